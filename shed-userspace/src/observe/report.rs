// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the daemon's loops publish for the metrics endpoint: decisions
//! counted per port and reason, periodic tasks' failures, a heartbeat per
//! loop, what the healer did, and netfilter NAT that takes a port past the gate.
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::control::Reason;

/// Controller decisions per port and reason, counted by the daemon.
#[derive(Clone, Debug, Default)]
pub struct Decisions(Arc<Mutex<BTreeMap<(u16, Reason), u64>>>);

impl Decisions {
    pub(crate) fn record(&self, port: u16, reason: Reason) {
        let mut counts = crate::observe::lock(&self.0);
        *counts.entry((port, reason)).or_default() += 1;
    }

    pub fn of(&self, port: u16) -> Vec<(Reason, u64)> {
        let counts = crate::observe::lock(&self.0);
        counts.iter().filter(|((p, _), _)| *p == port).map(|((_, r), n)| (*r, *n)).collect()
    }
}

/// Failures of the daemon's periodic tasks, by task: each is logged, counted
/// and retried on the next round with the last good state; none ends a gate.
#[derive(Clone, Debug, Default)]
pub struct TaskErrors(Arc<Mutex<BTreeMap<&'static str, u64>>>);

impl TaskErrors {
    /// Counts a failure of `task`; logs the first and then every hundredth, so
    /// a task that fails every second does not flood the log.
    /// The error is said with its causes ([`crate::error::chain`]).
    pub(crate) fn record(&self, task: &'static str, error: &(dyn std::error::Error + 'static)) {
        let mut counts = crate::observe::lock(&self.0);
        let n = counts.entry(task).or_default();
        *n += 1;
        if *n == 1 || (*n).is_multiple_of(100) {
            let error = crate::error::chain(error);
            tracing::warn!(task, failures = *n, "periodic task failed, retrying with the last good state: {error}");
        }
    }

    /// Every task's failures so far.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let counts = crate::observe::lock(&self.0);
        counts.iter().map(|(t, n)| (*t, *n)).collect()
    }
}

/// The control loop's last tick, for `/healthz`.
#[derive(Clone, Debug, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

/// A control loop silent this long is not healthy (it ticks every window, 100 ms by default, or
/// once a second while its ports see nothing).
pub(crate) const HEALTHY_WITHIN: Duration = Duration::from_secs(5);

impl Heartbeat {
    pub(crate) fn beat(&self) {
        self.0.store(unix_ms(), Ordering::Relaxed);
    }

    /// A beat `ago` in the past (a test's stalled loop).
    #[cfg(test)]
    pub(crate) fn beat_ago(&self, ago: Duration) {
        self.0.store(unix_ms() - ago.as_millis() as u64, Ordering::Relaxed);
    }

    /// Time since the last beat; None before the first.
    pub(crate) fn age(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(unix_ms().saturating_sub(at))),
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_errors_are_counted_per_task() {
        let errors = TaskErrors::default();
        let error = |what: &str| std::io::Error::other(what.to_owned());
        errors.record("addresses", &error("getifaddrs: Too many open files"));
        errors.record("addresses", &error("again"));
        errors.record("heal", &error("sock_diag"));
        assert_eq!(errors.counts(), [("addresses", 2), ("heal", 1)]);
    }

    #[test]
    fn a_heartbeat_ages() {
        let beat = Heartbeat::default();
        assert_eq!(beat.age(), None);
        beat.beat();
        assert!(beat.age().unwrap() < Duration::from_secs(1));
        beat.0.store(unix_ms() - 6_000, Ordering::Relaxed);
        assert!(beat.age().unwrap() > HEALTHY_WITHIN);
    }
}

/// Why a healing pass ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassReason {
    /// The daemon started: adopt connections that predate it.
    Start,
    /// The protected ports changed, or the connection map was full.
    Evidence,
    /// The last pass found something to confirm.
    Confirm,
    /// The safety net, every `--heal-interval`.
    Routine,
}

impl PassReason {
    pub const ALL: [Self; 4] = [Self::Start, Self::Evidence, Self::Confirm, Self::Routine];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Evidence => "evidence",
            Self::Confirm => "confirm",
            Self::Routine => "routine",
        }
    }
}

/// What the healer did, for the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct HealCounts {
    /// Cheap checks of the counters (about one a second).
    pub checks: u64,
    /// Full passes, by reason.
    pub passes: BTreeMap<PassReason, u64>,
    /// Per-connection records read by passes: socket-table records plus tracked sockets.
    pub records_read: u64,
    /// How long the last pass took.
    pub last_pass: Duration,
    /// Connections a pass could not adopt (the connection map was full).
    pub adopt_failed: u64,
}

/// Shared between the control loop and the metrics thread.
#[derive(Clone, Debug, Default)]
pub struct HealReport(Arc<Mutex<HealCounts>>);

impl HealReport {
    pub fn read(&self) -> HealCounts {
        self.0.lock().map(|c| c.clone()).unwrap_or_default()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut HealCounts)) {
        if let Ok(mut c) = self.0.lock() {
            f(&mut c);
        }
    }
}

/// Netfilter NAT as the gate's loop last saw it in its namespace (every few
/// seconds): protected ports a rule takes past the gate, which `/readyz`, the
/// metrics and the log report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatSeen {
    /// Whether the loop has looked yet.
    pub looked: bool,
    /// Whether a ruleset could be read at all (nft or the legacy iptables tools).
    pub readable: bool,
    /// Each protected port a NAT statement takes past the gate, with the statement.
    pub bypassed: BTreeMap<u16, String>,
    /// `--allow-nat`: the operator accepted it (reported, but the gate stays ready).
    pub allowed: bool,
}

/// Shared between the control loop and the metrics thread.
#[derive(Clone, Debug, Default)]
pub struct NatReport(Arc<Mutex<NatSeen>>);

impl NatReport {
    pub fn read(&self) -> NatSeen {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn set(&self, seen: NatSeen) {
        if let Ok(mut s) = self.0.lock() {
            *s = seen;
        }
    }

    /// Why the gate is not ready, if a NAT the operator did not allow takes a port past it.
    pub fn not_ready(&self) -> Option<String> {
        let seen = self.read();
        if seen.allowed {
            return None;
        }
        let (port, what) = seen.bypassed.iter().next()?;
        Some(format!(
            "port {port}: {what}: netfilter takes these connections past the gate, unjudged; remove the rule, gate the namespace where the socket lives, or restart with --allow-nat to accept it\n"
        ))
    }
}

/// A pod's gate at the node's dispatcher, for the metrics: which dispatcher
/// and gate number (None: the gate counts its own connections).
#[derive(Clone, Default)]
pub struct DispatchReport(Arc<Mutex<Option<Handed>>>);

/// The dispatcher a pod's gate was handed to, and its number there.
type Handed = (Arc<crate::kernel::dispatch::Dispatcher>, u32);

impl std::fmt::Debug for DispatchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DispatchReport").field(&self.0.lock().ok().and_then(|d| d.as_ref().map(|(_, g)| *g))).finish()
    }
}

impl DispatchReport {
    pub(crate) fn set(&self, dispatcher: Arc<crate::kernel::dispatch::Dispatcher>, gate: u32) {
        if let Ok(mut d) = self.0.lock() {
            *d = Some((dispatcher, gate));
        }
    }

    /// The gate's books at the dispatcher (zero for a gate that counts its own).
    pub fn books(&self) -> shed_common::dispatch::DispatchBooks {
        let handed = self.0.lock().ok().and_then(|d| d.clone());
        handed.map(|(dispatcher, gate)| dispatcher.books(gate)).unwrap_or_default()
    }
}
