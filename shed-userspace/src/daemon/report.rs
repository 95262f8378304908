//! What the daemon's loops publish for the metrics endpoint: decisions
//! counted per port and reason, and a heartbeat per loop.
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::control::Reason;

/// Controller decisions per port and reason, counted by the daemon.
#[derive(Clone, Debug, Default)]
pub struct Decisions(Arc<Mutex<BTreeMap<(u16, Reason), u64>>>);

impl Decisions {
    pub fn record(&self, port: u16, reason: Reason) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((port, reason)).or_default() += 1;
    }

    pub fn of(&self, port: u16) -> Vec<(Reason, u64)> {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().filter(|((p, _), _)| *p == port).map(|((_, r), n)| (*r, *n)).collect()
    }
}

/// The control loop's last tick, for `/healthz`.
#[derive(Clone, Debug, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

/// A control loop silent this long is not healthy (it ticks every window, 100 ms by default).
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(5);

impl Heartbeat {
    pub fn beat(&self) {
        self.0.store(unix_ms(), Ordering::Relaxed);
    }

    /// Time since the last beat; None before the first.
    pub fn age(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(unix_ms().saturating_sub(at))),
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_ages() {
        let beat = Heartbeat::default();
        assert_eq!(beat.age(), None);
        beat.beat();
        assert!(beat.age().unwrap() < Duration::from_secs(1));
        beat.0.store(unix_ms() - 6_000, Ordering::Relaxed);
        assert!(beat.age().unwrap() > HEALTHY_WITHIN);
    }
}
