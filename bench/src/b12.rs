// SPDX-License-Identifier: MIT OR Apache-2.0
//! B12: overload carried by kept-alive connections. A client keeps a pool
//! (each arrival takes an idle pooled connection, or opens a new one) warmed
//! with 0, 50 or 200 connections; open-loop arrivals at 2x and 4x the
//! capacity of 4 workers x 20 ms, a 1 s deadline (a late request closes its
//! connection). Against a kept-alive server whose workers read when free,
//! and one that reads every request at once.
use std::{
    fmt::Write as _,
    path::Path,
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::Duration,
};

use anyhow::Result;
use shed_testkit::testbed::{Backend, Outcome, PoolClient, PoolLoad, Service, Testbed};

use crate::{
    common::{PORT, Scale, median_min_max, nft_cap, percentile, start_gate},
    plot,
};

const WORKERS: usize = 4;
const SERVICE_US: u64 = 20_000;
const CAPACITY: f64 = WORKERS as f64 * 1e6 / SERVICE_US as f64;

struct Config {
    name: &'static str,
    shed: Option<&'static [&'static str]>,
    /// An nftables connection cap instead (hand-tuned: the workers plus a short queue).
    nft_cap: Option<u32>,
    honour_retry_after: bool,
}

const CONFIGS: [Config; 4] = [
    Config { name: "no gate", shed: None, nft_cap: None, honour_retry_after: false },
    Config { name: "nftables ct count 8 (hand-tuned)", shed: None, nft_cap: Some(8), honour_retry_after: false },
    Config { name: "shed rst", shed: Some(&["--action", "rst"]), nft_cap: None, honour_retry_after: false },
    Config {
        name: "shed http, client honours Retry-After",
        shed: Some(&["--action", "http"]),
        nft_cap: None,
        honour_retry_after: true,
    },
];

/// The server shapes: name and service.
fn service(at_once: bool, service_us: &Arc<AtomicU64>) -> Service {
    if at_once {
        Service::ReadAtOnce { workers: WORKERS, service_us: service_us.clone() }
    } else {
        Service::HttpKeepAliveWorkers { workers: WORKERS, service_us: service_us.clone() }
    }
}

struct Run {
    goodput: f64,
    p99_ms: f64,
    /// Of the requests that arrived after the first second (the limit
    /// settling from its start, which a whole run's p99 of a few thousand
    /// answers is made of).
    settled_p99_ms: f64,
    attempts_per_success: f64,
}

/// What a run's p99 leaves out to be the settled one: its first second.
const SETTLING: Duration = Duration::from_secs(1);

/// The client: a connection per request (closed once answered), or a pool warmed with this many.
#[derive(Clone, Copy, PartialEq)]
enum Client {
    PerRequest,
    Pool(usize),
}

impl Client {
    fn label(self) -> String {
        match self {
            Self::PerRequest => "per request".into(),
            Self::Pool(warm) => warm.to_string(),
        }
    }
}

fn run_once(shedctl: &Path, config: &Config, at_once: bool, client: Client, load: f64, seconds: u64) -> Result<Run> {
    let bed = Testbed::create("shedb12")?;
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(SERVICE_US));
    let _backend = Backend::start(&bed.server_ns, addr, service(at_once, &service_us))?;
    let _gate = config.shed.map(|args| start_gate(shedctl, &bed, args)).transpose()?;
    let (warm, reuse) = match client {
        Client::PerRequest => (0, false),
        Client::Pool(warm) => (warm, true),
    };
    let client =
        PoolClient { warm, deadline: Duration::from_secs(1), honour_retry_after: config.honour_retry_after, reuse };
    let rate = Arc::new(AtomicU64::new((load * CAPACITY) as u64));
    let pool = PoolLoad::start(&bed.client_ns, addr, rate, client)?;
    // The cap after the warm pool: it holds only new connections back, as a firewall's would.
    if let Some(cap) = config.nft_cap {
        nft_cap(&bed.server_ns, cap)?;
    }
    thread::sleep(Duration::from_secs(seconds));
    let outcomes = pool.finish();
    let first = outcomes.iter().map(|o| o.started).min();
    let latencies = |after: Duration| {
        let mut ms: Vec<f64> = outcomes
            .iter()
            .filter(|o| first.is_some_and(|first| o.started >= first + after))
            .filter_map(|o| match o.outcome {
                Outcome::Answered(l) => Some(l.as_secs_f64() * 1e3),
                _ => None,
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    };
    let answered = latencies(Duration::ZERO);
    let settled = latencies(SETTLING);
    let attempts: u64 = outcomes.iter().map(|o| u64::from(o.attempts)).sum();
    Ok(Run {
        goodput: answered.len() as f64 / seconds as f64 / CAPACITY,
        p99_ms: percentile(&answered, 0.99).unwrap_or(0.0),
        settled_p99_ms: percentile(&settled, 0.99).unwrap_or(0.0),
        attempts_per_success: attempts as f64 / answered.len().max(1) as f64,
    })
}

pub(crate) fn b12(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let (seconds, repeats) = scale.pick((10, 3), (5, 1), (2, 1));
    // Pools, and a connection per request beside them in the same run (the p99 to compare with).
    let clients: &[Client] = scale.pick(
        &[Client::PerRequest, Client::Pool(0), Client::Pool(50), Client::Pool(200)],
        &[Client::PerRequest, Client::Pool(0), Client::Pool(200)],
        &[Client::Pool(50)],
    );
    let loads: &[f64] = scale.pick(&[2.0, 4.0], &[2.0, 4.0], &[2.0]);
    let smoke = |c: &Config| scale != Scale::Smoke || c.name == "no gate" || c.name == "shed rst";
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let mut curves = Vec::new();
    for at_once in [false, true] {
        let server = if at_once { "reads at once" } else { "reads when free" };
        for config in CONFIGS.iter().filter(|c| smoke(c)) {
            for &load in loads {
                let mut curve = plot::Series { name: format!("{server}: {} at {load}x", config.name), points: vec![] };
                for &client in clients {
                    let runs: Vec<Run> = (0..repeats)
                        .map(|_| run_once(shedctl, config, at_once, client, load, seconds))
                        .collect::<Result<_>>()?;
                    let warm = client.label();
                    let (goodput, lo, hi) = median_min_max(runs.iter().map(|r| r.goodput).collect());
                    let (p99, _, _) = median_min_max(runs.iter().map(|r| r.p99_ms).collect());
                    let (settled, _, _) = median_min_max(runs.iter().map(|r| r.settled_p99_ms).collect());
                    let (attempts, _, _) = median_min_max(runs.iter().map(|r| r.attempts_per_success).collect());
                    println!(
                        "B12 {server:<16} {:<40} {load}x pool {warm:>11}: goodput {:5.1}% ({:.1}-{:.1}), p99 {p99:6.1} ms (after the first second {settled:6.1}), attempts/success {attempts:.2}",
                        config.name,
                        goodput * 100.0,
                        lo * 100.0,
                        hi * 100.0
                    );
                    rows.push(format!(
                        "| {server} | {} | {load}x | {warm} | {:.1}% ({:.1}-{:.1}) | {p99:.0} | {settled:.0} | {attempts:.2} |",
                        config.name,
                        goodput * 100.0,
                        lo * 100.0,
                        hi * 100.0
                    ));
                    json.push(serde_json::json!({"server": server, "config": config.name, "load": load, "pool": warm, "goodput_fraction": goodput, "goodput_min": lo, "goodput_max": hi, "p99_ms": p99, "settled_p99_ms": settled, "attempts_per_success": attempts}));
                    if let Client::Pool(warm) = client {
                        curve.points.push((warm as f64, goodput * 100.0, lo * 100.0, hi * 100.0));
                    }
                }
                curves.push(curve);
            }
        }
    }
    plot::goodput_vs(
        &out.join("b12_kept_alive.png"),
        "B12: overload carried by kept-alive pools (4 workers x 20 ms, 1 s deadline)",
        ("warm pool (connections)", "goodput (% of capacity)"),
        &curves,
    )?;
    let setup = format!(
        "{WORKERS} workers x {} ms HTTP/1.1 keep-alive ({CAPACITY:.0} req/s); a client pool (an idle pooled connection per arrival, else a new one; a reset reused connection retried once on a new one; a late answer closes its connection) warmed with 0-200 connections, or a connection per request; open-loop arrivals; 1 s deadline; {seconds} s per run, {repeats} run(s) per point",
        SERVICE_US / 1000
    );
    let mut md = String::new();
    let _ = writeln!(md, "\n## B12: overload on kept-alive connections\n");
    let _ = writeln!(
        md,
        "{setup}. Goodput: answers within the deadline / capacity (median of runs, min-max). p99 of answered requests, and of those that arrived after the first second (the limit settling from its start is most of a run's p99); attempts per answered request (resets retried, 503s retried after Retry-After when the client honours it). \"per request\": the same client opening a connection per request and closing it once answered, in the same run (the p99 a pool's is held to).\n\n![B12](b12_kept_alive.png)\n"
    );
    let _ = writeln!(
        md,
        "| server | configuration | load | warm pool | goodput | p99 ms | p99 after the first second, ms | attempts per success |\n|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((serde_json::json!({"benchmark": "B12 kept-alive overload", "setup": setup, "points": json}), md))
}
