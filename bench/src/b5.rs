// SPDX-License-Identifier: MIT OR Apache-2.0
//! B5: adaptation over time. Under open-loop load the backend slows 5x and
//! recovers, then demand steps from 0.8x to 1.4x; limit, goodput and p99 in
//! 100 ms bins, time to first shed or cut, and settling time per event.
use std::{
    fmt::Write as _,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;
use shed::kernel::maps::GateMaps;
use shed_testkit::testbed::{OpenLoop, Outcome, Testbed};

use crate::{
    b4::{Server, start_server},
    common::{PORT, Scale, median_min_max, percentile, start_gate},
    plot,
};

const WORKERS: u64 = 4;
const SERVICE_US: u64 = 20_000;
const BIN: Duration = Duration::from_millis(100);
/// Bins a settled state must hold.
const HOLD_BINS: usize = 10;

/// What happens at a moment of the run.
#[derive(Clone, Copy)]
struct Event {
    at_s: f64,
    name: &'static str,
    /// Offered load, x the normal capacity.
    load: f64,
    /// Backend service time factor.
    slow: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Bin {
    pub t: f64,
    pub limit: u32,
    pub in_flight: u64,
    pub offered: f64,
    pub capacity: f64,
    pub answered: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub p99_ms: f64,
}

fn schedule(scale: Scale) -> (Vec<Event>, f64) {
    let phase = scale.pick(8.0, 5.0, 1.5);
    let events = vec![
        Event { at_s: 0.0, name: "1.5x load", load: 1.5, slow: 1 },
        Event { at_s: phase, name: "backend 5x slower", load: 1.5, slow: 5 },
        Event { at_s: 2.0 * phase, name: "backend recovers", load: 1.5, slow: 1 },
        Event { at_s: 3.0 * phase, name: "demand 0.8x", load: 0.8, slow: 1 },
        Event { at_s: 4.0 * phase, name: "demand 1.4x", load: 1.4, slow: 1 },
    ];
    (events, 5.0 * phase)
}

/// The controllers B5 compares, side by side in one run, and the server each
/// runs against: its label, the controller (`fixed` runs at the hand-tuned 8).
const CASES: [(&str, &str, Server); 7] = [
    ("gradient", "gradient", Server::ReadsWhenFree),
    ("gradient2", "gradient2", Server::ReadsWhenFree),
    ("aimd", "aimd", Server::ReadsWhenFree),
    ("queue", "queue", Server::ReadsWhenFree),
    ("queue, thread per connection", "queue", Server::ThreadPerConnection),
    ("queue, Go net/http", "queue", Server::Go),
    ("fixed 8, Go net/http", "fixed", Server::Go),
];
/// Bins of goodput averaged for "goodput back": 0.5 s.
const GOODPUT_BINS: usize = 5;

/// The timeline plot of one controller.
fn timeline_file(label: &str) -> String {
    if label == "gradient" {
        "b5_adaptation.png".to_owned()
    } else {
        let slug: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        format!("b5_adaptation_{}.png", slug.replace("__", "_"))
    }
}

/// One run: bins of the whole timeline.
fn run_once(shedctl: &Path, scale: Scale, algo: &str, server: Server) -> Result<Vec<Bin>> {
    let (events, end_s) = schedule(scale);
    let bed = Testbed::create("shedb5")?;
    let service_us = Arc::new(AtomicU64::new(SERVICE_US));
    let addr = bed.server_addr(false, PORT);
    let running = start_server(server, &bed, addr, WORKERS as usize, &service_us, false)?;
    let start_at = if algo == "fixed" { ["--limit", "8"] } else { ["--initial-limit", "20"] };
    let gate = start_gate(shedctl, &bed, &[&["--action", "rst", "--algo", algo][..], &start_at].concat())?;
    let maps = GateMaps::open_pinned()?;
    let base_capacity = WORKERS as f64 * 1e6 / SERVICE_US as f64;
    let rate = Arc::new(AtomicU64::new((events[0].load * base_capacity) as u64));
    let load = OpenLoop::start_with(&bed.client_ns, addr, rate.clone(), Duration::from_secs(1), server.request());
    let start = Instant::now();
    let mut next_event = 0;
    let mut bins = Vec::new();
    let mut bin_end = start + BIN;
    let mut current = Bin::default();
    let mut latencies = Vec::new();
    while start.elapsed().as_secs_f64() < end_s {
        let t = start.elapsed().as_secs_f64();
        while next_event < events.len() && events[next_event].at_s <= t {
            let e = events[next_event];
            rate.store((e.load * base_capacity) as u64, Ordering::Relaxed);
            service_us.store(SERVICE_US * e.slow, Ordering::Relaxed);
            running.set_service_us(SERVICE_US * e.slow)?;
            next_event += 1;
        }
        while let Ok(o) = load.outcomes.try_recv() {
            match o {
                Outcome::Answered(l) => {
                    current.answered += 1;
                    latencies.push(l.as_secs_f64() * 1e3);
                }
                Outcome::Refused => current.refused += 1,
                Outcome::TimedOut | Outcome::Failed => current.timeouts += 1,
            }
        }
        if Instant::now() >= bin_end {
            let snapshot = maps.snapshot(PORT, maps.config(PORT)?)?;
            let e = events[next_event.saturating_sub(1)];
            latencies.sort_by(f64::total_cmp);
            current.t = (bins.len() + 1) as f64 * BIN.as_secs_f64();
            current.limit = snapshot.limit;
            current.in_flight = snapshot.in_flight();
            current.offered = e.load * base_capacity;
            current.capacity = base_capacity / e.slow as f64;
            current.p99_ms = percentile(&latencies, 0.99).unwrap_or(0.0);
            bins.push(std::mem::take(&mut current));
            latencies.clear();
            bin_end += BIN;
        }
        thread::sleep(Duration::from_millis(5));
    }
    drop(load);
    drop(gate);
    Ok(bins)
}

/// Per event: seconds to the first shed (or first limit cut) and to settling.
#[derive(Clone, Debug)]
struct Response {
    event: &'static str,
    first_shed_s: Option<f64>,
    /// The gate was shedding in the 0.5 s before the event (no "first" shed then).
    shedding_before: bool,
    first_cut_s: Option<f64>,
    /// From when goodput over 0.5 s is at least 90% of min(offered, capacity).
    goodput_s: Option<f64>,
    settle_s: Option<f64>,
    settled_limit: f64,
}

/// The limit in steady state (the first phase, 1.5x load, from 2 s on): its
/// median and the largest deviation from it, as a fraction.
fn steady_swing(bins: &[Bin], scale: Scale) -> (f64, f64) {
    let (events, _) = schedule(scale);
    let until = events.get(1).map_or(0.0, |e| e.at_s);
    let limits: Vec<f64> = bins.iter().filter(|b| b.t > 2.0 && b.t <= until).map(|b| f64::from(b.limit)).collect();
    if limits.is_empty() {
        return (0.0, 0.0);
    }
    let (median, lo, hi) = median_min_max(limits);
    (median, ((hi - median).max(median - lo)) / median.max(1.0))
}

fn per_second(n: u64) -> f64 {
    n as f64 / BIN.as_secs_f64()
}

fn responses(bins: &[Bin], scale: Scale) -> Vec<Response> {
    let (events, end_s) = schedule(scale);
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate().skip(1) {
        let until = events.get(i + 1).map_or(end_s, |n| n.at_s);
        let phase: Vec<&Bin> = bins.iter().filter(|b| b.t > e.at_s && b.t <= until).collect();
        let before = bins.iter().rfind(|b| b.t <= e.at_s);
        // The level the limit settles to: median of the phase's last 2 s.
        let tail: Vec<f64> = phase.iter().rev().take(20).map(|b| f64::from(b.limit)).collect();
        let settled_limit = if tail.is_empty() { 0.0 } else { median_min_max(tail).0 };
        // Only meaningful when the gate was not shedding already (the last 0.5 s before the event).
        let shedding_before = bins.iter().filter(|b| b.t <= e.at_s).rev().take(5).any(|b| b.refused > 0);
        let first_shed_s =
            if shedding_before { None } else { phase.iter().find(|b| b.refused > 0).map(|b| b.t - e.at_s) };
        let first_cut_s = before.and_then(|b0| phase.iter().find(|b| b.limit < b0.limit)).map(|b| b.t - e.at_s);
        let capacity = WORKERS as f64 * 1e6 / (SERVICE_US * e.slow) as f64;
        let target = 0.9 * capacity.min(e.load * WORKERS as f64 * 1e6 / SERVICE_US as f64);
        let settled = |w: &[&Bin]| {
            let goodput = w.iter().map(|b| per_second(b.answered)).sum::<f64>() / w.len() as f64;
            w.iter().all(|b| (f64::from(b.limit) - settled_limit).abs() <= 0.1 * settled_limit.max(1.0) + 0.5)
                && goodput >= target
        };
        let settle_s = phase.windows(HOLD_BINS).find(|w| settled(w)).map(|w| w[0].t - BIN.as_secs_f64() - e.at_s);
        let goodput_s = phase
            .windows(GOODPUT_BINS)
            .find(|w| w.iter().map(|b| per_second(b.answered)).sum::<f64>() / w.len() as f64 >= target)
            .map(|w| w[0].t - BIN.as_secs_f64() - e.at_s);
        out.push(Response {
            event: e.name,
            first_shed_s,
            shedding_before,
            first_cut_s,
            goodput_s,
            settle_s,
            settled_limit,
        });
    }
    out
}

pub(crate) fn b5(shedctl: &Path, scale: Scale, plot_dir: &Path) -> Result<(serde_json::Value, String)> {
    let runs = scale.pick(3, 1, 1);
    let (events, _) = schedule(scale);
    let mut md = String::new();
    let _ = writeln!(md, "\n## B5: adaptation over time\n");
    let _ = writeln!(
        md,
        "4 workers x 20 ms (200 req/s), `shed gradient`, `gradient2`, `aimd` and `queue` from limit 20 in turn against a server whose workers read when free; then `queue` against two servers that read every request at once (a thread per connection, Go net/http), beside a hand-tuned `fixed 8` on Go; action rst, a new connection per request, 1 s deadline, 100 ms bins. Events: 1.5x load; the backend slows 5x (40 req/s) and recovers; demand drops to 0.8x and steps to 1.4x. Goodput back = the first moment from which goodput over 0.5 s is at least 90% of min(offered, capacity) (target: 0.5 s). Settled = the first moment from which, for 1 s, the limit stays within +/-10% of the level it ends the phase at and goodput is at least 90% of min(offered, capacity) (target: 1 s). Steady = the limit over the first phase (1.5x load) after 2 s: its median and largest deviation (target: +/-10%). Median of {runs} runs (min-max).\n"
    );
    // The smoke run keeps two (the default and the first one).
    let cases: Vec<(&str, &str, Server)> = CASES
        .into_iter()
        .filter(|(label, ..)| scale != Scale::Smoke || *label == "gradient" || *label == "queue")
        .collect();
    let images: Vec<String> =
        cases.iter().map(|(label, ..)| format!("![B5 timeline, {label}]({})", timeline_file(label))).collect();
    let _ = writeln!(md, "{}\n", images.join(" "));
    let _ = writeln!(
        md,
        "| controller | event | first shed s | first limit cut s | goodput back s | settled after s | settled limit | goodput in 0.5 s and settled in 1 s |\n|---|---|---|---|---|---|---|---|"
    );
    let mut steady_rows = Vec::new();
    let mut json_events = Vec::new();
    let mut json_steady = Vec::new();
    let mut timelines = serde_json::Map::new();
    for &(label, algo, server) in &cases {
        let mut all = Vec::new();
        for r in 0..runs {
            let bins = run_once(shedctl, scale, algo, server)?;
            let resp = responses(&bins, scale);
            for x in &resp {
                println!(
                    "B5 {label} run {r}: {:<20} first shed {:>5} s{}, first cut {:>5} s, settled {:>5} s at limit {:.0}",
                    x.event,
                    fmt_s(x.first_shed_s),
                    if x.shedding_before { " (was shedding)" } else { "" },
                    fmt_s(x.first_cut_s),
                    fmt_s(x.settle_s),
                    x.settled_limit
                );
            }
            all.push((bins, resp));
        }
        let (bins, _) = &all[0];
        let points: Vec<plot::TimelinePoint> = bins
            .iter()
            .map(|b| plot::TimelinePoint {
                t: b.t,
                limit: b.limit.into(),
                in_flight: b.in_flight as f64,
                goodput: per_second(b.answered),
                capacity: b.capacity,
                offered: b.offered,
                p99_ms: b.p99_ms,
            })
            .collect();
        let markers: Vec<(f64, &str)> = events.iter().skip(1).map(|e| (e.at_s, e.name)).collect();
        let swings: Vec<(f64, f64)> = all.iter().map(|(b, _)| steady_swing(b, scale)).collect();
        let (median_limit, _, _) = median_min_max(swings.iter().map(|s| s.0).collect());
        let (swing, swing_lo, swing_hi) = median_min_max(swings.iter().map(|s| s.1).collect());
        steady_rows.push(format!(
            "| {label} | {median_limit:.0} | +/-{:.0}% ({:.0}-{:.0}) | {} |",
            swing * 100.0,
            swing_lo * 100.0,
            swing_hi * 100.0,
            if swing <= 0.1 { "yes" } else { "no" }
        ));
        json_steady.push(serde_json::json!({"controller": label, "server": server.name(), "median_limit": median_limit, "swing": swing, "swing_min": swing_lo, "swing_max": swing_hi}));
        plot::timeline(
            &plot_dir.join(timeline_file(label)),
            &format!("B5: shed {label} adapting (4 workers x 20 ms; 100 ms bins)"),
            &points,
            &markers,
        )?;
        for (i, e) in events.iter().skip(1).enumerate() {
            let pick =
                |f: fn(&Response) -> Option<f64>| -> Vec<f64> { all.iter().filter_map(|(_, r)| f(&r[i])).collect() };
            let stat = |v: Vec<f64>| -> (String, Option<f64>) {
                if v.is_empty() {
                    return ("never".into(), None);
                }
                let n = v.len();
                let (m, lo, hi) = median_min_max(v);
                let missing = if n < runs { format!(" ({n} of {runs} runs)") } else { String::new() };
                (format!("{m:.1} ({lo:.1}-{hi:.1}){missing}"), Some(m))
            };
            let (mut shed, shed_m) = stat(pick(|r| r.first_shed_s));
            if all.iter().all(|(_, r)| r[i].shedding_before) {
                shed = "already shedding".into();
            }
            let (cut, cut_m) = stat(pick(|r| r.first_cut_s));
            let goodputs = pick(|r| r.goodput_s);
            let all_back = goodputs.len() == runs;
            let (back, back_m) = stat(goodputs);
            let settles = pick(|r| r.settle_s);
            let all_settled = settles.len() == runs;
            let (settle, settle_m) = stat(settles);
            let (level, level_m) = stat(all.iter().map(|(_, r)| r[i].settled_limit).collect());
            let met = all_back && back_m.is_some_and(|s| s <= 0.5) && all_settled && settle_m.is_some_and(|s| s <= 1.0);
            let _ = writeln!(
                md,
                "| {label} | {} | {shed} | {cut} | {back} | {settle} | {level} | {} |",
                e.name,
                if met { "yes" } else { "no" }
            );
            json_events.push(serde_json::json!({"controller": label, "server": server.name(), "event": e.name, "at_s": e.at_s, "first_shed_s": shed_m, "first_cut_s": cut_m, "goodput_back_s": back_m, "settle_s": settle_m, "settled_limit": level_m, "met_targets": met}));
        }
        let timeline: Vec<_> = bins
            .iter()
            .map(|b| serde_json::json!({"t": b.t, "limit": b.limit, "in_flight": b.in_flight, "offered_rps": b.offered, "capacity_rps": b.capacity, "answered": b.answered, "refused": b.refused, "timeouts": b.timeouts, "p99_ms": b.p99_ms}))
            .collect();
        timelines.insert(label.to_owned(), serde_json::Value::Array(timeline));
    }
    let _ = writeln!(
        md,
        "\n| controller | steady limit | swing | within +/-10% |\n|---|---|---|---|\n{}",
        steady_rows.join("\n")
    );
    let json = serde_json::json!({
        "benchmark": "B5 adaptation",
        "runs": runs,
        "events": json_events,
        "steady": json_steady,
        "timeline_run_0": timelines.get("gradient").cloned().unwrap_or_default(),
        "timelines_run_0": timelines,
    });
    Ok((json, md))
}

fn fmt_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.1}"))
}
