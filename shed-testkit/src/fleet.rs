// SPDX-License-Identifier: MIT OR Apache-2.0
//! A fleet behind a real load balancer: backends in namespaces of their own,
//! each joined by a veth to a balancer namespace where HAProxy (Debian's
//! `haproxy`) and the clients run. For the steering test and B13.
use std::{
    fmt::Write as _,
    io::{self, BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr},
    os::unix::net::UnixStream,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    servers::{Process, wait_listening},
    testbed::{Backend, Service, ip},
};

/// The balancer's namespace and `n` backend namespaces, `10.201.<i+1>.0/24` each.
pub struct Fleet {
    pub lb_ns: String,
    /// Each backend's namespace and address (`10.201.<i+1>.2`).
    pub backends: Vec<(String, Ipv4Addr)>,
}

impl Fleet {
    /// Creates `<name>-lb` and `<name>-b<i>` (name: at most 6 characters).
    pub fn create(name: &str, n: usize) -> io::Result<Self> {
        assert!(name.len() <= 6 && n <= 9, "fleet name {name:?} too long for interface names, or too many backends");
        let fleet = Self {
            lb_ns: format!("{name}-lb"),
            backends: (0..n).map(|i| (format!("{name}-b{i}"), Ipv4Addr::new(10, 201, i as u8 + 1, 2))).collect(),
        };
        // Leftovers of a crashed earlier run would make every step below fail.
        fleet.remove();
        ip(&["netns", "add", &fleet.lb_ns])?;
        ip(&["-n", &fleet.lb_ns, "link", "set", "lo", "up"])?;
        for (i, (ns, addr)) in fleet.backends.iter().enumerate() {
            let (lb_if, be_if) = (format!("{name}l{i}"), format!("{name}b{i}"));
            ip(&["netns", "add", ns])?;
            ip(&["link", "add", &lb_if, "netns", &fleet.lb_ns, "type", "veth", "peer", "name", &be_if, "netns", ns])?;
            let [a, b, c, _] = addr.octets();
            ip(&["-n", &fleet.lb_ns, "addr", "add", &format!("{a}.{b}.{c}.1/24"), "dev", &lb_if])?;
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", &be_if])?;
            for (n, dev) in [(fleet.lb_ns.as_str(), lb_if.as_str()), (ns, be_if.as_str()), (ns, "lo")] {
                ip(&["-n", n, "link", "set", dev, "up"])?;
            }
        }
        Ok(fleet)
    }

    fn remove(&self) {
        let _ = ip(&["netns", "del", &self.lb_ns]);
        for (ns, _) in &self.backends {
            let _ = ip(&["netns", "del", ns]);
        }
    }

    /// Serves kept-alive HTTP/1.1 on `port` of every backend, `workers` each
    /// reading a request only when free (a worker-pool server), each backend
    /// with a service time of its own (microseconds, changeable while running).
    pub fn serve(&self, port: u16, workers: usize, service_us: u64) -> io::Result<Serving> {
        let service_us: Vec<Arc<AtomicU64>> =
            self.backends.iter().map(|_| Arc::new(AtomicU64::new(service_us))).collect();
        let addrs: Vec<SocketAddr> = self.backends.iter().map(|(_, a)| (*a, port).into()).collect();
        let servers = self
            .backends
            .iter()
            .zip(&service_us)
            .zip(&addrs)
            .map(|(((ns, _), us), addr)| {
                Backend::start(ns, *addr, Service::HttpKeepAliveWorkers { workers, service_us: us.clone() })
            })
            .collect::<io::Result<_>>()?;
        Ok(Serving { servers, service_us, addrs })
    }

    /// `--netns NS` for every backend, for one `shedctl attach` gating them all.
    pub fn netns_args(&self) -> Vec<String> {
        self.backends.iter().flat_map(|(ns, _)| ["--netns".to_owned(), ns.clone()]).collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A fleet's servers ([`Fleet::serve`]), in backend order; they stop on drop.
pub struct Serving {
    pub servers: Vec<Backend>,
    /// Each backend's service time, microseconds: store to slow one down.
    pub service_us: Vec<Arc<AtomicU64>>,
    /// Where each listens: what the balancer balances.
    pub addrs: Vec<SocketAddr>,
}

impl Serving {
    /// Requests each backend has read so far.
    pub fn read(&self) -> Vec<u64> {
        self.servers.iter().map(|b| b.read.load(Ordering::Relaxed)).collect()
    }
}

/// How HAProxy balances the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balancing {
    /// Round robin, nothing else.
    RoundRobin,
    /// Round robin, a failed request retried on another server (`retries 3`,
    /// `option redispatch 1`, `retry-on conn-failure empty-response`).
    Redispatch,
    /// Round robin weighted by each backend's agent (`agent-check`, every `inter_ms`).
    AgentCheck { port: u16, inter_ms: u32 },
}

/// HAProxy in front of a fleet: HTTP/1.1, kept-alive connections to the
/// backends, one thread. Stops on drop.
pub struct Haproxy {
    _process: Process,
    dir: tempfile::TempDir,
}

impl Haproxy {
    /// Listens on `bind` in `ns`, balancing `servers`.
    pub fn start(ns: &str, bind: SocketAddr, servers: &[SocketAddr], balancing: Balancing) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let d = dir.path().display();
        let retries = match balancing {
            Balancing::Redispatch => {
                "    retries 3\n    option redispatch 1\n    retry-on conn-failure empty-response response-timeout\n"
            }
            _ => "    retries 0\n",
        };
        let agent = match balancing {
            Balancing::AgentCheck { port, inter_ms } => {
                format!(" agent-check agent-port {port} agent-inter {inter_ms}ms")
            }
            _ => String::new(),
        };
        let mut lines = String::new();
        for (i, addr) in servers.iter().enumerate() {
            let _ = writeln!(lines, "    server b{i} {addr} weight 100{agent}");
        }
        let conf = format!(
            "global\n    maxconn 4096\n    nbthread 1\n    stats socket {d}/admin.sock mode 600 level admin\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 10s\n\
             option http-keep-alive\n    http-reuse always\n\
             frontend fe\n    bind {bind}\n    default_backend be\n\
             backend be\n    balance roundrobin\n{retries}{lines}"
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, conf)?;
        let log = dir.path().join("haproxy.log");
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "haproxy", "-db", "-f"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .map_err(|e| {
                io::Error::other(format!("run haproxy (apt-get install haproxy, or cargo xtask setup): {e}"))
            })?;
        wait_listening(ns, bind, "haproxy", &mut child)
            .map_err(|e| io::Error::other(format!("{e}: {}", std::fs::read_to_string(&log).unwrap_or_default())))?;
        Ok(Self { _process: Process(child), dir })
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    /// Each server's current weight, as HAProxy's `show stat` reports it (in `servers` order).
    pub fn weights(&self) -> io::Result<Vec<u32>> {
        Ok(self.server_stat("weight")?.into_iter().map(|w| w as u32).collect())
    }

    /// Requests each server was given so far (`stot`: counted when a request
    /// is assigned to the server, answered or not; `req_tot` counts answers,
    /// so a slow server's would be capped by its own pace). Retries count where they went.
    pub fn requests(&self) -> io::Result<Vec<u64>> {
        self.server_stat("stot")
    }

    /// One numeric column of `show stat`, for each server in `servers` order.
    fn server_stat(&self, name: &str) -> io::Result<Vec<u64>> {
        let mut conn = UnixStream::connect(self.socket())?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.write_all(b"show stat\n")?;
        let mut lines = BufReader::new(conn).lines();
        let header = lines.next().ok_or_else(|| io::Error::other("show stat: empty"))??;
        let column = header
            .trim_start_matches("# ")
            .split(',')
            .position(|c| c == name)
            .ok_or_else(|| io::Error::other(format!("show stat: no {name} column in {header}")))?;
        let mut values = Vec::new();
        for line in lines {
            let line = line?;
            let fields: Vec<&str> = line.split(',').collect();
            if fields.first() == Some(&"be") && fields.get(1).is_some_and(|s| s.starts_with('b')) {
                let value = fields.get(column).and_then(|w| w.parse().ok());
                values.push(value.ok_or_else(|| io::Error::other(format!("show stat: {name} of {line}")))?);
            }
        }
        Ok(values)
    }
}
