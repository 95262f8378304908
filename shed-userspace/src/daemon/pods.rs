// SPDX-License-Identifier: MIT OR Apache-2.0
//! `attach --pods`: the node's pods that ask for a gate (`shed.io/ports`),
//! found through the container runtime (CRI) twice a second (ten times a
//! second for 2 s after a new one came). Each gets a gate of its own, in its
//! network namespace, with the settings its `shed.io/*`
//! annotations give and the node's for the rest (hook, map sizes, healing);
//! a pod that goes takes its gate and pins with it. A pod's bad annotation or
//! failed set-up is that pod's alone: said, the pod left ungated, the node and
//! the other pods untouched. A bad annotation stays bad (a sandbox's
//! annotations never change); a set-up that failed (the kernel short of
//! memory, the verifier interrupted) is tried again, later each time.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

use crate::{
    daemon::{
        gate::{self, Gate, GateEnd, GateEnds, GateId, GateStart, Handles, LoopSignals},
        plan::{GatePlan, NodePlan, PodReader, PodRefusal, Scope},
    },
    host::{
        cri::{self, PodSandbox},
        paths, system,
    },
    kernel::{
        dispatch::Dispatcher,
        object::LoadOptions,
        options::Hook,
        programs::{Loaded, Prepared},
    },
    observe::endpoint::{GateRegistry, PodLoop, PodState, RefusedPods},
};

/// The pods the daemon gates, and those it will not.
pub(super) struct Pods {
    socket: PathBuf,
    node: Arc<NodePlan>,
    reloads: watch::Receiver<u64>,
    done: GateEnds,
    /// The metrics endpoint's gates (each pod's joins it), refused pods, and
    /// the pod loop's own state (its runtime, its pods by state).
    endpoint: (GateRegistry, RefusedPods, PodLoop),
    client: Option<cri::Client>,
    /// The sandboxes' network namespaces, asked of the runtime once each.
    networks: cri::Networks,
    /// By sandbox id.
    running: BTreeMap<String, PodGate>,
    /// Sandboxes left ungated for good, with their pod's name: bad
    /// annotations (said once; a sandbox's annotations never change, so they
    /// are not read again), or every port detached by an operator.
    refused: BTreeMap<String, String>,
    /// Pods left ungated for the memory budget, by sandbox id: their names (for the metric).
    over_budget: BTreeMap<String, String>,
    /// Pods whose last gate failed (to set up, or later), by sandbox id: their
    /// names, shown in `shed_pod_refused` until a gate of theirs runs again.
    set_up_failed: BTreeMap<String, String>,
    /// Sandboxes a gate of this agent has judged (its loop ticked), or that
    /// it took over from the last agent: a NAT rule found at a later set-up
    /// of theirs came after their first gate (a mesh's redirect), and is
    /// reported, not a reason to leave them ungated.
    judged_before: BTreeSet<String>,
    /// Sandboxes whose gate failed to set up or ended with an error: tried
    /// again when their time comes.
    failed: Retries,
    /// The runtime's last error, said once until it changes.
    last_error: Option<String>,
    /// Counts every pod's connections with one set of tracepoint programs
    /// (None: it could not start, and each pod's gate attaches its own).
    dispatcher: Option<Arc<Dispatcher>>,
    /// The next pod's gate object, its programs verified ahead.
    spare: Spare,
    /// The agent stops: gates end for that, not for their pods.
    stopping: bool,
    /// The shared programs' log records (`--kernel-log`), forwarded from the first look on.
    kernel_log: Option<crate::kernel::dispatch::KernelLogger>,
    /// Until when the runtime is looked at [`LOOK_SOON`]: a look that found a
    /// new pod expects more (a node's pods after a reboot, a Deployment scaled up).
    burst_until: Option<Instant>,
}

/// A gate object verified in the background for the next pod, so a new
/// pod's set-up spends no verifier time (a second or two on a busy node,
/// most of the 2 s a pod may wait). It costs what one more pod's gate costs
/// in kernel memory, held while no pod comes.
struct Spare {
    options: LoadOptions,
    hook: Hook,
    making: Option<std::thread::JoinHandle<Result<Prepared, crate::error::Error>>>,
    /// False under the node's shared object.
    wanted: bool,
}

impl Spare {
    fn start(options: LoadOptions, hook: Hook) -> Self {
        let mut spare = Self { options, hook, making: None, wanted: true };
        spare.refill();
        spare
    }

    /// No spare, ever: the node's shared object judges for every pod.
    fn none(options: LoadOptions, hook: Hook) -> Self {
        Self { options, hook, making: None, wanted: false }
    }

    /// The spare if it is ready; a new one is made after (a failed one is
    /// said at debug and not retried until the next pod).
    fn take(&mut self) -> Option<Prepared> {
        if !self.wanted {
            return None;
        }
        let Some(making) = &self.making else {
            // Its thread could not start: another try.
            self.refill();
            return None;
        };
        if !making.is_finished() {
            return None;
        }
        let made = self.making.take()?.join();
        self.refill();
        match made {
            Ok(Ok(spare)) => Some(spare),
            Ok(Err(e)) => {
                tracing::debug!("{}: the next pod's gate loads its own programs", crate::error::chain(&e));
                None
            }
            Err(_) => None,
        }
    }

    fn refill(&mut self) {
        let (options, hook) = (self.options, self.hook);
        self.making = std::thread::Builder::new()
            .name("shed-spare".into())
            .spawn(move || {
                let prepared = Loaded::prepare(options, hook);
                system::release_freed_memory();
                prepared
            })
            .map_err(|e| tracing::debug!("{e}: no spare gate object"))
            .ok();
    }
}

/// The node's dispatcher: the shared object, which judges and counts for
/// every pod itself (unless `--hook xdp`: it judges at TC), else one that
/// counts through each pod's own programs; None if neither starts.
fn start_dispatcher(node: &NodePlan) -> Option<Dispatcher> {
    if node.hook != Some(Hook::Xdp) {
        let expedite_rcu = node.pods.as_ref().is_some_and(|p| p.expedite_rcu);
        match Dispatcher::start_shared(node.max_connections, node.kernel_log, expedite_rcu) {
            Ok(dispatcher) => {
                tracing::info!("--pods: one set of programs, verified once, judges and counts for every pod");
                return Some(dispatcher);
            }
            Err(e) => tracing::warn!(
                "{}: each pod's gate loads its own judging programs (the verifier's second or so per pod)",
                crate::error::chain(&e)
            ),
        }
    }
    match Dispatcher::start(node.max_connections) {
        Ok(dispatcher) => {
            tracing::info!("--pods: every pod's connections are counted through one set of tracepoint programs");
            Some(dispatcher)
        }
        Err(e) => {
            tracing::warn!(
                "{}: each pod's gate attaches its own accounting programs, which every socket event of the \
                 node then runs once per gated pod",
                crate::error::chain(&e)
            );
            None
        }
    }
}

/// When each pod whose gate failed is tried again, by sandbox id.
#[derive(Default)]
struct Retries(BTreeMap<String, Retry>);

struct Retry {
    at: Instant,
    /// The wait after this try fails too.
    next: Duration,
}

impl Retries {
    /// Whether sandbox `id` waits for its next try at `now`.
    fn waiting(&self, id: &str, now: Instant) -> bool {
        self.0.get(id).is_some_and(|retry| retry.at > now)
    }

    /// Books another failed try of sandbox `id` at `now`; returns the wait
    /// before the next: [`RETRY_FIRST`], doubling up to [`RETRY_MOST`].
    fn failed(&mut self, id: &str, now: Instant) -> Duration {
        let retry = self.0.entry(id.to_owned()).or_insert(Retry { at: now, next: RETRY_FIRST });
        let wait = retry.next;
        *retry = Retry { at: now + wait, next: (wait * 2).min(RETRY_MOST) };
        wait
    }

    /// Starts sandbox `id`'s waits over (its gate ran well for a long time).
    fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }

    /// Forgets the sandboxes that are gone.
    fn keep_present(&mut self, present: &BTreeSet<&str>) {
        self.0.retain(|id, _| present.contains(id.as_str()));
    }
}

/// How often the runtime is asked for its pods. A look is one list (each
/// sandbox's namespace is asked once), and a new pod's gate must be set up
/// within 2 s of its sandbox being ready, the verifier taking one of them.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(500);

/// How often while pods are coming ([`BURST_WINDOW`] after a look found a new
/// one): in a burst each pod's set-up queues behind the others' (each TC
/// attachment holds the kernel's rtnl lock for an RCU grace period), so a
/// pod seen late is gated late. A quiet node keeps [`LOOK_EVERY`].
pub(super) const LOOK_SOON: Duration = Duration::from_millis(100);
const BURST_WINDOW: Duration = Duration::from_secs(2);

/// The wait before the next look: [`LOOK_SOON`] until `burst_until`, else [`LOOK_EVERY`].
fn look_pace(burst_until: Option<Instant>, now: Instant) -> Duration {
    if burst_until.is_some_and(|until| now < until) { LOOK_SOON } else { LOOK_EVERY }
}

/// The first wait before a failed pod is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MOST: Duration = Duration::from_mins(5);

struct PodGate {
    pod: String,
    /// Its namespace's label (its gate's pins and name file are named by it).
    label: String,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When its gate was started: one that ran longer than the longest wait
    /// before it failed starts its waits over.
    started: Instant,
    /// Beats once the gate is set up (its maps loaded and charged): until
    /// then its memory is booked against the budget by estimate.
    heartbeat: crate::observe::report::Heartbeat,
}

impl Pods {
    pub(super) fn new(
        socket: PathBuf,
        node: Arc<NodePlan>,
        reloads: watch::Receiver<u64>,
        done: GateEnds,
        endpoint: (GateRegistry, RefusedPods, PodLoop),
    ) -> Self {
        // (It finds what the last agent left, and lets go of pods gone since.)
        let dispatcher = start_dispatcher(&node).map(Arc::new);
        // Names left by a daemon that exited uncleanly (its pins are removed
        // too); a pod the last agent left judging keeps its name while it is.
        let handing_over = crate::kernel::handover::handing_over_labels();
        for entry in std::fs::read_dir(paths::POD_NAMES).into_iter().flatten().flatten() {
            if !handing_over.contains(entry.file_name().to_string_lossy().as_ref()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let kernel_log = dispatcher.as_ref().and_then(|d| d.take_kernel_log());
        // A pod under the shared object verifies nothing: no spare to keep.
        let spare = if dispatcher.as_ref().is_some_and(|d| d.shared()) {
            Spare::none(node.load_options(Scope::Pod), node.spare_hook())
        } else {
            Spare::start(node.load_options(Scope::Pod), node.spare_hook())
        };
        endpoint.2.start();
        Self {
            spare,
            dispatcher,
            socket,
            node,
            reloads,
            done,
            endpoint,
            client: None,
            networks: cri::Networks::default(),
            running: BTreeMap::new(),
            refused: BTreeMap::new(),
            over_budget: BTreeMap::new(),
            set_up_failed: BTreeMap::new(),
            judged_before: BTreeSet::new(),
            failed: Retries::default(),
            last_error: None,
            stopping: false,
            kernel_log,
            burst_until: None,
        }
    }

    /// The wait before the next look (see [`LOOK_SOON`]).
    pub(super) fn look_pace(&self) -> Duration {
        look_pace(self.burst_until, Instant::now())
    }

    /// Asks the runtime for its pods: gates the new ones that ask, ends the gates of pods gone.
    pub(super) async fn look(&mut self) {
        // In the daemon's runtime now: the shared programs' records go to its log.
        if let Some(logger) = self.kernel_log.take() {
            tokio::spawn(gate::forward_kernel_log(logger));
        }
        // The last agent's object goes once every pod it judged is taken over (or its lease is up).
        if let Some(dispatcher) = &self.dispatcher {
            dispatcher.finish_takeover();
        }
        // Bounded as a whole, as each call is: a runtime that answers each
        // status just in time must not hold the daemon's loop (and its
        // signals) for a call per pod.
        let listed = tokio::time::timeout(cri::CALL_TIMEOUT, self.list()).await.unwrap_or_else(|_| {
            Err(crate::error::Error::Cri {
                socket: self.socket.clone(),
                reason: format!(
                    "no full list of pod sandboxes in {} s (is the runtime stuck?)",
                    cri::CALL_TIMEOUT.as_secs()
                ),
            })
        });
        self.endpoint.2.looked(listed.is_ok());
        let pods = match listed {
            Ok(pods) => pods,
            Err(e) => {
                let e = crate::error::chain(&e);
                if self.last_error.as_ref() != Some(&e) {
                    tracing::warn!("--pods: {e}; the pods gated so far stay gated, the rest wait for the runtime");
                    self.last_error = Some(e);
                }
                self.client = None;
                return;
            }
        };
        if self.last_error.take().is_some() {
            tracing::info!(socket = %self.socket.display(), "--pods: the container runtime answers again");
        }
        let present: BTreeSet<&str> = pods.iter().map(|p| p.id.as_str()).collect();
        let gone: Vec<String> = self.running.keys().filter(|id| !present.contains(id.as_str())).cloned().collect();
        for id in gone {
            self.stop(&id).await;
        }
        self.refused.retain(|id, pod| {
            let keep = present.contains(id.as_str());
            if !keep {
                self.endpoint.1.clear(pod);
            }
            keep
        });
        self.failed.keep_present(&present);
        // A pod refused for memory that went: its series goes with it.
        self.over_budget.retain(|id, pod| {
            let keep = present.contains(id.as_str());
            if !keep {
                self.endpoint.1.clear(pod);
            }
            keep
        });
        for (id, gate) in &self.running {
            if gate.heartbeat.age().is_some() {
                self.judged_before.insert(id.clone());
            }
        }
        self.judged_before.retain(|id| present.contains(id.as_str()));
        // A failed pod's refusal lasts until it went, or a gate of its runs
        // (its loop has ticked: set up, judging).
        self.set_up_failed.retain(|id, pod| {
            let running = self.running.get(id).is_some_and(|g| g.heartbeat.age().is_some());
            let keep = present.contains(id.as_str()) && !running;
            if !keep {
                self.endpoint.1.clear(pod);
            }
            keep
        });
        let now = Instant::now();
        for pod in &pods {
            if self.running.contains_key(&pod.id)
                || self.refused.contains_key(&pod.id)
                || self.failed.waiting(&pod.id, now)
            {
                continue;
            }
            let read = &self.node.pods.as_ref().expect("Pods runs for --pods").read;
            match gate_for(pod, read) {
                Ok(None) => {}
                Ok(Some((settings, netns))) => {
                    // Refused, not OOM-killed: a gate that would not fit waits for room.
                    let set_up = self.running.values().map(|g| g.heartbeat.age().is_some());
                    let room = self.node.memory_budget.map_or(Ok(()), |b| {
                        // Under the shared object a pod's set-up verifies nothing.
                        let verifiers = if self.dispatcher.as_ref().is_some_and(|d| d.shared()) {
                            0
                        } else {
                            std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
                        };
                        b.room_for_next_pod(set_up, verifiers, system::cgroup_memory().map(|c| c.used))
                    });
                    if let Err(why) = room {
                        // Tried again every pass, without backing off: room comes as
                        // the pods setting up finish loading (a node's pods at once).
                        if self.over_budget.insert(pod.id.clone(), pod_name(pod)).is_none() {
                            tracing::warn!(pod = %pod_name(pod), "{why}: the pod is left ungated until there is room");
                            self.endpoint.1.set(&pod_name(pod), "memory-budget", &why);
                        }
                        continue;
                    }
                    self.burst_until = Some(Instant::now() + BURST_WINDOW);
                    if let Err(e) = self.start(pod, settings, netns) {
                        let wait = self.failed.failed(&pod.id, Instant::now());
                        self.gate_failed(&pod.id, pod_name(pod), &e, wait);
                    }
                }
                Err(why) => {
                    tracing::warn!(pod = %pod_name(pod), "{why}: the pod is left ungated");
                    // The annotation it names, for the metric.
                    if let Some(annotation) = &why.annotation {
                        self.endpoint.1.set(&pod_name(pod), annotation, &why.to_string());
                    }
                    self.refused.insert(pod.id.clone(), pod_name(pod));
                }
            }
        }
        self.endpoint.2.set_pods(self.states());
    }

    /// The pods that ask for a gate, by state ([`PodState::ALL`]'s order).
    fn states(&self) -> [u64; 4] {
        let ticked = self.running.values().filter(|g| g.heartbeat.age().is_some()).count() as u64;
        let setting_up = self.running.len() as u64 - ticked;
        let leaving = self.stopping && self.dispatcher.as_ref().is_some_and(|d| d.leaving());
        // Pods setting up that the last agent left judging: its programs judge them until taken over.
        let inherited = if setting_up > 0 && self.dispatcher.as_ref().is_some_and(|d| d.inheriting()) {
            let left = crate::kernel::handover::handing_over_labels();
            self.running.values().filter(|g| g.heartbeat.age().is_none() && left.contains(&g.label)).count() as u64
        } else {
            0
        };
        PodState::ALL.map(|state| match state {
            PodState::Gated if !leaving => ticked,
            PodState::HandingOver if leaving => ticked + inherited,
            PodState::Gated => 0,
            PodState::HandingOver => inherited,
            PodState::Waiting => setting_up - inherited + self.over_budget.len() as u64,
            PodState::Refused => (self.refused.len() + self.set_up_failed.len()) as u64,
        })
    }

    async fn list(&mut self) -> Result<Vec<PodSandbox>, crate::error::Error> {
        let client = match &mut self.client {
            Some(client) => client,
            None => self.client.insert(cri::connect(&self.socket).await?),
        };
        cri::pod_sandboxes(client, &self.socket, &mut self.networks).await
    }

    fn start(&mut self, pod: &PodSandbox, settings: GatePlan, netns: String) -> anyhow::Result<()> {
        let plan = pod_plan(&self.node, settings);
        let ports = plan.ports.clone();
        let handles = Handles {
            dispatcher: self.dispatcher.clone(),
            spare: self.spare.take(),
            judged_before: self.judged_before.contains(&pod.id),
        };
        let start = GateStart { node: self.node.clone(), plan, scope: Scope::Pod, handles };
        let gate = Gate::new(Some(netns));
        let (stop, stopped) = watch::channel(false);
        let signals = LoopSignals { stop: stopped, reload: self.reloads.clone() };
        let end = GateEnd::new(self.done.clone(), GateId::Pod(pod.id.clone()), &gate);
        // Named for stats, top and `--pod` before its pins appear.
        let name_file = Path::new(paths::POD_NAMES).join(&gate.label);
        std::fs::create_dir_all(paths::POD_NAMES)
            .and_then(|()| std::fs::write(&name_file, pod_name(pod)))
            .map_err(|e| crate::error::Error::io("write the pod's name to", &name_file, e))?;
        let thread = gate::spawn(gate.clone(), start, signals, None, end)?;
        self.endpoint.0.add(gate.endpoint(Some(pod_name(pod))));
        // Refused earlier for memory, gated now.
        if self.over_budget.remove(&pod.id).is_some() {
            self.endpoint.1.clear(&pod_name(pod));
        }
        tracing::info!(pod = %pod_name(pod), netns = %gate.label, ports = ?ports, "gating the pod");
        self.running.insert(
            pod.id.clone(),
            PodGate {
                pod: pod_name(pod),
                label: gate.label,
                stop,
                thread: Some(thread),
                started: Instant::now(),
                heartbeat: gate.heartbeat.clone(),
            },
        );
        Ok(())
    }

    /// Ends a pod's gate (its pod went, or the agent stops) and waits for its thread.
    async fn stop(&mut self, id: &str) {
        let Some(mut gate) = self.running.remove(id) else { return };
        let _ = gate.stop.send(true);
        if let Some(thread) = gate.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let leaving = self.dispatcher.as_ref().is_some_and(|d| d.leaving());
        if !leaving {
            // Left judging, the pod keeps its name for `stats` until the next agent takes it over.
            let _ = std::fs::remove_file(Path::new(paths::POD_NAMES).join(&gate.label));
        }
        if !self.stopping {
            tracing::info!(pod = %gate.pod, "the pod is gone: its gate detached");
        } else if leaving {
            tracing::info!(pod = %gate.pod, "its gate left judging for the next agent");
        } else {
            tracing::info!(pod = %gate.pod, "its gate detached: the agent stops");
        }
    }

    /// A pod's gate ended by itself: its set-up failed, or its loop did, or
    /// (`Ok`) an operator detached its last port. A failure is tried again
    /// later: what failed may pass (memory, a verifier interrupted), and what
    /// fails again costs one try per wait, the wait doubling up to
    /// [`RETRY_MOST`]. A detached pod stays ungated, as the operator asked,
    /// until the agent restarts. A pod that goes meanwhile is forgotten.
    pub(super) fn ended(&mut self, id: &str, result: anyhow::Result<()>) {
        let Some(gate) = self.running.remove(id) else { return };
        let _ = std::fs::remove_file(Path::new(paths::POD_NAMES).join(&gate.label));
        if let Err(e) = result {
            if gate.started.elapsed() > RETRY_MOST {
                self.failed.forget(id);
            }
            let wait = self.failed.failed(id, Instant::now());
            self.gate_failed(id, gate.pod, &e, wait);
        } else {
            tracing::info!(pod = %gate.pod, "the pod's gate ended (its ports detached): the pod stays ungated");
            // Ungated as an operator asked: no failure of its is shown any longer.
            if self.set_up_failed.remove(id).is_some() {
                self.endpoint.1.clear(&gate.pod);
            }
            self.refused.insert(id.to_owned(), gate.pod);
        }
    }

    /// A pod whose gate failed to start, set up, or run: said in the log and,
    /// loud in the metrics too, in `shed_pod_refused` (in place of any
    /// memory-budget refusal of its) until a gate of its runs; tried again in `wait`.
    fn gate_failed(&mut self, id: &str, pod: String, e: &anyhow::Error, wait: Duration) {
        tracing::warn!(pod = %pod, "{e:#}: the pod is left ungated; trying again in {} s", wait.as_secs());
        self.over_budget.remove(id);
        self.endpoint.1.set(&pod, failure_key(e), &format!("{e:#}"));
        self.set_up_failed.insert(id.to_owned(), pod);
    }

    /// On SIGTERM (a restart, a rolling update): every pod is left judged by
    /// the shared object for the next agent, which takes each over
    /// (`kernel::handover`); without a shared object, each is detached.
    /// Whether they are left.
    pub(super) fn leave_for_successor(&mut self) -> bool {
        let Some(dispatcher) = &self.dispatcher else { return false };
        if let Err(e) = dispatcher.leave_for_successor(crate::kernel::handover::HANDOVER_LEASE) {
            tracing::warn!("{}: every pod is detached as the agent stops", crate::error::chain(&e));
        }
        let leaving = dispatcher.leaving();
        // What the metrics show meanwhile: the pods judged, handed over.
        self.stopping = true;
        self.endpoint.2.set_pods(self.states());
        leaving
    }

    /// Ends every pod's gate (the daemon stops).
    pub(super) async fn stop_all(&mut self) {
        self.stopping = true;
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in &ids {
            if let Some(gate) = self.running.get(id) {
                let _ = gate.stop.send(true);
            }
        }
        for id in ids {
            self.stop(&id).await;
        }
    }
}

/// What `shed_pod_refused` names for a pod whose gate failed: `netfilter-nat`
/// for a NAT rule in its namespace that would take its connections past the
/// gate (a service mesh's redirect, present when its gate set up), else `set-up`.
fn failure_key(e: &anyhow::Error) -> &'static str {
    if e.chain().any(<dyn std::error::Error>::is::<super::gate::NatBypass>) { "netfilter-nat" } else { "set-up" }
}

/// `namespace/name`, as kubectl names a pod.
fn pod_name(pod: &PodSandbox) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

/// What a pod's gate would be (its settings and namespace), `None` when it
/// asks for none, or why it cannot have one.
fn gate_for(pod: &PodSandbox, read: &PodReader) -> Result<Option<(GatePlan, String)>, PodRefusal> {
    let Some(settings) = read(&pod.annotations)? else { return Ok(None) };
    if pod.host_network {
        return Err(PodRefusal::of_pod(
            "a host-network pod shares the node's namespace: gate its ports with the node's own --port",
        ));
    }
    let path = pod
        .netns
        .as_deref()
        .ok_or_else(|| PodRefusal::of_pod("the runtime reports no network namespace for the pod"))?;
    Ok(Some((settings, paths::netns_name(path))))
}

/// A pod's gate plan: its annotations' settings, each port once, and its
/// tiers: the node's hold in every pod (the kubelet probes pods from the
/// node: a node that exempts its own addresses keeps its pods' probes
/// flowing), the pod's own over them for the same network, but for the
/// node's loopback tiers: a pod's loopback is the pod's own, where a sidecar
/// proxy (Istio, Linkerd) hands the app every request, and the node's
/// `127.0.0.0/8 = exempt` would exempt them all. A pod may tier its loopback
/// itself. Where and how its gate attaches, map sizes, healing and logging
/// are the node's ([`NodePlan`]).
fn pod_plan(node: &NodePlan, settings: GatePlan) -> GatePlan {
    let mut ports = settings.ports;
    ports.sort_unstable();
    ports.dedup();
    let mut tiers = node.gate.tiers.clone();
    tiers.retain(|cidr, _| !cidr.within_loopback());
    tiers.extend(settings.tiers);
    GatePlan { ports, tiers, ..settings }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pod_is_refused_for_its_nat_rule_even_under_context_else_for_its_set_up() {
        let nat = || super::super::gate::NatBypass { port: 8080, what: "nftables table ip nat".into() };
        assert_eq!(failure_key(&anyhow::Error::new(nat())), "netfilter-nat");
        assert_eq!(failure_key(&anyhow::Error::new(nat()).context("set up the pod's gate")), "netfilter-nat");
        assert_eq!(failure_key(&anyhow::anyhow!("attach TC ingress to eth0")), "set-up");
        let said = format!("{}", nat());
        assert!(said.starts_with("port 8080: nftables table ip nat: netfilter rewrites"), "{said}");
    }

    #[test]
    fn the_runtime_is_looked_at_soon_while_pods_come_and_at_the_usual_pace_after() {
        let now = Instant::now();
        assert_eq!(look_pace(None, now), LOOK_EVERY, "a node where no pod came yet");
        let until = now + BURST_WINDOW;
        assert_eq!(look_pace(Some(until), now), LOOK_SOON);
        assert_eq!(look_pace(Some(until), now + BURST_WINDOW / 2), LOOK_SOON, "within the window");
        let last = until.checked_sub(Duration::from_millis(1)).expect("an instant 2 s on");
        assert_eq!(look_pace(Some(until), last), LOOK_SOON, "to its very end");
        assert_eq!(look_pace(Some(until), until), LOOK_EVERY, "the window is over");
        assert!(LOOK_SOON < LOOK_EVERY);
    }

    #[test]
    fn a_failed_pod_waits_longer_after_each_try_and_is_forgotten_when_gone() {
        let mut retries = Retries::default();
        let start = Instant::now();
        assert!(!retries.waiting("a", start), "a pod never failed waits for nothing");
        let waits: Vec<u64> = (0..10).map(|_| retries.failed("a", start).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        let mut retries = Retries::default();
        assert_eq!(retries.failed("a", start), RETRY_FIRST);
        assert!(retries.waiting("a", start + Duration::from_secs(1)));
        assert!(!retries.waiting("a", start + RETRY_FIRST), "due at its time");
        assert!(!retries.waiting("b", start), "each pod its own");
        retries.failed("b", start);
        retries.keep_present(&BTreeSet::from(["b"]));
        assert!(!retries.waiting("a", start), "a pod gone is forgotten");
        assert!(retries.waiting("b", start));
        // A gate that ran well starts its waits over.
        assert_eq!(retries.failed("b", start), 2 * RETRY_FIRST);
        retries.forget("b");
        assert!(!retries.waiting("b", start));
        assert_eq!(retries.failed("b", start), RETRY_FIRST, "from the first wait again");
    }

    fn pod(annotations: &[(&str, &str)], netns: Option<&str>, host_network: bool) -> PodSandbox {
        PodSandbox {
            id: "id".into(),
            namespace: "shop".into(),
            name: "web-0".into(),
            annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            netns: netns.map(PathBuf::from),
            host_network,
        }
    }

    /// A reader that asks for a gate on 8080 when `shed.io/ports` is there, refuses `bad`.
    fn reader() -> PodReader {
        Box::new(|a: &BTreeMap<String, String>| match a.get("shed.io/ports").map(String::as_str) {
            None => Ok(None),
            Some("bad") => Err(PodRefusal { annotation: Some("shed.io/ports".into()), reason: "bad".into() }),
            Some(_) => Ok(Some(GatePlan {
                ports: vec![8080],
                spec: crate::kernel::maps::PortSpec::default(),
                tiers: BTreeMap::new(),
                action: crate::kernel::options::Action::Rst,
                count: crate::kernel::options::Count::Connections,
                dry_run: false,
                window: std::time::Duration::from_millis(100),
                handshake_window: std::time::Duration::ZERO,
                agent_port: Some(9500),
            })),
        })
    }

    #[test]
    fn a_pod_that_asks_is_gated_in_its_own_namespace() {
        let read = reader();
        let asks = [("shed.io/ports", "8080")];
        let (settings, netns) = gate_for(&pod(&asks, Some("/var/run/netns/cni-1"), false), &read).unwrap().unwrap();
        assert_eq!((settings.ports.as_slice(), netns.as_str()), (&[8080][..], "cni-1"));
        assert!(gate_for(&pod(&[("app", "x")], Some("/var/run/netns/cni-1"), false), &read).unwrap().is_none());
        let bad = gate_for(&pod(&[("shed.io/ports", "bad")], Some("/run/netns/a"), false), &read);
        let bad = bad.unwrap_err();
        assert_eq!(bad.annotation.as_deref(), Some("shed.io/ports"), "named for the metric");
        assert_eq!(bad.to_string(), "annotation shed.io/ports: bad");
        let host = gate_for(&pod(&asks, None, true), &read).unwrap_err();
        assert!(host.annotation.is_none() && host.to_string().contains("host-network"), "{host}");
        let nowhere = gate_for(&pod(&asks, None, false), &read).unwrap_err();
        assert!(nowhere.annotation.is_none() && nowhere.to_string().contains("no network namespace"), "{nowhere}");
        assert_eq!(paths::netns_name(Path::new("/run/netns/cni-2")), "cni-2");
        assert_eq!(paths::netns_name(Path::new("/proc/42/ns/net")), "/proc/42/ns/net", "not a name: the path");
        assert_eq!(paths::netns_name(Path::new("/srv/netns/cni-3")), "/srv/netns/cni-3");
        assert_eq!(pod_name(&pod(&asks, None, false)), "shop/web-0", "as kubectl names it");
    }

    #[test]
    fn a_pods_plan_is_its_annotations_with_the_nodes_tiers_but_loopback() {
        let cidr = |s: &str| {
            let (addr, len) = s.split_once('/').unwrap();
            let v4: std::net::Ipv4Addr = addr.parse().unwrap();
            crate::kernel::options::Cidr {
                prefix_len: 96 + len.parse::<u32>().unwrap(),
                addr: shed_common::ipv4_mapped(v4.octets()),
            }
        };
        let loopback_v6 =
            crate::kernel::options::Cidr { prefix_len: 128, addr: std::net::Ipv6Addr::LOCALHOST.octets() };
        let mut node = crate::daemon::plan::tests::node_plan();
        node.gate.tiers = [
            (cidr("10.0.0.0/8"), 0),
            (cidr("192.168.0.0/16"), 3),
            (cidr("127.0.0.0/8"), 0),
            (cidr("127.0.0.1/32"), 1),
            (loopback_v6, 0),
        ]
        .into();
        let mut settings = (reader())(&[("shed.io/ports".to_owned(), "x".to_owned())].into()).unwrap().unwrap();
        settings.ports = vec![9090, 8080, 9090];
        settings.tiers = [(cidr("192.168.0.0/16"), 1), (cidr("172.16.0.0/12"), 2), (cidr("127.0.0.6/32"), 2)].into();
        let plan = pod_plan(&node, settings);
        assert_eq!(plan.ports, [8080, 9090], "each port once");
        let tiers: Vec<(String, u8)> = plan.tiers.iter().map(|(c, t)| (c.to_string(), *t)).collect();
        assert_eq!(
            tiers,
            [
                ("10.0.0.0/8".to_owned(), 0),
                ("172.16.0.0/12".to_owned(), 2),
                ("192.168.0.0/16".to_owned(), 1),
                ("127.0.0.6/32".to_owned(), 2)
            ],
            "the node's tiers but its loopback ones (a pod's sidecar), the pod's over them"
        );
        assert_eq!(
            (plan.action, plan.count, plan.dry_run),
            (crate::kernel::options::Action::Rst, crate::kernel::options::Count::Connections, false),
            "the pod's"
        );
        assert_eq!(plan.window, std::time::Duration::from_millis(100));
        assert_eq!(plan.agent_port, Some(9500), "the pod's agent port (its annotation, else the node's config)");
    }
}
