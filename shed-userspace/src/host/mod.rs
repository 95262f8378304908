// SPDX-License-Identifier: MIT OR Apache-2.0
//! The host as the gate finds it: capabilities, mounts, network namespaces,
//! interfaces and their drivers, the kernel's BTF, the socket table through
//! sock_diag, TCP counters, netfilter NAT that bypasses the gate, the
//! container runtime's pods (CRI), systemd's notifications, the kernel's
//! expedited-RCU switch, and the paths where the gate keeps its state.
//! Nothing here knows the gate's maps or programs.

pub(crate) mod btf;
pub mod cri;
pub(crate) mod nat;
pub mod netstat;
pub(crate) mod notify;
pub mod paths;
pub(crate) mod rcu;
pub(crate) mod sockdiag;
pub mod system;
