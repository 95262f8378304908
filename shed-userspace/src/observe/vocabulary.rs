// SPDX-License-Identifier: MIT OR Apache-2.0
//! One name per setting and per counter, wherever an operator meets it.
//!
//! The rules (docs/OPERATIONS.md, "One vocabulary", shows the table):
//! - a **setting** is `--name-of-it` on `attach` (and on `set`, where it can
//!   change live), `name-of-it` in the config file, `name_of_it` in
//!   `stats --json`, in the flag's unit;
//! - a **counter** is `name_of_it` in JSON and `shed_name_of_it_total` in
//!   Prometheus (a family with a label where JSON has a breakdown);
//! - a **measurement** carries its unit in JSON (`_us`) and is in seconds in
//!   Prometheus (`shed_<stem>_seconds`, a histogram for percentiles);
//! - a **gauge** is `name_of_it` and `shed_name_of_it` (or a label value of one family).
//!
//! [`TERMS`] lists every field of `stats --json`; a test walks the CLI, the
//! config keys, a live `stats --json` and a live scrape against it.

/// What a field of `stats --json` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An operator's setting; `live`: `shedctl set` changes it.
    Setting { live: bool },
    /// Cumulative since the gate started.
    Counter,
    /// A level now.
    Gauge,
    /// A measured duration (`_us`).
    Measure,
    /// Per second over the sampling interval (Prometheus: `rate()` of the counter).
    Rate,
    /// Names a series rather than measuring anything (a label in Prometheus).
    Label,
}

/// One field of `stats --json` and the metric family that serves it (None: no metric).
#[derive(Clone, Copy, Debug)]
pub struct Term {
    pub json: &'static str,
    pub kind: Kind,
    pub metric: Option<&'static str>,
}

const fn term(json: &'static str, kind: Kind, metric: Option<&'static str>) -> Term {
    Term { json, kind, metric }
}

const LIVE: Kind = Kind::Setting { live: true };
const FIXED: Kind = Kind::Setting { live: false };
use Kind::{Counter, Gauge, Label, Measure, Rate};

/// Every field of a port in `stats --json`, in its order.
pub const TERMS: &[Term] = &[
    term("port", Label, None),
    term("netns", Label, None),
    term("pod", Label, None),
    term("state", Label, None),
    term("limit", LIVE, Some("shed_limit")),
    term("in_flight", Gauge, Some("shed_in_flight")),
    term("count", LIVE, Some("shed_port_info")),
    term("established", Gauge, Some("shed_connections")),
    term("busy", Gauge, Some("shed_connections")),
    term("pending", Gauge, Some("shed_connections")),
    term("silent", Gauge, Some("shed_connections")),
    term("handshake_window_us", Measure, Some("shed_handshake_window_seconds")),
    term("handshake_p50_us", Measure, None),
    term("handshake_p99_us", Measure, None),
    term("idle_grace_ms", Measure, None),
    term("connection_quota", Measure, None),
    term("client_quota", Measure, None),
    term("algo", LIVE, Some("shed_port_info")),
    term("min_limit", LIVE, Some("shed_min_limit")),
    term("max_limit", LIVE, Some("shed_max_limit")),
    term("window", FIXED, None),
    term("percentile", FIXED, None),
    term("min_samples", FIXED, None),
    term("cooldown", FIXED, None),
    term("baseline_span", FIXED, None),
    term("probe_windows", FIXED, None),
    term("queue_target", FIXED, None),
    term("target_latency", FIXED, None),
    term("baseline_us", Measure, Some("shed_baseline_seconds")),
    term("observed_us", Measure, Some("shed_observed_seconds")),
    term("queue_wait_p50_us", Measure, Some("shed_queue_wait_seconds")),
    term("queue_wait_p99_us", Measure, Some("shed_queue_wait_seconds")),
    term("service_p50_us", Measure, Some("shed_service_seconds")),
    term("service_p99_us", Measure, Some("shed_service_seconds")),
    term("sojourn_p50_us", Measure, Some("shed_sojourn_seconds")),
    term("sojourn_p99_us", Measure, Some("shed_sojourn_seconds")),
    term("samples_per_window", Gauge, None),
    term("listen_drops_per_window", Gauge, None),
    term("accept_queue", Gauge, Some("shed_accept_queue")),
    term("accept_backlog", Gauge, Some("shed_accept_backlog")),
    term("listen_drops", Counter, Some("shed_listen_drops_total")),
    term("last_decision", Label, Some("shed_limit_decisions_total")),
    term("previous_limit", Gauge, None),
    term("admitted", Counter, Some("shed_admitted_total")),
    term("rejected", Counter, Some("shed_rejected_total")),
    term("rejected_by_reason", Counter, Some("shed_rejected_total")),
    term("tiers", Counter, Some("shed_tier_admitted_total")),
    term("trickle_admitted", Counter, Some("shed_trickle_admitted_total")),
    term("client_cap", LIVE, None),
    term("client_share", LIVE, None),
    term("client_prefix_v6", FIXED, None),
    term("retry_after", LIVE, Some("shed_retry_after_seconds")),
    term("top_clients", Label, None),
    term("action", LIVE, Some("shed_port_info")),
    term("dry_run", LIVE, Some("shed_dry_run")),
    term("would_reject", Counter, Some("shed_would_reject_total")),
    term("syn_seen", Counter, Some("shed_syn_seen_total")),
    term("not_local", Counter, Some("shed_not_local_total")),
    term("late_completed", Counter, Some("shed_late_completed_total")),
    term("syn_passed", Counter, Some("shed_syn_passed_total")),
    term("refused_at_ack", Counter, Some("shed_refused_at_ack_total")),
    term("refused_requests", Counter, Some("shed_refused_requests_total")),
    term("requests_admitted", Counter, Some("shed_requests_admitted_total")),
    term("refused_requests_again", Counter, Some("shed_refused_requests_again_total")),
    term("abandoned", Counter, Some("shed_abandoned_total")),
    term("rst_sent", Counter, Some("shed_rst_sent_total")),
    term("rst_failed", Counter, Some("shed_rst_failed_total")),
    term("rst_rate_limited", Counter, Some("shed_rst_rate_limited_total")),
    term("rst_rate", FIXED, None),
    term("rst_prefix_rate", FIXED, None),
    term("rst_suppressed", Counter, Some("shed_rst_suppressed_total")),
    term("http_syn_acks", Counter, Some("shed_http_syn_acks_total")),
    term("http_answers", Counter, Some("shed_http_answers_total")),
    term("http_not_http", Counter, Some("shed_http_not_http_total")),
    term("http_bad_cookies", Counter, Some("shed_http_bad_cookies_total")),
    term("client_map_full", Counter, Some("shed_client_map_full_total")),
    term("connection_map_full", Counter, Some("shed_connection_map_full_total")),
    term("handshakes_lapsed", Counter, Some("shed_handshakes_lapsed_total")),
    term("idle_expired", Counter, Some("shed_idle_expired_total")),
    term("drift_corrected", Counter, Some("shed_drift_corrected_total")),
    term("stalled_closed", Counter, Some("shed_stalled_closed_total")),
    term("refused_closed", Counter, Some("shed_refused_closed_total")),
    term("syn_per_sec", Rate, None),
    term("admitted_per_sec", Rate, None),
    term("rejected_per_sec", Rate, None),
];

/// Counters whose metric is a family of their breakdown, not `shed_<json>_total`.
#[cfg(test)]
const BREAKDOWNS: &[&str] = &["rejected_by_reason", "tiers"];

/// The flag (and config key) of a setting's JSON name.
pub fn flag(json: &str) -> String {
    json.replace('_', "-")
}

/// Why `term` breaks the naming rules, if it does.
#[cfg(test)]
pub(crate) fn rule_broken(term: &Term) -> Option<String> {
    let expected = match term.kind {
        Kind::Counter if BREAKDOWNS.contains(&term.json) => return None,
        Kind::Counter => Some(format!("shed_{}_total", term.json)),
        Kind::Measure => term.metric.map(|_| {
            let stem = term.json.trim_end_matches("_us").trim_end_matches("_p50").trim_end_matches("_p99");
            format!("shed_{stem}_seconds")
        }),
        Kind::Gauge | Kind::Setting { .. } => match term.metric {
            Some("shed_connections" | "shed_port_info") | None => return None,
            // A figure in seconds carries its unit in the metric's name (Prometheus' base units).
            Some(m) if m.ends_with("_seconds") => Some(format!("shed_{}_seconds", term.json)),
            Some(_) => Some(format!("shed_{}", term.json)),
        },
        Kind::Rate | Kind::Label => return None,
    };
    (term.metric.map(str::to_owned) != expected)
        .then(|| format!("{}: metric {:?}, the rule says {:?}", term.json, term.metric, expected))
}
