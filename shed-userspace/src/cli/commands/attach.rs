// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl attach`: check everything, then load, attach, pin and run.
use std::{fs, path::Path, time::Duration};

use anyhow::Context as _;

use crate::named::Named as _;
use crate::{
    cli::AttachArgs,
    cli::config,
    control::Algo,
    daemon::{self, DaemonLock, FollowInterfaces, LoopSettings, PinGuard},
    error::Error,
    host::paths,
    host::system::{self, Need},
    kernel::maps::{self, PortSpec},
    kernel::options::{Action, Hook, XdpAttachMode},
    kernel::programs::{Loaded, default_hook},
    observe::metrics,
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
    let (spec, tiers) = args.plan()?;
    let (control, limit) = (spec.control, spec.limit);
    if ports.len() > shed_common::capacity::MAX_PORTS as usize {
        return Err(Error::TooManyPorts { max: shed_common::capacity::MAX_PORTS }.into());
    }
    // Every check runs before anything changes, so a refusal leaves the host untouched.
    system::check_privileges(if args.netns.is_empty() { Need::Attach } else { Need::AttachNetns })?;
    let namespaces = namespaces(&args.netns)?;
    // Bound in the namespace shedctl starts in (the host's), even with --netns.
    let metrics_listener = args.metrics.map(metrics::bind).transpose()?;
    system::check_bpffs()?;
    system::check_tracefs()?;
    system::check_tracepoint_layouts()?;

    let mut lock = match DaemonLock::acquire() {
        Ok(lock) => lock,
        Err(Error::AlreadyRunning { pid, ports: running }) => {
            let protected: Vec<u16> = maps::GateMaps::open_gates(None)
                .unwrap_or_default()
                .iter()
                .flat_map(|g| g.maps.port_configs().unwrap_or_default().into_keys())
                .collect();
            if let Some(port) = ports.iter().find(|p| protected.contains(p)) {
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

    // Signals are this thread's alone, caught from before the first load: the
    // default action of a SIGTERM during set-up would leave pins behind, and a
    // handler installed per gate thread could miss one sent between two.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let mut signals = {
        let _context = runtime.enter();
        Signals::install()?
    };

    // One gate per namespace, each on a thread of its own that enters the
    // namespace first: interfaces, addresses, sockets and the listen-queue
    // counters are all read as that thread sees them.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (reload, reloads) = tokio::sync::watch::channel(0u64);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut gates = Vec::new();
    for netns in &namespaces {
        let (go_tx, go_rx) = std::sync::mpsc::channel::<Instance>();
        let gate = Gate {
            netns: netns.clone(),
            label: paths::netns_label(netns.as_deref()),
            pin_dir: paths::gate_pin_dir(netns.as_deref()),
            decisions: crate::daemon::report::Decisions::default(),
            heal: crate::daemon::heal::HealReport::default(),
            heartbeat: crate::daemon::report::Heartbeat::default(),
            task_errors: crate::daemon::report::TaskErrors::default(),
            ended: Default::default(),
        };
        let (setup, ready, spec, tiers) = (gate.clone(), ready_tx.clone(), spec, tiers.clone());
        let (args, ports, loop_signals) =
            (args.clone(), ports.clone(), LoopSignals { stop: stopped.clone(), reload: reloads.clone() });
        let mut end =
            GateEnd { done: done_tx.clone(), label: gate.label.clone(), ended: gate.ended.clone(), told: false };
        let thread = std::thread::Builder::new()
            .name(format!("shed-{}", gate.label))
            .spawn(move || {
                let _span = tracing::info_span!("gate", netns = %setup.label).entered();
                let loaded = set_up(&setup, &args, &ports, &spec, &tiers)
                    .with_context(|| format!("network namespace {}", setup.label));
                let (result, loaded) = match loaded {
                    Ok((loaded, local_addrs, seen)) => (Ok(()), Some((loaded, local_addrs, seen))),
                    Err(e) => (Err(e), None),
                };
                let _ = ready.send(result);
                drop(ready); // a set-up that panics instead ends the wait all the same
                // Every namespace answered: run, or (one of them failed) detach.
                let (Some((mut loaded, local_addrs, seen)), Ok(instance)) = (loaded, go_rx.recv()) else {
                    return end.tell(Ok(()));
                };
                let result = run_gate(&setup, &mut loaded, (local_addrs, seen), instance, &args, loop_signals);
                drop(loaded); // detaches its links, inside the namespace
                if setup.netns.is_some() {
                    // The namespace's ports are gone (or the daemon stops): so are its pins.
                    let _ = maps::remove_pins(&setup.pin_dir);
                }
                end.tell(result.with_context(|| format!("network namespace {}", setup.label)));
            })
            .context("starting a gate thread")?;
        gates.push((gate, go_tx, thread));
    }
    drop((ready_tx, done_tx));
    let mut failure = None;
    for _ in &gates {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => _ = failure.get_or_insert(e),
            Err(_) => _ = failure.get_or_insert(anyhow::anyhow!("a gate thread ended during set-up")),
        }
    }
    if let Some(e) = failure {
        // Nothing half-applied: every namespace set up so far detaches.
        for (_, go, thread) in gates {
            drop(go);
            let _ = thread.join();
        }
        return Err(e);
    }

    if let Some(listener) = metrics_listener {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        crate::observe::endpoint::serve(
            listener,
            crate::observe::endpoint::Endpoint {
                gates: gates
                    .iter()
                    .map(|(g, _, _)| crate::observe::endpoint::EndpointGate {
                        netns: g.label.clone(),
                        pin_dir: g.pin_dir.clone(),
                        decisions: g.decisions.clone(),
                        heal: g.heal.clone(),
                        heartbeat: g.heartbeat.clone(),
                        task_errors: g.task_errors.clone(),
                        ended: g.ended.clone(),
                    })
                    .collect(),
                readiness: crate::observe::endpoint::ReadinessRule {
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
    let labels: Vec<&str> = gates.iter().map(|(g, _, _)| g.label.as_str()).collect();
    tracing::info!(
        ports = ports.len(),
        netns = %labels.join(","),
        algo = %Algo::from_raw(control.algo),
        limit,
        count = %args.count.name(),
        tiers = tiers.len(),
        action = %args.action,
        dry_run = args.dry_run,
        pins = paths::PIN_DIR,
        pid = std::process::id(),
        "shed gate running; SIGINT or SIGTERM detaches"
    );
    let mut threads = Vec::new();
    for (_, go, thread) in gates {
        let _ = go.send(Instance);
        threads.push(thread);
    }
    // Signals go to every gate; a namespace that fails stops them all at once
    // (the daemon exits with its error); one whose ports were all detached
    // just ends, and the others run on.
    let failure = runtime.block_on(async {
        let (mut running, mut failure) = (threads.len(), None);
        while running > 0 {
            tokio::select! {
                _ = signals.interrupt.recv() => {
                    tracing::info!("SIGINT: detaching");
                    let _ = stop.send(true);
                }
                _ = signals.terminate.recv() => {
                    tracing::info!("SIGTERM: detaching");
                    let _ = stop.send(true);
                }
                _ = signals.hang_up.recv() => reload.send_modify(|n| *n += 1),
                Some((label, result)) = done_rx.recv() => {
                    running -= 1;
                    if let Err(e) = result {
                        tracing::error!(netns = %label, "{e:#}: stopping every gate");
                        let _ = stop.send(true);
                        failure.get_or_insert(e);
                    }
                }
            }
        }
        failure
    });
    for thread in threads {
        let _ = thread.join();
    }
    if let Some(e) = failure {
        return Err(e);
    }
    tracing::info!("detached; pins removed");
    Ok(())
}

/// The daemon's signals, installed once for every gate.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hang_up: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &str| signal(kind).map_err(|e| Error::io("install handler", name, e));
        Ok(Self {
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
            hang_up: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }
}

/// What a gate's loop hears from the daemon: stop, and reload the config.
struct LoopSignals {
    stop: tokio::sync::watch::Receiver<bool>,
    reload: tokio::sync::watch::Receiver<u64>,
}

/// Tells the daemon how a gate thread ended, once; a thread that panics tells it too.
struct GateEnd {
    done: tokio::sync::mpsc::UnboundedSender<(String, anyhow::Result<()>)>,
    label: String,
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
    told: bool,
}

impl GateEnd {
    fn tell(&mut self, result: anyhow::Result<()>) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.done.send((self.label.clone(), result));
        self.told = true;
    }
}

impl Drop for GateEnd {
    fn drop(&mut self) {
        if !self.told {
            self.tell(Err(anyhow::anyhow!("the gate's thread panicked")));
        }
    }
}

/// Go-ahead for a namespace's thread to run its control loop.
struct Instance;

/// One namespace's gate, as the daemon's threads and endpoint share it.
#[derive(Clone)]
struct Gate {
    netns: Option<String>,
    label: String,
    pin_dir: std::path::PathBuf,
    decisions: crate::daemon::report::Decisions,
    heal: crate::daemon::heal::HealReport,
    heartbeat: crate::daemon::report::Heartbeat,
    task_errors: crate::daemon::report::TaskErrors,
    /// Set when the gate's thread has ended (its ports detached, or the daemon stops).
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The namespaces to gate (None: the daemon's own), each once.
fn namespaces(netns: &[String]) -> anyhow::Result<Vec<Option<String>>> {
    use std::os::unix::fs::MetadataExt as _;
    if netns.is_empty() {
        return Ok(vec![None]);
    }
    let mut seen: Vec<(String, u64, &str)> = Vec::new();
    for ns in netns {
        let label = paths::netns_label(Some(ns));
        if label == paths::OWN_NETNS_LABEL {
            anyhow::bail!(
                "--netns {ns}: `{label}` names the daemon's own namespace in stats and metrics: give the namespace by path (--netns /run/netns/{ns})"
            );
        }
        let path = system::netns_path(ns);
        let inode = fs::metadata(&path)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot open network namespace `{ns}` ({}: {e}): give a name from `ip netns list` or a path such as /proc/PID/ns/net",
                    path.display()
                )
            })?
            .ino();
        if let Some((_, _, other)) = seen.iter().find(|(l, i, _)| *l == label || *i == inode) {
            anyhow::bail!(
                "--netns {ns} and --netns {other} name the same network namespace (or the same label `{label}`): give each namespace once"
            );
        }
        seen.push((label, inode, ns));
    }
    Ok(netns.iter().cloned().map(Some).collect())
}

/// Enters the gate's namespace (this thread), then loads, pins, configures
/// and attaches its programs; returns them with the addresses written and
/// the interfaces considered (gated or left out), for the loop to follow.
fn set_up(
    gate: &Gate,
    args: &AttachArgs,
    ports: &[u16],
    spec: &PortSpec,
    tiers: &std::collections::BTreeMap<crate::kernel::options::Cidr, u8>,
) -> anyhow::Result<(Loaded, daemon::LocalAddrs, Vec<(String, u32)>)> {
    if let Some(netns) = &gate.netns {
        system::enter_netns(netns)?;
    }
    // Taken before the interfaces are chosen: one that appears meanwhile is
    // not in it, and the loop gates it on its first look.
    let seen = system::interfaces_indexed();
    let targets = targets(&args.ifaces, args.hook)?;
    fs::create_dir_all(&gate.pin_dir).map_err(|e| Error::io("create pin folder", &gate.pin_dir, e))?;
    let options = crate::kernel::object::LoadOptions {
        connections: args.max_connections,
        clients: args.max_clients,
        kernel_log: args.kernel_log,
    };
    let mut loaded = Loaded::sized(Some(&gate.pin_dir), options).context("loading the kernel programs")?;
    for (&cidr, &tier) in tiers {
        loaded.maps.set_tier(cidr, tier)?;
    }
    for &port in ports {
        loaded.maps.protect(port, spec)?;
    }
    match system::netns_filter() {
        Ok(filter) => loaded.maps.set_netns_filter(filter)?,
        // Several gates on one port would each count the others' connections.
        Err(why) if args.netns.len() > 1 => anyhow::bail!(
            "cannot tell the namespaces' sockets apart ({why}), so several namespaces cannot be gated at once: gate one namespace per daemon"
        ),
        Err(why) => tracing::warn!(
            "counting sockets of every network namespace ({why}): another namespace serving the same port would share the counts"
        ),
    }
    if let Some(mode) = system::fast_open_for_servers() {
        tracing::warn!(
            tcp_fastopen = mode,
            "net.ipv4.tcp_fastopen lets servers in this namespace accept TCP Fast Open: a TFO SYN's data reaches the server before any ACK, so such connections are judged at their SYN only (against verified work); set net.ipv4.tcp_fastopen=1 (clients only) to judge every connection at its handshake-completing ACK"
        );
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
                tracing::info!(iface = %iface, hook = %hook, xdp_mode = %args.xdp_mode, "gate attached")
            }
            Hook::Tc => tracing::info!(iface = %iface, hook = %hook, "gate attached"),
        }
    }
    gate.heartbeat.beat();
    Ok((loaded, local_addrs, seen))
}

/// Runs one namespace's control loop until the daemon stops; detaches its
/// programs on the way out, still inside the namespace.
fn run_gate(
    gate: &Gate,
    loaded: &mut Loaded,
    (local_addrs, seen): (daemon::LocalAddrs, Vec<(String, u32)>),
    _go: Instance,
    args: &AttachArgs,
    signals: LoopSignals,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let follow_interfaces = args.ifaces.is_empty().then(|| FollowInterfaces {
        hook: args.hook,
        xdp_mode: args.xdp_mode,
        seen,
    });
    let settings = LoopSettings {
        tick: TICK.min(args.window),
        handshake_window: args.handshake_window,
        decisions: gate.decisions.clone(),
        follow_interfaces,
        local_addrs,
        heal_interval: args.heal_interval,
        heal_report: gate.heal.clone(),
        heartbeat: gate.heartbeat.clone(),
        task_errors: gate.task_errors.clone(),
        reload: args.config.is_some().then(|| {
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            let running = args.clone();
            Box::new(move |maps: &mut maps::GateMaps| {
                super::reload::reload(maps, &argv, &running).map_err(|e| format!("{e:#}"))
            }) as daemon::Reloader
        }),
        stop: signals.stop,
        reload_requests: signals.reload,
    };
    // aya-log's records wait in a ring buffer until read: poll it beside the loop.
    let kernel_log = if args.kernel_log {
        match aya_log::EbpfLogger::init(&mut loaded.ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                tracing::warn!("kernel log unavailable ({e}): the rare paths are still counted in stats");
                None
            }
        }
    } else {
        None
    };
    runtime.block_on(async {
        if let Some(logger) = kernel_log {
            tokio::spawn(forward_kernel_log(logger));
        }
        daemon::run(loaded, settings).await
    })?;
    Ok(())
}

/// Hands every record the kernel programs log to this process's log (and so
/// to tracing), each time the ring buffer has some.
async fn forward_kernel_log(logger: aya_log::EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns its ring buffer's fd, open until the logger drops,
    // and the AsyncFd owns the logger.
    let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
    let mut ring = match registered {
        Ok(ring) => ring,
        Err(e) => return tracing::warn!("kernel log unavailable: {e}"),
    };
    loop {
        let Ok(mut ready) = ring.readable_mut().await else {
            return tracing::warn!("kernel log stopped: its ring buffer cannot be polled");
        };
        // aya-log panics on a record it cannot decode: stop logging, not the gate.
        let logger = ready.get_inner_mut();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| logger.flush())).is_err() {
            return tracing::warn!("kernel log stopped: a record could not be decoded");
        }
        ready.clear_ready();
    }
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
        tracing::info!(interfaces = %all.join(","), "no --iface given: gating every interface of the namespace");
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
