// SPDX-License-Identifier: MIT OR Apache-2.0
//! B7: a spoofed SYN flood against a healthy service, at three round-trip
//! times. Legitimate clients open one connection per request at 50 req/s
//! with a 1 s deadline against a backend of 16 workers that answer in 1 ms;
//! they sit on the veth itself (RTT ~0.03 ms) or behind a delayed link (50 or
//! 200 ms: shed-testkit's TAP relay). Forged SYNs from random sources (that
//! never complete their handshakes) arrive directly on the veth at increasing
//! rates. Goodput of the legitimate clients, side by side in one run: no gate
//! (the kernel's own SYN cookies), nftables `ct count`, shed, and shed with
//! one more client that completes a handshake every second 250 ms late, all
//! with the same cap of 50.
use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    process::Command,
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use shed_testkit::{
    delay::DelayedLink,
    gate::{Gate as Daemon, Log},
    testbed::{self, Backend, LateClient, OpenLoop, Outcome, Service, Testbed},
};

use crate::{
    common::{PORT, Scale, nft_cap},
    plot,
};

const LIMIT: u32 = 50;
const LEGIT_PER_SEC: u64 = 50;

#[derive(Clone, Copy, PartialEq)]
enum Gate {
    None,
    Nftables,
    Shed,
    /// shed, with one more client that completes a handshake every second 250 ms late.
    ShedLateClient,
}

const CONFIGS: [(&str, Gate); 4] = [
    ("no gate (kernel SYN cookies)", Gate::None),
    ("nftables ct count", Gate::Nftables),
    ("shed", Gate::Shed),
    ("shed + a client ACKing 250 ms late", Gate::ShedLateClient),
];

/// The `i`th forged source: spread over 100.64.0.0/10.
fn forged(i: u32) -> Ipv4Addr {
    let h = i.wrapping_mul(2_654_435_761);
    Ipv4Addr::new(100, 64 + ((h >> 16) & 63) as u8, (h >> 8) as u8, (h as u8).max(1))
}

pub(crate) fn b7(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let rates: &[u32] = scale.pick(&[0, 200, 2_000, 20_000], &[0, 2_000, 20_000], &[2_000]);
    // One-way delays: the veth itself, then 50 and 200 ms round trips.
    let one_way: &[u64] = scale.pick(&[0, 25, 100], &[0, 25, 100], &[0, 25]);
    let window = scale.pick(Duration::from_secs(5), Duration::from_secs(3), Duration::from_secs(3));
    let mut json = Vec::new();
    let mut rows = Vec::new();
    let mut curves = Vec::new();
    for &delay_ms in one_way {
        let rtt = if delay_ms == 0 { "veth (0.03 ms)".to_owned() } else { format!("{} ms", 2 * delay_ms) };
        for (name, gate) in CONFIGS {
            let mut curve = plot::Series { name: format!("{name}, RTT {rtt}"), points: Vec::new() };
            for &rate in rates {
                let p = point(shedctl, gate, rate, delay_ms, window)?;
                println!(
                    "B7 RTT {rtt:<15} {name:<36} forged {rate:>6}/s (sent {:>7.0}/s): legit goodput {:5.1}% of {} requests, {} refused",
                    p.achieved,
                    p.goodput * 100.0,
                    p.requests,
                    p.refused
                );
                rows.push(format!(
                    "| {rtt} | {name} | {rate} | {:.0} | {:.1}% | {} | {} |",
                    p.achieved,
                    p.goodput * 100.0,
                    p.requests,
                    p.refused
                ));
                json.push(serde_json::json!({"rtt_ms": 2 * delay_ms, "config": name, "forged_per_sec": rate, "forged_sent_per_sec": p.achieved, "goodput_fraction": p.goodput, "requests": p.requests, "refused": p.refused, "seconds": p.seconds, "late_handshakes": p.late}));
                let x = f64::from(rate.max(1)).log10();
                curve.points.push((x, p.goodput * 100.0, p.goodput * 100.0, p.goodput * 100.0));
                thread::sleep(Duration::from_millis(300));
            }
            curves.push(curve);
        }
    }
    plot::goodput_vs(
        &out.join("b7_spoofed_flood.png"),
        "B7: legitimate goodput under a spoofed SYN flood, by RTT (cap 50, 50 req/s, 1 s deadline)",
        ("forged SYN/s (log10)", "legitimate requests answered in time (%)"),
        &curves,
    )
    .context("plot B7")?;
    let result = serde_json::json!({
        "benchmark": "B7 spoofed SYN flood",
        "setup": format!("backend 16 workers x 1 ms; legitimate clients {LEGIT_PER_SEC} req/s, one connection per request, 1 s deadline, on the veth or behind a delayed link (RTT 50, 200 ms); cap {LIMIT} (shed --limit --action rst, nftables ct count); forged SYNs from random sources in 100.64.0.0/10 on the veth, never completed; {window:?} per point after 1 s of warm-up"),
        "points": json,
    });
    let mut md = String::new();
    let _ = writeln!(md, "\n## B7: spoofed SYN flood, by round-trip time\n");
    let _ = writeln!(
        md,
        "Legitimate clients: {LEGIT_PER_SEC} req/s, one connection per request, 1 s deadline, on the veth (RTT ~0.03 ms) or behind shed-testkit's delayed link (a TAP pair and a userspace relay holding each frame; RTT 50 and 200 ms); backend 16 workers x 1 ms (healthy, far from its capacity). Forged SYNs from random sources that never complete their handshakes arrive on the veth. Cap {LIMIT} for nftables and shed (`--limit {LIMIT} --action rst`, everything else default); no gate relies on the kernel's SYN cookies. The last configuration adds one client that completes a handshake every second 250 ms after its SYN-ACK. Goodput is the share of legitimate requests answered within the deadline over {window:?} per point, all in one run; \"sent\" is the rate the raw-socket generator achieved.\n\n![goodput vs forged rate](b7_spoofed_flood.png)\n"
    );
    let _ = writeln!(
        md,
        "| RTT | configuration | forged SYN/s | sent/s | legit goodput | requests | refused |\n|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((result, md))
}

/// One measured point of B7.
struct Point {
    goodput: f64,
    requests: usize,
    refused: usize,
    achieved: f64,
    seconds: f64,
    late: u64,
}

fn point(shedctl: &Path, gate: Gate, rate: u32, delay_ms: u64, window: Duration) -> Result<Point> {
    let bed = Testbed::create("shedb7")?;
    // SYN-ACKs to forged sources leave towards the client side, where nobody answers.
    let route =
        Command::new("ip").args(["-n", &bed.server_ns, "route", "add", "default", "via", "10.200.0.2"]).status()?;
    if !route.success() {
        bail!("could not add the server's default route");
    }
    let link = (delay_ms > 0)
        .then(|| DelayedLink::create(&bed.server_ns, "shedb7", 7, Duration::from_millis(delay_ms)))
        .transpose()?;
    let (legit_ns, addr): (String, SocketAddr) = match &link {
        Some(l) => (l.far_ns.clone(), l.server_addr(PORT)),
        None => (bed.client_ns.clone(), bed.server_addr(false, PORT)),
    };
    let service_us = Arc::new(AtomicU64::new(1_000));
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT));
    let _backend = Backend::start(&bed.server_ns, any, Service::Workers { workers: 16, service_us })?;
    let daemon = match gate {
        Gate::Shed | Gate::ShedLateClient => {
            let limit = LIMIT.to_string();
            let mut args =
                vec!["--port", "8080", "--limit", &limit, "--action", "rst", "--netns", &bed.server_ns, "--iface"];
            args.push(&bed.server_if);
            if let Some(l) = &link {
                args.extend(["--iface", l.server_if.as_str()]);
            }
            Some(Daemon::launch(shedctl, &args, Log::Discard).context("shedctl attach")?)
        }
        Gate::Nftables => {
            nft_cap(&bed.server_ns, LIMIT)?;
            None
        }
        Gate::None => None,
    };
    let late = (gate == Gate::ShedLateClient)
        .then(|| {
            LateClient::start(
                &bed,
                Ipv4Addr::new(10, 200, 0, 77),
                PORT,
                Duration::from_secs(1),
                Duration::from_millis(250),
            )
        })
        .transpose()?;
    // Warm-up without the flood.
    let warm = OpenLoop::start(&legit_ns, addr, Arc::new(AtomicU64::new(LEGIT_PER_SEC)), Duration::from_secs(1));
    thread::sleep(Duration::from_secs(1));
    drop(warm.finish());
    let server = bed.server_v4;
    let flood = (rate > 0)
        .then(|| testbed::spawn_in(&bed.client_ns, move || testbed::syn_flood_at(server, PORT, rate, window, forged)));
    let started = Instant::now();
    let load = OpenLoop::start(&legit_ns, addr, Arc::new(AtomicU64::new(LEGIT_PER_SEC)), Duration::from_secs(1));
    thread::sleep(window);
    let outcomes = load.finish();
    let sent = match flood {
        Some(h) => h.join().map_err(|_| anyhow::anyhow!("flood thread panicked"))???,
        None => 0,
    };
    let seconds = started.elapsed().as_secs_f64().max(window.as_secs_f64());
    let late = late.map_or(0, |l| l.completed.load(std::sync::atomic::Ordering::Relaxed));
    drop(daemon);
    drop(link);
    let answered = outcomes.iter().filter(|o| matches!(o, Outcome::Answered(_))).count();
    let refused = outcomes.iter().filter(|o| matches!(o, Outcome::Refused)).count();
    Ok(Point {
        goodput: answered as f64 / outcomes.len().max(1) as f64,
        requests: outcomes.len(),
        refused,
        achieved: f64::from(sent) / window.as_secs_f64(),
        seconds,
        late,
    })
}
