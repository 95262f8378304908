// SPDX-License-Identifier: MIT OR Apache-2.0
//! What `attach` decided, split at the node/gate seam: a [`NodePlan`], fixed
//! for the process (where and how gates attach, map sizes, healing, the
//! endpoint, the pods), and a [`GatePlan`] per gate (its ports and how they
//! are judged): the node's own from its flags and config file, a pod's from
//! its annotations over that file. Live handles (the node's dispatcher, a
//! spare object) are not plans: a gate is handed them when it starts.
use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use crate::{
    daemon::{Reloader, budget::Budget},
    kernel::{
        maps::PortSpec,
        object::{LoadOptions, SockStateHook},
        options::{Action, Cidr, Count, Hook, XdpAttachMode},
    },
};

/// One gate's ports and how they are judged: what `--port` and its fellow
/// flags set for the node's own namespaces, and what a pod's annotations set
/// for its gate.
#[derive(Debug, Clone)]
pub(crate) struct GatePlan {
    /// The ports to protect, each once.
    pub ports: Vec<u16>,
    pub spec: PortSpec,
    pub tiers: BTreeMap<Cidr, u8>,
    pub action: Action,
    pub count: Count,
    pub dry_run: bool,
    /// The shortest control window.
    pub window: Duration,
    /// A fixed handshake window, or zero for the default (about 8 ms).
    pub handshake_window: Duration,
    /// `--agent-port`: where the gate answers a load balancer's agent checks.
    pub agent_port: Option<u16>,
}

/// Where a gate stands: a namespace the node names, or a pod's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// `--netns` (or the daemon's own): the node's `--iface`, its config's
    /// reloads, beside the node's other named namespaces, its maps sized by
    /// the node's flags.
    Named,
    /// A pod's namespace: every interface, the pod's annotations (no
    /// reload), its maps sized for a pod.
    Pod,
}

/// What the daemon runs with for its whole life.
pub(crate) struct NodePlan {
    /// The gate of each namespace the node names (`--netns`, else its own);
    /// no port: only pods are gated (`--pods` alone).
    pub gate: GatePlan,
    /// The namespaces to gate (None: the daemon's own), each once ([`super::process::namespaces`]).
    pub namespaces: Vec<Option<String>>,
    /// `--iface`; empty: every interface of the namespace, followed as they come and go.
    pub ifaces: Vec<String>,
    pub hook: Option<Hook>,
    pub xdp_mode: XdpAttachMode,
    /// `--max-connections`, `--max-clients`, `--kernel-log`.
    pub max_connections: u32,
    pub max_clients: u32,
    /// `--pod-max-connections`, `--pod-max-clients`: each pod's gate's tables.
    pub pod_max_connections: u32,
    pub pod_max_clients: u32,
    pub kernel_log: bool,
    /// `--allow-nat`: attach even where netfilter NAT takes connections past the gate.
    pub allow_nat: bool,
    pub heal_interval: Duration,
    /// The metrics endpoint's address, and its readiness rule.
    pub metrics: Option<SocketAddr>,
    /// `--metrics-token-file`'s token: /metrics answers only a scrape that carries it.
    pub metrics_token: Option<Arc<str>>,
    /// `--memory-budget` (or most of the cgroup's limit): gates that would not fit are refused.
    pub memory_budget: Option<Budget>,
    pub ready_max_shed: u8,
    pub ready_window: Duration,
    /// Makes a gate's reloader of the config file (SIGHUP), if one was given.
    pub reloader: Option<Box<dyn Fn() -> Reloader + Send + Sync>>,
    /// `--pods`: where the pods that ask for a gate are found, and how their asking is read.
    pub pods: Option<PodSource>,
}

impl NodePlan {
    /// The hook a spare object is verified for: the plan's, else TC (a
    /// pod's interfaces are loopback and, with most CNI plugins, a veth).
    pub(super) fn spare_hook(&self) -> Hook {
        self.hook.unwrap_or(Hook::Tc)
    }

    /// How a gate's object is sized and loaded: a named namespace's for
    /// the node's flags, a pod's for a pod ([`LoadOptions::pod`]).
    pub(super) fn load_options(&self, scope: Scope) -> LoadOptions {
        match scope {
            Scope::Named => LoadOptions {
                connections: self.max_connections,
                clients: self.max_clients,
                slots: shed_common::capacity::MAX_PORTS,
                kernel_log: self.kernel_log,
                sock_state: SockStateHook::Auto,
                dispatcher: false,
                shared: false,
            },
            Scope::Pod => LoadOptions::pod(self.pod_max_connections, self.pod_max_clients, self.kernel_log),
        }
    }
}

/// `--pods`: the container runtime's CRI socket, and the reader of a pod's annotations.
pub(crate) struct PodSource {
    pub socket: PathBuf,
    pub read: PodReader,
    /// Expedited RCU grace periods while pods wait in line to attach (not `--no-expedite-rcu`).
    pub expedite_rcu: bool,
}

/// Reads a pod's annotations: the plan of the gate it asks for, `None` when
/// it asks for none, or why it cannot have one.
pub(crate) type PodReader =
    Box<dyn Fn(&BTreeMap<String, String>) -> Result<Option<GatePlan>, PodRefusal> + Send + Sync>;

/// Why a pod is left ungated for good: one of its annotations (named, for
/// the metric), or the pod itself (host network, no namespace).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", annotation.as_ref().map(|a| format!("annotation {a}: ")).unwrap_or_default())]
pub(crate) struct PodRefusal {
    /// The annotation at fault (`shed.io/limit`, or `shed.io/*` for a conflict), if one is.
    pub annotation: Option<String>,
    pub reason: String,
}

impl PodRefusal {
    /// A refusal of the pod itself, not of one annotation.
    pub(crate) fn of_pod(reason: impl Into<String>) -> Self {
        Self { annotation: None, reason: reason.into() }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A node plan with its own gate's settings and every node setting set.
    pub(crate) fn node_plan() -> NodePlan {
        NodePlan {
            gate: GatePlan {
                ports: vec![9999],
                spec: crate::kernel::maps::PortSpec::default(),
                tiers: BTreeMap::new(),
                action: crate::kernel::options::Action::Drop,
                count: crate::kernel::options::Count::Work,
                dry_run: true,
                window: std::time::Duration::from_secs(9),
                handshake_window: std::time::Duration::from_secs(9),
                agent_port: Some(9400),
            },
            namespaces: vec![None],
            ifaces: vec!["eth9".into()],
            hook: Some(crate::kernel::options::Hook::Xdp),
            xdp_mode: crate::kernel::options::XdpAttachMode::Generic,
            max_connections: 1234,
            max_clients: 567,
            pod_max_connections: 4321,
            pod_max_clients: 765,
            kernel_log: true,
            allow_nat: true,
            heal_interval: std::time::Duration::from_secs(77),
            metrics: Some("127.0.0.1:1".parse().unwrap()),
            metrics_token: Some("secret".into()),
            memory_budget: None,
            ready_max_shed: 42,
            ready_window: std::time::Duration::from_secs(43),
            reloader: None,
            pods: None,
        }
    }
}
