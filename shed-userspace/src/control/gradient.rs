// SPDX-License-Identifier: MIT OR Apache-2.0
//! `gradient`, the seeds' limiter: `gradient = clamp(baseline / observed, 0.5,
//! 1.0)`, `target = limit * gradient + sqrt(limit)`, `new = (1 - smoothing) *
//! limit + smoothing * target`.
use super::Controller;

impl Controller {
    pub(super) fn propose_gradient(&self, observed: f64) -> f64 {
        let gradient = (self.baseline_us / observed).clamp(0.5, 1.0);
        let target = self.limit * gradient + self.limit.sqrt();
        (1.0 - self.settings.smoothing) * self.limit + self.settings.smoothing * target
    }
}
