// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask setup`: idempotent; says what it did and fails with the step that could not be done.
//! `cargo xtask setup --demo` installs only what the demo needs ([`Scope::Demo`]).
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{run, workspace_root};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// What a set-up installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// What `cargo xtask demo` needs: the kernel object's build (rust-src,
    /// bpf-linker), namespaces (iproute2, util-linux) and the bpffs/tracefs mounts.
    Demo,
    /// Everything the tests, the benchmarks, the package and the image need
    /// (what `cargo xtask test` and CI run).
    Full,
}

/// Everything ([`Scope::Full`]).
pub(crate) fn setup() -> Result<()> {
    setup_for(Scope::Full)
}

pub(crate) fn setup_for(scope: Scope) -> Result<()> {
    toolchain_components(scope)?;
    bpf_linker()?;
    debian_packages(scope)?;
    if scope == Scope::Full {
        python_tools()?;
    }
    mounts()?;
    Ok(())
}

/// rustup components: rust-src for -Z build-std=core (the kernel object);
/// clippy, with which `cargo xtask test` lints the workspace.
fn components(scope: Scope) -> &'static [(&'static str, &'static str)] {
    const ALL: &[(&str, &str)] =
        &[("rust-src", "needed for -Z build-std=core"), ("clippy", "cargo xtask test lints with it")];
    match scope {
        Scope::Demo => &ALL[..1],
        Scope::Full => ALL,
    }
}

/// PyPI's packages (module, package), for the tests only.
const PYTHON_TOOLS: &[(&str, &str)] = &[("kubernetes_validate", "kubernetes-validate"), ("gunicorn", "gunicorn")];

/// PyPI's tools: kubernetes-validate checks deploy/kubernetes against the
/// Kubernetes schemas it ships; gunicorn (its gthread worker) is a real
/// Python server for the control tests and B14.
fn python_tools() -> Result<()> {
    for &(module, package) in PYTHON_TOOLS {
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

/// The toolchain components the scope needs ([`components`]).
fn toolchain_components(scope: Scope) -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"])).unwrap_or_default();
    for &(component, why) in components(scope) {
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

/// Debian's packages the demo needs, each known by a command it installs:
/// iproute2 for the namespaces and veth, util-linux for unshare and setpriv.
const DEMO_PACKAGES: &[(&str, &str)] = &[("ip", "iproute2"), ("setpriv", "util-linux"), ("unshare", "util-linux")];

/// Debian's packages only the tests, the benchmarks, the package and the image need.
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
const TEST_PACKAGES: &[(&str, &str)] = &[
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

/// The Debian packages of a scope, (what shows it installed, package); the demo's first.
fn debian_wanted(scope: Scope) -> Vec<(&'static str, &'static str)> {
    let mut wanted = DEMO_PACKAGES.to_vec();
    if scope == Scope::Full {
        wanted.extend_from_slice(TEST_PACKAGES);
    }
    wanted
}

/// The package names of a scope, each once, in order.
fn debian_names(scope: Scope) -> Vec<&'static str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, package) in debian_wanted(scope) {
        if !names.contains(&package) {
            names.push(package);
        }
    }
    names
}

fn debian_packages(scope: Scope) -> Result<()> {
    let present = |what: &str| {
        if what.starts_with('/') {
            std::path::Path::new(what).exists()
        } else {
            output(Command::new("sh").args(["-c", &format!("command -v {what}")])).is_some()
        }
    };
    let mut missing: Vec<&str> = Vec::new();
    for (what, package) in debian_wanted(scope) {
        if !present(what) && !missing.contains(&package) {
            missing.push(package);
        }
    }
    if missing.is_empty() {
        println!("setup: {} present", debian_names(scope).join(", "));
        return Ok(());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's set-up is a strict part of the full one: whatever the demo
    /// needs the tests need too, and the demo asks for none of the tests' tools.
    #[test]
    fn the_demo_installs_a_strict_subset_of_what_the_tests_need() {
        let (demo, full) = (debian_names(Scope::Demo), debian_names(Scope::Full));
        assert_eq!(demo, ["iproute2", "util-linux"], "the demo needs namespaces and nothing else from Debian");
        assert!(demo.iter().all(|p| full.contains(p)), "{demo:?} not all in {full:?}");
        assert!(full.len() > demo.len(), "the tests need more than the demo");
        let names = |scope| components(scope).iter().map(|&(c, _)| c).collect::<Vec<_>>();
        assert_eq!(names(Scope::Demo), ["rust-src"], "the kernel object's build needs rust-src");
        assert!(names(Scope::Full).contains(&"rust-src") && names(Scope::Full).contains(&"clippy"));
        // `cargo xtask setup --demo` chooses it; plain `cargo xtask setup` (what CI runs) everything.
        use clap::Parser as _;
        let scope = |args: &[&str]| match crate::Cli::try_parse_from(args).map(|c| c.command) {
            Ok(crate::Task::Setup { demo }) => demo,
            _ => panic!("{args:?} is not a set-up"),
        };
        assert!(scope(&["cargo xtask", "setup", "--demo"]));
        assert!(!scope(&["cargo xtask", "setup"]));
    }

    /// The README says what each set-up installs, package by package, and its
    /// quick start runs the demo's.
    #[test]
    fn the_readme_names_what_each_setup_installs() {
        let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
        let quick_start = &readme[..readme.find("## Install").expect("the README has an Install section")];
        let block = quick_start.split("```sh").nth(1).expect("the quick start's commands").split("```").next().unwrap();
        let commands: Vec<&str> = block.lines().map(|l| l.split('#').next().unwrap().trim()).collect();
        let (setup, demo) = (
            commands.iter().position(|&c| c == "cargo xtask setup --demo"),
            commands.iter().position(|&c| c == "cargo xtask demo"),
        );
        assert!(
            setup.is_some() && setup < demo,
            "the quick start sets up the demo's needs, then runs it: {commands:?}"
        );
        let mut named: Vec<&str> = debian_names(Scope::Full);
        named.extend(components(Scope::Full).iter().map(|&(c, _)| c));
        named.extend(PYTHON_TOOLS.iter().map(|&(_, p)| p));
        named.push("bpf-linker");
        let missing: Vec<&&str> = named.iter().filter(|p| !quick_start.contains(&format!("`{p}`"))).collect();
        assert!(missing.is_empty(), "the README's quick start does not say set-up installs {missing:?}");
        let demo_says = &quick_start[quick_start.find("`cargo xtask setup --demo`").expect("what --demo installs")..];
        let demo_says = &demo_says[..demo_says.find("`cargo xtask setup`,").expect("what plain setup installs")];
        let extra: Vec<&str> =
            debian_names(Scope::Full).into_iter().filter(|p| demo_says.contains(&format!("`{p}`"))).collect();
        assert_eq!(extra, debian_names(Scope::Demo), "what the README says `setup --demo` installs");
    }
}
