// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon's one-per-host lock and its pins: who holds the gate, and
//! removing what a daemon leaves.
use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt as _},
    path::Path,
};

use crate::{
    error::Error,
    host::paths,
    kernel::maps::{self},
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
pub(crate) fn require_running() -> Result<String, Error> {
    match liveness() {
        Liveness::Running { pid } => Ok(pid),
        Liveness::Stale { pid } => Err(Error::StaleGate { pin_dir: paths::PIN_DIR.into(), pid }),
        Liveness::Absent => Err(Error::NoGate { pin_dir: paths::PIN_DIR.into() }),
    }
}

/// Serialises the control plane's read-modify-writes of the gate's port
/// configs and tiers: `set` reads a port's config, changes a field and writes
/// it back, and a `tier add` between the read and the write would otherwise
/// be undone (turning tier judging, and so the exempt tier, off). Held until
/// dropped.
pub(crate) struct ConfigLock {
    _file: File,
}

impl ConfigLock {
    /// Waits for and takes the lock.
    pub(crate) fn take() -> Result<Self, Error> {
        let path = Path::new(paths::CONFIG_LOCK);
        let dir = path.parent().expect("lock file has a parent");
        fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        // SAFETY: a valid fd; blocking until the holder (a short read-modify-write) is done.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::io("lock", path, std::io::Error::last_os_error()));
        }
        Ok(Self { _file: file })
    }
}

/// How often and how long `DaemonLock::acquire` tries again while the lock is held.
const LOCK_RETRIES: u32 = 20;
const LOCK_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The exclusive lock a running daemon holds for its whole life.
pub(crate) struct DaemonLock {
    file: File,
}

impl DaemonLock {
    /// Takes the lock, or says who holds it.
    pub(crate) fn acquire() -> Result<Self, Error> {
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
        // A reader (`liveness`: `stats`, `top`, a launcher polling for
        // readiness) holds the shared lock for an instant: a refusal is only a
        // holder that stays. A daemon holds it for its life.
        let mut taken = try_flock(&file, libc::LOCK_EX);
        for _ in 0..LOCK_RETRIES {
            if taken {
                break;
            }
            std::thread::sleep(LOCK_RETRY_EVERY);
            taken = try_flock(&file, libc::LOCK_EX);
        }
        if !taken {
            let pid = read_pid(&mut file);
            let ports = maps::GateMaps::open_gates(None).map_or_else(
                |_| "unknown".into(),
                |gates| {
                    let lists: Vec<String> = gates.iter().filter_map(|g| g.maps.port_list().ok()).collect();
                    lists.join(", ")
                },
            );
            return Err(Error::AlreadyRunning { pid, ports });
        }
        // Empty until `write_pid`: a pid in the file means the gate is fully attached.
        file.set_len(0).map_err(|e| Error::io("truncate", paths::PID_FILE, e))?;
        Ok(Self { file })
    }

    /// Records our pid for `shedctl detach` and for messages; call once every
    /// program is attached (readers take a pid as "ready").
    pub(crate) fn write_pid(&mut self) -> Result<(), Error> {
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
pub(crate) struct PinGuard;

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Err(e) = maps::remove_pins(Path::new(paths::PIN_DIR)) {
            tracing::error!("{}", crate::error::chain(&e));
        }
    }
}
