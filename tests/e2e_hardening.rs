// SPDX-License-Identifier: MIT OR Apache-2.0
//! What a client sends cannot take the gate down: a segment crossing
//! stacked devices is judged once, the metrics endpoint outlives more idle
//! clients than the daemon has files, a large tier file loads at once, and
//! every path to a protected listener is judged (AnyIP, TPROXY) or refused at
//! attach (NAT that rewrites the port after the gate).
//! The real `shedctl`, real kernel programs, real sockets between network
//! namespaces. Needs root.
mod support;

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    process::Command,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use shed_testkit::{
    gate::Log,
    metrics::http_get,
    testbed::{self, Backend, Service, Testbed},
};
use support::gate::{Gate, exclusive, field, poll, stats, wait_for_stats};

const PORT: u16 = 8080;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// The whole namespace gated (as the DaemonSet runs), the server's address on
/// a bridge whose port is the veth, or on a macvlan over it: every segment
/// crosses two gated devices, and is judged once (a SYN counted twice left
/// phantom reservations: `--limit 5 --count connections` admitted 2 of 10).
#[test]
fn a_segment_crossing_stacked_devices_is_judged_once() {
    let _one = exclusive();
    for kind in ["bridge", "macvlan"] {
        let bed = Testbed::create("shedhs").expect("testbed");
        let (sn, s) = (bed.server_ns.as_str(), bed.server_if.as_str());
        // The server's address moves from the veth to the upper device.
        ip(&["-n", sn, "addr", "flush", "dev", s]);
        match kind {
            "bridge" => {
                ip(&["-n", sn, "link", "add", "shedbr0", "type", "bridge"]);
                ip(&["-n", sn, "link", "set", s, "master", "shedbr0"]);
            }
            _ => ip(&["-n", sn, "link", "add", "shedbr0", "link", s, "type", "macvlan", "mode", "bridge"]),
        }
        ip(&["-n", sn, "addr", "add", "10.200.0.1/24", "dev", "shedbr0"]);
        ip(&["-n", sn, "link", "set", "shedbr0", "up"]);
        let addr = bed.server_addr(false, PORT);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let _gate = Gate::attach(&[
            "--netns",
            sn,
            "--port",
            "8080",
            "--limit",
            "5",
            "--count",
            "connections",
            "--action",
            "rst",
        ]);
        // 20 connections, opened and closed one by one.
        testbed::run_in(&bed.client_ns, move || {
            for i in 0..20 {
                let c = testbed::connect(addr, Duration::from_secs(2)).unwrap_or_else(|e| panic!("{kind} #{i}: {e}"));
                drop(c);
                thread::sleep(Duration::from_millis(5));
            }
        })
        .unwrap();
        let s = wait_for_stats(PORT, Duration::from_secs(3), "all closed", |s| field(s, "in_flight") == 0);
        println!("{kind}: {s}");
        assert_eq!((field(&s, "syn_seen"), field(&s, "admitted")), (20, 20), "{kind}: judged once each: {s}");
        assert_eq!(field(&s, "handshakes_lapsed"), 0, "{kind}: no phantom reservation: {s}");
        // The limit holds exactly: 5 of 10 held connections.
        let held: Vec<_> = testbed::run_in(&bed.client_ns, move || {
            (0..10).map(|_| testbed::connect(addr, Duration::from_secs(1))).collect::<Vec<_>>()
        })
        .unwrap();
        let admitted = held.iter().filter(|r| r.is_ok()).count();
        assert_eq!(admitted, 5, "{kind}: limit 5 admits 5 of 10: {}", stats(PORT));
        drop(held);
    }
}

/// A listener with `TCP_DEFER_ACCEPT` (nginx's `deferred`, HAProxy's
/// `defer-accept`) drops the handshake-completing ACK and completes the
/// handshake with the request behind it, so both find the request socket:
/// the request belongs to the handshake its ACK was admitted for, and holds
/// that reservation (judged twice, every connection took a second
/// reservation that lapsed; the same race as an ACK and its request judged
/// on two CPUs at once).
#[test]
fn a_handshake_completed_by_its_request_is_judged_once() {
    let _one = exclusive();
    let bed = Testbed::create("shedhd").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start_deferred(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "5", "--count", "connections", "--action", "rst"]);
    let echo = |c: &mut TcpStream| -> std::io::Result<()> {
        c.set_read_timeout(Some(Duration::from_secs(1)))?;
        c.write_all(b"p")?;
        c.read_exact(&mut [0u8; 1])
    };
    testbed::run_in(&bed.client_ns, move || {
        for i in 0..20 {
            let mut c = testbed::connect(addr, Duration::from_secs(2)).unwrap_or_else(|e| panic!("#{i}: {e}"));
            echo(&mut c).unwrap_or_else(|e| panic!("#{i} served: {e}"));
            drop(c);
            thread::sleep(Duration::from_millis(5));
        }
    })
    .unwrap();
    let s = wait_for_stats(PORT, Duration::from_secs(3), "all closed", |s| field(s, "in_flight") == 0);
    println!("deferred accept: {s}");
    assert_eq!(field(&s, "admitted"), 20, "one admission per handshake: {s}");
    assert_eq!(field(&s, "handshakes_lapsed"), 0, "no phantom reservation: {s}");
    assert_eq!(field(&s, "late_completed"), 0, "{s}");
    // The limit holds exactly: 5 of 10 held connections served.
    let held: Vec<_> = testbed::run_in(&bed.client_ns, move || {
        (0..10)
            .map(|_| {
                let mut c = testbed::connect(addr, Duration::from_secs(1))?;
                echo(&mut c).map(|()| c)
            })
            .collect::<Vec<_>>()
    })
    .unwrap();
    let served = held.iter().filter(|r| r.is_ok()).count();
    assert_eq!(served, 5, "limit 5 serves 5 of 10: {}", stats(PORT));
    drop(held);
}

/// The connection and client maps are shared by a gate's ports: one port's
/// flood of connections from many addresses filled both (262,144 and 65,536
/// entries, one /48 of /64 clients), and every other port went untracked,
/// its caps and shares off. Each port now holds at most an even share
/// (`connection_quota`, `client_quota`): here 1,100 connections from 1,100
/// addresses to one port of two, in maps of 1,024, leave the other port its room.
#[test]
fn one_port_cannot_fill_the_shared_maps_for_the_others() {
    let _one = exclusive();
    let bed = Testbed::create("shedhq").expect("testbed");
    let (a, b) = (bed.server_addr(false, PORT), bed.server_addr(false, 8081));
    let _held_a = Backend::start(&bed.server_ns, a, Service::Hold).expect("backend");
    let _held_b = Backend::start(&bed.server_ns, b, Service::Hold).expect("backend");
    // 1,100 client addresses in 10.201.0.0/16, routed back by the server through
    // the client's own address (one neighbour entry, not 1,100: the table holds 1,024).
    let batch = (0..1_100u32).fold(String::new(), |mut batch, i| {
        let _ = writeln!(batch, "addr add 10.201.{}.{}/32 dev {}", i / 250, 1 + i % 250, bed.client_if);
        batch
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), batch).unwrap();
    ip(&["-n", &bed.client_ns, "-batch", file.path().to_str().unwrap()]);
    ip(&["-n", &bed.server_ns, "route", "add", "10.201.0.0/16", "via", "10.200.0.2"]);
    let _gate = Gate::start(
        &bed,
        &[
            "--port",
            "8080",
            "--port",
            "8081",
            "--limit",
            "5000",
            "--count",
            "connections",
            "--action",
            "rst",
            "--max-connections",
            "1024",
            "--max-clients",
            "1024",
        ],
    );
    let quotas = wait_for_stats(PORT, Duration::from_secs(3), "quotas written", |s| field(s, "connection_quota") > 0);
    assert_eq!((field(&quotas, "connection_quota"), field(&quotas, "client_quota")), (512, 512), "{quotas}");
    let limit = libc::rlimit { rlim_cur: 8192, rlim_max: 8192 };
    // SAFETY: a valid rlimit; raising our own limit as root (the backends hold the other ends).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) }, 0, "raise this test's file limit");
    let flood: Vec<_> = testbed::run_in(&bed.client_ns, move || {
        (0..1_100u32)
            .filter_map(|i| {
                let source = std::net::IpAddr::from([10, 201, (i / 250) as u8, (1 + i % 250) as u8]);
                testbed::connect_from(source, a, Duration::from_secs(2)).ok()
            })
            .collect()
    })
    .unwrap();
    assert_eq!(flood.len(), 1_100, "every flood connection was accepted (the limit is far off)");
    let others: Vec<_> = testbed::run_in(&bed.client_ns, move || {
        (0..20).filter_map(|_| testbed::connect(b, Duration::from_secs(2)).ok()).collect::<Vec<_>>()
    })
    .unwrap();
    assert_eq!(others.len(), 20);
    let (sa, sb) = (stats(PORT), stats(8081));
    println!("flooded port: {sa}\nother port: {sb}");
    assert!(field(&sa, "established") <= 512, "the flooded port holds at most its quota: {sa}");
    assert!(field(&sa, "connection_map_full") >= 1_100 - 512, "{sa}");
    assert!(field(&sa, "client_map_full") >= 1_100 - 512, "{sa}");
    assert_eq!(field(&sb, "established"), 20, "the other port tracks every connection: {sb}");
    assert_eq!(field(&sb, "connection_map_full"), 0, "{sb}");
    assert_eq!(field(&sb, "client_map_full"), 0, "its client is counted: {sb}");
    drop((flood, others));
}

/// More idle clients on the metrics endpoint than the daemon has files
/// (systemd's default soft limit of 1,024; 1,072 idle clients ended the
/// daemon): the daemon stays up, a scrape and `/healthz` still answer within
/// a second, and the gate keeps judging.
#[test]
fn the_endpoint_outlives_more_idle_clients_than_the_daemon_has_files() {
    let _one = exclusive();
    let bed = Testbed::create("shedhe").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let endpoint = "127.0.0.1:19468";
    let mut gate = Gate::launch(
        std::path::Path::new(&support::gate::shedctl_path()),
        &[
            "--netns",
            &bed.server_ns,
            "--iface",
            &bed.server_if,
            "--port",
            "8080",
            "--limit",
            "1",
            "--action",
            "rst",
            "--count",
            "connections",
            "--metrics",
            endpoint,
        ],
        Log::Capture,
    )
    .expect("launch");
    // The daemon's soft file limit, as a tight unit would set it.
    let out = Command::new("prlimit")
        .args(["--pid", &gate.pid().to_string(), "--nofile=1024:4096"])
        .output()
        .expect("prlimit (util-linux)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // 1,100 clients connect and send nothing (more than the 1,024 files the daemon may
    // open); this process needs the files for them.
    let limit = libc::rlimit { rlim_cur: 8192, rlim_max: 8192 };
    // SAFETY: a valid rlimit; raising our own limit as root.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) }, 0, "raise this test's file limit");
    let mut idle = Vec::new();
    for _ in 0..1_100 {
        if let Ok(c) = TcpStream::connect_timeout(&endpoint.parse().unwrap(), Duration::from_secs(1)) {
            idle.push(c);
        }
    }
    assert!(idle.len() >= 1_000, "the idle clients connected: {}", idle.len());
    for _ in 0..3 {
        let started = Instant::now();
        let (status, body) = http_get(endpoint, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        assert!(body.contains("shed_limit"), "{body}");
        assert!(started.elapsed() < Duration::from_secs(1), "a scrape took {:?}", started.elapsed());
        let started = Instant::now();
        assert_eq!(http_get(endpoint, "/healthz").0, "HTTP/1.1 200 OK");
        assert!(started.elapsed() < Duration::from_secs(1), "/healthz took {:?}", started.elapsed());
        thread::sleep(Duration::from_millis(1_200));
    }
    // The idle clients were closed by the endpoint, not kept.
    let closed = idle
        .iter_mut()
        .map(|c| {
            c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            matches!(c.read(&mut [0u8; 1]), Ok(0) | Err(_))
        })
        .filter(|&closed| closed)
        .count();
    // All but the endpoint's 128 newest (its cap); the scrapes above took a few of those places.
    assert!(closed + 128 >= idle.len(), "{closed} of {} idle clients closed", idle.len());
    // Still gating: one connection fits, the second is refused.
    let held = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1))).unwrap();
    assert!(held.is_ok(), "{}", gate.log());
    let second = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(1))).unwrap();
    assert!(second.is_err(), "the gate still judges");
    assert!(gate.is_running(), "the daemon is up:\n{}", gate.log());
    drop(held);
    gate.stop();
}

/// 10,000 CIDRs in a tier file load in under a second (each insert used to
/// walk the whole trie: not visible within 120 s).
#[test]
fn ten_thousand_tiers_load_at_once() {
    let _one = exclusive();
    let bed = Testbed::create("shedht").expect("testbed");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiers.toml");
    let mut text = String::from("[tiers]\n");
    for i in 0..10_000u32 {
        let a = Ipv4Addr::from(0x0a00_0000 | (i << 8));
        let _ = writeln!(text, "\"{a}/24\" = \"{}\"", if i % 2 == 0 { "critical" } else { "low" });
    }
    std::fs::write(&file, text).unwrap();
    let started = Instant::now();
    let gate =
        Gate::start(&bed, &["--port", "8080", "--limit", "5", "--tier-file", file.to_str().unwrap(), "--kernel-log"]);
    let took = started.elapsed();
    let out = support::gate::shedctl(&["tier", "ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("tier ls --json");
    println!("10,000 tiers: gate ready after {took:?}");
    assert_eq!(list.as_array().unwrap().len(), 10_000, "{}", gate.log());
    // The whole attach (loading the programs included) within 10 s, where it took minutes.
    assert!(took < Duration::from_secs(10), "attach with 10,000 tiers took {took:?}");
}

/// An AnyIP route (`ip route add local 10.99.0.0/24 dev lo`) makes a whole
/// range local without an address the gate's table holds: SYNs to it pass as
/// not local, and the handshake-completing ACK, which the kernel's socket
/// lookup ties to our listener, is judged (10 of 10 got in at `--limit 3`).
#[test]
fn handshakes_to_an_anyip_range_are_judged() {
    let _one = exclusive();
    let bed = Testbed::create("shedha").expect("testbed");
    ip(&["-n", &bed.server_ns, "route", "add", "local", "10.99.0.0/24", "dev", "lo"]);
    ip(&["-n", &bed.client_ns, "route", "add", "10.99.0.0/24", "via", "10.200.0.1"]);
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT));
    let _backend = Backend::start(&bed.server_ns, any, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "3", "--count", "connections", "--action", "rst"]);
    let target = SocketAddr::from(([10, 99, 0, 5], PORT));
    let held: Vec<_> = testbed::run_in(&bed.client_ns, move || {
        (0..10)
            .map(|_| {
                // Served (an echo answers) or not: a refusal at the ACK may let connect() succeed first.
                let mut c = testbed::connect(target, Duration::from_secs(1))?;
                c.set_read_timeout(Some(Duration::from_secs(1)))?;
                c.write_all(b"p")?;
                c.read_exact(&mut [0u8; 1])?;
                Ok::<_, std::io::Error>(c)
            })
            .collect()
    })
    .unwrap();
    let served = held.iter().filter(|r| r.is_ok()).count();
    let s = stats(PORT);
    println!("AnyIP: {served} of 10 served; {s}");
    assert_eq!(served, 3, "the limit holds for an AnyIP range: {s}");
    assert_eq!(field(&s, "refused_at_ack"), 7, "{s}");
    drop(held);
}

/// Loads an nftables ruleset into `ns`.
fn nft(ns: &str, rules: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft (cargo xtask setup installs nftables)");
    child.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft refused:\n{rules}");
}

/// NAT that takes connections to a protected listener past the gate (a
/// `redirect` from another port, a `dnat` to this host: netfilter rewrites
/// the port after the gate has judged the wire's) is refused at attach, with
/// the rule and what to do; `--allow-nat` attaches anyway, and a DNAT that
/// sends the traffic to another host is not this gate's business.
#[test]
fn nat_that_bypasses_the_gate_is_refused_at_attach() {
    let _one = exclusive();
    let bed = Testbed::create("shedhn").expect("testbed");
    let args = ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080", "--limit", "3"];
    nft(
        &bed.server_ns,
        "table ip nat {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 8081 dnat to 10.244.1.5:8080; }\n}\n",
    );
    drop(Gate::attach(&args));
    nft(
        &bed.server_ns,
        "table ip nat {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 80 redirect to :8080; }\n}\n",
    );
    let shedctl = std::path::PathBuf::from(shed_testkit::gate::shedctl_path());
    let refused = Gate::launch(&shedctl, &args, Log::Capture).err().expect("attach refuses the redirect");
    let why = refused.to_string();
    assert!(
        why.contains("port 8080: nftables table ip nat chain prerouting: port 80 to local port 8080")
            && why.contains("--allow-nat"),
        "{why}"
    );
    let allowed: Vec<&str> = args.iter().copied().chain(["--allow-nat"]).collect();
    let gate = Gate::attach(&allowed);
    assert!(
        gate.log().contains("--allow-nat: connections this NAT rewrites reach the listener unjudged"),
        "{}",
        gate.log()
    );
    drop(gate);

    // A DNAT to each of the namespace's own addresses, and a redirect that
    // keeps the port (only the address changes under the gate): each refused.
    let (v4, v6) = (bed.server_v4, bed.server_addr(true, PORT).ip());
    for (family, rule, shown) in [
        ("ip", format!("tcp dport 8081 dnat to {v4}:8080"), "port 8081 to local port 8080"),
        ("ip6", format!("tcp dport 8081 dnat to [{v6}]:8080"), "port 8081 to local port 8080"),
        ("ip", "tcp dport 8081 dnat to 127.0.0.1:8080".to_owned(), "port 8081 to local port 8080"),
        ("ip", "tcp dport 8080 redirect".to_owned(), "port 8080 to a local address"),
    ] {
        nft(&bed.server_ns, "flush ruleset\n");
        nft(
            &bed.server_ns,
            &format!(
                "table {family} own {{\n chain prerouting {{ type nat hook prerouting priority -100; {rule}; }}\n}}\n"
            ),
        );
        let refused =
            Gate::launch(&shedctl, &args, Log::Capture).err().unwrap_or_else(|| panic!("attach refuses `{rule}`"));
        let why = refused.to_string();
        assert!(
            why.contains(&format!("port 8080: nftables table {family} own chain prerouting: {shown}")),
            "{rule}: {why}"
        );
    }
}

/// `shed_nat_bypassed` of port 8080 in namespace `ns`, scraped from `metrics`.
fn nat_bypassed_8080(metrics: &str, ns: &str) -> f64 {
    let scrape = support::metrics::scrape(metrics);
    support::metrics::value(&scrape, "shed_nat_bypassed", &[("netns", ns), ("port", "8080")])
}

/// A NAT rule added after attach (a sidecar's init container redirecting
/// inbound traffic, a late DNAT) is seen within seconds: the port is reported
/// bypassed in the metrics and on `/readyz`, with the rule, and judged again
/// once the rule goes. With `--allow-nat` it is reported and the gate stays ready.
#[test]
fn nat_added_after_attach_is_reported_until_it_goes() {
    const METRICS: &str = "127.0.0.1:19481";
    let _one = exclusive();
    let bed = Testbed::create("shedhl").expect("testbed");
    let bypassed = || nat_bypassed_8080(METRICS, &bed.server_ns);
    let args =
        ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080", "--metrics", METRICS];
    let gate = Gate::attach(&args);
    let readable = support::metrics::value(
        &support::metrics::scrape(METRICS),
        "shed_nat_readable",
        &[("netns", bed.server_ns.as_str())],
    );
    assert_eq!((bypassed(), readable), (0.0, 1.0));
    assert_eq!(support::metrics::http_get(METRICS, "/readyz").0, "HTTP/1.1 200 OK");
    // What Istio's init container does in a pod: inbound TCP redirected to the proxy's port.
    nft(
        &bed.server_ns,
        "table ip late {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 8080 redirect to :15006; }\n}\n",
    );
    poll(Duration::from_secs(15), "the late NAT reported", bypassed, |&b| b == 1.0);
    let (status, body) = support::metrics::http_get(METRICS, "/readyz");
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{body}");
    assert!(
        body.contains("port 8080: nftables table ip late chain prerouting: port 8080 to local port 15006"),
        "{body}"
    );
    assert!(gate.log().contains("netfilter NAT takes connections to this port past the gate"), "{}", gate.log());
    nft(&bed.server_ns, "delete table ip late\n");
    poll(Duration::from_secs(15), "the NAT gone", bypassed, |&b| b == 0.0);
    assert_eq!(support::metrics::http_get(METRICS, "/readyz").0, "HTTP/1.1 200 OK");
    // The same from ip6tables and iptables on their nft backend, whose
    // targets nft shows without their ports: reported as well, by each
    // family's save tool, with the rule as it was written.
    for (tool, family) in [("ip6tables-nft", "ip6"), ("iptables-nft", "ip")] {
        let rule = ["-t", "nat", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006"];
        let iptables = |verb: &str| {
            let out = Command::new("ip")
                .args(["netns", "exec", bed.server_ns.as_str(), tool, rule[0], rule[1], verb])
                .args(&rule[2..])
                .output()
                .expect("run iptables (cargo xtask setup installs it)");
            assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stderr));
        };
        iptables("-A");
        poll(Duration::from_secs(15), "the late iptables-nft NAT reported", bypassed, |&b| b == 1.0);
        let (status, body) = support::metrics::http_get(METRICS, "/readyz");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{tool}: {body}");
        assert!(body.contains(&format!("port 8080: {tool} nat PREROUTING: port 8080 to local port 15006")), "{body}");
        iptables("-D");
        nft(&bed.server_ns, &format!("delete table {family} nat\n"));
        poll(Duration::from_secs(15), "the iptables-nft NAT gone", bypassed, |&b| b == 0.0);
    }
    drop(gate);

    // Accepted with --allow-nat: reported, still ready.
    let allowed: Vec<&str> = args.iter().copied().chain(["--allow-nat"]).collect();
    let _gate = Gate::attach(&allowed);
    nft(
        &bed.server_ns,
        "table ip late {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 8080 redirect to :15006; }\n}\n",
    );
    poll(Duration::from_secs(15), "the late NAT reported", bypassed, |&b| b == 1.0);
    assert_eq!(support::metrics::http_get(METRICS, "/readyz").0, "HTTP/1.1 200 OK");
}

/// A look at the namespace's NAT starts `nft` only when nftables' ruleset
/// generation (or the namespace's addresses) moved since the last look that
/// read the rules: a quiet namespace costs the agent a netlink question every
/// 5 s, not a process. `nft` here is a wrapper that counts its runs.
#[test]
fn nft_runs_again_only_when_the_ruleset_changes() {
    let _one = exclusive();
    let bed = Testbed::create("shedhg").expect("testbed");
    let real = Command::new("sh").args(["-c", "command -v nft"]).output().expect("sh");
    let real = String::from_utf8_lossy(&real.stdout).trim().to_owned();
    assert!(!real.is_empty(), "nft on the PATH (cargo xtask setup installs nftables)");
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let wrapper = dir.path().join("nft");
    std::fs::write(&wrapper, format!("#!/bin/sh\necho run >> {}\nexec {real} \"$@\"\n", runs.display())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
    let counted = || std::fs::read_to_string(&runs).map_or(0, |r| r.lines().count());
    let args = ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080"];
    let mut gate =
        Gate::spawn_env(std::path::Path::new(&support::gate::shedctl_path()), &args, Log::Capture, &[("PATH", &path)])
            .expect("start the gate");
    poll(Duration::from_secs(20), "the gate running", || gate.log(), |log| log.contains("shed gate running"));
    // The set-up's look, then the loop's first: each reads the rules.
    poll(Duration::from_secs(10), "the loop's first look", counted, |&n| n >= 2);
    // Two more looks fall due (every 5 s in a gate's first minute): nothing changed, no nft.
    thread::sleep(Duration::from_secs(11));
    assert_eq!(counted(), 2, "nft ran with nothing changed: {}", gate.log());
    // A change to the ruleset (not NAT): the next look reads the rules again.
    nft(&bed.server_ns, "table inet quiet {\n chain input { type filter hook input priority 0; policy accept; }\n}\n");
    poll(Duration::from_secs(8), "a look after the ruleset changed", counted, |&n| n == 3);
    assert!(gate.is_running(), "{}", gate.log());
}

/// Legacy iptables' NAT is read only where the namespace has a legacy `nat`
/// table, so looking makes none (before, each look ran `iptables-legacy-save
/// -t nat`, which made one in every gated namespace). A redirect added with
/// `iptables-legacy` after attach is reported, with its place, and judged
/// again once deleted (the table stays, empty); the same with
/// `ip6tables-legacy`, whose tables the kernel lists apart (first, while
/// only that family has a nat table: a family read through the other's
/// list of tables would be missed).
#[test]
fn legacy_iptables_nat_is_read_where_its_table_is() {
    const METRICS: &str = "127.0.0.1:19482";
    let _one = exclusive();
    let bed = Testbed::create("shedhy").expect("testbed");
    let legacy_tables = || {
        let out =
            Command::new("ip").args(["netns", "exec", &bed.server_ns, "cat", "/proc/net/ip_tables_names"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    };
    let bypassed = || nat_bypassed_8080(METRICS, &bed.server_ns);
    let args =
        ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080", "--metrics", METRICS];
    let gate = Gate::attach(&args);
    // Two looks (every 5 s while the gate is new) have run.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(bypassed(), 0.0);
    assert!(!legacy_tables().lines().any(|t| t == "nat"), "looking made a nat table: {}", legacy_tables());
    let ip6_tables = || {
        let out =
            Command::new("ip").args(["netns", "exec", &bed.server_ns, "cat", "/proc/net/ip6_tables_names"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    };
    assert!(!ip6_tables().lines().any(|t| t == "nat"), "looking made an IPv6 nat table: {}", ip6_tables());
    // Each family's tool where only that family has a nat table: IPv6 first,
    // then IPv4 (each family's table stays, empty, once made).
    let legacy = |tool: &'static str| {
        let bed = &bed;
        move |args: &[&str]| {
            let status = Command::new("ip")
                .args(["netns", "exec", &bed.server_ns, tool, "-t", "nat"])
                .args(args)
                .status()
                .unwrap_or_else(|e| panic!("run {tool} (cargo xtask setup installs iptables): {e}"));
            assert!(status.success(), "{tool} {args:?}");
        }
    };
    let rule = ["PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006"];
    for (tool, tables) in
        [("ip6tables-legacy", &ip6_tables as &dyn Fn() -> String), ("iptables-legacy", &legacy_tables)]
    {
        let run = legacy(tool);
        run(&[&["-A"], &rule[..]].concat());
        assert!(tables().lines().any(|t| t == "nat"), "{tool}");
        poll(Duration::from_secs(15), &format!("the {tool} redirect reported"), bypassed, |&b| b == 1.0);
        let (status, body) = support::metrics::http_get(METRICS, "/readyz");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{body}");
        assert!(body.contains(&format!("port 8080: {tool} nat PREROUTING")), "{body}");
        run(&[&["-D"], &rule[..]].concat());
        poll(Duration::from_secs(15), &format!("the {tool} redirect gone"), bypassed, |&b| b == 0.0);
    }
    drop(gate);
}

/// TPROXY hands a connection to a listener on another port without NAT: the
/// segments keep the port on the wire, the kernel's request socket carries
/// it, and the gate judges it there (protect the port clients use).
#[test]
fn tproxy_connections_are_judged_on_the_port_clients_use() {
    let _one = exclusive();
    let bed = Testbed::create("shedht").expect("testbed");
    ip(&["-n", &bed.server_ns, "rule", "add", "fwmark", "1", "lookup", "100"]);
    ip(&["-n", &bed.server_ns, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100"]);
    nft(
        &bed.server_ns,
        "table ip tp {\n chain pre { type filter hook prerouting priority mangle; tcp dport 9000 tproxy to :8080 meta mark set 1 accept; }\n}\n",
    );
    // A transparent listener on 8080, echoing (TPROXY delivers only to IP_TRANSPARENT sockets).
    let listener = testbed::run_in(&bed.server_ns, || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_ip_transparent_v4(true).unwrap();
        socket.set_reuse_address(true).unwrap();
        socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)).into()).unwrap();
        socket.listen(64).unwrap();
        std::net::TcpListener::from(socket)
    })
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    listener.set_nonblocking(true).unwrap();
    let server = thread::spawn(move || {
        let mut conns = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((mut c, _)) = listener.accept() {
                let _ = c.set_nonblocking(false);
                let _ = c.write_all(b"+");
                conns.push(c);
            }
            thread::sleep(Duration::from_millis(2));
        }
    });
    let _gate = Gate::start(&bed, &["--port", "9000", "--limit", "2", "--count", "connections", "--action", "rst"]);
    let target = SocketAddr::from((bed.server_v4, 9000));
    let held: Vec<_> = testbed::run_in(&bed.client_ns, move || {
        (0..6)
            .map(|_| {
                let mut c = testbed::connect(target, Duration::from_secs(1))?;
                c.set_read_timeout(Some(Duration::from_secs(1)))?;
                c.read_exact(&mut [0u8; 1])?;
                Ok::<_, std::io::Error>(c)
            })
            .collect()
    })
    .unwrap();
    let served = held.iter().filter(|r| r.is_ok()).count();
    let s = stats(9000);
    assert_eq!(served, 2, "the limit holds for TPROXY'd connections: {s}");
    assert_eq!((field(&s, "admitted"), field(&s, "established")), (2, 2), "{s}");
    drop(held);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
}

/// `set` reads a port's config, changes a field and writes it back; a `tier
/// add` between the two was undone (tier judging, and with it the exempt
/// tier, silently off). Many of both at once leave the tiers in force.
#[test]
fn set_and_tier_changes_cannot_undo_each_other() {
    let _one = exclusive();
    let bed = Testbed::create("shedhr").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "100", "--action", "rst"]);
    for round in 0..20 {
        let cidr = format!("10.{round}.0.0/16");
        let setter = thread::spawn(move || {
            for limit in 100..103 {
                let out = support::gate::shedctl(&["set", "--port", "8080", "--limit", &limit.to_string()]);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
        });
        let out = support::gate::shedctl(&["tier", "add", &cidr, "exempt"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        setter.join().unwrap();
        let maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
        assert_eq!(maps.config(PORT).unwrap().tiered, 1, "round {round}: tier judging stays on");
        let out = support::gate::shedctl(&["tier", "rm", &cidr]);
        assert!(out.status.success());
    }
}

/// A reload re-reads the config file: one that others may write is refused
/// with the reason, and the running settings stay.
#[test]
fn a_reload_refuses_a_file_others_may_write() {
    use std::os::unix::fs::PermissionsExt as _;
    let _one = exclusive();
    let bed = Testbed::create("shedhw").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shed.toml");
    std::fs::write(&config, "ports = [8080]\nlimit = 3\naction = \"rst\"\n").unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let gate = Gate::start(&bed, &["--config", config.to_str().unwrap()]);
    std::fs::write(&config, "ports = [8080]\nlimit = 7\naction = \"rst\"\n[tiers]\n\"0.0.0.0/0\" = \"exempt\"\n")
        .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(gate.pid(), libc::SIGHUP) }, 0);
    let log =
        support::gate::poll(Duration::from_secs(3), "the refusal", || gate.log(), |l| l.contains("reload refused"));
    assert!(log.contains("is writable by others") && log.contains("chmod go-w"), "{log}");
    let s = stats(PORT);
    assert_eq!(field(&s, "limit"), 3, "nothing changed: {s}");
    let out = support::gate::shedctl(&["tier", "ls", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "no tier was loaded");
}

/// A phantom count on a busy port (a close the kernel never reported, here
/// written into the daemon's adjustment): the port's counts never stand still
/// under steady churn, and the healer used to correct drift only when they
/// did. It now corrects the part that the events during its pass cannot explain.
#[test]
fn drift_on_a_busy_port_is_corrected_while_connections_churn() {
    let _one = exclusive();
    let bed = Testbed::create("shedhd").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(
        &bed,
        &["--port", "8080", "--limit", "1000", "--count", "connections", "--action", "rst", "--heal-interval", "1"],
    );
    // Five phantom connections.
    let mut maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    let mut user = maps.raw().user_state.get(&slot, 0).unwrap();
    user.established_adjust += 5;
    maps.raw_mut().user_state.set(slot, user, 0).unwrap();
    // Churn: a connection opened and closed every few milliseconds, for up to 20 s.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        testbed::spawn_in(&bed.client_ns, move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(c) = testbed::connect(addr, Duration::from_secs(1)) {
                    n += 1;
                    drop(c);
                }
                thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    let corrected = support::gate::poll(
        Duration::from_secs(20),
        "the phantom connections corrected under churn",
        || stats(PORT),
        |s| field(s, "drift_corrected") >= 5,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let made = churn.join().unwrap().unwrap();
    println!("corrected while {made} connections churned: {corrected}");
    assert!(made >= 100, "the port was busy: {made} connections");
    let s = wait_for_stats(PORT, Duration::from_secs(5), "back to nothing held", |s| field(s, "established") == 0);
    assert_eq!(field(&s, "drift_corrected"), 5, "exactly the phantom five: {s}");
}

/// Idle is not work: one client opens 60 connections to a keep-alive backend
/// (idle connections cost it a parked thread) and sends nothing, at `--limit
/// 50` in `work` mode. They counted as busy until answered, so they held the
/// limit and legitimate clients got 0%; now a connection that has sent
/// nothing counts only for the idle grace (about half a second). A partial
/// request still counts: it is work the server owes.
#[test]
fn connections_that_send_nothing_do_not_hold_the_limit() {
    let _one = exclusive();
    let bed = Testbed::create("shedhi").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let service_us = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
    let _backend = Backend::start(&bed.server_ns, addr, Service::KeepAlive { service_us }).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "50", "--action", "rst"]);
    let idle: Vec<TcpStream> = testbed::run_in(&bed.client_ns, move || {
        (0..60).filter_map(|_| testbed::connect(addr, Duration::from_secs(1)).ok()).collect()
    })
    .unwrap();
    let (share, requests) = testbed::goodput(&bed.client_ns, addr, 50, 10, || {});
    let s = stats(PORT);
    println!("60 idle connections held ({} connected), limit 50: goodput {share:.3} of {requests}; {s}", idle.len());
    assert!(idle.len() >= 50, "the idle client got its connections: {}", idle.len());
    assert!(share >= 0.85, "legitimate clients are served beside idle connections: {share:.3} of {requests}; {s}");
    assert!(field(&s, "idle_expired") >= 50, "the idle connections stopped counting: {s}");
    assert!(field(&s, "established") >= 50, "while they are still open: {s}");
    assert_eq!(field(&s, "silent"), 0, "{s}");

    // Partial requests: bytes the server has not answered are work it owes.
    let mut partial = idle;
    partial.truncate(10);
    for c in &mut partial {
        c.write_all(b"GE").unwrap();
    }
    let s = wait_for_stats(PORT, Duration::from_secs(5), "partial requests counted", |s| field(s, "busy") == 10);
    thread::sleep(Duration::from_secs(1));
    let later = stats(PORT);
    assert_eq!(field(&later, "busy"), 10, "a partial request counts past the grace: {s} then {later}");
    assert_eq!(field(&later, "in_flight"), 10, "{later}");
}

/// A kept-alive line server behind `--limit 10 --action rst` (the default
/// share, half), and a second client address beside the testbed's own.
struct ShareBed {
    bed: Testbed,
    addr: SocketAddr,
    other: std::net::IpAddr,
    _backend: Backend,
    _gate: Gate,
}

impl ShareBed {
    /// `count`: the port's `--count`.
    fn new(name: &str, count: &str) -> Self {
        let bed = Testbed::create(name).expect("testbed");
        let addr = bed.server_addr(false, PORT);
        let other = std::net::IpAddr::V4(bed.add_client_v4(3).expect("second client address"));
        let service_us = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
        let backend = Backend::start(&bed.server_ns, addr, Service::KeepAlive { service_us }).expect("backend");
        let gate = Gate::start(&bed, &["--port", "8080", "--limit", "10", "--action", "rst", "--count", count]);
        Self { bed, addr, other, _backend: backend, _gate: gate }
    }

    /// One request line from `from`, answered `OK` within a second.
    fn request(bed: &Testbed, addr: SocketAddr, from: std::net::IpAddr) -> bool {
        testbed::run_in(&bed.client_ns, move || {
            let mut c = testbed::connect_from(from, addr, Duration::from_secs(1)).ok()?;
            c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            c.write_all(b"GET\n").ok()?;
            let mut b = [0u8; 3];
            c.read_exact(&mut b).ok().map(|()| b == *b"OK\n")
        })
        .unwrap()
        .unwrap_or(false)
    }

    /// Ten connections from the testbed's client address, each sending
    /// `partial` (a request line never finished), `spacing` apart.
    fn hog(bed: &Testbed, addr: SocketAddr, partial: &'static [u8], spacing: Duration) -> Vec<TcpStream> {
        testbed::run_in(&bed.client_ns, move || {
            (0..10)
                .map(|_| {
                    let mut c = testbed::connect(addr, Duration::from_secs(1)).expect("the port has room");
                    c.write_all(partial).unwrap();
                    thread::sleep(spacing);
                    c
                })
                .collect()
        })
        .unwrap()
    }
}

/// One client holds the limit (connections counted). While it holds its
/// share (half, by default) and a client
/// holding less is refused, its new connections are refused, and the room its
/// closed connections leave goes to others. Alone, it may fill the port.
#[test]
fn one_client_cannot_hold_more_than_its_share_while_others_are_refused() {
    let _one = exclusive();
    // The hog sends nothing: nothing of its is a request its server sits on,
    // so the daemon closes none of them (the next test), and only the share's
    // refusals are judged here.
    let ShareBed { bed, addr, other, _backend, _gate } = ShareBed::new("shedhs", "connections");
    // Alone, the hog fills the port: nobody else is refused.
    let mut hog = ShareBed::hog(&bed, addr, b"", Duration::ZERO);
    wait_for_stats(PORT, Duration::from_secs(5), "the hog's connections counted", |s| field(s, "established") == 10);
    // Another client is refused: at its ACK, its source proven.
    let served_then = |c: std::io::Result<TcpStream>| {
        let mut c = c.ok()?;
        c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        c.write_all(b"GET\n").ok()?;
        let mut b = [0u8; 3];
        c.read_exact(&mut b).ok()?;
        Some(c)
    };
    let refused = testbed::run_in(&bed.client_ns, move || {
        served_then(testbed::connect_from(other, addr, Duration::from_secs(1))).is_none()
    })
    .unwrap();
    assert!(refused, "the port is full");
    // The hog lets three go and tries three more at once: refused, its share held.
    hog.truncate(7);
    wait_for_stats(PORT, Duration::from_millis(500), "three slots free", |s| field(s, "established") == 7);
    let hog_again = testbed::run_in(&bed.client_ns, move || {
        (0..3).filter_map(|_| served_then(testbed::connect(addr, Duration::from_secs(1)))).count()
    })
    .unwrap();
    let others = testbed::run_in(&bed.client_ns, move || {
        (0..3).filter_map(|_| served_then(testbed::connect_from(other, addr, Duration::from_secs(1)))).count()
    })
    .unwrap();
    let s = stats(PORT);
    println!("hog holds 7 of 10: its 3 more served {hog_again}, the other client's {others}; {s}");
    assert_eq!(hog_again, 0, "the hog holds more than its share while another is refused: {s}");
    assert_eq!(others, 3, "the room goes to the other client: {s}");
    assert!(s["rejected_by_reason"]["client_share"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["client_share"].as_u64(), Some(50), "{s}");
}

/// The handshake stamps are placed by a hash keyed with a secret drawn at
/// load: a client choosing its ports cannot aim at another flow's stamp.
/// None of the stamps our connections took is where the unkeyed hash puts it.
#[test]
fn handshake_stamps_are_keyed_with_a_secret() {
    let _one = exclusive();
    let bed = Testbed::create("shedhk").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "100", "--action", "rst"]);
    let flows: Vec<(Ipv4Addr, u16)> = testbed::run_in(&bed.client_ns, move || {
        (0..20)
            .map(|_| {
                let c = testbed::connect(addr, Duration::from_secs(1)).expect("connect");
                let local = c.local_addr().unwrap();
                let std::net::IpAddr::V4(ip) = local.ip() else { unreachable!() };
                (ip, local.port())
            })
            .collect()
    })
    .unwrap();
    let maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    let per_port = shed_common::handshake::STAMPS_PER_PORT;
    let stamps: Vec<shed_common::HandshakeStamp> =
        (slot * per_port..(slot + 1) * per_port).map(|i| maps.raw().stamps.get(&i, 0).unwrap()).collect();
    let used = stamps.iter().filter(|s| s.flow != 0).count();
    // Two of 20 flows share a slot about one run in six (a completed stamp is free to reuse).
    assert!(used >= 15, "the admitted flows took stamps: {used}");
    let server = shed_common::ipv4_mapped(bed.server_v4.octets());
    for (ip, port) in flows {
        let unkeyed = shed_common::handshake::flow_hash(&shed_common::ipv4_mapped(ip.octets()), &server, port, PORT);
        assert!(!stamps.iter().any(|s| s.flow == unkeyed), "flow from port {port} stamped under the unkeyed hash");
    }
}

/// Connects to `addr` (IPv6) with a destination-options header on every
/// segment (`IPV6_DSTOPTS`: one PadN option, 8 bytes), as a client may.
fn connect_with_dstopts(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    use std::os::fd::AsRawFd as _;
    let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
    // Next header (filled by the kernel), length 0 (8 bytes), PadN of 4 bytes.
    let header: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
    // SAFETY: setsockopt with a buffer of its stated length on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_DSTOPTS,
            header.as_ptr().cast(),
            header.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

/// IPv6 segments behind a destination-options header are judged as plain
/// ones. The limit is held by 3 IPv4 connections; 5 IPv6 connections from
/// the same client (another address, holding nothing: judged at their ACK,
/// the port being full of one client) are refused there, whether or not
/// every segment carries the header. The client's connect returns as its ACK
/// leaves: what counts is what the server's kernel established.
#[test]
fn ipv6_destination_options_do_not_evade_the_limit() {
    let _one = exclusive();
    for (hook, action) in [("tc", "drop"), ("tc", "rst"), ("xdp", "drop")] {
        let bed = Testbed::create("shedh6").expect("testbed");
        let (v6, v4) = (bed.server_addr(true, PORT), bed.server_addr(false, PORT));
        let _backend = Backend::start(&bed.server_ns, v6, Service::Echo).expect("backend");
        let _backend_v4 = Backend::start(&bed.server_ns, v4, Service::Echo).expect("backend");
        let args = [
            "--port",
            "8080",
            "--limit",
            "3",
            "--count",
            "connections",
            "--algo",
            "fixed",
            "--action",
            action,
            "--hook",
            hook,
        ];
        let _gate = Gate::start(&bed, &args);
        let _held: Vec<_> = testbed::run_in(&bed.client_ns, move || {
            (0..3).map(|_| testbed::connect(v4, Duration::from_secs(2)).expect("under the limit")).collect::<Vec<_>>()
        })
        .expect("client namespace");
        wait_for_stats(PORT, Duration::from_secs(3), "the limit held", |s| field(s, "established") == 3);
        for (what, options) in [("destination options", true), ("plain", false)] {
            let before = stats(PORT);
            let _tried: Vec<_> = testbed::run_in(&bed.client_ns, move || {
                (0..5)
                    .map(|_| {
                        if options {
                            connect_with_dstopts(v6, Duration::from_millis(500))
                        } else {
                            testbed::connect(v6, Duration::from_millis(500))
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .expect("client namespace");
            thread::sleep(Duration::from_millis(300));
            let s = stats(PORT);
            println!("{hook} {action}, {what}: {s}");
            assert_eq!(field(&s, "established"), 3, "{hook} {action}, {what}: IPv6 past the full limit: {s}");
            // Each one's ACK is refused, and whatever else completes its handshake (a
            // retransmission, the client's FIN) is refused again.
            let refused = field(&s, "refused_at_ack") - field(&before, "refused_at_ack");
            assert!(refused >= 5, "{hook} {action}, {what}: refused at the ACK {refused}: {s}");
        }
    }
}

/// A `TCP_DEFER_ACCEPT` listener in the server namespace that accepts (once
/// the first bytes complete a handshake) and holds what it accepts; counts
/// them. Stopped, and its connections closed, on drop.
struct DeferredServer {
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<std::io::Result<()>>>,
}

impl DeferredServer {
    fn start(bed: &Testbed, addr: SocketAddr) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
        let (accepted, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (accepted, stop) = (accepted.clone(), stop.clone());
            testbed::spawn_in(&bed.server_ns, move || {
                let listener = support::handshake::deferring_listener(addr);
                listener.set_nonblocking(true).unwrap();
                let mut held = Vec::new();
                while !stop.load(Relaxed) {
                    match listener.accept() {
                        Ok((c, _)) => {
                            held.push(c);
                            accepted.store(held.len(), Relaxed);
                        }
                        Err(_) => thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        Self { accepted, stop, thread: Some(thread) }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for DeferredServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

/// `n` non-blocking connects from the testbed's client address, each sending
/// one byte as soon as its connection completes on the client's side, while
/// the ACK's admission is still pending (the handshake window).
fn deferred_connects(bed: &Testbed, addr: SocketAddr, n: usize) -> Vec<socket2::Socket> {
    testbed::run_in(&bed.client_ns, move || {
        let clients: Vec<socket2::Socket> = (0..n)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&addr.into());
                s
            })
            .collect();
        let mut sent = vec![false; clients.len()];
        let start = Instant::now();
        while sent.contains(&false) && start.elapsed() < Duration::from_millis(300) {
            for (c, sent) in clients.iter().zip(&mut sent) {
                *sent = *sent || c.send(b"G").is_ok();
            }
        }
        clients
    })
    .unwrap()
}

/// One address cannot stack admissions past its cap before any of them is
/// established. A `TCP_DEFER_ACCEPT` listener (nginx `deferred`, HAProxy
/// `defer-accept`) keeps each handshake a request socket until its first
/// bytes: one address makes 40 non-blocking connects, then sends one byte on
/// each. Admissions at the ACK are charged to their client until the kernel
/// establishes them (or they lapse), so exactly the cap (5) reaches the
/// server, under `drop` (the refused retransmit, refused again) and `rst`.
/// Before, every handshake-completing ACK saw the client holding nothing
/// established: 40 of 40 were served.
#[test]
fn a_deferred_accept_listener_cannot_stack_one_client_past_its_cap() {
    let _one = exclusive();
    let bed = Testbed::create("shedhd").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    for action in ["drop", "rst"] {
        let server = DeferredServer::start(&bed, addr);
        let gate = Gate::start(
            &bed,
            &["--port", "8080", "--limit", "50", "--client-cap", "5", "--count", "connections", "--action", action],
        );
        let clients = deferred_connects(&bed, addr, 40);
        let s = wait_for_stats(PORT, Duration::from_secs(5), "the cap's connections established", |s| {
            field(s, "established") >= 5
        });
        // Time for the refused ones to retransmit (drop) and be refused again.
        thread::sleep(Duration::from_millis(1_500));
        let later = stats(PORT);
        let served = server.accepted();
        println!("{action}: 40 deferred connects from one address, cap 5: {served} reached the server; {later}");
        assert_eq!(served, 5, "{action}: exactly the cap reaches the server: {s} then {later}");
        assert_eq!(field(&later, "established"), 5, "{action}: {later}");
        assert!(later["rejected_by_reason"]["client_cap"].as_u64().unwrap() >= 35, "{action}: {later}");
        drop((clients, gate, server));
    }
}

/// The share sees a client's admissions under way too: while it binds (a
/// client under its share was refused within the second), one address facing
/// a deferred-accept listener stacks no more than its share (10% of 50: 5)
/// in the handshake window, where only its established connections counted.
#[test]
fn a_deferred_accept_listener_cannot_stack_one_client_past_its_share() {
    let _one = exclusive();
    let bed = Testbed::create("shedhe").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let server = DeferredServer::start(&bed, addr);
    let _gate = Gate::start(
        &bed,
        &["--port", "8080", "--limit", "50", "--client-share", "10", "--count", "connections", "--action", "rst"],
    );
    // The share binds: as if another client under its share had just been refused.
    let mut maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    let mut contention = maps.raw().contention.get(&slot, 0).unwrap();
    contention.refused_ns = shed::host::system::monotonic_ns();
    maps.raw_mut().contention.set(slot, contention, 0).unwrap();
    let clients = deferred_connects(&bed, addr, 40);
    let s = wait_for_stats(PORT, Duration::from_secs(5), "the share's connections established", |s| {
        field(s, "established") >= 5
    });
    thread::sleep(Duration::from_millis(300));
    let later = stats(PORT);
    let served = server.accepted();
    println!("40 deferred connects from one address, share 5 while it binds: {served} reached the server; {later}");
    assert_eq!(served, 5, "exactly the share reaches the server: {s} then {later}");
    assert_eq!(field(&later, "established"), 5, "{later}");
    // 35 at least: a byte sent before its reset arrived is refused again.
    assert!(later["rejected_by_reason"]["client_share"].as_u64().unwrap() >= 35, "{later}");
    drop(clients);
}

/// One byte of a request on each of ten connections, from one address: the
/// server reads it and waits for the rest, forever, and the ten held
/// `--limit 10` shut against every other client (30 of 30 refused before).
/// The share is now held to what a client holds: once another client is
/// refused, the daemon closes the requests the hog's server has sat on for a
/// second, oldest first, down to its share (5): exactly five closed (the
/// five sent first), the other five untouched, and from then on the other
/// client's 30 requests are all served.
#[test]
fn partial_requests_cannot_hold_the_port_past_their_clients_share() {
    let _one = exclusive();
    let ShareBed { bed, addr, other, _backend, _gate } = ShareBed::new("shedhp", "work");
    // Sent (and read) 10 ms apart, so the oldest request is the first one sent.
    let mut hog = ShareBed::hog(&bed, addr, b"G", Duration::from_millis(10));
    wait_for_stats(PORT, Duration::from_secs(5), "the hog's partial requests counted", |s| field(s, "busy") == 10);
    let request = |from: std::net::IpAddr| ShareBed::request(&bed, addr, from);
    // Alone, the hog holds the port; the other client is refused at its ACK
    // and tries again every 100 ms, as a client does, until it is served.
    let start = Instant::now();
    let mut refused = 0;
    while !request(other) {
        refused += 1;
        assert!(start.elapsed() < Duration::from_secs(5), "never served: {}", stats(PORT));
        thread::sleep(Duration::from_millis(100));
    }
    println!("the other client served after {refused} refusals, {:?}", start.elapsed());
    assert!(refused >= 1, "the port was full at first");
    let s = wait_for_stats(PORT, Duration::from_secs(3), "the hog's oldest requests closed", |s| {
        field(s, "stalled_closed") >= 5
    });
    assert_eq!(field(&s, "stalled_closed"), 5, "closed down to the share (5 of 10), no further: {s}");
    let served = (0..30).filter(|_| request(other)).count();
    let s = stats(PORT);
    println!("hog's 10 one-byte requests, then another client: {served} of 30 served; {s}");
    assert_eq!(served, 30, "the other client is served once the hog is at its share: {s}");
    assert_eq!(field(&s, "stalled_closed"), 5, "the hog at its share keeps the rest: {s}");
    // Which of the hog's connections were closed: reset, the five sent first.
    let reset: Vec<bool> = hog
        .iter_mut()
        .map(|c| {
            c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut b = [0u8; 1];
            match c.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            }
        })
        .collect();
    assert_eq!(reset, [true, true, true, true, true, false, false, false, false, false], "the oldest five: {s}");
    assert_eq!(field(&s, "busy"), 5, "{s}");
}

/// A kept-alive request refused at the limit is contention as a refused
/// handshake is: the other client, under its share, holds one idle
/// kept-alive connection; the hog's ten partial requests fill the port; the
/// other's next request on its connection is refused, and that refusal
/// alone (no new connection is tried) makes the share bind, so the daemon
/// closes the hog's stalled requests down to its share (5 of 10).
#[test]
fn a_refused_kept_alive_request_makes_the_share_bind() {
    let _one = exclusive();
    let ShareBed { bed, addr, other, _backend, _gate } = ShareBed::new("shedhk", "work");
    let kept = testbed::run_in(&bed.client_ns, move || {
        let mut c = testbed::connect_from(other, addr, Duration::from_secs(1)).expect("the port has room");
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        c.write_all(b"GET\n").unwrap();
        let mut b = [0u8; 3];
        c.read_exact(&mut b).expect("answered while the port has room");
        c
    })
    .unwrap();
    let hog = ShareBed::hog(&bed, addr, b"G", Duration::from_millis(10));
    let s =
        wait_for_stats(PORT, Duration::from_secs(5), "the hog's partial requests counted", |s| field(s, "busy") == 10);
    assert_eq!((field(&s, "rejected"), field(&s, "established")), (0, 11), "nothing refused yet: {s}");
    let maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    let bound_at = || maps.raw().contention.get(&slot, 0).unwrap().refused_ns;
    assert_eq!(bound_at(), 0, "the share has not bound: {s}");
    // The hog's server has sat on its requests past the stall grace (1 s)
    // before the share binds: the closer's next look (every 0.5 s) within
    // the second the share binds takes them.
    thread::sleep(Duration::from_millis(1_200));
    // The other client's next request on its kept-alive connection: refused (reset).
    let answered = testbed::run_in(&bed.client_ns, move || {
        let mut c = kept;
        c.write_all(b"GET\n").is_ok() && c.read_exact(&mut [0u8; 3]).is_ok()
    })
    .unwrap();
    let s = stats(PORT);
    assert!(!answered && field(&s, "refused_requests") == 1, "the port is full: {s}");
    let now = shed::host::system::monotonic_ns();
    assert!(
        bound_at() != 0 && now - bound_at() < 1_000_000_000,
        "the refused request made the share bind ({} at {now}): {s}",
        bound_at()
    );
    let s = wait_for_stats(PORT, Duration::from_secs(3), "the hog's oldest requests closed", |s| {
        field(s, "stalled_closed") >= 5
    });
    assert_eq!(field(&s, "stalled_closed"), 5, "closed down to the share (5 of 10), no further: {s}");
    drop(hog);
}

/// The share binds whatever forged SYNs do to its budget. A full port passes
/// up to 100 SYNs a second from clients under their share, to be judged (and
/// refused, proving contention) at their ACK; a flood of forged SYNs spent
/// that budget, so a real newcomer's SYN was reset at the SYN, its refusal
/// never counted, and the hog kept the port (its requests never closed).
/// Past the budget such a SYN is now refused with a cookie of ours: a real
/// client's ACK answers it and proves it (the kernel then resets it), so the
/// share binds, the hog's stalled requests are closed down to its share, and
/// the newcomer is served, under 10,000 forged SYNs a second.
#[test]
fn forged_syns_cannot_keep_the_share_from_binding() {
    let _one = exclusive();
    let ShareBed { bed, addr, other, _backend, _gate } = ShareBed::new("shedhf", "work");
    let hog = ShareBed::hog(&bed, addr, b"G", Duration::ZERO);
    wait_for_stats(PORT, Duration::from_secs(5), "the hog's partial requests counted", |s| field(s, "busy") == 10);
    let server = bed.server_v4;
    let flood = testbed::spawn_in(&bed.client_ns, move || {
        testbed::syn_flood_at(server, PORT, 10_000, Duration::from_secs(8), |i| {
            Ipv4Addr::new(10, 78, (i % 200) as u8, (i / 200 % 250) as u8 + 1)
        })
    });
    // The flood spends the budget first.
    thread::sleep(Duration::from_millis(300));
    let request = || ShareBed::request(&bed, addr, other);
    // The newcomer's first try is refused, and proven so at once: the share
    // binds from it (before, its SYN was reset unless it won one of the
    // budget's 100 places a second against 10,000 forged SYNs).
    let start = Instant::now();
    assert!(!request(), "the port is full");
    let maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    let refused_ns = maps.raw().contention.get(&slot, 0).unwrap().refused_ns;
    let now = shed::host::system::monotonic_ns();
    assert!(
        refused_ns != 0 && now - refused_ns < 1_000_000_000,
        "the newcomer's first refusal made the share bind ({refused_ns} at {now}): {}",
        stats(PORT)
    );
    let (mut attempts, mut served) = (1, false);
    while !served && start.elapsed() < Duration::from_secs(6) {
        thread::sleep(Duration::from_millis(100));
        attempts += 1;
        served = request();
    }
    let took = start.elapsed();
    let sent = flood.join().unwrap().expect("in the namespace").expect("raw socket");
    let s = stats(PORT);
    println!("forged SYNs: {sent}; the other client served: {served} after {attempts} attempts, {took:?}; {s}");
    assert!(sent >= 50_000, "the flood ran: {sent}");
    assert!(served, "the share binds through the flood: {s}");
    assert_eq!(field(&s, "stalled_closed"), 5, "{s}");
    drop(hog);
}

/// What became of a request written on `c` a moment ago: its connection
/// reset (refused), or it is still open and unanswered (held by a server
/// that sits on it).
fn held(mut c: &TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut b = [0u8; 8];
    matches!(c.read(&mut b), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

fn tcp_fastopen(ns: &str) -> u32 {
    testbed::run_in(ns, || std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen").unwrap().trim().parse().unwrap())
        .unwrap()
}

fn set_tcp_fastopen(ns: &str, mode: u32) {
    testbed::run_in(ns, move || std::fs::write("/proc/sys/net/ipv4/tcp_fastopen", mode.to_string()).unwrap()).unwrap();
}

/// Every request is judged whatever its connection's history. One address
/// opens 20 connections 150 ms apart (each silent one counts for its idle
/// grace only, so every handshake is admitted), waits out the grace, then
/// writes a request on each, at once and 5 ms apart, to a server that sits
/// on them: `--limit 5` holds 5, and the rest are reset. A request carried
/// in a TCP Fast Open SYN cannot be judged, so servers' Fast Open is off
/// in the gated namespace while the gate runs (and put back after): 20 such
/// requests at once hold at most 5. (Before, all 20 were held in each case.)
#[test]
fn a_first_request_is_judged_after_the_idle_grace_and_in_a_fast_open_syn() {
    let _one = exclusive();
    let bed = Testbed::create("shedfr").expect("testbed");
    // Server Fast Open without the socket option, and clients' without a cookie.
    set_tcp_fastopen(&bed.server_ns, 0x603);
    set_tcp_fastopen(&bed.client_ns, 0x5);
    let service_us = Arc::new(std::sync::atomic::AtomicU64::new(4_000_000));
    let ports = [PORT, PORT + 1, PORT + 2];
    let _backends: Vec<Backend> = ports
        .iter()
        .map(|&p| {
            let service = Service::KeepAlive { service_us: service_us.clone() };
            Backend::start(&bed.server_ns, bed.server_addr(false, p), service).expect("backend")
        })
        .collect();
    let mut gate =
        Gate::start(&bed, &["--port", "8080", "--port", "8081", "--port", "8082", "--limit", "5", "--action", "rst"]);
    assert_eq!(tcp_fastopen(&bed.server_ns), 0x601, "servers' Fast Open is off while the gate runs");

    let (spaced, at_once) = (bed.server_addr(false, PORT), bed.server_addr(false, PORT + 1));
    let mut conns = testbed::run_in(&bed.client_ns, move || {
        let mut conns = (Vec::new(), Vec::new());
        for _ in 0..20 {
            conns.0.push(testbed::connect(spaced, Duration::from_secs(1)).expect("connect"));
            conns.1.push(testbed::connect(at_once, Duration::from_secs(1)).expect("connect"));
            thread::sleep(Duration::from_millis(150));
        }
        conns
    })
    .unwrap();
    for port in [PORT, PORT + 1] {
        wait_for_stats(port, Duration::from_secs(2), "every handshake admitted", |s| field(s, "established") == 20);
    }
    // Past the grace: none counts any more.
    thread::sleep(Duration::from_secs(1));
    for (port, conns, gap) in [(PORT, &mut conns.0, Duration::from_millis(5)), (PORT + 1, &mut conns.1, Duration::ZERO)]
    {
        for c in conns.iter_mut() {
            c.write_all(b"GET\n").unwrap();
            thread::sleep(gap);
        }
        thread::sleep(Duration::from_millis(300));
        let kept = conns.iter().filter(|c| held(c)).count();
        let s = stats(port);
        println!("port {port}, requests {} ms apart: {kept} of 20 held; {s}", gap.as_millis());
        assert_eq!(kept, 5, "at most the limit is held, and the limit is held: {s}");
        assert_eq!(field(&s, "busy"), 5, "{s}");
        assert_eq!(field(&s, "refused_requests"), 15, "{s}");
    }

    let fast_open = bed.server_addr(false, PORT + 2);
    let kept = testbed::run_in(&bed.client_ns, move || {
        let tries: Vec<_> = (0..20)
            .map(|_| {
                thread::spawn(move || {
                    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                    socket.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                    socket.send_to_with_flags(b"GET\n", &fast_open.into(), libc::MSG_FASTOPEN).ok()?;
                    thread::sleep(Duration::from_millis(500));
                    Some(held(&TcpStream::from(socket)))
                })
            })
            .collect();
        tries.into_iter().filter_map(|t| t.join().unwrap()).filter(|&kept| kept).count()
    })
    .unwrap();
    let s = stats(PORT + 2);
    println!("20 requests in Fast Open SYNs at once: {kept} held; {s}");
    assert!((1..=5).contains(&kept), "at most the limit is held: {kept}; {s}");
    gate.stop();
    assert_eq!(tcp_fastopen(&bed.server_ns), 0x603, "put back as the gate stops");
}

/// Many clients behind one address (a proxy, a NAT) at 4x overload, on the
/// defaults plus `--action http`: every refused request gets its 503 (or a
/// reset), never silence, and goodput is at least what no gate gives. The
/// per-/24 cap on answers (1,000 a second, against reflection) used to spend
/// itself on the address's cookie SYN-ACKs and 503s, and every refusal past
/// it was a dropped SYN that the client retried after its deadline. An
/// address that holds admitted connections is proven, not forged: its
/// refusals are answered within the port's cap alone. (Four seconds of load:
/// the cap is a per-second budget, and the controller needs a second to settle.)
#[test]
fn a_proxys_clients_behind_one_address_get_answers_not_silence() {
    let _one = exclusive();
    let bed = Testbed::create("shedpx").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let run = || {
        // A server of its own each run: no gate's leaves thousands of
        // connections queued, which it would serve for seconds more.
        let service_us = Arc::new(std::sync::atomic::AtomicU64::new(50_000));
        let _backend =
            Backend::start(&bed.server_ns, addr, Service::HttpWorkers { workers: 10, service_us }).expect("backend");
        let rate = Arc::new(std::sync::atomic::AtomicU64::new(800));
        let load =
            testbed::OpenLoop::start_with(&bed.client_ns, addr, rate, Duration::from_secs(2), testbed::HTTP_REQUEST);
        thread::sleep(Duration::from_secs(4));
        let outcomes = load.finish();
        let count = |f: fn(&testbed::Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        (
            count(|o| matches!(o, testbed::Outcome::Answered(_))),
            count(|o| matches!(o, testbed::Outcome::Refused)),
            count(|o| matches!(o, testbed::Outcome::TimedOut | testbed::Outcome::Failed)),
            outcomes.len(),
        )
    };
    let (no_gate, _, _, sent) = run();
    let gate = Gate::start(&bed, &["--port", "8080", "--action", "http"]);
    let (answered, refused, silent, total) = run();
    let s = stats(PORT);
    drop(gate);
    println!(
        "no gate {no_gate} of {sent} answered; gate {answered} of {total} answered, {refused} refused, {silent} nothing within 2 s; {s}"
    );
    assert!(answered >= no_gate, "goodput at least no gate's: {answered} vs {no_gate}; {s}");
    assert!(refused > total / 4, "the overload is refused: {refused} of {total}; {s}");
    assert!(silent * 100 <= refused, "refusals are answered, not silent: {silent} silent, {refused} refused; {s}");
}
