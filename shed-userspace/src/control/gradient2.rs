// SPDX-License-Identifier: MIT OR Apache-2.0
//! `gradient2`: Netflix concurrency-limits' `Gradient2Limit`. A long-window
//! average of latency against the current window: `gradient = clamp(tolerance
//! * long / short, 0.5, 1.0)`, `new = limit * gradient + queue_size`, smoothed.
use super::Controller;

/// Samples the long average is a plain average of, before it turns exponential.
const WARM_UP_SAMPLES: u32 = 10;

/// The long average decays for the next window while it is more than this many
/// times the short one (a slow spell is over).
const DECAY_ABOVE: f64 = 2.0;

/// How much it decays each such window.
const DECAY: f64 = 0.95;

impl Controller {
    pub(super) fn propose_gradient2(&mut self, observed: f64) -> f64 {
        let st = self.settings;
        // Gradient2Limit's long average: a plain average of the first ten
        // samples, then an exponential one with factor 2 / (window + 1).
        if self.long_count < WARM_UP_SAMPLES {
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
        if long / observed > DECAY_ABOVE {
            self.long_us *= DECAY;
        }
        let gradient = (st.gradient2_tolerance * long / observed).clamp(0.5, 1.0);
        let target = self.limit * gradient + st.gradient2_queue_size;
        (1.0 - st.smoothing) * self.limit + st.smoothing * target
    }
}
