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

pub mod reserve;
#[cfg(test)]
mod sim;
pub mod window;

use std::collections::VecDeque;

use serde::Serialize;
use shed_common::ControlConfig;

/// During a baseline probe the limit is held at this fraction of its value.
const PROBE_DEPTH: f64 = 0.25;

/// Weight of each window's latency in the smoothed latency the controllers follow.
const LATENCY_SMOOTHING: f64 = 0.3;

/// queue: the default target queue wait, 5 ms: CoDel's and Meta's adaptive
/// LIFO target, short against any request a user waits for, and long enough
/// that a busy server's normal jitter (a few ms of scheduling) is not overload.
pub const QUEUE_TARGET_US: f64 = 5_000.0;

/// queue: the share of the excess queue (Little's law) removed per window.
const QUEUE_GAIN: f64 = 0.25;

/// queue: the target is at least this many median service times.
const QUEUE_TARGET_PER_SERVICE: f64 = 0.75;

/// The share of the operator's objective the controllers plan to use: the rest
/// covers the handshake, scheduling and the estimate's error.
const OBJECTIVE_MARGIN: f64 = 0.97;

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
    /// Latency above the baseline: queueing, so the limit came down.
    LatencyRising,
    /// The listen queue overflowed: cut.
    ListenOverflow,
    /// Moved less than one connection.
    Steady,
    /// Re-measuring the baseline with the limit held at a quarter.
    Probe,
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
            _ => Self::Steady,
        }
    }
}

/// Controller settings; defaults are the ones documented in the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
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
        }
    }
}

impl Settings {
    /// The settings an operator gave a port (`SHED_CONTROL`), its limit the initial one.
    pub fn from_config(config: &ControlConfig, limit: u32) -> Self {
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
pub struct WindowSample {
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub limit: u32,
    pub reason: Reason,
}

/// Minimum over a moving span of control windows.
#[derive(Clone, Debug)]
struct WindowedMin {
    span: usize,
    /// (value, windows it covered)
    values: VecDeque<(f64, usize)>,
    covered: usize,
}

impl WindowedMin {
    fn push(&mut self, v: f64, windows: usize) -> f64 {
        self.values.push_back((v, windows));
        self.covered += windows;
        while self.covered > self.span && self.values.len() > 1 {
            let (_, w) = self.values.pop_front().expect("len > 1");
            self.covered -= w;
        }
        self.values.iter().map(|&(v, _)| v).fold(f64::INFINITY, f64::min)
    }
}

/// The rate the service answers at while every worker is busy: the median of
/// the answer rates of the recent windows in which requests queued throughout
/// (a median, because a window in which a burst began or drained understates
/// the rate and one short window's noise overstates it).
#[derive(Clone, Debug)]
struct ServedRate {
    /// Windows kept.
    span: usize,
    rates: VecDeque<f64>,
}

impl ServedRate {
    fn push(&mut self, rate: f64) {
        self.rates.push_back(rate);
        if self.rates.len() > self.span {
            self.rates.pop_front();
        }
    }

    /// 0 until a queued window is seen.
    fn rate(&self) -> f64 {
        let mut sorted: Vec<f64> = self.rates.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    }
}

/// What the operator's objective allows in one window.
#[derive(Clone, Copy, Debug)]
struct Objective {
    /// The queue wait a request may have and still be answered in time, us.
    wait_us: f64,
    /// The limit the service drains within that wait.
    limit: f64,
    /// Whether the window's requests met the objective.
    met: bool,
}

/// One port's limiter.
#[derive(Clone, Debug)]
pub struct Controller {
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
}

impl Controller {
    /// `seed` jitters the baseline span (use the port, so ports differ).
    pub fn new(settings: Settings, seed: u64) -> Self {
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
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    /// The latency the controller treats as "no queue", microseconds.
    pub fn baseline_us(&self) -> u64 {
        if self.settings.algo == Algo::Gradient2 { self.long_us as u64 } else { self.baseline_us as u64 }
    }

    /// The operator set the limit: continue from it.
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = f64::from(limit.clamp(self.settings.min_limit, self.settings.max_limit));
    }

    /// New settings; the current limit is kept (clamped to the new bounds).
    pub fn reconfigure(&mut self, settings: Settings) {
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

    pub fn on_window(&mut self, s: &WindowSample) -> Decision {
        let st = self.settings;
        if st.algo == Algo::Fixed {
            return Decision { limit: self.limit(), reason: Reason::Operator };
        }
        let windows = s.windows.max(1) as usize;
        let overflow = s.listen_drops > 0 && st.listen_drops_cut;
        // Baseline probe (as BBR's ProbeRTT): every ~0.9 baseline span, hold the
        // limit at a quarter for a few windows so queues drain and the minimum is
        // re-measured without them. This is what keeps the baseline from
        // learning a standing queue as normal and ratcheting up with it. A probe
        // lasts its windows whatever they carry (thin windows must not stretch
        // it: it would never end on sparse traffic), and a cut that lands
        // during it applies to the limit it returns to.
        if self.probe_left > 0 {
            self.probe_left = self.probe_left.saturating_sub(windows as u32);
            if overflow {
                self.before_probe *= st.backoff;
            }
            if s.samples >= st.min_samples {
                let raw = (s.latency_us as f64).max(1.0);
                self.smoothed_us += LATENCY_SMOOTHING * (raw - self.smoothed_us);
                self.baseline_us = self.baseline.push(self.smoothed_us, windows);
                self.probe_last_us = raw;
            }
            if self.probe_left == 0 {
                let restore = self.restore_after_probe();
                self.limit = restore.clamp(f64::from(st.min_limit), f64::from(st.max_limit));
                self.windows_since_cut = 0;
            }
            return Decision { limit: self.limit(), reason: Reason::Probe };
        }
        if overflow {
            return self.cut(self.limit * st.backoff, Reason::ListenOverflow);
        }
        if s.samples < st.min_samples {
            return Decision { limit: self.limit(), reason: Reason::TooFewSamples };
        }
        self.until_probe = self.until_probe.saturating_sub(windows);
        // queue needs no baseline, so no probe; with an objective, the objective
        // bounds latency, not a learned baseline (and a probe would shed a whole
        // burst of synchronized clients that the service could have served in time).
        let probes = st.probe_windows > 0 && st.algo != Algo::Queue && st.objective_us <= 0.0;
        if self.until_probe == 0 && probes {
            self.until_probe = self.probe_interval;
            self.probe_left = st.probe_windows;
            self.before_probe = self.limit;
            self.latency_before_probe = self.smoothed_us;
            self.probe_last_us = f64::INFINITY;
            self.limit = (self.limit * PROBE_DEPTH).max(f64::from(st.min_limit));
            return Decision { limit: self.limit(), reason: Reason::Probe };
        }
        let objective = self.objective(s, windows);
        let raw = (s.latency_us as f64).max(1.0);
        self.smoothed_us =
            if self.smoothed_us == 0.0 { raw } else { self.smoothed_us + LATENCY_SMOOTHING * (raw - self.smoothed_us) };
        let observed = raw;
        self.baseline_us = self.baseline.push(self.smoothed_us, s.windows.max(1) as usize);
        let proposed = match st.algo {
            Algo::Gradient => {
                let gradient = (self.baseline_us / observed).clamp(0.5, 1.0);
                let target = self.limit * gradient + self.limit.sqrt();
                (1.0 - st.smoothing) * self.limit + st.smoothing * target
            }
            Algo::Gradient2 => {
                // Gradient2Limit's long average: a plain average of the first ten
                // samples, then an exponential one with factor 2 / (window + 1).
                if self.long_count < 10 {
                    self.long_count += 1;
                    self.long_sum += observed;
                    self.long_us = self.long_sum / f64::from(self.long_count);
                } else {
                    let factor = 2.0 / (st.gradient2_long_window + 1.0);
                    self.long_us = self.long_us * (1.0 - factor) + observed * factor;
                }
                if st.gradient2_long_at_most_baseline {
                    self.long_us = self.long_us.min(self.baseline_us);
                }
                let long = self.long_us;
                // Well above the short one (a slow spell is over): decay it for the next window.
                if long / observed > 2.0 {
                    self.long_us *= 0.95;
                }
                let gradient = (st.gradient2_tolerance * long / observed).clamp(0.5, 1.0);
                let target = self.limit * gradient + st.gradient2_queue_size;
                (1.0 - st.smoothing) * self.limit + st.smoothing * target
            }
            Algo::Aimd => {
                if observed > st.aimd_tolerance * self.baseline_us {
                    self.limit * st.backoff
                } else {
                    self.limit + 1.0
                }
            }
            Algo::Queue => {
                let wait = s.queue_wait_us as f64;
                // Keeping every worker fed takes about one request waiting per
                // worker, which waits up to a service time: never aim below 3/4
                // of the median service time.
                let target = st
                    .queue_target_us
                    .max(QUEUE_TARGET_PER_SERVICE * s.service_us as f64)
                    .max(objective.map_or(0.0, |o| o.wait_us));
                if wait > target {
                    // Little's law: the requests queued beyond the target are the
                    // excess wait times the rate requests are served; remove a share
                    // of them (at most half the limit in one window).
                    let rate = s.samples as f64 / self.seconds(s, windows);
                    let excess = (wait - target) / 1e6 * rate;
                    (self.limit - QUEUE_GAIN * excess).max(self.limit * 0.5)
                } else {
                    // No queue beyond the target: grow gently (the app-limited guard below
                    // keeps it from growing when in-flight does not press the limit).
                    self.limit + (self.limit.sqrt() / 2.0).max(1.0)
                }
            }
            Algo::Fixed => unreachable!("handled above"),
        };
        let pressed = s.rejected > 0 || (s.in_flight as f64) >= self.limit / 2.0;
        let proposed = match objective {
            // Within the objective, latency is no reason to cut. Where the limit
            // pressed, it becomes what the service answers in time: more would
            // miss the objective, less would turn away what it could serve.
            Some(o) if o.met && o.limit > 0.0 => {
                if pressed {
                    o.limit
                } else {
                    self.limit.min(o.limit)
                }
            }
            // The rate is not known yet (no window had a queue throughout: small
            // bursts drain within one): double while the objective is met, as
            // slow start does, until bursts last long enough to be measured.
            Some(o) if o.met && pressed => proposed.max(self.limit * 2.0),
            Some(o) if o.met => proposed.max(self.limit),
            _ => proposed,
        };
        let proposed = proposed.clamp(f64::from(st.min_limit), f64::from(st.max_limit));
        let app_limited = !pressed;
        if app_limited && !st.cut_while_app_limited {
            self.windows_since_cut = self.windows_since_cut.saturating_add(1);
            return Decision { limit: self.limit(), reason: Reason::AppLimited };
        }
        if proposed < self.limit - 1e-9 {
            return self.cut(proposed, Reason::LatencyRising);
        }
        self.windows_since_cut = self.windows_since_cut.saturating_add(1);
        if proposed > self.limit + 1e-9 {
            if app_limited {
                return Decision { limit: self.limit(), reason: Reason::AppLimited };
            }
            if self.windows_since_cut <= st.cooldown_windows {
                return Decision { limit: self.limit(), reason: Reason::Cooldown };
            }
            let before = self.limit();
            self.limit = proposed;
            return Decision {
                limit: self.limit(),
                reason: if self.limit() == before { Reason::Steady } else { Reason::Grow },
            };
        }
        Decision { limit: self.limit(), reason: Reason::Steady }
    }

    /// What the operator's objective allows this window (None: no objective).
    ///
    /// A request may wait what the objective (less a margin) leaves after its
    /// own service. The service answers at most the rate it kept up while it had
    /// a queue (a windowed maximum), so by Little's law it drains `rate x wait`
    /// requests within that wait: a limit that high is admitted in time, even
    /// when they all arrive at once.
    fn objective(&mut self, s: &WindowSample, windows: usize) -> Option<Objective> {
        let st = self.settings;
        if st.objective_us <= 0.0 {
            return None;
        }
        let service = s.service_us as f64;
        let wait_us = (OBJECTIVE_MARGIN * st.objective_us - service).max(0.0);
        // Requests waited for a worker, and work was under way when the window
        // began and when it ended: every worker was likely busy throughout, so
        // this is the rate the service keeps up. Not a carried sample: it spans
        // quiet windows.
        let queued = s.queue_wait_us as f64 >= (service / 2.0).max(1000.0);
        if queued && windows == 1 && self.last_in_flight > 0 && s.in_flight > 0 {
            self.served.push(s.samples as f64 / self.seconds(s, windows));
        }
        self.last_in_flight = s.in_flight;
        let rate = self.served.rate();
        let met = match st.algo {
            Algo::Queue => s.queue_wait_us as f64 <= wait_us,
            _ => s.latency_us as f64 <= OBJECTIVE_MARGIN * st.objective_us,
        };
        Some(Objective { wait_us, limit: (rate * wait_us / 1e6).round(), met })
    }

    /// The limit a probe returns to, from what it saw (the latency of its last
    /// window, when the quarter limit has drained the queue most, against the
    /// smoothed latency before it; its first windows still answer requests
    /// admitted before it, which says nothing of a change), instead of the limit
    /// before it whatever happened. Higher, although a quarter of the limit
    /// was in flight: the service itself slowed during the probe (it fell on a
    /// change), and against its baseline the limiter is about to cut; returning
    /// to the old limit would overshoot first and settle later, so the limit
    /// returns scaled by the ratio, as a gradient would (at most by half).
    /// Lower (a standing queue drained): the old limit, and the new baseline
    /// does the rest (scaling it too cuts twice, and the limit ratchets down
    /// probe after probe). The baseline itself is left alone: a probe too short
    /// to drain a slow service's queue must not teach that queue as normal.
    fn restore_after_probe(&self) -> f64 {
        if !self.probe_last_us.is_finite() || self.probe_last_us <= self.latency_before_probe {
            return self.before_probe;
        }
        self.before_probe * (self.latency_before_probe / self.probe_last_us).clamp(0.5, 1.0)
    }

    /// The time a sample spans, seconds.
    fn seconds(&self, s: &WindowSample, windows: usize) -> f64 {
        if s.elapsed_us > 0 { s.elapsed_us as f64 / 1e6 } else { windows as f64 * self.settings.window_s }
    }

    fn cut(&mut self, to: f64, reason: Reason) -> Decision {
        // aimd keeps a whole limit, as AIMDLimit does (`(int) (limit * backoff)`).
        let to = if self.settings.algo == Algo::Aimd { to.floor() } else { to };
        self.limit = to.clamp(f64::from(self.settings.min_limit), f64::from(self.settings.max_limit));
        self.windows_since_cut = 0;
        Decision { limit: self.limit(), reason }
    }
}

/// A small deterministic mixer (SplitMix64) for jitter and the simulation.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gradient(limit: u32, baseline_us: u64) -> Controller {
        let mut c = Controller::new(
            Settings {
                algo: Algo::Gradient,
                initial_limit: limit,
                min_limit: 10,
                max_limit: 500,
                ..Settings::default()
            },
            0,
        );
        // Establish the baseline with one window at it, without moving the limit.
        c.baseline.push(baseline_us as f64, 1);
        c.smoothed_us = 40_000.0;
        c
    }

    fn window(latency_us: u64, in_flight: u64) -> WindowSample {
        WindowSample {
            in_flight,
            samples: 100,
            latency_us,
            queue_wait_us: latency_us / 2,
            service_us: 0,
            listen_drops: 0,
            rejected: 0,
            windows: 1,
            elapsed_us: 0,
        }
    }

    #[test]
    fn seeds_worked_example_100_to_92() {
        // Baseline 20 ms, observed 40 ms, limit 100: gradient 0.5, target 60, 0.8*100 + 0.2*60 = 92.
        let mut c = gradient(100, 20_000);
        let d = c.on_window(&window(40_000, 100));
        assert_eq!(d, Decision { limit: 92, reason: Reason::LatencyRising });
        assert_eq!(c.baseline_us(), 20_000);
    }

    #[test]
    fn rising_latency_never_raises_the_limit_past_the_tolerance() {
        for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
            let mut c = Controller::new(Settings { algo, initial_limit: 200, ..Settings::default() }, 1);
            for _ in 0..20 {
                c.on_window(&window(10_000, 200));
            }
            let start = c.limit();
            let mut last = start;
            for step in 1..50 {
                let d = c.on_window(&window(10_000 + step * 2_000, 1_000));
                // A baseline probe dips and restores the limit by design.
                if d.reason == Reason::Probe {
                    continue;
                }
                // Within the algorithms' tolerance (at most 2x the baseline) the limit may still probe upward.
                if step > 5 {
                    assert!(d.limit <= last, "{algo}: limit rose from {last} to {} as latency rose", d.limit);
                }
                last = d.limit;
            }
            assert!(
                last < start / 2,
                "{algo}: latency 10x the baseline must bring the limit well down: {start} -> {last}"
            );
        }
    }

    #[test]
    fn limits_stay_within_bounds() {
        let settings =
            Settings { algo: Algo::Gradient, initial_limit: 50, min_limit: 20, max_limit: 60, ..Settings::default() };
        for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
            let mut c = Controller::new(Settings { algo, ..settings }, 2);
            for _ in 0..200 {
                assert!(c.on_window(&window(1_000, 1_000)).limit <= 60);
            }
            for _ in 0..200 {
                assert!(c.on_window(&window(1_000_000, 1_000)).limit >= 20);
            }
        }
    }

    #[test]
    fn app_limited_windows_do_not_grow() {
        let mut c = gradient(100, 10_000);
        let d = c.on_window(&window(10_000, 20));
        assert_eq!(d, Decision { limit: 100, reason: Reason::AppLimited });
        let d = c.on_window(&window(10_000, 90));
        assert_eq!(d.reason, Reason::Grow);
        assert!(d.limit > 100);
        // Half the limit in flight is enough to grow.
        let mut c = gradient(100, 10_000);
        assert_eq!(c.on_window(&window(10_000, 50)).reason, Reason::Grow);
    }

    #[test]
    fn too_few_samples_hold_but_overflow_cuts() {
        let mut c = gradient(100, 10_000);
        let quiet = WindowSample {
            in_flight: 100,
            samples: 3,
            latency_us: 90_000,
            queue_wait_us: 0,
            service_us: 0,
            listen_drops: 0,
            rejected: 0,
            windows: 1,
            elapsed_us: 0,
        };
        assert_eq!(c.on_window(&quiet), Decision { limit: 100, reason: Reason::TooFewSamples });
        let overflow = WindowSample { listen_drops: 5, ..quiet };
        assert_eq!(c.on_window(&overflow), Decision { limit: 90, reason: Reason::ListenOverflow });
    }

    #[test]
    fn cooldown_after_a_cut() {
        let mut c = gradient(100, 10_000);
        assert_eq!(c.on_window(&window(20_000, 100)).reason, Reason::LatencyRising);
        for _ in 0..3 {
            assert_eq!(c.on_window(&window(10_000, 100)).reason, Reason::Cooldown);
        }
        assert_eq!(c.on_window(&window(10_000, 100)).reason, Reason::Grow);
    }

    #[test]
    fn baseline_expires_and_is_relearned() {
        let mut c = Controller::new(Settings { algo: Algo::Gradient, probe_windows: 0, ..Settings::default() }, 3);
        c.on_window(&window(1_000, 100));
        assert_eq!(c.baseline_us(), 1_000);
        // A costlier service for longer than the span: the (smoothed) baseline follows it up.
        for _ in 0..200 {
            c.on_window(&window(8_000, 100));
        }
        assert!((7_900..=8_000).contains(&c.baseline_us()), "baseline {}", c.baseline_us());
    }

    #[test]
    fn fixed_keeps_the_operator_limit() {
        let mut c =
            Controller::new(Settings { algo: Algo::Fixed, initial_limit: 7, min_limit: 1, ..Settings::default() }, 0);
        for latency in [1, 1_000_000] {
            assert_eq!(c.on_window(&window(latency, 7)), Decision { limit: 7, reason: Reason::Operator });
        }
    }

    #[test]
    fn the_windowed_minimum_keeps_exactly_its_span() {
        let mut m = WindowedMin { span: 3, values: VecDeque::new(), covered: 0 };
        assert_eq!(m.push(5.0, 1), 5.0);
        assert_eq!(m.push(9.0, 1), 5.0);
        assert_eq!(m.push(7.0, 1), 5.0, "three windows in a span of three: the first still counts");
        assert_eq!(m.push(8.0, 1), 7.0, "the fourth pushes the first out");
        let mut m = WindowedMin { span: 2, values: VecDeque::new(), covered: 0 };
        assert_eq!(m.push(4.0, 5), 4.0, "one value longer than the span is kept (never empty)");
        assert_eq!(m.push(6.0, 1), 6.0);
    }

    #[test]
    fn settings_and_operator_changes_are_kept() {
        let settings =
            Settings { algo: Algo::Gradient, initial_limit: 50, min_limit: 5, max_limit: 80, ..Settings::default() };
        let mut c = Controller::new(settings, 0);
        assert_eq!(c.settings().max_limit, 80);
        c.set_limit(70);
        assert_eq!(c.limit(), 70);
        c.set_limit(500);
        assert_eq!(c.limit(), 80, "clamped to max_limit");
        c.reconfigure(Settings { max_limit: 60, ..settings });
        assert_eq!((c.settings().max_limit, c.limit()), (60, 60), "new bounds apply, the limit is clamped");
    }

    #[test]
    fn a_new_algorithm_starts_without_the_old_ones_cooldown() {
        for (to, cooled) in [(Algo::Gradient, true), (Algo::Aimd, false)] {
            let mut c = gradient(100, 10_000);
            assert_eq!(c.on_window(&window(20_000, 100)).reason, Reason::LatencyRising);
            c.reconfigure(Settings { algo: to, ..*c.settings() });
            let d = c.on_window(&window(10_000, 100));
            assert_eq!(d.reason == Reason::Cooldown, cooled, "{to}: {d:?}");
        }
    }

    #[test]
    fn exactly_min_samples_is_enough() {
        let mut c = gradient(100, 10_000);
        let at_min = WindowSample { samples: c.settings().min_samples, ..window(40_000, 100) };
        assert_eq!(c.on_window(&at_min).reason, Reason::LatencyRising);
    }

    #[test]
    fn no_probe_when_probes_are_off() {
        let mut c = Controller::new(Settings { algo: Algo::Gradient, probe_windows: 0, ..Settings::default() }, 3);
        for _ in 0..500 {
            assert_ne!(c.on_window(&window(1_000, 100)).reason, Reason::Probe);
        }
    }

    #[test]
    fn aimd_backs_off_only_past_its_tolerance() {
        let aimd = |observed: u64| {
            let mut c = gradient(100, 10_000);
            c.reconfigure(Settings { algo: Algo::Aimd, ..*c.settings() });
            let tolerance = c.settings().aimd_tolerance;
            assert_eq!(tolerance, 2.0, "the test's latencies assume the default tolerance");
            c.on_window(&window(observed, 100))
        };
        assert_eq!(aimd(20_000), Decision { limit: 101, reason: Reason::Grow }, "at the tolerance: grow");
        assert_eq!(aimd(20_001), Decision { limit: 90, reason: Reason::LatencyRising }, "past it: back off");
    }

    #[test]
    fn at_the_maximum_the_limit_is_steady_even_when_little_is_in_flight() {
        let mut c = gradient(500, 10_000);
        assert_eq!(c.on_window(&window(10_000, 10)), Decision { limit: 500, reason: Reason::Steady });
    }

    #[test]
    fn gradient2_follows_a_slow_average_and_resets_it_on_a_sudden_drop() {
        let settings = Settings { algo: Algo::Gradient2, probe_windows: 0, ..Settings::default() };
        let mut c = Controller::new(settings, 0);
        // Warm-up: a plain average of the first ten windows.
        for _ in 0..10 {
            c.on_window(&window(10_000, 100));
        }
        assert_eq!(c.baseline_us(), 10_000);
        // The latency doubles for good: the long average creeps up by 2/601 of the gap
        // a window (held at the baseline while the baseline's span still sees 10 ms):
        // at most 20 - 10 * (1 - 2/601)^300 = 16.3 ms after 300 windows.
        for _ in 0..300 {
            c.on_window(&window(20_000, 100));
        }
        let long = c.baseline_us();
        assert!((12_000..=17_500).contains(&long), "a slow average, far from both: {long}");
        // A sudden drop below half the average: the average moves by 2/601, then is cut by 5%.
        let before = long as f64;
        c.on_window(&window(5_000, 100));
        let factor = 2.0 / (settings.gradient2_long_window + 1.0);
        let expected = (before * (1.0 - factor) + 5_000.0 * factor) * 0.95;
        assert!((c.baseline_us() as f64 - expected).abs() <= 2.0, "{} vs {expected:.0}", c.baseline_us());
    }

    #[test]
    fn queue_cuts_the_excess_queue_and_grows_gently_below_its_target() {
        let settings = Settings { algo: Algo::Queue, initial_limit: 40, cooldown_windows: 0, ..Settings::default() };
        let sample = |queue_wait_us: u64, in_flight: u64| WindowSample {
            in_flight,
            samples: 100, // over a 0.1 s window: 1,000 requests/s
            latency_us: 50_000,
            queue_wait_us,
            service_us: 0,
            listen_drops: 0,
            rejected: 0,
            windows: 1,
            elapsed_us: 0,
        };
        // 25 ms against a 5 ms target at 1,000/s: 20 requests queued too many, a quarter of them removed.
        let mut c = Controller::new(settings, 0);
        assert_eq!(c.on_window(&sample(25_000, 40)), Decision { limit: 35, reason: Reason::LatencyRising });
        // A huge excess cuts at most half the limit in one window.
        assert_eq!(c.on_window(&sample(2_000_000, 35)).limit, 18);
        // A slow service raises the target to 3/4 of its median service time: 25 ms
        // of queue for a 60 ms service is no excess.
        let mut c = Controller::new(settings, 0);
        let slow = WindowSample { service_us: 60_000, ..sample(25_000, 40) };
        assert_eq!(c.on_window(&slow).reason, Reason::Grow);
        // At the target or under, with in-flight pressing the limit: + sqrt(limit) / 2, at least 1.
        let mut c = Controller::new(Settings { initial_limit: 16, ..settings }, 0);
        assert_eq!(c.on_window(&sample(5_000, 16)), Decision { limit: 18, reason: Reason::Grow });
        assert_eq!(c.on_window(&sample(0, 18)).limit, 20);
        // App-limited: no growth, however short the queue.
        assert_eq!(c.on_window(&sample(0, 5)).reason, Reason::AppLimited);
        // A service that is merely slow (long service, no queue) is not overload: latency alone never cuts.
        let d = c.on_window(&WindowSample { latency_us: 10_000_000, ..sample(1_000, 20) });
        assert!(d.limit >= 20, "{d:?}");
        // The operator's target is honoured.
        let mut c = Controller::new(Settings { queue_target_us: 30_000.0, ..settings }, 0);
        assert_eq!(c.on_window(&sample(25_000, 40)).reason, Reason::Grow);
    }

    #[test]
    fn queue_never_probes() {
        let mut c = Controller::new(Settings { algo: Algo::Queue, probe_windows: 5, ..Settings::default() }, 0);
        for _ in 0..1_000 {
            assert_ne!(c.on_window(&window(10_000, 100)).reason, Reason::Probe);
        }
    }

    /// A burst's window: the limit turned clients away, yet in-flight has
    /// drained below half the limit by the window's end.
    fn burst_window(latency_us: u64, rejected: u64) -> WindowSample {
        WindowSample { rejected, ..window(latency_us, 10) }
    }

    #[test]
    fn rejections_show_the_limit_pressed_when_in_flight_has_drained() {
        let settings = Settings { algo: Algo::Gradient, probe_windows: 0, cooldown_windows: 0, ..Settings::default() };
        let mut c = Controller::new(settings, 0);
        for _ in 0..5 {
            c.on_window(&window(10_000, 100));
        }
        let before = c.limit();
        assert_eq!(
            c.on_window(&burst_window(10_000, 0)).reason,
            Reason::AppLimited,
            "nothing turned away: app-limited"
        );
        let d = c.on_window(&burst_window(10_000, 30));
        assert_eq!(d.reason, Reason::Grow, "turned clients away with latency at the baseline: grow");
        assert!(d.limit > before);
    }

    /// Windows of a service answering 200 requests/s with a queue (every worker
    /// busy), 20 ms each, from a burst of `in_flight` that the limit cut at `rejected`.
    fn draining(queue_wait_us: u64, in_flight: u64, rejected: u64) -> WindowSample {
        WindowSample {
            in_flight,
            samples: 20,
            latency_us: queue_wait_us + 20_000,
            queue_wait_us,
            service_us: 20_000,
            listen_drops: 0,
            rejected,
            windows: 1,
            elapsed_us: 100_000,
        }
    }

    #[test]
    fn an_objective_sets_the_limit_the_service_drains_within_it() {
        for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
            let settings = Settings { algo, initial_limit: 40, objective_us: 1e6, ..Settings::default() };
            let mut c = Controller::new(settings, 0);
            // A burst: 40 admitted, 360 turned away; then it drains at 200/s.
            c.on_window(&draining(50_000, 40, 360));
            for (wait, left) in [(100_000, 20), (150_000, 1)] {
                c.on_window(&draining(wait, left, 0));
            }
            // The next burst presses the limit: it becomes 200/s x (97% of 1 s - 20 ms) = 190.
            let d = c.on_window(&draining(50_000, 40, 360));
            assert_eq!(d.limit, 190, "{algo}: {d:?}");
            // Requests waiting past what the objective leaves: the limit comes down.
            let d = c.on_window(&draining(990_000, 190, 0));
            assert!(d.limit < 190, "{algo}: missed the objective, cut: {d:?}");
            // An objective bounds latency instead of a learned baseline: no probe.
            for _ in 0..300 {
                assert_ne!(c.on_window(&draining(100_000, 150, 10)).reason, Reason::Probe, "{algo}");
            }
        }
    }

    #[test]
    fn until_the_rate_is_known_the_limit_doubles_while_the_objective_is_met() {
        let settings = Settings {
            algo: Algo::Gradient,
            initial_limit: 40,
            objective_us: 1e6,
            cooldown_windows: 0,
            ..Settings::default()
        };
        let mut c = Controller::new(settings, 0);
        c.on_window(&window(10_000, 10));
        // Latency 25x the baseline but within the objective, no queue to measure a rate in:
        // not pressed, held; pressed, doubled (as slow start).
        assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..window(250_000, 10) }).limit, 40);
        assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..window(250_000, 40) }).limit, 80);
        assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..burst_window(250_000, 5) }).limit, 160);
        // Past the objective: the gradient cuts as it would without one.
        assert!(c.on_window(&window(2_000_000, 160)).limit < 160);
    }

    #[test]
    fn a_probe_that_falls_on_a_slowdown_returns_scaled_by_what_it_saw() {
        let settings = Settings { algo: Algo::Gradient, initial_limit: 100, probe_windows: 3, ..Settings::default() };
        let to_probe = |latency_us: u64| {
            let mut c = Controller::new(settings, 0);
            while c.on_window(&window(latency_us, 100)).reason != Reason::Probe {}
            c
        };
        // The service slows 2x during the probe (a quarter of the limit in flight):
        // the limit returns at half, as the gradient would cut it next.
        let mut c = to_probe(10_000);
        let before = c.before_probe;
        // Its first window still answers requests admitted before the change.
        for latency_us in [10_000, 20_000, 20_000] {
            c.on_window(&window(latency_us, 25));
        }
        assert_eq!(c.limit(), (before * 0.5).round() as u32, "returned scaled by 10 ms / 20 ms");
        // The probe drained a standing queue (it saw half the latency): the old
        // limit; the baseline it lowered does the rest.
        let mut c = to_probe(20_000);
        let before = c.before_probe;
        for _ in 0..3 {
            c.on_window(&window(10_000, 25));
        }
        assert_eq!(c.limit(), before.round() as u32);
    }

    #[test]
    fn raw_codes_round_trip() {
        for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Fixed, Algo::Queue] {
            assert_eq!(Algo::from_raw(algo.to_raw()), algo);
        }
        for r in 0..9 {
            assert_eq!(Reason::from_raw(r).to_raw(), r);
        }
    }

    proptest! {
        #[test]
        fn no_nan_or_overflow_on_any_sample(
            algo in prop::sample::select(vec![Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue]),
            samples in prop::collection::vec((0u64..=u64::MAX, 0u64..=u64::MAX, 0u64..=u64::MAX, 0u64..3), 1..200),
        ) {
            let settings = Settings { algo, min_limit: 1, max_limit: u32::MAX, ..Settings::default() };
            let mut c = Controller::new(settings, 9);
            for (latency_us, samples, in_flight, drops) in samples {
                let d = c.on_window(&WindowSample { in_flight, samples, latency_us, queue_wait_us: latency_us / 2, service_us: 0, listen_drops: drops, rejected: 0, windows: 1, elapsed_us: 0 });
                prop_assert!(d.limit >= 1);
                prop_assert!(c.limit.is_finite() && c.baseline_us.is_finite() && c.long_us.is_finite());
            }
        }
    }

    /// Netflix concurrency-limits' own trajectories (tests/data/netflix-limits,
    /// produced by its Gradient2Limit and AIMDLimit classes), one row per window:
    /// (rtt us, saturated or app-limited, drop, limit with min 20, limit with min 4).
    fn reference(csv: &str) -> Vec<(u64, bool, bool, u32, u32)> {
        csv.lines()
            .skip(1)
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                (f[1].parse().unwrap(), f[2] == "L", f[3] == "1", f[4].parse().unwrap(), f[5].parse().unwrap())
            })
            .collect()
    }

    const SCENARIOS: [(&str, Algo, &str); 9] = [
        ("a_steady", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/a_steady_gradient2.csv")),
        ("b_step", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/b_step_gradient2.csv")),
        ("c_drops", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/c_drops_gradient2.csv")),
        (
            "d_applimited",
            Algo::Gradient2,
            include_str!("../../../tests/data/netflix-limits/d_applimited_gradient2.csv"),
        ),
        ("e_longstep", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/e_longstep_gradient2.csv")),
        ("a_steady", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/a_steady_aimd.csv")),
        ("b_step", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/b_step_aimd.csv")),
        ("c_drops", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/c_drops_aimd.csv")),
        ("d_applimited", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/d_applimited_aimd.csv")),
    ];

    /// shed's limiter as the reference runs: its guards off (one sample is
    /// enough, no cooldown, no probe) and every named departure off.
    fn as_reference(algo: Algo, min_limit: u32) -> Settings {
        Settings {
            algo,
            initial_limit: 20,
            min_limit,
            max_limit: 200,
            min_samples: 1,
            cooldown_windows: 0,
            probe_windows: 0,
            // AIMDLimit cuts on drops and on a 5 s timeout only, never on latency.
            aimd_tolerance: f64::INFINITY,
            listen_drops_cut: algo == Algo::Aimd,
            cut_while_app_limited: false,
            gradient2_long_at_most_baseline: false,
            ..Settings::default()
        }
    }

    /// Replays a reference input window by window; returns the limit after each
    /// window as the reference publishes it (truncated) and the reference's own.
    fn replay(settings: Settings, rows: &[(u64, bool, bool, u32, u32)]) -> Vec<(u32, u32)> {
        let mut c = Controller::new(settings, 0);
        let mut published = settings.initial_limit;
        rows.iter()
            .map(|&(rtt_us, saturated, drop, min20, min4)| {
                // In-flight as the reference was fed it: its published limit, or just under half of it.
                let in_flight = if saturated { published } else { published.div_ceil(2) - 1 };
                c.on_window(&WindowSample {
                    in_flight: u64::from(in_flight),
                    samples: 100,
                    latency_us: rtt_us,
                    queue_wait_us: 0,
                    service_us: 0,
                    listen_drops: u64::from(drop),
                    rejected: 0,
                    windows: 1,
                    elapsed_us: 0,
                });
                published = if settings.min_limit == 20 { min20 } else { min4 };
                (c.limit.trunc() as u32, published)
            })
            .collect()
    }

    #[test]
    fn gradient2_and_aimd_match_netflix_concurrency_limits_with_the_departures_off() {
        for (name, algo, csv) in SCENARIOS {
            let rows = reference(csv);
            for min_limit in [20, 4] {
                for (window, (ours, theirs)) in replay(as_reference(algo, min_limit), &rows).into_iter().enumerate() {
                    assert_eq!(ours, theirs, "{name} {algo} min {min_limit}: window {}", window + 1);
                }
            }
        }
    }

    #[test]
    fn each_named_departure_from_the_reference_shows_where_it_should() {
        let departs = |algo: Algo, scenario: &str, change: fn(&mut Settings)| -> usize {
            let (_, _, csv) = SCENARIOS.iter().find(|(n, a, _)| *n == scenario && *a == algo).unwrap();
            let mut settings = as_reference(algo, 4);
            change(&mut settings);
            replay(settings, &reference(csv)).iter().filter(|(ours, theirs)| ours != theirs).count()
        };
        // gradient2 cutting on listen drops: only the scenario with drops departs.
        let drops: fn(&mut Settings) = |s| s.listen_drops_cut = true;
        assert!(departs(Algo::Gradient2, "c_drops", drops) > 0);
        assert_eq!(departs(Algo::Gradient2, "b_step", drops), 0);
        // Cutting while app-limited: the app-limited step departs, the saturated one does not.
        let app: fn(&mut Settings) = |s| s.cut_while_app_limited = true;
        assert!(departs(Algo::Gradient2, "d_applimited", app) > 0);
        assert_eq!(departs(Algo::Gradient2, "b_step", app), 0);
        // The long average held at the baseline: a long slow spell is never learned as normal.
        let held: fn(&mut Settings) = |s| s.gradient2_long_at_most_baseline = true;
        assert!(departs(Algo::Gradient2, "e_longstep", held) > 0);
        assert_eq!(departs(Algo::Gradient2, "a_steady", held), 0);
        // shed's aimd cuts on latency (2x the baseline), the reference only on drops and timeouts.
        let latency: fn(&mut Settings) = |s| s.aimd_tolerance = 2.0;
        assert!(departs(Algo::Aimd, "b_step", latency) > 0);
        assert_eq!(departs(Algo::Aimd, "c_drops", latency), 0);
    }

    #[test]
    fn a_probe_ends_on_thin_windows_and_keeps_a_cut_that_lands_in_it() {
        let settings = Settings { algo: Algo::Gradient, initial_limit: 100, probe_windows: 3, ..Settings::default() };
        let mut c = Controller::new(settings, 0);
        // Run up to the first probe.
        let mut d = c.on_window(&window(10_000, 100));
        while d.reason != Reason::Probe {
            d = c.on_window(&window(10_000, 100));
        }
        let before = c.before_probe;
        assert_eq!(d.limit, (before * PROBE_DEPTH).round() as u32);
        // Thin windows (sparse traffic) still count toward the probe, and a
        // listen-queue overflow during it cuts the limit the probe returns to.
        let thin = WindowSample { samples: 0, ..window(10_000, 10) };
        assert_eq!(c.on_window(&WindowSample { listen_drops: 3, ..thin }).reason, Reason::Probe);
        assert_eq!(c.on_window(&thin).reason, Reason::Probe);
        let end = c.on_window(&thin);
        assert_eq!(end.reason, Reason::Probe);
        assert_eq!(
            end.limit,
            (before * settings.backoff).round() as u32,
            "the probe ended after 3 windows, the cut kept"
        );
        assert_ne!(c.on_window(&thin).reason, Reason::Probe, "and is over");
    }
}
