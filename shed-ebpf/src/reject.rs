//! Turns a rejected SYN into its RST+ACK reply, in place.
use shed_common::rst::{
    IPV4_HEADER_LEN, IPV6_HEADER_LEN, TCP_HEADER_LEN, ipv4_header, ipv6_header, pseudo_sum_v4, pseudo_sum_v6,
    tcp_rst_ack,
};

use crate::parse::{Syn, ptr_at};

/// Rewrites the frame into the reply: MACs swapped, a fresh IP header without
/// options, a TCP header without options. Returns the reply's length; the
/// caller trims the frame to it. The VLAN tag, if any, is kept.
#[inline(always)]
pub fn write_rst(data: usize, data_end: usize, syn: &Syn) -> Result<usize, ()> {
    let macs: *mut [u8; 12] = ptr_at(data, data_end, 0).ok_or(())?;
    // SAFETY: bounds checked by ptr_at; frames are byte arrays (alignment 1).
    unsafe {
        let m = *macs;
        *macs = [m[6], m[7], m[8], m[9], m[10], m[11], m[0], m[1], m[2], m[3], m[4], m[5]];
    }

    let l3 = syn.l3_offset;
    let l4 = if syn.is_ipv6 {
        let ip: *mut [u8; IPV6_HEADER_LEN] = ptr_at(data, data_end, l3).ok_or(())?;
        unsafe { *ip = ipv6_header(syn.server_addr, syn.client_addr) };
        l3 + IPV6_HEADER_LEN
    } else {
        let ip: *mut [u8; IPV4_HEADER_LEN] = ptr_at(data, data_end, l3).ok_or(())?;
        let server = v4(&syn.server_addr);
        let client = v4(&syn.client_addr);
        unsafe { *ip = ipv4_header(server, client) };
        l3 + IPV4_HEADER_LEN
    };
    let pseudo = if syn.is_ipv6 {
        pseudo_sum_v6(syn.server_addr, syn.client_addr)
    } else {
        pseudo_sum_v4(v4(&syn.server_addr), v4(&syn.client_addr))
    };
    let tcp: *mut [u8; TCP_HEADER_LEN] = ptr_at(data, data_end, l4).ok_or(())?;
    unsafe { *tcp = tcp_rst_ack(syn.server_port, syn.client_port, syn.seq, pseudo) };
    Ok(l4 + TCP_HEADER_LEN)
}

/// The IPv4 address inside an IPv4-mapped IPv6 address.
#[inline(always)]
fn v4(mapped: &[u8; 16]) -> [u8; 4] {
    [mapped[12], mapped[13], mapped[14], mapped[15]]
}
