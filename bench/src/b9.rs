// SPDX-License-Identifier: MIT OR Apache-2.0
//! B9: the daemon's cost against connections held. Idle keep-alive
//! connections are opened to six protected ports, up to 100,000, and at each
//! level the daemon's CPU and RSS over an idle stretch, the kernel memory of
//! the gate's maps, and the time of one healing pass are read.
//!
//! A process may hold 20,000 open files here, and a client address about
//! 28,000 ephemeral ports, so each port's server holds its connections in a
//! process of its own and each batch of clients connects from its own
//! address, in processes of their own (`shed-bench hold`).
//!
//! `SHED_B9_BEFORE=/path/to/an/older/shedctl` runs the same ramp against that
//! build too (CPU and RSS only), for a before/after in one run.
use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use shed::{daemon::heal::Healer, kernel::maps::GateMaps, observe::report::HealReport};
use shed_testkit::testbed::{self, Backend, Service, Testbed};

use crate::{
    common::{PORT, Scale, median_min_max, start_gate},
    plot,
};

/// Protected ports; the connections are spread evenly over them.
const PORTS: u16 = 6;

/// Something holding connections open until dropped: a `shed-bench hold`
/// process (closed by closing its stdin), or, in a smoke run (a test binary
/// cannot re-run itself as a holder), threads of this process.
enum Holder {
    Process(Child),
    Server(#[allow(dead_code, reason = "held for its drop")] Backend),
    Clients(#[allow(dead_code, reason = "held for their drop")] Vec<TcpStream>),
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Self::Process(child) = self {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// Starts `shed-bench hold ARGS` and waits for its "ready" line.
fn hold_process(args: &[String]) -> Result<Holder> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("hold")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("start a holder process")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    if !line.starts_with("ready") {
        let _ = child.kill();
        bail!("holder {args:?} failed: {line:?}");
    }
    Ok(Holder::Process(child))
}

fn serve(bed: &Testbed, addr: SocketAddr, in_process: bool) -> Result<Holder> {
    if in_process {
        return Ok(Holder::Server(Backend::start(&bed.server_ns, addr, Service::Hold)?));
    }
    hold_process(&["--netns".into(), bed.server_ns.clone(), "--addr".into(), addr.to_string()])
}

fn connect(bed: &Testbed, addr: SocketAddr, from: IpAddr, count: usize, in_process: bool) -> Result<Holder> {
    if in_process {
        let conns = testbed::run_in(&bed.client_ns, move || {
            (0..count)
                .map(|_| testbed::connect_from(from, addr, Duration::from_secs(5)))
                .collect::<std::io::Result<Vec<_>>>()
        })??;
        return Ok(Holder::Clients(conns));
    }
    hold_process(&[
        "--netns".into(),
        bed.client_ns.clone(),
        "--addr".into(),
        addr.to_string(),
        "--from".into(),
        from.to_string(),
        "--count".into(),
        count.to_string(),
    ])
}

/// `shed-bench hold`: serve (hold every connection accepted on `addr`) or,
/// with `from`, open `count` connections to `addr`; in `netns`, until stdin closes.
pub(crate) fn hold(netns: &str, addr: SocketAddr, from: Option<IpAddr>, count: usize) -> Result<()> {
    let held: Holder = match from {
        None => Holder::Server(Backend::start(netns, addr, Service::Hold)?),
        Some(from) => {
            testbed::enter(netns)?;
            let conns = (0..count)
                .map(|_| testbed::connect_from(from, addr, Duration::from_secs(5)))
                .collect::<std::io::Result<Vec<_>>>()
                .with_context(|| format!("connect to {addr} from {from}"))?;
            Holder::Clients(conns)
        }
    };
    println!("ready");
    // Until the parent closes our stdin (or exits).
    let _ = std::io::stdin().lines().count();
    drop(held);
    Ok(())
}

/// CPU time (user + system, all threads) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').context("a stat line")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("VmRSS")?;
    Ok(kib * 1024)
}

/// Established connections over every port, as `shedctl stats --json` of the
/// binary under test reports them (any version can answer this).
fn established(shedctl: &Path) -> Result<u64> {
    let out = Command::new(shedctl).args(["stats", "--json", "--interval", "50"]).output()?;
    if !out.status.success() {
        bail!("shedctl stats: {}", String::from_utf8_lossy(&out.stderr));
    }
    let ports: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(ports.as_array().context("a list of ports")?.iter().filter_map(|p| p["established"].as_u64()).sum())
}

/// One healing pass as the daemon runs it (sock_diag in the gated namespace,
/// the tracked sockets in batches), timed; returns (seconds, records read).
fn heal_pass(ns: &str) -> Result<(f64, u64)> {
    testbed::run_in(ns, || -> Result<(f64, u64)> {
        let mut maps = GateMaps::open_pinned()?;
        let report = HealReport::default();
        // A fresh healer's first check is a full pass (and acts on nothing: it has no pass to confirm).
        let mut healer = Healer::new(Duration::from_hours(1), report.clone());
        let start = Instant::now();
        healer.check(&mut maps, Instant::now())?;
        Ok((start.elapsed().as_secs_f64(), report.read().records_read))
    })?
}

/// One binary's row at one level.
struct Level {
    held: usize,
    cpu: f64,
    rss: u64,
    /// Kernel memory of the maps, heal pass (median, min, max seconds) and its records:
    /// for the binary under test only (another version's maps may have other layouts).
    bpf: Option<u64>,
    pass: Option<((f64, f64, f64), u64)>,
    counted: u64,
}

/// Ramps the connections held through `levels` against a gate run by `shedctl`.
fn measure(shedctl: &Path, scale: Scale, levels: &[usize], ours: bool) -> Result<Vec<Level>> {
    let idle = scale.pick(Duration::from_secs(30), Duration::from_secs(10), Duration::from_secs(3));
    let in_process = scale == Scale::Smoke;
    let bed = Testbed::create("shedb9")?;
    let ports: Vec<u16> = (PORT..PORT + PORTS).collect();
    let _servers: Vec<Holder> =
        ports.iter().map(|&p| serve(&bed, bed.server_addr(false, p), in_process)).collect::<Result<_>>()?;
    let port_args: Vec<String> = ports[1..].iter().flat_map(|p| ["--port".to_owned(), p.to_string()]).collect();
    let mut args: Vec<&str> = port_args.iter().map(String::as_str).collect();
    // Idle connections greet and fall idle: with --count work they hold no place under the limit.
    args.extend(["--limit", "50000"]);
    let gate = start_gate(shedctl, &bed, &args)?;
    let pid = gate.pid() as u32;
    let mut clients: Vec<Holder> = Vec::new();
    let mut next_host = 10u8;
    let mut out = Vec::new();
    let mut held = 0usize;
    let result = (|| -> Result<()> {
        for &level in levels {
            // Open the difference, one holder per port, each from an address of its own.
            let per_port = (level - held) / ports.len();
            if per_port > 0 {
                for &p in &ports {
                    let from = IpAddr::V4(bed.add_client_v4(next_host)?);
                    next_host += 1;
                    clients.push(connect(&bed, bed.server_addr(false, p), from, per_port, in_process)?);
                }
            }
            held += per_port * ports.len();
            let start = Instant::now();
            while established(shedctl)? != held as u64 {
                if start.elapsed() > Duration::from_mins(2) {
                    bail!("B9: {} of {held} connections counted after 120 s", established(shedctl)?);
                }
                thread::sleep(Duration::from_millis(200));
            }
            // Settle (the accept loops, the first check after the ramp), then idle.
            thread::sleep(Duration::from_secs(2));
            let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
            thread::sleep(idle);
            let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            let cpu = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
            let rss = rss_bytes(pid)?;
            let (bpf, pass) = if ours {
                let passes: Vec<(f64, u64)> = (0..3).map(|_| heal_pass(&bed.server_ns)).collect::<Result<_>>()?;
                let times = median_min_max(passes.iter().map(|p| p.0).collect());
                (Some(GateMaps::open_pinned()?.memory_bytes()), Some((times, passes[0].1)))
            } else {
                (None, None)
            };
            let counted = established(shedctl)?;
            println!(
                "B9 {} {held:>7} connections: daemon CPU {cpu:5.2}% of a core, RSS {:.1} MiB, BPF maps {}, heal pass {}, counted {counted}",
                shedctl.display(),
                rss as f64 / 1_048_576.0,
                bpf.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / 1_048_576.0)),
                pass.map_or("-".into(), |((m, _, _), r)| format!("{:.1} ms ({r} records)", m * 1e3)),
            );
            out.push(Level { held, cpu, rss, bpf, pass, counted });
        }
        Ok(())
    })();
    drop(clients);
    drop(gate);
    result.map(|()| out)
}

pub(crate) fn b9(shedctl: &Path, scale: Scale, out: &Path) -> Result<(serde_json::Value, String)> {
    let levels: &[usize] = scale.pick(&[0, 10_000, 50_000, 100_000], &[0, 10_000, 50_000], &[0, 2_000]);
    let idle = scale.pick(Duration::from_secs(30), Duration::from_secs(10), Duration::from_secs(3));
    let mut runs = vec![("shed".to_owned(), measure(shedctl, scale, levels, true)?)];
    // The same ramp against an earlier build, for a before/after in one run.
    if let Ok(before) = std::env::var("SHED_B9_BEFORE") {
        runs.push((format!("before ({before})"), measure(Path::new(&before), scale, levels, false)?));
    }
    let series: Vec<plot::Series> = runs
        .iter()
        .map(|(name, levels)| plot::Series {
            name: name.clone(),
            points: levels.iter().map(|l| (l.held as f64, l.cpu, l.cpu, l.cpu)).collect(),
        })
        .collect();
    plot::goodput_vs(
        &out.join("b9_cost.png"),
        "B9: daemon CPU against idle connections held (default settings)",
        ("open connections", "daemon CPU, % of one core"),
        &series,
    )?;
    let mut md = String::new();
    let _ = writeln!(md, "\n## B9: cost against connections held\n");
    let _ = writeln!(
        md,
        "Idle keep-alive connections (each greeted with one byte, then silent) held open to {PORTS} protected ports, from the client namespace; default settings but a fixed limit of 50,000 (--count work: idle connections hold no place). At each level: the daemon's CPU over {idle:?} of idling (user + system, all threads, % of one core), its RSS, the kernel memory of the gate's maps (memlock as the kernel reports it), and one healing pass as the daemon runs it, timed in this process (median of 3, min-max; records: socket-table records plus tracked sockets read). \"counted\" is the gate's established count, which must equal the connections held. Goal: at most 3% of a core at 100,000, flat in the connections held.\n\n![daemon CPU vs connections](b9_cost.png)\n"
    );
    let _ = writeln!(
        md,
        "| daemon | connections | daemon CPU | RSS MiB | BPF maps MiB | heal pass ms | records read | counted |\n|---|---|---|---|---|---|---|---|"
    );
    let mut json = Vec::new();
    for (name, levels) in &runs {
        for l in levels {
            let _ = writeln!(
                md,
                "| {name} | {} | {:.2}% | {:.1} | {} | {} | {} | {} |",
                l.held,
                l.cpu,
                l.rss as f64 / 1_048_576.0,
                l.bpf.map_or("-".into(), |b| format!("{:.1}", b as f64 / 1_048_576.0)),
                l.pass.map_or("-".into(), |((m, lo, hi), _)| format!(
                    "{:.1} ({:.1}-{:.1})",
                    m * 1e3,
                    lo * 1e3,
                    hi * 1e3
                )),
                l.pass.map_or("-".into(), |(_, r)| r.to_string()),
                l.counted
            );
            json.push(serde_json::json!({"daemon": name, "connections": l.held, "daemon_cpu_percent": l.cpu, "daemon_rss_bytes": l.rss, "bpf_map_bytes": l.bpf, "heal_pass_seconds": l.pass.map(|p| p.0.0), "heal_pass_min_seconds": l.pass.map(|p| p.0.1), "heal_pass_max_seconds": l.pass.map(|p| p.0.2), "heal_pass_records": l.pass.map(|p| p.1), "counted": l.counted, "idle_seconds": idle.as_secs_f64()}));
        }
    }
    Ok((serde_json::json!({"benchmark": "B9 cost against connections held", "ports": PORTS, "levels": json}), md))
}
