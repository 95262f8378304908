//! shed's kernel programs.
//!
//! - `shed_xdp` / `shed_tc`: the admission gate. Thin adapters over one
//!   [`decide::decide`]; they differ only in how a RST leaves the host.
//! - `shed_sock_state`: in-flight accounting from `sock:inet_sock_set_state`.
//!
//! Every failure path passes the packet: a gate that cannot judge a packet
//! must not become the outage (fail-open, written once per entry point).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic_xadd: the only 64-bit fetch-add on the BPF target")]

mod account;
mod decide;
mod maps;
mod parse;
mod reject;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    helpers::{bpf_redirect, bpf_skb_change_tail, bpf_xdp_adjust_tail},
    macros::{classifier, raw_tracepoint, tracepoint, xdp},
    programs::{RawTracePointContext, TcContext, TracePointContext, XdpContext},
};

use crate::decide::Verdict;

#[xdp]
pub fn shed_xdp(ctx: XdpContext) -> u32 {
    match try_shed_xdp(&ctx) {
        Ok(action) => action,
        Err(()) => xdp_action::XDP_PASS,
    }
}

fn try_shed_xdp(ctx: &XdpContext) -> Result<u32, ()> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(syn) = parse::parse_syn(data, data_end) else {
        return Ok(xdp_action::XDP_PASS);
    };
    Ok(match decide::decide(&syn) {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
        Verdict::Rst { slot } => match reject::write_rst(data, data_end, &syn) {
            Ok(new_len) => {
                let delta = new_len as i32 - (data_end - data) as i32;
                // SAFETY: shrinking the frame; the helper checks the bounds itself.
                if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
                    decide::count(slot, shed_common::counter::RST_FAILED);
                    return Ok(xdp_action::XDP_DROP);
                }
                decide::count(slot, shed_common::counter::RST_SENT);
                xdp_action::XDP_TX
            }
            Err(()) => {
                decide::count(slot, shed_common::counter::RST_FAILED);
                xdp_action::XDP_DROP
            }
        },
    })
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
    match try_shed_tc(&ctx) {
        Ok(action) => action,
        Err(()) => TC_ACT_OK,
    }
}

fn try_shed_tc(ctx: &TcContext) -> Result<i32, ()> {
    // TC sees only the linear head of the skb; received packets carry their
    // headers there, and anything else fails open in the parser.
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(syn) = parse::parse_syn(data, data_end) else {
        return Ok(TC_ACT_OK);
    };
    Ok(match decide::decide(&syn) {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop => TC_ACT_SHOT,
        Verdict::Rst { slot } => match reject::write_rst(data, data_end, &syn) {
            Ok(new_len) => {
                // SAFETY: plain helper calls on our own skb. Packet pointers are
                // not used after change_tail invalidates them.
                unsafe {
                    if bpf_skb_change_tail(ctx.skb.skb, new_len as u32, 0) != 0 {
                        decide::count(slot, shed_common::counter::RST_FAILED);
                        return Ok(TC_ACT_SHOT);
                    }
                    decide::count(slot, shed_common::counter::RST_SENT);
                    // Out of the interface it came in on, back towards the client.
                    bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32
                }
            }
            Err(()) => {
                decide::count(slot, shed_common::counter::RST_FAILED);
                TC_ACT_SHOT
            }
        },
    })
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

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
