// SPDX-License-Identifier: MIT OR Apache-2.0
//! The load-balancer agent (`attach --agent-port PORT`): HAProxy's
//! `agent-check` connects, reads one line such as `70%` and closes. The line
//! is this backend's weight ([`crate::control::steer`]) from the gate's own
//! maps, so a balancer moves traffic to backends with room before any gate
//! has to refuse it.
//!
//! One per gate, listening on every address of the gate's namespace (a pod's
//! gate: the pod's own address, where the balancer reaches the pod). Two
//! threads: a sampler that reads the gate's maps every [`SAMPLE`] and keeps
//! the weight in an atomic, and a listener that answers each connection at
//! once from it. The listener serves one connection at a time without
//! waiting on any: the line is written without blocking (it fits any socket
//! buffer) and the connection closed, so it answers in microseconds, holds
//! nothing per client, and a client that connects and never reads costs it
//! nothing.
use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener},
    os::fd::AsRawFd as _,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    control::steer::{self, Load, Steering},
    error::Error,
    kernel::maps::{GateMaps, PortSnapshot},
    observe::lock,
};

/// How often the sampler reads the gate's maps.
const SAMPLE: Duration = Duration::from_millis(100);
/// How long the answered connection is drained of what the check sent before it closes.
const DRAIN_WAIT: Duration = Duration::from_millis(5);
/// With several protected ports, how long a check may take to name one
/// (HAProxy's `agent-send "8080\n"`, written as it connects).
const NAMED_PORT_WAIT: Duration = Duration::from_millis(1);

/// The weights the listener answers with: each protected port's, and the lowest.
#[derive(Debug, Default)]
struct Weights {
    by_port: std::collections::BTreeMap<u16, u32>,
}

impl Weights {
    /// The weight for a check that named `port` (or none): that port's, else
    /// the lowest (a backend serves the balancer as well as its weakest port).
    fn for_port(&self, port: Option<u16>) -> u32 {
        port.and_then(|p| self.by_port.get(&p).copied())
            .unwrap_or_else(|| self.by_port.values().copied().min().unwrap_or(100))
    }
}

/// Listens for the balancer's agent checks on `port` of every address of the
/// calling thread's namespace (IPv6 and IPv4 at once where the namespace has
/// IPv6). Called in the gate's set-up, so a busy port refuses the attach.
pub(crate) fn bind(port: u16) -> Result<TcpListener, Error> {
    let any6: SocketAddr = (std::net::Ipv6Addr::UNSPECIFIED, port).into();
    let dual = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).and_then(|s| {
        s.set_only_v6(false)?;
        s.set_reuse_address(true)?;
        s.bind(&any6.into())?;
        s.listen(128)?;
        Ok(s)
    });
    let listener: TcpListener = match dual {
        Ok(socket) => socket.into(),
        // No IPv6 in this namespace: IPv4 alone.
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) || e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
            let any4: SocketAddr = (std::net::Ipv4Addr::UNSPECIFIED, port).into();
            TcpListener::bind(any4)
                .map_err(|e| Error::io("listen for agent checks (--agent-port) on", any4.to_string(), e))?
        }
        Err(e) => return Err(Error::io("listen for agent checks (--agent-port) on", format!("port {port}"), e)),
    };
    Ok(listener)
}

/// Serves a gate's agent until `ended`: the sampler reads the maps pinned at
/// `pin_dir`, the listener answers on `listener`.
pub(crate) fn serve(listener: TcpListener, pin_dir: PathBuf, label: String, ended: Arc<AtomicBool>) {
    let weight = Arc::new(std::sync::Mutex::new(Weights::default()));
    let (w, stop) = (weight.clone(), ended.clone());
    let sampler =
        std::thread::Builder::new().name(format!("shed-agent-{label}")).spawn(move || sample(&pin_dir, &w, &stop));
    if let Err(e) = sampler {
        return tracing::error!(netns = %label, "agent disabled: cannot start its sampler: {e}");
    }
    let answer = std::thread::Builder::new().name(format!("shed-agent-{label}")).spawn(move || {
        answer(&listener, &weight, &ended);
    });
    if let Err(e) = answer {
        tracing::error!(netns = %label, "agent disabled: cannot start its listener: {e}");
    }
}

/// Keeps each protected port's weight current.
fn sample(pin_dir: &std::path::Path, weights: &std::sync::Mutex<Weights>, ended: &AtomicBool) {
    let mut maps = None;
    let mut ports: std::collections::BTreeMap<u16, Steering> = std::collections::BTreeMap::new();
    let mut last = Instant::now();
    while !ended.load(Ordering::Relaxed) {
        std::thread::sleep(SAMPLE);
        let now = Instant::now();
        let elapsed = now - std::mem::replace(&mut last, now);
        if maps.is_none() {
            maps = GateMaps::open_pinned_at(pin_dir).ok();
        }
        let Some(open) = maps.as_ref() else { continue };
        let Ok(snapshots) = open.snapshots(None) else { continue };
        ports.retain(|port, _| snapshots.iter().any(|s| s.port == *port));
        for snapshot in &snapshots {
            ports.entry(snapshot.port).or_default().sample(elapsed, load(snapshot));
        }
        let by_port = ports.iter().map(|(&port, s)| (port, s.weight())).collect();
        lock(weights).by_port = by_port;
    }
}

/// What the weight rule reads of one port.
fn load(s: &PortSnapshot) -> Load {
    let rejected = s.rejected();
    Load {
        attempts: s.counter(shed_common::counter::ADMITTED)
            + s.counter(shed_common::counter::REQUEST_ADMITTED)
            + rejected,
        refused: rejected,
        in_flight: s.in_flight(),
        limit: s.limit,
        queue_wait_us: s.status.queue_wait_p99_us,
        // The queue controller's own objective: its target, and never less
        // than 3/4 of the median service time (see `control`). Not the wait
        // the controller aims at, which takes `--target-latency`'s slack too:
        // steering on that moved B13's shift one 250 ms step later (2.01 s
        // against 1.76 s, 2026-12-04); traffic should leave a backend whose
        // queue outgrows its service, before the SLO's slack is spent.
        objective_us: u64::from(s.control.queue_target_us).max(s.status.service_p50_us * 3 / 4),
    }
}

/// Answers every agent check with the current weight until `ended`.
fn answer(listener: &TcpListener, weights: &std::sync::Mutex<Weights>, ended: &AtomicBool) {
    while !ended.load(Ordering::Relaxed) {
        // Woken at least every 100 ms to see `ended`; a connection waiting is answered at once.
        let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&raw mut fd, 1, 100) } <= 0 {
            continue;
        }
        let Ok((mut conn, _)) = listener.accept() else {
            // Out of files or memory: the gate goes on; try again shortly.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = conn.set_nonblocking(true);
        let several = lock(weights).by_port.len() > 1;
        // One port: the answer at once. Several: a check may name one first.
        let named = if several { named_port(&conn) } else { None };
        let weight = lock(weights).for_port(named);
        let _ = conn.write_all(steer::agent_line(weight).as_bytes());
        let _ = conn.shutdown(Shutdown::Write);
        // Whatever the check sent (HAProxy's `agent-send`, which may come just
        // after the connect) is read before the close, which would otherwise
        // reset the connection, and the line with it; waiting at most a few
        // milliseconds, so a client that never sends nor closes holds little.
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(DRAIN_WAIT));
        let _ = conn.read(&mut [0u8; 256]);
    }
}

/// The port a check names in its first line (`8080\n`), if it sends one within [`NAMED_PORT_WAIT`].
fn named_port(conn: &std::net::TcpStream) -> Option<u16> {
    let mut fd = libc::pollfd { fd: conn.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let wait = NAMED_PORT_WAIT.as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&raw mut fd, 1, wait) } <= 0 {
        return None;
    }
    let mut buf = [0u8; 16];
    let n = conn.peek(&mut buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.lines().next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A balancer's weight follows the work a backend was offered: every
    /// connection and kept-alive request admitted and every refusal, from
    /// the gate's own counters. A pool of kept-alive connections (HAProxy's
    /// `http-reuse`) brings its requests on connections admitted long ago:
    /// counted as connections alone, its attempts would stand still while
    /// its refusals grew, and the weight would read them as all refused.
    #[test]
    fn a_backends_attempts_are_its_connections_and_kept_alive_requests_admitted_and_its_refusals() {
        use shed_common::{counter, *};
        let mut counters = PortCounters::default();
        for (index, value) in [
            (counter::ADMITTED, 3),
            (counter::REQUEST_ADMITTED, 5),
            (counter::REJECTED_LIMIT, 2),
            (counter::REJECTED_CLIENT_SHARE, 1),
            // Seen, passed or answered: none of them a judgement of its own.
            (counter::SYN_SEEN, 100),
            (counter::SYN_PASSED, 50),
            (counter::RST_SENT, 3),
            (counter::REFUSED_REQUEST, 2),
        ] {
            counters.values[index] = value;
        }
        let snapshot = crate::kernel::maps::PortSnapshot {
            port: 8080,
            config: PortConfig::new(0, action::RST, false, count_mode::WORK),
            limit: 4,
            control: ControlConfig::default(),
            status: ControlStatus::default(),
            reserve: TierReserve::default(),
            state: PortState::default(),
            user: UserPortState::default(),
            ring: HandshakeRing::default(),
            silent: HandshakeRing::default(),
            now_ns: 0,
            counters,
        };
        let load = load(&snapshot);
        assert_eq!((load.attempts, load.refused), (3 + 5 + 3, 3), "{load:?}");
        assert_eq!(load.limit, 4);
        // The objective: the queue target, or 3/4 of the median service time if longer.
        let mut slow = snapshot;
        slow.control.queue_target_us = 5_000;
        let queue_target_us = 5_000;
        slow.status.service_p50_us = 4 * queue_target_us;
        assert_eq!(super::load(&slow).objective_us, 3 * queue_target_us, "3/4 of the service time");
        slow.status.service_p50_us = queue_target_us;
        assert_eq!(super::load(&slow).objective_us, queue_target_us, "the target, above 3/4 of it");
    }

    /// Serves checks from `weights` until the returned flag is set.
    fn agent(weights: &[(u16, u32)]) -> (SocketAddr, Arc<std::sync::Mutex<Weights>>, Arc<AtomicBool>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let w = Arc::new(std::sync::Mutex::new(Weights { by_port: weights.iter().copied().collect() }));
        let ended = Arc::new(AtomicBool::new(false));
        let (w2, e2) = (w.clone(), ended.clone());
        std::thread::spawn(move || answer(&listener, &w2, &e2));
        (addr, w, ended)
    }

    fn check(addr: SocketAddr, send: &[u8]) -> String {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(send).unwrap();
        let mut line = String::new();
        conn.read_to_string(&mut line).unwrap();
        line
    }

    #[test]
    fn a_check_reads_the_weight_as_one_line_and_the_connection_closes() {
        let (addr, weights, ended) = agent(&[(8080, 35)]);
        assert_eq!(check(addr, b""), "35%\n");
        // What HAProxy's agent-send sends does not cost the answer.
        assert_eq!(check(addr, b"8080\n"), "35%\n");
        weights.lock().unwrap().by_port.insert(8080, 100);
        assert_eq!(check(addr, b""), "100%\n");
        // A client that never reads holds nothing: the next check is answered.
        let idle = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(check(addr, b""), "100%\n");
        drop(idle);
        ended.store(true, Ordering::Relaxed);
    }

    #[test]
    fn with_several_ports_a_check_names_its_port_or_gets_the_lowest() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Every check connected and sent before the agent accepts any: what a
        // check names is there when it is read, however the threads are scheduled.
        let checks = [
            (&b"9090\n"[..], "90%\n"),
            (b"8080\n", "40%\n"),
            (b"", "40%\n"),
            (b"7070\n", "40%\n"),
            (b"junk\n", "40%\n"),
        ];
        let conns: Vec<std::net::TcpStream> = checks
            .iter()
            .map(|(send, _)| {
                let mut conn = std::net::TcpStream::connect(addr).unwrap();
                conn.write_all(send).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                conn
            })
            .collect();
        let weights = Arc::new(std::sync::Mutex::new(Weights { by_port: [(8080, 40), (9090, 90)].into() }));
        let ended = Arc::new(AtomicBool::new(false));
        let (w, e) = (weights.clone(), ended.clone());
        std::thread::spawn(move || answer(&listener, &w, &e));
        // A named port gets its own weight; none, one not protected, or junk: the lowest.
        for (mut conn, (send, want)) in conns.into_iter().zip(checks) {
            let mut line = String::new();
            conn.read_to_string(&mut line).unwrap();
            assert_eq!(line, want, "after sending {:?}", String::from_utf8_lossy(send));
        }
        ended.store(true, Ordering::Relaxed);
    }

    #[test]
    fn no_port_protected_yet_is_full_weight() {
        assert_eq!(Weights::default().for_port(None), 100);
        assert_eq!(Weights::default().for_port(Some(8080)), 100);
    }

    #[test]
    fn a_busy_agent_port_is_refused_with_the_flag_named() {
        let first = bind(0).unwrap();
        let port = first.local_addr().unwrap().port();
        let err = bind(port).unwrap_err().to_string();
        assert!(err.contains("--agent-port") && err.contains(&port.to_string()), "{err}");
    }
}
