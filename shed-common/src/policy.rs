// SPDX-License-Identifier: MIT OR Apache-2.0
//! What an operator's settings mean to the gate: the limit's bounds, the
//! reject actions, client tiers, what in-flight counts, the RST caps, and
//! the rare paths the kernel may log.

/// The highest concurrency limit an operator may set. Above this the socket
/// map could not hold the admitted work, so the limit would be a lie.
pub const MAX_LIMIT: u32 = 65_536;

/// Default cap on RSTs a port sends per second; forged SYNs must not turn
/// the gate into a reflector.
pub const DEFAULT_RST_PER_SEC: u32 = 20_000;
/// Default cap on RSTs per second to one source prefix (IPv4 /24, IPv6 /48).
pub const DEFAULT_RST_PER_PREFIX_PER_SEC: u32 = 1_000;

/// What the gate does with a SYN it rejects.
pub mod action {
    /// Drop silently: the client retransmits its SYN after its RTO.
    pub const DROP: u8 = 0;
    /// Answer with RST+ACK: the client's connect() fails at once with ECONNREFUSED.
    pub const RST: u8 = 1;
    /// Plaintext HTTP/1.x: the gate completes the handshake itself (a SYN
    /// cookie, nothing reaches the listener) and answers the request with
    /// `503` and `Retry-After`, then FIN (see [`crate::http`]).
    pub const HTTP: u8 = 2;
}

/// Client tiers, assigned server-side from the source address.
pub mod tier {
    /// Always admitted and never counted: health checkers, load-balancer probes.
    pub const EXEMPT: u8 = 0;
    pub const CRITICAL: u8 = 1;
    /// Sources not listed in the tier map.
    pub const NORMAL: u8 = 2;
    /// Shed first.
    pub const LOW: u8 = 3;
    pub const COUNT: usize = 4;
    pub const NAMES: [&str; COUNT] = ["exempt", "critical", "normal", "low"];
    /// Default share of the limit each tier may fill, in permille (exempt: unused).
    pub const DEFAULT_SHARE_PERMILLE: [u16; COUNT] = [1000, 1000, 900, 700];
    /// A tier whose share is full still gets one SYN in this many admitted
    /// while in-flight is below the limit, so it is never starved entirely.
    pub const TRICKLE_EVERY: u64 = 16;
    /// `PortConfig::tier_action` value: use the port's action.
    pub const ACTION_DEFAULT: u8 = 0xff;
}

/// What in-flight counts for a port ([`PortConfig::count_mode`]).
pub mod count_mode {
    /// Work in the service: handshakes under way plus connections that have not
    /// answered their latest request. Idle keep-alive connections do not count.
    pub const WORK: u8 = 0;
    /// Open connections: handshakes under way plus established connections.
    pub const CONNECTIONS: u8 = 1;
    /// Open connections of a multiplexed protocol (HTTP/2, gRPC, pipelined
    /// HTTP/1.1), counted as [`CONNECTIONS`]: one connection carries many
    /// requests at once, so request turns (arrival -> pick-up -> answer) cannot
    /// be told apart. Such a connection is busy for its whole life and feeds
    /// only queue-wait samples: each read's time in the receive queue (from the
    /// first byte landing in an empty queue to the application's read), which
    /// holds whatever the protocol. No service or sojourn samples.
    pub const MULTIPLEXED: u8 = 2;
}

/// Rare paths the kernel programs report through aya-log when the daemon
/// asks (`shedctl attach --kernel-log`), each at most once a second.
pub mod rare {
    /// A connection could not be tracked: the connection map is full.
    pub const CONNECTION_MAP_FULL: u32 = 0;
    /// A capped client could not be counted: the client map is full.
    pub const CLIENT_MAP_FULL: u32 = 1;
    /// A reset could not be written or sent (a helper failed).
    pub const RST_FAILED: u32 = 2;
    /// A packet whose headers could hide a SYN was dropped (tiny or
    /// overlapping fragment, IPv6 chain not parsed).
    pub const UNPARSED_HEADER: u32 = 3;
    pub const COUNT: u32 = 4;
    /// Least time between two log lines of one kind.
    pub const EVERY_NS: u64 = 1_000_000_000;
}
