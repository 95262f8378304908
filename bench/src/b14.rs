// SPDX-License-Identifier: MIT OR Apache-2.0
//! B14: control at every scale, the real-server slice. Slow services with
//! few workers (Go `net/http` 4 x 100 ms and 8 x 500 ms, gunicorn gthread
//! 4 x 100 ms) under 2x and 4x overload, a new connection per request and a
//! 1 s client deadline: no gate, shed on its defaults, the best hand-set
//! fixed limit, and HAProxy tuned by hand (`maxconn` = workers, `timeout
//! queue` = twice the service time, capped so a served request still meets
//! the deadline), side by side. The whole matrix is the simulation's
//! (`control::sim::matrix`).
use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shed_testkit::{
    servers::{GoServer, GuardProxy, Gunicorn},
    testbed::{HTTP_REQUEST, OpenLoop, Outcome, Testbed},
};

use crate::common::{PORT, Scale, median_min_max, percentile, start_gate};

/// One service of the slice.
#[derive(Clone, Copy)]
struct Cell {
    server: &'static str,
    workers: usize,
    service_us: u64,
}

impl Cell {
    fn capacity(self) -> f64 {
        self.workers as f64 * 1e6 / self.service_us as f64
    }
}

/// What guards the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Guard {
    None,
    ShedDefaults,
    ShedFixed,
    Haproxy,
}

impl Guard {
    const fn name(self) -> &'static str {
        match self {
            Self::None => "no gate",
            Self::ShedDefaults => "shed (defaults)",
            Self::ShedFixed => "shed fixed = workers (hand-set)",
            Self::Haproxy => "HAProxy, maxconn = workers, queue 2x service (hand-tuned)",
        }
    }
}

/// The servers listen here when HAProxy takes the port.
const BEHIND_PROXY_PORT: u16 = 9090;
const DEADLINE: Duration = Duration::from_secs(1);
/// Goodput and p99 are read after the start: the first seconds are the cold start.
const SETTLED_AFTER: Duration = Duration::from_secs(5);

enum Running {
    Go(#[expect(dead_code, reason = "held until dropped")] GoServer),
    Gunicorn(#[expect(dead_code, reason = "held until dropped")] Gunicorn),
}

fn start_server(cell: Cell, bed: &Testbed, addr: SocketAddr) -> Result<Running> {
    Ok(match cell.server {
        "gunicorn" => Running::Gunicorn(Gunicorn::start(&bed.server_ns, addr, cell.workers, cell.service_us)?),
        _ => Running::Go(GoServer::start(&bed.server_ns, addr, cell.workers, cell.service_us)?),
    })
}

/// One run's figures.
struct Run {
    /// Answers within the deadline after [`SETTLED_AFTER`], per second, of capacity.
    settled: f64,
    /// The same over the whole run.
    whole: f64,
    /// p99 of the answered requests after [`SETTLED_AFTER`], as a multiple of the service time.
    p99_x: f64,
    /// The gate's highest limit after [`SETTLED_AFTER`] (0: no shed gate).
    late_limit: u64,
}

fn limit(shedctl: &Path) -> Option<u64> {
    let out = std::process::Command::new(shedctl)
        .args(["stats", "--json", "--interval", "50", "--port", &PORT.to_string()])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["limit"].as_u64()
}

fn run(shedctl: &Path, cell: Cell, guard: Guard, load: f64, seconds: Duration) -> Result<Run> {
    let bed = Testbed::create("shedb14")?;
    let addr = bed.server_addr(false, PORT);
    let behind = SocketAddr::new(addr.ip(), BEHIND_PROXY_PORT);
    let _server = start_server(cell, &bed, if guard == Guard::Haproxy { behind } else { addr })?;
    let service_ms = cell.service_us / 1000;
    let queue_ms = (2 * service_ms).min((DEADLINE.as_millis() as u64).saturating_sub(service_ms));
    let _proxy = (guard == Guard::Haproxy)
        .then(|| GuardProxy::start(&bed.server_ns, addr, behind, cell.workers, queue_ms))
        .transpose()?;
    let workers = cell.workers.to_string();
    let gate = match guard {
        Guard::ShedDefaults => Some(start_gate(shedctl, &bed, &["--action", "rst"])?),
        Guard::ShedFixed => Some(start_gate(shedctl, &bed, &["--action", "rst", "--limit", &workers])?),
        Guard::None | Guard::Haproxy => None,
    };
    let rate = Arc::new(AtomicU64::new((load * cell.capacity()).round() as u64));
    let load_gen = OpenLoop::start_with(&bed.client_ns, addr, rate, DEADLINE, HTTP_REQUEST);
    let start = Instant::now();
    let (mut early, mut settled, mut late_limit) = (0usize, Vec::new(), 0);
    // When the settled part began and the run ended, as read (a read every 200 ms).
    let (mut settled_from, mut last_read) = (None, Duration::ZERO);
    while start.elapsed() < seconds {
        thread::sleep(Duration::from_millis(200));
        let after = start.elapsed() >= SETTLED_AFTER;
        if after && settled_from.is_none() {
            // What came before this read belongs to the first seconds.
            while let Ok(o) = load_gen.outcomes.try_recv() {
                early += usize::from(matches!(o, Outcome::Answered(_)));
            }
            settled_from = Some(start.elapsed());
            continue;
        }
        while let Ok(o) = load_gen.outcomes.try_recv() {
            if let Outcome::Answered(l) = o {
                if after { settled.push(l.as_secs_f64()) } else { early += 1 }
            }
        }
        last_read = start.elapsed();
        if gate.is_some() && after {
            late_limit = late_limit.max(limit(shedctl).unwrap_or(0));
        }
    }
    // Answers still on their way when the run ends fall outside it (counting
    // them would credit the last second's work twice against the window).
    drop(load_gen.finish());
    drop(gate);
    settled.sort_by(f64::total_cmp);
    let ended = last_read.as_secs_f64();
    let settled_s = ended - settled_from.map_or(SETTLED_AFTER, |d| d).as_secs_f64();
    let capacity = cell.capacity();
    Ok(Run {
        settled: settled.len() as f64 / settled_s / capacity,
        whole: (early + settled.len()) as f64 / ended / capacity,
        p99_x: percentile(&settled, 0.99).unwrap_or(0.0) / (cell.service_us as f64 / 1e6),
        late_limit,
    })
}

/// B14. Returns the JSON result and the report section.
pub(crate) fn b14(shedctl: &Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let cells = [
        Cell { server: "go", workers: 4, service_us: 100_000 },
        Cell { server: "go", workers: 8, service_us: 500_000 },
        Cell { server: "gunicorn", workers: 4, service_us: 100_000 },
    ];
    let all_guards = [Guard::None, Guard::ShedDefaults, Guard::ShedFixed, Guard::Haproxy];
    let guards: &[Guard] = scale.pick(&all_guards[..], &all_guards[..], &[Guard::ShedDefaults, Guard::Haproxy][..]);
    let loads: &[f64] = scale.pick(&[2.0, 4.0], &[2.0, 4.0], &[2.0]);
    let repeats = scale.pick(3, 1, 1);
    let cells: &[Cell] = scale.pick(&cells[..], &cells[..], &cells[..1]);
    let mut json = Vec::new();
    let mut rows = Vec::new();
    for &cell in cells {
        // At least 200 answers after the first 5 s.
        let seconds = SETTLED_AFTER.as_secs_f64() + (200.0 / cell.capacity()).max(10.0);
        let seconds = Duration::from_secs_f64(scale.pick(seconds, seconds, 8.0));
        for &load in loads {
            for &guard in guards {
                let mut runs = Vec::new();
                for _ in 0..repeats {
                    runs.push(run(shedctl, cell, guard, load, seconds).with_context(|| {
                        format!(
                            "B14 {} {} x {} ms, {load}x, {}",
                            cell.server,
                            cell.workers,
                            cell.service_us / 1000,
                            guard.name()
                        )
                    })?);
                }
                let stat = |f: fn(&Run) -> f64| median_min_max(runs.iter().map(f).collect());
                let (settled, smin, smax) = stat(|r| r.settled);
                let whole = stat(|r| r.whole).0;
                let p99_x = stat(|r| r.p99_x).0;
                let late_limit = runs.iter().map(|r| r.late_limit).max().unwrap_or(0);
                let label = format!("{} {} x {} ms", cell.server, cell.workers, cell.service_us / 1000);
                println!(
                    "B14 {label:<22} {load}x {:<58}: goodput {:5.1}% ({:.1}-{:.1}) after 5 s, {:5.1}% whole, p99 {p99_x:.1}x service, limit up to {late_limit}",
                    guard.name(),
                    settled * 100.0,
                    smin * 100.0,
                    smax * 100.0,
                    whole * 100.0
                );
                json.push(serde_json::json!({"server": cell.server, "workers": cell.workers, "service_ms": cell.service_us / 1000, "load": load, "config": guard.name(), "goodput_settled": settled, "goodput_settled_min": smin, "goodput_settled_max": smax, "goodput_whole": whole, "p99_x_service": p99_x, "late_limit": late_limit, "runs": repeats, "seconds": seconds.as_secs_f64()}));
                rows.push((label, load, guard, settled, whole, p99_x, late_limit));
            }
        }
    }
    // Met: shed's defaults at least 90% after 5 s and 80% whole, and within 3
    // points of the hand-tuned HAProxy (or better).
    let mut md = String::new();
    let _ = writeln!(md, "\n## B14: control at every scale (real servers)\n");
    let _ = writeln!(
        md,
        "A new connection per request at 2x and 4x capacity, 1 s client deadline; goodput is answers within the deadline per second of capacity, after the first 5 s and over the whole run (median of {repeats}); p99 of the answered requests after 5 s as a multiple of the (fixed) service time; the gate's highest limit after 5 s.\n"
    );
    let _ = writeln!(
        md,
        "| server | load | configuration | goodput after 5 s | whole run | p99 (x service) | limit | met |\n|---|---|---|---|---|---|---|---|"
    );
    for (label, load, guard, settled, whole, p99_x, late_limit) in &rows {
        let met = if *guard == Guard::ShedDefaults {
            let proxy =
                rows.iter().find(|r| r.0 == *label && r.1 == *load && r.2 == Guard::Haproxy).map_or(0.0, |r| r.3);
            if *settled >= 0.9 && *whole >= 0.8 && *settled >= proxy - 0.03 { "met" } else { "missed" }
        } else {
            ""
        };
        let limit = if *late_limit > 0 { late_limit.to_string() } else { "-".to_owned() };
        let _ = writeln!(
            md,
            "| {label} | {load}x | {} | {:.1}% | {:.1}% | {p99_x:.1} | {limit} | {met} |",
            guard.name(),
            settled * 100.0,
            whole * 100.0
        );
    }
    let result = serde_json::json!({"benchmark": "B14 control at every scale", "points": json});
    Ok((result, md))
}
