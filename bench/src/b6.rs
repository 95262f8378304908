// SPDX-License-Identifier: MIT OR Apache-2.0
//! B6: overhead on admitted traffic. Keep-alive clients in a closed loop
//! through the protected port, with no gate, shed on XDP and shed on TC; the
//! configurations alternate within each repeat so drift hits them alike.
use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    sync::{Arc, Barrier, atomic::AtomicU64},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use shed::kernel::programs::Loaded;
use shed_testkit::testbed::{self, Backend, Service, Testbed};

use crate::common::{PORT, Scale, do_nothing_in, median_min_max, percentile, start_gate, xdp_in};

const CONNECTIONS: usize = 8;

/// Runs `CONNECTIONS` keep-alive clients for `duration`; returns requests/s and p50/p99 in microseconds.
fn keep_alive_load(ns: &str, addr: SocketAddr, duration: Duration) -> Result<(f64, f64, f64)> {
    let start_line = Arc::new(Barrier::new(CONNECTIONS));
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let start_line = start_line.clone();
            testbed::spawn_in(ns, move || -> std::io::Result<Vec<u32>> {
                let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                conn.set_nodelay(true)?;
                conn.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut buf = [0u8; 16];
                let mut latencies = Vec::with_capacity(200_000);
                start_line.wait();
                let start = Instant::now();
                while start.elapsed() < duration {
                    let t = Instant::now();
                    conn.write_all(b"GET\n")?;
                    let mut got = 0;
                    while !buf[..got].contains(&b'\n') {
                        let n = conn.read(&mut buf[got..])?;
                        if n == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        got += n;
                    }
                    latencies.push(t.elapsed().as_micros() as u32);
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for c in clients {
        let latencies = c
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))?
            .context("entering the client namespace")?;
        all.extend(latencies.context("keep-alive client")?);
    }
    all.sort_unstable();
    let pct = |p: f64| f64::from(percentile(&all, p).expect("keep-alive clients answered"));
    Ok((all.len() as f64 / duration.as_secs_f64(), pct(0.5), pct(0.99)))
}

pub(crate) fn b6(shedctl: &Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let (duration, repeats) =
        scale.pick((Duration::from_secs(4), 5), (Duration::from_secs(2), 1), (Duration::from_millis(500), 1));
    // "empty XDP" is an XDP_PASS program on the server veth: what native XDP
    // costs a veth by itself (it moves the receive path onto veth's NAPI), shed aside.
    // "empty programs at shed's hooks": a TC program that passes on the server
    // veth and a do-nothing program on each socket tracepoint shed counts
    // from: the floor under any gate built on those hooks.
    let configs: [(&str, Option<&[&str]>); 5] = [
        ("no gate", None),
        ("empty XDP program", None),
        ("empty programs at shed's hooks", None),
        ("shed, XDP", Some(&["--hook", "xdp"])),
        ("shed, TC", Some(&["--hook", "tc"])),
    ];
    let bed = Testbed::create("shedb6")?;
    let addr = bed.server_addr(false, PORT);
    let _backend =
        Backend::start(&bed.server_ns, addr, Service::KeepAlive { service_us: Arc::new(AtomicU64::new(0)) })?;
    let mut samples: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); configs.len()];
    for r in 0..repeats {
        for (i, (name, args)) in configs.iter().enumerate() {
            let gate = args.map(|a| start_gate(shedctl, &bed, a)).transpose()?;
            let empty_xdp = (i == 1).then(|| xdp_in(&bed.server_ns, &bed.server_if, Loaded::xdp_pass)).transpose()?;
            let do_nothing = (i == 2).then(|| do_nothing_in(&bed.server_ns, &bed.server_if)).transpose()?;
            let (rps, p50, p99) = keep_alive_load(&bed.client_ns, addr, duration)?;
            drop(empty_xdp);
            drop(do_nothing);
            if let Some(g) = gate {
                drop(g);
            }
            println!("B6 run {r} {name:<10} {rps:9.0} req/s  p50 {p50:6.0} us  p99 {p99:6.0} us");
            samples[i].push((rps, p50, p99));
        }
    }
    let stats: Vec<_> = samples
        .iter()
        .map(|s| {
            (
                median_min_max(s.iter().map(|x| x.0).collect()),
                median_min_max(s.iter().map(|x| x.1).collect()).0,
                median_min_max(s.iter().map(|x| x.2).collect()).0,
            )
        })
        .collect();
    let (base_rps, _, base_p99) = (stats[0].0.0, stats[0].1, stats[0].2);
    let mut md = String::new();
    let _ = writeln!(md, "\n## B6: overhead on admitted keep-alive traffic\n");
    let _ = writeln!(
        md,
        "{CONNECTIONS} keep-alive connections in a closed loop (one request line, one answer, no service time) from the client namespace to the protected port, {duration:?} per run; each repeat runs the configurations in turn; median of {repeats} runs (min-max). The gate runs its default adaptive limit and times every request from the socket tracepoints. The client runs on the same kernel, so the tracepoint programs also run (and miss) for the client's sockets, which a remote client would not cost. \"empty XDP program\" is an XDP_PASS program on the server veth: native XDP on a veth moves its receive path to NAPI, which costs by itself whatever the program does. \"empty programs at shed's hooks\": a TC program that only passes, on the server veth's ingress, and a program that does nothing on each of the four socket tracepoints shed counts from: what running any program at those hooks costs, the floor under shed on TC. Goal: within 5% of no gate.\n"
    );
    let _ = writeln!(
        md,
        "| configuration | req/s | p50 us | p99 us | throughput vs no gate | p99 vs no gate |\n|---|---|---|---|---|---|"
    );
    let mut json = Vec::new();
    for ((name, _), ((rps, lo, hi), p50, p99)) in configs.iter().zip(&stats) {
        let _ = writeln!(
            md,
            "| {name} | {rps:.0} ({lo:.0}-{hi:.0}) | {p50:.0} | {p99:.0} | {:+.1}% | {:+.1}% |",
            (rps / base_rps - 1.0) * 100.0,
            (p99 / base_p99 - 1.0) * 100.0
        );
        json.push(serde_json::json!({"config": name, "rps": rps, "rps_min": lo, "rps_max": hi, "p50_us": p50, "p99_us": p99, "throughput_ratio": rps / base_rps, "p99_ratio": p99 / base_p99}));
    }
    Ok((
        serde_json::json!({"benchmark": "B6 keep-alive overhead", "connections": CONNECTIONS, "runs": repeats, "configs": json}),
        md,
    ))
}
