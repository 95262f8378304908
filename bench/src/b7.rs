//! B7: a spoofed SYN flood against a healthy service. Legitimate clients open
//! one connection per request at 50 req/s with a 1 s deadline against a
//! backend that answers in 1 ms; forged SYNs from random sources (that never
//! complete their handshakes) arrive at increasing rates. Goodput of the
//! legitimate clients, side by side: no gate (the kernel's own SYN cookies),
//! nftables `ct count`, and shed, all with the same cap of 50.
use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::Path,
    process::Command,
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use shed_testkit::testbed::{self, Backend, OpenLoop, Outcome, Service, Testbed};

use crate::{
    common::{PORT, Scale, nft_cap, start_gate},
    plot,
};

const LIMIT: u32 = 50;
const LEGIT_PER_SEC: u64 = 50;

#[derive(Clone, Copy, PartialEq)]
enum Gate {
    None,
    Nftables,
    Shed,
}

const CONFIGS: [(&str, Gate); 3] =
    [("no gate (kernel SYN cookies)", Gate::None), ("nftables ct count", Gate::Nftables), ("shed", Gate::Shed)];

/// The `i`th forged source: spread over 100.64.0.0/10.
fn forged(i: u32) -> Ipv4Addr {
    let h = i.wrapping_mul(2_654_435_761);
    Ipv4Addr::new(100, 64 + ((h >> 16) & 63) as u8, (h >> 8) as u8, (h as u8).max(1))
}

pub fn b7(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let rates: &[u32] = scale.pick(&[0, 200, 2_000, 20_000], &[0, 2_000, 20_000], &[0, 2_000]);
    let window = scale.pick(Duration::from_secs(5), Duration::from_secs(3), Duration::from_secs(2));
    let mut json = Vec::new();
    let mut rows = Vec::new();
    let mut curves = Vec::new();
    for (name, gate) in CONFIGS {
        let mut curve = plot::Series { name: name.to_owned(), points: Vec::new() };
        for &rate in rates {
            let bed = Testbed::create("shedb7")?;
            // SYN-ACKs to forged sources leave towards the client side, where nobody answers.
            let route = Command::new("ip")
                .args(["-n", &bed.server_ns, "route", "add", "default", "via", "10.200.0.2"])
                .status()?;
            if !route.success() {
                bail!("could not add the server's default route");
            }
            let addr = bed.server_addr(false, PORT);
            let service_us = Arc::new(AtomicU64::new(1_000));
            let _backend = Backend::start(&bed.server_ns, addr, Service::Workers { workers: 4, service_us })?;
            let daemon = match gate {
                Gate::Shed => Some(start_gate(shedctl, &bed, &["--limit", &LIMIT.to_string(), "--action", "rst"])?),
                Gate::Nftables => {
                    nft_cap(&bed.server_ns, LIMIT)?;
                    None
                }
                Gate::None => None,
            };
            // Warm-up without the flood (shed measures the handshake time meanwhile).
            let warm =
                OpenLoop::start(&bed.client_ns, addr, Arc::new(AtomicU64::new(LEGIT_PER_SEC)), Duration::from_secs(1));
            thread::sleep(Duration::from_secs(1));
            drop(warm.finish());
            let server = bed.server_v4;
            let flood_for = window;
            let flood = (rate > 0).then(|| {
                testbed::spawn_in(&bed.client_ns, move || testbed::syn_flood_at(server, PORT, rate, flood_for, forged))
            });
            let started = Instant::now();
            let load =
                OpenLoop::start(&bed.client_ns, addr, Arc::new(AtomicU64::new(LEGIT_PER_SEC)), Duration::from_secs(1));
            thread::sleep(window);
            let outcomes = load.finish();
            let sent = match flood {
                Some(h) => h.join().map_err(|_| anyhow::anyhow!("flood thread panicked"))???,
                None => 0,
            };
            let elapsed = started.elapsed().as_secs_f64().max(window.as_secs_f64());
            if let Some(child) = daemon {
                drop(child);
            }
            let answered = outcomes.iter().filter(|o| matches!(o, Outcome::Answered(_))).count();
            let refused = outcomes.iter().filter(|o| matches!(o, Outcome::Refused)).count();
            let goodput = answered as f64 / outcomes.len().max(1) as f64;
            let achieved = f64::from(sent) / window.as_secs_f64();
            println!(
                "B7 {name:<30} forged {rate:>6}/s (sent {achieved:>7.0}/s): legit goodput {:5.1}% of {} requests, {refused} refused",
                goodput * 100.0,
                outcomes.len()
            );
            rows.push(format!(
                "| {name} | {rate} | {achieved:.0} | {:.1}% | {} | {refused} |",
                goodput * 100.0,
                outcomes.len()
            ));
            json.push(serde_json::json!({"config": name, "forged_per_sec": rate, "forged_sent_per_sec": achieved, "goodput_fraction": goodput, "requests": outcomes.len(), "refused": refused, "seconds": elapsed}));
            let x = f64::from(rate.max(1)).log10();
            curve.points.push((x, goodput * 100.0, goodput * 100.0, goodput * 100.0));
            thread::sleep(Duration::from_millis(300));
        }
        curves.push(curve);
    }
    plot::goodput_vs(
        &out.join("b7_spoofed_flood.png"),
        "B7: legitimate goodput under a spoofed SYN flood (cap 50, 50 req/s, 1 s deadline)",
        ("forged SYN/s (log10; 0 = no flood)", "legitimate requests answered in time (%)"),
        &curves,
    )
    .context("plot B7")?;
    let result = serde_json::json!({
        "benchmark": "B7 spoofed SYN flood",
        "setup": format!("backend 4 workers x 1 ms; legitimate clients {LEGIT_PER_SEC} req/s, one connection per request, 1 s deadline; cap {LIMIT} (shed --limit, nftables ct count); forged SYNs from random sources in 100.64.0.0/10, never completed; {window:?} per point after 1 s of warm-up"),
        "points": json,
    });
    let mut md = String::new();
    let _ = writeln!(md, "\n## B7: spoofed SYN flood\n");
    let _ = writeln!(
        md,
        "Legitimate clients: {LEGIT_PER_SEC} req/s, one connection per request, 1 s deadline; backend 4 workers x 1 ms (healthy, far from its capacity). Forged SYNs from random sources that never complete their handshakes. Cap {LIMIT} for nftables and shed; no gate relies on the kernel's SYN cookies. Goodput is the share of legitimate requests answered within the deadline over {window:?} per point; \"sent\" is the rate the raw-socket generator achieved.\n\n![goodput vs forged rate](b7_spoofed_flood.png)\n"
    );
    let _ = writeln!(
        md,
        "| configuration | forged SYN/s | sent/s | legit goodput | requests | refused |\n|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((result, md))
}
