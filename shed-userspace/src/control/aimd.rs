// SPDX-License-Identifier: MIT OR Apache-2.0
//! `aimd`: +1 per healthy window; the backoff factor when latency breaches
//! `tolerance * baseline` (the cut itself keeps a whole limit, as AIMDLimit's
//! `(int) (limit * backoff)` does: see `Controller::cut`).
use super::Controller;

impl Controller {
    pub(super) fn propose_aimd(&self, observed: f64) -> f64 {
        if observed > self.settings.aimd_tolerance * self.baseline_us {
            self.limit * self.settings.backoff
        } else {
            self.limit + 1.0
        }
    }
}
