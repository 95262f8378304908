// SPDX-License-Identifier: MIT OR Apache-2.0
//! RST caps as a GCRA (generic cell rate algorithm): one 64-bit "theoretical
//! arrival time" per bucket, so the kernel can update it with a single
//! compare-and-swap and the cap holds exactly when CPUs race.
//!
//! A bucket of `rate` per second allows a burst of `rate` and then `rate` per
//! second: over any span of `t` seconds at most `rate + rate * t` replies.

const NS_PER_SEC: u64 = 1_000_000_000;

/// The bucket's next value if one more reply is allowed at `now_ns`, else `None`.
/// `tat` 0 is a bucket never used (full).
#[inline(always)]
pub const fn gcra_take(tat: u64, now_ns: u64, rate: u32) -> Option<u64> {
    if rate == 0 {
        return None;
    }
    let interval = NS_PER_SEC / rate as u64;
    // The burst: `rate` replies at once, i.e. up to one second ahead of now.
    let tolerance = NS_PER_SEC - interval;
    let start = if tat > now_ns { tat } else { now_ns };
    if start - now_ns > tolerance {
        return None;
    }
    Some(start + interval)
}

/// Index of a source prefix's bucket in the port's block of the prefix-bucket array.
/// Colliding prefixes share a bucket: they get less, never more, than the cap.
#[inline(always)]
pub fn prefix_bucket_index(slot: u32, prefix: &[u8; 16]) -> u32 {
    let h = crate::handshake::flow_hash(prefix, prefix, slot as u16, 0);
    slot * PREFIX_BUCKETS_PER_PORT + (h & (PREFIX_BUCKETS_PER_PORT - 1))
}

/// Prefix buckets per port (a power of two).
pub const PREFIX_BUCKETS_PER_PORT: u32 = 1024;

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;

    /// Replies allowed over `steps` attempts spaced `gap_ns` apart.
    fn allowed(rate: u32, start: u64, gap_ns: u64, steps: u64) -> u64 {
        let mut tat = 0;
        let mut n = 0;
        for i in 0..steps {
            if let Some(next) = gcra_take(tat, start + i * gap_ns, rate) {
                tat = next;
                n += 1;
            }
        }
        n
    }

    #[test]
    fn one_per_interval_at_the_exact_interval() {
        // Rate 1: no burst beyond the one reply; the next is allowed exactly one second later.
        let first = gcra_take(0, 5_000, 1).expect("a fresh bucket allows one");
        assert_eq!(first, 5_000 + NS_PER_SEC);
        assert_eq!(gcra_take(first, 5_000 + NS_PER_SEC - 1, 1), None, "a nanosecond early");
        assert_eq!(gcra_take(first, 5_000 + NS_PER_SEC, 1), Some(5_000 + 2 * NS_PER_SEC), "on time");
        // Rate 4: a burst of 4 at once, the 5th refused, one more after 250 ms.
        let mut tat = 0;
        for i in 0..4 {
            tat = gcra_take(tat, 1_000, 4).unwrap_or_else(|| panic!("burst #{i}"));
        }
        assert_eq!(gcra_take(tat, 1_000, 4), None);
        assert!(gcra_take(tat, 1_000 + NS_PER_SEC / 4, 4).is_some());
    }

    #[test]
    fn prefix_buckets_stay_in_their_port_block_and_spread() {
        let prefix = |a: u8, b: u8| crate::ipv4_mapped([a, b, 7, 0]);
        for slot in [0u32, 1, 5, 63] {
            let mut seen = std::collections::HashSet::new();
            for a in 0..40u8 {
                for b in 0..50u8 {
                    let i = prefix_bucket_index(slot, &prefix(a, b));
                    assert!(
                        (slot * PREFIX_BUCKETS_PER_PORT..(slot + 1) * PREFIX_BUCKETS_PER_PORT).contains(&i),
                        "slot {slot}: {i}"
                    );
                    seen.insert(i);
                }
            }
            assert!(seen.len() > 800, "2000 prefixes over 1024 buckets of slot {slot}: {}", seen.len());
        }
        let p = prefix(10, 1);
        assert_eq!(prefix_bucket_index(3, &p), prefix_bucket_index(3, &p), "one prefix, one bucket");
        assert_ne!(
            prefix_bucket_index(3, &p) % PREFIX_BUCKETS_PER_PORT,
            prefix_bucket_index(4, &p) % PREFIX_BUCKETS_PER_PORT,
            "ports hash a prefix differently (a collision on one port is not one on all)"
        );
    }

    #[test]
    fn burst_then_rate() {
        assert_eq!(allowed(3, 1_000, 0, 10), 3, "a burst of the rate at once");
        // 10 attempts per ms for 2 s at 5/s: the burst of 5, then 5 per second.
        let n = allowed(5, 7, 100_000, 20_000);
        assert!((14..=15).contains(&n), "{n}");
        assert_eq!(gcra_take(0, 5, 0), None, "rate 0 allows nothing (the caller skips the check)");
        assert_eq!(allowed(2_000_000_000, 0, 0, 100), 100, "rates above 1e9/s do not limit");
    }

    #[test]
    fn never_more_than_the_cap_in_any_second() {
        let rate = 7;
        let mut tat = 0;
        let mut times = Vec::new();
        for i in 0..50_000u64 {
            let now = 1_000_000_000 + i * 97_003;
            if let Some(next) = gcra_take(tat, now, rate) {
                tat = next;
                times.push(now);
            }
        }
        for (i, &t) in times.iter().enumerate() {
            let in_second = times[i..].iter().take_while(|&&u| u < t + 1_000_000_000).count();
            assert!(in_second <= 2 * rate as usize, "{in_second} in one second");
        }
        let tail = times.iter().filter(|&&t| (2_000_000_000..4_000_000_000).contains(&t)).count();
        assert!((13..=15).contains(&tail), "steady state is the rate: {tail} in 2 s");
    }
}
