//! `shedctl tier add|rm|ls`: client tiers of the running gate.
use crate::{
    Error,
    cli::TierCommand,
    daemon,
    maps::GateMaps,
    system::{self, Need},
    tiers::tier_name,
};

#[derive(serde::Serialize)]
struct TierRow {
    cidr: String,
    tier: &'static str,
}

pub fn execute(command: TierCommand) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    let mut maps = GateMaps::open_pinned()?;
    match command {
        TierCommand::Add { cidr, tier } => {
            maps.set_tier(cidr, tier)?;
            println!("{cidr} is now {}", tier_name(tier));
        }
        TierCommand::Rm { cidr } => {
            if !maps.tier_entries()?.contains_key(&cidr) {
                return Err(Error::TierNotFound { cidr: cidr.to_string() }.into());
            }
            maps.remove_tier(cidr)?;
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
