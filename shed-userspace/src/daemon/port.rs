// SPDX-License-Identifier: MIT OR Apache-2.0
//! One port's control: each window it reads the maps, builds the window's
//! figures, asks the controller (and the handshake window's policy), and
//! writes the limit, the window and the status back.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self},
    time::{Duration, Instant},
};

use shed_common::{ControlConfig, ControlStatus, PortLatency, count_mode, counter, tier};

use crate::{
    control::{
        Algo, Controller, Decision, Reason, Settings, WindowSample,
        handshake::HandshakeWindow,
        reserve::TierHoldBack,
        window::{Signals, Window, histogram_percentile},
    },
    error::Error,
    host::{
        netstat, paths,
        sockdiag::{AcceptQueue, SocketTable},
    },
    kernel::maps::{self, GateMaps},
    observe::report::Decisions,
};

/// One port's controller and what it remembers between windows.
pub(super) struct PortControl {
    pub(super) slot: u32,
    pub(super) port: u16,
    controller: Controller,
    generation: u32,
    window: Duration,
    percentile: f64,
    next_run: Instant,
    last_hist: PortLatency,
    /// When the histograms were last taken as a judged window's start.
    last_judged: Instant,
    last_listen_drops: Option<u64>,
    /// Whether the port's accept queue was at least half full at the last window's end.
    pressed_before: bool,
    listen_drops_total: u64,
    last_reason: Option<Reason>,
    /// When a changed limit was last logged at INFO (at most one a second).
    last_info: Option<Instant>,
    windows: u64,
    /// Quiet windows whose samples were carried into the current one.
    carried: u32,
    reserve: TierHoldBack,
    last_rejected_by_tier: [u64; tier::COUNT],
    /// SYNs the limit turned away (or would have, in dry-run) up to the last judged window.
    last_limit_rejected: u64,
    /// Abandoned requests and their summed ages (us) up to the last judged window.
    last_abandoned: (u64, u64),
    handshakes: HandshakeWindow,
}

impl PortControl {
    #[expect(clippy::large_types_passed_by_value, reason = "kept whole: the first window's start")]
    pub(super) fn new(
        port: u16,
        slot: u32,
        limit: u32,
        config: &ControlConfig,
        hist: PortLatency,
        handshakes: HandshakeWindow,
    ) -> Self {
        let mut controller = Controller::new(Settings::from_config(config, limit), u64::from(port));
        controller.set_limit(limit);
        let window = Duration::from_millis(u64::from(config.window_ms.max(1)));
        Self {
            slot,
            port,
            controller,
            generation: config.generation,
            window,
            percentile: f64::from(config.percentile),
            next_run: Instant::now() + window,
            last_hist: hist,
            last_judged: Instant::now(),
            last_listen_drops: None,
            pressed_before: false,
            listen_drops_total: 0,
            last_reason: None,
            last_info: None,
            windows: 0,
            carried: 0,
            reserve: TierHoldBack::default(),
            last_rejected_by_tier: [0; tier::COUNT],
            last_limit_rejected: 0,
            last_abandoned: (0, 0),
            handshakes,
        }
    }

    /// Runs one window if it is due: read the maps, build the window, decide, write back.
    pub(super) fn run(
        &mut self,
        maps: &mut GateMaps,
        now: Instant,
        decisions: &Decisions,
        accept_queues: &mut AcceptQueues,
        ports: &BTreeSet<u16>,
    ) -> Result<(), Error> {
        if !self.due(now) {
            return Ok(());
        }
        let Some(reading) = self.read(maps, now, accept_queues, ports)? else { return Ok(()) };
        let window = Window::between(&self.last_hist, &reading.hist);
        let judge_queue_waits = self.controller.settings().algo == Algo::Queue;
        let sample = window.sample(self.signals(&reading, now), self.percentile, judge_queue_waits);

        let decision = self.controller.on_window(&sample);
        let held_back = self.hold_back(&reading);

        let snapshot = &reading.snapshot;
        if snapshot.config.tiered != 0 && held_back != snapshot.reserve.held_back {
            maps.write_reserve(self.slot, shed_common::TierReserve { held_back })?;
        }
        let handshakes = self.handshakes.on_window(snapshot.user.shift(), &reading.hist.handshake, now);
        if let Some(shift) = handshakes.write_shift {
            maps.set_handshake_shift(self.slot, shift)?;
        }
        let handshake_times = handshakes.times;
        if decision.limit != snapshot.limit {
            maps.set_limit(self.slot, decision.limit)?;
        }
        // Written: only now is the decision logged and counted.
        self.close_window(decision, &reading, now);
        self.log_decision(decision, &reading, &sample, now);
        decisions.record(self.port, decision.reason);
        let status = self.status(decision, &reading, &window, &sample, handshake_times);
        let retry_after = crate::control::retry::retry_after_seconds(status.queue_wait_p99_us);
        if snapshot.config.answers_http() && snapshot.user.retry_after_s != retry_after {
            maps.set_retry_after(self.slot, retry_after)?;
        }
        maps.write_status(self.slot, status)
    }

    /// Whether a window is due at `now`; if so, when the next one is.
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next_run {
            return false;
        }
        // From the due time, not from now: the ticker fires every window too, and
        // `now + window` would fall a hair after the next tick and skip it (the
        // window would be twice as long as configured). Far behind (a stall): no
        // burst of catch-up windows.
        self.next_run += self.window;
        if self.next_run <= now {
            self.next_run = now + self.window;
        }
        true
    }

    /// Everything this window reads: the port's maps (following a settings change
    /// at once), its histograms, and the host's listen drops and accept queue.
    /// `None`: the port was detached meanwhile.
    fn read(
        &mut self,
        maps: &mut GateMaps,
        now: Instant,
        accept_queues: &mut AcceptQueues,
        ports: &BTreeSet<u16>,
    ) -> Result<Option<Reading>, Error> {
        let config = match maps.config(self.port) {
            Ok(config) => config,
            // Detached since this tick read the ports (`shedctl detach --port` runs
            // concurrently): the next tick drops this controller. Not an error.
            Err(Error::PortNotProtected { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let snapshot = maps.snapshot(self.port, config)?;
        let hist = maps.latency(self.slot)?;
        self.follow_settings(&snapshot);
        self.controller.set_counts_work(snapshot.config.count_mode == count_mode::WORK);

        let drops_now = fs::read_to_string(paths::NETSTAT).ok().as_deref().and_then(netstat::listen_drops);
        let namespace_drops = match (drops_now, self.last_listen_drops) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            _ => 0,
        };
        self.last_listen_drops = drops_now;
        // The drop counter is the namespace's: count its drops against this port only
        // while its own accept queue is (or just was) at least half full. Without
        // sock_diag, every drop counts, as before.
        let accept = accept_queues.of(self.port, ports, now);
        let pressed = accept.is_none_or(AcceptQueue::pressed);
        let listen_drops = if pressed || self.pressed_before { namespace_drops } else { 0 };
        self.pressed_before = pressed;
        self.listen_drops_total += listen_drops;

        // Counted since the last judged window, as the histograms are (a thin window carries both).
        let limit_rejected =
            snapshot.counter(counter::REJECTED_LIMIT) + snapshot.counter(counter::DRY_RUN_WOULD_REJECT);
        let abandoned = (snapshot.counter(counter::ABANDONED), snapshot.counter(counter::ABANDONED_AGE_US));
        Ok(Some(Reading {
            snapshot,
            hist,
            listen_drops,
            accept: accept.unwrap_or_default(),
            limit_rejected,
            abandoned,
        }))
    }

    /// Follows a settings change (`shedctl set`, a reload) in the window that first sees it.
    fn follow_settings(&mut self, snapshot: &maps::PortSnapshot) {
        if snapshot.control.generation == self.generation {
            return;
        }
        self.generation = snapshot.control.generation;
        self.controller.reconfigure(Settings::from_config(&snapshot.control, snapshot.limit));
        self.window = Duration::from_millis(u64::from(snapshot.control.window_ms.max(1)));
        self.percentile = f64::from(snapshot.control.percentile);
        if snapshot.control.requested_limit != 0 {
            self.controller.set_limit(snapshot.control.requested_limit);
        }
        tracing::info!(port = self.port, algo = %self.controller.settings().algo, limit = self.controller.limit(), "controller settings changed");
    }

    /// The window's signals besides its histograms, all since the last judged window.
    fn signals(&self, reading: &Reading, now: Instant) -> Signals {
        let abandoned = reading.abandoned.0.saturating_sub(self.last_abandoned.0);
        let abandoned_age = reading.abandoned.1.saturating_sub(self.last_abandoned.1);
        Signals {
            abandoned,
            abandoned_age_us: abandoned_age / abandoned.max(1),
            in_flight: reading.snapshot.in_flight(),
            listen_drops: reading.listen_drops,
            rejected: reading.limit_rejected.saturating_sub(self.last_limit_rejected),
            elapsed_us: now.saturating_duration_since(self.last_judged).as_micros() as u64,
            windows: self.carried + 1,
        }
    }

    /// The slots each tier holds back, from this window's rejections by tier.
    fn hold_back(&mut self, reading: &Reading) -> [u16; tier::COUNT] {
        let snapshot = &reading.snapshot;
        let rejected_by_tier: [u64; tier::COUNT] =
            std::array::from_fn(|t| snapshot.counter(counter::VERIFIED_REJECTED_BY_TIER + t));
        let rejected_now: [u64; tier::COUNT] =
            std::array::from_fn(|t| rejected_by_tier[t].saturating_sub(self.last_rejected_by_tier[t]));
        self.last_rejected_by_tier = rejected_by_tier;
        self.reserve.on_window(rejected_now, snapshot.limit, snapshot.config.share_permille)
    }

    /// Ends the window, or, when it was too thin to judge, keeps its requests for the next one.
    fn close_window(&mut self, decision: Decision, reading: &Reading, now: Instant) {
        self.windows += 1;
        if decision.reason == Reason::TooFewSamples {
            self.carried += 1;
            return;
        }
        self.last_hist = reading.hist;
        self.last_judged = now;
        self.last_limit_rejected = reading.limit_rejected;
        self.last_abandoned = reading.abandoned;
        self.carried = 0;
    }

    /// A line at INFO when the limit changes, at most one a second per port;
    /// every other judged window (a new reason, a held limit, a change within
    /// the second) at DEBUG. Every window is counted in the metrics anyway. A
    /// window too thin to judge is not logged.
    fn log_decision(&mut self, decision: Decision, reading: &Reading, sample: &WindowSample, now: Instant) {
        let Some(level) = self.log_level(decision, reading.snapshot.limit, now) else { return };
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    port = self.port,
                    limit = decision.limit,
                    previous = reading.snapshot.limit,
                    reason = %decision.reason.name(),
                    observed_us = sample.latency_us,
                    baseline_us = self.controller.baseline_us(),
                    in_flight = sample.in_flight,
                    queue_wait_us = sample.queue_wait_us,
                    service_us = sample.service_mean_us,
                    answered = sample.answered,
                    abandoned = sample.abandoned,
                    work_bound = self.controller.work_bound().map_or(0, |b| b.round() as u64),
                    objective_us = (self.controller.settings().objective_us) as u64,
                    "limit decision"
                )
            };
        }
        if level == tracing::Level::INFO {
            line!(info);
        } else {
            line!(debug);
        }
    }

    /// The level a decision is logged at (see [`Self::log_decision`]), if at all.
    fn log_level(&mut self, decision: Decision, previous: u32, now: Instant) -> Option<tracing::Level> {
        if decision.reason == Reason::TooFewSamples {
            return None;
        }
        let changed = decision.limit != previous;
        let quiet = self.last_info.is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1));
        let new_reason = self.last_reason != Some(decision.reason);
        self.last_reason = Some(decision.reason);
        if changed && !quiet {
            self.last_info = Some(now);
            Some(tracing::Level::INFO)
        } else {
            (changed || new_reason).then_some(tracing::Level::DEBUG)
        }
    }

    /// What `shedctl stats` shows of the window just judged.
    fn status(
        &self,
        decision: Decision,
        reading: &Reading,
        window: &Window,
        sample: &WindowSample,
        handshake_times: (u64, u64),
    ) -> ControlStatus {
        ControlStatus {
            baseline_us: self.controller.baseline_us(),
            observed_us: sample.latency_us,
            queue_wait_p50_us: histogram_percentile(&window.queue_wait, 50.0),
            queue_wait_p99_us: histogram_percentile(&window.queue_wait, 99.0),
            service_p50_us: histogram_percentile(&window.service, 50.0),
            service_p99_us: histogram_percentile(&window.service, 99.0),
            sojourn_p50_us: histogram_percentile(&window.sojourn, 50.0),
            sojourn_p99_us: histogram_percentile(&window.sojourn, 99.0),
            samples: sample.samples,
            listen_drops: reading.listen_drops,
            windows: self.windows,
            reason: decision.reason.to_raw(),
            previous_limit: reading.snapshot.limit,
            handshake_p50_us: handshake_times.0,
            handshake_p99_us: handshake_times.1,
            accept_queue: reading.accept.waiting,
            accept_backlog: reading.accept.backlog,
            listen_drops_total: self.listen_drops_total,
        }
    }
}

/// What one window read from the maps and the host.
struct Reading {
    snapshot: maps::PortSnapshot,
    hist: PortLatency,
    /// Listen drops counted against this port in the window.
    listen_drops: u64,
    accept: AcceptQueue,
    /// SYNs the limit turned away (or would have, in dry-run), cumulative.
    limit_rejected: u64,
    /// Abandoned requests and their summed ages (us), cumulative.
    abandoned: (u64, u64),
}

/// The protected ports' accept queues, read through sock_diag at most once per
/// tick for all ports together (one dump of the namespace's listeners serves
/// every port whose window is due).
#[derive(Default)]
pub(super) struct AcceptQueues {
    /// Opened at the first read; `Err` after opening failed (then every listen drop counts).
    table: Option<Result<SocketTable, ()>>,
    /// The tick of the last read and what it found (`None`: the read failed).
    read: Option<(Instant, Option<BTreeMap<u16, AcceptQueue>>)>,
}

impl AcceptQueues {
    /// `port`'s accept queue at tick `now`, or `None` when sock_diag cannot be asked.
    pub(super) fn of(&mut self, port: u16, ports: &BTreeSet<u16>, now: Instant) -> Option<AcceptQueue> {
        if self.read.as_ref().is_none_or(|(at, _)| *at != now) {
            let table = self.table.get_or_insert_with(|| {
                SocketTable::open().map_err(|e| {
                    tracing::warn!(
                        "no accept-queue signal (sock_diag: {e}): every listen drop in the namespace counts"
                    );
                })
            });
            let queues = table
                .as_mut()
                .ok()
                .and_then(|t| t.accept_queues(ports).map_err(|e| tracing::debug!("accept queues: {e}")).ok());
            self.read = Some((now, queues));
        }
        let (_, queues) = self.read.as_ref()?;
        Some(queues.as_ref()?.get(&port).copied().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::handshake::HandshakeWindow;

    fn port_control(window_ms: u32) -> PortControl {
        let config = ControlConfig { window_ms, ..ControlConfig::default() };
        PortControl::new(8080, 2, 100, &config, PortLatency::default(), HandshakeWindow::new(Duration::ZERO))
    }

    #[test]
    fn windows_fall_due_on_their_own_schedule_and_a_stall_brings_no_burst() {
        let mut p = port_control(100);
        let t0 = p.next_run;
        let ms = |n: u64| Duration::from_millis(n);
        assert!(!p.due(t0.checked_sub(ms(1)).unwrap()), "not before its time");
        assert!(p.due(t0));
        assert_eq!(p.next_run, t0 + ms(100), "the next from the due time");
        assert!(!p.due(t0 + ms(50)));
        assert!(p.due(t0 + ms(103)), "a tick a hair late");
        assert_eq!(p.next_run, t0 + ms(200), "still on the schedule, not 100 ms after the late tick");
        assert!(p.due(t0 + ms(200)), "exactly due: the next window");
        assert!(p.due(t0 + ms(1_000)), "after a stall, one window");
        assert_eq!(p.next_run, t0 + ms(1_100), "and the next a window after now: no catch-up burst");
        assert!(!p.due(t0 + ms(1_050)));
    }

    #[test]
    fn a_changed_limit_is_logged_at_info_at_most_once_a_second() {
        let mut p = port_control(100);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let d = |limit: u32, reason: Reason| Decision { limit, reason };
        let (info, debug) = (Some(tracing::Level::INFO), Some(tracing::Level::DEBUG));
        assert_eq!(p.log_level(d(90, Reason::LatencyRising), 100, at(0)), info);
        assert_eq!(p.log_level(d(80, Reason::LatencyRising), 90, at(500)), debug, "a change within the second");
        assert_eq!(p.log_level(d(80, Reason::LatencyRising), 80, at(600)), None, "held, same reason: nothing");
        assert_eq!(p.log_level(d(80, Reason::Steady), 80, at(700)), debug, "a new reason");
        assert_eq!(p.log_level(d(70, Reason::LatencyRising), 80, at(1_000)), info, "a second on: INFO again");
        assert_eq!(p.log_level(d(70, Reason::TooFewSamples), 60, at(3_000)), None, "too thin to judge: never");
        assert_eq!(p.log_level(d(75, Reason::Grow), 70, at(3_000)), info);
    }

    #[test]
    fn tiers_below_a_rejected_one_hold_back_from_this_windows_rejections_only() {
        let mut p = port_control(100);
        let mut counters = shed_common::PortCounters::default();
        let reading = |counters: shed_common::PortCounters| Reading {
            snapshot: maps::PortSnapshot {
                port: 8080,
                config: shed_common::PortConfig::new(2, shed_common::action::DROP, false, 0),
                limit: 100,
                control: ControlConfig::default(),
                status: ControlStatus::default(),
                reserve: shed_common::TierReserve::default(),
                state: shed_common::PortState::default(),
                user: shed_common::UserPortState::default(),
                ring: shed_common::HandshakeRing::default(),
                silent: shed_common::HandshakeRing::default(),
                now_ns: 0,
                counters,
            },
            hist: PortLatency::default(),
            listen_drops: 0,
            accept: AcceptQueue::default(),
            limit_rejected: 0,
            abandoned: (0, 0),
        };
        assert_eq!(p.hold_back(&reading(counters)), [0; tier::COUNT], "nothing rejected, nothing held");
        counters.values[counter::VERIFIED_REJECTED_BY_TIER + usize::from(tier::CRITICAL)] = 7;
        let held = p.hold_back(&reading(counters));
        let mut fresh = TierHoldBack::default();
        let mut rejected = [0; tier::COUNT];
        rejected[usize::from(tier::CRITICAL)] = 7;
        let want = fresh.on_window(rejected, 100, shed_common::tier::DEFAULT_SHARE_PERMILLE);
        assert_eq!(held, want, "the critical tier's rejections, read from its own counter");
        assert!(held[usize::from(tier::LOW)] > 0, "{held:?}");
        // The counters are cumulative: the next window, unchanged, brings no new rejection.
        let next = p.hold_back(&reading(counters));
        assert_eq!(next, fresh.on_window([0; tier::COUNT], 100, shed_common::tier::DEFAULT_SHARE_PERMILLE));
    }
}
