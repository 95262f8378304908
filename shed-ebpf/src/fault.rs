// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Deliberate faults, for mutation testing of the kernel programs only
//! (`cargo xtask mutants --kernel`): each is a bug the test suite must catch.
//!
//! A build picks at most one through the `SHED_KERNEL_FAULT` environment
//! variable, read at compile time. Every [`fault!`] site is a constant, so a
//! normal build (no variable) folds each to `false` and no faulty code is
//! left in the object. Naming a fault that is not listed here fails the
//! build, as does a `fault!` site whose name is not listed.

/// Every fault: its name and the bug it plants. `cargo xtask mutants --kernel`
/// reads this list from this file (one entry per line).
pub const FAULTS: &[(&str, &str)] = &[
    ("limit_off_by_one", "a SYN at the limit is admitted (> for >=, in the check and the reservation)"),
    ("reservation_not_taken", "an admitted ACK takes no reservation (bursts overshoot)"),
    (
        "reservation_unchecked",
        "a reservation is not checked against the limit once taken (two CPUs racing for the last slot both take it)",
    ),
    (
        "refused_record_sides_swapped",
        "a refused kept-alive request's record names the server's side as the client's (the daemon closes no socket of it)",
    ),
    (
        "refused_request_binds_nothing",
        "a kept-alive request refused at the limit, from a client under its share, leaves the share unbound (the client holding the port keeps it)",
    ),
    (
        "greeting_keeps_silence",
        "a server's greeting (it speaks first) leaves its connection silent: it counts in flight for its whole idle grace though it holds no work",
    ),
    (
        "fin_taken_for_a_request",
        "a client's FIN after its answer is taken for a request (busy again, and abandoned at every close)",
    ),
    (
        "refusal_reason_lost",
        "a refused kept-alive request's record says the limit refused it, whatever did (its retransmission is counted under another reason's books)",
    ),
    ("tier_judged_unverified", "critical and normal SYNs are refused on their unverified source"),
    ("share_ignored", "a tier's share of the limit is not checked"),
    ("trickle_never", "a full tier gets no trickle"),
    ("held_back_ignored", "the room held back for higher tiers is not applied"),
    ("tier_lookup_skipped", "every client is treated as tier normal"),
    ("client_share_ignored", "a client holding its share is not refused while others are"),
    (
        "share_unproven",
        "past the deferral budget a SYN from a client under its share is reset without a cookie (forged SYNs keep the share from binding)",
    ),
    ("client_cap_off_by_one", "a client at its cap gets one more connection"),
    (
        "client_pending_ignored",
        "a client's admissions not yet established do not count against its cap (a deferred-accept listener stacks it past)",
    ),
    (
        "client_pending_not_released",
        "a client's admission stays charged once established (counted twice until it lapses)",
    ),
    ("dry_run_enforced", "dry-run rejects instead of only counting"),
    ("tier_action_ignored", "a tier's own action is ignored for the port's"),
    ("rst_to_own_address", "resets go to this host's own and loopback addresses"),
    ("rst_cap_ignored", "the RST rate caps are not applied"),
    (
        "proxy_answers_capped",
        "the port's largest client (a proxy) is held to its prefix's answer cap: its refusals past it go silent",
    ),
    ("rst_bucket_stuck", "an RST bucket never refills (time does not advance it)"),
    (
        "ack_number_unchecked",
        "an ACK to a request socket is judged whatever its ack number (blind forged ACKs take slots)",
    ),
    (
        "sequence_unchecked",
        "an ACK to a request socket is judged whatever its sequence number (ACKs the kernel drops re-take lapsed reservations)",
    ),
    ("late_ack_unjudged", "handshake-completing ACKs are never judged"),
    (
        "cookie_byte_order",
        "the kernel SYN cookie check reads the ACK's sequence number in the wrong byte order (cookie-completed handshakes pass unjudged)",
    ),
    ("turns_unjudged", "a request on a kept-alive connection is never judged (a pool carries overload past the gate)"),
    (
        "silent_turn_unjudged",
        "a connection's first request after its idle grace is never judged (a pool that connects ahead holds any number)",
    ),
    (
        "turn_counted_late",
        "an admitted request counts only once the kernel queues it (a burst of first requests all see the same free slot)",
    ),
    (
        "refusal_unmarked",
        "a refused request leaves its connection's entry unmarked (its retransmission is judged afresh, not answered alike)",
    ),
    ("stacked_judged_twice", "a segment crossing stacked devices is judged on each"),
    ("ack_needs_local_table", "a handshake-completing ACK is judged only if its address is in the local table"),
    ("not_local_judged", "SYNs to addresses that are not this namespace's are judged"),
    ("tier_counter_shifted", "rejections are counted under the wrong tier"),
    ("duplicate_ack_reserved", "a second handshake-completing segment of an admitted flow takes a second reservation"),
    ("stamp_wrong_key", "the admission stamp is written under another port's slot"),
    ("close_not_counted", "a busy connection's close is not counted as closed"),
    ("idle_counted", "a work connection that has sent nothing counts as busy until answered (idle holds the limit)"),
    ("send_not_counted", "an answer does not end the connection's busy time"),
    (
        "http_cookie_unchecked",
        "an ACK to an http port that finds no socket is answered whatever its cookie (forged ACKs get answers)",
    ),
    (
        "http_time_wait_passed",
        "an ACK that finds an old connection's TIME_WAIT is passed to the kernel, even when it is a client of the http answer (a client reusing its port never gets the 503)",
    ),
    ("http_head_unchecked", "the http answer goes out on the first segment of a request, before its head is complete"),
    ("adjustment_ignored", "the healer's adjustment of a port's count is not applied (drift stays in the limit)"),
    ("silent_not_held", "connections in their idle grace (work mode) do not count in flight"),
    (
        "silence_ended_twice",
        "a connection's first bytes end its silence but leave it marked silent (its answer or close ends it again)",
    ),
    ("client_key_misread", "an IPv6 client is keyed by its /48, not by the port's --client-prefix-v6"),
    ("client_quota_ignored", "a port at its quota of the shared client map adds clients all the same"),
    ("connection_quota_ignored", "a port at its quota of the shared connection map tracks connections all the same"),
    ("client_not_released", "a capped client's closed connection is not released"),
    ("handshake_not_released", "a completed handshake keeps its reservation"),
    ("latency_bucket_shifted", "latency samples land one histogram bucket too high"),
    ("tiny_fragment_judged", "tiny first IPv4 fragments are judged instead of dropped"),
    ("long_chain_passes", "IPv6 chains longer than the parser follows pass unjudged"),
    ("second_vlan_tag_ignored", "a second VLAN tag (QinQ) is not looked through"),
    ("ipv4_options_ignored", "the TCP header is read at 20 bytes past IPv4, options or not"),
    ("syn_fin_judged", "SYN+FIN is judged as a SYN"),
    ("syn_ack_judged", "a SYN+ACK (the ACK flag set) is judged as a SYN"),
    ("overlap_fragment_passes", "IPv4 TCP fragments at offset 8 pass"),
    ("rst_checksum_byte", "the reset's TCP checksum has one wrong byte"),
    ("rst_ack_number", "the reset acknowledges the SYN's sequence number, not one past it"),
    ("rst_macs_kept", "the reset keeps the frame's MAC addresses instead of swapping them"),
    (
        "raw_client_port_unswapped",
        "the raw state program reads the client's port in network order (flows misnamed, handshakes unreleased)",
    ),
    ("dispatch_requests_dropped", "the pods' dispatcher hands over no per-request event (no pod connection is busy)"),
    ("dispatch_close_dropped", "the pods' dispatcher forgets a pod connection's close without handing it over"),
    (
        "dispatch_quota_ignored",
        "the pods' dispatcher follows a gate's connections past its quota (one pod can fill the node-wide table)",
    ),
    (
        "dispatch_close_kept",
        "the pods' dispatcher keeps a closed connection in its node-wide map (it fills, and new connections go uncounted)",
    ),
];

const CHOSEN: &str = match option_env!("SHED_KERNEL_FAULT") {
    Some(name) => name,
    None => "",
};
const _: () = assert!(CHOSEN.is_empty() || known(CHOSEN), "SHED_KERNEL_FAULT names a fault not in fault::FAULTS");

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `name` is one of [`FAULTS`].
pub const fn known(name: &str) -> bool {
    let mut i = 0;
    while i < FAULTS.len() {
        if same(FAULTS[i].0, name) {
            return true;
        }
        i += 1;
    }
    false
}

/// Whether this build plants `name`.
pub const fn planted(name: &str) -> bool {
    same(CHOSEN, name)
}

/// `fault!("name")`: a compile-time `bool`, true only in the build that plants `name`.
macro_rules! fault {
    ($name:literal) => {
        const {
            assert!($crate::fault::known($name), "fault! names a fault not in fault::FAULTS");
            $crate::fault::planted($name)
        }
    };
}
pub(crate) use fault;
