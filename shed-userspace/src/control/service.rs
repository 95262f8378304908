// SPDX-License-Identifier: MIT OR Apache-2.0
//! The queue inside the service: what `queue` follows besides the kernel's.
//!
//! Most servers read every request at once and queue it inside: Go's
//! `net/http` and every thread-per-connection server wait for a worker after
//! reading, and async servers wait on a pool or a lock. The kernel then sees
//! no queue wait, only longer service times (pick-up to the first answer
//! byte). By Little's law the service holds `rate x mean service` requests on
//! average. With no queue inside, it needs only its *knee*: the best rate it
//! answers at times the shortest mean service time it has shown (the
//! bandwidth-delay product of BBR, with the server as the pipe). What it
//! holds beyond the knee waits inside.
//!
//! Both are measured over a span of windows, but a standing queue inside
//! hides the shortest service time (every request waits), so neither may
//! simply expire upward: a queue would become the knee. The knee's factors
//! are *confirmed* by a drain probe, as BBR's ProbeRTT: the limit is held at
//! half the knee until a window's requests were all admitted under it, and
//! that window's mean service is the shortest, with the rate the service
//! answered at before the probe. Until the next confirmation the knee is at
//! least the confirmed one; the span only lowers the shortest and raises
//! the rate.
//!
//! A probe is due every ~0.9 span while the service holds a queue inside (more
//! than its knee), or when its shortest service in the span rose well above
//! the confirmed one (it slowed, or a queue hides it). A probe that found a
//! much shorter service is followed by another soon, so a knee first learned
//! from a queued start comes down within seconds. A service that really
//! slowed with no queue holds no more than its knee meanwhile (the confirmed
//! rate times the confirmed service is still its workers), so the limit does
//! not come down; its probe then confirms the slower service. A server whose
//! workers read when free never holds more than its workers, and is probed
//! only when its service time rises.
use super::minimum::WindowedMin;

/// Weight of each window in the smoothed rate and mean service the knee is
/// taken from: one window of a few dozen requests is noisy, and the best and
/// shortest of noisy values sit too far out.
const SMOOTHING: f64 = 0.3;

/// A drain probe holds the limit at this share of the knee.
const PROBE_DEPTH: f64 = 0.5;

/// A probe ends after this many windows, drained or not; a slow service's
/// after [`PROBE_SERVICE_TIMES`] of its service times (of nominal windows),
/// at most [`PROBE_LONGEST_WINDOWS`].
const PROBE_MOST_WINDOWS: u32 = 5;
const PROBE_SERVICE_TIMES: f64 = 4.0;
const PROBE_LONGEST_WINDOWS: u32 = 30;
const WINDOW_S: f64 = 0.1;

/// A probe pools the answers of its drained windows until it has this many
/// times the controller's `min_samples` (or ends with at least `min_samples`).
const DRAIN_ANSWERS_PER_SAMPLE: u64 = 3;

/// A probe window is taken as drained at once when the shortest service is
/// at most this share of a window; otherwise after in-flight stayed under the
/// probe's limit for a service time, but at most this many windows.
const DRAIN_SHORT: f64 = 0.2;
const DRAIN_MOST_WINDOWS: f64 = 2.0;

/// The service held a queue inside (worth a probe) when it held more than the
/// knee by this share of it (and by at least one request).
const SUSPECT_ABOVE_KNEE: f64 = 0.5;

/// The service is also worth a probe when its shortest service rose by this
/// share over what the last probe left.
const SUSPECT_ROSE: f64 = 0.25;

/// A judged rate spans at least this many of the shortest service times.
const RATE_SERVICES: f64 = 2.0;

/// The least answers the first knee is taken from (with half the usual).
const FIRST_ANSWERS: u64 = 3;

/// A confirming probe returns the limit to at most this many knees.
const RESTORE_KNEES: f64 = 2.0;

/// Probes come at most every this many shortest service times (see
/// [`ServiceStage::during_probe`]).
const PROBE_EVERY_SERVICES: f64 = 40.0;

/// A probe that lowered the shortest service by this share is followed by
/// another after [`PROBE_AGAIN_WINDOWS`].
const PROBE_FOUND: f64 = 0.2;
const PROBE_AGAIN_WINDOWS: usize = 10;

/// What the service held in one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Held {
    /// Requests in service on average (the window's rate x its mean service time).
    pub in_service: f64,
    /// Requests it needs to run at its best rate with no queue inside.
    pub knee: f64,
    /// The window's answer rate, per second.
    pub rate: f64,
    /// The shortest smoothed mean service time over the span, microseconds.
    pub shortest_us: f64,
}

impl Held {
    /// Requests waiting inside the service (held beyond the knee).
    pub(crate) fn waiting(&self) -> f64 {
        (self.in_service - self.knee).max(0.0)
    }

    /// Their wait, by Little's law, microseconds.
    pub(crate) fn wait_us(&self) -> f64 {
        if self.rate > 0.0 { self.waiting() / self.rate * 1e6 } else { 0.0 }
    }
}

/// A drain probe under way.
#[derive(Clone, Copy, Debug)]
struct Probe {
    windows_left: u32,
    /// The limit held meanwhile, and the one to return to.
    limit: f64,
    restore: f64,
    /// The knee's shortest service when it began, and the service of the
    /// requests then in flight (how long they take to drain).
    shortest_before_us: f64,
    service_before_us: f64,
    /// How long in-flight has been under the probe's limit (from window ends), microseconds.
    under_us: f64,
    /// The answers of its drained windows, and their service times' sum.
    drained_answers: u64,
    drained_sum_us: f64,
    /// The least answers a mean is judged by.
    min_samples: u64,
}

/// The service stage's knee and its drain probe (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct ServiceStage {
    rate: f64,
    service_us: f64,
    /// The best smoothed rate (a minimum of negated rates) and the shortest
    /// smoothed mean service, over the same span.
    best_rate: WindowedMin,
    shortest: WindowedMin,
    /// The last probe's shortest service and the rate before it (the first
    /// window's, until a probe): the knee is at least theirs.
    confirmed_us: f64,
    confirmed_rate: f64,
    /// In-flight at the last window's end: this window's start.
    last_in_flight: u64,
    probe: Option<Probe>,
    /// The probe's last window had enough answers, all admitted under its limit.
    drained: bool,
    /// Windows until a probe may start, and whether the service held a queue
    /// inside since the last one.
    until_probe: usize,
    suspected: bool,
    /// The last judged answers showed a queue inside (held past the knee by
    /// [`SUSPECT_ABOVE_KNEE`] of it), and the rate they were answered at.
    queued: bool,
    queued_rate: f64,
    /// The answers and seconds of the last judged windows, over at least
    /// [`RATE_SERVICES`] shortest service times.
    recent: std::collections::VecDeque<(u64, f64)>,
    probe_interval: usize,
    /// Windows too thin to judge, pooled.
    pending: Pending,
}

/// What left the service in a window: answers, and requests whose
/// connection closed before their answer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Departures {
    pub answered: u64,
    /// The answers' mean service time, us.
    pub mean_us: u64,
    pub abandoned: u64,
    /// The abandoned requests' mean age when they went, us.
    pub abandoned_age_us: u64,
}

/// Answers of windows not judged yet ([`ServiceStage::observe`]).
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    answered: u64,
    sum_us: f64,
    abandoned: u64,
    abandoned_sum_us: f64,
    seconds: f64,
    windows: usize,
}

impl ServiceStage {
    pub(crate) fn new(span: usize) -> Self {
        let min = || WindowedMin { span, values: std::collections::VecDeque::default(), covered: 0 };
        let probe_interval = (span * 9 / 10).max(1);
        Self {
            rate: 0.0,
            service_us: 0.0,
            best_rate: min(),
            shortest: min(),
            confirmed_us: f64::INFINITY,
            confirmed_rate: 0.0,
            last_in_flight: 0,
            probe: None,
            drained: false,
            until_probe: 0,
            suspected: false,
            queued: false,
            queued_rate: 0.0,
            recent: std::collections::VecDeque::new(),
            probe_interval,
            pending: Pending::default(),
        }
    }

    /// The knee, and the shortest service it is taken from: at least the
    /// confirmed ones (see the module docs).
    fn knee(&self) -> (f64, f64) {
        let shortest_us = self.shortest.min().min(self.confirmed_us);
        let rate = (-self.best_rate.min()).max(self.confirmed_rate);
        (rate * shortest_us / 1e6, shortest_us)
    }

    /// The knee, the best rate and the shortest service (us) it is taken
    /// from, while the service holds a queue inside (its last judged answers
    /// said so). None otherwise: before answers measured it, and while the
    /// service keeps up, when the rate it answers at may be only what it is
    /// asked (at a quiet hour the knee is a few requests, and a burst of work
    /// after it must not be cut to that).
    ///
    /// With a queue inside, every worker is busy, so the rate of the last
    /// judged answers is what the service can do now: the knee is that rate
    /// times the shortest service (a service that lost workers is followed
    /// down within a judged window or two, not a span of the best rate).
    pub(crate) fn queued_knee(&self) -> Option<(f64, f64, f64)> {
        let (_, shortest_us) = self.knee();
        let rate = self.queued_rate;
        let knee = rate * shortest_us / 1e6;
        (self.queued && rate > 0.0 && knee.is_finite()).then_some((knee, rate, shortest_us))
    }

    /// The shortest service time it is taken from (us), once answers have
    /// measured the service: a thin window judges nothing, but its requests'
    /// own service still includes the queue inside.
    pub(crate) fn shortest_us(&self) -> Option<f64> {
        let (_, shortest_us) = self.knee();
        (self.measured() && shortest_us.is_finite()).then_some(shortest_us)
    }

    /// Whether answers have measured the service yet.
    pub(crate) fn measured(&self) -> bool {
        self.confirmed_rate > 0.0
    }

    pub(crate) fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// One window's answers: `answered` requests in `seconds`, `mean_us` each
    /// on average; `in_flight` at its end. None: no answers to judge by.
    #[cfg(test)]
    pub(crate) fn observe(
        &mut self,
        answered: u64,
        mean_us: u64,
        seconds: f64,
        windows: usize,
        in_flight: u64,
        min_samples: u64,
    ) -> Option<Held> {
        self.observe_with_abandoned(
            Departures { answered, mean_us, abandoned: 0, abandoned_age_us: 0 },
            seconds,
            windows,
            in_flight,
            min_samples,
        )
    }

    /// [`Self::observe`], with the requests whose connection closed before
    /// their answer: by Little's law every departure counts towards what the
    /// service held (an abandoned request, its age when it went, a lower
    /// bound on its latency), but only answers are the rate it serves at.
    pub(crate) fn observe_with_abandoned(
        &mut self,
        departures: Departures,
        seconds: f64,
        windows: usize,
        in_flight: u64,
        min_samples: u64,
    ) -> Option<Held> {
        let Departures { answered, mean_us, abandoned, abandoned_age_us } = departures;
        let started_with = std::mem::replace(&mut self.last_in_flight, in_flight);
        self.drained = false;
        if seconds <= 0.0 {
            return None;
        }
        if let Some(probe) = &mut self.probe {
            // A probe window whose answered requests were all admitted under
            // the probe's limit shows the service without a queue inside.
            // Requests answered early in a window were picked up before it,
            // so in-flight must have been under the limit for a service time
            // before the window began (unless a service time is short against
            // the window, and so are the answers it misjudges). Its answers
            // are pooled until there are enough to judge by: the mean of a
            // few is noisy, and a knee too low cuts a queue that is not there.
            let window_us = seconds * 1e6;
            if started_with as f64 <= probe.limit {
                let needed = if probe.service_before_us <= DRAIN_SHORT * window_us {
                    0.0
                } else {
                    probe.service_before_us.min(DRAIN_MOST_WINDOWS * window_us)
                };
                if probe.under_us >= needed {
                    probe.drained_answers += answered;
                    probe.drained_sum_us += answered as f64 * mean_us as f64;
                    self.drained = probe.drained_answers >= DRAIN_ANSWERS_PER_SAMPLE * min_samples;
                }
                probe.under_us += window_us;
            } else {
                probe.under_us = 0.0;
            }
            probe.min_samples = min_samples;
        }
        // A slow service answers few requests a window: its windows are pooled
        // until there are enough answers to judge by (as the kernel's samples
        // carry), or it would be judged never at all.
        self.pending.answered += answered;
        self.pending.sum_us += answered as f64 * mean_us as f64;
        self.pending.abandoned += abandoned;
        self.pending.abandoned_sum_us += abandoned as f64 * abandoned_age_us as f64;
        self.pending.seconds += seconds;
        self.pending.windows += windows;
        // Abandoned requests alone judge a window once the service has been
        // measured (every client gave up: that is overload, not silence).
        let abandoned_judge = self.confirmed_rate > 0.0 && self.pending.abandoned >= min_samples;
        // The first knee is taken from the first few answers: at a slow
        // service's start, later ones already waited behind the first.
        let needed = if self.confirmed_rate == 0.0 {
            min_samples.div_ceil(2).max(FIRST_ANSWERS.min(min_samples))
        } else {
            min_samples
        };
        // Or from any answer at all once clients give up in numbers: a slow
        // service's later answers are all too late to be seen.
        let first_among_abandoned =
            self.confirmed_rate == 0.0 && self.pending.answered > 0 && self.pending.abandoned >= needed;
        if (self.pending.answered < needed || self.pending.sum_us <= 0.0) && !abandoned_judge && !first_among_abandoned
        {
            return None;
        }
        // A first knee from the few answers among abandoned requests spans two
        // of their service times at least: a slow service's first answers come
        // a service time after its start, and a rate read over less is a
        // fraction of what it answers (8 workers of 500 ms read at 2.5/s, a
        // knee of 1, held the limit at its floor for ten seconds).
        let mean_us = self.pending.sum_us / self.pending.answered.max(1) as f64;
        let spans = self.pending.seconds * 1e6 >= RATE_SERVICES * mean_us;
        if first_among_abandoned && self.pending.answered < needed && !spans {
            return None;
        }
        let pooled = std::mem::take(&mut self.pending);
        let (seconds, windows) = (pooled.seconds, pooled.windows);
        let rate = pooled.answered as f64 / seconds;
        let held_abandoned = pooled.abandoned_sum_us / 1e6 / seconds;
        if pooled.answered == 0 {
            let (knee, shortest_us) = self.knee();
            let held = Held { in_service: held_abandoned, knee, rate: 0.0, shortest_us };
            self.queued = held.in_service - knee > (SUSPECT_ABOVE_KNEE * knee).max(1.0);
            self.suspected |= self.queued;
            return Some(held);
        }
        let mean_us = pooled.sum_us / pooled.answered as f64;
        if self.probe.is_none() {
            let smooth = |old: f64, new: f64| if old == 0.0 { new } else { old + SMOOTHING * (new - old) };
            self.rate = smooth(self.rate, rate);
            self.service_us = smooth(self.service_us, mean_us);
            self.best_rate.push(-self.rate, windows);
            self.shortest.push(self.service_us, windows);
        }
        if self.confirmed_rate == 0.0 {
            (self.confirmed_us, self.confirmed_rate) = (self.service_us, self.rate);
        }
        let (knee, shortest_us) = self.knee();
        let held = Held { in_service: rate * mean_us / 1e6 + held_abandoned, knee, rate, shortest_us };
        self.queued = held.in_service - knee > (SUSPECT_ABOVE_KNEE * knee).max(1.0);
        // The rate the bound reads spans two of the shortest service times at
        // least: a slow service's workers answer in waves (eight at once every
        // 500 ms), and one judged window may hold a wave or its gap.
        self.recent.push_back((pooled.answered, seconds));
        let span_s = RATE_SERVICES * shortest_us / 1e6;
        while self.recent.len() > 1 && self.recent.iter().skip(1).map(|r| r.1).sum::<f64>() >= span_s {
            self.recent.pop_front();
        }
        if self.queued {
            let (answers, secs) = self.recent.iter().fold((0u64, 0.0), |(a, t), r| (a + r.0, t + r.1));
            self.queued_rate = answers as f64 / secs;
        }
        if self.queued || self.shortest.min() > (1.0 + SUSPECT_ROSE) * self.confirmed_us {
            self.suspected = true;
        }
        Some(held)
    }

    /// Starts a drain probe if one is due: the service held a queue inside
    /// since the last, and the probe's limit is below `limit`. Returns the
    /// limit to hold.
    pub(crate) fn start_probe(&mut self, limit: f64, min_limit: f64, windows: usize) -> Option<f64> {
        self.until_probe = self.until_probe.saturating_sub(windows);
        if self.probe.is_some() || self.until_probe > 0 || !self.suspected {
            return None;
        }
        let (knee, shortest_us) = self.knee();
        let hold = (knee * PROBE_DEPTH).floor().max(min_limit).max(1.0);
        if !knee.is_finite() || hold >= limit {
            return None;
        }
        // Long enough to drain: a few of its shortest service times, in
        // windows (at least the usual 5; not the queued service's, or bursts
        // that the objective admits would meet a probe of seconds).
        let service_windows = (PROBE_SERVICE_TIMES * shortest_us / 1e6 / WINDOW_S).ceil();
        let windows_left = (service_windows as u32).clamp(PROBE_MOST_WINDOWS, PROBE_LONGEST_WINDOWS);
        self.probe = Some(Probe {
            windows_left,
            limit: hold,
            restore: limit,
            shortest_before_us: shortest_us,
            service_before_us: self.service_us.max(shortest_us),
            under_us: 0.0,
            drained_answers: 0,
            drained_sum_us: 0.0,
            min_samples: 1,
        });
        Some(hold)
    }

    /// One window of a probe under way (after [`Self::observe`]): the limit
    /// to hold, or, when it ends, the one to return to (and `true`).
    pub(crate) fn during_probe(&mut self, windows: usize) -> (f64, bool) {
        let Some(mut probe) = self.probe else { return (0.0, true) };
        probe.windows_left = probe.windows_left.saturating_sub(windows as u32);
        if !self.drained && probe.windows_left > 0 {
            self.probe = Some(probe);
            return (probe.limit, false);
        }
        self.probe = None;
        self.suspected = false;
        let mut found = false;
        if probe.drained_answers >= probe.min_samples {
            // Confirmed: the drained service, at the rate it answered at before
            // the probe. The span starts over from them.
            let drained_us = probe.drained_sum_us / probe.drained_answers as f64;
            found = drained_us <= (1.0 - PROBE_FOUND) * probe.shortest_before_us;
            (self.confirmed_us, self.confirmed_rate) = (drained_us, self.rate);
            self.shortest.reset();
            self.best_rate.reset();
            // Back to at most a few knees: the limit before the probe held the
            // queue the probe just measured, and would take seconds to cut again.
            let knee = self.confirmed_rate * self.confirmed_us / 1e6;
            if knee.is_finite() && knee > 0.0 {
                probe.restore = probe.restore.min((RESTORE_KNEES * knee).max(probe.limit));
            }
        }
        // A probe holds half the knee for a few service times: a slow
        // service's probes come as seldom as a few dozen service times, so
        // they cost it at most a few percent of its capacity (every ~0.9 span
        // alone, a 1 s service spent four seconds in nine at half capacity).
        let seldom = (PROBE_EVERY_SERVICES * self.confirmed_us.min(self.shortest.min()) / 1e6 / WINDOW_S).ceil();
        let interval = if seldom.is_finite() { self.probe_interval.max(seldom as usize) } else { self.probe_interval };
        self.until_probe = if found { PROBE_AGAIN_WINDOWS } else { interval };
        (probe.restore, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 0.1 s window of `answered` requests, `mean_us` each, `in_flight` at its end.
    fn window(stage: &mut ServiceStage, answered: u64, mean_us: u64, in_flight: u64) -> Option<Held> {
        stage.observe(answered, mean_us, 0.1, 1, in_flight, 10)
    }

    #[test]
    fn held_and_knee_follow_littles_law() {
        let mut stage = ServiceStage::new(100);
        // 8 workers x 10 ms: 800/s, 8 held, no queue inside.
        let h = window(&mut stage, 80, 10_000, 8).unwrap();
        assert_eq!((h.in_service, h.knee, h.rate, h.shortest_us), (8.0, 8.0, 800.0, 10_000.0));
        assert_eq!((h.waiting(), h.wait_us()), (0.0, 0.0));
        // Same rate, 40 ms each: 32 held, 24 of them waiting inside, 30 ms each.
        let h = window(&mut stage, 80, 40_000, 32).unwrap();
        assert_eq!((h.in_service, h.knee), (32.0, 8.0));
        assert_eq!((h.waiting(), h.wait_us()), (24.0, 30_000.0));
        // No answer at all: those waiting have no rate to wait by, and no wait is read.
        let stalled = Held { rate: 0.0, ..h };
        assert_eq!((stalled.waiting(), stalled.wait_us()), (24.0, 0.0));
    }

    #[test]
    fn the_knee_follows_the_best_rate_over_the_span_not_only_the_first() {
        let mut stage = ServiceStage::new(100);
        // Half the workers busy at first: 400/s at 10 ms, a knee of 4.
        let h = window(&mut stage, 40, 10_000, 4).unwrap();
        assert_eq!(h.knee, 4.0);
        // Then all 8: the smoothed rate climbs toward 800/s, and the knee with it.
        let mut knee = 0.0;
        for _ in 0..30 {
            knee = window(&mut stage, 80, 10_000, 8).unwrap().knee;
        }
        assert!((7.5..=8.0).contains(&knee), "knee {knee}: the best rate seen, not the first");
    }

    #[test]
    fn a_slow_services_thin_windows_are_pooled_until_there_are_enough_answers() {
        let mut stage = ServiceStage::new(100);
        // 4 workers x 100 ms: 4 answers a window. The first knee is taken
        // from half the answers (5), later ones need all 10.
        assert_eq!(window(&mut stage, 4, 100_000, 4), None);
        let first = window(&mut stage, 4, 100_000, 4).expect("8 answers over 0.2 s: enough for the first knee");
        assert!((first.knee - 4.0).abs() < 1e-9, "{first:?}");
        assert_eq!(window(&mut stage, 4, 100_000, 4), None);
        assert_eq!(window(&mut stage, 4, 100_000, 4), None);
        let h = window(&mut stage, 4, 100_000, 4).expect("12 answers over 0.3 s");
        assert!((h.rate - 40.0).abs() < 1e-9 && (h.in_service - 4.0).abs() < 1e-9, "{h:?}");
        assert_eq!(window(&mut stage, 4, 100_000, 4), None, "pooled afresh");
    }

    #[test]
    fn a_service_that_slowed_with_no_queue_keeps_its_knee() {
        let mut stage = ServiceStage::new(20);
        for _ in 0..20 {
            window(&mut stage, 80, 10_000, 8);
        }
        // 5x slower, still 8 workers busy and no queue: 160/s x 50 ms = 8 held,
        // long after the span forgot the faster windows.
        for _ in 0..100 {
            let h = window(&mut stage, 16, 50_000, 8).unwrap();
            assert!(h.waiting() < 0.5, "no queue inside: held {} knee {}", h.in_service, h.knee);
        }
        // Its shortest service rose: a probe confirms it, the knee is the same 8.
        let hold = stage.start_probe(16.0, 1.0, 1).expect("a risen service time is worth a probe");
        assert_eq!(hold, 4.0, "half the knee");
        window(&mut stage, 16, 50_000, 4);
        assert_eq!(stage.during_probe(1), (4.0, false), "began above the probe's limit: not drained");
        window(&mut stage, 16, 50_000, 4);
        assert_eq!(stage.during_probe(1), (4.0, false), "under it for less than a service time");
        window(&mut stage, 16, 60_000, 4);
        assert_eq!(stage.during_probe(1), (4.0, false), "drained, but too few answers to judge by yet");
        window(&mut stage, 16, 40_000, 4);
        assert_eq!(stage.during_probe(1), (16.0, true), "drained: back to the limit before");
        // Drained to the service it had: no sooner again than the span's
        // interval (18 windows) or 40 of its 50 ms services (20 windows).
        assert_eq!((stage.probe_interval, stage.until_probe), (18, 20), "a slow service is probed seldom");
        let h = window(&mut stage, 16, 50_000, 8).unwrap();
        assert!((h.knee - 8.0).abs() < 0.5 && (h.shortest_us - 50_000.0).abs() < 1.0, "{h:?}");
        assert_eq!(stage.start_probe(16.0, 1.0, 1), None, "confirmed: not due again");
    }

    #[test]
    fn a_queue_inside_learned_as_the_knee_is_found_by_a_probe() {
        let mut stage = ServiceStage::new(100);
        // A start under overload: 8 workers x 10 ms, but 40 held (32 waiting)
        // from the first window, so the first knee is 40.
        let h = window(&mut stage, 80, 50_000, 40).unwrap();
        assert_eq!(h.knee, 40.0);
        assert_eq!(stage.start_probe(40.0, 1.0, 1), None, "nothing held above the knee yet");
        // The queue grows: held past the knee by half, a probe at half the knee.
        window(&mut stage, 80, 80_000, 64).unwrap();
        assert_eq!(stage.start_probe(64.0, 1.0, 1), Some(20.0));
        window(&mut stage, 80, 60_000, 20);
        assert_eq!(stage.during_probe(1), (20.0, false), "began above the probe's limit");
        window(&mut stage, 80, 30_000, 8);
        assert_eq!(stage.during_probe(1), (20.0, false), "under it for less than a service time");
        window(&mut stage, 80, 10_000, 8);
        let (restore, ended) = stage.during_probe(1);
        // Not back to the 64 that held the queue: two knees (800/s x 10 ms),
        // but no lower than the probe's own limit.
        assert!(ended && restore == 20.0, "{restore}");
        let h = window(&mut stage, 80, 10_000, 8).unwrap();
        assert!(h.knee < 9.0, "the drained service is the shortest: {h:?}");
        assert_eq!(stage.until_probe, PROBE_AGAIN_WINDOWS, "found much lower: probe again soon");
    }

    #[test]
    fn a_short_services_probe_counts_its_first_window_under_the_limit() {
        let mut stage = ServiceStage::new(100);
        window(&mut stage, 80, 10_000, 8);
        window(&mut stage, 80, 40_000, 32);
        let hold = stage.start_probe(32.0, 1.0, 1).unwrap();
        window(&mut stage, 80, 20_000, hold as u64);
        assert_eq!(stage.during_probe(1), (hold, false), "began above the probe's limit");
        // Began under it, and the service (19 ms, smoothed) is within a fifth
        // of the window: its answers count at once.
        window(&mut stage, 80, 10_000, hold as u64);
        assert!(stage.during_probe(1).1, "drained in its first window under the limit");
    }

    #[test]
    fn a_long_services_probe_waits_two_windows_under_the_limit_before_counting() {
        let mut stage = ServiceStage::new(100);
        let observe = |stage: &mut ServiceStage, seconds: f64, mean_us: u64, in_flight: u64| {
            stage.observe(2, mean_us, seconds, 1, in_flight, 1);
        };
        // 500 ms services: a knee of 10 at 20/s, then 40 held.
        observe(&mut stage, 0.1, 500_000, 10);
        observe(&mut stage, 0.1, 2_000_000, 40);
        let hold = stage.start_probe(40.0, 1.0, 1).unwrap();
        assert_eq!(stage.probe.unwrap().windows_left, 20, "four of its 500 ms services, in 100 ms windows");
        observe(&mut stage, 0.1, 500_000, hold as u64);
        // Under the limit for 50 ms, then 100 ms: 150 ms is less than the two
        // windows (200 ms) a service this long waits for, so nothing counts yet.
        observe(&mut stage, 0.05, 500_000, hold as u64);
        observe(&mut stage, 0.1, 500_000, hold as u64);
        observe(&mut stage, 0.1, 500_000, hold as u64);
        assert_eq!(stage.probe.unwrap().drained_answers, 0, "150 ms under: not yet");
        observe(&mut stage, 0.1, 500_000, hold as u64);
        assert_eq!(stage.probe.unwrap().drained_answers, 2, "250 ms under: counted");
    }

    #[test]
    fn a_probe_is_due_only_past_half_a_knee_held_above_it() {
        let mut stage = ServiceStage::new(100);
        // 8 workers x 10 ms: a knee of 8.
        window(&mut stage, 80, 10_000, 8);
        // 12 held: 4 above the knee, exactly half of it: no probe.
        assert_eq!(window(&mut stage, 80, 15_000, 12).unwrap().knee, 8.0);
        assert_eq!(stage.start_probe(12.0, 1.0, 1), None, "half a knee above it: not yet");
        // 13 held: past half a knee. A probe holds half the knee, and only
        // below the limit in force.
        window(&mut stage, 80, 16_250, 13);
        assert_eq!(stage.start_probe(4.0, 1.0, 1), None, "the limit is the probe's already");
        assert_eq!(stage.start_probe(13.0, 1.0, 1), Some(4.0));
    }

    #[test]
    fn a_probe_is_due_when_the_shortest_service_rose_by_a_quarter() {
        // A span of two windows, so the shortest service follows the service.
        let mut stage = ServiceStage::new(2);
        window(&mut stage, 80, 10_000, 8);
        // Services of 11 ms: a tenth longer than the 10 ms confirmed, no queue.
        for _ in 0..6 {
            window(&mut stage, 80, 11_000, 8);
        }
        assert_eq!(stage.start_probe(20.0, 1.0, 1), None, "risen by less than a quarter");
        // Services of 20 ms: the shortest passes 12.5 ms.
        for _ in 0..6 {
            window(&mut stage, 80, 20_000, 16);
        }
        assert!(stage.start_probe(20.0, 1.0, 1).is_some(), "risen by more than a quarter");
    }

    #[test]
    fn a_probe_is_due_only_past_a_quarter_risen_not_at_it() {
        // A probe confirms an exact mean, and a window at the smoothed mean
        // leaves it exact: the shortest service lands on 1.25 times the
        // confirmed one, which is not yet a reason to probe.
        let mut stage = ServiceStage::new(100);
        window(&mut stage, 16, 50_000, 8);
        // Held 18 against a knee of 8 (the abandoned requests' ages count): a queue inside.
        let abandoned = Departures { answered: 16, mean_us: 50_000, abandoned: 10, abandoned_age_us: 100_000 };
        stage.observe_with_abandoned(abandoned, 0.1, 1, 8, 10);
        assert_eq!(stage.start_probe(16.0, 1.0, 1), Some(4.0));
        let mut ended = false;
        for _ in 0..4 {
            window(&mut stage, 16, 40_000, 4);
            ended = stage.during_probe(1).1;
        }
        assert!(ended && stage.confirmed_us == 40_000.0, "confirmed {}", stage.confirmed_us);
        window(&mut stage, 16, 50_000, 8);
        assert_eq!(stage.shortest.min(), 1.25 * stage.confirmed_us);
        let due_in = stage.until_probe;
        assert_eq!(stage.start_probe(16.0, 1.0, due_in), None, "risen by exactly a quarter, not past it");
        // (Past it, a probe is due: a_probe_is_due_when_the_shortest_service_rose_by_a_quarter.)
    }

    #[test]
    fn a_probe_finds_a_queue_only_where_the_drained_service_is_a_fifth_shorter() {
        let mut stage = ServiceStage::new(100);
        // A first knee of 40 at 50 ms, then the queue grows: a probe at 20.
        window(&mut stage, 80, 50_000, 40);
        window(&mut stage, 80, 80_000, 64);
        assert_eq!(stage.start_probe(64.0, 1.0, 1), Some(20.0));
        window(&mut stage, 80, 60_000, 20);
        assert_eq!(stage.during_probe(1), (20.0, false));
        window(&mut stage, 80, 45_000, 8);
        assert_eq!(stage.during_probe(1), (20.0, false), "under it for less than a service time");
        // Drained to 45 ms: a tenth shorter than the 50 ms it began from, not a fifth.
        window(&mut stage, 80, 45_000, 8);
        assert!(stage.during_probe(1).1);
        assert_eq!(stage.until_probe, stage.probe_interval, "nothing found: the usual interval");
    }

    #[test]
    fn a_probe_that_cannot_drain_ends_and_confirms_nothing() {
        let mut stage = ServiceStage::new(100);
        window(&mut stage, 80, 10_000, 8);
        window(&mut stage, 80, 40_000, 32);
        let hold = stage.start_probe(32.0, 1.0, 1).unwrap();
        for left in (1..PROBE_MOST_WINDOWS).rev() {
            window(&mut stage, 80, 40_000, 30);
            assert_eq!(stage.during_probe(1), (hold, false), "{left} windows left");
        }
        window(&mut stage, 80, 40_000, 30);
        assert_eq!(stage.during_probe(1), (32.0, true));
        assert_eq!(window(&mut stage, 80, 40_000, 32).unwrap().knee, 8.0, "the knee stays the confirmed one");
    }
}
