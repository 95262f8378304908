// SPDX-License-Identifier: MIT OR Apache-2.0
//! How the kernel's counters make a port's in-flight: one definition for the
//! gate, the daemon and the tests.
use crate::{PortState, UserPortState, count_mode};

/// In-flight of a port: handshakes under way (`handshakes`, from the ring)
/// plus busy connections ([`count_mode::WORK`], with `silent`: those accepted
/// within the grace that have sent nothing yet, from the silent ring) or
/// established ones ([`count_mode::CONNECTIONS`]). The counters are read without a lock, so a
/// momentarily inconsistent read is clamped at zero rather than wrapping.
#[inline(always)]
pub const fn in_flight(state: &PortState, handshakes: u64, silent: u64, user: &UserPortState, mode: u8) -> u64 {
    held(state, user, mode, silent) + handshakes
}

/// Connections the port holds: busy (and silent within the grace) or
/// established, by `mode`.
#[inline(always)]
pub const fn held(state: &PortState, user: &UserPortState, mode: u8, silent: u64) -> u64 {
    if mode == count_mode::WORK { busy(state, user) + silent } else { established(state, user) }
}

/// `a - b + adjust`, clamped at zero.
#[inline(always)]
const fn adjusted(a: u64, b: u64, adjust: i64) -> u64 {
    let v = a.wrapping_sub(b) as i64;
    let v = v.saturating_add(adjust);
    if v < 0 || a < b && adjust <= 0 { 0 } else { v as u64 }
}

#[inline(always)]
pub const fn busy(state: &PortState, user: &UserPortState) -> u64 {
    adjusted(state.busy_enter, state.busy_exit, user.busy_adjust)
}

#[inline(always)]
pub const fn established(state: &PortState, user: &UserPortState) -> u64 {
    adjusted(state.opened, state.closed, user.established_adjust)
}

#[cfg(test)]
mod tests {
    use super::adjusted;

    #[test]
    fn a_count_is_what_opened_less_what_closed_plus_the_adjustment_never_below_zero() {
        for (opened, closed, adjust, held) in [
            (5, 3, 0, 2),
            (5, 3, 2, 4),
            (5, 3, -2, 0),
            (5, 3, -3, 0),
            (5, 5, 0, 0),
            (5, 5, -1, 0),
            (5, 5, 1, 1),
            // More closed than opened (a close counted before its open): zero, unless the healer adds.
            (3, 5, 0, 0),
            (3, 5, -1, 0),
            (3, 5, 2, 0),
            (3, 5, 3, 1),
            // A difference past i64's range reads negative however it wraps: still zero.
            (0, u64::MAX / 2 + 2, 0, 0),
            (0, u64::MAX / 2 + 2, -1, 0),
        ] {
            assert_eq!(adjusted(opened, closed, adjust), held, "{opened} - {closed} + {adjust}");
        }
    }
}
