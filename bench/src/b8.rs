// SPDX-License-Identifier: MIT OR Apache-2.0
//! B8: synchronized bursts from a real load generator. h2load opens each
//! second's connections at once (`--h1 -r N -m 1 -T 1`: one HTTP/1.1 request
//! per connection, 1 s to finish it), at 2x the capacity of a 4 x 20 ms
//! HTTP/1.1 server. Goodput is the requests answered within that second, as a
//! fraction of what the server could answer within it (its capacity: with a
//! 1 s objective every answer that lands in time counts); the limit is
//! sampled every 100 ms.
use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use shed::kernel::maps::GateMaps;
use shed_testkit::testbed::Testbed;

use crate::{
    b4::{Server, start_server},
    common::{PORT, Scale, median_min_max, start_gate},
};

const WORKERS: usize = 4;
const SERVICE_US: u64 = 20_000;
const LOAD: f64 = 2.0;

struct Config {
    name: &'static str,
    /// `shedctl attach` arguments; None: no gate.
    shed: Option<&'static [&'static str]>,
    server: Server,
}

/// The same, against the servers that read every request at once.
const AT_ONCE: [Server; 2] = [Server::ThreadPerConnection, Server::Go];
const AT_ONCE_CONFIGS: [(&str, Option<&[&str]>); 4] = [
    ("no gate", None),
    ("shed fixed 190 (hand-tuned)", Some(&["--limit", "190"])),
    ("shed (defaults)", Some(&[])),
    ("shed (defaults), objective 1 s", Some(&["--target-latency", "1000"])),
];

const CONFIGS: [Config; 6] = [
    Config { name: "no gate", shed: None, server: Server::ReadsWhenFree },
    // 200/s x 0.95 s: what the 4 workers answer within the second, tuned by hand.
    Config { name: "shed fixed 190 (hand-tuned)", shed: Some(&["--limit", "190"]), server: Server::ReadsWhenFree },
    Config { name: "shed gradient", shed: Some(&["--algo", "gradient"]), server: Server::ReadsWhenFree },
    Config { name: "shed queue", shed: Some(&["--algo", "queue"]), server: Server::ReadsWhenFree },
    Config {
        name: "shed gradient, objective 1 s",
        shed: Some(&["--algo", "gradient", "--target-latency", "1000"]),
        server: Server::ReadsWhenFree,
    },
    Config {
        name: "shed queue, objective 1 s",
        shed: Some(&["--algo", "queue", "--target-latency", "1000"]),
        server: Server::ReadsWhenFree,
    },
];

/// One run: the goodput fraction and the limits sampled during it.
fn run_once(shedctl: &std::path::Path, config: &Config, seconds: u64) -> Result<(f64, Vec<u32>)> {
    let bed = Testbed::create("shedb8")?;
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(SERVICE_US));
    let _server = start_server(config.server, &bed, addr, WORKERS, &service_us, true)?;
    let gate = config.shed.map(|args| start_gate(shedctl, &bed, &[&["--action", "rst"], args].concat())).transpose()?;
    let capacity = WORKERS as f64 * 1e6 / SERVICE_US as f64;
    let per_second = (LOAD * capacity) as u64;
    let total = per_second * seconds;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = gate.is_some().then(|| {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut limits = Vec::new();
            let Ok(maps) = GateMaps::open_pinned() else { return limits };
            while !stop.load(Ordering::Relaxed) {
                if let Ok(snapshot) = maps.config(PORT).and_then(|c| maps.snapshot(PORT, c)) {
                    limits.push(snapshot.limit);
                }
                thread::sleep(Duration::from_millis(100));
            }
            limits
        })
    });
    let out = Command::new("ip")
        .args(["netns", "exec", &bed.client_ns, "h2load", "--h1", "-m", "1", "-T", "1", "-t", "1"])
        .args(["-r", &per_second.to_string(), "-c", &total.to_string(), "-n", &total.to_string()])
        .arg(format!("http://{addr}/"))
        .stderr(Stdio::null())
        .output()
        .context("run h2load (apt-get install nghttp2-client, or cargo xtask setup)")?;
    stop.store(true, Ordering::Relaxed);
    let limits = sampler.map(|s| s.join().unwrap_or_default()).unwrap_or_default();
    if let Some(child) = gate {
        drop(child);
    }
    let report = String::from_utf8_lossy(&out.stdout);
    let (succeeded, requests) = shed_testkit::testbed::h2load_counts(&report).map_err(anyhow::Error::msg)?;
    if requests != total {
        bail!("h2load ran {requests} requests, not {total}: {report}");
    }
    Ok((succeeded as f64 / seconds as f64 / capacity, limits))
}

pub(crate) fn b8(shedctl: &std::path::Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let (seconds, repeats) = scale.pick((12, 3), (6, 1), (3, 1));
    let smoke = |c: &Config| {
        scale != Scale::Smoke
            || (c.server == Server::ReadsWhenFree && (c.name == "no gate" || c.name == "shed queue, objective 1 s"))
            || (c.server == Server::Go && c.name == "shed (defaults), objective 1 s")
    };
    let configs = CONFIGS.into_iter().chain(
        AT_ONCE.into_iter().flat_map(|server| AT_ONCE_CONFIGS.map(|(name, shed)| Config { name, shed, server })),
    );
    let mut json = Vec::new();
    let mut rows = Vec::new();
    for config in configs.filter(|c| smoke(c)) {
        let config = &config;
        let mut goodputs = Vec::new();
        let mut limits = Vec::new();
        for _ in 0..repeats {
            let (goodput, l) = run_once(shedctl, config, seconds)?;
            goodputs.push(goodput);
            limits.extend(l);
            thread::sleep(Duration::from_millis(300));
        }
        let (goodput, gmin, gmax) = median_min_max(goodputs.clone());
        let limit = (!limits.is_empty()).then(|| {
            let (median, min, max) = median_min_max(limits.iter().map(|&l| f64::from(l)).collect());
            (median, min, max)
        });
        println!(
            "B8 {:<22} {:<32}: goodput {:5.1}% ({:.1}-{:.1}) of capacity, limit {}",
            config.server.name(),
            config.name,
            goodput * 100.0,
            gmin * 100.0,
            gmax * 100.0,
            limit.map_or("-".into(), |(m, lo, hi)| format!("median {m:.0} ({lo:.0}-{hi:.0})"))
        );
        rows.push(format!(
            "| {} | {} | {:.1}% ({:.1}-{:.1}) | {} |",
            config.server.name(),
            config.name,
            goodput * 100.0,
            gmin * 100.0,
            gmax * 100.0,
            limit.map_or("-".into(), |(m, lo, hi)| format!("{m:.0} ({lo:.0}-{hi:.0})"))
        ));
        json.push(serde_json::json!({
            "config": config.name,
            "server": config.server.name(),
            "goodput_fraction": goodput,
            "goodput_min": gmin,
            "goodput_max": gmax,
            "goodput_runs": goodputs,
            "limit_median": limit.map(|l| l.0),
            "limit_min": limit.map(|l| l.1),
            "limit_max": limit.map(|l| l.2),
        }));
    }
    let setup = format!(
        "{WORKERS} workers x {} ms HTTP/1.1 ({:.0} req/s), h2load --h1 -m 1 -T 1 -r {:.0} (each second's connections opened at once, one request each, 1 s to finish), {seconds} s per run, {repeats} run(s) per configuration",
        SERVICE_US / 1000,
        WORKERS as f64 * 1e6 / SERVICE_US as f64,
        LOAD * WORKERS as f64 * 1e6 / SERVICE_US as f64,
    );
    let result = serde_json::json!({"benchmark": "B8 bursty arrivals", "setup": setup, "points": json});
    let mut md = String::new();
    let _ = writeln!(md, "\n## B8: synchronized bursts (a real load generator)\n");
    let _ = writeln!(
        md,
        "{setup}. The server reads each request when a worker is free (HTTP/1.1 workers), or reads every request at once and queues it inside (a thread per connection; Go net/http). Goodput: requests answered within their second, as a fraction of the server's capacity (the most a 1 s objective allows); median of runs, min-max in brackets. Limit: sampled every 100 ms over all runs, median (min-max).\n"
    );
    let _ = writeln!(md, "| server | configuration | goodput | limit |\n|---|---|---|---|");
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((result, md))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_h2load_counts() {
        let report = "finished in 12.00s, 80.00 req/s, 10KB/s\nrequests: 4800 total, 4800 started, 4800 done, 960 succeeded, 3840 failed, 3840 errored, 0 timeout\n";
        assert_eq!(shed_testkit::testbed::h2load_counts(report).unwrap(), (960, 4800));
        assert!(shed_testkit::testbed::h2load_counts("no such line").is_err());
    }
}
