// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl detach`: stop gating one port, or stop the gate.
use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::bail;

use crate::{
    cli::DetachArgs,
    daemon::{self, Liveness},
    error::Error,
    host::paths,
    host::system::{self, Need},
    kernel::maps::{self, GateMaps},
};

pub fn execute(args: DetachArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    let pid = match daemon::liveness() {
        Liveness::Running { pid } => pid,
        Liveness::Stale { pid } => {
            maps::remove_pins(Path::new(paths::PIN_DIR))?;
            println!("no daemon was running (pid {pid} is gone); removed its stale pins from {}", paths::PIN_DIR);
            return Ok(());
        }
        Liveness::Absent => return Err(Error::NoGate { pin_dir: paths::PIN_DIR.into() }.into()),
    };

    if let Some(port) = args.port {
        // The port table packs eight ports a word: a reload writing a neighbour meanwhile would undo this.
        let lock = daemon::ConfigLock::take()?;
        let gates = GateMaps::open_gates(args.netns.as_deref())?;
        let several = gates.len() > 1;
        let mut gates = maps::protecting(gates, port)?;
        crate::daemon::audit::note_request();
        for gate in &mut gates {
            gate.maps.unprotect(port)?;
        }
        drop(lock);
        let still = match GateMaps::open_gates(None) {
            Ok(gates) => gates,
            Err(Error::NoGate { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let left: Vec<String> = still
            .iter()
            .filter_map(|g| {
                let ports = g.maps.port_list().ok().filter(|p| p != "none")?;
                Some(if g.netns == paths::OWN_NETNS_LABEL { ports } else { format!("{ports} (netns {})", g.netns) })
            })
            .collect();
        let netns: Vec<&str> = gates.iter().map(|g| g.netns.as_str()).collect();
        let what = if several { format!("port {port} (netns {})", netns.join(", ")) } else { format!("port {port}") };
        if !left.is_empty() {
            println!("{what} is no longer gated; the gate keeps running for ports {}", left.join("; "));
            return Ok(());
        }
        // The daemon stops by itself once no port is left.
        wait_for_exit(&pid, args.timeout)?;
        println!("{what} was the last gated port: the gate (pid {pid}) stopped");
        return Ok(());
    }

    let Ok(pid_num) = pid.parse::<libc::pid_t>() else {
        bail!("the gate's pid file ({}) holds {pid:?}, not a pid: stop the daemon by hand", paths::PID_FILE);
    };
    // SAFETY: plain signal send.
    if unsafe { libc::kill(pid_num, libc::SIGTERM) } != 0 {
        bail!("could not signal the gate (pid {pid}): {}", std::io::Error::last_os_error());
    }
    wait_for_exit(&pid, args.timeout)?;
    println!("gate stopped (pid {pid}); nothing is attached or pinned");
    Ok(())
}

fn wait_for_exit(pid: &str, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if !matches!(daemon::liveness(), Liveness::Running { .. }) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    bail!("the gate (pid {pid}) did not stop within {} ms; check its log", timeout.as_millis())
}
