// SPDX-License-Identifier: MIT OR Apache-2.0
//! `--action http` end to end, with real HTTP clients: curl (IPv4 and IPv6,
//! and a request too large for one segment), Python urllib3 with a `Retry`
//! that honours Retry-After, and `h2load --h1`. Each is shed while the port
//! is full and sees `503` with Retry-After and the gate's `Shed` header,
//! answered by the gate alone: nothing reaches the listener. Needs root.
mod support;

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Command, Output},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use shed_testkit::testbed::{self, Testbed};
use support::gate::{Gate, exclusive, field, stats, wait_for_stats};

const PORT: u16 = 8080;
const RETRY_AFTER: u64 = 2;

/// An HTTP/1.1 server in the server namespace (IPv4 and IPv6): each
/// connection on a thread of its own, answered `200 OK` once its request
/// head is in, or closed when the client closes first (so an idle connection
/// holds the port's one place for as long as its client keeps it open).
struct Server {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    fn start(ns: &str) -> Self {
        let listener = testbed::run_in(ns, || {
            let l = TcpListener::bind(("::", PORT)).expect("bind [::]:8080");
            l.set_nonblocking(true).unwrap();
            l
        })
        .expect("server namespace");
        let (stop, accepted) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (s, a) = (stop.clone(), accepted.clone());
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        a.fetch_add(1, Ordering::Relaxed);
                        thread::spawn(move || answer(conn));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self { stop, accepted, thread: Some(thread) }
    }
}

fn answer(mut conn: TcpStream) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_mins(1)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n");
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `program args` in the client namespace, bounded by `timeout`.
fn client(bed: &Testbed, timeout: Duration, program: &str, args: &[&str]) -> Output {
    let secs = timeout.as_secs().max(1).to_string();
    let out = Command::new("timeout")
        .args([&secs, "ip", "netns", "exec", &bed.client_ns, program])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program} (cargo xtask setup installs it): {e}"));
    assert_ne!(out.status.code(), Some(124), "{program} {args:?} timed out after {timeout:?}");
    out
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

/// The gate's 503, as curl prints its head (`-i`).
fn assert_shed_answer(what: &str, out: &Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what}: curl failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    let head: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(head[0], "HTTP/1.1 503 Service Unavailable", "{what}:\n{text}");
    for line in [
        format!("Retry-After: {RETRY_AFTER:03}"),
        "Connection: close".into(),
        "Content-Length: 0".into(),
        "Shed: kernel; reason=limit; tier=normal".into(),
    ] {
        assert!(head.contains(&line.as_str()), "{what}: no `{line}` in\n{text}");
    }
}

#[test]
fn real_http_clients_are_shed_with_a_503_and_back_off_as_told() {
    let _gate_turn = exclusive();
    let bed = Testbed::create("shedhttp").expect("testbed");
    let server = Server::start(&bed.server_ns);
    let retry = RETRY_AFTER.to_string();
    let _gate = Gate::start(
        &bed,
        &["--port", "8080", "--limit", "1", "--count", "connections", "--action", "http", "--retry-after", &retry],
    );
    let (v4, v6) = (bed.server_addr(false, PORT), bed.server_addr(true, PORT));

    // One idle connection fills the port (limit 1, counting connections).
    let holder = testbed::run_in(&bed.client_ns, move || testbed::connect(v4, Duration::from_secs(5)))
        .expect("client namespace")
        .expect("the first connection is admitted");
    wait_for_stats(PORT, Duration::from_secs(5), "the holder counted", |s| field(s, "in_flight") == 1);
    let accepted = server.accepted.load(Ordering::Relaxed);

    // curl, IPv4 and IPv6; then a request whose head needs several segments
    // (the gate's SYN-ACK offers no MSS: the client sends at most 536 bytes a segment).
    assert_shed_answer("curl IPv4", &client(&bed, Duration::from_secs(10), "curl", &["-sS", "-i", &url(v4)]));
    assert_shed_answer("curl IPv6", &client(&bed, Duration::from_secs(10), "curl", &["-sS", "-i", "-g", &url(v6)]));
    let pad = format!("X-Pad: {}", "p".repeat(1500));
    let big = client(&bed, Duration::from_secs(10), "curl", &["-sS", "-i", "-H", &pad, &url(v4)]);
    assert_shed_answer("curl with a 1.5 KB header", &big);
    let s = stats(PORT);
    assert_eq!((field(&s, "http_syn_acks"), field(&s, "http_answers")), (3, 3), "{s}");

    // h2load over HTTP/1.1: every request answered 503, none an error.
    let h2load = client(&bed, Duration::from_secs(20), "h2load", &["--h1", "-n", "20", "-c", "2", &url(v4)]);
    let report = String::from_utf8_lossy(&h2load.stdout);
    assert!(report.contains("status codes: 0 2xx, 0 3xx, 0 4xx, 20 5xx"), "h2load:\n{report}");
    assert!(report.contains("20 done") && report.contains(" 0 errored"), "h2load:\n{report}");
    assert_eq!(server.accepted.load(Ordering::Relaxed), accepted, "no shed request reached the listener");

    // urllib3 with a Retry that honours Retry-After and no backoff of its own:
    // shed, it waits the 2 s it is told (meanwhile the port frees), then gets 200.
    let script = r#"
import sys, time, urllib3
from urllib3.util.retry import Retry
retry = Retry(total=3, status_forcelist=[503], backoff_factor=0, respect_retry_after_header=True)
started = time.monotonic()
r = urllib3.PoolManager().request("GET", sys.argv[1], retries=retry, timeout=5.0)
print(r.status, time.monotonic() - started, len(r.retries.history))
"#;
    let release = thread::spawn(move || {
        thread::sleep(Duration::from_millis(700));
        drop(holder);
    });
    let out = client(&bed, Duration::from_secs(30), "/usr/bin/python3", &["-c", script, &url(v4)]);
    release.join().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "urllib3: {}\n{said}", String::from_utf8_lossy(&out.stderr));
    let words: Vec<&str> = said.split_whitespace().collect();
    let (status, took, retries): (u16, f64, usize) =
        (words[0].parse().unwrap(), words[1].parse().unwrap(), words[2].parse().unwrap());
    eprintln!("urllib3: status, seconds, retries: {said}");
    assert_eq!(status, 200, "urllib3 ends with the real answer: {said}");
    // At least one: its first attempt was shed; how many more depends on when the held slot frees.
    assert!(retries >= 1, "urllib3 was shed first: {said}");
    assert!(took >= RETRY_AFTER as f64 * 0.95, "urllib3 waited the Retry-After ({RETRY_AFTER} s): {said}");
    let s = stats(PORT);
    assert_eq!(field(&s, "http_answers"), 3 + 20 + retries as u64, "one 503 per shed attempt: {s}");
    assert_eq!(field(&s, "http_not_http"), 0, "{s}");

    // A client that reuses its port: its last connection, admitted and closed
    // by the server first, left a TIME_WAIT socket on the server for that
    // 4-tuple. Shed the next time, its request still gets the gate's 503.
    // (The client reads to the server's FIN before it closes: the TIME_WAIT is the server's.)
    let from_port = r#"
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", 45123))
s.connect((sys.argv[1], 8080))
s.sendall(b"GET / HTTP/1.1\r\nHost: shed\r\n\r\n")
got = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    got += chunk
s.close()
sys.stdout.write(got.decode())
"#;
    let server_ip = bed.server_v4.to_string();
    wait_for_stats(PORT, Duration::from_secs(5), "the port empty", |s| field(s, "in_flight") == 0);
    let admitted = client(&bed, Duration::from_secs(10), "/usr/bin/python3", &["-c", from_port, &server_ip]);
    assert!(String::from_utf8_lossy(&admitted.stdout).starts_with("HTTP/1.1 200 OK"), "{admitted:?}");
    let holder =
        testbed::run_in(&bed.client_ns, move || testbed::connect(v4, Duration::from_secs(5))).unwrap().unwrap();
    wait_for_stats(PORT, Duration::from_secs(5), "the holder counted", |s| field(s, "in_flight") == 1);
    let reused = client(&bed, Duration::from_secs(10), "/usr/bin/python3", &["-c", from_port, &server_ip]);
    assert_shed_answer("a client port whose last connection is in the server's TIME_WAIT", &reused);
    drop(holder);
}

/// The answer grows the frame (a 503 is longer than the request segment it
/// answers): on XDP too, native and generic, with `bpf_xdp_adjust_tail` and
/// `XDP_TX` (the client end runs an XDP program, as a veth needs to deliver
/// XDP_TX frames).
#[test]
fn the_answer_leaves_by_xdp_too() {
    for mode in ["native", "generic"] {
        let _gate_turn = exclusive();
        let bed = Testbed::create("shedhx").expect("testbed");
        let iface = bed.client_if.clone();
        let _peer = testbed::run_in(&bed.client_ns, move || {
            let mut loaded = shed::kernel::programs::Loaded::new(None).expect("load object");
            loaded.xdp_pass().unwrap().attach(&iface, aya::programs::XdpMode::default()).expect("peer XDP");
            loaded
        })
        .unwrap();
        let server = Server::start(&bed.server_ns);
        let _gate = Gate::start(
            &bed,
            &[
                "--port",
                "8080",
                "--limit",
                "1",
                "--count",
                "connections",
                "--action",
                "http",
                "--retry-after",
                "2",
                "--hook",
                "xdp",
                "--xdp-mode",
                mode,
            ],
        );
        let v4 = bed.server_addr(false, PORT);
        let holder = testbed::run_in(&bed.client_ns, move || testbed::connect(v4, Duration::from_secs(5)))
            .expect("client namespace")
            .expect("the first connection is admitted");
        wait_for_stats(PORT, Duration::from_secs(5), "the holder counted", |s| field(s, "in_flight") == 1);
        let accepted = server.accepted.load(Ordering::Relaxed);
        for v6 in [false, true] {
            let addr = bed.server_addr(v6, PORT);
            let out = client(&bed, Duration::from_secs(10), "curl", &["-sS", "-i", "-g", &url(addr)]);
            assert_shed_answer(&format!("XDP {mode}, v6={v6}"), &out);
        }
        assert_eq!(server.accepted.load(Ordering::Relaxed), accepted, "XDP {mode}: nothing shed reached the listener");
        drop(holder);
    }
}

/// `set --retry-after` changes what a refused client is told, live, and
/// `stats --json` and the scrape say what it is told: the port's own seconds,
/// else (0) what the daemon derives from the queue wait (at least 1).
#[test]
fn the_retry_after_is_set_live_and_reported() {
    let _gate_turn = exclusive();
    let bed = Testbed::create("shedra").expect("testbed");
    let _server = Server::start(&bed.server_ns);
    let args = [
        "--port",
        "8080",
        "--limit",
        "1",
        "--count",
        "connections",
        "--algo",
        "fixed",
        "--action",
        "http",
        "--retry-after",
        "7",
        "--metrics",
        "127.0.0.1:19471",
    ];
    let _gate = Gate::start(&bed, &args);
    let v4 = bed.server_addr(false, PORT);
    let _holder = testbed::run_in(&bed.client_ns, move || testbed::connect(v4, Duration::from_secs(5)))
        .expect("client namespace")
        .expect("the first connection is admitted");
    wait_for_stats(PORT, Duration::from_secs(5), "the holder counted", |s| field(s, "in_flight") == 1);
    let told = |bed: &Testbed| {
        let out = client(bed, Duration::from_secs(10), "curl", &["-sS", "-i", &url(v4)]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split("\r\n").find_map(|l| l.strip_prefix("Retry-After: ")).map(str::to_owned).unwrap_or(text)
    };
    let scraped = || {
        let (_, body) = support::metrics::http_get("127.0.0.1:19471", "/metrics");
        body.lines().find_map(|l| l.strip_prefix("shed_retry_after_seconds{")).map(str::to_owned).unwrap_or_default()
    };
    assert_eq!((field(&stats(PORT), "retry_after"), told(&bed)), (7, "007".into()));
    assert!(scraped().ends_with("} 7"), "{}", scraped());
    for (seconds, expected) in [("5", 5), ("0", 1)] {
        let set = support::gate::shedctl(&["set", "--port", "8080", "--retry-after", seconds]);
        assert!(set.status.success(), "set --retry-after {seconds}: {}", String::from_utf8_lossy(&set.stderr));
        // 0: the controller's queue wait, rounded up: no queue here, so 1.
        assert_eq!(field(&stats(PORT), "retry_after"), expected, "--retry-after {seconds}");
        assert_eq!(told(&bed), format!("{expected:03}"), "--retry-after {seconds}");
        assert!(scraped().ends_with(&format!("}} {expected}")), "{}", scraped());
    }
}

/// The answer names why and whom it refused, for each rule and tier judged at
/// the SYN, to a POST with a body (curl) and to half a head, pushed (answered
/// at once: the client may be waiting for it); nothing reaches the listener.
/// One client namespace, two clients: its IPv4 and its IPv6 address.
#[test]
fn the_503_names_each_reason_and_tier_for_a_post_and_a_pushed_head() {
    let _gate_turn = exclusive();
    let bed = Testbed::create("shedhr").expect("testbed");
    let server = Server::start(&bed.server_ns);
    let args = [
        "--port",
        "8080",
        "--limit",
        "10",
        "--count",
        "connections",
        "--algo",
        "fixed",
        "--action",
        "http",
        "--client-cap",
        "1",
        "--retry-after",
        "2",
    ];
    let _gate = Gate::start(&bed, &args);
    let (v4, v6) = (bed.server_addr(false, PORT), bed.server_addr(true, PORT));
    // The client namespace's IPv4 address (Testbed's fixed plan).
    let client_v4 = "10.200.0.2/32";
    let hold = |addr: SocketAddr| {
        testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(5)))
            .expect("client namespace")
            .expect("admitted")
    };
    let shedctl = |args: &[&str]| {
        let out = support::gate::shedctl(args);
        assert!(out.status.success(), "shedctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // The answer's head, to a POST with a body.
    let post = |bed: &Testbed| {
        let out =
            client(bed, Duration::from_secs(10), "curl", &["-sS", "-i", "-X", "POST", "--data", "a=1&b=2", &url(v4)]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    // The answer to half a head, pushed (TCP_NODELAY: PSH on the segment).
    let pushed = |bed: &Testbed| {
        testbed::run_in(&bed.client_ns, move || {
            let mut s = testbed::connect(v4, Duration::from_secs(5)).expect("the gate answers the handshake");
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // Half a head, pushed: the client may be waiting, so it is
            // answered now (OPERATIONS: "or the client pushes").
            s.write_all(b"POST /orders HTTP/1.1\r\nHost: shop\r\n").unwrap();
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            answer
        })
        .expect("client namespace")
    };
    let check = |what: &str, text: &str, shed: &str| {
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{what}:\n{text}");
        assert!(text.contains(&format!("\r\nShed: kernel; {shed}\r\n")), "{what}: not `{shed}`:\n{text}");
        assert!(text.contains("\r\nRetry-After: 002\r\n"), "{what}:\n{text}");
    };
    let accepted = || server.accepted.load(Ordering::Relaxed);

    // The client's cap: its IPv4 address holds its one connection.
    let _held_v4 = hold(v4);
    wait_for_stats(PORT, Duration::from_secs(5), "the first held", |s| field(s, "in_flight") == 1);
    check("client cap, POST", &post(&bed), "reason=client-cap; tier=normal");
    check("client cap, pushed head", &pushed(&bed), "reason=client-cap; tier=normal");

    // The limit: the IPv6 client takes the second place of two.
    shedctl(&["set", "--port", "8080", "--client-cap", "0", "--limit", "2"]);
    let _held_v6 = hold(v6);
    wait_for_stats(PORT, Duration::from_secs(5), "both held", |s| field(s, "in_flight") == 2);
    check("limit, POST", &post(&bed), "reason=limit; tier=normal");
    check("limit, pushed head", &pushed(&bed), "reason=limit; tier=normal");

    // A tier's share, with room left in the port: low may hold a quarter of 4,
    // and the IPv4 client, now low, holds one.
    shedctl(&["set", "--port", "8080", "--limit", "4", "--share", "low=0.25"]);
    shedctl(&["tier", "add", client_v4, "low"]);
    check("share, low, POST", &post(&bed), "reason=share; tier=low");
    check("share, low, pushed head", &pushed(&bed), "reason=share; tier=low");

    // The limit for a low client; a critical one on this tiered port is judged
    // only at its ACK (its SYN proves nothing), where the kernel's handshake is
    // under way: refused with a reset, as documented, never a 503.
    shedctl(&["set", "--port", "8080", "--limit", "2", "--share", "low=1"]);
    check("limit, low, POST", &post(&bed), "reason=limit; tier=low");
    shedctl(&["tier", "add", client_v4, "critical"]);
    let at_ack = field(&stats(PORT), "refused_at_ack");
    let reset = post(&bed);
    assert!(!reset.contains("HTTP/1.1"), "a critical client refused at its ACK is reset:\n{reset}");
    assert_eq!(field(&stats(PORT), "refused_at_ack"), at_ack + 1, "{}", stats(PORT));

    assert_eq!(accepted(), 2, "only the two held connections reached the listener, no refused one");
    let s = stats(PORT);
    let reasons = &s["rejected_by_reason"];
    assert_eq!(
        (reasons["client_cap"].as_u64(), reasons["limit"].as_u64(), reasons["share"].as_u64()),
        (Some(2), Some(4), Some(2)),
        "{s}"
    );
}

/// What a client of nginx gets when nginx's upstream is gated and full, for
/// each action (OPERATIONS, "Behind a proxy"): `drop` leaves nginx waiting
/// out its `proxy_connect_timeout` for a SYN that is never answered (then
/// 504), `rst` is a 502 at once (nginx logs a refused upstream), and `http`
/// a 503 at once, the gate's own answer passed through. nginx in the client
/// namespace proxies to the gated server; one held connection fills its
/// limit of 1.
#[test]
fn nginx_in_front_of_a_gated_backend_answers_each_action_as_documented() {
    let _one = exclusive();
    let bed = Testbed::create("shedng").expect("testbed");
    let upstream = bed.server_addr(false, PORT);
    // Holds an idle connection as long as its client does (the one that fills the limit).
    let _backend = Server::start(&bed.server_ns);
    let front: SocketAddr = "127.0.0.1:18080".parse().unwrap();
    const CONNECT_TIMEOUT_S: u32 = 3;
    let _nginx =
        shed_testkit::servers::Nginx::start_with_connect_timeout(&bed.client_ns, front, upstream, CONNECT_TIMEOUT_S)
            .expect("nginx");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "1", "--count", "connections", "--action", "drop"]);
    wait_for_stats(PORT, Duration::from_secs(5), "the gate up", |s| field(s, "limit") == 1);
    // Through nginx: the status line it answers, and how long it took.
    let ask = || {
        testbed::run_in(&bed.client_ns, move || {
            let start = std::time::Instant::now();
            let mut conn = TcpStream::connect(front)?;
            conn.set_read_timeout(Some(Duration::from_secs(15)))?;
            conn.write_all(b"GET / HTTP/1.1\r\nHost: shed\r\nConnection: close\r\n\r\n")?;
            let mut head = [0u8; 12];
            conn.read_exact(&mut head)?;
            Ok::<_, std::io::Error>((String::from_utf8_lossy(&head[9..12]).into_owned(), start.elapsed()))
        })
        .expect("client namespace")
        .expect("nginx answers")
    };
    assert_eq!(ask().0, "200", "under the limit nginx's request passes");
    // One connection held from the client namespace fills the limit.
    let _held = testbed::run_in(&bed.client_ns, move || TcpStream::connect(upstream)).unwrap().expect("held");
    wait_for_stats(PORT, Duration::from_secs(5), "the holder counted", |s| field(s, "in_flight") == 1);
    let (status, took) = ask();
    assert_eq!(status, "504", "drop: nginx waits for a SYN-ACK that never comes ({took:?}): {}", stats(PORT));
    assert!(took >= Duration::from_millis(u64::from(CONNECT_TIMEOUT_S) * 1000 - 200), "{took:?}");
    for (action, code) in [("rst", "502"), ("http", "503")] {
        let out = support::gate::shedctl(&["set", "--port", "8080", "--action", action]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (status, took) = ask();
        assert_eq!(status, code, "{action}: nginx answers {code}");
        assert!(took < Duration::from_secs(1), "{action}: at once, not after a timeout: {took:?}");
    }
}
