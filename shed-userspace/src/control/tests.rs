// SPDX-License-Identifier: MIT OR Apache-2.0
//! The controllers' unit and property tests (the conformance replays and the
//! simulation are in [`super::sim`]).

use super::service::Held;
use super::{guards::PROBE_DEPTH, *};
use proptest::prelude::*;

fn gradient(limit: u32, baseline_us: u64) -> Controller {
    let mut c = Controller::new(
        Settings { algo: Algo::Gradient, initial_limit: limit, min_limit: 10, max_limit: 500, ..Settings::default() },
        0,
    );
    // Establish the baseline with one window at it, without moving the limit.
    c.baseline.push(baseline_us as f64, 1);
    c.smoothed_us = 40_000.0;
    c
}

fn window(latency_us: u64, in_flight: u64) -> WindowSample {
    WindowSample {
        in_flight,
        samples: 100,
        latency_us,
        queue_wait_us: latency_us / 2,
        service_us: 0,
        answered: 0,
        service_mean_us: 0,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 0,
        abandoned: 0,
        abandoned_age_us: 0,
    }
}

#[test]
fn seeds_worked_example_100_to_92() {
    // Baseline 20 ms, observed 40 ms, limit 100: gradient 0.5, target 60, 0.8*100 + 0.2*60 = 92.
    let mut c = gradient(100, 20_000);
    let d = c.on_window(&window(40_000, 100));
    assert_eq!(d, Decision { limit: 92, reason: Reason::LatencyRising });
    assert_eq!(c.baseline_us(), 20_000);
}

#[test]
fn rising_latency_never_raises_the_limit_past_the_tolerance() {
    for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
        let mut c = Controller::new(Settings { algo, initial_limit: 200, ..Settings::default() }, 1);
        for _ in 0..20 {
            c.on_window(&window(10_000, 200));
        }
        let start = c.limit();
        let mut last = start;
        for step in 1..50 {
            let d = c.on_window(&window(10_000 + step * 2_000, 1_000));
            // A baseline probe dips and restores the limit by design.
            if d.reason == Reason::Probe {
                continue;
            }
            // Within the algorithms' tolerance (at most 2x the baseline) the limit may still probe upward.
            if step > 5 {
                assert!(d.limit <= last, "{algo}: limit rose from {last} to {} as latency rose", d.limit);
            }
            last = d.limit;
        }
        assert!(last < start / 2, "{algo}: latency 10x the baseline must bring the limit well down: {start} -> {last}");
    }
}

#[test]
fn limits_stay_within_bounds() {
    let settings =
        Settings { algo: Algo::Gradient, initial_limit: 50, min_limit: 20, max_limit: 60, ..Settings::default() };
    for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
        let mut c = Controller::new(Settings { algo, ..settings }, 2);
        for _ in 0..200 {
            assert!(c.on_window(&window(1_000, 1_000)).limit <= 60);
        }
        for _ in 0..200 {
            assert!(c.on_window(&window(1_000_000, 1_000)).limit >= 20);
        }
    }
}

#[test]
fn app_limited_windows_do_not_grow() {
    let mut c = gradient(100, 10_000);
    let d = c.on_window(&window(10_000, 20));
    assert_eq!(d, Decision { limit: 100, reason: Reason::AppLimited });
    let d = c.on_window(&window(10_000, 90));
    assert_eq!(d.reason, Reason::Grow);
    assert!(d.limit > 100);
    // Half the limit in flight is enough to grow.
    let mut c = gradient(100, 10_000);
    assert_eq!(c.on_window(&window(10_000, 50)).reason, Reason::Grow);
}

#[test]
fn too_few_samples_hold_but_overflow_cuts() {
    let mut c = gradient(100, 10_000);
    let quiet = WindowSample {
        in_flight: 100,
        samples: 3,
        latency_us: 90_000,
        queue_wait_us: 0,
        service_us: 0,
        answered: 0,
        service_mean_us: 0,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 0,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    assert_eq!(c.on_window(&quiet), Decision { limit: 100, reason: Reason::TooFewSamples });
    let overflow = WindowSample { listen_drops: 5, ..quiet };
    assert_eq!(c.on_window(&overflow), Decision { limit: 90, reason: Reason::ListenOverflow });
}

#[test]
fn cooldown_after_a_cut() {
    let mut c = gradient(100, 10_000);
    assert_eq!(c.on_window(&window(20_000, 100)).reason, Reason::LatencyRising);
    for _ in 0..3 {
        assert_eq!(c.on_window(&window(10_000, 100)).reason, Reason::Cooldown);
    }
    assert_eq!(c.on_window(&window(10_000, 100)).reason, Reason::Grow);
}

#[test]
fn baseline_expires_and_is_relearned() {
    let mut c = Controller::new(Settings { algo: Algo::Gradient, probe_windows: 0, ..Settings::default() }, 3);
    c.on_window(&window(1_000, 100));
    assert_eq!(c.baseline_us(), 1_000);
    // A costlier service for longer than the span: the (smoothed) baseline follows it up.
    for _ in 0..200 {
        c.on_window(&window(8_000, 100));
    }
    assert!((7_900..=8_000).contains(&c.baseline_us()), "baseline {}", c.baseline_us());
}

#[test]
fn fixed_keeps_the_operator_limit() {
    let mut c =
        Controller::new(Settings { algo: Algo::Fixed, initial_limit: 7, min_limit: 1, ..Settings::default() }, 0);
    for latency in [1, 1_000_000] {
        assert_eq!(c.on_window(&window(latency, 7)), Decision { limit: 7, reason: Reason::Operator });
    }
}

#[test]
fn the_windowed_minimum_keeps_exactly_its_span() {
    let mut m = WindowedMin { span: 3, values: VecDeque::new(), covered: 0 };
    assert_eq!(m.push(5.0, 1), 5.0);
    assert_eq!(m.push(9.0, 1), 5.0);
    assert_eq!(m.push(7.0, 1), 5.0, "three windows in a span of three: the first still counts");
    assert_eq!(m.push(8.0, 1), 7.0, "the fourth pushes the first out");
    let mut m = WindowedMin { span: 2, values: VecDeque::new(), covered: 0 };
    assert_eq!(m.push(4.0, 5), 4.0, "one value longer than the span is kept (never empty)");
    assert_eq!(m.push(6.0, 1), 6.0);
}

#[test]
fn settings_and_operator_changes_are_kept() {
    let settings =
        Settings { algo: Algo::Gradient, initial_limit: 50, min_limit: 5, max_limit: 80, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    assert_eq!(c.settings().max_limit, 80);
    c.set_limit(70);
    assert_eq!(c.limit(), 70);
    c.set_limit(500);
    assert_eq!(c.limit(), 80, "clamped to max_limit");
    c.reconfigure(Settings { max_limit: 60, ..settings });
    assert_eq!((c.settings().max_limit, c.limit()), (60, 60), "new bounds apply, the limit is clamped");
}

#[test]
fn a_new_algorithm_starts_without_the_old_ones_cooldown() {
    for (to, cooled) in [(Algo::Gradient, true), (Algo::Aimd, false)] {
        let mut c = gradient(100, 10_000);
        assert_eq!(c.on_window(&window(20_000, 100)).reason, Reason::LatencyRising);
        c.reconfigure(Settings { algo: to, ..*c.settings() });
        let d = c.on_window(&window(10_000, 100));
        assert_eq!(d.reason == Reason::Cooldown, cooled, "{to}: {d:?}");
    }
}

#[test]
fn exactly_min_samples_is_enough() {
    let mut c = gradient(100, 10_000);
    let at_min = WindowSample { samples: c.settings().min_samples, ..window(40_000, 100) };
    assert_eq!(c.on_window(&at_min).reason, Reason::LatencyRising);
}

#[test]
fn no_probe_when_probes_are_off() {
    let mut c = Controller::new(Settings { algo: Algo::Gradient, probe_windows: 0, ..Settings::default() }, 3);
    for _ in 0..500 {
        assert_ne!(c.on_window(&window(1_000, 100)).reason, Reason::Probe);
    }
}

#[test]
fn aimd_backs_off_only_past_its_tolerance() {
    let aimd = |observed: u64| {
        let mut c = gradient(100, 10_000);
        c.reconfigure(Settings { algo: Algo::Aimd, ..*c.settings() });
        let tolerance = c.settings().aimd_tolerance;
        assert_eq!(tolerance, 2.0, "the test's latencies assume the default tolerance");
        c.on_window(&window(observed, 100))
    };
    assert_eq!(aimd(20_000), Decision { limit: 101, reason: Reason::Grow }, "at the tolerance: grow");
    assert_eq!(aimd(20_001), Decision { limit: 90, reason: Reason::LatencyRising }, "past it: back off");
}

#[test]
fn at_the_maximum_the_limit_is_steady_even_when_little_is_in_flight() {
    let mut c = gradient(500, 10_000);
    assert_eq!(c.on_window(&window(10_000, 10)), Decision { limit: 500, reason: Reason::Steady });
}

#[test]
fn gradient2_follows_a_slow_average_and_resets_it_on_a_sudden_drop() {
    let settings = Settings { algo: Algo::Gradient2, probe_windows: 0, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    // Warm-up: a plain average of the first ten windows.
    for _ in 0..10 {
        c.on_window(&window(10_000, 100));
    }
    assert_eq!(c.baseline_us(), 10_000);
    // The latency doubles for good: the long average creeps up by 2/601 of the gap
    // a window (held at the baseline while the baseline's span still sees 10 ms):
    // at most 20 - 10 * (1 - 2/601)^300 = 16.3 ms after 300 windows.
    for _ in 0..300 {
        c.on_window(&window(20_000, 100));
    }
    let long = c.baseline_us();
    assert!((12_000..=17_500).contains(&long), "a slow average, far from both: {long}");
    // A sudden drop below half the average: the average moves by 2/601, then is cut by 5%.
    let before = long as f64;
    c.on_window(&window(5_000, 100));
    let factor = 2.0 / (settings.gradient2_long_window + 1.0);
    let expected = (before * (1.0 - factor) + 5_000.0 * factor) * 0.95;
    assert!((c.baseline_us() as f64 - expected).abs() <= 2.0, "{} vs {expected:.0}", c.baseline_us());
}

#[test]
fn queue_cuts_the_excess_queue_and_grows_gently_below_its_target() {
    let settings = Settings { algo: Algo::Queue, initial_limit: 40, cooldown_windows: 0, ..Settings::default() };
    let sample = |queue_wait_us: u64, in_flight: u64| WindowSample {
        in_flight,
        samples: 100, // over a 0.1 s window: 1,000 requests/s
        latency_us: 50_000,
        queue_wait_us,
        service_us: 0,
        // Answered in 1 ms each: the service keeps up (no queue inside).
        answered: 100,
        service_mean_us: 1_000,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 0,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    // 25 ms against a 5 ms target at 1,000/s: 20 requests queued too many, a quarter of them removed.
    let mut c = Controller::new(settings, 0);
    assert_eq!(c.on_window(&sample(25_000, 40)), Decision { limit: 35, reason: Reason::LatencyRising });
    // A huge excess cuts at most half the limit in one window.
    assert_eq!(c.on_window(&sample(2_000_000, 35)).limit, 18);
    // A slow service raises the target to 3/4 of its median service time: 25 ms
    // of queue for a 60 ms service is no excess.
    let mut c = Controller::new(settings, 0);
    let slow = WindowSample { service_us: 60_000, ..sample(25_000, 40) };
    assert_eq!(c.on_window(&slow).reason, Reason::Grow);
    // And no higher: for a 30 ms service the target is 22.5 ms, so 25 ms is 2.5 ms
    // of excess at 1,000/s, 2.5 requests, a quarter of them off.
    let mut c = Controller::new(settings, 0);
    let d = c.on_window(&WindowSample { service_us: 30_000, ..sample(25_000, 40) });
    assert_eq!(d.reason, Reason::LatencyRising, "{d:?}");
    assert!((c.limit - (40.0 - 0.25 * 2.5)).abs() < 1e-9, "{}", c.limit);
    // At the target or under, with in-flight pressing the limit: + sqrt(limit) / 2, at least 1.
    let mut c = Controller::new(Settings { initial_limit: 16, ..settings }, 0);
    assert_eq!(c.on_window(&sample(5_000, 16)), Decision { limit: 18, reason: Reason::Grow });
    assert_eq!(c.on_window(&sample(0, 18)).limit, 20);
    // App-limited: no growth, however short the queue.
    assert_eq!(c.on_window(&sample(0, 5)).reason, Reason::AppLimited);
    // A service that is merely slow (long service, no queue) is not overload: latency alone never cuts.
    let d = c.on_window(&WindowSample { latency_us: 10_000_000, ..sample(1_000, 20) });
    assert!(d.limit >= 20, "{d:?}");
    // The operator's target is honoured.
    let mut c = Controller::new(Settings { queue_target_us: 30_000.0, ..settings }, 0);
    assert_eq!(c.on_window(&sample(25_000, 40)).reason, Reason::Grow);
    // No answers judged (a server that reads at once picks every request up,
    // and answers none yet): the kernel's empty queue is no reason to grow.
    let mut c = Controller::new(settings, 0);
    let unanswered = WindowSample { answered: 0, service_mean_us: 0, ..sample(0, 40) };
    assert_eq!(c.on_window(&unanswered), Decision { limit: 40, reason: Reason::Steady });
    assert_eq!(c.on_window(&sample(0, 40)).reason, Reason::Grow, "the same window with answers grows");
}

#[test]
fn queue_never_probes() {
    let mut c = Controller::new(Settings { algo: Algo::Queue, probe_windows: 5, ..Settings::default() }, 0);
    for _ in 0..1_000 {
        assert_ne!(c.on_window(&window(10_000, 100)).reason, Reason::Probe);
    }
}

/// A burst's window: the limit turned clients away, yet in-flight has
/// drained below half the limit by the window's end.
fn burst_window(latency_us: u64, rejected: u64) -> WindowSample {
    WindowSample { rejected, ..window(latency_us, 10) }
}

#[test]
fn rejections_show_the_limit_pressed_when_in_flight_has_drained() {
    let settings = Settings { algo: Algo::Gradient, probe_windows: 0, cooldown_windows: 0, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    for _ in 0..5 {
        c.on_window(&window(10_000, 100));
    }
    let before = c.limit();
    assert_eq!(c.on_window(&burst_window(10_000, 0)).reason, Reason::AppLimited, "nothing turned away: app-limited");
    let d = c.on_window(&burst_window(10_000, 30));
    assert_eq!(d.reason, Reason::Grow, "turned clients away with latency at the baseline: grow");
    assert!(d.limit > before);
}

/// Windows of a service answering 200 requests/s with a queue (every worker
/// busy), 20 ms each, from a burst of `in_flight` that the limit cut at `rejected`.
fn draining(queue_wait_us: u64, in_flight: u64, rejected: u64) -> WindowSample {
    WindowSample {
        in_flight,
        samples: 20,
        latency_us: queue_wait_us + 20_000,
        queue_wait_us,
        service_us: 20_000,
        answered: 20,
        service_mean_us: 20_000,
        listen_drops: 0,
        rejected,
        windows: 1,
        elapsed_us: 100_000,
        abandoned: 0,
        abandoned_age_us: 0,
    }
}

#[test]
fn an_objective_sets_the_limit_the_service_drains_within_it() {
    for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue] {
        let settings = Settings { algo, initial_limit: 40, objective_us: 1e6, ..Settings::default() };
        let mut c = Controller::new(settings, 0);
        // A burst: 40 admitted, 360 turned away; then it drains at 200/s.
        c.on_window(&draining(50_000, 40, 360));
        for (wait, left) in [(100_000, 20), (150_000, 1)] {
            c.on_window(&draining(wait, left, 0));
        }
        // The next burst presses the limit: it becomes 200/s x (97% of 1 s - 20 ms) = 190.
        let d = c.on_window(&draining(50_000, 40, 360));
        assert_eq!(d.limit, 190, "{algo}: {d:?}");
        // Requests waiting past what the objective leaves: the limit comes down.
        let d = c.on_window(&draining(990_000, 190, 0));
        assert!(d.limit < 190, "{algo}: missed the objective, cut: {d:?}");
        // An objective bounds latency instead of a learned baseline: no probe.
        for _ in 0..300 {
            assert_ne!(c.on_window(&draining(100_000, 150, 10)).reason, Reason::Probe, "{algo}");
        }
    }
}

#[test]
fn until_the_rate_is_known_the_limit_doubles_while_the_objective_is_met() {
    let settings = Settings {
        algo: Algo::Gradient,
        initial_limit: 40,
        objective_us: 1e6,
        cooldown_windows: 0,
        ..Settings::default()
    };
    let mut c = Controller::new(settings, 0);
    c.on_window(&window(10_000, 10));
    // Latency 25x the baseline but within the objective, no queue to measure a rate in:
    // not pressed, held; pressed, doubled (as slow start).
    assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..window(250_000, 10) }).limit, 40);
    assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..window(250_000, 40) }).limit, 80);
    assert_eq!(c.on_window(&WindowSample { queue_wait_us: 0, ..burst_window(250_000, 5) }).limit, 160);
    // Past the objective: the gradient cuts as it would without one.
    assert!(c.on_window(&window(2_000_000, 160)).limit < 160);
}

#[test]
fn a_probe_that_falls_on_a_slowdown_returns_scaled_by_what_it_saw() {
    let settings = Settings { algo: Algo::Gradient, initial_limit: 100, probe_windows: 3, ..Settings::default() };
    let to_probe = |latency_us: u64| {
        let mut c = Controller::new(settings, 0);
        while c.on_window(&window(latency_us, 100)).reason != Reason::Probe {}
        c
    };
    // The service slows 2x during the probe (a quarter of the limit in flight):
    // the limit returns at half, as the gradient would cut it next.
    let mut c = to_probe(10_000);
    let before = c.before_probe;
    // Its first window still answers requests admitted before the change.
    for latency_us in [10_000, 20_000, 20_000] {
        c.on_window(&window(latency_us, 25));
    }
    assert_eq!(c.limit(), (before * 0.5).round() as u32, "returned scaled by 10 ms / 20 ms");
    // The probe drained a standing queue (it saw half the latency): the old
    // limit; the baseline it lowered does the rest.
    let mut c = to_probe(20_000);
    let before = c.before_probe;
    for _ in 0..3 {
        c.on_window(&window(10_000, 25));
    }
    assert_eq!(c.limit(), before.round() as u32);
}

#[test]
fn raw_codes_round_trip() {
    for algo in [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Fixed, Algo::Queue] {
        assert_eq!(Algo::from_raw(algo.to_raw()), algo);
    }
    for r in 0..9 {
        assert_eq!(Reason::from_raw(r).to_raw(), r);
    }
}

proptest! {
    #[test]
    fn no_nan_or_overflow_on_any_sample(
        algo in prop::sample::select(vec![Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue]),
        samples in prop::collection::vec((0u64..=u64::MAX, 0u64..=u64::MAX, 0u64..=u64::MAX, 0u64..3), 1..200),
    ) {
        let settings = Settings { algo, min_limit: 1, max_limit: u32::MAX, ..Settings::default() };
        let mut c = Controller::new(settings, 9);
        for (latency_us, samples, in_flight, drops) in samples {
            let d = c.on_window(&WindowSample { in_flight, samples, latency_us, queue_wait_us: latency_us / 2, service_us: 0, answered: 0, service_mean_us: 0, listen_drops: drops, rejected: 0, windows: 1, elapsed_us: 0, abandoned: 0, abandoned_age_us: 0 });
            prop_assert!(d.limit >= 1);
            prop_assert!(c.limit.is_finite() && c.baseline_us.is_finite() && c.long_us.is_finite());
        }
    }
}

/// Netflix concurrency-limits' own trajectories (tests/data/netflix-limits,
/// produced by its Gradient2Limit and AIMDLimit classes), one row per window:
/// (rtt us, saturated or app-limited, drop, limit with min 20, limit with min 4).
fn reference(csv: &str) -> Vec<(u64, bool, bool, u32, u32)> {
    csv.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            (f[1].parse().unwrap(), f[2] == "L", f[3] == "1", f[4].parse().unwrap(), f[5].parse().unwrap())
        })
        .collect()
}

const SCENARIOS: [(&str, Algo, &str); 9] = [
    ("a_steady", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/a_steady_gradient2.csv")),
    ("b_step", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/b_step_gradient2.csv")),
    ("c_drops", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/c_drops_gradient2.csv")),
    ("d_applimited", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/d_applimited_gradient2.csv")),
    ("e_longstep", Algo::Gradient2, include_str!("../../../tests/data/netflix-limits/e_longstep_gradient2.csv")),
    ("a_steady", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/a_steady_aimd.csv")),
    ("b_step", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/b_step_aimd.csv")),
    ("c_drops", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/c_drops_aimd.csv")),
    ("d_applimited", Algo::Aimd, include_str!("../../../tests/data/netflix-limits/d_applimited_aimd.csv")),
];

/// shed's limiter as the reference runs: its guards off (one sample is
/// enough, no cooldown, no probe) and every named departure off.
fn as_reference(algo: Algo, min_limit: u32) -> Settings {
    Settings {
        algo,
        initial_limit: 20,
        min_limit,
        max_limit: 200,
        min_samples: 1,
        cooldown_windows: 0,
        probe_windows: 0,
        // AIMDLimit cuts on drops and on a 5 s timeout only, never on latency.
        aimd_tolerance: f64::INFINITY,
        listen_drops_cut: algo == Algo::Aimd,
        cut_while_app_limited: false,
        gradient2_long_at_most_baseline: false,
        ..Settings::default()
    }
}

/// Replays a reference input window by window; returns the limit after each
/// window as the reference publishes it (truncated) and the reference's own.
fn replay(settings: Settings, rows: &[(u64, bool, bool, u32, u32)]) -> Vec<(u32, u32)> {
    let mut c = Controller::new(settings, 0);
    let mut published = settings.initial_limit;
    rows.iter()
        .map(|&(rtt_us, saturated, drop, min20, min4)| {
            // In-flight as the reference was fed it: its published limit, or just under half of it.
            let in_flight = if saturated { published } else { published.div_ceil(2) - 1 };
            c.on_window(&WindowSample {
                in_flight: u64::from(in_flight),
                samples: 100,
                latency_us: rtt_us,
                queue_wait_us: 0,
                service_us: 0,
                answered: 0,
                service_mean_us: 0,
                listen_drops: u64::from(drop),
                rejected: 0,
                windows: 1,
                elapsed_us: 0,
                abandoned: 0,
                abandoned_age_us: 0,
            });
            published = if settings.min_limit == 20 { min20 } else { min4 };
            (c.limit.trunc() as u32, published)
        })
        .collect()
}

#[test]
fn gradient2_and_aimd_match_netflix_concurrency_limits_with_the_departures_off() {
    for (name, algo, csv) in SCENARIOS {
        let rows = reference(csv);
        for min_limit in [20, 4] {
            for (window, (ours, theirs)) in replay(as_reference(algo, min_limit), &rows).into_iter().enumerate() {
                assert_eq!(ours, theirs, "{name} {algo} min {min_limit}: window {}", window + 1);
            }
        }
    }
}

#[test]
fn each_named_departure_from_the_reference_shows_where_it_should() {
    let departs = |algo: Algo, scenario: &str, change: fn(&mut Settings)| -> usize {
        let (_, _, csv) = SCENARIOS.iter().find(|(n, a, _)| *n == scenario && *a == algo).unwrap();
        let mut settings = as_reference(algo, 4);
        change(&mut settings);
        replay(settings, &reference(csv)).iter().filter(|(ours, theirs)| ours != theirs).count()
    };
    // gradient2 cutting on listen drops: only the scenario with drops departs.
    let drops: fn(&mut Settings) = |s| s.listen_drops_cut = true;
    assert!(departs(Algo::Gradient2, "c_drops", drops) > 0);
    assert_eq!(departs(Algo::Gradient2, "b_step", drops), 0);
    // Cutting while app-limited: the app-limited step departs, the saturated one does not.
    let app: fn(&mut Settings) = |s| s.cut_while_app_limited = true;
    assert!(departs(Algo::Gradient2, "d_applimited", app) > 0);
    assert_eq!(departs(Algo::Gradient2, "b_step", app), 0);
    // The long average held at the baseline: a long slow spell is never learned as normal.
    let held: fn(&mut Settings) = |s| s.gradient2_long_at_most_baseline = true;
    assert!(departs(Algo::Gradient2, "e_longstep", held) > 0);
    assert_eq!(departs(Algo::Gradient2, "a_steady", held), 0);
    // shed's aimd cuts on latency (2x the baseline), the reference only on drops and timeouts.
    let latency: fn(&mut Settings) = |s| s.aimd_tolerance = 2.0;
    assert!(departs(Algo::Aimd, "b_step", latency) > 0);
    assert_eq!(departs(Algo::Aimd, "c_drops", latency), 0);
}

#[test]
fn a_probe_ends_on_thin_windows_and_keeps_a_cut_that_lands_in_it() {
    let settings = Settings { algo: Algo::Gradient, initial_limit: 100, probe_windows: 3, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    // Run up to the first probe.
    let mut d = c.on_window(&window(10_000, 100));
    while d.reason != Reason::Probe {
        d = c.on_window(&window(10_000, 100));
    }
    let before = c.before_probe;
    assert_eq!(d.limit, (before * PROBE_DEPTH).round() as u32);
    // Thin windows (sparse traffic) still count toward the probe, and a
    // listen-queue overflow during it cuts the limit the probe returns to.
    let thin = WindowSample { samples: 0, ..window(10_000, 10) };
    assert_eq!(c.on_window(&WindowSample { listen_drops: 3, ..thin }).reason, Reason::Probe);
    assert_eq!(c.on_window(&thin).reason, Reason::Probe);
    let end = c.on_window(&thin);
    assert_eq!(end.reason, Reason::Probe);
    assert_eq!(end.limit, (before * settings.backoff).round() as u32, "the probe ended after 3 windows, the cut kept");
    assert_ne!(c.on_window(&thin).reason, Reason::Probe, "and is over");
}

#[test]
fn settings_come_from_the_operators_config_and_zero_keeps_the_default() {
    let d = Settings::default();
    let given = ControlConfig {
        algo: Algo::Gradient2.to_raw(),
        min_limit: 7,
        max_limit: 700,
        window_ms: 250,
        min_samples: 33,
        cooldown_windows: 4,
        baseline_windows: 50,
        probe_windows: 6,
        queue_target_us: 1_500,
        target_latency_ms: 80,
        ..ControlConfig::default()
    };
    let s = Settings::from_config(&given, 42);
    assert_eq!((s.algo, s.initial_limit, s.min_limit, s.max_limit), (Algo::Gradient2, 42, 7, 700));
    assert_eq!((s.min_samples, s.cooldown_windows, s.baseline_windows, s.probe_windows), (33, 4, 50, 6));
    assert_eq!((s.window_s, s.objective_us, s.queue_target_us), (0.25, 80_000.0, 1_500.0));
    assert_eq!((s.smoothing, s.backoff), (d.smoothing, d.backoff), "what the map does not carry: the defaults");

    // A map written before a field existed holds 0 there: the default, not 0.
    let s = Settings::from_config(&ControlConfig { algo: Algo::Aimd.to_raw(), ..ControlConfig::default() }, 9);
    assert_eq!(
        (s.min_samples, s.baseline_windows, s.queue_target_us),
        (d.min_samples, d.baseline_windows, d.queue_target_us)
    );
    assert_eq!((s.min_limit, s.max_limit), (1, 1), "bounds are at least 1, the maximum at least the minimum");
    assert_eq!((s.window_s, s.objective_us, s.cooldown_windows, s.probe_windows), (0.001, 0.0, 0, 0));
    let crossed = ControlConfig { algo: Algo::Queue.to_raw(), min_limit: 20, max_limit: 5, ..ControlConfig::default() };
    assert_eq!((Settings::from_config(&crossed, 9).min_limit, Settings::from_config(&crossed, 9).max_limit), (20, 20));

    // The adaptive bounds do not hold an operator's fixed limit.
    let fixed = Settings::from_config(&ControlConfig { algo: Algo::Fixed.to_raw(), ..given }, 5_000);
    assert_eq!((fixed.algo, fixed.min_limit, fixed.max_limit), (Algo::Fixed, 1, shed_common::MAX_LIMIT));
}

#[test]
fn every_reason_and_algorithm_has_its_own_name_and_help() {
    assert_eq!(Reason::LatencyRising.name(), "latency_rising");
    assert_eq!(Reason::TooFewSamples.name(), "too_few_samples");
    assert_eq!(Reason::ServiceQueue.name(), "service_queue");
    let names: std::collections::BTreeSet<String> = (0..10).map(|r| Reason::from_raw(r).name()).collect();
    assert_eq!(names.len(), 10, "{names:?}");
    let helps: std::collections::BTreeSet<&str> =
        <Algo as crate::named::Named>::ALL.iter().map(|a| crate::named::Named::help(*a)).collect();
    assert_eq!(helps.len(), <Algo as crate::named::Named>::ALL.len(), "{helps:?}");
    assert!(helps.iter().all(|h| h.len() > 20), "{helps:?}");
    assert!(crate::named::Named::help(Algo::Queue).contains("queue"), "{}", crate::named::Named::help(Algo::Queue));
}

#[test]
fn jitter_comes_from_splitmix64() {
    // SplitMix64's published first outputs from state 0.
    assert_eq!(splitmix(0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(splitmix(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    assert_eq!(splitmix(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(2)), 0x06c4_5d18_8009_454f);
}

#[test]
fn gradient2_averages_its_first_ten_samples_then_decays_exponentially() {
    let settings = Settings { algo: Algo::Gradient2, gradient2_long_at_most_baseline: false, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    for _ in 0..10 {
        c.propose_gradient2(100.0);
    }
    assert!((c.long_us - 100.0).abs() < 1e-9, "{}", c.long_us);
    c.propose_gradient2(1_100.0);
    let factor = 2.0 / (settings.gradient2_long_window + 1.0);
    let want = 100.0 * (1.0 - factor) + 1_100.0 * factor;
    assert!((c.long_us - want).abs() < 1e-9, "the eleventh sample is exponential: {} vs {want}", c.long_us);
}

#[test]
fn the_served_rate_is_the_median_of_its_last_span_windows() {
    let mut rate = guards::ServedRate { span: 3, rates: std::collections::VecDeque::new() };
    assert_eq!(rate.rate(), 0.0, "nothing seen yet");
    for r in [50.0, 1.0, 2.0, 3.0, 40.0] {
        rate.push(r);
    }
    assert_eq!(rate.rates, [2.0, 3.0, 40.0], "exactly the last three");
    assert_eq!(rate.rate(), 3.0);
}

#[test]
fn the_objective_measures_the_served_rate_only_over_queued_busy_windows() {
    let settings = Settings { algo: Algo::Queue, objective_us: 100_000.0, ..Settings::default() };
    let sample = |queue_wait_us: u64, in_flight: u64| WindowSample {
        in_flight,
        samples: 200,
        latency_us: 150_000,
        queue_wait_us,
        service_us: 10_000,
        answered: 200,
        service_mean_us: 10_000,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 200_000,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    let wait_us = 0.97 * 100_000.0 - 10_000.0;
    // 200 requests in 0.2 s (not the 0.1 s window): 1,000/s; 87 ms of wait: 87.
    let mut c = Controller::new(settings, 0);
    c.objective(&sample(5_000, 3), 1, None);
    let o = c.objective(&sample(5_000, 3), 1, None).unwrap();
    assert_eq!((o.wait_us, o.limit), (wait_us, 87.0), "queued (wait at half the service time), busy at both ends");
    assert!(o.met, "queue's objective is the queue wait, not the latency");

    let mut c = Controller::new(settings, 0);
    c.objective(&sample(5_000, 3), 1, None);
    assert_eq!(
        c.objective(&sample(4_999, 3), 1, None).unwrap().limit,
        0.0,
        "a wait under half the service: not queued"
    );
    let mut c = Controller::new(settings, 0);
    c.objective(&sample(5_000, 0), 1, None);
    assert_eq!(c.objective(&sample(5_000, 3), 1, None).unwrap().limit, 0.0, "idle when the window began");
    let mut c = Controller::new(settings, 0);
    c.objective(&sample(5_000, 3), 1, None);
    assert_eq!(c.objective(&sample(5_000, 0), 1, None).unwrap().limit, 0.0, "idle when it ended");
    assert!(!c.objective(&sample(90_000, 3), 1, None).unwrap().met, "a wait past the objective's");

    let mut other = Controller::new(Settings { algo: Algo::Gradient, ..settings }, 0);
    assert!(!other.objective(&sample(0, 3), 1, None).unwrap().met, "the others follow the latency: 150 ms > 97 ms");
    let on_time = WindowSample { latency_us: 97_000, ..sample(0, 3) };
    assert!(other.objective(&on_time, 1, None).unwrap().met, "97% of the objective is in time");
    assert!(!other.objective(&WindowSample { latency_us: 97_001, ..on_time }, 1, None).unwrap().met);
    let none = Controller::new(Settings { objective_us: 0.0, ..settings }, 0).objective(&sample(0, 3), 1, None);
    assert!(none.is_none(), "no objective set");
}

#[test]
fn the_objective_sees_the_queue_inside_a_server_that_reads_at_once() {
    let settings = Settings { algo: Algo::Queue, objective_us: 100_000.0, ..Settings::default() };
    // No wait in the kernel; the service held 30 at 1,000/s where its knee is 10:
    // 20 requests waited inside, 20 ms each (Little's law).
    let sample = WindowSample {
        in_flight: 30,
        samples: 100,
        latency_us: 30_000,
        queue_wait_us: 0,
        service_us: 30_000,
        answered: 100,
        service_mean_us: 30_000,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 100_000,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    let held = Held { in_service: 30.0, knee: 10.0, rate: 1_000.0, shortest_us: 10_000.0 };
    assert_eq!(held.waiting(), 20.0);
    assert_eq!(held.wait_us(), 20_000.0);
    let mut c = Controller::new(settings, 0);
    c.objective(&sample, 1, Some(held));
    let o = c.objective(&sample, 1, Some(held)).unwrap();
    // The service is its shortest time (10 ms, not the window's 30 ms): 87 ms
    // of wait at the 1,000/s it kept up while it held a queue inside.
    assert_eq!((o.wait_us, o.limit), (87_000.0, 87.0));
    assert!(o.met, "20 ms inside is within 87 ms");
    let long = Held { in_service: 120.0, ..held };
    assert!(!c.objective(&sample, 1, Some(long)).unwrap().met, "110 ms inside is past it");
    // Without a queue inside (held at the knee) the rate is not the one it keeps up.
    let mut c = Controller::new(settings, 0);
    let at_knee = Held { in_service: 10.0, ..held };
    c.objective(&sample, 1, Some(at_knee));
    assert_eq!(c.objective(&sample, 1, Some(at_knee)).unwrap().limit, 0.0);
}

#[test]
fn a_queue_inside_is_probed_only_past_the_objective_and_held_through_overflows() {
    // 12 workers x 10 ms, then 48 held (36 waiting inside, 30 ms each at
    // 1,200/s) while clients are turned away: a drain probe is due. Within an
    // objective that admits 30 ms of waiting the bursts it lets in would be
    // turned away by a probe, so none starts; past it, or without one, it does.
    let served = |service_mean_us: u64, in_flight: u64, rejected: u64| WindowSample {
        in_flight,
        samples: 120,
        latency_us: service_mean_us,
        queue_wait_us: 0,
        service_us: service_mean_us,
        answered: 120,
        service_mean_us,
        listen_drops: 0,
        rejected,
        windows: 1,
        elapsed_us: 100_000,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    let windows = |objective_us: f64| {
        let settings = Settings {
            algo: Algo::Queue,
            initial_limit: 40,
            min_limit: 1,
            objective_us,
            cooldown_windows: 0,
            ..Settings::default()
        };
        let mut c = Controller::new(settings, 0);
        let first = c.on_window(&served(10_000, 12, 0));
        assert_ne!(first.reason, Reason::Probe, "nothing held above the knee yet");
        (c.on_window(&served(40_000, 48, 5)), c, first.limit)
    };
    assert_ne!(windows(1_000_000.0).0.reason, Reason::Probe, "30 ms inside is within a 1 s objective");
    assert_eq!(windows(20_000.0).0.reason, Reason::Probe, "past a 20 ms objective");
    let (start, mut c, before) = windows(0.0);
    assert_eq!(start, Decision { limit: 6, reason: Reason::Probe }, "no objective: half the knee of 12");
    // The queue does not drain (45 held): the probe holds its limit through
    // listen-queue overflows, and the window that ends it cuts the limit it
    // returns to.
    let overflowing = WindowSample { listen_drops: 3, ..served(40_000, 45, 0) };
    let mut held = 0;
    loop {
        let d = c.on_window(&overflowing);
        assert_eq!(d.reason, Reason::Probe);
        if !c.stage.probing() {
            assert_eq!(d.limit, (f64::from(before) * c.settings().backoff).round() as u32, "ended: cut");
            break;
        }
        assert_eq!(d.limit, 6, "under way: held, overflow or not");
        held += 1;
        assert!(held < 100, "the probe never ended");
    }
    assert!(held >= 1, "held for a window before it ended");
}

#[test]
fn the_queue_inside_is_cut_past_three_quarters_of_its_shortest_service() {
    let settings = Settings { algo: Algo::Queue, initial_limit: 40, ..Settings::default() };
    // 120 answers in 0.1 s; 48 held inside where 12 are in service: 36 wait.
    // The window's service (40 ms) is what the queue inside made of the
    // shortest (20 ms): the target inside follows the shortest.
    let held = Held { in_service: 48.0, knee: 12.0, rate: 1_200.0, shortest_us: 20_000.0 };
    let window = |queue_wait_us: u64| WindowSample {
        in_flight: 48,
        samples: 120,
        latency_us: 80_000,
        queue_wait_us,
        service_us: 40_000,
        answered: 120,
        service_mean_us: 40_000,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 100_000,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    assert!(settings.queue_target_us < 15_000.0, "the test needs the service's part to be the target");
    // Three quarters of 20 ms may wait: 15 ms at 1,200/s is 18 requests, so
    // 18 are in excess, a quarter of them cut.
    let mut c = Controller::new(settings, 0);
    assert_eq!(c.propose_queue(&window(0), 1, None, Some(held)), 40.0 - 0.25 * 18.0);
    assert!(c.inside_cut, "the queue inside decided the cut");
    // The same excess in the kernel (45 ms waited, 15 ms of it beyond its
    // target of three quarters of the window's service, at 1,200/s): a tie
    // is the kernel's queue.
    let mut c = Controller::new(settings, 0);
    assert_eq!(c.propose_queue(&window(45_000), 1, None, Some(held)), 40.0 - 0.25 * 18.0);
    assert!(!c.inside_cut, "a tie is not the queue inside");
    let mut c = Controller::new(settings, 0);
    c.propose_queue(&window(46_000), 1, None, Some(held));
    assert!(!c.inside_cut, "more in the kernel");
}

/// An objective is a bound: once windows in which requests queued throughout
/// measured the rate the service keeps up, in-flight past `rate x 97% of the
/// objective` is cut to it in the next window, whatever the other signals say
/// (Little's law: more cannot all be answered within it).
#[test]
fn an_objective_bounds_in_flight_by_the_rate_times_the_objective() {
    let settings = Settings {
        algo: Algo::Queue,
        initial_limit: 1_000,
        objective_us: 1_000_000.0,
        cooldown_windows: 0,
        ..Settings::default()
    };
    let mut c = Controller::new(settings, 0);
    // 200 answers a second, each waiting 50 ms unread (a queue throughout).
    let queued = |in_flight: u64| WindowSample {
        in_flight,
        samples: 20,
        latency_us: 55_000,
        queue_wait_us: 50_000,
        service_us: 5_000,
        answered: 20,
        service_mean_us: 5_000,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us: 100_000,
        abandoned: 0,
        abandoned_age_us: 0,
    };
    assert_eq!(c.work_bound(), None, "no rate measured yet: the initial limit applies");
    for _ in 0..3 {
        c.on_window(&queued(100));
    }
    let bound = c.work_bound().expect("the rate is measured");
    assert!((bound - 194.0).abs() < 1e-6, "200/s x 0.97 s: {bound}");
    c.set_limit(1_000);
    assert_eq!(c.on_window(&queued(500)), Decision { limit: 194, reason: Reason::WorkBound });
    // At or under the bound in flight: no such cut.
    c.set_limit(1_000);
    assert_ne!(c.on_window(&queued(194)).reason, Reason::WorkBound);
}

/// A window of a server that reads every request at once: no wait in the
/// kernel, `answered` answers of `mean_us` each (their wait inside included).
fn read_at_once(answered: u64, mean_us: u64, in_flight: u64, elapsed_us: u64) -> WindowSample {
    WindowSample {
        in_flight,
        samples: answered,
        latency_us: mean_us,
        queue_wait_us: 0,
        service_us: mean_us,
        answered,
        service_mean_us: mean_us,
        listen_drops: 0,
        rejected: 0,
        windows: 1,
        elapsed_us,
        abandoned: 0,
        abandoned_age_us: 0,
    }
}

/// Without an objective the bound applies only while answers show a queue
/// inside the service, from the rate it answers at then: the knee plus the
/// wait the queue target allows, at least one request over the knee.
#[test]
fn the_work_bound_cuts_a_service_holding_a_queue_inside_at_once() {
    let settings = Settings { algo: Algo::Queue, initial_limit: 100, cooldown_windows: 0, ..Settings::default() };
    let mut c = Controller::new(settings, 0);
    // 4 workers x 100 ms read at once: 40/s. The first answers (10 over 0.25 s)
    // took 100 ms: the knee, 4, and no queue yet, so no bound.
    c.on_window(&read_at_once(10, 100_000, 30, 250_000));
    assert_eq!(c.work_bound(), None, "the service keeps up: no bound");
    // Then 10 answers over 0.25 s that each took 500 ms: 20 held against a knee
    // of 4, a queue inside. The bound: 4 + 40/s x 75 ms = 7.
    let d = c.on_window(&read_at_once(10, 500_000, 30, 250_000));
    assert_eq!(d.reason, Reason::ServiceQueue, "the window that shows the queue cuts a share of it");
    let bound = c.work_bound().expect("a queue inside");
    assert!((bound - 7.0).abs() < 1e-6, "{bound}");
    // The next window, though it has no answer to judge: 30 in flight past 7.
    let d = c.on_window(&read_at_once(0, 0, 30, 100_000));
    assert_eq!(d, Decision { limit: 7, reason: Reason::WorkBound }, "cut to the bound at once");
    // Abandoned requests alone (clients gave up, nothing answered) still judge
    // a window: held work at their age, no rate.
    let gone = WindowSample {
        answered: 0,
        service_mean_us: 0,
        samples: 0,
        abandoned: 10,
        abandoned_age_us: 1_000_000,
        ..read_at_once(0, 0, 7, 100_000)
    };
    assert_ne!(c.on_window(&gone).reason, Reason::Grow, "clients giving up is no reason to grow");
}

#[test]
fn a_thin_window_after_a_burst_keeps_the_objectives_limit_at_the_shortest_service() {
    // Go net/http, 4 workers x 20 ms (200/s), read at once: a burst of 190 is
    // answered over a second, each answer's service holding its wait inside.
    // The burst's last window answers too few to judge, at a service of half a
    // second: the objective's wait is still 1 s less the shortest service, so
    // the next burst is admitted as this one was (it once halved the limit).
    let settings = Settings {
        algo: Algo::Queue,
        objective_us: 1_000_000.0,
        initial_limit: 190,
        max_limit: 200,
        ..Settings::default()
    };
    let mut c = Controller::new(settings, 0);
    for second in 0..3 {
        let mut in_flight = 190;
        // The burst read at once, then answered 20 a window.
        c.on_window(&WindowSample { samples: 190, ..read_at_once(0, 0, in_flight, 100_000) });
        for step in 1..9u64 {
            in_flight -= 20;
            c.on_window(&read_at_once(20, 55_000 + (step - 1) * 110_000, in_flight, 100_000));
        }
        let before = c.limit();
        // Eight answered, three gave up: enough to judge, too few for a mean.
        let last = read_at_once(8, 900_000, 0, 100_000);
        let d = c.on_window(&WindowSample { abandoned: 3, abandoned_age_us: 1_000_000, ..last });
        assert!(d.limit >= 170, "burst {second}: {before} -> {d:?}");
    }
}
