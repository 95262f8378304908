// SPDX-License-Identifier: MIT OR Apache-2.0
//! One control window's figures, built in one place from two snapshots of a
//! port's latency histograms (the window is their difference).

use shed_common::{PortLatency, latency};

use super::WindowSample;

type Histogram = [u64; latency::BUCKETS];

/// A port's latency histograms over one window: the later snapshot minus the earlier.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window {
    /// Arrival in the socket to pick-up by the application.
    pub queue_wait: Histogram,
    /// Pick-up to the first answer byte.
    pub service: Histogram,
    /// Arrival to the first answer byte.
    pub sojourn: Histogram,
}

/// What the window saw besides latency: the listener's and the gate's signals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Signals {
    /// In-flight at the window's end.
    pub in_flight: u64,
    /// Listen-queue drops counted against the port in the window.
    pub listen_drops: u64,
    /// SYNs the limit turned away in the window (or would have, in dry-run).
    pub rejected: u64,
    /// The time the window spans, microseconds, as measured.
    pub elapsed_us: u64,
    /// Control windows it spans (quiet windows carried over).
    pub windows: u32,
    /// Requests whose connection closed before their answer, in the window.
    pub abandoned: u64,
    /// Their mean age when they went, microseconds.
    pub abandoned_age_us: u64,
}

impl Window {
    /// The window between two snapshots of the same port's histograms (the
    /// kernel's counters only grow; a wrap reads as a difference all the same).
    pub(crate) fn between(before: &PortLatency, now: &PortLatency) -> Self {
        let delta = |now: &Histogram, before: &Histogram| -> Histogram {
            std::array::from_fn(|i| now[i].wrapping_sub(before[i]))
        };
        Self {
            queue_wait: delta(&now.queue_wait, &before.queue_wait),
            service: delta(&now.service, &before.service),
            sojourn: delta(&now.sojourn, &before.sojourn),
        }
    }

    /// What the controller judges: the `percentile` of sojourn (and of queue
    /// wait), the median service time, and the count of requests judged:
    /// queue waits for the queue limiter (a multiplexed port records nothing
    /// else), whole requests for the others.
    pub(crate) fn sample(&self, signals: Signals, percentile: f64, judge_queue_waits: bool) -> WindowSample {
        let judged = if judge_queue_waits { &self.queue_wait } else { &self.sojourn };
        WindowSample {
            in_flight: signals.in_flight,
            samples: judged.iter().sum(),
            latency_us: histogram_percentile(&self.sojourn, percentile),
            queue_wait_us: histogram_percentile(&self.queue_wait, percentile),
            service_us: histogram_percentile(&self.service, 50.0),
            answered: self.service.iter().sum(),
            service_mean_us: histogram_mean(&self.service),
            listen_drops: signals.listen_drops,
            rejected: signals.rejected,
            elapsed_us: signals.elapsed_us,
            windows: signals.windows,
            abandoned: signals.abandoned,
            abandoned_age_us: signals.abandoned_age_us,
        }
    }
}

/// The `p`th percentile (0-100) of a latency histogram, microseconds: the
/// midpoint of the bucket holding that rank (0 when the histogram is empty).
pub(crate) fn histogram_percentile(buckets: &[u64], p: f64) -> u64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let (lo, hi) = (latency::lower_bound(b), latency::upper_bound(b));
            return lo + (hi.saturating_sub(lo)) / 2;
        }
    }
    latency::lower_bound(buckets.len() - 1)
}

/// The mean of a latency histogram, microseconds, each sample taken at its
/// bucket's midpoint, or the last (open) bucket's lower bound (0 when the
/// histogram is empty).
pub(crate) fn histogram_mean(buckets: &[u64]) -> u64 {
    let (mut total, mut sum) = (0u64, 0u128);
    for (b, &n) in buckets.iter().enumerate() {
        let (lo, hi) = (latency::lower_bound(b), latency::upper_bound(b));
        total += n;
        let mid = if hi == u64::MAX { lo } else { lo + (hi - lo) / 2 };
        sum += u128::from(n) * u128::from(mid);
    }
    if total == 0 { 0 } else { (sum / u128::from(total)) as u64 }
}

/// The `p`th percentile (0-100) of sorted samples, by nearest rank (None when
/// there are none): the one percentile of raw samples, for the simulation and
/// the benchmarks alike.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50.0), Some(50));
        assert_eq!(nearest_rank(&v, 99.0), Some(99));
        assert_eq!(nearest_rank(&v, 100.0), Some(100));
        assert_eq!(nearest_rank(&v, 0.0), Some(1), "rank 0 is the first sample");
        assert_eq!(nearest_rank(&[7u64], 99.0), Some(7));
        assert_eq!(nearest_rank::<u64>(&[], 50.0), None);
    }

    #[test]
    fn histogram_mean_weighs_each_bucket_at_its_midpoint() {
        let mut h = [0u64; latency::BUCKETS];
        assert_eq!(histogram_mean(&h), 0, "no samples");
        let b = latency::bucket(1_000);
        h[b] = 3;
        let mid = latency::lower_bound(b) + (latency::upper_bound(b) - latency::lower_bound(b)) / 2;
        assert_eq!(histogram_mean(&h), mid);
        let c = latency::bucket(100_000);
        h[c] = 1;
        let mid_c = latency::lower_bound(c) + (latency::upper_bound(c) - latency::lower_bound(c)) / 2;
        assert_eq!(histogram_mean(&h), (3 * mid + mid_c) / 4);
        let mut open = [0u64; latency::BUCKETS];
        open[latency::BUCKETS - 1] = 2;
        assert_eq!(histogram_mean(&open), latency::lower_bound(latency::BUCKETS - 1), "the open bucket at its floor");
    }

    #[test]
    fn a_window_is_the_difference_of_two_snapshots() {
        let mut before = PortLatency::default();
        let mut now = PortLatency::default();
        before.sojourn[latency::bucket(1_000)] = 5;
        now.sojourn[latency::bucket(1_000)] = 7;
        now.sojourn[latency::bucket(40_000)] = 3;
        now.queue_wait[latency::bucket(200)] = 4;
        now.service[latency::bucket(300)] = 6;
        let window = Window::between(&before, &now);
        assert_eq!(window.sojourn.iter().sum::<u64>(), 5, "2 + 3 new requests");
        let signals = Signals {
            in_flight: 9,
            listen_drops: 1,
            rejected: 2,
            elapsed_us: 100_000,
            windows: 1,
            abandoned: 3,
            abandoned_age_us: 1_500_000,
        };
        let whole = window.sample(signals, 99.0, false);
        assert_eq!((whole.samples, whole.in_flight, whole.listen_drops, whole.rejected), (5, 9, 1, 2));
        assert_eq!((whole.abandoned, whole.abandoned_age_us), (3, 1_500_000), "abandoned requests pass through");
        assert_eq!(whole.latency_us, histogram_percentile(&window.sojourn, 99.0));
        assert!(whole.latency_us >= 32_768, "p99 is in the 40 ms bucket: {}", whole.latency_us);
        assert_eq!(window.sample(signals, 99.0, true).samples, 4, "the queue limiter counts queue waits");
        assert_eq!(whole.answered, 6, "each service time is an answered request");
        assert_eq!(whole.service_mean_us, histogram_mean(&window.service));
    }

    #[test]
    fn percentiles_of_histograms() {
        let mut h = [0u64; latency::BUCKETS];
        assert_eq!(histogram_percentile(&h, 99.0), 0);
        h[latency::bucket(1_000)] = 90; // ~1 ms
        h[latency::bucket(50_000)] = 10; // ~50 ms
        let p50 = histogram_percentile(&h, 50.0);
        let p99 = histogram_percentile(&h, 99.0);
        assert!((896..=1_151).contains(&p50), "p50 {p50}");
        assert!((49_152..=57_343).contains(&p99), "p99 {p99}");
        assert_eq!(histogram_percentile(&h, 90.0), p50, "rank 90 of 100 is still in the first bucket");
        // Exactly the midpoint of the bucket that holds the rank.
        let mid = |us: u64| {
            let b = latency::bucket(us);
            latency::lower_bound(b) + (latency::upper_bound(b) - latency::lower_bound(b)) / 2
        };
        assert_eq!(p50, mid(1_000));
        assert_eq!(p99, mid(50_000));
        assert_eq!(histogram_percentile(&h, 100.0), mid(50_000), "the last sample");
        assert_eq!(histogram_percentile(&h, 0.0), mid(1_000), "rank 0 is the first sample");
        assert_eq!(histogram_percentile(&h, 91.0), mid(50_000), "rank 91 of 100 is in the second bucket");
        // Past 100%: the top of the histogram's range.
        assert_eq!(histogram_percentile(&h, 150.0), latency::lower_bound(latency::BUCKETS - 1));
    }
}
