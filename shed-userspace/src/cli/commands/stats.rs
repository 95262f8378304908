// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl stats`: read the pinned maps of the running gate.
use std::{io::Write as _, thread, time::Instant};

use crate::{
    cli::StatsArgs,
    daemon,
    host::system::{self, Need},
    kernel::maps::{self, GateMaps, PortSnapshot},
    observe::stats::ClientStats,
    observe::stats::{GateState, PortStats},
    observe::table,
};

pub fn execute(args: StatsArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    let gates = judging(crate::cli::chosen_netns(args.netns, args.pod.as_deref())?.as_deref())?;
    let gates = match args.port {
        Some(port) => maps::protecting(gates, port)?,
        None => gates,
    };
    let read = || -> anyhow::Result<Vec<Vec<PortSnapshot>>> {
        gates.iter().map(|g| Ok(g.maps.snapshots(args.port)?)).collect()
    };
    let mut before = read()?;
    let mut taken = Instant::now();
    loop {
        thread::sleep(args.interval);
        let now = read()?;
        let elapsed = taken.elapsed();
        taken = Instant::now();
        let mut stats: Vec<PortStats> = Vec::new();
        for ((gate, now), before) in gates.iter().zip(&now).zip(&before) {
            for n in now {
                let mut s = PortStats::new(n, before.iter().find(|b| b.port == n.port).map(|b| (b, elapsed)));
                s.netns.clone_from(&gate.netns);
                s.pod.clone_from(&gate.pod);
                s.state = state_of(gate);
                if n.config.counts_clients() {
                    s.top_clients = gate
                        .maps
                        .client_counts(n.config.slot)?
                        .into_iter()
                        .filter(|(_, held)| *held > 0)
                        .take(10)
                        .map(|(k, held)| ClientStats { client: client_name(&k.addr), in_flight: held })
                        .collect();
                }
                stats.push(s);
            }
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&stats)?)?;
        } else {
            if args.watch {
                write!(out, "\x1b[2J\x1b[H")?;
            }
            write!(out, "{}", table::stats_table(&stats))?;
        }
        out.flush()?;
        if !args.watch {
            return Ok(());
        }
        if !still_judging() {
            anyhow::bail!("the gate stopped");
        }
        before = now;
    }
}

/// The gates `stats` and `top` read (`netns`: one namespace's): the running
/// daemon's, and a node agent's pods left judging for the next agent (shown
/// while no daemon runs too); with neither, why not (no gate, or a stale one).
pub(crate) fn judging(netns: Option<&str>) -> anyhow::Result<Vec<maps::PinnedGate>> {
    let running = daemon::require_running();
    match GateMaps::open_judging(netns, running.is_ok()) {
        Ok(gates) => Ok(gates),
        Err(e) => Err(running.err().unwrap_or(e).into()),
    }
}

/// Whether a `--watch` view has anything left to read: a daemon runs, or
/// pods are left judging for the next agent.
pub(crate) fn still_judging() -> bool {
    daemon::require_running().is_ok() || !crate::kernel::handover::handing_over().is_empty()
}

/// The state a gate's ports show.
pub(crate) fn state_of(gate: &maps::PinnedGate) -> GateState {
    if gate.handing_over { GateState::HandingOver } else { GateState::Gated }
}

/// An address (IPv4-mapped shown as IPv4) for output.
fn client_name(addr: &[u8; 16]) -> String {
    let v6 = std::net::Ipv6Addr::from(*addr);
    v6.to_ipv4_mapped().map_or_else(|| v6.to_string(), |v4| v4.to_string())
}
