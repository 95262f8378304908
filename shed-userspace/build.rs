// SPDX-License-Identifier: MIT OR Apache-2.0
//! Embeds the kernel object built by `cargo xtask build-ebpf`.
//!
//! Without it (a plain `cargo check`/`clippy` on a machine without
//! bpf-linker) an empty placeholder is embedded instead, and the loader
//! refuses it with a message that says how to build the real one.
use std::{env, fs, path::PathBuf};

fn main() {
    // The commit for `shed_build_info` (SHED_GIT_COMMIT wins, as in a build from a tarball).
    println!("cargo:rerun-if-env-changed=SHED_GIT_COMMIT");
    let commit = env::var("SHED_GIT_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let out = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    println!("cargo:rustc-env=SHED_GIT_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
    // `shedctl --version`: the release and the commit it was built from.
    println!(
        "cargo:rustc-env=SHED_VERSION={} (commit {})",
        env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        commit.as_deref().unwrap_or("unknown")
    );
    // A new commit changes HEAD or the branch it names.
    let git = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo")).join("../.git");
    println!("cargo:rerun-if-changed={}", git.join("HEAD").display());
    if let Some(branch) =
        fs::read_to_string(git.join("HEAD")).ok().and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_owned()))
    {
        println!("cargo:rerun-if-changed={}", git.join(branch).display());
    }
    println!("cargo:rerun-if-env-changed=SHED_EBPF_OBJECT");
    let object = env::var_os("SHED_EBPF_OBJECT").map_or_else(
        || {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
            manifest.join("../target/bpfel-unknown-none/release/shed")
        },
        PathBuf::from,
    );
    embed(&object, "shed.bpf.o");
    // The shared object, built beside it (`shed-shared`).
    let mut shared = object.into_os_string();
    shared.push("-shared");
    embed(&PathBuf::from(shared), "shed-shared.bpf.o");
}

/// Copies `object` into OUT_DIR as `name` for `include_bytes!`, or an empty placeholder.
fn embed(object: &std::path::Path, name: &str) {
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo")).join(name);
    if let Ok(bytes) = fs::read(object) {
        fs::write(&out, bytes).expect("write embedded eBPF object");
    } else {
        println!(
            "cargo:warning=eBPF object {} not found; embedding an empty placeholder (run `cargo xtask build-ebpf`)",
            object.display()
        );
        fs::write(&out, []).expect("write placeholder eBPF object");
    }
}
