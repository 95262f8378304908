// SPDX-License-Identifier: MIT OR Apache-2.0
//! Client tiers end to end: several client addresses in the client namespace,
//! the real `shedctl`, real sockets. Needs root.
mod support;

use std::{
    io,
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

use shed_testkit::testbed::{self, Backend, Service, Testbed};
use support::gate::{Gate, exclusive, field, shedctl, stats, wait_for_stats};

const PORT: u16 = 8080;

fn connect_from(bed: &Testbed, source: IpAddr, addr: SocketAddr) -> io::Result<TcpStream> {
    testbed::run_in(&bed.client_ns, move || testbed::connect_from(source, addr, Duration::from_secs(1)))
        .expect("client namespace")
}

/// A connection from `source` that the backend (echo) has answered: a client
/// refused at its handshake-completing ACK may see `connect()` succeed just
/// before the reset arrives, so an answer is what proves admission.
fn served_from(bed: &Testbed, source: IpAddr, addr: SocketAddr) -> io::Result<TcpStream> {
    let mut s = connect_from(bed, source, addr)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    std::io::Write::write_all(&mut s, b"p")?;
    let mut buf = [0u8; 1];
    std::io::Read::read_exact(&mut s, &mut buf)?;
    Ok(s)
}

fn tier(stats: &serde_json::Value, name: &str, what: &str) -> u64 {
    stats["tiers"][name][what].as_u64().unwrap_or_else(|| panic!("tiers.{name}.{what} in {stats}"))
}

#[test]
fn low_is_shed_first_critical_keeps_its_admissions_exempt_always_gets_in() {
    let _one = exclusive();
    let bed = Testbed::create("shedtt").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let critical = IpAddr::V4(bed.add_client_v4(3).unwrap());
    let low = IpAddr::V4(bed.add_client_v4(4).unwrap());
    let exempt = IpAddr::V4(bed.add_client_v4(5).unwrap());
    let retiered = IpAddr::V4(bed.add_client_v4(6).unwrap());
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(
        &bed,
        &[
            "--port",
            "8080",
            "--limit",
            "10",
            "--action",
            "rst",
            "--count",
            "connections",
            "--tier",
            "10.200.0.3/32=critical",
            "--tier",
            "10.200.0.4/32=low",
            "--tier",
            "10.200.0.5/32=exempt",
        ],
    );

    // Critical and low each offer 12 connections, alternately: more than the limit.
    let mut held = Vec::new();
    let mut first_refused = None;
    let (mut admitted_low, mut admitted_critical) = (0, 0);
    for i in 0..12 {
        for (name, source) in [("low", low), ("critical", critical)] {
            match served_from(&bed, source, addr) {
                Ok(s) => {
                    held.push(s);
                    if name == "low" { admitted_low += 1 } else { admitted_critical += 1 }
                }
                Err(e) => {
                    // Low is refused at its SYN; a critical claim is judged at the ACK that
                    // proves it, so a refused critical client's handshake is reset.
                    let reset = matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof
                    );
                    if name == "low" {
                        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{name} #{i}: {e}");
                    } else {
                        assert!(reset, "{name} #{i}: reset after its handshake: {e}");
                    }
                    first_refused.get_or_insert(name);
                }
            }
        }
    }
    println!("tiers: low admitted {admitted_low} of 12, critical admitted {admitted_critical} of 12 at limit 10");
    assert_eq!(first_refused, Some("low"), "low is rejected first");
    assert_eq!((admitted_low, admitted_critical), (4, 6), "low stops at its 70% share, critical fills the limit");
    let s = stats(PORT);
    assert_eq!(field(&s, "in_flight"), 10, "{s}");
    assert_eq!((tier(&s, "low", "admitted"), tier(&s, "low", "rejected")), (4, 8), "{s}");
    assert_eq!((tier(&s, "critical", "admitted"), tier(&s, "critical", "rejected")), (6, 6), "{s}");
    assert_eq!(
        (s["rejected_by_reason"]["share"].as_u64(), s["rejected_by_reason"]["limit"].as_u64()),
        (Some(2), Some(12)),
        "{s}"
    );

    // Exempt connects although the limit is full, and is not counted (not even as open).
    for _ in 0..3 {
        let mut s = connect_from(&bed, exempt, addr).expect("exempt always gets in");
        std::io::Write::write_all(&mut s, b"ping").unwrap();
        let mut buf = [0u8; 4];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        std::io::Read::read_exact(&mut s, &mut buf).expect("exempt connection served");
        held.push(s);
    }
    let s = stats(PORT);
    assert_eq!((field(&s, "in_flight"), field(&s, "established"), tier(&s, "exempt", "admitted")), (10, 10, 3), "{s}");

    // Make room (drop 3 critical connections), then watch a tier change land on the next SYN.
    held.drain(4..7);
    // The window after critical's rejections holds a tenth of the limit (one slot)
    // back from each lower tier, for about four windows (it decays by a fifth a
    // window); with no more rejections the hold decays away.
    let s = wait_for_stats(PORT, Duration::from_secs(3), "a slot held back from normal and low", |s| {
        tier(s, "normal", "held_back") == 1 && tier(s, "low", "held_back") == 1
    });
    println!(
        "held back after critical rejections: normal {}, low {}",
        tier(&s, "normal", "held_back"),
        tier(&s, "low", "held_back")
    );
    wait_for_stats(PORT, Duration::from_secs(5), "in-flight 7, nothing held back", |s| {
        field(s, "in_flight") == 7 && tier(s, "normal", "held_back") == 0 && tier(s, "low", "held_back") == 0
    });
    held.push(connect_from(&bed, retiered, addr).expect("unlisted source is normal: 7 < 9"));
    let out = shedctl(&["tier", "add", "10.200.0.6/32", "low"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "10.200.0.6/32 is now low\n", "not the first tier: one line");
    // Replacing a tier says what it was.
    let out = shedctl(&["tier", "add", "10.200.0.6/32", "normal"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.200.0.6/32 is now normal (was low)"));
    assert!(shedctl(&["tier", "add", "10.200.0.6/32", "low"]).status.success());
    let e = connect_from(&bed, retiered, addr).expect_err("now low: 8 >= 7");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    let out = shedctl(&["tier", "ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("tier ls --json");
    assert!(list.as_array().unwrap().iter().any(|r| r["cidr"] == "10.200.0.6/32" && r["tier"] == "low"), "{list}");
    assert!(shedctl(&["tier", "rm", "10.200.0.6/32"]).status.success());
    held.push(connect_from(&bed, retiered, addr).expect("normal again: 8 < 9"));
    let out = shedctl(&["tier", "rm", "10.200.0.6/32"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no tier of its own"));
    drop(held);
}

#[test]
fn one_client_cannot_hold_more_than_its_cap() {
    let _one = exclusive();
    let bed = Testbed::create("shedtc").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let noisy = IpAddr::V4(bed.add_client_v4(3).unwrap());
    let other = IpAddr::V4(bed.add_client_v4(4).unwrap());
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "50", "--action", "rst", "--client-cap", "3"]);

    let mut noisy_held: Vec<TcpStream> =
        (0..3).map(|i| connect_from(&bed, noisy, addr).unwrap_or_else(|e| panic!("#{i}: {e}"))).collect();
    let e = connect_from(&bed, noisy, addr).expect_err("a 4th connection over the cap");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    let others: Vec<TcpStream> =
        (0..3).map(|_| connect_from(&bed, other, addr).expect("others still get in")).collect();
    let s = wait_for_stats(PORT, Duration::from_secs(3), "6 open", |s| field(s, "established") == 6);
    assert_eq!(s["rejected_by_reason"]["client_cap"].as_u64(), Some(1), "{s}");
    let held_by = |s: &serde_json::Value, client: &str| {
        s["top_clients"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["client"] == client)
            .map_or(0, |c| c["in_flight"].as_i64().unwrap())
    };
    assert_eq!((held_by(&s, "10.200.0.3"), held_by(&s, "10.200.0.4")), (3, 3), "{s}");

    // Released exactly like the port's in-flight: one closes, one more gets in.
    noisy_held.pop();
    wait_for_stats(PORT, Duration::from_secs(5), "noisy client down to 2", |s| held_by(s, "10.200.0.3") == 2);
    noisy_held.push(connect_from(&bed, noisy, addr).expect("room again after a close"));
    drop((noisy_held, others));
    let s = wait_for_stats(PORT, Duration::from_secs(5), "all closed", |s| field(s, "in_flight") == 0);
    assert!(s["top_clients"].as_array().unwrap().is_empty(), "nothing held after every close: {s}");
}

#[test]
fn a_full_client_map_is_counted_and_the_port_limit_still_holds() {
    use shed_common::{ClientKey, capacity::MAX_CLIENTS, ipv4_mapped};
    let _one = exclusive();
    let bed = Testbed::create("shedtf").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let client = IpAddr::V4(bed.add_client_v4(3).unwrap());
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "5", "--action", "rst", "--client-cap", "2"]);
    // Only confirmed handshakes add clients, so forged sources cannot do this; 65,536
    // real clients holding connections can. Each holds one here.
    let mut maps = shed::kernel::maps::GateMaps::open_pinned().unwrap();
    let slot = maps.config(PORT).unwrap().slot;
    // Other clients, one per address of 100.64.0.0/16.
    let fake = |i: u32| ClientKey { slot, addr: ipv4_mapped([100, 64, (i >> 8) as u8, i as u8]) };
    for i in 0..MAX_CLIENTS {
        maps.raw_mut().clients.insert(fake(i), 1, 0).unwrap();
    }
    // The client's connections cannot be counted against its cap: each is counted
    // as client_map_full instead, and the port's limit still holds.
    let held: Vec<TcpStream> =
        (0..5).map(|i| connect_from(&bed, client, addr).unwrap_or_else(|e| panic!("#{i}: {e}"))).collect();
    let e = connect_from(&bed, client, addr).expect_err("over the port's limit");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    let s = wait_for_stats(PORT, Duration::from_secs(3), "5 open", |s| field(s, "established") == 5);
    assert_eq!(field(&s, "client_map_full"), 5, "{s}");
    assert_eq!(s["rejected_by_reason"]["limit"].as_u64(), Some(1), "{s}");
    for i in 0..MAX_CLIENTS {
        maps.raw_mut().clients.remove(&fake(i)).unwrap();
    }
    drop(held);
}

/// Forged SYNs from a critical range hold nothing and move nothing: while real
/// work fills the port, a flood claiming the critical tier takes no slot, is
/// never counted as a critical client refused, and makes no lower tier hold
/// back (the hold-back reacts to refusals at the ACK, of verified sources).
#[test]
fn forged_critical_syns_take_no_slot_and_trigger_no_hold_back() {
    let _one = exclusive();
    let bed = Testbed::create("shedtv").expect("testbed");
    // SYN-ACKs to the forged sources leave for the client side, where nobody answers them.
    let route = std::process::Command::new("ip")
        .args(["-n", &bed.server_ns, "route", "add", "default", "via", "10.200.0.2"])
        .status()
        .unwrap();
    assert!(route.success());
    let addr = bed.server_addr(false, PORT);
    let normal = IpAddr::V4(bed.add_client_v4(3).unwrap());
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let _gate = Gate::start(
        &bed,
        &[
            "--port",
            "8080",
            "--limit",
            "10",
            "--action",
            "rst",
            "--count",
            "connections",
            "--tier",
            "100.64.0.0/10=critical",
            "--tier",
            "10.200.0.4/32=low",
        ],
    );
    // Normal's share of 10 is 9: real normal clients hold all of it.
    let held: Vec<TcpStream> =
        (0..9).map(|i| served_from(&bed, normal, addr).unwrap_or_else(|e| panic!("normal #{i}: {e}"))).collect();
    let server = bed.server_v4;
    let sent = testbed::run_in(&bed.client_ns, move || {
        testbed::syn_flood_at(server, PORT, 2_000, Duration::from_secs(2), |i| {
            let h = i.wrapping_mul(2_654_435_761);
            std::net::Ipv4Addr::new(100, 64 + ((h >> 16) & 63) as u8, (h >> 8) as u8, (h as u8).max(1))
        })
    })
    .unwrap()
    .expect("raw socket");
    // Several control windows after the flood: a hold-back would have been written by now.
    std::thread::sleep(Duration::from_millis(500));
    let s = stats(PORT);
    println!("forged critical flood: {sent} SYNs; {s}");
    assert!(sent >= 3_000, "the flood ran: {sent}");
    assert_eq!(field(&s, "in_flight"), 9, "only the real connections hold slots: {s}");
    assert!(field(&s, "syn_passed") >= u64::from(sent), "every forged SYN passed holding nothing: {s}");
    assert_eq!((tier(&s, "critical", "admitted"), tier(&s, "critical", "rejected")), (0, 0), "{s}");
    assert_eq!((tier(&s, "normal", "held_back"), tier(&s, "low", "held_back")), (0, 0), "no hold-back: {s}");
    drop(held);
}
