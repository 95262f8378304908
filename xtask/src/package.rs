// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask package`: a Debian package that installs without Rust:
//! `/usr/bin/shedctl`, the systemd unit, `/etc/shed/shed.toml` (a conffile),
//! man pages and bash, zsh and fish completions, built with `dpkg-deb` from
//! a staging tree (no cargo-deb needed).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{run, workspace_root};

/// Builds the package from `shedctl` (a release binary) into `out`; returns its path.
pub(crate) fn build(shedctl: &Path, out: &Path) -> Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let name = format!("shed_{version}_{arch}");
    let root = out.join(&name);
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("clear {}", root.display()))?;
    }
    let repo = workspace_root();
    let install = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let dest = root.join(to);
        fs::create_dir_all(dest.parent().expect("has a parent"))?;
        fs::copy(from, &dest).with_context(|| format!("stage {} as {to}", from.display()))?;
        fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        Ok(())
    };
    install(shedctl, "usr/bin/shedctl", 0o755)?;
    install(&repo.join("deploy/shed.toml"), "etc/shed/shed.toml", 0o644)?;
    // The unit as shipped, with the package's binary path.
    let unit = fs::read_to_string(repo.join("deploy/systemd/shed.service"))?
        .replace("/usr/local/bin/shedctl", "/usr/bin/shedctl");
    let unit_path = root.join("lib/systemd/system/shed.service");
    fs::create_dir_all(unit_path.parent().expect("has a parent"))?;
    fs::write(&unit_path, unit)?;
    // Man pages (gzip -9n, as Debian policy asks) and completions, from the binary itself.
    let share = root.join("usr/share");
    crate::docs::generate(shedctl, &share)?;
    let man = share.join("man/man1");
    run(Command::new("gzip")
        .args(["-9n"])
        .args(fs::read_dir(&man)?.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>()?))?;
    let doc = share.join("doc/shed");
    fs::create_dir_all(&doc)?;
    fs::copy(repo.join("README.md"), doc.join("README.md"))?;
    fs::write(doc.join("copyright"), copyright(&fs::read_to_string(repo.join("LICENSE-MIT"))?))?;
    // A native package's changelog (Debian policy 12.7), compressed as the man pages.
    fs::write(doc.join("changelog"), changelog(version)?)?;
    run(Command::new("gzip").args(["-9n"]).arg(doc.join("changelog")))?;
    let debian = root.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    let installed_kib = du_kib(&root)?;
    fs::write(
        debian.join("control"),
        format!(
            "Package: shed\nVersion: {version}\nArchitecture: {arch}\nMaintainer: {MAINTAINER}\nInstalled-Size: {installed_kib}\nDepends: libc6 (>= 2.34), libgcc-s1\nSection: net\nPriority: optional\nHomepage: https://github.com/shed/shed\nDescription: eBPF admission gate for TCP services\n shed decides on every new TCP connection to a protected port, in XDP or TC,\n whether to admit it or shed it early (drop or RST) because the service already\n holds as much work as it can finish in time. `shedctl attach` runs the gate;\n `systemctl enable --now shed` runs it from /etc/shed/shed.toml.\n"
        ),
    )?;
    fs::write(debian.join("conffiles"), "/etc/shed/shed.toml\n")?;
    let deb = out.join(format!("{name}.deb"));
    run(Command::new("dpkg-deb").args(["--root-owner-group", "--build"]).arg(&root).arg(&deb))?;
    Ok(deb)
}

/// Who answers for the package (an address lintian accepts: no localhost).
const MAINTAINER: &str = "shed developers <maintainers@shed.example.org>";

/// The changelog entry of this version, dated by `SOURCE_DATE_EPOCH` when set
/// (a reproducible build), else now.
fn changelog(version: &str) -> Result<String> {
    let mut date = Command::new("date");
    date.arg("-R");
    if let Ok(epoch) = std::env::var("SOURCE_DATE_EPOCH") {
        date.arg("-d").arg(format!("@{epoch}"));
    }
    let date = output(date.env("LC_ALL", "C"))?;
    Ok(format!("shed ({version}) unstable; urgency=medium\n\n  * Release {version}.\n\n -- {MAINTAINER}  {date}\n"))
}

/// The package's machine-readable copyright file (DEP-5), as Debian policy
/// asks of every package: the userspace under MIT or Apache-2.0, the kernel
/// programs embedded in shedctl under MIT or GPL-2.0.
fn copyright(mit: &str) -> String {
    let indent = |text: &str| {
        text.lines()
            .map(|l| if l.trim().is_empty() { " .".to_owned() } else { format!(" {l}") })
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: shed\nSource: https://github.com/shed/shed\n\nFiles: *\nCopyright: 2026 the shed developers\nLicense: MIT or Apache-2.0\n\nFiles: shed-ebpf/*\nCopyright: 2026 the shed developers\nComment: the kernel programs, embedded in /usr/bin/shedctl and loaded into the kernel\nLicense: MIT or GPL-2\n\nLicense: MIT\n{}\n\nLicense: Apache-2.0\n On Debian systems the full text of the Apache License 2.0 is in\n /usr/share/common-licenses/Apache-2.0.\n\nLicense: GPL-2\n On Debian systems the full text of the GNU General Public License\n version 2 is in /usr/share/common-licenses/GPL-2.\n",
        indent(mit)
    )
}

fn du_kib(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { du_kib(&entry.path())? * 1024 } else { meta.len() };
    }
    Ok(total.div_ceil(1024))
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dpkg(args: &[&str]) -> std::process::Output {
        Command::new("dpkg").args(args).output().expect("dpkg")
    }

    /// Debian's own checks find no error in the package (a copyright file, man
    /// pages, conffiles, permissions). Built from a stripped copy of the debug
    /// binary the tests already have, as a release package is stripped.
    #[test]
    fn lintian_finds_no_error_in_the_package() {
        let debug = workspace_root().join("target/debug/shedctl");
        assert!(debug.exists(), "{} is missing: run the tests with `cargo xtask test`", debug.display());
        let out = tempfile::tempdir().unwrap();
        let shedctl = out.path().join("shedctl");
        let strip = Command::new("strip").args(["--strip-unneeded", "-o"]).arg(&shedctl).arg(&debug).status().unwrap();
        assert!(strip.success(), "strip {}", debug.display());
        let deb = build(&shedctl, out.path()).expect("package");
        let lintian = Command::new("lintian")
            .args(["--tag-display-limit", "0", "--fail-on", "error"])
            .arg(&deb)
            .output()
            .expect("lintian (installed by `cargo xtask setup`)");
        let report = String::from_utf8_lossy(&lintian.stdout);
        assert!(
            lintian.status.success() && !report.lines().any(|l| l.starts_with("E: ")),
            "lintian found errors:\n{report}{}",
            String::from_utf8_lossy(&lintian.stderr)
        );
    }

    /// Installs the package with dpkg, runs what it installed, verifies the unit,
    /// and removes it without a trace. Needs root; builds from the debug binary
    /// the tests already have (the package holds whatever binary it is given).
    #[test]
    fn the_package_installs_runs_and_purges_cleanly() {
        let shedctl = workspace_root().join("target/debug/shedctl");
        assert!(shedctl.exists(), "{} is missing: run the tests with `cargo xtask test`", shedctl.display());
        let out = tempfile::tempdir().unwrap();
        let deb = build(&shedctl, out.path()).expect("package");
        let contents = String::from_utf8(dpkg(&["--contents", deb.to_str().unwrap()]).stdout).unwrap();
        for file in [
            "./usr/bin/shedctl",
            "./lib/systemd/system/shed.service",
            "./etc/shed/shed.toml",
            "./usr/share/man/man1/shedctl-attach.1.gz",
            "./usr/share/bash-completion/completions/shedctl",
            "./usr/share/zsh/vendor-completions/_shedctl",
            "./usr/share/fish/vendor_completions.d/shedctl.fish",
            "./usr/share/doc/shed/copyright",
        ] {
            assert!(contents.contains(file), "{file} in:\n{contents}");
        }
        // Never clobber a shedctl installed another way.
        let owned = dpkg(&["-s", "shed"]).status.success();
        for path in ["/usr/bin/shedctl", "/etc/shed/shed.toml", "/lib/systemd/system/shed.service"] {
            assert!(owned || !Path::new(path).exists(), "{path} exists outside the package: not touching it");
        }
        let _ = dpkg(&["--purge", "shed"]);
        let install = dpkg(&["-i", deb.to_str().unwrap()]);
        assert!(install.status.success(), "dpkg -i: {}", String::from_utf8_lossy(&install.stderr));
        let version = Command::new("/usr/bin/shedctl").arg("--version").output().unwrap();
        let purge = || dpkg(&["--purge", "shed"]);
        if !version.status.success() {
            purge();
            panic!("installed shedctl --version failed");
        }
        // The release and the commit it was built from.
        let said = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        assert!(said.starts_with(&format!("shedctl {} (commit ", env!("CARGO_PKG_VERSION"))), "{said}");
        assert!(!said.contains("(commit unknown)"), "built from a checkout, the commit is known: {said}");
        let verify =
            Command::new("systemd-analyze").args(["verify", "/lib/systemd/system/shed.service"]).output().unwrap();
        let verified = verify.status.success();
        let removed = purge();
        assert!(verified, "systemd-analyze verify: {}", String::from_utf8_lossy(&verify.stderr));
        assert!(removed.status.success(), "dpkg --purge: {}", String::from_utf8_lossy(&removed.stderr));
        for left in ["/usr/bin/shedctl", "/lib/systemd/system/shed.service", "/etc/shed/shed.toml"] {
            assert!(!Path::new(left).exists(), "{left} left after purge");
        }
        let status = dpkg(&["-s", "shed"]);
        assert!(!status.status.success(), "dpkg still knows shed");
    }
}
