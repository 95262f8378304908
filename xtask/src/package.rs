// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask package`: a Debian package that installs without Rust:
//! `/usr/bin/shedctl`, the systemd unit, `/etc/shed/shed.toml` (a conffile),
//! man pages and bash, zsh and fish completions, built with `dpkg-deb` from
//! a staging tree (no cargo-deb needed). Its maintainer scripts
//! (deploy/debian/) reload systemd's units on install, stop the service on
//! remove and clear the gate's pins on purge, each only where it is safe.
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
            "Package: shed\nVersion: {version}\nArchitecture: {arch}\nMaintainer: {MAINTAINER}\nInstalled-Size: {installed_kib}\nDepends: libc6 (>= 2.34), libgcc-s1\nSection: net\nPriority: optional\nHomepage: https://github.com/shed/shed\nDescription: eBPF admission gate for TCP services\n shed judges every new TCP connection to a protected port, and every new\n request on a kept-alive one, in XDP or TC: it admits it, or sheds it early\n (a drop, a RST or an HTTP 503) because the service already holds as much\n work as it can finish in time. `shedctl attach` runs the gate;\n `systemctl enable --now shed` runs it from /etc/shed/shed.toml.\n"
        ),
    )?;
    fs::write(debian.join("conffiles"), "/etc/shed/shed.toml\n")?;
    for script in MAINTAINER_SCRIPTS {
        install(&repo.join("deploy/debian").join(script), &format!("DEBIAN/{script}"), 0o755)?;
    }
    let deb = out.join(format!("{name}.deb"));
    run(Command::new("dpkg-deb").args(["--root-owner-group", "--build"]).arg(&root).arg(&deb))?;
    Ok(deb)
}

/// The maintainer scripts, from deploy/debian/: postinst reloads systemd's
/// units, prerm stops the service on remove, postrm clears the pins on purge
/// unless a daemon runs; each does nothing where systemd is not PID 1.
const MAINTAINER_SCRIPTS: [&str; 3] = ["postinst", "prerm", "postrm"];

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

    /// Runs `script` (sh, `set -e`) in a mount namespace of its own whose
    /// /sys/fs/bpf and /run are empty tmpfs, so the maintainer scripts meet
    /// only what it makes there, never the host's pins (another gate's) or its
    /// systemd. A `systemctl` first on PATH logs its arguments instead of
    /// running; with `systemd`, /run/systemd/system exists, as where systemd
    /// runs the host. Its output, and what systemctl was asked.
    fn isolated(systemd: bool, script: &str) -> (std::process::Output, String) {
        let fake = tempfile::tempdir().unwrap();
        let (bin, log) = (fake.path().join("bin"), fake.path().join("systemctl.log"));
        fs::create_dir(&bin).unwrap();
        fs::write(bin.join("systemctl"), format!("#!/bin/sh\necho \"$*\" >> {}\n", log.display())).unwrap();
        fs::set_permissions(bin.join("systemctl"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let systemd = if systemd { "mkdir -p /run/systemd/system" } else { "true" };
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "set -e; mount -t tmpfs shed-test /sys/fs/bpf; mount -t tmpfs shed-test /run; {systemd}; {script}"
            ))
            .env("PATH", path)
            .output()
            .expect("unshare (util-linux)");
        (out, fs::read_to_string(&log).unwrap_or_default())
    }

    fn show(out: &std::process::Output) -> String {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
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
    /// and removes it without a trace. Its maintainer scripts are in it; under
    /// systemd they reload the units on install, stop the service on remove,
    /// and a purge clears pins a gate left, but not while a daemon runs (each
    /// in a mount namespace with bpffs and /run of its own: the host's pins
    /// are never touched). Needs root; builds from the debug binary the tests
    /// already have (the package holds whatever binary it is given).
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
        // The maintainer scripts, executable (dpkg-deb marks those with a `*`).
        let info = String::from_utf8(dpkg(&["--info", deb.to_str().unwrap()]).stdout).unwrap();
        for script in MAINTAINER_SCRIPTS {
            assert!(
                info.lines().any(|l| l.split_whitespace().collect::<Vec<_>>().ends_with(&["*", script, "#!/bin/sh"])),
                "{script} is not an executable maintainer script of the package:\n{info}"
            );
        }
        // Never clobber a shedctl installed another way.
        let owned = dpkg(&["-s", "shed"]).status.success();
        for path in ["/usr/bin/shedctl", "/etc/shed/shed.toml", "/lib/systemd/system/shed.service"] {
            assert!(owned || !Path::new(path).exists(), "{path} exists outside the package: not touching it");
        }
        let purge = || isolated(false, "dpkg --purge shed").0;
        purge();
        // Installed where systemd runs the host: the units are reloaded.
        let (install, systemctl) = isolated(true, &format!("dpkg -i {}", deb.display()));
        assert!(install.status.success(), "dpkg -i: {}", show(&install));
        if systemctl.lines().collect::<Vec<_>>() != ["daemon-reload"] {
            purge();
            panic!("postinst under systemd ran systemctl {systemctl:?}, not daemon-reload");
        }
        let version = Command::new("/usr/bin/shedctl").arg("--version").output().unwrap();
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
        // Pins a gate left (its namespaces' too, and a node agent's handover
        // links), with a daemon holding the pid file's lock, as a running one
        // does: the installed postrm leaves them, and calls no systemctl where
        // systemd is not PID 1. With nobody holding the lock, the purge clears
        // them and, under systemd, the service was stopped and the units reloaded.
        let pins = "mkdir -p /sys/fs/bpf/shed/netns/web /sys/fs/bpf/shed-handover/until-1 /run/shed; \
                    echo 4242 > /run/shed/shedctl.pid";
        let (kept, kept_systemctl) = isolated(
            false,
            &format!(
                "{pins}; flock --exclusive /run/shed/shedctl.pid sh /var/lib/dpkg/info/shed.postrm purge; \
                 test -d /sys/fs/bpf/shed/netns/web && test -d /sys/fs/bpf/shed-handover/until-1 && echo kept"
            ),
        );
        let (removed, systemctl) = isolated(
            true,
            &format!(
                "{pins}; dpkg --purge shed; \
                 if [ -e /sys/fs/bpf/shed ] || [ -e /sys/fs/bpf/shed-handover ]; then echo left; else echo cleared; fi"
            ),
        );
        assert!(verified, "systemd-analyze verify: {}", String::from_utf8_lossy(&verify.stderr));
        assert!(removed.status.success(), "dpkg --purge: {}", show(&removed));
        assert!(show(&kept).contains("kept"), "postrm purge removed a running daemon's pins: {}", show(&kept));
        assert!(show(&kept).contains("a shedctl daemon runs (pid 4242)"), "it says why: {}", show(&kept));
        assert_eq!(kept_systemctl, "", "no systemctl without systemd");
        assert!(show(&removed).contains("cleared"), "purge left the pins: {}", show(&removed));
        assert_eq!(systemctl.lines().collect::<Vec<_>>(), ["stop shed.service", "daemon-reload"], "under systemd");
        for left in ["/usr/bin/shedctl", "/lib/systemd/system/shed.service", "/etc/shed/shed.toml"] {
            assert!(!Path::new(left).exists(), "{left} left after purge");
        }
        let status = dpkg(&["-s", "shed"]);
        assert!(!status.status.success(), "dpkg still knows shed");
    }
}
