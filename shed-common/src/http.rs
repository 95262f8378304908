// SPDX-License-Identifier: MIT OR Apache-2.0
//! The stateless HTTP/1.x refusal (`action = "http"`): a SYN refused by the
//! gate is answered by the gate itself with a SYN-ACK whose sequence number
//! is a cookie, and the client's request on that handshake with one segment,
//! `503 Service Unavailable` with `Retry-After`, then FIN. Nothing is kept
//! between segments: every one is answered from the cookie it acknowledges.
//!
//! The cookie (32 bits, the SYN-ACK's sequence number):
//! - bit 31: the low bit of the time slot (`now >> COOKIE_SLOT_SHIFT`, about
//!   69 s), so that a check hashes one slot, the current or the one before;
//! - bits 11..31: a keyed SipHash-1-3 of the 4-tuple, the reason and the slot;
//! - bits 9..11: why the SYN was refused ([`reason`]), named in the answer;
//! - bits 0..9: zero. Every later segment of the client acknowledges
//!   `cookie + 1 + n` with `n` the bytes of ours it has (0, the answer, the
//!   answer and our FIN): `n` is read from these bits, the cookie from the rest.
//!
//! The answer's bytes are fixed by (reason, tier) and the three digits of
//! Retry-After, so a retransmitted request gets the very same bytes.

use crate::rst::{Reset, finish, sum_words};

/// Low bits of a cookie that count the bytes of ours a segment acknowledges.
pub const OFFSET_BITS: u32 = 9;
pub const OFFSET_MASK: u32 = (1 << OFFSET_BITS) - 1;
/// Where the reason sits in a cookie (two bits).
pub const REASON_SHIFT: u32 = OFFSET_BITS;
/// The hashed bits of a cookie.
pub const HASH_MASK: u32 = 0x7fff_f800;
/// A cookie's time slot: `now_ns >> COOKIE_SLOT_SHIFT` (2^36 ns, about 69 s);
/// a cookie is good in its own slot and the next, so for 69 to 137 s.
pub const COOKIE_SLOT_SHIFT: u32 = 36;
/// The name of the kernel object's global holding the cookie key (two u64),
/// drawn by userspace at every load.
pub const COOKIE_KEY_GLOBAL: &str = "SHED_COOKIE_KEY";

/// Why a SYN was refused, as the answer names it (`reason=`).
pub mod reason {
    pub const LIMIT: u32 = 0;
    pub const SHARE: u32 = 1;
    pub const CLIENT_CAP: u32 = 2;
    pub const CLIENT_SHARE: u32 = 3;
    pub const COUNT: usize = 4;
    pub const NAMES: [&str; COUNT] = ["limit", "share", "client-cap", "client-share"];
}

/// The receive window of every answer (no window scaling is offered). The
/// SYN-ACK carries no options ([`syn_ack`]): the client
/// sends at most 536 bytes (IPv4) or 1220 (IPv6) a segment.
pub const WINDOW: u16 = 65_535;
/// TCP flags of the answers after the SYN-ACK.
pub const FLAGS_ACK: u8 = 0x10;
/// The answer's one segment: FIN | PSH | ACK.
pub const FLAGS_ANSWER: u8 = 0x19;

/// Retry-After is three digits (`001` to `999` seconds), at this offset of every answer.
pub const RETRY_DIGITS_AT: usize = STATUS_LINE.len() + RETRY_NAME.len();
pub const MAX_RETRY_AFTER: u32 = 999;
/// Room for an answer (bytes of HTTP; each is shorter, and fits one segment
/// of the least MSS, 536). 256: the kernel copies `1 + ((len - 1) & 0xff)`
/// bytes, a length the verifier bounds to this array without a branch.
pub const ANSWER_MAX: usize = 256;
/// Answers by `reason * tier::COUNT + tier`.
pub const ANSWER_COUNT: usize = reason::COUNT * crate::tier::COUNT;

const STATUS_LINE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n";
const RETRY_NAME: &[u8] = b"Retry-After: ";
const AFTER_DIGITS: &[u8] = b"\r\nConnection: close\r\nContent-Length: 0\r\nShed: kernel; reason=";
const TIER_NAME: &[u8] = b"; tier=";
const END: &[u8] = b"\r\n\r\n";

/// One answer: its bytes (Retry-After `000`) and their ones'-complement sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    pub len: u32,
    /// [`sum_words`] of `bytes[..len]` (an odd last byte as the high half of a word).
    pub sum: u32,
    pub bytes: [u8; ANSWER_MAX],
}
const _: () = assert!(core::mem::size_of::<HttpAnswer>() == 264);

/// Every answer, built at compile time (the kernel holds them as read-only data).
pub const ANSWERS: [HttpAnswer; ANSWER_COUNT] = answers();

/// The answer's index for a refusal `reason` of a client of `tier`.
#[inline(always)]
pub const fn answer_index(reason: u32, tier: u8) -> usize {
    ((reason as usize & (reason::COUNT - 1)) * crate::tier::COUNT + (tier as usize & (crate::tier::COUNT - 1)))
        & (ANSWER_COUNT - 1)
}

const fn answers() -> [HttpAnswer; ANSWER_COUNT] {
    let mut out = [HttpAnswer { len: 0, sum: 0, bytes: [0; ANSWER_MAX] }; ANSWER_COUNT];
    let mut r = 0;
    while r < reason::COUNT {
        let mut t = 0;
        while t < crate::tier::COUNT {
            let mut a = HttpAnswer { len: 0, sum: 0, bytes: [0; ANSWER_MAX] };
            let parts: [&[u8]; 8] = [
                STATUS_LINE,
                RETRY_NAME,
                b"000",
                AFTER_DIGITS,
                reason::NAMES[r].as_bytes(),
                TIER_NAME,
                crate::tier::NAMES[t].as_bytes(),
                END,
            ];
            let mut len = 0;
            let mut p = 0;
            while p < parts.len() {
                let mut i = 0;
                while i < parts[p].len() {
                    a.bytes[len] = parts[p][i];
                    len += 1;
                    i += 1;
                }
                p += 1;
            }
            a.len = len as u32;
            a.sum = sum_words(&a.bytes);
            out[r * crate::tier::COUNT + t] = a;
            t += 1;
        }
        r += 1;
    }
    out
}

/// The seconds a port's answer carries in its Retry-After: the port's own
/// (`--retry-after`, `port_s`), else what the daemon derived from the
/// controller (`derived_s`), held as [`retry_seconds`] holds them.
#[inline(always)]
pub const fn retry_after_seconds(port_s: u16, derived_s: u32) -> u32 {
    retry_seconds(if port_s != 0 { port_s as u32 } else { derived_s })
}

/// `seconds` held to 1 through [`MAX_RETRY_AFTER`]: what three digits can say.
#[inline(always)]
pub const fn retry_seconds(seconds: u32) -> u32 {
    if seconds == 0 {
        1
    } else if seconds > MAX_RETRY_AFTER {
        MAX_RETRY_AFTER
    } else {
        seconds
    }
}

/// The three digits of Retry-After for `seconds` (held to 1..=999).
#[inline(always)]
pub const fn retry_digits(seconds: u32) -> [u8; 3] {
    let s = retry_seconds(seconds);
    [b'0' + (s / 100) as u8, b'0' + (s / 10 % 10) as u8, b'0' + (s % 10) as u8]
}

/// What `digits` add to an answer's sum over its `000`.
#[inline(always)]
pub const fn digits_sum(digits: [u8; 3]) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while i < 3 {
        let value = (digits[i] - b'0') as u32;
        // Even offsets of the TCP segment are a word's high byte (the payload starts at an even one).
        sum += if (RETRY_DIGITS_AT + i).is_multiple_of(2) { value << 8 } else { value };
        i += 1;
    }
    sum
}

/// SipHash-1-3 of six words under `key`.
#[inline(always)]
pub fn siphash13(key: [u64; 2], words: &[u64; 6]) -> u64 {
    let mut v = [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ];
    let mut i = 0;
    while i < 6 {
        v[3] ^= words[i];
        sip_round(&mut v);
        v[0] ^= words[i];
        i += 1;
    }
    let last = 48u64 << 56;
    v[3] ^= last;
    sip_round(&mut v);
    v[0] ^= last;
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// A flow as the cookie sees it (addresses IPv4-mapped for IPv4, ports host order).
#[derive(Clone, Copy, Debug)]
pub struct Flow<'a> {
    pub client: &'a [u8; 16],
    pub server: &'a [u8; 16],
    pub client_port: u16,
    pub server_port: u16,
}

/// The cookie for `flow` refused for `why` in time slot `slot`.
#[inline(always)]
pub fn cookie_in_slot(key: [u64; 2], flow: Flow<'_>, why: u32, slot: u64) -> u32 {
    let word = |a: &[u8; 16], at: usize| {
        u64::from_be_bytes([a[at], a[at + 1], a[at + 2], a[at + 3], a[at + 4], a[at + 5], a[at + 6], a[at + 7]])
    };
    let why = why & (reason::COUNT as u32 - 1);
    let ports = (u64::from(flow.client_port) << 48) | (u64::from(flow.server_port) << 32) | u64::from(why);
    let words = [word(flow.client, 0), word(flow.client, 8), word(flow.server, 0), word(flow.server, 8), ports, slot];
    let hash = siphash13(key, &words) as u32;
    (((slot as u32) & 1) << 31) | (hash & HASH_MASK) | (why << REASON_SHIFT)
}

/// The cookie a SYN of `flow` refused for `why` at `now_ns` gets.
#[inline(always)]
pub fn cookie(key: [u64; 2], flow: Flow<'_>, why: u32, now_ns: u64) -> u32 {
    cookie_in_slot(key, flow, why, now_ns >> COOKIE_SLOT_SHIFT)
}

/// A segment's acknowledgment number read against our cookies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    /// The cookie (our ISN).
    pub cookie: u32,
    /// Why its SYN was refused.
    pub reason: u32,
    /// Bytes of ours (after the SYN) the segment acknowledges.
    pub offset: u32,
}

/// Whether `ack_seq` acknowledges a SYN-ACK of ours for `flow` sent in the
/// current time slot or the one before.
#[inline(always)]
pub fn check(key: [u64; 2], flow: Flow<'_>, ack_seq: u32, now_ns: u64) -> Option<Acked> {
    let acked = ack_seq.wrapping_sub(1);
    let candidate = acked & !OFFSET_MASK;
    let now_slot = now_ns >> COOKIE_SLOT_SHIFT;
    let slot = if candidate >> 31 == (now_slot as u32) & 1 { now_slot } else { now_slot.wrapping_sub(1) };
    let why = (candidate >> REASON_SHIFT) & (reason::COUNT as u32 - 1);
    (cookie_in_slot(key, flow, why, slot) == candidate).then_some(Acked {
        cookie: candidate,
        reason: why,
        offset: acked & OFFSET_MASK,
    })
}

/// Not a reset: the SYN-ACK of a refusal, `SEQ=cookie, ACK=SEG.SEQ+1,
/// CTL=SYN,ACK` with a window and no options (the client then sends at most
/// 536 bytes a segment, RFC 9293 §3.7.1; every answer is shorter). Built as
/// a [`Reset`] is, so that it leaves by the reset's path.
#[inline(always)]
pub const fn syn_ack(cookie: u32, syn_seq: u32) -> Reset {
    Reset { seq: cookie, ack: syn_seq.wrapping_add(1), flags: crate::rst::FLAGS_SYN_ACK, window: WINDOW }
}

/// The TCP header (no options) of a segment of ours with `flags`, whose
/// checksum covers `payload_sum` too; `pseudo_sum` is the pseudo-header's for
/// the whole segment's length.
#[inline(always)]
pub fn tcp_segment(
    server_port: u16,
    client_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    pseudo_sum: u32,
    payload_sum: u32,
) -> [u8; crate::rst::TCP_HEADER_LEN] {
    let s = server_port.to_be_bytes();
    let d = client_port.to_be_bytes();
    let q = seq.to_be_bytes();
    let a = ack.to_be_bytes();
    let w = WINDOW.to_be_bytes();
    let mut h =
        [s[0], s[1], d[0], d[1], q[0], q[1], q[2], q[3], a[0], a[1], a[2], a[3], 0x50, flags, w[0], w[1], 0, 0, 0, 0];
    let c = finish(pseudo_sum + payload_sum + sum_words(&h)).to_be_bytes();
    h[16] = c[0];
    h[17] = c[1];
    h
}

/// Whether a segment that starts with `head` may be (part of) an HTTP/1.x
/// request. A segment in the middle of a request starts anywhere, so only
/// what is surely something else is refused: a TLS record (0x16, a
/// ClientHello) and HTTP/2's connection preface (`PRI * HTTP/2.0`). Those
/// cannot be answered statelessly, and get a reset instead.
#[inline(always)]
pub fn may_be_http1(head: [u8; 8]) -> bool {
    head[0] != 0x16 && !(head[0] == b'P' && head[1] == b'R' && head[2] == b'I' && head[3] == b' ')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::string::String;

    /// SipHash-1-3 from the `siphasher` crate, over the message as bytes.
    fn reference_siphash13(key: [u64; 2], message: &[u8]) -> u64 {
        use core::hash::Hasher as _;
        let mut h = siphasher::sip::SipHasher13::new_with_keys(key[0], key[1]);
        h.write(message);
        h.finish()
    }

    proptest! {
        /// The six words are the message's 48 bytes, each word little-endian, as SipHash reads them.
        #[test]
        fn siphash13_is_the_reference_siphash(key in any::<[u64; 2]>(), words in any::<[u64; 6]>()) {
            let message: std::vec::Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            prop_assert_eq!(siphash13(key, &words), reference_siphash13(key, &message));
        }

        /// The cookie as DESIGN.md lays it out, built here from the flow's bytes:
        /// the slot's parity in bit 31, 20 bits of the keyed hash of (client,
        /// server, ports and reason, slot) in 11-30, the reason in 9-10, 0 below.
        #[test]
        fn a_cookie_is_parity_hash_and_reason(
            key in any::<[u64; 2]>(),
            client in any::<[u8; 16]>(),
            server in any::<[u8; 16]>(),
            ports in any::<(u16, u16)>(),
            why in 0..reason::COUNT as u32,
            slot in any::<u64>(),
        ) {
            let flow = Flow { client: &client, server: &server, client_port: ports.0, server_port: ports.1 };
            let mut message = std::vec::Vec::new();
            for half in [&client[..8], &client[8..], &server[..8], &server[8..]] {
                // Each 8 address bytes are one word, read big-endian, hashed as SipHash words.
                message.extend(half.iter().rev());
            }
            // The ports word: the reason in its low 32 bits, the server port, the client port.
            message.extend_from_slice(&why.to_le_bytes());
            message.extend_from_slice(&ports.1.to_le_bytes());
            message.extend_from_slice(&ports.0.to_le_bytes());
            message.extend_from_slice(&slot.to_le_bytes());
            let hash = reference_siphash13(key, &message) as u32;
            let expected = ((slot as u32 & 1) << 31) | (hash & 0x7fff_f800) | (why << 9);
            prop_assert_eq!(cookie_in_slot(key, flow, why, slot), expected);
        }
    }

    #[test]
    fn the_port_s_retry_after_wins_over_the_derived_one() {
        assert_eq!(retry_after_seconds(7, 42), 7, "the port's own");
        assert_eq!(retry_after_seconds(0, 42), 42, "else the derived one");
        assert_eq!(retry_after_seconds(0, 0), 1, "at least 1");
        assert_eq!(retry_after_seconds(0, 5000), 999, "at most 999");
    }

    #[test]
    fn retry_digits_are_the_seconds_held_to_one_through_999() {
        for (seconds, digits) in
            [(0, b"001"), (1, b"001"), (7, b"007"), (42, b"042"), (999, b"999"), (1000, b"999"), (u32::MAX, b"999")]
        {
            assert_eq!(&retry_digits(seconds), digits, "{seconds}");
        }
    }

    fn text(a: &HttpAnswer) -> String {
        String::from_utf8(a.bytes[..a.len as usize].to_vec()).unwrap()
    }

    #[test]
    fn every_answer_is_a_complete_503_that_fits_one_small_segment() {
        for r in 0..reason::COUNT as u32 {
            for t in 0..crate::tier::COUNT as u8 {
                let a = &ANSWERS[answer_index(r, t)];
                let s = text(a);
                assert!(s.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{s}");
                assert!(s.contains("\r\nRetry-After: 000\r\n") && s.contains("\r\nConnection: close\r\n"));
                assert!(s.contains("\r\nContent-Length: 0\r\n"));
                let shed = std::format!(
                    "\r\nShed: kernel; reason={}; tier={}\r\n\r\n",
                    reason::NAMES[r as usize],
                    crate::tier::NAMES[t as usize]
                );
                assert!(s.ends_with(&shed), "{s}");
                assert_eq!(&a.bytes[RETRY_DIGITS_AT..RETRY_DIGITS_AT + 3], b"000");
                assert!(a.len as usize <= ANSWER_MAX && a.len < 536);
                assert!(a.bytes[a.len as usize..].iter().all(|&b| b == 0));
            }
        }
    }

    /// RFC 1071 written apart from [`sum_words`]: any length, the odd byte high.
    fn reference_sum(bytes: &[u8]) -> u64 {
        bytes.chunks(2).map(|c| u64::from(c[0]) << 8 | u64::from(*c.get(1).unwrap_or(&0))).sum()
    }

    #[test]
    fn retry_digits_patch_the_sum_as_a_fresh_sum_would() {
        for seconds in [0, 1, 9, 10, 42, 99, 100, 537, 999, 1000, u32::MAX] {
            let digits = retry_digits(seconds);
            let shown: u32 = core::str::from_utf8(&digits).unwrap().parse().unwrap();
            assert_eq!(shown, seconds.clamp(1, 999));
            for a in &ANSWERS {
                let mut bytes = a.bytes;
                bytes[RETRY_DIGITS_AT..RETRY_DIGITS_AT + 3].copy_from_slice(&digits);
                assert_eq!(u64::from(a.sum + digits_sum(digits)), reference_sum(&bytes[..a.len as usize]));
            }
        }
    }

    fn flow<'a>(c: &'a [u8; 16], s: &'a [u8; 16], cp: u16) -> Flow<'a> {
        Flow { client: c, server: s, client_port: cp, server_port: 8080 }
    }

    #[test]
    fn siphash13_is_keyed_and_reads_every_word() {
        let words = [1, 2, 3, 4, 5, 6];
        let base = siphash13([7, 8], &words);
        assert_ne!(base, siphash13([7, 9], &words));
        for i in 0..6 {
            let mut w = words;
            w[i] ^= 1 << 40;
            assert_ne!(base, siphash13([7, 8], &w), "word {i}");
        }
    }

    proptest! {
        #[test]
        fn a_cookie_checks_at_each_offset_of_ours_in_its_slot_and_the_next(
            key: [u64; 2], c: [u8; 16], s: [u8; 16], cp: u16, why in 0u32..4, now in 1u64 << 40..1u64 << 60, offset in 0u32..=OFFSET_MASK,
        ) {
            let f = flow(&c, &s, cp);
            let k = cookie(key, f, why, now);
            prop_assert_eq!(k & OFFSET_MASK, 0);
            prop_assert_eq!((k >> REASON_SHIFT) & 3, why);
            let ack = k.wrapping_add(1).wrapping_add(offset);
            let expect = Some(Acked { cookie: k, reason: why, offset });
            prop_assert_eq!(check(key, f, ack, now), expect);
            prop_assert_eq!(check(key, f, ack, now + (1 << COOKIE_SLOT_SHIFT)), expect, "good in the next slot");
            prop_assert_eq!(check(key, f, ack, now + (2 << COOKIE_SLOT_SHIFT)), None, "stale two slots on");
            let other_port = flow(&c, &s, cp.wrapping_add(1));
            prop_assert_eq!(check(key, other_port, ack, now), None);
            prop_assert_eq!(check([key[0] ^ 1, key[1]], f, ack, now), None);
        }

        #[test]
        fn syn_acks_and_answers_verify(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, seq: u32, ack: u32, retry in 0u32..2000, i in 0usize..ANSWER_COUNT) {
            let h = crate::rst::tcp_reset(sp, dp, syn_ack(seq, ack), crate::rst::pseudo_sum_v4(src, dst));
            let pseudo = [&src[..], &dst[..], &[0, 6, 0, 20]].concat();
            prop_assert_eq!(reference_sum(&[&pseudo[..], &h[..]].concat()) % 0xffff, 0);
            prop_assert_eq!(h[13], crate::rst::FLAGS_SYN_ACK);
            prop_assert_eq!(u16::from_be_bytes([h[14], h[15]]), WINDOW);
            let a = &ANSWERS[i];
            let digits = retry_digits(retry);
            let mut payload = a.bytes[..a.len as usize].to_vec();
            payload[RETRY_DIGITS_AT..RETRY_DIGITS_AT + 3].copy_from_slice(&digits);
            let len = 20 + a.len as u16;
            let t = tcp_segment(sp, dp, seq, ack, FLAGS_ANSWER, crate::rst::pseudo_sum_v4_len(src, dst, len), a.sum + digits_sum(digits));
            let pseudo = [&src[..], &dst[..], &[0, 6], &len.to_be_bytes()[..]].concat();
            let whole = [&pseudo[..], &t[..], &payload[..]].concat();
            let mut sum = reference_sum(&whole);
            while sum > 0xffff { sum = (sum & 0xffff) + (sum >> 16); }
            prop_assert_eq!(sum, 0xffff);
        }
    }

    #[test]
    fn tls_and_http2_are_told_from_http1() {
        assert!(may_be_http1(*b"GET / HT"));
        assert!(may_be_http1(*b"ost: a\r\n"), "the middle of a request");
        assert!(!may_be_http1(*b"PRI * HT"), "HTTP/2 preface");
        assert!(!may_be_http1([0x16, 3, 1, 0, 0xa5, 1, 0, 0]), "TLS ClientHello");
        assert!(may_be_http1(*b"PRIVATE "), "a method that starts like the preface");
    }
}
