// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the socket tracepoints report: TCP states, the layout of
//! `sock:inet_sock_set_state`'s record, and where the raw tracepoint's
//! program finds the same fields in the socket itself.

/// TCP states as the `sock:inet_sock_set_state` tracepoint reports them.
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_RECV: i32 = 3;
    pub const CLOSE: i32 = 7;
}

/// Field offsets of `sock:inet_sock_set_state` (see its `format` file in tracefs).
/// Userspace checks them against the running kernel before attaching.
pub mod sock_state_tp {
    pub const SKADDR: usize = 8;
    pub const OLDSTATE: usize = 16;
    pub const NEWSTATE: usize = 20;
    pub const SPORT: usize = 24;
    pub const DPORT: usize = 26;
    pub const PROTOCOL: usize = 30;
    pub const SADDR_V6: usize = 40;
    pub const DADDR_V6: usize = 56;
}

/// The names of the globals that hold the byte offsets of `skc_state` in the
/// running kernel's `struct sock_common` and of `copied_seq` in its
/// `struct tcp_sock` (0 when they could not be found: a client's FIN is then
/// taken for a request's bytes, as any `sk_data_ready` is).
pub const SK_STATE_OFFSET_GLOBAL: &str = "SHED_SK_STATE_OFFSET";
pub const COPIED_SEQ_OFFSET_GLOBAL: &str = "SHED_COPIED_SEQ_OFFSET";

/// Whether an `sk_data_ready` brought only the client's FIN: the socket left
/// ESTABLISHED (`tcp_fin` moves it before waking readers) and it holds
/// nothing unread but the FIN's one sequence number (`rcv_nxt` counts it;
/// `copied_seq` is what the application read). Bytes that came with the FIN
/// are a request still: a client may send its last request and close at once.
#[inline(always)]
pub const fn only_a_fin(state: u8, rcv_nxt: u32, copied_seq: u32) -> bool {
    state as i32 != tcp_state::ESTABLISHED && rcv_nxt.wrapping_sub(copied_seq) <= 1
}

/// The name of the kernel object's global that holds a [`SockLayout`].
pub const SOCK_LAYOUT_GLOBAL: &str = "SHED_SOCK_LAYOUT";

/// Byte offsets in `struct sock` of the fields `sock:inet_sock_set_state`'s
/// record copies, on the running kernel (from its BTF). The raw tracepoint's
/// program gets only the socket, so it reads them there; a raw tracepoint
/// takes any number of programs, a regular one at most 64 (the kernel's
/// `BPF_TRACE_MAX_PROGS`), and a node agent loads one per gated pod.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockLayout {
    /// `skc_family` (u16).
    pub family: u32,
    /// `sk_protocol` (u16); 0: the layout is unknown and the raw program counts nothing.
    pub protocol: u32,
    /// `skc_num`: the local port in host order (u16).
    pub local_port: u32,
    /// `skc_dport`: the remote port in network order (u16).
    pub remote_port: u32,
    /// `skc_rcv_saddr` and `skc_daddr` (IPv4, network order).
    pub local_v4: u32,
    pub remote_v4: u32,
    /// `skc_v6_rcv_saddr` and `skc_v6_daddr`.
    pub local_v6: u32,
    pub remote_v6: u32,
}
const _: () = assert!(size_of::<SockLayout>() == 32);

impl SockLayout {
    /// Whether userspace found the layout: all of it or none (`skc_daddr` is
    /// at 0, `sk_protocol` never is).
    pub const fn known(&self) -> bool {
        self.protocol != 0
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), plain integers, no padding (the size assert above).
unsafe impl aya::Pod for SockLayout {}

/// The address families of `skc_family`.
pub mod address_family {
    pub const INET: u16 = 2;
    pub const INET6: u16 = 10;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fin_alone_is_no_request_but_bytes_with_it_are() {
        const CLOSE_WAIT: u8 = 8;
        // Everything read, then the FIN: rcv_nxt is one past what was read.
        assert!(only_a_fin(CLOSE_WAIT, 1_001, 1_000));
        assert!(only_a_fin(CLOSE_WAIT, 0, u32::MAX), "across the sequence space's wrap");
        // A last request sent with the FIN (or before it, unread): bytes to read.
        assert!(!only_a_fin(CLOSE_WAIT, 1_002, 1_000));
        assert!(!only_a_fin(CLOSE_WAIT, 1, u32::MAX));
        // A one-byte request on an open connection is a request.
        assert!(!only_a_fin(tcp_state::ESTABLISHED as u8, 1_001, 1_000));
    }

    #[test]
    fn a_layout_is_known_by_its_protocol_offset() {
        assert!(!SockLayout::default().known());
        // skc_daddr is the first field of sock_common: a 0 offset is a real one.
        let layout = SockLayout { protocol: 514, remote_v4: 0, local_v4: 4, ..SockLayout::default() };
        assert!(layout.known());
    }
}
