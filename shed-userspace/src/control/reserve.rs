// SPDX-License-Identifier: MIT OR Apache-2.0
//! Tier hold-back: how much of the limit lower tiers leave to a higher tier
//! that is being rejected (the kernel applies it from `shed_common::TierReserve`).
use shed_common::tier;

/// Room held back from lower tiers while a higher tier is being rejected.
///
/// A share alone leaves a higher tier only the band between its lower tiers'
/// share and the limit (10% of it for critical over normal by default), too
/// little when the limit is small and lower tiers alone overload the service.
/// Each window in which a tier above was rejected, every lower tier holds back
/// another 10% of the limit (at least one slot); each window without, the hold
/// decays by a fifth. A tier is never held below one slot of its share, and
/// the kernel's trickle still lets it through now and then.
#[derive(Clone, Debug, Default)]
pub(crate) struct TierHoldBack {
    held: [f64; tier::COUNT],
}

impl TierHoldBack {
    /// `rejected`: rejections by tier in the window. Returns the slots held back by tier.
    pub(crate) fn on_window(
        &mut self,
        rejected: [u64; tier::COUNT],
        limit: u32,
        share_permille: [u16; tier::COUNT],
    ) -> [u16; tier::COUNT] {
        let step = (f64::from(limit) * 0.1).max(1.0);
        let mut out = [0u16; tier::COUNT];
        for t in (tier::CRITICAL as usize + 1)..tier::COUNT {
            let above_rejected = (tier::CRITICAL as usize..t).any(|u| rejected[u] > 0);
            self.held[t] = if above_rejected { self.held[t] + step } else { self.held[t] * 0.8 };
            let share = f64::from(limit) * f64::from(share_permille[t]) / 1000.0;
            self.held[t] = self.held[t].clamp(0.0, (share - 1.0).max(0.0));
            out[t] = self.held[t].round() as u16;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_tiers_hold_back_while_a_higher_one_is_rejected() {
        let shares = tier::DEFAULT_SHARE_PERMILLE;
        let mut r = TierHoldBack::default();
        let critical_rejected = [0, 3, 0, 0];
        assert_eq!(r.on_window(critical_rejected, 20, shares), [0, 0, 2, 2]);
        assert_eq!(r.on_window(critical_rejected, 20, shares), [0, 0, 4, 4]);
        // Normal rejected: only low holds back more; normal's hold decays.
        assert_eq!(r.on_window([0, 0, 5, 0], 20, shares), [0, 0, 3, 6]);
        for _ in 0..100 {
            r.on_window(critical_rejected, 20, shares);
        }
        // Never below one slot of the share: normal 18 - 1, low 14 - 1.
        assert_eq!(r.on_window(critical_rejected, 20, shares), [0, 0, 17, 13]);
        for _ in 0..100 {
            r.on_window([0; 4], 20, shares);
        }
        assert_eq!(r.on_window([0; 4], 20, shares), [0; 4], "quiet windows release the hold");
    }
}
