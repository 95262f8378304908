// SPDX-License-Identifier: MIT OR Apache-2.0
//! The layout of every map key and value, each `#[repr(C)]` with its size
//! asserted, so the kernel and userspace read the same bytes.
use core::mem::size_of;

use crate::{
    DEFAULT_RST_PER_PREFIX_PER_SEC, DEFAULT_RST_PER_SEC, action, counter, gate_counter, handshake, latency, tier,
};

/// The namespace's addresses in [`map::LOCAL_ADDRS`]: a two-choice hash
/// table in an array, so the gate finds an address with two array lookups
/// instead of a hash-map lookup on every SYN.
pub mod local_addr {
    /// An address of an interface of the namespace: SYNs to it are judged.
    pub const UNICAST: u32 = 1;
    /// A broadcast address of the namespace: never judged, never answered.
    pub const BROADCAST: u32 = 2;
    /// Slots of the table (a power of two): two-choice placement holds up to
    /// about half of them, 2,048 addresses.
    pub const SLOTS: u32 = 4096;

    /// The two slots an address may live in.
    #[inline(always)]
    pub fn slots(addr: &[u8; 16]) -> (u32, u32) {
        let h = crate::handshake::flow_hash(addr, addr, 0x5eed, 0x10ca);
        (h & (SLOTS - 1), (h >> 16) & (SLOTS - 1))
    }
}

/// One slot of [`map::LOCAL_ADDRS`]: `kind` 0 is an empty slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalAddr {
    pub addr: [u8; 16],
    /// One of [`local_addr`]'s kinds, or 0.
    pub kind: u32,
}
const _: () = assert!(size_of::<LocalAddr>() == 20);

/// Gate-wide counters on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateCounters {
    pub values: [u64; gate_counter::COUNT],
}
const _: () = assert!(size_of::<GateCounters>() == 8 * gate_counter::COUNT);

/// The last segment a CPU judged and passed: its client, ports, sequence
/// numbers and kind (compared whole: a digest could be matched by a crafted
/// segment), and when. A segment that crosses stacked devices (a bridge port
/// then the bridge, a VLAN's lower device then the VLAN) meets the gate once
/// per device, on the same CPU, microseconds apart; the second meeting finds
/// it here and passes uncounted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastPassed {
    pub at_ns: u64,
    pub client_addr: [u8; 16],
    /// The whole segment is compared, addresses, flags and length with the
    /// rest: a copy sent to another local address first (a decoy, which
    /// completes nothing) must not pass the real one unjudged.
    pub server_addr: [u8; 16],
    pub seq: u32,
    pub ack_seq: u32,
    pub client_port: u16,
    pub server_port: u16,
    /// The interface it passed on: only a meeting on another one is the same
    /// segment crossing a stack (a repeat on the same interface is a new packet).
    pub ifindex: u32,
    /// 1 for a SYN, 0 for an ACK.
    pub syn: u32,
    pub payload_len: u16,
    pub flags: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<LastPassed>() == 64);

/// How long a passed segment is remembered: far longer than a segment takes
/// from one stacked device to the next (microseconds) even on the kernel's
/// coarse clock, which the memory is stamped with (it moves a tick at a
/// time: 10 ms at HZ=100, so a segment and its copy a microsecond later may
/// read times a tick apart); far shorter than any retransmission (200 ms at
/// least).
pub const STACKED_WITHIN_NS: u64 = 25_000_000;

/// The share of the limit one client (an IPv4 address, an IPv6 prefix) may
/// hold while others are refused, in percent: half. One source can never shut
/// everyone else out, and a lone NAT'd population (a corporate gateway, a
/// carrier-grade NAT pool, a reverse proxy) still gets the whole port as long
/// as nobody else is being refused; two such populations get at least half each.
pub const DEFAULT_CLIENT_SHARE: u8 = 50;

/// How long a refusal of a client under its share keeps the share enforced:
/// contention is over once nobody under their share has been refused for this long.
pub const CONTENDED_FOR_NS: u64 = 1_000_000_000;

/// Whether a port's clients contend for it, for the client share
/// ([`PortConfig::client_share`]). Written by the kernel (plain stores: a
/// lost update at worst shifts a time by one judgement), read by the gate
/// and by `shedctl stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contention {
    /// The client (its cap key's address) that held the most connections when
    /// one was last counted, and how many it holds now (kept as it opens and
    /// closes; another client's count replaces it when it grows larger). A
    /// SYN that finds the port full while that is at least the share is
    /// judged at its ACK, where its refusal counts.
    pub largest: [u8; 16],
    pub largest_held: u64,
    /// When a verified client holding less than its share was last refused:
    /// for [`CONTENDED_FOR_NS`] after it, a client at its share is refused.
    pub refused_ns: u64,
    /// The budget of SYNs passed to be judged at their ACK ([`DEFERRED_PER_SEC`];
    /// a GCRA time, see [`crate::ratelimit`]).
    pub deferred_tat: u64,
}
const _: () = assert!(size_of::<Contention>() == 40);

/// Most SYNs a full port passes per second, while one client holds its
/// share, so that a client under its share can prove itself at its ACK:
/// enough to see contention within a second, too few for a flood of forged
/// SYNs to cost the server more than a trickle of SYN cookies (the rest are
/// refused at the SYN as before).
pub const DEFERRED_PER_SEC: u32 = 100;

impl Contention {
    /// Whether `at_ns` lies within [`CONTENDED_FOR_NS`] after `since_ns` (never set: no).
    #[inline(always)]
    pub const fn recent(since_ns: u64, now_ns: u64) -> bool {
        since_ns != 0 && now_ns.wrapping_sub(since_ns) < CONTENDED_FOR_NS
    }
}

/// Per-port configuration. Key: port (host order). Written by `shedctl` only.
/// The limit lives apart, in [`map::LIMITS`], because the controller rewrites
/// it every window and must not race an operator's change of the action.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// Index into the per-port arrays ([`map::PORT_STATE`], [`map::COUNTERS`], [`map::LIMITS`], ...).
    pub slot: u32,
    /// One of [`action`].
    pub action: u8,
    /// 1: count would-rejects but admit everything.
    pub dry_run: u8,
    /// One of [`count_mode`].
    pub count_mode: u8,
    /// 1 once any client tier is configured: only then do tier shares apply
    /// (with no tiers every source is normal and may fill the whole limit).
    pub tiered: u8,
    /// Share of the limit each tier may fill, permille, by [`tier`] index.
    pub share_permille: [u16; tier::COUNT],
    /// Per-tier reject action, or [`tier::ACTION_DEFAULT`].
    pub tier_action: [u8; tier::COUNT],
    /// Most connections (open plus pending) one client may hold; 0: no cap.
    pub client_cap: u32,
    /// IPv6 clients are counted per prefix of this length (IPv4: per address).
    pub client_prefix_v6: u8,
    /// Percent of the limit one client may hold while clients holding less
    /// are refused (0: no share). Judged at the handshake-completing ACK only.
    pub client_share: u8,
    /// Seconds an `http` answer's Retry-After tells the client (0: what the
    /// daemon derives from the controller, [`UserPortState::retry_after_s`]).
    pub retry_after_s: u16,
    pub _pad2: [u8; 4],
    /// Most RSTs per second the port sends in all (0: no cap); above it, drop.
    pub rst_per_sec: u32,
    /// Most RSTs per second to one source prefix (IPv4 /24, IPv6 /48; 0: no cap).
    pub rst_per_prefix_per_sec: u32,
}
const _: () = assert!(size_of::<PortConfig>() == 40);

impl PortConfig {
    /// Whether clients' established connections are counted (for a cap or a share).
    #[inline(always)]
    pub const fn counts_clients(&self) -> bool {
        self.client_cap != 0 || self.client_share != 0
    }

    /// Most connections one client may hold while others are refused, at
    /// `limit` (at least one); `None` without a share, or when the share
    /// would be the whole limit (a limit of 1, a share of 100%).
    #[inline(always)]
    pub const fn share_cap(&self, limit: u32) -> Option<u64> {
        if self.client_share == 0 {
            return None;
        }
        let cap = limit as u64 * self.client_share as u64 / 100;
        let cap = if cap == 0 { 1 } else { cap };
        if cap >= limit as u64 { None } else { Some(cap) }
    }

    /// A port with the default tier shares and the port's action for every tier.
    pub const fn new(slot: u32, action: u8, dry_run: bool, count_mode: u8) -> Self {
        Self {
            slot,
            action,
            dry_run: dry_run as u8,
            count_mode,
            tiered: 0,
            share_permille: tier::DEFAULT_SHARE_PERMILLE,
            tier_action: [tier::ACTION_DEFAULT; tier::COUNT],
            client_cap: 0,
            client_prefix_v6: 64,
            client_share: DEFAULT_CLIENT_SHARE,
            retry_after_s: 0,
            _pad2: [0; 4],
            rst_per_sec: DEFAULT_RST_PER_SEC,
            rst_per_prefix_per_sec: DEFAULT_RST_PER_PREFIX_PER_SEC,
        }
    }

    /// The key a client is counted under: its address, IPv6 cut to the port's prefix.
    #[inline(always)]
    pub fn client_key(&self, addr: &[u8; 16]) -> ClientKey {
        if is_ipv4_mapped(addr) {
            return ClientKey { slot: self.slot, addr: *addr };
        }
        // Two 64-bit masks, not a loop over bytes: a data-dependent branch per
        // byte multiplies the paths the verifier must walk.
        let prefix = if self.client_prefix_v6 > 128 { 128 } else { u32::from(self.client_prefix_v6) };
        let hi_bits = if prefix > 64 { 64 } else { prefix };
        let lo_bits = prefix - hi_bits;
        let hi = u64::from_be_bytes([addr[0], addr[1], addr[2], addr[3], addr[4], addr[5], addr[6], addr[7]]);
        let lo = u64::from_be_bytes([addr[8], addr[9], addr[10], addr[11], addr[12], addr[13], addr[14], addr[15]]);
        let (hi, lo) = ((hi & high_bits(hi_bits)).to_be_bytes(), (lo & high_bits(lo_bits)).to_be_bytes());
        ClientKey {
            slot: self.slot,
            addr: [
                hi[0], hi[1], hi[2], hi[3], hi[4], hi[5], hi[6], hi[7], lo[0], lo[1], lo[2], lo[3], lo[4], lo[5],
                lo[6], lo[7],
            ],
        }
    }

    /// Whether any tier of the port is refused with the stateless HTTP answer
    /// (then an ACK that finds no socket may be a client of that answer).
    #[inline(always)]
    pub fn answers_http(&self) -> bool {
        self.action == action::HTTP
            || self.tier_action[0] == action::HTTP
            || self.tier_action[1] == action::HTTP
            || self.tier_action[2] == action::HTTP
            || self.tier_action[3] == action::HTTP
    }

    /// The reject action for a client of `tier`.
    #[inline(always)]
    pub fn action_for(&self, tier: u8) -> u8 {
        // Constant indices: a computed one into a stack copy lets LLVM turn the
        // address add into an OR, which the BPF verifier refuses on a pointer.
        let own = match tier {
            0 => self.tier_action[0],
            1 => self.tier_action[1],
            2 => self.tier_action[2],
            3 => self.tier_action[3],
            _ => tier::ACTION_DEFAULT,
        };
        if own == tier::ACTION_DEFAULT { self.action } else { own }
    }

    /// In-flight below which `tier` is admitted: its share of `limit` (all of it while untiered).
    #[inline(always)]
    pub fn tier_threshold(&self, tier: u8, limit: u32) -> u64 {
        if self.tiered == 0 {
            return u64::from(limit);
        }
        let share = self.share_permille.get(tier as usize).copied().unwrap_or(1000);
        u64::from(limit) * u64::from(share) / 1000
    }
}

/// A u64 with its top `bits` bits set (0 to 64).
#[inline(always)]
const fn high_bits(bits: u32) -> u64 {
    if bits == 0 { 0 } else { u64::MAX << (64 - bits) }
}

/// In-flight accounting for one port, kept as monotonically increasing event
/// counts so that every writer only ever adds (atomically) and no two writers
/// share a field:
/// - established = `opened - closed`
/// - busy        = `busy_enter - busy_exit` (connections owing an answer)
///
/// Handshakes under way live in the port's [`HandshakeRing`]. Written only by
/// the kernel programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortState {
    /// Sockets of the port that entered ESTABLISHED (passive open).
    pub opened: u64,
    /// Of those, sockets that reached their final close.
    pub closed: u64,
    /// Connections that started owing an answer (accepted, or a request arrived while idle).
    pub busy_enter: u64,
    /// Connections that stopped owing one (answered, or closed while busy).
    pub busy_exit: u64,
    /// Client entries the port's connections inserted into the client map
    /// (the daemon counts the ones it forgets in [`UserPortState::clients_forgotten`]).
    pub clients_added: u64,
}
const _: () = assert!(size_of::<PortState>() == 40);

/// The daemon's share of a port's accounting. Written only by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserPortState {
    /// Epoch length of the port's handshake ring, as a power of two of ns
    /// (0: [`handshake::DEFAULT_SHIFT`]).
    pub handshake_shift: u32,
    /// Epoch length of the port's silent ring (0: [`handshake::DEFAULT_SILENT_SHIFT`]).
    pub silent_shift: u32,
    /// Drift healing: added to the kernel's established count (missed events, adopted sockets).
    pub established_adjust: i64,
    /// Drift healing: added to the kernel's busy count.
    pub busy_adjust: i64,
    /// Drift healing: connections corrected so far (reported, not used by the gate).
    pub drift_corrected: u64,
    /// Most connections the port may track in the shared connection map (0:
    /// no bound), so one port cannot fill it for every port.
    pub connection_quota: u32,
    /// Most client entries the port may hold in the shared client map (0: no bound).
    pub client_quota: u32,
    /// Client entries of the port the daemon forgot (idle), against
    /// [`PortState::clients_added`].
    pub clients_forgotten: u64,
    /// Seconds an `http` answer's Retry-After tells the client when the port
    /// sets none: the controller's queue wait rounded up (at least 1).
    pub retry_after_s: u32,
    /// Requests the daemon closed because a client over its share of a
    /// contended port had its server sit on them unanswered (reported only).
    pub stalled_closed: u32,
    /// Sockets of requests refused on kept-alive connections that the daemon
    /// closed (reported, not used by the gate).
    pub refused_closed: u64,
}
const _: () = assert!(size_of::<UserPortState>() == 64);

impl UserPortState {
    /// The epoch shift the gate uses, clamped to the supported range.
    #[inline(always)]
    pub const fn shift(&self) -> u32 {
        clamp_shift(self.handshake_shift, handshake::DEFAULT_SHIFT, handshake::MIN_SHIFT, handshake::MAX_SHIFT)
    }

    /// Whether the port may track one more connection: it holds fewer than
    /// its quota (established = opened - closed, plus the healer's correction).
    #[inline(always)]
    pub const fn connection_room(&self, state: &PortState) -> bool {
        if self.connection_quota == 0 {
            return true;
        }
        let tracked = state.opened.wrapping_sub(state.closed) as i64 + self.established_adjust;
        tracked < self.connection_quota as i64
    }

    /// Whether the port may insert one more client entry.
    #[inline(always)]
    pub const fn client_room(&self, state: &PortState) -> bool {
        self.client_quota == 0
            || (state.clients_added.wrapping_sub(self.clients_forgotten) as i64) < self.client_quota as i64
    }

    /// The silent ring's epoch shift, clamped to the supported range.
    #[inline(always)]
    pub const fn silent_shift(&self) -> u32 {
        clamp_shift(
            self.silent_shift,
            handshake::DEFAULT_SILENT_SHIFT,
            handshake::MIN_SILENT_SHIFT,
            handshake::MAX_SILENT_SHIFT,
        )
    }
}

/// A port's quota of a map all of a gate's ports share (`capacity` entries)
/// when `ports` are gated: an even share each, so one port's flood of
/// connections or clients cannot turn tracking, caps and shares off for the
/// others; no bound (0) for a port alone.
#[inline(always)]
pub const fn map_quota(capacity: u32, ports: usize) -> u32 {
    if ports <= 1 { 0 } else { capacity / ports as u32 }
}

/// A ring's epoch shift as the daemon wrote it: 0 means `default`, anything
/// else is held to `min..=max`.
#[inline(always)]
const fn clamp_shift(s: u32, default: u32, min: u32, max: u32) -> u32 {
    if s == 0 {
        default
    } else if s < min {
        min
    } else if s > max {
        max
    } else {
        s
    }
}

/// Event counters of one port on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortCounters {
    pub values: [u64; counter::COUNT],
}
const _: () = assert!(size_of::<PortCounters>() == 8 * counter::COUNT);

impl Default for PortCounters {
    fn default() -> Self {
        Self { values: [0; counter::COUNT] }
    }
}

/// Identifies one handshake. Addresses network order (IPv4-mapped for IPv4), ports host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub client_addr: [u8; 16],
    pub server_addr: [u8; 16],
    pub client_port: u16,
    pub server_port: u16,
}
const _: () = assert!(size_of::<FlowKey>() == 36);

/// A request refused on a kept-alive connection (`SHED_REFUSED_TURNS`, keyed
/// by the server socket's address): a retransmission of its first segment
/// gets the same answer, and the daemon closes the server's socket (sock_diag
/// `SOCK_DESTROY`) so the connection holds nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefusedTurn {
    pub at_ns: u64,
    pub flow: FlowKey,
    /// The refused segment's sequence number (the request's first byte).
    pub seq: u32,
    /// The refusal's counter (`counter::REJECTED_*`).
    pub reason: u32,
    /// The action it was refused with (`action::*`): the daemon closes the
    /// socket of an `rst` or `http` refusal; a `drop` leaves the client
    /// waiting, and its retransmissions are dropped too.
    pub action: u32,
}
const _: () = assert!(size_of::<RefusedTurn>() == 56);

/// Socket tracepoints fire for every network namespace; the gate counts only
/// sockets of the namespace it protects. Offsets come from the running
/// kernel's BTF (`sock_common.skc_net`, `net.ns.inum`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetnsFilter {
    /// 0: count every namespace (BTF offsets unavailable).
    pub enabled: u32,
    /// Inode number of the protected network namespace.
    pub inum: u32,
    pub skc_net_offset: u32,
    pub net_inum_offset: u32,
    /// `sk_buff.dev` and `net_device.nd_net.net`: where a shared object's TC
    /// program finds the namespace of the device a packet arrived on (0: unknown).
    pub skb_dev_offset: u32,
    pub dev_net_offset: u32,
    /// A node agent's shared object left running for its successor (on
    /// SIGTERM: a restart or a rolling update): the kernel time (ns,
    /// `CLOCK_MONOTONIC`) after which its programs judge and hand over
    /// nothing, so a gate nobody took over fails open. 0: an agent holds it.
    pub left_until_ns: u64,
}
const _: () = assert!(size_of::<NetnsFilter>() == 32);

/// A client of a port, for the per-client cap.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey {
    pub slot: u32,
    /// Address (IPv4-mapped for IPv4), IPv6 cut to the port's client prefix.
    pub addr: [u8; 16],
}
const _: () = assert!(size_of::<ClientKey>() == 20);

/// An established socket of a protected port, and where its current request stands.
/// Updated only from the socket's own events. `busy` and `silent` change by
/// compare-and-swap of the 8-byte word each shares with fields that never
/// change once the entry is in the map (`slot`, `port`, `capped`; the flow's
/// ports, `multiplexed`): an answer's send event runs outside the socket's
/// lock, beside a request's arrival or the connection's close.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockEntry {
    pub slot: u32,
    pub port: u16,
    /// 1 while the connection owes an answer (counted in `busy_enter - busy_exit`).
    pub busy: u8,
    /// 1 if the connection counts against its client's cap (release it at close).
    pub capped: u8,
    /// When the current request's first bytes arrived (ns, 0: none pending).
    pub arrival_ns: u64,
    /// When the application first read them (ns, 0: not yet).
    pub pickup_ns: u64,
    /// The client's cap key address (see [`PortConfig::client_key`]).
    pub client: [u8; 16],
    /// The connection, so the daemon can match the entry with the kernel's socket table.
    pub flow: FlowKey,
    /// 1 if the port counted [`count_mode::MULTIPLEXED`] when the connection
    /// was accepted: queue-wait samples per read, busy until closed.
    pub multiplexed: u8,
    /// 1 while a [`count_mode::WORK`] connection has sent nothing since it was
    /// accepted: counted in the port's silent ring at `silent_epoch` (so only
    /// for a grace, see [`handshake::DEFAULT_SILENT_SHIFT`]), not as busy.
    pub silent: u8,
    /// 1 once a request on the connection was refused (its record is in
    /// [`map::REFUSED_TURNS`]): only then does the gate look for that record
    /// when the connection's next request comes. Set after `silent` is 0
    /// for good, so the compare-and-swap of the word they share never
    /// meets it changing.
    pub refused_request: u8,
    pub _pad2: u8,
    /// The silent ring's epoch the connection was accepted in.
    pub silent_epoch: u64,
}
const _: () = assert!(size_of::<SockEntry>() == 88);

/// Request latency histograms of one port on one CPU, in microseconds,
/// bucketed by [`latency::bucket`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortLatency {
    /// Arrival to pick-up: time in the service's queues.
    pub queue_wait: [u64; latency::BUCKETS],
    /// Pick-up to first response byte.
    pub service: [u64; latency::BUCKETS],
    /// Arrival to first response byte.
    pub sojourn: [u64; latency::BUCKETS],
    /// Admitted SYN to established: how long a handshake takes (sizes the handshake window).
    pub handshake: [u64; latency::BUCKETS],
}
const _: () = assert!(size_of::<PortLatency>() == 4 * 8 * latency::BUCKETS);

impl Default for PortLatency {
    fn default() -> Self {
        Self {
            queue_wait: [0; latency::BUCKETS],
            service: [0; latency::BUCKETS],
            sojourn: [0; latency::BUCKETS],
            handshake: [0; latency::BUCKETS],
        }
    }
}

/// Slots of the limit held back from each tier (by [`tier`] index) while a
/// tier above it is being rejected. Written by the daemon only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierReserve {
    pub held_back: [u16; tier::COUNT],
}
const _: () = assert!(size_of::<TierReserve>() == 8);

/// The controller's settings for one port. Written by `shedctl attach/set`, read by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlConfig {
    /// Bumped on every change, so the daemon notices.
    pub generation: u32,
    /// Algorithm code (see `shed::control::Algo`).
    pub algo: u8,
    /// Latency percentile the controller follows (1-99).
    pub percentile: u8,
    pub _pad: [u8; 2],
    pub min_limit: u32,
    pub max_limit: u32,
    /// Control window, milliseconds.
    pub window_ms: u32,
    /// A limit set by the operator with this generation (0: none); adaptive controllers continue from it.
    pub requested_limit: u32,
    /// Guard: fewer completed requests than this hold the limit (and carry over).
    pub min_samples: u32,
    /// Guard: windows after a cut without growth.
    pub cooldown_windows: u32,
    /// Guard: span of the baseline minimum, in windows.
    pub baseline_windows: u32,
    /// Guard: windows of each baseline probe (0: never probe).
    pub probe_windows: u32,
    /// `queue`: the queue wait to hold admitted requests near, microseconds (0: the default, 5 ms).
    pub queue_target_us: u32,
    /// The operator's latency objective, milliseconds (0: none): a request the
    /// service can still answer within it may be admitted however long it queues.
    pub target_latency_ms: u32,
}
const _: () = assert!(size_of::<ControlConfig>() == 48);

/// The controller's last window for one port. Written by the daemon, read by `shedctl stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlStatus {
    pub baseline_us: u64,
    /// The latency the controller followed in the last window.
    pub observed_us: u64,
    pub queue_wait_p50_us: u64,
    pub queue_wait_p99_us: u64,
    pub service_p50_us: u64,
    pub service_p99_us: u64,
    pub sojourn_p50_us: u64,
    pub sojourn_p99_us: u64,
    /// Completed requests in the last window.
    pub samples: u64,
    /// Listen-queue drops of the namespace in the last window, counted against
    /// this port (fed to its controller) only while its own accept queue is at
    /// least half full (this window or the last): another listener's overflow
    /// is not this port's overload.
    pub listen_drops: u64,
    /// Windows run so far.
    pub windows: u64,
    /// Reason code of the last decision (see `shed::control::Reason`).
    pub reason: u32,
    /// Limit before the last decision.
    pub previous_limit: u32,
    /// Handshake time (admitted SYN to established) in the last windows.
    pub handshake_p50_us: u64,
    pub handshake_p99_us: u64,
    /// The port's listeners at the window's end: connections waiting in their
    /// accept queues, and the queues' capacity (backlog), summed over listeners.
    pub accept_queue: u32,
    pub accept_backlog: u32,
    /// Listen-queue drops counted against this port so far.
    pub listen_drops_total: u64,
}
const _: () = assert!(size_of::<ControlStatus>() == 128);

/// Builds the IPv4-mapped IPv6 form of an IPv4 address, as the socket tracepoint reports it.
#[inline(always)]
pub const fn ipv4_mapped(v4: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3]]
}

/// Whether `addr` is certainly counted under cap key address `key` (see
/// [`PortConfig::client_key`]): the very address (an IPv4 client's key, or an
/// IPv6 key of 128 bits), or an IPv6 address in a key's /64 cut at 64 bits
/// (the default; a key cut shorter is matched only by addresses of its own
/// /64, never wrongly). Three word compares, no key built: the caller's stack
/// may be the verifier's last bytes.
#[inline(always)]
pub fn within_key(addr: &[u8; 16], key: &[u8; 16]) -> bool {
    let word = |a: &[u8; 16], at: usize| {
        u64::from_ne_bytes([a[at], a[at + 1], a[at + 2], a[at + 3], a[at + 4], a[at + 5], a[at + 6], a[at + 7]])
    };
    // A key's low word is 0 only for an IPv6 key cut at 64 bits or fewer (an
    // IPv4 key's holds `ffff` and the address), and an IPv6 client's high
    // word never is (IPv4 ones' always is: they match their key exactly).
    let (high, key_low) = (word(addr, 0), word(key, 8));
    high == word(key, 0) && (word(addr, 8) == key_low || (key_low == 0 && high != 0))
}

/// Whether an address is IPv4, stored IPv4-mapped (`::ffff:a.b.c.d`).
#[inline(always)]
pub fn is_ipv4_mapped(addr: &[u8; 16]) -> bool {
    addr[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
}

#[cfg(feature = "user")]
mod user {
    use super::{
        ClientKey, Contention, ControlConfig, ControlStatus, FlowKey, GateCounters, LocalAddr, NetnsFilter, PortConfig,
        PortCounters, PortLatency, PortState, RefusedTurn, SockEntry, TierReserve, UserPortState,
    };
    use crate::{HandshakeRing, HandshakeStamp};
    // SAFETY: all are #[repr(C)], Copy, made of fixed-width integers and byte arrays, with no padding.
    unsafe impl aya::Pod for PortConfig {}
    unsafe impl aya::Pod for Contention {}
    unsafe impl aya::Pod for PortState {}
    unsafe impl aya::Pod for UserPortState {}
    unsafe impl aya::Pod for PortCounters {}
    unsafe impl aya::Pod for RefusedTurn {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for HandshakeRing {}
    unsafe impl aya::Pod for HandshakeStamp {}
    unsafe impl aya::Pod for GateCounters {}
    unsafe impl aya::Pod for LocalAddr {}
    unsafe impl aya::Pod for SockEntry {}
    unsafe impl aya::Pod for PortLatency {}
    unsafe impl aya::Pod for ControlConfig {}
    unsafe impl aya::Pod for ControlStatus {}
    unsafe impl aya::Pod for TierReserve {}
    unsafe impl aya::Pod for ClientKey {}
    unsafe impl aya::Pod for NetnsFilter {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_is_recent_for_a_second_after_it_was_seen() {
        assert!(!Contention::recent(0, 5), "never set: no contention");
        assert!(Contention::recent(10, 10));
        assert!(Contention::recent(10, 10 + CONTENDED_FOR_NS - 1));
        assert!(!Contention::recent(10, 10 + CONTENDED_FOR_NS), "a second on, it is over");
        assert!(!Contention::recent(10, 10 + 3 * CONTENDED_FOR_NS));
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix_and_a_prefix_past_128_is_the_address() {
        let addr = [0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let key = |prefix: u8| {
            let config = PortConfig { client_prefix_v6: prefix, ..PortConfig::new(3, action::DROP, false, 0) };
            config.client_key(&addr)
        };
        assert_eq!(key(64).slot, 3);
        assert_eq!(key(64).addr, [0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(key(72).addr, [0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(key(12).addr[..2], [0x20, 0x00]);
        assert_eq!(key(128).addr, addr);
        assert_eq!(key(200).addr, addr, "a map value past 128 bits keys the whole address");
        let v4 = ipv4_mapped([10, 1, 2, 3]);
        let config = PortConfig { client_prefix_v6: 8, ..PortConfig::new(3, action::DROP, false, 0) };
        assert_eq!(config.client_key(&v4).addr, v4, "IPv4 clients are keyed by their address");
    }

    proptest::proptest! {
        /// An address within a key is counted under it (`client_key`), for
        /// every IPv4 address and for IPv6 keys of 64 and 128 bits; an exact
        /// key (IPv4, or 128 bits) is matched by its address alone.
        #[test]
        fn an_address_within_a_key_is_counted_under_it(
            prefix in proptest::prop_oneof![proptest::strategy::Just(64u8), proptest::strategy::Just(128u8), 0u8..=255],
            addr in proptest::prelude::any::<[u8; 16]>(),
            other in proptest::prelude::any::<[u8; 16]>(),
            v4 in proptest::prelude::any::<bool>(),
        ) {
            let config = PortConfig { client_prefix_v6: prefix, ..PortConfig::new(3, action::DROP, false, 0) };
            let addr = if v4 { ipv4_mapped([addr[0], addr[1], addr[2], addr[3]]) } else { addr };
            let key = config.client_key(&addr).addr;
            if v4 || ((prefix == 64 || prefix >= 128) && addr[..8] != [0; 8]) {
                proptest::prop_assert!(within_key(&addr, &key), "its own key");
            }
            proptest::prop_assert!(!within_key(&addr, &[0; 16]) || addr == [0; 16], "no key is no client's");
            let other = if v4 { ipv4_mapped([other[0], other[1], other[2], other[3]]) } else { other };
            if within_key(&other, &key) {
                proptest::prop_assert_eq!(config.client_key(&other).addr, key, "never a wrong key");
            }
            if v4 || prefix >= 128 {
                proptest::prop_assert_eq!(within_key(&other, &key), other == addr, "an exact key: its address alone");
            }
        }
    }

    #[test]
    fn each_tier_takes_its_own_action_or_the_ports() {
        let mut config = PortConfig::new(0, action::RST, false, 0);
        assert!(!config.answers_http());
        for t in 0..tier::COUNT as u8 {
            assert_eq!(config.action_for(t), action::RST, "tier {t} follows the port");
        }
        assert_eq!(config.action_for(9), action::RST, "an unknown tier follows the port");
        for t in 0..tier::COUNT {
            let mut one = config;
            one.tier_action[t] = action::HTTP;
            assert!(one.answers_http(), "tier {t} answers HTTP");
            for u in 0..tier::COUNT {
                let want = if u == t { action::HTTP } else { action::RST };
                assert_eq!(one.action_for(u as u8), want, "tier {u} with tier {t} set");
            }
            one.tier_action[t] = action::DROP;
            assert!(!one.answers_http());
            assert_eq!(one.action_for(t as u8), action::DROP);
        }
        config.action = action::HTTP;
        assert!(config.answers_http(), "the port's own action");
    }

    #[test]
    fn ring_shifts_are_held_to_their_range() {
        let user =
            |handshake_shift, silent_shift| UserPortState { handshake_shift, silent_shift, ..Default::default() };
        assert_eq!(user(0, 0).shift(), handshake::DEFAULT_SHIFT, "0: the default");
        assert_eq!(user(1, 0).shift(), handshake::MIN_SHIFT);
        assert_eq!(user(handshake::MIN_SHIFT + 1, 0).shift(), handshake::MIN_SHIFT + 1);
        assert_eq!(user(99, 0).shift(), handshake::MAX_SHIFT);
        assert_eq!(user(0, 0).silent_shift(), handshake::DEFAULT_SILENT_SHIFT);
        assert_eq!(user(0, 1).silent_shift(), handshake::MIN_SILENT_SHIFT);
        assert_eq!(user(0, 99).silent_shift(), handshake::MAX_SILENT_SHIFT);
        assert_eq!(user(0, handshake::MAX_SILENT_SHIFT - 1).silent_shift(), handshake::MAX_SILENT_SHIFT - 1);
    }
}
