//! The admission decision, shared by the XDP and TC entry points.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_ktime_get_ns;
use shed_common::{ClientKey, FlowKey, PendingEntry, RstBucket, RstPrefixKey, action, counter, rst_prefix, tier};

use crate::{
    maps::{
        SHED_CLIENT_EXPIRED, SHED_CLIENTS, SHED_CLOCK, SHED_COUNTERS, SHED_LIMITS, SHED_PENDING, SHED_PORT_STATE,
        SHED_PORTS, SHED_RESERVE, SHED_RST_BUCKETS, SHED_RST_PREFIX, SHED_USER_STATE, maybe_protected, tier_of,
    },
    parse::Syn,
};

const EEXIST: i32 = 17;

pub enum Verdict {
    Pass,
    Drop,
    /// Reject with a RST; `slot` lets the adapter count how the reply went.
    Rst {
        slot: u32,
    },
}

/// Adds one to a per-CPU counter of the port in `slot`.
#[inline(always)]
pub fn count(slot: u32, index: usize) {
    if let Some(counters) = SHED_COUNTERS.get_ptr_mut(slot) {
        // SAFETY: per-CPU value; programs do not migrate CPU mid-run.
        unsafe { (*counters).values[index] += 1 };
    }
}

/// Atomically adds `delta` (two's complement for subtraction) and returns the previous value.
#[inline(always)]
pub fn atomic_add(field: *mut u64, delta: u64) -> u64 {
    // The BPF target has no compare-and-swap, so core's AtomicU64 lacks fetch_add;
    // the intrinsic lowers to BPF_ATOMIC | BPF_FETCH (kernel >= 5.12).
    // SeqCst, not Relaxed: LLVM 22's BPF backend lowers a Relaxed add whose result
    // is used to the non-fetching `lock +=` and hands back the operand instead of
    // the old value (seen in the disassembly; tests/prog_test_run.rs catches it).
    // SAFETY: `field` points into a map value, valid and 8-byte aligned for the program's run.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(field, delta) }
}

#[inline(always)]
pub fn decide(syn: &Syn) -> Verdict {
    // Most SYNs are for ports the gate does not protect: an array lookup answers that.
    if !maybe_protected(syn.server_port) {
        return Verdict::Pass;
    }
    // SAFETY: map values are plain data; a miss means "not protected" and passes.
    let Some(config) = (unsafe { SHED_PORTS.get(&syn.server_port) }) else {
        return Verdict::Pass;
    };
    let slot = config.slot;
    let Some(state) = SHED_PORT_STATE.get_ptr_mut(slot) else {
        return Verdict::Pass;
    };
    let Some(&limit) = SHED_LIMITS.get(slot) else {
        return Verdict::Pass;
    };
    count(slot, counter::SYN_SEEN);
    // The LPM lookup is the dearest step of a SYN; skip it while no tier is configured.
    let tier = if config.tiered != 0 { tier_of(&syn.client_addr) } else { tier::NORMAL };
    if tier == tier::EXEMPT {
        // Health checks and control-plane callers: always in, never counted.
        count(slot, counter::EXEMPT);
        count(slot, counter::ADMITTED_BY_TIER + tier::EXEMPT as usize);
        return Verdict::Pass;
    }

    let key = FlowKey {
        client_addr: syn.client_addr,
        server_addr: syn.server_addr,
        client_port: syn.client_port,
        server_port: syn.server_port,
    };
    // A retransmitted SYN of an admitted handshake already holds its slot.
    if unsafe { SHED_PENDING.get(&key) }.is_some() {
        count(slot, counter::SYN_RETRANSMIT);
        return Verdict::Pass;
    }

    // Reserve first, then judge with the value we reserved against: two CPUs
    // racing for the last slot see different values, so the limit holds even
    // for a burst of simultaneous SYNs.
    let reserved_before = atomic_add(unsafe { &raw mut (*state).reserved }, 1);
    let user = SHED_USER_STATE.get(slot).copied().unwrap_or_default();
    let in_flight = shed_common::in_flight(unsafe { &*state }, reserved_before, &user, config.count_mode);
    // The whole limit is a hard stop; a tier's share of it sheds lower tiers
    // first, except for a trickle that keeps a full tier from starving.
    let mut capped: Option<ClientKey> = None;
    let reason = if in_flight >= u64::from(limit) {
        Some(counter::REJECTED_LIMIT)
    } else if in_flight >= config.tier_threshold(tier, limit).saturating_sub(held_back(slot, tier)) {
        if trickle(slot) {
            count(slot, counter::TRICKLE);
            None
        } else {
            Some(counter::REJECTED_SHARE)
        }
    } else if config.client_cap != 0 {
        let client = config.client_key(&syn.client_addr);
        match client_reserve(&client, config.client_cap) {
            ClientVerdict::Counted => {
                capped = Some(client);
                None
            }
            ClientVerdict::Uncounted => None,
            ClientVerdict::OverCap => Some(counter::REJECTED_CLIENT_CAP),
        }
    } else {
        None
    };
    if let Some(reason) = reason {
        if config.dry_run != 0 {
            count(slot, counter::DRY_RUN_WOULD_REJECT);
        } else {
            atomic_add(unsafe { &raw mut (*state).reserved }, u64::MAX);
            count(slot, reason);
            count(slot, counter::REJECTED_BY_TIER + (tier as usize & 3));
            if config.action_for(tier) != action::RST {
                return Verdict::Drop;
            }
            if !rst_allowed(slot, config.rst_per_sec, config.rst_per_prefix_per_sec, &syn.client_addr) {
                count(slot, counter::RST_RATE_LIMITED);
                return Verdict::Drop;
            }
            return Verdict::Rst { slot };
        }
    }

    let entry = PendingEntry {
        slot,
        capped: u32::from(capped.is_some()),
        admitted_ms: SHED_CLOCK.get(0).copied().unwrap_or(0),
    };
    if let Err(err) = SHED_PENDING.insert(&key, &entry, u64::from(BPF_NOEXIST)) {
        atomic_add(unsafe { &raw mut (*state).reserved }, u64::MAX);
        if let Some(client) = capped {
            client_release(&client);
        }
        // Another CPU admitted the same handshake a moment ago (a retransmit race),
        // or the map is full: either way pass without a second slot.
        count(slot, if err == -EEXIST { counter::SYN_RETRANSMIT } else { counter::RESERVE_FAILED });
        return Verdict::Pass;
    }
    count(slot, counter::ADMITTED);
    count(slot, counter::ADMITTED_BY_TIER + (tier as usize & 3));
    Verdict::Pass
}

/// Whether the port and the client's prefix still have RST budget. Races
/// between CPUs can let a few extra through; a cap, not an exact count.
#[inline(always)]
fn rst_allowed(slot: u32, per_sec: u32, per_prefix: u32, client: &[u8; 16]) -> bool {
    // SAFETY: reading the clock has no preconditions; only the reject path pays for it.
    let now = unsafe { bpf_ktime_get_ns() };
    // The prefix first: a flood from one prefix must not spend the port's budget.
    if per_prefix != 0 {
        let key = RstPrefixKey { slot, prefix: rst_prefix(client) };
        let allowed = match SHED_RST_PREFIX.get_ptr_mut(&key) {
            // SAFETY: map value.
            Some(bucket) => unsafe { (*bucket).take(per_prefix, now) },
            None => {
                let mut bucket = RstBucket::full(per_prefix, now);
                let allowed = bucket.take(per_prefix, now);
                let _ = SHED_RST_PREFIX.insert(&key, &bucket, 0);
                allowed
            }
        };
        if !allowed {
            return false;
        }
    }
    if per_sec != 0 {
        let Some(bucket) = SHED_RST_BUCKETS.get_ptr_mut(slot) else { return false };
        // SAFETY: map value; a first use (last_ns 0) starts full.
        let bucket = unsafe { &mut *bucket };
        if bucket.last_ns == 0 {
            *bucket = RstBucket::full(per_sec, now);
        }
        return bucket.take(per_sec, now);
    }
    true
}

enum ClientVerdict {
    /// Under the cap; counted (release it when the connection ends).
    Counted,
    /// The client map is full: admitted without a count (fail-open).
    Uncounted,
    OverCap,
}

/// Counts one more connection for `client`, unless it already holds `cap`.
/// Fetch-add first, then judge (as for the port), so racing SYNs of one
/// client cannot overshoot its cap.
#[inline(always)]
fn client_reserve(client: &ClientKey, cap: u32) -> ClientVerdict {
    if SHED_CLIENTS.get_ptr_mut(client).is_none() {
        let _ = SHED_CLIENTS.insert(client, &0i64, u64::from(BPF_NOEXIST));
    }
    let Some(held) = SHED_CLIENTS.get_ptr_mut(client) else {
        return ClientVerdict::Uncounted;
    };
    let before = atomic_add(held.cast::<u64>(), 1) as i64;
    // SAFETY: plain data.
    let expired = unsafe { SHED_CLIENT_EXPIRED.get(client) }.copied().unwrap_or(0);
    if before - expired >= i64::from(cap) {
        atomic_add(held.cast::<u64>(), u64::MAX);
        return ClientVerdict::OverCap;
    }
    ClientVerdict::Counted
}

/// Releases one connection of `client` (it closed, or its reservation was rolled back).
#[inline(always)]
pub fn client_release(client: &ClientKey) {
    if let Some(held) = SHED_CLIENTS.get_ptr_mut(client) {
        atomic_add(held.cast::<u64>(), u64::MAX);
    }
}

/// Room the daemon holds back from `tier` for the tiers above it.
#[inline(always)]
fn held_back(slot: u32, tier: u8) -> u64 {
    SHED_RESERVE.get(slot).and_then(|r| r.held_back.get(tier as usize)).map_or(0, |&h| u64::from(h))
}

/// One share rejection in [`tier::TRICKLE_EVERY`] (per CPU) is admitted instead.
#[inline(always)]
fn trickle(slot: u32) -> bool {
    let Some(counters) = SHED_COUNTERS.get_ptr_mut(slot) else { return false };
    // SAFETY: per-CPU value. The share-rejection count doubles as the trickle's clock.
    let seen = unsafe { (*counters).values[counter::REJECTED_SHARE] + (*counters).values[counter::TRICKLE] };
    seen % tier::TRICKLE_EVERY == tier::TRICKLE_EVERY - 1
}
