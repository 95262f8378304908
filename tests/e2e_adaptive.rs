// SPDX-License-Identifier: MIT OR Apache-2.0
//! Adaptive control on the real kernel: in-flight counts work rather than
//! sockets, the latency probes land in the right buckets, and the limit
//! follows a service that slows down and recovers. Needs root.
mod support;

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use shed::kernel::maps::GateMaps;
use shed_common::latency;
use shed_testkit::servers::{GoServer, Gunicorn};
use shed_testkit::testbed::{self, Backend, OpenLoop, Service, Testbed};
use support::gate::{Gate, exclusive, field, stats, wait_for_stats};

const PORT: u16 = 8080;

fn ask(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(b"GET\n")?;
    let mut buf = [0u8; 3];
    stream.read_exact(&mut buf)
}

#[test]
fn idle_keep_alive_connections_do_not_count_but_their_requests_are_judged() {
    let _one = exclusive();
    let bed = Testbed::create("shedtw").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(0));
    let backend =
        Backend::start(&bed.server_ns, addr, Service::KeepAlive { service_us: service_us.clone() }).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "10", "--action", "rst"]);

    // 50 keep-alive connections, each answered once: idle now.
    let mut idle: Vec<TcpStream> = testbed::run_in(&bed.client_ns, move || {
        (0..50)
            .map(|i| {
                let mut s =
                    testbed::connect(addr, Duration::from_secs(1)).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                ask(&mut s).unwrap_or_else(|e| panic!("request on connection {i}: {e}"));
                s
            })
            .collect()
    })
    .unwrap();
    let s = wait_for_stats(PORT, Duration::from_secs(3), "50 open, none busy", |s| {
        field(s, "established") == 50 && field(s, "in_flight") == 0
    });
    assert_eq!((field(&s, "busy"), s["count"].as_str()), (0, Some("work")), "{s}");
    // Their first requests came with their handshakes: judged there, not again.
    assert_eq!((field(&s, "requests_admitted"), field(&s, "refused_requests")), (0, 0), "{s}");
    // Quick answers: new clients still get in although 50 connections are open, 5x the limit.
    let mut fresh = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1)))
        .unwrap()
        .expect("admitted");
    ask(&mut fresh).expect("answered");
    let read_before = backend.read.load(Ordering::Relaxed);
    assert_eq!(read_before, 51);

    // Now every idle connection sends its next request, which the server answers
    // slowly: the first 10 are admitted and busy, the other 40 meet a full port
    // at their first segment and are refused with a reset, never read.
    service_us.store(1_500_000, Ordering::Relaxed);
    for s in &mut idle {
        s.write_all(b"GET\n").expect("send request");
    }
    let s = wait_for_stats(PORT, Duration::from_secs(3), "requests judged", |s| {
        field(s, "requests_admitted") + field(s, "refused_requests") == 50
    });
    println!("kept-alive requests judged: {s}");
    assert_eq!((field(&s, "requests_admitted"), field(&s, "refused_requests")), (10, 40), "{s}");
    assert_eq!(field(&s, "in_flight"), 10, "{s}");
    assert_eq!(s["rejected_by_reason"]["limit"].as_u64(), Some(40), "{s}");
    let refused = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1))).unwrap();
    assert_eq!(refused.expect_err("work above the limit").kind(), std::io::ErrorKind::ConnectionRefused);

    // The admitted 10 are answered; the refused 40 were reset, and the service never read them.
    let (mut answered, mut reset) = (0, 0);
    for s in &mut idle {
        let mut buf = [0u8; 3];
        match s.read_exact(&mut buf) {
            Ok(()) => answered += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => reset += 1,
            Err(e) => panic!("neither answered nor reset: {e}"),
        }
    }
    assert_eq!((answered, reset), (10, 40));
    assert_eq!(backend.read.load(Ordering::Relaxed), read_before + 10, "refused requests were never read");
    // The daemon closed the refused connections' server sockets.
    wait_for_stats(PORT, Duration::from_secs(3), "refused connections closed", |s| field(s, "established") == 11);
    service_us.store(0, Ordering::Relaxed);
    wait_for_stats(PORT, Duration::from_secs(5), "answers out", |s| field(s, "in_flight") < 10);
    testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1)))
        .unwrap()
        .expect("admitted again");

    // The clients close their answered connections: each FIN wakes the
    // server's reader as a request's bytes would, but none is a request, and
    // none was abandoned (each was once counted busy again, and abandoned at
    // its close).
    let abandoned = field(&stats(PORT), "abandoned");
    drop(idle);
    drop(fresh);
    let s = wait_for_stats(PORT, Duration::from_secs(5), "every connection closed", |s| field(s, "established") == 0);
    assert_eq!((field(&s, "abandoned"), field(&s, "busy")), (abandoned, 0), "{s}");
    // A client that gives up before its answer (a reset, as a timed-out
    // client's close often is) did abandon its request.
    service_us.store(1_500_000, Ordering::Relaxed);
    let mut gives_up = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1)))
        .unwrap()
        .expect("admitted");
    gives_up.write_all(b"GET\n").expect("send request");
    wait_for_stats(PORT, Duration::from_secs(3), "its request in service", |s| field(s, "busy") == 1);
    socket2::SockRef::from(&gives_up).set_linger(Some(Duration::ZERO)).expect("SO_LINGER 0");
    drop(gives_up);
    let s = wait_for_stats(PORT, Duration::from_secs(5), "the reset connection gone", |s| field(s, "established") == 0);
    assert_eq!((field(&s, "abandoned"), field(&s, "busy")), (abandoned + 1, 0), "{s}");
    service_us.store(0, Ordering::Relaxed);
}

/// Samples recorded in `hist` within [lo_us, hi_us] (by bucket bounds).
fn count_between(hist: &[u64; latency::BUCKETS], lo_us: u64, hi_us: u64) -> u64 {
    hist.iter()
        .enumerate()
        .filter(|(b, _)| latency::lower_bound(*b) >= lo_us && latency::upper_bound(*b) <= hi_us)
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn latency_probes_land_in_the_right_buckets() {
    let _one = exclusive();
    let bed = Testbed::create("shedtp").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    // One worker that takes 30 ms per request: a second request sent at the same time waits ~30 ms.
    let service_us = Arc::new(AtomicU64::new(30_000));
    let _backend = Backend::start(&bed.server_ns, addr, Service::Workers { workers: 1, service_us }).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "100"]);
    let maps = GateMaps::open_pinned().expect("pinned maps");
    let slot = maps.config(PORT).unwrap().slot;

    // Five requests one at a time: no queue. The bounds come from what the client
    // measured (the backend polls, and a busy machine delays it): nothing the kernel
    // saw can take longer than the client's whole request, and the service sleeps 30 ms.
    let mut slowest_us = 0u64;
    for _ in 0..5 {
        let outcome = testbed::run_in(&bed.client_ns, move || testbed::request(addr, Duration::from_secs(2))).unwrap();
        let testbed::Outcome::Answered(took) = outcome else { panic!("{outcome:?}") };
        slowest_us = slowest_us.max(took.as_micros() as u64);
    }
    let hist = maps.latency(slot).unwrap();
    let total: u64 = hist.service.iter().sum();
    assert_eq!(total, 5, "one service sample per request: {:?}", hist.service);
    // Within the bucket holding the bound (buckets are coarse).
    let upto = |us: u64| latency::upper_bound(latency::bucket(us));
    assert_eq!(
        count_between(&hist.service, 24_576, upto(slowest_us)),
        5,
        "service: the 30 ms sleep, at most the request"
    );
    assert_eq!(count_between(&hist.sojourn, 24_576, upto(slowest_us)), 5, "sojourn likewise: {:?}", hist.sojourn);
    assert_eq!(
        count_between(&hist.queue_wait, 0, upto(slowest_us.saturating_sub(30_000))),
        5,
        "no queue: picked up within what the request took beyond its 30 ms service ({slowest_us} us): {:?}",
        hist.queue_wait
    );

    // Two at once: the worker takes one, the other waits its turn (~30 ms) before it is read.
    let both: Vec<_> = (0..2)
        .map(|_| testbed::spawn_in(&bed.client_ns, move || testbed::request(addr, Duration::from_secs(2))))
        .collect();
    let mut took_us: Vec<u64> = both
        .into_iter()
        .map(|h| match h.join().unwrap().unwrap() {
            testbed::Outcome::Answered(took) => took.as_micros() as u64,
            other => panic!("{other:?}"),
        })
        .collect();
    took_us.sort_unstable();
    let after = maps.latency(slot).unwrap();
    let queue: [u64; latency::BUCKETS] = std::array::from_fn(|i| after.queue_wait[i] - hist.queue_wait[i]);
    let sojourn: [u64; latency::BUCKETS] = std::array::from_fn(|i| after.sojourn[i] - hist.sojourn[i]);
    // The first is read at once (within what its request took beyond the service);
    // the second waits for the first's 30 ms service, and its sojourn is wait plus service.
    let (first, second) = (took_us[0], took_us[1]);
    assert_eq!(count_between(&queue, 0, upto(first.saturating_sub(30_000))), 1, "{took_us:?}: {queue:?}");
    assert_eq!(count_between(&queue, 16_384, upto(second.saturating_sub(30_000))), 1, "{took_us:?}: {queue:?}");
    assert_eq!(count_between(&sojourn, 49_152, upto(second)), 1, "{took_us:?}: {sojourn:?}");
}

/// Medians over each phase (after its first second) of the limit and the
/// sojourn p99 while 8 workers serve 10 ms, then 100 ms, then 10 ms again,
/// under 1,000 req/s on new connections, with a gate run with `args`.
struct Phases {
    limit_fast: u64,
    limit_slow: u64,
    limit_recovered: u64,
    p99_fast: u64,
    p99_slow: u64,
}

fn slow_down_and_recover(args: &[&str]) -> Phases {
    let _one = exclusive();
    let bed = Testbed::create("shedta").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    // 8 workers x 10 ms = 800 req/s; offered 1000 req/s on new connections.
    let service_us = Arc::new(AtomicU64::new(10_000));
    let _backend =
        Backend::start(&bed.server_ns, addr, Service::Workers { workers: 8, service_us: service_us.clone() })
            .expect("backend");
    let _gate =
        Gate::start(&bed, &[&["--port", "8080", "--action", "rst", "--initial-limit", "40"][..], args].concat());
    let rate = Arc::new(AtomicU64::new(1000));
    let load = OpenLoop::start(&bed.client_ns, addr, rate, Duration::from_secs(1));

    let mut trajectory: Vec<(f64, u64, u64)> = Vec::new(); // (t, limit, sojourn p99)
    let start = Instant::now();
    let mut sample_phase = |secs: u64, service: u64| -> Vec<(u64, u64)> {
        service_us.store(service, Ordering::Relaxed);
        let end = start.elapsed() + Duration::from_secs(secs);
        let mut seen = Vec::new();
        while start.elapsed() < end {
            let s = stats(PORT);
            let point = (field(&s, "limit"), field(&s, "sojourn_p99_us"));
            trajectory.push((start.elapsed().as_secs_f64(), point.0, point.1));
            seen.push(point);
            thread::sleep(Duration::from_millis(150));
        }
        seen
    };
    let fast = sample_phase(5, 10_000);
    let slow = sample_phase(5, 100_000);
    let recovered = sample_phase(6, 10_000);
    drop(load);

    // Medians over each phase's last 2 s: the level it settles to (as B5 reads it;
    // the phase's first seconds are the transition, and a baseline probe can fall
    // on the change: the first one comes about 5 s in, with the slowdown).
    let median = |v: &[(u64, u64)], pick: fn(&(u64, u64)) -> u64| -> u64 {
        let mut v: Vec<u64> = v.iter().skip(v.len().saturating_sub(13)).map(pick).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let phases = Phases {
        limit_fast: median(&fast, |p| p.0),
        limit_slow: median(&slow, |p| p.0),
        limit_recovered: median(&recovered, |p| p.0),
        p99_fast: median(&fast, |p| p.1),
        p99_slow: median(&slow, |p| p.1),
    };
    println!("limit trajectory {args:?} (t s, limit, sojourn p99 us):");
    for (t, l, p) in &trajectory {
        println!("  {t:5.1}  {l:4}  {p:7}");
    }
    println!(
        "median limit: {} at 10 ms service, {} at 100 ms, {} after; median p99 {} us -> {} us",
        phases.limit_fast, phases.limit_slow, phases.limit_recovered, phases.p99_fast, phases.p99_slow
    );
    phases
}

#[test]
fn the_limit_falls_when_the_service_slows_and_recovers_after() {
    let Phases { limit_fast, limit_slow, limit_recovered, p99_fast, p99_slow } =
        slow_down_and_recover(&["--algo", "gradient"]);
    // (A 10x slower service; p99 measured over each phase's settled last 2 s.)
    assert!(p99_slow > 2 * p99_fast, "stats show the latency rising: p99 {p99_fast} -> {p99_slow} us");
    // The limit falls on its own, by a quarter at least (not a slot or two), to what
    // Little's law asks of 8 workers at 100 ms (80 req/s x ~0.1-0.3 s in the system:
    // 8 busy plus a short queue), and rises again by more than a slot or two when the
    // service speeds up, towards gradient's own level for it (8 workers kept busy plus
    // a queue of about sqrt(limit), where limit x baseline/RTT + sqrt(limit) = limit:
    // about 12). A slow-phase limit already at that level need not rise (the 6 s phase
    // is short for gradient's growth: measured 25 -> 8 -> 15, 32 -> 14 -> 19,
    // 16 -> 9 -> 16 and 43 -> 16 -> 16 on this machine, settled levels).
    assert!(
        limit_slow * 4 <= limit_fast * 3,
        "the limit falls on its own when the service slows: {limit_fast} -> {limit_slow}"
    );
    assert!((4..=24).contains(&limit_slow), "limit {limit_slow} at 100 ms x 8 workers, Little's law asks 8..24");
    // Up by three slots, or to gradient's own level (12) from a slow phase
    // already there (seen on a fresh clone: 31 -> 13 -> 12, the level itself).
    assert!(
        limit_recovered >= (limit_slow + 3).min(12),
        "and rises again when it speeds up: {limit_fast} -> {limit_slow} -> {limit_recovered}"
    );
}

/// `n` connection attempts to `addr` from the client namespace, left in flight (non-blocking).
fn attempt(bed: &Testbed, addr: std::net::SocketAddr, n: usize) -> Vec<socket2::Socket> {
    testbed::run_in(&bed.client_ns, move || {
        (0..n)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&addr.into()); // EINPROGRESS
                s
            })
            .collect()
    })
    .expect("client namespace")
}

/// A listener with a backlog of 2 that never accepts: its accept queue fills and overflows.
fn stuck_listener(bed: &Testbed, addr: std::net::SocketAddr) -> socket2::Socket {
    testbed::run_in(&bed.server_ns, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.listen(2).unwrap();
        s
    })
    .expect("server namespace")
}

fn namespace_listen_drops(bed: &Testbed) -> u64 {
    testbed::run_in(&bed.server_ns, || {
        shed::host::netstat::listen_drops(&std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap()).unwrap()
    })
    .expect("server namespace")
}

#[test]
fn only_the_ports_own_accept_queue_overflow_cuts_its_limit() {
    let _one = exclusive();
    let bed = Testbed::create("shedtq").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _protected = stuck_listener(&bed, addr);
    let _other = stuck_listener(&bed, bed.server_addr(false, 9090));
    let _gate = Gate::start(&bed, &["--port", "8080", "--algo", "gradient", "--initial-limit", "100"]);

    // Another listener of the namespace overflows: the namespace's drop counter moves,
    // the protected port's limit does not (its own queue is empty).
    let drops_before = namespace_listen_drops(&bed);
    let _elsewhere = attempt(&bed, bed.server_addr(false, 9090), 30);
    thread::sleep(Duration::from_secs(3));
    let drops = namespace_listen_drops(&bed) - drops_before;
    assert!(drops >= 20, "the other listener overflowed: {drops} drops");
    let s = stats(PORT);
    assert_eq!(field(&s, "limit"), 100, "another listener's overflow cut this port: {s}");
    assert_eq!(field(&s, "listen_drops"), 0, "{s}");
    assert_eq!(field(&s, "accept_backlog"), 2, "{s}");

    // Its own queue overflows: counted against it, and the limit comes down.
    let _here = attempt(&bed, addr, 30);
    let s = wait_for_stats(PORT, Duration::from_secs(5), "the port's own overflow cuts it", |s| {
        field(s, "listen_drops") > 0 && field(s, "limit") < 100
    });
    assert!(field(&s, "accept_queue") >= 2, "its accept queue is full: {s}");
}

#[test]
fn the_queue_controller_keeps_every_worker_busy_with_a_short_queue() {
    let Phases { limit_fast, limit_slow, limit_recovered, p99_fast, p99_slow } =
        slow_down_and_recover(&["--algo", "queue"]);
    // (A 10x slower service; p99 measured over each phase's settled last 2 s.)
    assert!(p99_slow > 2 * p99_fast, "stats show the latency rising: p99 {p99_fast} -> {p99_slow} us");
    // Little's law with a short queue: 8 workers busy plus about one request
    // waiting per worker (the target is at least 3/4 of the median service
    // time). Measured (last 2 s of each phase) 14 -> 11 -> 14 and 14 -> 10 -> 14.
    assert!((8..=24).contains(&limit_fast), "limit {limit_fast} at 10 ms x 8 workers");
    assert!(
        (6..=16).contains(&limit_slow) && limit_slow < limit_fast,
        "limit {limit_fast} -> {limit_slow} at 100 ms x 8 workers"
    );
    // Back up once the service recovers: the limit climbs a slot or two per few
    // windows, so on a loaded machine the phase's last 2 s may catch it part way
    // (14 -> 10 -> 11 in one CI run; 14 -> 10 -> 14 usually).
    assert!(limit_recovered > limit_slow, "and back up: {limit_fast} -> {limit_slow} -> {limit_recovered}");
}

/// h2load's bursts (`--h1 -m 1 -T 1 -r 400`: each second's 400 connections at
/// once, one request each, 1 s to finish) against 4 workers x 20 ms (200/s), for
/// `seconds`: the limits seen every 100 ms, and the requests answered.
fn bursts(args: &[&str], seconds: u64) -> (Vec<u32>, u64) {
    let bed = Testbed::create("shedob").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(20_000));
    let _backend =
        Backend::start(&bed.server_ns, addr, Service::HttpWorkers { workers: 4, service_us }).expect("backend");
    let _gate = Gate::start(&bed, args);
    let total = (400 * seconds).to_string();
    let load = std::process::Command::new("ip")
        .args(["netns", "exec", &bed.client_ns, "h2load", "--h1", "-m", "1", "-T", "1", "-t", "1", "-r", "400"])
        .args(["-c", &total, "-n", &total, &format!("http://{addr}/")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run h2load (apt-get install nghttp2-client, or cargo xtask setup)");
    let mut limits = Vec::new();
    let mut load = load;
    let start = Instant::now();
    while load.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(seconds + 20), "h2load did not finish");
        limits.push(field(&stats(PORT), "limit") as u32);
        thread::sleep(Duration::from_millis(100));
    }
    let report = String::from_utf8_lossy(&load.wait_with_output().unwrap().stdout).into_owned();
    let (succeeded, _) = testbed::h2load_counts(&report).unwrap_or_else(|e| panic!("{e}: {report}"));
    (limits, succeeded)
}

/// Synchronized bursts at 2x capacity from a real load generator. Judged on
/// queue wait alone, every burst looks like overload and the limit stays near
/// a few dozen; with a 1 s objective the limit becomes what the 4 workers
/// answer within it (about 200/s x 0.95 s = 190), and the bursts get served.
#[test]
fn an_objective_admits_the_bursts_the_service_can_answer_in_time() {
    let _one = exclusive();
    let seconds = 8;
    let base = ["--port", "8080", "--action", "rst", "--algo", "queue", "--initial-limit", "20"];
    let (plain, plain_served) = bursts(&base, seconds);
    let (objective, served) = bursts(&[&base[..], &["--target-latency", "1000"]].concat(), seconds);
    let last = |l: &[u32]| l[l.len().saturating_sub(10)..].iter().copied().max().unwrap_or(0);
    println!(
        "bursts: answered {plain_served} on queue wait alone (last limit {}), {served} with a 1 s objective (last limit {})",
        last(&plain),
        last(&objective)
    );
    assert!(last(&plain) < 80, "on queue wait alone the limit stays low: {plain:?}");
    assert!((120..=230).contains(&last(&objective)), "the objective's limit: {objective:?}");
    // 1,600 at most in 8 s. The limit doubles from 20 while the rate is unknown
    // (20 + 40 + 80 + 160, then about 190 a second: some 1,060).
    assert!(
        served >= 800 && served >= 4 * plain_served,
        "answered in time: {served} with the objective, {plain_served} without"
    );
}

/// What one run of overload gave: answered within the deadline, sent, the
/// highest limit of the run's second half (0 without a gate), and the limit
/// every 200 ms.
struct CaseRun {
    answered: usize,
    sent: usize,
    late_limit: u64,
    limits: Vec<u64>,
}

/// A real server of `workers` x `service_us`, loaded on new connections
/// with a 1 s client deadline.
#[derive(Clone, Copy)]
struct ServerCase {
    /// `go` (Go's `net/http`, reads every request at once), `gunicorn` (its
    /// gthread worker: a thread reads a request when free) or the in-process
    /// thread-per-connection server (reads at once).
    kind: &'static str,
    workers: usize,
    service_us: u64,
    /// Offered load, in multiples of capacity.
    overload: u64,
    seconds: u64,
}

impl ServerCase {
    /// Requests a second the server answers at most.
    fn capacity(&self) -> u64 {
        self.workers as u64 * 1_000_000 / self.service_us
    }
}

/// One run of `case` with shed on its defaults plus `--action rst`, or no gate.
fn case_run(case: ServerCase, gated: bool) -> CaseRun {
    let bed = Testbed::create("shedra").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(case.service_us));
    let (_rust, _go, _gunicorn);
    if case.kind == "go" {
        _go = Some(GoServer::start(&bed.server_ns, addr, case.workers, case.service_us).expect("Go net/http server"));
    } else if case.kind == "gunicorn" {
        _gunicorn =
            Some(Gunicorn::start(&bed.server_ns, addr, case.workers, case.service_us).expect("gunicorn gthread"));
    } else {
        _rust = Some(
            Backend::start(&bed.server_ns, addr, Service::ReadAtOnce { workers: case.workers, service_us })
                .expect("backend"),
        );
    }
    let gate = gated.then(|| Gate::start(&bed, &["--port", "8080", "--action", "rst"]));
    let load = OpenLoop::start_with(
        &bed.client_ns,
        addr,
        Arc::new(AtomicU64::new(case.overload * case.capacity())),
        Duration::from_secs(1),
        testbed::HTTP_REQUEST,
    );
    let start = Instant::now();
    let (mut late_limit, mut limits) = (0, Vec::new());
    while start.elapsed() < Duration::from_secs(case.seconds) {
        if gate.is_some() {
            let limit = field(&stats(PORT), "limit");
            limits.push(limit);
            if start.elapsed() >= Duration::from_secs(case.seconds / 2) {
                late_limit = late_limit.max(limit);
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    let outcomes = load.finish();
    if let Some(gate) = &gate
        && std::env::var_os("SHED_TEST_GATE_LOG").is_some()
    {
        println!("{}", gate.log());
    }
    let answered = outcomes.iter().filter(|o| matches!(o, testbed::Outcome::Answered(_))).count();
    CaseRun { answered, sent: outcomes.len(), late_limit, limits }
}

/// Runs `case` with no gate and then with shed, and prints both.
fn case_pair(case: ServerCase) -> (CaseRun, CaseRun) {
    let none = case_run(case, false);
    let shed = case_run(case, true);
    let capacity = (case.capacity() * case.seconds) as f64;
    println!(
        "{} {} x {} ms at {}x: answered {} of {} with shed ({:.0}% of capacity, limit up to {} in the second half), {} of {} with no gate ({:.0}%); limits {:?}",
        case.kind,
        case.workers,
        case.service_us / 1000,
        case.overload,
        shed.answered,
        shed.sent,
        100.0 * shed.answered as f64 / capacity,
        shed.late_limit,
        none.answered,
        none.sent,
        100.0 * none.answered as f64 / capacity,
        shed.limits,
    );
    (none, shed)
}

/// A server that reads every request at once shows the kernel no queue wait:
/// blind to it, the limit climbed into the hundreds and shed served what no
/// gate did (a third). The service stage's Little's law finds the queue
/// inside; the ratio against no gate in the same run is what is asserted.
#[test]
fn a_server_that_reads_at_once_is_protected_from_overload() {
    let _one = exclusive();
    for kind in ["thread-per-connection", "go"] {
        let case = ServerCase { kind, workers: 4, service_us: 20_000, overload: 2, seconds: 12 };
        let (none, shed) = case_pair(case);
        let capacity = (case.capacity() * case.seconds) as f64;
        // 4 workers need about 4 in flight; the queue target (5 ms, or 3/4 of a
        // service time) adds a few, and the limit a drain probe returns to a few
        // more (measured up to 28). Blind to the queue inside, it climbed past 1,000.
        assert!(shed.late_limit <= 48, "{kind}: the limit climbed to {}", shed.late_limit);
        // Measured (2 cores): shed 97-99% of capacity; no gate 49% (this server wakes
        // its waiting threads in no order, so some new requests are in time) and 15% (Go).
        assert!(
            shed.answered as f64 >= 1.5 * none.answered as f64 && shed.answered as f64 >= 0.75 * capacity,
            "{kind}: shed answered {} in time, no gate {}",
            shed.answered,
            none.answered
        );
    }
}

/// Runs `case` with no gate and with shed and checks shed protects it: the
/// limit stays bounded, shed answers at least `fraction` of capacity in time
/// and at least 3x what no gate answers in the same run.
fn assert_protected(case: ServerCase, fraction: f64) {
    let (none, shed) = case_pair(case);
    let capacity = (case.capacity() * case.seconds) as f64;
    // A few workers use a few in flight: the limit is bounded near that.
    assert!(shed.late_limit <= 40, "the limit ran away: {}", shed.late_limit);
    assert!(
        shed.answered as f64 >= fraction * capacity && shed.answered >= 3 * none.answered.max(1),
        "shed answered {} in time ({:.0}% of capacity), no gate {}",
        shed.answered,
        100.0 * shed.answered as f64 / capacity,
        none.answered
    );
}

/// A slow service with few workers: Go with 4 workers x 100 ms (40/s) under
/// 2x overload. The starting limit (100) holds 2.5 s of work against a 1 s
/// deadline, most admitted requests are abandoned by their clients, and the
/// answers come a few a window. On the defaults the limit climbed past 1,000
/// here and shed served what no gate serves (6%). Measured after: 98-99%.
#[test]
fn a_slow_server_with_few_workers_is_protected_from_overload() {
    let _one = exclusive();
    assert_protected(ServerCase { kind: "go", workers: 4, service_us: 100_000, overload: 2, seconds: 20 }, 0.7);
}

/// A slower service still: Go with 8 workers x 500 ms (16/s) under 2x
/// overload, where a request may wait one more service time before its
/// client gives up. On the defaults shed served 2.5% here, as no gate.
/// Measured after: 69-81% (the drain probe holds half the knee for seconds
/// at this service time: BENCHMARKS, B14).
#[test]
fn a_server_of_half_second_requests_is_protected_from_overload() {
    let _one = exclusive();
    assert_protected(ServerCase { kind: "go", workers: 8, service_us: 500_000, overload: 2, seconds: 30 }, 0.55);
}

/// gunicorn's gthread worker, 4 threads x 100 ms (40/s), under 2x overload:
/// a Python service whose requests wait unread for a thread. Measured: 87%.
#[test]
fn a_gunicorn_service_of_few_threads_is_protected_from_overload() {
    let _one = exclusive();
    assert_protected(ServerCase { kind: "gunicorn", workers: 4, service_us: 100_000, overload: 2, seconds: 20 }, 0.7);
}
