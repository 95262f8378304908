// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon's life: `process` (one per host, guarded by a lock file: its
//! pins, signals, a thread per network namespace, the ready barrier, the
//! metrics endpoint, a clean exit that leaves nothing attached or pinned);
//! `gate` (one namespace: set up, run, detach); and here the control loop
//! that runs the controllers, sizes each port's handshake window, and keeps
//! the namespace's addresses and interfaces covered.

pub(crate) mod audit;
pub(crate) mod budget;
pub(crate) mod gate;
pub mod heal;
mod lock;
mod pace;
pub(crate) mod plan;
mod pods;
mod port;
pub(crate) mod process;
mod refused;
mod stalled;

pub(crate) use lock::{ConfigLock, DaemonLock, PinGuard, require_running};
pub use lock::{Liveness, liveness, ready};
use pace::Pace;
use port::{AcceptQueues, PortControl};

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use crate::{
    error::Error,
    host::{paths, system},
    kernel::{
        maps::GateMaps,
        options::{Hook, XdpAttachMode},
        programs::{Loaded, default_hook},
    },
    observe::report::Decisions,
};

/// How often live changes are looked for, to log each (see [`crate::daemon::audit`]).
const AUDIT_EVERY: Duration = Duration::from_secs(1);

/// How often the healer checks the counters (a full pass runs only when due, see [`crate::daemon::heal`]).
const HEAL_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often an unhurried (quiet or light, see [`pace`]) pod's gate asks its
/// healer whether a pass is due. A pass reads the namespace's sockets
/// through sock_diag, whose dump walks the host's whole connection hash
/// (every namespace's buckets, empty or not): 110 idle pods' routine passes
/// were most of the agent's idle CPU. A quiet gate saw no event, so its
/// counts moved only if they were wrong already; a light one sees a few,
/// and each could be missed only as a busy port's can (a full map, which a
/// busy port's check sees). Its first busy tick looks again at once.
const UNHURRIED_POD_HEAL_CHECK_EVERY: Duration = Duration::from_mins(5);

/// How often the loop asks its healer whether a pass is due (see
/// [`UNHURRIED_POD_HEAL_CHECK_EVERY`]): a node's own gates keep their pace
/// whatever their ports do (one gate's pass is cheap). `unhurried`: the gate
/// is quiet or light, and its healer owes no pass (a restarted agent's
/// first, which finds the connections open, and the one that confirms them,
/// run at the usual pace).
fn heal_check_every(unhurried: bool, one_of_many: bool) -> Duration {
    if unhurried && one_of_many { UNHURRIED_POD_HEAL_CHECK_EVERY } else { HEAL_CHECK_EVERY }
}

/// How often each port's quota of the shared maps is written again, the ports unchanged.
const QUOTAS_EVERY: Duration = Duration::from_secs(5);

/// How often clients that hold nothing are looked for (and forgotten on the second look).
const CLIENT_SWEEP: Duration = Duration::from_secs(5);

/// How often the namespace's addresses and interfaces are looked at again
/// (rtnetlink's notifications bring a look forward), and while the gate is
/// quiet or light (see [`pace`]).
const WATCH_EVERY: Duration = Duration::from_secs(1);
const QUIET_WATCH_EVERY: Duration = Duration::from_secs(10);
/// How often netfilter NAT is looked at again while the gate is new (a rule
/// added after attach, such as a sidecar's init container's redirect, is
/// reported within this), and for a minute after a look that found a change.
const NAT_EVERY: Duration = Duration::from_secs(5);
/// How often once a gate's NAT has stayed the same for [`NAT_SETTLES`]: a
/// look runs `nft` (and the legacy tools where there is a legacy nat table),
/// which for 110 pods every 5 s was a sixth of a core, unless nftables'
/// generation and the addresses say nothing changed since the last.
const NAT_EVERY_SETTLED: Duration = Duration::from_mins(1);
const NAT_SETTLES: Duration = Duration::from_mins(1);
/// A look at NAT that takes longer than this (a hung `nft`) is reported as NAT unreadable.
const NAT_LOOK_LIMIT: Duration = Duration::from_secs(10);
/// An attach to a new interface slower than this is logged (it holds the loop).
const SLOW_ATTACH: Duration = Duration::from_secs(1);

/// Settings of the control loop.
pub struct LoopSettings {
    /// How often the loop runs (the shortest control window).
    pub tick: Duration,
    /// A fixed handshake window, or zero for the default (about 8 ms).
    pub handshake_window: Duration,
    /// Where each window's decision is counted for the metrics endpoint.
    pub decisions: Decisions,
    /// With no `--iface`: interfaces that appear later are gated too.
    pub follow_interfaces: Option<FollowInterfaces>,
    /// The addresses written at attach, kept up to date by the loop.
    pub local_addrs: LocalAddrs,
    /// Most time between routine healing passes.
    pub heal_interval: Duration,
    /// A pod's gate, one of a node's many: while quiet, it looks for drift
    /// seldom (see [`heal_check_every`]).
    pub one_of_many: bool,
    /// What the healer did, for the metrics endpoint.
    pub heal_report: crate::observe::report::HealReport,
    /// Beaten every tick, for `/healthz`.
    pub heartbeat: crate::observe::report::Heartbeat,
    /// Failures of the periodic tasks, for the metrics endpoint.
    pub task_errors: crate::observe::report::TaskErrors,
    /// Netfilter NAT that takes a protected port past the gate, looked at every few seconds.
    pub nat: crate::observe::report::NatReport,
    /// `--allow-nat`: such NAT is reported, and the gate stays ready.
    pub allow_nat: bool,
    /// SIGHUP: re-reads the config and applies it (None: attach had no --config).
    pub reload: Option<Reloader>,
    /// Becomes true when the loop must stop (SIGINT, SIGTERM, or another namespace's loop failed).
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Changes on each SIGHUP: re-read the config.
    pub reload_requests: tokio::sync::watch::Receiver<u64>,
}

/// Applies a reloaded config; returns the changed settings that take a restart.
pub(crate) type Reloader = Box<dyn FnMut(&mut GateMaps) -> Result<Vec<&'static str>, String> + Send>;

/// Gates interfaces as they appear (no `--iface`: the whole namespace).
#[derive(Clone, Debug)]
pub struct FollowInterfaces {
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    /// Interfaces (name, index) already gated or already reported as
    /// impossible to gate: one deleted and created again under its name has a
    /// new index, and is gated again.
    pub seen: Vec<(String, u32)>,
}

impl FollowInterfaces {
    /// Attaches to every interface not seen before; a failure is logged, not fatal.
    pub(crate) fn attach_new(&mut self, loaded: &mut Loaded) {
        let now = system::interfaces_indexed();
        // Forget interfaces that are gone, so their names can come back.
        self.seen.retain(|s| now.contains(s));
        for (iface, index) in now {
            if self.seen.iter().any(|(n, i)| *n == iface && *i == index) {
                continue;
            }
            self.seen.push((iface.clone(), index));
            let hook = self.hook.unwrap_or_else(|| default_hook(&iface));
            let started = Instant::now();
            match loaded.attach_gate(&iface, hook, self.xdp_mode) {
                Ok(()) => tracing::info!(iface = %iface, hook = %hook, "new interface gated"),
                Err(e) => tracing::warn!(iface = %iface, "new interface not gated: {}", crate::error::chain(&e)),
            }
            // Attaching takes the kernel's rtnl lock, which a burst of namespace
            // deletions can hold for seconds; the loop waits meanwhile.
            if started.elapsed() > SLOW_ATTACH {
                tracing::warn!(iface = %iface, took_ms = started.elapsed().as_millis(), "attaching to a new interface was slow (the kernel's rtnl lock was busy?): the loop waited");
            }
        }
    }
}

/// The namespace's addresses as last written to the gate (only SYNs to them are judged).
#[derive(Clone, Debug, Default)]
pub struct LocalAddrs {
    written: Option<std::collections::BTreeMap<[u8; 16], u32>>,
}

impl LocalAddrs {
    /// Asks the kernel for the addresses and rewrites the gate's table only when
    /// they changed (the table has thousands of slots to compare).
    pub(crate) fn refresh(&mut self, maps: &mut GateMaps) -> Result<(), Error> {
        let addrs = system::local_addresses()?;
        if self.written.as_ref() == Some(&addrs) {
            return Ok(());
        }
        if maps.set_local_addrs(&addrs)? {
            tracing::debug!(addresses = addrs.len(), "local addresses updated");
        }
        self.written = Some(addrs);
        Ok(())
    }
}

/// Runs until told to stop or until every port has been detached. A failing
/// periodic task (the address refresh, a port's window, healing ...) is
/// logged, counted in `settings.task_errors` and tried again on the next
/// round with the last good state: the gate keeps judging meanwhile.
pub(crate) async fn run(loaded: &mut Loaded, settings: LoopSettings) -> Result<(), Error> {
    let mut ticker = tokio::time::interval(settings.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pace = Pace::new(settings.tick, Instant::now());
    let mut settings = settings;
    let mut last_watch = Instant::now();
    // Opened on the gate's own thread, inside its namespace.
    let links = system::LinkWatch::open();
    let mut controls: Vec<PortControl> = Vec::new();
    let mut idle_clients = std::collections::HashSet::new();
    let mut last_client_sweep = Instant::now();
    let mut healer = crate::daemon::heal::Healer::new(settings.heal_interval, settings.heal_report.clone());
    let mut accept_queues = AcceptQueues::default();
    let mut refused = refused::RefusedRequests::default();
    let mut stalled = stalled::StalledRequests::default();
    let mut quotas: Option<(Vec<u32>, Instant)> = None;
    let mut last_heal_check: Option<Instant> = None;
    let mut nat = NatWatch::default();
    // What the operator last set, to log each live change once (see `crate::daemon::audit`).
    let mut audited = crate::daemon::audit::read(&loaded.maps).unwrap_or_default();
    let mut last_audit = Instant::now();
    let _ = std::fs::remove_file(paths::REQUEST_NOTE);
    loop {
        tokio::select! {
            // The daemon's signals come through the main thread (a closed channel: it is gone).
            _ = settings.stop.changed() => return Ok(()),
            changed = settings.reload_requests.changed() => match settings.reload.as_mut() {
                _ if changed.is_err() => return Ok(()),
                None => tracing::warn!("SIGHUP: attach was started without --config: nothing to reload"),
                Some(reload) => match reload(&mut loaded.maps) {
                    Ok(restart) if restart.is_empty() => tracing::info!("SIGHUP: config reloaded and applied"),
                    Ok(restart) => tracing::warn!(
                        changed = %restart.join(", "),
                        "SIGHUP: config reloaded and applied, except settings that take a restart (systemctl restart shed)"
                    ),
                    Err(e) => tracing::error!("SIGHUP: reload refused, nothing changed: {e}"),
                },
            },
            _ = ticker.tick() => {
                settings.heartbeat.beat();
                // A link or address change is acted on within this tick; the
                // once-a-second look covers anything a notification missed.
                let notified = links.as_ref().is_some_and(system::LinkWatch::changed);
                let watch_every = if pace.mode() == pace::Mode::Busy { WATCH_EVERY } else { QUIET_WATCH_EVERY };
                if notified || last_watch.elapsed() >= watch_every {
                    if let Err(e) = settings.local_addrs.refresh(&mut loaded.maps) {
                        settings.task_errors.record("addresses", &e);
                    }
                    if let Some(follow) = &mut settings.follow_interfaces {
                        follow.attach_new(loaded);
                    }
                    last_watch = Instant::now();
                }
                // Once a second: reading the tier table every tick would cost with many tiers.
                if last_audit.elapsed() >= AUDIT_EVERY {
                    if let Ok(now) = crate::daemon::audit::read(&loaded.maps) {
                        crate::daemon::audit::log_changes(&audited, &now);
                        audited = now;
                    }
                    last_audit = Instant::now();
                }
                let ports = match loaded.maps.port_configs() {
                    Ok(ports) => ports,
                    Err(e) => {
                        settings.task_errors.record("ports", &e);
                        continue;
                    }
                };
                if ports.is_empty() {
                    tracing::info!("every port was detached: stopping");
                    return Ok(());
                }
                // What the ports do sets the pace, and which chores this tick has.
                let instant = Instant::now();
                match loaded.maps.activity(ports.values()) {
                    Ok(activity) => {
                        if let Some(tick) = pace.observe(activity, instant) {
                            tracing::debug!(tick_ms = tick.as_millis(), mode = ?pace.mode(), "the loop's pace changes");
                            ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
                            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                    }
                    Err(e) => settings.task_errors.record("activity", &e),
                }
                // Refused requests and stalled shares come only with refusals,
                // and any refusal makes the gate busy at the look that sees it.
                if pace.mode() == pace::Mode::Busy {
                    if let Err(e) = refused.close(&mut loaded.maps, &ports) {
                        settings.task_errors.record("refused requests", &e);
                    }
                    if let Err(e) = stalled.close(&mut loaded.maps, &ports) {
                        settings.task_errors.record("stalled requests", &e);
                    }
                }
                // Each port's share of the shared maps changes with the ports;
                // written again now and then (a port detached and attached
                // again between two ticks keeps its slot, its state new).
                let slots: Vec<u32> = ports.values().map(|c| c.slot).collect();
                if quotas.as_ref().is_none_or(|(written, at)| *written != slots || at.elapsed() >= QUOTAS_EVERY) {
                    match loaded.maps.set_quotas(&slots) {
                        Ok(()) => quotas = Some((slots, Instant::now())),
                        Err(e) => settings.task_errors.record("quotas", &e),
                    }
                }
                // Follow ports detached (or re-attached in another slot) since the last tick.
                controls.retain(|c| {
                    let kept = ports.get(&c.port).is_some_and(|p| p.slot == c.slot);
                    if !kept {
                        tracing::info!(port = c.port, "port detached");
                    }
                    kept
                });
                for (&port, config) in &ports {
                    if !controls.iter().any(|c| c.port == port) {
                        let read = loaded.maps.snapshot(port, *config).and_then(|s| Ok((s, loaded.maps.latency(config.slot)?)));
                        let (snapshot, hist) = match read {
                            Ok(read) => read,
                            Err(e) => {
                                settings.task_errors.record("control", &e);
                                continue;
                            }
                        };
                        let handshakes = crate::control::handshake::HandshakeWindow::new(settings.handshake_window);
                        controls.push(PortControl::new(port, config.slot, snapshot.limit, &snapshot.control, hist, handshakes));
                    }
                }
                let unhurried = pace.mode() != pace::Mode::Busy && !healer.awaits_a_pass();
                let heal_every = heal_check_every(unhurried, settings.one_of_many);
                if last_heal_check.is_none_or(|t| t.elapsed() >= heal_every) {
                    // A failed pass leaves the counts as they are: the gate keeps running.
                    if let Err(e) = healer.check(&mut loaded.maps, Instant::now()) {
                        settings.task_errors.record("heal", &e);
                    }
                    last_heal_check = Some(Instant::now());
                }
                let protected: Vec<u16> = ports.keys().copied().collect();
                nat.tick(&settings.nat, &protected, settings.allow_nat).await;
                if last_client_sweep.elapsed() >= CLIENT_SWEEP {
                    match loaded.maps.forget_idle_clients(&idle_clients) {
                        Ok(idle) => idle_clients = idle,
                        Err(e) => settings.task_errors.record("clients", &e),
                    }
                    last_client_sweep = Instant::now();
                }
                if pace.quiet() {
                    // Nothing happened: no window to judge (the next spans the quiet time).
                    continue;
                }
                let port_set: BTreeSet<u16> = ports.keys().copied().collect();
                for control in &mut controls {
                    if let Err(e) = control.run(&mut loaded.maps, instant, &settings.decisions, &mut accept_queues, &port_set) {
                        settings.task_errors.record("control", &e);
                    }
                }
            }
        }
    }
}

/// Looks at the namespace's netfilter NAT every [`NAT_EVERY`], off the loop:
/// the look runs `nft`, which a large ruleset makes slow and a hung tool
/// would make endless, and the loop must keep ticking meanwhile.
#[derive(Default)]
struct NatWatch {
    /// The look under way (on a blocking thread of this gate's runtime, so in
    /// its namespace), and when it began.
    pending: Option<(tokio::task::JoinHandle<(crate::host::nat::NatLook, crate::host::nat::NatStamp)>, Instant)>,
    last: Option<Instant>,
    /// What the last look that read the rules depended on: a look falling
    /// due with nothing of it changed is not run (no `nft` started).
    stamp: Option<crate::host::nat::NatStamp>,
    /// The first look, and the last that found the rules changed.
    changed: Option<Instant>,
    slow_reported: bool,
}

impl NatWatch {
    /// Between looks: [`NAT_EVERY`] until the rules have stayed the same for [`NAT_SETTLES`].
    fn every(&self) -> Duration {
        self.every_at(Instant::now())
    }

    /// [`Self::every`] as of `now` (a test need not go back in time, which a
    /// monotonic clock a minute after boot cannot).
    fn every_at(&self, now: Instant) -> Duration {
        let settled = self.changed.is_some_and(|t| now.saturating_duration_since(t) >= NAT_SETTLES);
        if settled { NAT_EVERY_SETTLED } else { NAT_EVERY }
    }

    async fn tick(&mut self, report: &crate::observe::report::NatReport, ports: &[u16], allowed: bool) {
        match self.pending.take() {
            Some((look, _)) if look.is_finished() => {
                if let Ok((look, stamp)) = look.await {
                    self.stamp = look.readable.then_some(stamp);
                    let before = report.read();
                    report_nat(report, ports, allowed, &look);
                    let after = report.read();
                    if self.changed.is_none()
                        || (before.readable, &before.bypassed) != (after.readable, &after.bypassed)
                    {
                        self.changed = Some(Instant::now());
                    }
                }
                self.last = Some(Instant::now());
                self.slow_reported = false;
            }
            Some((look, since)) => {
                if since.elapsed() > NAT_LOOK_LIMIT && !self.slow_reported {
                    tracing::warn!(
                        "reading netfilter NAT has taken over {} s (is nft stuck?): NAT is reported unreadable until it answers",
                        NAT_LOOK_LIMIT.as_secs()
                    );
                    report.set(crate::observe::report::NatSeen { readable: false, ..report.read() });
                    self.slow_reported = true;
                }
                self.pending = Some((look, since));
            }
            None if self.last.is_none_or(|t| t.elapsed() >= self.every()) => {
                // Asked in this thread, in the gate's namespace: a netlink answer and the addresses.
                if self.stamp.as_ref().is_some_and(|s| s.still_holds(&crate::host::nat::NatStamp::now())) {
                    self.last = Some(Instant::now());
                } else {
                    self.pending = Some((tokio::task::spawn_blocking(crate::host::nat::look_stamped), Instant::now()));
                }
            }
            None => {}
        }
    }
}

/// Reports what a look at the namespace's NAT changed: a rule that now takes
/// a protected port past the gate (added after attach, as a sidecar's init
/// container does), one that went, and a ruleset that cannot be read (what
/// was seen before it stays reported: an unread rule is not a rule gone).
fn report_nat(
    report: &crate::observe::report::NatReport,
    ports: &[u16],
    allowed: bool,
    look: &crate::host::nat::NatLook,
) {
    let before = report.read();
    let bypassed = if look.readable { look.bypassed(ports) } else { before.bypassed.clone() };
    for (port, what) in &bypassed {
        if before.bypassed.get(port) != Some(what) {
            tracing::warn!(
                port,
                nat = %what,
                "netfilter NAT takes connections to this port past the gate: they reach the listener unjudged (shed_nat_bypassed; /readyz unless --allow-nat). Remove the rule, or gate the namespace where the socket lives"
            );
        }
    }
    for port in before.bypassed.keys().filter(|p| !bypassed.contains_key(p)) {
        tracing::info!(port, "the NAT that took this port past the gate is gone: judged again");
    }
    if !look.readable && (!before.looked || before.readable) {
        tracing::warn!(
            "cannot read netfilter NAT here (neither nft nor iptables-legacy-save runs): a NAT rule that takes connections past the gate would go unseen (shed_nat_readable 0); install nftables"
        );
    }
    report.set(crate::observe::report::NatSeen { looked: true, readable: look.readable, bypassed, allowed });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::nat::{LocalNat, NatLook};
    use crate::observe::report::NatReport;

    fn redirect(from: u16) -> LocalNat {
        LocalNat {
            place: "nftables table ip late chain prerouting".into(),
            from_ports: vec![from],
            to_port: Some(15006),
        }
    }

    #[test]
    fn an_unhurried_pods_healer_is_asked_seldom_and_every_other_gate_each_second() {
        assert_eq!(heal_check_every(false, false), HEAL_CHECK_EVERY);
        assert_eq!(heal_check_every(true, false), HEAL_CHECK_EVERY, "a node's own gate, quiet or light");
        assert_eq!(heal_check_every(false, true), HEAL_CHECK_EVERY, "a busy pod's gate");
        assert_eq!(heal_check_every(true, true), UNHURRIED_POD_HEAL_CHECK_EVERY);
        assert!(UNHURRIED_POD_HEAL_CHECK_EVERY > HEAL_CHECK_EVERY * 60);
    }

    #[test]
    fn nat_is_looked_at_every_five_seconds_until_it_has_stayed_the_same_for_a_minute() {
        let mut watch = NatWatch::default();
        assert_eq!(watch.every(), NAT_EVERY, "before the first look");
        // Times after a change, not before now: in a boot's first minute the
        // monotonic clock has no minute to go back (checked_sub gave None,
        // read as "no look yet", and the test failed then).
        let t0 = Instant::now();
        watch.changed = Some(t0);
        assert_eq!(watch.every_at(t0), NAT_EVERY, "just changed");
        assert_eq!(watch.every_at(t0 + NAT_SETTLES.saturating_sub(Duration::from_secs(1))), NAT_EVERY);
        assert_eq!(watch.every_at(t0 + NAT_SETTLES), NAT_EVERY_SETTLED);
    }

    #[test]
    fn a_look_reports_a_bypass_until_a_readable_look_no_longer_finds_it() {
        let report = NatReport::default();
        let ports = [8080, 9090];
        report_nat(&report, &ports, false, &NatLook { found: vec![redirect(8080), redirect(7000)], readable: true });
        let seen = report.read();
        assert_eq!(seen.bypassed.keys().copied().collect::<Vec<_>>(), [8080], "only a protected port's");
        assert!(seen.looked && seen.readable && !seen.allowed);
        assert!(report.not_ready().is_some_and(|why| why.starts_with("port 8080: nftables table ip late")));
        // A look that could not read the rules is not a rule gone.
        report_nat(&report, &ports, false, &NatLook { found: vec![], readable: false });
        let seen = report.read();
        assert!(!seen.readable && seen.bypassed.contains_key(&8080), "{seen:?}");
        // A readable look without it: gone, and ready again.
        report_nat(&report, &ports, false, &NatLook { found: vec![], readable: true });
        assert!(report.read().bypassed.is_empty() && report.not_ready().is_none());
        // Allowed (--allow-nat): reported, never unready.
        report_nat(&report, &ports, true, &NatLook { found: vec![redirect(9090)], readable: true });
        assert!(report.read().bypassed.contains_key(&9090) && report.not_ready().is_none());
    }
}
