//! `cargo xtask systemd`: the Debian package's unit under a real systemd, in
//! a container built here (no registry to pull from), through a reboot.
//!
//! A minimal Debian (debootstrap, cached in `target/systemd/root`) boots
//! under `systemd-nspawn` with a private network (only `lo`), a bpffs of its
//! own at `/sys/fs/bpf` (and no tracefs, as in most containers). The package is installed
//! with dpkg and the unit enabled; the check then:
//! - boots, and waits for `shed.service` to be active (`Type=notify`: after
//!   READY=1, so the port is judged);
//! - reads `shedctl stats --json` inside, makes a connection to the port
//!   and sees the gate count it, and asks `/readyz`;
//! - records `systemd-analyze security shed`;
//! - powers off and boots again (a fresh, empty `/run`: the unit must make
//!   its own runtime directory), and checks it all again.
//!
//! Not part of `cargo xtask test`: it downloads a Debian root from the mirror
//! on its first run (a few minutes, and CI must not fail on a mirror outage),
//! and needs systemd-nspawn. `--keep` leaves the root for the next run.
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{run, workspace_root};

/// The Debian release the package targets, and its mirror.
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// How long a boot may take until the unit is active.
const BOOT_LIMIT: Duration = Duration::from_secs(90);

/// Runs the check with the package at `deb`.
pub(crate) fn check(deb: &Path) -> Result<()> {
    for (tool, package) in [("debootstrap", "debootstrap"), ("systemd-nspawn", "systemd-container")] {
        if Command::new("which").arg(tool).stdout(Stdio::null()).status().map_or(true, |s| !s.success()) {
            run(Command::new("apt-get").args(["install", "-y", "-q", package]))?;
        }
    }
    let dir = workspace_root().join("target/systemd");
    let root = dir.join("root");
    if !root.join("sbin/init").exists() {
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&dir)?;
        println!("systemd: building a Debian {SUITE} root in {} (once)", root.display());
        run(Command::new("debootstrap").args([
            "--variant=minbase",
            "--include=systemd,systemd-sysv,dbus,curl",
            SUITE,
            root.to_str().context("a UTF-8 path")?,
            MIRROR,
        ]))?;
    }
    // The package, installed fresh: an earlier run's unit and config go first.
    let _ = nspawn(&root, &["dpkg", "--purge", "shed"]);
    fs::copy(deb, root.join("var/tmp/shed.deb"))?;
    nspawn(&root, &["dpkg", "-i", "/var/tmp/shed.deb"])?;
    nspawn(&root, &["systemctl", "enable", "shed.service"])?;

    // A bpffs of the container's own: its pins are not the host's.
    let bpffs = dir.join("bpffs");
    fs::create_dir_all(&bpffs)?;
    let _ = Command::new("umount").arg(&bpffs).status();
    run(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpffs))?;
    let result = (|| {
        let mut reports = Vec::new();
        for boot in ["first boot", "after a reboot (empty /run)"] {
            let machine = Machine::boot(&root, &bpffs, &dir.join(format!("{}.log", boot.split(' ').next().unwrap())))?;
            let report = machine.check(boot);
            machine.power_off();
            reports.push(report?);
        }
        Ok::<_, anyhow::Error>(reports)
    })();
    let _ = Command::new("umount").arg(&bpffs).status();
    let reports = result?;
    println!("\nsystemd: shed.service under systemd 252 in Debian {SUITE}, through a reboot: ok");
    for r in &reports {
        println!("{r}");
    }
    Ok(())
}

/// Runs one command in the root without booting it (dpkg, systemctl enable).
fn nspawn(root: &Path, args: &[&str]) -> Result<()> {
    run(Command::new("systemd-nspawn").args(["-q", "--register=no", "--keep-unit", "-D"]).arg(root).args(args))
}

/// A booted container: its nspawn process and the container's PID 1.
struct Machine {
    nspawn: Child,
    init: u32,
}

impl Machine {
    fn boot(root: &Path, bpffs: &Path, log: &Path) -> Result<Self> {
        let log = fs::File::create(log)?;
        let nspawn = Command::new("systemd-nspawn")
            .args(["-q", "-b", "--register=no", "--keep-unit", "--private-network", "--capability=all"])
            // nspawn's seccomp filter refuses bpf(2) to what the container's
            // systemd starts (EPERM at the first map), as a host's does not.
            .arg("--system-call-filter=bpf perf_event_open")
            .arg(format!("--bind={}:/sys/fs/bpf", bpffs.display()))
            .arg("-D")
            .arg(root)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("run systemd-nspawn")?;
        let start = Instant::now();
        // The container's PID 1 is nspawn's child.
        let init = loop {
            let children =
                fs::read_to_string(format!("/proc/{}/task/{}/children", nspawn.id(), nspawn.id())).unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse().ok()) {
                break pid;
            }
            ensure!(start.elapsed() < BOOT_LIMIT, "systemd-nspawn started no container");
            std::thread::sleep(Duration::from_millis(100));
        };
        Ok(Self { nspawn, init })
    }

    /// A command inside the running container: its stdout, or why it failed.
    fn exec(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("nsenter")
            .args(["-t", &self.init.to_string(), "-a"])
            .args(args)
            .output()
            .context("run nsenter")?;
        if !out.status.success() {
            bail!(
                "{} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn check(&self, boot: &str) -> Result<String> {
        let start = Instant::now();
        // `Type=notify`: active only after READY=1 (every port attached and judging).
        loop {
            let state = self.exec(&["systemctl", "is-active", "shed.service"]).unwrap_or_else(|e| e.to_string());
            if state.trim() == "active" {
                break;
            }
            if state.trim() == "failed" || start.elapsed() > BOOT_LIMIT {
                let journal = self.exec(&["journalctl", "-b", "-u", "shed.service", "--no-pager"]).unwrap_or_default();
                bail!("{boot}: shed.service is {}:\n{journal}", state.trim());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let active_after = start.elapsed();
        let show =
            self.exec(&["systemctl", "show", "shed.service", "-p", "Type,WatchdogUSec,NRestarts,ExecMainStatus"])?;
        ensure!(show.contains("Type=notify") && show.contains("NRestarts=0"), "{boot}: {show}");
        let runtime = self.exec(&["stat", "-c", "%U %a", "/run/shed"])?;
        // Judging: a connection from loopback (exempt in the shipped config) is seen.
        let stats = |what: &str| -> Result<u64> {
            let json = self.exec(&["shedctl", "stats", "--json"])?;
            let ports: serde_json::Value = serde_json::from_str(&json).with_context(|| format!("stats: {json}"))?;
            let port = ports.as_array().and_then(|p| p.iter().find(|p| p["port"] == 8080));
            port.and_then(|p| p[what].as_u64()).with_context(|| format!("{boot}: port 8080's {what} in {json}"))
        };
        let seen = stats("syn_seen")?;
        let _ = self.exec(&["curl", "-s", "--max-time", "2", "http://127.0.0.1:8080/"]);
        let seen_after = stats("syn_seen")?;
        ensure!(
            seen_after == seen + 1,
            "{boot}: a connection to 8080 was not seen by the gate ({seen} -> {seen_after})"
        );
        let ready =
            self.exec(&["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9464/readyz"])?;
        ensure!(ready.trim() == "200", "{boot}: /readyz answered {ready}");
        let security = self.exec(&["systemd-analyze", "security", "shed.service", "--no-pager"]).map_or_else(
            |e| format!("(systemd-analyze security: {e})"),
            |s| s.lines().last().unwrap_or_default().trim().to_owned(),
        );
        Ok(format!(
            "- {boot}: active {:.1} s after boot; {}; /run/shed {}; port 8080 judged (syn_seen {seen} -> {seen_after}), /readyz 200; {security}",
            active_after.as_secs_f64(),
            show.split_whitespace().collect::<Vec<_>>().join(", "),
            runtime.trim(),
        ))
    }

    fn power_off(mut self) {
        let _ = self.exec(&["systemctl", "poweroff"]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}
