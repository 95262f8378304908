// SPDX-License-Identifier: MIT OR Apache-2.0
//! Running the real `shedctl` against a testbed, and cleaning up after it.
use std::{
    fs::File,
    io::{self, Read as _},
    path::Path,
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, MutexGuard},
    thread,
    time::{Duration, Instant},
};

use shed::{daemon, host::paths, kernel::maps};

use crate::testbed::Testbed;

/// The `shedctl` under test: `$SHEDCTL` if set, else the one cargo built
/// beside the running test binary (`target/<profile>/shedctl`; `cargo xtask
/// test` builds it before the tests).
pub fn shedctl_path() -> String {
    if let Ok(path) = std::env::var("SHEDCTL") {
        return path;
    }
    let exe = std::env::current_exe().expect("the running binary's path");
    // A test binary is target/<profile>/deps/<test>-<hash>; the bench binary is
    // target/<profile>/shed-bench. shedctl is target/<profile>/shedctl.
    let beside = exe.parent().expect("the binary's folder");
    let shedctl = [beside, beside.parent().unwrap_or(beside)]
        .map(|dir| dir.join("shedctl"))
        .into_iter()
        .find(|path| path.exists());
    let shedctl = shedctl
        .unwrap_or_else(|| panic!("no shedctl beside {}: build it first (cargo build --bin shedctl)", exe.display()));
    shedctl.display().to_string()
}

/// The host has one gate: end-to-end tests take turns.
static ONE_GATE: Mutex<()> = Mutex::new(());

pub fn exclusive() -> MutexGuard<'static, ()> {
    let guard = ONE_GATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // A gate left by an earlier, crashed run would make every attach fail.
    if let daemon::Liveness::Stale { .. } = daemon::liveness() {
        let _ = maps::remove_pins(Path::new(paths::PIN_DIR));
    }
    guard
}

/// Where a launched gate's log (its stderr) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Log {
    /// Into a file that [`Gate::log`] reads (and failures quote).
    Capture,
    /// To this process's stderr, for a person watching (the demo).
    Inherit,
    /// Nowhere (a benchmark's long runs).
    Discard,
}

/// A running `shedctl attach`. Dropping it stops it (SIGTERM, then SIGKILL)
/// and removes anything it left (never the pins of another, live gate),
/// including what a node agent leaves judging for its successor, unless
/// stopped with [`Gate::leave_for_successor`].
pub struct Gate {
    child: Child,
    log: Option<tempfile::NamedTempFile>,
    /// Whether what it leaves for the next agent stays (a restart's test).
    successor_follows: bool,
}

impl Gate {
    /// `shedctl attach --netns <server ns> --iface <server veth> <args>`; waits until it serves stats.
    pub fn start(bed: &Testbed, args: &[&str]) -> Self {
        Self::start_on(bed, &bed.server_if, args)
    }

    /// The same, gating `iface` of the server namespace.
    pub fn start_on(bed: &Testbed, iface: &str, args: &[&str]) -> Self {
        let mut all = vec!["--netns", &bed.server_ns, "--iface", iface];
        all.extend_from_slice(args);
        Self::attach(&all)
    }

    /// `shedctl attach <args>` (namespaces and interfaces included); waits until it
    /// serves stats. Panics, with the gate's log, if it does not come up.
    pub fn attach(args: &[&str]) -> Self {
        Self::launch(Path::new(&shedctl_path()), args, Log::Capture).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `<shedctl> attach <args>`, started and not waited for (a test of what
    /// readers see while it comes up); stopped on drop like any gate.
    pub fn spawn(shedctl: &Path, args: &[&str], log: Log) -> io::Result<Self> {
        Self::spawn_env(shedctl, args, log, &[])
    }

    /// The same, with `env` added to its environment (systemd's `NOTIFY_SOCKET`, ...).
    pub fn spawn_env(shedctl: &Path, args: &[&str], log: Log, env: &[(&str, &str)]) -> io::Result<Self> {
        let file = match log {
            Log::Capture => Some(tempfile::NamedTempFile::new()?),
            Log::Inherit | Log::Discard => None,
        };
        let stderr = match (&file, log) {
            (Some(file), _) => Stdio::from(file.reopen()?),
            (None, Log::Inherit) => Stdio::inherit(),
            (None, _) => Stdio::null(),
        };
        let child = Command::new(shedctl)
            .arg("attach")
            .args(args)
            .env("SHED_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| io::Error::other(format!("spawn {}: {e}", shedctl.display())))?;
        Ok(Self { child, log: file, successor_follows: false })
    }

    /// `<shedctl> attach <args>`, waiting up to 20 s until it is ready and serves
    /// stats. The error says why not (with the log, when captured); nothing is
    /// left running or pinned after an error.
    pub fn launch(shedctl: &Path, args: &[&str], log: Log) -> io::Result<Self> {
        let mut gate = Self::spawn(shedctl, args, log)?;
        let start = Instant::now();
        loop {
            if let Some(status) = gate.child.try_wait()? {
                return Err(io::Error::other(format!("shedctl attach {args:?} exited with {status}:\n{}", gate.log())));
            }
            let serves_stats = || {
                Command::new(shedctl)
                    .args(["stats", "--json", "--interval", "50"])
                    .output()
                    .is_ok_and(|out| out.status.success())
            };
            // Ready: the lock's holder is our child (not another gate on the host,
            // which our child is about to refuse), and it answers.
            let ours = matches!(daemon::liveness(), daemon::Liveness::Running { pid } if pid == gate.pid().to_string());
            if ours && serves_stats() {
                return Ok(gate);
            }
            if start.elapsed() > Duration::from_secs(20) {
                // Dropping the gate stops it and removes its pins.
                return Err(io::Error::other(format!("gate did not come up in 20 s:\n{}", gate.log())));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the gate logged so far (empty unless launched with [`Log::Capture`]).
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Some(file) = &self.log {
            let _ = File::open(file.path()).and_then(|mut f| f.read_to_string(&mut s));
        }
        s
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The CPU time the daemon's threads have had so far, to the nanosecond
    /// (each thread's schedstat; `/proc/PID/stat` counts 10 ms ticks, too
    /// coarse for an idle agent's few tenths of a percent). A thread that ends
    /// takes its time with it: spans measured this way can only read low by
    /// such a thread's share.
    pub fn cpu(&self) -> Duration {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else { return Duration::ZERO };
        let ns: u64 = tasks
            .filter_map(Result::ok)
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        Duration::from_nanos(ns)
    }

    /// Percent of one core the daemon used over `span`, from now.
    pub fn cpu_percent_over(&self, span: Duration) -> f64 {
        let before = self.cpu();
        std::thread::sleep(span);
        100.0 * self.cpu().saturating_sub(before).as_secs_f64() / span.as_secs_f64()
    }

    /// Whether the daemon is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as the kubelet restarts a node agent: the pods it leaves
    /// judged for the next agent stay so (see `kernel::handover`).
    pub fn leave_for_successor(mut self) {
        self.stop();
        self.successor_follows = true;
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                return self.child.wait().expect("wait");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
        // A test's agent would leave its pods judged, for a successor that
        // never comes, until the lease is up.
        if !self.successor_follows {
            let _ = std::fs::remove_dir_all(paths::HANDOVER_PIN_DIR);
        }
        // Only pins no live daemon holds: whatever ours left, never another gate's.
        if let daemon::Liveness::Stale { .. } = daemon::liveness() {
            let _ = maps::remove_pins(Path::new(paths::PIN_DIR));
        }
        // A global dry-run a test turned on must not reach the next test's gates.
        if !matches!(daemon::liveness(), daemon::Liveness::Running { .. }) {
            let _ = std::fs::remove_file(paths::DRY_RUN_ALL);
        }
    }
}

pub fn shedctl(args: &[&str]) -> Output {
    Command::new(shedctl_path()).args(args).output().expect("run shedctl")
}

/// `shedctl stats --json --port <port>`, parsed.
pub fn stats(port: u16) -> serde_json::Value {
    let out = shedctl(&["stats", "--json", "--interval", "50", "--port", &port.to_string()]);
    assert!(out.status.success(), "shedctl stats failed: {}", String::from_utf8_lossy(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats --json is JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "one object for one port: {list}");
    list[0].clone()
}

pub fn field(stats: &serde_json::Value, name: &str) -> u64 {
    stats[name].as_u64().unwrap_or_else(|| panic!("field {name} is not an integer in {stats}"))
}

/// Polls `stats` until `cond` holds, for at most `timeout`.
pub fn wait_for_stats(
    port: u16,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    poll(timeout, what, || stats(port), cond)
}

/// Reads with `read` every 50 ms until `done` holds of what it read, for at
/// most `timeout` (then fails, showing the last reading); returns that reading.
pub fn poll<T: std::fmt::Debug>(timeout: Duration, what: &str, read: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    let start = Instant::now();
    loop {
        let value = read();
        if done(&value) {
            return value;
        }
        assert!(start.elapsed() < timeout, "waited {timeout:?} for {what}; last reading: {value:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The shed programs still loaded after waiting up to 2 s for them all to go:
/// the kernel frees a detached raw tracepoint program after an RCU grace
/// period, not when its link closes (the hook itself is gone at once).
pub fn shed_programs_left(allowed: &[&str]) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left: Vec<String> = loaded_shed_programs().into_iter().filter(|n| !allowed.contains(&n.as_str())).collect();
        if left.is_empty() || start.elapsed() > Duration::from_secs(2) {
            return left;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Names of the shed programs loaded in the kernel right now.
pub fn loaded_shed_programs() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_owned))
        .filter(|n| n.starts_with("shed_"))
        .collect()
}

/// The daemon's log line that says `netns`'s gate is set up (its programs
/// attached and judging), if the log has it; whichever module logs it.
pub fn gated_line<'a>(log: &'a str, netns: &str) -> Option<&'a str> {
    gate_line(log, netns, ": gate set up: judging every new connection")
}

/// The first line `netns`'s gate logged that says `says`, if the log has it.
pub fn gate_line<'a>(log: &'a str, netns: &str, says: &str) -> Option<&'a str> {
    let span = format!("gate{{netns={netns}}}:");
    log.lines().find(|l| l.contains(&span) && l.contains(says))
}
