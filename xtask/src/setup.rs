// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask setup`: idempotent; says what it did and fails with the step that could not be done.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{run, workspace_root};

const BPF_LINKER_VERSION: &str = "0.13.0";

pub(crate) fn setup() -> Result<()> {
    toolchain_components()?;
    bpf_linker()?;
    debian_packages()?;
    python_tools()?;
    mounts()?;
    Ok(())
}

/// PyPI's tools: kubernetes-validate checks deploy/kubernetes against the
/// Kubernetes schemas it ships; gunicorn (its gthread worker) is a real
/// Python server for the control tests and B14.
fn python_tools() -> Result<()> {
    for (module, package) in [("kubernetes_validate", "kubernetes-validate"), ("gunicorn", "gunicorn")] {
        if output(Command::new("python3").args(["-m", module, "--version"])).is_some() {
            println!("setup: {package} present");
            continue;
        }
        println!("setup: installing {package} (pip)");
        run(Command::new("python3").args(["-m", "pip", "install", "--quiet", package]))
            .with_context(|| format!("pip install {package}"))?;
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The toolchain components the build and the checks need: rust-src (for
/// -Z build-std=core) and clippy (`cargo xtask test` lints the workspace).
fn toolchain_components() -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"])).unwrap_or_default();
    for (component, why) in [("rust-src", "needed for -Z build-std=core"), ("clippy", "cargo xtask test lints with it")]
    {
        if installed.lines().any(|l| l.starts_with(component)) {
            println!("setup: {component} present");
            continue;
        }
        println!("setup: adding {component} ({why})");
        run(Command::new("rustup").args(["component", "add", component]))
            .with_context(|| format!("rustup component add {component}"))?;
    }
    Ok(())
}

fn bpf_linker() -> Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        println!("setup: bpf-linker {BPF_LINKER_VERSION} present");
        return Ok(());
    }
    // bpf-linker links against LLVM; use the toolchain's own libLLVM so no LLVM download is needed.
    let rustc = output(Command::new("rustup").args(["which", "rustc"])).context("rustup which rustc")?;
    let toolchain = Path::new(rustc.trim()).parent().and_then(Path::parent).context("toolchain folder")?;
    let lib = toolchain.join("lib");
    let llvm = std::fs::read_dir(&lib)
        .with_context(|| format!("list {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libLLVM.so.")))
        .with_context(|| format!("no libLLVM.so.* in {}: is this a rustup toolchain?", lib.display()))?;
    let major = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libLLVM.so."))
        .and_then(|v| v.split('.').next())
        .context("LLVM version from libLLVM file name")?
        .to_owned();
    let prefix = workspace_root().join("target/llvm-prefix");
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link).with_context(|| format!("symlink {}", link.display()))?;
    println!("setup: installing bpf-linker {BPF_LINKER_VERSION} against {} (LLVM {major})", llvm.display());
    run(Command::new("cargo")
        .env("LLVM_PREFIX", &prefix)
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{major}")))
    .context("cargo install bpf-linker")
}

fn debian_packages() -> Result<()> {
    // iproute2: namespaces and veth for the tests and the demo; util-linux: setpriv and unshare in the tests.
    // nftables: the static-cap comparison in `cargo xtask bench`; fonts-dejavu-core: the text of its plots.
    // iptables: iptables-legacy, whose NAT rules the gate reads too (e2e_hardening).
    // nghttp2-proxy (nghttpx) and nghttp2-client (h2load): a real HTTP/2 server and
    // load generator for the multiplexed-connection test and the bursty benchmark (B8).
    // prometheus: promtool, which checks and unit-tests deploy/prometheus's rules.
    // podman and runc: build and run the OCI image (`cargo xtask image`) without a Docker daemon.
    // curl and python3-urllib3 (for the system python3): real HTTP clients of the `http` action's
    // test and of its retry-storm benchmark (B11).
    // lintian and binutils (strip): Debian's checks of the package (`cargo xtask package`), run by xtask's tests.
    // containerd, the CNI plugins and busybox-static (the pause image's one binary): real pod
    // sandboxes for e2e_pods; protobuf-compiler (protoc): the CRI bindings' build (k8s-cri).
    // golang-go: Go's net/http, a real server that reads every request at once and queues inside
    // (the read-at-once tests and B4/B5); nginx and haproxy: a real proxy in front of a backend and
    // the balancer of the agent-check benchmark; wrk: a real kept-alive load generator;
    // kubernetes-client: kubectl kustomize, which builds deploy/kubernetes's bases in the tests.
    // Each package is known by a command it installs, or by a file (a leading /).
    let wanted = [
        ("ip", "iproute2"),
        ("setpriv", "util-linux"),
        ("unshare", "util-linux"),
        ("nft", "nftables"),
        ("iptables-legacy", "iptables"),
        ("nghttpx", "nghttp2-proxy"),
        ("h2load", "nghttp2-client"),
        ("promtool", "prometheus"),
        ("podman", "podman"),
        ("runc", "runc"),
        ("curl", "curl"),
        ("lintian", "lintian"),
        ("strip", "binutils"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        ("/usr/share/doc/busybox-static", "busybox-static"),
        ("protoc", "protobuf-compiler"),
        ("/usr/lib/python3/dist-packages/urllib3/__init__.py", "python3-urllib3"),
        ("go", "golang-go"),
        ("nginx", "nginx"),
        ("haproxy", "haproxy"),
        ("wrk", "wrk"),
        ("kubectl", "kubernetes-client"),
        ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "fonts-dejavu-core"),
    ];
    let present = |what: &str| {
        if what.starts_with('/') {
            std::path::Path::new(what).exists()
        } else {
            output(Command::new("sh").args(["-c", &format!("command -v {what}")])).is_some()
        }
    };
    let missing: Vec<&str> = wanted.iter().filter(|(what, _)| !present(what)).map(|(_, pkg)| *pkg).collect();
    if missing.is_empty() {
        println!(
            "setup: iproute2, util-linux, nftables, iptables, nghttp2, promtool, podman, curl, lintian, containerd, CNI, busybox, protoc, urllib3 and fonts-dejavu-core present"
        );
        return Ok(());
    }
    let mut missing = missing;
    missing.dedup();
    println!("setup: installing {}", missing.join(" "));
    if run(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing)).is_err() {
        run(Command::new("apt-get").arg("update")).context("apt-get update")?;
        run(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing))
            .context("apt-get install")?;
    }
    Ok(())
}

fn is_mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(path))
}

fn mounts() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for (fs, path) in [("bpf", "/sys/fs/bpf"), ("tracefs", "/sys/kernel/tracing")] {
        if is_mounted(path) {
            println!("setup: {fs} mounted at {path}");
            continue;
        }
        if !root {
            bail!("{fs} is not mounted at {path} and mounting needs root: run `sudo mount -t {fs} {fs} {path}`");
        }
        println!("setup: mounting {fs} at {path}");
        run(Command::new("mount").args(["-t", fs, fs, path]))?;
    }
    Ok(())
}
