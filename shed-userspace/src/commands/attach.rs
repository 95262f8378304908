//! `shedctl attach`: check everything, then load, attach, pin and run.
use std::{fs, path::Path, time::Duration};

use anyhow::Context as _;

use crate::{
    Error,
    cli::AttachArgs,
    config,
    control::Algo,
    daemon::{self, DaemonLock, FollowInterfaces, LoopSettings, PinGuard},
    gate::{Loaded, default_hook},
    input::{Action, Hook, XdpAttachMode},
    maps::{self, PortSpec},
    metrics, paths,
    system::{self, Need},
    tiers,
};

/// Longest control-loop period.
const TICK: Duration = Duration::from_millis(100);

pub fn execute(args: AttachArgs) -> anyhow::Result<()> {
    if args.print_config {
        // Only a file that `attach` accepts: the same checks first.
        args.control().map_err(anyhow::Error::msg)?;
        print!("{}", config::render(&args));
        return Ok(());
    }
    if args.ports.is_empty() {
        anyhow::bail!("no port to protect: give --port, or `ports = [8080]` in the config file");
    }
    let ports = dedup(&args.ports);
    let (spec, tiers) = plan(&args)?;
    let (control, limit) = (spec.control, spec.limit);
    if ports.len() > shed_common::capacity::MAX_PORTS as usize {
        return Err(Error::TooManyPorts { max: shed_common::capacity::MAX_PORTS }.into());
    }
    // Every check runs before anything changes, so a refusal leaves the host untouched.
    system::check_privileges(if args.netns.is_some() { Need::AttachNetns } else { Need::Attach })?;
    // Bound in the namespace shedctl starts in (the host's), even with --netns.
    let metrics_listener = args.metrics.map(metrics::bind).transpose()?;
    if let Some(netns) = &args.netns {
        // Before any thread exists: threads started later inherit the namespace.
        system::enter_netns(netns)?;
    }
    system::check_bpffs()?;
    system::check_tracefs()?;
    system::check_tracepoint_layouts()?;
    let targets = targets(&args.ifaces, args.hook)?;

    let mut lock = match DaemonLock::acquire() {
        Ok(lock) => lock,
        Err(Error::AlreadyRunning { pid, ports: running }) => {
            let protected = maps::GateMaps::open_pinned().and_then(|m| m.port_configs()).unwrap_or_default();
            if let Some(port) = ports.iter().find(|p| protected.contains_key(p)) {
                return Err(Error::PortAlreadyProtected { port: *port, pid }.into());
            }
            return Err(Error::AlreadyRunning { pid, ports: running }.into());
        }
        Err(e) => return Err(e.into()),
    };
    if Path::new(paths::PIN_DIR).exists() {
        tracing::warn!(pins = paths::PIN_DIR, "removing pins left by a daemon that exited uncleanly");
        maps::remove_pins(Path::new(paths::PIN_DIR))?;
    }

    fs::create_dir_all(paths::PIN_DIR).map_err(|e| Error::io("create pin folder", paths::PIN_DIR, e))?;
    // Root only: whoever can open the pins can retune or blind the gate.
    fs::set_permissions(paths::PIN_DIR, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| Error::io("restrict pin folder", paths::PIN_DIR, e))?;
    let _pins = PinGuard;
    let sizes = crate::object::MapSizes { connections: args.max_connections, clients: args.max_clients };
    let mut loaded = Loaded::sized(Some(Path::new(paths::PIN_DIR)), sizes).context("loading the kernel programs")?;
    for (&cidr, &tier) in &tiers {
        loaded.maps.set_tier(cidr, tier)?;
    }
    for &port in &ports {
        loaded.maps.protect(port, &spec)?;
    }
    match system::netns_filter() {
        Ok(filter) => loaded.maps.set_netns_filter(filter)?,
        Err(why) => tracing::warn!(
            "counting sockets of every network namespace ({why}): another namespace serving the same port would share the counts"
        ),
    }
    // Before any gate: only SYNs addressed to these are judged.
    let mut local_addrs = daemon::LocalAddrs::default();
    local_addrs.refresh(&mut loaded.maps)?;
    loaded.attach_accounting()?;
    for (iface, hook) in &targets {
        // Native XDP_TX on a veth is delivered only to a peer running XDP itself (generic mode
        // transmits an skb, which arrives anyway).
        let native = args.xdp_mode != XdpAttachMode::Generic;
        if *hook == Hook::Xdp
            && native
            && args.action == Action::Rst
            && system::driver(iface).as_deref() == Some("veth")
        {
            tracing::warn!(
                iface = %iface,
                "XDP on a veth with --action rst: the RSTs (XDP_TX) reach the other end only if it runs an XDP program of its own; otherwise refused clients time out instead, while rst_sent still counts them. Use --hook tc (the default on veth) or --action drop"
            );
        }
        loaded.attach_gate(iface, *hook, args.xdp_mode)?;
        match hook {
            Hook::Xdp => {
                tracing::info!(iface = %iface, hook = %hook, xdp_mode = %config::value_name(args.xdp_mode), "gate attached")
            }
            Hook::Tc => tracing::info!(iface = %iface, hook = %hook, "gate attached"),
        }
    }
    let decisions = metrics::Decisions::default();
    let heal_report = crate::heal::HealReport::default();
    let heartbeat = crate::endpoint::Heartbeat::default();
    heartbeat.beat();
    if let Some(listener) = metrics_listener {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        crate::endpoint::serve(
            listener,
            crate::endpoint::Endpoint {
                decisions: decisions.clone(),
                heal: heal_report.clone(),
                heartbeat: heartbeat.clone(),
                readiness: crate::endpoint::ReadinessRule {
                    max_shed_percent: args.ready_max_shed,
                    window: args.ready_window,
                },
            },
        );
    }
    lock.write_pid()?;
    for &port in &ports {
        tracing::info!(port, "protecting port");
    }
    tracing::info!(
        ports = ports.len(),
        algo = %Algo::from_raw(control.algo),
        limit,
        count = args.count.name(),
        tiers = tiers.len(),
        action = %args.action,
        dry_run = args.dry_run,
        pins = paths::PIN_DIR,
        pid = std::process::id(),
        "shed gate running; SIGINT or SIGTERM detaches"
    );

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let tick = TICK.min(args.window);
    let follow_interfaces = args.ifaces.is_empty().then(|| FollowInterfaces {
        hook: args.hook,
        xdp_mode: args.xdp_mode,
        seen: system::interfaces(),
    });
    let settings = LoopSettings {
        tick,
        handshake_window: args.handshake_window,
        decisions,
        follow_interfaces,
        local_addrs,
        heal_interval: args.heal_interval,
        heal_report,
        heartbeat,
        reload: args.config.is_some().then(|| {
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            let running = args.clone();
            Box::new(move |maps: &mut maps::GateMaps| {
                super::reload::reload(maps, &argv, &running).map_err(|e| format!("{e:#}"))
            }) as daemon::Reloader
        }),
    };
    runtime.block_on(daemon::run(&mut loaded, settings))?;
    drop(loaded); // detaches every link
    tracing::info!("detached; pins removed");
    Ok(())
}

/// What the arguments ask of every port, and the client tiers, checked (the
/// same for `attach` and a SIGHUP reload).
pub fn plan(args: &AttachArgs) -> anyhow::Result<(PortSpec, std::collections::BTreeMap<tiers::Cidr, u8>)> {
    let (control, limit) = args.control().map_err(anyhow::Error::msg)?;
    let mut assignments = args.tiers.clone();
    if let Some(file) = &args.tier_file {
        assignments.extend(tiers::load_tier_file(file).map_err(anyhow::Error::msg)?);
    }
    let tiers = tiers::merge(assignments).map_err(anyhow::Error::msg)?;
    let spec = PortSpec {
        client_cap: args.client_cap,
        client_prefix_v6: args.client_prefix_v6,
        rst_per_sec: args.rst_rate,
        rst_per_prefix_per_sec: args.rst_prefix_rate,
        ..PortSpec::new(limit, args.action.to_raw(), args.dry_run, args.count.to_raw(), control)
    };
    Ok((spec, tiers))
}

fn dedup(ports: &[u16]) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::with_capacity(ports.len());
    for p in ports {
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

/// The interfaces to gate and the hook on each, all checked to exist.
fn targets(ifaces: &[String], hook: Option<Hook>) -> Result<Vec<(String, Hook)>, Error> {
    let chosen = if ifaces.is_empty() {
        let all = system::interfaces();
        tracing::info!(interfaces = ?all, "no --iface given: gating every interface of the namespace");
        all
    } else {
        ifaces.to_vec()
    };
    let mut targets = Vec::new();
    for iface in chosen {
        match system::check_interface(&iface) {
            // The whole namespace: an interface without Ethernet framing is left out, loudly.
            Err(e @ Error::NotEthernet { .. }) if ifaces.is_empty() => {
                tracing::warn!("not gated: {e}");
                continue;
            }
            other => other?,
        }
        if !targets.iter().any(|(i, _)| *i == iface) {
            let hook = hook.unwrap_or_else(|| default_hook(&iface));
            targets.push((iface, hook));
        }
    }
    Ok(targets)
}
