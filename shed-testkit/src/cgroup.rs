// SPDX-License-Identifier: MIT OR Apache-2.0
//! A memory cgroup for the daemon, as a container's limit is: the tests that
//! run `shedctl` under the DaemonSet's limit and check it is refused, never
//! OOM-killed.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

/// A memory cgroup (v2 if mounted so, else v1's memory controller) with a
/// limit, and a wrapper that starts `shedctl` inside it, so that everything
/// the daemon creates is charged there from its first byte; removed on drop.
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
    wrapper: tempfile::TempPath,
}

impl MemoryCgroup {
    /// `name` under the cgroup root, limited to `limit` bytes.
    pub fn create(name: &str, limit: u64) -> Self {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let root = if v2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/memory" };
        let dir = Path::new(root).join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        std::fs::write(dir.join(if v2 { "memory.max" } else { "memory.limit_in_bytes" }), limit.to_string()).unwrap();
        let mut wrapper = tempfile::Builder::new().suffix(".sh").tempfile().unwrap();
        let script = format!(
            "#!/bin/sh\necho $$ > {}/cgroup.procs\nexec {} \"$@\"\n",
            dir.display(),
            crate::gate::shedctl_path()
        );
        wrapper.write_all(script.as_bytes()).unwrap();
        let wrapper = wrapper.into_temp_path();
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Self { dir, v2, wrapper }
    }

    /// The script that runs `shedctl <its arguments>` inside the cgroup.
    pub fn shedctl(&self) -> &Path {
        &self.wrapper
    }

    /// Bytes charged to it now.
    pub fn current(&self) -> u64 {
        let file = if self.v2 { "memory.current" } else { "memory.usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(file)).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
    }

    /// Times the kernel's OOM killer ran in it.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The memory limit of the shipped DaemonSet's agent container
/// (deploy/kubernetes/daemonset.yaml), in bytes: what the tests run the agent under.
pub fn daemonset_memory_limit() -> u64 {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/daemonset.yaml");
    let yaml = std::fs::read_to_string(path).expect("the shipped DaemonSet");
    let limits = yaml.split_once("limits:").expect("its resource limits").1;
    let memory = limits.lines().find_map(|l| l.trim().strip_prefix("memory:")).expect("a memory limit").trim();
    let mib: u64 = memory.strip_suffix("Mi").and_then(|m| m.parse().ok()).expect("a limit in Mi");
    mib << 20
}
