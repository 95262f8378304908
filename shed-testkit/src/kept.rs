// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real kept-alive connections whose server socket owes no answer, for tests
//! and benchmarks that judge the first segment of the next request on them (a turn).
use std::{
    io::{self, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use shed::kernel::maps::GateMaps;

use crate::frames::{ACK, PSH, Spec, frame};

/// The request every turn carries.
pub const REQUEST: &[u8] = b"GET /next HTTP/1.1\r\nHost: shed\r\n\r\n";

/// One request answered on a connection to `listener` (from `connect`), which is
/// then left idle: the client socket frozen in TCP repair mode (it sends
/// nothing more; closed silently), the server's open. `next` is the segment
/// that starts the connection's next request (its first byte the one the
/// server's socket expects), as the client would send it.
pub struct IdleKeptAlive {
    _client: TcpStream,
    pub server: TcpStream,
    pub next: Spec,
    pub frame: Vec<u8>,
}

impl IdleKeptAlive {
    pub fn open(
        listener: &TcpListener,
        connect: impl FnOnce(std::net::SocketAddr) -> io::Result<TcpStream>,
    ) -> io::Result<Self> {
        let mut client = connect(listener.local_addr()?)?;
        let (mut server, _) = listener.accept()?;
        client.write_all(b"GET / HTTP/1.1\r\nHost: shed\r\n\r\n")?;
        let mut buf = [0u8; 256];
        if server.read(&mut buf)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the first request did not arrive"));
        }
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        server.write_all(answer)?;
        client.read_exact(&mut buf[..answer.len()])?;
        Self::frozen(client, server)
    }

    /// A connection to `listener` that has sent nothing since its handshake
    /// (silent, in a `work` port's books), left so: `next` carries its first request.
    pub fn silent(
        listener: &TcpListener,
        connect: impl FnOnce(std::net::SocketAddr) -> io::Result<TcpStream>,
    ) -> io::Result<Self> {
        let client = connect(listener.local_addr()?)?;
        let (server, _) = listener.accept()?;
        Self::frozen(client, server)
    }

    /// The client frozen in repair mode, and the segment of its next request.
    fn frozen(client: TcpStream, server: TcpStream) -> io::Result<Self> {
        let fd = client.as_raw_fd();
        // The client's next sequence number, and the server's.
        let (seq, ack) = (queue_seq(fd, 2)?, queue_seq(fd, 1)?);
        let (from, to) = (client.local_addr()?, client.peer_addr()?);
        let v4 = |a: std::net::SocketAddr| match a.ip() {
            std::net::IpAddr::V4(v4) => Ok(v4.octets()),
            std::net::IpAddr::V6(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "an IPv4 listener")),
        };
        let next = Spec {
            client_v4: v4(from)?,
            server_v4: v4(to)?,
            client_port: from.port(),
            server_port: to.port(),
            seq,
            ack,
            flags: ACK | PSH,
            tcp_options: 0,
            payload: REQUEST.to_vec(),
            ..Spec::default()
        };
        Ok(Self { _client: client, server, frame: frame(&next), next })
    }
}

/// Waits up to 3 s until the gate's books hold `n` connections of `port`,
/// each idle (answered, owing nothing); whether they do.
pub fn wait_idle(maps: &GateMaps, port: u16, n: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let idle = maps
            .tracked_sockets()
            .map_or(0, |socks| socks.values().filter(|e| e.port == port && e.busy == 0 && e.silent == 0).count());
        if idle == n {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The next sequence number of `queue` (1: receive, 2: send) of a connected
/// socket, read in TCP repair mode (the socket stays in it: closed silently).
pub fn queue_seq(fd: std::os::fd::RawFd, queue: libc::c_int) -> io::Result<u32> {
    let set = |name: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt with a c_int value on a socket the caller owns.
        let rc = unsafe {
            libc::setsockopt(fd, libc::IPPROTO_TCP, name, (&raw const value).cast(), size_of::<libc::c_int>() as u32)
        };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    };
    set(libc::TCP_REPAIR, 1)?;
    set(libc::TCP_REPAIR_QUEUE, queue)?;
    let mut seq: u32 = 0;
    let mut len = size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt into a u32 of `len` bytes.
    let rc =
        unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ, (&raw mut seq).cast(), &raw mut len) };
    if rc == 0 { Ok(seq) } else { Err(io::Error::last_os_error()) }
}
