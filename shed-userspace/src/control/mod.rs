// SPDX-License-Identifier: MIT OR Apache-2.0
//! Adaptive concurrency control: plain structs, no I/O and no clock of their
//! own. The daemon (and the simulation) feed one [`WindowSample`] per control
//! window and write back the [`Decision`]'s limit.
//!
//! Algorithms:
//! - `gradient`, the seeds' limiter: `gradient = clamp(baseline /
//!   observed, 0.5, 1.0)`, `target = limit * gradient + sqrt(limit)`,
//!   `new = (1 - smoothing) * limit + smoothing * target`, smoothing 0.2.
//! - `gradient2`: Netflix concurrency-limits `Gradient2Limit`: a long-window
//!   average of latency (a plain average of 10 warm-up samples, then an
//!   exponential one with factor 2 / (600 + 1)) against the current window,
//!   `gradient = clamp(tolerance * long / short, 0.5, 1.0)` with tolerance
//!   1.5, `new = limit * gradient + queue_size` (queue size 4), smoothed by
//!   0.2; the long average decays by 0.95 for the next window while it is more
//!   than twice the short one (recovery after a slow spell). With the guards
//!   and the named departures off it matches the reference window for window
//!   (the conformance test replays its own trajectories). The departures, each
//!   a [`Settings`] field on by default: `listen_drops_cut` (the reference
//!   ignores drops), `cut_while_app_limited` (the reference freezes while
//!   in-flight is under half the limit), `gradient2_long_at_most_baseline`
//!   (below); and the published limit rounds where the reference truncates.
//! - `aimd`: +1 per healthy window; x0.9, to a whole limit, when latency
//!   breaches `tolerance * baseline` (tolerance 2.0; `AIMDLimit` cuts only on
//!   drops and a 5 s timeout: an infinite tolerance matches it) or the listen
//!   queue overflows.
//! - `queue` (default): holds the queue wait of admitted requests (arrival in the socket
//!   to pick-up by the application, at the followed percentile) near a target
//!   (`--queue-target`, 5 ms: CoDel's target). Above it, Little's law gives the
//!   requests queued too many, `(wait - target) x completions/s`, and a quarter
//!   of them come off the limit (at most half the limit per window); at or under
//!   it the limit grows by `sqrt(limit) / 2` while in-flight presses it. The
//!   target is never below 3/4 of the median service time: keeping every
//!   worker fed takes about one request waiting per worker, and that request
//!   waits up to a service time, so a slow service needs a longer wait (one
//!   full service time let p99 grow to 1.5x unloaded in B4, half of one left
//!   workers idle at 4x). No baseline, so no probe, and a slower backend with
//!   no queue is not overload.
//! - `fixed`: the operator's limit.
//!
//! Guards shared by the adaptive algorithms (all in [`Settings`]):
//! - a window with fewer than `min_samples` completed requests holds the limit
//!   (except that listen-queue overflows still cut it), and the caller carries
//!   its samples into the next window, so a slow service is still judged
//!   (a baseline probe counts every window, thin or not, so it always ends);
//! - no growth while in-flight < limit / 2 (app-limited: the limit is not what
//!   holds the traffic back, so latency says nothing about a higher one);
//! - no growth for `cooldown_windows` windows after a cut (against flapping);
//! - the baseline is the minimum of the followed latency over the last
//!   `baseline_windows` windows (10 s by default), with that span jittered by
//!   +/-10% per port so a fleet does not re-probe in lockstep. A minimum over a
//!   moving span cannot get stuck low (old minima expire, so a service that got
//!   costlier is re-learned within one span) and cannot drift up while queues
//!   persist, because a falling limit drains the queue and brings the minimum
//!   back down within the span. gradient2's long-window average is held at or
//!   below this minimum: unchecked, it learns a standing queue as normal and
//!   lets the limit drift up with it (the common complaint about Gradient2),
//!   which the simulation showed as a p99 7x the unloaded one.
//!
//! One file per limiter ([`gradient`], [`gradient2`], [`aimd`], [`queue`]:
//! each proposes the next limit from a window), the guards they share in
//! [`guards`] (probe, objective, app-limited, cooldown, the baseline), and
//! [`Controller::on_window`] here, which runs them in order.

mod aimd;
mod gradient;
mod gradient2;
mod guards;
pub(crate) mod handshake;
pub(crate) mod minimum;
mod queue;
pub(crate) mod reserve;
pub(crate) mod retry;
pub(crate) mod service;
#[cfg(test)]
mod sim;
pub(crate) mod steer;
#[cfg(test)]
mod tests;
pub mod window;

use std::collections::VecDeque;

use serde::Serialize;
use shed_common::ControlConfig;

use guards::ServedRate;
use minimum::WindowedMin;
pub(crate) use queue::QUEUE_TARGET_US;

/// Which limiter runs a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    Gradient,
    Gradient2,
    Aimd,
    Fixed,
    Queue,
}

impl Algo {
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::Gradient => 0,
            Self::Gradient2 => 1,
            Self::Aimd => 2,
            Self::Fixed => 3,
            Self::Queue => 4,
        }
    }

    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            1 => Self::Gradient2,
            2 => Self::Aimd,
            3 => Self::Fixed,
            4 => Self::Queue,
            _ => Self::Gradient,
        }
    }

    /// Whether the limiter follows request latency (arrival to answer), which
    /// only request-response connections show.
    pub const fn follows_turns(self) -> bool {
        matches!(self, Self::Gradient | Self::Gradient2 | Self::Aimd)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Gradient => "gradient",
            Self::Gradient2 => "gradient2",
            Self::Aimd => "aimd",
            Self::Fixed => "fixed",
            Self::Queue => "queue",
        }
    }
}

impl crate::named::Named for Algo {
    const ALL: &'static [Self] = &[Self::Gradient, Self::Gradient2, Self::Aimd, Self::Fixed, Self::Queue];
    fn name(self) -> &'static str {
        Algo::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Self::Gradient => "Latency gradient against a probed baseline",
            Self::Gradient2 => "Netflix Gradient2: long-window average latency against the current window",
            Self::Aimd => "Additive increase, multiplicative decrease on latency or listen-queue drops",
            Self::Fixed => "A fixed limit (--limit)",
            Self::Queue => "Queue delay: the limit follows the measured queue wait (the default)",
        }
    }
}

impl std::fmt::Display for Algo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the limit is what it is after a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The operator's limit (`fixed`, or a `set --limit` just applied).
    Operator,
    TooFewSamples,
    AppLimited,
    Cooldown,
    /// Latency near the baseline: probing upward.
    Grow,
    /// Latency above the baseline (`queue`: requests waiting in the kernel,
    /// unread, past the target): queueing, so the limit came down.
    LatencyRising,
    /// The listen queue overflowed: cut.
    ListenOverflow,
    /// Moved less than one connection.
    Steady,
    /// Re-measuring the baseline with the limit held at a quarter (`queue`: the
    /// service's shortest service time, with the limit held at half its knee).
    Probe,
    /// `queue`: requests waiting inside the service past the target (a server
    /// that reads every request at once holds more than its knee), so the
    /// limit came down.
    ServiceQueue,
    /// `queue`: in-flight was past the work bound, the most the service can
    /// hold and answer each request within its wait (Little's law, from the
    /// rate and the shortest service it was seen to have): the limit came
    /// down to the bound at once.
    WorkBound,
    /// `queue`: clients gave up on their requests in numbers (closed before
    /// any answer) before answers measured the service: half the limit came off.
    Abandoned,
}

impl Reason {
    pub const fn to_raw(self) -> u32 {
        self as u32
    }

    /// Its name in JSON, metrics and logs (`latency_rising`).
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Operator,
            1 => Self::TooFewSamples,
            2 => Self::AppLimited,
            3 => Self::Cooldown,
            4 => Self::Grow,
            5 => Self::LatencyRising,
            6 => Self::ListenOverflow,
            8 => Self::Probe,
            9 => Self::ServiceQueue,
            10 => Self::WorkBound,
            11 => Self::Abandoned,
            _ => Self::Steady,
        }
    }
}

/// Controller settings; defaults are the ones documented in the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Settings {
    pub algo: Algo,
    pub initial_limit: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    pub smoothing: f64,
    pub min_samples: u64,
    pub cooldown_windows: u32,
    pub baseline_windows: usize,
    /// Windows of each baseline probe (0: never probe).
    pub probe_windows: u32,
    /// gradient2: latency tolerance before the limit comes down.
    pub gradient2_tolerance: f64,
    /// gradient2: long-window length, in samples (windows).
    pub gradient2_long_window: f64,
    /// gradient2: queue-size headroom added each window.
    pub gradient2_queue_size: f64,
    /// aimd: breach when observed > tolerance * baseline.
    pub aimd_tolerance: f64,
    /// aimd: multiplicative decrease.
    pub backoff: f64,
    /// Cut by `backoff` when the listen queue overflows. A departure for
    /// gradient2: Netflix's Gradient2Limit never reads drops (its AIMDLimit does).
    pub listen_drops_cut: bool,
    /// Still cut while app-limited (in-flight under half the limit). A departure:
    /// the reference limiters freeze then, neither up nor down.
    pub cut_while_app_limited: bool,
    /// queue: the queue wait (at the followed percentile) to hold admitted requests near, us.
    pub queue_target_us: f64,
    /// The operator's latency objective, us (0: none). See [`Controller::objective`].
    pub objective_us: f64,
    /// The control window, seconds (queue: turns a window's completions into a rate).
    pub window_s: f64,
    /// gradient2: hold the long average at or below the baseline (the windowed
    /// minimum), so a standing queue is not learned as normal. A departure from
    /// Gradient2Limit.
    pub gradient2_long_at_most_baseline: bool,
    /// The port counts work (`--count work`, the default): in-flight is the
    /// requests owing an answer, so by Little's law the work bound
    /// ([`Controller::work_bound`]) applies to it. Idle kept-alive connections
    /// (`connections`) or whole multiplexed connections are not requests.
    pub counts_work: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // B4 and B5 side by side: queue keeps goodput with the lowest tail latency
            // and settles fastest (docs/CONTROLLERS.md, "How the limit adapts").
            algo: Algo::Queue,
            initial_limit: 100,
            min_limit: 4,
            max_limit: 10_000,
            smoothing: 0.2,
            min_samples: 10,
            cooldown_windows: 3,
            baseline_windows: 100,
            probe_windows: 5,
            gradient2_tolerance: 1.5,
            gradient2_long_window: 600.0,
            gradient2_queue_size: 4.0,
            aimd_tolerance: 2.0,
            backoff: 0.9,
            listen_drops_cut: true,
            cut_while_app_limited: true,
            gradient2_long_at_most_baseline: true,
            queue_target_us: QUEUE_TARGET_US,
            objective_us: 0.0,
            window_s: 0.1,
            counts_work: true,
        }
    }
}

impl Settings {
    /// The settings an operator gave a port (`SHED_CONTROL`), its limit the initial one.
    pub(crate) fn from_config(config: &ControlConfig, limit: u32) -> Self {
        let algo = Algo::from_raw(config.algo);
        // The adaptive bounds do not apply to an operator's fixed limit.
        let (min_limit, max_limit) = if algo == Algo::Fixed {
            (1, shed_common::MAX_LIMIT)
        } else {
            (config.min_limit.max(1), config.max_limit.max(config.min_limit.max(1)))
        };
        let defaults = Settings::default();
        // Zero means "not set" (a map written before these fields existed): keep the default.
        let or = |v: u32, d: u32| if v == 0 { d } else { v };
        Settings {
            algo,
            initial_limit: limit,
            min_limit,
            max_limit,
            min_samples: u64::from(or(config.min_samples, defaults.min_samples as u32)),
            cooldown_windows: config.cooldown_windows,
            baseline_windows: or(config.baseline_windows, defaults.baseline_windows as u32) as usize,
            probe_windows: config.probe_windows,
            window_s: f64::from(config.window_ms.max(1)) / 1000.0,
            objective_us: f64::from(config.target_latency_ms) * 1000.0,
            queue_target_us: if config.queue_target_us == 0 {
                defaults.queue_target_us
            } else {
                f64::from(config.queue_target_us)
            },
            ..defaults
        }
    }
}

/// What the controller sees of one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct WindowSample {
    /// In-flight at the end of the window.
    pub in_flight: u64,
    /// Requests completed in the window.
    pub samples: u64,
    /// The followed latency (a percentile of sojourn time), microseconds.
    pub latency_us: u64,
    /// The same percentile of queue wait (arrival in the socket to pick-up by
    /// the application) of the requests picked up in the window, microseconds.
    pub queue_wait_us: u64,
    /// Median service time (pick-up to the first answer byte) in the window, microseconds.
    pub service_us: u64,
    /// Requests answered in the window (each with a service time).
    pub answered: u64,
    /// Their mean service time, microseconds: with `answered`, by Little's law,
    /// the requests the service itself held on average (see [`service`]).
    pub service_mean_us: u64,
    /// Listen-queue overflows and drops in the window.
    pub listen_drops: u64,
    /// SYNs the limit turned away in the window (or would have, in dry-run):
    /// the limit pressed even if in-flight is low again when the window ends,
    /// as it is between the bursts of synchronized clients.
    pub rejected: u64,
    /// Control windows this sample spans (more than 1 when a quiet window's
    /// samples were carried over); 0 counts as 1.
    pub windows: u32,
    /// The time the sample spans, microseconds, as the caller measured it (a
    /// late tick makes a window longer than configured); 0: `windows` control windows.
    pub elapsed_us: u64,
    /// Requests whose connection closed before their answer (the client gave
    /// up, reset, or the connection was destroyed) in the window.
    pub abandoned: u64,
    /// Their mean age when they went (arrival to close), microseconds: a lower
    /// bound on the latency they would have had.
    pub abandoned_age_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Decision {
    pub limit: u32,
    pub reason: Reason,
}

/// One port's limiter.
#[derive(Clone, Debug)]
pub(crate) struct Controller {
    settings: Settings,
    limit: f64,
    baseline: WindowedMin,
    baseline_us: f64,
    /// The rate the service answers at while it has a queue.
    served: ServedRate,
    /// In-flight at the end of the last window.
    last_in_flight: u64,
    /// Exponential average of the followed latency: one window's percentile of a
    /// few dozen requests is noisy, and a minimum over noisy values sits too low.
    smoothed_us: f64,
    /// Windows until the next baseline probe, and probe windows left.
    until_probe: usize,
    probe_left: u32,
    /// The limit to return to after a probe.
    before_probe: f64,
    /// The smoothed latency when the probe began, and the latency of the probe's
    /// last window with enough samples (infinite: none yet).
    latency_before_probe: f64,
    probe_last_us: f64,
    probe_interval: usize,
    /// gradient2's long-window average, how many samples it has, and their
    /// sum while it warms up (a plain average of the first ten).
    long_us: f64,
    long_count: u32,
    long_sum: f64,
    windows_since_cut: u32,
    /// queue: the service stage's knee and drain probe.
    stage: service::ServiceStage,
    /// queue: the last proposal's cut came from the queue inside the service.
    inside_cut: bool,
}

impl Controller {
    /// `seed` jitters the baseline span (use the port, so ports differ).
    pub(crate) fn new(settings: Settings, seed: u64) -> Self {
        let jitter = (splitmix(seed) % 21) as f64 / 100.0 - 0.10; // -10% ..= +10%
        let span = ((settings.baseline_windows as f64) * (1.0 + jitter)).round().max(1.0) as usize;
        Self {
            settings,
            limit: f64::from(settings.initial_limit.clamp(settings.min_limit, settings.max_limit)),
            baseline: WindowedMin { span, values: VecDeque::with_capacity(span), covered: 0 },
            served: ServedRate { span, rates: VecDeque::with_capacity(span) },
            last_in_flight: 0,
            until_probe: span / 2,
            probe_left: 0,
            before_probe: 0.0,
            latency_before_probe: 0.0,
            probe_last_us: f64::INFINITY,
            probe_interval: (span * 9 / 10).max(1),
            smoothed_us: 0.0,
            baseline_us: 0.0,
            long_us: 0.0,
            long_count: 0,
            long_sum: 0.0,
            windows_since_cut: u32::MAX,
            stage: service::ServiceStage::new(span),
            inside_cut: false,
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    /// The latency the controller treats as "no queue", microseconds.
    pub(crate) fn baseline_us(&self) -> u64 {
        if self.settings.algo == Algo::Gradient2 { self.long_us as u64 } else { self.baseline_us as u64 }
    }

    /// Whether the port counts requests (`--count work`): see [`Settings::counts_work`].
    pub(crate) fn set_counts_work(&mut self, counts_work: bool) {
        self.settings.counts_work = counts_work;
    }

    /// The operator set the limit: continue from it.
    pub(crate) fn set_limit(&mut self, limit: u32) {
        self.limit = f64::from(limit.clamp(self.settings.min_limit, self.settings.max_limit));
    }

    /// New settings; the current limit is kept (clamped to the new bounds).
    pub(crate) fn reconfigure(&mut self, settings: Settings) {
        let limit = self.limit();
        let algo_changed = settings.algo != self.settings.algo;
        self.settings = settings;
        if algo_changed {
            self.long_count = 0;
            self.long_sum = 0.0;
            self.windows_since_cut = u32::MAX;
        }
        self.set_limit(limit);
    }

    /// One window: the steps every limiter takes, its own proposal among them.
    pub(crate) fn on_window(&mut self, s: &WindowSample) -> Decision {
        let st = self.settings;
        if st.algo == Algo::Fixed {
            return Decision { limit: self.limit(), reason: Reason::Operator };
        }
        let windows = s.windows.max(1) as usize;
        let overflow = s.listen_drops > 0 && st.listen_drops_cut;
        if self.probe_left > 0 {
            return self.during_probe(s, windows, overflow);
        }
        if st.algo == Algo::Queue && self.stage.probing() {
            return self.during_drain_probe(s, windows, overflow);
        }
        if overflow {
            return self.cut(self.limit * st.backoff, Reason::ListenOverflow);
        }
        // The work bound needs no completions: it reads in-flight now against
        // what the service was seen to finish (Little's law), so a window with
        // few answers, or none because every client gave up, is still judged.
        if let Some(decision) = self.over_work_bound(s, windows) {
            return decision;
        }
        // queue judges answers too: a server that reads every request at once
        // reads a burst in one window and answers it over the next ones.
        let judged = if st.algo == Algo::Queue { s.samples.max(s.answered + s.abandoned) } else { s.samples };
        if judged < st.min_samples {
            return Decision { limit: self.limit(), reason: Reason::TooFewSamples };
        }
        if let Some(probe) = self.start_probe(windows) {
            return probe;
        }
        // queue: what the service itself held (its queue inside), which the
        // objective and the proposal both judge.
        let held = if st.algo == Algo::Queue { self.observe_stage(s, windows) } else { None };
        let objective = self.objective(s, windows, held);
        let observed = self.observe(s);
        let proposed = match st.algo {
            Algo::Gradient => self.propose_gradient(observed),
            Algo::Gradient2 => self.propose_gradient2(observed),
            Algo::Aimd => self.propose_aimd(observed),
            Algo::Queue => self.propose_queue(s, windows, objective, held),
            Algo::Fixed => unreachable!("handled above"),
        };
        let pressed = s.rejected > 0 || (s.in_flight as f64) >= self.limit / 2.0;
        // A queue inside that the objective allows is no reason to probe: the
        // bursts it admits would be turned away.
        if st.algo == Algo::Queue
            && pressed
            && objective.is_none_or(|o| !o.met)
            && let Some(hold) = self.stage.start_probe(self.limit, f64::from(st.min_limit), windows)
        {
            self.limit = hold.clamp(f64::from(st.min_limit), f64::from(st.max_limit));
            return Decision { limit: self.limit(), reason: Reason::Probe };
        }
        let proposed = self.within_objective(proposed, objective, pressed);
        // queue grows only on evidence that the service keeps up: answers
        // judged this window, or answers keeping pace with the requests read
        // (the kernel's queue waits alone say nothing of a server that reads
        // every request at once and answers far fewer: its queue is inside).
        // A server that reads when free answers about what it reads, so its
        // thin windows still grow, or its cuts would ratchet the limit down.
        let unanswered = s.answered.saturating_add(s.abandoned).saturating_mul(4) < s.samples.saturating_mul(3);
        let proposed =
            if st.algo == Algo::Queue && held.is_none() && unanswered { proposed.min(self.limit) } else { proposed };
        self.settle(proposed, pressed)
    }
}

/// A small deterministic mixer (SplitMix64) for jitter and the simulation.
pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
