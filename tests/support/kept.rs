// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real kept-alive connections whose server socket owes no answer, for tests
//! that judge the first segment of the next request on them (a turn).
use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use shed::kernel::maps::GateMaps;
use shed_testkit::frames::{ACK, PSH, Spec, frame};

/// The request every turn carries.
pub(crate) const REQUEST: &[u8] = b"GET /next HTTP/1.1\r\nHost: shed\r\n\r\n";

/// One request answered on a connection to `listener` (from `connect`), which is
/// then left idle: the client socket frozen in TCP repair mode (it sends
/// nothing more; closed silently), the server's open. `next` is the segment
/// that starts the connection's next request (its first byte the one the
/// server's socket expects), as the client would send it.
pub(crate) struct IdleKeptAlive {
    _client: TcpStream,
    pub(crate) server: TcpStream,
    pub(crate) next: Spec,
    pub(crate) frame: Vec<u8>,
}

impl IdleKeptAlive {
    pub(crate) fn open(listener: &TcpListener, connect: impl FnOnce(std::net::SocketAddr) -> TcpStream) -> Self {
        let mut client = connect(listener.local_addr().unwrap());
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(b"GET / HTTP/1.1\r\nHost: shed\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        let n = server.read(&mut buf).unwrap();
        assert!(n > 0, "the first request arrives");
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        server.write_all(answer).unwrap();
        client.read_exact(&mut buf[..answer.len()]).unwrap();
        let fd = client.as_raw_fd();
        // The client's next sequence number, and the server's.
        let (seq, ack) = (super::handshake::queue_seq(fd, 2), super::handshake::queue_seq(fd, 1));
        let (from, to) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
        let v4 = |a: std::net::SocketAddr| match a.ip() {
            std::net::IpAddr::V4(v4) => v4.octets(),
            std::net::IpAddr::V6(_) => panic!("an IPv4 listener"),
        };
        let next = Spec {
            client_v4: v4(from),
            server_v4: v4(to),
            client_port: from.port(),
            server_port: to.port(),
            seq,
            ack,
            flags: ACK | PSH,
            tcp_options: 0,
            payload: REQUEST.to_vec(),
            ..Spec::default()
        };
        Self { _client: client, server, frame: frame(&next), next }
    }
}

/// Waits until the gate's books hold `n` connections of `port`, each idle
/// (answered, owing nothing).
pub(crate) fn wait_idle(maps: &GateMaps, port: u16, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let socks = maps.tracked_sockets().unwrap();
        let idle = socks.values().filter(|e| e.port == port && e.busy == 0 && e.silent == 0).count();
        if idle == n {
            return;
        }
        assert!(Instant::now() < deadline, "{idle} of {n} kept-alive connections idle in the books");
        std::thread::sleep(Duration::from_millis(5));
    }
}
