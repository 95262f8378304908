// SPDX-License-Identifier: MIT OR Apache-2.0
//! `queue` (the default): holds the queue wait of admitted requests near a
//! target. Above it, Little's law gives the requests queued too many, and a
//! share of them come off the limit; at or under it the limit grows gently.
use super::{Controller, WindowSample, guards::Objective};

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
    pub(super) fn propose_queue(&self, s: &WindowSample, windows: usize, objective: Option<Objective>) -> f64 {
        let wait = s.queue_wait_us as f64;
        // Keeping every worker fed takes about one request waiting per
        // worker, which waits up to a service time: never aim below 3/4
        // of the median service time.
        let target = self
            .settings
            .queue_target_us
            .max(QUEUE_TARGET_PER_SERVICE * s.service_us as f64)
            .max(objective.map_or(0.0, |o| o.wait_us));
        if wait > target {
            // Little's law: the requests queued beyond the target are the
            // excess wait times the rate requests are served; remove a share
            // of them (at most half the limit in one window).
            let rate = s.samples as f64 / self.seconds(s, windows);
            let excess = (wait - target) / 1e6 * rate;
            (self.limit - QUEUE_GAIN * excess).max(self.limit * MOST_CUT)
        } else {
            // No queue beyond the target: grow gently (the app-limited guard
            // keeps it from growing when in-flight does not press the limit).
            self.limit + (self.limit.sqrt() / 2.0).max(1.0)
        }
    }
}
