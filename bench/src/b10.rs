// SPDX-License-Identifier: MIT OR Apache-2.0
//! B10: the node agent's cost against pods gated. A private containerd makes
//! 1, 10 and 110 (the kubelet's default most) annotated pod sandboxes through the CRI API; `shedctl attach
//! --pods` finds them and gates each in its own namespace. Per level: with
//! the agent running, the pods started at once and each one's time from its
//! sandbox ready to its gate set up; then, a new agent started with every pod
//! there, how long it took to gate them all from its start, how long one more pod
//! created then took from its sandbox being ready to its gate being set up,
//! the daemon's CPU time and resident memory, the kernel memory of its maps
//! and programs, and the programs loaded per pod (read from the daemon's own
//! file descriptors, /proc/PID/fdinfo: one shared set judges and counts for
//! every pod, which brings only its maps), and how long a restart of the
//! agent leaves the pods ungated. And what the pods' gates cost every other
//! socket on the node: the socket tracepoints run the agent's dispatchers,
//! which count a pod's socket events under that pod's maps (before them,
//! each event of any socket ran one program per pod). Loopback round
//! trips and connections in the node's namespace, on a port no gate
//! protects, before the agent starts and with every pod gated, and the runs
//! of the agent's programs from the kernel's BPF statistics.
use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use shed_testkit::{
    cri::Runtime,
    gate::{Gate, Log},
    testbed::{Backend, Service},
};

use crate::common::Scale;

const ASKS: [(&str, &str); 4] =
    [("shed.io/ports", "8080"), ("shed.io/limit", "50"), ("shed.io/count", "connections"), ("shed.io/action", "rst")];

/// What the daemon holds: CPU seconds, resident bytes, and its BPF maps and programs (count, memlock bytes).
#[derive(Debug, Default)]
struct Held {
    cpu_s: f64,
    rss_bytes: u64,
    maps: (u64, u64),
    programs: (u64, u64),
    /// Runs and run time (ns) of its programs, with the kernel's BPF statistics on.
    runs: (u64, u64),
}

/// Ample for the agent to settle after a pod's set-up (to verify its next
/// spare gate object, where pods load their own programs).
const SPARE_SETTLES: Duration = Duration::from_secs(8);

fn held_by(pid: i32) -> Result<Held> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    let mut held = Held { cpu_s: (field(14) + field(15)) as f64 / ticks, rss_bytes: rss_kb * 1024, ..Held::default() };
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(info) = std::fs::read_to_string(fd?.path()) else { continue };
        let memlock = info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse::<u64>().ok());
        let slot = if info.contains("map_type:") {
            &mut held.maps
        } else if info.contains("prog_type:") {
            &mut held.programs
        } else {
            continue;
        };
        slot.0 += 1;
        slot.1 += memlock.unwrap_or(0);
        let stat =
            |key: &str| info.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<u64>().ok());
        held.runs.0 += stat("run_cnt:").unwrap_or(0);
        held.runs.1 += stat("run_time_ns:").unwrap_or(0);
    }
    Ok(held)
}

/// A memory cgroup the agent runs in, as a container's limit counts it: the
/// kernel charges it the BPF maps and the verifier's work besides the
/// process's own memory (cgroup v2 if mounted so, else v1's memory
/// controller). No limit is set; removed on drop.
struct Charged {
    dir: std::path::PathBuf,
    v2: bool,
}

impl Charged {
    fn join(pid: i32) -> Result<Self> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let root = if v2 { Path::new("/sys/fs/cgroup") } else { Path::new("/sys/fs/cgroup/memory") };
        let dir = root.join(format!("shed-b10-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).context("move the agent into its cgroup")?;
        Ok(Self { dir, v2 })
    }

    fn read(&self, v2: &str, v1: &str) -> u64 {
        let file = self.dir.join(if self.v2 { v2 } else { v1 });
        std::fs::read_to_string(file).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
    }

    /// Bytes charged now.
    fn now(&self) -> u64 {
        self.read("memory.current", "memory.usage_in_bytes")
    }

    /// The most bytes charged at once so far.
    fn peak(&self) -> u64 {
        self.read("memory.peak", "memory.max_usage_in_bytes")
    }
}

impl Drop for Charged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// When the agent's log says `netns`'s gate was set up (its line's UTC time).
fn gated_at(log: &str, netns: &str) -> Option<SystemTime> {
    let line = shed_testkit::gate::gated_line(log, netns)?;
    log_time(line.split_whitespace().next()?)
}

/// When the agent's log says `netns`'s gate was set up, waited for (every
/// 10 ms) until `deadline`; past it, the error names `what` and the log.
fn wait_gated(gate: &Gate, netns: &str, deadline: Instant, what: &str) -> Result<SystemTime> {
    loop {
        if let Some(at) = gated_at(&gate.log(), netns) {
            return Ok(at);
        }
        if Instant::now() > deadline {
            bail!("{what}:\n{}", gate.log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// When the agent took over the first of `netns`'s links its predecessor
/// left judging, if it did.
fn taken_over_at(log: &str, netns: &str) -> Option<SystemTime> {
    let line = shed_testkit::gate::gate_line(log, netns, "took over the last agent's TC link")?;
    log_time(line.split_whitespace().next()?)
}

/// A log line's `2026-12-03T05:49:08.207168Z` as a time (UTC).
fn log_time(stamp: &str) -> Option<SystemTime> {
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<u64> = hms.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let (&[y, m, day], &[h, min, s]) = (d.as_slice(), t.as_slice()) else { return None };
    // Days since 1970-01-01 (civil from days, inverted; Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos = format!("{frac:0<9}")[..9].parse::<u64>().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(days * 86_400 + h * 3600 + min * 60 + s, nanos as u32))
}

/// What a socket of the node pays: wall time per loopback round trip (64
/// bytes each way on one connection: six socket events) and per connection
/// opened and closed, each the median of 5 repeats; and, from the kernel's
/// BPF statistics, how many runs of the agent's programs and how much of
/// their time each took (a dispatcher's runs include the gate programs it
/// tail-calls).
#[derive(Debug, Default)]
struct SocketCosts {
    trip_us: f64,
    connect_us: f64,
    /// Program runs and ns per round trip, then per connection.
    trip_runs: f64,
    trip_ns: f64,
    connect_runs: f64,
    connect_ns: f64,
}

/// `programs`: the agent's programs' (runs, ns) so far.
fn socket_costs(scale: Scale, programs: &dyn Fn() -> Result<(u64, u64)>) -> Result<SocketCosts> {
    let (trips, connects) = scale.pick((2_000u32, 300u32), (1_000, 200), (100, 20));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        // The echo connection first, then each connection of the churn until the client's last.
        let (mut echo, _) = listener.accept()?;
        let mut buf = [0u8; 64];
        while echo.read_exact(&mut buf).is_ok() {
            echo.write_all(&buf)?;
        }
        for _ in 0..5 * connects {
            drop(listener.accept()?);
        }
        Ok(())
    });
    let mut echo = TcpStream::connect(addr)?;
    echo.set_nodelay(true)?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per = |before: (u64, u64), after: (u64, u64), n: u32| {
        let n = f64::from(n);
        (after.0.saturating_sub(before.0) as f64 / n, after.1.saturating_sub(before.1) as f64 / n)
    };
    let mut costs = SocketCosts::default();
    let mut per_trip = Vec::new();
    let mut buf = [7u8; 64];
    // A warm-up round first (caches, a CPU's frequency), then 5 timed ones.
    let mut counted = programs()?;
    for round in 0..6 {
        if round == 1 {
            counted = programs()?;
        }
        let start = Instant::now();
        for _ in 0..trips {
            echo.write_all(&buf)?;
            echo.read_exact(&mut buf)?;
        }
        if round > 0 {
            per_trip.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(trips));
        }
    }
    (costs.trip_runs, costs.trip_ns) = per(counted, programs()?, 5 * trips);
    drop(echo);
    let mut per_connect = Vec::new();
    let counted = programs()?;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..connects {
            drop(TcpStream::connect(addr)?);
        }
        per_connect.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(connects));
    }
    server.join().map_err(|_| anyhow::anyhow!("the echo server panicked"))??;
    // The last closes land a moment after the loop.
    std::thread::sleep(Duration::from_millis(100));
    (costs.connect_runs, costs.connect_ns) = per(counted, programs()?, 5 * connects);
    costs.trip_us = median(per_trip);
    costs.connect_us = median(per_connect);
    Ok(costs)
}

/// What the agent costs as its pods hold connections and serve a trickle,
/// each in percent of one core over a span (the agent's threads' own
/// schedstat: clock ticks are too coarse for tenths of a percent): every
/// pod serves an echo on its port, first with nothing held, then holding
/// [`HELD_PER_POD`] idle kept-alive connections (each answered once), then
/// with a request a second to every pod on them.
#[derive(Debug, Default)]
struct HeldCosts {
    none_held: f64,
    held: f64,
    light_load: f64,
    connections: usize,
    /// Requests answered a second under the light load (one a pod, if every one was).
    light_rate: f64,
}

const HELD_PER_POD: usize = 20;

fn held_costs(gate: &Gate, pods: &[&shed_testkit::cri::Pod], scale: Scale) -> Result<HeldCosts> {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let (span, settle) = scale.pick(
        (Duration::from_secs(20), Duration::from_secs(5)),
        (Duration::from_secs(10), Duration::from_secs(5)),
        (Duration::from_secs(2), Duration::from_secs(3)),
    );
    let addr = |p: &shed_testkit::cri::Pod| std::net::SocketAddr::from((p.ip, 8080));
    let _servers = pods
        .iter()
        .map(|p| Backend::start(&p.netns, addr(p), Service::Echo))
        .collect::<std::io::Result<Vec<_>>>()
        .context("an echo server in each pod")?;
    std::thread::sleep(settle);
    let none_held = gate.cpu_percent_over(span);
    let ask = |conn: &mut TcpStream| -> std::io::Result<()> {
        conn.write_all(b"hi")?;
        let mut answer = [0u8; 2];
        conn.read_exact(&mut answer)
    };
    let mut held = Vec::with_capacity(pods.len());
    for pod in pods {
        let mut conns = Vec::with_capacity(HELD_PER_POD);
        for _ in 0..HELD_PER_POD {
            let mut conn = shed_testkit::testbed::connect(addr(pod), Duration::from_secs(2))
                .with_context(|| format!("connect to {}", pod.netns))?;
            conn.set_read_timeout(Some(Duration::from_secs(2)))?;
            ask(&mut conn).with_context(|| format!("a first request to {}", pod.netns))?;
            conns.push(conn);
        }
        held.push(conns);
    }
    let connections = held.iter().map(Vec::len).sum();
    std::thread::sleep(settle);
    let held_cpu = gate.cpu_percent_over(span);
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || -> std::io::Result<(u64, Duration)> {
            let (started, mut answered) = (Instant::now(), 0u64);
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                for conns in &mut held {
                    ask(&mut conns[round % HELD_PER_POD])?;
                    answered += 1;
                }
                round += 1;
                std::thread::sleep(Duration::from_secs(1).saturating_sub(at.elapsed()));
            }
            Ok((answered, started.elapsed()))
        })
    };
    std::thread::sleep(settle);
    let light_load = gate.cpu_percent_over(span);
    stop.store(true, Ordering::Relaxed);
    let (answered, took) = load.join().map_err(|_| anyhow::anyhow!("the light load panicked"))??;
    Ok(HeldCosts {
        none_held,
        held: held_cpu,
        light_load,
        connections,
        light_rate: answered as f64 / took.as_secs_f64(),
    })
}

/// Turns the kernel's BPF run statistics on (run counts and times in each
/// program's fdinfo) while it lives, as they were after.
struct BpfStats(String);

impl BpfStats {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn on() -> Result<Self> {
        let was = std::fs::read_to_string(Self::PATH).context("read bpf_stats_enabled")?;
        std::fs::write(Self::PATH, "1").context("turn the kernel's BPF statistics on")?;
        Ok(Self(was.trim().to_owned()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// Pods started together with the agent running: from each one's sandbox
/// ready to its gate set up.
struct Together {
    longest: Duration,
    median: Duration,
}

/// One level: `pods` annotated pods gated by one agent, then one more.
fn level(shedctl: &Path, pods: usize, level_index: usize, scale: Scale) -> Result<serde_json::Value> {
    let mut runtime = Runtime::start(&format!("shedb10{level_index}"), &format!("10.233.{}.0/24", 80 + level_index))
        .context("a private containerd")?;
    let socket = runtime.socket().display().to_string();
    // The pods start together with the agent running (a node's pods after
    // its reboot, a Deployment scaled up): each pod's time from its sandbox
    // ready to its gate set up. The agent then leaves them for good (no
    // successor), and the next starts with every pod there.
    let (made, together) = {
        // Launched by hand: with no pod yet, there is no gate for `stats` to read.
        let mut gate = Gate::spawn(shedctl, &["--pods", "--cri-socket", &socket], Log::Capture)?;
        let up = Instant::now();
        while !gate.log().contains("shed gate running") {
            if !gate.is_running() || up.elapsed() > Duration::from_secs(20) {
                bail!("the agent did not come up:\n{}", gate.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let names: Vec<String> = (0..pods).map(|i| format!("b10-{i}")).collect();
        let started = runtime.run_pods_together(&names, &ASKS)?;
        let deadline = Instant::now() + Duration::from_secs(60 + 3 * pods as u64);
        let mut waits = Vec::new();
        for (pod, ready) in &started {
            let at = wait_gated(&gate, &pod.netns, deadline, "not every pod started together was gated")?;
            waits.push(at.duration_since(*ready).unwrap_or_default());
        }
        waits.sort();
        let made: Vec<_> = started.into_iter().map(|(pod, _)| pod).collect();
        drop(gate);
        // Its links go one RCU grace period each under the rtnl lock: measured
        // meanwhile, the node's sockets would pay for the teardown.
        let gone = Instant::now();
        while !shed_testkit::gate::loaded_shed_programs().is_empty() {
            if gone.elapsed() > Duration::from_secs(30 + pods as u64) {
                bail!("the first agent's programs outlived it: {:?}", shed_testkit::gate::loaded_shed_programs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (made, Together { longest: waits.last().copied().unwrap_or_default(), median: waits[waits.len() / 2] })
    };
    let _stats = BpfStats::on()?;
    let ungated = socket_costs(scale, &|| Ok((0, 0)))?;
    let started = Instant::now();
    let gate = Gate::launch(shedctl, &["--pods", "--cri-socket", &socket], Log::Capture)?;
    let charged = Charged::join(gate.pid())?;
    let deadline = started + Duration::from_secs(60 + 3 * pods as u64);
    while made.iter().any(|p| gated_at(&gate.log(), &p.netns).is_none()) {
        if Instant::now() > deadline {
            bail!("not every pod gated in {:?}:\n{}", deadline - started, gate.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_gated = started.elapsed();
    let settled = held_by(gate.pid())?;
    // One more, with the others gated: from its sandbox ready to its gate set up.
    let one_more = runtime.run_pod("b10-late", &ASKS)?;
    let ready = SystemTime::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    let late = wait_gated(&gate, &one_more.netns, deadline, "the late pod was not gated in 30 s")?
        .duration_since(ready)
        .unwrap_or_default();
    // An idle stretch: what the agent costs while nothing changes, once the
    // late pod's set-up has settled.
    std::thread::sleep(SPARE_SETTLES);
    let before = held_by(gate.pid())?;
    let idle = Duration::from_secs(if pods > 2 { 10 } else { 2 });
    std::thread::sleep(idle);
    let after = held_by(gate.pid())?;
    // Again once every gate is past its first minute, when it looks at its
    // namespace's NAT every 30 s instead of every 5 (full runs only).
    let settled_idle = match scale.pick(Some(Duration::from_secs(20)), None, None) {
        Some(span) => {
            std::thread::sleep(Duration::from_mins(1));
            let from = held_by(gate.pid())?;
            std::thread::sleep(span);
            Some(100.0 * (held_by(gate.pid())?.cpu_s - from.cpu_s) / span.as_secs_f64())
        }
        None => None,
    };
    let pods_now: Vec<&shed_testkit::cri::Pod> = made.iter().chain([&one_more]).collect();
    let held = held_costs(&gate, &pods_now, scale)?;
    let (cgroup_now, cgroup_peak) = (charged.now(), charged.peak());
    let pid = gate.pid();
    let gated = socket_costs(scale, &|| held_by(pid).map(|h| h.runs))?;
    // A restart (a rolling update's, the container's start aside): the agent
    // leaves on SIGTERM, its pods judged by its programs until the next agent
    // takes each link over (`kernel::handover`), for at most the lease. The
    // new agent writes a pod's ports before it takes the link, so a pod taken
    // over is ungated for no time; what is measured for one is an upper
    // bound, from its first link taken over to its gate's "set up" line. A pod
    // not taken over is ungated from the old agent's exit (or the lease's
    // end) until its gate is set up.
    gate.leave_for_successor();
    drop(charged);
    let stopped = SystemTime::now();
    let lease_end = stopped + shed::kernel::handover::HANDOVER_LEASE;
    let gate = Gate::launch(shedctl, &["--pods", "--cri-socket", &socket], Log::Capture)?;
    let deadline = Instant::now() + Duration::from_secs(60 + 3 * pods as u64);
    let every = made.iter().chain([&one_more]);
    let (mut restart_gap, mut taken_over, mut restart_all) = (Duration::ZERO, 0, Duration::ZERO);
    for pod in every {
        let at = wait_gated(&gate, &pod.netns, deadline, "not every pod gated again after a restart")?;
        let from = match taken_over_at(&gate.log(), &pod.netns) {
            Some(taken) if taken <= lease_end => {
                taken_over += 1;
                taken
            }
            Some(_) => lease_end,
            None => stopped,
        };
        restart_gap = restart_gap.max(at.duration_since(from).unwrap_or_default());
        restart_all = restart_all.max(at.duration_since(stopped).unwrap_or_default());
    }
    drop(gate);
    let gates = (pods + 1) as f64;
    Ok(serde_json::json!({
        "pods": pods,
        "all_gated_s": all_gated.as_secs_f64(),
        "restart_ungated_s": restart_gap.as_secs_f64(),
        "restart_taken_over": taken_over,
        "restart_all_gated_s": restart_all.as_secs_f64(),
        "late_pod_gated_s": late.as_secs_f64(),
        "together_longest_gated_s": together.longest.as_secs_f64(),
        "together_median_gated_s": together.median.as_secs_f64(),
        "cpu_s_to_gate_all": settled.cpu_s,
        "idle_cpu_percent": 100.0 * (after.cpu_s - before.cpu_s) / idle.as_secs_f64(),
        "idle_cpu_percent_settled": settled_idle,
        "none_held_cpu_percent": held.none_held,
        "held_connections": held.connections,
        "held_cpu_percent": held.held,
        "light_load_cpu_percent": held.light_load,
        "light_load_per_s": held.light_rate,
        // The node's own socket events while idle (the agent's netlink and CRI calls among them).
        "idle_program_runs_per_s": after.runs.0.saturating_sub(before.runs.0) as f64 / idle.as_secs_f64(),
        "rss_bytes": after.rss_bytes,
        // What a container's memory limit counts: the process, its maps, and at the peak the verifier's work.
        "cgroup_bytes": cgroup_now,
        "cgroup_peak_bytes": cgroup_peak,
        "map_memlock_bytes": after.maps.1,
        "map_memlock_bytes_per_pod": after.maps.1 as f64 / gates,
        "programs": after.programs.0,
        "programs_per_pod": after.programs.0 as f64 / gates,
        "program_memlock_bytes": after.programs.1,
        "round_trip_us_before": ungated.trip_us,
        "round_trip_us_gated": gated.trip_us,
        "connect_us_before": ungated.connect_us,
        "connect_us_gated": gated.connect_us,
        "program_runs_per_round_trip": gated.trip_runs,
        "program_ns_per_round_trip": gated.trip_ns,
        "program_runs_per_connection": gated.connect_runs,
        "program_ns_per_connection": gated.connect_ns,
    }))
}

pub(crate) fn b10(shedctl: &Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let levels: &[usize] = scale.pick(&[1, 10, 110], &[1, 10], &[1, 2]);
    let mut rows = Vec::new();
    for (i, &pods) in levels.iter().enumerate() {
        println!("B10: {pods} pod(s)");
        rows.push(level(shedctl, pods, i, scale)?);
    }
    let mut md = String::from(
        "## B10: the node agent against pods gated\n\n`attach --pods` over a private containerd's annotated pod \
         sandboxes: with the agent running, every pod started at once and each one's time from its sandbox ready to \
         its gate set up (longest, median); then a new agent started with every pod there and the time to gate \
         them all from its start, one more pod's time from its sandbox ready to its gate set up, the daemon's CPU and memory, and the kernel memory of its maps and programs (one shared set of \
         programs judges and counts for every pod; a pod brings its maps), and a restart of the agent (SIGTERM, \
         then a new agent): the longest any pod went ungated (the old agent leaves its programs judging each pod \
         until the new one, its ports written, takes its link over; for a pod taken over, the time from that to \
         its gate's set-up line, an upper bound; for one not taken over, from the old agent's exit until its gate \
         is set up), the pods taken over, and the time until the new agent has set up every pod's gate. Then what the \
         pods' gates cost the node's other sockets (the socket tracepoints run the agent's dispatchers): a loopback round trip and a connection on an unprotected port, before the \
         agent and with every pod gated (medians of 5), and, from the kernel's BPF statistics, the runs of the \
         agent's programs and their time per round trip and per connection (a dispatcher's time includes the \
         accounting it runs).\n\n\
         | pods | started together, ready to gated, longest / median (s) | all gated from the agent's start (s) | one more gated (s) | ungated by a restart (s) | taken over | all set up again (s) | CPU to gate all (s) | idle CPU (%) | idle CPU, every gate past its first minute (%) | RSS (MiB) | cgroup memory, idle / peak (MiB) | maps (MiB) | maps per pod (MiB) | programs | per pod |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut costs = String::from(
        "\n| pods | round trip before (µs) | gated | connection before (µs) | gated | shed program runs per round trip | their ns | runs per connection | their ns | runs per s, idle |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut held = format!(
        "\n| pods | agent CPU, idle with none held (%) | connections held ({HELD_PER_POD} a pod, idle) | agent CPU holding them (%) | agent CPU, a request a second to each pod (%) | requests answered a second |\n|---|---|---|---|---|---|\n"
    );
    let mib = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
    for r in &rows {
        let pct = |key: &str| r[key].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            held,
            "| {} | {:.2} | {} | {:.2} | {:.2} | {:.0} |",
            r["pods"],
            pct("none_held_cpu_percent"),
            r["held_connections"],
            pct("held_cpu_percent"),
            pct("light_load_cpu_percent"),
            pct("light_load_per_s"),
        );
        let _ = writeln!(
            md,
            "| {} | {:.2} / {:.2} | {:.1} | {:.2} | {:.3} | {} of {} | {:.1} | {:.1} | {:.2} | {} | {:.0} | {:.0} / {:.0} | {:.0} | {:.1} | {} | {:.0} |",
            r["pods"],
            r["together_longest_gated_s"].as_f64().unwrap_or(0.0),
            r["together_median_gated_s"].as_f64().unwrap_or(0.0),
            r["all_gated_s"].as_f64().unwrap_or(0.0),
            r["late_pod_gated_s"].as_f64().unwrap_or(0.0),
            r["restart_ungated_s"].as_f64().unwrap_or(0.0),
            r["restart_taken_over"],
            r["pods"].as_u64().unwrap_or(0) + 1,
            r["restart_all_gated_s"].as_f64().unwrap_or(0.0),
            r["cpu_s_to_gate_all"].as_f64().unwrap_or(0.0),
            r["idle_cpu_percent"].as_f64().unwrap_or(0.0),
            r["idle_cpu_percent_settled"].as_f64().map_or("-".to_owned(), |v| format!("{v:.2}")),
            mib(&r["rss_bytes"]),
            mib(&r["cgroup_bytes"]),
            mib(&r["cgroup_peak_bytes"]),
            mib(&r["map_memlock_bytes"]),
            mib(&r["map_memlock_bytes_per_pod"]),
            r["programs"],
            r["programs_per_pod"].as_f64().unwrap_or(0.0),
        );
        let us = |key: &str| r[key].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            costs,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} | {:.0} | {:.0} |",
            r["pods"],
            us("round_trip_us_before"),
            us("round_trip_us_gated"),
            us("connect_us_before"),
            us("connect_us_gated"),
            us("program_runs_per_round_trip"),
            us("program_ns_per_round_trip"),
            us("program_runs_per_connection"),
            us("program_ns_per_connection"),
            us("idle_program_runs_per_s"),
        );
    }
    md.push_str(&costs);
    md.push_str(&held);
    Ok((serde_json::json!({ "levels": rows }), md))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_are_read_as_utc() {
        let t = log_time("2026-12-03T05:49:08.207168Z").unwrap();
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        // date -u -d 2026-12-03T05:49:08Z +%s
        assert_eq!(since.as_secs(), 1_796_276_948);
        assert_eq!(since.subsec_micros(), 207_168);
        assert_eq!(log_time("1970-01-01T00:00:01Z").unwrap(), SystemTime::UNIX_EPOCH + Duration::from_secs(1));
        assert!(log_time("yesterday").is_none());
    }
}
