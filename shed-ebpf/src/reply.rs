// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! What a judged segment gets ([`Verdict`]), and whether a reply may go to
//! its client now: never to a source that cannot be one, and within the RST
//! caps (per port and per source prefix), which the `http` answers spend too.
use shed_common::{
    PortConfig, counter, is_ipv4_mapped, ratelimit::gcra_take, ratelimit::prefix_bucket_index, rst::Reset, rst_prefix,
};

use crate::{
    atomic,
    fault::fault,
    maps::{gate, is_loopback, local_kind},
    reject::Answer,
};

pub enum Verdict {
    Pass,
    Drop,
    /// Reject with a reset; `slot` lets the adapter count how the reply went.
    Rst {
        slot: u32,
        reset: Reset,
    },
    /// No socket of the kernel's takes this ACK: it may be a client of the
    /// HTTP answer ([`http_segment`] judges it), else the kernel resets it.
    Unclaimed,
    /// Answer with a segment of the stateless HTTP refusal (`action = "http"`).
    Answer {
        slot: u32,
        answer: Answer,
    },
    /// The first segment of a kept-alive connection's next request: [`turn`]
    /// judges it, in a program of its own (its socket in `SHED_TURN_SOCKET`).
    Turn,
}

/// Why a reply (a reset, or an `http` answer) may not go to `client` now, as
/// the counter to count: a source that cannot be a client (`RST_SUPPRESSED`),
/// or a spent RST cap (`RST_RATE_LIMITED`, the budget taken otherwise).
#[inline(always)]
pub(crate) fn withheld(config: &PortConfig, client: &[u8; 16], from_loopback: bool, now_ns: u64) -> Option<usize> {
    if !answerable(client, from_loopback) {
        Some(counter::RST_SUPPRESSED)
    } else if !rst_allowed(config.slot, config, client, now_ns) {
        Some(counter::RST_RATE_LIMITED)
    } else {
        None
    }
}

/// Whether a reset may go to `client`: never to multicast, broadcast or an
/// unspecified source, nor, unless the SYN came in on loopback, to a loopback
/// address or one of this host's own (a forged source would make us hit ourselves).
#[inline(never)]
pub(crate) fn answerable(client: &[u8; 16], from_loopback: bool) -> bool {
    if is_ipv4_mapped(client) {
        let first = client[12];
        let all_ones = client[12..] == [0xff; 4];
        let zero = client[12..] == [0; 4];
        if (224..=239).contains(&first) || all_ones || zero || first >= 240 {
            return false;
        }
    } else if client[0] == 0xff || *client == [0; 16] {
        return false;
    }
    if from_loopback || fault!("rst_to_own_address") {
        return true;
    }
    !is_loopback(client) && local_kind(client) == 0
}

/// Whether the port and the client's prefix still have RST budget. Each bucket
/// is one GCRA time updated by compare-and-swap, so CPUs racing each other
/// cannot exceed a cap; a swap lost four times over refuses (never over the cap).
#[inline(never)]
pub(crate) fn rst_allowed(slot: u32, config: &PortConfig, client: &[u8; 16], now: u64) -> bool {
    if fault!("rst_cap_ignored") {
        return true;
    }
    // The prefix first: a flood from one prefix must not spend the port's budget.
    if config.rst_per_prefix_per_sec != 0 {
        let Some(bucket) = prefix_bucket(prefix_bucket_index(slot, &rst_prefix(client))) else { return false };
        if !take(bucket, now, config.rst_per_prefix_per_sec) {
            return false;
        }
    }
    if config.rst_per_sec != 0 {
        let Some(bucket) = gate::rst_buckets().and_then(|m| m.get_ptr_mut(slot)) else { return false };
        return take(bucket, now, config.rst_per_sec);
    }
    true
}

/// The prefix bucket at `index`. A subprogram: a shared object's two
/// lookups (the gate, then its map) beside the prefix's hash would spill
/// the hash into `rst_allowed`'s frame, which the turn program's stack cannot hold.
#[inline(never)]
fn prefix_bucket(index: u32) -> Option<*mut u64> {
    gate::rst_prefix().and_then(|m| m.get_ptr_mut(index))
}

#[inline(always)]
pub(crate) fn take(bucket: *mut u64, now: u64, rate: u32) -> bool {
    for _ in 0..4 {
        let old = atomic::load(bucket);
        let now = if fault!("rst_bucket_stuck") { 0 } else { now };
        let Some(new) = gcra_take(old, now, rate) else { return false };
        if atomic::compare_exchange(bucket, old, new) {
            return true;
        }
    }
    false
}
