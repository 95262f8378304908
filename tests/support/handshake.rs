// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real handshakes held as request sockets, for tests that judge the ACKs
//! that complete them.
use shed_testkit::frames::{ACK, Spec, frame};

/// A handshake the server's kernel holds as a request socket: a client of the
/// testbed connected to a `TCP_DEFER_ACCEPT` listener (which drops the bare
/// ACK and keeps the request for the defer time), and the ACK that completes
/// it: the gate judges that ACK each time it sees it.
pub(crate) struct HeldHandshake {
    _client: std::net::TcpStream,
    pub(crate) spec: Spec,
    pub(crate) ack: Vec<u8>,
}

/// A listener on `addr` in the calling thread's namespace whose handshakes
/// stay request sockets for a minute.
pub(crate) fn deferring_listener(addr: std::net::SocketAddr) -> std::net::TcpListener {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&addr.into()).unwrap();
    shed_testkit::testbed::defer_accept_for(&socket, 60).expect("TCP_DEFER_ACCEPT");
    socket.listen(64).unwrap();
    socket.into()
}

/// A handshake of the testbed's client (10.200.0.2) to `port` of its server,
/// held by a [`deferring_listener`] there.
pub(crate) fn held(bed: &shed_testkit::testbed::Testbed, port: u16) -> HeldHandshake {
    let server = std::net::SocketAddr::from((bed.server_v4, port));
    let (client, client_port, seq, ack) = shed_testkit::testbed::run_in(&bed.client_ns, move || {
        let client = std::net::TcpStream::connect_timeout(&server, std::time::Duration::from_secs(2)).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&client);
        let client_port = client.local_addr().unwrap().port();
        // The client's next sequence number, and the server's (its ISN + 1).
        let (seq, ack) = (
            shed_testkit::kept::queue_seq(fd, 2).expect("TCP repair"),
            shed_testkit::kept::queue_seq(fd, 1).expect("TCP repair"),
        );
        (client, client_port, seq, ack)
    })
    .unwrap();
    let spec = Spec {
        flags: ACK,
        server_v4: bed.server_v4.octets(),
        client_v4: [10, 200, 0, 2],
        client_port,
        server_port: port,
        seq,
        ack,
        tcp_options: 0,
        ..Spec::default()
    };
    HeldHandshake { _client: client, ack: frame(&spec), spec }
}
