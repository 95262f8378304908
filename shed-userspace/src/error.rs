// SPDX-License-Identifier: MIT OR Apache-2.0
//! Library errors. Each says what went wrong and, where the operator can act,
//! what to do about it; a cause is its source, said once ([`chain`]).
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
    KernelTooOld { release: String, minimum: String, missing: &'static str },

    #[error(
        "unknown interface {name:?}: list interfaces with `ip link` (inside the namespace given with --netns, if any)"
    )]
    UnknownInterface { name: String },

    #[error(
        "interface {name:?} carries no Ethernet header (link type {link_type}: WireGuard, tun, ipip and the like); shed parses Ethernet frames only: gate the Ethernet interface the traffic arrives on instead"
    )]
    NotEthernet { name: String, link_type: u32 },

    /// Flags or config keys that do not go together (the reason says which and what to do).
    #[error("{reason}")]
    InvalidPlan { reason: String },

    #[error("no shed gate is running (nothing pinned at {}): start one with `sudo shedctl attach --port PORT`", pin_dir.display())]
    NoGate { pin_dir: PathBuf },

    #[error(
        "cannot open network namespace `{name}` ({}: {reason}): give a name from `ip netns list` or a path such as /proc/PID/ns/net",
        path.display()
    )]
    UnknownNamespace { name: String, path: PathBuf, reason: String },

    #[error(
        "--metrics-token-file {}: {reason}: write one token (the scrape's bearer token, one word), such as the output of `head -c 32 /dev/urandom | base64`, in a file the daemon can read",
        path.display()
    )]
    MetricsToken { path: PathBuf, reason: String },

    #[error(
        "no container runtime's CRI socket found (looked at {looked}): start the runtime, or give its socket with --cri-socket PATH"
    )]
    NoCriSocket { looked: String },

    #[error(
        "net.ipv4.tcp_fastopen is {mode}: servers in this namespace accept TCP Fast Open, whose SYN carries a request the gate cannot judge, and turning it off failed ({source}); set net.ipv4.tcp_fastopen={off} in the namespace, or attach with --count connections"
    )]
    FastOpen { mode: u32, off: u32, source: io::Error },

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

    #[error("loading the kernel object failed")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },

    #[error("{op} failed")]
    Program {
        op: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("{op} failed")]
    Map {
        op: String,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    #[error("memory: {reason}")]
    MemoryBudget { reason: String },

    #[error("the pods' dispatcher cannot {what}")]
    Dispatch { what: String },

    #[error("the container runtime (CRI) at {}: {reason}", socket.display())]
    Cri { socket: PathBuf, reason: String },

    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// `error` and each of its causes, as `a: b: c`: what a log line says of an
/// error. [`Error`]'s messages leave their source to the chain, as aya's
/// `MapError` does, so `{}` alone names the step that failed, not why. Some
/// foreign errors say their source in their own message too (aya's
/// `EbpfError::MapError`): a cause already said is not said again.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    said_once(error.to_string(), std::iter::successors(error.source(), |e| e.source()).map(ToString::to_string))
}

/// `message`, then each of `causes` that it does not already end with,
/// joined by `: ` (a cause repeated inside a longer text is said again:
/// a short cause may be a phrase the message uses for something else).
pub fn said_once(mut message: String, causes: impl Iterator<Item = String>) -> String {
    for cause in causes {
        if !message.ends_with(&cause) {
            message.push_str(": ");
            message.push_str(&cause);
        }
    }
    message
}

/// `shedctl`'s exit status, by what went wrong (documented in OPERATIONS, "Exit codes").
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// It failed while it ran (a map, a program, the kernel, a file).
    pub const RUNTIME: i32 = 1;
    /// The command line or the config file is wrong (clap's own status too).
    pub const USAGE: i32 = 2;
    /// No gate is running for a verb that needs one.
    pub const NOT_RUNNING: i32 = 3;
    /// Refused before anything changed: the host, the kernel or the running
    /// gate does not allow what was asked.
    pub const REFUSED: i32 = 4;
}

impl Error {
    /// The exit status this error ends `shedctl` with ([`exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::InvalidPlan { .. } => exit::USAGE,
            Self::NoGate { .. } | Self::StaleGate { .. } => exit::NOT_RUNNING,
            Self::NotPrivileged { .. }
            | Self::BpffsMissing { .. }
            | Self::TracefsMissing { .. }
            | Self::KernelTooOld { .. }
            | Self::UnknownInterface { .. }
            | Self::NotEthernet { .. }
            | Self::SeveralNamespaces { .. }
            | Self::UnknownNamespace { .. }
            | Self::MetricsToken { .. }
            | Self::NoCriSocket { .. }
            | Self::FastOpen { .. }
            | Self::NamespaceNotGated { .. }
            | Self::PortNotProtected { .. }
            | Self::InsideIpNetnsExec { .. }
            | Self::PortAlreadyProtected { .. }
            | Self::MemoryBudget { .. }
            | Self::AlreadyRunning { .. }
            | Self::TracepointLayout { .. }
            | Self::TierNotFound { .. }
            | Self::TooManyPorts { .. } => exit::REFUSED,
            Self::EbpfObjectMissing
            | Self::Load { .. }
            | Self::Program { .. }
            | Self::Map { .. }
            | Self::Dispatch { .. }
            | Self::Cri { .. }
            | Self::Io { .. } => exit::RUNTIME,
        }
    }

    /// The exit status of a command's error: the first of its causes that is
    /// one of ours decides; any other is a runtime failure.
    pub fn exit_code_of(err: &anyhow::Error) -> i32 {
        err.chain().find_map(|cause| cause.downcast_ref::<Self>()).map_or(exit::RUNTIME, Self::exit_code)
    }

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

#[cfg(test)]
mod tests {
    use super::{Error, exit};

    #[test]
    fn each_kind_of_failure_has_its_exit_status() {
        let no_gate = anyhow::Error::new(Error::NoGate { pin_dir: "/sys/fs/bpf/shed".into() });
        assert_eq!(Error::exit_code_of(&no_gate), exit::NOT_RUNNING);
        let refused =
            anyhow::Error::new(Error::AlreadyRunning { pid: "1".into(), ports: "8080".into() }).context("attaching");
        assert_eq!(Error::exit_code_of(&refused), exit::REFUSED, "a cause decides, under context");
        let io = Error::io("read", "/x", std::io::Error::other("boom"));
        assert_eq!(Error::exit_code_of(&anyhow::Error::new(io)), exit::RUNTIME);
        assert_eq!(Error::exit_code_of(&anyhow::anyhow!("something else")), exit::RUNTIME);
        let distinct = [exit::OK, exit::RUNTIME, exit::USAGE, exit::NOT_RUNNING, exit::REFUSED];
        assert!(distinct.iter().enumerate().all(|(i, a)| distinct[i + 1..].iter().all(|b| a != b)));
    }

    #[test]
    fn a_cause_is_said_once_by_the_chain_not_by_the_message() {
        let io = Error::io("create pin folder", "/sys/fs/bpf/shed", std::io::Error::other("read-only file system"));
        assert_eq!(io.to_string(), "create pin folder /sys/fs/bpf/shed", "the step, not its source");
        assert_eq!(super::chain(&io), "create pin folder /sys/fs/bpf/shed: read-only file system");
        let map = Error::map("write config of port 8080", aya::maps::MapError::KeyNotFound);
        assert_eq!(super::chain(&map), "write config of port 8080 failed: key not found");
        let wrapped = anyhow::Error::new(map).context("attaching");
        assert_eq!(format!("{wrapped:#}"), "attaching: write config of port 8080 failed: key not found");
        // A cause that a message already said is not said again.
        let load = Error::Load { source: Box::new(aya::EbpfError::MapError(aya::maps::MapError::KeyNotFound)) };
        assert_eq!(super::chain(&load), "loading the kernel object failed: map error: key not found");
    }
}
