//! The daemon's life: one gate per host, guarded by a lock file; a control
//! loop that runs the controllers, sizes each port's handshake window, keeps
//! the namespace's addresses and interfaces covered; and a clean exit that
//! leaves nothing attached or pinned.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self, File, OpenOptions},
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt as _},
    path::Path,
    time::{Duration, Instant},
};

use shed_common::{ControlConfig, ControlStatus, PortLatency, counter, handshake, latency, tier};

use crate::{
    Error,
    control::{Algo, Controller, Reason, Settings, TierReserve, WindowSample},
    gate::{Loaded, default_hook},
    input::{Hook, XdpAttachMode},
    maps::{self, GateMaps},
    metrics::Decisions,
    paths,
    sockdiag::{AcceptQueue, SocketTable},
    stats, system,
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

/// How often live changes are looked for, to log each (see [`crate::audit`]).
const AUDIT_EVERY: Duration = Duration::from_secs(1);

/// How often the healer checks the counters (a full pass runs only when due, see [`crate::heal`]).
const HEAL_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often clients that hold nothing are looked for (and forgotten on the second look).
const CLIENT_SWEEP: Duration = Duration::from_secs(5);

/// How often the namespace's addresses and interfaces are looked at again.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long handshake-completing ACKs stay checked after the last lapsed
/// admission: longer than the kernel keeps a half-open handshake (SYN-ACK
/// retries, about 63 s) and than a SYN cookie stays valid (about 2 minutes).
const ACK_CHECK_HOLD: Duration = Duration::from_secs(180);

/// Settings of the control loop.
pub struct LoopSettings {
    /// How often the loop runs (the shortest control window).
    pub tick: Duration,
    /// A fixed handshake window, or zero to follow the measured handshake time.
    pub handshake_window: Duration,
    /// Where each window's decision is counted for the metrics endpoint.
    pub decisions: Decisions,
    /// With no `--iface`: interfaces that appear later are gated too.
    pub follow_interfaces: Option<FollowInterfaces>,
    /// The addresses written at attach, kept up to date by the loop.
    pub local_addrs: LocalAddrs,
    /// Most time between routine healing passes.
    pub heal_interval: Duration,
    /// What the healer did, for the metrics endpoint.
    pub heal_report: crate::heal::HealReport,
    /// Beaten every tick, for `/healthz`.
    pub heartbeat: crate::endpoint::Heartbeat,
    /// SIGHUP: re-reads the config and applies it (None: attach had no --config).
    pub reload: Option<Reloader>,
    /// Becomes true when the loop must stop (another namespace's loop failed).
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Applies a reloaded config; returns the changed settings that take a restart.
pub type Reloader = Box<dyn FnMut(&mut GateMaps) -> Result<Vec<&'static str>, String> + Send>;

/// Gates interfaces as they appear (no `--iface`: the whole namespace).
#[derive(Clone, Debug)]
pub struct FollowInterfaces {
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    /// Interfaces already gated or already reported as impossible to gate.
    pub seen: Vec<String>,
}

impl FollowInterfaces {
    /// Attaches to every interface not seen before; a failure is logged, not fatal.
    pub fn attach_new(&mut self, loaded: &mut Loaded) {
        for iface in system::interfaces() {
            if self.seen.contains(&iface) {
                continue;
            }
            self.seen.push(iface.clone());
            let hook = self.hook.unwrap_or_else(|| default_hook(&iface));
            match loaded.attach_gate(&iface, hook, self.xdp_mode) {
                Ok(()) => tracing::info!(iface = %iface, hook = %hook, "new interface gated"),
                Err(e) => tracing::warn!(iface = %iface, "new interface not gated: {e}"),
            }
        }
    }
}

/// The namespace's addresses as last written to the gate (only SYNs to them are judged).
#[derive(Clone, Debug, Default)]
pub struct LocalAddrs {
    written: Option<std::collections::BTreeMap<[u8; 16], u32>>,
}

impl LocalAddrs {
    /// Asks the kernel for the addresses and rewrites the gate's table only when
    /// they changed (the table has thousands of slots to compare).
    pub fn refresh(&mut self, maps: &mut GateMaps) -> Result<(), Error> {
        let addrs = system::local_addresses()?;
        if self.written.as_ref() == Some(&addrs) {
            return Ok(());
        }
        if maps.set_local_addrs(&addrs)? {
            tracing::debug!(addresses = addrs.len(), "local addresses updated");
        }
        self.written = Some(addrs);
        Ok(())
    }
}

/// Runs until SIGINT/SIGTERM or until every port has been detached.
pub async fn run(loaded: &mut Loaded, settings: LoopSettings) -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| Error::io("install handler", "SIGINT", e))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| Error::io("install handler", "SIGTERM", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| Error::io("install handler", "SIGHUP", e))?;
    let mut ticker = tokio::time::interval(settings.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut settings = settings;
    let mut last_watch = Instant::now();
    let mut controls: Vec<PortControl> = Vec::new();
    let mut idle_clients = Vec::new();
    let mut last_client_sweep = Instant::now();
    let mut healer = crate::heal::Healer::new(settings.heal_interval, settings.heal_report.clone());
    let mut accept_queues = AcceptQueues::default();
    let mut last_heal_check: Option<Instant> = None;
    // What the operator last set, to log each live change once (see `crate::audit`).
    let mut audited = crate::audit::read(&loaded.maps).unwrap_or_default();
    let mut last_audit = Instant::now();
    let _ = std::fs::remove_file(paths::REQUEST_NOTE);
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching"); return Ok(()); }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching"); return Ok(()); }
            _ = settings.stop.changed() => { tracing::info!("the gate is stopping: detaching"); return Ok(()); }
            _ = sighup.recv() => match settings.reload.as_mut() {
                None => tracing::warn!("SIGHUP: attach was started without --config: nothing to reload"),
                Some(reload) => match reload(&mut loaded.maps) {
                    Ok(restart) if restart.is_empty() => tracing::info!("SIGHUP: config reloaded and applied"),
                    Ok(restart) => tracing::warn!(
                        changed = %restart.join(", "),
                        "SIGHUP: config reloaded and applied, except settings that take a restart (systemctl restart shed)"
                    ),
                    Err(e) => tracing::error!("SIGHUP: reload refused, nothing changed: {e}"),
                },
            },
            _ = ticker.tick() => {
                settings.heartbeat.beat();
                if last_watch.elapsed() >= WATCH_EVERY {
                    settings.local_addrs.refresh(&mut loaded.maps)?;
                    if let Some(follow) = &mut settings.follow_interfaces {
                        follow.attach_new(loaded);
                    }
                    last_watch = Instant::now();
                }
                // Once a second: reading the tier table every tick would cost with many tiers.
                if last_audit.elapsed() >= AUDIT_EVERY {
                    if let Ok(now) = crate::audit::read(&loaded.maps) {
                        crate::audit::log_changes(&audited, &now);
                        audited = now;
                    }
                    last_audit = Instant::now();
                }
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
                        let handshakes = HandshakeWindow::new(settings.handshake_window);
                        controls.push(PortControl::new(port, config.slot, snapshot.limit, &snapshot.control, hist, handshakes));
                    }
                }
                if last_heal_check.is_none_or(|t| t.elapsed() >= HEAL_CHECK_EVERY) {
                    // A failed pass leaves the counts as they are: the gate keeps running.
                    if let Err(e) = healer.check(&mut loaded.maps, Instant::now()) {
                        tracing::warn!("healing pass failed: {e}");
                    }
                    last_heal_check = Some(Instant::now());
                }
                if last_client_sweep.elapsed() >= CLIENT_SWEEP {
                    idle_clients = loaded.maps.forget_idle_clients(&idle_clients)?;
                    last_client_sweep = Instant::now();
                }
                let instant = Instant::now();
                let port_set: BTreeSet<u16> = ports.keys().copied().collect();
                for control in &mut controls {
                    control.run(&mut loaded.maps, instant, &settings.decisions, &mut accept_queues, &port_set)?;
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
    /// When the histograms were last taken as a judged window's start.
    last_judged: Instant,
    last_listen_drops: Option<u64>,
    /// Whether the port's accept queue was at least half full at the last window's end.
    pressed_before: bool,
    listen_drops_total: u64,
    last_reason: Option<Reason>,
    windows: u64,
    /// Quiet windows whose samples were carried into the current one.
    carried: u32,
    reserve: TierReserve,
    last_rejected_by_tier: [u64; tier::COUNT],
    /// SYNs the limit turned away (or would have, in dry-run) up to the last judged window.
    last_limit_rejected: u64,
    handshakes: HandshakeWindow,
}

impl PortControl {
    fn new(
        port: u16,
        slot: u32,
        limit: u32,
        config: &ControlConfig,
        hist: PortLatency,
        handshakes: HandshakeWindow,
    ) -> Self {
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
            last_judged: Instant::now(),
            last_listen_drops: None,
            pressed_before: false,
            listen_drops_total: 0,
            last_reason: None,
            windows: 0,
            carried: 0,
            reserve: TierReserve::default(),
            last_rejected_by_tier: [0; tier::COUNT],
            last_limit_rejected: 0,
            handshakes,
        }
    }

    /// Runs one window if it is due.
    fn run(
        &mut self,
        maps: &mut GateMaps,
        now: Instant,
        decisions: &Decisions,
        accept_queues: &mut AcceptQueues,
        ports: &BTreeSet<u16>,
    ) -> Result<(), Error> {
        if now < self.next_run {
            return Ok(());
        }
        // From the due time, not from now: the ticker fires every window too, and
        // `now + window` would fall a hair after the next tick and skip it (the
        // window would be twice as long as configured). Far behind (a stall): no
        // burst of catch-up windows.
        self.next_run += self.window;
        if self.next_run <= now {
            self.next_run = now + self.window;
        }
        let config = match maps.config(self.port) {
            Ok(config) => config,
            // Detached since this tick read the ports (`shedctl detach --port` runs
            // concurrently): the next tick drops this controller. Not an error.
            Err(Error::PortNotProtected { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let snapshot = maps.snapshot(self.port, config)?;
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
        let namespace_drops = match (drops_now, self.last_listen_drops) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            _ => 0,
        };
        self.last_listen_drops = drops_now;
        // The drop counter is the namespace's: count its drops against this port only
        // while its own accept queue is (or just was) at least half full. Without
        // sock_diag, every drop counts, as before.
        let accept = accept_queues.of(self.port, ports, now);
        let pressed = accept.is_none_or(|q| q.pressed());
        let listen_drops = if pressed || self.pressed_before { namespace_drops } else { 0 };
        self.pressed_before = pressed;
        self.listen_drops_total += listen_drops;
        let accept = accept.unwrap_or_default();

        // The queue limiter judges queue waits (a multiplexed port records nothing else);
        // the others judge whole requests.
        let judged = if self.controller.settings().algo == Algo::Queue { &queue } else { &sojourn };
        // Counted since the last judged window, as the histograms are (a thin window carries both).
        let limit_rejected =
            snapshot.counter(counter::REJECTED_LIMIT) + snapshot.counter(counter::DRY_RUN_WOULD_REJECT);
        let sample = WindowSample {
            in_flight: snapshot.in_flight(),
            samples: judged.iter().sum(),
            latency_us: stats::histogram_percentile(&sojourn, self.percentile),
            queue_wait_us: stats::histogram_percentile(&queue, self.percentile),
            service_us: stats::histogram_percentile(&service, 50.0),
            listen_drops,
            rejected: limit_rejected.saturating_sub(self.last_limit_rejected),
            elapsed_us: now.saturating_duration_since(self.last_judged).as_micros() as u64,
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
        let handshake_times = self.handshakes.on_window(maps, &snapshot, &hist.handshake, now)?;
        let previous = snapshot.limit;
        let decision = self.controller.on_window(&sample);
        // Too few samples: keep this window's requests for the next one.
        if decision.reason == Reason::TooFewSamples {
            self.carried += 1;
        } else {
            self.last_hist = hist;
            self.last_judged = now;
            self.last_limit_rejected = limit_rejected;
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
                reason = %crate::stats::json_name(&decision.reason),
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
                handshake_p50_us: handshake_times.0,
                handshake_p99_us: handshake_times.1,
                accept_queue: accept.waiting,
                accept_backlog: accept.backlog,
                listen_drops_total: self.listen_drops_total,
            },
        )
    }
}

/// The protected ports' accept queues, read through sock_diag at most once per
/// tick for all ports together (one dump of the namespace's listeners serves
/// every port whose window is due).
#[derive(Default)]
struct AcceptQueues {
    /// Opened at the first read; `Err` after opening failed (then every listen drop counts).
    table: Option<Result<SocketTable, ()>>,
    /// The tick of the last read and what it found (`None`: the read failed).
    read: Option<(Instant, Option<BTreeMap<u16, AcceptQueue>>)>,
}

impl AcceptQueues {
    /// `port`'s accept queue at tick `now`, or `None` when sock_diag cannot be asked.
    fn of(&mut self, port: u16, ports: &BTreeSet<u16>, now: Instant) -> Option<AcceptQueue> {
        if self.read.as_ref().is_none_or(|(at, _)| *at != now) {
            let table = self.table.get_or_insert_with(|| {
                SocketTable::open().map_err(|e| {
                    tracing::warn!("no accept-queue signal (sock_diag: {e}): every listen drop in the namespace counts")
                })
            });
            let queues = table
                .as_mut()
                .ok()
                .and_then(|t| t.accept_queues(ports).map_err(|e| tracing::debug!("accept queues: {e}")).ok());
            self.read = Some((now, queues));
        }
        let (_, queues) = self.read.as_ref()?;
        Some(queues.as_ref()?.get(&port).copied().unwrap_or_default())
    }
}

/// Sizes a port's handshake window (how long an admitted SYN holds its slot)
/// from the measured handshake time, and keeps the ACK check on while
/// admissions lapse.
///
/// The window is four times the p99 handshake time over the last period
/// (at least ~1 ms): long enough that real handshakes complete inside it, short
/// enough that a forged SYN, which never completes, holds its slot only that
/// long. It grows at once and shrinks only after a run of periods that all
/// want it shorter, so a burst of slow handshakes is not forgotten at once.
struct HandshakeWindow {
    /// A fixed window (`--handshake-window`), or `None` to measure.
    fixed: Option<Duration>,
    /// Handshake histogram at the start of the current measuring period.
    period_start: Option<(Instant, [u64; latency::BUCKETS])>,
    /// Consecutive periods that wanted a shorter window.
    shorter: u32,
    shift: Option<u32>,
    last_lapsed: u64,
    last_late: u64,
    last_lapse: Option<Instant>,
    /// p50/p99 of the last full period, microseconds.
    times: (u64, u64),
    /// Whether a period with enough handshakes has set the window yet.
    measured: bool,
}

/// One measuring period of handshake times.
const HANDSHAKE_PERIOD: Duration = Duration::from_secs(1);
/// Periods in a row that must want a shorter window before it shrinks.
const SHRINK_AFTER: u32 = 5;
/// Handshakes a period needs before it may shrink the window.
const SHRINK_SAMPLES: u64 = 20;

impl HandshakeWindow {
    fn new(fixed: Duration) -> Self {
        Self {
            fixed: (!fixed.is_zero()).then_some(fixed),
            period_start: None,
            shorter: 0,
            shift: None,
            last_lapsed: 0,
            last_late: 0,
            last_lapse: None,
            times: (0, 0),
            measured: false,
        }
    }

    /// Returns the handshake p50/p99 (us) of the last full period.
    fn on_window(
        &mut self,
        maps: &mut GateMaps,
        snapshot: &maps::PortSnapshot,
        hist: &[u64; latency::BUCKETS],
        now: Instant,
    ) -> Result<(u64, u64), Error> {
        self.watch_lapses(maps, snapshot, now)?;
        let (start, before) = *self.period_start.get_or_insert((now, *hist));
        if now.duration_since(start) < HANDSHAKE_PERIOD {
            return Ok(self.times);
        }
        let period: [u64; latency::BUCKETS] = std::array::from_fn(|i| hist[i].wrapping_sub(before[i]));
        self.period_start = Some((now, *hist));
        let samples: u64 = period.iter().sum();
        if samples > 0 {
            self.times = (stats::histogram_percentile(&period, 50.0), stats::histogram_percentile(&period, 99.0));
        }
        let current = snapshot.user.shift();
        let wanted = match self.fixed {
            Some(window) => handshake::shift_for_window(window.as_nanos() as u64),
            None if samples == 0 => current,
            None => handshake::shift_for_window(4 * 1000 * self.times.1),
        };
        let shift = if wanted >= current || self.fixed.is_some() {
            self.shorter = 0;
            self.measured |= samples >= SHRINK_SAMPLES;
            wanted
        } else if samples >= SHRINK_SAMPLES && !self.measured {
            // The first measurement replaces the default at once.
            self.measured = true;
            wanted
        } else if samples >= SHRINK_SAMPLES {
            self.shorter += 1;
            if self.shorter >= SHRINK_AFTER {
                self.shorter = 0;
                wanted
            } else {
                current
            }
        } else {
            current
        };
        if self.shift != Some(shift) || shift != current {
            maps.set_handshake_shift(snapshot.config.slot, shift)?;
            if self.shift.is_some() && shift != current {
                tracing::info!(
                    port = snapshot.port,
                    window_us = (handshake::LIVE_EPOCHS << shift) / 1000,
                    handshake_p99_us = self.times.1,
                    "handshake window changed"
                );
            }
            self.shift = Some(shift);
        }
        Ok(self.times)
    }

    /// Turns the ACK check on when admissions lapse (the kernel does too, on the
    /// next SYN; this covers a port that gets none) and off once none has for
    /// [`ACK_CHECK_HOLD`].
    fn watch_lapses(&mut self, maps: &mut GateMaps, snapshot: &maps::PortSnapshot, now: Instant) -> Result<(), Error> {
        let lapsed = snapshot.handshakes_lapsed();
        let late = snapshot.counter(counter::LATE_COMPLETED);
        if lapsed != self.last_lapsed || late != self.last_late {
            self.last_lapsed = lapsed;
            self.last_late = late;
            self.last_lapse = Some(now);
            if !snapshot.ack_check {
                maps.set_ack_check(snapshot.port, true)?;
            }
        } else if snapshot.ack_check && self.last_lapse.is_none_or(|t| now.duration_since(t) >= ACK_CHECK_HOLD) {
            if self.last_lapse.is_none() {
                // Set before we started watching: hold it from now.
                self.last_lapse = Some(now);
            } else {
                maps.set_ack_check(snapshot.port, false)?;
                tracing::info!(port = snapshot.port, "no handshake lapsed for {ACK_CHECK_HOLD:?}: ACK check off");
            }
        }
        Ok(())
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
        window_s: f64::from(config.window_ms.max(1)) / 1000.0,
        objective_us: f64::from(config.target_latency_ms) * 1000.0,
        queue_target_us: if config.queue_target_us == 0 {
            defaults.queue_target_us
        } else {
            f64::from(config.queue_target_us)
        },
        ..defaults
    }
}
