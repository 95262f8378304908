// SPDX-License-Identifier: MIT OR Apache-2.0
//! Churn soak: many connections opened and closed every way there is, against
//! a protected port. Afterwards the raw kernel counts balance exactly (every
//! connection opened was closed, every busy spell ended, every handshake
//! reservation was released by its completion or, one per retransmitted SYN,
//! lapsed), each port opened exactly the connections made to it, nothing needed healing, and the
//! per-socket and per-client maps are back to idle. The raw counts are read
//! from the maps, not from `stats` (which clamps in-flight at zero and so would
//! hide an over-release).
//! `SHED_SOAK_CONNECTIONS` sets the count (CI: 3,000; the long run: 100,000).
mod support;

use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, TcpStream},
    sync::{Arc, atomic::AtomicU64},
    thread,
    time::{Duration, Instant},
};

use shed::kernel::maps::GateMaps;
use shed_testkit::testbed::{self, Backend, Service, Testbed};
use support::gate::{Gate, exclusive, field, stats, wait_for_stats};

const PORT: u16 = 8080;

#[test]
fn churn_returns_every_count_to_zero() {
    let total: u64 = std::env::var("SHED_SOAK_CONNECTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000);
    let _one = exclusive();
    let bed = Testbed::create("shedts").expect("testbed");
    let addr = bed.server_addr(false, PORT);
    let server_first = bed.server_addr(false, 8081);
    // 8080: echo (client closes); 8081: answers one request and closes first.
    let _echo = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let service_us = Arc::new(AtomicU64::new(0));
    let _closer =
        Backend::start(&bed.server_ns, server_first, Service::Workers { workers: 4, service_us }).expect("backend");
    // A handshake window far longer than any handshake here (the measured one is
    // 4x the p99, a fraction of a millisecond on a veth, and a scheduling stall on a
    // busy two-core machine can outlast it): a reservation that lapses is then a
    // release the accounting lost, never a slow handshake.
    let _gate = Gate::start(
        &bed,
        &[
            "--port",
            "8080",
            "--port",
            "8081",
            "--limit",
            "10000",
            "--action",
            "rst",
            "--client-cap",
            "10000",
            "--handshake-window",
            "2000",
        ],
    );

    let start = Instant::now();
    let workers = 4u64;
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            testbed::spawn_in(&bed.client_ns, move || {
                let mut failures = 0u64;
                // Connections made to 8080 and to 8081 (the connect itself succeeded).
                let mut connected = [0u64; 2];
                let mut count = |port: usize, r: std::io::Result<TcpStream>| {
                    connected[port] += u64::from(r.is_ok());
                    r
                };
                for i in (w..total).step_by(workers as usize) {
                    let ok = match i % 4 {
                        // Clean close by the client after a round trip.
                        0 => count(0, TcpStream::connect(addr)).and_then(|mut s| {
                            s.write_all(b"hi")?;
                            let mut buf = [0u8; 2];
                            s.read_exact(&mut buf)?;
                            s.shutdown(Shutdown::Both)
                        }),
                        // Reset by the client (linger 0), after one round trip: the
                        // handshake's last ACK leaves from the softirq that took the
                        // SYN-ACK, the RST from this thread, possibly on the other CPU,
                        // and a veth queues each on its sender's CPU; an RST that
                        // overtakes the ACK kills the request socket before it is a
                        // connection (seen once in a fresh-clone run), which no gate
                        // could count. The echo proves the connection exists.
                        1 => count(0, TcpStream::connect(addr)).and_then(|mut s| {
                            s.write_all(b"hi")?;
                            let mut buf = [0u8; 2];
                            s.read_exact(&mut buf)?;
                            socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
                            drop(s);
                            Ok(())
                        }),
                        // The server answers and closes first.
                        2 => count(1, TcpStream::connect(server_first)).and_then(|mut s| {
                            s.write_all(b"GET\n")?;
                            let mut buf = Vec::new();
                            s.read_to_end(&mut buf).map(|_| ())
                        }),
                        // Closed without a word, before the server reads anything.
                        _ => count(1, TcpStream::connect(server_first)).map(drop),
                    };
                    failures += u64::from(ok.is_err());
                }
                (failures, connected)
            })
        })
        .collect();
    let (mut failures, mut connected) = (0u64, [0u64; 2]);
    for h in handles {
        let (f, c) = h.join().unwrap().unwrap();
        failures += f;
        connected = [connected[0] + c[0], connected[1] + c[1]];
    }
    let elapsed = start.elapsed();
    println!(
        "soak: {total} connections in {elapsed:?} ({:.0}/s), {failures} client-side errors",
        total as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(failures, 0, "every connection completes its exchange on a clean network");
    let made = |port: usize| (0..total).filter(|i| (i % 4 < 2) == (port == 0)).count() as u64;
    assert_eq!(connected, [made(0), made(1)], "every connect succeeded");

    let maps = GateMaps::open_pinned().unwrap();
    for (i, port) in [8080u16, 8081].into_iter().enumerate() {
        let s = wait_for_stats(port, Duration::from_secs(10), "everything closed", |s| {
            field(s, "in_flight") == 0 && field(s, "established") == 0 && field(s, "pending") == 0
        });
        let slot = maps.config(port).unwrap().slot;
        let raw = maps.state.get(&slot, 0).unwrap();
        assert_eq!(raw.opened, connected[i], "port {port}: one socket opened per connection: {raw:?}");
        assert_eq!(raw.closed, raw.opened, "port {port}: every socket opened was closed once: {raw:?}");
        assert_eq!(raw.busy_exit, raw.busy_enter, "port {port}: every busy spell ended once: {raw:?}");
        // Reservations: every one was released by its handshake's completion, except
        // one per retransmitted SYN (a SYN the server's kernel did not answer in time is
        // sent again and admitted afresh; the first reservation then lapses). So what is
        // still unreleased equals the SYNs beyond one per connection, exactly.
        let ring = maps.handshakes.get(&slot, 0).unwrap();
        for cell in &ring.cells {
            assert!(cell.completed <= cell.admitted, "port {port}: a reservation released twice: {ring:?}");
        }
        let unreleased = ring.lapsed + ring.cells.iter().map(|c| c.admitted - c.completed).sum::<u64>();
        let (syns, admitted) = (field(&s, "syn_seen"), field(&s, "admitted"));
        assert_eq!(admitted, syns, "nothing rejected: {s}");
        assert_eq!(field(&s, "rejected"), 0, "{s}");
        assert_eq!(field(&s, "late_completed"), 0, "no handshake outlasted the 2 s window: {s}");
        assert_eq!(
            admitted,
            raw.opened + unreleased,
            "port {port}: every admission was released by a completion or lapsed: {ring:?} {s}"
        );
        assert_eq!(
            syns - connected[i],
            unreleased,
            "port {port}: only retransmitted SYNs leave a reservation to lapse: {ring:?} {s}"
        );
        assert!(unreleased * 100 <= connected[i], "port {port}: over 1% of SYNs retransmitted: {s}");
        assert_eq!(field(&s, "drift_corrected"), 0, "a clean soak needs no healing: {s}");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let socks = maps.socks.keys().count();
        // Idle clients are forgotten on the second 5 s sweep that finds them idle.
        let clients = maps.clients.keys().count();
        if socks == 0 && clients == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "maps not back to idle: {socks} sockets, {clients} clients");
        thread::sleep(Duration::from_millis(200));
    }
    let s = stats(PORT);
    assert_eq!(field(&s, "busy"), 0, "{s}");
}
