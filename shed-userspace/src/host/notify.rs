// SPDX-License-Identifier: MIT OR Apache-2.0
//! systemd's service notifications (`Type=notify`, sd_notify(3)) without
//! libsystemd: datagrams to `$NOTIFY_SOCKET`. `READY=1` once every port is
//! judged, `STOPPING=1` on the way out, and `WATCHDOG=1` every half
//! `$WATCHDOG_USEC` while the gates' control loops are alive, so systemd
//! restarts a daemon whose loops have stalled. Outside systemd (no
//! `$NOTIFY_SOCKET`) every call does nothing.
use std::{os::unix::net::UnixDatagram, path::PathBuf, time::Duration};

/// Where notifications go: a socket path, or an abstract name (`@name`).
#[derive(Debug)]
pub(crate) struct Notifier {
    socket: UnixDatagram,
    target: Target,
    watchdog: Option<Duration>,
}

#[derive(Debug)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From the environment systemd gives a `Type=notify` service; None outside one.
    pub(crate) fn from_env() -> Option<Self> {
        let socket = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(socket.as_os_str()).to_vec();
        let target = match bytes.strip_prefix(b"@") {
            Some(name) => Target::Abstract(name.to_vec()),
            None => Target::Path(PathBuf::from(socket)),
        };
        // The watchdog is this process's only if systemd named it (WATCHDOG_PID), or named no one.
        let ours = std::env::var("WATCHDOG_PID").map_or(true, |pid| pid == std::process::id().to_string());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|us| us.parse::<u64>().ok())
            .filter(|&us| ours && us > 0)
            .map(|us| Duration::from_micros(us / 2));
        let socket = UnixDatagram::unbound().ok()?;
        Some(Self { socket, target, watchdog })
    }

    /// Sends `state` (`READY=1`, newline-separated assignments); a failure is logged, never fatal.
    pub(crate) fn send(&self, state: &str) {
        let sent = match &self.target {
            Target::Path(path) => self.socket.send_to(state.as_bytes(), path),
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|addr| self.socket.send_to_addr(state.as_bytes(), &addr))
            }
        };
        if let Err(e) = sent {
            tracing::debug!("systemd notification {state:?}: {e}");
        }
    }

    /// How often to feed the watchdog (half `$WATCHDOG_USEC`), if systemd asked for it.
    pub(crate) fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_a_path_socket_and_the_watchdog_is_half_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier {
            socket: UnixDatagram::unbound().unwrap(),
            target: Target::Path(path),
            watchdog: Some(Duration::from_secs(5)),
        };
        notifier.send("READY=1\nSTATUS=gating 8080");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=gating 8080");
        assert_eq!(notifier.watchdog_every(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn abstract_names_are_reached_too() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("shed-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier {
            socket: UnixDatagram::unbound().unwrap(),
            target: Target::Abstract(name.into_bytes()),
            watchdog: None,
        };
        notifier.send("STOPPING=1");
        let mut buf = [0u8; 16];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
