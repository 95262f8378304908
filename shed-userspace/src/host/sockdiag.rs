// SPDX-License-Identifier: MIT OR Apache-2.0
//! The kernel's table of TCP connections, asked through NETLINK_SOCK_DIAG
//! (what `ss` uses): the kernel filters by state and answers in binary
//! records, instead of printing the namespace's whole table as text
//! (/proc/net/tcp), which cost the healer about 1% of a core per thousand
//! connections held. Sockets of the calling thread's network namespace.
use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use shed_common::{FlowKey, ipv4_mapped};

/// Socket states held by a connection from ESTABLISHED to its final close
/// (established, fin-wait-1/2, close, close-wait, last-ack, closing); not
/// TIME_WAIT (a mini socket, no longer counted) nor SYN_RECV (a request).
const HELD_STATES: [u8; 7] = [1, 4, 5, 7, 8, 9, 11];
const TCP_LISTEN: u8 = 10;

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_sockid`.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, sockid.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_msg`: family, state, timer, retrans, sockid, expires,
/// rqueue, wqueue, uid, inode.
const MSG_LEN: usize = 4 + SOCKID_LEN + 20;

/// Closes server sockets by their connections (`SOCK_DESTROY`, what `ss -K`
/// does) through a [`SocketTable`] opened on first use in the calling
/// thread's namespace. A table that cannot be opened is logged once, naming
/// what then stays open, and every later call closes nothing.
#[derive(Default)]
pub(crate) struct Closer {
    table: Option<Result<SocketTable, ()>>,
}

impl Closer {
    /// Closes each of `flows` that is still open; how many it closed, and the
    /// error that stopped it, if one did (those closed before it counted).
    pub(crate) fn close<'a>(
        &mut self,
        flows: impl IntoIterator<Item = &'a FlowKey>,
        left_open: &str,
    ) -> (usize, Option<io::Error>) {
        let table = self
            .table
            .get_or_insert_with(|| SocketTable::open().map_err(|e| tracing::warn!("sock_diag: {e}: {left_open}")));
        let Ok(table) = table.as_mut() else { return (0, None) };
        let mut closed = 0;
        for flow in flows {
            match table.destroy(flow) {
                Ok(true) => closed += 1,
                Ok(false) => {}
                Err(e) => return (closed, Some(e)),
            }
        }
        (closed, None)
    }
}

/// A netlink socket for dumping the namespace's TCP connections.
pub(crate) struct SocketTable {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
}

impl SocketTable {
    /// Opens the socket in the calling thread's network namespace (it stays
    /// there, whatever namespace later calls run in).
    pub(crate) fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, buf: vec![0; 64 * 1024], seq: 0 })
    }

    /// Appends the connections held on `ports` (IPv4 and IPv6) to `out`;
    /// returns how many records the kernel sent (every held connection of
    /// the namespace, whatever its port: the cost of one call).
    pub(crate) fn held(&mut self, ports: &BTreeSet<u16>, out: &mut Vec<FlowKey>) -> io::Result<usize> {
        let states = HELD_STATES.iter().map(|s| 1u32 << s).sum();
        self.dump(states, |msg| {
            if let Some(flow) = flow_of(msg, ports) {
                out.push(flow);
            }
        })
    }

    /// The accept queues of the listeners on `ports`, summed per port over its
    /// listeners (IPv4, IPv6, SO_REUSEPORT groups).
    pub(crate) fn accept_queues(&mut self, ports: &BTreeSet<u16>) -> io::Result<BTreeMap<u16, AcceptQueue>> {
        let mut out: BTreeMap<u16, AcceptQueue> = BTreeMap::new();
        self.dump(1 << TCP_LISTEN, |msg| {
            if let Some((port, queue)) = accept_queue_of(msg).filter(|(p, _)| ports.contains(p)) {
                let sum = out.entry(port).or_default();
                sum.waiting += queue.waiting;
                sum.backlog += queue.backlog;
            }
        })?;
        Ok(out)
    }

    /// Closes the server's socket of `flow` (the kernel resets its peer and
    /// the application's next call on it fails), as `ss -K` does. Ok(false):
    /// there is no such connection (it closed already). The kernel's lookup
    /// by 4-tuple falls back to the listener when the connection is gone, so
    /// the socket is first found and its cookie taken: the destroy names that
    /// very socket, and a listener is never closed.
    pub(crate) fn destroy(&mut self, flow: &FlowKey) -> io::Result<bool> {
        let Some((state, cookie)) = self.ask(flow, SOCK_DIAG_BY_FAMILY, NOCOOKIE)? else { return Ok(false) };
        if state == TCP_LISTEN {
            return Ok(false);
        }
        Ok(self.ask(flow, SOCK_DESTROY, cookie)?.is_some())
    }

    /// One request about `flow`'s server socket (`kind`: get or destroy, of
    /// the socket with `cookie`). Some((state, cookie)) when the kernel found
    /// it (a destroy answers with no record: state 0), None when it did not.
    fn ask(&mut self, flow: &FlowKey, kind: u16, cookie: [u8; 8]) -> io::Result<Option<(u8, [u8; 8])>> {
        self.seq = self.seq.wrapping_add(1);
        let request = exact_request(flow, kind, cookie, self.seq);
        // SAFETY: sending a buffer we own to the kernel (address: the kernel, pid 0).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
                (&raw const kernel).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag answer: {what}"));
        loop {
            // SAFETY: receiving into a buffer we own, of its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            let reply = &self.buf[..n as usize];
            if reply.len() < NLMSG_HDRLEN + 4 {
                return Err(bad("short"));
            }
            let msg_kind = u16::from_ne_bytes([reply[4], reply[5]]);
            let seq = u32::from_ne_bytes(reply[8..12].try_into().expect("4 bytes"));
            if seq != self.seq {
                continue;
            }
            if msg_kind == NLMSG_ERROR {
                let errno = -i32::from_ne_bytes(reply[16..20].try_into().expect("4 bytes"));
                return match errno {
                    0 => Ok(Some((0, cookie))),
                    libc::ENOENT => Ok(None),
                    _ => Err(io::Error::from_raw_os_error(errno)),
                };
            }
            let msg = &reply[NLMSG_HDRLEN..];
            if msg.len() < MSG_LEN {
                return Err(bad("short record"));
            }
            let found: [u8; 8] = msg[4 + 40..4 + 48].try_into().expect("8 bytes");
            return Ok(Some((msg[1], found)));
        }
    }

    /// Dumps the namespace's TCP sockets in `states` (a bit per state), IPv4
    /// then IPv6, handing each `inet_diag_msg` to `visit`; returns the count.
    fn dump(&mut self, states: u32, mut visit: impl FnMut(&[u8])) -> io::Result<usize> {
        let mut records = 0;
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.seq = self.seq.wrapping_add(1);
            let request = dump_request(family, states, self.seq);
            // SAFETY: sending a buffer we own to the kernel (address: the kernel, pid 0).
            let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            kernel.nl_family = libc::AF_NETLINK as u16;
            let sent = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    request.as_ptr().cast(),
                    request.len(),
                    0,
                    (&raw const kernel).cast(),
                    size_of::<libc::sockaddr_nl>() as u32,
                )
            };
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            loop {
                // SAFETY: receiving into a buffer we own, of its length.
                let n = unsafe { libc::recv(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
                if n < 0 {
                    let err = io::Error::last_os_error();
                    if err.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(err);
                }
                let (read, done) = parse_batch(&self.buf[..n as usize], self.seq, &mut visit)?;
                records += read;
                if done {
                    break;
                }
            }
        }
        Ok(records)
    }
}

/// A listener's accept queue: connections established and waiting for
/// `accept()`, and how many it may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AcceptQueue {
    pub waiting: u32,
    pub backlog: u32,
}

impl AcceptQueue {
    /// At least half full: the state in which its listener can overflow.
    pub(crate) fn pressed(self) -> bool {
        self.backlog > 0 && self.waiting * 2 >= self.backlog
    }
}

/// A `SOCK_DIAG_BY_FAMILY` dump request for TCP sockets of `family` in `states`.
fn dump_request(family: u8, states: u32, seq: u32) -> [u8; NLMSG_HDRLEN + REQ_LEN] {
    let mut m = [0u8; NLMSG_HDRLEN + REQ_LEN];
    m[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // pid 0 (bytes 12..16); the request proper:
    m[16] = family;
    m[17] = libc::IPPROTO_TCP as u8;
    m[20..24].copy_from_slice(&states.to_ne_bytes());
    m
}

/// `INET_DIAG_NOCOOKIE`: any socket the 4-tuple finds.
const NOCOOKIE: [u8; 8] = [0xff; 8];

/// A request (`kind`: `SOCK_DIAG_BY_FAMILY` without dump, or `SOCK_DESTROY`)
/// for the server's socket of `flow`, in any state, with `cookie`.
fn exact_request(flow: &FlowKey, kind: u16, cookie: [u8; 8], seq: u32) -> [u8; NLMSG_HDRLEN + REQ_LEN] {
    let mut m = [0u8; NLMSG_HDRLEN + REQ_LEN];
    m[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    let flags = if kind == SOCK_DESTROY { NLM_F_REQUEST | NLM_F_ACK } else { NLM_F_REQUEST };
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    let v4 = shed_common::is_ipv4_mapped(&flow.client_addr) && shed_common::is_ipv4_mapped(&flow.server_addr);
    m[16] = if v4 { libc::AF_INET as u8 } else { libc::AF_INET6 as u8 };
    m[17] = libc::IPPROTO_TCP as u8;
    m[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    // The socket id, from the server's side: its port and address are the source.
    let id = &mut m[24..24 + SOCKID_LEN];
    id[0..2].copy_from_slice(&flow.server_port.to_be_bytes());
    id[2..4].copy_from_slice(&flow.client_port.to_be_bytes());
    if v4 {
        id[4..8].copy_from_slice(&flow.server_addr[12..16]);
        id[20..24].copy_from_slice(&flow.client_addr[12..16]);
    } else {
        id[4..20].copy_from_slice(&flow.server_addr);
        id[20..36].copy_from_slice(&flow.client_addr);
    }
    // Interface any (bytes 36..40), then the cookie.
    id[40..48].copy_from_slice(&cookie);
    m
}

/// Reads one datagram of a dump, handing each record to `visit`.
/// Returns the records read and whether the dump is over.
fn parse_batch(mut buf: &[u8], seq: u32, visit: &mut impl FnMut(&[u8])) -> io::Result<(usize, bool)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag answer: {what}"));
    let mut records = 0;
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
        let msg_seq = u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(bad(&format!("message of {len} bytes in {} left", buf.len())));
        }
        let body = &buf[NLMSG_HDRLEN..len];
        // Messages are 4-byte aligned.
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        if msg_seq != seq {
            continue; // the tail of an earlier, abandoned dump
        }
        match kind {
            NLMSG_DONE => return Ok((records, true)),
            NLMSG_ERROR => {
                let errno = body.get(0..4).map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")));
                return Err(io::Error::from_raw_os_error(-errno));
            }
            SOCK_DIAG_BY_FAMILY => {
                if body.len() < MSG_LEN {
                    return Err(bad(&format!("record of {} bytes, want {MSG_LEN}", body.len())));
                }
                records += 1;
                visit(body);
            }
            _ => {}
        }
    }
    Ok((records, false))
}

/// The local port and accept queue of a listener's `inet_diag_msg`
/// (for a listener the kernel reports the accept queue as rqueue and its
/// backlog as wqueue).
fn accept_queue_of(msg: &[u8]) -> Option<(u16, AcceptQueue)> {
    if msg[1] != TCP_LISTEN {
        return None;
    }
    let word = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().expect("4 bytes"));
    let port = u16::from_be_bytes([msg[4], msg[5]]);
    // After family, state, timer, retrans (4) and the socket id (48): expires, rqueue, wqueue.
    Some((port, AcceptQueue { waiting: word(4 + SOCKID_LEN + 4), backlog: word(4 + SOCKID_LEN + 8) }))
}

/// The connection an `inet_diag_msg` describes, if it is held on one of `ports`.
fn flow_of(msg: &[u8], ports: &BTreeSet<u16>) -> Option<FlowKey> {
    let (family, state) = (msg[0], msg[1]);
    if !HELD_STATES.contains(&state) {
        return None;
    }
    let id = &msg[4..4 + SOCKID_LEN];
    let sport = u16::from_be_bytes([id[0], id[1]]);
    if !ports.contains(&sport) {
        return None;
    }
    let addr = |raw: &[u8]| -> [u8; 16] {
        if family == libc::AF_INET as u8 {
            ipv4_mapped(raw[0..4].try_into().expect("4 bytes"))
        } else {
            raw[0..16].try_into().expect("16 bytes")
        }
    };
    Some(FlowKey {
        client_addr: addr(&id[20..36]),
        server_addr: addr(&id[4..20]),
        client_port: u16::from_be_bytes([id[2], id[3]]),
        server_port: sport,
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};

    use super::*;

    /// One `inet_diag_msg` record as the kernel frames it.
    fn record(seq: u32, family: u8, state: u8, local: (&[u8], u16), remote: (&[u8], u16)) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN + MSG_LEN];
        m[0..4].copy_from_slice(&((NLMSG_HDRLEN + MSG_LEN) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        let msg = &mut m[NLMSG_HDRLEN..];
        msg[0] = family;
        msg[1] = state;
        msg[4..6].copy_from_slice(&local.1.to_be_bytes());
        msg[6..8].copy_from_slice(&remote.1.to_be_bytes());
        msg[8..8 + local.0.len()].copy_from_slice(local.0);
        msg[24..24 + remote.0.len()].copy_from_slice(remote.0);
        m
    }

    fn done(seq: u32) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN + 4];
        m[0..4].copy_from_slice(&((NLMSG_HDRLEN + 4) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        m
    }

    #[test]
    fn reads_held_connections_of_the_ports_asked_for() {
        let ports = BTreeSet::from([8080]);
        let (server, client) = ([10, 200, 0, 1], [10, 200, 0, 2]);
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).octets();
        let v6_client = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2).octets();
        let mut batch = Vec::new();
        batch.extend(record(7, libc::AF_INET as u8, 1, (&server, 8080), (&client, 0xd431)));
        batch.extend(record(7, libc::AF_INET as u8, 1, (&server, 8081), (&client, 0xd432))); // another port
        batch.extend(record(7, libc::AF_INET as u8, 6, (&server, 8080), (&client, 0xd433))); // time-wait
        batch.extend(record(6, libc::AF_INET as u8, 1, (&server, 8080), (&client, 0xd434))); // an older dump
        batch.extend(record(7, libc::AF_INET6 as u8, 8, (&v6, 8080), (&v6_client, 0xd435))); // close-wait
        let mut out = Vec::new();
        let mut held = |msg: &[u8]| out.extend(flow_of(msg, &ports));
        assert_eq!(parse_batch(&batch, 7, &mut held).unwrap(), (4, false), "records of this dump, not done");
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].server_addr, ipv4_mapped(server));
        assert_eq!(out[0].client_addr, ipv4_mapped(client));
        assert_eq!((out[0].server_port, out[0].client_port), (8080, 0xd431));
        assert_eq!((out[1].server_addr, out[1].client_addr, out[1].client_port), (v6, v6_client, 0xd435));

        let mut ignore = |_: &[u8]| {};
        assert_eq!(parse_batch(&done(7), 7, &mut ignore).unwrap(), (0, true));
        assert!(parse_batch(&batch[..NLMSG_HDRLEN + 8], 7, &mut ignore).is_err(), "a truncated record");
    }

    #[test]
    fn asks_for_the_held_states_of_tcp() {
        let states = HELD_STATES.iter().map(|s| 1u32 << s).sum();
        let m = dump_request(libc::AF_INET6 as u8, states, 3);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!((m[16], m[17]), (libc::AF_INET6 as u8, 6));
        let states = u32::from_ne_bytes(m[20..24].try_into().unwrap());
        assert_eq!(states, 0b1011_1011_0010, "established, fin-wait, close, close-wait, last-ack, closing");
    }

    #[test]
    fn finds_a_live_connection_in_this_namespace() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_served, _) = listener.accept().unwrap();
        let mut table = SocketTable::open().unwrap();
        let mut out = Vec::new();
        let records = table.held(&BTreeSet::from([port]), &mut out).unwrap();
        assert!(records >= 2, "both ends of the connection are in the table: {records}");
        let want = FlowKey {
            client_addr: ipv4_mapped([127, 0, 0, 1]),
            server_addr: ipv4_mapped([127, 0, 0, 1]),
            client_port: client.local_addr().unwrap().port(),
            server_port: port,
        };
        assert_eq!(out, [want], "only the server end is on the port");
        drop(client);
        // A second dump on the same socket works (sequence numbers move on),
        // and still finds the server's end: its client's FIN leaves it in
        // CLOSE_WAIT, a connection the server still holds until it closes.
        out.clear();
        table.held(&BTreeSet::from([port]), &mut out).unwrap();
        assert_eq!(out, [want], "the server's end in CLOSE_WAIT, still held");
    }

    #[test]
    fn destroys_a_live_connection_by_its_server_side() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        let (mut server, peer) = listener.accept().unwrap();
        let flow = FlowKey {
            client_addr: ipv4_mapped(Ipv4Addr::LOCALHOST.octets()),
            server_addr: ipv4_mapped(Ipv4Addr::LOCALHOST.octets()),
            client_port: peer.port(),
            server_port: port,
        };
        let mut table = SocketTable::open().unwrap();
        assert!(table.destroy(&flow).unwrap(), "the server's socket was there");
        use std::io::Read as _;
        let mut buf = [0u8; 1];
        assert!(server.read(&mut buf).is_err(), "the application's next call fails");
        assert!(client.read(&mut buf).is_err() || client.read(&mut buf).is_ok_and(|n| n == 0), "the client was reset");
        assert!(!table.destroy(&flow).unwrap(), "gone: nothing to destroy, and the listener is left alone");
        let again = TcpStream::connect((Ipv4Addr::LOCALHOST, port));
        assert!(again.is_ok() && listener.accept().is_ok(), "the listener still listens");
    }

    #[test]
    fn reads_a_listeners_accept_queue() {
        // A listener with a backlog of 4 that accepts nothing: connections wait in its queue.
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.bind(&std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).unwrap();
        socket.listen(4).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        let _waiting: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut table = SocketTable::open().unwrap();
        let queues = table.accept_queues(&BTreeSet::from([addr.port()])).unwrap();
        let queue = queues[&addr.port()];
        assert_eq!(queue, AcceptQueue { waiting: 3, backlog: 4 });
        assert!(queue.pressed(), "3 of 4 is at least half full");
        assert!(!AcceptQueue { waiting: 1, backlog: 4 }.pressed());
        assert!(!AcceptQueue::default().pressed(), "no listener, no pressure");
        assert!(table.accept_queues(&BTreeSet::from([1])).unwrap().is_empty(), "no listener on port 1");
    }
}
