// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl tier add|rm|ls`: client tiers of the running gate.
use crate::{
    cli::TierCommand,
    daemon,
    error::Error,
    host::system::{self, Need},
    kernel::maps::GateMaps,
    kernel::options::tier_name,
};

#[derive(serde::Serialize)]
struct TierRow {
    cidr: String,
    tier: &'static str,
}

pub fn execute(command: TierCommand) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    // Client tiers are the daemon's, the same in every namespace it gates:
    // a change goes to each namespace's gate, and the first one answers.
    // Read-modify-write of port configs (tier judging on or off): one change at a time.
    let _lock = daemon::ConfigLock::take()?;
    let mut gates = GateMaps::open_gates(None)?;
    let maps = &gates[0].maps;
    if !matches!(command, TierCommand::Ls { .. }) {
        crate::daemon::audit::note_request();
    }
    match command {
        TierCommand::Add { cidr, tier } => {
            let before = maps.tier_entries()?;
            for gate in &mut gates {
                gate.maps.set_tier(cidr, tier)?;
            }
            match before.get(&cidr) {
                Some(&old) if old == tier => println!("{cidr} was already {}", tier_name(tier)),
                Some(&old) => println!("{cidr} is now {} (was {})", tier_name(tier), tier_name(old)),
                None => println!("{cidr} is now {}", tier_name(tier)),
            }
            if before.is_empty() {
                // Shares apply only while some client has a tier: say so when that starts.
                println!(
                    "the first client tier: tier shares now apply on every protected port (every other source is normal; see `shedctl stats`, change them with `shedctl set --share`)"
                );
            }
        }
        TierCommand::Rm { cidr } => {
            if !maps.tier_entries()?.contains_key(&cidr) {
                return Err(Error::TierNotFound { cidr: cidr.to_string() }.into());
            }
            for gate in &mut gates {
                gate.maps.remove_tier(cidr)?;
            }
            println!("{cidr} no longer has a tier of its own");
        }
        TierCommand::Ls { json } => {
            let rows: Vec<TierRow> = maps
                .tier_entries()?
                .into_iter()
                .map(|(c, t)| TierRow { cidr: c.to_string(), tier: tier_name(t) })
                .collect();
            if json {
                println!("{}", serde_json::to_string(&rows)?);
            } else if rows.is_empty() {
                println!("no client tiers: every source is normal");
            } else {
                println!("{:<45}  TIER", "CIDR");
                for r in rows {
                    println!("{:<45}  {}", r.cidr, r.tier);
                }
            }
        }
    }
    Ok(())
}
