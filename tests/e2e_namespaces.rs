// SPDX-License-Identifier: MIT OR Apache-2.0
//! One daemon gating the same port in two network namespaces (two containers
//! on one host, say): each namespace has its own limit and its own counts,
//! `set --netns` changes one, and stats, metrics and top name the namespace.
//! Needs root.
mod support;

use std::{
    io,
    net::{SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use shed::host::paths;
use shed_testkit::testbed::{self, Backend, Service, Testbed};
use support::{
    gate::{Gate, exclusive, poll, shed_programs_left, shedctl},
    metrics::{scrape, value},
};

const PORT: u16 = 8080;
const METRICS: &str = "127.0.0.1:19477";

/// Opens a connection from the client namespace; the stream stays open while held.
fn open(bed: &Testbed) -> io::Result<TcpStream> {
    let addr = bed.server_addr(false, PORT);
    testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1)))?
}

/// `stats --json` (every namespace, or `--netns`), as (netns, port object) pairs.
fn stats(netns: Option<&str>) -> Vec<(String, serde_json::Value)> {
    let mut args = vec!["stats", "--json", "--interval", "50"];
    if let Some(ns) = netns {
        args.extend(["--netns", ns]);
    }
    let out = shedctl(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON list");
    list.into_iter().map(|p| (p["netns"].as_str().expect("netns field").to_owned(), p)).collect()
}

fn of<'a>(all: &'a [(String, serde_json::Value)], netns: &str) -> &'a serde_json::Value {
    &all.iter().find(|(n, _)| n == netns).unwrap_or_else(|| panic!("no port of netns {netns} in {all:?}")).1
}

fn int(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} in {v}"))
}

#[test]
fn one_daemon_gates_two_namespaces_each_with_its_own_limit_and_counts() {
    let _one = exclusive();
    let (a, b) = (Testbed::create("nsa").unwrap(), Testbed::create("nsb").unwrap());
    let addr: SocketAddr = a.server_addr(false, PORT);
    let _backends = [&a, &b].map(|bed| Backend::start(&bed.server_ns, addr, Service::Echo).unwrap());

    // The same namespace twice is refused before anything is attached.
    let out = shedctl(&[
        "attach",
        "--netns",
        &a.server_ns,
        "--netns",
        &format!("/run/netns/{}", a.server_ns),
        "--port",
        "8080",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("name the same network namespace"), "{stderr}");
    assert!(!Path::new(paths::PIN_DIR).exists(), "nothing pinned after a refusal");
    let out = shedctl(&["attach", "--netns", "host", "--port", "8080"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("names the daemon's own namespace"), "{stderr}");

    let mut gate = Gate::attach(&[
        "--netns",
        &a.server_ns,
        "--netns",
        &b.server_ns,
        "--port",
        "8080",
        "--limit",
        "2",
        "--count",
        "connections",
        "--action",
        "rst",
        "--metrics",
        METRICS,
    ]);
    let (la, lb) = (a.server_ns.as_str(), b.server_ns.as_str());
    assert!(Path::new(paths::NETNS_PIN_DIR).join(la).is_dir() && Path::new(paths::NETNS_PIN_DIR).join(lb).is_dir());

    // Namespace a: two held, the third refused.
    let held_a: Vec<TcpStream> = (0..2).map(|_| open(&a).expect("within a's limit")).collect();
    let all =
        poll(Duration::from_secs(5), "a's connections counted", || stats(None), |s| int(of(s, la), "established") == 2);
    let refused = open(&a).expect_err("a's third connection is over its limit");
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused, "refused with an RST: {refused}");
    // Namespace b counts only its own: a's connections are not b's.
    assert_eq!(int(of(&all, lb), "established"), 0, "{all:?}");
    let held_b: Vec<TcpStream> = (0..2).map(|_| open(&b).expect("b has its own limit")).collect();
    let all = poll(
        Duration::from_secs(5),
        "b's connections counted",
        || stats(None),
        |s| int(of(s, lb), "established") == 2 && int(of(s, la), "rejected") >= 1,
    );
    assert_eq!(int(of(&all, la), "established"), 2, "{all:?}");
    assert_eq!(int(of(&all, lb), "rejected"), 0, "a's refusal is not counted in b: {all:?}");

    // `set --netns` changes one namespace; the other keeps its limit.
    let out = shedctl(&["set", "--netns", lb, "--port", "8080", "--limit", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = stats(None);
    assert_eq!((int(of(&all, la), "limit"), int(of(&all, lb), "limit")), (2, 3), "{all:?}");
    let third_b = open(&b).expect("b's new limit admits a third");
    assert_eq!(open(&a).expect_err("a is still at 2").kind(), io::ErrorKind::ConnectionRefused);
    // Only the chosen namespace's ports; an unknown one is named with the ones gated.
    let only_b = stats(Some(lb));
    assert!(only_b.len() == 1 && only_b[0].0 == lb, "{only_b:?}");
    let out = shedctl(&["stats", "--netns", "nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(&format!("it protects {la}, {lb}")), "{stderr}");

    // Metrics and top are labelled by namespace.
    let s = scrape(METRICS);
    assert_eq!(value(&s, "shed_limit", &[("netns", la), ("port", "8080")]), 2.0);
    assert_eq!(value(&s, "shed_limit", &[("netns", lb), ("port", "8080")]), 3.0);
    assert!(value(&s, "shed_rejected_total", &[("netns", la), ("port", "8080"), ("reason", "limit")]) >= 2.0);
    assert_eq!(value(&s, "shed_rejected_total", &[("netns", lb), ("port", "8080"), ("reason", "limit")]), 0.0);
    // The size is the kernel's map accounting (it varies by kernel); the point is that
    // each namespace's own gate reports it.
    assert!(value(&s, "shed_bpf_memory_bytes", &[("netns", lb)]) > 0.0);
    let out = shedctl(&["top", "--once", "--interval", "100", "--size", "110x40"]);
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        top.contains(&format!("netns {la} · port 8080")) && top.contains(&format!("netns {lb} · port 8080")),
        "{top}"
    );
    let out = shedctl(&["stats", "--interval", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("netns {la}:")) && text.contains(&format!("netns {lb}:")), "{text}");

    // Detaching the port in one namespace leaves the other gated.
    let out = shedctl(&["detach", "--port", "8080", "--netns", la]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    poll(Duration::from_secs(5), "a's pins removed", || Path::new(paths::NETNS_PIN_DIR).join(la).exists(), |e| !e);
    let all = stats(None);
    assert!(all.len() == 1 && all[0].0 == lb, "{all:?}");
    // The ended gate is left out of the endpoint: healthy past its last heartbeat, no series.
    std::thread::sleep(Duration::from_millis(5_500));
    let (status, body) = support::metrics::http_get(METRICS, "/healthz");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let s = scrape(METRICS);
    assert!(!s.samples.iter().any(|x| x.labels.get("netns") == Some(la)), "no series of the ended gate");
    assert_eq!(value(&s, "shed_limit", &[("netns", lb), ("port", "8080")]), 3.0);
    drop(held_a);
    let more_a: Vec<TcpStream> = (0..3).map(|_| open(&a).expect("a is no longer gated")).collect();
    assert_eq!(open(&b).expect_err("b is still gated at 3").kind(), io::ErrorKind::ConnectionRefused);

    assert!(gate.stop().success(), "{}", gate.log());
    assert!(!Path::new(paths::PIN_DIR).exists(), "pins removed");
    let left = shed_programs_left(&[]);
    assert!(left.is_empty(), "every namespace's programs unloaded: {left:?}");
    drop((held_b, third_b, more_a));
}

/// A node agent counts every pod's connections through one set of
/// tracepoint programs (`kernel::dispatch`), not one per pod on every socket
/// event of the host. Two namespaces serving the same port, each with its
/// gate's programs handed their namespace: each gate counts exactly its own
/// connections, with their requests (busy, then answered: the per-request
/// events reach it too) and their closes; a gate taken back counts no more.
#[test]
fn the_nodes_dispatcher_hands_each_namespace_to_its_own_gate() {
    use std::{io::Read as _, io::Write as _, os::unix::fs::MetadataExt as _, sync::Arc};

    use shed::kernel::{dispatch::Dispatcher, maps::PortSpec, programs::Loaded};
    use shed_common::{ControlConfig, action, count_mode};

    let _one = exclusive();
    let bed = Testbed::create("shedds").expect("testbed");
    // Room for 64 connections, 16 a gate: the churn below goes well past the
    // room, the hog below past a gate's quota.
    let dispatcher = Arc::new(Dispatcher::start(64).expect("start the dispatcher"));
    let gate_in = |ns: &str| {
        let dispatcher = dispatcher.clone();
        testbed::run_in(ns, move || {
            let mut loaded = Loaded::new(None).expect("load object");
            let spec = PortSpec::new(100, action::RST, false, count_mode::WORK, ControlConfig::default());
            loaded.maps.protect(PORT, &spec).expect("protect the port");
            let inum = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino() as u32;
            let dispatched = dispatcher.add(&mut loaded, inum).expect("hand the namespace over");
            let number = dispatched.gate();
            loaded.dispatched = Some(Box::new(dispatched));
            (loaded, number)
        })
        .expect("namespace")
    };
    let (mut server_gate, server_number) = gate_in(&bed.server_ns);
    let (client_gate, client_number) = gate_in(&bed.client_ns);
    assert_eq!(dispatcher.gates(), 2);
    let server_addr = bed.server_addr(false, PORT);
    let own_addr: SocketAddr = ([127, 0, 0, 1], PORT).into();
    let _server = Backend::start(&bed.server_ns, server_addr, Service::Echo).expect("backend");
    let _own = Backend::start(&bed.client_ns, own_addr, Service::Echo).expect("backend in the client namespace");

    // From the client namespace: 3 to the server's namespace, 2 to its own.
    let held = testbed::run_in(&bed.client_ns, move || {
        let mut held = Vec::new();
        for addr in [server_addr, server_addr, server_addr, own_addr, own_addr] {
            let mut s = testbed::connect(addr, Duration::from_secs(1)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            for _ in 0..2 {
                s.write_all(b"ping").unwrap();
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).expect("echo");
            }
            held.push(s);
        }
        held
    })
    .expect("client namespace");
    let snapshot_of = |loaded: &Loaded| {
        let config = loaded.maps.config(PORT).unwrap();
        loaded.maps.snapshot(PORT, config).unwrap()
    };
    let counts = |loaded: &Loaded| {
        let config = loaded.maps.config(PORT).unwrap();
        let snapshot = loaded.maps.snapshot(PORT, config).unwrap();
        let service: u64 = loaded.maps.latency(config.slot).unwrap().service.iter().sum();
        (snapshot.established(), snapshot.state.busy_enter, snapshot.state.busy_exit, service)
    };
    // Panics naming the last reading if it does not settle in time.
    let settled = |loaded: &Loaded, open: u64, what: &str| {
        poll(
            Duration::from_secs(3),
            what,
            || counts(loaded),
            |&(established, enter, exit, _)| established == open && enter == exit,
        )
    };
    settled(&server_gate, 3, "the server's gate to count its 3 connections");
    settled(&client_gate, 2, "the client's gate to count its 2");
    let (_, enter, _, service) = counts(&server_gate);
    // Each request (two per connection, each one segment) made its connection
    // busy (data ready) and its answer idle again; read then answered, it
    // timed its service (recv, send): one of each per request, exactly.
    assert_eq!((enter, service), (6, 6), "server's gate saw the 6 requests: {:?}", counts(&server_gate));
    let (_, enter, _, service) = counts(&client_gate);
    assert_eq!((enter, service), (4, 4), "client's gate saw the 4 requests: {:?}", counts(&client_gate));

    drop(held);
    settled(&server_gate, 0, "the closes to reach the server's gate");
    settled(&client_gate, 0, "the closes to reach the client's gate");
    poll(Duration::from_secs(3), "the dispatcher to forget the closed", || dispatcher.followed(), |&n| n == 0);

    // Churn past the dispatcher's room (64): 200 connections to the server's
    // namespace, one after another, each with a request, while the client's
    // namespace holds 2 of its own. Each close frees its entry, so every one
    // is counted with its request, and the other gate's count stays exact.
    const CHURN: u64 = 200;
    let own_held = testbed::run_in(&bed.client_ns, move || {
        [own_addr, own_addr].map(|addr| testbed::connect(addr, Duration::from_secs(1)).expect("connect"))
    })
    .expect("client namespace");
    settled(&client_gate, 2, "the client's gate to count its 2 held");
    let (_, enter_before, _, _) = counts(&server_gate);
    let opened_before = snapshot_of(&server_gate).state.opened;
    testbed::run_in(&bed.client_ns, move || {
        for _ in 0..CHURN {
            let mut s = testbed::connect(server_addr, Duration::from_secs(1)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).expect("echo");
        }
    })
    .expect("client namespace");
    settled(&server_gate, 0, "the churn's closes to reach the server's gate");
    let (_, enter_after, _, _) = counts(&server_gate);
    assert_eq!(snapshot_of(&server_gate).state.opened - opened_before, CHURN, "every churned connection counted");
    // Exactly one busy spell each: the request's (the client's FIN after the
    // echo is no request, see account::only_a_fin).
    assert_eq!(enter_after - enter_before, CHURN, "and each one's request, once: {enter_before} -> {enter_after}");
    assert_eq!(counts(&client_gate).0, 2, "the other namespace's count is untouched");
    poll(Duration::from_secs(3), "the dispatcher to forget the churn", || dispatcher.followed(), |&n| n == 2);
    drop(own_held);
    settled(&client_gate, 0, "the client's gate to count its 2 closed");

    // One namespace holds 20 connections, past its quota of 16: the dispatcher
    // follows 16 (the gate counts all 20 open), and the other namespace's new
    // connections are followed and counted exactly meanwhile.
    let hog = testbed::run_in(&bed.client_ns, move || {
        (0..20).map(|_| testbed::connect(server_addr, Duration::from_secs(1)).expect("connect")).collect::<Vec<_>>()
    })
    .expect("client namespace");
    settled(&server_gate, 20, "the hog's 20 counted open");
    let books = dispatcher.books(server_number);
    assert_eq!((books.followed, books.unfollowed), (16, 4), "the quota: {books:?}");
    let own_more = testbed::run_in(&bed.client_ns, move || {
        [own_addr, own_addr].map(|addr| {
            let mut s = testbed::connect(addr, Duration::from_secs(1)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(b"ping").unwrap();
            s.read_exact(&mut [0u8; 4]).expect("echo");
            s
        })
    })
    .expect("client namespace");
    settled(&client_gate, 2, "the other namespace's 2 counted while the hog holds its quota");
    let books = dispatcher.books(client_number);
    assert_eq!((books.followed, books.unfollowed), (2, 0), "{books:?}");
    drop((hog, own_more));
    // The 16 followed closes reach the gate, the 4 unfollowed do not (its healer's work).
    settled(&server_gate, 4, "the followed closes");
    settled(&client_gate, 0, "the other namespace's closes");
    poll(Duration::from_secs(3), "the quota's room back", || dispatcher.books(server_number).followed, |&n| n == 0);

    // Taken back: the server's namespace is handed to no gate, the client's still is.
    drop(server_gate.dispatched.take());
    assert_eq!(dispatcher.gates(), 1);
    let later = testbed::run_in(&bed.client_ns, move || {
        [server_addr, own_addr].map(|addr| testbed::connect(addr, Duration::from_secs(1)).expect("connect"))
    })
    .expect("client namespace");
    settled(&client_gate, 1, "the client's gate to count on");
    assert_eq!(snapshot_of(&server_gate).state.opened, 3 + CHURN + 20, "a gate taken back counts no new connection");
    drop(later);
}

/// `bed`'s server namespace gated under the shared object: a pod's maps
/// (`connections` in its table) with `PORT` protected as `spec` says, its
/// address local, its namespace handed over, its interface attached.
fn gate_under_shared(
    dispatcher: &std::sync::Arc<shed::kernel::dispatch::Dispatcher>,
    bed: &Testbed,
    connections: u32,
    spec: shed::kernel::maps::PortSpec,
) -> shed::kernel::programs::Loaded {
    support::shared::gate_under_shared(
        dispatcher,
        &bed.server_ns,
        &[&bed.server_if],
        &[bed.server_v4],
        connections,
        PORT,
        spec,
    )
}

/// A connection from namespace `ns` to `addr` that an echo backend answered
/// once (`ping`), held open.
fn pinged(ns: &str, addr: SocketAddr) -> io::Result<TcpStream> {
    use std::io::{Read as _, Write as _};
    testbed::run_in(ns, move || {
        let mut s = testbed::connect(addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"ping")?;
        s.read_exact(&mut [0u8; 4])?;
        Ok::<_, io::Error>(s)
    })
    .expect("client namespace")
}

/// The node agent's shared object (`Dispatcher::start_shared`): one TC
/// program and one set of dispatchers, verified once, judge and count for
/// every pod; each pod brings only its maps (`Loaded::maps_only`). Two
/// namespaces serving the same port at a limit of one connection each: each
/// is judged against its own count (one held in the first refuses the first
/// namespace's next, not the second's), counts its own requests, and a
/// namespace taken back is judged no more while the other still is.
#[test]
fn a_shared_object_judges_and_counts_each_namespace_with_its_own_maps() {
    use std::sync::Arc;

    use shed::kernel::{dispatch::Dispatcher, maps::PortSpec, programs::Loaded};
    use shed_common::{ControlConfig, action, count_mode, counter};

    let _one = exclusive();
    let (a, b) = (Testbed::create("shsa").expect("testbed"), Testbed::create("shsb").expect("testbed"));
    let dispatcher = Arc::new(Dispatcher::start_shared(64, false, false).expect("start the shared object"));
    assert!(dispatcher.shared());
    let gate_in = |bed: &Testbed, connections: u32, limit: u32| {
        let spec = PortSpec::new(limit, action::RST, false, count_mode::CONNECTIONS, ControlConfig::default());
        gate_under_shared(&dispatcher, bed, connections, spec)
    };
    let (mut gate_a, gate_b) = (gate_in(&a, 1024, 1), gate_in(&b, 1024, 1));
    assert_eq!(dispatcher.gates(), 2);
    let addr: SocketAddr = a.server_addr(false, PORT);
    assert_eq!(addr, b.server_addr(false, PORT), "the same address in both");
    let _backends = [&a, &b].map(|bed| Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend"));
    let connect = |bed: &Testbed| pinged(&bed.client_ns, addr);
    let counts = |loaded: &Loaded| {
        let config = loaded.maps.config(PORT).unwrap();
        let snapshot = loaded.maps.snapshot(PORT, config).unwrap();
        let service: u64 = loaded.maps.latency(config.slot).unwrap().service.iter().sum();
        let values = snapshot.counters.values;
        (
            snapshot.established(),
            snapshot.state.busy_enter,
            service,
            values[counter::RST_SENT],
            values[counter::CONNECTION_MAP_FULL],
        )
    };
    let settled = |loaded: &Loaded, want: (u64, u64, u64), what: &str| {
        poll(
            Duration::from_secs(3),
            what,
            || counts(loaded),
            |&(open, enter, service, ..)| (open, enter, service) == want,
        )
    };

    let held_a = connect(&a).expect("the first connection to A is admitted");
    settled(&gate_a, (1, 1, 1), "A's gate to count its connection and request");
    let refused = connect(&a);
    assert!(refused.is_err(), "A's second connection is refused at its limit of 1: {refused:?}");
    assert_eq!(counts(&gate_a).3, 1, "with one reset: {:?}", counts(&gate_a));
    // B's own count is 0: its first is admitted, though A holds one on the same port.
    let held_b = connect(&b).expect("the first connection to B is admitted");
    settled(&gate_b, (1, 1, 1), "B's gate to count its own");
    assert!(connect(&b).is_err(), "B's second is refused at its own limit");
    assert_eq!(counts(&gate_a).0, 1, "A counts none of B's");

    // A taken back (its link and its gate): A judges no more, B still does.
    gate_a.shared_links.clear();
    drop(gate_a.dispatched.take());
    assert_eq!(dispatcher.gates(), 1);
    let more_a = connect(&a).expect("A ungated admits past its old limit");
    assert!(connect(&b).is_err(), "B is still judged");
    drop((held_a, held_b, more_a));
    poll(Duration::from_secs(3), "B's close counted", || counts(&gate_b), |&(open, ..)| open == 0);

    // Each pod's tables are its own: A gated again with a connection table of
    // 4 and a limit of 100 fills its table with 8 connections (4 counted, 4
    // past it as CONNECTION_MAP_FULL), while B's limit of 1 holds exactly.
    drop(gate_a);
    let gate_a = gate_in(&a, 4, 100);
    let flood: Vec<_> = (0..8).map(|_| connect(&a).expect("under A's limit of 100")).collect();
    let full = || counts(&gate_a).4;
    poll(
        Duration::from_secs(3),
        "A's table full",
        || (counts(&gate_a).0, full()),
        |&(open, full)| (open, full) == (4, 4),
    );
    let served_b = counts(&gate_b).2;
    let held_b = connect(&b).expect("B's first, its own table empty");
    poll(
        Duration::from_secs(3),
        "B's connection and request counted beside A's full table",
        || counts(&gate_b),
        |&(open, _, service, ..)| (open, service) == (1, served_b + 1),
    );
    assert!(connect(&b).is_err(), "B's limit of 1 holds");
    drop((flood, held_b));
}

/// The shared object's turn program (its TC judge's tail call) judges the
/// next request of a pod's kept-alive connection under the pod's own maps:
/// six idle connections each send another request, which the server answers
/// slowly, at a limit of 2: two are admitted, four refused with a reset and
/// never read.
#[test]
fn a_shared_objects_turn_program_judges_a_pods_kept_alive_requests() {
    shared_turn_program_judges_kept_alive_requests(false);
}

/// The same, the agent gone once the connections are idle: the object it
/// left for the next agent still judges each next request (its turn
/// programs' array pinned with its links, or the kernel would empty it and
/// every request would pass unjudged).
#[test]
fn a_left_shared_objects_turn_program_judges_a_pods_kept_alive_requests() {
    shared_turn_program_judges_kept_alive_requests(true);
}

/// Six kept-alive connections' next requests at a limit of 2 under the
/// shared object (after its agent left it, with `left`).
fn shared_turn_program_judges_kept_alive_requests(left: bool) {
    use std::{
        io::{Read as _, Write as _},
        sync::{
            Arc,
            atomic::{AtomicU64, Ordering},
        },
    };

    use shed::kernel::{dispatch::Dispatcher, maps::PortSpec};
    use shed_common::{ControlConfig, action, count_mode, counter};

    let _one = exclusive();
    let bed = Testbed::create("shst").expect("testbed");
    let _ = std::fs::remove_dir_all(shed::host::paths::HANDOVER_PIN_DIR);
    let dispatcher = Arc::new(Dispatcher::start_shared(64, false, false).expect("start the shared object"));
    let spec = PortSpec::new(2, action::RST, false, count_mode::WORK, ControlConfig::default());
    let mut loaded = gate_under_shared(&dispatcher, &bed, 1024, spec);
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(AtomicU64::new(0));
    let backend =
        Backend::start(&bed.server_ns, addr, Service::KeepAlive { service_us: service_us.clone() }).expect("backend");
    let ask = |s: &mut TcpStream| -> io::Result<()> {
        s.write_all(b"GET\n")?;
        s.read_exact(&mut [0u8; 3])
    };
    let mut idle: Vec<TcpStream> = testbed::run_in(&bed.client_ns, move || {
        (0..6)
            .map(|i| {
                let mut s = testbed::connect(addr, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{i}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                ask(&mut s).unwrap_or_else(|e| panic!("request on connection {i}: {e}"));
                s
            })
            .collect()
    })
    .expect("client namespace");
    let read_before = backend.read.load(Ordering::Relaxed);
    if left {
        // The agent leaves: the pod's link pinned, its maps kept at its gate,
        // the object's own handles all closed (the maps here stay open to be read).
        dispatcher.leave_for_successor(Duration::from_mins(1)).expect("leave for the next agent");
        loaded.shared_links.clear();
        loaded.dispatched = None;
        loaded.shared = None;
        assert_eq!(Arc::strong_count(&dispatcher), 1, "the test holds the last handle of the agent's object");
    }
    drop(dispatcher);
    let counted = |index: usize| {
        let config = loaded.maps.config(PORT).unwrap();
        loaded.maps.snapshot(PORT, config).unwrap().counters.values[index]
    };
    service_us.store(1_500_000, Ordering::Relaxed);
    for s in &mut idle {
        s.write_all(b"GET\n").expect("send the next request");
    }
    poll(
        Duration::from_secs(3),
        "the six next requests judged",
        || (counted(counter::REQUEST_ADMITTED), counted(counter::REFUSED_REQUEST)),
        |&(admitted, refused)| admitted + refused == 6,
    );
    assert_eq!((counted(counter::REQUEST_ADMITTED), counted(counter::REFUSED_REQUEST)), (2, 4));
    let (mut answered, mut reset) = (0, 0);
    for s in &mut idle {
        match s.read_exact(&mut [0u8; 3]) {
            Ok(()) => answered += 1,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => reset += 1,
            Err(e) => panic!("neither answered nor reset: {e}"),
        }
    }
    assert_eq!((answered, reset), (2, 4));
    assert_eq!(backend.read.load(Ordering::Relaxed), read_before + 2, "refused requests were never read");
    drop((idle, loaded));
    let _ = std::fs::remove_dir_all(shed::host::paths::HANDOVER_PIN_DIR);
}

/// `shedctl attach <args>` inside `cgroup`, its stderr piped.
fn attach_in(cgroup: &shed_testkit::cgroup::MemoryCgroup, args: &[String]) -> std::process::Child {
    std::process::Command::new(cgroup.shedctl())
        .arg("attach")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Under the shipped DaemonSet's memory limit (256 MiB when 30 namespaces
/// were OOM-killed with nothing gated; 512 MiB now), 30 namespaces are
/// refused before anything is attached (exit 4, the budget named), and one
/// namespace runs in the same limit.
#[test]
fn namespaces_past_the_memory_budget_are_refused_not_oom_killed() {
    let _one = exclusive();
    let names: Vec<String> = (0..30).map(|i| format!("shedmb{i}")).collect();
    for n in &names {
        let _ = std::process::Command::new("ip").args(["netns", "del", n]).output();
        assert!(std::process::Command::new("ip").args(["netns", "add", n]).status().unwrap().success());
    }
    let _cleanup = Namespaces(names.clone());
    let limit = shed_testkit::cgroup::daemonset_memory_limit();
    let cgroup = shed_testkit::cgroup::MemoryCgroup::create("shed-budget-test", limit);
    let mut args: Vec<String> = names.iter().flat_map(|n| ["--netns".to_owned(), n.clone()]).collect();
    args.extend(["--port", "8080"].map(String::from));
    let out = attach_in(&cgroup, &args).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "refused, not killed: {:?} {stderr}", out.status);
    assert!(stderr.contains("30 more gate(s) need about 1920 MiB") && stderr.contains("--memory-budget"), "{stderr}");
    assert!(!Path::new(paths::PIN_DIR).exists(), "nothing attached");
    assert_eq!(cgroup.oom_kills(), 0);

    // One namespace fits the same limit and runs.
    let one = ["--netns".to_owned(), names[0].clone(), "--port".to_owned(), "8080".to_owned()];
    let mut child = attach_in(&cgroup, &one);
    poll(
        Duration::from_secs(30),
        "the gate up in the DaemonSet's limit",
        || shedctl(&["stats", "--json"]).status.success(),
        |&up| up,
    );
    assert!(child.try_wait().unwrap().is_none(), "one namespace runs in the DaemonSet's limit");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert_eq!(cgroup.oom_kills(), 0);
}

/// Deletes the named namespaces on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = std::process::Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// A leave that cannot pin (the handover folder is not on bpffs) leaves
/// nothing: the call says why, the agent is not leaving, the folder it made
/// is gone, and the pod's link detaches as its gate ends, as without a
/// handover. Once the object goes its link and program go with it: nothing
/// judges the pod past its agent, and no lease of a failed leave lingers in
/// the next agent's way.
#[test]
fn a_leave_that_cannot_pin_leaves_nothing_judging() {
    use std::sync::Arc;

    use aya::programs::{SchedClassifier, TcAttachType};
    use shed::{
        host::paths::HANDOVER_PIN_DIR,
        kernel::{dispatch::Dispatcher, maps::PortSpec},
    };
    use shed_common::{ControlConfig, action, count_mode};

    /// A tmpfs over the handover folder (a pin there fails); unmounted on drop.
    struct NotBpffs;
    impl Drop for NotBpffs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(HANDOVER_PIN_DIR).status();
            let _ = std::fs::remove_dir_all(HANDOVER_PIN_DIR);
        }
    }

    let _one = exclusive();
    let _ = std::fs::remove_dir_all(HANDOVER_PIN_DIR);
    std::fs::create_dir_all(HANDOVER_PIN_DIR).expect("the handover folder");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "shed-not-bpffs", HANDOVER_PIN_DIR])
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount a tmpfs over {HANDOVER_PIN_DIR}");
    let _not_bpffs = NotBpffs;

    let bed = Testbed::create("shhf").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let iface = bed.server_if.clone();
    let programs = || {
        let iface = iface.clone();
        testbed::run_in(&bed.server_ns, move || {
            let (_, programs) = SchedClassifier::query_tcx(&iface, TcAttachType::Ingress).expect("query tcx");
            programs.len()
        })
        .expect("server namespace")
    };
    let spec = PortSpec::new(1, action::RST, false, count_mode::CONNECTIONS, ControlConfig::default());
    let agent = Arc::new(Dispatcher::start_shared(64, false, false).expect("start a shared object"));
    let pod = gate_under_shared(&agent, &bed, 1024, spec);
    let held = pinged(&bed.client_ns, addr).expect("the first connection is admitted");
    poll(Duration::from_secs(3), "refused at the limit of 1", || pinged(&bed.client_ns, addr).is_err(), |&r| r);

    let e = agent.leave_for_successor(Duration::from_secs(30)).expect_err("no pin outside bpffs");
    assert!(e.to_string().contains("turn programs' array"), "says what it could not leave: {e}");
    assert!(!agent.leaving(), "not leaving after a failed leave");
    let left: Vec<_> = std::fs::read_dir(HANDOVER_PIN_DIR).unwrap().collect();
    assert!(left.is_empty(), "the failed leave's folder is removed: {left:?}");
    // Still the agent's own gate meanwhile: its dispatchers count and it judges.
    assert!(pinged(&bed.client_ns, addr).is_err(), "judged after the failed leave");

    drop(pod);
    drop(agent);
    poll(Duration::from_secs(3), "the pod's link gone with its gate", programs, |&n| n == 0);
    let past = pinged(&bed.client_ns, addr).expect("nothing judges the pod once its agent is gone");
    drop((held, past));
}

/// A node agent leaving on SIGTERM (a restart, a rolling update) leaves its
/// shared object judging every pod for the next agent
/// (`Dispatcher::leave_for_successor`). With the first agent gone, its
/// program still refuses a pod's connection past the limit and its
/// dispatchers still count the pod's closes. The next agent's shared object
/// takes the pod's link over (its program replaces the old one on the same
/// link: one program on the interface throughout) and judges under its own
/// maps; the old object's pins go once every pod is taken. An object left
/// and not taken over judges nothing once its lease is up (fail-open), and
/// the next agent to start removes its pins.
#[test]
fn a_leaving_agents_shared_object_judges_until_the_next_agent_takes_each_pod_over() {
    use std::{path::Path, sync::Arc};

    use aya::programs::{SchedClassifier, TcAttachType};
    use shed::{
        host::paths::HANDOVER_PIN_DIR,
        kernel::{dispatch::Dispatcher, maps::PortSpec, programs::Loaded},
    };
    use shed_common::{ControlConfig, action, count_mode};

    let _one = exclusive();
    let _ = std::fs::remove_dir_all(HANDOVER_PIN_DIR);
    let bed = Testbed::create("shho").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let spec = || PortSpec::new(1, action::RST, false, count_mode::CONNECTIONS, ControlConfig::default());
    let connect = || pinged(&bed.client_ns, addr);
    let iface = bed.server_if.clone();
    let programs = || {
        let iface = iface.clone();
        testbed::run_in(&bed.server_ns, move || {
            let (_, programs) = SchedClassifier::query_tcx(&iface, TcAttachType::Ingress).expect("query tcx");
            programs.iter().map(aya::programs::ProgramInfo::id).collect::<Vec<u32>>()
        })
        .expect("server namespace")
    };
    let open = |loaded: &Loaded| {
        let config = loaded.maps.config(PORT).unwrap();
        loaded.maps.snapshot(PORT, config).unwrap().established()
    };

    // The first agent: its pod holds its one connection.
    let first = Arc::new(Dispatcher::start_shared(64, false, false).expect("start the first shared object"));
    let pod = gate_under_shared(&first, &bed, 1024, spec());
    let held = connect().expect("the first connection is admitted");
    poll(Duration::from_secs(3), "the first agent's count", || open(&pod), |&n| n == 1);
    assert!(connect().is_err(), "refused at the limit of 1");
    let old_program = programs();
    assert_eq!(old_program.len(), 1, "one program on the interface: {old_program:?}");

    // It leaves (SIGTERM): the pod's gate and the agent end, their programs stay.
    first.leave_for_successor(Duration::from_secs(30)).expect("leave for the next agent");
    drop(pod);
    drop(first);
    assert_eq!(programs(), old_program, "the left link stays attached");
    assert!(connect().is_err(), "the left object still refuses past the limit");
    drop(held);
    // Its dispatchers counted the close: the next connection is admitted, then held.
    let held = poll(Duration::from_secs(3), "the left object's count to free the slot", connect, Result::is_ok)
        .expect("admitted once the close is counted");
    assert!(connect().is_err(), "refused again with the slot held");

    // The next agent takes the pod over: the same link, its own program and maps.
    let next = Arc::new(Dispatcher::start_shared(64, false, false).expect("start the next shared object"));
    let pod = gate_under_shared(&next, &bed, 1024, spec());
    let new_program = programs();
    assert_eq!(new_program.len(), 1, "still one program on the interface: {new_program:?}");
    assert_ne!(new_program, old_program, "the next agent's program judges now");
    // Its maps start from nothing: the connection the old object counted is not
    // its, so one more is admitted (fail-open), then it refuses.
    let newer = connect().expect("the next agent's first");
    poll(Duration::from_secs(3), "the next agent's count", || open(&pod), |&n| n == 1);
    assert!(connect().is_err(), "the next agent refuses past its limit");
    next.finish_takeover();
    assert!(!Path::new(HANDOVER_PIN_DIR).exists(), "the old object's pins go once its pod is taken over");
    drop((held, newer));

    // Left with a lease of 3 s and never taken over: it passes everything once the lease is up.
    poll(Duration::from_secs(3), "the next agent's closes counted", || open(&pod), |&n| n == 0);
    let held = connect().expect("admitted with the slot free");
    let lease = Duration::from_secs(3);
    let leased = std::time::Instant::now();
    next.leave_for_successor(lease).expect("leave again");
    drop(pod);
    drop(next);
    assert!(connect().is_err(), "judged while the lease runs");
    assert!(leased.elapsed() < lease, "checked within the lease ({:?})", leased.elapsed());
    std::thread::sleep(lease.saturating_sub(leased.elapsed()) + Duration::from_millis(300));
    let past = connect().expect("a lapsed lease judges nothing: admitted past the limit");
    assert_eq!(programs().len(), 1, "attached, but judging nothing");
    let last = Arc::new(Dispatcher::start_shared(64, false, false).expect("start another shared object"));
    assert!(!Path::new(HANDOVER_PIN_DIR).exists(), "a lapsed object's pins go when the next agent starts");
    // The kernel frees a link's program after a grace period, not at its unpin.
    poll(Duration::from_secs(3), "the lapsed object's link gone with its pins", programs, Vec::is_empty);
    drop((held, past));

    // Left, then the pod goes before the next agent takes it: its link, attached
    // to nothing now, is not waited for; the old object goes.
    let pod = gate_under_shared(&last, &bed, 1024, spec());
    last.leave_for_successor(Duration::from_secs(30)).expect("leave once more");
    drop(pod);
    drop(last);
    let after_the_pod = Dispatcher::start_shared(64, false, false).expect("start a shared object");
    assert!(Path::new(HANDOVER_PIN_DIR).exists(), "left while the pod lives");
    drop(backend);
    drop(bed);
    poll(
        Duration::from_secs(20),
        "the left links of a pod gone to go",
        || {
            after_the_pod.finish_takeover();
            Path::new(HANDOVER_PIN_DIR).exists()
        },
        |&left| !left,
    );
}
