// SPDX-License-Identifier: MIT OR Apache-2.0
//! One namespace's gate, on its own thread inside the namespace: set up (load,
//! pin, configure, attach), then the control loop and the kernel-log
//! forwarder until the daemon stops; detached on the way out, still inside.
use std::{collections::BTreeMap, fs, net::SocketAddr, time::Duration};

use anyhow::Context as _;

use crate::{
    daemon::{self, FollowInterfaces, LocalAddrs, LoopSettings, Reloader},
    error::Error,
    host::system,
    kernel::{
        maps::PortSpec,
        object::{LoadOptions, SockStateHook},
        options::{Action, Cidr, Count, Hook, XdpAttachMode},
        programs::{Loaded, Prepared, default_hook},
    },
};

/// Longest control-loop period.
const TICK: Duration = Duration::from_millis(100);

/// What `attach` decided and checked: everything the daemon runs its gates with.
pub(crate) struct Plan {
    /// The ports to protect (a port given twice is protected once).
    pub ports: Vec<u16>,
    pub spec: PortSpec,
    pub tiers: BTreeMap<Cidr, u8>,
    /// The namespaces to gate (None: the daemon's own), each once ([`namespaces`]).
    pub namespaces: Vec<Option<String>>,
    /// `--iface`; empty: every interface of the namespace, followed as they come and go.
    pub ifaces: Vec<String>,
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    pub action: Action,
    pub count: Count,
    pub dry_run: bool,
    /// `--max-connections`, `--max-clients`, `--kernel-log`.
    pub max_connections: u32,
    pub max_clients: u32,
    pub kernel_log: bool,
    /// `--allow-nat`: attach even where netfilter NAT takes connections past the gate.
    pub allow_nat: bool,
    /// The shortest control window.
    pub window: Duration,
    /// A fixed handshake window, or zero for the default (about 8 ms).
    pub handshake_window: Duration,
    pub heal_interval: Duration,
    /// The metrics endpoint's address, and its readiness rule.
    pub metrics: Option<SocketAddr>,
    /// `--metrics-token-file`'s token: /metrics answers only a scrape that carries it.
    pub metrics_token: Option<std::sync::Arc<str>>,
    /// `--agent-port`: where each gate answers a load balancer's agent checks.
    pub agent_port: Option<u16>,
    /// `--memory-budget` (or most of the cgroup's limit): gates that would not fit are refused.
    pub memory_budget: Option<super::budget::Budget>,
    pub ready_max_shed: u8,
    pub ready_window: Duration,
    /// Makes a gate's reloader of the config file (SIGHUP), if one was given.
    pub reloader: Option<Box<dyn Fn() -> Reloader + Send + Sync>>,
    /// `--pods`: where the pods that ask for a gate are found, and how their asking is read.
    pub pods: Option<PodSource>,
    /// A pod's gate: the node's dispatcher its connections are counted through
    /// (None: its accounting programs attach themselves, as a node's gate's do).
    pub dispatcher: Option<std::sync::Arc<crate::kernel::dispatch::Dispatcher>>,
    /// A pod's gate: the node agent's spare object, its programs verified
    /// ahead (taken once, by the set-up; None: it loads its own).
    pub spare: std::sync::Mutex<Option<Prepared>>,
}

/// `--pods`: the container runtime's CRI socket, and the reader of a pod's annotations.
pub(crate) struct PodSource {
    pub socket: std::path::PathBuf,
    pub read: PodReader,
}

/// Reads a pod's annotations: the settings of the gate it asks for, `None`
/// when it asks for none, or why it cannot have one.
pub(crate) type PodReader = Box<dyn Fn(&BTreeMap<String, String>) -> Result<Option<PodSettings>, String> + Send + Sync>;

/// What a pod's annotations set for its gate (the node's plan gives the rest).
#[derive(Debug)]
pub(crate) struct PodSettings {
    pub ports: Vec<u16>,
    pub spec: PortSpec,
    pub tiers: BTreeMap<Cidr, u8>,
    pub action: Action,
    pub count: Count,
    pub dry_run: bool,
    pub window: Duration,
    pub handshake_window: Duration,
    pub agent_port: Option<u16>,
}

impl Plan {
    /// The hook a spare object is verified for: the plan's, else TC (a
    /// pod's interfaces are loopback and, with most CNI plugins, a veth).
    pub(super) fn spare_hook(&self) -> Hook {
        self.hook.unwrap_or(Hook::Tc)
    }

    pub(super) fn load_options(&self) -> LoadOptions {
        LoadOptions {
            connections: self.max_connections,
            clients: self.max_clients,
            kernel_log: self.kernel_log,
            sock_state: SockStateHook::Auto,
            dispatcher: false,
        }
    }
}

/// Go-ahead for a namespace's thread to run its control loop.
pub(super) struct Instance;

/// One namespace's gate, as the daemon's threads and endpoint share it.
#[derive(Clone)]
pub(super) struct Gate {
    pub(super) netns: Option<String>,
    pub(super) label: String,
    pub(super) pin_dir: std::path::PathBuf,
    pub(super) decisions: crate::observe::report::Decisions,
    pub(super) heal: crate::observe::report::HealReport,
    pub(super) heartbeat: crate::observe::report::Heartbeat,
    pub(super) task_errors: crate::observe::report::TaskErrors,
    pub(super) nat: crate::observe::report::NatReport,
    pub(super) dispatch: crate::observe::report::DispatchReport,
    /// Set when the gate's thread has ended (its ports detached, or the daemon stops).
    pub(super) ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Gate {
    /// The gate of `netns` (None: the daemon's own), before it is set up.
    pub(super) fn new(netns: Option<String>) -> Self {
        Self {
            label: crate::host::paths::netns_label(netns.as_deref()),
            pin_dir: crate::host::paths::gate_pin_dir(netns.as_deref()),
            netns,
            decisions: crate::observe::report::Decisions::default(),
            heal: crate::observe::report::HealReport::default(),
            heartbeat: crate::observe::report::Heartbeat::default(),
            task_errors: crate::observe::report::TaskErrors::default(),
            nat: crate::observe::report::NatReport::default(),
            dispatch: crate::observe::report::DispatchReport::default(),
            ended: std::sync::Arc::default(),
        }
    }

    /// The gate as the metrics endpoint reads it (`pod`: the pod it serves, `namespace/name`).
    pub(super) fn endpoint(&self, pod: Option<String>) -> crate::observe::endpoint::EndpointGate {
        crate::observe::endpoint::EndpointGate {
            netns: self.label.clone(),
            pod,
            pin_dir: self.pin_dir.clone(),
            decisions: self.decisions.clone(),
            heal: self.heal.clone(),
            heartbeat: self.heartbeat.clone(),
            task_errors: self.task_errors.clone(),
            nat: self.nat.clone(),
            dispatch: self.dispatch.clone(),
            ended: self.ended.clone(),
        }
    }
}

/// What a gate's loop hears from the daemon: stop, and reload the config.
pub(super) struct LoopSignals {
    pub(super) stop: tokio::sync::watch::Receiver<bool>,
    pub(super) reload: tokio::sync::watch::Receiver<u64>,
}

/// Refuses (or, with `--allow-nat`, warns of) netfilter NAT in this
/// namespace that takes connections to or from a protected port past the
/// gate: they would reach the listener unjudged.
fn refuse_nat_bypass(ports: &[u16], allow: bool) -> anyhow::Result<()> {
    // An unreadable ruleset is said once, by the loop's first look (`daemon::NatWatch`).
    for (port, what) in crate::host::nat::look().bypassed(ports) {
        if allow {
            tracing::warn!(port, nat = %what, "--allow-nat: connections this NAT rewrites reach the listener unjudged");
            continue;
        }
        anyhow::bail!(
            "port {port}: {what}: netfilter rewrites the destination after the gate has seen the packet, so these \
             connections would reach the listener unjudged. Publish the service on the port clients use, gate the \
             namespace where the socket lives (--netns), or attach anyway with --allow-nat"
        );
    }
    Ok(())
}

/// Interfaces (name, index) a gate has considered: gated or left out.
pub(super) type Considered = Vec<(String, u32)>;

/// Enters the gate's namespace (this thread), then loads, pins, configures
/// and attaches its programs; returns them with the addresses written and
/// the interfaces considered (gated or left out), for the loop to follow.
pub(super) fn set_up(gate: &Gate, plan: &Plan) -> anyhow::Result<(Loaded, Following)> {
    if let Some(netns) = &gate.netns {
        system::enter_netns(netns)?;
    }
    refuse_nat_bypass(&plan.ports, plan.allow_nat)?;
    // In the namespace, before anything loads: a busy port refuses the gate.
    let agent = plan.agent_port.map(crate::observe::agent::bind).transpose()?;
    // Taken before the interfaces are chosen: one that appears meanwhile is
    // not in it, and the loop gates it on its first look.
    let seen = system::interfaces_indexed();
    let targets = targets(&plan.ifaces, plan.hook)?;
    fs::create_dir_all(&gate.pin_dir).map_err(|e| Error::io("create pin folder", &gate.pin_dir, e))?;
    let spare = plan.spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let mut loaded = match spare.filter(|s| s.fits(plan.load_options(), plan.spare_hook())) {
        Some(spare) => Loaded::from_prepared(spare, Some(&gate.pin_dir)),
        None => Loaded::sized(Some(&gate.pin_dir), plan.load_options()),
    }
    .context("loading the kernel programs")?;
    for (&cidr, &tier) in &plan.tiers {
        loaded.maps.set_tier(cidr, tier)?;
    }
    let filter = system::netns_filter();
    match filter.clone() {
        Ok(filter) => loaded.maps.set_netns_filter(filter)?,
        // Several gates on one port would each count the others' connections.
        Err(why) if plan.namespaces.len() > 1 => anyhow::bail!(
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
    let mut local_addrs = LocalAddrs::default();
    local_addrs.refresh(&mut loaded.maps)?;
    match (&plan.dispatcher, filter) {
        (Some(dispatcher), Ok(filter)) => {
            let dispatched = dispatcher.add(&mut loaded, filter.inum)?;
            gate.dispatch.set(dispatcher.clone(), dispatched.gate());
            loaded.dispatched = Some(Box::new(dispatched));
        }
        _ => loaded.attach_accounting()?,
    }
    for (iface, hook) in &targets {
        // Native XDP_TX on a veth is delivered only to a peer running XDP itself (generic mode
        // transmits an skb, which arrives anyway).
        let native = plan.xdp_mode != XdpAttachMode::Generic;
        if *hook == Hook::Xdp
            && native
            && matches!(plan.action, Action::Rst | Action::Http)
            && system::driver(iface).as_deref() == Some("veth")
        {
            tracing::warn!(
                iface = %iface,
                "XDP on a veth with --action rst: the RSTs (XDP_TX) reach the other end only if it runs an XDP program of its own; otherwise refused clients time out instead, while rst_sent still counts them. Use --hook tc (the default on veth) or --action drop"
            );
        }
        loaded.attach_gate(iface, *hook, plan.xdp_mode)?;
        match hook {
            Hook::Xdp => {
                tracing::info!(iface = %iface, hook = %hook, xdp_mode = %plan.xdp_mode, "gate attached");
            }
            Hook::Tc => tracing::info!(iface = %iface, hook = %hook, "gate attached"),
        }
    }
    // Last: a port is listed (`stats`, `/readyz`) once written, so only when
    // every interface's program is attached and judges it (attaching loads
    // the program: a second of the verifier's, during which nothing is judged).
    let spec = PortSpec { handshake_shift: crate::control::handshake::shift_for(plan.handshake_window), ..plan.spec };
    for &port in &plan.ports {
        loaded.maps.protect(port, &spec)?;
    }
    gate.heartbeat.beat();
    Ok((loaded, Following { local_addrs, seen, agent }))
}

/// What a gate's set-up hands its loop besides the programs: the addresses
/// and interfaces it follows, and the agent's listener.
pub(super) struct Following {
    pub(super) local_addrs: LocalAddrs,
    pub(super) seen: Considered,
    pub(super) agent: Option<std::net::TcpListener>,
}

/// Runs one namespace's control loop until the daemon stops; detaches its
/// programs on the way out, still inside the namespace.
pub(super) fn run(
    gate: &Gate,
    loaded: &mut Loaded,
    Following { local_addrs, seen, agent }: Following,
    _go: Instance,
    plan: &Plan,
    signals: LoopSignals,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    if let Some(listener) = agent {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(port = addr.port(), "answering load-balancer agent checks");
        }
        crate::observe::agent::serve(listener, gate.pin_dir.clone(), gate.label.clone(), gate.ended.clone());
    }
    let follow_interfaces =
        plan.ifaces.is_empty().then_some(FollowInterfaces { hook: plan.hook, xdp_mode: plan.xdp_mode, seen });
    let settings = LoopSettings {
        tick: TICK.min(plan.window),
        handshake_window: plan.handshake_window,
        decisions: gate.decisions.clone(),
        follow_interfaces,
        local_addrs,
        heal_interval: plan.heal_interval,
        heal_report: gate.heal.clone(),
        heartbeat: gate.heartbeat.clone(),
        task_errors: gate.task_errors.clone(),
        nat: gate.nat.clone(),
        allow_nat: plan.allow_nat,
        reload: plan.reloader.as_ref().map(|make| make()),
        stop: signals.stop,
        reload_requests: signals.reload,
    };
    // aya-log's records wait in a ring buffer until read: poll it beside the loop.
    let kernel_log = if plan.kernel_log {
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

/// Starts a namespace's gate on a thread of its own that enters the namespace
/// first (interfaces, addresses, sockets and the listen-queue counters are all
/// read as that thread sees them), sets the gate up and runs its loop until
/// `signals.stop`; the pins of a named namespace go with it. With a `barrier`,
/// it reports its set-up there and runs only on the go-ahead (every namespace
/// set up, or none stays attached); without, a failed set-up is its end.
pub(super) fn spawn_gate(
    gate: Gate,
    plan: std::sync::Arc<Plan>,
    signals: LoopSignals,
    barrier: Option<(std::sync::mpsc::Sender<anyhow::Result<()>>, std::sync::mpsc::Receiver<Instance>)>,
    mut end: GateEnd,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("shed-{}", gate.label))
        .spawn(move || {
            let _span = tracing::info_span!("gate", netns = %gate.label).entered();
            let loaded = set_up(&gate, &plan).with_context(|| format!("network namespace {}", gate.label));
            let (mut loaded, following, instance) = match (loaded, barrier) {
                (Ok((loaded, following)), Some((ready, go))) => {
                    let _ = ready.send(Ok(()));
                    drop(ready);
                    // Every namespace answered: run, or (one of them failed) detach.
                    let Ok(instance) = go.recv() else { return end.tell(Ok(())) };
                    (loaded, following, instance)
                }
                (Ok((loaded, following)), None) => {
                    tracing::info!("gate set up: judging every new connection");
                    (loaded, following, Instance)
                }
                (Err(e), barrier) => {
                    // Pinned before what failed: a pod's set-up tried again pins there anew.
                    if gate.netns.is_some() {
                        let _ = crate::kernel::maps::remove_pins(&gate.pin_dir);
                    }
                    if let Some((ready, _)) = barrier {
                        let _ = ready.send(Err(e));
                        return end.tell(Ok(()));
                    }
                    return end.tell(Err(e));
                }
            };
            let result = run(&gate, &mut loaded, following, instance, &plan, signals);
            drop(loaded); // detaches its links, inside the namespace
            if gate.netns.is_some() {
                // The namespace's ports are gone (or the daemon stops): so are its pins.
                let _ = crate::kernel::maps::remove_pins(&gate.pin_dir);
            }
            end.tell(result.with_context(|| format!("network namespace {}", gate.label)));
        })
        .context("starting a gate thread")
}

/// Tells the daemon how a gate thread ended, once; a thread that panics tells it too.
pub(super) struct GateEnd {
    done: tokio::sync::mpsc::UnboundedSender<(String, anyhow::Result<()>)>,
    label: String,
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
    told: bool,
}

impl GateEnd {
    /// Tells `done` as `(label, result)`.
    pub(super) fn new(
        done: tokio::sync::mpsc::UnboundedSender<(String, anyhow::Result<()>)>,
        label: String,
        gate: &Gate,
    ) -> Self {
        Self { done, label, ended: gate.ended.clone(), told: false }
    }

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
