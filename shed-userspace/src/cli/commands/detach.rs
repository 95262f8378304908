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
    kernel::{
        handover,
        maps::{self, GateMaps},
    },
};

pub fn execute(args: DetachArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    let pid = match daemon::liveness() {
        Liveness::Running { pid } => pid,
        Liveness::Stale { pid } => {
            maps::remove_pins(Path::new(paths::PIN_DIR))?;
            println!("no daemon was running (pid {pid} is gone); removed its stale pins from {}", paths::PIN_DIR);
            if args.now {
                remove_left_links();
            } else {
                say_left_links();
            }
            return Ok(());
        }
        Liveness::Absent if args.now && !handover::left().is_empty() => {
            // No daemon, but a stopped agent's links still judge its pods.
            remove_left_links();
            return Ok(());
        }
        Liveness::Absent => return Err(Error::NoGate { pin_dir: paths::PIN_DIR.into() }.into()),
    };

    // One pod of a node agent: every port of its gate, as `--port P --netns LABEL` each.
    let (port, netns) = match &args.pod {
        Some(pod) => {
            let label = crate::cli::chosen_netns(None, Some(pod))?.expect("a pod's label");
            let gates = GateMaps::open_gates(Some(&label))?;
            let ports: Vec<u16> = gates
                .iter()
                .flat_map(|g| g.maps.port_configs().map(|c| c.into_keys().collect::<Vec<_>>()).unwrap_or_default())
                .collect();
            let lock = daemon::ConfigLock::take()?;
            crate::daemon::audit::note_request();
            let mut gates = gates;
            for gate in &mut gates {
                for &p in &ports {
                    gate.maps.unprotect(p)?;
                }
            }
            drop(lock);
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            println!(
                "pod {pod} is no longer gated (ports {}); it stays ungated until the agent restarts",
                ports.join(", ")
            );
            return Ok(());
        }
        None => (args.port, args.netns.clone()),
    };

    if let Some(port) = port {
        // The port table packs eight ports a word: a reload writing a neighbour meanwhile would undo this.
        let lock = daemon::ConfigLock::take()?;
        let gates = GateMaps::open_gates(netns.as_deref())?;
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
    // SIGTERM: a node agent leaves its pods judged for the next agent (a
    // restart, a rolling update). SIGINT (--now): everything goes, no handover.
    let signal = if args.now { libc::SIGINT } else { libc::SIGTERM };
    // SAFETY: plain signal send.
    if unsafe { libc::kill(pid_num, signal) } != 0 {
        bail!("could not signal the gate (pid {pid}): {}", std::io::Error::last_os_error());
    }
    wait_for_exit(&pid, args.timeout)?;
    // With the whole gate gone, an operator's global dry-run ends too.
    let _ = std::fs::remove_file(paths::DRY_RUN_ALL);
    if args.now {
        println!("gate stopped at once (pid {pid}), no handover");
        remove_left_links();
    } else {
        println!("gate stopped (pid {pid}); its pins are removed");
        say_left_links();
    }
    Ok(())
}

/// Says what a stopped node agent left judging for its successor, if anything.
fn say_left_links() {
    let left = handover::left();
    let pods: usize = left.iter().map(|(_, _, n)| n).sum();
    if left.is_empty() {
        println!("nothing is left attached or pinned");
        return;
    }
    let now = system::monotonic_ns();
    let longest = left.iter().map(|(_, until, _)| until.saturating_sub(now)).max().unwrap_or(0) / 1_000_000_000;
    println!(
        "left for the next agent: {pods} pod(s) still judged by the stopped agent's programs for up to {longest} s more (until a new agent takes them over); `shedctl detach --now` removes them at once"
    );
}

/// Removes what stopped agents left judging for a successor, and says so.
fn remove_left_links() {
    let pods = handover::remove_all();
    if pods > 0 {
        println!("removed the links a stopped agent left for its successor: {pods} pod(s) pass ungated now");
    }
    println!("nothing is left attached or pinned");
}

fn wait_for_exit(pid: &str, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        // The lock goes with the daemon's last files, a moment before the
        // process itself: "stopped" means the process is gone too.
        if !matches!(daemon::liveness(), Liveness::Running { .. }) && !process_alive(pid) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    bail!("the gate (pid {pid}) did not stop within {} ms; check its log", timeout.as_millis())
}

/// A process that still runs (a zombie, already exited and waiting to be
/// reaped by its parent, does not).
fn process_alive(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}
