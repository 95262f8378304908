//! Types shared by shed's kernel programs and its userspace.
//!
//! Everything that crosses the kernel/userspace boundary is defined here once:
//! map and program names, the layout of every map key and value, and the pure
//! functions that build the TCP RST reply (so the kernel and the tests' model
//! agree on one definition of "the bytes we send").
//!
//! Byte order, decided once:
//! - ports are **host order** everywhere in maps (the socket tracepoint reports
//!   them that way; the packet path converts once);
//! - addresses are **network order** byte arrays, IPv4 stored as IPv4-mapped
//!   IPv6 (`::ffff:a.b.c.d`), which is what the socket tracepoint reports.
#![no_std]
#[cfg(test)]
extern crate std;

pub mod handshake;
pub mod latency;
pub mod ratelimit;
pub mod rst;

pub use handshake::{HandshakeCell, HandshakeRing, HandshakeStamp};

use core::mem::size_of;

/// Map names, as they appear in the object file and under the pin folder.
pub mod map {
    /// `HashMap<u16 port, PortConfig>`: protected ports. Written by userspace, read by every program.
    pub const PORTS: &str = "SHED_PORTS";
    /// `Array<PortState>` indexed by slot: in-flight accounting. Written only by the kernel (atomics).
    pub const PORT_STATE: &str = "SHED_PORT_STATE";
    /// `Array<UserPortState>` indexed by slot: the daemon's share of the accounting (expired reservations).
    pub const USER_STATE: &str = "SHED_USER_STATE";
    /// `PerCpuArray<PortCounters>` indexed by slot: event counters. Written by the kernel.
    pub const COUNTERS: &str = "SHED_COUNTERS";
    /// `Array<HandshakeRing>` indexed by slot: handshakes admitted and not yet
    /// established, by epoch (see [`crate::handshake`]). Written by the kernel (atomics).
    pub const HANDSHAKES: &str = "SHED_HANDSHAKES";
    /// `Array<HandshakeStamp>`, [`crate::handshake::STAMPS_PER_PORT`] per slot:
    /// when each flow was admitted. Written by the kernel.
    pub const STAMPS: &str = "SHED_STAMPS";
    /// `Array<LocalAddr>` of [`local_addr::SLOTS`]: the protected namespace's own
    /// addresses, each in one of its two slots (see [`local_addr::slots`]). Only SYNs
    /// addressed to one of them are judged. Written by the daemon.
    pub const LOCAL_ADDRS: &str = "SHED_LOCAL_ADDRS";
    /// `Array<u32>` indexed by port: non-zero while handshake-completing ACKs to the
    /// port are checked (some admissions lapsed, so a late completion could overshoot).
    /// Set by the kernel and the daemon, cleared by the daemon.
    pub const ACK_CHECK: &str = "SHED_ACK_CHECK";
    /// `PerCpuArray<GateCounters>[1]`: what the gate did with packets it could not
    /// tie to a port (fragments, unparsable headers). Written by the kernel.
    pub const GATE_COUNTERS: &str = "SHED_GATE_COUNTERS";
    /// `HashMap<u64 sock address, SockEntry>`: established sockets counted in flight, so each is released once.
    pub const SOCKS: &str = "SHED_SOCKS";
    /// `Array<u32>` indexed by slot: the current concurrency limit. Written by the daemon's
    /// controller and by `shedctl set --limit`; read by the gate.
    pub const LIMITS: &str = "SHED_LIMITS";
    /// `PerCpuArray<PortLatency>` indexed by slot: request latency histograms. Written by the kernel.
    pub const LATENCY: &str = "SHED_LATENCY";
    /// `Array<ControlConfig>` indexed by slot: the controller's settings. Written by `shedctl`, read by the daemon.
    pub const CONTROL: &str = "SHED_CONTROL";
    /// `Array<ControlStatus>` indexed by slot: the controller's last window. Written by the daemon, read by `shedctl stats`.
    pub const STATUS: &str = "SHED_STATUS";
    /// `LpmTrie<[u8; 16], u32>`: client CIDR (IPv4-mapped for IPv4) -> tier. Written by `shedctl`, read by the kernel.
    pub const TIERS: &str = "SHED_TIERS";
    /// `Array<TierReserve>` indexed by slot: room held back from each tier for the tiers above it.
    /// Written by the daemon, read by the gate.
    pub const RESERVE: &str = "SHED_RESERVE";

    /// `HashMap<ClientKey, i64>`: a client's established connections (opened minus
    /// closed; kernel atomics). Only confirmed handshakes enter it, so forged
    /// sources cannot fill it.
    pub const CLIENTS: &str = "SHED_CLIENTS";
    /// `Array<u64>` indexed by slot: the port's RST budget (a GCRA time, see
    /// [`crate::ratelimit`]). Kernel only.
    pub const RST_BUCKETS: &str = "SHED_RST_BUCKETS";
    /// `Array<u64>`, [`crate::ratelimit::PREFIX_BUCKETS_PER_PORT`] per slot: RST budget
    /// per source prefix, by prefix hash. Kernel only.
    pub const RST_PREFIX_BUCKETS: &str = "SHED_RST_PREFIX";

    /// `Array<NetnsFilter>[1]`: which network namespace's sockets to count. Written by the daemon.
    pub const NETNS: &str = "SHED_NETNS";
    /// `Array<u32>` indexed by port: 0 for an unprotected port, else its slot + 1.
    /// The gate's first lookup for every SYN (an array, not a hash). Written by `shedctl`.
    pub const PORT_SLOTS: &str = "SHED_PORT_SLOTS";
    /// `Array<PortConfig>` indexed by slot: the gate's copy of [`PORTS`], read
    /// with one array lookup. Written by `shedctl` with every config change.
    pub const SLOT_CONFIG: &str = "SHED_SLOT_CONFIG";
    /// `Array<u64>` of [`crate::rare::COUNT`]: when each rare path last logged
    /// (kernel only; see `attach --kernel-log`).
    pub const RARE_STAMPS: &str = "SHED_RARE_STAMPS";

    /// Every map of the kernel object by name, in one place (the daemon pins
    /// those it opens as `GateMaps`; `RARE_STAMPS` is the kernel's alone).
    pub const ALL: [&str; 23] = [
        PORTS,
        PORT_STATE,
        USER_STATE,
        COUNTERS,
        HANDSHAKES,
        STAMPS,
        LOCAL_ADDRS,
        ACK_CHECK,
        GATE_COUNTERS,
        SOCKS,
        LIMITS,
        LATENCY,
        CONTROL,
        STATUS,
        TIERS,
        RESERVE,
        CLIENTS,
        NETNS,
        RST_BUCKETS,
        RST_PREFIX_BUCKETS,
        PORT_SLOTS,
        SLOT_CONFIG,
        RARE_STAMPS,
    ];
}

/// Program names (the function names in `shed-ebpf`).
pub mod program {
    pub const XDP: &str = "shed_xdp";
    pub const TC: &str = "shed_tc";
    pub const SOCK_STATE: &str = "shed_sock_state";
    /// `sock:sk_data_ready`: request bytes reached a tracked socket.
    pub const DATA_READY: &str = "shed_data_ready";
    /// `sock:sock_recv_length`: the application read them.
    pub const RECV: &str = "shed_recv";
    /// `sock:sock_send_length`: the application answered.
    pub const SEND: &str = "shed_send";
    /// XDP_PASS only: for the peer of a veth gated with XDP, so XDP_TX replies are delivered.
    pub const XDP_PASS: &str = "shed_xdp_pass";
    /// XDP_DROP only: the cheapest possible verdict, a benchmark baseline.
    pub const XDP_DROP: &str = "shed_xdp_drop";
    /// The raw tracepoint programs and the `sock:` events they attach to.
    pub const RAW_TRACEPOINTS: [(&str, &str); 3] =
        [(DATA_READY, "sk_data_ready"), (RECV, "sock_recv_length"), (SEND, "sock_send_length")];
}

/// Capacities of the kernel maps.
pub mod capacity {
    /// Ports one gate can protect at once (slots in the per-port arrays).
    pub const MAX_PORTS: u32 = 64;
    /// TCP port numbers: the maps indexed by port have one entry each.
    pub const PORT_NUMBERS: u32 = 1 << 16;
    /// Established sockets tracked across all ports, by default (`--max-connections`).
    /// The map is not preallocated: it costs memory for the sockets it holds, not for this.
    pub const MAX_SOCKS: u32 = 262_144;
    /// Client CIDRs with a tier.
    pub const MAX_TIER_ENTRIES: u32 = 16_384;
    /// Clients counted against a per-client cap, across ports, by default
    /// (`--max-clients`). Not preallocated either.
    pub const MAX_CLIENTS: u32 = 65_536;
}

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

/// The highest concurrency limit an operator may set. Above this the socket
/// map could not hold the admitted work, so the limit would be a lie.
pub const MAX_LIMIT: u32 = 65_536;

/// Default cap on RSTs a port sends per second; forged SYNs must not turn
/// the gate into a reflector.
pub const DEFAULT_RST_PER_SEC: u32 = 20_000;
/// Default cap on RSTs per second to one source prefix (IPv4 /24, IPv6 /48).
pub const DEFAULT_RST_PER_PREFIX_PER_SEC: u32 = 1_000;

/// The RST-rate prefix of a client address.
#[inline(always)]
pub fn rst_prefix(addr: &[u8; 16]) -> [u8; 16] {
    let mut p = *addr;
    let v4 = addr[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
    let keep = if v4 { 15 } else { 6 };
    let mut i = keep;
    while i < 16 {
        p[i] = 0;
        i += 1;
    }
    p
}

/// What the gate does with a SYN it rejects.
pub mod action {
    /// Drop silently: the client retransmits its SYN after its RTO.
    pub const DROP: u8 = 0;
    /// Answer with RST+ACK: the client's connect() fails at once with ECONNREFUSED.
    pub const RST: u8 = 1;
}

/// Client tiers, assigned server-side from the source address.
pub mod tier {
    /// Always admitted and never counted: health checkers, load-balancer probes.
    pub const EXEMPT: u8 = 0;
    pub const CRITICAL: u8 = 1;
    /// Sources not listed in the tier map.
    pub const NORMAL: u8 = 2;
    /// Shed first.
    pub const LOW: u8 = 3;
    pub const COUNT: usize = 4;
    pub const NAMES: [&str; COUNT] = ["exempt", "critical", "normal", "low"];
    /// Default share of the limit each tier may fill, in permille (exempt: unused).
    pub const DEFAULT_SHARE_PERMILLE: [u16; COUNT] = [1000, 1000, 900, 700];
    /// A tier whose share is full still gets one SYN in this many admitted
    /// while in-flight is below the limit, so it is never starved entirely.
    pub const TRICKLE_EVERY: u64 = 16;
    /// `PortConfig::tier_action` value: use the port's action.
    pub const ACTION_DEFAULT: u8 = 0xff;
}

/// Indices into [`PortCounters::values`].
pub mod counter {
    /// SYNs (without ACK) addressed to this host for the port.
    pub const SYN_SEEN: usize = 0;
    /// SYNs admitted (each holds a handshake reservation for about one handshake time).
    pub const ADMITTED: usize = 1;
    /// SYNs rejected because in-flight had reached the limit.
    pub const REJECTED_LIMIT: usize = 2;
    /// RST+ACK replies sent for rejected SYNs.
    pub const RST_SENT: usize = 3;
    /// Dry-run: SYNs that enforce mode would have rejected (they were admitted).
    pub const DRY_RUN_WOULD_REJECT: usize = 4;
    /// Handshakes that completed after their reservation lapsed (or whose stamp
    /// was overwritten): counted from their completion on.
    pub const LATE_COMPLETED: usize = 5;
    /// Handshake-completing ACKs refused because their reservation had lapsed and
    /// the port was full.
    pub const LATE_ACK_REJECTED: usize = 6;
    /// Rejected SYNs for which the RST could not be built (dropped instead).
    pub const RST_FAILED: usize = 7;
    /// SYNs rejected because in-flight had reached their tier's share of the limit.
    pub const REJECTED_SHARE: usize = 8;
    /// SYNs from exempt clients (admitted, never counted).
    pub const EXEMPT: usize = 9;
    /// SYNs admitted past a full tier share by the anti-starvation trickle.
    pub const TRICKLE: usize = 10;
    /// SYNs rejected because their client already held its cap.
    pub const REJECTED_CLIENT_CAP: usize = 11;
    /// Admitted SYNs by tier: `ADMITTED_BY_TIER + tier`.
    pub const ADMITTED_BY_TIER: usize = 12;
    /// Rejected SYNs (all reasons) by tier: `REJECTED_BY_TIER + tier`.
    pub const REJECTED_BY_TIER: usize = 16;
    /// Rejected SYNs dropped instead of answered because an RST cap was reached.
    pub const RST_RATE_LIMITED: usize = 20;
    /// SYNs to the port that were not addressed to this namespace (forwarded or
    /// leaving local containers): passed untouched.
    pub const NOT_LOCAL: usize = 21;
    /// Rejected SYNs not answered because the source cannot be a real client
    /// (multicast, broadcast, unspecified, or this host's own or loopback address
    /// arriving from outside): dropped.
    pub const RST_SUPPRESSED: usize = 22;
    /// Established connections not counted against their client's cap because
    /// the client map was full (fail-open).
    pub const CLIENT_MAP_FULL: usize = 23;
    /// Late handshake-completing ACKs admitted (the port had room): counted as
    /// a reservation until the connection is established.
    pub const LATE_ACK_ADMITTED: usize = 24;
    /// Established connections not counted at all because the connection map was
    /// full (fail-open: they hold no place under the limit; the healer adopts them
    /// when room frees).
    pub const CONNECTION_MAP_FULL: usize = 25;
    /// Number of counter slots; spare slots are reserved for later reasons.
    pub const COUNT: usize = 32;
}

/// Indices into [`GateCounters::values`]: packets the gate judged before it
/// could tie them to a port.
pub mod gate_counter {
    /// First IPv4 fragments of TCP too short to hold the TCP header (RFC 1858,
    /// RFC 3128): dropped.
    pub const TINY_FRAGMENT: usize = 0;
    /// IPv4 TCP fragments at offset 8 bytes (RFC 1858 overlap attack): dropped.
    pub const OVERLAP_FRAGMENT: usize = 1;
    /// IPv6 packets whose extension-header chain was longer than the gate
    /// parses or malformed: dropped (a SYN could hide behind them).
    pub const IPV6_CHAIN_UNPARSED: usize = 2;
    /// Later fragments (IPv4 or IPv6): passed, the first fragment carries the TCP header.
    pub const LATER_FRAGMENT: usize = 3;
    pub const COUNT: usize = 8;
}

/// Rare paths the kernel programs report through aya-log when the daemon
/// asks (`shedctl attach --kernel-log`), each at most once a second.
pub mod rare {
    /// A connection could not be tracked: the connection map is full.
    pub const CONNECTION_MAP_FULL: u32 = 0;
    /// A capped client could not be counted: the client map is full.
    pub const CLIENT_MAP_FULL: u32 = 1;
    /// A reset could not be written or sent (a helper failed).
    pub const RST_FAILED: u32 = 2;
    /// A packet whose headers could hide a SYN was dropped (tiny or
    /// overlapping fragment, IPv6 chain not parsed).
    pub const UNPARSED_HEADER: u32 = 3;
    pub const COUNT: u32 = 4;
    /// Least time between two log lines of one kind.
    pub const EVERY_NS: u64 = 1_000_000_000;
}

/// Gate-wide counters on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateCounters {
    pub values: [u64; gate_counter::COUNT],
}
const _: () = assert!(size_of::<GateCounters>() == 8 * gate_counter::COUNT);

/// What in-flight counts for a port ([`PortConfig::count_mode`]).
pub mod count_mode {
    /// Work in the service: handshakes under way plus connections that have not
    /// answered their latest request. Idle keep-alive connections do not count.
    pub const WORK: u8 = 0;
    /// Open connections: handshakes under way plus established connections.
    pub const CONNECTIONS: u8 = 1;
    /// Open connections of a multiplexed protocol (HTTP/2, gRPC, pipelined
    /// HTTP/1.1), counted as [`CONNECTIONS`]: one connection carries many
    /// requests at once, so request turns (arrival -> pick-up -> answer) cannot
    /// be told apart. Such a connection is busy for its whole life and feeds
    /// only queue-wait samples: each read's time in the receive queue (from the
    /// first byte landing in an empty queue to the application's read), which
    /// holds whatever the protocol. No service or sojourn samples.
    pub const MULTIPLEXED: u8 = 2;
}

/// TCP states as the `sock:inet_sock_set_state` tracepoint reports them.
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_RECV: i32 = 3;
    pub const CLOSE: i32 = 7;
}

/// Field offsets of `sock:inet_sock_set_state` (see its `format` file in tracefs).
/// Userspace checks them against the running kernel before attaching.
pub mod sock_state_tp {
    pub const SKADDR: usize = 8;
    pub const OLDSTATE: usize = 16;
    pub const NEWSTATE: usize = 20;
    pub const SPORT: usize = 24;
    pub const DPORT: usize = 26;
    pub const PROTOCOL: usize = 30;
    pub const SADDR_V6: usize = 40;
    pub const DADDR_V6: usize = 56;
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
    pub _pad2: [u8; 7],
    /// Most RSTs per second the port sends in all (0: no cap); above it, drop.
    pub rst_per_sec: u32,
    /// Most RSTs per second to one source prefix (IPv4 /24, IPv6 /48; 0: no cap).
    pub rst_per_prefix_per_sec: u32,
}
const _: () = assert!(size_of::<PortConfig>() == 40);

impl PortConfig {
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
            _pad2: [0; 7],
            rst_per_sec: DEFAULT_RST_PER_SEC,
            rst_per_prefix_per_sec: DEFAULT_RST_PER_PREFIX_PER_SEC,
        }
    }

    /// The key a client is counted under: its address, IPv6 cut to the port's prefix.
    #[inline(always)]
    pub fn client_key(&self, addr: &[u8; 16]) -> ClientKey {
        let v4 = addr[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
        if v4 {
            return ClientKey { slot: self.slot, addr: *addr };
        }
        // Two 64-bit masks, not a loop over bytes: a data-dependent branch per
        // byte multiplies the paths the verifier must walk.
        let prefix = if self.client_prefix_v6 > 128 { 128 } else { self.client_prefix_v6 as u32 };
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

    /// The action for a rejected SYN of `tier`.
    #[inline(always)]
    pub fn action_for(&self, tier: u8) -> u8 {
        match self.tier_action.get(tier as usize) {
            Some(&a) if a != tier::ACTION_DEFAULT => a,
            _ => self.action,
        }
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
}
const _: () = assert!(size_of::<PortState>() == 32);

/// The daemon's share of a port's accounting. Written only by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserPortState {
    /// Epoch length of the port's handshake ring, as a power of two of ns
    /// (0: [`handshake::DEFAULT_SHIFT`]).
    pub handshake_shift: u32,
    pub _pad: u32,
    /// Drift healing: added to the kernel's established count (missed events, adopted sockets).
    pub established_adjust: i64,
    /// Drift healing: added to the kernel's busy count.
    pub busy_adjust: i64,
    /// Drift healing: connections corrected so far (reported, not used by the gate).
    pub drift_corrected: u64,
}
const _: () = assert!(size_of::<UserPortState>() == 32);

impl UserPortState {
    /// The epoch shift the gate uses, clamped to the supported range.
    #[inline(always)]
    pub const fn shift(&self) -> u32 {
        let s = self.handshake_shift;
        if s == 0 {
            handshake::DEFAULT_SHIFT
        } else if s < handshake::MIN_SHIFT {
            handshake::MIN_SHIFT
        } else if s > handshake::MAX_SHIFT {
            handshake::MAX_SHIFT
        } else {
            s
        }
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
}
const _: () = assert!(size_of::<NetnsFilter>() == 16);

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
/// Updated only from the socket's own events, which the socket lock serialises.
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
    pub _pad2: [u8; 3],
}
const _: () = assert!(size_of::<SockEntry>() == 80);

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

/// In-flight of a port: handshakes under way (`handshakes`, from the ring)
/// plus busy connections ([`count_mode::WORK`]) or established ones
/// ([`count_mode::CONNECTIONS`]). The counters are read without a lock, so a
/// momentarily inconsistent read is clamped at zero rather than wrapping.
#[inline(always)]
pub const fn in_flight(state: &PortState, handshakes: u64, user: &UserPortState, mode: u8) -> u64 {
    held(state, user, mode) + handshakes
}

/// Connections the port holds: busy or established, by `mode`.
#[inline(always)]
pub const fn held(state: &PortState, user: &UserPortState, mode: u8) -> u64 {
    if mode == count_mode::WORK { busy(state, user) } else { established(state, user) }
}

/// `a - b + adjust`, clamped at zero.
#[inline(always)]
const fn adjusted(a: u64, b: u64, adjust: i64) -> u64 {
    let v = a.wrapping_sub(b) as i64;
    let v = v.saturating_add(adjust);
    if v < 0 || a < b && adjust <= 0 { 0 } else { v as u64 }
}

#[inline(always)]
pub const fn busy(state: &PortState, user: &UserPortState) -> u64 {
    adjusted(state.busy_enter, state.busy_exit, user.busy_adjust)
}

#[inline(always)]
pub const fn established(state: &PortState, user: &UserPortState) -> u64 {
    adjusted(state.opened, state.closed, user.established_adjust)
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all are #[repr(C)], Copy, made of fixed-width integers and byte arrays, with no padding.
    unsafe impl aya::Pod for PortConfig {}
    unsafe impl aya::Pod for PortState {}
    unsafe impl aya::Pod for UserPortState {}
    unsafe impl aya::Pod for PortCounters {}
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
    fn in_flight_clamps_inconsistent_reads() {
        let user = |e, b| UserPortState { established_adjust: e, busy_adjust: b, ..UserPortState::default() };
        let state = PortState { opened: 3, closed: 5, busy_enter: 1, busy_exit: 2 };
        assert_eq!(in_flight(&state, 0, &user(0, 0), count_mode::CONNECTIONS), 0);
        assert_eq!(in_flight(&state, 0, &user(0, 0), count_mode::WORK), 0);
        let state = PortState { opened: 10, closed: 4, busy_enter: 7, busy_exit: 5 };
        assert_eq!(in_flight(&state, 4, &user(0, 0), count_mode::CONNECTIONS), 6 + 4);
        assert_eq!(in_flight(&state, 4, &user(0, 0), count_mode::WORK), 2 + 4);
        // Drift healing adjusts both ways, never below zero.
        assert_eq!(established(&state, &user(-2, 0)), 4);
        assert_eq!(established(&state, &user(3, 0)), 9);
        assert_eq!(established(&state, &user(-100, 0)), 0);
        assert_eq!(busy(&state, &user(0, -1)), 1);
    }

    #[test]
    fn handshake_shift_is_clamped() {
        let shift = |s| UserPortState { handshake_shift: s, ..UserPortState::default() }.shift();
        assert_eq!(shift(0), handshake::DEFAULT_SHIFT);
        assert_eq!(shift(1), handshake::MIN_SHIFT);
        assert_eq!(shift(20), 20);
        assert_eq!(shift(63), handshake::MAX_SHIFT);
        assert_eq!(rst_prefix(&ipv4_mapped([10, 1, 2, 3])), ipv4_mapped([10, 1, 2, 0]));
    }

    #[test]
    fn client_keys() {
        let mut config = PortConfig::new(3, action::DROP, false, count_mode::WORK);
        let v4 = ipv4_mapped([10, 1, 2, 3]);
        assert_eq!(config.client_key(&v4), ClientKey { slot: 3, addr: v4 }, "IPv4 clients are whole addresses");
        let v6: [u8; 16] = core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 3, 4, 5, 6).octets();
        let per_64 = core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, 0).octets();
        assert_eq!(config.client_key(&v6).addr, per_64);
        config.client_prefix_v6 = 52;
        assert_eq!(config.client_key(&v6).addr, core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0).octets());
        config.client_prefix_v6 = 128;
        assert_eq!(config.client_key(&v6).addr, v6);
    }

    #[test]
    fn ipv4_mapped_matches_std() {
        let v4 = core::net::Ipv4Addr::new(10, 1, 2, 3);
        assert_eq!(ipv4_mapped(v4.octets()), v4.to_ipv6_mapped().octets());
    }
}
