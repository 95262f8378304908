// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon process: one per host (the lock file), its pins, its signals,
//! one thread per network namespace that sets its gate up and runs its loop,
//! a ready barrier (every namespace set up, or none stays attached), the
//! metrics endpoint, and a clean exit.
use std::{fs, path::Path, sync::Arc};

use anyhow::Context as _;

use crate::{
    control::Algo,
    daemon::{
        DaemonLock, PinGuard,
        gate::{Gate, GateEnd, Instance, LoopSignals, Plan, spawn_gate},
        pods::Pods,
    },
    error::Error,
    host::{notify::Notifier, paths, system},
    kernel::maps,
    observe::{
        endpoint::{self, ReadinessRule},
        metrics,
        report::HEALTHY_WITHIN,
    },
};

/// Runs the daemon until a signal (or a namespace's failure) stops it. Takes
/// the host's lock and the pin folder, sets every namespace's gate up, and
/// leaves nothing attached or pinned on the way out. Refuses, changing
/// nothing, too many ports or a metrics address it cannot listen on.
pub(crate) fn run(mut plan: Plan) -> anyhow::Result<()> {
    plan.ports = dedup(&plan.ports);
    // `attach` refused more already (AttachArgs::plan); a plan built elsewhere is held to it too.
    if plan.ports.len() > shed_common::capacity::MAX_PORTS as usize {
        return Err(Error::TooManyPorts { max: shed_common::capacity::MAX_PORTS }.into());
    }
    // Every namespace's gate must fit the memory budget: refused here, before
    // anything changes, rather than OOM-killed half attached.
    if let Some(budget) = plan.memory_budget {
        let used = system::cgroup_memory().map(|c| c.used);
        budget
            .room_for(plan.namespaces.len() as u64, super::budget::PER_NAMESPACE, used)
            .map_err(|reason| Error::MemoryBudget { reason })?;
    }
    // Bound in the namespace shedctl starts in (the host's), even with --netns.
    let metrics = plan.metrics.map(metrics::bind).transpose()?;
    let readiness = ReadinessRule { max_shed_percent: plan.ready_max_shed, window: plan.ready_window };
    let plan = Arc::new(plan);
    let mut lock = match DaemonLock::acquire() {
        Ok(lock) => lock,
        Err(Error::AlreadyRunning { pid, ports: running }) => {
            let protected: Vec<u16> = maps::GateMaps::open_gates(None)
                .unwrap_or_default()
                .iter()
                .flat_map(|g| g.maps.port_configs().unwrap_or_default().into_keys())
                .collect();
            if let Some(port) = plan.ports.iter().find(|p| protected.contains(p)) {
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
    for netns in &plan.namespaces {
        let (go_tx, go_rx) = std::sync::mpsc::channel::<Instance>();
        let gate = Gate::new(netns.clone());
        let loop_signals = LoopSignals { stop: stopped.clone(), reload: reloads.clone() };
        let end = GateEnd::new(done_tx.clone(), gate.label.clone(), &gate);
        let thread = spawn_gate(gate.clone(), plan.clone(), loop_signals, Some((ready_tx.clone(), go_rx)), end)?;
        gates.push((gate, go_tx, thread));
    }
    // What the metrics endpoint serves: these gates, and the pods' as they come.
    let (registry, refused_pods) = (endpoint::GateRegistry::default(), endpoint::RefusedPods::default());
    // `attach --pods`: each pod that asks gets a gate of its own, found and followed here.
    let (pod_done_tx, mut pod_done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut pods = plan.pods.as_ref().map(|source| {
        Pods::new(
            source.socket.clone(),
            plan.clone(),
            reloads.clone(),
            pod_done_tx.clone(),
            (registry.clone(), refused_pods.clone()),
        )
    });
    drop(pod_done_tx);
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

    for (gate, _, _) in &gates {
        registry.add(gate.endpoint(None));
    }
    if let Some(listener) = metrics {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        endpoint::serve(
            listener,
            endpoint::Endpoint {
                gates: registry.clone(),
                refused_pods: refused_pods.clone(),
                readiness,
                token: plan.metrics_token.clone(),
            },
        );
    }
    lock.write_pid()?;
    for &port in &plan.ports {
        tracing::info!(port, "protecting port");
    }
    let labels: Vec<&str> = gates.iter().map(|(g, _, _)| g.label.as_str()).collect();
    tracing::info!(
        ports = plan.ports.len(),
        netns = %labels.join(","),
        algo = %Algo::from_raw(plan.spec.control.algo),
        limit = plan.spec.limit,
        count = %plan.count,
        tiers = plan.tiers.len(),
        action = %plan.action,
        dry_run = plan.dry_run,
        pins = paths::PIN_DIR,
        pid = std::process::id(),
        "shed gate running; SIGINT or SIGTERM detaches"
    );
    // Each gate's heartbeat, and whether it has ended (its ports detached: it beats no more).
    let heartbeats: Vec<_> = gates.iter().map(|(gate, _, _)| (gate.heartbeat.clone(), gate.ended.clone())).collect();
    let mut threads = Vec::new();
    for (_, go, thread) in gates {
        let _ = go.send(Instance);
        threads.push(thread);
    }
    // systemd (Type=notify): ready now, every port attached and judged.
    let notifier = Notifier::from_env();
    if let Some(notifier) = &notifier {
        let ports: Vec<String> = plan.ports.iter().map(u16::to_string).collect();
        notifier.send(&format!("READY=1\nSTATUS=gating port(s) {}\nMAINPID={}", ports.join(", "), std::process::id()));
    }
    let watchdog_every = notifier.as_ref().and_then(Notifier::watchdog_every);
    // Signals go to every gate; a namespace that fails stops them all at once
    // (the daemon exits with its error); one whose ports were all detached
    // just ends, and the others run on.
    let failure = runtime.block_on(async {
        let (mut running, mut failure, mut stopping) = (threads.len(), None, false);
        let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(std::time::Duration::from_hours(1)));
        let mut look = tokio::time::interval(super::pods::LOOK_EVERY);
        // A slow runtime delays the next look; it does not bunch them up.
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while running > 0 || (pods.is_some() && !stopping) {
            tokio::select! {
                _ = watchdog.tick(), if watchdog_every.is_some() && !stopping => {
                    // Fed only while every namespace's control loop has ticked
                    // lately: systemd restarts a daemon whose loops stalled.
                    if let Some(n) = &notifier
                        && heartbeats.iter().all(|(beat, ended)| {
                            ended.load(std::sync::atomic::Ordering::Relaxed)
                                || beat.age().is_some_and(|age| age < HEALTHY_WITHIN)
                        })
                    {
                        n.send("WATCHDOG=1");
                    }
                }
                _ = signals.interrupt.recv() => {
                    if let Some(n) = &notifier {
                        n.send("STOPPING=1");
                    }
                    tracing::info!("SIGINT: detaching");
                    let _ = stop.send(true);
                    stopping = true;
                }
                _ = signals.terminate.recv() => {
                    if let Some(n) = &notifier {
                        n.send("STOPPING=1");
                    }
                    tracing::info!("SIGTERM: detaching");
                    let _ = stop.send(true);
                    stopping = true;
                }
                _ = signals.hang_up.recv() => reload.send_modify(|n| *n += 1),
                Some((label, result)) = done_rx.recv() => {
                    running -= 1;
                    if let Err(e) = result {
                        tracing::error!(netns = %label, "{e:#}: stopping every gate");
                        let _ = stop.send(true);
                        stopping = true;
                        failure.get_or_insert(e);
                    }
                }
                _ = look.tick(), if pods.is_some() && !stopping => {
                    if let Some(pods) = pods.as_mut() {
                        pods.look().await;
                    }
                }
                Some((id, result)) = pod_done_rx.recv() => {
                    if let Some(pods) = pods.as_mut() {
                        pods.ended(&id, result);
                    }
                }
            }
        }
        if let Some(pods) = pods.as_mut() {
            pods.stop_all().await;
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

/// The namespaces to gate (None: the daemon's own), each once.
pub(crate) fn namespaces(netns: &[String]) -> anyhow::Result<Vec<Option<String>>> {
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

fn dedup(ports: &[u16]) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::with_capacity(ports.len());
    for p in ports {
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}
