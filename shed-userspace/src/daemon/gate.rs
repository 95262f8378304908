// SPDX-License-Identifier: MIT OR Apache-2.0
//! One namespace's gate, on its own thread inside the namespace: set up (load,
//! pin, configure, attach), then the control loop and the kernel-log
//! forwarder until the daemon stops; detached on the way out, still inside.
use std::{fs, sync::Arc, time::Duration};

use anyhow::Context as _;

use crate::{
    daemon::{
        self, FollowInterfaces, LocalAddrs, LoopSettings,
        plan::{GatePlan, NodePlan, Scope},
    },
    error::Error,
    host::system,
    kernel::{
        maps::PortSpec,
        options::{Action, Hook, XdpAttachMode},
        programs::{Loaded, Prepared, default_hook},
    },
};

/// Longest control-loop period.
const TICK: Duration = Duration::from_millis(100);

/// What one gate's thread runs with: the node's plan, the gate's own, where
/// it stands, and the live handles it starts from.
pub(super) struct GateStart {
    pub(super) node: Arc<NodePlan>,
    pub(super) plan: GatePlan,
    pub(super) scope: Scope,
    pub(super) handles: Handles,
}

/// Live handles a gate starts from (a pod's, from the node agent).
#[derive(Default)]
pub(super) struct Handles {
    /// The node's dispatcher its connections are counted through (None: its
    /// accounting programs attach themselves, as a named namespace's do).
    pub(super) dispatcher: Option<Arc<crate::kernel::dispatch::Dispatcher>>,
    /// The node agent's spare object, its programs verified ahead (None: it loads its own).
    pub(super) spare: Option<Prepared>,
    /// A pod this agent's gate judged before (a gate that failed later, and
    /// is set up again): a NAT rule found now came after its first gate.
    pub(super) judged_before: bool,
}

impl GateStart {
    /// The hook its interfaces are gated at: the node's shared object's,
    /// TC, for a pod under it; otherwise `hook` (None: each interface's default).
    pub(super) fn hook(&self, hook: Option<Hook>) -> Option<Hook> {
        if self.handles.dispatcher.as_ref().is_some_and(|d| d.shared()) { Some(Hook::Tc) } else { hook }
    }

    /// The interfaces to gate: the node's `--iface` for a named namespace
    /// (empty: all, followed), every interface of a pod's.
    fn ifaces(&self) -> &[String] {
        match self.scope {
            Scope::Named => &self.node.ifaces,
            Scope::Pod => &[],
        }
    }

    /// Whether other gates of this node count sockets beside this one in a
    /// namespace filter that cannot tell them apart (named namespaces only;
    /// a pod's gate warns, as a single namespace's does).
    fn beside_others(&self) -> bool {
        self.scope == Scope::Named && self.node.namespaces.len() > 1
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
    pub(super) ended: Arc<std::sync::atomic::AtomicBool>,
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
            ended: Arc::default(),
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
        return Err(NatBypass { port, what }.into());
    }
    Ok(())
}

/// A netfilter NAT rule that would take a protected port's connections past
/// the gate: why a gate refused to set up (a pod's refusal names it).
#[derive(Debug, thiserror::Error)]
#[error(
    "port {port}: {what}: netfilter rewrites the destination after the gate has seen the packet, so these \
     connections would reach the listener unjudged. Publish the service on the port clients use, gate the \
     namespace where the socket lives (--netns), or attach anyway with --allow-nat"
)]
pub(super) struct NatBypass {
    pub(super) port: u16,
    pub(super) what: String,
}

/// Interfaces (name, index) a gate has considered: gated or left out.
pub(super) type Considered = Vec<(String, u32)>;

/// Enters the gate's namespace (this thread), then loads, pins, configures
/// and attaches its programs; returns them with the addresses written and
/// the interfaces considered (gated or left out), for the loop to follow.
pub(super) fn set_up(gate: &Gate, start: &mut GateStart) -> anyhow::Result<(Loaded, Following)> {
    if let Some(netns) = &gate.netns {
        system::enter_netns(netns)?;
    }
    let (node, plan) = (start.node.clone(), &start.plan);
    // Taken before the interfaces are chosen: one that appears meanwhile is
    // not in it, and the loop gates it on its first look.
    let seen = system::interfaces_indexed();
    // A pod under the node's shared object: its programs (TC) judge and count
    // for it, and it brings only its maps.
    let shared = start.handles.dispatcher.as_ref().is_some_and(|d| d.shared());
    let targets = targets(start.ifaces(), start.hook(node.hook))?;
    // Where the last agent left a link to take over, the pod was judged until
    // now (an agent's restart or rolling update).
    let takes_over = start
        .handles
        .dispatcher
        .as_ref()
        .is_some_and(|d| d.shared() && targets.iter().any(|(iface, _)| d.inherits(iface)));
    // A NAT rule that would take a protected port past the gate refuses it,
    // but for a pod judged before (taken over from the last agent, or set up
    // again by this one): a rule added after its first gate (a mesh's
    // redirect, as its init container runs) left it gated and reported, and a
    // restart of the agent or of its gate must not turn that into an ungated
    // pod. The loop's first look at the NAT reports the rule as any found
    // after attach.
    if !takes_over && !start.handles.judged_before {
        refuse_nat_bypass(&plan.ports, node.allow_nat)?;
    }
    // In the namespace, before anything loads: a busy port refuses the gate.
    let agent = plan.agent_port.map(crate::observe::agent::bind).transpose()?;
    fs::create_dir_all(&gate.pin_dir).map_err(|e| Error::io("create pin folder", &gate.pin_dir, e))?;
    let options = node.load_options(start.scope);
    let mut loaded = if shared {
        Loaded::maps_only(Some(&gate.pin_dir), options)
    } else {
        match start.handles.spare.take().filter(|s| s.fits(options, node.spare_hook())) {
            Some(spare) => Loaded::from_prepared(spare, Some(&gate.pin_dir)),
            None => Loaded::sized(Some(&gate.pin_dir), options),
        }
    }
    .context("loading the kernel programs")?;
    for (&cidr, &tier) in &plan.tiers {
        loaded.maps.set_tier(cidr, tier)?;
    }
    let filter = system::netns_filter();
    match filter.clone() {
        Ok(filter) => loaded.maps.set_netns_filter(filter)?,
        // Several gates on one port would each count the others' connections.
        Err(why) if start.beside_others() => anyhow::bail!(
            "cannot tell the namespaces' sockets apart ({why}), so several namespaces cannot be gated at once: gate one namespace per daemon"
        ),
        Err(why) => tracing::warn!(
            "counting sockets of every network namespace ({why}): another namespace serving the same port would share the counts"
        ),
    }
    // A TFO SYN's request reaches the server before the connection is
    // tracked or any request is judged: under `work`, where requests are what
    // is counted, servers' Fast Open is off while the gate runs (a client
    // then sends its request after the handshake, one round trip later).
    let fast_open = if plan.count == crate::kernel::options::Count::Work {
        let off = system::FastOpenOff::take()?;
        if let Some((was, now)) = off.as_ref().map(system::FastOpenOff::values) {
            tracing::warn!(
                tcp_fastopen = was,
                now,
                "turned servers' TCP Fast Open off in this namespace while the gate runs (net.ipv4.tcp_fastopen {was} -> {now}): a TFO SYN carries a request the gate cannot judge; put back when the gate stops"
            );
        }
        off
    } else {
        if let Some(mode) = system::fast_open_for_servers() {
            tracing::warn!(
                tcp_fastopen = mode,
                "net.ipv4.tcp_fastopen lets servers in this namespace accept TCP Fast Open: a TFO SYN's data reaches the server before any ACK, so such connections are judged at their SYN only; set net.ipv4.tcp_fastopen=1 (clients only) to judge every connection at its handshake-completing ACK"
            );
        }
        None
    };
    // Before any gate: only SYNs addressed to these are judged.
    let mut local_addrs = LocalAddrs::default();
    local_addrs.refresh(&mut loaded.maps)?;
    match (&start.handles.dispatcher, filter) {
        (Some(dispatcher), Ok(filter)) => {
            let dispatched = dispatcher.add(&mut loaded, filter.inum)?;
            gate.dispatch.set(dispatcher.clone(), dispatched.gate());
            loaded.dispatched = Some(Box::new(dispatched));
        }
        (_, Err(why)) if shared => {
            anyhow::bail!("the node's shared programs cannot tell this pod's namespace ({why}): not gated")
        }
        _ => loaded.attach_accounting()?,
    }
    let spec = PortSpec { handshake_shift: crate::control::handshake::shift_for(plan.handshake_window), ..plan.spec };
    // First where the last agent left a link to take over: it runs this
    // gate's program the moment it is taken, and must find the ports
    // protected (the pod was judged until then; taking over loads nothing).
    if takes_over {
        for &port in &plan.ports {
            loaded.maps.protect(port, &spec)?;
        }
        // And with the connections the pod holds counted: this gate's program
        // judges from the moment it is taken, against them.
        match crate::daemon::heal::take_over_held(&mut loaded.maps) {
            Ok(0) => {}
            Ok(adopted) => tracing::info!(adopted, "the pod's held connections counted before its link is taken over"),
            // Not counted: the healer's first passes adopt them, as for any gate.
            Err(e) => tracing::warn!("could not count the pod's held connections before taking it over: {e}"),
        }
    }
    let ifaces: Vec<&str> = targets.iter().map(|(iface, _)| iface.as_str()).collect();
    if loaded.attach_shared(&ifaces)? {
        for iface in ifaces {
            tracing::info!(iface = %iface, hook = %Hook::Tc, "gate attached");
        }
    } else {
        for (iface, hook) in &targets {
            attach_to(&mut loaded, iface, *hook, &node, plan.action)?;
        }
    }
    // Otherwise last: a port is listed (`stats`, `/readyz`) once written, so
    // only when every interface's program is attached and judges it (a pod
    // is never shown gated while nothing judges it; attaching a gate's own
    // program loads it: a second of the verifier's).
    if !takes_over {
        for &port in &plan.ports {
            loaded.maps.protect(port, &spec)?;
        }
    }
    gate.heartbeat.beat();
    Ok((loaded, Following { local_addrs, seen, agent, fast_open }))
}

/// Attaches the gate's program to `iface` on `hook`, saying so.
fn attach_to(loaded: &mut Loaded, iface: &str, hook: Hook, node: &NodePlan, action: Action) -> anyhow::Result<()> {
    // Native XDP_TX on a veth is delivered only to a peer running XDP itself (generic mode
    // transmits an skb, which arrives anyway).
    let native = node.xdp_mode != XdpAttachMode::Generic;
    if hook == Hook::Xdp
        && native
        && matches!(action, Action::Rst | Action::Http)
        && system::driver(iface).as_deref() == Some("veth")
    {
        tracing::warn!(
            iface = %iface,
            "XDP on a veth with --action rst: the RSTs (XDP_TX) reach the other end only if it runs an XDP program of its own; otherwise refused clients time out instead, while rst_sent still counts them. Use --hook tc (the default on veth) or --action drop"
        );
    }
    loaded.attach_gate(iface, hook, node.xdp_mode)?;
    match hook {
        Hook::Xdp => tracing::info!(iface = %iface, hook = %hook, xdp_mode = %node.xdp_mode, "gate attached"),
        Hook::Tc => tracing::info!(iface = %iface, hook = %hook, "gate attached"),
    }
    Ok(())
}

/// What a gate's set-up hands its loop besides the programs: the addresses
/// and interfaces it follows, and the agent's listener.
pub(super) struct Following {
    pub(super) local_addrs: LocalAddrs,
    pub(super) seen: Considered,
    pub(super) agent: Option<std::net::TcpListener>,
    /// Servers' Fast Open, off while the gate runs (put back as it ends).
    pub(super) fast_open: Option<system::FastOpenOff>,
}

/// Runs one namespace's control loop until the daemon stops; detaches its
/// programs on the way out, still inside the namespace.
pub(super) fn run(
    gate: &Gate,
    loaded: &mut Loaded,
    Following { local_addrs, seen, agent, fast_open: _fast_open_back_at_the_end }: Following,
    _go: Instance,
    start: &GateStart,
    signals: LoopSignals,
) -> anyhow::Result<()> {
    let (node, plan) = (&start.node, &start.plan);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    if let Some(listener) = agent {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(port = addr.port(), "answering load-balancer agent checks");
        }
        crate::observe::agent::serve(listener, gate.pin_dir.clone(), gate.label.clone(), gate.ended.clone());
    }
    let follow_interfaces = start.ifaces().is_empty().then_some(FollowInterfaces {
        hook: start.hook(node.hook),
        xdp_mode: node.xdp_mode,
        seen,
    });
    let settings = LoopSettings {
        tick: TICK.min(plan.window),
        handshake_window: plan.handshake_window,
        decisions: gate.decisions.clone(),
        follow_interfaces,
        local_addrs,
        heal_interval: node.heal_interval,
        one_of_many: start.scope == Scope::Pod,
        heal_report: gate.heal.clone(),
        heartbeat: gate.heartbeat.clone(),
        task_errors: gate.task_errors.clone(),
        nat: gate.nat.clone(),
        allow_nat: node.allow_nat,
        reload: node.reloader.as_ref().filter(|_| start.scope == Scope::Named).map(|make| make()),
        stop: signals.stop,
        reload_requests: signals.reload,
    };
    // aya-log's records wait in a ring buffer until read: poll it beside the loop.
    // A pod's gate under the shared object has no programs of its own to log.
    let kernel_log = if let (true, Some(ebpf)) = (node.kernel_log, loaded.ebpf.as_mut()) {
        match aya_log::EbpfLogger::init(ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                tracing::warn!("kernel log unavailable ({e}): the rare paths are still counted in stats");
                None
            }
        }
    } else {
        None
    };
    crate::host::system::release_freed_memory();
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
pub(super) fn spawn(
    gate: Gate,
    mut start: GateStart,
    signals: LoopSignals,
    barrier: Option<(std::sync::mpsc::Sender<anyhow::Result<()>>, std::sync::mpsc::Receiver<Instance>)>,
    mut end: GateEnd,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("shed-{}", gate.label))
        .spawn(move || {
            let _span = tracing::info_span!("gate", netns = %gate.label).entered();
            let loaded = set_up(&gate, &mut start).with_context(|| format!("network namespace {}", gate.label));
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
            let result = run(&gate, &mut loaded, following, instance, &start, signals);
            drop(loaded); // detaches its links (or leaves them for the next agent), inside the namespace
            if gate.netns.is_some() {
                // Left judging for the next agent, its maps go beside its links
                // (`stats` shows it handed over); otherwise the namespace's
                // ports are gone (or the daemon stops): so are its pins.
                let left = start.handles.dispatcher.as_ref().and_then(|d| d.leaving_dir());
                if !left.is_some_and(|left| crate::kernel::handover::leave_pins(&gate.pin_dir, &left, &gate.label)) {
                    let _ = crate::kernel::maps::remove_pins(&gate.pin_dir);
                }
            }
            end.tell(result.with_context(|| format!("network namespace {}", gate.label)));
        })
        .context("starting a gate thread")
}

/// A gate, as the daemon's control channel names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum GateId {
    /// A namespace the node names, by its label.
    Named(String),
    /// A pod's, by its sandbox id.
    Pod(String),
}

/// Where every gate tells how it ended.
pub(super) type GateEnds = tokio::sync::mpsc::UnboundedSender<(GateId, anyhow::Result<()>)>;

/// Tells the daemon how a gate thread ended, once; a thread that panics tells it too.
pub(super) struct GateEnd {
    done: GateEnds,
    id: GateId,
    ended: Arc<std::sync::atomic::AtomicBool>,
    told: bool,
}

impl GateEnd {
    /// Tells `done` as `(id, result)`.
    pub(super) fn new(done: GateEnds, id: GateId, gate: &Gate) -> Self {
        Self { done, id, ended: gate.ended.clone(), told: false }
    }

    fn tell(&mut self, result: anyhow::Result<()>) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.done.send((self.id.clone(), result));
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
pub(super) async fn forward_kernel_log(logger: crate::kernel::dispatch::KernelLogger) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_gate_takes_the_nodes_interfaces_and_a_pods_gate_every_one() {
        let mut node = crate::daemon::plan::tests::node_plan();
        node.namespaces = vec![Some("a".into()), Some("b".into())];
        let node = Arc::new(node);
        let start =
            |scope| GateStart { node: node.clone(), plan: node.gate.clone(), scope, handles: Handles::default() };
        let named = start(Scope::Named);
        assert_eq!(named.ifaces(), ["eth9"], "--iface");
        assert!(named.beside_others(), "two named namespaces");
        let pod = start(Scope::Pod);
        assert!(pod.ifaces().is_empty(), "every interface of the pod's namespace, followed");
        assert!(!pod.beside_others(), "a pod's gate stands alone");
    }
}
