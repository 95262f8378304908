// SPDX-License-Identifier: MIT OR Apache-2.0
//! Library errors. Each says what went wrong and, where the operator can act,
//! what to do about it.
use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "missing privileges: {missing}. Run as root (sudo shedctl ...) or grant CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON"
    )]
    NotPrivileged { missing: String },

    #[error("bpffs is not mounted at {path}: mount it with `mount -t bpf bpf {path}` (or run `cargo xtask setup`)")]
    BpffsMissing { path: &'static str },

    #[error(
        "tracefs is not mounted at {path}: mount it with `mount -t tracefs tracefs {path}` (or run `cargo xtask setup`)"
    )]
    TracefsMissing { path: &'static str },

    #[error(
        "kernel {release} is older than {minimum}, the oldest shed runs on: it lacks {missing}. Upgrade the kernel (Debian 12: bookworm-backports' linux-image-amd64)"
    )]
    KernelTooOld { release: String, minimum: &'static str, missing: &'static str },

    #[error(
        "unknown interface {name:?}: list interfaces with `ip link` (inside the namespace given with --netns, if any)"
    )]
    UnknownInterface { name: String },

    #[error(
        "interface {name:?} carries no Ethernet header (link type {link_type}: WireGuard, tun, ipip and the like); shed parses Ethernet frames only: gate the Ethernet interface the traffic arrives on instead"
    )]
    NotEthernet { name: String, link_type: u32 },

    #[error("no shed gate is running (nothing pinned at {}): start one with `sudo shedctl attach --port PORT`", pin_dir.display())]
    NoGate { pin_dir: PathBuf },

    #[error("the gate protects several network namespaces ({labels}): name one with --netns")]
    SeveralNamespaces { labels: String },

    #[error(
        "the gate does not protect network namespace `{netns}`: it protects {labels} (labels as `shedctl stats` shows them)"
    )]
    NamespaceNotGated { netns: String, labels: String },

    #[error("no shed gate is running: the pins at {} were left by a daemon that is gone (pid {pid}); `sudo shedctl detach` removes them", pin_dir.display())]
    StaleGate { pin_dir: PathBuf, pid: String },

    #[error(
        "port {port} is not protected by the running gate (protected: {protected}); a running gate takes no new port: to add it, stop the gate (`shedctl detach`) and attach again with every port (`shedctl attach --port {port} --port ...`)"
    )]
    PortNotProtected { port: u16, protected: String },

    #[error(
        "shedctl is running inside network namespace `{name}` (as `ip netns exec {name}` runs it), with a /sys of its own: the host's bpffs and the gate's pins are hidden there, and a gate attached from inside would be invisible to shedctl on the host. Run shedctl on the host and name the namespace instead: `shedctl attach --netns {name} --port ...`"
    )]
    InsideIpNetnsExec { name: String },

    #[error(
        "port {port} is already protected by the running gate (pid {pid}): change it with `shedctl set --port {port} ...`, or stop it with `shedctl detach --port {port}` first"
    )]
    PortAlreadyProtected { port: u16, pid: String },

    #[error(
        "a shed gate is already running (pid {pid}, ports {ports}); shed runs one gate per host: stop it with `shedctl detach` and attach again with every port (--port A --port B)"
    )]
    AlreadyRunning { pid: String, ports: String },

    #[error(
        "the kernel object was not built into this binary: run `cargo xtask build-ebpf`, then rebuild shedctl (or use `cargo xtask install`)"
    )]
    EbpfObjectMissing,

    #[error(
        "the running kernel's {tracepoint} tracepoint differs from what shed was built for: field {field} expected at offset {expected}, found {found}"
    )]
    TracepointLayout { tracepoint: &'static str, field: &'static str, expected: usize, found: String },

    #[error("{cidr} has no tier of its own: list tiers with `shedctl tier ls`")]
    TierNotFound { cidr: String },

    #[error("too many ports: a gate protects at most {max} ports")]
    TooManyPorts { max: u32 },

    #[error("loading the kernel object failed: {source}")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },

    #[error("{op} failed: {source}")]
    Program {
        op: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("{op} failed: {source}")]
    Map {
        op: String,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    #[error("the pods' dispatcher cannot {what}")]
    Dispatch { what: String },

    #[error("the container runtime (CRI) at {}: {reason}", socket.display())]
    Cri { socket: PathBuf, reason: String },

    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub fn map(op: impl Into<String>, source: aya::maps::MapError) -> Self {
        Self::Map { op: op.into(), source: Box::new(source) }
    }

    pub fn program(op: impl Into<String>, source: aya::programs::ProgramError) -> Self {
        Self::Program { op: op.into(), source: Box::new(source) }
    }

    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }
}
