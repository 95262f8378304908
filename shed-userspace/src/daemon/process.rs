// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon process: one per host (the lock file), its pins, its signals,
//! one thread per network namespace that sets its gate up and runs its loop,
//! a ready barrier (every namespace set up, or none stays attached), the
//! metrics endpoint, and a clean exit.
use std::{
    fs,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use anyhow::Context as _;

use crate::{
    control::Algo,
    daemon::{
        DaemonLock, PinGuard,
        gate::{self, Gate, GateEnd, GateEnds, GateId, GateStart, Handles, Instance, LoopSignals},
        plan::{NodePlan, Scope},
        pods::Pods,
    },
    error::Error,
    host::{notify::Notifier, paths, system},
    kernel::maps,
    observe::{
        endpoint::{self, ReadinessRule},
        metrics,
        report::{HEALTHY_WITHIN, Heartbeat},
    },
};

/// Runs the daemon until a signal (or a namespace's failure) stops it. Takes
/// the host's lock and the pin folder, sets every namespace's gate up, and
/// leaves nothing attached or pinned on the way out. Refuses, changing
/// nothing, too many ports or a metrics address it cannot listen on.
pub(crate) fn run(mut plan: NodePlan) -> anyhow::Result<()> {
    plan.gate.ports = dedup(&plan.gate.ports);
    refuse_what_cannot_fit(&plan)?;
    // Bound in the namespace shedctl starts in (the host's), even with --netns.
    let metrics = plan.metrics.map(metrics::bind).transpose()?;
    let plan = Arc::new(plan);
    let mut lock = take_lock(&plan.gate.ports)?;
    let _pins = make_pin_folder()?;
    // Signals are this thread's alone, caught from before the first load: the
    // default action of a SIGTERM during set-up would leave pins behind, and a
    // handler installed per gate thread could miss one sent between two.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let signals = {
        let _context = runtime.enter();
        Signals::install()?
    };
    let (control, mut ends) = Control::new();
    let named = NamedGates::start(&plan, &control)?;
    // What the metrics endpoint serves: these gates, and the pods' as they come.
    let (registry, refused_pods) = (endpoint::GateRegistry::default(), endpoint::RefusedPods::default());
    let pod_loop = endpoint::PodLoop::default();
    // `attach --pods`: each pod that asks gets a gate of its own, found and followed here.
    let pods = plan.pods.as_ref().map(|source| {
        Pods::new(
            source.socket.clone(),
            plan.clone(),
            control.reloads.clone(),
            control.ends.clone(),
            (registry.clone(), refused_pods.clone(), pod_loop.clone()),
        )
    });
    let named = named.ready()?;
    for gate in &named.gates {
        registry.add(gate.endpoint(None));
    }
    if let Some(listener) = metrics {
        tracing::info!(address = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        let readiness = ReadinessRule { max_shed_percent: plan.ready_max_shed, window: plan.ready_window };
        endpoint::serve(
            listener,
            endpoint::Endpoint {
                gates: registry,
                refused_pods,
                pod_loop,
                readiness,
                token: plan.metrics_token.clone(),
            },
        );
    }
    lock.write_pid()?;
    announce(&plan, &named.gates);
    let (heartbeats, threads) = named.go();
    let supervisor = Supervisor::new(control, threads.len(), heartbeats, pods, &plan.gate.ports);
    let failure = runtime.block_on(supervisor.run(signals, &mut ends));
    for thread in threads {
        let _ = thread.join();
    }
    if let Some(e) = failure {
        return Err(e);
    }
    tracing::info!("detached; pins removed");
    Ok(())
}

/// Refuses, before anything changes, more ports than the maps hold, and
/// gates that would not fit the memory budget (rather than OOM-killed half attached).
fn refuse_what_cannot_fit(plan: &NodePlan) -> Result<(), Error> {
    // `attach` refused more already (AttachArgs::plan); a plan built elsewhere is held to it too.
    if plan.gate.ports.len() > shed_common::capacity::MAX_PORTS as usize {
        return Err(Error::TooManyPorts { max: shed_common::capacity::MAX_PORTS });
    }
    if let Some(budget) = plan.memory_budget {
        let used = system::cgroup_memory().map(|c| c.used);
        budget
            .room_for(plan.namespaces.len() as u64, super::budget::PER_NAMESPACE, used)
            .map_err(|reason| Error::MemoryBudget { reason })?;
    }
    Ok(())
}

/// The host's daemon lock; refused, naming the port, when a running daemon
/// already protects one of `ports`.
fn take_lock(ports: &[u16]) -> Result<DaemonLock, Error> {
    match DaemonLock::acquire() {
        Err(Error::AlreadyRunning { pid, ports: running }) => {
            let protected: Vec<u16> = maps::GateMaps::open_gates(None)
                .unwrap_or_default()
                .iter()
                .flat_map(|g| g.maps.port_configs().unwrap_or_default().into_keys())
                .collect();
            if let Some(port) = ports.iter().find(|p| protected.contains(p)) {
                return Err(Error::PortAlreadyProtected { port: *port, pid });
            }
            Err(Error::AlreadyRunning { pid, ports: running })
        }
        other => other,
    }
}

/// The pin folder, made afresh (pins an unclean exit left are removed) and
/// root's only: whoever can open the pins can retune or blind the gate.
fn make_pin_folder() -> Result<PinGuard, Error> {
    if Path::new(paths::PIN_DIR).exists() {
        tracing::warn!(pins = paths::PIN_DIR, "removing pins left by a daemon that exited uncleanly");
        maps::remove_pins(Path::new(paths::PIN_DIR))?;
    }
    // A node agent's object left for a successor that never came judges nothing now: it goes.
    crate::kernel::handover::remove_lapsed();
    fs::create_dir_all(paths::PIN_DIR).map_err(|e| Error::io("create pin folder", paths::PIN_DIR, e))?;
    fs::set_permissions(paths::PIN_DIR, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| Error::io("restrict pin folder", paths::PIN_DIR, e))?;
    Ok(PinGuard)
}

/// Says what runs.
fn announce(plan: &NodePlan, gates: &[Gate]) {
    if std::path::Path::new(paths::DRY_RUN_ALL).exists() {
        tracing::warn!(
            "an operator's global dry-run is on ({}): every port starts in dry-run, refusing nothing; `shedctl set --all --dry-run=off` ends it",
            paths::DRY_RUN_ALL
        );
    }
    for &port in &plan.gate.ports {
        tracing::info!(port, "protecting port");
    }
    let labels: Vec<&str> = gates.iter().map(|g| g.label.as_str()).collect();
    let gate = &plan.gate;
    tracing::info!(
        ports = gate.ports.len(),
        netns = %labels.join(","),
        algo = %Algo::from_raw(gate.spec.control.algo),
        limit = gate.spec.limit,
        count = %gate.count,
        tiers = gate.tiers.len(),
        action = %gate.action,
        dry_run = gate.dry_run,
        pins = paths::PIN_DIR,
        pid = std::process::id(),
        "shed gate running; SIGINT or SIGTERM detaches"
    );
}

/// The one channel between the daemon and every gate, named or a pod's:
/// stop and reload go out to each, and each tells how it ended.
struct Control {
    stop: tokio::sync::watch::Sender<bool>,
    stopped: tokio::sync::watch::Receiver<bool>,
    reload: tokio::sync::watch::Sender<u64>,
    reloads: tokio::sync::watch::Receiver<u64>,
    ends: GateEnds,
}

impl Control {
    fn new() -> (Self, tokio::sync::mpsc::UnboundedReceiver<(GateId, anyhow::Result<()>)>) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (reload, reloads) = tokio::sync::watch::channel(0u64);
        let (ends, ended) = tokio::sync::mpsc::unbounded_channel();
        (Self { stop, stopped, reload, reloads, ends }, ended)
    }

    /// What a named namespace's gate hears: the daemon's stop, and reloads.
    fn signals(&self) -> LoopSignals {
        LoopSignals { stop: self.stopped.clone(), reload: self.reloads.clone() }
    }
}

/// Each named gate's heartbeat, and whether it has ended (its ports
/// detached: it beats no more).
type Heartbeats = Vec<(Heartbeat, Arc<AtomicBool>)>;

/// The gates of the namespaces the node names, each on a thread of its own
/// that enters the namespace first (interfaces, addresses, sockets and the
/// listen-queue counters are all read as that thread sees them).
struct NamedGates {
    gates: Vec<Gate>,
    go: Vec<std::sync::mpsc::Sender<Instance>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    ready: std::sync::mpsc::Receiver<anyhow::Result<()>>,
}

impl NamedGates {
    fn start(plan: &Arc<NodePlan>, control: &Control) -> anyhow::Result<Self> {
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let mut named = Self { gates: Vec::new(), go: Vec::new(), threads: Vec::new(), ready };
        for netns in &plan.namespaces {
            let (go_tx, go_rx) = std::sync::mpsc::channel::<Instance>();
            let gate = Gate::new(netns.clone());
            let end = GateEnd::new(control.ends.clone(), GateId::Named(gate.label.clone()), &gate);
            let start = GateStart {
                node: plan.clone(),
                plan: plan.gate.clone(),
                scope: Scope::Named,
                handles: Handles::default(),
            };
            let thread = gate::spawn(gate.clone(), start, control.signals(), Some((ready_tx.clone(), go_rx)), end)?;
            named.gates.push(gate);
            named.go.push(go_tx);
            named.threads.push(thread);
        }
        Ok(named)
    }

    /// Waits for every namespace's set-up: all ready, or (one failed) every
    /// namespace set up so far detaches, nothing half-applied.
    fn ready(self) -> anyhow::Result<Self> {
        let mut failure = None;
        for _ in &self.gates {
            match self.ready.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => _ = failure.get_or_insert(e),
                Err(_) => _ = failure.get_or_insert(anyhow::anyhow!("a gate thread ended during set-up")),
            }
        }
        let Some(e) = failure else { return Ok(self) };
        drop(self.go);
        for thread in self.threads {
            let _ = thread.join();
        }
        Err(e)
    }

    /// Lets every gate run; returns their heartbeats (with whether each has
    /// ended: its ports detached, it beats no more) and their threads.
    fn go(self) -> (Heartbeats, Vec<std::thread::JoinHandle<()>>) {
        let heartbeats = self.gates.iter().map(|gate| (gate.heartbeat.clone(), gate.ended.clone())).collect();
        for go in self.go {
            let _ = go.send(Instance);
        }
        (heartbeats, self.threads)
    }
}

/// The daemon's loop once every named gate runs: signals go to every gate;
/// a named namespace that fails stops them all at once (the daemon exits
/// with its error); one whose ports were all detached just ends, and the
/// others run on; pods are looked for and followed.
struct Supervisor {
    control: Control,
    /// Named gates still running.
    running: usize,
    heartbeats: Heartbeats,
    pods: Option<Pods>,
    notifier: Option<Notifier>,
    stopping: bool,
    failure: Option<anyhow::Error>,
}

impl Supervisor {
    fn new(control: Control, running: usize, heartbeats: Heartbeats, pods: Option<Pods>, ports: &[u16]) -> Self {
        // systemd (Type=notify): ready now, every port attached and judged.
        let notifier = Notifier::from_env();
        if let Some(notifier) = &notifier {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            notifier.send(&format!(
                "READY=1\nSTATUS=gating port(s) {}\nMAINPID={}",
                ports.join(", "),
                std::process::id()
            ));
        }
        Self { control, running, heartbeats, pods, notifier, stopping: false, failure: None }
    }

    async fn run(
        mut self,
        mut signals: Signals,
        ends: &mut tokio::sync::mpsc::UnboundedReceiver<(GateId, anyhow::Result<()>)>,
    ) -> Option<anyhow::Error> {
        let watchdog_every = self.notifier.as_ref().and_then(Notifier::watchdog_every);
        let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(std::time::Duration::from_hours(1)));
        // The first look at once; each next one a pace after the last ended
        // (a slow runtime delays it, never bunches looks up).
        let mut next_look = tokio::time::Instant::now();
        while self.running > 0 || (self.pods.is_some() && !self.stopping) {
            tokio::select! {
                _ = watchdog.tick(), if watchdog_every.is_some() && !self.stopping => self.feed_watchdog(),
                _ = signals.interrupt.recv() => self.stop("SIGINT: detaching"),
                _ = signals.terminate.recv() => {
                    // A node agent's pods stay judged for the next agent (a restart, a rolling update).
                    let leaving = self.pods.as_mut().is_some_and(Pods::leave_for_successor);
                    self.stop(if leaving {
                        "SIGTERM: the pods stay judged for the next agent; the node's own gates detach"
                    } else {
                        "SIGTERM: detaching"
                    });
                }
                _ = signals.hang_up.recv() => self.control.reload.send_modify(|n| *n += 1),
                Some((id, result)) = ends.recv() => self.ended(id, result),
                () = tokio::time::sleep_until(next_look), if self.pods.is_some() && !self.stopping => {
                    if let Some(pods) = self.pods.as_mut() {
                        pods.look().await;
                        next_look = tokio::time::Instant::now() + pods.look_pace();
                    }
                }
            }
        }
        if let Some(pods) = self.pods.as_mut() {
            pods.stop_all().await;
        }
        self.failure
    }

    /// Fed only while every namespace's control loop has ticked lately:
    /// systemd restarts a daemon whose loops stalled.
    fn feed_watchdog(&self) {
        let alive = |(beat, ended): &(Heartbeat, Arc<AtomicBool>)| {
            ended.load(Ordering::Relaxed) || beat.age().is_some_and(|age| age < HEALTHY_WITHIN)
        };
        if let Some(n) = &self.notifier
            && self.heartbeats.iter().all(alive)
        {
            n.send("WATCHDOG=1");
        }
    }

    fn stop(&mut self, why: &str) {
        if let Some(n) = &self.notifier {
            n.send("STOPPING=1");
        }
        tracing::info!("{why}");
        let _ = self.control.stop.send(true);
        self.stopping = true;
    }

    fn ended(&mut self, id: GateId, result: anyhow::Result<()>) {
        match id {
            GateId::Pod(id) => {
                if let Some(pods) = self.pods.as_mut() {
                    pods.ended(&id, result);
                }
            }
            GateId::Named(label) => {
                self.running -= 1;
                if let Err(e) = result {
                    tracing::error!(netns = %label, "{e:#}: stopping every gate");
                    let _ = self.control.stop.send(true);
                    self.stopping = true;
                    self.failure.get_or_insert(e);
                }
            }
        }
    }
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
            return Err(Error::InvalidPlan {
                reason: format!(
                    "--netns {ns}: `{label}` names the daemon's own namespace in stats and metrics: give the namespace by path (--netns /run/netns/{ns})"
                ),
            }
            .into());
        }
        let path = system::netns_path(ns);
        let inode = fs::metadata(&path)
            .map_err(|e| Error::UnknownNamespace { name: ns.clone(), path: path.clone(), reason: e.to_string() })?
            .ino();
        if let Some((_, _, other)) = seen.iter().find(|(l, i, _)| *l == label || *i == inode) {
            return Err(Error::InvalidPlan {
                reason: format!(
                    "--netns {ns} and --netns {other} name the same network namespace (or the same label `{label}`): give each namespace once"
                ),
            }
            .into());
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
