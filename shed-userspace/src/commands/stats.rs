//! `shedctl stats`: read the pinned maps of the running gate.
use std::{io::Write as _, thread, time::Instant};

use crate::{
    cli::StatsArgs,
    daemon,
    maps::GateMaps,
    stats::ClientStats,
    stats::PortStats,
    system::{self, Need},
    table,
};

pub fn execute(args: StatsArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    let maps = GateMaps::open_pinned()?;
    let mut before = maps.snapshots(args.port)?;
    let mut taken = Instant::now();
    loop {
        thread::sleep(args.interval);
        let now = maps.snapshots(args.port)?;
        let elapsed = taken.elapsed();
        taken = Instant::now();
        let mut stats: Vec<PortStats> = now
            .iter()
            .map(|n| PortStats::new(n, before.iter().find(|b| b.port == n.port).map(|b| (b, elapsed))))
            .collect();
        for (s, n) in stats.iter_mut().zip(&now) {
            if n.config.client_cap != 0 {
                s.top_clients = maps
                    .client_counts(n.config.slot)?
                    .into_iter()
                    .filter(|(_, held)| *held > 0)
                    .take(10)
                    .map(|(k, held)| ClientStats { client: client_name(&k.addr), in_flight: held })
                    .collect();
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
        if daemon::require_running().is_err() {
            anyhow::bail!("the gate stopped");
        }
        before = now;
    }
}

/// An address (IPv4-mapped shown as IPv4) for output.
fn client_name(addr: &[u8; 16]) -> String {
    let v6 = std::net::Ipv6Addr::from(*addr);
    v6.to_ipv4_mapped().map_or_else(|| v6.to_string(), |v4| v4.to_string())
}
