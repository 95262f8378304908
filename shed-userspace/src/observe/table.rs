// SPDX-License-Identifier: MIT OR Apache-2.0
//! Human-readable output. `--json` output comes from serde on the same structs.
use std::fmt::Write as _;

use crate::observe::stats::PortStats;

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}/s"))
}

/// One line per port under a header.
pub(crate) fn stats_table(stats: &[PortStats]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5}  {:<9}  {:>6}  {:>9}  {:>11}  {:>7}  {:>10}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}  {:>9}  {:<6}",
        "PORT",
        "ALGO",
        "LIMIT",
        "IN-FLIGHT",
        "ESTABLISHED",
        "PENDING",
        "ADMITTED",
        "REJECTED",
        "ADMIT/S",
        "REJECT/S",
        "BASE(ms)",
        "P50(ms)",
        "P99(ms)",
        "ACTION"
    );
    let mut netns = crate::host::paths::OWN_NETNS_LABEL;
    for s in stats {
        // Ports of a namespace named with --netns under its name.
        if s.netns != netns {
            netns = &s.netns;
            match &s.pod {
                Some(pod) if s.state == crate::observe::stats::GateState::HandingOver => {
                    _ = writeln!(
                        out,
                        "pod {pod} (netns {netns}), judged by the last agent until the next takes it over:"
                    );
                }
                Some(pod) => _ = writeln!(out, "pod {pod} (netns {netns}):"),
                None => _ = writeln!(out, "netns {netns}:"),
            }
        }
        let mode = if s.dry_run {
            format!("{} (dry-run, would reject {})", s.action, s.would_reject)
        } else {
            s.action.to_string()
        };
        let _ = writeln!(
            out,
            "{:>5}  {:<9}  {:>6}  {:>9}  {:>11}  {:>7}  {:>10}  {:>10}  {:>10}  {:>10}  {:>9.1}  {:>9.1}  {:>9.1}  {:<6}",
            s.port,
            s.algo.name(),
            s.limit,
            s.in_flight,
            s.established,
            s.pending,
            s.admitted,
            s.rejected,
            rate(s.admitted_per_sec),
            rate(s.rejected_per_sec),
            s.baseline_us as f64 / 1e3,
            s.sojourn_p50_us as f64 / 1e3,
            s.sojourn_p99_us as f64 / 1e3,
            mode
        );
        port_details(&mut out, s);
    }
    out
}

/// The lines under a port's row: queue and service, objective, clients, tiers.
fn port_details(out: &mut String, s: &PortStats) {
    let queue = format!(
        "       queue wait p50/p99 {:.1}/{:.1} ms, service p50/p99 {:.1}/{:.1} ms, {} samples/window, accept queue {}/{}, {} listen drops, last decision {} (from {})",
        s.queue_wait_p50_us as f64 / 1e3,
        s.queue_wait_p99_us as f64 / 1e3,
        s.service_p50_us as f64 / 1e3,
        s.service_p99_us as f64 / 1e3,
        s.samples_per_window,
        s.accept_queue,
        s.accept_backlog,
        s.listen_drops,
        s.last_decision.map_or_else(|| "none yet".to_owned(), crate::control::Reason::name),
        s.previous_limit
    );
    let _ = writeln!(out, "{queue}");
    if let Some(objective) = s.target_latency {
        let _ = writeln!(out, "       objective: answered within {objective} ms (--target-latency)");
    }
    if s.count == crate::kernel::options::Count::Multiplexed {
        let _ = writeln!(out, "       multiplexed: each connection busy while open, queue waits per read only");
    }
    let tiers: Vec<String> = s
        .tiers
        .iter()
        .filter(|(_, t)| t.admitted + t.rejected > 0)
        .map(|(name, t)| format!("{name} {}/{} (share {})", t.admitted, t.rejected, t.share))
        .collect();
    if s.client_cap != 0 || s.client_share != 0 {
        let top: Vec<String> = s.top_clients.iter().map(|c| format!("{} {}", c.client, c.in_flight)).collect();
        let cap = if s.client_cap == 0 { "none".to_owned() } else { s.client_cap.to_string() };
        let share = if s.client_share == 0 { "none".to_owned() } else { format!("{}%", s.client_share) };
        let _ = writeln!(
            out,
            "       client cap {cap}: rejected {}; client share {share}: rejected {}; top clients: {}",
            s.rejected_by_reason.client_cap,
            s.rejected_by_reason.client_share,
            if top.is_empty() { "none".into() } else { top.join(", ") }
        );
    }
    if !tiers.is_empty() {
        let _ = writeln!(
            out,
            "       tiers admitted/rejected: {}; rejected at limit {}, at tier share {}",
            tiers.join(", "),
            s.rejected_by_reason.limit,
            s.rejected_by_reason.share
        );
    }
}
