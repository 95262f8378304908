// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where the gate keeps its state on the host. Every path is defined here.
use std::path::{Path, PathBuf};

/// bpffs mount point.
pub(crate) const BPFFS: &str = "/sys/fs/bpf";
/// The gate's pin folder. A gate of the daemon's own network namespace pins
/// its maps here; a gate of a namespace
/// named with `--netns` pins them in [`NETNS_PIN_DIR`]`/<label>` instead.
pub const PIN_DIR: &str = "/sys/fs/bpf/shed";
/// Pin folders of the gates of namespaces named with `--netns`, one per namespace.
pub const NETNS_PIN_DIR: &str = "/sys/fs/bpf/shed/netns";
/// Where a node agent leaving on SIGTERM pins the links of its shared object
/// (its pods' TC links and its dispatchers') for its successor, a folder per
/// agent that left (`until-<lease end, CLOCK_MONOTONIC ns>`). Outside
/// [`PIN_DIR`], which every daemon's start and exit clears.
pub const HANDOVER_PIN_DIR: &str = "/sys/fs/bpf/shed-handover";
/// The `netns` label of the daemon's own network namespace (no `--netns`).
pub(crate) const OWN_NETNS_LABEL: &str = "host";
/// tracefs mount point (tracepoint ids and formats).
pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";
/// The running daemon's lock and pid file (flock held for the daemon's life).
pub const PID_FILE: &str = "/run/shed/shedctl.pid";

/// The folder of the daemon's run-time files.
pub const RUN_DIR: &str = "/run/shed";

/// While this file exists (`shedctl set --all --dry-run`), every port a gate
/// starts protecting starts in dry-run.
pub const DRY_RUN_ALL: &str = "/run/shed/dry-run-all";
/// Held (flock) around every read-modify-write of the gate's port configs and
/// tiers (`set`, `tier`, a reload), so two of them cannot undo each other.
pub(crate) const CONFIG_LOCK: &str = "/run/shed/config.lock";
/// The pod each pod gate serves (`attach --pods`): a file per gate, named by
/// its namespace's label, holding `namespace/name`. Beside the pins (bpffs
/// holds no plain files), removed with the gate.
pub(crate) const POD_NAMES: &str = "/run/shed/pods";

/// The pod (`namespace/name`) the gate of namespace `label` serves, if it is a pod's.
pub(crate) fn pod_of(label: &str) -> Option<String> {
    std::fs::read_to_string(Path::new(POD_NAMES).join(label)).ok().map(|s| s.trim().to_owned())
}

/// The label of the namespace whose gate serves `pod` (`namespace/name`).
pub(crate) fn label_of_pod(pod: &str) -> Option<String> {
    let entries = std::fs::read_dir(POD_NAMES).ok()?;
    entries.flatten().find_map(|e| {
        let label = e.file_name().into_string().ok()?;
        (pod_of(&label).as_deref() == Some(pod)).then_some(label)
    })
}

/// The gated namespace's TCP counters (listen-queue overflows), as the daemon's thread sees them.
pub(crate) const NETSTAT: &str = "/proc/thread-self/net/netstat";

/// Where the gate of `netns` (None: the daemon's own namespace) pins its maps.
pub fn gate_pin_dir(netns: Option<&str>) -> PathBuf {
    match netns {
        None => PathBuf::from(PIN_DIR),
        Some(ns) => Path::new(NETNS_PIN_DIR).join(netns_label(Some(ns))),
    }
}

/// The name a namespace goes by in stats, metrics, top and logs: its `ip netns`
/// name, a path with its slashes made underscores (`/proc/42/ns/net` is
/// `proc_42_ns_net`), or [`OWN_NETNS_LABEL`] for the daemon's own.
pub(crate) fn netns_label(netns: Option<&str>) -> String {
    match netns {
        None => OWN_NETNS_LABEL.to_owned(),
        Some(ns) => ns.trim_matches('/').replace('/', "_"),
    }
}
/// A namespace as `--netns` names it: its `ip netns` name when it is one
/// (a runtime's `/var/run/netns/cni-...`), else its path.
pub(crate) fn netns_name(path: &Path) -> String {
    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let named = parent == Path::new("/run/netns") || parent == Path::new("/var/run/netns");
    match path.file_name().and_then(|n| n.to_str()) {
        Some(name) if named => name.to_owned(),
        _ => path.display().to_string(),
    }
}

/// Where `ip netns` keeps its named network namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// The last live change's requester (uid, pid, command), for the daemon's audit line.
pub(crate) const REQUEST_NOTE: &str = "/run/shed/last-request";

/// The kernel's switch that makes every RCU grace period an expedited one
/// (see [`crate::host::rcu`]).
pub(crate) const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";
/// Left while this agent holds [`RCU_EXPEDITED`] on: an agent that finds it
/// at its start turns the switch back off for the one that died holding it.
pub(crate) const RCU_EXPEDITED_MARK: &str = "/run/shed/rcu-expedited";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_namespace_has_a_label_and_a_pin_folder_of_its_own() {
        assert_eq!(netns_label(None), "host");
        assert_eq!(netns_label(Some("web")), "web");
        assert_eq!(netns_label(Some("/proc/42/ns/net")), "proc_42_ns_net");
        assert_eq!(gate_pin_dir(None), Path::new(PIN_DIR));
        assert_eq!(gate_pin_dir(Some("web")), Path::new("/sys/fs/bpf/shed/netns/web"));
        assert_eq!(gate_pin_dir(Some("/run/netns/api")), Path::new("/sys/fs/bpf/shed/netns/run_netns_api"));
    }
}
