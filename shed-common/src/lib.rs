// SPDX-License-Identifier: MIT OR Apache-2.0
//! Types shared by shed's kernel programs and its userspace.
//!
//! Everything that crosses the kernel/userspace boundary is defined here once:
//! map and program names, the layout of every map key and value, and the pure
//! functions that build the TCP RST reply (so the kernel and the tests' model
//! agree on one definition of "the bytes we send").
//!
//! Byte order, decided once:
//! - ports are **host order** everywhere in maps (the socket tracepoint reports
//!   them that way; the packet path converts once);
//! - addresses are **network order** byte arrays, IPv4 stored as IPv4-mapped
//!   IPv6 (`::ffff:a.b.c.d`), which is what the socket tracepoint reports.
#![no_std]
#[cfg(test)]
extern crate std;

mod accounting;
mod counters;
pub mod dispatch;
pub mod handshake;
pub mod http;
pub mod latency;
mod layout;
mod names;
mod policy;
pub mod port_table;
pub mod ratelimit;
pub mod rst;
mod tracepoint;

pub use accounting::{busy, established, held, in_flight};
pub use counters::{counter, gate_counter};

pub use handshake::{HandshakeCell, HandshakeRing, HandshakeStamp};
pub use layout::*;
pub use names::{capacity, map, program};
pub use policy::{DEFAULT_RST_PER_PREFIX_PER_SEC, DEFAULT_RST_PER_SEC, MAX_LIMIT, action, count_mode, rare, tier};
pub use rst::rst_prefix;
pub use tracepoint::{
    COPIED_SEQ_OFFSET_GLOBAL, SK_STATE_OFFSET_GLOBAL, SOCK_LAYOUT_GLOBAL, SockLayout, address_family, only_a_fin,
    sock_state_tp, tcp_state,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_clamps_inconsistent_reads() {
        let user = |e, b| UserPortState { established_adjust: e, busy_adjust: b, ..UserPortState::default() };
        let state = PortState { opened: 3, closed: 5, busy_enter: 1, busy_exit: 2, ..PortState::default() };
        assert_eq!(in_flight(&state, 0, 0, &user(0, 0), count_mode::CONNECTIONS), 0);
        assert_eq!(in_flight(&state, 0, 0, &user(0, 0), count_mode::WORK), 0);
        let state = PortState { opened: 10, closed: 4, busy_enter: 7, busy_exit: 5, ..PortState::default() };
        assert_eq!(
            in_flight(&state, 4, 3, &user(0, 0), count_mode::CONNECTIONS),
            6 + 4,
            "silent connections are established ones"
        );
        assert_eq!(in_flight(&state, 4, 3, &user(0, 0), count_mode::WORK), 2 + 3 + 4, "silent ones count in work mode");
        // Drift healing adjusts both ways, never below zero.
        assert_eq!(established(&state, &user(-2, 0)), 4);
        assert_eq!(established(&state, &user(3, 0)), 9);
        assert_eq!(established(&state, &user(-100, 0)), 0);
        assert_eq!(busy(&state, &user(0, -1)), 1);
    }

    #[test]
    fn a_client_share_is_a_part_of_the_limit_never_all_of_it() {
        let config =
            |share| PortConfig { client_share: share, ..PortConfig::new(0, action::RST, false, count_mode::WORK) };
        assert_eq!(config(50).share_cap(10), Some(5));
        assert_eq!(config(50).share_cap(3), Some(1));
        assert_eq!(config(50).share_cap(2), Some(1));
        assert_eq!(config(50).share_cap(1), None, "a limit of 1 has no part to give");
        assert_eq!(config(1).share_cap(1000), Some(10));
        assert_eq!(config(1).share_cap(10), Some(1), "at least one connection");
        assert_eq!(config(100).share_cap(10), None);
        assert_eq!(config(0).share_cap(10), None);
        assert!(!config(0).counts_clients() && config(50).counts_clients());
        assert_eq!(PortConfig::new(0, action::RST, false, count_mode::WORK).client_share, DEFAULT_CLIENT_SHARE);
    }

    #[test]
    fn a_port_quota_bounds_what_it_holds_of_the_shared_maps() {
        let state = PortState { opened: 110, closed: 10, clients_added: 40, ..PortState::default() };
        let user = |quota, adjust, forgotten| UserPortState {
            connection_quota: quota,
            client_quota: quota,
            established_adjust: adjust,
            clients_forgotten: forgotten,
            ..UserPortState::default()
        };
        assert!(user(0, 0, 0).connection_room(&state) && user(0, 0, 0).client_room(&state), "no quota");
        assert!(!user(100, 0, 0).connection_room(&state), "100 tracked of 100");
        assert!(user(101, 0, 0).connection_room(&state));
        assert!(user(100, -1, 0).connection_room(&state), "the healer took one back");
        assert!(!user(40, 0, 0).client_room(&state), "40 clients of 40");
        assert!(user(40, 0, 1).client_room(&state), "one forgotten");
        // A forgotten count ahead of the kernel's (a reset slot read mid-way) is room, not a wrap.
        assert!(user(40, 0, 100).client_room(&state));
        assert_eq!(map_quota(262_144, 1), 0, "a port alone may fill the map");
        assert_eq!(map_quota(262_144, 0), 0);
        assert_eq!(map_quota(262_144, 2), 131_072);
        assert_eq!(map_quota(1_024, 3), 341);
    }

    #[test]
    fn handshake_shift_is_clamped() {
        let shift = |s| UserPortState { handshake_shift: s, ..UserPortState::default() }.shift();
        assert_eq!(shift(0), handshake::DEFAULT_SHIFT);
        assert_eq!(shift(1), handshake::MIN_SHIFT);
        assert_eq!(shift(20), 20);
        assert_eq!(shift(63), handshake::MAX_SHIFT);
        assert_eq!(rst_prefix(&ipv4_mapped([10, 1, 2, 3])), ipv4_mapped([10, 1, 2, 0]));
    }

    #[test]
    fn client_keys() {
        let mut config = PortConfig::new(3, action::DROP, false, count_mode::WORK);
        let v4 = ipv4_mapped([10, 1, 2, 3]);
        assert_eq!(config.client_key(&v4), ClientKey { slot: 3, addr: v4 }, "IPv4 clients are whole addresses");
        let v6: [u8; 16] = core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 3, 4, 5, 6).octets();
        let per_64 = core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, 0).octets();
        assert_eq!(config.client_key(&v6).addr, per_64);
        config.client_prefix_v6 = 52;
        assert_eq!(config.client_key(&v6).addr, core::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0).octets());
        config.client_prefix_v6 = 128;
        assert_eq!(config.client_key(&v6).addr, v6);
    }

    #[test]
    fn ipv4_mapped_matches_std() {
        let v4 = core::net::Ipv4Addr::new(10, 1, 2, 3);
        assert_eq!(ipv4_mapped(v4.octets()), v4.to_ipv6_mapped().octets());
    }
}
