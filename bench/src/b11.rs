// SPDX-License-Identifier: MIT OR Apache-2.0
//! B11: a retry storm. A client population whose HTTP library retries
//! (Python urllib3, `Retry(total=3, backoff_factor=0.1,
//! status_forcelist=[503], respect_retry_after_header=True)`, a new
//! connection per attempt) sends requests open-loop at 2x and 4x a backend's
//! capacity, against shed refusing with `drop`, `rst` and `http`, side by
//! side in one run (and no gate). Per configuration: goodput (requests that
//! end in a 200 within their deadline, as a share of capacity), connection
//! attempts per successful request, and the client-seen p99 of successful
//! requests (first attempt to answer, retries and waits included).
use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use shed_testkit::testbed::{Backend, Service, Testbed};

use crate::{
    common::{PORT, Scale, median_min_max, start_gate},
    plot,
};

const WORKERS: usize = 2;
const SERVICE_US: u64 = 50_000;
/// Requests per second the backend answers.
const CAPACITY: f64 = WORKERS as f64 * 1e6 / SERVICE_US as f64;
/// A request counts for goodput if it ends in a 200 within this long of its
/// first attempt, and within the arrivals' window (after it, retries would
/// find a backend no new arrivals compete for).
const DEADLINE_S: f64 = 5.0;
/// The fixed limit every shed configuration uses (hand-tuned for 2 workers:
/// the comparison is of the refusal, not of the controller).
const LIMIT: &str = "6";

struct Config {
    name: &'static str,
    /// The `--action` of shed; None: no gate.
    action: Option<&'static str>,
}

const CONFIGS: [Config; 4] = [
    Config { name: "no gate", action: None },
    Config { name: "shed drop", action: Some("drop") },
    Config { name: "shed rst", action: Some("rst") },
    Config { name: "shed http (503 + Retry-After)", action: Some("http") },
];

const LOADS: [f64; 2] = [2.0, 4.0];

/// The client population: one thread per request in flight (up to 1,000),
/// requests started open-loop at `rate` per second for `seconds`; prints one
/// JSON line of totals. urllib3 from Debian's python3-urllib3 (1.26).
const CLIENTS: &str = r#"
import json, sys, threading, time
import urllib3
from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout
from concurrent.futures import ThreadPoolExecutor
url, rate, seconds, deadline = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
pool = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
lock = threading.Lock()
totals = {"requests": 0, "ok": 0, "ok_in_time": 0, "attempts": 0, "attempts_ok": 0, "failed": 0}
latencies = []
def one():
    retry = Retry(total=3, backoff_factor=0.1, status_forcelist=[503], respect_retry_after_header=True, raise_on_status=False)
    started = time.monotonic()
    try:
        r = pool.request("GET", url, retries=retry, timeout=Timeout(connect=2.0, read=5.0), headers={"Connection": "close"})
        attempts, ok = 1 + len(r.retries.history), r.status == 200
    except urllib3.exceptions.MaxRetryError:
        attempts, ok = 4, False
    except Exception:
        attempts, ok = 1, False
    done = time.monotonic()
    took = done - started
    with lock:
        totals["requests"] += 1
        totals["attempts"] += attempts
        if ok:
            totals["ok"] += 1
            totals["attempts_ok"] += attempts
            latencies.append(took)
            # Goodput counts what the backend finished within the arrivals' window
            # (the most it can finish there is its capacity), within the deadline.
            if took <= deadline and done - start <= seconds:
                totals["ok_in_time"] += 1
        else:
            totals["failed"] += 1
with ThreadPoolExecutor(max_workers=1000) as workers:
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        workers.submit(one)
latencies.sort()
p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None
totals["p50_s"], totals["p99_s"] = p(0.5), p(0.99)
print(json.dumps(totals))
"#;

/// What one run measured.
struct Run {
    goodput: f64,
    attempts_per_success: f64,
    p99_ms: f64,
    syns_per_success: Option<f64>,
}

fn run_once(shedctl: &Path, config: &Config, load: f64, seconds: u64) -> Result<Run> {
    let bed = Testbed::create("shedb11")?;
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(SERVICE_US));
    let _backend = Backend::start(&bed.server_ns, addr, Service::HttpWorkers { workers: WORKERS, service_us })?;
    let gate = config
        .action
        .map(|action| {
            start_gate(shedctl, &bed, &["--limit", LIMIT, "--action", action, "--hook", "tc", "--rst-rate", "0"])
        })
        .transpose()?;
    let rate = load * CAPACITY;
    let out = Command::new("timeout")
        .args([&(seconds + 60).to_string(), "ip", "netns", "exec", &bed.client_ns, "/usr/bin/python3", "-c", CLIENTS])
        .args([&format!("http://{addr}/"), &rate.to_string(), &seconds.to_string(), &DEADLINE_S.to_string()])
        .output()
        .context("run the urllib3 clients (cargo xtask setup installs python3-urllib3)")?;
    let syns = gate.as_ref().and_then(|_| {
        let maps = shed::kernel::maps::GateMaps::open_pinned().ok()?;
        let s = maps.snapshot(PORT, maps.config(PORT).ok()?).ok()?;
        Some(s.counter(shed_common::counter::SYN_SEEN))
    });
    drop(gate);
    if !out.status.success() {
        bail!("{}: the clients failed: {}", config.name, String::from_utf8_lossy(&out.stderr));
    }
    let totals: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("the clients' totals: {}", String::from_utf8_lossy(&out.stdout)))?;
    let n = |k: &str| totals[k].as_f64().unwrap_or(0.0);
    let ok = n("ok").max(1.0);
    Ok(Run {
        goodput: n("ok_in_time") / seconds as f64 / CAPACITY,
        attempts_per_success: n("attempts") / ok,
        p99_ms: totals["p99_s"].as_f64().map_or(f64::NAN, |s| s * 1000.0),
        syns_per_success: syns.map(|s| s as f64 / ok),
    })
}

pub(crate) fn b11(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let (seconds, repeats) = scale.pick((10, 3), (6, 1), (3, 1));
    let smoke =
        |c: &Config, load: f64| scale != Scale::Smoke || (load == LOADS[0] && matches!(c.action, Some("rst" | "http")));
    let mut json = Vec::new();
    let mut rows = Vec::new();
    let mut series: Vec<plot::Series> = Vec::new();
    let mut attempt_series: Vec<plot::Series> = Vec::new();
    for config in &CONFIGS {
        let mut row = vec![config.name.to_owned()];
        let mut curve = plot::Series { name: config.name.to_owned(), points: Vec::new() };
        let mut attempt_curve = plot::Series { name: config.name.to_owned(), points: Vec::new() };
        for load in LOADS {
            if !smoke(config, load) {
                row.push("-".into());
                continue;
            }
            let mut runs = Vec::new();
            for _ in 0..repeats {
                runs.push(run_once(shedctl, config, load, seconds)?);
                thread::sleep(Duration::from_millis(300));
            }
            let stat = |f: fn(&Run) -> f64| median_min_max(runs.iter().map(f).collect());
            let (goodput, glo, ghi) = stat(|r| r.goodput);
            let (attempts, alo, ahi) = stat(|r| r.attempts_per_success);
            let (p99, _, _) = stat(|r| r.p99_ms);
            let syns = runs
                .iter()
                .all(|r| r.syns_per_success.is_some())
                .then(|| stat(|r| r.syns_per_success.unwrap_or(0.0)).0);
            println!(
                "B11 {:<32} {load}x: goodput {:5.1}% ({:.1}-{:.1}), {attempts:.2} attempts per success, p99 {p99:.0} ms{}",
                config.name,
                goodput * 100.0,
                glo * 100.0,
                ghi * 100.0,
                syns.map_or(String::new(), |s| format!(", {s:.2} SYNs per success"))
            );
            row.push(format!(
                "{:.1}% ({:.1}-{:.1}), {attempts:.2} attempts, p99 {p99:.0} ms{}",
                goodput * 100.0,
                glo * 100.0,
                ghi * 100.0,
                syns.map_or(String::new(), |s| format!(", {s:.2} SYNs"))
            ));
            curve.points.push((load, goodput * 100.0, glo * 100.0, ghi * 100.0));
            attempt_curve.points.push((load, attempts, alo, ahi));
            json.push(serde_json::json!({
                "config": config.name, "load": load,
                "goodput_fraction": goodput, "goodput_min": glo, "goodput_max": ghi,
                "attempts_per_success": attempts, "syns_per_success": syns, "p99_ms": p99,
                "runs": runs.iter().map(|r| serde_json::json!({"goodput": r.goodput, "attempts_per_success": r.attempts_per_success, "p99_ms": r.p99_ms})).collect::<Vec<_>>(),
            }));
        }
        rows.push(format!("| {} |", row.join(" | ")));
        if !curve.points.is_empty() {
            series.push(curve);
            attempt_series.push(attempt_curve);
        }
    }
    let plot_path = out.join("b11_retry_storm.png");
    plot::goodput_vs_load(&plot_path, "B11: a retry storm (urllib3, 3 retries), goodput by refusal", &series)?;
    plot::values_vs(
        &out.join("b11_attempts.png"),
        "B11: connection attempts per successful request",
        ("offered load (x capacity)", "attempts per success"),
        &attempt_series,
    )?;
    let setup = format!(
        "{WORKERS} workers x {} ms HTTP/1.1 ({CAPACITY:.0} req/s); clients: Python urllib3 1.26, a new connection per attempt, `Retry(total=3, backoff_factor=0.1, status_forcelist=[503], respect_retry_after_header=True)`, connect timeout 2 s, open-loop arrivals at 2x and 4x capacity for {seconds} s; shed `--limit {LIMIT} --hook tc --rst-rate 0` (Retry-After derived: the queue wait rounded up, 1 s here); {repeats} run(s) per point",
        SERVICE_US / 1000
    );
    let mut md = String::new();
    let _ = writeln!(md, "\n## B11: a retry storm (clients whose library retries)\n");
    let _ = writeln!(
        md,
        "{setup}. Goodput: requests that ended in a 200 within {DEADLINE_S} s of their first attempt and within the arrivals' window, per second of it, as a share of capacity (median, min-max). Attempts: connections the library opened per successful request (SYNs: what the gate saw per success). p99: client-seen, first attempt to the answer, of successful requests.\n\n![goodput by refusal](b11_retry_storm.png)\n![attempts per success](b11_attempts.png)\n"
    );
    let _ = writeln!(md, "| configuration | 2x capacity | 4x capacity |\n|---|---|---|");
    for r in &rows {
        let _ = writeln!(md, "{r}");
    }
    let point = |name: &str, load: f64| {
        json.iter().find(|p| p["config"] == name && p["load"] == load).map(|p| {
            (p["goodput_fraction"].as_f64().unwrap_or(0.0), p["attempts_per_success"].as_f64().unwrap_or(f64::INFINITY))
        })
    };
    let mut verdicts = Vec::new();
    for load in LOADS {
        if let (Some((g_rst, a_rst)), Some((g_http, a_http))) =
            (point("shed rst", load), point("shed http (503 + Retry-After)", load))
        {
            let held = a_http < a_rst && g_http >= g_rst * 0.98;
            verdicts.push(serde_json::json!({"load": load, "http_fewer_attempts_same_goodput": held}));
            let _ = writeln!(
                md,
                "\nAt {load}x: http needs {a_http:.2} attempts per success against rst's {a_rst:.2}, with goodput {:.1}% against {:.1}% (expectation: fewer attempts, at least the same goodput within 2%: {}).",
                g_http * 100.0,
                g_rst * 100.0,
                if held { "held" } else { "not held" }
            );
        }
    }
    Ok((serde_json::json!({"benchmark": "B11 retry storm", "setup": setup, "points": json, "verdicts": verdicts}), md))
}
