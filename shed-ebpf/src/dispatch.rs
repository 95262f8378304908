// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The node agent's dispatchers (see `shed_common::dispatch`): one program
//! per socket tracepoint for all of the node's pod gates, handing each event
//! to the gate of the socket's pod by tail call. The dispatcher's own object
//! loads only these; a gate's object never loads them.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{HashMap, ProgramArray},
    programs::RawTracePointContext,
};
use shed_common::{
    capacity::MAX_SOCKS,
    dispatch::{self, GATES, SLOTS},
    tcp_state,
};

use crate::{fault::fault, maps::SHED_NETNS};

#[map]
pub static SHED_DISPATCH_TARGETS: ProgramArray = ProgramArray::with_max_entries(SLOTS, 0);

#[map]
pub static SHED_DISPATCH_NETNS: HashMap<u32, u32> = HashMap::with_max_entries(GATES, BPF_F_NO_PREALLOC);

#[map]
pub static SHED_DISPATCH_SOCKS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_SOCKS, BPF_F_NO_PREALLOC);

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
        if !fault!("dispatch_close_kept") {
            let _ = SHED_DISPATCH_SOCKS.remove(&sk);
        }
        if !fault!("dispatch_close_dropped") {
            hand_over(ctx, gate, dispatch::SOCK_STATE);
        }
    } else if new == tcp_state::ESTABLISHED && old == tcp_state::SYN_RECV {
        let Some(inum) = netns_inum(sk) else { return };
        // SAFETY: plain data copied out of the map.
        let Some(gate) = (unsafe { SHED_DISPATCH_NETNS.get(&inum) }).copied() else { return };
        // Full: the gate still counts it open (below), but sees neither its
        // requests nor its close; the gate's healer corrects the count.
        let _ = SHED_DISPATCH_SOCKS.insert(&sk, &gate, 0);
        hand_over(ctx, gate, dispatch::SOCK_STATE);
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

/// Tail-calls the gate's program for `event`; returns only if there is none
/// (the pod's gate is going or gone: nothing to count).
#[inline(always)]
fn hand_over(ctx: &RawTracePointContext, gate: u32, event: u32) {
    // SAFETY: a tail call into a program of the same type, on the same context.
    unsafe { SHED_DISPATCH_TARGETS.tail_call(ctx, dispatch::target(gate, event)) };
}

/// The inode number of the socket's network namespace, at the offsets the
/// agent wrote into `SHED_NETNS` (its `enabled` 0: none known).
#[inline(always)]
fn netns_inum(sk: u64) -> Option<u32> {
    let filter = SHED_NETNS.get(0)?;
    if filter.enabled == 0 {
        return None;
    }
    // SAFETY: probe reads of kernel memory at offsets from the kernel's own BTF; failures are errors.
    let net: u64 = unsafe { bpf_probe_read_kernel((sk + u64::from(filter.skc_net_offset)) as *const u64) }.ok()?;
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel((net + u64::from(filter.net_inum_offset)) as *const u32) }.ok()
}
