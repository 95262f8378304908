// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! shed's kernel programs.
//!
//! - `shed_xdp` / `shed_tc`: the admission gate. Thin adapters over one
//!   [`judge`]; they differ only in how a reset leaves the host.
//! - `shed_sock_state`: in-flight accounting from `sock:inet_sock_set_state`.
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
mod decide;
mod fault;
mod maps;
mod parse;
mod rare;
mod reject;
mod ring;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    helpers::{bpf_ktime_get_ns, bpf_redirect, bpf_skb_change_tail, bpf_skb_pull_data, bpf_xdp_adjust_tail},
    macros::{classifier, raw_tracepoint, tracepoint, xdp},
    programs::{RawTracePointContext, TcContext, TracePointContext, XdpContext},
};
use shed_common::{counter, gate_counter};

use crate::{
    decide::Verdict,
    maps::{count, count_gate, protected},
    parse::Parsed,
};

/// How much of a TC packet must be linear for the parser's direct reads:
/// Ethernet, two VLAN tags, IPv4 with options or IPv6, and the TCP header's
/// header (extension headers are read through a helper).
const TC_LINEAR_HEAD: u32 = 14 + 8 + 60 + 20;

/// What an entry point must do with a frame, before hook-specific actions.
enum Outcome {
    Pass,
    Drop,
    /// Send the reset now written into the frame, `len` bytes long.
    Reply {
        slot: u32,
        len: usize,
    },
}

/// The tail both entry points share: parse, decide, count, write any reset.
#[inline(always)]
fn judge<B: parse::LoadBytes>(data: usize, data_end: usize, bytes: &B, ctx: *mut core::ffi::c_void) -> Outcome {
    // Not zeroed: `parse` writes every field before it returns Syn or Ack, the
    // only results after which it is read (the verifier checks just that).
    let mut seg = core::mem::MaybeUninit::<parse::Segment>::uninit();
    // The port check first, by array lookup: segments to other ports end there.
    let wanted = |port, _syn| protected(port);
    let parsed = parse::parse(data, data_end, bytes, wanted, &mut seg);
    // SAFETY: read only on the Syn and Ack arms, where `parse` has written it.
    let seg = unsafe { seg.assume_init_ref() };
    let verdict = match parsed {
        Parsed::Pass | Parsed::Truncated => return Outcome::Pass,
        Parsed::LaterFragment => {
            count_gate(gate_counter::LATER_FRAGMENT);
            return Outcome::Pass;
        }
        Parsed::Refuse(why) => {
            count_gate(why as usize);
            rare::unparsed_header(why);
            return Outcome::Drop;
        }
        Parsed::Syn | Parsed::Ack => {
            let syn = parsed == Parsed::Syn;
            // SAFETY: reading the clock has no preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            // Crossing stacked devices (bridge, VLAN, macvlan, bond): judged once.
            let ifindex = bytes.ifindex();
            if decide::passed_already(seg, syn, now, ifindex) {
                // Where it is now: the next device of the stack compares with
                // this one, and a repeat on this very device is a new segment.
                decide::remember_passed(seg, syn, now, ifindex);
                return Outcome::Pass;
            }
            let loopback = ifindex == parse::LOOPBACK_IFINDEX;
            let verdict =
                if syn { decide::syn(seg, loopback, now) } else { decide::ack(seg, ctx, loopback, now) };
            if matches!(verdict, Verdict::Pass) {
                decide::remember_passed(seg, syn, now, ifindex);
            }
            verdict
        }
    };
    match verdict {
        Verdict::Pass => Outcome::Pass,
        Verdict::Drop => Outcome::Drop,
        Verdict::Rst { slot, reset } => match reject::write_rst(data, data_end, seg, reset) {
            Ok(len) => Outcome::Reply { slot, len },
            Err(()) => {
                count_reset(slot, false, "writing");
                Outcome::Drop
            }
        },
    }
}

/// Counts what became of a reset: sent, or failed at `step` (then the frame is
/// dropped instead). Returns `sent`.
#[inline(always)]
fn count_reset(slot: u32, sent: bool, step: &'static str) -> bool {
    if sent {
        count(slot, counter::RST_SENT);
    } else {
        count(slot, counter::RST_FAILED);
        rare::rst_failed(slot, step);
    }
    sent
}

#[xdp]
pub fn shed_xdp(ctx: XdpContext) -> u32 {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    match judge(data, data_end, &parse::XdpBytes(ctx.ctx), ctx.ctx.cast()) {
        Outcome::Pass => xdp_action::XDP_PASS,
        Outcome::Drop => xdp_action::XDP_DROP,
        Outcome::Reply { slot, len } => {
            let delta = len as i32 - (data_end - data) as i32;
            // SAFETY: shrinking the frame; the helper checks the bounds itself.
            let trimmed = unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } == 0;
            if count_reset(slot, trimmed, "bpf_xdp_adjust_tail") { xdp_action::XDP_TX } else { xdp_action::XDP_DROP }
        }
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

#[classifier]
pub fn shed_tc(ctx: TcContext) -> i32 {
    // TC reads the linear head of the skb directly: make sure the headers the
    // parser reads that way are in it (received packets nearly always are).
    // SAFETY: our own skb; packet pointers are read after the helper.
    let len = unsafe { (*ctx.skb.skb).len }.min(TC_LINEAR_HEAD);
    if ((ctx.data_end() - ctx.data()) as u32) < len && unsafe { bpf_skb_pull_data(ctx.skb.skb.cast(), len) } != 0 {
        return TC_ACT_OK;
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    match judge(data, data_end, &parse::SkbBytes(ctx.skb.skb), ctx.skb.skb.cast()) {
        Outcome::Pass => TC_ACT_OK,
        Outcome::Drop => TC_ACT_SHOT,
        Outcome::Reply { slot, len } => {
            // SAFETY: a plain helper call on our own skb. Packet pointers are
            // not used after change_tail invalidates them.
            let trimmed = unsafe { bpf_skb_change_tail(ctx.skb.skb, len as u32, 0) } == 0;
            if !count_reset(slot, trimmed, "bpf_skb_change_tail") {
                return TC_ACT_SHOT;
            }
            // Out of the interface it came in on, back towards the client.
            // SAFETY: our own skb's ifindex, and a plain helper call.
            unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
        }
    }
}

#[tracepoint]
pub fn shed_sock_state(ctx: TracePointContext) -> u32 {
    account::on_sock_state(&ctx);
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
