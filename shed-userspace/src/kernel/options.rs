// SPDX-License-Identifier: MIT OR Apache-2.0
//! What an operator chooses for the kernel side of a port, as the maps hold
//! it: the reject action, the hook, what in-flight counts, how XDP runs, and
//! client networks (CIDRs) for tiers. Parsing them from text is the CLI's.
use std::fmt;

use shed_common::{action, ipv4_mapped, tier};

use crate::named::Named;

/// What a rejected SYN gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Drop,
    Rst,
    Http,
}

impl Action {
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::Drop => action::DROP,
            Self::Rst => action::RST,
            Self::Http => action::HTTP,
        }
    }

    /// Decodes a map value; unknown values read as `drop`, which is what the kernel does with them.
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            action::RST => Self::Rst,
            action::HTTP => Self::Http,
            _ => Self::Drop,
        }
    }
}

impl Named for Action {
    const ALL: &'static [Self] = &[Self::Drop, Self::Rst, Self::Http];
    fn name(self) -> &'static str {
        match self {
            Self::Drop => "drop",
            Self::Rst => "rst",
            Self::Http => "http",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Self::Drop => {
                "Drop silently: a refused SYN or handshake-completing ACK, or a kept-alive request's segment, is retransmitted by the client after its RTO and judged again"
            }
            Self::Rst => {
                "Answer with a reset: a refused new connection's connect() fails at once (ECONNREFUSED), a refused kept-alive request's connection is reset (ECONNRESET)"
            }
            Self::Http => {
                "Plaintext HTTP/1.x only: the gate completes the handshake itself (a SYN cookie) and answers \
                 the request with 503 and Retry-After, then closes; clients back off as told"
            }
        }
    }
}

/// Where the gate hooks into the receive path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hook {
    Xdp,
    Tc,
}

impl Named for Hook {
    const ALL: &'static [Self] = &[Self::Xdp, Self::Tc];
    fn name(self) -> &'static str {
        match self {
            Self::Xdp => "xdp",
            Self::Tc => "tc",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Self::Xdp => "XDP: before the kernel allocates an skb (native where the driver supports it)",
            Self::Tc => "TC clsact ingress (tcx): works on every interface, loopback included",
        }
    }
}

/// What a port's in-flight counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Count {
    Work,
    Connections,
    Multiplexed,
}

impl Count {
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::Work => shed_common::count_mode::WORK,
            Self::Connections => shed_common::count_mode::CONNECTIONS,
            Self::Multiplexed => shed_common::count_mode::MULTIPLEXED,
        }
    }

    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            shed_common::count_mode::CONNECTIONS => Self::Connections,
            shed_common::count_mode::MULTIPLEXED => Self::Multiplexed,
            _ => Self::Work,
        }
    }
}

impl Named for Count {
    const ALL: &'static [Self] = &[Self::Work, Self::Connections, Self::Multiplexed];
    fn name(self) -> &'static str {
        match self {
            Self::Work => "work",
            Self::Connections => "connections",
            Self::Multiplexed => "multiplexed",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Self::Work => {
                "Work in the service: admissions not yet established plus connections owing an answer (idle keep-alive ones do not count)"
            }
            Self::Connections => "Open connections, for protocols whose request turns cannot be seen",
            Self::Multiplexed => {
                "Open connections of a multiplexed protocol (HTTP/2, gRPC): busy while open, queue-wait samples only (needs --algo queue or fixed)"
            }
        }
    }
}

/// How XDP runs on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpAttachMode {
    Auto,
    Native,
    Generic,
}

impl Named for XdpAttachMode {
    const ALL: &'static [Self] = &[Self::Auto, Self::Native, Self::Generic];
    fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Self::Auto => "Native where the driver supports it, generic elsewhere (the kernel decides)",
            Self::Native => "In the driver, before any skb exists; fails where the driver lacks XDP",
            Self::Generic => "In the stack after the skb is built: works on every interface, loopback included",
        }
    }
}

macro_rules! display_by_name {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    )*};
}
display_by_name!(Action, Hook, Count, XdpAttachMode);

/// A client network as the LPM trie stores it: IPv4 as IPv4-mapped IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// Prefix length over the 128-bit (mapped) address.
    pub prefix_len: u32,
    pub addr: [u8; 16],
}

impl Cidr {
    pub fn is_v4(&self) -> bool {
        self.prefix_len >= 96 && self.addr[..12] == ipv4_mapped([0; 4])[..12]
    }

    /// Whether every address of it is a loopback one (in 127.0.0.0/8, or ::1).
    pub fn within_loopback(&self) -> bool {
        let v6_loopback = std::net::Ipv6Addr::LOCALHOST.octets();
        (self.is_v4() && self.prefix_len >= 104 && self.addr[12] == 127)
            || (self.prefix_len == 128 && self.addr == v6_loopback)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_v4() {
            let a = &self.addr;
            write!(f, "{}.{}.{}.{}/{}", a[12], a[13], a[14], a[15], self.prefix_len - 96)
        } else {
            write!(f, "{}/{}", std::net::Ipv6Addr::from(self.addr), self.prefix_len)
        }
    }
}

/// A tier's name (`normal` for a value out of range).
pub(crate) fn tier_name(t: u8) -> &'static str {
    tier::NAMES.get(t as usize).copied().unwrap_or("normal")
}
