// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl config save`: writes the running gate's live settings (after any
//! `set` and `tier` changes) back to a config file, keeping the file's keys
//! the maps do not hold (interfaces, hook, namespace, metrics, ...). A config
//! file gives every port the same settings, so ports that differ are refused.
use std::{collections::BTreeMap, path::Path};

use anyhow::Context as _;
use shed_common::{ControlConfig, PortConfig, tier};
use toml::{Table, Value};

use crate::named::Named as _;
use crate::{
    cli::config,
    control::Algo,
    daemon,
    host::system::{self, Need},
    kernel::maps::{GateMaps, PortSnapshot},
    kernel::options::{Action, Count},
};

/// The settings a config file holds for every port: a port's config and
/// controller with their per-port parts (slot, generation, requests) cleared.
fn shared(config: &PortConfig, control: &ControlConfig) -> (PortConfig, ControlConfig) {
    let mut config = *config;
    config.slot = 0;
    config.tiered = 0;
    let mut control = *control;
    control.generation = 0;
    control.requested_limit = 0;
    (config, control)
}

pub fn execute(file: &Path, netns: Option<&str>) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    let maps = match netns {
        None => GateMaps::open_pinned()?,
        Some(_) => GateMaps::open_gates(netns)?.remove(0).maps,
    };
    let snapshots = maps.snapshots(None)?;
    let Some(first) = snapshots.first() else { anyhow::bail!("the running gate protects no port: nothing to save") };
    let (port_config, control) = agreed_settings(&snapshots)?;
    if port_config.share_permille != tier::DEFAULT_SHARE_PERMILLE
        || port_config.tier_action != [tier::ACTION_DEFAULT; tier::COUNT]
    {
        eprintln!(
            "note: tier shares and per-tier actions are not config keys; they are not saved (set them again after a restart)"
        );
    }
    let mut table: Table = match std::fs::read_to_string(file) {
        Ok(text) => text.parse().with_context(|| format!("{}: not a TOML file", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::new(),
        Err(e) => return Err(e).with_context(|| format!("read {}", file.display())),
    };
    let ports = snapshots.iter().map(|s| Value::Integer(s.port.into())).collect();
    table.insert("ports".into(), Value::Array(ports));
    // The namespaces the gate judges, so a new file attaches where this gate
    // does (a file's own `netns` is kept). Named ones only: a gate given a
    // path (/proc/PID/ns/net) has a label no file can name again.
    if !table.contains_key("netns") {
        let named = gated_namespaces()?;
        if !named.is_empty() {
            table.insert("netns".into(), Value::Array(named.into_iter().map(Value::String).collect()));
        }
    }
    port_keys(&mut table, &port_config);
    limiter_keys(&mut table, &control, first.limit);
    if table.remove("tier-file").is_some() {
        eprintln!("note: `tier-file` replaced by the live tiers, written as [tiers]");
    }
    let tiers: BTreeMap<String, Value> = maps
        .tier_entries()?
        .into_iter()
        .map(|(cidr, t)| (cidr.to_string(), Value::String(crate::kernel::options::tier_name(t).into())))
        .collect();
    if tiers.is_empty() {
        table.remove("tiers");
    } else {
        table.insert("tiers".into(), Value::Table(tiers.into_iter().collect()));
    }
    let out = format!(
        "# Written by `shedctl config save` from the running gate (keys it does not hold kept from this file).\n{}",
        toml::to_string(&table)?
    );
    write_checked(file, &out)?;
    println!("saved the live settings of {} port(s) to {}", snapshots.len(), file.display());
    Ok(())
}

/// The settings every port shares, or why they cannot be saved as one file's.
fn agreed_settings(snapshots: &[PortSnapshot]) -> anyhow::Result<(PortConfig, ControlConfig)> {
    let first = &snapshots[0];
    let settings = shared(&first.config, &first.control);
    for s in &snapshots[1..] {
        if shared(&s.config, &s.control) != settings {
            anyhow::bail!(
                "ports {} and {} have different settings, and a config file gives every port the same: make them agree with `shedctl set` first; nothing written",
                first.port,
                s.port
            );
        }
    }
    Ok(settings)
}

/// The keys of how every port is judged, from the gate's config.
fn port_keys(table: &mut Table, port_config: &PortConfig) {
    let int = |n: u64| Value::Integer(n as i64);
    let text = |s: String| Value::String(s);
    table.insert("action".into(), text(Action::from_raw(port_config.action).to_string()));
    table.insert("dry-run".into(), Value::Boolean(port_config.dry_run != 0));
    table.insert("count".into(), text(Count::from_raw(port_config.count_mode).name().into()));
    table.insert("client-cap".into(), int(port_config.client_cap.into()));
    table.insert("client-share".into(), int(port_config.client_share.into()));
    table.insert("client-prefix-v6".into(), int(port_config.client_prefix_v6.into()));
    table.insert("rst-rate".into(), int(port_config.rst_per_sec.into()));
    table.insert("rst-prefix-rate".into(), int(port_config.rst_per_prefix_per_sec.into()));
    table.insert("retry-after".into(), int(port_config.retry_after_s.into()));
}

/// The limiter's keys, from the gate's controller settings and its limit now.
fn limiter_keys(table: &mut Table, control: &ControlConfig, limit: u32) {
    let int = |n: u64| Value::Integer(n as i64);
    let algo = Algo::from_raw(control.algo);
    if algo == Algo::Fixed {
        table.remove("algo");
        table.remove("initial-limit");
        table.insert("limit".into(), int(limit.into()));
    } else {
        table.remove("limit");
        table.insert("algo".into(), Value::String(algo.to_string()));
        table.insert("initial-limit".into(), int(limit.clamp(control.min_limit, control.max_limit).into()));
        table.insert("min-limit".into(), int(control.min_limit.into()));
        table.insert("max-limit".into(), int(control.max_limit.into()));
    }
    table.insert("window".into(), int(control.window_ms.into()));
    table.insert("percentile".into(), int(control.percentile.into()));
    table.insert("min-samples".into(), int(control.min_samples.into()));
    table.insert("cooldown".into(), int(control.cooldown_windows.into()));
    table.insert("baseline-span".into(), int(control.baseline_windows.into()));
    table.insert("probe-windows".into(), int(control.probe_windows.into()));
    if control.queue_target_us != 0 {
        table.insert("queue-target".into(), int(u64::from(control.queue_target_us / 1000).max(1)));
    }
    match control.target_latency_ms {
        0 => table.remove("target-latency"),
        ms => table.insert("target-latency".into(), int(ms.into())),
    };
}

/// Writes `out` to `file` only if `attach` accepts it, and whole or not at all.
fn write_checked(file: &Path, out: &str) -> anyhow::Result<()> {
    let args = config::file_args(file, out, &|_| false)?;
    let cli = config::parse_cli(["shedctl", "attach"].into_iter().map(std::ffi::OsString::from).chain(args))?;
    if let crate::cli::Command::Attach(args) = cli.command {
        args.control().map_err(anyhow::Error::msg)?;
    }
    let temp = file.with_extension("toml.new");
    std::fs::write(&temp, out).with_context(|| format!("write {}", temp.display()))?;
    std::fs::rename(&temp, file).with_context(|| format!("replace {}", file.display()))?;
    Ok(())
}

/// The network namespaces the running daemon gates by name (`ip netns`'s),
/// not its own nor a pod's.
fn gated_namespaces() -> anyhow::Result<Vec<String>> {
    let gates = GateMaps::open_gates(None)?;
    Ok(gates
        .into_iter()
        .filter(|g| g.pod.is_none() && g.netns != crate::host::paths::OWN_NETNS_LABEL)
        .map(|g| g.netns)
        .filter(|label| Path::new("/run/netns").join(label).exists())
        .collect())
}
