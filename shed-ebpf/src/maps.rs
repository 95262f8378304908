// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The kernel maps. Names and layouts come from `shed_common`; the statics are
//! named exactly like `shed_common::map::*` (the `#[map]` macro needs a literal).
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps,
    macros::{btf_map, map},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
};
use shed_common::{
    ClientKey, Contention, ControlConfig, ControlStatus, GateCounters, HandshakeRing, HandshakeStamp, LastPassed,
    LocalAddr, NetnsFilter, PortConfig, PortCounters, PortLatency, PortState, RefusedTurn, SockEntry, SockLayout,
    TierReserve, UserPortState,
    capacity::{
        MAX_CLIENTS, MAX_PENDING_CLIENTS, MAX_PORTS, MAX_REFUSED_TURNS, MAX_SOCKS, MAX_TIER_ENTRIES, POD_MAX_PORTS,
    },
    handshake::STAMPS_PER_PORT,
    is_ipv4_mapped, local_addr, port_table,
    ratelimit::PREFIX_BUCKETS_PER_PORT,
};

/// The secret of the handshake stamps' flow hash
/// ([`shed_common::handshake::keyed_flow_hash`]), drawn by userspace at load
/// (`FLOW_SECRET_GLOBAL`); read-only data the verifier sees as a constant map.
#[unsafe(no_mangle)]
static SHED_FLOW_SECRET: u64 = 0;

/// The key of the `http` answer's SYN cookies ([`shed_common::http`]), drawn
/// by userspace at load (`COOKIE_KEY_GLOBAL`).
#[unsafe(no_mangle)]
static SHED_COOKIE_KEY: [u64; 2] = [0; 2];

/// [`SHED_COOKIE_KEY`], read as the verifier's constant.
#[inline(always)]
pub fn cookie_key() -> [u64; 2] {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_COOKIE_KEY) }
}

/// Where the kernel keeps a request socket's initial sequence number (the
/// one its SYN-ACK carried): `offsetof(struct tcp_request_sock, snt_isn)` on
/// the running kernel, from its BTF (`SNT_ISN_OFFSET_GLOBAL`); 0 when
/// userspace could not find it.
#[unsafe(no_mangle)]
static SHED_SNT_ISN_OFFSET: u32 = 0;

/// [`SHED_SNT_ISN_OFFSET`], read as the verifier's constant.
#[inline(always)]
pub fn snt_isn_offset() -> u32 {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_SNT_ISN_OFFSET) }
}

/// Where the kernel keeps a request socket's peer's initial sequence number:
/// `offsetof(struct tcp_request_sock, rcv_isn)` on the running kernel
/// (`RCV_ISN_OFFSET_GLOBAL`); 0 when userspace could not find it.
#[unsafe(no_mangle)]
static SHED_RCV_ISN_OFFSET: u32 = 0;

/// [`SHED_RCV_ISN_OFFSET`], read as the verifier's constant.
#[inline(always)]
pub fn rcv_isn_offset() -> u32 {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_RCV_ISN_OFFSET) }
}

/// Where the raw `inet_sock_set_state` program finds the record's fields in
/// the socket (`SOCK_LAYOUT_GLOBAL`), from the kernel's BTF at load.
#[unsafe(no_mangle)]
static SHED_SOCK_LAYOUT: SockLayout = SockLayout {
    family: 0,
    protocol: 0,
    local_port: 0,
    remote_port: 0,
    local_v4: 0,
    remote_v4: 0,
    local_v6: 0,
    remote_v6: 0,
};

/// [`SHED_SOCK_LAYOUT`], read as the verifier's constant.
#[inline(always)]
pub fn sock_layout() -> SockLayout {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0s it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_SOCK_LAYOUT) }
}

/// The stamp hash of a flow, under the secret drawn at load.
#[inline(always)]
pub fn stamp_hash(client: &[u8; 16], server: &[u8; 16], client_port: u16, server_port: u16) -> u32 {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    let key = unsafe { core::ptr::read_volatile(&raw const SHED_FLOW_SECRET) };
    shed_common::handshake::keyed_flow_hash(key, client, server, client_port, server_port)
}

/// Whether this object serves every pod of a node (built with the `shared`
/// feature, see [`shed_common::dispatch::SHARED_OBJECT`]): each gated map
/// below is then the pod's own, found in its `_OF` array at the gate of the
/// running program ([`gate_now`]). A compile-time constant: a node's gate is
/// built without a single `_OF` path, its frames and verification as before.
#[inline(always)]
pub const fn shared() -> bool {
    cfg!(feature = "shared")
}

/// Per CPU: [0] the gate (+1) of the program running now, [1] the gate to
/// restore when a turn program ends (its caller's tail call did not return).
#[map]
pub static SHED_GATE_NOW: PerCpuArray<u32> = PerCpuArray::with_max_entries(2, 0);

/// The gate the running program judges or counts for (shared objects only).
#[cfg_attr(not(feature = "shared"), expect(dead_code, reason = "read only by a shared object's gated maps"))]
#[inline(always)]
fn gate_now() -> Option<u32> {
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    let plus_one = unsafe { *SHED_GATE_NOW.get_ptr(0)? };
    // None entered: u32::MAX, past every array of maps (its lookup fails), without a branch here.
    Some(plus_one.wrapping_sub(1))
}

/// Makes `gate` the running program's; returns the gate it replaces, to
/// give back with [`leave_gate`]. Programs nest on a CPU (a packet's
/// softirq over a process's `recv`), always last in, first out: each entry
/// point that enters gives back before it returns.
#[inline(always)]
pub fn enter_gate(gate: u32) -> u32 {
    let Some(now) = SHED_GATE_NOW.get_ptr_mut(0) else { return 0 };
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    unsafe { core::mem::replace(&mut *now, gate.saturating_add(1)) }
}

/// Gives back the gate [`enter_gate`] replaced.
#[inline(always)]
pub fn leave_gate(before: u32) {
    if let Some(now) = SHED_GATE_NOW.get_ptr_mut(0) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe { *now = before };
    }
}

/// Keeps the gate to give back for the turn program a tail call starts
/// (a TC program does not nest on its CPU: one softirq at a time).
#[inline(always)]
pub fn hand_gate_to_turn(before: u32) {
    if let Some(kept) = SHED_GATE_NOW.get_ptr_mut(1) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe { *kept = before };
    }
}

/// The gate [`hand_gate_to_turn`] kept, taken.
#[inline(always)]
pub fn take_gate_from_caller() -> u32 {
    let Some(kept) = SHED_GATE_NOW.get_ptr_mut(1) else { return 0 };
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    unsafe { core::mem::replace(&mut *kept, 0) }
}

/// A map each gate has of its own: the static a node's gate uses, the
/// `ArrayOfMaps` a shared object finds each pod's in, and the function that
/// returns the running gate's. The static's size in the type is a pod's (an
/// inner array must be as long as its template); a node's gate is loaded
/// with its own sizes (`LoadOptions::map_sizes`).
macro_rules! gated {
    ($(#[$doc:meta])* $name:ident, $outer:ident, $get:ident: $ty:ty) => {
        $(#[$doc])*
        #[btf_map]
        pub static $name: $ty = <$ty>::new();

        #[cfg(feature = "shared")]
        #[btf_map]
        pub static $outer: btf_maps::ArrayOfMaps<$ty, { shed_common::dispatch::GATES as usize }> =
            btf_maps::ArrayOfMaps::new();

        #[doc = concat!("The running gate's `", stringify!($name), "`.")]
        #[inline(always)]
        pub fn $get() -> Option<&'static $ty> {
            #[cfg(feature = "shared")]
            return $outer.get(gate_now()?);
            #[cfg(not(feature = "shared"))]
            Some(&$name)
        }
    };
}

/// Each gate's own maps ([`gated`]), and the running gate's, by function.
pub mod gate {
    use super::*;

    const POD_SLOTS: usize = POD_MAX_PORTS as usize;
    const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

    gated!(
        /// Each port's slot + 1, a byte a port (see [`shed_common::port_table`]).
        SHED_PORT_SLOTS, SHED_PORT_SLOTS_OF, port_slots: btf_maps::Array<u64, { port_table::WORDS as usize }>
    );
    gated!(SHED_SLOT_CONFIG, SHED_SLOT_CONFIG_OF, slot_config: btf_maps::Array<PortConfig, POD_SLOTS>);
    gated!(SHED_PORT_STATE, SHED_PORT_STATE_OF, port_state: btf_maps::Array<PortState, POD_SLOTS>);
    gated!(SHED_USER_STATE, SHED_USER_STATE_OF, user_state: btf_maps::Array<UserPortState, POD_SLOTS>);
    gated!(SHED_COUNTERS, SHED_COUNTERS_OF, counters: btf_maps::PerCpuArray<PortCounters, POD_SLOTS>);
    gated!(SHED_HANDSHAKES, SHED_HANDSHAKES_OF, handshakes: btf_maps::Array<HandshakeRing, POD_SLOTS>);
    gated!(SHED_SILENT, SHED_SILENT_OF, silent: btf_maps::Array<HandshakeRing, POD_SLOTS>);
    gated!(
        SHED_STAMPS, SHED_STAMPS_OF,
        stamps: btf_maps::Array<HandshakeStamp, { POD_SLOTS * STAMPS_PER_PORT as usize }>
    );
    gated!(
        /// Requests refused on kept-alive connections, by server socket, until the
        /// daemon closes the socket ([`shed_common::RefusedTurn`]).
        SHED_REFUSED_TURNS, SHED_REFUSED_TURNS_OF,
        refused_turns: btf_maps::LruHashMap<u64, RefusedTurn, { MAX_REFUSED_TURNS as usize }>
    );
    gated!(SHED_LOCAL_ADDRS, SHED_LOCAL_ADDRS_OF, local_addrs: btf_maps::Array<LocalAddr, { local_addr::SLOTS as usize }>);
    gated!(SHED_GATE_COUNTERS, SHED_GATE_COUNTERS_OF, gate_counters: btf_maps::PerCpuArray<GateCounters, 1>);
    gated!(SHED_SOCKS, SHED_SOCKS_OF, socks: btf_maps::HashMap<u64, SockEntry, { MAX_SOCKS as usize }, NO_PREALLOC>);
    gated!(SHED_LIMITS, SHED_LIMITS_OF, limits: btf_maps::Array<u32, POD_SLOTS>);
    gated!(SHED_LATENCY, SHED_LATENCY_OF, latency: btf_maps::PerCpuArray<PortLatency, POD_SLOTS>);
    gated!(
        /// GCRA times (see `shed_common::ratelimit`), one per port.
        SHED_RST_BUCKETS, SHED_RST_BUCKETS_OF, rst_buckets: btf_maps::Array<u64, POD_SLOTS>
    );
    gated!(
        /// GCRA times per source-prefix hash, a block per port: no insert on the reject
        /// path, and one port's flood cannot evict another port's buckets.
        SHED_RST_PREFIX, SHED_RST_PREFIX_OF,
        rst_prefix: btf_maps::Array<u64, { POD_SLOTS * PREFIX_BUCKETS_PER_PORT as usize }>
    );
    gated!(SHED_CLIENTS, SHED_CLIENTS_OF, clients: btf_maps::HashMap<ClientKey, i64, { MAX_CLIENTS as usize }, NO_PREALLOC>);
    gated!(
        SHED_PENDING_CLIENTS, SHED_PENDING_CLIENTS_OF,
        pending_clients: btf_maps::LruHashMap<ClientKey, HandshakeRing, { MAX_PENDING_CLIENTS as usize }>
    );
    gated!(SHED_CONTENTION, SHED_CONTENTION_OF, contention: btf_maps::Array<Contention, POD_SLOTS>);
    gated!(SHED_RESERVE, SHED_RESERVE_OF, reserve: btf_maps::Array<TierReserve, POD_SLOTS>);
    gated!(
        SHED_TIERS, SHED_TIERS_OF,
        tiers: btf_maps::LpmTrie<[u8; 16], u32, { MAX_TIER_ENTRIES as usize }>
    );
}

/// The authoritative configs, for userspace; the programs read [`SHED_SLOT_CONFIG`].
#[map]
pub static SHED_PORTS: HashMap<u16, PortConfig> = HashMap::with_max_entries(MAX_PORTS, 0);

/// The config of `port` if it is protected: two array lookups (the common
/// "not protected" answer after the first).
#[inline(always)]
pub fn port_config(port: u16) -> Option<PortConfig> {
    let slot = port_table::slot_plus_one(*gate::port_slots()?.get(port_table::word_of(port))?, port);
    if slot == 0 {
        return None;
    }
    gate::slot_config()?.get(slot - 1).copied()
}

/// Whether `port` is protected (one array lookup).
#[inline(always)]
pub fn protected(port: u16) -> bool {
    gate::port_slots()
        .and_then(|words| words.get(port_table::word_of(port)))
        .is_some_and(|&word| port_table::slot_plus_one(word, port) != 0)
}

/// Where the kernel keeps a connection's next expected sequence number:
/// `offsetof(struct tcp_sock, rcv_nxt)` on the running kernel, from its BTF
/// (`RCV_NXT_OFFSET_GLOBAL`); 0 when userspace could not find it.
#[unsafe(no_mangle)]
static SHED_RCV_NXT_OFFSET: u32 = 0;

/// [`SHED_RCV_NXT_OFFSET`], read as the verifier's constant.
#[inline(always)]
pub fn rcv_nxt_offset() -> u32 {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_RCV_NXT_OFFSET) }
}

/// Where the kernel keeps a socket's state and what its application read:
/// `offsetof(struct sock_common, skc_state)` and `offsetof(struct tcp_sock,
/// copied_seq)` on the running kernel, from its BTF
/// (`SK_STATE_OFFSET_GLOBAL`, `COPIED_SEQ_OFFSET_GLOBAL`); 0 when userspace
/// could not find them.
#[unsafe(no_mangle)]
static SHED_SK_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SHED_COPIED_SEQ_OFFSET: u32 = 0;

/// [`SHED_SK_STATE_OFFSET`] and [`SHED_COPIED_SEQ_OFFSET`], read as the verifier's constants.
#[inline(always)]
pub fn sk_state_offset() -> u32 {
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    unsafe { core::ptr::read_volatile(&raw const SHED_SK_STATE_OFFSET) }
}
#[inline(always)]
pub fn copied_seq_offset() -> u32 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&raw const SHED_COPIED_SEQ_OFFSET) }
}

/// The turn programs, installed by userspace as the gate programs load: the
/// gate's tail call for the first segment of a kept-alive connection's next
/// request. One array per hook: a program array serves one program type.
#[map]
pub static SHED_TURN_TC: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
pub static SHED_TURN_XDP: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The socket of the request a turn program judges, handed over by the gate
/// on this CPU just before its tail call (a per-CPU scratch): [0] its
/// address, [1] 1 if a request on it was refused before (then its record in
/// `SHED_REFUSED_TURNS` is looked for; else the lookup is skipped).
#[map]
pub static SHED_TURN_SOCKET: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Hands over whether the socket being handed over had a request refused ([`turn_refused_before`]).
#[inline(always)]
pub fn set_turn_refused_before(refused: bool) {
    if let Some(slot) = SHED_TURN_SOCKET.get_ptr_mut(1) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe { *slot = u64::from(refused) };
    }
}

/// What [`set_turn_refused_before`] handed over with this CPU's turn socket.
#[inline(always)]
pub fn turn_refused_before() -> bool {
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    SHED_TURN_SOCKET.get_ptr(1).is_none_or(|slot| unsafe { *slot } != 0)
}

#[inline(always)]
pub fn set_turn_socket(sk: u64) {
    if let Some(slot) = SHED_TURN_SOCKET.get_ptr_mut(0) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe { *slot = sk };
    }
}

/// Whether the gate handed a socket over on this CPU (left for the turn program to take).
#[inline(always)]
pub fn turn_pending() -> bool {
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    SHED_TURN_SOCKET.get_ptr(0).is_some_and(|slot| unsafe { *slot } != 0)
}

/// The socket [`set_turn_socket`] handed over (0: none), cleared as read.
#[inline(always)]
pub fn take_turn_socket() -> u64 {
    let Some(slot) = SHED_TURN_SOCKET.get_ptr_mut(0) else { return 0 };
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    unsafe { core::mem::replace(&mut *slot, 0) }
}

#[map]
pub static SHED_LAST_PASSED: PerCpuArray<LastPassed> = PerCpuArray::with_max_entries(1, 0);

// Userspace-only (controller settings and status); defined here so one object
// creates every map the gate pins.
#[map]
pub static SHED_CONTROL: Array<ControlConfig> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_STATUS: Array<ControlStatus> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_NETNS: Array<NetnsFilter> = Array::with_max_entries(1, 0);

/// A word a program writes and reads back at once, so that the verifier
/// forgets which path made the value ([`forget`]). Per CPU.
#[map]
pub static SHED_FORGET: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `n` written to this CPU's [`SHED_FORGET`] and read back: the verifier
/// cannot tell one path's value from another's behind it (map memory holds
/// unknown scalars), so the paths that computed it merge there rather than
/// each walking the rest of the program. (0 if the lookup failed, which it
/// does not: an array's one entry.)
#[inline(always)]
pub fn forget(n: u64) -> u64 {
    let Some(word) = SHED_FORGET.get_ptr_mut(0) else { return 0 };
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    unsafe {
        core::ptr::write_volatile(word, n);
        core::ptr::read_volatile(word)
    }
}

#[map]
pub static SHED_EMPTY_RING: Array<HandshakeRing> = Array::with_max_entries(1, 0);

/// The tier of a client address (IPv4-mapped for IPv4); unlisted sources are normal.
#[inline(always)]
pub fn tier_of(addr: &[u8; 16]) -> u8 {
    let key = aya_ebpf::maps::lpm_trie::Key::new(128, *addr);
    match gate::tiers().and_then(|tiers| tiers.get(&key)) {
        Some(&t) if (t as usize) < shed_common::tier::COUNT => t as u8,
        _ => shed_common::tier::NORMAL,
    }
}

/// Whether `addr` is one of the protected namespace's own unicast addresses
/// (loopback included): only SYNs addressed to it are judged.
#[inline(always)]
pub fn is_local(addr: &[u8; 16]) -> bool {
    if is_loopback(addr) {
        return true;
    }
    local_kind(addr) == local_addr::UNICAST
}

/// What `addr` is to this namespace: one of `local_addr`'s kinds, 0 if none.
/// A subprogram: its stack stays out of the decision's frame.
#[inline(never)]
pub fn local_kind(addr: &[u8; 16]) -> u32 {
    let (a, b) = local_addr::slots(addr);
    let Some(addrs) = gate::local_addrs() else { return 0 };
    let in_slot = |slot: u32| match addrs.get_ptr(slot) {
        // SAFETY: map value; compared in place, without a copy on the stack.
        Some(entry) if unsafe { (*entry).kind != 0 && (*entry).addr == *addr } => unsafe { (*entry).kind },
        _ => 0,
    };
    let kind = in_slot(a);
    if kind != 0 { kind } else { in_slot(b) }
}

/// 127.0.0.0/8 (IPv4-mapped) or ::1.
#[inline(always)]
pub fn is_loopback(addr: &[u8; 16]) -> bool {
    (is_ipv4_mapped(addr) && addr[12] == 127) || *addr == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
}

/// Adds one to a gate-wide per-CPU counter.
#[inline(always)]
pub fn count_gate(index: usize) {
    if let Some(counters) = gate::gate_counters().and_then(|c| c.get_ptr_mut(0))
        // SAFETY: this CPU's slot of a per-CPU array map, valid for this run; `get_mut` checks the index.
        && let Some(v) = unsafe { (*counters).values.get_mut(index) }
    {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        *v += 1;
    }
}

/// Adds `n` to a per-CPU counter of the port in `slot`.
#[inline(always)]
pub fn count_by(slot: u32, index: usize, n: u64) {
    if let Some(counters) = gate::counters().and_then(|c| c.get_ptr_mut(slot))
        // SAFETY: this CPU's slot of a per-CPU array map, valid for this run; `get_mut` checks the index.
        && let Some(v) = unsafe { (*counters).values.get_mut(index) }
    {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        *v += n;
    }
}

/// Adds one to a per-CPU counter of the port in `slot`.
#[inline(always)]
pub fn count(slot: u32, index: usize) {
    if let Some(counters) = gate::counters().and_then(|c| c.get_ptr_mut(slot))
        // SAFETY: this CPU's slot of a per-CPU array map, valid for this run; `get_mut` checks the index.
        && let Some(v) = unsafe { (*counters).values.get_mut(index) }
    {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        *v += 1;
    }
}
