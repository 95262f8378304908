// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The kernel's word on its rare paths (a map full, a helper failing, a header
//! it will not parse), through aya-log to the daemon's log.
//!
//! Off unless `shedctl attach --kernel-log`: the daemon then loads the object
//! with aya-log's level global (read-only data) at 0, so the verifier prunes
//! every branch below and the packet path pays nothing. On, each kind speaks
//! at most once a second; the counters still count every occurrence.
//!
//! Each logging function is a call of its own (`inline(never)`): aya-log's
//! record takes a few hundred bytes of stack, which the gate's deepest path
//! cannot spare in its own frame (the verifier allows 512 for all frames).
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::Array};
use aya_log_ebpf::macro_support::{Level, level_enabled};
use shed_common::rare;

#[map]
pub static SHED_RARE_STAMPS: Array<u64> = Array::with_max_entries(rare::COUNT, 0);

/// Whether a rare path of `kind` should log now (and, if so, notes the time).
#[inline(always)]
pub fn due(kind: u32) -> bool {
    if !level_enabled(Level::Warn) {
        return false;
    }
    let Some(last) = SHED_RARE_STAMPS.get_ptr_mut(kind) else { return false };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a slot of an array map, valid for the program's run. Two CPUs
    // racing here may both log; that costs one extra line, nothing else.
    unsafe {
        if *last != 0 && now.wrapping_sub(*last) < rare::EVERY_NS {
            return false;
        }
        *last = now;
    }
    true
}

/// Logs that connections of port slot `slot` go uncounted: the connection map is full.
#[inline(never)]
pub fn connection_map_full(slot: u32) {
    if due(rare::CONNECTION_MAP_FULL) {
        aya_log_ebpf::warn!(
            &(),
            "connection map full: a connection of port slot {} is admitted uncounted (fail-open); raise --max-connections",
            slot
        );
    }
}

/// Logs that a capped client of port slot `slot` goes uncounted: the client map is full.
#[inline(never)]
pub fn client_map_full(slot: u32) {
    if due(rare::CLIENT_MAP_FULL) {
        aya_log_ebpf::warn!(
            &(),
            "client map full: a connection of port slot {} is not counted against its client's cap; raise --max-clients",
            slot
        );
    }
}

/// Logs that a reset for port slot `slot` could not be written or sent (`step`: which).
#[inline(never)]
pub fn rst_failed(slot: u32, step: &'static str) {
    if due(rare::RST_FAILED) {
        aya_log_ebpf::warn!(&(), "reset for port slot {} failed at {}: the SYN was dropped instead", slot, step);
    }
}

/// Logs a packet dropped because its headers could hide a SYN (`why`: a
/// `shed_common::gate_counter` index).
#[inline(never)]
pub fn unparsed_header(why: u32) {
    if due(rare::UNPARSED_HEADER) {
        aya_log_ebpf::warn!(
            &(),
            "dropped a packet whose headers could hide a SYN (gate counter {}: 0 tiny fragment, 1 overlapping fragment, 2 IPv6 chain not parsed)",
            why
        );
    }
}
