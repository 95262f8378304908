// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The node agent's dispatchers (see `shed_common::dispatch`): one program
//! per socket tracepoint for all of the node's pod gates, handing each event
//! to the gate of the socket's pod by tail call. The dispatcher's own object
//! loads only these; a gate's object never loads them.
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{Array, HashMap, ProgramArray},
    programs::RawTracePointContext,
};
use shed_common::{
    NetnsFilter,
    capacity::MAX_SOCKS,
    dispatch::{self, DispatchBooks, GATES, SLOTS},
    tcp_state,
};

use crate::{
    account, atomic,
    fault::fault,
    maps::{SHED_NETNS, enter_gate, leave_gate, shared},
};

#[map]
pub static SHED_DISPATCH_TARGETS: ProgramArray = ProgramArray::with_max_entries(SLOTS, 0);

#[map]
pub static SHED_DISPATCH_NETNS: HashMap<u32, u32> = HashMap::with_max_entries(GATES, BPF_F_NO_PREALLOC);

#[map]
pub static SHED_DISPATCH_SOCKS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_SOCKS, BPF_F_NO_PREALLOC);

#[map]
pub static SHED_DISPATCH_BOOKS: Array<DispatchBooks> = Array::with_max_entries(GATES, 0);

/// Connections one gate may have followed at once ([`dispatch::QUOTA_GLOBAL`]);
/// 0: no quota (an object whose loader did not set it).
#[unsafe(no_mangle)]
static SHED_DISPATCH_QUOTA: u32 = 0;

/// `inet_sock_set_state(sk, oldstate, newstate)`: a handshake's end goes to
/// the gate of the socket's namespace, which is remembered for the socket's
/// later events; its close to the gate remembered, which is then forgotten.
#[inline(always)]
pub fn sock_state(ctx: &RawTracePointContext) {
    let sk: u64 = ctx.arg(0);
    let (old, new): (i32, i32) = (ctx.arg(1), ctx.arg(2));
    if new == tcp_state::CLOSE {
        // SAFETY: plain data copied out of the map.
        let Some(gate) = (unsafe { SHED_DISPATCH_SOCKS.get(&sk) }).copied() else { return };
        if !fault!("dispatch_close_kept")
            && SHED_DISPATCH_SOCKS.remove(&sk).is_ok()
            && let Some(books) = SHED_DISPATCH_BOOKS.get_ptr_mut(gate)
        {
            // SAFETY: a map value, valid for this run; only the remover takes it back.
            atomic::add(unsafe { &raw mut (*books).followed }, u64::MAX);
        }
        if !fault!("dispatch_close_dropped") {
            hand_over(ctx, gate, dispatch::SOCK_STATE);
        }
    } else if new == tcp_state::ESTABLISHED && old == tcp_state::SYN_RECV {
        let Some(inum) = netns_inum(sk) else { return };
        // SAFETY: plain data copied out of the map.
        let Some(gate) = (unsafe { SHED_DISPATCH_NETNS.get(&inum) }).copied() else { return };
        follow(sk, gate);
        hand_over(ctx, gate, dispatch::SOCK_STATE);
    }
}

/// Remembers `sk` as `gate`'s, within the gate's quota. Not followed (the
/// quota reached, or the table full), the gate still counts it open, but sees
/// neither its requests nor its close: its healer corrects the count, and the
/// other gates keep their room.
#[inline(always)]
fn follow(sk: u64, gate: u32) {
    let Some(books) = SHED_DISPATCH_BOOKS.get_ptr_mut(gate) else { return };
    // SAFETY: a read of our own global; volatile, or the compiler folds the 0 it was built with.
    let quota = u64::from(unsafe { core::ptr::read_volatile(&raw const SHED_DISPATCH_QUOTA) });
    // SAFETY: a map value, valid for this run; its fields are updated atomically.
    let (followed, unfollowed) = unsafe { (&raw mut (*books).followed, &raw mut (*books).unfollowed) };
    // Taken first, judged on the value taken: racing CPUs cannot pass the quota together.
    let before = atomic::add(followed, 1);
    let over = quota != 0 && before >= quota && !fault!("dispatch_quota_ignored");
    if over || SHED_DISPATCH_SOCKS.insert(&sk, &gate, u64::from(BPF_NOEXIST)).is_err() {
        atomic::add(followed, u64::MAX);
        atomic::add(unfollowed, 1);
    }
}

/// A per-request event (`sk` first): to the gate the socket was handed to.
#[inline(always)]
pub fn socket_event(ctx: &RawTracePointContext, event: u32) {
    let sk: u64 = ctx.arg(0);
    // SAFETY: plain data copied out of the map.
    if let Some(gate) = (unsafe { SHED_DISPATCH_SOCKS.get(&sk) }).copied()
        && !fault!("dispatch_requests_dropped")
    {
        hand_over(ctx, gate, event);
    }
}

/// Hands `event` to `gate`: a shared object counts it here, under the
/// gate's own maps; otherwise a tail call to the gate's program for it,
/// which returns only if there is none (the pod's gate is going or gone:
/// nothing to count).
#[inline(always)]
fn hand_over(ctx: &RawTracePointContext, gate: u32, event: u32) {
    if shared() {
        let before = enter_gate(gate);
        match event {
            dispatch::SOCK_STATE => {
                account::on_sock_state(&account::RawStateChange { sk: ctx.arg(0), old: ctx.arg(1), new: ctx.arg(2) })
            }
            dispatch::DATA_READY => account::on_data_ready(ctx.arg(0)),
            dispatch::RECV => account::on_recv(ctx.arg(0), ctx.arg(1), ctx.arg(2)),
            _ => account::on_send(ctx.arg(0), ctx.arg(1), ctx.arg(2)),
        }
        leave_gate(before);
        return;
    }
    // SAFETY: a tail call into a program of the same type, on the same context.
    unsafe { SHED_DISPATCH_TARGETS.tail_call(ctx, dispatch::target(gate, event)) };
}

/// The inode number of the socket's network namespace, at the offsets the
/// agent wrote into `SHED_NETNS` (its `enabled` 0: none known).
#[inline(always)]
fn netns_inum(sk: u64) -> Option<u32> {
    let filter = SHED_NETNS.get(0)?;
    if filter.enabled == 0 || left_and_lapsed(filter) {
        return None;
    }
    // SAFETY: probe reads of kernel memory at offsets from the kernel's own BTF; failures are errors.
    let net: u64 = unsafe { bpf_probe_read_kernel((sk + u64::from(filter.skc_net_offset)) as *const u64) }.ok()?;
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel((net + u64::from(filter.net_inum_offset)) as *const u32) }.ok()
}

/// Whether the agent that held this object left it running for its
/// successor, and the time it left it for is up: nobody took it over, so it
/// judges nothing and hands nothing over (fail-open).
#[inline(always)]
fn left_and_lapsed(filter: &NetnsFilter) -> bool {
    // SAFETY: a helper without arguments.
    filter.left_until_ns != 0 && unsafe { bpf_ktime_get_ns() } > filter.left_until_ns
}

/// A shared object's gate for a packet: the one of the namespace of the
/// device it arrived on (`skb->dev->nd_net`, at the agent's BTF offsets).
/// Not `bpf_get_netns_cookie`, which reads the packet's socket: a SYN from
/// another namespace across a veth still carries its sender's.
#[inline(always)]
pub fn gate_of_skb(skb: u64) -> Option<u32> {
    let filter = SHED_NETNS.get(0)?;
    if filter.enabled == 0 || filter.skb_dev_offset == 0 || filter.dev_net_offset == 0 || left_and_lapsed(filter) {
        return None;
    }
    // SAFETY: probe reads of kernel memory at offsets from the kernel's own BTF
    // (a TC program's context is the kernel's sk_buff); failures are errors.
    let dev: u64 = unsafe { bpf_probe_read_kernel((skb + u64::from(filter.skb_dev_offset)) as *const u64) }.ok()?;
    // SAFETY: as above.
    let net: u64 = unsafe { bpf_probe_read_kernel((dev + u64::from(filter.dev_net_offset)) as *const u64) }.ok()?;
    // SAFETY: as above.
    let inum: u32 = unsafe { bpf_probe_read_kernel((net + u64::from(filter.net_inum_offset)) as *const u32) }.ok()?;
    // SAFETY: plain data copied out of the map.
    unsafe { SHED_DISPATCH_NETNS.get(&inum) }.copied()
}
