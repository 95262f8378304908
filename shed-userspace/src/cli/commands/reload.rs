// SPDX-License-Identifier: MIT OR Apache-2.0
//! SIGHUP: `attach` re-reads its config file (merged under the same command
//! line, as at start) and applies what can change live: every port's action,
//! dry-run, count, client cap, RST caps and limiter settings, and the client
//! tiers. Settings that only a restart can change (ports, interfaces, hook,
//! namespace, endpoint, map sizes, NAT allowance, pod mode, ...) are named in a warning. A file that
//! does not pass every check changes nothing.
use std::{collections::BTreeMap, ffi::OsString};

use crate::{
    cli::config,
    cli::{AttachArgs, Command},
    control::Algo,
    daemon::Reloader,
    host::paths,
    kernel::maps::GateMaps,
};

/// What a reload can only warn about: the settings that take a restart.
fn restart_only(args: &AttachArgs) -> BTreeMap<&'static str, String> {
    let mut ports = args.ports.clone();
    ports.sort_unstable();
    ports.dedup();
    BTreeMap::from([
        ("ports", format!("{ports:?}")),
        ("ifaces", format!("{:?}", args.ifaces)),
        ("hook", format!("{:?}", args.hook)),
        ("xdp-mode", format!("{:?}", args.xdp_mode)),
        ("netns", format!("{:?}", args.netns)),
        ("metrics", format!("{:?}", args.metrics)),
        ("metrics-token-file", format!("{:?}", args.metrics_token_file)),
        ("agent-port", format!("{:?}", args.agent_port)),
        ("handshake-window", format!("{:?}", args.handshake_window)),
        ("heal-interval", format!("{:?}", args.heal_interval)),
        ("max-connections", args.max_connections.to_string()),
        ("max-clients", args.max_clients.to_string()),
        ("memory-budget", args.memory_budget.to_string()),
        ("kernel-log", args.kernel_log.to_string()),
        ("ready-max-shed", args.ready_max_shed.to_string()),
        ("ready-window", format!("{:?}", args.ready_window)),
        ("allow-nat", args.allow_nat.to_string()),
        ("pods", args.pods.to_string()),
        ("cri-socket", args.cri_socket.display().to_string()),
        ("pod-max-connections", args.pod_max_connections.to_string()),
        ("pod-max-clients", args.pod_max_clients.to_string()),
        ("no-expedite-rcu", args.no_expedite_rcu.to_string()),
    ])
}

/// The config keys a reload applies to the running gate (see [`reload`]);
/// every other key is in [`restart_only`], so that no change is ignored unsaid.
#[cfg(test)]
const APPLIED_LIVE: &[&str] = &[
    "action",
    "limit",
    "algo",
    "initial-limit",
    "min-limit",
    "max-limit",
    "window",
    "percentile",
    "count",
    "min-samples",
    "cooldown",
    "baseline-span",
    "probe-windows",
    "queue-target",
    "target-latency",
    "tiers",
    "tier-file",
    "client-cap",
    "client-share",
    "client-prefix-v6",
    "rst-rate",
    "rst-prefix-rate",
    "retry-after",
    "dry-run",
];

/// Refuses a file that someone other than root could have written: a tier file
/// that anyone can edit (`0.0.0.0/0 = "exempt"`) would turn the gate off.
fn trusted(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    trusted_mode(meta.uid(), meta.gid(), meta.mode()).map_err(|why| {
        anyhow::anyhow!(
            "{} {why}: only root may write the files a reload reads (chown root: and chmod go-w it)",
            path.display()
        )
    })
}

fn trusted_mode(uid: u32, gid: u32, mode: u32) -> Result<(), &'static str> {
    if uid != 0 {
        return Err("is not owned by root");
    }
    if mode & 0o002 != 0 {
        return Err("is writable by others");
    }
    if mode & 0o020 != 0 && gid != 0 {
        return Err("is writable by a group other than root's");
    }
    Ok(())
}

/// With a config file: what makes each gate's SIGHUP reloader, re-reading
/// attach's own command line (`argv`) against what it started with.
pub(crate) fn reloader(args: &AttachArgs) -> Option<Box<dyn Fn() -> Reloader + Send + Sync>> {
    args.config.as_ref()?;
    let argv: Vec<OsString> = std::env::args_os().collect();
    let running = args.clone();
    Some(Box::new(move || {
        let (argv, running) = (argv.clone(), running.clone());
        Box::new(move |maps: &mut GateMaps| reload(maps, &argv, &running).map_err(|e| format!("{e:#}"))) as Reloader
    }))
}

/// Re-reads the config under `argv` (attach's own command line) and applies
/// it; `running` is what the gate started with. Returns the settings that
/// changed but take a restart.
pub fn reload(maps: &mut GateMaps, argv: &[OsString], running: &AttachArgs) -> anyhow::Result<Vec<&'static str>> {
    // The files decide who may pass the gate: only root may have written them.
    if let Some(file) = &running.config {
        trusted(file)?;
    }
    let cli = config::parse_cli(argv.iter().cloned())?;
    let Command::Attach(args) = cli.command else { anyhow::bail!("not an attach command line") };
    if let Some(file) = &args.tier_file {
        trusted(file)?;
    }
    let _lock = crate::daemon::ConfigLock::take()?;
    let (spec, tiers) = args.plan()?;
    let (before, after) = (restart_only(running), restart_only(&args));
    let restart: Vec<&'static str> =
        after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| *k).collect();

    // Every check passed: from here on only writes, attributed in the daemon's audit line.
    let _ = std::fs::write(
        paths::REQUEST_NOTE,
        format!(
            "SIGHUP: reload of {}",
            args.config.as_ref().map_or("the command line".into(), |c| c.display().to_string())
        ),
    );
    for (port, mut port_config) in maps.port_configs()? {
        port_config.action = spec.action;
        port_config.dry_run = u8::from(spec.dry_run);
        port_config.count_mode = spec.count_mode;
        port_config.client_cap = spec.client_cap;
        port_config.client_share = spec.client_share;
        port_config.client_prefix_v6 = spec.client_prefix_v6;
        port_config.rst_per_sec = spec.rst_per_sec;
        port_config.rst_per_prefix_per_sec = spec.rst_per_prefix_per_sec;
        port_config.retry_after_s = spec.retry_after_s;
        maps.write_config(port, port_config)?;
        let current = maps.control(port_config.slot)?;
        let mut control = spec.control;
        control.generation = current.generation;
        control.requested_limit = current.requested_limit;
        let fixed = Algo::from_raw(control.algo) == Algo::Fixed;
        let limit_now = maps.snapshot(port, port_config)?.limit;
        if control != current || (fixed && limit_now != spec.limit) {
            // A fixed limit, or a new limiter, starts from the file's limit.
            let restart_limit = fixed || control.algo != current.algo;
            control.requested_limit = if restart_limit { spec.limit } else { 0 };
            control.generation = current.generation.wrapping_add(1);
            maps.write_control(port_config.slot, control)?;
            if restart_limit {
                maps.set_limit(port_config.slot, spec.limit)?;
            }
        }
    }
    let live = maps.tier_entries()?;
    for cidr in live.keys().filter(|c| !tiers.contains_key(c)) {
        maps.remove_tier(*cidr)?;
    }
    for (&cidr, &tier) in tiers.iter().filter(|(c, t)| live.get(c) != Some(t)) {
        maps.set_tier(cidr, tier)?;
    }
    Ok(restart)
}

#[cfg(test)]
mod tests {
    /// A reload applies each key or names it as taking a restart: none is
    /// left out (a new config key must be placed in one or the other).
    #[test]
    fn every_config_key_is_applied_or_named_for_a_restart() {
        let Ok(crate::cli::Cli { command: crate::cli::Command::Attach(args), .. }) =
            crate::cli::config::parse_cli(["shedctl", "attach", "--port", "8080"])
        else {
            panic!("attach parses")
        };
        let restart = super::restart_only(&args);
        for key in crate::cli::config::keys() {
            let live = super::APPLIED_LIVE.contains(&key);
            assert!(
                live != restart.contains_key(key),
                "config key `{key}`: applied live {live}, named for a restart {}",
                restart.contains_key(key)
            );
        }
    }

    #[test]
    fn only_root_may_write_a_reloaded_file() {
        use super::trusted_mode;
        assert_eq!(trusted_mode(0, 0, 0o100_644), Ok(()));
        assert_eq!(trusted_mode(0, 0, 0o100_664), Ok(()), "root's own group may write");
        assert_eq!(trusted_mode(1000, 0, 0o100_644), Err("is not owned by root"));
        assert_eq!(trusted_mode(0, 0, 0o100_646), Err("is writable by others"));
        assert_eq!(trusted_mode(0, 50, 0o100_664), Err("is writable by a group other than root's"));
    }
}
