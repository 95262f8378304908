// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! The stateless HTTP refusal (`action = "http"`): the segments of a client
//! whose SYN was refused with a cookie SYN-ACK, answered from the cookie
//! alone ([`http_segment`]), and the pieces the kept-alive turn's `503`
//! shares with it.
use shed_common::{PortConfig, counter, http, rst::Reset, tier};

use crate::{
    client::note_verified_refusal,
    fault::fault,
    maps::{count, gate, is_local, port_config, tier_of},
    parse::FLAG_FIN,
    parse::FLAG_PSH,
    parse::LoadBytes,
    parse::Segment,
    reject::Answer,
    reply::{Verdict, withheld},
};

/// The `http` answer's reason for a refusal counted under `reason`.
#[inline(always)]
pub(crate) fn http_reason(reason: usize) -> u32 {
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
pub(crate) fn http_flow(seg: &Segment) -> http::Flow<'_> {
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
    // Any port with a client share hands out cookies too, to SYNs it must
    // refuse past the share's budget (`decide::syn`): their ACKs prove a
    // client under its share was refused.
    let answers = config.answers_http();
    if !answers && config.client_share == 0 {
        return Verdict::Pass;
    }
    let slot = config.slot;
    // Only to this namespace's own addresses were cookies handed out (a SYN to
    // another is not judged): a forwarded segment is never answered, whatever
    // its acknowledgment number happens to check as.
    if !is_local(&seg.server_addr) {
        if answers {
            count(slot, counter::NOT_LOCAL);
        }
        return Verdict::Pass;
    }
    let checked = if fault!("http_cookie_unchecked") {
        let acked = seg.ack_seq.wrapping_sub(1);
        Some(http::Acked { cookie: acked & !http::OFFSET_MASK, reason: 0, offset: acked & http::OFFSET_MASK })
    } else {
        http::check(crate::maps::cookie_key(), http_flow(seg), seg.ack_seq, now_ns)
    };
    let Some(acked) = checked else {
        if answers {
            count(slot, counter::HTTP_BAD_COOKIE);
        }
        return Verdict::Pass;
    };
    // A proven client refused for room: the share binds if it holds less than
    // its share. Only at our offset 0 (the ACK of our SYN-ACK, or the request
    // with it) and for the limit, the only cookie `rst` hands out: a blind
    // guess then checks once in 2^31, not 2^20.
    if acked.offset == 0
        && acked.reason == http::reason::LIMIT
        && let Some(&limit) = gate::limits().and_then(|m| m.get(slot))
    {
        note_verified_refusal(&config, limit, &seg.client_addr, now_ns);
    }
    if !answers {
        // `rst`: the kernel, which has no socket for it, resets it.
        return Verdict::Pass;
    }
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
pub(crate) fn retry_after(config: &PortConfig) -> u32 {
    let derived = gate::user_state().and_then(|m| m.get(config.slot)).map_or(0, |u| u.retry_after_s);
    http::retry_after_seconds(config.retry_after_s, derived)
}

/// `reply`, if a reply may go to the client now ([`withheld`]); else the segment is dropped.
#[inline(always)]
pub(crate) fn http_reply(
    config: &PortConfig,
    seg: &Segment,
    from_loopback: bool,
    now_ns: u64,
    reply: Verdict,
) -> Verdict {
    if let Some(why) = withheld(config, &seg.client_addr, from_loopback, now_ns) {
        count(config.slot, why);
        return Verdict::Drop;
    }
    reply
}

/// Whether the payload may be (part of) an HTTP/1.x request: not TLS, not HTTP/2's preface.
#[inline(always)]
pub(crate) fn http_request<B: LoadBytes>(seg: &Segment, bytes: &B) -> bool {
    if seg.payload_len < 8 {
        return true;
    }
    bytes.load::<8>(usize::from(seg.payload_at)).is_none_or(http::may_be_http1)
}

/// Whether the payload ends the request head (`CRLF CRLF`).
#[inline(always)]
pub(crate) fn ends_head<B: LoadBytes>(seg: &Segment, bytes: &B) -> bool {
    if seg.payload_len < 4 {
        return false;
    }
    let at = usize::from(seg.payload_at) + usize::from(seg.payload_len) - 4;
    bytes.load::<4>(at) == Some(*b"\r\n\r\n")
}
