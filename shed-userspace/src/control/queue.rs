// SPDX-License-Identifier: MIT OR Apache-2.0
//! `queue` (the default): holds the queue wait of admitted requests near a
//! target, wherever they wait: unread in the kernel (a server whose workers
//! read when free), or inside the service (one that reads every request at
//! once: [`super::service`]). Above it, Little's law gives the requests
//! queued too many, and a share of them come off the limit; at or under it
//! the limit grows gently.
use super::{Controller, Decision, Reason, WindowSample, guards::Objective, service::Held};

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

impl Controller {
    /// What the service held in this window ([`super::service`]).
    pub(super) fn observe_stage(&mut self, s: &WindowSample, windows: usize) -> Option<Held> {
        let seconds = self.seconds(s, windows);
        self.stage.observe(s.answered, s.service_mean_us, seconds, windows, s.in_flight, self.settings.min_samples)
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
