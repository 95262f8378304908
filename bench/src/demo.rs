// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask demo`: a backend of known capacity in a throwaway namespace,
//! the gate in front of it, and open-loop load that rises above capacity;
//! prints what the gate and the clients see, once a second.
use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shed::kernel::maps::GateMaps;
use shed_testkit::{
    gate::{Gate, Log},
    testbed::{Backend, OpenLoop, Outcome, Service, Testbed},
};

const PORT: u16 = 8080;
const WORKERS: usize = 4;
const SERVICE: Duration = Duration::from_millis(20);
const DEADLINE: Duration = Duration::from_secs(1);
const INITIAL_LIMIT: u32 = 50;
const METRICS: &str = "127.0.0.1:9464";

pub(crate) fn run(shedctl: &Path, seconds: u64) -> Result<()> {
    let capacity = WORKERS as f64 / SERVICE.as_secs_f64();
    println!(
        "demo: backend with {WORKERS} workers x {} ms = {capacity:.0} req/s capacity; adaptive gate (queue, the default) from limit {INITIAL_LIMIT}, action rst; {seconds} s\nphases: 0.5x load; 2x load; 2x load with the backend 5x slower; 2x load, backend recovered",
        SERVICE.as_millis()
    );
    let bed = Testbed::create("sheddemo").context("creating the demo namespaces")?;
    let service_us = Arc::new(AtomicU64::new(SERVICE.as_micros() as u64));
    let _backend = Backend::start(
        &bed.server_ns,
        bed.server_addr(false, PORT),
        Service::Workers { workers: WORKERS, service_us: service_us.clone() },
    )?;
    // Its log goes to the terminal, beside the demo's lines.
    let initial_limit = INITIAL_LIMIT.to_string();
    let daemon = Gate::launch(
        shedctl,
        &["--port", "8080", "--initial-limit", &initial_limit, "--action", "rst"]
            .into_iter()
            .chain(["--netns", &bed.server_ns, "--iface", &bed.server_if, "--metrics", METRICS])
            .collect::<Vec<_>>(),
        Log::Inherit,
    )
    .context("starting shedctl attach")?;
    let maps = GateMaps::open_pinned().context("open the gate's maps")?;
    println!("watch it live: `sudo shedctl top` in another terminal; Prometheus metrics at http://{METRICS}/metrics");

    let addr = bed.server_addr(false, PORT);
    let start = Instant::now();
    let total = Duration::from_secs(seconds);
    // Offered load (x capacity) and service slowdown over the run: calm; 2x
    // overload; the backend slows 5x under it; it recovers.
    let phase_at = move |t: Duration| {
        let f = t.as_secs_f64() / total.as_secs_f64();
        if f < 0.15 {
            (0.5, 1)
        } else if f < 0.45 {
            (2.0, 1)
        } else if f < 0.7 {
            (2.0, 5)
        } else {
            (2.0, 1)
        }
    };
    let load_at = move |t: Duration| phase_at(t).0;
    let rate = Arc::new(AtomicU64::new((capacity * load_at(Duration::ZERO)) as u64));
    let load = OpenLoop::start(&bed.client_ns, addr, rate.clone(), DEADLINE);

    println!(
        "{:>4}  {:>7}  {:>7}  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}",
        "t(s)",
        "offered",
        "service",
        "limit",
        "in-flight",
        "admit/s",
        "reject/s",
        "answered",
        "refused",
        "timeouts",
        "p99(ms)"
    );
    let mut before = maps.snapshots(Some(PORT))?[0];
    for second in 1..=seconds {
        thread::sleep(
            Duration::from_secs(1).saturating_sub(start.elapsed().saturating_sub(Duration::from_secs(second - 1))),
        );
        rate.store((capacity * load_at(Duration::from_secs(second))) as u64, Ordering::Relaxed);
        let slowdown = phase_at(Duration::from_secs(second)).1;
        service_us.store(SERVICE.as_micros() as u64 * slowdown, Ordering::Relaxed);
        let now = maps.snapshots(Some(PORT))?[0];
        let mut answered = Vec::new();
        let (mut refused, mut timeouts) = (0, 0);
        for outcome in load.outcomes.try_iter() {
            match outcome {
                Outcome::Answered(latency) => answered.push(latency),
                Outcome::Refused => refused += 1,
                Outcome::TimedOut | Outcome::Failed => timeouts += 1,
            }
        }
        answered.sort();
        let p99 = answered
            .get((answered.len() * 99 / 100).min(answered.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let delta = |i| now.counter(i) - before.counter(i);
        println!(
            "{:>4}  {:>6.1}x  {:>5}ms  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8.1}",
            second,
            load_at(Duration::from_secs(second - 1)),
            SERVICE.as_millis() as u64 * phase_at(Duration::from_secs(second - 1)).1,
            now.limit,
            now.in_flight(),
            delta(shed_common::counter::ADMITTED),
            delta(shed_common::counter::REJECTED_LIMIT),
            answered.len(),
            refused,
            timeouts,
            p99
        );
        before = now;
    }
    drop(load);
    drop(daemon);
    println!("demo: done; namespaces and gate removed");
    Ok(())
}
