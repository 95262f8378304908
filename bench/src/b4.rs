// SPDX-License-Identifier: MIT OR Apache-2.0
//! B4: goodput under overload, a new connection per request and a 1 s
//! deadline, against no gate and static nftables caps.
use std::fmt::Write as _;

use anyhow::Result;

use crate::{
    common::{PORT, Scale, median_min_max, nft_cap, percentile, start_gate},
    plot,
};

/// One configuration of B4.
struct GateConfig {
    name: &'static str,
    /// `shedctl attach` arguments after the port and interface.
    shed: Option<&'static [&'static str]>,
    /// An nftables connection cap instead.
    nft_cap: Option<u32>,
    /// Serve 5x slower than the capacity the cap was tuned for (a stale static limit).
    slowed: bool,
    /// The server shape (where it keeps its queue).
    server: Server,
}

/// Where the server keeps the requests it cannot serve yet (issue 42).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// Its workers read a request only when free: the queue waits unread in the socket.
    ReadsWhenFree,
    /// A thread per connection reads at once and waits for a worker slot.
    ThreadPerConnection,
    /// Go's `net/http`: a goroutine per connection, a pool of worker slots.
    Go,
    /// nginx (reads at once) proxying to a backend whose workers read when free.
    Nginx,
}

impl Server {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::ReadsWhenFree => "reads when free",
            Self::ThreadPerConnection => "thread per connection",
            Self::Go => "Go net/http",
            Self::Nginx => "nginx -> workers",
        }
    }

    /// The request its clients send: HTTP for the HTTP servers.
    pub(crate) const fn request(self) -> &'static [u8] {
        match self {
            Self::ReadsWhenFree => shed_testkit::testbed::LINE_REQUEST,
            _ => shed_testkit::testbed::HTTP_REQUEST,
        }
    }
}

/// A running server of one [`Server`] shape; stops on drop.
pub(crate) enum Running {
    Backend(#[expect(dead_code, reason = "held until dropped")] shed_testkit::testbed::Backend),
    Go(shed_testkit::servers::GoServer),
    Nginx(
        #[expect(dead_code, reason = "held until dropped")] shed_testkit::servers::Nginx,
        #[expect(dead_code, reason = "held until dropped")] shed_testkit::testbed::Backend,
    ),
}

/// Starts `server` on `addr` with `workers` x `service_us` (changeable at run
/// time through `service_us`, except Go's, which [`Running::set_service_us`] sets).
/// `http`: the server that reads when free speaks HTTP/1.1 (for h2load), not lines.
pub(crate) fn start_server(
    server: Server,
    bed: &shed_testkit::testbed::Testbed,
    addr: std::net::SocketAddr,
    workers: usize,
    service_us: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    http: bool,
) -> Result<Running> {
    use shed_testkit::testbed::{Backend, Service};
    let service_us = service_us.clone();
    Ok(match server {
        Server::ReadsWhenFree if http => {
            Running::Backend(Backend::start(&bed.server_ns, addr, Service::HttpWorkers { workers, service_us })?)
        }
        Server::ReadsWhenFree => {
            Running::Backend(Backend::start(&bed.server_ns, addr, Service::Workers { workers, service_us })?)
        }
        Server::ThreadPerConnection => {
            Running::Backend(Backend::start(&bed.server_ns, addr, Service::ReadAtOnce { workers, service_us })?)
        }
        Server::Go => Running::Go(shed_testkit::servers::GoServer::start(
            &bed.server_ns,
            addr,
            workers,
            service_us.load(std::sync::atomic::Ordering::Relaxed),
        )?),
        Server::Nginx => {
            let upstream = std::net::SocketAddr::new(addr.ip(), NGINX_UPSTREAM_PORT);
            let backend = Backend::start(&bed.server_ns, upstream, Service::HttpWorkers { workers, service_us })?;
            Running::Nginx(shed_testkit::servers::Nginx::start(&bed.server_ns, addr, upstream)?, backend)
        }
    })
}

impl Running {
    /// A new service time, for the servers that do not follow the shared one.
    pub(crate) fn set_service_us(&self, us: u64) -> Result<()> {
        if let Self::Go(go) = self {
            go.set_service_us(us)?;
        }
        Ok(())
    }
}

/// nginx's backend listens here, beside the gated port.
const NGINX_UPSTREAM_PORT: u16 = 9090;

const B4_WORKERS: usize = 4;
const B4_SERVICE_US: u64 = 20_000;
const B4_STATIC_CAP: u32 = 8; // Little's law: 4 busy workers plus a short queue
/// A cap sized for the deadline instead: what the fast backend answers in 1 s (200/s x 1 s).
const B4_DEADLINE_CAP: u32 = 200;
const B4_LOADS: [f64; 5] = [0.5, 1.0, 1.5, 2.0, 4.0];
/// The servers that read every request at once, measured beside the one that reads when free.
const AT_ONCE: [Server; 3] = [Server::ThreadPerConnection, Server::Go, Server::Nginx];

/// B4: goodput under overload, new connection per request, 1 s deadline.
/// Returns the JSON result and the report section.
pub(crate) fn b4(
    shedctl: &std::path::Path,
    scale: Scale,
    out: &std::path::Path,
) -> Result<(serde_json::Value, String)> {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicU64, Ordering},
        },
        thread,
        time::Duration,
    };

    use shed_testkit::testbed::{OpenLoop, Outcome, Testbed};

    let configs = [
        GateConfig { name: "no gate", shed: None, nft_cap: None, slowed: false, server: Server::ReadsWhenFree },
        GateConfig {
            name: "nftables cap (optimum)",
            shed: None,
            nft_cap: Some(B4_STATIC_CAP),
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "nftables cap, backend 5x slower (stale)",
            shed: None,
            nft_cap: Some(B4_STATIC_CAP),
            slowed: true,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "nftables cap 200 (the 1 s deadline's worth), backend 5x slower",
            shed: None,
            nft_cap: Some(B4_DEADLINE_CAP),
            slowed: true,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed fixed (optimum)",
            shed: Some(&["--limit", "8"]),
            nft_cap: None,
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed fixed 8, backend 5x slower (stale)",
            shed: Some(&["--limit", "8"]),
            nft_cap: None,
            slowed: true,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed fixed 200 (the deadline's worth), backend 5x slower",
            shed: Some(&["--limit", "200"]),
            nft_cap: None,
            slowed: true,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed gradient",
            shed: Some(&["--algo", "gradient", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed gradient2",
            shed: Some(&["--algo", "gradient2", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed aimd",
            shed: Some(&["--algo", "aimd", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed queue",
            shed: Some(&["--algo", "queue", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: false,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed gradient, backend 5x slower",
            shed: Some(&["--algo", "gradient", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: true,
            server: Server::ReadsWhenFree,
        },
        GateConfig {
            name: "shed queue, backend 5x slower",
            shed: Some(&["--algo", "queue", "--initial-limit", "20"]),
            nft_cap: None,
            slowed: true,
            server: Server::ReadsWhenFree,
        },
    ]
    .into_iter()
    .chain(AT_ONCE.iter().flat_map(|&server| {
        [
            GateConfig { name: "no gate", shed: None, nft_cap: None, slowed: false, server },
            GateConfig {
                name: "shed fixed (optimum)",
                shed: Some(&["--limit", "8"]),
                nft_cap: None,
                slowed: false,
                server,
            },
            GateConfig { name: "shed (defaults)", shed: Some(&[]), nft_cap: None, slowed: false, server },
            GateConfig {
                name: "shed (defaults), backend 5x slower",
                shed: Some(&[]),
                nft_cap: None,
                slowed: true,
                server,
            },
        ]
    }))
    .collect::<Vec<_>>();
    let (warm, measure, repeats) = scale.pick(
        (Duration::from_secs(2), Duration::from_secs(3), 3),
        (Duration::from_secs(1), Duration::from_millis(1500), 1),
        (Duration::from_millis(500), Duration::from_millis(500), 1),
    );
    // The smoke run keeps one baseline and one adaptive configuration at two loads.
    let smoke = |c: &GateConfig| {
        scale != Scale::Smoke
            || (c.server == Server::ReadsWhenFree && (c.name == "no gate" || c.name == "shed gradient"))
            || (c.server == Server::Go && c.name == "shed (defaults)")
    };
    let loads: &[f64] = scale.pick(&B4_LOADS, &[1.0, 2.0, 4.0], &[1.0, 2.0]);
    // Unloaded (for p99), and the 2x and 4x.
    let at_once_loads: &[f64] = scale.pick(&[0.5, 2.0, 4.0], &[0.5, 2.0, 4.0], &[2.0]);
    let deadline = Duration::from_secs(1);
    let mut json = Vec::new();
    let mut rows = Vec::new();
    let mut curves = Vec::new();
    for config in configs.iter().filter(|c| smoke(c)) {
        let label = if config.server == Server::ReadsWhenFree {
            config.name.to_owned()
        } else {
            format!("{}: {}", config.server.name(), config.name)
        };
        let mut curve = plot::Series { name: label.clone(), points: Vec::new() };
        let bed = Testbed::create("shedb4")?;
        let service_us = Arc::new(AtomicU64::new(B4_SERVICE_US * if config.slowed { 5 } else { 1 }));
        let capacity = B4_WORKERS as f64 * 1e6 / service_us.load(Ordering::Relaxed) as f64;
        let addr = bed.server_addr(false, PORT);
        let _server = start_server(config.server, &bed, addr, B4_WORKERS, &service_us, false)?;
        let daemon =
            config.shed.map(|args| start_gate(shedctl, &bed, &[&["--action", "rst"], args].concat())).transpose()?;
        if let Some(cap) = config.nft_cap {
            nft_cap(&bed.server_ns, cap)?;
        }
        let loads = if config.server == Server::ReadsWhenFree { loads } else { at_once_loads };
        for &load in loads {
            // Offered load is relative to the capacity the configuration was tuned for.
            let tuned = B4_WORKERS as f64 * 1e6 / B4_SERVICE_US as f64;
            let rate = Arc::new(AtomicU64::new((load * tuned) as u64));
            let load_gen = OpenLoop::start_with(&bed.client_ns, addr, rate, deadline, config.server.request());
            thread::sleep(warm);
            while load_gen.outcomes.try_recv().is_ok() {}
            // `repeats` consecutive measurement windows at this load.
            let mut windows = Vec::new();
            for _ in 0..repeats {
                thread::sleep(measure);
                let (mut answered, mut refused, mut timeouts) = (Vec::new(), 0u64, 0u64);
                while let Ok(o) = load_gen.outcomes.try_recv() {
                    match o {
                        Outcome::Answered(l) => answered.push(l.as_secs_f64() * 1e3),
                        Outcome::Refused => refused += 1,
                        Outcome::TimedOut | Outcome::Failed => timeouts += 1,
                    }
                }
                answered.sort_by(f64::total_cmp);
                let pct = |p: f64| percentile(&answered, p).unwrap_or(0.0);
                let goodput = answered.len() as f64 / measure.as_secs_f64() / capacity;
                windows.push([goodput, pct(0.5), pct(0.99), refused as f64, timeouts as f64]);
            }
            drop(load_gen);
            let stat = |i: usize| median_min_max(windows.iter().map(|w| w[i]).collect());
            let (goodput, gmin, gmax) = stat(0);
            let (p50, p99, refused, timeouts) = (stat(1).0, stat(2).0, stat(3).0, stat(4).0);
            println!(
                "B4 {:<40} {load:>3}x: goodput {:5.1}% ({:.1}-{:.1}) of capacity, p50 {p50:6.1} ms, p99 {p99:6.1} ms, refused {refused}, timeouts {timeouts}",
                label,
                goodput * 100.0,
                gmin * 100.0,
                gmax * 100.0,
            );
            rows.push(format!(
                "| {} | {} | {load}x | {:.1}% ({:.1}-{:.1}) | {p50:.1} | {p99:.1} | {refused:.0} | {timeouts:.0} |",
                config.server.name(),
                config.name,
                goodput * 100.0,
                gmin * 100.0,
                gmax * 100.0,
            ));
            json.push(serde_json::json!({"config": config.name, "server": config.server.name(), "load": load, "goodput_fraction": goodput, "goodput_min": gmin, "goodput_max": gmax, "p50_ms": p50, "p99_ms": p99, "refused_per_window": refused, "timeouts_per_window": timeouts, "capacity_rps": capacity, "windows": repeats}));
            curve.points.push((load, goodput * 100.0, gmin * 100.0, gmax * 100.0));
            thread::sleep(Duration::from_millis(300));
        }
        if let Some(child) = daemon {
            drop(child);
        }
        curves.push(curve);
    }
    plot::goodput_vs_load(
        &out.join("b4_goodput.png"),
        "B4: goodput under overload (4 workers x 20 ms, new connection per request, 1 s deadline)",
        &curves,
    )?;
    let result = serde_json::json!({
        "benchmark": "B4 goodput under overload",
        "setup": format!("{B4_WORKERS} workers x {} ms, new connection per request, open-loop arrivals, 1 s deadline; static caps {B4_STATIC_CAP} and {B4_DEADLINE_CAP}; warm {warm:?}, then {repeats} windows of {measure:?} per point", B4_SERVICE_US / 1000),
        "points": json,
    });
    let mut md = String::new();
    let _ = writeln!(md, "\n## B4: goodput under overload\n");
    let _ = writeln!(
        md,
        "{B4_WORKERS} workers x {} ms (200 req/s; 40 req/s when 5x slower), a new connection per request, open-loop arrivals at multiples of 200 req/s, 1 s client deadline. Goodput is answers within the deadline as a fraction of the backend's actual capacity (median of {repeats} consecutive {measure:?} windows after {warm:?} of warm-up, min-max in brackets); latency over answered requests; refused and timeouts per window.\n\n![goodput vs offered load](b4_goodput.png)\n",
        B4_SERVICE_US / 1000
    );
    let _ = writeln!(
        md,
        "| server | configuration | load | goodput | p50 ms | p99 ms | refused | timeouts |\n|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((result, md))
}
