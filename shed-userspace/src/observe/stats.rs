// SPDX-License-Identifier: MIT OR Apache-2.0
//! What `shedctl stats` reports, computed from map snapshots. The JSON form
//! (serde on these structs) is a stable interface for scripts.
use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;
use shed_common::{counter, tier};

use crate::{
    control::{Algo, Reason},
    kernel::maps::{PortSnapshot, REJECTIONS},
    kernel::options::{Action, Count},
};

/// Rejections by reason (each also counted in `rejected`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct RejectedByReason {
    /// In-flight had reached the limit.
    pub limit: u64,
    /// In-flight had reached the client tier's share of the limit.
    pub share: u64,
    /// The client already held its cap.
    pub client_cap: u64,
    /// The client held its share of the limit while clients holding less were refused.
    pub client_share: u64,
}

/// A client and what it holds against the cap.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ClientStats {
    /// Address, or IPv6 prefix.
    pub client: String,
    pub in_flight: i64,
}

/// One client tier of a port.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct TierStats {
    pub admitted: u64,
    pub rejected: u64,
    /// Share of the limit the tier may fill (exempt: always admitted; every
    /// share is 1 while no client tier is configured).
    pub share: f64,
    /// `drop` or `rst`.
    pub action: Action,
    /// Slots held back from this tier while a tier above it is being rejected.
    pub held_back: u16,
}

/// Who judges a port: the running daemon's gate, or a stopped agent's left for the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum GateState {
    #[default]
    Gated,
    HandingOver,
}

/// One protected port.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PortStats {
    pub port: u16,
    /// The network namespace the port is gated in (see [`crate::host::paths::netns_label`]).
    pub netns: String,
    /// The pod it serves (`namespace/name`), for a pod's gate (`attach --pods`); null otherwise.
    pub pod: Option<String>,
    /// `gated` (the running daemon's gate judges it), or `handing_over` (a
    /// stopped node agent left its programs judging the pod for the next
    /// agent, which has not taken it over yet: the counts are theirs).
    pub state: GateState,
    pub limit: u32,
    /// What the limit applies to: handshakes under way (`pending`) plus busy
    /// connections (`work`) or plus established ones (`connections`).
    pub in_flight: u64,
    pub count: Count,
    /// Open (established) connections.
    pub established: u64,
    /// Connections owing an answer.
    pub busy: u64,
    /// Handshakes admitted and not yet established, within the handshake window.
    pub pending: u64,
    /// `work` connections accepted within the idle grace that have sent
    /// nothing yet (they count in flight until the grace ends).
    pub silent: u64,
    /// How long an admitted handshake-completing ACK holds its reservation at
    /// most (the handshake window): about 8 ms, or `--handshake-window`.
    pub handshake_window_us: u64,
    /// Measured handshake time (admitted ACK to established), recent windows.
    pub handshake_p50_us: u64,
    pub handshake_p99_us: u64,
    /// How long a `work` connection that sends nothing counts in flight (at least; ms).
    pub idle_grace_ms: u64,
    /// Most connections and client entries the port may hold of the gate's
    /// shared maps (0: no bound, a port alone); past them, `connection_map_full`
    /// and `client_map_full` count for this port only.
    pub connection_quota: u32,
    pub client_quota: u32,
    pub algo: Algo,
    pub min_limit: u32,
    pub max_limit: u32,
    /// `--window`, milliseconds.
    pub window: u32,
    /// The sojourn percentile the controller follows.
    pub percentile: u8,
    /// Guards: see `shedctl attach --help`.
    pub min_samples: u32,
    pub cooldown: u32,
    pub baseline_span: u32,
    pub probe_windows: u32,
    /// `--queue-target`, milliseconds.
    pub queue_target: f64,
    /// The operator's latency objective (`--target-latency`), milliseconds; null: none.
    pub target_latency: Option<u32>,
    /// Latency the controller treats as "no queue".
    pub baseline_us: u64,
    /// The followed percentile in the last window.
    pub observed_us: u64,
    pub queue_wait_p50_us: u64,
    pub queue_wait_p99_us: u64,
    pub service_p50_us: u64,
    pub service_p99_us: u64,
    pub sojourn_p50_us: u64,
    pub sojourn_p99_us: u64,
    /// Requests completed in the last window.
    pub samples_per_window: u64,
    /// Listen-queue drops in the last window counted against this port (the
    /// namespace's, while this port's accept queue was at least half full).
    pub listen_drops_per_window: u64,
    /// Connections waiting in the port's accept queues at the last window's end, and their capacity.
    pub accept_queue: u32,
    pub accept_backlog: u32,
    /// Listen-queue drops counted against this port since the gate started.
    pub listen_drops: u64,
    /// Why the controller set the limit it set last window (null before the first window).
    pub last_decision: Option<Reason>,
    pub previous_limit: u32,
    /// Connections admitted at their handshake-completing ACK (cumulative).
    pub admitted: u64,
    /// SYNs, handshake-completing ACKs and kept-alive requests refused, all reasons (cumulative).
    pub rejected: u64,
    pub rejected_by_reason: RejectedByReason,
    /// Per client tier: exempt, critical, normal, low.
    pub tiers: BTreeMap<&'static str, TierStats>,
    /// Connections and requests a full tier share would have refused, admitted by the anti-starvation trickle.
    pub trickle_admitted: u64,
    /// Most connections one client may hold (0: no cap).
    pub client_cap: u32,
    /// Percent of the limit one client may hold while others are refused (0: none).
    pub client_share: u8,
    /// IPv6 clients are capped per prefix of this length.
    pub client_prefix_v6: u8,
    /// Seconds the `http` action's 503 tells clients to wait (Retry-After):
    /// the port's own (`--retry-after`), else the controller's, from its
    /// queue wait; 1 to 999.
    pub retry_after: u32,
    /// With a cap: the clients holding the most, at most 10.
    pub top_clients: Vec<ClientStats>,
    pub action: Action,
    pub dry_run: bool,
    /// Dry-run only: SYNs enforce mode would have rejected (they were admitted).
    pub would_reject: u64,
    pub syn_seen: u64,
    /// SYNs to the port not addressed to this namespace (forwarded, or leaving
    /// local containers): passed untouched.
    pub not_local: u64,
    /// Handshakes that completed after their reservation lapsed (counted all the same).
    pub late_completed: u64,
    /// SYNs passed to the kernel holding nothing (their ACK is judged).
    pub syn_passed: u64,
    /// Refusals at the handshake-completing ACK (also counted by reason): the
    /// client's `connect()` had succeeded.
    pub refused_at_ack: u64,
    /// Requests refused on kept-alive connections at their first segment (also
    /// counted by reason): the service never read them.
    pub refused_requests: u64,
    /// Requests on kept-alive connections judged at their first segment and admitted.
    pub requests_admitted: u64,
    /// Retransmissions of a refused request's first segment, given the same answer.
    pub refused_requests_again: u64,
    /// Requests abandoned: their connection closed (reset by the client, or
    /// destroyed) while they owed an answer. The controller counts them as
    /// work the service held, at their age.
    pub abandoned: u64,
    pub rst_sent: u64,
    pub rst_failed: u64,
    /// Rejected SYNs dropped instead of answered because an RST cap was reached.
    pub rst_rate_limited: u64,
    /// The RST caps, per second (0: none).
    pub rst_rate: u32,
    pub rst_prefix_rate: u32,
    /// Resets withheld because the source cannot be a real client (multicast,
    /// broadcast, unspecified, or this host's own address from outside).
    pub rst_suppressed: u64,
    /// `http` refusals: SYN-ACKs carrying a cookie sent to refused SYNs.
    pub http_syn_acks: u64,
    /// `http` refusals: requests answered with 503 and Retry-After.
    pub http_answers: u64,
    /// `http` refusals: segments on a cookie handshake that were not HTTP/1.x (reset).
    pub http_not_http: u64,
    /// ACKs to an `http` port without a socket whose cookie did not check (the kernel resets them).
    pub http_bad_cookies: u64,
    /// Connections not counted against their client's cap because the client map was full.
    pub client_map_full: u64,
    /// Connections not counted at all because the connection map was full
    /// (fail-open; `--max-connections` sets its size).
    pub connection_map_full: u64,
    /// Handshake reservations (taken at the ACK) that lapsed without the
    /// kernel establishing the connection (it dropped the ACK: a full accept
    /// queue, a bad checksum), cumulative.
    pub handshakes_lapsed: u64,
    /// `work` connections that sent nothing for the whole idle grace and
    /// stopped counting in flight (idle clients, or server-first protocols
    /// whose server greets late), cumulative.
    pub idle_expired: u64,
    /// Connections the daemon corrected against the kernel's socket table (missed events).
    pub drift_corrected: u64,
    /// Requests the daemon closed, cumulative: a client over its share of a
    /// contended port had its server sit on them unanswered for a second.
    pub stalled_closed: u64,
    /// Sockets of requests refused on kept-alive connections that the daemon
    /// closed, cumulative (`rst` and `http`; a `drop` refusal's is left to its client).
    pub refused_closed: u64,
    /// Rates over the sampling interval; null when only one sample was taken.
    pub syn_per_sec: Option<f64>,
    pub admitted_per_sec: Option<f64>,
    pub rejected_per_sec: Option<f64>,
}

impl PortStats {
    /// Stats of `now`, with rates against `before` taken `elapsed` earlier.
    pub(crate) fn new(now: &PortSnapshot, before: Option<(&PortSnapshot, Duration)>) -> Self {
        let rate = |index: usize| {
            before.and_then(|(b, elapsed)| {
                let secs = elapsed.as_secs_f64();
                (secs > 0.0 && b.config.slot == now.config.slot)
                    .then(|| now.counter(index).saturating_sub(b.counter(index)) as f64 / secs)
            })
        };
        Self {
            port: now.port,
            netns: crate::host::paths::OWN_NETNS_LABEL.to_owned(),
            pod: None,
            state: GateState::Gated,
            limit: now.limit,
            in_flight: now.in_flight(),
            count: Count::from_raw(now.config.count_mode),
            established: now.established(),
            busy: now.busy(),
            pending: now.pending(),
            silent: now.silent(),
            handshake_window_us: now.handshake_window_us(),
            handshake_p50_us: now.status.handshake_p50_us,
            handshake_p99_us: now.status.handshake_p99_us,
            idle_grace_ms: now.idle_grace_ms(),
            connection_quota: now.user.connection_quota,
            client_quota: now.user.client_quota,
            algo: Algo::from_raw(now.control.algo),
            min_limit: now.control.min_limit,
            max_limit: now.control.max_limit,
            window: now.control.window_ms,
            percentile: now.control.percentile,
            min_samples: now.control.min_samples,
            cooldown: now.control.cooldown_windows,
            baseline_span: now.control.baseline_windows,
            probe_windows: now.control.probe_windows,
            queue_target: f64::from(now.control.queue_target_us) / 1000.0,
            target_latency: (now.control.target_latency_ms != 0).then_some(now.control.target_latency_ms),
            baseline_us: now.status.baseline_us,
            observed_us: now.status.observed_us,
            queue_wait_p50_us: now.status.queue_wait_p50_us,
            queue_wait_p99_us: now.status.queue_wait_p99_us,
            service_p50_us: now.status.service_p50_us,
            service_p99_us: now.status.service_p99_us,
            sojourn_p50_us: now.status.sojourn_p50_us,
            sojourn_p99_us: now.status.sojourn_p99_us,
            samples_per_window: now.status.samples,
            listen_drops_per_window: now.status.listen_drops,
            accept_queue: now.status.accept_queue,
            accept_backlog: now.status.accept_backlog,
            listen_drops: now.status.listen_drops_total,
            last_decision: (now.status.windows > 0).then(|| Reason::from_raw(now.status.reason)),
            previous_limit: now.status.previous_limit,
            admitted: now.counter(counter::ADMITTED),
            rejected: now.rejected(),
            rejected_by_reason: RejectedByReason {
                limit: now.counter(counter::REJECTED_LIMIT),
                share: now.counter(counter::REJECTED_SHARE),
                client_cap: now.counter(counter::REJECTED_CLIENT_CAP),
                client_share: now.counter(counter::REJECTED_CLIENT_SHARE),
            },
            client_cap: now.config.client_cap,
            client_share: now.config.client_share,
            client_prefix_v6: now.config.client_prefix_v6,
            retry_after: shed_common::http::retry_after_seconds(now.config.retry_after_s, now.user.retry_after_s),
            top_clients: Vec::new(),
            tiers: (0..tier::COUNT)
                .map(|t| {
                    (
                        tier::NAMES[t],
                        TierStats {
                            admitted: now.counter(counter::ADMITTED_BY_TIER + t),
                            rejected: now.counter(counter::REJECTED_BY_TIER + t),
                            share: if now.config.tiered == 0 {
                                1.0
                            } else {
                                f64::from(now.config.share_permille[t]) / 1000.0
                            },
                            action: Action::from_raw(now.config.action_for(t as u8)),
                            held_back: now.reserve.held_back[t],
                        },
                    )
                })
                .collect(),
            trickle_admitted: now.counter(counter::TRICKLE),
            action: Action::from_raw(now.config.action),
            dry_run: now.config.dry_run != 0,
            would_reject: now.counter(counter::DRY_RUN_WOULD_REJECT),
            syn_seen: now.counter(counter::SYN_SEEN),
            not_local: now.counter(counter::NOT_LOCAL),
            late_completed: now.counter(counter::LATE_COMPLETED),
            syn_passed: now.counter(counter::SYN_PASSED),
            refused_at_ack: now.counter(counter::REFUSED_AT_ACK),
            refused_requests: now.counter(counter::REFUSED_REQUEST),
            requests_admitted: now.counter(counter::REQUEST_ADMITTED),
            refused_requests_again: now.counter(counter::REQUEST_REFUSED_AGAIN),
            abandoned: now.counter(counter::ABANDONED),
            rst_sent: now.counter(counter::RST_SENT),
            rst_failed: now.counter(counter::RST_FAILED),
            rst_rate_limited: now.counter(counter::RST_RATE_LIMITED),
            rst_rate: now.config.rst_per_sec,
            rst_prefix_rate: now.config.rst_per_prefix_per_sec,
            rst_suppressed: now.counter(counter::RST_SUPPRESSED),
            http_syn_acks: now.counter(counter::HTTP_SYN_ACK),
            http_answers: now.counter(counter::HTTP_ANSWERED),
            http_not_http: now.counter(counter::HTTP_NOT_HTTP),
            http_bad_cookies: now.counter(counter::HTTP_BAD_COOKIE),
            client_map_full: now.counter(counter::CLIENT_MAP_FULL),
            connection_map_full: now.counter(counter::CONNECTION_MAP_FULL),
            handshakes_lapsed: now.handshakes_lapsed(),
            idle_expired: now.idle_expired(),
            drift_corrected: now.user.drift_corrected,
            stalled_closed: u64::from(now.user.stalled_closed),
            refused_closed: now.user.refused_closed,
            syn_per_sec: rate(counter::SYN_SEEN),
            admitted_per_sec: rate(counter::ADMITTED),
            rejected_per_sec: REJECTIONS.iter().map(|&c| rate(c)).sum(),
        }
    }
}

/// The name a value has in `stats --json` (`"latency_rising"`, `"work"`): also
/// its label in the metrics and its text in `top`.
pub(crate) fn json_name(value: &impl Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shed_common::{
        ControlConfig, ControlStatus, HandshakeCell, HandshakeRing, PortConfig, PortCounters, PortState, TierReserve,
        UserPortState, action, count_mode,
    };

    fn snapshot(admitted: u64, rejected: u64) -> PortSnapshot {
        let mut counters = PortCounters::default();
        counters.values[counter::ADMITTED] = admitted;
        counters.values[counter::REJECTED_LIMIT] = rejected;
        PortSnapshot {
            port: 8080,
            config: PortConfig { tiered: 1, ..PortConfig::new(0, action::RST, false, count_mode::CONNECTIONS) },
            limit: 5,
            control: ControlConfig::default(),
            reserve: TierReserve { held_back: [0, 0, 1, 2] },
            status: ControlStatus {
                baseline_us: 900,
                windows: 3,
                reason: Reason::Grow.to_raw(),
                ..ControlStatus::default()
            },
            state: PortState { opened: 7, closed: 2, busy_enter: 4, busy_exit: 3, ..PortState::default() },
            user: UserPortState { handshake_shift: 20, ..UserPortState::default() },
            ring: {
                // Epoch 100 at shift 20: one live cell with 2 open, one lapsed cell with 1.
                let mut ring = HandshakeRing { lapsed: 4, ..HandshakeRing::default() };
                ring.cells[0] = HandshakeCell { epoch: 100, admitted: 5, completed: 3 };
                ring.cells[1] = HandshakeCell { epoch: 96, admitted: 1, completed: 0 };
                ring
            },
            silent: {
                // Silent epoch 0 at the default shift (now is 100 << 20 ns): one
                // live cell with 3 silent connections.
                let mut ring = HandshakeRing { lapsed: 2, ..HandshakeRing::default() };
                ring.cells[0] = HandshakeCell { epoch: 0, admitted: 4, completed: 1 };
                ring
            },
            now_ns: 100 << 20,
            counters,
        }
    }

    #[test]
    fn fields_and_rates() {
        let before = snapshot(5, 10);
        let now = snapshot(9, 30);
        let stats = PortStats::new(&now, Some((&before, Duration::from_secs(2))));
        // A connections-mode port: silent connections are among the established.
        assert_eq!((stats.established, stats.busy, stats.pending, stats.silent, stats.in_flight), (5, 1, 2, 3, 7));
        assert_eq!(stats.idle_expired, 2);
        let mut work = now;
        work.config.count_mode = count_mode::WORK;
        assert_eq!(PortStats::new(&work, None).in_flight, 1 + 3 + 2, "busy, silent and pending");
        assert_eq!((stats.handshakes_lapsed, stats.handshake_window_us), (5, (4 << 20) / 1000));
        assert_eq!((stats.baseline_us, stats.last_decision), (900, Some(Reason::Grow)));
        assert_eq!((stats.admitted, stats.rejected, stats.rejected_by_reason.limit), (9, 30, 30));
        assert_eq!(stats.admitted_per_sec, Some(2.0));
        assert_eq!(stats.rejected_per_sec, Some(10.0));
        assert_eq!(stats.action, Action::Rst);
        assert_eq!(PortStats::new(&now, None).rejected_per_sec, None);
    }

    #[test]
    fn json_names_are_the_serialized_words() {
        assert_eq!(json_name(&crate::control::Reason::LatencyRising), "latency_rising");
        assert_eq!(json_name(&crate::kernel::options::Count::Work), "work");
        assert_eq!(json_name(&5u32), "", "not a word: empty");
    }

    /// The keys of a JSON object's top level, in the order written.
    fn top_level_keys(json: &str) -> Vec<&str> {
        let (mut keys, mut depth, mut in_string, mut start, mut escaped) = (Vec::new(), 0, false, 0, false);
        let mut expect_key = false;
        for (i, c) in json.char_indices() {
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        in_string = false;
                        if expect_key {
                            keys.push(&json[start..i]);
                            expect_key = false;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => {
                    in_string = true;
                    start = i + 1;
                }
                '{' | '[' => {
                    depth += 1;
                    expect_key = depth == 1 && c == '{';
                }
                '}' | ']' => depth -= 1,
                ',' if depth == 1 => expect_key = true,
                _ => {}
            }
        }
        keys
    }

    #[test]
    fn json_fields_are_the_vocabulary_in_its_order() {
        let json = serde_json::to_string(&PortStats::new(&snapshot(1, 2), None)).unwrap();
        let fields = top_level_keys(&json);
        let terms: Vec<&str> = crate::observe::vocabulary::TERMS.iter().map(|t| t.json).collect();
        assert_eq!(fields, terms, "stats --json fields vs shed::observe::vocabulary::TERMS");
    }

    #[test]
    fn json_has_the_stable_fields() {
        let json = serde_json::to_value(PortStats::new(&snapshot(1, 2), None)).unwrap();
        for field in ["port", "limit", "in_flight", "admitted", "rejected", "baseline_us", "sojourn_p99_us"] {
            assert!(json[field].is_u64(), "{field} must be an integer in {json}");
        }
        assert_eq!(json["action"], "rst");
        assert_eq!(json["algo"], "gradient");
        assert_eq!(json["count"], "connections");
        assert_eq!(json["tiers"]["low"]["share"], 0.7);
        assert_eq!(json["tiers"]["critical"]["action"], "rst");
        assert_eq!(json["tiers"]["low"]["held_back"], 2);
    }
}
