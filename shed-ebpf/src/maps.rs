// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The kernel maps. Names and layouts come from `shed_common`; the statics are
//! named exactly like `shed_common::map::*` (the `#[map]` macro needs a literal).
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray},
};
use shed_common::{
    ClientKey, Contention, ControlConfig, ControlStatus, GateCounters, HandshakeRing, HandshakeStamp, LastPassed,
    LocalAddr, NetnsFilter, PortConfig, PortCounters, PortLatency, PortState, RefusedTurn, SockEntry, SockLayout,
    TierReserve, UserPortState,
    capacity::{MAX_CLIENTS, MAX_PENDING_CLIENTS, MAX_PORTS, MAX_REFUSED_TURNS, MAX_SOCKS, MAX_TIER_ENTRIES},
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

/// The authoritative configs, for userspace; the programs read [`SHED_SLOT_CONFIG`].
#[map]
pub static SHED_PORTS: HashMap<u16, PortConfig> = HashMap::with_max_entries(MAX_PORTS, 0);

/// Each port's slot + 1, a byte a port (see [`shed_common::port_table`]).
#[map]
pub static SHED_PORT_SLOTS: Array<u64> = Array::with_max_entries(port_table::WORDS, 0);

#[map]
pub static SHED_SLOT_CONFIG: Array<PortConfig> = Array::with_max_entries(MAX_PORTS, 0);

/// The config of `port` if it is protected: two array lookups (the common
/// "not protected" answer after the first).
#[inline(always)]
pub fn port_config(port: u16) -> Option<PortConfig> {
    let slot = port_table::slot_plus_one(*SHED_PORT_SLOTS.get(port_table::word_of(port))?, port);
    if slot == 0 {
        return None;
    }
    SHED_SLOT_CONFIG.get(slot - 1).copied()
}

/// Whether `port` is protected (one array lookup).
#[inline(always)]
pub fn protected(port: u16) -> bool {
    SHED_PORT_SLOTS.get(port_table::word_of(port)).is_some_and(|&word| port_table::slot_plus_one(word, port) != 0)
}

#[map]
pub static SHED_PORT_STATE: Array<PortState> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_USER_STATE: Array<UserPortState> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_COUNTERS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_HANDSHAKES: Array<HandshakeRing> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_SILENT: Array<HandshakeRing> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_STAMPS: Array<HandshakeStamp> = Array::with_max_entries(MAX_PORTS * STAMPS_PER_PORT, 0);

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

/// The turn programs, installed by userspace as the gate programs load: the
/// gate's tail call for the first segment of a kept-alive connection's next
/// request. One array per hook: a program array serves one program type.
#[map]
pub static SHED_TURN_TC: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
pub static SHED_TURN_XDP: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The socket of the request a turn program judges, handed over by the gate
/// on this CPU just before its tail call (a per-CPU scratch).
#[map]
pub static SHED_TURN_SOCKET: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

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

/// Requests refused on kept-alive connections, by server socket, until the
/// daemon closes the socket ([`shed_common::RefusedTurn`]).
#[map]
pub static SHED_REFUSED_TURNS: LruHashMap<u64, RefusedTurn> = LruHashMap::with_max_entries(MAX_REFUSED_TURNS, 0);

#[map]
pub static SHED_LOCAL_ADDRS: Array<LocalAddr> = Array::with_max_entries(local_addr::SLOTS, 0);

#[map]
pub static SHED_LAST_PASSED: PerCpuArray<LastPassed> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static SHED_GATE_COUNTERS: PerCpuArray<GateCounters> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static SHED_SOCKS: HashMap<u64, SockEntry> = HashMap::with_max_entries(MAX_SOCKS, BPF_F_NO_PREALLOC);

#[map]
pub static SHED_LIMITS: Array<u32> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_LATENCY: PerCpuArray<PortLatency> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

// Userspace-only (controller settings and status); defined here so one object
// creates every map the gate pins.
#[map]
pub static SHED_CONTROL: Array<ControlConfig> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_STATUS: Array<ControlStatus> = Array::with_max_entries(MAX_PORTS, 0);

/// GCRA times (see `shed_common::ratelimit`), one per port.
#[map]
pub static SHED_RST_BUCKETS: Array<u64> = Array::with_max_entries(MAX_PORTS, 0);

/// GCRA times per source-prefix hash, a block per port: no insert on the reject
/// path, and one port's flood cannot evict another port's buckets.
#[map]
pub static SHED_RST_PREFIX: Array<u64> = Array::with_max_entries(MAX_PORTS * PREFIX_BUCKETS_PER_PORT, 0);

#[map]
pub static SHED_NETNS: Array<NetnsFilter> = Array::with_max_entries(1, 0);

#[map]
pub static SHED_CLIENTS: HashMap<ClientKey, i64> = HashMap::with_max_entries(MAX_CLIENTS, BPF_F_NO_PREALLOC);

#[map]
pub static SHED_PENDING_CLIENTS: LruHashMap<ClientKey, HandshakeRing> =
    LruHashMap::with_max_entries(MAX_PENDING_CLIENTS, 0);

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

#[map]
pub static SHED_CONTENTION: Array<Contention> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_RESERVE: Array<TierReserve> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_TIERS: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_TIER_ENTRIES, 0);

/// The tier of a client address (IPv4-mapped for IPv4); unlisted sources are normal.
#[inline(always)]
pub fn tier_of(addr: &[u8; 16]) -> u8 {
    let key = aya_ebpf::maps::lpm_trie::Key::new(128, *addr);
    match SHED_TIERS.get(&key) {
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
    let in_slot = |slot: u32| match SHED_LOCAL_ADDRS.get_ptr(slot) {
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
    if let Some(counters) = SHED_GATE_COUNTERS.get_ptr_mut(0)
        // SAFETY: this CPU's slot of a per-CPU array map, valid for this run; `get_mut` checks the index.
        && let Some(v) = unsafe { (*counters).values.get_mut(index) }
    {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        *v += 1;
    }
}

/// Adds one to a per-CPU counter of the port in `slot`.
#[inline(always)]
pub fn count(slot: u32, index: usize) {
    if let Some(counters) = SHED_COUNTERS.get_ptr_mut(slot)
        // SAFETY: this CPU's slot of a per-CPU array map, valid for this run; `get_mut` checks the index.
        && let Some(v) = unsafe { (*counters).values.get_mut(index) }
    {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        *v += 1;
    }
}
