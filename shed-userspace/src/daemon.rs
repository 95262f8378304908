//! The daemon's life: one gate per host, guarded by a lock file; a control
//! loop that keeps the kernel's clock and expires stale reservations; and a
//! clean exit that leaves nothing attached or pinned.
use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Seek, Write},
    os::fd::AsRawFd,
    path::Path,
    time::{Duration, Instant},
};

use crate::{Error, gate::Loaded, maps, paths, system};

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
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(paths::PID_FILE)
            .map_err(|e| Error::io("open", paths::PID_FILE, e))?;
        if !try_flock(&file, libc::LOCK_EX) {
            let pid = read_pid(&mut file);
            let ports = maps::GateMaps::open_pinned().and_then(|m| m.port_list()).unwrap_or_else(|_| "unknown".into());
            return Err(Error::AlreadyRunning { pid, ports });
        }
        Ok(Self { file })
    }

    /// Records our pid for `shedctl detach` and for messages.
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

/// Settings of the control loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopSettings {
    /// How often the clock is written and reservations are checked.
    pub tick: Duration,
    /// How long an admitted handshake may hold its reservation.
    pub pending_timeout: Duration,
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
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching"); return Ok(()); }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching"); return Ok(()); }
            _ = ticker.tick() => {
                let now = system::monotonic_ms();
                loaded.maps.set_clock(now)?;
                expired_since_report += loaded.maps.expire_pending(now, timeout_ms)?;
                if loaded.maps.port_configs()?.is_empty() {
                    tracing::info!("every port was detached: stopping");
                    return Ok(());
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
