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
//!   to busy. The loop's chores that only refusals make (closing refused
//!   requests' sockets, stalled shares) wait for busy, as they do while
//!   quiet;
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
/// one window every [`LIGHT_TICK`]: as long as a quiet gate's look, so that
/// a light pod meets a surge as soon as an idle one does (a light tick a
/// second cost 0.03% of a core a pod, 3.3% at 110 pods; every two seconds,
/// with the chores a light gate skips, about a third of that).
pub(crate) const LIGHT_AFTER: Duration = Duration::from_secs(2);
pub(crate) const LIGHT_TICK: Duration = Duration::from_secs(2);
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

    /// A pace and its start: `look` takes what is seen `ms` after it, and says the mode then.
    struct Looks {
        pace: Pace,
        t0: Instant,
    }

    impl Looks {
        fn new(window: Duration) -> Self {
            let t0 = Instant::now();
            Self { pace: Pace::new(window, t0), t0 }
        }

        fn look(&mut self, seen: Activity, ms: u64) -> Mode {
            self.pace.observe(seen, self.t0 + Duration::from_millis(ms));
            self.pace.mode()
        }

        /// The tick the look changes to, if it changes.
        fn tick(&mut self, seen: Activity, ms: u64) -> Option<Duration> {
            self.pace.observe(seen, self.t0 + Duration::from_millis(ms))
        }

        /// A request a second, looked at every window, from `from_ms` for `ms`; then the mode.
        fn trickle(&mut self, from_ms: u64, ms: u64) -> Mode {
            for t in (from_ms..=from_ms + ms).step_by(100) {
                self.look(seen(t / 100, t / 1_000, 0, 0), t);
            }
            self.pace.mode()
        }
    }

    #[test]
    fn a_gate_that_sees_nothing_for_two_seconds_looks_every_two_seconds_until_anything_happens() {
        let mut looks = Looks::new(WINDOW);
        let idle = |events| seen(events, 0, 0, 0);
        assert_eq!(looks.look(idle(7), 0), Mode::Busy, "busy from the start");
        assert_eq!(looks.look(idle(7), 1_900), Mode::Busy);
        assert_eq!(looks.look(idle(8), 1_999), Mode::Busy, "something happened: the two seconds start again");
        assert_eq!(looks.look(idle(8), 3_998), Mode::Light, "two seconds, no answer, nothing refused");
        assert_eq!(looks.look(idle(8), 3_999), Mode::Quiet, "two seconds of nothing");
        assert_eq!(looks.look(idle(8), 4_999), Mode::Quiet, "stays quiet");
        // A look that sees a burst (a refusal) is busy at once.
        assert_eq!(looks.tick(seen(20, 0, 1, 0), 5_999), Some(WINDOW), "refused: windows again");
        assert_eq!(looks.look(seen(20, 0, 1, 0), 6_000), Mode::Busy);
        // Work held keeps the gate from quiet, though nothing changes.
        let held = seen(20, 0, 1, 1);
        assert_eq!(looks.tick(held, 8_000), Some(LIGHT_TICK), "one request held, nothing refused: light");
        assert_eq!(looks.look(held, 20_000), Mode::Light, "a request owing an answer is not quiet");
        assert_eq!(looks.look(seen(20, 0, 1, 0), 21_999), Mode::Light, "the work went");
        assert_eq!(looks.look(seen(20, 0, 1, 0), 22_000), Mode::Quiet, "two seconds after the work went");
    }

    #[test]
    fn no_pace_is_faster_than_the_gates_own_window() {
        let mut slow = Looks::new(QUIET_TICK);
        assert_eq!(slow.tick(seen(1, 0, 0, 0), 0), None);
        assert_eq!(slow.tick(seen(1, 0, 0, 0), 60_000), None, "quiet, at the window it had");
        assert_eq!(slow.pace.mode(), Mode::Quiet);
        let mut a_second = Looks::new(Duration::from_secs(1));
        assert_eq!(a_second.tick(seen(1, 0, 0, 0), 0), None);
        assert_eq!(a_second.tick(seen(1, 0, 0, 0), 60_000), Some(QUIET_TICK), "a one-second window slows too");
        let mut long = Looks::new(Duration::from_secs(5));
        long.look(seen(1, 0, 0, 0), 0);
        assert_eq!(long.tick(seen(2, 0, 0, 0), 5_000), None, "light at its own window");
        assert_eq!(long.pace.mode(), Mode::Light);
    }

    /// A pod serving a request a second: every look sees something, so it is
    /// never quiet, and at the full pace each would cost ten windows a second.
    #[test]
    fn a_gate_serving_a_trickle_goes_light_and_back_to_busy_on_the_first_sign_of_pressure() {
        let mut looks = Looks::new(WINDOW);
        assert_eq!(looks.trickle(0, 1_900), Mode::Busy, "not before two calm seconds");
        assert_eq!(looks.tick(seen(20, 2, 0, 0), 2_000), Some(LIGHT_TICK), "light after two");
        assert_eq!(looks.look(seen(40, 4, 0, 1), 4_000), Mode::Light, "one request held of one port");
        assert_eq!(looks.look(seen(60, 6, 0, 0), 6_000), Mode::Light);
        // Each sign of pressure, alone, is busy at the next look.
        for (what, next) in [
            ("a refusal", seen(80, 8, 1, 0)),
            ("two requests held on one port", seen(80, 8, 0, 2)),
            ("twenty answers in two seconds", seen(80, 26, 0, 0)),
        ] {
            let mut light = Looks::new(WINDOW);
            assert_eq!(light.trickle(0, 6_000), Mode::Light);
            assert_eq!(light.tick(next, 8_000), Some(WINDOW), "{what}");
            assert_eq!(light.pace.mode(), Mode::Busy, "{what}");
        }
        let mut light = Looks::new(WINDOW);
        light.trickle(0, 6_000);
        assert_eq!(light.look(seen(80, 6 + 19, 0, 0), 8_000), Mode::Light, "nineteen in two seconds");
        // A look sooner than a tick judges nothing yet.
        let mut light = Looks::new(WINDOW);
        light.trickle(0, 6_000);
        assert_eq!(light.look(seen(70, 6 + 30, 0, 0), 6_500), Mode::Light, "half a tick: not judged");
        assert_eq!(light.look(seen(80, 6 + 30, 0, 0), 8_000), Mode::Busy, "judged at the tick");
    }

    #[test]
    fn a_busy_gate_goes_light_only_two_seconds_after_its_load_drops() {
        let mut looks = Looks::new(WINDOW);
        // 5 s at 50 answers a second, nothing refused: busy throughout.
        let mut answers = 0;
        for tick in 0..=50u64 {
            answers = tick * 5;
            assert_eq!(looks.look(seen(tick, answers, 0, 0), tick * 100), Mode::Busy, "tick {tick}");
        }
        // Then a request a second: light within two spans of two seconds, not after the average falls.
        let mut light_at = None;
        for tick in 51..=100u64 {
            answers += u64::from(tick % 10 == 0);
            if looks.look(seen(tick, answers, 0, 0), tick * 100) == Mode::Light {
                light_at = Some(tick);
                break;
            }
        }
        let light_at = light_at.expect("went light");
        assert!((70..=90).contains(&light_at), "light at tick {light_at}");
        // A refusal while busy starts the calm span again.
        let mut pressed = Looks::new(WINDOW);
        for tick in 0..=34u64 {
            let refusals = u64::from(tick >= 15);
            assert_eq!(pressed.look(seen(tick, 0, refusals, 0), tick * 100), Mode::Busy, "tick {tick}");
        }
        assert_eq!(pressed.look(seen(35, 0, 1, 0), 3_500), Mode::Light, "two calm seconds after it");
    }

    #[test]
    fn a_quiet_gate_woken_by_a_trickle_goes_light_and_by_a_burst_busy() {
        let quiet = || {
            let mut looks = Looks::new(WINDOW);
            looks.look(seen(1, 0, 0, 0), 0);
            assert_eq!(looks.look(seen(1, 0, 0, 0), 2_000), Mode::Quiet);
            looks
        };
        assert_eq!(quiet().look(seen(5, 1, 0, 0), 4_000), Mode::Light, "one answer in two seconds");
        assert_eq!(quiet().look(seen(90, 20, 0, 0), 4_000), Mode::Busy, "twenty answers in two seconds");
        assert_eq!(quiet().look(seen(5, 0, 1, 0), 4_000), Mode::Busy, "a refusal");
        assert_eq!(quiet().look(seen(5, 0, 0, 0), 2_500), Mode::Busy, "woken before a span could be judged");
    }

    #[test]
    fn work_held_is_judged_against_the_gates_ports() {
        let mut looks = Looks::new(WINDOW);
        let held = |events, held| Activity { events, answers: 0, refusals: 0, held, ports: 2 };
        for tick in 0..=20u64 {
            looks.look(held(tick, 2), tick * 100);
        }
        assert_eq!(looks.pace.mode(), Mode::Light, "a request held on each of two ports");
        assert_eq!(looks.look(held(30, 3), 3_000), Mode::Busy, "three");
    }
}
