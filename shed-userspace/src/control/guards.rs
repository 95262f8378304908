// SPDX-License-Identifier: MIT OR Apache-2.0
//! What every adaptive limiter shares: the baseline (a windowed minimum of
//! the smoothed latency), the baseline probe, the operator's objective (and
//! the served rate it is planned from), and the guards that settle a
//! proposal (bounds, app-limited, cooldown).
use std::collections::VecDeque;

use super::{Algo, Controller, Decision, Reason, WindowSample, service::Held};

/// During a baseline probe the limit is held at this fraction of its value.
pub(super) const PROBE_DEPTH: f64 = 0.25;

/// Weight of each window's latency in the smoothed latency the controllers follow.
const LATENCY_SMOOTHING: f64 = 0.3;

/// The share of the operator's objective the controllers plan to use: the rest
/// covers the handshake, scheduling and the estimate's error.
pub(super) const OBJECTIVE_MARGIN: f64 = 0.97;

/// Below or above the limit by less than this is no change (it only absorbs rounding).
const NO_CHANGE: f64 = 1e-9;

/// The rate the service answers at while every worker is busy: the median of
/// the answer rates of the recent windows in which requests queued throughout
/// (a median, because a window in which a burst began or drained understates
/// the rate and one short window's noise overstates it).
#[derive(Clone, Debug)]
pub(super) struct ServedRate {
    /// Windows kept.
    pub(super) span: usize,
    pub(super) rates: VecDeque<f64>,
}

impl ServedRate {
    pub(super) fn push(&mut self, rate: f64) {
        self.rates.push_back(rate);
        if self.rates.len() > self.span {
            self.rates.pop_front();
        }
    }

    /// 0 until a queued window is seen.
    pub(super) fn rate(&self) -> f64 {
        let mut sorted: Vec<f64> = self.rates.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    }
}

/// What the operator's objective allows in one window.
#[derive(Clone, Copy, Debug)]
pub(super) struct Objective {
    /// The queue wait a request may have and still be answered in time, us.
    pub(super) wait_us: f64,
    /// The limit the service drains within that wait.
    pub(super) limit: f64,
    /// Whether the window's requests met the objective.
    pub(super) met: bool,
}

impl Controller {
    /// A window of a baseline probe (as BBR's ProbeRTT): every ~0.9 baseline
    /// span the limit is held at a quarter for a few windows so queues drain
    /// and the minimum is re-measured without them. This is what keeps the
    /// baseline from learning a standing queue as normal and ratcheting up
    /// with it. A probe lasts its windows whatever they carry (thin windows
    /// must not stretch it: it would never end on sparse traffic), and a cut
    /// that lands during it applies to the limit it returns to.
    pub(super) fn during_probe(&mut self, s: &WindowSample, windows: usize, overflow: bool) -> Decision {
        let st = self.settings;
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
        Decision { limit: self.limit(), reason: Reason::Probe }
    }

    /// Starts a probe when one is due. queue needs no baseline, so no probe;
    /// with an objective, the objective bounds latency, not a learned baseline
    /// (and a probe would shed a whole burst of synchronized clients that the
    /// service could have served in time).
    pub(super) fn start_probe(&mut self, windows: usize) -> Option<Decision> {
        let st = self.settings;
        self.until_probe = self.until_probe.saturating_sub(windows);
        let probes = st.probe_windows > 0 && st.algo != Algo::Queue && st.objective_us <= 0.0;
        if self.until_probe != 0 || !probes {
            return None;
        }
        self.until_probe = self.probe_interval;
        self.probe_left = st.probe_windows;
        self.before_probe = self.limit;
        self.latency_before_probe = self.smoothed_us;
        self.probe_last_us = f64::INFINITY;
        self.limit = (self.limit * PROBE_DEPTH).max(f64::from(st.min_limit));
        Some(Decision { limit: self.limit(), reason: Reason::Probe })
    }

    /// Follows the window's latency: the smoothed value and the baseline (its
    /// windowed minimum); returns the window's own latency, microseconds.
    pub(super) fn observe(&mut self, s: &WindowSample) -> f64 {
        let raw = (s.latency_us as f64).max(1.0);
        self.smoothed_us =
            if self.smoothed_us == 0.0 { raw } else { self.smoothed_us + LATENCY_SMOOTHING * (raw - self.smoothed_us) };
        self.baseline_us = self.baseline.push(self.smoothed_us, s.windows.max(1) as usize);
        raw
    }

    /// What the operator's objective allows this window (None: no objective).
    ///
    /// A request may wait what the objective (less a margin) leaves after its
    /// own service. The service answers at most the rate it kept up while it had
    /// a queue (a windowed maximum), so by Little's law it drains `rate x wait`
    /// requests within that wait: a limit that high is admitted in time, even
    /// when they all arrive at once.
    ///
    /// `held` (queue): what the service itself held. A server that reads every
    /// request at once keeps its queue inside, where the kernel sees no wait:
    /// its service time is then its shortest one, the wait its queue inside
    /// (Little's law), and the rate it answers while it held a queue there is
    /// the rate it keeps up.
    pub(super) fn objective(&mut self, s: &WindowSample, windows: usize, held: Option<Held>) -> Option<Objective> {
        let st = self.settings;
        if st.objective_us <= 0.0 {
            return None;
        }
        // The service's own time is its shortest once measured, in a thin window
        // too: the window's service of a server that reads at once includes
        // its queue inside (the last of a burst's answers waited half a second,
        // which halved the limit for the next burst).
        let shortest = held.map(|h| h.shortest_us).or_else(|| match st.algo {
            Algo::Queue => self.stage.shortest_us(),
            _ => None,
        });
        let service = shortest.map_or(s.service_us as f64, |shortest| shortest.min(s.service_us as f64));
        let wait_us = (OBJECTIVE_MARGIN * st.objective_us - service).max(0.0);
        let inside_wait = held.map_or(0.0, |h| h.wait_us());
        // Requests waited for a worker, and work was under way when the window
        // began and when it ended: every worker was likely busy throughout, so
        // this is the rate the service keeps up. Not a carried sample: it spans
        // quiet windows.
        let waited = |wait: f64| wait >= (service / 2.0).max(1000.0);
        let busy = windows == 1 && self.last_in_flight > 0 && s.in_flight > 0;
        if busy && waited(s.queue_wait_us as f64) {
            self.served.push(s.samples as f64 / self.seconds(s, windows));
        } else if let Some(h) = held
            && busy
            && waited(inside_wait)
        {
            self.served.push(h.rate);
        }
        self.last_in_flight = s.in_flight;
        let rate = self.served.rate();
        let met = match st.algo {
            Algo::Queue => (s.queue_wait_us as f64).max(inside_wait) <= wait_us,
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

    /// The proposal as the objective allows it. Within the objective, latency
    /// is no reason to cut. Where the limit pressed, it becomes what the service
    /// answers in time: more would miss the objective, less would turn away what
    /// it could serve. While the rate is not known yet (no window had a queue
    /// throughout: small bursts drain within one), it doubles while the
    /// objective is met, as slow start does, until bursts last long enough to
    /// be measured.
    pub(super) fn within_objective(&self, proposed: f64, objective: Option<Objective>, pressed: bool) -> f64 {
        match objective {
            Some(o) if o.met && o.limit > 0.0 => {
                if pressed {
                    o.limit
                } else {
                    self.limit.min(o.limit)
                }
            }
            Some(o) if o.met && pressed => proposed.max(self.limit * 2.0),
            Some(o) if o.met => proposed.max(self.limit),
            _ => proposed,
        }
    }

    /// The limit after the guards: clamped to the bounds; no growth while
    /// app-limited (the limit is not what holds the traffic back, so latency
    /// says nothing about a higher one) nor during the cooldown after a cut.
    pub(super) fn settle(&mut self, proposed: f64, pressed: bool) -> Decision {
        let st = self.settings;
        let proposed = proposed.clamp(f64::from(st.min_limit), f64::from(st.max_limit));
        let app_limited = !pressed;
        if app_limited && !st.cut_while_app_limited {
            self.windows_since_cut = self.windows_since_cut.saturating_add(1);
            return Decision { limit: self.limit(), reason: Reason::AppLimited };
        }
        if proposed < self.limit - NO_CHANGE {
            let reason = if self.inside_cut { Reason::ServiceQueue } else { Reason::LatencyRising };
            return self.cut(proposed, reason);
        }
        self.windows_since_cut = self.windows_since_cut.saturating_add(1);
        if proposed > self.limit + NO_CHANGE {
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

    /// The time a sample spans, seconds.
    pub(super) fn seconds(&self, s: &WindowSample, windows: usize) -> f64 {
        if s.elapsed_us > 0 { s.elapsed_us as f64 / 1e6 } else { windows as f64 * self.settings.window_s }
    }

    pub(super) fn cut(&mut self, to: f64, reason: Reason) -> Decision {
        // aimd keeps a whole limit, as AIMDLimit does (`(int) (limit * backoff)`).
        let to = if self.settings.algo == Algo::Aimd { to.floor() } else { to };
        self.limit = to.clamp(f64::from(self.settings.min_limit), f64::from(self.settings.max_limit));
        self.windows_since_cut = 0;
        Decision { limit: self.limit(), reason }
    }
}
