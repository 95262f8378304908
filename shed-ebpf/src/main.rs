// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! shed's kernel programs.
//!
//! - `shed_xdp` / `shed_tc`: the admission gate. Thin adapters over one
//!   [`judge`]; they differ only in how a reply (a reset, an HTTP answer)
//!   leaves the host. The first segment of a kept-alive connection's next
//!   request goes on to `shed_xdp_turn` / `shed_tc_turn` (a tail call).
//! - `shed_sock_state_raw` (or `shed_sock_state`, without BTF): in-flight
//!   accounting from `sock:inet_sock_set_state`.
//! - `shed_dispatch_*`: a node agent's one set of socket-tracepoint programs
//!   for all its pods' gates (`dispatch`).
//! - `shed_xdp_pass`, `shed_xdp_drop`, `shed_tc_pass`, `shed_hook_nothing`:
//!   programs that do (next to) nothing, for a veth peer's XDP and as the
//!   benchmarks' baselines.
//!
//! Every failure path passes the packet: a gate that cannot judge a packet
//! must not become the outage (fail-open, written once per entry point).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic_xadd: the only 64-bit fetch-add on the BPF target")]
#![expect(
    unreachable_pub,
    reason = "a program crate: nothing is a library API, and the entry points stay pub as aya's macros write them"
)]

mod account;
mod atomic;
mod client;
mod decide;
mod dispatch;
mod fault;
mod http_answer;
mod maps;
mod parse;
mod proof;
mod rare;
mod reject;
mod reply;
mod ring;
mod stacked;
mod stamp;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    helpers::{
        bpf_ktime_get_ns, bpf_redirect, bpf_skb_change_tail, bpf_skb_pull_data, bpf_skb_store_bytes,
        bpf_xdp_adjust_head, bpf_xdp_adjust_tail, bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    macros::{classifier, raw_tracepoint, tracepoint, xdp},
    programs::{RawTracePointContext, TcContext, TracePointContext, XdpContext},
};
use shed_common::{counter, gate_counter};

use crate::{
    maps::{count, count_gate, protected},
    parse::Parsed,
    reply::Verdict,
};

/// How much of a TC packet must be linear for the parser's direct reads:
/// Ethernet, two VLAN tags, IPv4 with options or IPv6, and the TCP header's
/// header (extension headers are read through a helper).
const TC_LINEAR_HEAD: u32 = 14 + 8 + 60 + 20;

/// What an entry point must do with a frame, before hook-specific actions.
/// A struct whose every field is set on every path, not an enum with
/// payloads: LLVM merges an enum's paths into stores of every field, and the
/// verifier refuses a store of a register a path left unset. Small, too: it
/// lives in the entry point's frame, under every subprogram's.
#[derive(Clone, Copy)]
struct Outcome {
    kind: u8,
    /// An HTTP answer's counter, payload and Retry-After ([`reject::Answer`]'s).
    sent: u8,
    payload: u8,
    digits: [u8; 3],
    /// The reply's whole length, once the frame is resized to it.
    len: u16,
    /// Where an HTTP answer's payload goes (after the resize).
    payload_at: u16,
    slot: u32,
}

impl Outcome {
    const PASS: u8 = 0;
    const DROP: u8 = 1;
    /// Send the reset now written into the frame.
    const RESET: u8 = 2;
    /// Send the HTTP answer whose headers are written into the frame, its payload stored after the resize.
    const ANSWER: u8 = 3;
    /// The first segment of a kept-alive connection's next request: judged by
    /// the hook's turn program, a tail call (its socket in `SHED_TURN_SOCKET`).
    const TURN: u8 = 4;

    #[inline(always)]
    const fn of(kind: u8) -> Self {
        Self { kind, sent: 0, payload: 0, digits: [0; 3], len: 0, payload_at: 0, slot: 0 }
    }
}

/// The tail both entry points share: parse, decide, count, write any reset
/// or the headers of an HTTP answer.
#[inline(always)]
fn judge<B: parse::LoadBytes>(data: usize, data_end: usize, bytes: &B) -> Outcome {
    // Not zeroed: `parse` writes every field before it returns Syn or Ack, the
    // only results after which it is read (the verifier checks just that).
    let mut seg = core::mem::MaybeUninit::<parse::Segment>::uninit();
    // The port check first, by array lookup: segments to other ports end there.
    let wanted = |port, _syn| protected(port);
    let parsed = parse::parse(data, data_end, bytes, wanted, &mut seg);
    // SAFETY: read only on the Syn and Ack arms, where `parse` has written it.
    let seg = unsafe { seg.assume_init_ref() };
    let verdict = match parsed {
        Parsed::Pass | Parsed::Truncated => return Outcome::of(Outcome::PASS),
        Parsed::LaterFragment => {
            count_gate(gate_counter::LATER_FRAGMENT);
            return Outcome::of(Outcome::PASS);
        }
        Parsed::Refuse(why) => {
            count_gate(why as usize);
            rare::unparsed_header(why);
            return Outcome::of(Outcome::DROP);
        }
        Parsed::Syn | Parsed::Ack => {
            let syn = parsed == Parsed::Syn;
            // Crossing stacked devices (bridge, VLAN, macvlan, bond): judged once.
            let ifindex = bytes.ifindex();
            if stacked::passed_already(seg, syn, ifindex) {
                // Where it is now: the next device of the stack compares with
                // this one, and a repeat on this very device is a new segment.
                stacked::remember_passed(seg, syn, ifindex);
                return Outcome::of(Outcome::PASS);
            }
            let loopback = ifindex == parse::LOOPBACK_IFINDEX;
            // The clock is read where a decision needs the time: the segments
            // of established connections (nearly all) need none.
            let verdict = if syn {
                decide::syn(seg, loopback, clock())
            } else {
                match decide::ack(seg, bytes, loopback) {
                    Verdict::Unclaimed => http_answer::http_segment(seg, bytes, loopback, clock()),
                    verdict => verdict,
                }
            };
            if matches!(verdict, Verdict::Pass) {
                stacked::remember_passed(seg, syn, ifindex);
            }
            verdict
        }
    };
    outcome_of(verdict, data, data_end, seg)
}

/// The clock (ns since boot) a decision reads: on a virtual machine a read
/// of it costs tens of ns.
#[inline(always)]
fn clock() -> u64 {
    // SAFETY: reading the clock has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The turn programs' tail of [`judge`]: the same segment parsed again, its
/// request judged ([`decide::turn`]).
#[inline(always)]
fn judge_turn<B: parse::LoadBytes>(data: usize, data_end: usize, bytes: &B) -> Outcome {
    let mut seg = core::mem::MaybeUninit::<parse::Segment>::uninit();
    let wanted = |port, _syn| protected(port);
    let parsed = parse::parse(data, data_end, bytes, wanted, &mut seg);
    if parsed != Parsed::Ack {
        return Outcome::of(Outcome::PASS);
    }
    // SAFETY: `parse` wrote it: it returned Ack.
    let seg = unsafe { seg.assume_init_ref() };
    let sk = maps::take_turn_socket();
    if sk == 0 {
        return Outcome::of(Outcome::PASS);
    }
    let ifindex = bytes.ifindex();
    let verdict = decide::turn(seg, bytes, sk, ifindex == parse::LOOPBACK_IFINDEX);
    if matches!(verdict, Verdict::Pass) {
        stacked::remember_passed(seg, false, ifindex);
    }
    outcome_of(verdict, data, data_end, seg)
}

/// A verdict as the entry points act on it: any reset or the headers of an
/// HTTP answer written into the frame.
#[inline(always)]
fn outcome_of(verdict: Verdict, data: usize, data_end: usize, seg: &parse::Segment) -> Outcome {
    match verdict {
        // A turn passes here; the entry point finds it handed over
        // (`maps::turn_pending`) and tail-calls its turn program.
        Verdict::Pass | Verdict::Unclaimed | Verdict::Turn => Outcome::of(Outcome::PASS),
        Verdict::Drop => Outcome::of(Outcome::DROP),
        Verdict::Rst { slot, reset } => match reject::write_rst(data, data_end, seg, reset) {
            0 => {
                count_failed(slot, "writing");
                Outcome::of(Outcome::DROP)
            }
            len => Outcome {
                slot,
                len: len as u16,
                // An `http` refusal's SYN-ACK leaves as a reset does, counted apart.
                sent: reject::Answer::counted(if reset.flags == shed_common::rst::FLAGS_SYN_ACK {
                    counter::HTTP_SYN_ACK
                } else {
                    counter::RST_SENT
                }),
                ..Outcome::of(Outcome::RESET)
            },
        },
        Verdict::Answer { slot, answer } => match reject::write_answer(data, data_end, seg, &answer) {
            0 => {
                count_failed(slot, "writing an answer");
                Outcome::of(Outcome::DROP)
            }
            written => Outcome {
                kind: Outcome::ANSWER,
                sent: answer.sent,
                payload: answer.payload,
                digits: answer.digits,
                len: written as u16,
                payload_at: (written >> 16) as u16,
                slot,
            },
        },
    }
}

/// Counts what became of a reply (a reset or an HTTP answer): sent, under
/// its own counter (`counted`, an [`reject::Answer::sent`]), or failed at
/// `step` (then the frame is dropped instead). Returns `sent`.
#[inline(always)]
fn count_reply(slot: u32, counted: u8, sent: bool, step: &'static str) -> bool {
    if !sent {
        count_failed(slot, step);
    } else if counted != reject::Answer::UNCOUNTED {
        count(slot, usize::from(counted - 1) & (counter::COUNT - 1));
    }
    sent
}

/// A reply that could not be written or sent.
#[inline(always)]
fn count_failed(slot: u32, step: &'static str) {
    count(slot, counter::RST_FAILED);
    rare::rst_failed(slot, step);
}

#[xdp]
pub fn shed_xdp(ctx: XdpContext) -> u32 {
    // A shared object's pods are gated at TC, which tells their namespaces apart.
    if maps::shared() {
        return xdp_action::XDP_PASS;
    }
    let outcome = judge(ctx.data(), ctx.data_end(), &parse::XdpBytes(ctx.ctx));
    if outcome.kind == Outcome::PASS && maps::turn_pending() {
        // SAFETY: the turn program is an XDP program of this object; a failed
        // call (none installed) returns, and the segment passes.
        let _ = unsafe { maps::SHED_TURN_XDP.tail_call(&ctx, 0) };
        return xdp_action::XDP_PASS;
    }
    xdp_finish(&ctx, outcome)
}

/// The first segment of a kept-alive connection's next request ([`Outcome::TURN`]).
#[xdp]
pub fn shed_xdp_turn(ctx: XdpContext) -> u32 {
    let outcome = judge_turn(ctx.data(), ctx.data_end(), &parse::XdpBytes(ctx.ctx));
    xdp_finish(&ctx, outcome)
}

/// What an XDP program does with an outcome: pass, drop, or send the reply
/// written into the frame. The frame's length comes from the kernel: packet
/// pointers kept across the judging would cost the entry point's frame the
/// room `parse` needs.
#[inline(always)]
fn xdp_finish(ctx: &XdpContext, outcome: Outcome) -> u32 {
    let Outcome { kind, sent, payload, digits, len, payload_at, slot } = outcome;
    // SAFETY: a plain helper call on our own frame.
    let frame = || unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as i32;
    match kind {
        Outcome::PASS | Outcome::TURN => xdp_action::XDP_PASS,
        Outcome::RESET => {
            let delta = len as i32 - frame();
            // SAFETY: shrinking the frame; the helper checks the bounds itself.
            let trimmed = unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } == 0;
            if count_reply(slot, sent, trimmed, "bpf_xdp_adjust_tail") {
                xdp_action::XDP_TX
            } else {
                xdp_action::XDP_DROP
            }
        }
        Outcome::ANSWER => {
            let delta = len as i32 - frame();
            // SAFETY: resizing our own frame; the helpers check the bounds themselves.
            let sized = unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } == 0
                || (delta > 0 && grow_at_head(ctx, delta as u32, u32::from(payload_at)));
            let stored = sized
                && reject::store_payload(payload, digits, usize::from(payload_at), |at, from, n| {
                    // SAFETY: the helper copies `n` bytes of read-only data into our frame, bounds-checked.
                    unsafe { bpf_xdp_store_bytes(ctx.ctx, at, from.cast_mut().cast(), n) == 0 }
                });
            if count_reply(slot, sent, stored, "resizing or filling an XDP answer") {
                xdp_action::XDP_TX
            } else {
                xdp_action::XDP_DROP
            }
        }
        _ => xdp_action::XDP_DROP,
    }
}

/// The longest headers an answer has (Ethernet, two VLAN tags, IPv6, TCP: 82 bytes).
const ANSWER_HEADERS_MAX: u32 = 96;

/// Grows an answer's frame at its head, where its tail cannot grow: a veth
/// copies a frame it receives into a buffer with a cache line's slack or
/// less, too little for an IPv6 answer (39 bytes longer than curl's
/// request), while XDP guarantees 256 bytes of headroom. The `headers`
/// bytes already written move down by `grow`; the payload is stored after.
///
/// A subprogram: its buffer stays out of the entry point's frame, under
/// which `parse`'s must fit with its callees'.
#[inline(never)]
fn grow_at_head(ctx: &XdpContext, grow: u32, headers: u32) -> bool {
    if headers == 0 || headers > ANSWER_HEADERS_MAX || grow > 255 {
        return false;
    }
    // SAFETY: our own frame; the helper checks the bounds.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(grow as i32)) } != 0 {
        return false;
    }
    // In two halves through a small buffer (the program's stack is nearly
    // full); moving down, the first half never overwrites the second.
    let half = ANSWER_HEADERS_MAX / 2;
    let first = headers.min(half);
    move_down(ctx, 0, grow, first) && (headers <= half || move_down(ctx, half, grow, headers - half))
}

/// Moves `n` (1..=ANSWER_HEADERS_MAX / 2) bytes of the frame at `at + by` to `at`.
#[inline(always)]
fn move_down(ctx: &XdpContext, at: u32, by: u32, n: u32) -> bool {
    const HALF: usize = ANSWER_HEADERS_MAX as usize / 2;
    let mut moved = [0u8; HALF];
    // Hidden from LLVM, so that the bounds the verifier sees are these: 1..=HALF.
    // SAFETY: reading a local.
    let n = unsafe { core::ptr::read_volatile(&n) };
    let n = (n.wrapping_sub(1) & 63).min(HALF as u32 - 1) + 1;
    // SAFETY: our own frame; each helper checks its bounds, and `moved` holds `n` bytes.
    unsafe {
        bpf_xdp_load_bytes(ctx.ctx, at + by, moved.as_mut_ptr().cast(), n) == 0
            && bpf_xdp_store_bytes(ctx.ctx, at, moved.as_mut_ptr().cast(), n) == 0
    }
}

/// Passes everything. Attach it to the peer of a veth that runs `shed_xdp`:
/// veth delivers XDP_TX frames (our RSTs) to its peer only when the peer runs
/// an XDP program of its own.
#[xdp]
pub fn shed_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// Drops everything: the cheapest verdict there is, the baseline that
/// `cargo xtask bench` measures rejection costs against.
#[xdp]
pub fn shed_xdp_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

/// Passes everything. With [`shed_hook_nothing`], the floor `cargo xtask
/// bench` measures B6 against: programs at shed's hooks that do nothing
/// (never attached by `shedctl`).
#[classifier]
pub fn shed_tc_pass(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

/// Does nothing: attached to each socket tracepoint shed uses, what running
/// any program there costs (a benchmark baseline; never attached by `shedctl`).
#[raw_tracepoint(tracepoint = "sk_data_ready")]
pub fn shed_hook_nothing(_ctx: RawTracePointContext) -> i32 {
    0
}

#[classifier]
pub fn shed_tc(ctx: TcContext) -> i32 {
    if !maps::shared() {
        return tc_gate(&ctx, 0);
    }
    // A shared object judges for the pod whose namespace the packet arrived
    // in; a namespace it does not gate passes.
    let Some(gate) = dispatch::gate_of_skb(ctx.skb.skb as u64) else { return TC_ACT_OK };
    let before = maps::enter_gate(gate);
    let verdict = tc_gate(&ctx, before);
    maps::leave_gate(before);
    verdict
}

/// The TC gate under the running gate's maps; `before`: the gate to give
/// back, handed to the turn program when it takes over.
#[inline(always)]
fn tc_gate(ctx: &TcContext, before: u32) -> i32 {
    if !tc_linear_head(ctx) {
        return TC_ACT_OK;
    }
    let outcome = judge(ctx.data(), ctx.data_end(), &parse::SkbBytes(ctx.skb.skb));
    if outcome.kind == Outcome::PASS && maps::turn_pending() {
        maps::hand_gate_to_turn(before);
        // SAFETY: the turn program is a classifier of this object; a failed
        // call (none installed) returns, and the segment passes.
        let _ = unsafe { maps::SHED_TURN_TC.tail_call(ctx, 0) };
        return TC_ACT_OK;
    }
    tc_finish(ctx, outcome)
}

/// The first segment of a kept-alive connection's next request ([`Outcome::TURN`]).
#[classifier]
pub fn shed_tc_turn(ctx: TcContext) -> i32 {
    let verdict = if tc_linear_head(&ctx) {
        let outcome = judge_turn(ctx.data(), ctx.data_end(), &parse::SkbBytes(ctx.skb.skb));
        tc_finish(&ctx, outcome)
    } else {
        TC_ACT_OK
    };
    if maps::shared() {
        // The gate `shed_tc` entered, given back here: its tail call did not return.
        maps::leave_gate(maps::take_gate_from_caller());
    }
    verdict
}

/// TC reads the linear head of the skb directly: makes sure the headers the
/// parser reads that way are in it (received packets nearly always are).
#[inline(always)]
fn tc_linear_head(ctx: &TcContext) -> bool {
    // SAFETY: our own skb; packet pointers are read after the helper.
    let len = unsafe { (*ctx.skb.skb).len }.min(TC_LINEAR_HEAD);
    ((ctx.data_end() - ctx.data()) as u32) >= len || unsafe { bpf_skb_pull_data(ctx.skb.skb.cast(), len) } == 0
}

/// What a TC program does with an outcome: pass, drop, or send the reply written into the skb.
#[inline(always)]
fn tc_finish(ctx: &TcContext, outcome: Outcome) -> i32 {
    let Outcome { kind, sent, payload, digits, len, payload_at, slot } = outcome;
    match kind {
        Outcome::PASS | Outcome::TURN => TC_ACT_OK,
        Outcome::RESET => {
            // SAFETY: a plain helper call on our own skb. Packet pointers are
            // not used after change_tail invalidates them.
            let trimmed = unsafe { bpf_skb_change_tail(ctx.skb.skb, len as u32, 0) } == 0;
            if !count_reply(slot, sent, trimmed, "bpf_skb_change_tail") {
                return TC_ACT_SHOT;
            }
            // Out of the interface it came in on, back towards the client.
            // SAFETY: our own skb's ifindex, and a plain helper call.
            unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
        }
        Outcome::ANSWER => {
            let skb = ctx.skb.skb;
            // SAFETY: plain helper calls on our own skb; packet pointers are not used after the resize.
            let sized = unsafe { bpf_skb_change_tail(skb, len as u32, 0) } == 0;
            let stored = sized
                && reject::store_payload(payload, digits, usize::from(payload_at), |at, from, n| {
                    // SAFETY: the helper copies `n` bytes of read-only data into our skb, bounds-checked.
                    unsafe { bpf_skb_store_bytes(skb, at, from.cast(), n, 0) == 0 }
                });
            if !count_reply(slot, sent, stored, "resizing or filling a TC answer") {
                return TC_ACT_SHOT;
            }
            // SAFETY: our own skb's ifindex, and a plain helper call.
            unsafe { bpf_redirect((*skb).ifindex, 0) as i32 }
        }
        _ => TC_ACT_SHOT,
    }
}

/// `sock:inet_sock_set_state`, from its record: where the kernel's BTF lacks
/// the socket's layout for [`shed_sock_state_raw`].
#[tracepoint]
pub fn shed_sock_state(ctx: TracePointContext) -> u32 {
    account::on_sock_state(&ctx);
    0
}

/// `sock:inet_sock_set_state(const struct sock *sk, int oldstate, int newstate)`,
/// the fields read from the socket: the same accounting without the record,
/// and without a regular tracepoint's cap of 64 programs (one per gated pod).
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn shed_sock_state_raw(ctx: RawTracePointContext) -> i32 {
    account::on_sock_state(&account::RawStateChange { sk: ctx.arg(0), old: ctx.arg(1), new: ctx.arg(2) });
    0
}

// The per-request events are raw tracepoints: the kernel hands over the
// TP_PROTO arguments as they are, without building the trace record first
// (which regular tracepoints do for every event, ours or not).

/// `sock:sk_data_ready(const struct sock *sk)`.
#[raw_tracepoint(tracepoint = "sk_data_ready")]
pub fn shed_data_ready(ctx: RawTracePointContext) -> i32 {
    account::on_data_ready(ctx.arg(0));
    0
}

/// `sock:sock_recv_length(struct sock *sk, int ret, int flags)`.
#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn shed_recv(ctx: RawTracePointContext) -> i32 {
    account::on_recv(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

/// `sock:sock_send_length(struct sock *sk, int ret, int flags)`.
#[raw_tracepoint(tracepoint = "sock_send_length")]
pub fn shed_send(ctx: RawTracePointContext) -> i32 {
    account::on_send(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

// The node agent's dispatchers (`dispatch`): attached once per node, for every pod's gate.

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn shed_dispatch_sock_state(ctx: RawTracePointContext) -> i32 {
    dispatch::sock_state(&ctx);
    0
}

#[raw_tracepoint(tracepoint = "sk_data_ready")]
pub fn shed_dispatch_data_ready(ctx: RawTracePointContext) -> i32 {
    dispatch::socket_event(&ctx, shed_common::dispatch::DATA_READY);
    0
}

#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn shed_dispatch_recv(ctx: RawTracePointContext) -> i32 {
    dispatch::socket_event(&ctx, shed_common::dispatch::RECV);
    0
}

#[raw_tracepoint(tracepoint = "sock_send_length")]
pub fn shed_dispatch_send(ctx: RawTracePointContext) -> i32 {
    dispatch::socket_event(&ctx, shed_common::dispatch::SEND);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The kernel programs are dual-licensed MIT or GPL-2.0, as aya's examples
/// are: GPL-compatible, as the kernel asks of programs that call GPL-only
/// helpers (the SYN-cookie check, `bpf_probe_read_kernel`).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
