// SPDX-License-Identifier: MIT OR Apache-2.0
//! Log-linear latency buckets: four buckets per power of two of microseconds,
//! so any value is within 25% of its bucket's bounds, from 1 us to 71 minutes
//! in 128 buckets. Branchy integer code only: it runs in the kernel.

/// Buckets per histogram.
pub const BUCKETS: usize = 128;

/// Bucket of a latency in microseconds.
#[inline(always)]
pub fn bucket(us: u64) -> usize {
    let v = if us > u64::from(u32::MAX) { u32::MAX } else { us as u32 };
    if v < 4 {
        return v as usize;
    }
    // floor(log2(v)) by binary search: the BPF target has no count-leading-zeros.
    let mut e = 0u32;
    let mut x = v;
    if x >= 1 << 16 {
        x >>= 16;
        e += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        e += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        e += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        e += 2;
    }
    if x >= 1 << 1 {
        e += 1;
    }
    let mantissa = (v >> (e - 2)) & 3;
    ((4 * (e - 1) + mantissa) as usize) & (BUCKETS - 1)
}

/// Smallest value in bucket `b`.
pub const fn lower_bound(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let e = (b / 4 + 1) as u32;
    let m = (b % 4) as u64;
    (4 + m) << (e - 2)
}

/// Largest value in bucket `b`.
pub const fn upper_bound(b: usize) -> u64 {
    if b + 1 >= BUCKETS { u64::MAX } else { lower_bound(b + 1) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        assert_eq!(
            [bucket(0), bucket(3), bucket(4), bucket(7), bucket(8), bucket(15), bucket(16)],
            [0, 3, 4, 7, 8, 11, 12]
        );
        assert_eq!(bucket(u64::from(u32::MAX)), 123);
        assert_eq!(bucket(u64::MAX), 123);
        // Past u32 (71 minutes) everything is the last bucket used, not a wrapped value.
        assert_eq!(bucket((1 << 32) + 5), 123);
    }

    #[test]
    fn the_last_bucket_has_no_upper_bound() {
        assert_eq!(upper_bound(BUCKETS - 1), u64::MAX);
        assert_eq!(upper_bound(BUCKETS - 2), lower_bound(BUCKETS - 1) - 1);
        assert_eq!([upper_bound(0), upper_bound(3), upper_bound(4), upper_bound(7)], [0, 3, 4, 7]);
    }

    proptest! {
        #[test]
        fn value_lies_within_its_bucket(us in 0u64..=u64::from(u32::MAX)) {
            let b = bucket(us);
            prop_assert!(lower_bound(b) <= us && us <= upper_bound(b), "{} in bucket {} [{}, {}]", us, b, lower_bound(b), upper_bound(b));
        }

        #[test]
        fn buckets_are_monotonic(a in 0u64..=u64::from(u32::MAX), b in 0u64..=u64::from(u32::MAX)) {
            prop_assert!(a > b || bucket(a) <= bucket(b));
        }
    }
}
