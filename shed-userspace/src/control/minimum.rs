// SPDX-License-Identifier: MIT OR Apache-2.0
//! A minimum over a moving span of control windows: the baseline's, and the
//! service stage's best rate and shortest service.
use std::collections::VecDeque;

/// Minimum over a moving span of control windows.
#[derive(Clone, Debug)]
pub(crate) struct WindowedMin {
    pub(crate) span: usize,
    /// (value, windows it covered)
    pub(crate) values: VecDeque<(f64, usize)>,
    pub(crate) covered: usize,
}

impl WindowedMin {
    pub(crate) fn push(&mut self, v: f64, windows: usize) -> f64 {
        self.values.push_back((v, windows));
        self.covered += windows;
        while self.covered > self.span && self.values.len() > 1 {
            let (_, w) = self.values.pop_front().expect("len > 1");
            self.covered -= w;
        }
        self.min()
    }

    /// Forgets every value.
    pub(crate) fn reset(&mut self) {
        self.values.clear();
        self.covered = 0;
    }

    /// The minimum now (infinite while empty).
    pub(crate) fn min(&self) -> f64 {
        self.values.iter().map(|&(v, _)| v).fold(f64::INFINITY, f64::min)
    }
}
