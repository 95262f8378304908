// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl set`: change a protected port's settings live.
use shed_common::{ControlConfig, PortConfig};

use crate::named::Named as _;
use crate::{
    cli::SetArgs,
    control::Algo,
    daemon,
    host::{
        paths,
        system::{self, Need},
    },
    kernel::maps::GateMaps,
    kernel::options::{Action, Count},
    observe::stats::PortStats,
};

pub fn execute(args: SetArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    // Read-modify-write of port configs: one control-plane change at a time.
    let _lock = daemon::ConfigLock::take()?;
    let Some(port) = args.port else { return dry_run_everywhere(&args) };
    let gates = GateMaps::open_gates(crate::cli::chosen_netns(args.netns.clone(), args.pod.as_deref())?.as_deref())?;
    let several = gates.len() > 1;
    // The port in every chosen namespace that protects it; checked in each
    // before any is written, so a refusal changes nothing anywhere.
    let mut gates = crate::kernel::maps::protecting(gates, port)?;
    let mut plans = Vec::new();
    for gate in &gates {
        plans.push(plan(&gate.maps, &args, port, gate.maps.config(port)?)?);
    }
    // Every check is done: from here on only writes (the daemon logs each with who asked).
    crate::daemon::audit::note_request();
    let mut changed = Vec::new();
    for (gate, plan) in gates.iter_mut().zip(plans) {
        write(&mut gate.maps, &args, &plan)?;
        if args.json {
            // Read back: what the gate now holds, not what was asked.
            for snapshot in gate.maps.snapshots(Some(port))? {
                let mut stats = PortStats::new(&snapshot, None);
                stats.netns.clone_from(&gate.netns);
                stats.pod.clone_from(&gate.pod);
                changed.push(stats);
            }
            continue;
        }
        let netns = match &gate.pod {
            Some(pod) if several => format!("pod {pod}: "),
            _ if several => format!("netns {}: ", gate.netns),
            _ => String::new(),
        };
        println!("{netns}{}", plan.summary(&args));
    }
    if args.json {
        println!("{}", serde_json::to_string(&changed)?);
    }
    Ok(())
}

/// What `set` writes for one namespace's port.
struct Plan {
    port: u16,
    config: PortConfig,
    control: ControlConfig,
    min: u32,
    max: u32,
    limit: u32,
}

/// Checks the change against one port's current settings, and what it comes to.
fn plan(maps: &GateMaps, args: &SetArgs, port: u16, mut config: PortConfig) -> anyhow::Result<Plan> {
    let snapshot = maps.snapshot(port, config)?;
    let control = snapshot.control;
    let min = args.min_limit.unwrap_or(control.min_limit);
    let max = args.max_limit.unwrap_or(control.max_limit);
    // A change refused for its flags is a usage error (exit 2), as attach's.
    let usage = |reason: String| crate::error::Error::InvalidPlan { reason };
    if min > max {
        return Err(usage(format!("--min-limit {min} would be above --max-limit {max}: nothing changed")).into());
    }
    let count = args.count.unwrap_or(Count::from_raw(config.count_mode));
    let algo = args.algo.unwrap_or(Algo::from_raw(control.algo));
    crate::cli::check_count_algo(count, algo).map_err(|e| usage(format!("{e}: nothing changed")))?;
    // What `attach` refuses, `set` refuses: an adaptive limiter starts within its bounds.
    if let Some(limit) = args.limit
        && algo != Algo::Fixed
        && !(min..=max).contains(&limit)
    {
        return Err(usage(format!(
            "--limit {limit} is outside --min-limit {min} .. --max-limit {max} of {algo}: give a limit within them, or move the bounds in the same command: nothing changed"
        ))
        .into());
    }
    if let Some(action) = args.action {
        config.action = action.to_raw();
    }
    if let Some(dry_run) = args.dry_run.map(|s| s.0).or(args.no_dry_run.then_some(false)) {
        config.dry_run = u8::from(dry_run);
    }
    if let Some(count) = args.count {
        config.count_mode = count.to_raw();
    }
    if let Some(cap) = args.client_cap {
        config.client_cap = cap;
    }
    if let Some(share) = args.client_share {
        config.client_share = share;
    }
    for &(tier, permille) in &args.shares {
        config.share_permille[tier as usize] = permille;
    }
    for &(tier, action) in &args.tier_actions {
        config.tier_action[tier as usize] = action.to_raw();
    }
    if let Some(seconds) = args.retry_after {
        config.retry_after_s = seconds;
    }
    if config.answers_http() {
        crate::cli::input::http_port(port)
            .and_then(|()| crate::cli::input::http_count(Count::from_raw(config.count_mode)))
            .map_err(|e| anyhow::anyhow!("{e}: nothing changed"))?;
    }
    Ok(Plan { port, config, control, min, max, limit: args.limit.unwrap_or(snapshot.limit) })
}

fn write(maps: &mut GateMaps, args: &SetArgs, plan: &Plan) -> anyhow::Result<()> {
    let config = plan.config;
    // One map write: the kernel sees the old or the new config, never a mix.
    maps.write_config(plan.port, config)?;
    if let Some(limit) = args.limit {
        // Straight into the gate's map, so the next SYN sees it; the controller continues from it.
        maps.set_limit(config.slot, limit)?;
    }
    if args.limit.is_some() || args.algo.is_some() || args.min_limit.is_some() || args.max_limit.is_some() {
        let mut control = plan.control;
        if let Some(algo) = args.algo {
            control.algo = algo.to_raw();
        }
        control.min_limit = plan.min;
        control.max_limit = plan.max;
        control.requested_limit = args.limit.unwrap_or(0);
        control.generation = control.generation.wrapping_add(1);
        maps.write_control(config.slot, control)?;
    }
    Ok(())
}

impl Plan {
    fn summary(&self, args: &SetArgs) -> String {
        let config = &self.config;
        let algo = args.algo.unwrap_or(Algo::from_raw(self.control.algo));
        let shares: Vec<String> = (1..shed_common::tier::COUNT)
            .map(|t| {
                format!(
                    "{}={}",
                    crate::kernel::options::tier_name(t as u8),
                    f64::from(config.share_permille[t]) / 1000.0
                )
            })
            .collect();
        format!(
            "port {}: limit {} ({algo} {}..{}), action {}, count {}, dry-run {}, shares {}, client cap {}, client share {}",
            self.port,
            self.limit,
            self.min,
            self.max,
            Action::from_raw(config.action),
            Count::from_raw(config.count_mode).name(),
            if config.dry_run != 0 { "on" } else { "off" },
            shares.join(" "),
            if config.client_cap == 0 { "none".to_owned() } else { config.client_cap.to_string() },
            if config.client_share == 0 { "none".to_owned() } else { format!("{}%", config.client_share) }
        )
    }
}

/// `set --all --dry-run[=on|off]`: every port of every gate (pods included)
/// in dry-run, or out of it, at once; while it is on, a gate or port that
/// starts starts in dry-run too (the daemon reads [`paths::DRY_RUN_ALL`]).
fn dry_run_everywhere(args: &SetArgs) -> anyhow::Result<()> {
    let on = args.dry_run.map(|s| s.0).or(args.no_dry_run.then_some(false)).ok_or_else(|| {
        crate::error::Error::InvalidPlan { reason: "--all takes --dry-run (on) or --dry-run=off only".into() }
    })?;
    crate::daemon::audit::note_request();
    // The mark first: a gate that starts meanwhile reads it.
    if on {
        std::fs::create_dir_all(paths::RUN_DIR)
            .and_then(|()| std::fs::write(paths::DRY_RUN_ALL, "on\n"))
            .map_err(|e| crate::error::Error::io("write", paths::DRY_RUN_ALL, e))?;
    } else {
        match std::fs::remove_file(paths::DRY_RUN_ALL) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(crate::error::Error::io("remove", paths::DRY_RUN_ALL, e).into());
            }
            _ => {}
        }
    }
    let mut changed = Vec::new();
    for mut gate in GateMaps::open_gates(None)? {
        for (port, mut config) in gate.maps.port_configs()? {
            config.dry_run = u8::from(on);
            gate.maps.write_config(port, config)?;
            changed.push(match &gate.pod {
                Some(pod) => format!("{port} (pod {pod})"),
                None if gate.netns == paths::OWN_NETNS_LABEL => port.to_string(),
                None => format!("{port} (netns {})", gate.netns),
            });
        }
    }
    println!(
        "dry-run {} on every gated port: {}{}",
        if on { "on" } else { "off" },
        if changed.is_empty() { "none".to_owned() } else { changed.join(", ") },
        if on { "; gates that start now start in dry-run too, until `shedctl set --all --dry-run=off`" } else { "" }
    );
    Ok(())
}
