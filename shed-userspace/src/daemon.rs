//! The daemon's life: one gate per host, guarded by a lock file; a control
//! loop that keeps the kernel's clock and expires stale reservations; and a
//! clean exit that leaves nothing attached or pinned.
use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt as _},
    path::Path,
    time::{Duration, Instant},
};

use shed_common::{ControlConfig, ControlStatus, PortLatency, counter, latency, tier};

use crate::{
    Error,
    control::{Algo, Controller, Reason, Settings, TierReserve, WindowSample},
    gate::Loaded,
    maps::{self, GateMaps},
    metrics::Decisions,
    paths, stats, system,
};

/// Whether a daemon holds the gate right now.
#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    /// A daemon holds the lock.
    Running { pid: String },
    /// Nobody holds the lock, but pins exist: a daemon died without cleaning up.
    Stale { pid: String },
    /// No daemon, no pins.
    Absent,
}

fn read_pid(file: &mut File) -> String {
    let mut pid = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut pid);
    let pid = pid.trim();
    if pid.is_empty() { "unknown".into() } else { pid.into() }
}

fn try_flock(file: &File, mode: libc::c_int) -> bool {
    // SAFETY: valid fd.
    unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) == 0 }
}

/// Finds out whether a gate is running, without disturbing it.
pub fn liveness() -> Liveness {
    let pins = Path::new(paths::PIN_DIR).exists();
    let Ok(mut file) = File::open(paths::PID_FILE) else {
        return if pins { Liveness::Stale { pid: "unknown".into() } } else { Liveness::Absent };
    };
    let pid = read_pid(&mut file);
    if !try_flock(&file, libc::LOCK_SH) {
        return Liveness::Running { pid };
    }
    if pins { Liveness::Stale { pid } } else { Liveness::Absent }
}

/// A daemon holds the lock and has finished attaching (its pid is written).
pub fn ready() -> bool {
    matches!(liveness(), Liveness::Running { pid } if pid != "unknown")
}

/// Fails unless a daemon is running; used by every verb that reads or tunes the gate.
pub fn require_running() -> Result<String, Error> {
    match liveness() {
        Liveness::Running { pid } => Ok(pid),
        Liveness::Stale { pid } => Err(Error::StaleGate { pin_dir: paths::PIN_DIR.into(), pid }),
        Liveness::Absent => Err(Error::NoGate { pin_dir: paths::PIN_DIR.into() }),
    }
}

/// The exclusive lock a running daemon holds for its whole life.
pub struct DaemonLock {
    file: File,
}

impl DaemonLock {
    /// Takes the lock, or says who holds it.
    pub fn acquire() -> Result<Self, Error> {
        let dir = Path::new(paths::PID_FILE).parent().expect("pid file has a parent");
        fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::io("restrict", dir, e))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(paths::PID_FILE)
            .map_err(|e| Error::io("open", paths::PID_FILE, e))?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| Error::io("restrict", paths::PID_FILE, e))?;
        if !try_flock(&file, libc::LOCK_EX) {
            let pid = read_pid(&mut file);
            let ports = maps::GateMaps::open_pinned().and_then(|m| m.port_list()).unwrap_or_else(|_| "unknown".into());
            return Err(Error::AlreadyRunning { pid, ports });
        }
        // Empty until `write_pid`: a pid in the file means the gate is fully attached.
        file.set_len(0).map_err(|e| Error::io("truncate", paths::PID_FILE, e))?;
        Ok(Self { file })
    }

    /// Records our pid for `shedctl detach` and for messages; call once every
    /// program is attached (readers take a pid as "ready").
    pub fn write_pid(&mut self) -> Result<(), Error> {
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            writeln!(f, "{}", std::process::id())?;
            f.flush()
        };
        write(&mut self.file).map_err(|e| Error::io("write", paths::PID_FILE, e))
    }
}

impl Drop for DaemonLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        // The flock is released when the file closes.
    }
}

/// Removes the pin folder when dropped: pins exist only while a daemon owns them.
pub struct PinGuard;

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Err(e) = maps::remove_pins(Path::new(paths::PIN_DIR)) {
            tracing::error!("{e}");
        }
    }
}

/// How often the counts are reconciled with the kernel's socket table.
const HEAL_EVERY: Duration = Duration::from_secs(1);

/// How often clients that hold nothing are looked for (and forgotten on the second look).
const CLIENT_SWEEP: Duration = Duration::from_secs(5);

/// Settings of the control loop.
#[derive(Clone, Debug)]
pub struct LoopSettings {
    /// How often the clock is written and reservations are checked.
    pub tick: Duration,
    /// How long an admitted handshake may hold its reservation.
    pub pending_timeout: Duration,
    /// Where each window's decision is counted for the metrics endpoint.
    pub decisions: Decisions,
}

/// Runs until SIGINT/SIGTERM or until every port has been detached.
pub async fn run(loaded: &mut Loaded, settings: LoopSettings) -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| Error::io("install handler", "SIGINT", e))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| Error::io("install handler", "SIGTERM", e))?;
    let mut ticker = tokio::time::interval(settings.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout_ms = settings.pending_timeout.as_millis() as u64;
    let mut last_report = Instant::now();
    let mut expired_since_report = 0;
    let mut controls: Vec<PortControl> = Vec::new();
    let mut idle_clients = Vec::new();
    let mut last_client_sweep = Instant::now();
    let mut healer = crate::heal::Healer::default();
    let mut last_heal = Instant::now();
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching"); return Ok(()); }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching"); return Ok(()); }
            _ = ticker.tick() => {
                let now = system::monotonic_ms();
                loaded.maps.set_clock(now)?;
                expired_since_report += loaded.maps.expire_pending(now, timeout_ms)?;
                let ports = loaded.maps.port_configs()?;
                if ports.is_empty() {
                    tracing::info!("every port was detached: stopping");
                    return Ok(());
                }
                // Follow ports detached (or re-attached in another slot) since the last tick.
                controls.retain(|c| {
                    let kept = ports.get(&c.port).is_some_and(|p| p.slot == c.slot);
                    if !kept {
                        tracing::info!(port = c.port, "port detached");
                    }
                    kept
                });
                for (&port, config) in &ports {
                    if !controls.iter().any(|c| c.port == port) {
                        let snapshot = loaded.maps.snapshot(port, *config)?;
                        let hist = loaded.maps.latency(config.slot)?;
                        controls.push(PortControl::new(port, config.slot, snapshot.limit, &snapshot.control, hist));
                    }
                }
                if last_heal.elapsed() >= HEAL_EVERY {
                    healer.run(&mut loaded.maps)?;
                    last_heal = Instant::now();
                }
                if last_client_sweep.elapsed() >= CLIENT_SWEEP {
                    idle_clients = loaded.maps.forget_idle_clients(&idle_clients)?;
                    last_client_sweep = Instant::now();
                }
                let instant = Instant::now();
                for control in &mut controls {
                    control.run(&mut loaded.maps, instant, &settings.decisions)?;
                }
                if expired_since_report > 0 && last_report.elapsed() >= Duration::from_secs(10) {
                    tracing::info!(expired = expired_since_report, "handshakes that never completed released their slots");
                    expired_since_report = 0;
                    last_report = Instant::now();
                }
            }
        }
    }
}

/// One port's controller and what it remembers between windows.
struct PortControl {
    slot: u32,
    port: u16,
    controller: Controller,
    generation: u32,
    window: Duration,
    percentile: f64,
    next_run: Instant,
    last_hist: PortLatency,
    last_listen_drops: Option<u64>,
    last_reason: Option<Reason>,
    windows: u64,
    /// Quiet windows whose samples were carried into the current one.
    carried: u32,
    reserve: TierReserve,
    last_rejected_by_tier: [u64; tier::COUNT],
}

impl PortControl {
    fn new(port: u16, slot: u32, limit: u32, config: &ControlConfig, hist: PortLatency) -> Self {
        let mut controller = Controller::new(settings(config, limit), u64::from(port));
        controller.set_limit(limit);
        let window = Duration::from_millis(u64::from(config.window_ms.max(1)));
        Self {
            slot,
            port,
            controller,
            generation: config.generation,
            window,
            percentile: f64::from(config.percentile),
            next_run: Instant::now() + window,
            last_hist: hist,
            last_listen_drops: None,
            last_reason: None,
            windows: 0,
            carried: 0,
            reserve: TierReserve::default(),
            last_rejected_by_tier: [0; tier::COUNT],
        }
    }

    /// Runs one window if it is due.
    fn run(&mut self, maps: &mut GateMaps, now: Instant, decisions: &Decisions) -> Result<(), Error> {
        if now < self.next_run {
            return Ok(());
        }
        self.next_run = now + self.window;
        let snapshot = maps.snapshot(self.port, maps.config(self.port)?)?;
        if snapshot.control.generation != self.generation {
            self.generation = snapshot.control.generation;
            self.controller.reconfigure(settings(&snapshot.control, snapshot.limit));
            self.window = Duration::from_millis(u64::from(snapshot.control.window_ms.max(1)));
            self.percentile = f64::from(snapshot.control.percentile);
            if snapshot.control.requested_limit != 0 {
                self.controller.set_limit(snapshot.control.requested_limit);
            }
            tracing::info!(port = self.port, algo = %self.controller.settings().algo, limit = self.controller.limit(), "controller settings changed");
        }

        let hist = maps.latency(self.slot)?;
        let delta = |now: &[u64; latency::BUCKETS], before: &[u64; latency::BUCKETS]| -> [u64; latency::BUCKETS] {
            std::array::from_fn(|i| now[i].wrapping_sub(before[i]))
        };
        let queue = delta(&hist.queue_wait, &self.last_hist.queue_wait);
        let service = delta(&hist.service, &self.last_hist.service);
        let sojourn = delta(&hist.sojourn, &self.last_hist.sojourn);
        let drops_now = fs::read_to_string(paths::NETSTAT).ok().as_deref().and_then(stats::listen_drops);
        let listen_drops = match (drops_now, self.last_listen_drops) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            _ => 0,
        };
        self.last_listen_drops = drops_now;

        let sample = WindowSample {
            in_flight: snapshot.in_flight(),
            samples: sojourn.iter().sum(),
            latency_us: stats::histogram_percentile(&sojourn, self.percentile),
            listen_drops,
            windows: self.carried + 1,
        };
        let rejected_by_tier: [u64; tier::COUNT] =
            std::array::from_fn(|t| snapshot.counter(counter::REJECTED_BY_TIER + t));
        let rejected_now: [u64; tier::COUNT] =
            std::array::from_fn(|t| rejected_by_tier[t].saturating_sub(self.last_rejected_by_tier[t]));
        self.last_rejected_by_tier = rejected_by_tier;
        let held_back = self.reserve.on_window(rejected_now, snapshot.limit, snapshot.config.share_permille);
        if snapshot.config.tiered != 0 && held_back != snapshot.reserve.held_back {
            maps.write_reserve(self.slot, shed_common::TierReserve { held_back })?;
        }
        let previous = snapshot.limit;
        let decision = self.controller.on_window(&sample);
        // Too few samples: keep this window's requests for the next one.
        if decision.reason == Reason::TooFewSamples {
            self.carried += 1;
        } else {
            self.last_hist = hist;
            self.carried = 0;
        }
        if decision.limit != previous {
            maps.set_limit(self.slot, decision.limit)?;
        }
        if self.last_reason != Some(decision.reason) && decision.reason != Reason::TooFewSamples {
            tracing::info!(
                port = self.port,
                limit = decision.limit,
                previous,
                reason = ?decision.reason,
                observed_us = sample.latency_us,
                baseline_us = self.controller.baseline_us(),
                in_flight = sample.in_flight,
                "limit decision"
            );
        }
        // A window too thin to judge does not count as a change of reason: one line per change, not per window.
        if decision.reason != Reason::TooFewSamples {
            self.last_reason = Some(decision.reason);
        }
        decisions.record(self.port, decision.reason);
        self.windows += 1;
        maps.write_status(
            self.slot,
            ControlStatus {
                baseline_us: self.controller.baseline_us(),
                observed_us: sample.latency_us,
                queue_wait_p50_us: stats::histogram_percentile(&queue, 50.0),
                queue_wait_p99_us: stats::histogram_percentile(&queue, 99.0),
                service_p50_us: stats::histogram_percentile(&service, 50.0),
                service_p99_us: stats::histogram_percentile(&service, 99.0),
                sojourn_p50_us: stats::histogram_percentile(&sojourn, 50.0),
                sojourn_p99_us: stats::histogram_percentile(&sojourn, 99.0),
                samples: sample.samples,
                listen_drops,
                windows: self.windows,
                reason: decision.reason.to_raw(),
                previous_limit: previous,
            },
        )
    }
}

fn settings(config: &ControlConfig, limit: u32) -> Settings {
    let algo = Algo::from_raw(config.algo);
    // The adaptive bounds do not apply to an operator's fixed limit.
    let (min_limit, max_limit) = if algo == Algo::Fixed {
        (1, shed_common::MAX_LIMIT)
    } else {
        (config.min_limit.max(1), config.max_limit.max(config.min_limit.max(1)))
    };
    let defaults = Settings::default();
    // Zero means "not set" (a map written before these fields existed): keep the default.
    let or = |v: u32, d: u32| if v == 0 { d } else { v };
    Settings {
        algo,
        initial_limit: limit,
        min_limit,
        max_limit,
        min_samples: u64::from(or(config.min_samples, defaults.min_samples as u32)),
        cooldown_windows: config.cooldown_windows,
        baseline_windows: or(config.baseline_windows, defaults.baseline_windows as u32) as usize,
        probe_windows: config.probe_windows,
        ..defaults
    }
}
