// SPDX-License-Identifier: MIT OR Apache-2.0
//! The Retry-After an `http` refusal tells clients when the port sets none:
//! how long the service's queue makes a request wait now, rounded up to whole
//! seconds (a client told less would come back into the same queue).

use shed_common::http::MAX_RETRY_AFTER;

/// Seconds to tell a refused client: the window's p99 queue wait rounded up,
/// at least 1 (the header's unit), at most [`MAX_RETRY_AFTER`].
pub(crate) fn retry_after_seconds(queue_wait_p99_us: u64) -> u32 {
    queue_wait_p99_us.div_ceil(1_000_000).clamp(1, u64::from(MAX_RETRY_AFTER)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_queue_wait_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(0), 1, "no queue: come back in a second");
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000_000), 1);
        assert_eq!(retry_after_seconds(1_000_001), 2);
        assert_eq!(retry_after_seconds(7_300_000), 8);
        assert_eq!(retry_after_seconds(u64::MAX), MAX_RETRY_AFTER);
    }

    proptest! {
        #[test]
        fn never_less_than_the_wait_nor_a_second_more(us in 0u64..900_000_000) {
            let s = u64::from(retry_after_seconds(us));
            prop_assert!(s * 1_000_000 >= us);
            prop_assert!(s == 1 || (s - 1) * 1_000_000 < us);
        }
    }
}
