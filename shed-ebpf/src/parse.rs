//! Packet parsing: from a frame to the one thing the gate cares about, a SYN.
use core::mem::size_of;

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    vlan::VlanHdr,
};
use shed_common::ipv4_mapped;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
/// IPv4 "more fragments" flag and fragment offset bits.
const IPV4_FRAG_MASK: u16 = 0x3fff;

/// A SYN (without ACK or RST) and where its headers sit in the frame.
pub struct Syn {
    pub l3_offset: usize,
    pub is_ipv6: bool,
    pub client_addr: [u8; 16],
    pub server_addr: [u8; 16],
    pub client_port: u16,
    pub server_port: u16,
    /// Sequence number, host order.
    pub seq: u32,
}

/// Bounds-checked pointer to a `T` at `offset` into the frame.
#[inline(always)]
pub fn ptr_at<T>(data: usize, data_end: usize, offset: usize) -> Option<*mut T> {
    if data + offset + size_of::<T>() > data_end {
        return None;
    }
    Some((data + offset) as *mut T)
}

/// Returns the SYN in the frame, or `None` for everything else (other
/// protocols, other TCP segments, truncated or malformed headers).
#[inline(always)]
pub fn parse_syn(data: usize, data_end: usize) -> Option<Syn> {
    let eth: *const EthHdr = ptr_at(data, data_end, 0)?;
    let mut ether_type = u16::from_be(unsafe { (*eth).ether_type });
    let mut l3_offset = EthHdr::LEN;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let vlan: *const VlanHdr = ptr_at(data, data_end, l3_offset)?;
        ether_type = u16::from_be(unsafe { (*vlan).ether_type });
        l3_offset += VlanHdr::LEN;
    }

    let (l4_offset, is_ipv6, client_addr, server_addr) = match ether_type {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = ptr_at(data, data_end, l3_offset)?;
            let ip = unsafe { &*ip };
            let header_len = usize::from(ip.vihl & 0x0f) * 4;
            if ip.vihl >> 4 != 4 || header_len < Ipv4Hdr::LEN || ip.proto != IPPROTO_TCP {
                return None;
            }
            // A fragment is never a whole SYN we could judge.
            if u16::from_be_bytes(ip.frags) & IPV4_FRAG_MASK != 0 {
                return None;
            }
            (l3_offset + header_len, false, ipv4_mapped(ip.src_addr), ipv4_mapped(ip.dst_addr))
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = ptr_at(data, data_end, l3_offset)?;
            let ip = unsafe { &*ip };
            // Extension headers before TCP: pass untouched.
            if ip.vcf[0] >> 4 != 6 || ip.next_hdr != IPPROTO_TCP {
                return None;
            }
            (l3_offset + Ipv6Hdr::LEN, true, ip.src_addr, ip.dst_addr)
        }
        _ => return None,
    };

    let tcp: *const TcpHdr = ptr_at(data, data_end, l4_offset)?;
    let tcp = unsafe { &*tcp };
    if tcp.doff() < 5 || tcp.syn() == 0 || tcp.ack() != 0 || tcp.rst() != 0 {
        return None;
    }
    Some(Syn {
        l3_offset,
        is_ipv6,
        client_addr,
        server_addr,
        client_port: u16::from_be_bytes(tcp.source),
        server_port: u16::from_be_bytes(tcp.dest),
        seq: u32::from_be_bytes(tcp.seq),
    })
}
