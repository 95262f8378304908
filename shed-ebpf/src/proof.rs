// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Proof of a handshake: what the kernel's socket lookup makes of an ACK
//! ([`socket_of`]). Only an ACK the kernel would take to complete a
//! handshake (it acknowledges a request socket's SYN-ACK within its window,
//! or carries a valid SYN cookie of the kernel's) is judged; the first bytes
//! of a kept-alive connection's next request are handed to the turn program.
use shed_common::gate_counter;

use crate::{
    fault::fault,
    maps::{count_gate, gate},
    parse::FLAG_FIN,
    parse::Segment,
};

/// `sk_state` values (include/net/tcp_states.h).
pub(crate) const TCP_ESTABLISHED: u32 = 1;
pub(crate) const TCP_TIME_WAIT: u32 = 6;
pub(crate) const TCP_LISTEN: u32 = 10;
pub(crate) const TCP_NEW_SYN_RECV: u32 = 12;

/// What the kernel's socket lookup makes of an ACK (a plain value: see [`Claim`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found(u8);

impl Found {
    /// It completes a handshake: judge it.
    pub(crate) const HANDSHAKE: Self = Self(0);
    /// An established connection, or a handshake it does not prove: pass.
    pub(crate) const OTHER: Self = Self(1);
    /// Only the listener (and no SYN cookie of the kernel's), an old
    /// connection's TIME_WAIT, or no socket at all: not a segment the kernel
    /// takes, unless it is a client of our HTTP answer (a client reusing its
    /// port finds the server's TIME_WAIT of its last connection).
    pub(crate) const UNCLAIMED: Self = Self(2);
    /// The first bytes of the next request on a kept-alive connection that
    /// owes no answer: judge it as a new connection ([`turn`]).
    pub(crate) const TURN: Self = Self(3);
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
pub(crate) fn socket_of(seg: &Segment, ctx: *mut core::ffi::c_void, turn_sk: &mut u64) -> Found {
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
/// socket is one the gate counts (`SHED_SOCKS`) and owes no answer (idle, not
/// multiplexed), and is not counted already: a connection silent since its
/// handshake counts in the port's silent ring for its idle grace only, so its
/// first request is judged once the grace is over (a pool that connects
/// ahead of its requests, a client that waits out the grace). Then the socket's
/// address, else 0; whether a request on it was refused before is left for
/// the turn program ([`crate::maps::turn_refused_before`]). The turn program
/// checks the rest ([`next_expected`]): every instruction here is walked by
/// the verifier once per state that reaches the ACK's lookup. A subprogram:
/// its ways to say no end in one state for the caller.
#[inline(never)]
pub(crate) fn turn_socket(sk: *mut core::ffi::c_void) -> u64 {
    if fault!("turns_unjudged") {
        return 0;
    }
    let key = sk as u64;
    let Some(entry) = gate::socks().and_then(|m| m.get_ptr(&key)) else { return 0 };
    // SAFETY: map value, read as plain data.
    let idle = unsafe { (*entry).busy == 0 && (*entry).multiplexed == 0 };
    if !idle {
        return 0;
    }
    // SAFETY: as above.
    let (silent, slot, epoch) = unsafe { ((*entry).silent != 0, (*entry).slot, (*entry).silent_epoch) };
    if silent && !fault!("silent_turn_unjudged") {
        let shift = gate::user_state().and_then(|m| m.get(slot)).copied().unwrap_or_default().silent_shift();
        // SAFETY: reading the clock has no preconditions.
        let now_epoch = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() } >> shift;
        if shed_common::handshake::live(epoch, now_epoch) {
            return 0;
        }
    } else if silent {
        return 0;
    }
    // SAFETY: as above.
    crate::maps::set_turn_refused_before(unsafe { (*entry).refused_request } != 0);
    key
}

/// Whether `seq` is the next byte socket `sk` (an address from the gate's
/// lookup, a moment ago) expects: the first byte of a request, not a
/// retransmission of data it has. Read at `tcp_sock.rcv_nxt` (the offset
/// userspace finds in BTF); without it, true.
#[inline(always)]
pub(crate) fn next_expected(sk: u64, seq: u32) -> bool {
    use aya_ebpf::helpers::bpf_probe_read_kernel;
    let offset = crate::maps::rcv_nxt_offset();
    if offset == 0 {
        return true;
    }
    // SAFETY: a 4-byte read of kernel memory; the helper fails safely on a bad
    // address (sockets are freed by RCU: the memory stays a socket's meanwhile).
    matches!(unsafe { bpf_probe_read_kernel((sk + u64::from(offset)) as *const u32) }, Ok(next) if next == seq)
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
pub(crate) unsafe fn acks_our_syn_ack(sk: *mut core::ffi::c_void, seg: &Segment) -> bool {
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
pub(crate) fn valid_cookie(seg: &Segment) -> bool {
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
