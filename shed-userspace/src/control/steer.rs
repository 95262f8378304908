// SPDX-License-Identifier: MIT OR Apache-2.0
//! The weight a load balancer should give this backend (`attach
//! --agent-port`, HAProxy's `agent-check`): what share of the fleet's traffic
//! it can take, from the gate's own measurements. Plain logic, fed one
//! [`Load`] sample per tick; the agent endpoint reports [`Steering::weight`].
//!
//! The rule, AIMD on the weight (percent of the balancer's configured weight):
//! - **Overloaded** (over the last [`WINDOW`]): more than [`MAX_REFUSED`] of
//!   the work that reached the gate was refused, or the queue wait is over
//!   [`QUEUE_OVER`] times its objective. The weight is cut by the refused
//!   share (what the backend took is what it can take), at least by
//!   [`MIN_CUT`] and at most by [`MAX_CUT`], and not again within [`CUT_HOLD`].
//! - **Room**: nothing refused, the queue wait within half its objective and
//!   in-flight at most [`ROOM_USED`] of the limit, for [`ROOM_HOLD`] since the
//!   last cut: the weight grows by [`GROWTH`] per step, to 100.
//! - Otherwise it holds (the band between the two is the hysteresis).
//!
//! What is reported moves only by [`REPORT_BAND`] points or more (or to a
//! bound), so small changes do not churn the balancer's tables.
//!
//! It never reports `drain`, `down` or 0%: the weight stops at [`FLOOR`].
//! - A balancer reads 0% as drain. When every backend is overloaded at once
//!   (the fleet is short of capacity, not one backend), all would drain and
//!   the pool would empty; at the floor they keep equal shares and each
//!   gate sheds its excess, which is the right answer to a fleet overload.
//! - A backend at the floor still gets a trickle of real work: the only
//!   evidence that it has recovered. At 0% it would never be asked again.
//! - Weights are relative: a floor costs the others little (10 against
//!   three backends at 100 is 3% of the traffic).
//!
//! Every backend runs the same rule on its own measurements, so there is no
//! shared state to herd on; a fleet-wide overload moves every weight the same
//! way, which leaves the shares where they were.
use std::{collections::VecDeque, time::Duration};

/// Lowest weight reported, percent.
pub(crate) const FLOOR: u32 = 10;
/// How often the weight is judged.
pub(crate) const STEP: Duration = Duration::from_millis(250);
/// The span of samples each judgement reads.
pub(crate) const WINDOW: Duration = Duration::from_millis(500);
/// Refused share above which the backend is overloaded.
pub(crate) const MAX_REFUSED: f64 = 0.01;
/// Fewer attempts than this in the window say nothing about the refused share.
pub(crate) const MIN_ATTEMPTS: u64 = 5;
/// Queue wait over this many times its objective is overload.
pub(crate) const QUEUE_OVER: f64 = 2.0;
/// A cut keeps at least this share of the weight, and at most this one.
pub(crate) const MAX_CUT: f64 = 0.3;
pub(crate) const MIN_CUT: f64 = 0.8;
/// In-flight at most this share of the limit is room.
pub(crate) const ROOM_USED: f64 = 0.75;
/// A cut waits this long after the last one: the balancer applies a weight
/// up to one check interval late, so the window must first hold what the
/// last cut did (cutting again on the same evidence throws the weight to the floor).
pub(crate) const CUT_HOLD: Duration = WINDOW;
/// Queue wait at most this share of its objective is room to grow.
pub(crate) const ROOM_QUEUE: f64 = 0.5;
/// Room must last this long after a cut before the weight grows.
pub(crate) const ROOM_HOLD: Duration = Duration::from_secs(1);
/// Growth per step, points.
pub(crate) const GROWTH: u32 = 5;
/// Reported changes smaller than this are not reported.
pub(crate) const REPORT_BAND: u32 = 5;

/// One sample of a port's gate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Load {
    /// Work judged so far (connections admitted, kept-alive requests
    /// admitted, and every refusal), cumulative.
    pub attempts: u64,
    /// Refusals so far, cumulative.
    pub refused: u64,
    pub in_flight: u64,
    pub limit: u32,
    /// The queue wait the controller followed in its last window, and its objective.
    pub queue_wait_us: u64,
    pub objective_us: u64,
}

/// Why the weight moved (or held) at the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Overloaded,
    Room,
    Hold,
}

/// One port's weight and the samples it is judged on.
#[derive(Debug)]
pub(crate) struct Steering {
    samples: VecDeque<(Duration, Load)>,
    weight: f64,
    reported: u32,
    since_step: Duration,
    since_cut: Duration,
    now: Duration,
}

impl Default for Steering {
    fn default() -> Self {
        Self {
            samples: VecDeque::new(),
            weight: 100.0,
            reported: 100,
            since_step: Duration::ZERO,
            since_cut: ROOM_HOLD,
            now: Duration::ZERO,
        }
    }
}

impl Steering {
    /// The weight to report, percent: [`FLOOR`] to 100.
    pub(crate) fn weight(&self) -> u32 {
        self.reported
    }

    /// Takes a sample `elapsed` after the last one; judges the weight when a step is due.
    pub(crate) fn sample(&mut self, elapsed: Duration, load: Load) -> Option<Verdict> {
        self.now += elapsed;
        self.since_step += elapsed;
        self.since_cut += elapsed;
        self.samples.push_back((self.now, load));
        while self.samples.len() > 2
            && self.samples.front().is_some_and(|(at, _)| self.now.saturating_sub(*at) > WINDOW)
        {
            self.samples.pop_front();
        }
        if self.since_step < STEP {
            return None;
        }
        self.since_step = Duration::ZERO;
        let (verdict, refused) = self.judge();
        match verdict {
            Verdict::Overloaded => {
                self.weight = (self.weight * (1.0 - refused).clamp(MAX_CUT, MIN_CUT)).max(f64::from(FLOOR));
                self.since_cut = Duration::ZERO;
            }
            Verdict::Room => self.weight = (self.weight + f64::from(GROWTH)).min(100.0),
            Verdict::Hold => {}
        }
        let weight = self.weight.round() as u32;
        if weight.abs_diff(self.reported) >= REPORT_BAND
            || (weight != self.reported && (weight == FLOOR || weight == 100))
        {
            self.reported = weight;
        }
        Some(verdict)
    }

    /// The window's refused share (0 when it holds fewer than [`MIN_ATTEMPTS`]:
    /// too few to say anything; any refusal still stops growth in `judge`).
    fn refused_share(&self) -> f64 {
        let (Some((_, first)), Some((_, last))) = (self.samples.front(), self.samples.back()) else { return 0.0 };
        let attempts = last.attempts.saturating_sub(first.attempts);
        let refused = last.refused.saturating_sub(first.refused).min(attempts);
        if attempts < MIN_ATTEMPTS { 0.0 } else { refused as f64 / attempts as f64 }
    }

    /// The verdict on the window, and its refused share (what a cut keeps the rest of).
    fn judge(&self) -> (Verdict, f64) {
        let refused = self.refused_share();
        let n = self.samples.len().max(1) as f64;
        let queue = self
            .samples
            .iter()
            .map(|(_, l)| if l.objective_us == 0 { 0.0 } else { l.queue_wait_us as f64 / l.objective_us as f64 })
            .sum::<f64>()
            / n;
        let used = self.samples.iter().map(|(_, l)| l.in_flight as f64 / f64::from(l.limit.max(1))).sum::<f64>() / n;
        let any_refused =
            self.samples.front().zip(self.samples.back()).is_some_and(|((_, f), (_, l))| l.refused > f.refused);
        let verdict = if refused > MAX_REFUSED || queue > QUEUE_OVER {
            if self.since_cut >= CUT_HOLD { Verdict::Overloaded } else { Verdict::Hold }
        } else if !any_refused && queue <= ROOM_QUEUE && used <= ROOM_USED && self.since_cut >= ROOM_HOLD {
            Verdict::Room
        } else {
            Verdict::Hold
        };
        (verdict, refused)
    }
}

/// What the agent answers HAProxy's `agent-check` with: the weight as a
/// percentage of the server's configured weight, and nothing that changes its
/// state (no `up`, `ready`, `drain` or `down`: health is the balancer's own check's).
pub(crate) fn agent_line(weight: u32) -> String {
    format!("{}%\n", weight.clamp(FLOOR, 100))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    /// A gate seeing `rate` attempts per second with `refused` of them refused, for `secs`.
    fn run(s: &mut Steering, load: &mut Load, per_tick: u64, refused_per_tick: u64, used: f64, queue: f64, secs: f64) {
        for _ in 0..(secs * 10.0).round() as usize {
            load.attempts += per_tick;
            load.refused += refused_per_tick;
            load.limit = 20;
            load.in_flight = (used * 20.0).round() as u64;
            load.objective_us = 10_000;
            load.queue_wait_us = (queue * 10_000.0) as u64;
            s.sample(TICK, *load);
        }
    }

    #[test]
    fn a_healthy_backend_keeps_its_full_weight() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 0, 0.5, 0.5, 30.0);
        assert_eq!(s.weight(), 100);
        assert_eq!(agent_line(s.weight()), "100%\n");
    }

    #[test]
    fn refusals_cut_the_weight_by_the_refused_share_within_a_second() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 0, 0.5, 0.5, 2.0);
        // 64% refused from here: the first step's window holds one refusing
        // tick of five (12.8%: the smallest cut, to 80); the next step comes
        // within CUT_HOLD of it and holds.
        run(&mut s, &mut l, 50, 32, 1.0, 1.5, 0.5);
        assert_eq!(s.weight(), 80, "one cut, not a second on the same evidence");
        // The step 600 ms after the cut reads a window of refusing ticks
        // only: 64% refused, so it keeps 36% (80 -> 29).
        run(&mut s, &mut l, 50, 32, 1.0, 1.5, 0.3);
        assert_eq!(s.weight(), 29, "the second cut, by the refused share");
        run(&mut s, &mut l, 50, 32, 1.0, 1.5, 2.0);
        assert_eq!(s.weight(), FLOOR, "never below the floor, never drain");
        assert_eq!(agent_line(s.weight()), "10%\n");
    }

    #[test]
    fn a_small_refused_share_cuts_by_the_smallest_cut() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 100, 2, 1.0, 1.0, 0.3);
        // 2% refused: a cut keeps at most 80%.
        assert_eq!(s.weight(), 80);
    }

    #[test]
    fn a_queue_over_twice_its_objective_is_overload_even_without_refusals() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 0, 0.9, 2.5, 0.3);
        assert_eq!(s.weight(), 80);
        // Between the objective and twice it: the weight holds (the hysteresis band).
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 0, 0.9, 1.5, 0.3);
        let before = s.weight();
        run(&mut s, &mut l, 50, 0, 0.9, 1.9, 5.0);
        assert_eq!(s.weight(), before);
    }

    #[test]
    fn the_weight_grows_back_only_with_room_and_after_a_pause() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 30, 1.0, 3.0, 3.0);
        assert_eq!(s.weight(), FLOOR);
        // Busy but refusing nothing (in-flight near the limit): no room, it holds.
        run(&mut s, &mut l, 50, 0, 0.9, 0.5, 3.0);
        assert_eq!(s.weight(), FLOOR);
        // In-flight low but the queue wait over half its objective: no room either.
        run(&mut s, &mut l, 50, 0, 0.3, 0.6, 3.0);
        assert_eq!(s.weight(), FLOOR);
        // Room: the first growth waits a second after the last cut, then 5 points a step.
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 30, 1.0, 3.0, 3.0);
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 0.9);
        assert_eq!(s.weight(), FLOOR, "no growth within a second of the cut");
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 2.6);
        // A step every third 100 ms sample. The last cut was the step at
        // 3.3 s, whose 500 ms window still held the refusals until 3.0 s;
        // the steps at 4.5, 4.8, ... 6.3 s are the seven with room a second
        // after it: 10 + 7 x 5.
        assert_eq!(s.weight(), 45, "grows at 5 points a step");
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 10.0);
        assert_eq!(s.weight(), 100, "and recovers fully");
    }

    #[test]
    fn thin_traffic_is_not_judged_by_its_share_but_any_refusal_stops_growth() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 30, 1.0, 3.0, 3.0);
        let floor = s.weight();
        // One attempt a tick, one refusal a second: too few to cut on, but no room either.
        for i in 0..50 {
            l.attempts += 1;
            l.refused += u64::from(i % 10 == 0);
            l.in_flight = 1;
            l.queue_wait_us = 0;
            s.sample(TICK, l);
        }
        assert_eq!(s.weight(), floor);
    }

    #[test]
    fn reported_changes_smaller_than_the_band_are_held() {
        let mut s = Steering { weight: 62.0, reported: 60, since_cut: ROOM_HOLD, ..Steering::default() };
        let mut l = Load::default();
        // One growth step: 62 -> 67, 7 points from the reported 60: reported.
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 0.3);
        assert_eq!(s.weight(), 67);
        // One step from 58 to 63, 3 points from the reported 60: held.
        let mut s = Steering { weight: 58.0, reported: 60, since_cut: ROOM_HOLD, ..Steering::default() };
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 0.3);
        assert_eq!(s.weight(), 60, "63 is within the band of 60");
    }

    #[test]
    fn the_floor_and_full_weight_are_reported_even_within_the_band() {
        let mut l = Load::default();
        // 97 -> 100: 3 points, within the band, but full weight is said.
        let mut s = Steering { weight: 97.0, reported: 97, since_cut: ROOM_HOLD, ..Steering::default() };
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 0.3);
        assert_eq!(s.weight(), 100);
        // 12 -> 10 (a cut to the floor): 2 points, said too.
        let mut s = Steering { weight: 12.0, reported: 12, ..Steering::default() };
        run(&mut s, &mut l, 50, 30, 1.0, 3.0, 0.3);
        assert_eq!(s.weight(), FLOOR);
        // Between them, a change within the band is held.
        let mut s = Steering { weight: 50.0, reported: 50, since_cut: ROOM_HOLD, ..Steering::default() };
        s.weight = 52.0;
        run(&mut s, &mut l, 50, 0, 0.9, 1.5, 0.3);
        assert_eq!(s.weight(), 50, "52 held at 50");
    }

    #[test]
    fn the_weight_is_judged_every_step_exactly() {
        let (mut s, l) = (Steering::default(), Load::default());
        assert!(s.sample(Duration::from_millis(249), l).is_none(), "before the step");
        let mut s = Steering::default();
        assert!(s.sample(STEP, l).is_some(), "at the step");
    }

    #[test]
    fn sparse_samples_keep_two_to_judge_by() {
        // Samples 2 s apart (longer than the window): the two latest still
        // make a window, and its refusals count.
        let mut s = Steering::default();
        let mut l = Load { limit: 20, in_flight: 20, objective_us: 10_000, ..Load::default() };
        s.sample(Duration::from_secs(2), l);
        l.attempts += 100;
        l.refused += 50;
        assert_eq!(s.sample(Duration::from_secs(2), l), Some(Verdict::Overloaded));
        assert!(s.weight() < 100, "cut by the refused share");
    }

    #[test]
    fn a_window_with_any_refusal_has_no_room_to_grow() {
        let idle = Load { limit: 20, in_flight: 1, objective_us: 10_000, ..Load::default() };
        let window = |refused: [u64; 2]| Steering {
            samples: [
                (Duration::ZERO, Load { refused: refused[0], ..idle }),
                (STEP, Load { refused: refused[1], ..idle }),
            ]
            .into(),
            since_cut: ROOM_HOLD,
            ..Steering::default()
        };
        // Too few attempts for a share, but one refusal: no room.
        assert_eq!(window([0, 1]).judge().0, Verdict::Hold);
        assert_eq!(window([1, 1]).judge().0, Verdict::Room);
        // Counters that went back (the gate restarted) are no refusal.
        assert_eq!(window([5, 0]).judge().0, Verdict::Room);
        // Overload is past 1% refused, or past twice the objective's wait: at either, not yet.
        let mut at = window([0, 1]);
        at.samples[1].1.attempts = 100;
        assert_eq!(at.judge(), (Verdict::Hold, 0.01));
        at.samples[1].1.refused = 2;
        assert_eq!(at.judge().0, Verdict::Overloaded);
        let mut queued = window([0, 0]);
        for (_, l) in &mut queued.samples {
            l.queue_wait_us = 20_000;
        }
        assert_eq!(queued.judge().0, Verdict::Hold, "twice the objective");
        queued.samples[1].1.queue_wait_us = 20_002;
        assert_eq!(queued.judge().0, Verdict::Overloaded);
    }

    #[test]
    fn counters_that_go_back_never_count_as_refusals() {
        let (mut s, mut l) = (Steering::default(), Load::default());
        run(&mut s, &mut l, 50, 0, 0.3, 0.2, 1.0);
        // The gate restarted: counters from zero.
        let mut fresh = Load::default();
        run(&mut s, &mut fresh, 50, 0, 0.3, 0.2, 2.0);
        assert_eq!(s.weight(), 100);
    }
}
