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
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

#[derive(Clone, Debug)]
pub struct Spec {
    /// An outer 802.1ad (QinQ) tag, before `vlan`.
    pub outer_vlan: Option<u16>,
    pub vlan: Option<u16>,
    pub v6: bool,
    /// IPv4 options, bytes (multiple of 4, at most 40).
    pub ip_options: usize,
    /// IPv6 extension headers before TCP, by next-header value, 8 bytes each
    /// (AH: 12). A fragment header (44) carries `v6_fragment`.
    pub v6_chain: Vec<u8>,
    /// The fragment header's offset-and-flags field (offset in 8-byte units << 3, M flag 1).
    pub v6_fragment: u16,
    /// IPv4 total length / IPv6 payload length as sent, if not the real one (tiny first fragments).
    pub ip_length: Option<u16>,
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
    pub flags: u8,
    /// TCP options, bytes (multiple of 4).
    pub tcp_options: usize,
    /// TCP data offset override (words), for malformed headers.
    pub doff: Option<u8>,
    pub client_v4: [u8; 4],
    pub client_v6: [u8; 16],
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            outer_vlan: None,
            vlan: None,
            v6: false,
            ip_options: 0,
            v6_chain: Vec::new(),
            v6_fragment: 0x0001,
            ip_length: None,
            server_v4: SERVER_V4,
            server_v6: SERVER_V6,
            protocol: 6,
            frag: 0x4000,
            client_port: 40_000,
            server_port: 8080,
            seq: 0x1234_5678,
            flags: SYN,
            tcp_options: 20,
            doff: None,
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
    if let Some(vid) = s.outer_vlan {
        f.extend_from_slice(&[0x88, 0xa8]);
        f.extend_from_slice(&vid.to_be_bytes());
    }
    if let Some(vid) = s.vlan {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&vid.to_be_bytes());
    }
    let tcp_len = 20 + s.tcp_options;
    if s.v6 {
        f.extend_from_slice(&[0x86, 0xdd]);
        let mut chain = Vec::new();
        for (i, &kind) in s.v6_chain.iter().enumerate() {
            let next = s.v6_chain.get(i + 1).copied().unwrap_or(s.protocol);
            match kind {
                // Fragment: next header, reserved, offset and flags, identification.
                44 => {
                    chain.extend_from_slice(&[next, 0]);
                    chain.extend_from_slice(&s.v6_fragment.to_be_bytes());
                    chain.extend_from_slice(&[0, 0, 0x12, 0x34]);
                }
                // AH: length in 4-byte units minus 2 (12 bytes: 1).
                51 => chain.extend_from_slice(&[next, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
                // Options headers: length 0 (8 bytes), PadN.
                _ => chain.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]),
            }
        }
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        let payload = s.ip_length.unwrap_or((tcp_len + chain.len()) as u16);
        f.extend_from_slice(&payload.to_be_bytes());
        f.push(s.v6_chain.first().copied().unwrap_or(s.protocol));
        f.push(64);
        f.extend_from_slice(&s.client_v6);
        f.extend_from_slice(&s.server_v6);
        f.extend_from_slice(&chain);
    } else {
        f.extend_from_slice(&[0x08, 0x00]);
        let ihl = (20 + s.ip_options) / 4;
        f.push(0x40 | ihl as u8);
        f.push(0);
        f.extend_from_slice(&s.ip_length.unwrap_or((20 + s.ip_options + tcp_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0xab, 0xcd]);
        f.extend_from_slice(&s.frag.to_be_bytes());
        f.push(64);
        f.push(s.protocol);
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&s.client_v4);
        f.extend_from_slice(&s.server_v4);
        // NOPs then EOL: valid options of the requested length.
        for i in 0..s.ip_options {
            f.push(if i + 1 == s.ip_options { 0 } else { 1 });
        }
    }
    f.extend_from_slice(&s.client_port.to_be_bytes());
    f.extend_from_slice(&s.server_port.to_be_bytes());
    f.extend_from_slice(&s.seq.to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    let doff = s.doff.unwrap_or((tcp_len / 4) as u8);
    f.push(doff << 4);
    f.push(s.flags);
    f.extend_from_slice(&64_240u16.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    // MSS option then NOPs.
    for i in 0..s.tcp_options {
        f.push(match i {
            0 => 2,
            1 => 4,
            2 => 0x05,
            3 => 0xb4,
            _ => 1,
        });
    }
    f
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
