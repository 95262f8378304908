// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The stamp protocol: where a handshake-completing ACK claims its flow's
//! stamp before it is judged ([`Claim`]), so a second segment of the same
//! handshake takes no second reservation, and how the kernel's confirmation
//! of the connection releases the reservation the stamp remembers
//! ([`complete`]). See [`shed_common::handshake`].
use shed_common::{ClientKey, HandshakeStamp, handshake::STAMP_PROBES, handshake::stamp_index, handshake::stamp_state};

use crate::{
    atomic,
    client::release_charge,
    fault::fault,
    maps::{gate, stamp_hash},
    parse::Segment,
    ring,
};

/// Where a handshake-completing ACK claimed its flow's stamp: the index of
/// the slot it tried to claim (it holds it if the slot's head reads its
/// flow, claimed), or [`Claim::DUPLICATE`]. One scalar whose value the
/// judging path never branches on: the verifier walks that path once, not
/// once per outcome of the claim.
#[derive(Clone, Copy)]
pub(crate) struct Claim(u32);

impl Claim {
    /// The flow's handshake holds a reservation already, or another CPU is
    /// judging it right now: this segment passes, counted nowhere.
    pub(crate) const DUPLICATE: Self = Self(u32::MAX);

    /// Claims a stamp for `flow` before its ACK is judged, so that a second
    /// handshake-completing segment of the same flow (a duplicate ACK, the
    /// request that completes a deferred accept, or the request right behind
    /// the ACK judged on another CPU at the same time) finds the handshake
    /// held and takes no second reservation. Its own slot first; else the
    /// first slot holding no other handshake under way; else the first (whose
    /// handshake then lapses: counting too much, never too little). A claim is
    /// one compare-and-swap of the slot's head word, so two CPUs never both
    /// hold a slot.
    #[inline(never)]
    pub(crate) fn take(slot: u32, flow: u32, epoch: u64) -> Self {
        let slot = slot ^ u32::from(fault!("stamp_wrong_key"));
        let mut chosen = stamp_index(slot, flow, 0);
        let mut free = false;
        // The gate's map once, outside the probes: a lookup a probe makes the verifier walk it each time.
        let Some(stamps) = gate::stamps() else { return Self(chosen) };
        for probe in 0..STAMP_PROBES {
            let index = stamp_index(slot, flow, probe);
            let Some(stamp) = stamps.get(index) else { break };
            let seen = read(stamp);
            if seen.flow == flow {
                if seen.holds(flow, epoch) && !fault!("duplicate_ack_reserved") {
                    return Self::DUPLICATE;
                }
                chosen = index;
                break;
            }
            if !free && seen.free_for(flow, epoch) {
                chosen = index;
                free = true;
            }
        }
        let Some(stamp) = stamps.get_ptr_mut(chosen) else { return Self(chosen) };
        let seen = read(stamp);
        let head = stamp.cast::<u64>();
        if !atomic::compare_exchange(head, HandshakeStamp::head(seen.flow, seen.state), HandshakeStamp::head(flow, stamp_state::CLAIMED))
            // SAFETY: map value, read as plain data.
            && unsafe { (*stamp).flow } == flow
        {
            // Another CPU claimed the slot first for this very flow: it is judging it.
            return Self::DUPLICATE;
        }
        Self(chosen)
    }

    /// The index of the stamp slot it claimed.
    #[inline(always)]
    pub(crate) const fn index(self) -> u32 {
        self.0
    }

    #[inline(always)]
    pub(crate) fn is_duplicate(self) -> bool {
        self.0 == Self::DUPLICATE.0
    }

    /// Gives back a claimed slot: the flow was refused.
    #[inline(always)]
    pub(crate) fn give_back(self, flow: u32) {
        if let Some(stamp) = gate::stamps().and_then(|m| m.get_ptr_mut(self.0)) {
            let claimed = HandshakeStamp::head(flow, stamp_state::CLAIMED);
            atomic::compare_exchange(stamp.cast::<u64>(), claimed, HandshakeStamp::head(flow, stamp_state::COMPLETED));
        }
    }
}

/// The stamp `flow` took at admission, if it is still there.
#[inline(always)]
pub(crate) fn find_stamp(slot: u32, flow: u32) -> Option<*mut HandshakeStamp> {
    let stamps = gate::stamps()?;
    for probe in 0..STAMP_PROBES {
        let stamp = stamps.get_ptr_mut(stamp_index(slot, flow, probe))?;
        // SAFETY: map value, read as plain data.
        if unsafe { (*stamp).flow } == flow {
            return Some(stamp);
        }
    }
    None
}

#[inline(always)]
pub(crate) fn flow_of(seg: &Segment) -> u32 {
    stamp_hash(&seg.client_addr, &seg.server_addr, seg.client_port, seg.server_port)
}

/// The reservation of an admitted flow, released when its handshake completes.
/// Returns the handshake time (ns) if the flow was stamped, and whether its
/// reservation was still live (false: a late completion).
#[inline(always)]
/// `client`: the admission was charged to that client (the port counts clients).
pub fn complete(slot: u32, shift: u32, flow: u32, client: Option<&ClientKey>, now_ns: u64) -> (Option<u64>, bool) {
    let Some(stamp) = find_stamp(slot, flow) else { return (None, false) };
    let head = stamp.cast::<u64>();
    // Completed while a CPU still judges the ACK (the request behind it passed
    // as a duplicate on another CPU and completed the handshake first): that
    // CPU finds the claim completed and releases its own reservation.
    let claimed = HandshakeStamp::head(flow, stamp_state::CLAIMED);
    let completed = HandshakeStamp::head(flow, stamp_state::COMPLETED);
    if atomic::load(head) == claimed && atomic::compare_exchange(head, claimed, completed) {
        return (None, true);
    }
    // The head first, then the epoch, each read on its own: the claimant
    // writes the epoch before it swaps the head to admitted, so a head read
    // as admitted vouches for the epoch read after it. (One copy of the whole
    // stamp could pair the new head with the slot's last epoch, read a moment
    // before the claimant wrote it: that completion was counted late and its
    // reservation lapsed, about one soak in ten once the charge of the client
    // made the claimant slower.) One compare-and-swap: a lapsed stamp may be
    // taken by another flow's claim meanwhile, which this completion must not
    // undo; while the head still reads admitted, nobody rewrote the epoch.
    let admitted = HandshakeStamp::head(flow, stamp_state::ADMITTED);
    if atomic::load(head) != admitted {
        return (None, false);
    }
    // SAFETY: map value, plain fields read after the head vouched for them.
    let (epoch, syn_ns) = unsafe {
        (core::ptr::read_volatile(&raw const (*stamp).epoch), core::ptr::read_volatile(&raw const (*stamp).syn_ns))
    };
    if !atomic::compare_exchange(head, admitted, completed) {
        return (None, false);
    }
    let stamp = HandshakeStamp { epoch, syn_ns, ..HandshakeStamp::default() };
    let took = now_ns.saturating_sub(stamp.syn_ns);
    let Some(handshakes) = gate::handshakes().and_then(|m| m.get_ptr_mut(slot)) else { return (Some(took), false) };
    if fault!("handshake_not_released") {
        return (Some(took), true);
    }
    let in_time = ring::close(handshakes, stamp.epoch, now_ns >> shift);
    if in_time && let Some(client) = client {
        release_charge(client, stamp.epoch, now_ns >> shift);
    }
    (Some(took), in_time)
}

/// A stamp as one CPU may trust it while others write it: the head word
/// (flow and state) first, then the epoch. A claimant writes the epoch before
/// it swaps the head to admitted, so a head read as admitted vouches for the
/// epoch read after it; one copy of the whole stamp could pair the new head
/// with the slot's last epoch (a live handshake then judged a second time,
/// or its completion counted late, and a reservation lapsed).
#[inline(always)]
fn read(stamp: *const HandshakeStamp) -> HandshakeStamp {
    let head = atomic::load(stamp.cast::<u64>());
    // SAFETY: map value; a plain field read after the head.
    let epoch = unsafe { core::ptr::read_volatile(&raw const (*stamp).epoch) };
    HandshakeStamp { flow: head as u32, state: (head >> 32) as u32, epoch, syn_ns: 0 }
}
