// SPDX-License-Identifier: MIT OR Apache-2.0
//! Throwaway network namespaces, backends and clients for the end-to-end
//! tests and the demo. Everything here cleans up after itself on drop, and
//! every loop is bounded in time.
use std::{
    fs::File,
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd as _},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

/// Server and client namespaces joined by a veth pair.
pub struct Testbed {
    pub server_ns: String,
    pub client_ns: String,
    pub server_if: String,
    pub client_if: String,
    pub server_v4: Ipv4Addr,
    pub server_v6: Ipv6Addr,
}

/// Runs `ip` with `args`; its stderr is the error.
pub(crate) fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl Testbed {
    /// Creates `<name>-srv` and `<name>-cli` (name: at most 8 characters).
    pub fn create(name: &str) -> io::Result<Self> {
        assert!(name.len() <= 8, "testbed name {name:?} too long for interface names");
        let bed = Self {
            server_ns: format!("{name}-srv"),
            client_ns: format!("{name}-cli"),
            server_if: format!("{name}-s"),
            client_if: format!("{name}-c"),
            server_v4: Ipv4Addr::new(10, 200, 0, 1),
            server_v6: "fd00:5ed::1".parse().expect("valid address"),
        };
        // Leftovers of a crashed earlier run would make every step below fail.
        let _ = ip(&["netns", "del", &bed.server_ns]);
        let _ = ip(&["netns", "del", &bed.client_ns]);
        ip(&["netns", "add", &bed.server_ns])?;
        ip(&["netns", "add", &bed.client_ns])?;
        let (s, c) = (bed.server_if.as_str(), bed.client_if.as_str());
        let (sn, cn) = (bed.server_ns.as_str(), bed.client_ns.as_str());
        ip(&["link", "add", s, "netns", sn, "type", "veth", "peer", "name", c, "netns", cn])?;
        ip(&["-n", sn, "addr", "add", "10.200.0.1/24", "dev", s])?;
        ip(&["-n", cn, "addr", "add", "10.200.0.2/24", "dev", c])?;
        ip(&["-n", sn, "addr", "add", "fd00:5ed::1/64", "dev", s, "nodad"])?;
        ip(&["-n", cn, "addr", "add", "fd00:5ed::2/64", "dev", c, "nodad"])?;
        for (ns, dev) in [(sn, s), (cn, c), (sn, "lo"), (cn, "lo")] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(bed)
    }

    /// Adds `10.200.0.<host>/24` to the client end, for clients of several addresses.
    pub fn add_client_v4(&self, host: u8) -> io::Result<Ipv4Addr> {
        let addr = Ipv4Addr::new(10, 200, 0, host);
        ip(&["-n", &self.client_ns, "addr", "add", &format!("{addr}/24"), "dev", &self.client_if])?;
        Ok(addr)
    }

    pub fn server_addr(&self, v6: bool, port: u16) -> SocketAddr {
        if v6 {
            SocketAddr::new(IpAddr::V6(self.server_v6), port)
        } else {
            SocketAddr::new(IpAddr::V4(self.server_v4), port)
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the pair.
        let _ = ip(&["netns", "del", &self.server_ns]);
        let _ = ip(&["netns", "del", &self.client_ns]);
    }
}

/// Sets `TCP_DEFER_ACCEPT` on a listening socket: the kernel drops a
/// handshake-completing ACK that carries no data and keeps the handshake a
/// request socket for up to `seconds`, completing it with the first data.
pub fn defer_accept_for(socket: &socket2::Socket, seconds: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt on a socket the caller owns, with a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const seconds).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the kernel in `ns` answer every SYN with a SYN cookie
/// (`tcp_syncookies=2`), as a listener in overflow does: a handshake then
/// completes on the listener itself, with no request socket.
pub fn always_syn_cookies(ns: &str) -> io::Result<()> {
    let status =
        Command::new("ip").args(["netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_syncookies=2"]).status()?;
    if !status.success() {
        return Err(io::Error::other(format!("sysctl tcp_syncookies=2 in {ns}: {status}")));
    }
    Ok(())
}

/// The kernel's SYN cookie counters in `ns`: (sent, received), from `nstat`.
pub fn syn_cookies(ns: &str) -> io::Result<(u64, u64)> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nstat", "-az", "TcpExtSyncookiesSent", "TcpExtSyncookiesRecv"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let read = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| io::Error::other(format!("{name} not in nstat's output:\n{text}")))
    };
    Ok((read("TcpExtSyncookiesSent")?, read("TcpExtSyncookiesRecv")?))
}

/// Enters `ns` on the calling thread (it stays there).
pub fn enter(ns: &str) -> io::Result<()> {
    let file = File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: valid namespace fd.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread inside `ns`. Sockets made there stay in `ns`
/// wherever they are used afterwards.
pub fn spawn_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<io::Result<T>> {
    let ns = ns.to_owned();
    thread::spawn(move || {
        enter(&ns)?;
        Ok(f())
    })
}

/// Runs `f` inside `ns` and waits for it.
pub fn run_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    spawn_in(ns, f).join().map_err(|_| io::Error::other("thread in namespace panicked"))?
}

/// How a backend treats a connection.
#[derive(Clone, Debug)]
pub enum Service {
    /// Echo every byte back until the client closes; holds the connection open meanwhile.
    Echo,
    /// Greet with one byte (a server-first protocol's banner: the connection has
    /// answered, so it is idle) and hold the connection, without a thread of its
    /// own, until the backend stops: many idle keep-alive connections.
    Hold,
    /// Keep-alive: answer every request line with "OK\n" after the service
    /// time (microseconds, changeable at run time), on a thread per connection.
    KeepAlive { service_us: Arc<AtomicU64> },
    /// Read one request line, queue for one of `workers`, sleep the service
    /// time (changeable at run time, microseconds), answer "OK\n" and close.
    Workers { workers: usize, service_us: Arc<AtomicU64> },
    /// The same as HTTP/1.1 (for real load generators and proxies): read one
    /// request's head, queue for a worker, sleep, answer `200 OK` and close.
    HttpWorkers { workers: usize, service_us: Arc<AtomicU64> },
    /// A server that reads every request at once and queues inside, as a
    /// thread-per-connection server (Python's `ThreadingHTTPServer`, a servlet
    /// container) or Go's `net/http` with a pool of `workers`: a thread per
    /// connection reads each request as it arrives, then waits for one of the
    /// `workers` slots, sleeps the service time and answers. A request line
    /// gets "OK\n", an HTTP/1.1 head `200 OK`; the connection stays open for
    /// the next request (kept alive) unless the client asked to close.
    ReadAtOnce { workers: usize, service_us: Arc<AtomicU64> },
    /// A kept-alive HTTP/1.1 server whose `workers` read a request only when
    /// free (a pre-fork or worker-pool server): idle connections wait in a
    /// poller; one whose next request arrived waits, unread in its socket,
    /// for a free worker, which reads it, serves it, answers `200 OK` and
    /// hands the connection back.
    HttpKeepAliveWorkers { workers: usize, service_us: Arc<AtomicU64> },
}

/// A TCP server inside a namespace. Stops (and closes every connection) on drop.
pub struct Backend {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicU64>,
    /// Requests the service read (kept-alive services: each request line or
    /// HTTP head, as the application reads it).
    pub read: Arc<AtomicU64>,
}

impl Backend {
    pub fn start(ns: &str, addr: SocketAddr, service: Service) -> io::Result<Self> {
        Self::start_listening(ns, addr, service, false)
    }

    /// The same, the listener set to `TCP_DEFER_ACCEPT` (nginx's `deferred`,
    /// HAProxy's `defer-accept`): the kernel drops a handshake-completing ACK
    /// that carries no data and completes the handshake with the request.
    pub fn start_deferred(ns: &str, addr: SocketAddr, service: Service) -> io::Result<Self> {
        Self::start_listening(ns, addr, service, true)
    }

    fn start_listening(ns: &str, addr: SocketAddr, service: Service, defer_accept: bool) -> io::Result<Self> {
        let listener = run_in(ns, move || {
            // A deep accept queue (std's listen() asks for 128): under churn on a busy
            // machine the accept loop lags, and an overflowing queue drops handshake-
            // completing ACKs, which stretches handshakes past any window.
            let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&addr.into())?;
            if defer_accept {
                defer_accept_for(&socket, 5)?;
            }
            socket.listen(4096)?;
            let l: TcpListener = socket.into();
            l.set_nonblocking(true)?;
            Ok::<_, io::Error>(l)
        })??;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        let (tx, rx) = mpsc::channel::<TcpStream>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let read = Arc::new(AtomicU64::new(0));
        if let Service::Workers { workers, service_us } | Service::HttpWorkers { workers, service_us } = &service {
            let http = matches!(service, Service::HttpWorkers { .. });
            for _ in 0..*workers {
                let (rx, stop, service_us) = (rx.clone(), stop.clone(), service_us.clone());
                threads.push(thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let conn = rx.lock().expect("queue lock").recv_timeout(Duration::from_millis(50));
                        if let Ok(conn) = conn {
                            let service = Duration::from_micros(service_us.load(Ordering::Relaxed));
                            let _ = serve_request(conn, service, http);
                        }
                    }
                    Ok(())
                }));
            }
        }
        // The kept-alive worker pool: connections come in from the accept loop
        // and back from the workers to the poller; ready ones go to the workers.
        let (idle_tx, idle_rx) = mpsc::channel::<TcpStream>();
        if let Service::HttpKeepAliveWorkers { workers, service_us } = &service {
            let (ready_tx, ready_rx) = mpsc::channel::<TcpStream>();
            let ready_rx = Arc::new(std::sync::Mutex::new(ready_rx));
            for _ in 0..*workers {
                let (rx, stop, service_us, back) =
                    (ready_rx.clone(), stop.clone(), service_us.clone(), idle_tx.clone());
                let read = read.clone();
                threads.push(thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let conn = rx.lock().expect("ready lock").recv_timeout(Duration::from_millis(50));
                        if let Ok(conn) = conn
                            && let Some(conn) = serve_kept_alive(conn, &service_us, &read)
                        {
                            let _ = back.send(conn);
                        }
                    }
                    Ok(())
                }));
            }
            let stop = stop.clone();
            threads.push(thread::spawn(move || {
                poll_idle(&idle_rx, &ready_tx, &stop);
                Ok(())
            }));
        }
        let slots = match &service {
            Service::ReadAtOnce { workers, .. } => Some(Arc::new(Slots::new(*workers))),
            _ => None,
        };
        let (stop2, accepted2, read2) = (stop.clone(), accepted.clone(), read.clone());
        threads.push(thread::spawn(move || {
            let mut holders: Vec<JoinHandle<()>> = Vec::new();
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        accepted2.fetch_add(1, Ordering::Relaxed);
                        conn.set_nonblocking(false)?;
                        match &service {
                            Service::Echo => {
                                let stop = stop2.clone();
                                holders.push(thread::spawn(move || echo(conn, &stop)));
                            }
                            Service::Workers { .. } | Service::HttpWorkers { .. } => {
                                let _ = tx.send(conn);
                            }
                            Service::Hold => {
                                let mut conn = conn;
                                let _ = conn.write_all(b"+");
                                held.push(conn);
                            }
                            Service::KeepAlive { service_us } => {
                                let (stop, service_us, read) = (stop2.clone(), service_us.clone(), read2.clone());
                                holders.push(thread::spawn(move || keep_alive(conn, &stop, &service_us, &read)));
                            }
                            Service::HttpKeepAliveWorkers { .. } => {
                                let _ = idle_tx.send(conn);
                            }
                            Service::ReadAtOnce { service_us, .. } => {
                                let (stop, service_us, read) = (stop2.clone(), service_us.clone(), read2.clone());
                                let slots = slots.clone().expect("slots for ReadAtOnce");
                                holders
                                    .push(thread::spawn(move || read_at_once(conn, &stop, &service_us, &slots, &read)));
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(2)),
                    Err(e) => return Err(e),
                }
                holders.retain(|h| !h.is_finished());
            }
            for h in holders {
                let _ = h.join();
            }
            Ok(())
        }));
        Ok(Self { stop, threads, accepted, read })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn echo(mut conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
}

fn keep_alive(mut conn: TcpStream, stop: &AtomicBool, service_us: &AtomicU64, read: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // One answer per request line.
                for _ in buf[..n].iter().filter(|&&b| b == b'\n') {
                    read.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_micros(service_us.load(Ordering::Relaxed)));
                    if conn.write_all(b"OK\n").is_err() {
                        return;
                    }
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
}

/// The poller of a [`Service::HttpKeepAliveWorkers`] server: holds idle
/// connections, and hands each whose next request (or close) arrived to the
/// workers, unread.
fn poll_idle(incoming: &mpsc::Receiver<TcpStream>, ready: &mpsc::Sender<TcpStream>, stop: &AtomicBool) {
    let mut idle: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        while let Ok(c) = incoming.try_recv() {
            idle.push(c);
        }
        if idle.is_empty() {
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        let mut fds: Vec<libc::pollfd> =
            idle.iter().map(|c| libc::pollfd { fd: c.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: a valid array of pollfds of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1) };
        if n <= 0 {
            continue;
        }
        let mut kept = Vec::with_capacity(idle.len());
        for (conn, fd) in idle.drain(..).zip(&fds) {
            if fd.revents == 0 {
                kept.push(conn);
            } else if ready.send(conn).is_err() {
                return;
            }
        }
        idle = kept;
    }
}

/// A worker's turn on a kept-alive connection: reads one request head, serves
/// it, answers. The connection, to be polled again, or None once it closed.
fn serve_kept_alive(mut conn: TcpStream, service_us: &AtomicU64, read: &AtomicU64) -> Option<TcpStream> {
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    read.fetch_add(1, Ordering::Relaxed);
    thread::sleep(Duration::from_micros(service_us.load(Ordering::Relaxed)));
    conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nOK\n").ok()?;
    Some(conn)
}

/// A counting semaphore: the workers of a [`Service::ReadAtOnce`] server.
struct Slots {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Slots {
    fn new(n: usize) -> Self {
        Self { free: std::sync::Mutex::new(n), freed: std::sync::Condvar::new() }
    }

    /// Waits for a slot (or `stop`); false when stopped.
    fn acquire(&self, stop: &AtomicBool) -> bool {
        let mut free = self.free.lock().expect("slots lock");
        while *free == 0 {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            free = self.freed.wait_timeout(free, Duration::from_millis(50)).expect("slots lock").0;
        }
        *free -= 1;
        true
    }

    fn release(&self) {
        *self.free.lock().expect("slots lock") += 1;
        self.freed.notify_one();
    }
}

/// A connection of a [`Service::ReadAtOnce`] server: every request read as it
/// arrives, then queued inside for a slot.
fn read_at_once(mut conn: TcpStream, stop: &AtomicBool, service_us: &AtomicU64, slots: &Slots, read: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        // A whole request: a line, or an HTTP head (a request line ending in HTTP/1.x).
        let http = buf.starts_with(b"GET ") || buf.starts_with(b"POST ") || buf.starts_with(b"HEAD ");
        let end: &[u8] = if http { b"\r\n\r\n" } else { b"\n" };
        if let Some(at) = buf.windows(end.len()).position(|w| w == end) {
            let head = buf.drain(..at + end.len()).collect::<Vec<u8>>();
            read.fetch_add(1, Ordering::Relaxed);
            if !slots.acquire(stop) {
                return;
            }
            thread::sleep(Duration::from_micros(service_us.load(Ordering::Relaxed)));
            slots.release();
            let close = String::from_utf8_lossy(&head).to_ascii_lowercase().contains("connection: close");
            let answer: &[u8] = match (http, close) {
                (false, _) => b"OK\n",
                (true, false) => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nOK\n",
                (true, true) => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n",
            };
            if conn.write_all(answer).is_err() || close {
                break;
            }
            continue;
        }
        match conn.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
}

/// One request (a line, or an HTTP/1.1 head), the service time, one answer, close.
fn serve_request(mut conn: TcpStream, service: Duration, http: bool) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let end: &[u8] = if http { b"\r\n\r\n" } else { b"\n" };
    let mut buf = [0u8; 4096];
    let mut got = 0;
    while got < buf.len() {
        let n = conn.read(&mut buf[got..])?;
        if n == 0 {
            return Ok(());
        }
        got += n;
        if buf[..got].windows(end.len()).any(|w| w == end) {
            break;
        }
    }
    thread::sleep(service);
    let answer: &[u8] =
        if http { b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n" } else { b"OK\n" };
    conn.write_all(answer)?;
    conn.shutdown(Shutdown::Write)
}

/// Connects with a timeout; the error kind tells refused from timed out.
pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, timeout)
}

/// Connects from a chosen source address.
pub fn connect_from(source: IpAddr, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

/// Outcome of one request from [`request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered; with the latency from connect() start to the answer.
    Answered(Duration),
    /// Refused at connect (RST).
    Refused,
    /// Nothing within the deadline (dropped SYN, or queued too long).
    TimedOut,
    /// Any other failure.
    Failed,
}

/// The line-protocol request of [`request`]: every backend here answers it.
pub const LINE_REQUEST: &[u8] = b"GET\n";

/// An HTTP/1.1 request on its own connection, for real HTTP servers (Go's
/// `net/http`, nginx); the line-protocol backends answer it as a line too.
pub const HTTP_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: shed\r\nConnection: close\r\n\r\n";

/// One request on a new connection, within `deadline`.
pub fn request(addr: SocketAddr, deadline: Duration) -> Outcome {
    request_with(addr, deadline, LINE_REQUEST)
}

/// One request (`payload`) on a new connection, within `deadline`. An HTTP
/// request is answered only by a `200`: the gate's `503` is a refusal.
pub fn request_with(addr: SocketAddr, deadline: Duration, payload: &[u8]) -> Outcome {
    let start = Instant::now();
    let mut conn = match TcpStream::connect_timeout(&addr, deadline) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Outcome::Refused,
        Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => return Outcome::TimedOut,
        Err(_) => return Outcome::Failed,
    };
    let left = deadline.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
    let _ = conn.set_read_timeout(Some(left));
    if conn.write_all(payload).is_err() {
        return Outcome::Failed;
    }
    let http = payload.starts_with(b"GET /");
    let need = if http { b"HTTP/1.1 200".len() } else { 1 };
    let mut buf = [0u8; 16];
    let mut got = 0;
    while got < need {
        match conn.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Outcome::TimedOut;
            }
            Err(_) => return Outcome::Failed,
        }
    }
    if got == 0 || start.elapsed() > deadline {
        return Outcome::TimedOut;
    }
    if http && !(buf[..got].starts_with(b"HTTP/1.1 200") || buf[..got].starts_with(b"HTTP/1.0 200")) {
        return Outcome::Refused;
    }
    Outcome::Answered(start.elapsed())
}

/// The answered share of `per_sec` requests a second (each on a new
/// connection, 1 s deadline) made from `ns` to `addr` for `seconds`, while
/// `during` runs; and how many requests that was.
pub fn goodput(ns: &str, addr: SocketAddr, per_sec: u64, seconds: u64, during: impl FnOnce()) -> (f64, usize) {
    let load = OpenLoop::start(ns, addr, Arc::new(AtomicU64::new(per_sec)), Duration::from_secs(1));
    let start = Instant::now();
    during();
    if let Some(rest) = Duration::from_secs(seconds).checked_sub(start.elapsed()) {
        thread::sleep(rest);
    }
    let outcomes = load.finish();
    let answered = outcomes.iter().filter(|o| matches!(o, Outcome::Answered(_))).count();
    (answered as f64 / outcomes.len().max(1) as f64, outcomes.len())
}

/// Open-loop load: requests on new connections at a rate (per second,
/// changeable while running), each on its own thread so a slow answer never
/// holds back the next arrival. Stops on drop.
pub struct OpenLoop {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<io::Result<()>>>,
    /// Every request's outcome, as it completes.
    pub outcomes: mpsc::Receiver<Outcome>,
}

impl OpenLoop {
    pub fn start(ns: &str, addr: SocketAddr, rate: Arc<AtomicU64>, deadline: Duration) -> Self {
        Self::start_with(ns, addr, rate, deadline, LINE_REQUEST)
    }

    /// The same, each request `payload` ([`HTTP_REQUEST`] for real HTTP servers).
    pub fn start_with(
        ns: &str,
        addr: SocketAddr,
        rate: Arc<AtomicU64>,
        deadline: Duration,
        payload: &'static [u8],
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, outcomes) = mpsc::channel();
        let stop2 = stop.clone();
        let handle = spawn_in(ns, move || {
            let mut next = Instant::now();
            while !stop2.load(Ordering::Relaxed) {
                let per_sec = rate.load(Ordering::Relaxed).max(1);
                next += Duration::from_secs_f64(1.0 / per_sec as f64);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let tx = tx.clone();
                thread::spawn(move || {
                    let _ = tx.send(request_with(addr, deadline, payload));
                });
            }
        });
        Self { stop, handle: Some(handle), outcomes }
    }
}

impl OpenLoop {
    /// Stops sending and returns every outcome, waiting for requests still
    /// under way (each is bounded by its deadline).
    pub fn finish(mut self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        // Disconnected once the last request thread has sent its outcome.
        let mut out = Vec::new();
        while let Ok(o) = self.outcomes.recv_timeout(Duration::from_secs(10)) {
            out.push(o);
        }
        out
    }
}

impl Drop for OpenLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// An IPv4 TCP segment without options or payload, checksums filled in.
pub fn tcp_segment(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> [u8; 40] {
    use shed_common::rst::{finish, sum_words};
    let (s, d) = (src.octets(), dst.octets());
    let mut pkt = [0u8; 40];
    pkt[..20]
        .copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]]);
    let ip_sum = finish(sum_words(&<[u8; 20]>::try_from(&pkt[..20]).expect("20 bytes")));
    pkt[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&ack.to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let pseudo = sum_words(&s) + sum_words(&d) + 6 + 20;
    let checksum = finish(pseudo + sum_words(&tcp));
    tcp[16..18].copy_from_slice(&checksum.to_be_bytes());
    pkt[20..].copy_from_slice(&tcp);
    pkt
}

/// A first IPv4 fragment of a SYN to `port` too short to hold the TCP
/// header (RFC 1858): the ports, the sequence number, and nothing else.
pub fn tiny_fragment(from: Ipv4Addr, to: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut pkt = tcp_segment(from, to, 40_000, port, 1, 0, 0x02)[..28].to_vec();
    pkt[6] = 0x20; // more fragments, offset 0
    pkt
}

/// A raw IPv4 socket that sends whole packets (IP_HDRINCL) as they are,
/// fragments too (IP_NODEFRAG: conntrack, where the namespace has it, would
/// hold a lone fragment for the rest), closed on drop.
pub struct RawSender {
    fd: std::os::fd::OwnedFd,
}

impl RawSender {
    pub fn new() -> io::Result<Self> {
        // SAFETY: a raw socket (IPPROTO_RAW implies IP_HDRINCL).
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        /// linux/in.h: fragments pass conntrack's defragmentation as they are.
        const IP_NODEFRAG: libc::c_int = 22;
        let on: libc::c_int = 1;
        // SAFETY: an int option on our own socket.
        let set = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::SOL_IP,
                IP_NODEFRAG,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Sends one IPv4 packet (header included), such as one built by [`tcp_segment`]; whether it went out whole.
    pub fn send(&self, pkt: &[u8]) -> bool {
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([pkt[16], pkt[17], pkt[18], pkt[19]]) },
            sin_zero: [0; 8],
        };
        // SAFETY: valid buffer and address.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        n == pkt.len() as isize
    }
}

/// Sends `count` SYNs to `dst:port` from forged sources (`source(i)`), over a
/// raw socket: a flood of handshakes that never complete. Returns SYNs sent.
pub fn syn_flood(dst: Ipv4Addr, port: u16, count: u32, source: impl Fn(u32) -> Ipv4Addr) -> io::Result<u32> {
    let raw = RawSender::new()?;
    let mut sent = 0;
    for i in 0..count {
        let sport = (1024 + i % 60_000) as u16;
        let pkt = tcp_segment(source(i), dst, sport, port, i.wrapping_mul(2_654_435_761), 0, 0x02);
        sent += u32::from(raw.send(&pkt));
    }
    Ok(sent)
}

/// Sends forged SYNs at `per_sec` for `duration` (paced in 1 ms slices), from
/// `source(i)`; returns how many were sent. Bounded by the duration.
pub fn syn_flood_at(
    dst: Ipv4Addr,
    port: u16,
    per_sec: u32,
    duration: Duration,
    source: impl Fn(u32) -> Ipv4Addr,
) -> io::Result<u32> {
    let raw = RawSender::new()?;
    let start = Instant::now();
    let mut sent = 0u32;
    while start.elapsed() < duration {
        let due = (start.elapsed().as_secs_f64() * f64::from(per_sec)) as u32;
        while sent < due {
            let sport = (1024 + sent % 60_000) as u16;
            let pkt = tcp_segment(source(sent), dst, sport, port, sent.wrapping_mul(2_654_435_761), 0, 0x02);
            raw.send(&pkt);
            sent += 1;
        }
        thread::sleep(Duration::from_micros(500));
    }
    Ok(sent)
}

/// Captures SYN-ACKs addressed to `to` on `iface` of the calling thread's
/// namespace (an AF_PACKET socket), for at most `timeout`: (port, their seq)
/// of each, the first `count` distinct ports. For forged handshakes completed by hand.
pub struct SynAckCapture {
    fd: std::os::fd::OwnedFd,
}

impl SynAckCapture {
    pub fn open(iface: &str) -> io::Result<Self> {
        const ETH_P_IP: u16 = 0x0800;
        // SAFETY: an AF_PACKET socket for IPv4 frames.
        let fd = unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, i32::from(ETH_P_IP.to_be()))
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
        // SAFETY: valid C string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_IP.to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: binding our socket to a valid sockaddr_ll.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval { tv_sec: 0, tv_usec: 50_000 };
        // SAFETY: a valid timeval for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Self { fd })
    }

    /// SYN-ACKs to `to` seen within `timeout`, (our port, their seq), at most `count` distinct ports.
    pub fn syn_acks(&self, to: Ipv4Addr, count: usize, timeout: Duration) -> Vec<(u16, u32)> {
        let start = Instant::now();
        let mut seen: Vec<(u16, u32)> = Vec::new();
        let mut buf = [0u8; 2048];
        while seen.len() < count && start.elapsed() < timeout {
            // SAFETY: reading into our buffer.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 40 {
                continue;
            }
            let p = &buf[..n as usize];
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if p[9] != 6 || p[16..20] != to.octets() || p.len() < ihl + 20 {
                continue;
            }
            let tcp = &p[ihl..];
            if tcp[13] & 0x12 != 0x12 {
                continue;
            }
            let port = u16::from_be_bytes([tcp[2], tcp[3]]);
            let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
            if !seen.iter().any(|(p, _)| *p == port) {
                seen.push((port, seq));
            }
        }
        seen
    }
}

/// h2load's request counts from its report: (succeeded, total), or why not.
pub fn h2load_counts(report: &str) -> Result<(u64, u64), String> {
    let line = report.lines().find(|l| l.starts_with("requests:")).ok_or("h2load printed no requests line")?;
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let number = |word: &str| -> Result<u64, String> {
        let i = words.iter().position(|w| *w == word).ok_or_else(|| format!("no {word:?} in {line:?}"))?;
        words[i - 1].parse().map_err(|e| format!("{word} in {line:?}: {e}"))
    };
    Ok((number("succeeded")?, number("total")?))
}

/// A client that completes a handshake every `every`, each ACK sent `late_by`
/// after the server's SYN-ACK arrived (a slow or malicious client), then resets
/// it. It speaks from `from` over raw sockets on the client end of `bed`, so
/// `from` must be routed to the client's interface: [`LateClient::start`]
/// pins the client interface's MAC and a neighbour entry for `from` on the
/// server. Stops on drop; `completed` counts the handshakes it finished.
pub struct LateClient {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<io::Result<io::Result<()>>>>,
    pub completed: Arc<AtomicU64>,
}

impl LateClient {
    pub fn start(bed: &Testbed, from: Ipv4Addr, port: u16, every: Duration, late_by: Duration) -> io::Result<Self> {
        const MAC: &str = "02:00:00:00:00:77";
        ip(&["-n", &bed.client_ns, "link", "set", "dev", &bed.client_if, "address", MAC])?;
        let from_s = from.to_string();
        ip(&["-n", &bed.server_ns, "neigh", "replace", &from_s, "lladdr", MAC, "dev", &bed.server_if])?;
        let stop = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicU64::new(0));
        let (stop2, done, iface, server) = (stop.clone(), completed.clone(), bed.client_if.clone(), bed.server_v4);
        let handle = spawn_in(&bed.client_ns, move || -> io::Result<()> {
            let capture = SynAckCapture::open(&iface)?;
            let raw = RawSender::new()?;
            let mut sport = 50_000u16;
            while !stop2.load(Ordering::Relaxed) {
                let round = Instant::now();
                sport = if sport >= 59_999 { 50_000 } else { sport + 1 };
                raw.send(&tcp_segment(from, server, sport, port, 1000, 0, 0x02));
                let acks = capture.syn_acks(from, 1, every.min(Duration::from_secs(1)));
                if let Some(&(_, seq)) = acks.iter().find(|(p, _)| *p == sport) {
                    thread::sleep(late_by);
                    raw.send(&tcp_segment(from, server, sport, port, 1001, seq.wrapping_add(1), 0x10));
                    done.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(20));
                    raw.send(&tcp_segment(from, server, sport, port, 1001, 0, 0x04));
                }
                if let Some(rest) = every.checked_sub(round.elapsed()) {
                    thread::sleep(rest);
                }
            }
            Ok(())
        });
        Ok(Self { stop, handle: Some(handle), completed })
    }
}

impl Drop for LateClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What one request of a [`PoolLoad`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PooledOutcome {
    pub outcome: Outcome,
    /// Attempts it took: connections' resets retried on a new connection, and
    /// 503s retried after their Retry-After (when honoured), within the deadline.
    pub attempts: u32,
    /// When it arrived (its first attempt began).
    pub started: Instant,
}

/// How a [`PoolLoad`]'s client behaves.
#[derive(Clone, Copy, Debug)]
pub struct PoolClient {
    /// Kept-alive connections opened (each answered once) before the load starts.
    pub warm: usize,
    /// A request not answered within it fails, and its connection is closed.
    pub deadline: Duration,
    /// Retry a 503 after its Retry-After (urllib3's `respect_retry_after_header`).
    pub honour_retry_after: bool,
    /// Keep each answered connection for the next request (a pool); false:
    /// a connection per request, closed once answered (`warm` then opens none).
    pub reuse: bool,
}

/// Open-loop HTTP/1.1 requests carried by a pool of kept-alive connections,
/// as a client library or a proxy's upstream pool sends them: each arrival
/// takes an idle pooled connection, or opens a new one when none is idle,
/// and returns it once answered. A connection reset before any answer is
/// retried once on a new connection (curl's and urllib3's "connection died"
/// retry); a late answer closes its connection. Stops on drop.
pub struct PoolLoad {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<io::Result<()>>>,
    pub outcomes: mpsc::Receiver<PooledOutcome>,
}

/// One answer read from a kept-alive connection: its status and Retry-After.
fn read_answer(conn: &mut TcpStream) -> io::Result<(u16, Option<u64>, bool)> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 512];
    let end = loop {
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = conn.read(&mut byte)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&byte[..n]);
    };
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let header = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()));
    let length: usize = header("content-length:").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = head.len() - end;
    while body < length {
        let n = conn.read(&mut byte)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        body += n;
    }
    let close = header("connection:").is_some_and(|v| v == "close");
    Ok((status, header("retry-after:").and_then(|v| v.parse().ok()), close))
}

impl PoolLoad {
    pub fn start(ns: &str, addr: SocketAddr, rate: Arc<AtomicU64>, client: PoolClient) -> io::Result<Self> {
        const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: shed\r\n\r\n";
        let pool: Arc<std::sync::Mutex<Vec<TcpStream>>> = Arc::default();
        let warm = run_in(ns, move || -> io::Result<Vec<TcpStream>> {
            (0..if client.reuse { client.warm } else { 0 })
                .map(|_| {
                    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                    c.set_read_timeout(Some(Duration::from_secs(5)))?;
                    c.write_all(GET)?;
                    read_answer(&mut c)?;
                    Ok(c)
                })
                .collect()
        })??;
        pool.lock().expect("pool").extend(warm);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, outcomes) = mpsc::channel();
        let stop2 = stop.clone();
        let handle = spawn_in(ns, move || {
            let mut next = Instant::now();
            while !stop2.load(Ordering::Relaxed) {
                next += Duration::from_secs_f64(1.0 / rate.load(Ordering::Relaxed).max(1) as f64);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let (tx, pool) = (tx.clone(), pool.clone());
                thread::spawn(move || {
                    let _ = tx.send(Self::one(addr, &pool, client));
                });
            }
        });
        Ok(Self { stop, handle: Some(handle), outcomes })
    }

    /// One request, on a pooled connection or a new one, with the client's retries.
    fn one(addr: SocketAddr, pool: &std::sync::Mutex<Vec<TcpStream>>, client: PoolClient) -> PooledOutcome {
        const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: shed\r\n\r\n";
        let start = Instant::now();
        let mut attempts = 0;
        let mut retried_reset = false;
        loop {
            let left = client.deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return PooledOutcome { outcome: Outcome::TimedOut, attempts, started: start };
            }
            attempts += 1;
            let pooled = pool.lock().expect("pool").pop();
            let reused = pooled.is_some();
            let mut conn = match pooled {
                Some(c) => c,
                None => match TcpStream::connect_timeout(&addr, left) {
                    Ok(c) => c,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        return PooledOutcome { outcome: Outcome::Refused, attempts, started: start };
                    }
                    Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
                        return PooledOutcome { outcome: Outcome::TimedOut, attempts, started: start };
                    }
                    Err(_) => return PooledOutcome { outcome: Outcome::Failed, attempts, started: start },
                },
            };
            let left = client.deadline.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            let _ = conn.set_read_timeout(Some(left));
            let answer = conn.write_all(GET).and_then(|()| read_answer(&mut conn));
            match answer {
                Ok((200, _, close)) => {
                    if start.elapsed() > client.deadline {
                        return PooledOutcome { outcome: Outcome::TimedOut, attempts, started: start };
                    }
                    if !close && client.reuse {
                        pool.lock().expect("pool").push(conn);
                    }
                    return PooledOutcome { outcome: Outcome::Answered(start.elapsed()), attempts, started: start };
                }
                Ok((_, retry_after, _)) => {
                    // Refused (the gate's 503, and its Connection: close).
                    let wait = retry_after.map(Duration::from_secs);
                    match wait.filter(|w| client.honour_retry_after && start.elapsed() + *w < client.deadline) {
                        Some(w) => thread::sleep(w),
                        None => return PooledOutcome { outcome: Outcome::Refused, attempts, started: start },
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    // Late: the client gives up and closes the connection.
                    return PooledOutcome { outcome: Outcome::TimedOut, attempts, started: start };
                }
                Err(_) if reused && !retried_reset => retried_reset = true,
                Err(_) => return PooledOutcome { outcome: Outcome::Refused, attempts, started: start },
            }
        }
    }

    /// Stops sending and returns every outcome, waiting for requests still under way.
    pub fn finish(mut self) -> Vec<PooledOutcome> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let mut out = Vec::new();
        while let Ok(o) = self.outcomes.recv_timeout(Duration::from_secs(10)) {
            out.push(o);
        }
        out
    }
}

impl Drop for PoolLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
