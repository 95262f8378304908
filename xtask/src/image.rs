// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask image`: the OCI image, without a Docker daemon: a static
//! shedctl (glibc, `crt-static`) on `scratch`, built by podman (buildah
//! inside) from deploy/image/Containerfile and tagged `localhost/shed:VERSION`,
//! the tag deploy/kubernetes/daemonset.yaml runs.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::workspace_root;

/// The tag the image is built under, and the DaemonSet's `image:`.
pub(crate) fn tag() -> String {
    format!("localhost/shed:{}", env!("CARGO_PKG_VERSION"))
}

/// Podman's global flags for this host. A cgroup v1 or hybrid host (as CI VMs
/// are) needs runc and the cgroupfs manager; crun refuses hybrid cgroups.
pub(crate) fn podman() -> Command {
    let mut cmd = Command::new("podman");
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        cmd.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    }
    cmd
}

/// Builds the static binary (its own target folder) and the image; returns the tag.
pub(crate) fn build() -> Result<String> {
    let root = workspace_root();
    let target_dir = root.join("target/static");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", "x86_64-unknown-linux-gnu", "--package", "shed-userspace"])
        .args(["--bin", "shedctl", "--target-dir"])
        .arg(&target_dir)
        .status()
        .context("cargo build (static)")?;
    if !status.success() {
        bail!("the static shedctl did not build");
    }
    let binary = target_dir.join("x86_64-unknown-linux-gnu/release/shedctl");
    let context = root.join("target/image");
    fs::create_dir_all(&context)?;
    fs::copy(&binary, context.join("shedctl")).context("stage shedctl")?;
    fs::copy(root.join("deploy/shed.toml"), context.join("shed.toml")).context("stage shed.toml")?;
    stage_with_libraries(Path::new("/usr/sbin/nft"), &context.join("root"))?;
    let containerfile: PathBuf = root.join("deploy/image/Containerfile");
    let tag = tag();
    let image_id = || {
        podman()
            .args(["image", "inspect", "--format", "{{.Id}}", &tag])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let before = image_id();
    let status = podman()
        .args(["build", "--tag", &tag, "--file"])
        .arg(&containerfile)
        .arg(&context)
        .status()
        .context("run podman (apt-get install podman runc, or cargo xtask setup)")?;
    if !status.success() {
        bail!("podman build failed");
    }
    // The image the tag named before is now nameless: remove it rather than
    // leave one more dangling image per rebuild (unless a container still uses it).
    if let Some(old) = before.filter(|old| Some(old) != image_id().as_ref()) {
        let _ = podman().args(["rmi", &old]).output();
    }
    Ok(tag)
}

/// Copies `binary` and every shared library it loads (as `ldd` lists them,
/// the loader included) under `root` at their own paths: the gate reads the
/// namespace's NAT rules with `nft`, so the image carries it and what it needs.
fn stage_with_libraries(binary: &Path, root: &Path) -> Result<()> {
    let out = Command::new("ldd").arg(binary).output().context("run ldd")?;
    if !out.status.success() {
        bail!(
            "ldd {}: {} (cargo xtask setup installs nftables)",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = String::from_utf8_lossy(&out.stdout);
    // `libx.so => /lib/.../libx.so (0x...)`, or the loader alone: `/lib64/ld-linux-x86-64.so.2 (0x...)`.
    let libraries = listed.lines().filter_map(|line| {
        let path = line.split("=>").last()?.split_whitespace().next()?;
        path.starts_with('/').then(|| PathBuf::from(path))
    });
    for file in std::iter::once(binary.to_path_buf()).chain(libraries) {
        let to = root.join(file.strip_prefix("/").unwrap_or(&file));
        fs::create_dir_all(to.parent().expect("a file's folder"))?;
        // The file itself, not a symlink into a tree the image does not have.
        fs::copy(&file, &to).with_context(|| format!("stage {}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use shed_testkit::testbed::{self, Backend, Service, Testbed};

    use super::*;

    /// Removes the test container however the test ends.
    struct Container(&'static str);

    impl Drop for Container {
        fn drop(&mut self) {
            let _ = podman().args(["rm", "--force", "--time", "5", self.0]).output();
        }
    }

    fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given.
        unsafe { libc::getrlimit(resource, &raw mut limit) };
        limit.rlim_max.min(1 << 20)
    }

    /// The DaemonSet runs the tag the build produces.
    #[test]
    fn the_daemonset_runs_the_image_the_build_tags() {
        let manifest = fs::read_to_string(workspace_root().join("deploy/kubernetes/daemonset.yaml")).unwrap();
        assert!(manifest.contains(&format!("image: {}", tag())), "daemonset.yaml must run {}", tag());
    }

    /// Builds the image, runs it with podman and gates a test namespace from
    /// inside it: the limit holds, and shedctl on the host sees the gate.
    #[test]
    fn the_image_gates_a_namespace_from_inside_a_container() {
        let tag = build().expect("image");
        let bed = Testbed::create("shedim").expect("testbed");
        let addr = bed.server_addr(false, 8080);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let name = "shed-image-test";
        let _ = podman().args(["rm", "--force", name]).output();
        // The folders the container shares with the host: on a machine where no
        // gate ran yet the daemon's own is not there, and podman refuses a missing one.
        for dir in ["/run/shed", "/run/netns"] {
            std::fs::create_dir_all(dir).expect(dir);
        }
        let out = podman()
            .args(["run", "--detach", "--name", name, "--network", "host", "--pid", "host", "--privileged"])
            // No more files or processes than this process may have (podman's defaults can
            // exceed a sandbox's hard limits, and the runtime then refuses to start).
            .args(["--ulimit", &format!("nofile={0}:{0}", hard_limit(libc::RLIMIT_NOFILE))])
            .args(["--ulimit", &format!("nproc={0}:{0}", hard_limit(libc::RLIMIT_NPROC).min(4096))])
            .args(["--volume", "/sys/fs/bpf:/sys/fs/bpf", "--volume", "/sys/kernel/tracing:/sys/kernel/tracing"])
            .args(["--volume", "/run/netns:/run/netns", "--volume", "/run/shed:/run/shed"])
            .arg(&tag)
            .args(["attach", "--netns", &bed.server_ns, "--iface", &bed.server_if, "--port", "8080", "--limit", "1"])
            .args(["--action", "rst"])
            .output()
            .expect("podman run");
        assert!(out.status.success(), "podman run: {}", String::from_utf8_lossy(&out.stderr));
        let container = Container(name);
        let start = Instant::now();
        while !shed::daemon::ready() {
            let logs = podman().args(["logs", name]).output().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the gate in the container did not come up: {}",
                String::from_utf8_lossy(&logs.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let (held, refused) = testbed::run_in(&bed.client_ns, move || {
            let held = testbed::connect(addr, Duration::from_secs(1)).expect("the first client is admitted");
            let refused = testbed::connect(addr, Duration::from_secs(1)).expect_err("the second is over the limit");
            (held, refused)
        })
        .unwrap();
        assert_eq!(
            refused.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "refused with an RST from the container's gate"
        );
        let stats =
            Command::new(workspace_root().join("target/debug/shedctl")).args(["stats", "--json"]).output().unwrap();
        let stats = String::from_utf8_lossy(&stats.stdout);
        assert!(
            stats.contains("\"limit\":1") && stats.contains("\"rejected\":1"),
            "the host's shedctl sees it: {stats}"
        );
        drop(held);
        let stop = podman().args(["stop", "--time", "10", name]).output().unwrap();
        assert!(stop.status.success(), "podman stop: {}", String::from_utf8_lossy(&stop.stderr));
        assert!(
            !std::path::Path::new(shed::host::paths::PIN_DIR).exists(),
            "the container's gate removed its pins on SIGTERM"
        );
        drop(container);
        // The NAT check's tool runs inside the image.
        let nft = podman()
            .args(["run", "--rm", "--entrypoint", "/usr/sbin/nft"])
            .args(["--ulimit", &format!("nofile={0}:{0}", hard_limit(libc::RLIMIT_NOFILE))])
            .args(["--ulimit", &format!("nproc={0}:{0}", hard_limit(libc::RLIMIT_NPROC).min(4096))])
            .args([&tag, "--version"])
            .output()
            .unwrap();
        assert!(
            nft.status.success() && String::from_utf8_lossy(&nft.stdout).starts_with("nftables v"),
            "nft in the image: {}{}",
            String::from_utf8_lossy(&nft.stdout),
            String::from_utf8_lossy(&nft.stderr)
        );
    }
}
