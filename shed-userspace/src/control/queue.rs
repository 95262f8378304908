// SPDX-License-Identifier: MIT OR Apache-2.0
//! `queue` (the default): holds the queue wait of admitted requests near a
//! target, wherever they wait: unread in the kernel (a server whose workers
//! read when free), or inside the service (one that reads every request at
//! once: [`super::service`]). Above it, Little's law gives the requests
//! queued too many, and a share of them come off the limit; at or under it
//! the limit grows gently.
use super::{
    Algo, Controller, Decision, Reason, WindowSample,
    guards::{OBJECTIVE_MARGIN, Objective},
    service::{Departures, Held},
};

/// The default target queue wait, 5 ms: CoDel's and Meta's adaptive LIFO
/// target, short against any request a user waits for, and long enough that
/// a busy server's normal jitter (a few ms of scheduling) is not overload.
pub(crate) const QUEUE_TARGET_US: f64 = 5_000.0;

/// The share of the excess queue (Little's law) removed per window.
const QUEUE_GAIN: f64 = 0.25;

/// The target is at least this many median service times.
const QUEUE_TARGET_PER_SERVICE: f64 = 0.75;

/// At most this share of the limit comes off in one window.
const MOST_CUT: f64 = 0.5;

/// Requests the work bound allows over the knee at least: one waiting, so a
/// worker that finishes finds the next request already there.
const BOUND_SLACK: f64 = 1.0;

impl Controller {
    /// What the service held in this window ([`super::service`]).
    pub(super) fn observe_stage(&mut self, s: &WindowSample, windows: usize) -> Option<Held> {
        let seconds = self.seconds(s, windows);
        let departures = Departures {
            answered: s.answered,
            mean_us: s.service_mean_us,
            abandoned: s.abandoned,
            abandoned_age_us: s.abandoned_age_us,
        };
        self.stage.observe_with_abandoned(departures, seconds, windows, s.in_flight, self.settings.min_samples)
    }

    /// The work bound: the most requests the service can hold and still
    /// answer each within the wait it may have (Little's law), once answers
    /// have measured it: `knee + best rate x wait`, where the wait is the
    /// objective's (what `--target-latency` leaves after the shortest
    /// service: then the bound is `rate x objective`) or the queue target
    /// (at least 3/4 of the shortest service), and at least [`BOUND_SLACK`] over the knee.
    /// Without an objective it applies only while the service holds a queue
    /// inside, from the rate it answers at now (every worker busy); with
    /// one, from the best rate measured, queue or not. None: not measured
    /// yet, the service keeps up (no queue inside: its rate may be only what
    /// it was asked), or the port does not count requests.
    pub(crate) fn work_bound(&self) -> Option<f64> {
        let st = self.settings;
        if st.algo != Algo::Queue || !st.counts_work {
            return None;
        }
        let bound = if st.objective_us > 0.0 {
            // The rate the service keeps up while requests queue throughout
            // (the objective's own, [`super::guards::ServedRate`]): a burst's
            // quiet remainder of a second says nothing of what it can do.
            let rate = self.served.rate();
            if rate <= 0.0 {
                return None;
            }
            rate * OBJECTIVE_MARGIN * st.objective_us / 1e6
        } else {
            let (knee, rate, shortest_us) = self.stage.queued_knee()?;
            let wait_us = st.queue_target_us.max(QUEUE_TARGET_PER_SERVICE * shortest_us);
            (knee + rate * wait_us / 1e6).max(knee + BOUND_SLACK)
        };
        Some(bound.clamp(f64::from(st.min_limit), f64::from(st.max_limit)))
    }

    /// A window in which the service holds more than its work bound, with the
    /// limit above it: the limit comes down to the bound at once. In-flight is
    /// what the service holds now, and by Little's law each request admitted
    /// past the bound waits longer than it may; answers tell the same only a
    /// queue's length later, and abandoned requests may never tell.
    pub(super) fn over_work_bound(&mut self, s: &WindowSample, windows: usize) -> Option<Decision> {
        let st = self.settings;
        // Before any answer measured the service, clients giving up in numbers
        // with nothing answered is loss: half the limit comes off (as a
        // congestion window's on a drop), so the service can drain and answer.
        if st.algo == Algo::Queue
            && st.counts_work
            && !self.stage.measured()
            && s.answered == 0
            && s.abandoned >= st.min_samples
            && (s.in_flight as f64) >= self.limit * MOST_CUT
        {
            self.observe_stage(s, windows);
            return Some(self.cut(self.limit * MOST_CUT, Reason::Abandoned));
        }
        let bound = self.work_bound()?;
        if (s.in_flight as f64) <= bound || self.limit <= bound {
            return None;
        }
        // The window is judged here: its answers join the service stage first.
        self.observe_stage(s, windows);
        self.inside_cut = true;
        Some(self.cut(bound, Reason::WorkBound))
    }

    pub(super) fn propose_queue(
        &mut self,
        s: &WindowSample,
        windows: usize,
        objective: Option<Objective>,
        held: Option<Held>,
    ) -> f64 {
        let st = self.settings;
        let seconds = self.seconds(s, windows);
        let objective_wait = objective.map_or(0.0, |o| o.wait_us);
        // In the kernel. Keeping every worker fed takes about one request
        // waiting per worker, which waits up to a service time: never aim
        // below 3/4 of the median service time.
        let target = st.queue_target_us.max(QUEUE_TARGET_PER_SERVICE * s.service_us as f64).max(objective_wait);
        // Little's law: the requests queued beyond the target are the excess
        // wait times the rate requests are served.
        let in_kernel = (s.queue_wait_us as f64 - target) / 1e6 * (s.samples as f64 / seconds);
        // Inside the service: what it holds beyond its knee, less what may wait
        // there. The target follows the service's shortest time, not the
        // window's (which the queue inside lengthens).
        let inside = held.map_or(f64::NEG_INFINITY, |held| {
            let target = st.queue_target_us.max(QUEUE_TARGET_PER_SERVICE * held.shortest_us).max(objective_wait);
            held.waiting() - target / 1e6 * held.rate
        });
        let excess = in_kernel.max(inside);
        self.inside_cut = inside > in_kernel;
        if excess > 0.0 {
            // Remove a share of the excess (at most half the limit in one window).
            (self.limit - QUEUE_GAIN * excess).max(self.limit * MOST_CUT)
        } else {
            // No queue beyond the target: grow gently (the app-limited guard
            // keeps it from growing when in-flight does not press the limit).
            self.limit + (self.limit.sqrt() / 2.0).max(1.0)
        }
    }

    /// A window of the service stage's drain probe ([`super::service`]): the
    /// limit held at half the knee until the service has drained, then back.
    /// A listen-queue overflow meanwhile cuts the limit it returns to.
    pub(super) fn during_drain_probe(&mut self, s: &WindowSample, windows: usize, overflow: bool) -> Decision {
        let st = self.settings;
        self.observe_stage(s, windows);
        let (limit, ended) = self.stage.during_probe(windows);
        let limit = if ended && overflow { limit * st.backoff } else { limit };
        self.limit = limit.clamp(f64::from(st.min_limit), f64::from(st.max_limit));
        if ended {
            self.windows_since_cut = 0;
        }
        Decision { limit: self.limit(), reason: Reason::Probe }
    }
}
