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

#[cfg(test)]
mod tests {
    use super::*;

    fn span(windows: usize) -> WindowedMin {
        WindowedMin { span: windows, values: VecDeque::new(), covered: 0 }
    }

    #[test]
    fn the_minimum_covers_its_span_of_windows_and_forgets_older_ones() {
        let mut m = span(3);
        assert_eq!(m.min(), f64::INFINITY, "empty");
        assert_eq!(m.push(5.0, 1), 5.0);
        assert_eq!(m.push(7.0, 1), 5.0);
        assert_eq!(m.push(6.0, 1), 5.0, "three windows: 5 still covered");
        assert_eq!(m.push(8.0, 1), 6.0, "the fourth pushes the first out");
        // A value covering several windows pushes out as many.
        assert_eq!(m.push(9.0, 2), 8.0);
        assert_eq!(m.covered, 3);
        // The newest value stays whatever its windows.
        assert_eq!(m.push(10.0, 5), 10.0);
        assert_eq!((m.values.len(), m.covered), (1, 5));
    }

    #[test]
    fn a_reset_forgets_every_value() {
        let mut m = span(10);
        m.push(1.0, 1);
        m.push(2.0, 1);
        m.reset();
        assert_eq!((m.min(), m.covered, m.values.len()), (f64::INFINITY, 0, 0));
        assert_eq!(m.push(4.0, 1), 4.0, "a larger value is the minimum once the smaller ones are forgotten");
    }
}
