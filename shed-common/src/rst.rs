// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP RST+ACK that answers a rejected SYN, built from fixed-size arrays so
//! the same code runs in the kernel (unrolled, no bounds the verifier must
//! prove) and in userspace tests.
//!
//! RFC 9293 §3.10.7.1: a segment without ACK answered with a reset carries
//! `SEQ=0, ACK=SEG.SEQ+SEG.LEN, CTL=RST,ACK`; a SYN has SEG.LEN 1. The reply
//! carries no TCP options and no IP options.

/// The RST-rate prefix of a client address (IPv4 /24, IPv6 /48).
#[inline(always)]
pub fn rst_prefix(addr: &[u8; 16]) -> [u8; 16] {
    let mut p = *addr;
    let keep = if crate::is_ipv4_mapped(addr) { 15 } else { 6 };
    let mut i = keep;
    while i < 16 {
        p[i] = 0;
        i += 1;
    }
    p
}

pub const IPV4_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
pub const TCP_HEADER_LEN: usize = 20;
/// TTL / hop limit of replies: the Linux default.
pub const REPLY_TTL: u8 = 64;
/// Flags byte (offset 13) of the reply to a SYN: RST | ACK.
pub const FLAGS_RST_ACK: u8 = 0x14;
/// Flags byte of the reply to an ACK: RST alone.
pub const FLAGS_RST: u8 = 0x04;
/// Flags byte of an `http` refusal's SYN-ACK.
pub const FLAGS_SYN_ACK: u8 = 0x12;
const IPPROTO_TCP: u8 = 6;

/// Ones'-complement sum of big-endian 16-bit words (unfolded). `N` must be even.
#[inline(always)]
pub const fn sum_words<const N: usize>(bytes: &[u8; N]) -> u32 {
    let mut sum = 0u32;
    let mut i = 0;
    while i + 1 < N {
        sum += u16::from_be_bytes([bytes[i], bytes[i + 1]]) as u32;
        i += 2;
    }
    sum
}

/// Folds a 32-bit ones'-complement sum and complements it: the checksum field value.
#[inline(always)]
pub fn finish(mut sum: u32) -> u16 {
    // Two folds suffice: after the first, the sum is at most 0x1_fffe.
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// IPv4 header of the reply (no options, DF set, id 0).
#[inline(always)]
pub fn ipv4_header(src: [u8; 4], dst: [u8; 4]) -> [u8; IPV4_HEADER_LEN] {
    ipv4_header_len(src, dst, TCP_HEADER_LEN as u16)
}

/// IPv4 header of a reply of `tcp_len` bytes of TCP (header and payload).
#[inline(always)]
pub fn ipv4_header_len(src: [u8; 4], dst: [u8; 4], tcp_len: u16) -> [u8; IPV4_HEADER_LEN] {
    let total = IPV4_HEADER_LEN as u16 + tcp_len;
    let t = total.to_be_bytes();
    let mut h = [
        0x45,
        0,
        t[0],
        t[1],
        0,
        0,
        0x40,
        0,
        REPLY_TTL,
        IPPROTO_TCP,
        0,
        0,
        src[0],
        src[1],
        src[2],
        src[3],
        dst[0],
        dst[1],
        dst[2],
        dst[3],
    ];
    let c = finish(sum_words(&h)).to_be_bytes();
    h[10] = c[0];
    h[11] = c[1];
    h
}

/// IPv6 header of the reply (traffic class and flow label 0).
#[inline(always)]
pub fn ipv6_header(src: [u8; 16], dst: [u8; 16]) -> [u8; IPV6_HEADER_LEN] {
    ipv6_header_len(src, dst, TCP_HEADER_LEN as u16)
}

/// IPv6 header of a reply of `tcp_len` bytes of TCP (header and payload).
#[inline(always)]
pub fn ipv6_header_len(src: [u8; 16], dst: [u8; 16], tcp_len: u16) -> [u8; IPV6_HEADER_LEN] {
    let mut h = [0u8; IPV6_HEADER_LEN];
    h[0] = 0x60;
    let l = tcp_len.to_be_bytes();
    h[4] = l[0];
    h[5] = l[1];
    h[6] = IPPROTO_TCP;
    h[7] = REPLY_TTL;
    let mut i = 0;
    while i < 16 {
        h[8 + i] = src[i];
        h[24 + i] = dst[i];
        i += 1;
    }
    h
}

/// Pseudo-header sum for an IPv4 TCP segment of [`TCP_HEADER_LEN`] bytes.
#[inline(always)]
pub fn pseudo_sum_v4(src: [u8; 4], dst: [u8; 4]) -> u32 {
    pseudo_sum_v4_len(src, dst, TCP_HEADER_LEN as u16)
}

/// Pseudo-header sum for an IPv4 TCP segment of `tcp_len` bytes.
#[inline(always)]
pub fn pseudo_sum_v4_len(src: [u8; 4], dst: [u8; 4], tcp_len: u16) -> u32 {
    sum_words(&src) + sum_words(&dst) + u32::from(IPPROTO_TCP) + u32::from(tcp_len)
}

/// Pseudo-header sum for an IPv6 TCP segment of [`TCP_HEADER_LEN`] bytes.
#[inline(always)]
pub fn pseudo_sum_v6(src: [u8; 16], dst: [u8; 16]) -> u32 {
    pseudo_sum_v6_len(src, dst, TCP_HEADER_LEN as u16)
}

/// Pseudo-header sum for an IPv6 TCP segment of `tcp_len` bytes.
#[inline(always)]
pub fn pseudo_sum_v6_len(src: [u8; 16], dst: [u8; 16], tcp_len: u16) -> u32 {
    sum_words(&src) + sum_words(&dst) + u32::from(IPPROTO_TCP) + u32::from(tcp_len)
}

/// TCP header of the RST+ACK answering a SYN with sequence number `syn_seq`
/// (host order) sent from `client_port` to `server_port`.
#[inline(always)]
pub fn tcp_rst_ack(server_port: u16, client_port: u16, syn_seq: u32, pseudo_sum: u32) -> [u8; TCP_HEADER_LEN] {
    tcp_reset(server_port, client_port, Reset::to_syn(syn_seq), pseudo_sum)
}

/// What a reset says, by the segment it answers (RFC 9293 §3.10.7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// The receive window: 0 for a reset; an `http` SYN-ACK's own
    /// ([`crate::http::syn_ack`]).
    pub window: u16,
}

impl Reset {
    /// A SYN (no ACK): `SEQ=0, ACK=SEG.SEQ+1, CTL=RST,ACK`.
    #[inline(always)]
    pub const fn to_syn(syn_seq: u32) -> Self {
        Self { seq: 0, ack: syn_seq.wrapping_add(1), flags: FLAGS_RST_ACK, window: 0 }
    }

    /// An ACK: `SEQ=SEG.ACK, CTL=RST`.
    #[inline(always)]
    pub const fn to_ack(ack_seq: u32) -> Self {
        Self { seq: ack_seq, ack: 0, flags: FLAGS_RST, window: 0 }
    }
}

/// TCP header (no options) of `reset` (or an `http` SYN-ACK), from `server_port` to `client_port`.
#[inline(always)]
pub fn tcp_reset(server_port: u16, client_port: u16, reset: Reset, pseudo_sum: u32) -> [u8; TCP_HEADER_LEN] {
    let s = server_port.to_be_bytes();
    let d = client_port.to_be_bytes();
    let q = reset.seq.to_be_bytes();
    let a = reset.ack.to_be_bytes();
    let w = reset.window.to_be_bytes();
    let mut h = [
        s[0],
        s[1],
        d[0],
        d[1],
        q[0],
        q[1],
        q[2],
        q[3],
        a[0],
        a[1],
        a[2],
        a[3],
        0x50,
        reset.flags,
        w[0],
        w[1],
        0,
        0,
        0,
        0,
    ];
    let c = finish(pseudo_sum + sum_words(&h)).to_be_bytes();
    h[16] = c[0];
    h[17] = c[1];
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A checksum over the whole buffer, including the checksum field, verifies to 0.
    fn verifies<const N: usize>(extra: u32, bytes: &[u8; N]) -> bool {
        finish(extra + sum_words(bytes)) == 0
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: words 0001 f203 f4f5 f6f7 sum to 0xddf2 (folded), checksum 0x220d.
        assert_eq!(finish(sum_words(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])), 0x220d);
    }

    /// RFC 1071 written apart from [`sum_words`] and [`finish`]: bytes taken in
    /// pairs into a wide sum, folded for as long as anything carries.
    fn reference_checksum(parts: &[&[u8]]) -> u16 {
        let bytes = parts.concat();
        let mut sum: u64 = bytes.chunks(2).map(|c| u64::from(c[0]) << 8 | u64::from(*c.get(1).unwrap_or(&0))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// Whether a sum still carries after one fold (a single fold gets it wrong).
    fn carries_twice(parts: &[&[u8]]) -> bool {
        let bytes = parts.concat();
        let sum: u64 = bytes.chunks(2).map(|c| u64::from(c[0]) << 8 | u64::from(*c.get(1).unwrap_or(&0))).sum();
        (sum & 0xffff) + (sum >> 16) > 0xffff
    }

    /// Headers chosen by search so that their sums carry twice (about 1 in
    /// 28,000 resets): random inputs almost never reach the second fold.
    #[test]
    fn checksums_that_carry_twice_match_an_independent_rfc1071() {
        let server = [192, 0, 2, 10];
        let mut header_cases = 0;
        for i in 0..=u16::MAX {
            let client = [198, 18, (i >> 8) as u8, i as u8];
            let mut h = ipv4_header(server, client);
            let field = [h[10], h[11]];
            h[10..12].fill(0);
            if carries_twice(&[&h]) {
                header_cases += 1;
                assert_eq!(u16::from_be_bytes(field), reference_checksum(&[&h]), "IPv4 header to {client:?}");
            }
        }
        let (v6_server, v6_client) = ([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0xff; 16]);
        let pseudo_v4 = [&server[..], &[203, 0, 113, 7], &[0, 6, 0, 20]].concat();
        let pseudo_v6 = [&v6_server[..], &v6_client[..], &[0, 0, 0, 20, 0, 0, 0, 6]].concat();
        let mut tcp_cases = [0, 0];
        for seq in (0..u32::MAX / 7919).map(|i| i * 7919) {
            let sums = [pseudo_sum_v4(server, [203, 0, 113, 7]), pseudo_sum_v6(v6_server, v6_client)];
            for (v, (pseudo, sum)) in [&pseudo_v4, &pseudo_v6].into_iter().zip(sums).enumerate() {
                let mut tcp = tcp_rst_ack(8080, 40_000, seq, sum);
                let field = [tcp[16], tcp[17]];
                tcp[16..18].fill(0);
                if carries_twice(&[pseudo, &tcp]) {
                    tcp_cases[v] += 1;
                    assert_eq!(u16::from_be_bytes(field), reference_checksum(&[pseudo, &tcp]), "reset to seq {seq}");
                }
            }
        }
        assert!(header_cases > 0 && tcp_cases[0] > 0 && tcp_cases[1] > 0, "{header_cases} {tcp_cases:?}");
    }

    #[test]
    fn reply_headers_carry_version_lengths_protocol_ttl_and_addresses() {
        let (src, dst) = ([192, 0, 2, 10], [198, 51, 100, 7]);
        let h = ipv4_header(src, dst);
        assert_eq!(h[0], 0x45, "IPv4, five words");
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 40, "total length: 20 of IP, 20 of TCP");
        assert_eq!((h[6], h[8], h[9]), (0x40, REPLY_TTL, 6), "DF, TTL, TCP");
        assert_eq!((&h[12..16], &h[16..20]), (&src[..], &dst[..]));
        assert_eq!(u16::from_be_bytes([ipv4_header_len(src, dst, 300)[2], ipv4_header_len(src, dst, 300)[3]]), 320);

        let (src, dst) = ([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0xfe; 16]);
        let h = ipv6_header(src, dst);
        assert_eq!(h[0], 0x60, "IPv6, traffic class 0");
        assert_eq!(&h[1..4], &[0, 0, 0], "flow label 0");
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 20, "payload length: the TCP header");
        assert_eq!((h[6], h[7]), (6, REPLY_TTL), "next header TCP, hop limit");
        assert_eq!((&h[8..24], &h[24..40]), (&src[..], &dst[..]));
        let h = ipv6_header_len(src, dst, 300);
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 300);
        assert_eq!((&h[8..24], &h[24..40]), (&src[..], &dst[..]));
    }

    proptest! {
        #[test]
        fn ipv4_header_checksum_verifies(src: [u8; 4], dst: [u8; 4]) {
            prop_assert!(verifies(0, &ipv4_header(src, dst)));
        }

        #[test]
        fn tcp_checksum_verifies_v4(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, seq: u32) {
            let tcp = tcp_rst_ack(sp, dp, seq, pseudo_sum_v4(src, dst));
            prop_assert!(verifies(pseudo_sum_v4(src, dst), &tcp));
            prop_assert_eq!(u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]), seq.wrapping_add(1));
        }

        #[test]
        fn reset_to_an_ack_verifies(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, ack: u32) {
            let tcp = tcp_reset(sp, dp, Reset::to_ack(ack), pseudo_sum_v4(src, dst));
            prop_assert!(verifies(pseudo_sum_v4(src, dst), &tcp));
            prop_assert_eq!(u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]), ack);
            prop_assert_eq!(u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]), 0);
            prop_assert_eq!(tcp[13], FLAGS_RST);
        }

        #[test]
        fn tcp_checksum_verifies_v6(src: [u8; 16], dst: [u8; 16], sp: u16, dp: u16, seq: u32) {
            let tcp = tcp_rst_ack(sp, dp, seq, pseudo_sum_v6(src, dst));
            prop_assert!(verifies(pseudo_sum_v6(src, dst), &tcp));
        }
    }
}
