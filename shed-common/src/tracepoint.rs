// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the socket tracepoints report: TCP states and the layout of
//! `sock:inet_sock_set_state`'s record.

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
