//! What `shedctl stats` reports, computed from map snapshots. The JSON form
//! (serde on these structs) is a stable interface for scripts.
use std::time::Duration;

use serde::Serialize;
use shed_common::counter;

use crate::{input::Action, maps::PortSnapshot};

/// Rejections by reason (each also counted in `rejected`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RejectedByReason {
    /// In-flight had reached the limit.
    pub limit: u64,
}

/// One protected port.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortStats {
    pub port: u16,
    pub limit: u32,
    /// Established connections plus pending handshakes.
    pub in_flight: u64,
    pub established: u64,
    pub pending: u64,
    /// SYNs admitted with a fresh reservation (cumulative).
    pub admitted: u64,
    /// SYNs rejected, all reasons (cumulative).
    pub rejected: u64,
    pub rejected_by_reason: RejectedByReason,
    pub action: Action,
    pub dry_run: bool,
    /// Dry-run only: SYNs enforce mode would have rejected (they were admitted).
    pub would_reject: u64,
    pub syn_seen: u64,
    pub syn_retransmits: u64,
    pub rst_sent: u64,
    pub rst_failed: u64,
    /// SYNs passed without a reservation because the pending map was full.
    pub reserve_failed: u64,
    /// Reservations whose handshake never completed in time.
    pub pending_expired: u64,
    /// Rates over the sampling interval; null when only one sample was taken.
    pub syn_per_sec: Option<f64>,
    pub admitted_per_sec: Option<f64>,
    pub rejected_per_sec: Option<f64>,
}

impl PortStats {
    /// Stats of `now`, with rates against `before` taken `elapsed` earlier.
    pub fn new(now: &PortSnapshot, before: Option<(&PortSnapshot, Duration)>) -> Self {
        let rate = |index: usize| {
            before.and_then(|(b, elapsed)| {
                let secs = elapsed.as_secs_f64();
                (secs > 0.0 && b.config.slot == now.config.slot)
                    .then(|| now.counter(index).saturating_sub(b.counter(index)) as f64 / secs)
            })
        };
        Self {
            port: now.port,
            limit: now.config.limit,
            in_flight: now.in_flight(),
            established: now.established(),
            pending: now.pending(),
            admitted: now.counter(counter::ADMITTED),
            rejected: now.counter(counter::REJECTED_LIMIT),
            rejected_by_reason: RejectedByReason { limit: now.counter(counter::REJECTED_LIMIT) },
            action: Action::from_raw(now.config.action),
            dry_run: now.config.dry_run != 0,
            would_reject: now.counter(counter::DRY_RUN_WOULD_REJECT),
            syn_seen: now.counter(counter::SYN_SEEN),
            syn_retransmits: now.counter(counter::SYN_RETRANSMIT),
            rst_sent: now.counter(counter::RST_SENT),
            rst_failed: now.counter(counter::RST_FAILED),
            reserve_failed: now.counter(counter::RESERVE_FAILED),
            pending_expired: now.user.pending_expired,
            syn_per_sec: rate(counter::SYN_SEEN),
            admitted_per_sec: rate(counter::ADMITTED),
            rejected_per_sec: rate(counter::REJECTED_LIMIT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shed_common::{PortConfig, PortCounters, PortState, UserPortState, action};

    fn snapshot(admitted: u64, rejected: u64) -> PortSnapshot {
        let mut counters = PortCounters::default();
        counters.values[counter::ADMITTED] = admitted;
        counters.values[counter::REJECTED_LIMIT] = rejected;
        PortSnapshot {
            port: 8080,
            config: PortConfig { limit: 5, slot: 0, action: action::RST, dry_run: 0, _pad: [0; 6] },
            state: PortState { opened: 7, closed: 2, reserved: 9, released: 6 },
            user: UserPortState { pending_expired: 1 },
            counters,
        }
    }

    #[test]
    fn fields_and_rates() {
        let before = snapshot(5, 10);
        let now = snapshot(9, 30);
        let stats = PortStats::new(&now, Some((&before, Duration::from_secs(2))));
        assert_eq!((stats.established, stats.pending, stats.in_flight), (5, 2, 7));
        assert_eq!((stats.admitted, stats.rejected, stats.rejected_by_reason.limit), (9, 30, 30));
        assert_eq!(stats.admitted_per_sec, Some(2.0));
        assert_eq!(stats.rejected_per_sec, Some(10.0));
        assert_eq!(stats.action, Action::Rst);
        assert_eq!(PortStats::new(&now, None).rejected_per_sec, None);
    }

    #[test]
    fn json_has_the_stable_fields() {
        let json = serde_json::to_value(PortStats::new(&snapshot(1, 2), None)).unwrap();
        for field in ["port", "limit", "in_flight", "admitted", "rejected"] {
            assert!(json[field].is_u64(), "{field} must be an integer in {json}");
        }
        assert_eq!(json["action"], "rst");
    }
}
