// SPDX-License-Identifier: MIT OR Apache-2.0
//! Frames for BPF_PROG_TEST_RUN, built byte by byte (independently of the
//! kernel code), and an independent Internet checksum to verify replies.
#![allow(dead_code, reason = "each test binary uses a different part")]

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const CLIENT_V4: [u8; 4] = [192, 0, 2, 2];
pub const SERVER_V4: [u8; 4] = [192, 0, 2, 1];
pub const CLIENT_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
pub const SERVER_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

pub const FIN: u8 = 0x01;
pub const PSH: u8 = 0x08;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

#[derive(Clone, Debug)]
pub struct Spec {
    /// An outer 802.1ad (QinQ) tag, before `vlan`.
    pub outer_vlan: Option<u16>,
    pub vlan: Option<u16>,
    /// A third tag (802.1Q) after `vlan`: more than the gate looks through.
    pub extra_vlan: Option<u16>,
    /// The Ethernet type as sent, if not IPv4's or IPv6's (ARP, anything); the
    /// layers after it are built as `v6` says.
    pub ether_type: Option<u16>,
    pub v6: bool,
    /// The IP version nibble as sent, if not the real one.
    pub ip_version: Option<u8>,
    /// The IPv4 IHL field as sent (words), if not the real header length.
    pub ihl: Option<u8>,
    /// IPv4 options, bytes (multiple of 4, at most 40).
    pub ip_options: usize,
    /// IPv6 extension headers before TCP, by next-header value. A fragment
    /// header (44) is 8 bytes and carries `v6_fragment`.
    pub v6_chain: Vec<u8>,
    /// The length field of each header of `v6_chain`, in order: an options
    /// header is (length + 1) x 8 bytes, AH (length + 2) x 4. Missing: 0, and
    /// 1 for AH (8 and 12 bytes).
    pub v6_lengths: Vec<u8>,
    /// The fragment header's offset-and-flags field (offset in 8-byte units << 3, M flag 1).
    pub v6_fragment: u16,
    /// IPv4 total length / IPv6 payload length as sent shortened by this many
    /// bytes (tiny first fragments).
    pub ip_short_by: u16,
    /// The destination address, if not the server's (forwarded traffic).
    pub server_v4: [u8; 4],
    pub server_v6: [u8; 16],
    /// IP protocol (6 for TCP).
    pub protocol: u8,
    /// IPv4 flags+fragment offset field.
    pub frag: u16,
    pub client_port: u16,
    pub server_port: u16,
    pub seq: u32,
    /// The acknowledgment number (0 unless set: a SYN carries none).
    pub ack: u32,
    pub flags: u8,
    /// TCP options, bytes (multiple of 4).
    pub tcp_options: usize,
    /// TCP data offset override (words), for malformed headers.
    pub doff: Option<u8>,
    /// Bytes after the TCP header.
    pub payload: Vec<u8>,
    /// Cut the finished frame to this many bytes.
    pub cut: Option<usize>,
    pub client_v4: [u8; 4],
    pub client_v6: [u8; 16],
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            outer_vlan: None,
            vlan: None,
            extra_vlan: None,
            ether_type: None,
            v6: false,
            ip_version: None,
            ihl: None,
            ip_options: 0,
            v6_chain: Vec::new(),
            v6_lengths: Vec::new(),
            v6_fragment: 0x0001,
            ip_short_by: 0,
            server_v4: SERVER_V4,
            server_v6: SERVER_V6,
            protocol: 6,
            frag: 0x4000,
            client_port: 40_000,
            server_port: 8080,
            seq: 0x1234_5678,
            ack: 0,
            flags: SYN,
            tcp_options: 20,
            doff: None,
            payload: Vec::new(),
            cut: None,
            client_v4: CLIENT_V4,
            client_v6: CLIENT_V6,
        }
    }
}

impl Spec {
    pub fn v6() -> Self {
        Self { v6: true, ..Self::default() }
    }
}

/// Builds the frame. Input checksums are left zero: the gate does not verify them.
pub fn frame(s: &Spec) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&SERVER_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    for (tpid, tag) in [(0x88a8u16, s.outer_vlan), (0x8100, s.vlan), (0x8100, s.extra_vlan)] {
        if let Some(vid) = tag {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
    }
    let ether_type = s.ether_type.unwrap_or(if s.v6 { 0x86dd } else { 0x0800 });
    f.extend_from_slice(&ether_type.to_be_bytes());
    let tcp = tcp_header(s);
    let after_ip = tcp.len() + s.payload.len();
    if s.v6 {
        let chain = v6_chain(s);
        f.push(s.ip_version.unwrap_or(6) << 4);
        f.extend_from_slice(&[0, 0, 0]);
        let payload = (chain.len() + after_ip).saturating_sub(usize::from(s.ip_short_by));
        f.extend_from_slice(&(payload as u16).to_be_bytes());
        f.push(s.v6_chain.first().copied().unwrap_or(s.protocol));
        f.push(64);
        f.extend_from_slice(&s.client_v6);
        f.extend_from_slice(&s.server_v6);
        f.extend_from_slice(&chain);
    } else {
        let header = 20 + s.ip_options;
        let ihl = s.ihl.unwrap_or((header / 4) as u8) & 0x0f;
        f.push(s.ip_version.unwrap_or(4) << 4 | ihl);
        f.push(0);
        let total = (header + after_ip).saturating_sub(usize::from(s.ip_short_by));
        f.extend_from_slice(&(total as u16).to_be_bytes());
        f.extend_from_slice(&[0xab, 0xcd]);
        f.extend_from_slice(&s.frag.to_be_bytes());
        f.push(64);
        f.push(s.protocol);
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&s.client_v4);
        f.extend_from_slice(&s.server_v4);
        // NOPs then EOL: valid options of the requested length.
        for i in 0..s.ip_options {
            f.push(u8::from(i + 1 != s.ip_options));
        }
    }
    f.extend_from_slice(&tcp);
    f.extend_from_slice(&s.payload);
    if let Some(cut) = s.cut {
        f.truncate(cut);
    }
    f
}

/// The IPv6 extension headers of `s`, each naming the next (the last names `s.protocol`).
fn v6_chain(s: &Spec) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, &kind) in s.v6_chain.iter().enumerate() {
        let next = s.v6_chain.get(i + 1).copied().unwrap_or(s.protocol);
        let length = s.v6_lengths.get(i).copied();
        let start = chain.len();
        match kind {
            // Fragment: next header, reserved, offset and flags, identification.
            44 => {
                chain.extend_from_slice(&[next, 0]);
                chain.extend_from_slice(&s.v6_fragment.to_be_bytes());
                chain.extend_from_slice(&[0, 0, 0x12, 0x34]);
            }
            // AH: (length + 2) x 4 bytes; reserved, then SPI 1, then zeros.
            51 => {
                let length = length.unwrap_or(1);
                chain.extend_from_slice(&[next, length, 0, 0, 0, 0, 0, 1]);
                chain.resize(start + (usize::from(length) + 2) * 4, 0);
            }
            // Options headers and the rest: (length + 1) x 8 bytes, one PadN filling them.
            _ => {
                let length = length.unwrap_or(0);
                let size = (usize::from(length) + 1) * 8;
                chain.extend_from_slice(&[next, length, 1, (size - 4) as u8]);
                chain.resize(start + size, 0);
            }
        }
    }
    chain
}

/// The TCP header: 20 bytes, then `tcp_options` bytes (an MSS option, then NOPs).
fn tcp_header(s: &Spec) -> Vec<u8> {
    let length = 20 + s.tcp_options;
    let mut h = Vec::with_capacity(length);
    h.extend_from_slice(&s.client_port.to_be_bytes());
    h.extend_from_slice(&s.server_port.to_be_bytes());
    h.extend_from_slice(&s.seq.to_be_bytes());
    h.extend_from_slice(&s.ack.to_be_bytes());
    h.push(s.doff.unwrap_or((length / 4) as u8) << 4);
    h.push(s.flags);
    h.extend_from_slice(&64_240u16.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]);
    for i in 0..s.tcp_options {
        h.push(match i {
            0 => 2,
            1 => 4,
            2 => 0x05,
            3 => 0xb4,
            _ => 1,
        });
    }
    h
}

/// RFC 1071 checksum over a byte string (odd length padded), written without
/// reference to the kernel code's implementation.
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.concat();
    let mut sum: u64 = bytes.chunks(2).map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A segment the server side sends back to the client of `to` (the frame it
/// answers): what a test expects the gate to send, built here apart from
/// the kernel's code (the RFC's fields, [`internet_checksum`]).
pub struct Reply<'a> {
    pub to: &'a Spec,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub payload: &'a [u8],
}

/// The frame of `r`: MACs swapped, the client's VLAN tag kept, IPv4 (DF, TTL
/// 64, id 0, no options) or IPv6 (hop limit 64), TCP without options.
pub fn reply_frame(r: &Reply<'_>) -> Vec<u8> {
    let s = r.to;
    let mut f = Vec::new();
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&SERVER_MAC);
    if let Some(vid) = s.vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    let tcp_len = 20 + r.payload.len();
    let mut tcp = Vec::with_capacity(tcp_len);
    tcp.extend_from_slice(&s.server_port.to_be_bytes());
    tcp.extend_from_slice(&s.client_port.to_be_bytes());
    tcp.extend_from_slice(&r.seq.to_be_bytes());
    tcp.extend_from_slice(&r.ack.to_be_bytes());
    tcp.push(5 << 4);
    tcp.push(r.flags);
    tcp.extend_from_slice(&r.window.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    tcp.extend_from_slice(r.payload);
    let pseudo: Vec<u8> = if s.v6 {
        f.extend_from_slice(&0x86ddu16.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&s.server_v6);
        f.extend_from_slice(&s.client_v6);
        [&s.server_v6[..], &s.client_v6[..], &(tcp_len as u32).to_be_bytes()[..], &[0, 0, 0, 6]].concat()
    } else {
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&s.server_v4);
        ip.extend_from_slice(&s.client_v4);
        let c = internet_checksum(&[&ip]).to_be_bytes();
        ip[10..12].copy_from_slice(&c);
        f.extend_from_slice(&ip);
        [&s.server_v4[..], &s.client_v4[..], &[0, 6], &(tcp_len as u16).to_be_bytes()[..]].concat()
    };
    let c = internet_checksum(&[&pseudo, &tcp]).to_be_bytes();
    tcp[16..18].copy_from_slice(&c);
    f.extend_from_slice(&tcp);
    f
}
