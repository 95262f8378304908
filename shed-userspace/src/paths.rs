//! Where the gate keeps its state on the host. Every path is defined here.
use std::path::{Path, PathBuf};

/// bpffs mount point.
pub const BPFFS: &str = "/sys/fs/bpf";
/// The gate's pin folder: one pinned map per name in `shed_common::map::ALL`.
pub const PIN_DIR: &str = "/sys/fs/bpf/shed";
/// tracefs mount point (tracepoint ids and formats).
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// The running daemon's lock and pid file (flock held for the daemon's life).
pub const PID_FILE: &str = "/run/shed/shedctl.pid";
/// The gated namespace's TCP counters (listen-queue overflows), as the daemon's thread sees them.
pub const NETSTAT: &str = "/proc/thread-self/net/netstat";

/// Pin path of one map.
pub fn map_pin(name: &str) -> PathBuf {
    Path::new(PIN_DIR).join(name)
}
/// Where `ip netns` keeps its named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// The last live change's requester (uid, pid, command), for the daemon's audit line.
pub const REQUEST_NOTE: &str = "/run/shed/last-request";
