// SPDX-License-Identifier: MIT OR Apache-2.0
//! The per-port and gate-wide counters, by index.

/// Indices into [`PortCounters::values`].
pub mod counter {
    /// SYNs (without ACK) addressed to this host for the port.
    pub const SYN_SEEN: usize = 0;
    /// Connections admitted: handshake-completing ACKs that took a slot (the
    /// source answered our SYN-ACK). Each holds a reservation until the kernel
    /// reports the connection established, microseconds later.
    pub const ADMITTED: usize = 1;
    /// Refused (SYNs or handshake-completing ACKs) because in-flight had reached the limit.
    pub const REJECTED_LIMIT: usize = 2;
    /// RST+ACK replies sent for rejected SYNs.
    pub const RST_SENT: usize = 3;
    /// Dry-run: SYNs that enforce mode would have rejected (they were admitted).
    pub const DRY_RUN_WOULD_REJECT: usize = 4;
    /// Handshakes that completed after their reservation lapsed (or whose stamp
    /// was overwritten): counted from their completion on.
    pub const LATE_COMPLETED: usize = 5;
    /// Handshake-completing ACKs refused (the port filled between the client's
    /// SYN and its ACK, or a critical client found it full): the client saw its
    /// `connect()` succeed and then a reset, or its ACK dropped. Also counted
    /// by reason.
    pub const REFUSED_AT_ACK: usize = 6;
    /// Rejected SYNs for which the RST could not be built (dropped instead).
    pub const RST_FAILED: usize = 7;
    /// SYNs rejected because in-flight had reached their tier's share of the limit.
    pub const REJECTED_SHARE: usize = 8;
    /// SYNs from exempt clients (admitted, never counted).
    pub const EXEMPT: usize = 9;
    /// SYNs admitted past a full tier share by the anti-starvation trickle.
    pub const TRICKLE: usize = 10;
    /// SYNs rejected because their client already held its cap.
    pub const REJECTED_CLIENT_CAP: usize = 11;
    /// Admitted SYNs by tier: `ADMITTED_BY_TIER + tier`.
    pub const ADMITTED_BY_TIER: usize = 12;
    /// Rejected SYNs (all reasons) by tier: `REJECTED_BY_TIER + tier`.
    pub const REJECTED_BY_TIER: usize = 16;
    /// Rejected SYNs dropped instead of answered because an RST cap was reached.
    pub const RST_RATE_LIMITED: usize = 20;
    /// SYNs to the port that were not addressed to this namespace (forwarded or
    /// leaving local containers): passed untouched.
    pub const NOT_LOCAL: usize = 21;
    /// Rejected SYNs not answered because the source cannot be a real client
    /// (multicast, broadcast, unspecified, or this host's own or loopback address
    /// arriving from outside): dropped.
    pub const RST_SUPPRESSED: usize = 22;
    /// Established connections not counted against their client's cap because
    /// the client map was full (fail-open).
    pub const CLIENT_MAP_FULL: usize = 23;
    /// SYNs passed to the kernel unjudged-for-now (the port had room): they
    /// hold nothing; their ACK is judged.
    pub const SYN_PASSED: usize = 24;
    /// Established connections not counted at all because the connection map was
    /// full (fail-open: they hold no place under the limit; the healer adopts them
    /// when room frees).
    pub const CONNECTION_MAP_FULL: usize = 25;
    /// Handshake-completing ACKs refused, by tier: `VERIFIED_REJECTED_BY_TIER +
    /// tier`. Refusals of sources that proved real: the tier hold-back's input.
    pub const VERIFIED_REJECTED_BY_TIER: usize = 26;
    /// Handshake-completing ACKs refused because their client held its share
    /// of the limit while clients holding less were being refused.
    pub const REJECTED_CLIENT_SHARE: usize = 30;
    /// `http` refusals: SYNs answered by the gate with a SYN-ACK carrying a
    /// cookie (the refusal itself is counted by reason, as for any action).
    pub const HTTP_SYN_ACK: usize = 31;
    /// `http` refusals: requests answered with `503` and Retry-After (a
    /// retransmitted request is answered, and counted, again).
    pub const HTTP_ANSWERED: usize = 32;
    /// `http` refusals: segments on a cookie handshake that were not an
    /// HTTP/1.x request (TLS, HTTP/2's preface, a FIN before any request): reset.
    pub const HTTP_NOT_HTTP: usize = 33;
    /// ACKs to an `http` port that found no socket and carried no cookie of
    /// ours (nor the kernel's): passed to the kernel, which resets them.
    pub const HTTP_BAD_COOKIE: usize = 34;
    /// Requests refused on kept-alive connections: the first segment of a
    /// connection's next request met a full port (limit, share, client cap or
    /// share: also counted by reason, and by tier). The service never read it.
    pub const REFUSED_REQUEST: usize = 35;
    /// Requests on kept-alive connections judged at their first segment and admitted.
    pub const REQUEST_ADMITTED: usize = 36;
    /// A refused request's first segment again (a retransmission): the same
    /// answer, counted here rather than as a new refusal.
    pub const REQUEST_REFUSED_AGAIN: usize = 37;
    /// Requests abandoned: their connection closed (the client reset it, or it
    /// was destroyed) while the request owed an answer. A client that closes
    /// its side (FIN) and still gets its late answer is not counted here: the
    /// answer is a sample like any other.
    pub const ABANDONED: usize = 38;
    /// The abandoned requests' ages summed, arrival to close, microseconds: a
    /// lower bound on the latency each would have had.
    pub const ABANDONED_AGE_US: usize = 39;
    /// Number of counter slots; spare slots are reserved for later reasons.
    pub const COUNT: usize = 64;
}

/// Indices into [`GateCounters::values`]: packets the gate judged before it
/// could tie them to a port.
pub mod gate_counter {
    /// First IPv4 fragments of TCP too short to hold the TCP header (RFC 1858,
    /// RFC 3128): dropped.
    pub const TINY_FRAGMENT: usize = 0;
    /// IPv4 TCP fragments at offset 8 bytes (RFC 1858 overlap attack): dropped.
    pub const OVERLAP_FRAGMENT: usize = 1;
    /// IPv6 packets whose extension-header chain was longer than the gate
    /// parses or malformed: dropped (a SYN could hide behind them).
    pub const IPV6_CHAIN_UNPARSED: usize = 2;
    /// Later fragments (IPv4 or IPv6): passed, the first fragment carries the TCP header.
    pub const LATER_FRAGMENT: usize = 3;
    /// ACKs on the 4-tuple of a handshake under way that do not acknowledge
    /// its SYN-ACK (blind forged, or stale): passed unjudged, holding nothing
    /// (the kernel itself drops or resets them).
    pub const UNPROVEN_ACK: usize = 4;
    pub const COUNT: usize = 8;
}
