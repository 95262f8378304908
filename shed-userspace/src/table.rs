//! Human-readable output. `--json` output comes from serde on the same structs.
use std::fmt::Write as _;

use crate::stats::PortStats;

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}/s"))
}

/// One line per port under a header.
pub fn stats_table(stats: &[PortStats]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5}  {:>6}  {:>9}  {:>6}  {:>7}  {:>10}  {:>10}  {:>10}  {:>10}  {:<6}",
        "PORT", "LIMIT", "IN-FLIGHT", "ESTAB", "PENDING", "ADMITTED", "REJECTED", "ADMIT/S", "REJECT/S", "ACTION"
    );
    for s in stats {
        let mode = if s.dry_run { format!("{} (dry-run, would reject {})", s.action, s.would_reject) } else { s.action.to_string() };
        let _ = writeln!(
            out,
            "{:>5}  {:>6}  {:>9}  {:>6}  {:>7}  {:>10}  {:>10}  {:>10}  {:>10}  {:<6}",
            s.port,
            s.limit,
            s.in_flight,
            s.established,
            s.pending,
            s.admitted,
            s.rejected,
            rate(s.admitted_per_sec),
            rate(s.rejected_per_sec),
            mode
        );
    }
    out
}
