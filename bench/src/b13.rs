// SPDX-License-Identifier: MIT OR Apache-2.0
//! B13: steering before shedding. Four backends in namespaces of their own,
//! each 4 workers x 20 ms (kept-alive HTTP/1.1, workers read when free),
//! behind a real HAProxy (round robin, kept-alive connections to the
//! backends). One backend slows 5x midway; open-loop clients send 0.7x of
//! what the fleet can still serve, with a 1 s deadline. Side by side in one
//! run: no gates, gates only, gates with HAProxy's retries and redispatch,
//! and gates with `agent-check` on each gate's `--agent-port`; and the last
//! two with no slowdown, so what steering costs when all is well shows.
use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shed_testkit::{
    fleet::{Balancing, Fleet, Haproxy},
    gate::{Gate, Log},
    testbed::{self, OpenLoop, Outcome},
};

use crate::{
    common::{PORT, Scale, median_min_max, percentile},
    plot,
};

const BACKENDS: usize = 4;
const WORKERS: usize = 4;
const SERVICE_US: u64 = 20_000;
const SLOWDOWN: u64 = 5;
const AGENT_PORT: u16 = 9500;
/// HAProxy's agent-check interval.
const AGENT_INTER_MS: u32 = 250;
/// How often the run is sampled.
const TICK: Duration = Duration::from_millis(250);

/// One backend's capacity, and the fleet's with one backend slowed.
const CAPACITY: f64 = WORKERS as f64 * 1e6 / SERVICE_US as f64;
const SLOW_CAPACITY: f64 = CAPACITY / SLOWDOWN as f64;
const FLEET_SLOWED: f64 = (BACKENDS - 1) as f64 * CAPACITY + SLOW_CAPACITY;
const OFFERED: f64 = 0.7 * FLEET_SLOWED;

#[derive(Clone, Copy, PartialEq)]
enum Gates {
    None,
    Gated(Balancing),
}

struct Config {
    name: &'static str,
    gates: Gates,
    slowdown: bool,
}

const CONFIGS: [Config; 6] = [
    Config { name: "no gates", gates: Gates::None, slowdown: true },
    Config { name: "gates only", gates: Gates::Gated(Balancing::RoundRobin), slowdown: true },
    Config { name: "gates + retries, redispatch", gates: Gates::Gated(Balancing::Redispatch), slowdown: true },
    Config {
        name: "gates + agent-check",
        gates: Gates::Gated(Balancing::AgentCheck { port: AGENT_PORT, inter_ms: AGENT_INTER_MS }),
        slowdown: true,
    },
    Config { name: "gates only, no slowdown", gates: Gates::Gated(Balancing::RoundRobin), slowdown: false },
    Config {
        name: "gates + agent-check, no slowdown",
        gates: Gates::Gated(Balancing::AgentCheck { port: AGENT_PORT, inter_ms: AGENT_INTER_MS }),
        slowdown: false,
    },
];

struct Run {
    goodput: f64,
    refused: f64,
    p99_ms: f64,
    /// Seconds from the slowdown until the slowed backend is sent at most its capacity (None: never).
    shift_s: Option<f64>,
    /// The slowed backend's share of the requests HAProxy sent, per tick: (seconds, percent).
    share: Vec<(f64, f64)>,
}

/// Refusals summed over the gates (`stats --json`, every namespace).
fn refusals(shedctl: &Path) -> Result<u64> {
    let out = std::process::Command::new(shedctl).args(["stats", "--json"]).output()?;
    anyhow::ensure!(out.status.success(), "stats: {}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    Ok(all.iter().map(|p| p["rejected"].as_u64().unwrap_or(0)).sum())
}

fn run_once(shedctl: &Path, config: &Config, seconds: f64, slow_at: f64) -> Result<Run> {
    let fleet = Fleet::create("shb13", BACKENDS)?;
    let serving = fleet.serve(PORT, WORKERS, SERVICE_US)?;
    let (gate, balancing) = match config.gates {
        Gates::None => (None, Balancing::RoundRobin),
        Gates::Gated(balancing) => {
            let mut args = fleet.netns_args();
            args.extend(["--port", "8080", "--action", "rst", "--agent-port", "9500"].map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (Some(Gate::launch(shedctl, &args, Log::Discard)?), balancing)
        }
    };
    let lb: SocketAddr = "127.0.0.1:8000".parse()?;
    let haproxy = Haproxy::start(&fleet.lb_ns, lb, &serving.addrs, balancing)?;
    let rate = Arc::new(AtomicU64::new(OFFERED as u64));
    let load = OpenLoop::start_with(&fleet.lb_ns, lb, rate, Duration::from_secs(1), testbed::HTTP_REQUEST);
    let refused_before = if gate.is_some() { refusals(shedctl)? } else { 0 };
    let start = Instant::now();
    let mut sent: Vec<(f64, Vec<u64>)> = Vec::new();
    let mut slowed = false;
    while start.elapsed().as_secs_f64() < seconds {
        thread::sleep(TICK);
        let t = start.elapsed().as_secs_f64();
        if config.slowdown && !slowed && t >= slow_at {
            serving.service_us[0].store(SERVICE_US * SLOWDOWN, Ordering::Relaxed);
            slowed = true;
        }
        sent.push((t, haproxy.requests().context("haproxy show stat")?));
    }
    let outcomes = load.finish();
    let refused = if gate.is_some() { refusals(shedctl)? - refused_before } else { 0 };
    drop(gate);
    let mut answered: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Answered(l) => Some(l.as_secs_f64() * 1e3),
            _ => None,
        })
        .collect();
    answered.sort_by(f64::total_cmp);
    // The slowed backend's share of what HAProxy sent, and its rate, over the last 500 ms at each tick.
    let mut share = Vec::new();
    let mut shift_s = None;
    for (i, (t, now)) in sent.iter().enumerate().skip(2) {
        let (_, then) = &sent[i - 2];
        let delta: Vec<u64> = now.iter().zip(then).map(|(a, b)| a - b).collect();
        let total: u64 = delta.iter().sum();
        share.push((*t, delta[0] as f64 * 100.0 / total.max(1) as f64));
        // The shift, from the last tick alone (250 ms: a slowed backend still sent
        // its round-robin share gets 28 requests a tick, at its capacity 10).
        let (t_before, before) = &sent[i - 1];
        let rate = (now[0] - before[0]) as f64 / (t - t_before);
        if config.slowdown && shift_s.is_none() && *t >= slow_at + 0.25 && rate <= SLOW_CAPACITY {
            shift_s = Some(t - slow_at);
        }
    }
    Ok(Run {
        goodput: answered.len() as f64 / outcomes.len().max(1) as f64,
        refused: refused as f64 / outcomes.len().max(1) as f64,
        p99_ms: percentile(&answered, 0.99).unwrap_or(0.0),
        shift_s,
        share,
    })
}

/// How long the agent takes to answer one check, while the fleet is loaded (µs, sorted).
fn agent_answer_times(shedctl: &Path, checks: usize) -> Result<Vec<f64>> {
    let fleet = Fleet::create("shb13", 1)?;
    let (ns, addr) = fleet.backends[0].clone();
    let _serving = fleet.serve(PORT, WORKERS, SERVICE_US)?;
    let args = ["--netns", ns.as_str(), "--port", "8080", "--action", "rst", "--agent-port", "9500"];
    let _gate = Gate::launch(shedctl, &args, Log::Discard)?;
    let mut times = testbed::run_in(&fleet.lb_ns, move || {
        (0..checks)
            .map(|_| {
                let start = Instant::now();
                let mut conn = std::net::TcpStream::connect((addr, AGENT_PORT))?;
                let mut line = String::new();
                std::io::Read::read_to_string(&mut conn, &mut line)?;
                anyhow::ensure!(line.ends_with("%\n"), "agent answered {line:?}");
                Ok(start.elapsed().as_secs_f64() * 1e6)
            })
            .collect::<Result<Vec<f64>>>()
    })??;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

pub(crate) fn b13(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let (seconds, slow_at, repeats) = scale.pick((20.0, 5.0, 3), (12.0, 4.0, 1), (6.0, 2.0, 1));
    let smoke = |c: &Config| scale != Scale::Smoke || c.name == "gates + agent-check";
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let mut curves = Vec::new();
    for config in CONFIGS.iter().filter(|c| smoke(c)) {
        let runs: Vec<Run> =
            (0..repeats).map(|_| run_once(shedctl, config, seconds, slow_at)).collect::<Result<_>>()?;
        let (goodput, glo, ghi) = median_min_max(runs.iter().map(|r| r.goodput * 100.0).collect());
        let (refused, rlo, rhi) = median_min_max(runs.iter().map(|r| r.refused * 100.0).collect());
        let (p99, _, _) = median_min_max(runs.iter().map(|r| r.p99_ms).collect());
        let shifts: Vec<f64> = runs.iter().filter_map(|r| r.shift_s).collect();
        let shift = if !config.slowdown {
            "-".to_owned()
        } else if shifts.len() < runs.len() {
            format!("never ({} of {} runs)", runs.len() - shifts.len(), runs.len())
        } else {
            let (m, lo, hi) = median_min_max(shifts.clone());
            format!("{m:.2} s ({lo:.2}-{hi:.2})")
        };
        println!(
            "B13 {:<34} goodput {goodput:5.1}% refused {refused:5.2}% p99 {p99:6.0} ms shift {shift}",
            config.name
        );
        rows.push(format!(
            "| {} | {goodput:.1}% ({glo:.1}-{ghi:.1}) | {refused:.2}% ({rlo:.2}-{rhi:.2}) | {p99:.0} | {shift} |",
            config.name
        ));
        json.push(serde_json::json!({"config": config.name, "slowdown": config.slowdown, "goodput_percent": goodput, "goodput_min": glo, "goodput_max": ghi, "refused_percent": refused, "refused_min": rlo, "refused_max": rhi, "p99_ms": p99, "shift_seconds": shifts}));
        if config.slowdown {
            // The median run's share timeline (by goodput).
            let mut by_goodput: Vec<&Run> = runs.iter().collect();
            by_goodput.sort_by(|a, b| a.goodput.total_cmp(&b.goodput));
            let median = by_goodput[by_goodput.len() / 2];
            curves.push(plot::Series {
                name: config.name.to_owned(),
                points: median.share.iter().map(|&(t, s)| (t, s, s, s)).collect(),
            });
        }
    }
    plot::values_vs(
        &out.join("b13_steering.png"),
        &format!("B13: the slowed backend's share of requests (slowed 5x at {slow_at:.0} s)"),
        ("seconds", "share sent to the slowed backend (%)"),
        &curves,
    )?;
    let checks = scale.pick(1000, 200, 50);
    let times = agent_answer_times(shedctl, checks)?;
    let (p50, p99) = (percentile(&times, 0.5).unwrap_or(0.0), percentile(&times, 0.99).unwrap_or(0.0));
    println!("B13 agent answer: p50 {p50:.0} µs, p99 {p99:.0} µs over {checks} checks");
    let setup = format!(
        "{BACKENDS} backends, each {WORKERS} workers x {} ms ({CAPACITY:.0} req/s; HTTP/1.1 keep-alive, workers read when free) in a namespace of its own, gated by one `shedctl attach --netns ... --action rst --agent-port 9500`; HAProxy 2.6 in front (round robin, kept-alive connections to the backends, one thread; agent-check every {AGENT_INTER_MS} ms); backend 0 slowed {SLOWDOWN}x at {slow_at:.0} s; open-loop clients at {OFFERED:.0} req/s (0.7 x {FLEET_SLOWED:.0}, what the fleet can serve with one backend slowed), a new connection to HAProxy per request, 1 s deadline; {seconds:.0} s per run, {repeats} run(s) per configuration",
        SERVICE_US / 1000
    );
    let mut md = String::new();
    let _ = writeln!(md, "\n## B13: steering before shedding (HAProxy agent-check)\n");
    let _ = writeln!(
        md,
        "{setup}. Goodput: requests answered `200` within the deadline / requests sent. Refused: the gates' refusals (every reason, retried or not) / requests sent. Shift: from the slowdown to the end of the first 250 ms in which HAProxy sent the slowed backend at most its capacity ({SLOW_CAPACITY:.0} req/s). Median of runs (min-max).\n\n![B13](b13_steering.png)\n"
    );
    let _ = writeln!(md, "| configuration | goodput | refused | p99 ms | traffic shifted |\n|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    let _ = writeln!(
        md,
        "\nThe agent's answer (connect to the line, from the balancer's namespace, {checks} checks): p50 {p50:.0} µs, p99 {p99:.0} µs."
    );
    Ok((
        serde_json::json!({"benchmark": "B13 steering", "setup": setup, "configs": json, "agent_answer_us": {"p50": p50, "p99": p99, "checks": checks}}),
        md,
    ))
}
