// SPDX-License-Identifier: MIT OR Apache-2.0
//! Steering before shedding: a real HAProxy balances three gated backends
//! with `agent-check` against each gate's `--agent-port`. One backend slows
//! 5x: its weight falls and the traffic moves to the others (counted at the
//! backends and at the slow one's gate), and when it is fast again its
//! weight and its share come back. Needs root and haproxy.
mod support;

use std::{
    io::Read as _,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use shed_testkit::{
    fleet::{Balancing, Fleet, Haproxy},
    testbed::{self, OpenLoop, Outcome},
};
use support::gate::{Gate, exclusive, poll, shedctl};

const PORT: u16 = 8080;
const AGENT_PORT: u16 = 9500;
const FAST_US: u64 = 20_000;

/// Work each backend's gate has judged (connections, kept-alive requests and refusals), by backend.
fn judged(fleet: &Fleet) -> Vec<u64> {
    let out = shedctl(&["stats", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("stats JSON");
    fleet
        .backends
        .iter()
        .map(|(ns, _)| {
            let port = all.iter().find(|p| p["netns"] == ns.as_str()).unwrap_or_else(|| panic!("{ns} in {all:?}"));
            ["admitted", "requests_admitted", "rejected"].iter().map(|f| port[f].as_u64().expect(f)).sum()
        })
        .collect()
}

/// Per-second rates of `read` (one counter per backend) over `span`.
fn rates(read: impl Fn() -> Vec<u64>, span: Duration) -> Vec<f64> {
    let before = read();
    thread::sleep(span);
    read().iter().zip(before).map(|(after, before)| (after - before) as f64 / span.as_secs_f64()).collect()
}

#[test]
fn a_slowed_backend_loses_weight_and_traffic_and_wins_them_back() {
    let _one = exclusive();
    let fleet = Fleet::create("steer", 3).expect("fleet");
    let serving = fleet.serve(PORT, 4, FAST_US).expect("backends");
    let mut args: Vec<String> = fleet.netns_args();
    args.extend(["--port", "8080", "--action", "rst", "--agent-port", "9500"].map(String::from));
    let _gate = Gate::attach(&args.iter().map(String::as_str).collect::<Vec<_>>());

    // The agent answers on each backend's own address, one line, at once.
    let (ns, addr) = fleet.backends[1].clone();
    let line = testbed::run_in(&fleet.lb_ns, move || {
        let start = Instant::now();
        let mut conn = std::net::TcpStream::connect((addr, AGENT_PORT)).expect("agent");
        let mut line = String::new();
        conn.read_to_string(&mut line).expect("agent line");
        (line, start.elapsed())
    })
    .unwrap();
    assert_eq!(line.0, "100%\n", "an idle backend has all its weight ({ns})");

    let lb: SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let haproxy =
        Haproxy::start(&fleet.lb_ns, lb, &serving.addrs, Balancing::AgentCheck { port: AGENT_PORT, inter_ms: 250 })
            .expect("haproxy");
    // 300 requests a second: 0.7 of what the fleet can still serve with one
    // backend 5x slower (200 + 200 + 40 a second).
    let rate = Arc::new(AtomicU64::new(300));
    let load = OpenLoop::start_with(&fleet.lb_ns, lb, rate, Duration::from_secs(1), testbed::HTTP_REQUEST);
    let read = || serving.read();

    // All well: full weights, even shares.
    thread::sleep(Duration::from_secs(2));
    let before = rates(read, Duration::from_secs(2));
    let judged_before = rates(|| judged(&fleet), Duration::from_secs(2));
    assert_eq!(haproxy.weights().unwrap(), [100, 100, 100], "steering costs nothing while all is well");

    // Backend 0 slows 5x: its agent reports less weight, and HAProxy moves its traffic.
    serving.service_us[0].store(5 * FAST_US, Ordering::Relaxed);
    let slowed = Instant::now();
    let weights =
        poll(Duration::from_secs(4), "backend 0's weight to fall", || haproxy.weights().unwrap(), |w| w[0] <= 50);
    eprintln!("weight fell to {weights:?} {:?} after the slowdown", slowed.elapsed());
    thread::sleep(Duration::from_secs(2));
    let (during, judged_during) =
        (rates(read, Duration::from_secs(3)), rates(|| judged(&fleet), Duration::from_secs(3)));
    eprintln!("read/s before {before:?} during {during:?}; judged/s before {judged_before:?} during {judged_during:?}");
    assert!(
        judged_during[0] < judged_before[0] * 0.5,
        "the slow backend is offered less than half of what it was: {judged_during:?} against {judged_before:?}"
    );
    for i in [1, 2] {
        assert!(during[i] > before[i] * 1.2, "backend {i} took the traffic: {during:?} against {before:?}");
    }

    // Fast again: the weight grows back to full, and with it the share.
    serving.service_us[0].store(FAST_US, Ordering::Relaxed);
    poll(Duration::from_secs(20), "backend 0's weight to recover", || haproxy.weights().unwrap(), |w| w[0] == 100);
    let after = rates(read, Duration::from_secs(2));
    assert!(after[0] > before[0] * 0.7, "backend 0 has its share back: {after:?} against {before:?}");

    let outcomes = load.finish();
    let answered = outcomes.iter().filter(|o| matches!(o, Outcome::Answered(_))).count();
    eprintln!("{answered} of {} answered; the agent answered in {:?}", outcomes.len(), line.1);
}
