// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Each segment judged once: a segment crossing stacked devices (a bridge
//! port then the bridge, a VLAN's lower device then the VLAN) meets the gate
//! on each, on the same CPU, microseconds apart. Each CPU remembers the last
//! segment it passed (`SHED_LAST_PASSED`); the same segment on another
//! interface within [`shed_common::STACKED_WITHIN_NS`] passes again,
//! uncounted. The time is the kernel's coarse clock (a tick's resolution):
//! every passed segment is remembered, and the precise clock would cost
//! each of them a read of the TSC, tens of ns on a virtual machine.
use crate::{fault::fault, maps::SHED_LAST_PASSED, parse::Segment};

/// Whether this CPU passed this very segment a moment ago, on the device below
/// (or above) this one: then it is passed again, uncounted and unreserved.
/// The clock is read last, only for a segment that matches in every field.
#[inline(always)]
pub fn passed_already(seg: &Segment, syn: bool, ifindex: u32) -> bool {
    if fault!("stacked_judged_twice") {
        return false;
    }
    let Some(last) = SHED_LAST_PASSED.get_ptr(0) else { return false };
    // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
    let last = unsafe { &*last };
    last.seq == seg.seq
        && last.ack_seq == seg.ack_seq
        && last.client_port == seg.client_port
        && last.server_port == seg.server_port
        && last.syn == u32::from(syn)
        && last.ifindex != ifindex
        && last.payload_len == seg.payload_len
        && last.flags == seg.flags
        && last.client_addr == seg.client_addr
        && last.server_addr == seg.server_addr
        && coarse_now().wrapping_sub(last.at_ns) < shed_common::STACKED_WITHIN_NS
}

/// Remembers a passed segment (see [`passed_already`]). Field by field into
/// the map value: a whole struct built on the stack first would push the
/// judging path over the verifier's 512-byte stack.
#[inline(never)]
pub fn remember_passed(seg: &Segment, syn: bool, ifindex: u32) {
    if let Some(last) = SHED_LAST_PASSED.get_ptr_mut(0) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe {
            (*last).at_ns = coarse_now();
            (*last).client_addr = seg.client_addr;
            (*last).server_addr = seg.server_addr;
            (*last).payload_len = seg.payload_len;
            (*last).flags = seg.flags;
            (*last).seq = seg.seq;
            (*last).ack_seq = seg.ack_seq;
            (*last).client_port = seg.client_port;
            (*last).server_port = seg.server_port;
            (*last).ifindex = ifindex;
            (*last).syn = u32::from(syn);
        }
    }
}

/// The kernel's coarse monotonic clock: updated every tick (1-10 ms), read
/// without the TSC.
#[inline(always)]
fn coarse_now() -> u64 {
    // SAFETY: reading the clock has no preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_coarse_ns() }
}
