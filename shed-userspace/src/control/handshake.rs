// SPDX-License-Identifier: MIT OR Apache-2.0
//! A port's reservation window (how long an admitted handshake-completing ACK
//! holds its slot before the kernel reports the connection established): the
//! epoch shift to write, and how long admission to establishment took.
//!
//! The window no longer follows the path's round-trip time: the slot is taken
//! at the ACK, after the client proved its address, and the kernel establishes
//! the connection in the same softirq, so a window of a few milliseconds
//! covers every completion however far away the client is.
use std::time::{Duration, Instant};

use shed_common::{handshake, latency};

use super::window::histogram_percentile;

/// One measuring period of admission-to-established times.
const HANDSHAKE_PERIOD: Duration = Duration::from_secs(1);

/// The epoch shift of a window of `fixed` (`--handshake-window`; zero: the default).
pub(crate) fn shift_for(fixed: Duration) -> u32 {
    if fixed.is_zero() { handshake::DEFAULT_SHIFT } else { handshake::shift_for_window(fixed.as_nanos() as u64) }
}

/// The window's policy for one port.
#[derive(Clone, Debug)]
pub(crate) struct HandshakeWindow {
    /// The epoch shift that gives the window (`--handshake-window`, or the default).
    shift: u32,
    written: bool,
    /// Handshake histogram at the start of the current measuring period.
    period_start: Option<(Instant, [u64; latency::BUCKETS])>,
    /// p50/p99 of the last full period, microseconds.
    times: (u64, u64),
}

/// What a control window asks of the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HandshakeStep {
    /// The epoch shift to write to the port, if the map does not hold it yet.
    pub write_shift: Option<u32>,
    /// Admission-to-established p50/p99 (us) of the last full period.
    pub times: (u64, u64),
}

impl HandshakeWindow {
    /// `fixed`: `--handshake-window`, or zero for the default.
    pub(crate) fn new(fixed: Duration) -> Self {
        Self { shift: shift_for(fixed), written: false, period_start: None, times: (0, 0) }
    }

    /// One control window: `current_shift` is what the port's map holds,
    /// `hist` the port's cumulative admission-to-established histogram.
    pub(crate) fn on_window(
        &mut self,
        current_shift: u32,
        hist: &[u64; latency::BUCKETS],
        now: Instant,
    ) -> HandshakeStep {
        let write_shift = (!self.written || current_shift != self.shift).then_some(self.shift);
        self.written = true;
        let (start, before) = *self.period_start.get_or_insert((now, *hist));
        if now.duration_since(start) >= HANDSHAKE_PERIOD {
            let period: [u64; latency::BUCKETS] = std::array::from_fn(|i| hist[i].wrapping_sub(before[i]));
            self.period_start = Some((now, *hist));
            if period.iter().sum::<u64>() > 0 {
                self.times = (histogram_percentile(&period, 50.0), histogram_percentile(&period, 99.0));
            }
        }
        HandshakeStep { write_shift, times: self.times }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_is_written_once_and_again_only_when_the_map_lost_it() {
        let mut w = HandshakeWindow::new(Duration::ZERO);
        let (hist, now) = ([0; latency::BUCKETS], Instant::now());
        let default = handshake::DEFAULT_SHIFT;
        assert_eq!(w.on_window(default, &hist, now).write_shift, Some(default), "written at the first window");
        assert_eq!(w.on_window(default, &hist, now).write_shift, None);
        assert_eq!(w.on_window(0, &hist, now).write_shift, Some(default), "the map lost it (a re-created slot)");
        let fixed = HandshakeWindow::new(Duration::from_millis(30)).shift;
        assert_eq!(fixed, handshake::shift_for_window(30_000_000));
        assert_ne!(fixed, default);
    }

    #[test]
    fn times_are_the_last_full_periods_percentiles() {
        let mut w = HandshakeWindow::new(Duration::ZERO);
        let start = Instant::now();
        let mut hist = [0u64; latency::BUCKETS];
        assert_eq!(w.on_window(0, &hist, start).times, (0, 0));
        hist[3] += 90;
        hist[9] += 10;
        assert_eq!(w.on_window(0, &hist, start + Duration::from_millis(500)).times, (0, 0), "the period is not over");
        let first = w.on_window(0, &hist, start + HANDSHAKE_PERIOD).times;
        let whole = [0, 0, 0, 90, 0, 0, 0, 0, 0, 10];
        let mut expected = [0u64; latency::BUCKETS];
        expected[..whole.len()].copy_from_slice(&whole);
        assert_eq!(first, (histogram_percentile(&expected, 50.0), histogram_percentile(&expected, 99.0)));
        assert!(first.0 < first.1, "{first:?}");
        // A quiet period keeps the last times; a later one counts only its own handshakes.
        assert_eq!(w.on_window(0, &hist, start + 2 * HANDSHAKE_PERIOD).times, first);
        hist[9] += 100;
        let later = w.on_window(0, &hist, start + 3 * HANDSHAKE_PERIOD).times;
        assert_eq!(later.0, later.1, "only bucket 9 in the last period: {later:?}");
    }
}
