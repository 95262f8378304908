// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask`: everything the project needs, from a fresh machine to a
//! running demo, with no hand-run step.
mod docs;
mod image;
mod mutants;
mod package;
mod room;
mod setup;
mod systemd;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and every test need (idempotent): rust-src, clippy, bpf-linker, Debian's
    /// packages of the tests, gunicorn and kubernetes-validate; mount bpffs/tracefs.
    Setup {
        /// Only what `cargo xtask demo` needs: rust-src, bpf-linker, iproute2 and util-linux, and the mounts.
        #[arg(long)]
        demo: bool,
    },
    /// Build the kernel object (release, with BTF).
    BuildEbpf,
    /// Set up, build everything, and run every test (needs root: tests load real programs).
    Test {
        /// Extra arguments for `cargo test` (after --).
        #[arg(last = true)]
        cargo_args: Vec<String>,
    },
    /// Benchmarks (root): writes bench/results/<name>.json and REPORT.md.
    Bench {
        /// Fewer and shorter samples.
        #[arg(long)]
        quick: bool,
        /// Benchmarks to run (default: all): b1 ... b14.
        names: Vec<String>,
    },
    /// Long differential fuzz of the packet path (kernel vs reference model).
    Fuzz {
        /// Cases per hook.
        #[arg(long, default_value_t = 100_000)]
        cases: u32,
    },
    /// Mutation testing: cargo-mutants over the pure-logic modules, or (--kernel)
    /// every deliberate kernel fault against the program and end-to-end tests (root).
    /// Writes docs/mutants/. Slow: not part of `test`.
    Mutants {
        /// The kernel programs' faults (shed-ebpf/src/fault.rs) instead of the logic modules.
        #[arg(long)]
        kernel: bool,
        /// Only these faults (--kernel) or source files; the report is then not rewritten.
        only: Vec<String>,
        /// Re-test only what the last run did not catch (logic: cargo-mutants
        /// `--iterate`; kernel: the faults docs/mutants/kernel.md marks missed, and
        /// any fault it does not list), and update the report.
        #[arg(long, conflicts_with = "only")]
        again: bool,
    },
    /// Long churn soak: connections opened and closed every way, counts back to zero.
    Soak {
        #[arg(long, default_value_t = 100_000)]
        connections: u32,
    },
    /// Set up, build, and run the live demo in throwaway network namespaces.
    Demo {
        /// Seconds to run.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
    /// Build the Debian package (target/package/shed_VERSION_ARCH.deb): shedctl, the
    /// systemd unit, /etc/shed/shed.toml, man pages and completions; installs without Rust.
    Package,
    /// The Debian package's unit under a real systemd (root): boots a Debian
    /// container built here with systemd-nspawn, checks the gate is up and
    /// judging, reboots (empty /run) and checks again. Opt-in, not part of
    /// `test`: its first run downloads a Debian root from the mirror.
    Systemd,
    /// Build the OCI image localhost/shed:VERSION with podman (no Docker daemon): a
    /// static shedctl on scratch; deploy/kubernetes/daemonset.yaml runs that tag.
    Image,
    /// Build release binaries and install shedctl, its man pages and shell completions.
    Install {
        /// Folder for the binary.
        #[arg(long, default_value = "/usr/local/bin")]
        prefix: PathBuf,
        /// Folder for man pages (man/man1) and completions (bash, zsh, fish).
        #[arg(long, default_value = "/usr/local/share")]
        share: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup { demo } => setup::setup_for(if demo { setup::Scope::Demo } else { setup::Scope::Full }),
        Task::BuildEbpf => build_ebpf(),
        Task::Test { cargo_args } => test(&cargo_args),
        Task::Bench { quick, names } => {
            let mut args = vec!["run".to_owned()];
            args.extend(quick.then(|| "--quick".to_owned()));
            args.extend(names);
            shed_bench(&args)
        }
        Task::Mutants { kernel, only, again } => {
            setup::setup()?;
            build_ebpf()?;
            if kernel {
                require_root("the kernel faults are caught by tests that load real programs")?;
                mutants::kernel(&only, again)
            } else {
                mutants::logic(&only, again)
            }
        }
        Task::Fuzz { cases } => long_run("fuzz_decide", "SHED_FUZZ_CASES", cases),
        Task::Soak { connections } => long_run("e2e_soak", "SHED_SOAK_CONNECTIONS", connections),
        Task::Demo { seconds } => shed_bench(&["demo".to_owned(), "--seconds".to_owned(), seconds.to_string()]),
        Task::Package => {
            println!("built {}", build_package()?.display());
            Ok(())
        }
        Task::Systemd => {
            require_root("the check boots a container and loads real programs")?;
            systemd::check(&build_package()?)
        }
        Task::Image => {
            setup::setup()?;
            build_ebpf()?;
            println!("built {}", image::build()?);
            Ok(())
        }
        Task::Install { prefix, share } => {
            setup::setup()?;
            build_ebpf()?;
            cargo(&["build", "--release", "--package", "shed-userspace"])?;
            let dest = prefix.join("shedctl");
            std::fs::copy(workspace_root().join("target/release/shedctl"), &dest)
                .with_context(|| format!("install {}", dest.display()))?;
            println!("installed {}", dest.display());
            for file in docs::generate(&dest, &share)? {
                println!("installed {}", file.display());
            }
            Ok(())
        }
    }
}

/// Sets up, builds release shedctl and the Debian package; its path.
fn build_package() -> Result<PathBuf> {
    setup::setup()?;
    build_ebpf()?;
    cargo(&["build", "--release", "--package", "shed-userspace"])?;
    let out = workspace_root().join("target/package");
    std::fs::create_dir_all(&out)?;
    package::build(&workspace_root().join("target/release/shedctl"), &out)
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// cargo of the toolchain that runs us, in the workspace root.
fn cargo_command() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn cargo(args: &[&str]) -> Result<()> {
    run(cargo_command().args(args))
}

/// The benchmarks and the demo: set up, build the kernel object, shedctl and
/// shed-bench (release; it embeds the object just built), and run it as root.
fn shed_bench(args: &[String]) -> Result<()> {
    // The demo needs only what `setup --demo` installs; the benchmarks need the rest too.
    let demo = args.first().map(String::as_str) == Some("demo");
    setup::setup_for(if demo { setup::Scope::Demo } else { setup::Scope::Full })?;
    build_ebpf()?;
    require_root("the benchmarks and the demo load real eBPF programs and create network namespaces")?;
    cargo(&["build", "--release", "--package", "shed-userspace", "--package", "shed-bench"])?;
    run(Command::new(workspace_root().join("target/release/shed-bench")).args(args))
}

/// One integration test with its size turned up through an environment variable.
fn long_run(test: &str, size_var: &str, size: u32) -> Result<()> {
    setup::setup()?;
    build_ebpf()?;
    run(cargo_command().env(size_var, size.to_string()).args(["test", "--test", test, "--", "--nocapture"]))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Builds shed-ebpf for bpfel-unknown-none. Stable toolchain with
/// RUSTC_BOOTSTRAP for -Z build-std; BTF and CPU v3 (atomic fetch-add) for
/// this crate only.
fn build_ebpf() -> Result<()> {
    build_ebpf_with(None)
}

/// [`build_ebpf`], with one deliberate fault planted (see shed-ebpf/src/fault.rs).
fn build_ebpf_with(fault: Option<&str>) -> Result<()> {
    // A target folder of its own: sharing one with the host builds made each
    // invalidate the other's host dependencies (two full rebuilds per bench run).
    let ebpf_target = workspace_root().join("target/ebpf");
    // The gate's object, then the node agent's shared object for its pods
    // (shed_common::dispatch::SHARED_OBJECT), each copied where it is embedded from.
    for (features, name) in [(None, "shed"), (Some("shared"), "shed-shared")] {
        build_ebpf_object(&ebpf_target, fault, features, name)?;
    }
    Ok(())
}

/// One build of shed-ebpf (with `features`), copied to `target/bpfel-unknown-none/release/{name}`.
fn build_ebpf_object(ebpf_target: &Path, fault: Option<&str>, features: Option<&str>, name: &str) -> Result<()> {
    // No inter-procedural register allocation: with it LLVM may keep a value in
    // R1-R5 across a call to a subprogram it knows leaves them alone, and the
    // verifier (for which every call clobbers R1-R5) refuses the read after.
    let flags = ["-C", "debuginfo=2", "-C", "link-arg=--btf", "-C", "target-cpu=v3"].join("\x1f");
    run(cargo_command()
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .env("CARGO_TARGET_DIR", ebpf_target)
        .env_remove("RUSTFLAGS")
        .env("SHED_KERNEL_FAULT", fault.unwrap_or_default())
        .args([
            "build",
            "--package",
            "shed-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .args(features.map(|f| ["--features", f]).into_iter().flatten()))
    .context("building the kernel object (run `cargo xtask setup` if bpf-linker is missing)")?;
    // Where shed-userspace's build script embeds it from; copied only when it
    // changed, so an unchanged object does not rebuild the userspace crates.
    let built = ebpf_target.join("bpfel-unknown-none/release/shed");
    let object = workspace_root().join("target/bpfel-unknown-none/release").join(name);
    let bytes = std::fs::read(&built).with_context(|| format!("read {}", built.display()))?;
    // Constants that LLVM pools into mergeable sections (`&0i64` in a map
    // insert) land in `.rodata.cst*`, which aya 0.14 relocates to offset 0 of
    // the object's `.rodata`, where the stamps' secret lives: the insert then
    // read the secret as a client's count. Refuse such an object outright.
    if let Some(at) = bytes.windows(11).position(|w| w == b".rodata.cst") {
        bail!(
            "the kernel object has a mergeable constant section (.rodata.cst*, at byte {at}), which aya 0.14 \
             relocates wrongly: pass such values from the stack (see client_add in shed-ebpf/src/client.rs)"
        );
    }
    if std::fs::read(&object).ok().as_deref() != Some(&bytes[..]) {
        std::fs::create_dir_all(object.parent().expect("has a parent"))?;
        std::fs::write(&object, &bytes).with_context(|| format!("write {}", object.display()))?;
    }
    println!("built {}", object.display());
    Ok(())
}

fn require_root(why: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{why}: run it as root (`sudo -E cargo xtask ...`)");
    }
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    room::check(&workspace_root().join("target"))?;
    setup::setup()?;
    build_ebpf()?;
    require_root("the tests load real eBPF programs and create network namespaces")?;
    // The integration tests run the real shedctl, from beside their own binaries.
    let status = cargo_command().args(["build", "--bin", "shedctl"]).status().context("build shedctl")?;
    if !status.success() {
        bail!("building shedctl failed ({status})");
    }
    // The lints first (workspace [lints]: warnings are errors here), for every
    // default member and its tests.
    let status = cargo_command()
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .status()
        .context("run cargo clippy")?;
    if !status.success() {
        bail!("lints failed ({status}): see the warnings above");
    }
    // Default members: every crate but shed-ebpf, which only builds for the BPF target.
    let mut args = vec!["test", "--no-fail-fast"];
    args.extend(extra.iter().map(String::as_str));
    // One test at a time: the end-to-end tests share the host's one gate.
    args.extend(["--", "--test-threads=1"]);
    let mut child =
        cargo_command().args(&args).stdout(std::process::Stdio::piped()).spawn().context("run cargo test")?;
    // Echo the output and total the per-binary results into one closing line.
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    let stdout = child.stdout.take().expect("piped stdout");
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
                let n: u64 = n.parse().unwrap_or(0);
                match what {
                    "passed" => passed += n,
                    "failed" => failed += n,
                    "ignored" => ignored += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    println!("{passed} passed, {failed} failed, {ignored} skipped");
    if !status.success() || failed > 0 || passed == 0 {
        bail!("tests failed ({status})");
    }
    Ok(())
}
