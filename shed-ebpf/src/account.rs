// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! In-flight accounting and request latency, from socket tracepoints.
//!
//! A passive-open socket of a protected port is tracked from SYN_RECV ->
//! ESTABLISHED to its final CLOSE. Membership in `SHED_SOCKS` makes counting
//! exactly-once: only the CPU whose insert (or delete) succeeds counts the
//! open (or the close); a busy or silent spell is ended by whichever event
//! takes its flag (below). A socket's close events are serialised by its lock.
//!
//! Per request turn (keep-alive connections have many), from raw tracepoints:
//! arrival (`sk_data_ready`) -> pick-up (`sock_recv_length`) -> first response
//! byte (`sock_send_length`). A connection is busy from a request's arrival
//! until it answers; an idle keep-alive connection is not. One that has sent
//! nothing since it was accepted is *silent*: it counts in the port's silent
//! ring, so only for the idle grace (a request a moment behind its handshake
//! must not let a burst overshoot; a connection that never sends must not hold
//! the port), and becomes busy when its first bytes arrive.
//! A socket's state changes and `sk_data_ready` run under its lock, but
//! `sock_send_length` and `sock_recv_length` fire after the send or receive
//! has released it, while a request arriving or the connection closing runs
//! on another CPU: the entry's `busy` and `silent` flags, which decide what is
//! counted, change only by compare-and-swap ([`take_flag`]), so each is
//! counted once. Its latency stamps are plain stores: a race costs one sample.
//!
//! A connection of a multiplexed port ([`count_mode::MULTIPLEXED`]) carries
//! many requests at once, so its turns are not requests: it stays busy until
//! closed and records only each read's time in the receive queue.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    programs::TracePointContext,
};
use shed_common::{
    ClientKey, FlowKey, SockEntry, address_family as family, count_mode, counter, ipv4_mapped, latency,
    sock_state_tp as tp, tcp_state,
};

use crate::{
    atomic::add as atomic_add,
    client::{client_add, client_release},
    fault::fault,
    maps::{SHED_NETNS, count, count_by, gate, port_config, shared, sock_layout, stamp_hash, tier_of},
    ring,
    stamp::complete,
};

const IPPROTO_TCP: u16 = 6;
const EEXIST: i32 = 17;
/// The error a port at its connection quota gets instead of an insert.
const E2BIG: i32 = 7;

/// A `sock:inet_sock_set_state` event: the fields its record copies from the
/// socket, read from the record (regular tracepoint) or from the socket
/// itself (raw tracepoint). Getters are lazy: most events end after the states.
pub trait StateChange {
    fn protocol(&self) -> Result<u16, i32>;
    fn old_state(&self) -> Result<i32, i32>;
    fn new_state(&self) -> Result<i32, i32>;
    /// The socket's address: the key of `SHED_SOCKS`.
    fn sk(&self) -> Result<u64, i32>;
    fn local_port(&self) -> Result<u16, i32>;
    fn client_port(&self) -> Result<u16, i32>;
    fn client_addr(&self) -> Result<[u8; 16], i32>;
    fn server_addr(&self) -> Result<[u8; 16], i32>;
}

/// The regular tracepoint's record. Offsets from its format, checked against
/// tracefs by userspace at attach.
impl StateChange for TracePointContext {
    fn protocol(&self) -> Result<u16, i32> {
        // SAFETY: the helper reads the record and fails cleanly past its end.
        unsafe { self.read_at(tp::PROTOCOL) }
    }
    fn old_state(&self) -> Result<i32, i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::OLDSTATE) }
    }
    fn new_state(&self) -> Result<i32, i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::NEWSTATE) }
    }
    fn sk(&self) -> Result<u64, i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::SKADDR) }
    }
    fn local_port(&self) -> Result<u16, i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::SPORT) }
    }
    fn client_port(&self) -> Result<u16, i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::DPORT) }
    }
    fn client_addr(&self) -> Result<[u8; 16], i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::DADDR_V6) }
    }
    fn server_addr(&self) -> Result<[u8; 16], i32> {
        // SAFETY: as above.
        unsafe { self.read_at(tp::SADDR_V6) }
    }
}

/// The raw tracepoint's arguments, `(const struct sock *sk, int oldstate,
/// int newstate)`; the rest is read from the socket at the offsets userspace
/// found in the kernel's BTF ([`sock_layout`]), as the record's
/// `TP_fast_assign` reads them.
pub struct RawStateChange {
    pub sk: u64,
    pub old: i32,
    pub new: i32,
}

impl RawStateChange {
    #[inline(always)]
    fn field<T>(&self, offset: u32) -> Result<T, i32> {
        // SAFETY: the helper reads kernel memory and fails cleanly on a bad address.
        unsafe { bpf_probe_read_kernel((self.sk + u64::from(offset)) as *const T) }
    }

    /// A local (`v4`, `v6`) or the remote address, IPv4 mapped into IPv6 as the record writes it.
    #[inline(always)]
    fn addr(&self, v4: u32, v6: u32) -> Result<[u8; 16], i32> {
        let layout = sock_layout();
        if self.field::<u16>(layout.family)? == family::INET6 {
            self.field(v6)
        } else {
            self.field::<[u8; 4]>(v4).map(ipv4_mapped)
        }
    }
}

impl StateChange for RawStateChange {
    fn protocol(&self) -> Result<u16, i32> {
        let offset = sock_layout().protocol;
        // No layout: nothing is counted (userspace attaches the regular tracepoint instead).
        if offset == 0 { Err(-1) } else { self.field(offset) }
    }
    fn old_state(&self) -> Result<i32, i32> {
        Ok(self.old)
    }
    fn new_state(&self) -> Result<i32, i32> {
        Ok(self.new)
    }
    fn sk(&self) -> Result<u64, i32> {
        Ok(self.sk)
    }
    fn local_port(&self) -> Result<u16, i32> {
        self.field(sock_layout().local_port)
    }
    fn client_port(&self) -> Result<u16, i32> {
        let port = self.field::<u16>(sock_layout().remote_port)?;
        Ok(if fault!("raw_client_port_unswapped") { port } else { u16::from_be(port) })
    }
    fn client_addr(&self) -> Result<[u8; 16], i32> {
        let layout = sock_layout();
        self.addr(layout.remote_v4, layout.remote_v6)
    }
    fn server_addr(&self) -> Result<[u8; 16], i32> {
        let layout = sock_layout();
        self.addr(layout.local_v4, layout.local_v6)
    }
}

#[inline(always)]
pub fn on_sock_state<E: StateChange>(event: &E) {
    let _ = try_on_sock_state(event);
}

fn state_field(slot: u32) -> Option<*mut shed_common::PortState> {
    gate::port_state().and_then(|m| m.get_ptr_mut(slot))
}

fn try_on_sock_state<E: StateChange>(event: &E) -> Result<(), i32> {
    // The states first: free from the raw tracepoint, and most events are
    // neither a close nor a handshake's end (every gate on the host runs this
    // for every socket of every namespace).
    let newstate = event.new_state()?;
    if newstate != tcp_state::CLOSE && newstate != tcp_state::ESTABLISHED {
        return Ok(());
    }
    if event.protocol()? != IPPROTO_TCP {
        return Ok(());
    }
    let skaddr = event.sk()?;
    if newstate == tcp_state::CLOSE {
        untrack(skaddr);
        return Ok(());
    }
    if event.old_state()? != tcp_state::SYN_RECV {
        return Ok(());
    }
    established(event, skaddr)
}

/// A tracked socket closed: its counts released (silent, busy, open, its client's).
#[inline(always)]
fn untrack(skaddr: u64) {
    let Some(live) = tracked(skaddr) else { return };
    // Its flags taken before it goes: an answer's send finishing on another
    // CPU meanwhile ends the busy spell once, either there or here.
    let (silent, busy) = (take_flag(live, SILENT_AT, 1, 0), take_flag(live, BUSY_AT, 1, 0));
    // SAFETY: plain data copied out of the map value.
    let entry = unsafe { *live };
    if gate::socks().map_or(Err(-1), |m| m.remove(&skaddr)).is_ok()
        && let Some(state) = state_field(entry.slot)
    {
        if silent {
            end_silence(entry.slot, entry.silent_epoch);
        }
        if busy {
            // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
            atomic_add(unsafe { &raw mut (*state).busy_exit }, 1);
            // A request that arrived and owed an answer went with its
            // connection: abandoned, at its age (a lower bound on its latency).
            if entry.arrival_ns != 0 && entry.multiplexed == 0 {
                // SAFETY: reading the clock has no preconditions.
                let age_us = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.arrival_ns) / 1000;
                count(entry.slot, counter::ABANDONED);
                count_by(entry.slot, counter::ABANDONED_AGE_US, age_us);
            }
        }
        if !(fault!("close_not_counted") && busy) {
            // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
            atomic_add(unsafe { &raw mut (*state).closed }, 1);
        }
        if entry.capped != 0 && !fault!("client_not_released") {
            client_release(&ClientKey { slot: entry.slot, addr: entry.client });
        }
    }
}

/// A handshake of a protected port completed: the connection is tracked
/// and counted, then its handshake's reservation released.
#[inline(always)]
fn established<E: StateChange>(event: &E, skaddr: u64) -> Result<(), i32> {
    let local_port = event.local_port()?;
    let Some(config) = port_config(local_port) else {
        return Ok(());
    };
    if !in_protected_netns(skaddr) {
        return Ok(());
    }
    let slot = config.slot;
    let Some(state) = state_field(slot) else {
        return Ok(());
    };
    let client_addr = event.client_addr()?;
    if config.tiered != 0 && tier_of(&client_addr) == shed_common::tier::EXEMPT {
        // Exempt clients are never counted (nor reserved for at the gate).
        return Ok(());
    }
    let key = FlowKey {
        client_addr,
        server_addr: event.server_addr()?,
        client_port: event.client_port()?,
        server_port: local_port,
    };
    // The connection is counted first and its handshake released after, so it is
    // never in neither count.
    let client = config.client_key(&client_addr);
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let user = gate::user_state().and_then(|m| m.get(slot)).copied().unwrap_or_default();
    // Accepted, nothing sent yet: in `work` mode silent (counted for the idle
    // grace only: a burst of connections whose requests follow a moment later
    // must not overshoot the limit, a connection that never sends must not
    // hold it); in the other modes busy until answered or closed.
    let silent = config.count_mode == count_mode::WORK && !fault!("idle_counted");
    let mut entry = SockEntry {
        slot,
        port: local_port,
        busy: u8::from(!silent),
        capped: 0,
        arrival_ns: 0,
        pickup_ns: 0,
        client: client.addr,
        flow: key,
        multiplexed: u8::from(config.count_mode == count_mode::MULTIPLEXED),
        silent: u8::from(silent),
        refused_request: 0,
        _pad2: 0,
        silent_epoch: now >> user.silent_shift(),
    };
    if config.counts_clients() {
        if client_add(&client) {
            entry.capped = 1;
        } else {
            count(slot, counter::CLIENT_MAP_FULL);
            crate::rare::client_map_full(slot);
        }
    }
    track(skaddr, &entry, state, &user, &client);
    // Counted first, released after: never in neither count.
    release(slot, &key, config.counts_clients().then_some(&client), now, user.shift());
    Ok(())
}

/// Inserts a new connection's entry and counts it (open, busy or silent),
/// within the port's quota of the shared map; a connection that finds no room
/// is not counted (fail-open), and the healer adopts it when room frees.
#[inline(always)]
fn track(
    skaddr: u64,
    entry: &SockEntry,
    state: *mut shed_common::PortState,
    user: &shed_common::UserPortState,
    client: &ClientKey,
) {
    let slot = entry.slot;
    // A port at its quota of the shared map is full for itself only: the
    // other ports keep their room.
    // SAFETY: `state` is a slot of an array map, valid for this run; copied as plain data.
    let room = user.connection_room(&unsafe { *state }) || fault!("connection_quota_ignored");
    let inserted = if room {
        gate::socks().map_or(Err(-1), |m| m.insert(&skaddr, entry, u64::from(BPF_NOEXIST)))
    } else {
        Err(-E2BIG)
    };
    match inserted {
        Ok(()) => {
            if entry.silent != 0
                && let Some(silent) = gate::silent().and_then(|m| m.get_ptr_mut(slot))
            {
                let _ = ring::open(silent, entry.silent_epoch);
            }
            if entry.busy != 0 {
                // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
                atomic_add(unsafe { &raw mut (*state).busy_enter }, 1);
            }
            // SAFETY: as above.
            atomic_add(unsafe { &raw mut (*state).opened }, 1);
        }
        Err(err) => {
            if entry.capped != 0 {
                client_release(client);
            }
            // Already tracked: a repeated event, nothing lost. Anything else (the map
            // is full, or out of memory): this connection is not counted (fail-open),
            // and the healer is told to adopt it when room frees.
            if err != -EEXIST {
                count(slot, counter::CONNECTION_MAP_FULL);
                crate::rare::connection_map_full(slot);
            }
        }
    }
}

/// Ends a connection's silence (its first bytes, its server's first answer,
/// or its close): its place in the silent ring is released, if the grace has
/// not ended it already.
#[inline(always)]
fn end_silence(slot: u32, epoch: u64) {
    let Some(silent) = gate::silent().and_then(|m| m.get_ptr_mut(slot)) else { return };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let shift = gate::user_state().and_then(|m| m.get(slot)).copied().unwrap_or_default().silent_shift();
    ring::close(silent, epoch, now >> shift);
}

/// Releases the admission reservation of `key`'s connection: it now counts as
/// established (or busy), or it closed.
#[inline(always)]
/// `client`: the admission was charged to it (the port counts clients).
fn release(slot: u32, key: &FlowKey, client: Option<&ClientKey>, now: u64, shift: u32) {
    let flow = stamp_hash(&key.client_addr, &key.server_addr, key.client_port, key.server_port);
    let (took, in_time) = complete(slot, shift, flow, client, now);
    if let Some(ns) = took {
        record(slot, Histogram::Handshake, ns);
    }
    if !in_time {
        // Counted from now on all the same (the ACK was judged when it arrived).
        count(slot, counter::LATE_COMPLETED);
    }
}

/// Whether the socket lives in the namespace the gate protects (true when
/// the daemon could not tell: counting too much beats counting nothing).
#[inline(always)]
fn in_protected_netns(skaddr: u64) -> bool {
    // A shared object's dispatcher found the gate by this very namespace.
    if shared() {
        return true;
    }
    let Some(filter) = SHED_NETNS.get(0) else { return true };
    if filter.enabled == 0 {
        return true;
    }
    // SAFETY: probe reads of kernel memory at offsets from the kernel's own BTF.
    let net: Result<u64, _> =
        unsafe { bpf_probe_read_kernel((skaddr + u64::from(filter.skc_net_offset)) as *const u64) };
    let Ok(net) = net else { return true };
    let inum: Result<u32, _> =
        // SAFETY: the helper reads kernel memory and fails cleanly on a bad address.
        unsafe { bpf_probe_read_kernel((net + u64::from(filter.net_inum_offset)) as *const u32) };
    inum.map_or(true, |inum| inum == filter.inum)
}

/// The tracked socket of an I/O event, if it is one of ours: only sockets of
/// protected ports are in `SHED_SOCKS`, so the address alone decides.
#[inline(always)]
fn tracked(sk: u64) -> Option<*mut SockEntry> {
    gate::socks().and_then(|m| m.get_ptr_mut(&sk))
}

/// Bytes moved by a recv/send event (0 for errors and MSG_PEEK).
#[inline(always)]
fn moved(ret: i32, flags: i32) -> i32 {
    if flags & MSG_PEEK != 0 { 0 } else { ret }
}

const MSG_PEEK: i32 = 2;

/// Where a flag's byte sits in [`SockEntry`].
const BUSY_AT: usize = core::mem::offset_of!(SockEntry, busy);
const SILENT_AT: usize = core::mem::offset_of!(SockEntry, silent);

/// Changes the flag at byte `at` of a live entry from `from` to `to`; whether
/// this call did. One compare-and-swap of the aligned 8-byte word around it,
/// whose other bytes never change once the entry is in the map: of two
/// events that would change the flag at once, exactly one does.
#[inline(always)]
fn take_flag(entry: *mut SockEntry, at: usize, from: u8, to: u8) -> bool {
    // SAFETY: a map value (8-byte aligned), valid for this run; the word lies within it.
    let word = unsafe { entry.cast::<u8>().add(at & !7) }.cast::<u64>();
    let shift = (at & 7) * 8;
    let old = crate::atomic::load(word);
    if (old >> shift) & 0xff != u64::from(from) {
        return false;
    }
    crate::atomic::compare_exchange(word, old, (old & !(0xff << shift)) | (u64::from(to) << shift))
}

/// The gate admitted the first segment of connection `sk`'s next request:
/// it is busy from now, before the kernel queues the bytes, so the next
/// request judged (on another connection, a microsecond later) sees it.
/// `sk_data_ready` then finds the flag taken and counts nothing more.
#[inline(always)]
pub fn turn_admitted(sk: u64, slot: u32) {
    if fault!("turn_counted_late") {
        return;
    }
    let Some(live) = tracked(sk) else { return };
    if take_flag(live, BUSY_AT, 0, 1)
        && let Some(state) = state_field(slot)
    {
        // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
        atomic_add(unsafe { &raw mut (*state).busy_enter }, 1);
    }
}

/// `sock:sk_data_ready`: a request's bytes arrived (or only the client's
/// FIN, which wakes readers too: its goodbye after an answer is no request,
/// and counted busy it went as an abandoned one at every close).
pub fn on_data_ready(sk: u64) {
    let Some(live) = tracked(sk) else { return };
    if !fault!("fin_taken_for_a_request") && only_a_fin(sk) {
        return;
    }
    // SAFETY: map value, valid for this run; fields read and written through
    // the pointer (no reference: the flags change by compare-and-swap).
    let (slot, epoch) = unsafe { ((*live).slot, (*live).silent_epoch) };
    // SAFETY: as above.
    unsafe {
        if (*live).arrival_ns == 0 {
            (*live).arrival_ns = bpf_ktime_get_ns();
        }
    }
    // SAFETY: as above.
    let silent = unsafe { (*live).silent } != 0;
    if silent && (fault!("silence_ended_twice") || take_flag(live, SILENT_AT, 1, 0)) {
        end_silence(slot, epoch);
    }
    if take_flag(live, BUSY_AT, 0, 1)
        && let Some(state) = state_field(slot)
    {
        // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
        atomic_add(unsafe { &raw mut (*state).busy_enter }, 1);
    }
}

/// Whether socket `sk` holds nothing unread but the client's FIN
/// ([`shed_common::only_a_fin`]), read at the offsets userspace found in
/// BTF; without them (or unreadable), false: a data-ready is a request.
#[inline(always)]
fn only_a_fin(sk: u64) -> bool {
    let (state_at, rcv_nxt_at, copied_at) =
        (crate::maps::sk_state_offset(), crate::maps::rcv_nxt_offset(), crate::maps::copied_seq_offset());
    if state_at == 0 || rcv_nxt_at == 0 || copied_at == 0 {
        return false;
    }
    // SAFETY: reads of kernel memory; the helper fails safely on a bad address
    // (the socket is the tracepoint's own, held under its lock).
    let Ok(state) = (unsafe { bpf_probe_read_kernel((sk + u64::from(state_at)) as *const u8) }) else { return false };
    if i32::from(state) == tcp_state::ESTABLISHED {
        return false;
    }
    // SAFETY: as above.
    let read = |at: u32| unsafe { bpf_probe_read_kernel((sk + u64::from(at)) as *const u32) };
    matches!((read(rcv_nxt_at), read(copied_at)), (Ok(next), Ok(copied)) if shed_common::only_a_fin(state, next, copied))
}

/// `sock:sock_recv_length`: the application read the request.
pub fn on_recv(sk: u64, ret: i32, flags: i32) {
    let Some(live) = tracked(sk) else { return };
    if moved(ret, flags) <= 0 {
        return;
    }
    // SAFETY: map value, valid for this run; fields read and written through
    // the pointer (no reference: other CPUs change its flags meanwhile).
    let (slot, multiplexed, arrival, pickup) =
        unsafe { ((*live).slot, (*live).multiplexed, (*live).arrival_ns, (*live).pickup_ns) };
    if arrival == 0 || (multiplexed == 0 && pickup != 0) {
        return;
    }
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    record(slot, Histogram::QueueWait, now.saturating_sub(arrival));
    // SAFETY: as above.
    unsafe {
        if multiplexed != 0 {
            // Receive-queue residence of what this read took; the next bytes to land
            // in the (now drained) queue start the next wait. A turn means nothing here.
            (*live).arrival_ns = 0;
        } else {
            (*live).pickup_ns = now;
        }
    }
}

/// `sock:sock_send_length`: the application answered.
pub fn on_send(sk: u64, ret: i32, flags: i32) {
    let Some(live) = tracked(sk) else { return };
    if moved(ret, flags) <= 0 {
        return;
    }
    // SAFETY: map value, valid for this run; fields read and written through
    // the pointer (no reference: the flags change by compare-and-swap).
    let (slot, epoch, multiplexed) = unsafe { ((*live).slot, (*live).silent_epoch, (*live).multiplexed) };
    // A server-first protocol's greeting: the server has done its part.
    if !fault!("greeting_keeps_silence") && take_flag(live, SILENT_AT, 1, 0) {
        end_silence(slot, epoch);
    }
    if multiplexed != 0 {
        // An answer to one of many requests under way: no turn ends, the connection stays busy.
        return;
    }
    // SAFETY: as above.
    let (arrival, pickup) = unsafe { ((*live).arrival_ns, (*live).pickup_ns) };
    if pickup != 0 {
        // SAFETY: reading the clock has no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        record(slot, Histogram::Service, now.saturating_sub(pickup));
        record(slot, Histogram::Sojourn, now.saturating_sub(arrival));
    }
    // Later sends of the same answer change nothing until the next request arrives.
    // SAFETY: as above.
    unsafe {
        (*live).arrival_ns = 0;
        (*live).pickup_ns = 0;
    }
    if !fault!("send_not_counted")
        && take_flag(live, BUSY_AT, 1, 0)
        && let Some(state) = state_field(slot)
    {
        // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
        atomic_add(unsafe { &raw mut (*state).busy_exit }, 1);
    }
}

enum Histogram {
    QueueWait,
    Service,
    Sojourn,
    Handshake,
}

#[inline(always)]
fn record(slot: u32, which: Histogram, ns: u64) {
    let Some(hist) = gate::latency().and_then(|m| m.get_ptr_mut(slot)) else { return };
    let b = latency::bucket(ns / 1000) + usize::from(fault!("latency_bucket_shifted"));
    // Verifier workaround: LLVM bounds-checks one copy of the index and adds
    // another to the pointer. Laundering it through the stack makes the mask
    // apply to the very register used for the access.
    // SAFETY: reading a local.
    let b = unsafe { core::ptr::read_volatile(&b) } & (latency::BUCKETS - 1);
    // SAFETY: per-CPU value, no concurrent writer.
    let buckets = unsafe {
        match which {
            Histogram::QueueWait => &mut (*hist).queue_wait,
            Histogram::Service => &mut (*hist).service,
            Histogram::Sojourn => &mut (*hist).sojourn,
            Histogram::Handshake => &mut (*hist).handshake,
        }
    };
    // `get_mut`, not indexing: an index panic path would end the program in a
    // call the verifier rejects ("last insn is not an exit or jmp").
    if let Some(count) = buckets.get_mut(b) {
        *count += 1;
    }
}
