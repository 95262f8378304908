// SPDX-License-Identifier: MIT OR Apache-2.0
//! B3: real clients. Non-blocking connect() clients, 64 attempts in flight,
//! against (a) shed refusing every SYN with an RST, (b) a userspace server
//! that accepts, answers 503 and closes: what an in-app limiter pays per
//! rejection, and (c) shed's `http` action answering the request with its own
//! stateless 503. Attempts/s, the client-seen rejection latency, and CPU per
//! rejection.
use std::{
    fmt::Write as _,
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use shed_testkit::testbed::{self, Backend, Service, Testbed};

use crate::{
    b2::busy_cpu,
    common::{PORT, Scale, median_min_max, percentile, start_gate},
};

const IN_FLIGHT: usize = 64;
const NAMES: [&str; 3] = ["shed RST (TC)", "accept + 503 + close (userspace)", "shed http 503 (TC, stateless)"];
/// What the clients send once connected to the `http` gate (it answers a request, not a connection).
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: b3\r\n\r\n";
const RESPONSE_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[derive(Default)]
struct ClientRun {
    attempts: u64,
    rejected: u64,
    /// Connected without a 503 (shed admitted it), or failed otherwise.
    other: u64,
    latencies_us: Vec<u32>,
    cpu: Duration,
    elapsed: Duration,
}

enum Phase {
    Connecting,
    Reading,
}

struct Attempt {
    fd: libc::c_int,
    start: Instant,
    phase: Phase,
}

fn open(addr: &libc::sockaddr_in) -> Option<Attempt> {
    // SAFETY: plain socket calls on our own fd.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let start = Instant::now();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        libc::connect(fd, std::ptr::from_ref::<libc::sockaddr_in>(addr).cast(), len);
        Some(Attempt { fd, start, phase: Phase::Connecting })
    }
}

/// Keeps `IN_FLIGHT` non-blocking attempts going for `duration`. `expect_503`:
/// a refusal is a 503 read after connecting (`send_request`: after writing a
/// request), not ECONNREFUSED.
fn clients(addr: SocketAddr, duration: Duration, expect_503: bool, send_request: bool) -> ClientRun {
    let SocketAddr::V4(v4) = addr else { unreachable!("IPv4 testbed address") };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
        sin_zero: [0; 8],
    };
    let mut run = ClientRun::default();
    let cpu_start = thread_cpu();
    let start = Instant::now();
    let mut live: Vec<Attempt> = Vec::with_capacity(IN_FLIGHT);
    loop {
        let running = start.elapsed() < duration;
        while running && live.len() < IN_FLIGHT {
            match open(&sin) {
                Some(a) => {
                    run.attempts += 1;
                    live.push(a);
                }
                None => break,
            }
        }
        if live.is_empty() || start.elapsed() > duration + Duration::from_secs(3) {
            break;
        }
        let mut fds: Vec<libc::pollfd> = live
            .iter()
            .map(|a| libc::pollfd {
                fd: a.fd,
                events: match a.phase {
                    Phase::Connecting => libc::POLLOUT,
                    Phase::Reading => libc::POLLIN,
                },
                revents: 0,
            })
            .collect();
        // SAFETY: valid pollfd array.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        let mut done = Vec::new();
        for (i, p) in fds.iter().enumerate() {
            if p.revents == 0 {
                continue;
            }
            let a = &mut live[i];
            match a.phase {
                Phase::Connecting => {
                    let mut err: libc::c_int = 0;
                    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                    // SAFETY: reading an int socket option.
                    unsafe {
                        libc::getsockopt(a.fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut err).cast(), &raw mut len)
                    };
                    if err == libc::ECONNREFUSED {
                        run.rejected += 1;
                        run.latencies_us.push(a.start.elapsed().as_micros() as u32);
                        done.push(i);
                    } else if err == 0 && expect_503 {
                        // SAFETY: writing our request on our own connected socket.
                        let wrote = !send_request
                            || unsafe { libc::write(a.fd, REQUEST.as_ptr().cast(), REQUEST.len()) }
                                == REQUEST.len() as isize;
                        if wrote {
                            a.phase = Phase::Reading;
                        } else {
                            run.other += 1;
                            done.push(i);
                        }
                    } else {
                        run.other += 1;
                        done.push(i);
                    }
                }
                Phase::Reading => {
                    let mut buf = [0u8; 512];
                    // SAFETY: reading into our buffer.
                    let n = unsafe { libc::read(a.fd, buf.as_mut_ptr().cast(), buf.len()) };
                    if n > 0 && buf[..n as usize].starts_with(b"HTTP/1.1 503") {
                        run.rejected += 1;
                        run.latencies_us.push(a.start.elapsed().as_micros() as u32);
                    } else {
                        run.other += 1;
                    }
                    done.push(i);
                }
            }
        }
        for i in done.into_iter().rev() {
            let a = live.swap_remove(i);
            // SAFETY: our fd.
            unsafe { libc::close(a.fd) };
        }
    }
    for a in live {
        // SAFETY: our fd.
        unsafe { libc::close(a.fd) };
    }
    run.elapsed = start.elapsed();
    run.cpu = thread_cpu().saturating_sub(cpu_start);
    run.latencies_us.sort_unstable();
    run
}

/// Accepts every connection, answers 503 and closes, on one thread; returns its CPU on stop.
struct Server503 {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<std::io::Result<std::io::Result<Duration>>>>,
}

impl Server503 {
    fn start(ns: &str, addr: SocketAddr) -> Result<Self> {
        let listener = testbed::run_in(ns, move || TcpListener::bind(addr))??;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = testbed::spawn_in(ns, move || -> std::io::Result<Duration> {
            use std::io::Write as _;
            let cpu_start = thread_cpu();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let mut conn: TcpStream = conn;
                        let _ = conn.write_all(RESPONSE_503);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(thread_cpu().saturating_sub(cpu_start))
        });
        Ok(Self { stop, handle: Some(handle) })
    }

    fn stop(mut self) -> Result<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        let cpu =
            self.handle.take().expect("started").join().map_err(|_| anyhow::anyhow!("503 server panicked"))???;
        Ok(cpu)
    }
}

pub(crate) fn b3(shedctl: &Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let (duration, runs) =
        scale.pick((Duration::from_secs(4), 5), (Duration::from_secs(2), 1), (Duration::from_millis(500), 1));
    let bed = Testbed::create("shedb3")?;
    let addr = bed.server_addr(false, PORT);
    // Per configuration and run: attempts/s, rejected fraction, p50 us, p99 us,
    // server CPU ns per rejection, the 503 thread's own CPU ns per rejection.
    let mut samples: [Vec<[f64; 6]>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for r in 0..runs {
        for (i, name) in NAMES.iter().enumerate() {
            let (run, total, process_cpu) = if i == 1 {
                let server = Server503::start(&bed.server_ns, addr)?;
                let total_before = busy_cpu()?;
                let run = testbed::run_in(&bed.client_ns, move || clients(addr, duration, true, false))?;
                let total = busy_cpu()?.saturating_sub(total_before);
                let process = server.stop()?;
                (run, total, Some(process))
            } else {
                let http = i == 2;
                let backend = Backend::start(&bed.server_ns, addr, Service::Echo)?;
                // One held connection fills limit 1 (counting open connections): every later SYN is refused.
                let gate = start_gate(
                    shedctl,
                    &bed,
                    &[
                        "--limit",
                        "1",
                        "--count",
                        "connections",
                        "--action",
                        if http { "http" } else { "rst" },
                        "--hook",
                        "tc",
                        "--rst-rate",
                        "0",
                    ],
                )?;
                let held = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1)))??;
                let total_before = busy_cpu()?;
                let run = testbed::run_in(&bed.client_ns, move || clients(addr, duration, http, http))?;
                let total = busy_cpu()?.saturating_sub(total_before);
                drop(held);
                drop(gate);
                drop(backend);
                (run, total, None)
            };
            if run.rejected == 0 {
                bail!("{name}: no attempt was rejected ({} attempts, {} other)", run.attempts, run.other);
            }
            let pct = |p: f64| f64::from(percentile(&run.latencies_us, p).expect("every rejection has a latency"));
            let rejected = run.rejected as f64;
            let server_ns = total.saturating_sub(run.cpu).as_nanos() as f64 / rejected;
            let process_ns = process_cpu.map_or(0.0, |c| c.as_nanos() as f64 / rejected);
            let rate = run.attempts as f64 / run.elapsed.as_secs_f64();
            println!(
                "B3 run {r} {name:<34} {rate:8.0} attempts/s, {:.1}% rejected, p50 {:.0} us, p99 {:.0} us, server CPU {server_ns:.0} ns per rejection{}",
                rejected / run.attempts as f64 * 100.0,
                pct(0.5),
                pct(0.99),
                process_cpu.map_or(String::new(), |_| format!(" (the 503 process itself: {process_ns:.0} ns)"))
            );
            samples[i].push([rate, rejected / run.attempts as f64, pct(0.5), pct(0.99), server_ns, process_ns]);
        }
    }
    let stat = |i: usize, k: usize| median_min_max(samples[i].iter().map(|s| s[k]).collect());
    let mut md = String::new();
    let _ = writeln!(md, "\n## B3: real clients, shed vs an in-app 503\n");
    let _ = writeln!(
        md,
        "Non-blocking connect() clients in the client namespace keep {IN_FLIGHT} attempts in flight for {duration:?}. shed (TC, limit 1 held by one open connection, action rst) refuses every SYN; the in-app limiter is a userspace thread that accepts, writes a 503 and closes; shed's http action completes each handshake itself (a SYN cookie), and answers the request the client then writes with its 503 and FIN. Rejection latency is what the client sees (ECONNREFUSED, or the 503 read). Server CPU per rejection is the machine's busy CPU (/proc/stat) minus the client thread's own CPU, per rejection, so it includes the kernel's handshake and teardown work on both ends of the veth; for the 503 server the accepting thread's own CPU is also shown. Median of {runs} runs (min-max).\n"
    );
    let _ = writeln!(
        md,
        "| configuration | attempts/s | rejected | p50 us | p99 us | server CPU ns per rejection | of which the 503 thread |\n|---|---|---|---|---|---|---|"
    );
    let mut json = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let (rate, lo, hi) = stat(i, 0);
        let (cpu, clo, chi) = stat(i, 4);
        let process = if i == 1 { format!("{:.0}", stat(i, 5).0) } else { "-".into() };
        let _ = writeln!(
            md,
            "| {name} | {rate:.0} ({lo:.0}-{hi:.0}) | {:.1}% | {:.0} | {:.0} | {cpu:.0} ({clo:.0}-{chi:.0}) | {process} |",
            stat(i, 1).0 * 100.0,
            stat(i, 2).0,
            stat(i, 3).0
        );
        json.push(serde_json::json!({"config": name, "attempts_per_sec": rate, "rejected_fraction": stat(i, 1).0, "reject_p50_us": stat(i, 2).0, "reject_p99_us": stat(i, 3).0, "server_cpu_ns_per_rejection": cpu, "process_cpu_ns_per_rejection": if i == 1 { Some(stat(i, 5).0) } else { None }}));
    }
    let ratio = stat(0, 4).0 / stat(1, 4).0;
    let http_ratio = stat(2, 4).0 / stat(1, 4).0;
    let _ = writeln!(
        md,
        "\nshed's server CPU per rejection is {:.2} of accept+503 (goal at most 0.10: {}); shed's stateless http 503 is {:.2} of it (goal at most 0.25: {}).",
        ratio,
        if ratio <= 0.10 { "met" } else { "missed" },
        http_ratio,
        if http_ratio <= 0.25 { "met" } else { "missed" }
    );
    Ok((
        serde_json::json!({"benchmark": "B3 real clients", "runs": runs, "configs": json, "shed_over_503_cpu": ratio, "shed_http_over_503_cpu": http_ratio}),
        md,
    ))
}
