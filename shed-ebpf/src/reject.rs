// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Turns a rejected segment into its reply, in place: a reset, or a segment
//! of the stateless HTTP answer.
use shed_common::{
    http,
    rst::{
        IPV4_HEADER_LEN, IPV6_HEADER_LEN, Reset, TCP_HEADER_LEN, ipv4_header_len, ipv6_header_len, pseudo_sum_v4_len,
        pseudo_sum_v6_len, tcp_reset,
    },
};

use crate::{
    fault::fault,
    parse::{Segment, ptr_at},
};

/// Rewrites the frame into the reply: MACs swapped, a fresh IP header without
/// options or extension headers, a TCP header without options. Returns the
/// reply's length (0: the frame could not hold it); the caller trims the
/// frame to it. VLAN tags are kept. A plain scalar result: a larger one is
/// returned through the caller's stack, whose pointer the verifier refuses.
/// A subprogram: the header arrays it builds need stack of their own.
#[inline(never)]
pub fn write_rst(data: usize, data_end: usize, seg: &Segment, reset: Reset) -> usize {
    write_rst_frame(data, data_end, seg, reset).unwrap_or(0)
}

/// [`write_rst`], with `?` for its bounds checks.
#[inline(always)]
fn write_rst_frame(data: usize, data_end: usize, seg: &Segment, reset: Reset) -> Option<usize> {
    let (l4, pseudo) = write_headers(data, data_end, seg, TCP_HEADER_LEN as u16)?;
    let tcp: *mut [u8; TCP_HEADER_LEN] = ptr_at(data, data_end, l4)?;
    // SAFETY: bounds checked by ptr_at.
    unsafe { *tcp = tcp_reset(seg.server_port, seg.client_port, reset, pseudo) };
    if fault!("rst_checksum_byte") {
        // SAFETY: bounds checked by ptr_at.
        unsafe { (*tcp)[17] ^= 1 };
    }
    Some(l4 + TCP_HEADER_LEN)
}

/// The part every reply shares: MACs swapped (VLAN tags kept) and a fresh IP
/// header for `tcp_len` bytes of TCP. Returns where TCP starts and the
/// pseudo-header's sum for that length.
#[inline(always)]
fn write_headers(data: usize, data_end: usize, seg: &Segment, tcp_len: u16) -> Option<(usize, u32)> {
    let macs: *mut [u8; 12] = ptr_at(data, data_end, 0)?;
    if !fault!("rst_macs_kept") {
        // SAFETY: bounds checked by ptr_at; frames are byte arrays (alignment 1).
        unsafe {
            let m = *macs;
            *macs = [m[6], m[7], m[8], m[9], m[10], m[11], m[0], m[1], m[2], m[3], m[4], m[5]];
        }
    }
    // The verifier does not carry the offset's bounds through the caller's stack: restate them.
    let l3 = seg.l3_offset;
    if l3 > MAX_L3_OFFSET {
        return None;
    }
    if seg.is_ipv6 {
        let ip: *mut [u8; IPV6_HEADER_LEN] = ptr_at(data, data_end, l3)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { *ip = ipv6_header_len(seg.server_addr, seg.client_addr, tcp_len) };
        Some((l3 + IPV6_HEADER_LEN, pseudo_sum_v6_len(seg.server_addr, seg.client_addr, tcp_len)))
    } else {
        let ip: *mut [u8; IPV4_HEADER_LEN] = ptr_at(data, data_end, l3)?;
        let (server, client) = (v4(&seg.server_addr), v4(&seg.client_addr));
        // SAFETY: bounds checked by ptr_at.
        unsafe { *ip = ipv4_header_len(server, client, tcp_len) };
        Some((l3 + IPV4_HEADER_LEN, pseudo_sum_v4_len(server, client, tcp_len)))
    }
}

/// Ethernet plus two VLAN tags: the furthest the IP header can start.
const MAX_L3_OFFSET: usize = 14 + 8;

/// The IPv4 address inside an IPv4-mapped IPv6 address.
#[inline(always)]
fn v4(mapped: &[u8; 16]) -> [u8; 4] {
    [mapped[12], mapped[13], mapped[14], mapped[15]]
}

/// A segment of the stateless HTTP answer (`action = "http"`) after its
/// SYN-ACK (which leaves as a [`Reset`] does): a bare ACK, or the `503` with FIN.
#[derive(Clone, Copy)]
pub struct Answer {
    pub seq: u32,
    pub ack: u32,
    /// [`http::FLAGS_ACK`] or [`http::FLAGS_ANSWER`] (the SYN-ACK is a [`Reset`]).
    pub flags: u8,
    /// The payload: [`http::ANSWERS`] index + 1, or 0 for none.
    pub payload: u8,
    pub digits: [u8; 3],
    /// The port counter to count once the answer is sent, plus one (0: none).
    pub sent: u8,
}

/// The HTTP answers, as read-only data: the helpers copy from it into the frame.
#[unsafe(no_mangle)]
static SHED_HTTP_ANSWERS: [http::HttpAnswer; http::ANSWER_COUNT] = http::ANSWERS;

/// Answer `payload` (an [`Answer::payload`]): the template and its length.
#[inline(always)]
fn template(payload: u8) -> Option<(&'static http::HttpAnswer, usize)> {
    if payload == 0 {
        return None;
    }
    let answer = SHED_HTTP_ANSWERS.get(usize::from(payload - 1) & (http::ANSWER_COUNT - 1))?;
    Some((answer, (answer.len as usize).min(http::ANSWER_MAX)))
}

impl Answer {
    /// [`Self::sent`] for an answer counted nowhere (a bare ACK).
    pub const UNCOUNTED: u8 = 0;

    /// A bare ACK (no payload, counted nowhere).
    #[inline(always)]
    pub const fn bare_ack(seq: u32, ack: u32) -> Self {
        Self { seq, ack, flags: http::FLAGS_ACK, payload: 0, digits: [b'0'; 3], sent: Self::UNCOUNTED }
    }

    /// [`Self::sent`] for port counter `index`.
    #[inline(always)]
    pub const fn counted(index: usize) -> u8 {
        index as u8 + 1
    }

    /// The payload's template and length (None: a bare ACK).
    #[inline(always)]
    fn payload(&self) -> Option<(&'static http::HttpAnswer, usize)> {
        template(self.payload)
    }

    /// The TCP length of the answer: header and payload.
    #[inline(always)]
    fn tcp_len(&self) -> usize {
        TCP_HEADER_LEN + self.payload().map_or(0, |(_, len)| len)
    }
}

/// The length of answer `index` ([`http::answer_index`]).
#[inline(always)]
pub fn answer_len(index: usize) -> u32 {
    template((index & (http::ANSWER_COUNT - 1)) as u8 + 1).map_or(0, |(_, len)| len as u32)
}

/// Rewrites the frame's headers into `answer`'s, as [`write_rst`] does for a
/// reset. Returns the answer's whole length (the caller resizes the frame to
/// it) in the low 16 bits and where its payload goes ([`store_payload`], after
/// the resize) in the high 16; 0 if the frame could not hold it.
#[inline(never)]
pub fn write_answer(data: usize, data_end: usize, seg: &Segment, answer: &Answer) -> u32 {
    write_answer_frame(data, data_end, seg, answer).map_or(0, |(len, at)| len as u32 | (at as u32) << 16)
}

/// [`write_answer`], with `?` for its bounds checks.
#[inline(always)]
fn write_answer_frame(data: usize, data_end: usize, seg: &Segment, answer: &Answer) -> Option<(usize, usize)> {
    let tcp_len = answer.tcp_len() as u16;
    let (l4, pseudo) = write_headers(data, data_end, seg, tcp_len)?;
    let payload_sum = answer.payload().map_or(0, |(a, _)| a.sum + http::digits_sum(answer.digits));
    let tcp: *mut [u8; TCP_HEADER_LEN] = ptr_at(data, data_end, l4)?;
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        *tcp = http::tcp_segment(
            seg.server_port,
            seg.client_port,
            answer.seq,
            answer.ack,
            answer.flags,
            pseudo,
            payload_sum,
        )
    };
    Some((l4 + usize::from(tcp_len), l4 + TCP_HEADER_LEN))
}

/// Copies an answer's `payload` ([`Answer::payload`]) into the resized frame
/// at `at`, through the hook's store helper (`store(offset, from, len)`), and
/// its Retry-After `digits`.
#[inline(always)]
pub fn store_payload(payload: u8, digits: [u8; 3], at: usize, store: impl Fn(u32, *const u8, u32) -> bool) -> bool {
    let Some((bytes, len)) = template(payload) else { return true };
    // Hidden from LLVM, so that the bounds the verifier sees are these: 1..=ANSWER_MAX
    // (every answer's length is in that range, so this is the length itself).
    // SAFETY: reading a local.
    let len = unsafe { core::ptr::read_volatile(&(len as u32)) };
    let len = (len.wrapping_sub(1) & (http::ANSWER_MAX as u32 - 1)) + 1;
    store(at as u32, bytes.bytes.as_ptr(), len)
        && store((at + http::RETRY_DIGITS_AT) as u32, digits.as_ptr(), digits.len() as u32)
}
