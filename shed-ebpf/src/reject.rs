// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Turns a rejected segment into its reset reply, in place.
use shed_common::rst::{
    IPV4_HEADER_LEN, IPV6_HEADER_LEN, Reset, TCP_HEADER_LEN, ipv4_header, ipv6_header, pseudo_sum_v4, pseudo_sum_v6,
    tcp_reset,
};

use crate::{
    fault::fault,
    parse::{Segment, ptr_at},
};

/// Rewrites the frame into the reply: MACs swapped, a fresh IP header without
/// options or extension headers, a TCP header without options. Returns the
/// reply's length; the caller trims the frame to it. VLAN tags are kept.
/// A subprogram: the header arrays it builds need stack of their own.
#[inline(never)]
pub fn write_rst(data: usize, data_end: usize, seg: &Segment, reset: Reset) -> Result<usize, ()> {
    let macs: *mut [u8; 12] = ptr_at(data, data_end, 0).ok_or(())?;
    // SAFETY: bounds checked by ptr_at; frames are byte arrays (alignment 1).
    if !fault!("rst_macs_kept") {
        // SAFETY: as above.
        unsafe {
            let m = *macs;
            *macs = [m[6], m[7], m[8], m[9], m[10], m[11], m[0], m[1], m[2], m[3], m[4], m[5]];
        }
    }

    // The verifier does not carry the offset's bounds through the caller's stack: restate them.
    let l3 = seg.l3_offset;
    if l3 > MAX_L3_OFFSET {
        return Err(());
    }
    let l4 = if seg.is_ipv6 {
        let ip: *mut [u8; IPV6_HEADER_LEN] = ptr_at(data, data_end, l3).ok_or(())?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { *ip = ipv6_header(seg.server_addr, seg.client_addr) };
        l3 + IPV6_HEADER_LEN
    } else {
        let ip: *mut [u8; IPV4_HEADER_LEN] = ptr_at(data, data_end, l3).ok_or(())?;
        // SAFETY: bounds checked by ptr_at.
        unsafe { *ip = ipv4_header(v4(&seg.server_addr), v4(&seg.client_addr)) };
        l3 + IPV4_HEADER_LEN
    };
    let pseudo = if seg.is_ipv6 {
        pseudo_sum_v6(seg.server_addr, seg.client_addr)
    } else {
        pseudo_sum_v4(v4(&seg.server_addr), v4(&seg.client_addr))
    };
    let tcp: *mut [u8; TCP_HEADER_LEN] = ptr_at(data, data_end, l4).ok_or(())?;
    // SAFETY: bounds checked by ptr_at.
    unsafe { *tcp = tcp_reset(seg.server_port, seg.client_port, reset, pseudo) };
    if fault!("rst_checksum_byte") {
        // SAFETY: bounds checked by ptr_at.
        unsafe { (*tcp)[17] ^= 1 };
    }
    Ok(l4 + TCP_HEADER_LEN)
}

/// Ethernet plus two VLAN tags: the furthest the IP header can start.
const MAX_L3_OFFSET: usize = 14 + 8;

/// The IPv4 address inside an IPv4-mapped IPv6 address.
#[inline(always)]
fn v4(mapped: &[u8; 16]) -> [u8; 4] {
    [mapped[12], mapped[13], mapped[14], mapped[15]]
}
