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
    } else if !rst_allowed(config.slot, config, client, now_ns, prefix_rate(config, client)) {
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
/// `prefix_rate`: the client's prefix's cap ([`prefix_rate`]; 0: none).
pub(crate) fn rst_allowed(slot: u32, config: &PortConfig, client: &[u8; 16], now: u64, prefix_rate: u32) -> bool {
    if fault!("rst_cap_ignored") {
        return true;
    }
    // The prefix first: a flood from one prefix must not spend the port's
    // budget. Not for a source that holds connections the kernel completed
    // (a proxy, a NAT: its clients are many, and their refusals would turn
    // into silence): it is no forged one, and the port's cap still bounds it.
    if prefix_rate != 0 {
        let Some(bucket) = prefix_bucket(prefix_bucket_index(slot, &rst_prefix(client))) else { return false };
        if !take(bucket, now, prefix_rate) {
            return false;
        }
    }
    if config.rst_per_sec != 0 {
        let Some(bucket) = gate::rst_buckets().and_then(|m| m.get_ptr_mut(slot)) else { return false };
        return take(bucket, now, config.rst_per_sec);
    }
    true
}

/// Whether `client` is the port's largest client (`SHED_CONTENTION`), and
/// holds connections: the kernel completed handshakes with it, so its address
/// is not forged, and many refusals from it are many users behind one address
/// (a proxy, a NAT). Read in place from the map value, compared by words: the
/// ACK's path has no stack left for a key to look the client up by. Called
/// before [`rst_allowed`], not from it: a turn program's call chain through
/// `rst_allowed` has no byte of stack to spare.
#[inline(always)]
fn proven_source(config: &PortConfig, client: &[u8; 16]) -> bool {
    // One test for both (no client counted: no largest client).
    if fault!("proxy_answers_capped") || (config.client_cap | u32::from(config.client_share)) == 0 {
        return false;
    }
    let Some(contention) = gate::contention().and_then(|m| m.get_ptr(config.slot)) else { return false };
    // SAFETY: map value, valid for this run; plain reads (a store racing them
    // at worst compares with the last largest client).
    unsafe { (*contention).largest_held > 0 && shed_common::within_key(client, &(*contention).largest) }
}

/// The answer cap of `client`'s prefix: the port's `rst_per_prefix_per_sec`,
/// or none (0) for a [`proven_source`]. Masked through [`crate::maps::forget`],
/// so that whatever the answer, `rst_allowed` is walked as before: once per
/// way its rates may go, not once more per way here.
#[inline(never)]
fn prefix_rate(config: &PortConfig, client: &[u8; 16]) -> u32 {
    let capped = crate::maps::forget(u64::from(!proven_source(config, client))) as u32;
    capped.wrapping_neg() & config.rst_per_prefix_per_sec
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
