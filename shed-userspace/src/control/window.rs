//! One control window's figures, built in one place from two snapshots of a
//! port's latency histograms (the window is their difference).

use shed_common::latency;

/// The `p`th percentile (0-100) of a latency histogram, microseconds: the
/// midpoint of the bucket holding that rank (0 when the histogram is empty).
pub fn histogram_percentile(buckets: &[u64], p: f64) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
