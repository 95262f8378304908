// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control loop's pace: how often a gate wakes, from what its ports do.
//!
//! A node agent runs one gate per pod, and every wake costs (a window reads
//! about a dozen maps: some 45 us, so a pod at the full pace of 10 windows a
//! second is 0.45% of a core, and 110 such pods half a core). Most pods are
//! idle or nearly so most of the time, and a window with no answers in it
//! has nothing to judge. So a gate keeps its full pace only while it may
//! need to act:
//! - **busy**: a window every tick (`--window`), while anything is refused,
//!   answers come at [`LIGHT_ANSWERS_PER_S`] or more, or more work is held
//!   than the gate has ports;
//! - **light**: a window every [`LIGHT_TICK`], once [`LIGHT_AFTER`] has
//!   passed with none of that (a pod serving a request a second): the first
//!   light tick that sees a refusal, more answers or more work held is back
//!   to busy;
//! - **quiet**: no window at all, a look every [`QUIET_TICK`], once nothing
//!   has happened and no work has been held for [`QUIET_AFTER`] (an idle
//!   pod, kept-alive connections open or not: an idle connection owes
//!   nothing). The first look that sees anything is busy again, or light if
//!   what it saw was light.
//!
//! Meanwhile the kernel judges every segment by the limit in place; the
//! slower paces only delay the next change of the limit, by at most their
//! tick. A window skipped while quiet is spanned by the next.
use std::time::{Duration, Instant};

use crate::kernel::maps::Activity;

/// A gate whose ports see nothing (no segment judged, no socket event) and
/// hold no work for this long looks every [`QUIET_TICK`] instead of every
/// window. A node's idle pods cost a look every two seconds each (a look a
/// second was 3.4% of a core at 110 pods, B10).
pub(crate) const QUIET_AFTER: Duration = Duration::from_secs(2);
pub(crate) const QUIET_TICK: Duration = Duration::from_secs(2);
/// A gate whose ports are light (see the module's doc) for this long judges
/// one window every [`LIGHT_TICK`].
pub(crate) const LIGHT_AFTER: Duration = Duration::from_secs(2);
pub(crate) const LIGHT_TICK: Duration = Duration::from_secs(1);
/// Answers a second (summed over the gate's ports) below which a gate may
/// go light: at the default 100 ms window fewer than one answer a window,
/// where every controller waits for ten (`--min-samples`) before it judges.
pub(crate) const LIGHT_ANSWERS_PER_S: u64 = 10;

/// How a gate's loop runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A window every tick.
    Busy,
    /// A window every [`LIGHT_TICK`].
    Light,
    /// No window; a look every [`QUIET_TICK`].
    Quiet,
}

/// Where the span being judged began: the time, and the ports' answers then.
#[derive(Clone, Copy, Debug)]
struct Span {
    since: Instant,
    answers: u64,
}

/// The loop's pace (see the module's doc).
#[derive(Debug)]
pub(crate) struct Pace {
    /// The gate's own window (`--window`): the busy tick.
    busy: Duration,
    mode: Mode,
    /// What the last look saw.
    last: Option<Activity>,
    /// When the ports' events last changed (or work was last held).
    changed_at: Instant,
    /// The span whose answers the next judgement counts: it starts again
    /// after each judgement, each look while quiet, and any pressure.
    span: Option<Span>,
}

impl Pace {
    pub(crate) fn new(busy: Duration, now: Instant) -> Self {
        Self { busy, mode: Mode::Busy, last: None, changed_at: now, span: None }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the gate is quiet now: its windows wait for the next thing that happens.
    pub(crate) fn quiet(&self) -> bool {
        self.mode == Mode::Quiet
    }

    /// The tick of `mode`: never shorter than the gate's own window.
    fn tick_of(&self, mode: Mode) -> Duration {
        match mode {
            Mode::Busy => self.busy,
            Mode::Light => self.busy.max(LIGHT_TICK),
            Mode::Quiet => self.busy.max(QUIET_TICK),
        }
    }

    /// Takes what the ports do; returns the new tick when the pace changes.
    /// Work held (a request owing an answer) keeps the gate from quiet, as
    /// anything that happens does: a queue inside the server may grow unseen.
    pub(crate) fn observe(&mut self, seen: Activity, now: Instant) -> Option<Duration> {
        let last = self.last.replace(seen);
        if last.is_none_or(|l| l.events != seen.events) || seen.held > 0 {
            self.changed_at = now;
        }
        // Pressure: anything refused since the last look, or more work held than ports.
        let pressed = last.is_some_and(|l| l.refusals != seen.refusals) || seen.held > u64::from(seen.ports);
        let restart = Some(Span { since: now, answers: seen.answers });
        let mode = if now.saturating_duration_since(self.changed_at) >= QUIET_AFTER {
            self.span = restart;
            Mode::Quiet
        } else if pressed {
            self.span = restart;
            Mode::Busy
        } else {
            // A busy gate's looks are too close together to judge a rate: it
            // judges spans of LIGHT_AFTER, each new one starting where the
            // last ended (a load that drops is seen within two spans,
            // whatever came before); a light or quiet one, the time since
            // its last judgement, a tick or more.
            let needs = if self.mode == Mode::Busy { LIGHT_AFTER } else { LIGHT_TICK };
            match self.span {
                Some(span) if now.saturating_duration_since(span.since) >= needs => {
                    self.span = restart;
                    let elapsed_ms = now.saturating_duration_since(span.since).as_millis();
                    let answers = u128::from(seen.answers.wrapping_sub(span.answers));
                    if answers * 1_000 >= u128::from(LIGHT_ANSWERS_PER_S) * elapsed_ms {
                        Mode::Busy
                    } else {
                        Mode::Light
                    }
                }
                Some(_) if self.mode != Mode::Quiet => self.mode,
                // Woken before a span could be judged: busy, to be safe.
                Some(_) => Mode::Busy,
                None => {
                    self.span = restart;
                    Mode::Busy
                }
            }
        };
        let (before, after) = (self.tick_of(self.mode), self.tick_of(mode));
        self.mode = mode;
        (before != after).then_some(after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(100);

    /// What one port does: `events` so far, `answers` so far, `refusals` so far, `held` now.
    fn seen(events: u64, answers: u64, refusals: u64, held: u64) -> Activity {
        Activity { events, answers, refusals, held, ports: 1 }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_gate_that_sees_nothing_for_two_seconds_looks_every_two_seconds_until_anything_happens() {
        let t0 = Instant::now();
        let at = |ms| at(t0, ms);
        let idle = |events| seen(events, 0, 0, 0);
        let mut pace = Pace::new(WINDOW, t0);
        assert_eq!(pace.observe(idle(7), at(0)), None, "busy from the start");
        assert_eq!(pace.observe(idle(7), at(1_900)), None);
        assert_eq!(pace.observe(idle(8), at(1_999)), None, "something happened: the two seconds start again");
        assert_eq!(
            pace.observe(idle(8), at(3_998)),
            Some(LIGHT_TICK),
            "two seconds, no answer, nothing refused: light"
        );
        assert_eq!(pace.observe(idle(8), at(3_999)), Some(QUIET_TICK), "two seconds of nothing");
        assert!(pace.quiet());
        assert_eq!(pace.observe(idle(8), at(4_999)), None, "stays quiet");
        // A look that sees a burst (a refusal) is busy at once.
        assert_eq!(pace.observe(seen(20, 0, 1, 0), at(5_999)), Some(WINDOW), "refused: windows again");
        assert_eq!(pace.observe(seen(20, 0, 1, 0), at(6_000)), None);
        // Work held keeps the gate from quiet, though nothing changes.
        let held = seen(20, 0, 1, 1);
        assert_eq!(pace.observe(held, at(8_000)), Some(LIGHT_TICK), "one request held, nothing refused: light");
        assert_eq!(pace.observe(held, at(20_000)), None, "a request owing an answer is not quiet");
        assert_eq!(pace.observe(seen(20, 0, 1, 0), at(21_999)), None, "the work went");
        assert_eq!(pace.observe(seen(20, 0, 1, 0), at(22_000)), Some(QUIET_TICK), "two seconds after the work went");
    }

    #[test]
    fn a_window_as_long_as_the_slow_ticks_has_no_slower_pace_to_take() {
        let t0 = Instant::now();
        let mut slow = Pace::new(QUIET_TICK, t0);
        assert_eq!((slow.observe(seen(1, 0, 0, 0), t0), slow.observe(seen(1, 0, 0, 0), at(t0, 60_000))), (None, None));
        let mut a_second = Pace::new(LIGHT_TICK, t0);
        assert_eq!(a_second.observe(seen(1, 0, 0, 0), t0), None);
        assert_eq!(
            a_second.observe(seen(1, 0, 0, 0), at(t0, 60_000)),
            Some(QUIET_TICK),
            "a one-second window slows too"
        );
    }

    /// A pod serving a request a second: every look sees something, so it is
    /// never quiet, and at the full pace each would cost ten windows a second.
    #[test]
    fn a_gate_serving_a_trickle_goes_light_and_back_to_busy_on_the_first_sign_of_pressure() {
        let t0 = Instant::now();
        let mut pace = Pace::new(WINDOW, t0);
        let mut changes = Vec::new();
        // 3 s at a request a second, looked at every window.
        for tick in 0..=30u64 {
            let answers = tick / 10;
            if let Some(to) = pace.observe(seen(tick, answers, 0, 0), at(t0, tick * 100)) {
                changes.push((tick, to));
            }
        }
        assert_eq!(changes, [(20, LIGHT_TICK)], "light after two calm seconds, not before");
        // Light: a look a second, nothing changes while the trickle goes on.
        assert_eq!(pace.observe(seen(40, 4, 0, 1), at(t0, 4_000)), None, "one request held of one port: still light");
        assert_eq!(pace.observe(seen(50, 5, 0, 0), at(t0, 5_000)), None);
        assert_eq!(pace.mode(), Mode::Light);
        // Each sign of pressure, alone, is busy at the next look.
        for (what, next) in [
            ("a refusal", seen(60, 6, 1, 0)),
            ("two requests held on one port", seen(60, 6, 0, 2)),
            ("ten answers in a second", seen(60, 15, 0, 0)),
        ] {
            let mut light = Pace::new(WINDOW, t0);
            for tick in 0..=20u64 {
                light.observe(seen(tick, tick / 10, 0, 0), at(t0, tick * 100));
            }
            assert_eq!(light.mode(), Mode::Light);
            light.observe(seen(50, 5, 0, 0), at(t0, 3_000));
            assert_eq!(light.observe(next, at(t0, 4_000)), Some(WINDOW), "{what}");
            assert_eq!(light.mode(), Mode::Busy, "{what}");
        }
        // Nine answers in a second stay light.
        let mut light = Pace::new(WINDOW, t0);
        for tick in 0..=20u64 {
            light.observe(seen(tick, tick / 10, 0, 0), at(t0, tick * 100));
        }
        assert_eq!(light.observe(seen(40, 2 + 9, 0, 0), at(t0, 3_000)), None, "9 a second");
        assert_eq!(light.mode(), Mode::Light);
    }

    #[test]
    fn a_busy_gate_goes_light_only_two_seconds_after_its_load_drops() {
        let t0 = Instant::now();
        let mut pace = Pace::new(WINDOW, t0);
        // 5 s at 50 answers a second, nothing refused: busy throughout.
        let mut answers = 0;
        for tick in 0..=50u64 {
            answers = tick * 5;
            assert_eq!(pace.observe(seen(tick, answers, 0, 0), at(t0, tick * 100)), None, "tick {tick}");
        }
        assert_eq!(pace.mode(), Mode::Busy);
        // Then a request a second: light within two spans of two seconds, not after the average falls.
        let mut light_at = None;
        for tick in 51..=100u64 {
            answers += u64::from(tick % 10 == 0);
            if pace.observe(seen(tick, answers, 0, 0), at(t0, tick * 100)).is_some() {
                light_at = Some(tick);
                break;
            }
        }
        let light_at = light_at.expect("went light");
        assert!((70..=90).contains(&light_at), "light at tick {light_at}");
        // Refusals while busy restart the calm span: no light two seconds after the first calm look.
        let mut pressed = Pace::new(WINDOW, t0);
        for tick in 0..=34u64 {
            let refusals = u64::from(tick >= 15);
            assert_eq!(pressed.observe(seen(tick, 0, refusals, 0), at(t0, tick * 100)), None, "tick {tick}");
        }
        assert_eq!(pressed.mode(), Mode::Busy, "refused at 1.5 s: calm only since");
        assert_eq!(pressed.observe(seen(35, 0, 1, 0), at(t0, 3_500)), Some(LIGHT_TICK), "two calm seconds after it");
    }

    #[test]
    fn a_quiet_gate_woken_by_a_trickle_goes_light_and_by_a_burst_busy() {
        let t0 = Instant::now();
        let quiet = || {
            let mut pace = Pace::new(WINDOW, t0);
            pace.observe(seen(1, 0, 0, 0), t0);
            assert_eq!(pace.observe(seen(1, 0, 0, 0), at(t0, 2_000)), Some(QUIET_TICK));
            pace
        };
        let mut trickle = quiet();
        assert_eq!(trickle.observe(seen(5, 1, 0, 0), at(t0, 4_000)), Some(LIGHT_TICK), "one answer in two seconds");
        let mut burst = quiet();
        assert_eq!(burst.observe(seen(90, 20, 0, 0), at(t0, 4_000)), Some(WINDOW), "twenty answers in two seconds");
        let mut refused = quiet();
        assert_eq!(refused.observe(seen(5, 0, 1, 0), at(t0, 4_000)), Some(WINDOW), "a refusal");
    }

    #[test]
    fn work_held_is_judged_against_the_gates_ports() {
        let t0 = Instant::now();
        let mut two_ports = Pace::new(WINDOW, t0);
        let held = |events, held| Activity { events, answers: 0, refusals: 0, held, ports: 2 };
        for tick in 0..=20u64 {
            two_ports.observe(held(tick, 2), at(t0, tick * 100));
        }
        assert_eq!(two_ports.mode(), Mode::Light, "a request held on each of two ports");
        assert_eq!(two_ports.observe(held(30, 3), at(t0, 3_000)), Some(WINDOW), "three");
    }
}
