// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The admission decision, shared by the XDP and TC entry points: a SYN
//! ([`syn`]), the ACK that completes a handshake ([`ack`]), and the first
//! bytes of a kept-alive connection's next request ([`turn`]), each judged
//! against a port's limit, tier shares, client cap and share ([`Port`]).
//!
//! A SYN proves nothing about its source, so it only reads: it is refused at
//! once when the port is already full of verified work, else passed holding
//! nothing. The admission itself is at the handshake-completing ACK (proven
//! by [`crate::proof`]): one fetch-add into the current epoch's cell of the
//! port's ring (judged again with the value it fetched, so racing CPUs cannot
//! overshoot), one into its client's ([`crate::client`]), and one stamp
//! ([`crate::stamp`]), which the socket tracepoint's confirmation releases.
//! A refusal writes nothing but per-CPU counters (and, for a reply, the rate
//! buckets of [`crate::reply`]).
use shed_common::{
    Contention, HandshakeRing, HandshakeStamp, PortConfig, UserPortState, action, count_mode, counter,
    handshake::stamp_state, http, is_ipv4_mapped, rst::Reset, tier,
};

use crate::{
    atomic,
    client::{charge_client, client_held, note_verified_refusal, over_client_cap, uncharge_client},
    fault::fault,
    http_answer::{http_flow, http_reason, http_reply, http_request, retry_after},
    maps::{count, gate, is_local, port_config, tier_of},
    parse::FLAG_FIN,
    parse::LoadBytes,
    parse::Segment,
    proof::{Found, next_expected, socket_of},
    reject::Answer,
    reply::{Verdict, take, withheld},
    ring,
    stamp::{Claim, flow_of},
};

/// Everything the SYN and late-ACK checks read about one port.
struct Port {
    slot: u32,
    config: PortConfig,
    limit: u64,
    /// Connections held (busy or established, by the port's count mode).
    held: u64,
    ring: *mut HandshakeRing,
    /// This CPU's counters of the port, looked up once.
    counters: *mut shed_common::PortCounters,
    now_ns: u64,
    epoch: u64,
}

impl Port {
    /// The protected port a segment is addressed to, or `None` (pass): the port
    /// has no slot or config, or (`check_local`) the destination is not one of
    /// this namespace's addresses (forwarded, or leaving a local container).
    /// A handshake-completing ACK needs no such check: the kernel's socket
    /// lookup found our own request socket or listener for it, which covers
    /// AnyIP routes, TPROXY and addresses the table does not hold yet.
    #[inline(always)]
    fn of(seg: &Segment, check_local: bool, now_ns: u64) -> Option<Self> {
        let port = seg.server_port;
        // A miss means "not protected": pass.
        let config = port_config(port)?;
        let slot = config.slot;
        if check_local && !is_local(&seg.server_addr) && !fault!("not_local_judged") {
            count(slot, counter::NOT_LOCAL);
            return None;
        }
        let state = gate::port_state().and_then(|m| m.get(slot))?;
        let limit = u64::from(*gate::limits().and_then(|m| m.get(slot))?);
        let mut user = gate::user_state().and_then(|m| m.get(slot)).copied().unwrap_or_default();
        if fault!("adjustment_ignored") {
            (user.established_adjust, user.busy_adjust) = (0, 0);
        }
        let ring = gate::handshakes().and_then(|m| m.get_ptr_mut(slot))?;
        let counters = gate::counters().and_then(|m| m.get_ptr_mut(slot))?;
        Some(Self {
            slot,
            config,
            limit,
            held: shed_common::held(state, &user, config.count_mode, silent(slot, config.count_mode, &user, now_ns)),
            ring,
            counters,
            now_ns,
            epoch: now_ns >> user.shift(),
        })
    }

    /// Admitted handshakes not yet established in the live cells other than
    /// the current epoch's, and in the current one.
    #[inline(always)]
    fn handshakes(&self) -> (u64, u64) {
        ring::outstanding(self.ring, self.epoch)
    }

    /// Takes a reservation in the current epoch's cell if in-flight stays within
    /// the limit, judged with the value the fetch-add returned.
    #[inline(always)]
    fn reserve(&self, others: u64, enforce: bool) -> bool {
        if fault!("reservation_not_taken") {
            return true;
        }
        let Some((cell, mine)) = ring::open(self.ring, self.epoch) else { return false };
        if enforce
            && !fault!("reservation_unchecked")
            && self.held + others + mine > self.limit + u64::from(fault!("limit_off_by_one"))
        {
            ring::undo(cell);
            return false;
        }
        true
    }

    /// The client's tier (normal while the port has no tiers: the LPM lookup
    /// is the dearest step of a judgement).
    #[inline(always)]
    fn tier(&self, seg: &Segment) -> u8 {
        if self.config.tiered != 0 && !fault!("tier_lookup_skipped") { tier_of(&seg.client_addr) } else { tier::NORMAL }
    }

    /// Why a client of `tier` would be refused with `in_flight` held, if it
    /// would: the whole limit is a hard stop; a tier's share of it sheds lower
    /// tiers first, except for a trickle that keeps a full tier from starving;
    /// a client at its cap is refused. Only reads (and the trickle's count).
    /// `share`: judge the tier's share (once per connection, where its tier is
    /// judged: else the trickle would apply twice). `verified`: the source has
    /// answered our SYN-ACK, so its client share may be judged.
    #[inline(always)]
    fn refusal(&self, tier: u8, in_flight: u64, seg: &Segment, share: bool, verified: bool) -> Option<usize> {
        if in_flight >= self.limit + u64::from(fault!("limit_off_by_one")) {
            Some(counter::REJECTED_LIMIT)
        } else if share
            && !fault!("share_ignored")
            && in_flight
                >= self.config.tier_threshold(tier, self.limit as u32).saturating_sub(held_back(self.slot, tier))
        {
            if trickle(self.slot) {
                self.count(counter::TRICKLE);
                None
            } else {
                Some(counter::REJECTED_SHARE)
            }
        } else if over_client_cap(&self.config, &seg.client_addr) {
            Some(counter::REJECTED_CLIENT_CAP)
        } else if verified && self.over_share_while_contended(seg) {
            Some(counter::REJECTED_CLIENT_SHARE)
        } else {
            None
        }
    }

    /// At a handshake-completing ACK (a proven source), the client share: a
    /// client holding its share or more is refused while clients holding less
    /// are being refused.
    #[inline(never)]
    fn over_share_while_contended(&self, seg: &Segment) -> bool {
        if fault!("client_share_ignored") {
            return false;
        }
        let Some(cap) = self.config.share_cap(self.limit as u32) else { return false };
        let Some(contention) = gate::contention().and_then(|m| m.get_ptr_mut(self.slot)) else { return false };
        // The port's contention first (an array read), the client's hold (a
        // hash lookup) only while it binds: a port with room is not contended.
        // SAFETY: map value, read as plain data.
        Contention::recent(unsafe { (*contention).refused_ns }, self.now_ns)
            && client_held(&self.config, &seg.client_addr) >= cap
    }

    /// What one client may hold now, its admissions under way included: its
    /// share while the share binds (a client under its share was refused
    /// lately), else no bound (`u64::MAX`). Through [`crate::maps::forget`]:
    /// the charge after it is walked once, not once per way here.
    #[inline(always)]
    fn share_binding(&self) -> u64 {
        let bound = match (self.config.share_cap(self.limit as u32), gate::contention().and_then(|m| m.get(self.slot)))
        {
            (Some(cap), Some(c))
                if Contention::recent(c.refused_ns, self.now_ns) && !fault!("client_share_ignored") =>
            {
                cap
            }
            _ => u64::MAX,
        };
        crate::maps::forget(bound)
    }

    /// A verified client was refused: if it holds less than its share, the
    /// share binds for a while (see [`Self::over_share_while_contended`]).
    /// Only a refusal for room (the limit) is contention: one for the client's
    /// own cap, or for its tier's share, says nothing of another client's hold.
    #[inline(always)]
    fn note_refused(&self, seg: &Segment, reason: Option<usize>) {
        if reason == Some(counter::REJECTED_LIMIT) {
            note_verified_refusal(&self.config, self.limit as u32, &seg.client_addr, self.now_ns);
        }
    }

    /// Whether the client share may bind on this port now: some client holds
    /// its share or more, and this client holds less ([`ShareAtSyn`]). Not on
    /// a tiered port: critical and normal are judged at their ACK already, and
    /// low is the tier refused first, at its SYN.
    #[inline(never)]
    fn share_may_bind(&self, seg: &Segment) -> u32 {
        if self.config.tiered != 0 {
            return ShareAtSyn::NO;
        }
        let Some(cap) = self.config.share_cap(self.limit as u32) else { return ShareAtSyn::NO };
        let Some(contention) = gate::contention().and_then(|m| m.get_ptr_mut(self.slot)) else { return ShareAtSyn::NO };
        // SAFETY: map value, read as plain data; the budget is taken by compare-and-swap.
        unsafe {
            if (*contention).largest_held < cap || client_held(&self.config, &seg.client_addr) >= cap {
                ShareAtSyn::NO
            } else if take(&raw mut (*contention).deferred_tat, self.now_ns, shed_common::DEFERRED_PER_SEC) {
                ShareAtSyn::DEFER
            } else {
                ShareAtSyn::PROVE
            }
        }
    }

    /// Adds one to a counter of the port on this CPU.
    #[inline(always)]
    fn count(&self, index: usize) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        if let Some(v) = unsafe { (*self.counters).values.get_mut(index) } {
            *v += 1;
        }
    }

    /// Remembers where the admitted flow holds its reservation, so its
    /// completion releases it: the epoch first, then the state that makes it
    /// count. Only into a slot this CPU claimed (a claim's compare-and-swap
    /// lost to another flow leaves that flow's stamp alone, and this
    /// admission lapses). The handshake may have completed meanwhile, by a
    /// segment of the flow another CPU passed as a duplicate: the completion
    /// then found the claim and left the release to this CPU.
    #[inline(always)]
    fn stamp(&self, claim: Claim, flow: u32, seg: &Segment, syn_ns: u64) {
        let Some(stamp) = gate::stamps().and_then(|m| m.get_ptr_mut(claim.index())) else { return };
        let head = stamp.cast::<u64>();
        let claimed = HandshakeStamp::head(flow, stamp_state::CLAIMED);
        if atomic::load(head) == claimed {
            // SAFETY: map value this CPU claimed.
            unsafe {
                core::ptr::write_volatile(&raw mut (*stamp).epoch, self.epoch);
                core::ptr::write_volatile(&raw mut (*stamp).syn_ns, syn_ns);
            }
            if atomic::compare_exchange(head, claimed, HandshakeStamp::head(flow, stamp_state::ADMITTED)) {
                return;
            }
        }
        if atomic::load(head) == HandshakeStamp::head(flow, stamp_state::COMPLETED) {
            ring::close(self.ring, self.epoch, self.epoch);
            uncharge_client(&self.config, &seg.client_addr, self.epoch, self.epoch);
        }
    }

    /// The verdict for a rejected segment; `reason` counted.
    #[inline(always)]
    /// `at_syn`: the segment is a SYN (an `http` refusal then answers it with
    /// a cookie; at the ACK the kernel's handshake is under way: a reset).
    /// `prove`: a SYN from a client under its share that `rst` answers with a
    /// cookie too, so that its ACK proves it ([`ShareAtSyn::PROVE`]).
    #[allow(clippy::too_many_arguments)]
    fn reject(
        &self,
        reason: usize,
        tier: u8,
        seg: &Segment,
        from_loopback: bool,
        reset: Reset,
        at_syn: bool,
        prove: bool,
    ) -> Verdict {
        self.count(reason);
        let shifted = usize::from(fault!("tier_counter_shifted"));
        self.count(counter::REJECTED_BY_TIER + ((usize::from(tier) + shifted) & (tier::COUNT - 1)));
        let act = if fault!("tier_action_ignored") { self.config.action } else { self.config.action_for(tier) };
        if act != action::RST && act != action::HTTP {
            return Verdict::Drop;
        }
        if let Some(why) = withheld(&self.config, &seg.client_addr, from_loopback, self.now_ns) {
            self.count(why);
            return Verdict::Drop;
        }
        let reset = if at_syn && (act == action::HTTP || (prove && !fault!("share_unproven"))) {
            http::syn_ack(
                http::cookie(crate::maps::cookie_key(), http_flow(seg), http_reason(reason), self.now_ns),
                seg.seq,
            )
        } else {
            reset
        };
        Verdict::Rst { slot: self.slot, reset }
    }
}

/// What the client share asks of a SYN the full port would refuse
/// ([`Port::share_may_bind`]).
struct ShareAtSyn;

impl ShareAtSyn {
    /// Nothing: refused as any.
    const NO: u32 = 0;
    /// Passed holding nothing, to be judged at its ACK (within the budget).
    const DEFER: u32 = 1;
    /// The budget is spent: refused with a cookie of ours, whose ACK proves the client.
    const PROVE: u32 = 2;
}

/// Judges a SYN to a protected port (the caller checked the port's slot).
/// `from_loopback`: it arrived on the loopback interface.
///
/// A SYN proves nothing about its source, so it only **reads**: it is refused
/// at once when the port (or its tier's share, or its client's cap) is already
/// full of verified work, and otherwise passed to the kernel holding nothing
/// (the kernel's SYN queue and SYN cookies answer it). The slot is taken when
/// the handshake-completing ACK proves the source real ([`ack`]).
/// Subprograms (not inlined), like [`ack`]: each needs much of the 512-byte stack.
#[inline(never)]
pub fn syn(seg: &Segment, from_loopback: bool, now_ns: u64) -> Verdict {
    // The kernel never completes a handshake from an IPv4-mapped IPv6 source
    // (tcp_v6_conn_request drops it): nothing to judge, no tier to give it.
    if seg.is_ipv6 && is_ipv4_mapped(&seg.client_addr) {
        return Verdict::Pass;
    }
    let Some(port) = Port::of(seg, true, now_ns) else { return Verdict::Pass };
    port.count(counter::SYN_SEEN);
    let tier = port.tier(seg);
    if tier == tier::EXEMPT {
        // Health checks and control-plane callers: always in, never counted.
        port.count(counter::EXEMPT);
        return Verdict::Pass;
    }
    // A claim to a tier that others yield to is worth nothing until the source
    // is verified: on a tiered port, critical and normal SYNs are judged at
    // their ACK only, so forged ones can neither take a slot above low nor make
    // lower tiers hold back. Low (the tier nobody yields to) is refused here.
    let (others, current) = port.handshakes();
    let mut reason = if deferred_to_ack(&port.config, tier) {
        None
    } else {
        port.refusal(tier, port.held + others + current, seg, true, false)
    };
    // A full port may be full of one client. A SYN it would refuse from a
    // client under its share then passes (holding nothing), so that the
    // client's refusal, at its ACK, comes from a proven source and makes the
    // share bind; forged SYNs meanwhile meet the kernel's SYN cookies.
    // Past the budget (a flood of forged SYNs spends it), the SYN is refused
    // with a cookie of ours even under `rst`: a real client's ACK answers it,
    // and its refusal there makes the share bind (`http_answer::http_segment`)
    // whatever forged SYNs do to the budget; the kernel then resets it.
    let mut prove = false;
    if reason == Some(counter::REJECTED_LIMIT) {
        let share = port.share_may_bind(seg);
        if share == ShareAtSyn::DEFER {
            reason = None;
        }
        prove = share == ShareAtSyn::PROVE;
    }
    let enforce = port.config.dry_run == 0 || fault!("dry_run_enforced");
    // Dry run passes it; what enforcing would refuse is counted once, at the
    // handshake-completing ACK, where the connection would be admitted.
    if let Some(reason) = reason.map(opaque)
        && enforce
    {
        let seq = seg.seq.wrapping_sub(u32::from(fault!("rst_ack_number")));
        return port.reject(reason, tier, seg, from_loopback, Reset::to_syn(seq), true, prove);
    }
    port.count(counter::SYN_PASSED);
    Verdict::Pass
}

/// Judges an ACK to a protected port: the admission itself. Only an ACK that
/// the kernel would take to complete a handshake (its 4-tuple finds a request
/// socket, or the listener and the ACK carries a valid SYN cookie) is judged;
/// every other segment passes after one socket lookup. Its source has
/// answered our SYN-ACK, so tiers and client caps judge a real address. An
/// admitted ACK reserves a slot until the socket tracepoint sees the
/// connection established (the same softirq, microseconds later), so racing
/// CPUs cannot overshoot the limit; a refused one is answered like a SYN
/// (`RST` with seq = its ack number, or dropped: the client retransmits).
/// `ctx` is the program's context, for the kernel's socket lookup.
#[inline(never)]
pub fn ack<B: LoadBytes>(seg: &Segment, bytes: &B, from_loopback: bool) -> Verdict {
    if fault!("late_ack_unjudged") {
        return Verdict::Pass;
    }
    if seg.is_ipv6 && is_ipv4_mapped(&seg.client_addr) {
        return Verdict::Pass;
    }
    // The socket lookup first: nearly every ACK belongs to an established
    // connection and ends here, before the port's maps are read.
    let mut sk = 0u64;
    match socket_of(seg, bytes.ctx(), &mut sk) {
        Found::HANDSHAKE => {}
        // No socket of the kernel's takes it: one of our HTTP answers' clients, or the kernel resets it.
        // Judged by the caller, whose frame is the shallower: `http_segment` needs stack of its own.
        Found::UNCLAIMED => return Verdict::Unclaimed,
        // Judged by the gate's turn program (a tail call), its socket handed over per CPU.
        Found::TURN => {
            crate::maps::set_turn_socket(sk);
            return Verdict::Turn;
        }
        _ => return Verdict::Pass,
    }
    // The clock only now: the segments that end above need no time.
    // SAFETY: reading the clock has no preconditions.
    let now_ns = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let Some(port) = Port::of(seg, fault!("ack_needs_local_table"), now_ns) else { return Verdict::Pass };
    let tier = port.tier(seg);
    if tier == tier::EXEMPT {
        port.count(counter::ADMITTED_BY_TIER + tier::EXEMPT as usize);
        return Verdict::Pass;
    }
    // A second segment of a handshake admitted (or being judged) already: a
    // duplicate ACK, or the request that completes a deferred accept.
    // Claimed before it is judged, so that of two CPUs judging the flow at
    // once (the ACK and the request right behind it) the second passes.
    let flow = flow_of(seg);
    let claim = Claim::take(port.slot, flow, port.epoch);
    if claim.is_duplicate() {
        return Verdict::Pass;
    }
    let (others, current) = port.handshakes();
    let enforce = port.config.dry_run == 0 || fault!("dry_run_enforced");
    // The share was judged at the SYN unless the tier was deferred to here.
    let share = deferred_to_ack(&port.config, tier);
    let mut reason = port.refusal(tier, port.held + others + current, seg, share, true);
    if reason.is_none() && !port.reserve(others, enforce) {
        reason = Some(counter::REJECTED_LIMIT);
    }
    port.note_refused(seg, reason);
    // Then the client's charge: its admissions under way count against its
    // cap and, while the share binds, its share (the port's reservation given
    // back if it is refused; a dry run counts the refusal and admits, uncharged).
    if reason.is_none() {
        let refused = charge_client(&port.config, seg, port.epoch, port.share_binding());
        if refused != 0 {
            ring::undo_at(port.ring, port.epoch);
            reason = Some(refused);
        }
    }
    if let Some(reason) = reason.map(opaque) {
        if enforce {
            claim.give_back(flow);
            port.count(counter::REFUSED_AT_ACK);
            // Verified refusals by tier: what the daemon's tier hold-back reacts to.
            port.count(counter::VERIFIED_REJECTED_BY_TIER + (usize::from(tier) & (tier::COUNT - 1)));
            return port.reject(reason, tier, seg, from_loopback, Reset::to_ack(seg.ack_seq), false, false);
        }
        port.count(counter::DRY_RUN_WOULD_REJECT);
        // Dry run admits it, and accounts it as any admission.
        port.reserve(others, false);
    }
    port.stamp(claim, flow, seg, port.now_ns);
    port.count(counter::ADMITTED);
    port.count(counter::ADMITTED_BY_TIER + (usize::from(tier) & (tier::COUNT - 1)));
    Verdict::Pass
}

/// A refusal's counter index, hidden from the verifier's value tracking: each
/// reason as a constant would be a path of its own through the whole refusal
/// (the reset, the rate caps), so that the verifier walks it once per reason.
#[inline(always)]
fn opaque(reason: usize) -> usize {
    // SAFETY: reading a local.
    unsafe { core::ptr::read_volatile(&reason) & (counter::COUNT - 1) }
}

/// Whether a SYN of `tier` is judged only at its ACK: on a tiered port, a
/// claim to a tier that others yield to (critical, normal) is worth nothing
/// until the source is verified.
#[inline(always)]
fn deferred_to_ack(config: &PortConfig, tier: u8) -> bool {
    config.tiered != 0 && tier < tier::LOW && !fault!("tier_judged_unverified")
}

/// Judges the first segment of a kept-alive connection's next request
/// ([`Found::TURN`]) as a new connection is judged at its handshake (limit,
/// tier share, client cap and share; an exempt client passes), against the
/// work held now. Admitted, it passes: the socket tracepoint makes the
/// connection busy as the kernel queues the bytes, microseconds later on
/// this CPU. Refused, the service never reads it: the segment is consumed,
/// the client is answered as the port's action says (`http`: the `503` with
/// FIN in the connection's own sequence space; `rst`, or a request that is
/// not HTTP/1.x: a reset; `drop`: nothing), and the socket is recorded so
/// that a retransmission gets the same answer and the daemon closes the
/// server's socket within a tick (`SOCK_DESTROY`).
/// (Four arguments and the result, the most a BPF call passes in registers:
/// the clock is read again here.)
#[inline(never)]
pub fn turn<B: LoadBytes>(seg: &Segment, bytes: &B, sk: u64, from_loopback: bool) -> Verdict {
    // SAFETY: reading the clock has no preconditions.
    let now_ns = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let Some(port) = Port::of(seg, false, now_ns) else { return Verdict::Pass };
    if port.config.count_mode != count_mode::WORK {
        return Verdict::Pass;
    }
    if !next_expected(sk, seg.seq) {
        return Verdict::Pass;
    }
    let tier = port.tier(seg);
    if tier == tier::EXEMPT {
        return Verdict::Pass;
    }
    // Only a connection refused before has a record to look for.
    let refused =
        if crate::maps::turn_refused_before() { gate::refused_turns().and_then(|m| m.get_ptr(&sk)) } else { None };
    // SAFETY: map value, read as plain data.
    let again = refused.filter(|&t| unsafe { (*t).seq } == seg.seq).map(|t| unsafe { (*t).reason } as usize);
    let reason = if let Some(reason) = again {
        port.count(counter::REQUEST_REFUSED_AGAIN);
        opaque(reason)
    } else {
        let (others, current) = port.handshakes();
        let Some(reason) = port.refusal(tier, port.held + others + current, seg, true, true) else {
            crate::account::turn_admitted(sk, port.slot);
            port.count(counter::REQUEST_ADMITTED);
            return Verdict::Pass;
        };
        if port.config.dry_run != 0 && !fault!("dry_run_enforced") {
            port.count(counter::DRY_RUN_WOULD_REJECT);
            return Verdict::Pass;
        }
        if !fault!("refused_request_binds_nothing") {
            port.note_refused(seg, Some(reason));
        }
        let reason = opaque(reason);
        remember_refused(sk, seg, reason, port.config.action_for(tier), now_ns);
        port.count(counter::REFUSED_REQUEST);
        port.count(reason);
        port.count(counter::REJECTED_BY_TIER + (usize::from(tier) & (tier::COUNT - 1)));
        port.count(counter::VERIFIED_REJECTED_BY_TIER + (usize::from(tier) & (tier::COUNT - 1)));
        reason
    };
    let act = port.config.action_for(tier);
    if act == action::HTTP && http_request(seg, bytes) {
        let fin = seg.flags & FLAG_FIN != 0;
        let end = seg.seq.wrapping_add(u32::from(seg.payload_len)).wrapping_add(u32::from(fin));
        let answer = Answer {
            seq: seg.ack_seq,
            ack: end,
            flags: http::FLAGS_ANSWER,
            payload: http::answer_index(http_reason(reason), tier) as u8 + 1,
            digits: http::retry_digits(retry_after(&port.config)),
            sent: Answer::counted(counter::HTTP_ANSWERED),
        };
        return http_reply(&port.config, seg, from_loopback, now_ns, Verdict::Answer { slot: port.slot, answer });
    }
    if act != action::RST && act != action::HTTP {
        return Verdict::Drop;
    }
    if let Some(why) = withheld(&port.config, &seg.client_addr, from_loopback, now_ns) {
        port.count(why);
        return Verdict::Drop;
    }
    Verdict::Rst { slot: port.slot, reset: Reset::to_ack(seg.ack_seq) }
}

/// Records a refused request ([`shed_common::RefusedTurn`]), field by field into the map's value.
#[inline(never)]
fn remember_refused(sk: u64, seg: &Segment, reason: usize, act: u8, now_ns: u64) {
    let flow = if fault!("refused_record_sides_swapped") {
        shed_common::FlowKey {
            client_addr: seg.server_addr,
            server_addr: seg.client_addr,
            client_port: seg.server_port,
            server_port: seg.client_port,
        }
    } else {
        shed_common::FlowKey {
            client_addr: seg.client_addr,
            server_addr: seg.server_addr,
            client_port: seg.client_port,
            server_port: seg.server_port,
        }
    };
    let turn = shed_common::RefusedTurn {
        at_ns: now_ns,
        flow,
        seq: seg.seq,
        reason: if fault!("refusal_reason_lost") { counter::REJECTED_LIMIT as u32 } else { reason as u32 },
        action: u32::from(act),
    };
    if gate::refused_turns().map_or(Err(-1), |m| m.insert(&sk, &turn, 0)).is_err() || fault!("refusal_unmarked") {
        return;
    }
    // The connection's entry says so, for its next request's judgement
    // ([`crate::maps::turn_refused_before`]).
    if let Some(entry) = gate::socks().and_then(|m| m.get_ptr_mut(&sk)) {
        // SAFETY: map value; a byte no other path writes (see `SockEntry::refused_request`).
        unsafe { core::ptr::write_volatile(&raw mut (*entry).refused_request, 1) };
    }
}

/// Room the daemon holds back from `tier` for the tiers above it.
#[inline(always)]
fn held_back(slot: u32, tier: u8) -> u64 {
    if fault!("held_back_ignored") {
        return 0;
    }
    gate::reserve().and_then(|m| m.get(slot)).and_then(|r| r.held_back.get(tier as usize)).map_or(0, |&h| u64::from(h))
}

/// One share rejection in [`tier::TRICKLE_EVERY`] (per CPU) is admitted instead.
#[inline(always)]
fn trickle(slot: u32) -> bool {
    if fault!("trickle_never") {
        return false;
    }
    let Some(counters) = gate::counters().and_then(|m| m.get_ptr_mut(slot)) else { return false };
    // SAFETY: per-CPU value. The share-rejection count doubles as the trickle's clock.
    let seen = unsafe { (*counters).values[counter::REJECTED_SHARE] + (*counters).values[counter::TRICKLE] };
    seen % tier::TRICKLE_EVERY == tier::TRICKLE_EVERY - 1
}

/// `work` connections of the port accepted within the idle grace that have
/// sent nothing yet (0 in the other count modes: they count connections).
#[inline(always)]
fn silent(slot: u32, mode: u8, user: &UserPortState, now_ns: u64) -> u64 {
    if mode != count_mode::WORK || fault!("silent_not_held") {
        return 0;
    }
    let Some(silent) = gate::silent().and_then(|m| m.get_ptr(slot)) else { return 0 };
    let (others, current) = ring::outstanding(silent, now_ns >> user.silent_shift());
    others + current
}
