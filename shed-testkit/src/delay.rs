// SPDX-License-Identifier: MIT OR Apache-2.0
//! A link with a round-trip time, for clients a real network's distance away.
//!
//! This kernel has neither netem nor fq, so the delay is made in userspace: a
//! TAP device in the server's namespace and one in a new "far" namespace,
//! with two relay threads that copy every frame from one to the other once it
//! has waited the one-way delay. TAP rather than TUN: the frames keep their
//! Ethernet header, so the gate judges the server's end like any NIC (ARP,
//! IPv4 and IPv6 cross the link as they would a wire).
//!
//! Each direction is a FIFO with a constant delay, so frames keep their order;
//! the relay adds about 10-50 us of its own. Stops, and removes the far
//! namespace and both devices, on drop.
use std::{
    collections::VecDeque,
    fs::{File, OpenOptions},
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::testbed::{ip, run_in};

/// `TUNSETIFF` (linux/if_tun.h): `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The far end of a delayed link: a namespace whose clients reach the server
/// namespace over a path of a chosen round-trip time.
pub struct DelayedLink {
    /// The far clients' namespace.
    pub far_ns: String,
    /// The server's end of the link (a TAP device in the server namespace).
    pub server_if: String,
    /// The server's address on the link.
    pub server_v4: Ipv4Addr,
    /// The far clients' address.
    pub client_v4: Ipv4Addr,
    /// Frames relayed each way (towards the server, towards the clients).
    pub relayed: Arc<[AtomicU64; 2]>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Opens a new TAP device `name` in the calling thread's namespace.
fn open_tap(name: &str) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).open("/dev/net/tun")?;
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TAP | IFF_NO_PI, _pad: [0; 22] };
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!("interface name {name:?} too long")));
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` lays out (name, flags, union padding).
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

impl DelayedLink {
    /// Joins a new namespace `<name>-far` to `server_ns` through two TAP
    /// devices (`<name>-ts` in the server namespace, `<name>-tc` far away),
    /// addressed `10.201.<net>.1/24` (server) and `.2` (clients), each frame
    /// held `one_way` in each direction (the round-trip time is twice that).
    /// `name`: at most 8 characters.
    pub fn create(server_ns: &str, name: &str, net: u8, one_way: Duration) -> io::Result<Self> {
        assert!(name.len() <= 8, "link name {name:?} too long for interface names");
        let far_ns = format!("{name}-far");
        let (server_if, far_if) = (format!("{name}-ts"), format!("{name}-tc"));
        let _ = ip(&["netns", "del", &far_ns]);
        ip(&["netns", "add", &far_ns])?;
        let (s_if, f_if) = (server_if.clone(), far_if.clone());
        let server_tap = run_in(server_ns, move || open_tap(&s_if))??;
        let far_tap = run_in(&far_ns, move || open_tap(&f_if))??;
        let (server_v4, client_v4) = (Ipv4Addr::new(10, 201, net, 1), Ipv4Addr::new(10, 201, net, 2));
        ip(&["-n", server_ns, "addr", "add", &format!("{server_v4}/24"), "dev", &server_if])?;
        ip(&["-n", &far_ns, "addr", "add", &format!("{client_v4}/24"), "dev", &far_if])?;
        for (ns, dev) in [(server_ns, server_if.as_str()), (far_ns.as_str(), far_if.as_str()), (far_ns.as_str(), "lo")]
        {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let mut threads = Vec::new();
        for (direction, (from, to)) in
            [(far_tap.try_clone()?, server_tap.try_clone()?), (server_tap, far_tap)].into_iter().enumerate()
        {
            threads.extend(relay(from, to, one_way, stop.clone(), relayed.clone(), direction));
        }
        Ok(Self { far_ns, server_if, server_v4, client_v4, relayed, stop, threads })
    }

    /// The server's address on the link, at `port`.
    pub fn server_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.server_v4), port)
    }
}

/// One direction: a reader that stamps each frame with when it is due, and a
/// writer that hands it on then.
fn relay(
    mut from: File,
    mut to: File,
    delay: Duration,
    stop: Arc<AtomicBool>,
    relayed: Arc<[AtomicU64; 2]>,
    direction: usize,
) -> [JoinHandle<()>; 2] {
    let queue = Arc::new((Mutex::new(VecDeque::<(Instant, Vec<u8>)>::new()), Condvar::new()));
    let (q, stop_r) = (queue.clone(), stop.clone());
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while !stop_r.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&raw mut pfd, 1, 50) } <= 0 {
                continue;
            }
            let Ok(n) = from.read(&mut buf) else {
                // A device that is not up yet: try again shortly.
                thread::sleep(Duration::from_millis(1));
                continue;
            };
            let (lock, ready) = &*q;
            lock.lock().expect("relay queue").push_back((Instant::now() + delay, buf[..n].to_vec()));
            ready.notify_one();
        }
    });
    let writer = thread::spawn(move || {
        let (lock, ready) = &*queue;
        let mut pending = lock.lock().expect("relay queue");
        while !stop.load(Ordering::Relaxed) {
            let Some(&(due, _)) = pending.front() else {
                pending = ready.wait_timeout(pending, Duration::from_millis(50)).expect("relay queue").0;
                continue;
            };
            let now = Instant::now();
            if due > now {
                pending = ready.wait_timeout(pending, due - now).expect("relay queue").0;
                continue;
            }
            let (_, frame) = pending.pop_front().expect("a frame");
            drop(pending);
            // A full or downed device drops the frame, as a wire would.
            let _ = to.write(&frame);
            relayed[direction].fetch_add(1, Ordering::Relaxed);
            pending = lock.lock().expect("relay queue");
        }
    });
    [reader, writer]
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The TAP devices went with their last file descriptor; the namespace goes now.
        let _ = ip(&["netns", "del", &self.far_ns]);
    }
}
