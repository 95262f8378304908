// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The admission decision, shared by the XDP and TC entry points.
//!
//! A SYN is judged only when it is addressed to this namespace and its port is
//! protected. The check itself only reads: held connections (confirmed by the
//! kernel, counted by the socket tracepoint) plus the handshakes still under
//! way in the port's ring. Only an admitted SYN writes: one fetch-add into the
//! current epoch's cell (judged again with the value it fetched, so racing
//! CPUs cannot overshoot) and one stamp. A rejected SYN writes nothing but
//! per-CPU counters (and, for a RST, the rate buckets).
use shed_common::{
    ClientKey, Contention, HandshakeRing, HandshakeStamp, PortConfig, UserPortState, action, count_mode, counter,
    gate_counter,
    handshake::{STAMP_PROBES, stamp_index, stamp_state},
    http, is_ipv4_mapped,
    ratelimit::{gcra_take, prefix_bucket_index},
    rst::Reset,
    rst_prefix, tier,
};

use crate::{
    atomic,
    fault::fault,
    maps::{
        SHED_CLIENTS, SHED_CONTENTION, SHED_COUNTERS, SHED_EMPTY_RING, SHED_HANDSHAKES, SHED_LAST_PASSED, SHED_LIMITS,
        SHED_PENDING_CLIENTS, SHED_PORT_STATE, SHED_REFUSED_TURNS, SHED_RESERVE, SHED_RST_BUCKETS, SHED_RST_PREFIX,
        SHED_SILENT, SHED_SOCKS, SHED_STAMPS, SHED_USER_STATE, count, count_gate, is_local, is_loopback, local_kind,
        port_config, stamp_hash, tier_of,
    },
    parse::{FLAG_FIN, FLAG_PSH, LoadBytes, Segment},
    reject::Answer,
    ring,
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

/// Where a handshake-completing ACK claimed its flow's stamp: the index of
/// the slot it tried to claim (it holds it if the slot's head reads its
/// flow, claimed), or [`Claim::DUPLICATE`]. One scalar whose value the
/// judging path never branches on: the verifier walks that path once, not
/// once per outcome of the claim.
#[derive(Clone, Copy)]
struct Claim(u32);

impl Claim {
    /// The flow's handshake holds a reservation already, or another CPU is
    /// judging it right now: this segment passes, counted nowhere.
    const DUPLICATE: Self = Self(u32::MAX);

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
    fn take(slot: u32, flow: u32, epoch: u64) -> Self {
        let slot = slot ^ u32::from(fault!("stamp_wrong_key"));
        let mut chosen = stamp_index(slot, flow, 0);
        let mut free = false;
        for probe in 0..STAMP_PROBES {
            let index = stamp_index(slot, flow, probe);
            let Some(stamp) = SHED_STAMPS.get(index) else { break };
            // SAFETY: map value, copied out as plain data (a torn copy at worst misjudges one slot).
            let seen = unsafe { core::ptr::read_volatile(stamp) };
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
        let Some(stamp) = SHED_STAMPS.get_ptr_mut(chosen) else { return Self(chosen) };
        // SAFETY: map value, copied out as plain data.
        let seen = unsafe { core::ptr::read_volatile(stamp) };
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

    #[inline(always)]
    fn is_duplicate(self) -> bool {
        self.0 == Self::DUPLICATE.0
    }

    /// Gives back a claimed slot: the flow was refused.
    #[inline(always)]
    fn give_back(self, flow: u32) {
        if let Some(stamp) = SHED_STAMPS.get_ptr_mut(self.0) {
            let claimed = HandshakeStamp::head(flow, stamp_state::CLAIMED);
            atomic::compare_exchange(stamp.cast::<u64>(), claimed, HandshakeStamp::head(flow, stamp_state::COMPLETED));
        }
    }
}

/// `sk_state` values (include/net/tcp_states.h).
const TCP_ESTABLISHED: u32 = 1;
const TCP_TIME_WAIT: u32 = 6;
const TCP_LISTEN: u32 = 10;
const TCP_NEW_SYN_RECV: u32 = 12;

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
        let state = SHED_PORT_STATE.get(slot)?;
        let limit = u64::from(*SHED_LIMITS.get(slot)?);
        let mut user = SHED_USER_STATE.get(slot).copied().unwrap_or_default();
        if fault!("adjustment_ignored") {
            (user.established_adjust, user.busy_adjust) = (0, 0);
        }
        let ring = SHED_HANDSHAKES.get_ptr_mut(slot)?;
        let counters = SHED_COUNTERS.get_ptr_mut(slot)?;
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
        let Some(contention) = SHED_CONTENTION.get_ptr_mut(self.slot) else { return false };
        if client_held(&self.config, &seg.client_addr) < cap {
            return false;
        }
        // SAFETY: map value, read as plain data.
        Contention::recent(unsafe { (*contention).refused_ns }, self.now_ns)
    }

    /// A verified client was refused: if it holds less than its share, the
    /// share binds for a while (see [`Self::over_share_while_contended`]).
    #[inline(never)]
    fn note_refused(&self, seg: &Segment) {
        let Some(cap) = self.config.share_cap(self.limit as u32) else { return };
        let Some(contention) = SHED_CONTENTION.get_ptr_mut(self.slot) else { return };
        if client_held(&self.config, &seg.client_addr) < cap {
            // SAFETY: map value; a plain store.
            unsafe { (*contention).refused_ns = self.now_ns };
        }
    }

    /// Whether the client share may bind on this port now: some client holds
    /// its share or more, and this client holds less. Not on a tiered port:
    /// critical and normal are judged at their ACK already, and low is the
    /// tier refused first, at its SYN.
    #[inline(never)]
    fn share_may_bind(&self, seg: &Segment) -> bool {
        if self.config.tiered != 0 {
            return false;
        }
        let Some(cap) = self.config.share_cap(self.limit as u32) else { return false };
        let Some(contention) = SHED_CONTENTION.get_ptr_mut(self.slot) else { return false };
        // SAFETY: map value, read as plain data; the budget is taken by compare-and-swap.
        unsafe {
            (*contention).largest_held >= cap
                && client_held(&self.config, &seg.client_addr) < cap
                && take(&raw mut (*contention).deferred_tat, self.now_ns, shed_common::DEFERRED_PER_SEC)
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
        let Some(stamp) = SHED_STAMPS.get_ptr_mut(claim.0) else { return };
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
    fn reject(
        &self,
        reason: usize,
        tier: u8,
        seg: &Segment,
        from_loopback: bool,
        reset: Reset,
        at_syn: bool,
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
        let reset = if act == action::HTTP && at_syn {
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
    if reason == Some(counter::REJECTED_LIMIT) && port.share_may_bind(seg) {
        reason = None;
    }
    let enforce = port.config.dry_run == 0 || fault!("dry_run_enforced");
    // Dry run passes it; what enforcing would refuse is counted once, at the
    // handshake-completing ACK, where the connection would be admitted.
    if let Some(reason) = reason.map(opaque)
        && enforce
    {
        let seq = seg.seq.wrapping_sub(u32::from(fault!("rst_ack_number")));
        return port.reject(reason, tier, seg, from_loopback, Reset::to_syn(seq), true);
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
pub fn ack<B: LoadBytes>(seg: &Segment, bytes: &B, from_loopback: bool, now_ns: u64) -> Verdict {
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
    if reason.is_some() {
        port.note_refused(seg);
    }
    if reason.is_none() && !port.reserve(others, enforce) {
        reason = Some(counter::REJECTED_LIMIT);
    }
    // Then the client's charge: its admissions under way count against its
    // cap (the port's reservation given back if it is refused).
    if reason.is_none() && !charge_client(&port.config, seg, port.epoch, enforce) {
        ring::close(port.ring, port.epoch, port.epoch);
        reason = Some(counter::REJECTED_CLIENT_CAP);
    }
    if let Some(reason) = reason.map(opaque) {
        if enforce {
            claim.give_back(flow);
            port.count(counter::REFUSED_AT_ACK);
            // Verified refusals by tier: what the daemon's tier hold-back reacts to.
            port.count(counter::VERIFIED_REJECTED_BY_TIER + (usize::from(tier) & (tier::COUNT - 1)));
            return port.reject(reason, tier, seg, from_loopback, Reset::to_ack(seg.ack_seq), false);
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

/// Whether this CPU passed this very segment a moment ago, on the device below
/// (or above) this one: then it is passed again, uncounted and unreserved.
#[inline(always)]
pub fn passed_already(seg: &Segment, syn: bool, now_ns: u64, ifindex: u32) -> bool {
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
        && now_ns.wrapping_sub(last.at_ns) < shed_common::STACKED_WITHIN_NS
        && last.payload_len == seg.payload_len
        && last.flags == seg.flags
        && last.client_addr == seg.client_addr
        && last.server_addr == seg.server_addr
}

/// Remembers a passed segment (see [`passed_already`]). Field by field into
/// the map value: a whole struct built on the stack first would push the
/// judging path over the verifier's 512-byte stack.
#[inline(never)]
pub fn remember_passed(seg: &Segment, syn: bool, now_ns: u64, ifindex: u32) {
    if let Some(last) = SHED_LAST_PASSED.get_ptr_mut(0) {
        // SAFETY: per-CPU map value; programs do not migrate CPU mid-run.
        unsafe {
            (*last).at_ns = now_ns;
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

/// The stamp `flow` took at admission, if it is still there.
#[inline(always)]
fn find_stamp(slot: u32, flow: u32) -> Option<*mut HandshakeStamp> {
    for probe in 0..STAMP_PROBES {
        let stamp = SHED_STAMPS.get_ptr_mut(stamp_index(slot, flow, probe))?;
        // SAFETY: map value, read as plain data.
        if unsafe { (*stamp).flow } == flow {
            return Some(stamp);
        }
    }
    None
}

#[inline(always)]
fn flow_of(seg: &Segment) -> u32 {
    stamp_hash(&seg.client_addr, &seg.server_addr, seg.client_port, seg.server_port)
}

/// What the kernel's socket lookup makes of an ACK (a plain value: see [`Claim`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Found(u8);

impl Found {
    /// It completes a handshake: judge it.
    const HANDSHAKE: Self = Self(0);
    /// An established connection, or a handshake it does not prove: pass.
    const OTHER: Self = Self(1);
    /// Only the listener (and no SYN cookie of the kernel's), an old
    /// connection's TIME_WAIT, or no socket at all: not a segment the kernel
    /// takes, unless it is a client of our HTTP answer (a client reusing its
    /// port finds the server's TIME_WAIT of its last connection).
    const UNCLAIMED: Self = Self(2);
    /// The first bytes of the next request on a kept-alive connection that
    /// owes no answer: judge it as a new connection ([`turn`]).
    const TURN: Self = Self(3);
}

/// Whether the kernel would complete a handshake with this ACK: the socket it
/// finds for the 4-tuple is a request socket (a handshake under way) whose
/// SYN-ACK the ACK acknowledges, or the listener itself and the ACK carries a
/// valid SYN cookie (any other ACK to a
/// listener is answered with a reset by the kernel, and holds nothing here).
///
/// A segment with data on an established connection that owes no answer (in
/// `SHED_SOCKS`, idle: the application answered its last request and reads
/// nothing more), whose first byte is the next the socket expects, starts
/// the connection's next request: [`Found::TURN`], with the socket's address
/// in `turn_sk`. Every other segment of an established connection (a busy
/// one's, pure ACKs, retransmissions of old data) passes as before.
#[inline(always)]
fn socket_of(seg: &Segment, ctx: *mut core::ffi::c_void, turn_sk: &mut u64) -> Found {
    use aya_ebpf::{
        bindings::{BPF_F_CURRENT_NETNS, bpf_sock_tuple},
        helpers::{bpf_sk_release, bpf_skc_lookup_tcp},
    };
    // SAFETY: a plain C union of byte arrays and integers; all-zero is valid.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let size = if seg.is_ipv6 {
        // SAFETY: writing plain fields of the union.
        unsafe {
            let t = &mut tuple.__bindgen_anon_1.ipv6;
            t.saddr = core::mem::transmute::<[u8; 16], [u32; 4]>(seg.client_addr);
            t.daddr = core::mem::transmute::<[u8; 16], [u32; 4]>(seg.server_addr);
            t.sport = seg.client_port.to_be();
            t.dport = seg.server_port.to_be();
        }
        core::mem::size_of::<aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>()
    } else {
        let v4 = |a: &[u8; 16]| u32::from_ne_bytes([a[12], a[13], a[14], a[15]]);
        // SAFETY: as above.
        unsafe {
            let t = &mut tuple.__bindgen_anon_1.ipv4;
            t.saddr = v4(&seg.client_addr);
            t.daddr = v4(&seg.server_addr);
            t.sport = seg.client_port.to_be();
            t.dport = seg.server_port.to_be();
        }
        core::mem::size_of::<aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>()
    };
    // SAFETY: the helper takes the program's own context and a stack tuple of `size` bytes;
    // a non-null result is a referenced socket that must be released on every path.
    unsafe {
        let sk = bpf_skc_lookup_tcp(ctx, &mut tuple, size as u32, BPF_F_CURRENT_NETNS as u64, 0);
        if sk.is_null() {
            return Found::UNCLAIMED;
        }
        let state = (*sk).state;
        let proven = state == TCP_NEW_SYN_RECV && acks_our_syn_ack(sk.cast(), seg);
        if state == TCP_ESTABLISHED && seg.payload_len > 0 {
            *turn_sk = turn_socket(sk.cast());
        }
        bpf_sk_release(sk.cast());
        if *turn_sk != 0 {
            Found::TURN
        } else if proven {
            Found::HANDSHAKE
        } else if state == TCP_TIME_WAIT && !fault!("http_time_wait_passed") {
            Found::UNCLAIMED
        } else if state != TCP_LISTEN {
            Found::OTHER
        } else if valid_cookie(seg) {
            Found::HANDSHAKE
        } else {
            Found::UNCLAIMED
        }
    }
}

/// Whether data to established socket `sk` may start its next request: the
/// socket is one the gate counts (`SHED_SOCKS`) and owes no answer (idle,
/// not silent since its handshake, not multiplexed). Then the socket's
/// address, else 0. The turn program checks the rest ([`next_expected`]):
/// every instruction here is walked by the verifier once per state that
/// reaches the ACK's lookup. A subprogram: its ways to say no end in one
/// state for the caller.
#[inline(never)]
fn turn_socket(sk: *mut core::ffi::c_void) -> u64 {
    if fault!("turns_unjudged") {
        return 0;
    }
    let key = sk as u64;
    let Some(entry) = SHED_SOCKS.get_ptr(&key) else { return 0 };
    // SAFETY: map value, read as plain data.
    let idle = unsafe { (*entry).busy == 0 && (*entry).silent == 0 && (*entry).multiplexed == 0 };
    if idle { key } else { 0 }
}

/// Whether `seq` is the next byte socket `sk` (an address from the gate's
/// lookup, a moment ago) expects: the first byte of a request, not a
/// retransmission of data it has. Read at `tcp_sock.rcv_nxt` (the offset
/// userspace finds in BTF); without it, true.
#[inline(always)]
fn next_expected(sk: u64, seq: u32) -> bool {
    use aya_ebpf::helpers::bpf_probe_read_kernel;
    let offset = crate::maps::rcv_nxt_offset();
    if offset == 0 {
        return true;
    }
    // SAFETY: a 4-byte read of kernel memory; the helper fails safely on a bad
    // address (sockets are freed by RCU: the memory stays a socket's meanwhile).
    matches!(unsafe { bpf_probe_read_kernel((sk + u64::from(offset)) as *const u32) }, Ok(next) if next == seq)
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
    let refused = SHED_REFUSED_TURNS.get_ptr(&sk);
    // SAFETY: map value, read as plain data.
    let again = refused.filter(|&t| unsafe { (*t).seq } == seg.seq).map(|t| unsafe { (*t).reason } as usize);
    let reason = if let Some(reason) = again {
        port.count(counter::REQUEST_REFUSED_AGAIN);
        opaque(reason)
    } else {
        let (others, current) = port.handshakes();
        let Some(reason) = port.refusal(tier, port.held + others + current, seg, true, true) else {
            port.count(counter::REQUEST_ADMITTED);
            return Verdict::Pass;
        };
        if port.config.dry_run != 0 && !fault!("dry_run_enforced") {
            port.count(counter::DRY_RUN_WOULD_REJECT);
            return Verdict::Pass;
        }
        port.note_refused(seg);
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
    let turn = shed_common::RefusedTurn {
        at_ns: now_ns,
        flow: shed_common::FlowKey {
            client_addr: seg.client_addr,
            server_addr: seg.server_addr,
            client_port: seg.client_port,
            server_port: seg.server_port,
        },
        seq: seg.seq,
        reason: reason as u32,
        action: u32::from(act),
    };
    let _ = SHED_REFUSED_TURNS.insert(&sk, &turn, 0);
}

/// Whether an ACK to request socket `sk` acknowledges the SYN-ACK it sent
/// (ack number = its ISN + 1) and falls in its receive window (after the
/// client's ISN), as the kernel requires to complete the handshake. Only the
/// client the SYN-ACK reached knows the ack number: a blind forger that sent
/// the SYN (and so knows the 4-tuple) cannot follow it with an ACK that takes
/// a reservation, however many it sends. A real client that sends ACKs the
/// kernel drops (out of window) cannot take reservation after reservation
/// either. Each check is skipped when its offset is unknown (judged on the
/// socket alone, as before).
#[inline(always)]
unsafe fn acks_our_syn_ack(sk: *mut core::ffi::c_void, seg: &Segment) -> bool {
    use aya_ebpf::helpers::{bpf_probe_read_kernel, bpf_skc_to_tcp_request_sock};
    let (snt_isn_at, rcv_isn_at) = (crate::maps::snt_isn_offset(), crate::maps::rcv_isn_offset());
    if snt_isn_at == 0 || fault!("ack_number_unchecked") {
        return true;
    }
    // SAFETY: `sk` is a referenced socket from the lookup, released by the caller after this.
    let req = unsafe { bpf_skc_to_tcp_request_sock(sk) };
    if req.is_null() {
        return true;
    }
    // SAFETY: 4-byte reads of kernel memory; the helper fails safely on a bad address.
    let read = |at: u32| unsafe { bpf_probe_read_kernel(req.cast::<u8>().add(at as usize).cast::<u32>()) };
    let acked = match read(snt_isn_at) {
        Ok(isn) => seg.ack_seq == isn.wrapping_add(1),
        Err(_) => true,
    };
    let in_window = rcv_isn_at == 0
        || fault!("sequence_unchecked")
        || match read(rcv_isn_at) {
            Ok(isn) => {
                let len = u32::from(seg.payload_len) + u32::from(seg.flags & FLAG_FIN != 0);
                shed_common::handshake::in_synack_window(seg.seq, seg.seq.wrapping_add(len), isn)
            }
            Err(_) => true,
        };
    if !(acked && in_window) {
        count_gate(gate_counter::UNPROVEN_ACK);
    }
    acked && in_window
}

/// Whether the ACK carries a SYN cookie the kernel would accept. The helpers
/// read only the addresses, ports and sequence numbers, so headers rebuilt on
/// the stack from the segment serve.
#[inline(always)]
fn valid_cookie(seg: &Segment) -> bool {
    use aya_ebpf::{
        bindings::{iphdr, ipv6hdr, tcphdr},
        helpers::{bpf_tcp_raw_check_syncookie_ipv4, bpf_tcp_raw_check_syncookie_ipv6},
    };
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&seg.client_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&seg.server_port.to_be_bytes());
    let seq = if fault!("cookie_byte_order") { seg.seq.to_le_bytes() } else { seg.seq.to_be_bytes() };
    tcp[4..8].copy_from_slice(&seq);
    tcp[8..12].copy_from_slice(&seg.ack_seq.to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = 0x10;
    // SAFETY: the helpers read a fixed-size IP and TCP header from these initialised stack buffers.
    unsafe {
        if seg.is_ipv6 {
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[6] = 6;
            ip[8..24].copy_from_slice(&seg.client_addr);
            ip[24..40].copy_from_slice(&seg.server_addr);
            bpf_tcp_raw_check_syncookie_ipv6(ip.as_mut_ptr().cast::<ipv6hdr>(), tcp.as_mut_ptr().cast::<tcphdr>()) == 0
        } else {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[9] = 6;
            ip[12..16].copy_from_slice(&seg.client_addr[12..]);
            ip[16..20].copy_from_slice(&seg.server_addr[12..]);
            bpf_tcp_raw_check_syncookie_ipv4(ip.as_mut_ptr().cast::<iphdr>(), tcp.as_mut_ptr().cast::<tcphdr>()) == 0
        }
    }
}

/// Whether a client already holds its cap of established connections (read only:
/// the tracepoint counts connections when the kernel confirms them).
#[inline(never)]
fn over_client_cap(config: &PortConfig, client: &[u8; 16]) -> bool {
    if config.client_cap == 0 {
        return false;
    }
    client_held(config, client) >= u64::from(config.client_cap) + u64::from(fault!("client_cap_off_by_one"))
}

/// The established connections `client` holds on the port (0 when it holds
/// none, or clients are not counted).
#[inline(always)]
fn client_held(config: &PortConfig, client: &[u8; 16]) -> u64 {
    let key: ClientKey = if fault!("client_key_misread") {
        PortConfig { client_prefix_v6: 48, ..*config }.client_key(client)
    } else {
        config.client_key(client)
    };
    // SAFETY: plain data.
    unsafe { SHED_CLIENTS.get(&key) }.map_or(0, |&held| if held < 0 { 0 } else { held as u64 })
}

/// A client's admissions at the ACK that the kernel has not established yet
/// ([`shed_common::map::PENDING_CLIENTS`]): a `TCP_DEFER_ACCEPT` listener keeps
/// them as request sockets until their first bytes, so without them one
/// address could stack admissions past its cap before any is established.
/// Charged in the port's handshake epochs, they lapse like the port's own
/// reservations.
///
/// Charges one admission to `seg`'s client, judged with the value the
/// fetch-add returned (so racing CPUs cannot stack one client past its cap
/// either): false, nothing charged, if the client's established connections
/// and its admissions under way would pass its cap. A subprogram: the ACK
/// path's one extra call.
#[inline(never)]
fn charge_client(config: &PortConfig, seg: &Segment, epoch: u64, enforce: bool) -> bool {
    if !config.counts_clients() || fault!("client_pending_ignored") {
        return true;
    }
    let key = &config.client_key(&seg.client_addr);
    // No room in the table: counted once established, as before it had one.
    let Some(pending) = pending_ring(key, true) else { return true };
    // The ring walked here, not in `ring::outstanding`: a call deeper would
    // pass the 512-byte stack (XDP entry, `ack`, this). Its paths merge after.
    // SAFETY: map value; cells are read field by field while other CPUs add to them.
    let others = crate::maps::forget(unsafe { &*pending }.split(epoch, |field| atomic::load(field)).others);
    let Some((cell, mine)) = ring::open(pending, epoch) else { return true };
    let cap = u64::from(config.client_cap);
    // SAFETY: plain data.
    let established = unsafe { SHED_CLIENTS.get(key) }.map_or(0, |&held| if held < 0 { 0 } else { held as u64 });
    if enforce && cap != 0 && established + others + mine > cap + u64::from(fault!("client_cap_off_by_one")) {
        ring::undo(cell);
        return false;
    }
    true
}

/// The ring of `key`'s admissions under way; `create`: a client without one
/// gets one (the table is an LRU: the least recent client's goes, its
/// admissions then counted once established).
#[inline(always)]
fn pending_ring(key: &ClientKey, create: bool) -> Option<*mut HandshakeRing> {
    if let Some(pending) = SHED_PENDING_CLIENTS.get_ptr_mut(key) {
        return Some(pending);
    }
    if !create {
        return None;
    }
    let empty = SHED_EMPTY_RING.get(0)?;
    // Another CPU may insert it first: this then finds that one.
    let _ = SHED_PENDING_CLIENTS.insert(key, empty, u64::from(aya_ebpf::bindings::BPF_NOEXIST));
    SHED_PENDING_CLIENTS.get_ptr_mut(key)
}

/// Releases an admission charged to `seg`'s client at `epoch` (its handshake
/// completed, or the port refused it after the charge), unless it lapsed.
#[inline(never)]
fn uncharge_client(config: &PortConfig, client: &[u8; 16], epoch: u64, now_epoch: u64) {
    if !config.counts_clients() || fault!("client_pending_not_released") {
        return;
    }
    if let Some(pending) = pending_ring(&config.client_key(client), false) {
        ring::close(pending, epoch, now_epoch);
    }
}

/// Why a reply (a reset, or an `http` answer) may not go to `client` now, as
/// the counter to count: a source that cannot be a client (`RST_SUPPRESSED`),
/// or a spent RST cap (`RST_RATE_LIMITED`, the budget taken otherwise).
#[inline(always)]
fn withheld(config: &PortConfig, client: &[u8; 16], from_loopback: bool, now_ns: u64) -> Option<usize> {
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
fn answerable(client: &[u8; 16], from_loopback: bool) -> bool {
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
fn rst_allowed(slot: u32, config: &PortConfig, client: &[u8; 16], now: u64) -> bool {
    if fault!("rst_cap_ignored") {
        return true;
    }
    // The prefix first: a flood from one prefix must not spend the port's budget.
    if config.rst_per_prefix_per_sec != 0 {
        let index = prefix_bucket_index(slot, &rst_prefix(client));
        let Some(bucket) = SHED_RST_PREFIX.get_ptr_mut(index) else { return false };
        if !take(bucket, now, config.rst_per_prefix_per_sec) {
            return false;
        }
    }
    if config.rst_per_sec != 0 {
        let Some(bucket) = SHED_RST_BUCKETS.get_ptr_mut(slot) else { return false };
        return take(bucket, now, config.rst_per_sec);
    }
    true
}

#[inline(always)]
fn take(bucket: *mut u64, now: u64, rate: u32) -> bool {
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

/// Room the daemon holds back from `tier` for the tiers above it.
#[inline(always)]
fn held_back(slot: u32, tier: u8) -> u64 {
    if fault!("held_back_ignored") {
        return 0;
    }
    SHED_RESERVE.get(slot).and_then(|r| r.held_back.get(tier as usize)).map_or(0, |&h| u64::from(h))
}

/// One share rejection in [`tier::TRICKLE_EVERY`] (per CPU) is admitted instead.
#[inline(always)]
fn trickle(slot: u32) -> bool {
    if fault!("trickle_never") {
        return false;
    }
    let Some(counters) = SHED_COUNTERS.get_ptr_mut(slot) else { return false };
    // SAFETY: per-CPU value. The share-rejection count doubles as the trickle's clock.
    let seen = unsafe { (*counters).values[counter::REJECTED_SHARE] + (*counters).values[counter::TRICKLE] };
    seen % tier::TRICKLE_EVERY == tier::TRICKLE_EVERY - 1
}

/// Releases one connection of `client` (it closed).
#[inline(always)]
pub fn client_release(client: &ClientKey) {
    if let Some(held) = SHED_CLIENTS.get_ptr_mut(client) {
        let before = atomic::add(held.cast::<u64>(), u64::MAX);
        note_client(client, before.wrapping_sub(1));
    }
}

/// Counts one more established connection for `client`; false if the client
/// map is full (the connection is then not counted against the cap).
#[inline(always)]
pub fn client_add(client: &ClientKey) -> bool {
    if SHED_CLIENTS.get_ptr_mut(client).is_none() {
        // A port at its quota of the shared client map adds no new client (its
        // connections go uncounted against caps and shares), so that one port's
        // clients, say a /48 of /64s, cannot fill the map for every port.
        let Some(state) = SHED_PORT_STATE.get_ptr_mut(client.slot) else { return false };
        let user = SHED_USER_STATE.get(client.slot).copied().unwrap_or_default();
        // SAFETY: map value, copied as plain data.
        if !user.client_room(&unsafe { *state }) && !fault!("client_quota_ignored") {
            return false;
        }
        // A zero on the stack, not `&0i64`: a pointer to a constant lands in
        // `.rodata.cst8`, which the loader relocates to offset 0 of the wrong
        // data section (it read back the stamps' secret as the count).
        let mut zero = 1i64;
        // SAFETY: a write to a local.
        unsafe { core::ptr::write_volatile(&mut zero, 0) };
        if SHED_CLIENTS.insert(client, &zero, u64::from(aya_ebpf::bindings::BPF_NOEXIST)).is_ok() {
            // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
            atomic::add(unsafe { &raw mut (*state).clients_added }, 1);
        }
    }
    let Some(held) = SHED_CLIENTS.get_ptr_mut(client) else { return false };
    let before = atomic::add(held.cast::<u64>(), 1);
    note_client(client, before + 1);
    true
}

/// Keeps the port's largest client current: `client` now holds `held`.
/// Plain stores: CPUs racing here at worst leave a count one off until the
/// next open or close of that client sets it again.
#[inline(never)]
fn note_client(client: &ClientKey, held: u64) {
    // A close of a count the healer already took back reads below zero: none held.
    let held = if (held as i64) < 0 { 0 } else { held };
    let Some(c) = SHED_CONTENTION.get_ptr_mut(client.slot) else { return };
    // SAFETY: map value, plain data.
    unsafe {
        if (*c).largest == client.addr {
            (*c).largest_held = held;
        } else if held > (*c).largest_held {
            (*c).largest = client.addr;
            (*c).largest_held = held;
        }
    }
}

/// The reservation of an admitted flow, released when its handshake completes.
/// Returns the handshake time (ns) if the flow was stamped, and whether its
/// reservation was still live (false: a late completion).
#[inline(always)]
/// `client`: the admission was charged to that client (the port counts clients).
pub fn complete(slot: u32, shift: u32, flow: u32, client: Option<&ClientKey>, now_ns: u64) -> (Option<u64>, bool) {
    let Some(stamp) = find_stamp(slot, flow) else { return (None, false) };
    // SAFETY: map value, copied out as plain data.
    let mut seen = unsafe { core::ptr::read_volatile(stamp) };
    // Completed while a CPU still judges the ACK (the request behind it passed
    // as a duplicate on another CPU and completed the handshake first): that
    // CPU finds the claim completed and releases its own reservation.
    let claimed = HandshakeStamp::head(flow, stamp_state::CLAIMED);
    let completed = HandshakeStamp::head(flow, stamp_state::COMPLETED);
    if seen.state == stamp_state::CLAIMED {
        if atomic::compare_exchange(stamp.cast::<u64>(), claimed, completed) {
            return (None, true);
        }
        // The claimant admitted it between the read and the swap: read it again
        // (else that reservation lapsed and this completion counted late).
        // SAFETY: as above.
        seen = unsafe { core::ptr::read_volatile(stamp) };
    }
    // One compare-and-swap: a lapsed stamp may be taken by another flow's
    // claim meanwhile, which this completion must not undo.
    let admitted = HandshakeStamp::head(flow, stamp_state::ADMITTED);
    if seen.state != stamp_state::ADMITTED || !atomic::compare_exchange(stamp.cast::<u64>(), admitted, completed) {
        return (None, false);
    }
    let stamp = seen;
    let took = now_ns.saturating_sub(stamp.syn_ns);
    let Some(handshakes) = SHED_HANDSHAKES.get_ptr_mut(slot) else { return (Some(took), false) };
    if fault!("handshake_not_released") {
        return (Some(took), true);
    }
    let in_time = ring::close(handshakes, stamp.epoch, now_ns >> shift);
    if in_time
        && let Some(client) = client
        && !fault!("client_pending_not_released")
        && let Some(pending) = pending_ring(client, false)
    {
        ring::close(pending, stamp.epoch, now_ns >> shift);
    }
    (Some(took), in_time)
}

/// `work` connections of the port accepted within the idle grace that have
/// sent nothing yet (0 in the other count modes: they count connections).
#[inline(always)]
fn silent(slot: u32, mode: u8, user: &UserPortState, now_ns: u64) -> u64 {
    if mode != count_mode::WORK || fault!("silent_not_held") {
        return 0;
    }
    let Some(silent) = SHED_SILENT.get_ptr(slot) else { return 0 };
    let (others, current) = ring::outstanding(silent, now_ns >> user.silent_shift());
    others + current
}

/// The `http` answer's reason for a refusal counted under `reason`.
#[inline(always)]
fn http_reason(reason: usize) -> u32 {
    if reason == counter::REJECTED_SHARE {
        http::reason::SHARE
    } else if reason == counter::REJECTED_CLIENT_CAP {
        http::reason::CLIENT_CAP
    } else if reason == counter::REJECTED_CLIENT_SHARE {
        http::reason::CLIENT_SHARE
    } else {
        http::reason::LIMIT
    }
}

#[inline(always)]
fn http_flow(seg: &Segment) -> http::Flow<'_> {
    http::Flow {
        client: &seg.client_addr,
        server: &seg.server_addr,
        client_port: seg.client_port,
        server_port: seg.server_port,
    }
}

/// A segment no socket of the kernel's takes, to a port with an `http`
/// action: if it acknowledges a SYN-ACK of ours (its cookie checks), it is
/// answered from the cookie alone and never reaches the listener (which would
/// reset it); any other passes (the kernel resets it, as before).
/// - the request (at our offset 0): `503` with FIN once the request head is
///   complete (it ends the head, or the client pushed or closed), else an ACK
///   so the client sends the rest; a retransmitted request gets the same bytes;
/// - TLS, HTTP/2's preface, a FIN before any request: a reset;
/// - data or a FIN after our FIN: an ACK (the client's close completes);
/// - anything else (the handshake's ACK, ACKs of our answer): dropped.
///
/// The answers spend the RST caps as resets do, and go only where a reset may.
#[inline(never)]
pub fn http_segment<B: LoadBytes>(seg: &Segment, bytes: &B, from_loopback: bool, now_ns: u64) -> Verdict {
    let Some(config) = port_config(seg.server_port) else { return Verdict::Pass };
    if !config.answers_http() {
        return Verdict::Pass;
    }
    let slot = config.slot;
    // Only to this namespace's own addresses were cookies handed out (a SYN to
    // another is not judged): a forwarded segment is never answered, whatever
    // its acknowledgment number happens to check as.
    if !is_local(&seg.server_addr) {
        count(slot, counter::NOT_LOCAL);
        return Verdict::Pass;
    }
    let checked = if fault!("http_cookie_unchecked") {
        let acked = seg.ack_seq.wrapping_sub(1);
        Some(http::Acked { cookie: acked & !http::OFFSET_MASK, reason: 0, offset: acked & http::OFFSET_MASK })
    } else {
        http::check(crate::maps::cookie_key(), http_flow(seg), seg.ack_seq, now_ns)
    };
    let Some(acked) = checked else {
        count(slot, counter::HTTP_BAD_COOKIE);
        return Verdict::Pass;
    };
    let tier = if config.tiered != 0 { tier_of(&seg.client_addr) } else { tier::NORMAL };
    let index = http::answer_index(acked.reason, tier);
    let answer_len = crate::reject::answer_len(index);
    let fin = seg.flags & FLAG_FIN != 0;
    let len = u32::from(seg.payload_len);
    let end = seg.seq.wrapping_add(len).wrapping_add(u32::from(fin));
    let ours = acked.cookie.wrapping_add(1);
    let reply = if acked.offset == 0 && (len > 0 || fin) {
        if len == 0 || !http_request(seg, bytes) {
            count(slot, counter::HTTP_NOT_HTTP);
            Verdict::Rst { slot, reset: Reset::to_ack(seg.ack_seq) }
        } else if fin || seg.flags & FLAG_PSH != 0 || ends_head(seg, bytes) || fault!("http_head_unchecked") {
            let answer = Answer {
                seq: ours,
                ack: end,
                flags: http::FLAGS_ANSWER,
                payload: index as u8 + 1,
                digits: http::retry_digits(retry_after(&config)),
                sent: Answer::counted(counter::HTTP_ANSWERED),
            };
            Verdict::Answer { slot, answer }
        } else {
            Verdict::Answer { slot, answer: Answer::bare_ack(ours, end) }
        }
    } else if acked.offset == answer_len + 1 && (len > 0 || fin) {
        Verdict::Answer { slot, answer: Answer::bare_ack(ours.wrapping_add(answer_len + 1), end) }
    } else {
        return Verdict::Drop;
    };
    http_reply(&config, seg, from_loopback, now_ns, reply)
}

/// The Retry-After an answer of the port gives: the port's own, or what the daemon derives.
#[inline(always)]
fn retry_after(config: &PortConfig) -> u32 {
    let derived = SHED_USER_STATE.get(config.slot).map_or(0, |u| u.retry_after_s);
    http::retry_after_seconds(config.retry_after_s, derived)
}

/// `reply`, if a reply may go to the client now ([`withheld`]); else the segment is dropped.
#[inline(always)]
fn http_reply(config: &PortConfig, seg: &Segment, from_loopback: bool, now_ns: u64, reply: Verdict) -> Verdict {
    if let Some(why) = withheld(config, &seg.client_addr, from_loopback, now_ns) {
        count(config.slot, why);
        return Verdict::Drop;
    }
    reply
}

/// Whether the payload may be (part of) an HTTP/1.x request: not TLS, not HTTP/2's preface.
#[inline(always)]
fn http_request<B: LoadBytes>(seg: &Segment, bytes: &B) -> bool {
    if seg.payload_len < 8 {
        return true;
    }
    bytes.load::<8>(usize::from(seg.payload_at)).is_none_or(http::may_be_http1)
}

/// Whether the payload ends the request head (`CRLF CRLF`).
#[inline(always)]
fn ends_head<B: LoadBytes>(seg: &Segment, bytes: &B) -> bool {
    if seg.payload_len < 4 {
        return false;
    }
    let at = usize::from(seg.payload_at) + usize::from(seg.payload_len) - 4;
    bytes.load::<4>(at) == Some(*b"\r\n\r\n")
}
