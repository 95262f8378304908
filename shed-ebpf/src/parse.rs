// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Packet parsing: from a frame to the TCP segments the gate judges.
//!
//! The policy (docs/ARCHITECTURE.md, "What is judged"): every TCP segment the
//! kernel could accept as a SYN or as the ACK completing a handshake is found,
//! whatever sits in front of its TCP header: up to two VLAN tags (802.1Q,
//! 802.1ad/QinQ), IPv4 options, an IPv4 first fragment that holds the whole TCP
//! header, an IPv6 extension-header chain of up to [`MAX_IPV6_EXTENSIONS`]
//! headers (hop-by-hop, routing, destination options, fragment, AH, mobility,
//! HIP, shim6). What cannot be parsed but might hide a SYN is dropped and
//! counted ([`Parsed::Refuse`]): a first IPv4 fragment too short for the TCP
//! header (RFC 1858, RFC 3128), an overlapping TCP fragment at offset 8, an
//! IPv6 chain longer than the parser follows. Later fragments pass: the first
//! one carries the flags.
use core::mem::size_of;

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    vlan::VlanHdr,
};
use shed_common::{gate_counter, ipv4_mapped};

use crate::fault::fault;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
/// IPv4 "more fragments" flag, in [`Ipv4Hdr::frag_flags`].
const IPV4_MORE_FRAGMENTS: u8 = 0b001;
/// The IPv6 fragment header's offset field sits above two reserved bits and
/// the M flag (RFC 8200, 4.5); network-types has no type for this header.
const IPV6_FRAGMENT_OFFSET_SHIFT: u32 = 3;
/// VLAN tags the parser looks through (QinQ: an outer 802.1ad and an inner 802.1Q tag).
const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers the parser follows before TCP; a longer chain is refused.
pub const MAX_IPV6_EXTENSIONS: usize = 8;

/// IPv6 next-header values.
mod nexthdr {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AUTH: u8 = 51;
    pub const DEST_OPTS: u8 = 60;
    pub const MOBILITY: u8 = 135;
    pub const HIP: u8 = 139;
    pub const SHIM6: u8 = 140;
}

/// A TCP segment the gate may judge, and where its headers sit in the frame.
pub struct Segment {
    pub l3_offset: usize,
    pub is_ipv6: bool,
    pub client_addr: [u8; 16],
    pub server_addr: [u8; 16],
    pub client_port: u16,
    pub server_port: u16,
    /// Sequence number, host order.
    pub seq: u32,
    /// Acknowledgment number, host order.
    pub ack_seq: u32,
    /// Where the TCP payload starts in the frame (read through [`LoadBytes`]).
    pub payload_at: u16,
    /// Bytes of TCP payload, by the IP header's length (not the frame's:
    /// Ethernet pads short frames).
    pub payload_len: u16,
    /// The segment's FIN and PSH flags ([`FLAG_FIN`], [`FLAG_PSH`]).
    pub flags: u8,
}

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_PSH: u8 = 0x08;

/// What the frame is, as far as the gate is concerned (the segment itself is
/// written to the caller's [`Segment`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not a segment the gate judges: pass.
    Pass,
    /// A SYN (without ACK, RST or FIN): judged by the admission decision.
    Syn,
    /// An ACK without SYN or RST: possibly the one completing a handshake.
    Ack,
    /// Headers that could hide a SYN but cannot be judged: drop, counted under
    /// this [`gate_counter`] index.
    Refuse(u32),
    /// Headers run past the end of the data the program reads directly: pass
    /// (TC makes the headers linear first; XDP sees the whole frame).
    Truncated,
    /// A later fragment: pass, counted under [`gate_counter::LATER_FRAGMENT`].
    LaterFragment,
}

/// Copies bytes out of the packet through the program type's helper
/// (`bpf_xdp_load_bytes`, `bpf_skb_load_bytes`). Used behind IPv6 extension
/// headers: an offset handed to a helper stays imprecise to the verifier, so
/// the paths through a chain of headers of different lengths merge instead of
/// multiplying (with direct packet access each length is a state of its own).
pub trait LoadBytes {
    fn load<const N: usize>(&self, offset: usize) -> Option<[u8; N]>;
    /// The interface the packet is on now (on loopback a reset to a local
    /// address is for a local client there) (a stacked device's upper one
    /// differs from the lower one it crossed first).
    fn ifindex(&self) -> u32;
    /// The program's context, for helpers that take it (the socket lookup).
    fn ctx(&self) -> *mut core::ffi::c_void;
}

/// The loopback interface's index in every namespace.
pub const LOOPBACK_IFINDEX: u32 = 1;

/// An XDP context.
pub struct XdpBytes(pub *mut aya_ebpf::bindings::xdp_md);

impl LoadBytes for XdpBytes {
    #[inline(always)]
    fn load<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let mut buf = [0u8; N];
        // SAFETY: the program's own context; the helper bounds-checks offset and length.
        let r =
            unsafe { aya_ebpf::helpers::bpf_xdp_load_bytes(self.0, offset as u32, buf.as_mut_ptr().cast(), N as u32) };
        (r == 0).then_some(buf)
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the program's own context.
        unsafe { (*self.0).ingress_ifindex }
    }

    #[inline(always)]
    fn ctx(&self) -> *mut core::ffi::c_void {
        self.0.cast()
    }
}

/// A TC (skb) context.
pub struct SkbBytes(pub *mut aya_ebpf::bindings::__sk_buff);

impl LoadBytes for SkbBytes {
    #[inline(always)]
    fn load<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let mut buf = [0u8; N];
        // SAFETY: the program's own context; the helper bounds-checks offset and length.
        let r = unsafe {
            aya_ebpf::helpers::bpf_skb_load_bytes(self.0.cast(), offset as u32, buf.as_mut_ptr().cast(), N as u32)
        };
        (r == 0).then_some(buf)
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the program's own context.
        unsafe { (*self.0).ifindex }
    }

    #[inline(always)]
    fn ctx(&self) -> *mut core::ffi::c_void {
        self.0.cast()
    }
}

/// Bounds-checked pointer to a `T` at `offset` into the frame.
#[inline(always)]
pub fn ptr_at<T>(data: usize, data_end: usize, offset: usize) -> Option<*mut T> {
    if data + offset + size_of::<T>() > data_end {
        return None;
    }
    Some((data + offset) as *mut T)
}

/// Where the TCP header is, once the network layer has been looked through.
/// Small: it lives in the parser's frame, the deepest of the judging path.
struct Network {
    l3_offset: usize,
    /// Where TCP starts.
    tcp_at: usize,
    /// TCP follows the fixed IP header and its options (read directly); false
    /// behind IPv6 extension headers (read through the helper).
    direct: bool,
    /// Behind extension headers: the TCP header, already loaded.
    tcp_head: [u8; TCP_HEADER],
    /// TCP header and payload, by the IP header's length fields.
    tcp_len: u16,
    is_ipv6: bool,
    client_addr: [u8; 16],
    server_addr: [u8; 16],
}

/// Classifies a frame that starts with an Ethernet header; the fields of a SYN
/// or ACK that `wanted(destination port, is SYN)` asks for go to `seg`. A subprogram: inlined, the header walk's stack and the
/// decision's exceed the 512 bytes a call chain may use. It returns a plain
/// value and writes the segment through an out-parameter: a large returned
/// enum is written through memory LLVM may also use as scratch, and the
/// verifier refuses a pointer to the callee's stack stored there.
#[inline(never)]
pub fn parse<B: LoadBytes>(
    data: usize,
    data_end: usize,
    bytes: &B,
    wanted: impl Fn(u16, bool) -> bool,
    seg: &mut core::mem::MaybeUninit<Segment>,
) -> Parsed {
    let Some(eth) = ptr_at::<EthHdr>(data, data_end, 0) else { return Parsed::Pass };
    // SAFETY: bounds checked by ptr_at; headers are byte arrays (alignment 1).
    let mut ether_type = u16::from_be(unsafe { (*eth).ether_type });
    let mut l3_offset = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS - usize::from(fault!("second_vlan_tag_ignored")) {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let Some(vlan) = ptr_at::<VlanHdr>(data, data_end, l3_offset) else { return Parsed::Truncated };
        // SAFETY: bounds checked by ptr_at.
        ether_type = u16::from_be(unsafe { (*vlan).ether_type });
        l3_offset += VlanHdr::LEN;
    }
    let network = match ether_type {
        ETH_P_IP => ipv4(data, data_end, l3_offset),
        ETH_P_IPV6 => ipv6(data, data_end, l3_offset, bytes),
        // A third VLAN tag, ARP, MPLS, ...: the kernel does not deliver these to a TCP listener.
        _ => return Parsed::Pass,
    };
    let network = match network {
        Ok(n) => n,
        Err(other) => return other,
    };
    // The fixed TCP header must be there whole, as the kernel requires.
    let head: TcpHdr = if network.direct {
        let Some(tcp) = ptr_at::<TcpHdr>(data, data_end, network.tcp_at) else { return Parsed::Truncated };
        // SAFETY: bounds checked by ptr_at.
        unsafe { *tcp }
    } else {
        tcp_header(network.tcp_head)
    };
    if head.doff() < 5 || head.rst() != 0 {
        return Parsed::Pass;
    }
    let kind = match (head.syn() != 0, head.ack() != 0) {
        // SYN+FIN: a Linux listener discards it, so it holds nothing.
        (true, false) if head.fin() == 0 || fault!("syn_fin_judged") => Parsed::Syn,
        (true, true) if fault!("syn_ack_judged") => Parsed::Syn,
        (false, true) => Parsed::Ack,
        _ => return Parsed::Pass,
    };
    // Whether the gate judges this segment at all (by destination port): most
    // traffic ends here, before the segment is copied out.
    if !wanted(u16::from_be_bytes(head.dest), kind == Parsed::Syn) {
        return Parsed::Pass;
    }
    let header_len = usize::from(head.doff()) * 4;
    seg.write(Segment {
        payload_at: (network.tcp_at + header_len) as u16,
        payload_len: usize::from(network.tcp_len).saturating_sub(header_len) as u16,
        flags: u8::from(head.fin() != 0) * FLAG_FIN | u8::from(head.psh() != 0) * FLAG_PSH,
        l3_offset: network.l3_offset,
        is_ipv6: network.is_ipv6,
        client_addr: network.client_addr,
        server_addr: network.server_addr,
        client_port: u16::from_be_bytes(head.source),
        server_port: u16::from_be_bytes(head.dest),
        seq: u32::from_be_bytes(head.seq),
        ack_seq: u32::from_be_bytes(head.ack_seq),
    });
    kind
}

/// The fixed TCP header, as bytes copied out through the helper.
const TCP_HEADER: usize = TcpHdr::LEN;

/// The TCP header in `bytes`, read through network-types' accessors.
#[inline(always)]
fn tcp_header(bytes: [u8; TCP_HEADER]) -> TcpHdr {
    // SAFETY: TcpHdr is repr(C), 20 bytes of byte arrays and a byte bitfield:
    // every bit pattern is a valid value.
    unsafe { core::mem::transmute::<[u8; TCP_HEADER], TcpHdr>(bytes) }
}

#[inline(always)]
fn ipv4(data: usize, data_end: usize, l3_offset: usize) -> Result<Network, Parsed> {
    let Some(ip) = ptr_at::<Ipv4Hdr>(data, data_end, l3_offset) else { return Err(Parsed::Truncated) };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    let header_len = usize::from(ip.ihl());
    if ip.version() != 4 || header_len < Ipv4Hdr::LEN || ip.proto != IPPROTO_TCP {
        return Err(Parsed::Pass);
    }
    let offset = ip.frag_offset();
    if offset == 1 && !fault!("overlap_fragment_passes") {
        // RFC 1858: a TCP fragment at offset 8 can only serve to overwrite the flags.
        return Err(Parsed::Refuse(gate_counter::OVERLAP_FRAGMENT as u32));
    }
    if offset != 0 {
        return Err(Parsed::LaterFragment);
    }
    if ip.frag_flags() & IPV4_MORE_FRAGMENTS != 0 && !fault!("tiny_fragment_judged") {
        // A first fragment is judged only if it holds the whole basic TCP header.
        let l4_len = usize::from(ip.tot_len()).saturating_sub(header_len);
        if l4_len < TcpHdr::LEN {
            return Err(Parsed::Refuse(gate_counter::TINY_FRAGMENT as u32));
        }
    }
    let l4_offset = l3_offset + if fault!("ipv4_options_ignored") { Ipv4Hdr::LEN } else { header_len };
    Ok(Network {
        l3_offset,
        tcp_at: l4_offset,
        direct: true,
        tcp_len: ip.tot_len().saturating_sub(header_len as u16),
        tcp_head: [0; TCP_HEADER],
        is_ipv6: false,
        client_addr: ipv4_mapped(ip.src_addr),
        server_addr: ipv4_mapped(ip.dst_addr),
    })
}

#[inline(always)]
fn ipv6<B: LoadBytes>(data: usize, data_end: usize, l3_offset: usize, bytes: &B) -> Result<Network, Parsed> {
    let Some(ip) = ptr_at::<Ipv6Hdr>(data, data_end, l3_offset) else { return Err(Parsed::Truncated) };
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &*ip };
    if ip.version() != 6 {
        return Err(Parsed::Pass);
    }
    let payload_end = l3_offset + Ipv6Hdr::LEN + usize::from(ip.payload_len());
    let network = |direct: bool, tcp_at: usize, tcp_head| Network {
        l3_offset,
        tcp_at,
        direct,
        tcp_len: payload_end.saturating_sub(tcp_at) as u16,
        tcp_head,
        is_ipv6: true,
        client_addr: ip.src_addr,
        server_addr: ip.dst_addr,
    };
    let mut next = ip.next_hdr;
    if next == IPPROTO_TCP {
        return Ok(network(true, l3_offset + Ipv6Hdr::LEN, [0; TCP_HEADER]));
    }
    // Behind extension headers everything is read through the helper (see `LoadBytes`).
    let mut offset = l3_offset + Ipv6Hdr::LEN;
    let mut first_fragment = false;
    for _ in 0..MAX_IPV6_EXTENSIONS {
        if next == IPPROTO_TCP {
            break;
        }
        // Every extension header starts with (next header, length).
        let Some(ext) = bytes.load::<8>(offset) else { return Err(Parsed::Pass) };
        let len = match next {
            nexthdr::HOP_BY_HOP
            | nexthdr::ROUTING
            | nexthdr::DEST_OPTS
            | nexthdr::MOBILITY
            | nexthdr::HIP
            | nexthdr::SHIM6 => (usize::from(ext[1]) + 1) * 8,
            nexthdr::AUTH => (usize::from(ext[1]) + 2) * 4,
            nexthdr::FRAGMENT => {
                if u16::from_be_bytes([ext[2], ext[3]]) >> IPV6_FRAGMENT_OFFSET_SHIFT != 0 {
                    return Err(Parsed::LaterFragment);
                }
                first_fragment = true;
                8
            }
            // ESP, no next header, or another upper layer: not TCP we can see.
            _ => return Err(Parsed::Pass),
        };
        next = ext[0];
        offset += len;
    }
    if next != IPPROTO_TCP {
        // Still inside the chain: TCP may follow, and a SYN must not hide behind headers.
        return Err(match next {
            nexthdr::HOP_BY_HOP
            | nexthdr::ROUTING
            | nexthdr::DEST_OPTS
            | nexthdr::MOBILITY
            | nexthdr::HIP
            | nexthdr::SHIM6
            | nexthdr::AUTH
            | nexthdr::FRAGMENT
                if !fault!("long_chain_passes") =>
            {
                Parsed::Refuse(gate_counter::IPV6_CHAIN_UNPARSED as u32)
            }
            _ => Parsed::Pass,
        });
    }
    // RFC 7112: the first fragment must hold the upper-layer header.
    if first_fragment && payload_end < offset + TcpHdr::LEN {
        return Err(Parsed::Refuse(gate_counter::TINY_FRAGMENT as u32));
    }
    match bytes.load::<TCP_HEADER>(offset) {
        Some(head) => Ok(network(false, offset, head)),
        None => Err(Parsed::Pass),
    }
}
