// SPDX-License-Identifier: MIT OR Apache-2.0
//! A deterministic discrete-event simulation of a gated service, to test the
//! controllers against known capacity: a server with a fixed number of
//! workers and exponential service times, open-loop Poisson arrivals (or
//! synchronized bursts: each second's arrivals at once), clients
//! with a deadline, and the gate admitting while in-system < limit. The
//! controller sees exactly what the daemon sees: a latency percentile of the
//! requests completed in each window, and in-flight at its end.
use std::{cmp::Reverse, collections::BinaryHeap, collections::VecDeque};

use shed_common::{PortConfig, tier};

use crate::control::{Algo, Controller, Reason, Settings, WindowSample, reserve::TierHoldBack, splitmix};

const NS: f64 = 1e9;

#[derive(Clone, Debug)]
pub(super) struct SimConfig {
    pub workers: usize,
    /// Mean service time, seconds.
    pub mean_service: f64,
    /// Offered load as a multiple of capacity (workers / mean_service).
    pub load: f64,
    /// Client deadline, seconds: answers later than this are not goodput.
    pub deadline: f64,
    /// Simulated seconds.
    pub duration: f64,
    /// Results are measured from this time on (after warm-up).
    pub measure_from: f64,
    /// Control window, seconds.
    pub window: f64,
    /// Percentile of sojourn time the controller follows (0-100).
    pub percentile: f64,
    /// `None`: no gate at all.
    pub gate: Option<Settings>,
    /// At this time, multiply the mean service time by this factor.
    pub service_step: Option<(f64, f64)>,
    /// Fractions of arrivals from critical, normal and low clients (None: all normal, untiered).
    pub tier_mix: Option<[f64; 3]>,
    /// Each second's arrivals all at once, at the start of the second (as
    /// synchronized clients, or a load generator's rate period), instead of Poisson.
    pub bursts: bool,
    /// The server reads every request at once and queues it inside (a thread or
    /// goroutine per connection waiting for one of the workers): the kernel sees
    /// no queue wait, only a longer service time. Otherwise a worker reads a
    /// request only when it is free, and the queue waits unread in the socket.
    pub reads_at_once: bool,
    /// Clients close their connection at the deadline, as real ones do: the
    /// request leaves the gate's count then (its connection is gone) while the
    /// server still works on it (a handler that does not watch its client), and
    /// its late answer leaves no sample. The window sees it as abandoned, with
    /// its age. Otherwise a late answer is a sample like any other.
    pub abandon: bool,
    /// Each request's service time is exactly the mean (a sleep, as the real
    /// test servers have) instead of exponential.
    pub fixed_service: bool,
    /// At each (time, workers), the server has that many workers from then on
    /// (workers lost and back: a failed dependency, a restarted pool).
    pub worker_steps: Vec<(f64, usize)>,
    pub seed: u64,
}

impl SimConfig {
    pub(super) fn new(load: f64, gate: Option<Settings>) -> Self {
        Self {
            workers: 8,
            mean_service: 0.010,
            load,
            deadline: 1.0,
            duration: 60.0,
            measure_from: 20.0,
            window: 0.1,
            percentile: 90.0,
            gate,
            service_step: None,
            tier_mix: None,
            bursts: false,
            reads_at_once: false,
            abandon: false,
            fixed_service: false,
            worker_steps: Vec::new(),
            seed: 42,
        }
    }

    pub(super) fn capacity(&self) -> f64 {
        self.workers as f64 / self.mean_service
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct SimResult {
    /// Answers within the deadline per second, over the measured period.
    pub goodput: f64,
    /// Initial capacity, requests per second.
    pub capacity: f64,
    /// p99 sojourn of answered requests (measured period), seconds.
    pub admitted_p99: f64,
    pub admitted_p50: f64,
    pub rejected: u64,
    pub late: u64,
    /// The limit at the end of each window.
    pub limits: Vec<u32>,
    /// Whether each window was a baseline probe (deliberate dips, excluded from the band checks).
    pub probes: Vec<bool>,
    /// Per tier (exempt, critical, normal, low), over the measured period: arrivals and answers within the deadline.
    pub tier_demand: [u64; tier::COUNT],
    pub tier_good: [u64; tier::COUNT],
}

impl SimResult {
    pub(super) fn goodput_fraction(&self) -> f64 {
        self.goodput / self.capacity
    }
}

struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = splitmix(self.0);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn exponential(&mut self, mean: f64) -> f64 {
        -self.uniform().ln() * mean
    }
}

/// [`crate::control::window::nearest_rank`], 0 for no samples.
fn nearest_rank_or_zero(sorted: &[u64], p: f64) -> u64 {
    crate::control::window::nearest_rank(sorted, p).unwrap_or(0)
}

pub(super) fn simulate(cfg: &SimConfig) -> SimResult {
    let mut rng = Rng(cfg.seed);
    let mut controller = cfg.gate.map(|s| Controller::new(s, cfg.seed));
    let mut limit = controller.as_ref().map_or(u64::MAX, |c| u64::from(c.limit()));
    let to_ns = |s: f64| (s * NS) as u64;
    let end = to_ns(cfg.duration);
    let measure_from = to_ns(cfg.measure_from);
    let window = to_ns(cfg.window);
    let arrival_mean = 1.0 / (cfg.load * cfg.capacity());

    // Bursts: this many arrivals at the start of every second, 1 ns apart.
    let per_burst = (cfg.load * cfg.capacity()).round() as u64;
    let mut burst_left = per_burst;
    let mut next_arrival = if cfg.bursts { 0 } else { to_ns(rng.exponential(arrival_mean)) };
    let mut next_window = window;
    // The gate's tier rule, exactly as the kernel applies it.
    let mut port = PortConfig::new(0, 0, false, 0);
    port.tiered = u8::from(cfg.tier_mix.is_some());
    let mut share_rejections = 0u64;
    let mut reserve = TierHoldBack::default();
    let mut held_back = [0u16; tier::COUNT];
    let mut window_rejected = [0u64; tier::COUNT];
    // Turned away by the limit itself (not a tier's share): the limit pressed.
    let mut window_limit_rejected = 0u64;
    // Completion times of busy workers, with each request's arrival time, tier
    // and the time the server read it (pick-up: the start of its service as the
    // kernel sees it).
    let mut busy: BinaryHeap<Reverse<(u64, u64, u8, u64)>> = BinaryHeap::new();
    let mut queue: VecDeque<(u64, u64, u8)> = VecDeque::new(); // (arrival, service ns, tier)
    let mut window_sojourns: Vec<u64> = Vec::new();
    // Queue waits (arrival to the start of service) of the requests started in the window.
    let mut window_waits: Vec<u64> = Vec::new();
    let mut window_services: Vec<u64> = Vec::new();
    let mut measured_sojourns: Vec<u64> = Vec::new();
    let mut result = SimResult { capacity: cfg.capacity(), ..SimResult::default() };
    let mut good = 0u64;
    let mut carried = 0u32;
    // With `abandon`: the arrival times of admitted requests the gate still
    // counts (their client is still there), and the window's abandoned ones.
    let mut counted: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let mut counted_total = 0u64;
    let (mut window_abandoned, mut window_abandoned_age) = (0u64, 0u64);
    let deadline_ns = to_ns(cfg.deadline);

    let workers_at =
        |t: u64| cfg.worker_steps.iter().rfind(|&&(at, _)| t >= to_ns(at)).map_or(cfg.workers, |&(_, n)| n);
    let mean_service_at = |t: u64| match cfg.service_step {
        Some((at, factor)) if t >= to_ns(at) => cfg.mean_service * factor,
        _ => cfg.mean_service,
    };

    loop {
        let next_done = busy.peek().map_or(u64::MAX, |Reverse((t, _, _, _))| *t);
        let now = next_arrival.min(next_done).min(next_window);
        if now >= end {
            break;
        }
        // Clients whose deadline passed close their connections.
        while cfg.abandon
            && let Some((&arrived, &n)) = counted.first_key_value()
            && arrived + deadline_ns < now
        {
            counted.remove(&arrived);
            counted_total -= n;
            window_abandoned += n;
            window_abandoned_age += n * deadline_ns;
        }
        let in_flight = if cfg.abandon { counted_total } else { (queue.len() + busy.len()) as u64 };
        if now == next_window {
            next_window += window;
            // Workers that came back take queued requests at once.
            while busy.len() < workers_at(now)
                && let Some((arrival, service, t)) = queue.pop_front()
            {
                if !cfg.reads_at_once {
                    window_waits.push(now - arrival);
                }
                busy.push(Reverse((now + service, arrival, t, if cfg.reads_at_once { arrival } else { now })));
            }
            if let Some(c) = controller.as_mut() {
                window_sojourns.sort_unstable();
                window_waits.sort_unstable();
                window_services.sort_unstable();
                // As the daemon: the queue limiter counts queue waits, the others whole requests.
                let judged = if c.settings().algo == Algo::Queue { window_waits.len() } else { window_sojourns.len() };
                let sample = WindowSample {
                    in_flight,
                    samples: judged as u64,
                    latency_us: nearest_rank_or_zero(&window_sojourns, cfg.percentile) / 1000,
                    queue_wait_us: nearest_rank_or_zero(&window_waits, cfg.percentile) / 1000,
                    service_us: nearest_rank_or_zero(&window_services, 50.0) / 1000,
                    answered: window_services.len() as u64,
                    service_mean_us: (window_services.iter().sum::<u64>() / (window_services.len() as u64).max(1))
                        / 1000,
                    listen_drops: 0,
                    rejected: window_limit_rejected,
                    windows: carried + 1,
                    elapsed_us: 0,
                    abandoned: window_abandoned,
                    abandoned_age_us: (window_abandoned_age / window_abandoned.max(1)) / 1000,
                };
                if cfg.tier_mix.is_some() {
                    held_back = reserve.on_window(window_rejected, c.limit(), port.share_permille);
                }
                window_rejected = [0; tier::COUNT];
                window_limit_rejected = 0;
                let decision = c.on_window(&sample);
                limit = u64::from(decision.limit);
                result.limits.push(c.limit());
                result.probes.push(decision.reason == Reason::Probe);
                // Too few samples: carry them into the next window, as the daemon does.
                if decision.reason == Reason::TooFewSamples {
                    carried += 1;
                } else {
                    window_sojourns.clear();
                    window_waits.clear();
                    window_services.clear();
                    (window_abandoned, window_abandoned_age) = (0, 0);
                    carried = 0;
                }
            } else {
                window_sojourns.clear();
                window_waits.clear();
                window_services.clear();
            }
        } else if now == next_done {
            let Reverse((_, arrived, t, picked_up)) = busy.pop().expect("peeked");
            let sojourn = now - arrived;
            // Its client is still there (or never leaves): an answer the gate sees.
            let seen = !cfg.abandon || sojourn <= deadline_ns;
            if seen {
                window_sojourns.push(sojourn);
                window_services.push(now - picked_up);
            }
            if cfg.abandon
                && seen
                && let Some(n) = counted.get_mut(&arrived)
            {
                *n -= 1;
                counted_total -= 1;
                if *n == 0 {
                    counted.remove(&arrived);
                }
            }
            if arrived >= measure_from {
                if sojourn <= to_ns(cfg.deadline) {
                    good += 1;
                    result.tier_good[t as usize] += 1;
                    measured_sojourns.push(sojourn);
                } else {
                    result.late += 1;
                }
            }
            if busy.len() < workers_at(now)
                && let Some((arrival, service, t)) = queue.pop_front()
            {
                if cfg.reads_at_once {
                    busy.push(Reverse((now + service, arrival, t, arrival)));
                } else {
                    window_waits.push(now - arrival);
                    busy.push(Reverse((now + service, arrival, t, now)));
                }
            }
        } else {
            next_arrival = if !cfg.bursts {
                now + to_ns(rng.exponential(arrival_mean))
            } else if burst_left > 1 {
                burst_left -= 1;
                now + 1
            } else {
                burst_left = per_burst;
                (now / to_ns(1.0) + 1) * to_ns(1.0)
            };
            let t = match cfg.tier_mix {
                Some([critical, normal, _]) => {
                    let u = rng.uniform();
                    if u < critical {
                        tier::CRITICAL
                    } else if u < critical + normal {
                        tier::NORMAL
                    } else {
                        tier::LOW
                    }
                }
                None => tier::NORMAL,
            };
            if now >= measure_from {
                result.tier_demand[t as usize] += 1;
            }
            let in_system = in_flight;
            let threshold = port.tier_threshold(t, limit.min(u64::from(u32::MAX)) as u32);
            let share_full = in_system >= threshold.saturating_sub(u64::from(held_back[t as usize]));
            let rejected = in_system >= limit
                || (share_full && {
                    share_rejections += 1;
                    !share_rejections.is_multiple_of(tier::TRICKLE_EVERY)
                });
            if rejected {
                window_rejected[t as usize] += 1;
                window_limit_rejected += u64::from(in_system >= limit);
                if now >= measure_from {
                    result.rejected += 1;
                }
                continue;
            }
            let service = if cfg.fixed_service {
                to_ns(mean_service_at(now))
            } else {
                to_ns(rng.exponential(mean_service_at(now)))
            };
            if cfg.abandon {
                *counted.entry(now).or_default() += 1;
                counted_total += 1;
            }
            if busy.len() < workers_at(now) || cfg.reads_at_once {
                // Read now: by a free worker, or by the server that reads at once.
                window_waits.push(0);
            }
            if busy.len() < workers_at(now) {
                busy.push(Reverse((now + service, now, t, now)));
            } else {
                queue.push_back((now, service, t));
            }
        }
    }
    measured_sojourns.sort_unstable();
    result.goodput = good as f64 / (cfg.duration - cfg.measure_from);
    result.admitted_p99 = nearest_rank_or_zero(&measured_sojourns, 99.0) as f64 / NS;
    result.admitted_p50 = nearest_rank_or_zero(&measured_sojourns, 50.0) as f64 / NS;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Algo;

    const ADAPTIVE: [Algo; 4] = [Algo::Gradient, Algo::Gradient2, Algo::Aimd, Algo::Queue];

    /// A gate running `algo` (as `SimConfig` takes it: `None` runs no gate).
    #[expect(clippy::unnecessary_wraps, reason = "SimConfig::new takes an optional gate")]
    fn gate(algo: Algo) -> Option<Settings> {
        Some(Settings { algo, initial_limit: 100, min_limit: 4, ..Settings::default() })
    }

    fn unloaded_p99() -> f64 {
        simulate(&SimConfig::new(0.3, None)).admitted_p99
    }

    /// Seeds every simulated claim must hold for (one seed can be lucky).
    const SEEDS: [u64; 3] = [42, 7, 2026];

    #[test]
    fn critical_keeps_its_goodput_when_lower_tiers_overload_the_service() {
        for (algo, seed) in ADAPTIVE.into_iter().flat_map(|a| SEEDS.map(|s| (a, s))) {
            let mut cfg = SimConfig::new(3.0, gate(algo));
            cfg.tier_mix = Some([0.2, 0.6, 0.2]);
            cfg.seed = seed;
            let r = simulate(&cfg);
            let served = |t: u8| r.tier_good[t as usize] as f64 / r.tier_demand[t as usize] as f64;
            println!(
                "{algo:>9} at 3x, 20/60/20 critical/normal/low: goodput {:.1}% of capacity; served critical {:.1}%, normal {:.1}%, low {:.1}% of demand",
                r.goodput_fraction() * 100.0,
                served(tier::CRITICAL) * 100.0,
                served(tier::NORMAL) * 100.0,
                served(tier::LOW) * 100.0
            );
            // Over 12 seeds gradient served critical 94.5-95.8% of its demand, the others 96.5-97.9%.
            let floor = if algo == Algo::Gradient { 0.94 } else { 0.95 };
            assert!(
                served(tier::CRITICAL) >= floor,
                "{algo}: critical got {:.3} of its demand",
                served(tier::CRITICAL)
            );
            // Capacity is a third of demand: critical (20%) is served, normal gets most
            // of what is left, low is shed first and hardest.
            assert!(
                served(tier::LOW) + 0.05 <= served(tier::NORMAL),
                "{algo} seed {seed}: low ({:.3}) is shed before normal ({:.3})",
                served(tier::LOW),
                served(tier::NORMAL)
            );
            assert!(r.goodput_fraction() >= 0.85, "{algo} seed {seed}: goodput {:.3}", r.goodput_fraction());
        }
    }

    #[test]
    fn without_a_gate_goodput_collapses_under_overload() {
        let r = simulate(&SimConfig::new(2.0, None));
        println!(
            "no gate at 2x: goodput {:.1}% of capacity, p99 {:.0} ms",
            r.goodput_fraction() * 100.0,
            r.admitted_p99 * 1e3
        );
        assert!(r.goodput_fraction() < 0.2, "the model must show the collapse the gate prevents: {r:?}");
    }

    #[test]
    fn adaptive_controllers_keep_goodput_and_latency_under_overload() {
        let base_p99 = unloaded_p99();
        println!("unloaded p99 {:.1} ms", base_p99 * 1e3);
        for algo in ADAPTIVE {
            for load in [2.0, 4.0] {
                let r = simulate(&SimConfig::new(load, gate(algo)));
                let tail = steady(&r, r.limits.len() - 200..r.limits.len());
                println!(
                    "{algo:>9} at {load}x: goodput {:.1}% of capacity, admitted p50 {:.1} ms p99 {:.1} ms ({:.2}x unloaded), limit {}..{}",
                    r.goodput_fraction() * 100.0,
                    r.admitted_p50 * 1e3,
                    r.admitted_p99 * 1e3,
                    r.admitted_p99 / base_p99,
                    tail.iter().min().unwrap(),
                    tail.iter().max().unwrap(),
                );
                assert!(
                    r.goodput_fraction() >= 0.90,
                    "{algo} at {load}x: goodput {:.3} of capacity",
                    r.goodput_fraction()
                );
                assert!(
                    r.admitted_p99 <= 3.0 * base_p99,
                    "{algo} at {load}x: p99 {} vs unloaded {base_p99}",
                    r.admitted_p99
                );
            }
        }
    }

    /// A server that reads every request at once and queues it inside (issue
    /// 42's server b): the kernel sees no queue wait, only service times that
    /// grow with the queue. `queue` must find the queue inside by Little's law
    /// and keep goodput and latency as it does for a server that reads when free.
    #[test]
    fn queue_finds_the_queue_inside_a_server_that_reads_at_once() {
        let base_p99 = unloaded_p99();
        for (load, seed) in [2.0, 4.0].into_iter().flat_map(|l| SEEDS.map(|s| (l, s))) {
            let run = |gate: Option<Settings>| {
                let mut cfg = SimConfig::new(load, gate);
                (cfg.reads_at_once, cfg.seed) = (true, seed);
                simulate(&cfg)
            };
            let none = run(None);
            let r = run(gate(Algo::Queue));
            let tail = steady(&r, r.limits.len() - 200..r.limits.len());
            let (lo, hi) = (*tail.iter().min().unwrap(), *tail.iter().max().unwrap());
            println!(
                "queue, reads at once, {load}x seed {seed}: goodput {:.1}% (no gate {:.1}%), p99 {:.1} ms ({:.2}x unloaded), limit {lo}..{hi}",
                r.goodput_fraction() * 100.0,
                none.goodput_fraction() * 100.0,
                r.admitted_p99 * 1e3,
                r.admitted_p99 / base_p99
            );
            assert!(r.goodput_fraction() >= 0.90, "{load}x seed {seed}: goodput {:.3}", r.goodput_fraction());
            assert!(
                r.admitted_p99 <= 2.0 * base_p99,
                "{load}x seed {seed}: p99 {} vs unloaded {base_p99}",
                r.admitted_p99
            );
            // Little's law: 8 workers need about 8 in flight; a limit in the
            // hundreds (blind to the queue inside) holds a queue of hundreds.
            assert!(hi <= 4 * cfg_workers(), "{load}x seed {seed}: limit up to {hi}");
        }
    }

    fn cfg_workers() -> u32 {
        SimConfig::new(1.0, None).workers as u32
    }

    /// The drain probe and the knee must not cost a server that reads when
    /// free anything, nor a read-at-once server that really slowed 5x with no
    /// queue: its limit must not collapse below its workers.
    #[test]
    fn a_read_at_once_server_that_slowed_keeps_its_limit() {
        for seed in SEEDS {
            let mut cfg = SimConfig::new(2.0, gate(Algo::Queue));
            (cfg.reads_at_once, cfg.duration, cfg.measure_from, cfg.service_step, cfg.seed) =
                (true, 90.0, 60.0, Some((30.0, 5.0)), seed);
            let r = simulate(&cfg);
            let tail = steady(&r, r.limits.len() - 200..r.limits.len());
            let mean = tail.iter().map(|&l| f64::from(l)).sum::<f64>() / tail.len() as f64;
            let goodput = r.goodput / (cfg.capacity() / 5.0);
            println!(
                "queue, reads at once, 5x slower at 30 s, seed {seed}: limit {mean:.1} over the last 20 s, goodput {:.1}% of the new capacity, p99 {:.0} ms",
                goodput * 100.0,
                r.admitted_p99 * 1e3
            );
            let workers = cfg.workers as f64;
            // Not collapsed below the workers; at most a short queue inside above them
            // (measured 15-22: the knee, the target's 3/4 of a 50 ms service, noise).
            assert!((workers..=3.0 * workers).contains(&mean), "seed {seed}: settled limit {mean:.1}");
            assert!(goodput >= 0.85, "seed {seed}: goodput {goodput:.3}");
        }
    }

    /// The limits of the windows that were not baseline probes.
    fn steady(r: &SimResult, range: std::ops::Range<usize>) -> Vec<u32> {
        range.filter(|&i| !r.probes[i]).map(|i| r.limits[i]).collect()
    }

    /// Windows after `from` until the limit's 1-second rolling mean (probes
    /// excluded) enters +/-`band` of its final mean and stays there for 2 s.
    fn settling_windows(r: &SimResult, from: usize, band: f64) -> (usize, f64) {
        let tail = steady(r, r.limits.len() - 100..r.limits.len());
        let mean = tail.iter().map(|&l| f64::from(l)).sum::<f64>() / tail.len() as f64;
        let rolling_mean = |i: usize| {
            let w = steady(r, i.saturating_sub(9)..i + 1);
            (!w.is_empty()).then(|| w.iter().map(|&l| f64::from(l)).sum::<f64>() / w.len() as f64)
        };
        let inside = |i: usize| rolling_mean(i).is_none_or(|m| (m - mean).abs() <= band * mean);
        let settled = (from..r.limits.len() - 20).find(|&i| (i..i + 20).all(inside)).unwrap_or(r.limits.len());
        (settled - from, mean)
    }

    /// How each controller must settle after the step: within this many windows,
    /// at a limit within this multiple of the workers (Little's law: in-flight =
    /// throughput x time in system; every worker busy needs at least `workers`,
    /// and each further slot is a queued request). AIMD is the slowest and
    /// loosest: it learns the new latency through its baseline span and backs off
    /// only past a tolerance of it (measured, seeds 42/7/2026: 124-250 windows,
    /// 2.9-4.6x the workers; gradient: 0-12 windows, 1.1-2x). gradient2 follows
    /// Gradient2Limit's long average (factor 2/601), which learns the slower
    /// service as normal within a few hundred windows and then, with its 1.5x
    /// tolerance, keeps a standing queue (measured: 0-276 windows, 2.8-3.4x).
    fn settle_bounds(algo: Algo) -> (usize, (f64, f64)) {
        match algo {
            Algo::Aimd => (300, (1.0, 5.0)),
            Algo::Gradient2 => (300, (1.0, 4.0)),
            _ => (100, (1.0, 2.5)),
        }
    }

    #[test]
    fn limit_settles_after_a_5x_service_time_step_and_stays_in_band() {
        for (algo, seed) in ADAPTIVE.into_iter().flat_map(|a| SEEDS.map(|s| (a, s))) {
            let mut cfg = SimConfig::new(2.0, gate(algo));
            cfg.duration = 90.0;
            cfg.measure_from = 60.0;
            cfg.service_step = Some((30.0, 5.0));
            cfg.seed = seed;
            let r = simulate(&cfg);
            let step_window = 300;
            let (settle, mean) = settling_windows(&r, step_window, 0.5);
            let tail = steady(&r, r.limits.len() - 200..r.limits.len());
            let (lo, hi) = (*tail.iter().min().unwrap(), *tail.iter().max().unwrap());
            let before = r.limits[step_window - 1];
            // Goodput after the step, against the new capacity (workers / (5 x service)).
            let new_capacity = cfg.capacity() / 5.0;
            println!(
                "{algo:>9}: limit {before} before the 5x step, settles (1 s mean within +/-50% of {mean:.0} for 2 s) after {settle} windows; last 20 s within {lo}..{hi}; goodput after {:.0}% of the new capacity, p99 {:.0} ms",
                r.goodput / new_capacity * 100.0,
                r.admitted_p99 * 1e3
            );
            let (max_windows, band) = settle_bounds(algo);
            assert!(settle <= max_windows, "{algo} seed {seed}: did not settle within {max_windows} windows: {settle}");
            assert!(
                f64::from(hi - lo) <= 1.5 * mean,
                "{algo} seed {seed}: steady-state swing {lo}..{hi} around {mean:.0}"
            );
            // Little's law: at the new capacity the limit must keep every worker busy
            // (in-flight >= workers) without a queue longer than a few service times
            // (a limit stuck at min_limit starves the workers; one stuck high lets the queue grow).
            let workers = cfg.workers as f64;
            assert!(
                (band.0 * workers..=band.1 * workers).contains(&mean),
                "{algo} seed {seed}: settled limit {mean:.1} outside {band:?} x {workers} workers"
            );
            let goodput = r.goodput / new_capacity;
            assert!(goodput >= 0.85, "{algo} seed {seed}: goodput after the step {goodput:.3} of the new capacity");
            assert!(
                r.admitted_p99 <= cfg.deadline,
                "{algo} seed {seed}: p99 {:.3} s past the deadline",
                r.admitted_p99
            );
        }
    }

    /// Synchronized bursts at 2x (each second's 400 arrivals at once, 4 workers
    /// x 20 ms, 1 s deadline). Judged on latency alone, a burst looks like
    /// overload and the limit stays at a few dozen; with the 1 s objective the
    /// limit becomes what the service answers within it.
    #[test]
    fn an_objective_admits_the_bursts_the_service_can_finish_in_time() {
        let run = |algo: Option<Algo>, objective_us: f64, seed: u64, reads_at_once: bool| {
            let gate = algo.map(|algo| Settings { algo, objective_us, ..Settings::default() });
            let mut cfg = SimConfig::new(2.0, gate);
            (cfg.workers, cfg.mean_service, cfg.bursts, cfg.duration, cfg.measure_from, cfg.seed, cfg.reads_at_once) =
                (4, 0.020, true, 30.0, 10.0, seed, reads_at_once);
            simulate(&cfg)
        };
        // Against a server that reads at once only `queue` sees the queue inside.
        let cases = [(Algo::Gradient, false), (Algo::Queue, false), (Algo::Queue, true)];
        for seed in SEEDS {
            assert!(run(None, 0.0, seed, false).goodput_fraction() < 0.05, "no gate: the queue collapses goodput");
            assert!(run(None, 0.0, seed, true).goodput_fraction() < 0.05, "no gate: the queue collapses goodput");
            for (algo, at_once) in cases {
                let run = |objective_us| run(Some(algo), objective_us, seed, at_once);
                let judged_on_latency = run(0.0);
                let with_objective = run(1e6);
                let server = if at_once { "reads at once" } else { "reads when free" };
                println!(
                    "{algo:>9} bursts at 2x, {server}: goodput {:.1}% on latency alone, {:.1}% with a 1 s objective (p99 {:.0} ms)",
                    judged_on_latency.goodput_fraction() * 100.0,
                    with_objective.goodput_fraction() * 100.0,
                    with_objective.admitted_p99 * 1e3
                );
                // With exponential service times a burst's drain time varies by ~70 ms,
                // so about 85% of capacity fits in the second reliably.
                assert!(with_objective.goodput_fraction() >= 0.80, "{algo} seed {seed}: {with_objective:?}");
                assert!(
                    with_objective.goodput_fraction() >= 3.0 * judged_on_latency.goodput_fraction(),
                    "{algo} seed {seed}: the objective admits what latency alone turns away"
                );
                assert!(with_objective.admitted_p99 <= 1.0, "{algo} seed {seed}: admitted requests meet the objective");
            }
        }
    }
}

/// The matrix of issue "every scale": service times from 1 ms to 1 s, 1 to
/// 64 workers, both server shapes, 2x and 4x overload, clients that give up
/// at a 1 s deadline and close (their late answers leave no sample), fixed
/// service times as the real test servers have. Each cell against no gate.
#[cfg(test)]
mod matrix {
    use super::*;
    use crate::control::QUEUE_TARGET_US;

    /// One cell: goodput after the first 5 s (of capacity), p99 of answers
    /// (x the service time), the highest limit after 5 s, and no gate's goodput.
    struct Cell {
        goodput: f64,
        whole: f64,
        p99_x: f64,
        late_limit: u32,
        none: f64,
    }

    fn cell(workers: usize, service: f64, load: f64, reads_at_once: bool) -> Cell {
        // Long enough for 200 answers after the first 5 s.
        let capacity = workers as f64 / service;
        let duration = (5.0 + 200.0 / capacity).max(20.0);
        let mut cfg = SimConfig::new(load, Some(Settings::default()));
        (cfg.workers, cfg.mean_service, cfg.reads_at_once, cfg.abandon, cfg.fixed_service) =
            (workers, service, reads_at_once, true, true);
        // Clients wait 1 s, or twice the service time for a slower one.
        cfg.deadline = cfg.deadline.max(2.0 * service);
        (cfg.duration, cfg.measure_from) = (duration, 5.0);
        let r = simulate(&cfg);
        let whole = simulate(&SimConfig { measure_from: 0.0, ..cfg.clone() });
        let none = simulate(&SimConfig { gate: None, ..cfg.clone() });
        let first_after = (5.0 / cfg.window) as usize;
        let late_limit = r.limits.iter().skip(first_after).copied().max().unwrap_or(0);
        Cell {
            goodput: r.goodput_fraction(),
            whole: whole.goodput_fraction(),
            p99_x: r.admitted_p99 / service,
            late_limit,
            none: none.goodput_fraction(),
        }
    }

    /// The whole matrix runs and prints (BENCHMARKS, B14, quotes it); the
    /// slice the defaults hold is asserted with wide margins: services of
    /// 1 to 100 ms with 4 or more workers keep 90% of capacity after the
    /// first 5 s (measured 97-100%), at least 3x no gate, and no runaway
    /// (the limit within 4x of what the service can use, its workers or
    /// what it drains within the 5 ms queue target, plus 8). Slower services
    /// and a single worker are reported, not asserted: see B14.
    #[test]
    fn the_defaults_protect_every_scale() {
        let mut failures = Vec::new();
        for reads_at_once in [true, false] {
            for service in [0.001, 0.02, 0.1, 0.5, 1.0] {
                for workers in [1usize, 4, 8, 64] {
                    let capacity = workers as f64 / service;
                    if capacity > 20_000.0 {
                        continue;
                    }
                    for load in [2.0, 4.0] {
                        let c = cell(workers, service, load, reads_at_once);
                        let shape = if reads_at_once { "at once" } else { "when free" };
                        println!(
                            "{shape:9} {workers:3} x {:5.0} ms at {load}x: goodput {:5.1}% after 5 s, {:5.1}% whole (no gate {:5.1}%), p99 {:4.1}x service, limit up to {}",
                            service * 1e3,
                            c.goodput * 100.0,
                            c.whole * 100.0,
                            c.none * 100.0,
                            c.p99_x,
                            c.late_limit
                        );
                        if service > 0.1 || workers < 4 {
                            continue;
                        }
                        let cell = format!("{shape} {workers} x {service} s at {load}x");
                        if c.goodput < 0.9 || c.goodput < 3.0 * c.none {
                            failures.push(format!("{cell}: goodput {:.3}, no gate {:.3}", c.goodput, c.none));
                        }
                        let usable = (workers as f64).max(capacity * QUEUE_TARGET_US / 1e6);
                        if f64::from(c.late_limit) > 4.0 * usable + 8.0 {
                            failures.push(format!("{cell}: limit {}", c.late_limit));
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

#[cfg(test)]
mod changes {
    use super::*;

    /// A read-at-once server of 4 workers x 100 ms under 2x its full load
    /// loses 3 workers at 15 s and gets them back at 30 s.
    fn lose_and_recover(seed: u64) -> (SimResult, SimConfig) {
        let mut cfg = SimConfig::new(2.0, Some(Settings::default()));
        (cfg.workers, cfg.mean_service, cfg.reads_at_once, cfg.abandon, cfg.fixed_service, cfg.seed) =
            (4, 0.1, true, true, true, seed);
        (cfg.duration, cfg.measure_from, cfg.worker_steps) = (45.0, 0.0, vec![(15.0, 1), (30.0, 4)]);
        (simulate(&cfg), cfg)
    }

    /// Followed down to the floor within 4 s of the loss (the target
    /// is 2 s: measured 2.5-3 s, a judged window of ten answers at 10/s
    /// first), and back to the workers' level within 10 s of the recovery
    /// (measured 2-3 s). Goodput while one worker serves stays near its
    /// capacity.
    #[test]
    fn a_service_that_loses_workers_is_followed_down_and_back_up() {
        for seed in [42, 7, 2024] {
            let (r, cfg) = lose_and_recover(seed);
            let at = |t: f64| (t / cfg.window) as usize;
            let down = r.limits[at(15.0)..at(30.0)].iter().position(|&l| l <= Settings::default().min_limit);
            let up = r.limits[at(30.0)..].iter().position(|&l| l >= 8);
            println!("seed {seed}: down to the floor after {down:?} windows, back to 8 after {up:?} windows");
            assert!(down.is_some_and(|w| w <= at(4.0)), "seed {seed}: {:?}", &r.limits[at(15.0)..at(30.0)]);
            assert!(
                r.limits[at(19.0)..at(30.0)].iter().all(|&l| l <= 6),
                "seed {seed}: held down while one worker serves: {:?}",
                &r.limits[at(19.0)..at(30.0)]
            );
            assert!(up.is_some_and(|w| w <= at(10.0)), "seed {seed}: {:?}", &r.limits[at(30.0)..]);
        }
    }
}
