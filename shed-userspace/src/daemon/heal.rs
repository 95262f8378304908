// SPDX-License-Identifier: MIT OR Apache-2.0
//! Drift healing: the kernel's counts are kept by events, and an event that
//! never arrives (a socket established before the gate, a connection the full
//! map could not track, a missed close) would skew them for good. A healing
//! pass compares the tracked sockets with the kernel's own socket table for
//! the gated namespace (asked through sock_diag, see [`crate::host::sockdiag`]) and
//! with the counters:
//! - a tracked socket that is gone from the table is forgotten;
//! - a live connection of a protected port that is not tracked is adopted
//!   (counted as open; its request turns are not seen, so it is never busy);
//! - a count that differs from the tracked sockets by the same amount on two
//!   passes in a row is corrected, and the correction reported.
//!
//! Every change waits for a second pass that sees the same thing, so a
//! connection opening or closing during a pass is never "healed" by mistake.
//!
//! A pass reads every held connection, so it does not run every second: once
//! at start (connections that predate the gate), at once on evidence that the
//! counts may be off (the protected ports changed, or the connection map was
//! full), a second later to confirm what a pass found, and otherwise every
//! `--heal-interval` as a safety net. Between passes a check reads only the
//! per-port counters, so the daemon's idle cost does not grow with the
//! connections held. Passes brought forward by evidence keep a gap of ten
//! times the last pass's duration, so healing never takes more than about a
//! tenth of a core however often the evidence moves; routine passes keep a
//! hundred times it (1% of a core) when that is longer than the interval.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::{Duration, Instant},
};

use shed_common::{FlowKey, PortConfig, SockEntry, UserPortState, counter};

use crate::{
    error::Error,
    host::sockdiag::SocketTable,
    kernel::maps::GateMaps,
    observe::report::{HealReport, PassReason},
};

/// What a pass reads and changes in the gate's books: the pinned maps
/// ([`GateMaps`]), or a plain table in the unit tests, which hold the pass's
/// decisions.
trait Books {
    /// Forgets a tracked socket (and its client's charge); false if it was gone.
    fn forget_socket(&mut self, key: u64, entry: &SockEntry) -> bool;
    /// Tracks a socket under `key`; false if the key is taken or the map full.
    fn adopt_socket(&mut self, key: u64, entry: SockEntry) -> bool;
    /// The tier of the client at `addr`, if it has one.
    fn tier_of(&self, addr: [u8; 16]) -> Option<u8>;
    /// The daemon-side state of the port in `slot` (the healer's adjustments).
    fn user_state(&self, slot: u32) -> Result<UserPortState, Error>;
    /// Takes a drift (established, busy) out of the port's counts.
    fn correct_drift(&mut self, slot: u32, drift: (i64, i64)) -> Result<(), Error>;
    /// Counts `adopted` connections as established on the port (their opening went unseen).
    fn count_adopted(&mut self, slot: u32, adopted: i64) -> Result<(), Error>;
}

impl Books for GateMaps {
    fn forget_socket(&mut self, key: u64, entry: &SockEntry) -> bool {
        GateMaps::forget_socket(self, key, entry)
    }
    fn adopt_socket(&mut self, key: u64, entry: SockEntry) -> bool {
        GateMaps::adopt_socket(self, key, entry)
    }
    fn tier_of(&self, addr: [u8; 16]) -> Option<u8> {
        GateMaps::tier_of(self, addr)
    }
    fn user_state(&self, slot: u32) -> Result<UserPortState, Error> {
        GateMaps::user_state(self, slot)
    }
    fn correct_drift(&mut self, slot: u32, drift: (i64, i64)) -> Result<(), Error> {
        GateMaps::correct_drift(self, slot, drift)
    }
    fn count_adopted(&mut self, slot: u32, adopted: i64) -> Result<(), Error> {
        GateMaps::count_adopted(self, slot, adopted)
    }
}

/// Keys of adopted sockets: user-space addresses, never a kernel socket's.
const ADOPTED_KEY_BASE: u64 = 0x0000_5eed_0000_0000;

/// How soon a pass that found something looks again to confirm it.
pub(crate) const CONFIRM_AFTER: Duration = Duration::from_secs(1);

/// A pass brought forward waits at least this many times the last pass's duration.
const GAP_PER_PASS_TIME: u32 = 10;

/// A routine pass waits at least this many times the last pass's duration
/// (`--heal-interval` is the shortest wait): the safety net never takes more
/// than 1% of a core, however many connections a pass reads.
const ROUTINE_PER_PASS_TIME: u32 = 100;

/// When the next pass runs.
#[derive(Debug)]
pub(crate) struct Schedule {
    /// Between routine passes.
    interval: Duration,
    /// When the last pass ended, how long it took, and whether it left something to confirm.
    last: Option<(Instant, Duration, bool)>,
}

impl Schedule {
    pub(crate) fn new(interval: Duration) -> Self {
        Self { interval, last: None }
    }

    /// Whether a pass is due at `now`, and why; `evidence`: the cheap check saw
    /// a reason to look now.
    pub(crate) fn due(&self, now: Instant, evidence: bool) -> Option<PassReason> {
        let Some((ended, took, pending)) = self.last else { return Some(PassReason::Start) };
        let since = now.saturating_duration_since(ended);
        let gap = CONFIRM_AFTER.max(took * GAP_PER_PASS_TIME);
        if since >= self.interval.max(took * ROUTINE_PER_PASS_TIME) {
            Some(if pending { PassReason::Confirm } else { PassReason::Routine })
        } else if since < gap {
            None
        } else if pending {
            Some(PassReason::Confirm)
        } else if evidence {
            Some(PassReason::Evidence)
        } else {
            None
        }
    }

    /// Whether the last pass left something to confirm (or none has run):
    /// the next pass is due soon, whatever the gate's pace.
    pub(crate) fn awaits_a_pass(&self) -> bool {
        self.last.is_none_or(|(_, _, pending)| pending)
    }

    /// Records a pass that ended at `now` after `took`, leaving something to
    /// confirm (`pending`) or not.
    pub(crate) fn passed(&mut self, now: Instant, took: Duration, pending: bool) {
        self.last = Some((now, took, pending));
    }
}

/// What the cheap check reads: the protected ports and the connection-map-full
/// counts. A change in either is evidence that a pass may find something.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Evidence {
    ports: BTreeMap<u16, u32>,
    map_full: u64,
}

impl Evidence {
    fn read(maps: &GateMaps, configs: &BTreeMap<u16, PortConfig>) -> Result<Self, Error> {
        let mut map_full = 0;
        for (&port, config) in configs {
            map_full += maps.snapshot(port, *config)?.counter(counter::CONNECTION_MAP_FULL);
        }
        Ok(Self { ports: configs.iter().map(|(&p, c)| (p, c.slot)).collect(), map_full })
    }
}

pub struct Healer {
    schedule: Schedule,
    report: HealReport,
    table: Option<SocketTable>,
    /// What the last pass saw of the counters.
    evidence: Option<Evidence>,
    /// What the last pass would have changed, to be confirmed by this one.
    stale_before: HashSet<u64>,
    untracked_before: HashSet<FlowKey>,
    drift_before: BTreeMap<u32, Drift>,
}

impl Healer {
    /// A healer whose routine passes are `interval` apart.
    pub fn new(interval: Duration, report: HealReport) -> Self {
        Self {
            schedule: Schedule::new(interval),
            report,
            table: None,
            evidence: None,
            stale_before: HashSet::new(),
            untracked_before: HashSet::new(),
            drift_before: BTreeMap::new(),
        }
    }

    /// The cheap check (the counters only); runs a pass when one is due.
    /// Whether a pass is owed soon: the first, or one to confirm what the last saw.
    pub(crate) fn awaits_a_pass(&self) -> bool {
        self.schedule.awaits_a_pass()
    }

    pub fn check(&mut self, maps: &mut GateMaps, now: Instant) -> Result<(), Error> {
        let configs = maps.port_configs()?;
        let evidence = Evidence::read(maps, &configs)?;
        self.report.update(|c| c.checks += 1);
        let Some(reason) = self.schedule.due(now, self.evidence.as_ref() != Some(&evidence)) else {
            return Ok(());
        };
        let started = Instant::now();
        let outcome = self.pass(maps, &configs)?;
        let took = started.elapsed();
        // On a busy port every pass sees a few connections that opened or closed
        // while it read; chasing those would make every pass a confirming one. So
        // a confirming pass asks for another only when it changed something (an
        // adoption shows as drift next): what it merely saw first waits for the
        // next routine pass.
        let pending = outcome.found && (reason != PassReason::Confirm || outcome.acted);
        let (records, adopt_failed) = (outcome.records, outcome.adopt_failed);
        tracing::debug!(reason = reason.name(), records, pending, took_us = took.as_micros() as u64, "healing pass");
        self.schedule.passed(Instant::now(), took, pending);
        // What this pass saw is the new normal: only a change after it is evidence.
        self.evidence = Some(Evidence::read(maps, &configs)?);
        self.report.update(|c| {
            *c.passes.entry(reason).or_default() += 1;
            c.records_read += records;
            c.last_pass = took;
            c.adopt_failed += adopt_failed;
        });
        Ok(())
    }

    /// One pass: reads the tracked sockets and the socket table, acts on what
    /// the last pass saw too.
    fn pass(&mut self, maps: &mut GateMaps, configs: &BTreeMap<u16, PortConfig>) -> Result<PassOutcome, Error> {
        let ports: BTreeSet<u16> = configs.keys().copied().collect();
        // Each port's event counts just before and just after the tracked
        // sockets are read: the counts they are compared with, and how many
        // events could have landed on one side of that comparison only.
        let counts_before = event_counts(maps, configs)?;
        // The tracked sockets first, then the table: a socket that closes in
        // between is gone from both; one that opens in between is caught next pass.
        let mut tracked: HashMap<u64, SockEntry> = maps.tracked_sockets()?;
        let counts_read = event_counts(maps, configs)?;
        let (live, table_records) = self.live_flows(&ports)?;
        let records = (tracked.len() + table_records) as u64;
        let mut outcome = PassOutcome { records, found: false, acted: false, adopt_failed: 0 };
        self.forget_stale(maps, configs, &mut tracked, &live, &mut outcome);
        self.adopt_untracked(maps, configs, &mut tracked, &live, &mut outcome);
        self.correct_counts(maps, configs, &tracked, (&counts_before, &counts_read), &mut outcome)?;
        Ok(outcome)
    }

    /// The connections of `ports` the kernel's socket table holds, and the
    /// records read for them.
    fn live_flows(&mut self, ports: &BTreeSet<u16>) -> Result<(HashSet<FlowKey>, usize), Error> {
        let mut live = Vec::new();
        let table = match &mut self.table {
            Some(table) => table,
            None => self.table.insert(SocketTable::open().map_err(|e| Error::io("open", "sock_diag socket", e))?),
        };
        let records = table.held(ports, &mut live).map_err(|e| Error::io("read socket table", "sock_diag", e))?;
        Ok((live.into_iter().collect(), records))
    }

    /// Forgets the tracked sockets of our ports that the table no longer
    /// holds, seen so by this pass and the last.
    fn forget_stale(
        &mut self,
        books: &mut impl Books,
        configs: &BTreeMap<u16, PortConfig>,
        tracked: &mut HashMap<u64, SockEntry>,
        live: &HashSet<FlowKey>,
        outcome: &mut PassOutcome,
    ) {
        let ours = |e: &SockEntry| configs.get(&e.port).is_some_and(|c| c.slot == e.slot);
        let stale: HashSet<u64> =
            tracked.iter().filter(|(_, e)| ours(e) && !live.contains(&e.flow)).map(|(k, _)| *k).collect();
        outcome.found |= !stale.is_subset(&self.stale_before);
        for key in confirmed(&stale, &self.stale_before) {
            // The close was missed, so its client still counts it: forgotten with it.
            if books.forget_socket(*key, &tracked[key]) {
                outcome.acted = true;
                tracked.remove(key);
            }
        }
        self.stale_before = stale;
    }

    /// Tracks the table's connections the gate missed opening, seen so by
    /// this pass and the last (never an exempt client's: those are not counted).
    fn adopt_untracked(
        &mut self,
        books: &mut impl Books,
        configs: &BTreeMap<u16, PortConfig>,
        tracked: &mut HashMap<u64, SockEntry>,
        live: &HashSet<FlowKey>,
        outcome: &mut PassOutcome,
    ) {
        let tracked_flows: HashSet<FlowKey> = tracked.values().map(|e| e.flow).collect();
        let untracked: HashSet<FlowKey> = live.difference(&tracked_flows).copied().collect();
        outcome.found |= !untracked.is_subset(&self.untracked_before);
        for flow in confirmed(&untracked, &self.untracked_before) {
            match adopt(books, configs, flow) {
                Adoption::Adopted(key, entry) => {
                    outcome.acted = true;
                    tracked.insert(key, entry);
                }
                Adoption::Failed => outcome.adopt_failed += 1,
                Adoption::NotCounted => {}
            }
        }
        self.untracked_before = untracked;
    }

    /// Each port's counts against the tracked sockets. On a busy port
    /// connections open and close while the pass reads: every event since the
    /// pass began may have landed on one side of the comparison and not the
    /// other, so only the drift beyond that many events is certain, and it is
    /// corrected once two passes agree on it.
    fn correct_counts(
        &mut self,
        books: &mut impl Books,
        configs: &BTreeMap<u16, PortConfig>,
        tracked: &HashMap<u64, SockEntry>,
        (counts_before, counts_read): (&EventCounts, &EventCounts),
        outcome: &mut PassOutcome,
    ) -> Result<(), Error> {
        for (&port, config) in configs {
            let slot = config.slot;
            let ours = || tracked.values().filter(|e| e.slot == slot && e.port == port);
            let (open, busy) = (ours().count() as i64, ours().filter(|e| e.busy != 0).count() as i64);
            let user = books.user_state(slot)?;
            // The kernel's counts as they were when the entries were read (the
            // adjustments are the healer's own, unchanged since).
            let Some(at_read) = counts_read.get(&port) else { continue };
            let drift = drift_at_read(at_read, &user, open, busy);
            let (opens, closes, enters, exits) = events_since(counts_before.get(&port), at_read);
            let certain = (beyond(drift.0, opens, closes), beyond(drift.1, enters, exits));
            let now = Drift { seen: drift, certain };
            if let Some(drift) = drift_to_correct(self.drift_before.get(&slot), &now) {
                books.correct_drift(slot, drift)?;
                tracing::warn!(
                    port,
                    established_drift = drift.0,
                    busy_drift = drift.1,
                    "corrected in-flight drift against the socket table"
                );
                self.drift_before.remove(&slot);
                outcome.acted = true;
            } else {
                outcome.found |= drift != (0, 0) && self.drift_before.get(&slot).map(|d| d.seen) != Some(drift);
                self.drift_before.insert(slot, now);
            }
        }
        Ok(())
    }
}

/// A pod taken over from the last agent (`kernel::handover`): the connections
/// its protected ports hold, adopted and counted at once, before this gate's
/// program judges the pod. A healing pass would adopt them only once a second
/// pass confirms, and count them once two more agree: for those seconds the
/// gate would admit a limit's worth past the connections held. At once is
/// safe here: the last agent's programs judge the pod until its link is
/// taken over, so what the table holds was admitted by them; a connection
/// that closes meanwhile is counted until the healer finds it gone, which
/// refuses a little more, never less. Returns how many were adopted.
pub(crate) fn take_over_held(maps: &mut GateMaps) -> Result<usize, Error> {
    let configs = maps.port_configs()?;
    let ports: BTreeSet<u16> = configs.keys().copied().collect();
    let mut live = Vec::new();
    SocketTable::open()
        .and_then(|mut table| table.held(&ports, &mut live))
        .map_err(|e| Error::io("read socket table", "sock_diag", e))?;
    let tracked: HashSet<FlowKey> = maps.tracked_sockets()?.values().map(|e| e.flow).collect();
    adopt_at_once(maps, &configs, &tracked, live.into_iter().collect())
}

/// [`take_over_held`]'s books: every live flow not tracked is adopted (an
/// exempt client's aside, as a pass does) and counted on its port.
fn adopt_at_once(
    books: &mut impl Books,
    configs: &BTreeMap<u16, PortConfig>,
    tracked: &HashSet<FlowKey>,
    live: HashSet<FlowKey>,
) -> Result<usize, Error> {
    let mut adopted: BTreeMap<u32, i64> = BTreeMap::new();
    for flow in live.difference(tracked) {
        if let Adoption::Adopted(_, entry) = adopt(books, configs, flow) {
            *adopted.entry(entry.slot).or_default() += 1;
        }
    }
    for (&slot, &n) in &adopted {
        books.count_adopted(slot, n)?;
    }
    Ok(adopted.values().sum::<i64>() as usize)
}

/// What adopting one live connection came to.
enum Adoption {
    /// Tracked under this key, as this entry.
    Adopted(u64, SockEntry),
    /// Not tracked: the connection map is full (or the key taken).
    Failed,
    /// Not for the gate to count: no protected port's, or an exempt client's.
    NotCounted,
}

/// Tracks connection `flow`, which the gate missed opening (see [`adopted`]).
fn adopt(books: &mut impl Books, configs: &BTreeMap<u16, PortConfig>, flow: &FlowKey) -> Adoption {
    let Some(config) = configs.get(&flow.server_port) else { return Adoption::NotCounted };
    if books.tier_of(flow.client_addr) == Some(shed_common::tier::EXEMPT) {
        return Adoption::NotCounted;
    }
    let (key, entry) = (ADOPTED_KEY_BASE | (fxhash(flow) & 0xffff_ffff), adopted(config, flow));
    if books.adopt_socket(key, entry) { Adoption::Adopted(key, entry) } else { Adoption::Failed }
}

/// The entry a connection the gate missed opening is tracked under: as
/// established and idle, so it adds to no ring and releases from none.
fn adopted(config: &PortConfig, flow: &FlowKey) -> SockEntry {
    SockEntry {
        slot: config.slot,
        port: flow.server_port,
        busy: 0,
        capped: 0,
        arrival_ns: 0,
        pickup_ns: 0,
        client: config.client_key(&flow.client_addr).addr,
        flow: *flow,
        multiplexed: u8::from(config.count_mode == shed_common::count_mode::MULTIPLEXED),
        silent: 0,
        refused_request: 0,
        _pad2: 0,
        silent_epoch: 0,
    }
}

/// What one pass did.
struct PassOutcome {
    /// Per-connection records read.
    records: u64,
    /// Something seen for the first time (to be confirmed by the next pass).
    found: bool,
    /// Something changed (a socket forgotten or adopted, a count corrected).
    acted: bool,
    /// Untracked connections that could not be adopted (the map was full).
    adopt_failed: u64,
}

/// Each port's raw event counts (opened, closed, busy enter and exit), by port.
type EventCounts = BTreeMap<u16, [u64; 4]>;

/// Each port's raw event counts now.
fn event_counts(maps: &GateMaps, configs: &BTreeMap<u16, PortConfig>) -> Result<EventCounts, Error> {
    let mut out = BTreeMap::new();
    for (&port, config) in configs {
        let s = maps.snapshot(port, *config)?.state;
        out.insert(port, [s.opened, s.closed, s.busy_enter, s.busy_exit]);
    }
    Ok(out)
}

/// What two passes in a row found: a socket, flow or drift is acted on only
/// when the pass before saw it too (one pass can race a connection opening
/// or closing between the map read and the socket-table read).
fn confirmed<'a, T: Eq + std::hash::Hash>(now: &'a HashSet<T>, before: &'a HashSet<T>) -> impl Iterator<Item = &'a T> {
    now.intersection(before)
}

/// A port's drift (established, busy) when its tracked sockets were read:
/// the kernel's counts at that moment (opens, closes, busy enters, busy
/// exits), with the healer's own adjustments, less the `open` and `busy`
/// entries the read found.
fn drift_at_read(counts: &[u64; 4], user: &shed_common::UserPortState, open: i64, busy: i64) -> (i64, i64) {
    let [opened, closed, busy_enter, busy_exit] = *counts;
    let at_read = shed_common::PortState { opened, closed, busy_enter, busy_exit, ..shed_common::PortState::default() };
    (shed_common::established(&at_read, user) as i64 - open, shed_common::busy(&at_read, user) as i64 - busy)
}

/// Events of a port between two reads of its counts (opens, closes, busy
/// enters, busy exits); without an earlier read, more than any drift.
fn events_since(before: Option<&[u64; 4]>, now: &[u64; 4]) -> (i64, i64, i64, i64) {
    let far = i64::MAX / 4;
    let Some(b) = before else { return (far, far, far, far) };
    let moved = |i: usize| now[i].abs_diff(b[i]).min(far as u64) as i64;
    (moved(0), moved(1), moved(2), moved(3))
}

/// The part of a drift `d` (the kernel's count at the end of the read, less
/// the entries read) that events during the read cannot explain: each `up`
/// (an open, or a busy enter) may be counted by the kernel and missed by the
/// read, making `d` too high by one; each `down` (a close, a busy exit) may
/// be read and no longer counted, making it too low by one.
fn beyond(d: i64, up: i64, down: i64) -> i64 {
    if d > 0 { (d - up).max(0) } else { (d + down).min(0) }
}

/// A port's drift as one pass measured it (established, busy): what it saw,
/// and the part of that which events during the read cannot explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Drift {
    seen: (i64, i64),
    certain: (i64, i64),
}

/// The drift of a port's counts to correct now: seen in the same direction by
/// this pass and the last (a drift seen once waits), by the larger of the two
/// passes' certain parts (each is a bound the true drift reaches: on a busy
/// port, one pass's read may overlap more opens and closes than the other's).
fn drift_to_correct(before: Option<&Drift>, now: &Drift) -> Option<(i64, i64)> {
    let before = before?;
    let both = |b_seen: i64, n_seen: i64, b: i64, n: i64| {
        if b_seen.signum() == n_seen.signum() { n_seen.signum() * b.abs().max(n.abs()) } else { 0 }
    };
    let drift = (
        both(before.seen.0, now.seen.0, before.certain.0, now.certain.0),
        both(before.seen.1, now.seen.1, before.certain.1, now.certain.1),
    );
    (drift != (0, 0)).then_some(drift)
}

fn fxhash(flow: &FlowKey) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in flow
        .client_addr
        .iter()
        .chain(&flow.server_addr)
        .chain(&flow.client_port.to_le_bytes())
        .chain(&flow.server_port.to_le_bytes())
    {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_owed_before_the_first_and_while_one_awaits_confirmation() {
        let mut schedule = Schedule::new(Duration::from_secs(30));
        assert!(schedule.awaits_a_pass(), "none has run");
        schedule.passed(Instant::now(), Duration::from_millis(1), true);
        assert!(schedule.awaits_a_pass(), "it saw something to confirm");
        schedule.passed(Instant::now(), Duration::from_millis(1), false);
        assert!(!schedule.awaits_a_pass(), "confirmed: only the routine pass is left");
    }

    #[test]
    fn acts_only_on_what_two_passes_in_a_row_found() {
        let set = |v: &[u64]| v.iter().copied().collect::<HashSet<u64>>();
        let mut both: Vec<u64> = confirmed(&set(&[1, 2, 3]), &set(&[2, 3, 4])).copied().collect();
        both.sort_unstable();
        assert_eq!(both, [2, 3], "seen once (1 now, 4 before) is not acted on");
        assert_eq!(confirmed(&set(&[1]), &set(&[])).count(), 0, "the first pass acts on nothing");

        let quiet = |d: (i64, i64)| Drift { seen: d, certain: d };
        assert_eq!(drift_to_correct(None, &quiet((2, 1))), None, "a drift seen once waits");
        assert_eq!(drift_to_correct(Some(&quiet((2, 1))), &quiet((2, 1))), Some((2, 1)), "seen twice: corrected");
        assert_eq!(
            drift_to_correct(Some(&quiet((2, -1))), &quiet((-3, -1))),
            Some((0, -1)),
            "directions that disagree wait"
        );
        // Busy: +5 seen twice, one read overlapping 3 opens (certain +2), the other 1 (certain +4).
        let busy = |seen: i64, certain: i64| Drift { seen: (seen, 0), certain: (certain, 0) };
        assert_eq!(drift_to_correct(Some(&busy(5, 2)), &busy(5, 4)), Some((4, 0)), "the tighter bound of the two");
        assert_eq!(drift_to_correct(Some(&busy(2, 0)), &busy(1, 0)), None, "nothing certain: waits");
        // On a busy port: a phantom +5 measured while 3 connections opened is certainly +2;
        // closes during the read cannot make a positive drift look larger.
        assert_eq!(beyond(5, 3, 9), 2);
        assert_eq!(beyond(-5, 9, 3), -2);
        assert_eq!(beyond(2, 3, 0), 0, "within what concurrent opens explain: nothing certain");
        assert_eq!(beyond(0, 3, 3), 0);
        assert_eq!(
            drift_to_correct(Some(&quiet((-1, 0))), &quiet((-1, 0))),
            Some((-1, 0)),
            "an over-count is corrected too"
        );
        assert_eq!(drift_to_correct(Some(&quiet((0, 0))), &quiet((0, 0))), None, "no drift, nothing to do");
    }

    #[test]
    fn drift_is_the_adjusted_counts_less_the_entries_read() {
        let user = shed_common::UserPortState { established_adjust: -2, busy_adjust: 1, ..Default::default() };
        // 10 opened, 3 closed, 9 busy spells begun, 7 ended: 7 established
        // (5 after the healer's -2), 2 busy (3 after its +1).
        assert_eq!(drift_at_read(&[10, 3, 9, 7], &user, 4, 1), (1, 2), "one phantom connection, two phantom busy");
        assert_eq!(drift_at_read(&[10, 3, 9, 7], &user, 5, 3), (0, 0), "the entries agree with the counts");
        assert_eq!(drift_at_read(&[10, 3, 9, 7], &user, 6, 3), (-1, 0), "an entry the counts lost");
        assert_eq!(
            drift_at_read(&[3, 10, 7, 9], &shed_common::UserPortState::default(), 0, 0),
            (0, 0),
            "never below 0"
        );
    }

    #[test]
    fn events_between_two_reads_are_counted_per_kind() {
        assert_eq!(events_since(Some(&[1, 2, 3, 4]), &[11, 22, 33, 44]), (10, 20, 30, 40));
        assert_eq!(events_since(Some(&[5, 5, 5, 5]), &[5, 6, 5, 7]), (0, 1, 0, 2));
        let far = i64::MAX / 4;
        assert_eq!(
            events_since(None, &[1, 2, 3, 4]),
            (far, far, far, far),
            "no earlier read: anything could have moved"
        );
        assert_eq!(events_since(Some(&[0, 0, 0, 0]), &[u64::MAX, 0, 0, 1]).0, far, "capped, never negative");
        assert_eq!(beyond(1, 0, 0), 1, "a drift of one with nothing under way is certain");
        assert_eq!(beyond(-1, 0, 0), -1);
    }

    #[test]
    fn passes_run_at_start_on_evidence_to_confirm_and_as_a_routine() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let quick = Duration::from_millis(5);
        let mut s = Schedule::new(Duration::from_secs(30));
        assert_eq!(
            s.due(t0, false),
            Some(PassReason::Start),
            "the first check passes: connections may predate the gate"
        );
        s.passed(t0, quick, false);
        assert_eq!(s.due(at(500), true), None, "evidence waits for the gap after a pass (1 s)");
        assert_eq!(s.due(at(1_000), false), None, "no evidence, nothing pending: no pass before the interval");
        assert_eq!(s.due(at(29_999), false), None);
        assert_eq!(s.due(at(1_000), true), Some(PassReason::Evidence), "evidence brings a pass forward");
        assert_eq!(s.due(at(30_000), false), Some(PassReason::Routine), "the safety net");

        s.passed(at(30_000), quick, true);
        assert_eq!(s.due(at(30_500), false), None, "a finding is confirmed after a second, not at once");
        assert_eq!(s.due(at(31_000), false), Some(PassReason::Confirm));
        assert_eq!(s.due(at(31_000), true), Some(PassReason::Confirm), "confirming comes first");

        // A slow pass (a huge table) keeps ten times its duration between passes
        // brought forward, and the interval still bounds the wait.
        s.passed(at(40_000), Duration::from_millis(400), false);
        assert_eq!(s.due(at(43_999), true), None);
        assert_eq!(s.due(at(44_000), true), Some(PassReason::Evidence));
        s.passed(at(50_000), Duration::from_secs(5), false);
        assert_eq!(s.due(at(79_999), true), None, "a 5 s pass: at most one in 50 s, even on evidence");
        assert_eq!(s.due(at(100_000), true), Some(PassReason::Evidence));
        assert_eq!(s.due(at(100_000), false), None, "routine passes keep 100x their duration (1% of a core)");
        assert_eq!(s.due(at(549_999), false), None);
        assert_eq!(s.due(at(550_000), false), Some(PassReason::Routine));
        let mut short = Schedule::new(Duration::from_secs(1));
        short.passed(t0, quick, false);
        assert_eq!(short.due(at(1_000), false), Some(PassReason::Routine), "--heal-interval 1: every second");
    }

    #[test]
    fn adopted_flows_get_distinct_keys() {
        let keys: HashSet<u64> = (0..2_000u16)
            .map(|port| {
                let flow = FlowKey {
                    client_addr: shed_common::ipv4_mapped([10, 0, (port >> 8) as u8, port as u8]),
                    server_addr: shed_common::ipv4_mapped([10, 0, 0, 1]),
                    client_port: 40_000 + port,
                    server_port: 8080,
                };
                fxhash(&flow) & 0xffff_ffff
            })
            .collect();
        assert_eq!(keys.len(), 2_000, "one map key per adopted connection");
    }

    /// The gate's books as a plain table: what a pass forgets and adopts.
    #[derive(Default)]
    struct Table {
        socks: HashMap<u64, SockEntry>,
        exempt: Vec<[u8; 16]>,
        full: bool,
        user: UserPortState,
        corrected: Vec<(u32, (i64, i64))>,
        counted: Vec<(u32, i64)>,
    }

    impl Books for Table {
        fn forget_socket(&mut self, key: u64, _: &SockEntry) -> bool {
            self.socks.remove(&key).is_some()
        }
        fn adopt_socket(&mut self, key: u64, entry: SockEntry) -> bool {
            !self.full && self.socks.insert(key, entry).is_none()
        }
        fn tier_of(&self, addr: [u8; 16]) -> Option<u8> {
            self.exempt.contains(&addr).then_some(shed_common::tier::EXEMPT)
        }
        fn user_state(&self, _: u32) -> Result<UserPortState, Error> {
            Ok(self.user)
        }
        fn correct_drift(&mut self, slot: u32, drift: (i64, i64)) -> Result<(), Error> {
            self.user.established_adjust -= drift.0;
            self.user.busy_adjust -= drift.1;
            self.corrected.push((slot, drift));
            Ok(())
        }
        fn count_adopted(&mut self, slot: u32, adopted: i64) -> Result<(), Error> {
            self.user.established_adjust += adopted;
            self.counted.push((slot, adopted));
            Ok(())
        }
    }

    /// A pod taken over: what the table holds and the books do not is
    /// adopted and counted in one go, the exempt and the untracked ports
    /// aside, and nothing that is tracked already is counted twice.
    #[test]
    fn a_taken_over_pods_held_connections_are_adopted_and_counted_at_once() {
        let configs = configs();
        let tracked = HashSet::from([flow(1, 8080)]);
        let live = HashSet::from([flow(1, 8080), flow(2, 8080), flow(3, 8080), flow(4, 8080), flow(5, 9090)]);
        let mut books = Table { exempt: vec![flow(4, 8080).client_addr], ..Table::default() };
        assert_eq!(adopt_at_once(&mut books, &configs, &tracked, live.clone()).unwrap(), 2);
        let adopted: HashSet<FlowKey> = books.socks.values().map(|e| e.flow).collect();
        assert_eq!(adopted, HashSet::from([flow(2, 8080), flow(3, 8080)]));
        assert!(books.socks.values().all(|e| e.slot == 1 && e.busy == 0), "idle, in the port's slot");
        assert_eq!(books.counted, [(1, 2)], "counted on the port, once");
        assert_eq!(books.user.established_adjust, 2);
        assert!(books.corrected.is_empty(), "no drift was corrected: nothing had been counted yet");
        // A full map adopts nothing, and counts nothing it did not adopt.
        let mut full = Table { full: true, ..Table::default() };
        assert_eq!(adopt_at_once(&mut full, &configs, &tracked, live).unwrap(), 0);
        assert!(full.counted.is_empty() && full.user.established_adjust == 0);
        // What a first healing pass then sees: no drift, nothing to adopt.
        let mut healer = Healer::new(Duration::from_secs(30), HealReport::default());
        let mut on_books: HashMap<u64, SockEntry> = books.socks.clone();
        let mut outcome = outcome();
        let now_live = HashSet::from([flow(2, 8080), flow(3, 8080), flow(4, 8080)]);
        healer.adopt_untracked(&mut books, &configs, &mut on_books, &now_live, &mut outcome);
        assert_eq!(healer.untracked_before, HashSet::from([flow(4, 8080)]), "only the exempt client's is untracked");
        healer.adopt_untracked(&mut books, &configs, &mut on_books, &now_live, &mut outcome);
        assert_eq!(books.socks.len(), 2, "and never adopted");
    }

    fn flow(client: u8, server_port: u16) -> FlowKey {
        FlowKey {
            client_addr: shed_common::ipv4_mapped([10, 0, 0, client]),
            server_addr: shed_common::ipv4_mapped([10, 0, 0, 1]),
            client_port: 40_000 + u16::from(client),
            server_port,
        }
    }

    /// Port 8080 gated in slot 1.
    fn configs() -> BTreeMap<u16, PortConfig> {
        let config = PortConfig {
            slot: 1,
            ..PortConfig::new(8080, shed_common::action::DROP, false, shed_common::count_mode::CONNECTIONS)
        };
        BTreeMap::from([(8080, config)])
    }

    fn outcome() -> PassOutcome {
        PassOutcome { records: 0, found: false, acted: false, adopt_failed: 0 }
    }

    #[test]
    fn a_tracked_socket_of_ours_gone_from_the_table_is_forgotten_on_the_second_pass() {
        let configs = configs();
        let entry =
            |client: u8, slot: u32, port: u16| SockEntry { slot, ..adopted(&configs[&8080], &flow(client, port)) };
        // 1: ours and gone; 2: ours and live; 3: a slot the port no longer
        // holds (an earlier protection's); 4: a port not ours.
        let tracked: HashMap<u64, SockEntry> = HashMap::from([
            (1, entry(1, 1, 8080)),
            (2, entry(2, 1, 8080)),
            (3, entry(3, 9, 8080)),
            (4, entry(4, 1, 9090)),
        ]);
        let live = HashSet::from([flow(2, 8080)]);
        let mut books = Table { socks: tracked.clone(), ..Table::default() };
        let mut healer = Healer::new(Duration::from_secs(30), HealReport::default());
        let pass = |healer: &mut Healer, books: &mut Table, tracked: &mut HashMap<u64, SockEntry>| {
            let mut outcome = outcome();
            healer.forget_stale(books, &configs, tracked, &live, &mut outcome);
            (outcome.found, outcome.acted)
        };
        let mut first = tracked.clone();
        assert_eq!(pass(&mut healer, &mut books, &mut first), (true, false), "seen once: found, not acted on");
        assert_eq!(first.len(), 4);
        let mut second = tracked.clone();
        assert_eq!(pass(&mut healer, &mut books, &mut second), (false, true), "seen again: forgotten");
        let mut left: Vec<u64> = second.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [2, 3, 4], "only ours that the table lost");
        assert!(!books.socks.contains_key(&1) && books.socks.len() == 3);
        // A socket the gate already forgot (its close arrived late) is left as read.
        let mut third = tracked.clone();
        assert_eq!(pass(&mut healer, &mut books, &mut third), (false, false));
        assert!(third.contains_key(&1));
    }

    #[test]
    fn a_live_connection_the_gate_missed_is_adopted_on_the_second_pass_unless_exempt() {
        let configs = configs();
        let (ours, exempt, elsewhere) = (flow(1, 8080), flow(2, 8080), flow(3, 9090));
        let live = HashSet::from([ours, exempt, elsewhere]);
        let key = ADOPTED_KEY_BASE | (fxhash(&ours) & 0xffff_ffff);
        let pass = |healer: &mut Healer, books: &mut Table, tracked: &mut HashMap<u64, SockEntry>| {
            let mut outcome = outcome();
            healer.adopt_untracked(books, &configs, tracked, &live, &mut outcome);
            (outcome.found, outcome.acted, outcome.adopt_failed)
        };
        let mut books = Table { exempt: vec![exempt.client_addr], ..Table::default() };
        let mut healer = Healer::new(Duration::from_secs(30), HealReport::default());
        let mut tracked = HashMap::new();
        assert_eq!(pass(&mut healer, &mut books, &mut tracked), (true, false, 0), "seen once: found, not adopted");
        assert!(tracked.is_empty() && books.socks.is_empty());
        assert_eq!(pass(&mut healer, &mut books, &mut tracked), (false, true, 0), "seen again: adopted");
        let expected = adopted(&configs[&8080], &ours);
        assert_eq!(books.socks, HashMap::from([(key, expected)]), "ours only: not the exempt client, not port 9090");
        assert_eq!(tracked, books.socks);
        // Once tracked it is not untracked; a full map counts what it could not adopt.
        assert_eq!(pass(&mut healer, &mut books, &mut tracked), (false, false, 0));
        let mut full = Table { exempt: vec![exempt.client_addr], full: true, ..Table::default() };
        let mut healer = Healer::new(Duration::from_secs(30), HealReport::default());
        let mut tracked = HashMap::new();
        pass(&mut healer, &mut full, &mut tracked);
        assert_eq!(pass(&mut healer, &mut full, &mut tracked), (false, false, 1));
        assert!(tracked.is_empty());
    }

    #[test]
    fn a_drift_seen_on_two_passes_is_corrected_once() {
        let configs = configs();
        let entry = |client: u8, busy: u8| SockEntry { busy, ..adopted(&configs[&8080], &flow(client, 8080)) };
        // Three tracked, one busy; the counts say 5 opened and 1 busy spell begun.
        let tracked = HashMap::from([(1, entry(1, 1)), (2, entry(2, 0)), (3, entry(3, 0))]);
        let counts: EventCounts = BTreeMap::from([(8080, [5, 0, 1, 0])]);
        let mut books = Table::default();
        let mut healer = Healer::new(Duration::from_secs(30), HealReport::default());
        let mut pass = |books: &mut Table| {
            let mut outcome = outcome();
            healer.correct_counts(books, &configs, &tracked, (&counts, &counts), &mut outcome).unwrap();
            (outcome.found, outcome.acted)
        };
        assert_eq!(pass(&mut books), (true, false), "two phantom connections, seen once");
        assert!(books.corrected.is_empty());
        assert_eq!(pass(&mut books), (false, true), "seen again: corrected");
        assert_eq!(books.corrected, [(1, (2, 0))]);
        assert_eq!(pass(&mut books), (false, false), "the counts agree now: nothing found, nothing done");
        assert_eq!(books.corrected.len(), 1);
    }

    #[test]
    fn an_adopted_connection_is_established_and_idle_under_its_ports_slot() {
        let mut config = configs()[&8080];
        let entry = adopted(&config, &flow(1, 8080));
        assert_eq!((entry.slot, entry.port, entry.flow), (1, 8080, flow(1, 8080)));
        assert_eq!(entry.client, flow(1, 8080).client_addr, "charged to its client's key (an IPv4 address whole)");
        assert_eq!((entry.busy, entry.capped, entry.silent), (0, 0, 0), "idle, in no ring, releasing no charge");
        assert_eq!((entry.arrival_ns, entry.pickup_ns, entry.silent_epoch), (0, 0, 0));
        assert_eq!(entry.multiplexed, 0);
        config.count_mode = shed_common::count_mode::MULTIPLEXED;
        assert_eq!(adopted(&config, &flow(1, 8080)).multiplexed, 1);
    }
}
