// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `shedctl` command line (clap derive). Every flag documents itself and
//! validates its value before anything is changed.

pub mod annotations;
pub mod commands;
pub mod config;
pub(crate) mod input;
pub mod tiers;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use clap::{ArgGroup, Args, Parser, Subcommand};

use shed_common::ControlConfig;

use crate::{
    cli::input::{
        Switch, http_count, http_port, named, parse_client_cap, parse_client_share, parse_handshake_window,
        parse_interface, parse_limit, parse_listen_addr, parse_map_size, parse_millis, parse_netns, parse_percentile,
        parse_port, parse_prefix_v6, parse_retry_after, parse_seconds,
    },
    cli::tiers::{parse_assignment, parse_cidr, parse_share, parse_tier, parse_tier_action},
    control::{Algo, Settings},
    kernel::maps::PortSpec,
    kernel::options::{Action, Cidr, Count, Hook, XdpAttachMode},
};

#[derive(Debug, Parser)]
#[command(
    name = "shedctl",
    version = env!("SHED_VERSION"),
    about = "shed: an eBPF admission gate that sheds new connections and requests before a service overloads",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per run; boxing would only move the bytes")]
pub enum Command {
    /// Load and attach the gate, then run in the foreground until SIGINT/SIGTERM.
    ///
    /// Example: sudo shedctl attach --port 8080 --limit 200 --action rst
    Attach(AttachArgs),
    /// Show limit, in-flight, admitted and rejected per protected port.
    ///
    /// Example: shedctl stats --port 8080 --json
    Stats(StatsArgs),
    /// Live view: limit vs in-flight, shed rate by tier and reason, latency; q quits.
    ///
    /// Example: shedctl top --port 8080
    Top(TopArgs),
    /// Change a protected port's settings live; the next connection or request judged sees them.
    ///
    /// Example: shedctl set --port 8080 --limit 50
    Set(SetArgs),
    /// Stop gating one port, or stop the gate entirely.
    ///
    /// Example: shedctl detach --port 8080
    Detach(DetachArgs),
    /// The node's pods as the container runtime reports them, with the gate
    /// each one's `shed.io/*` annotations ask for (or why they cannot).
    ///
    /// Example: shedctl pods --cri-socket /run/containerd/containerd.sock
    Pods(PodsArgs),
    /// Client tiers by source network: add, remove, list (live; the next connection or request judged sees a change).
    ///
    /// Example: shedctl tier add 10.0.0.0/8 critical
    #[command(subcommand)]
    Tier(TierCommand),
    /// The config file of the running gate.
    ///
    /// Example: shedctl config save --file /etc/shed/shed.toml
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print shell completions for bash, zsh, fish, elvish or powershell.
    ///
    /// Example: shedctl completions bash > /usr/share/bash-completion/completions/shedctl
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page shedctl(1), or write it and one page per verb into a folder.
    ///
    /// Example: shedctl man --dir /usr/share/man/man1
    Man {
        /// Folder for shedctl.1, shedctl-attach.1, ... (created if missing).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Write the live settings (after `set` and `tier` changes) back to a config file;
    /// keys the gate does not hold (interfaces, metrics, ...) are kept from the file.
    ///
    /// Example: shedctl config save --file /etc/shed/shed.toml
    Save {
        /// The file to write (--file /etc/shed/shed.toml).
        #[arg(long, default_value = "/etc/shed/shed.toml")]
        file: PathBuf,

        /// With several namespaces gated: whose live settings to write (--netns web).
        #[arg(long)]
        netns: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TierCommand {
    /// Give a client network a tier (exempt, critical, normal, low).
    ///
    /// Example: shedctl tier add 2001:db8::/32 low
    Add {
        #[arg(value_parser = parse_cidr)]
        cidr: Cidr,
        #[arg(value_parser = parse_tier)]
        tier: u8,
    },
    /// Remove a client network's tier (it falls back to a shorter prefix, or normal).
    ///
    /// Example: shedctl tier rm 10.0.0.0/8
    Rm {
        #[arg(value_parser = parse_cidr)]
        cidr: Cidr,
    },
    /// List client networks and their tiers.
    ///
    /// Example: shedctl tier ls --json
    Ls {
        /// Print a JSON list of {cidr, tier}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Debug, Args)]
pub struct AttachArgs {
    /// TOML file of attach settings, one key per flag; flags given here override it (--config /etc/shed/shed.toml).
    #[arg(help_heading = "Config file", long)]
    pub config: Option<PathBuf>,

    /// Print the settings as a config file and exit, without attaching (--print-config > shed.toml).
    #[arg(help_heading = "Config file", long)]
    pub print_config: bool,

    /// Port to protect; repeat for several (--port 8080 --port 8443).
    #[arg(help_heading = "Ports and limits", long = "port", required_unless_present_any = ["config", "pods"], allow_negative_numbers = true, value_parser = parse_port)]
    pub ports: Vec<u16>,

    /// Also gate every pod of the node whose `shed.io/ports` annotation asks for it, each in its
    /// own network namespace with the settings its `shed.io/*` annotations give, found through the
    /// container runtime (CRI) and followed as pods come and go (--pods).
    #[arg(help_heading = "Pods (node agent)", long)]
    pub pods: bool,

    /// The container runtime's CRI socket, for --pods; auto: the first there of containerd's,
    /// CRI-O's, and k3s's or RKE2's (--cri-socket /run/containerd/containerd.sock).
    #[arg(help_heading = "Pods (node agent)", long, default_value = crate::host::cri::DEFAULT_SOCKET)]
    pub cri_socket: PathBuf,

    /// With --pods, the established connections each pod's gate counts; past it a pod's new
    /// connections are admitted uncounted (connection_map_full). Each pod's table costs 16 bytes
    /// an entry at once (256 KiB at the default), then ~200 bytes a connection (--pod-max-connections 16384).
    #[arg(help_heading = "Pods (node agent)", long, value_parser = parse_map_size, default_value_t = shed_common::capacity::POD_MAX_CONNECTIONS)]
    pub pod_max_connections: u32,

    /// With --pods, the clients each pod's gate counts for a client cap or share; past it new
    /// clients are not capped (client_map_full) (--pod-max-clients 4096).
    #[arg(help_heading = "Pods (node agent)", long, value_parser = parse_map_size, default_value_t = shed_common::capacity::POD_MAX_CLIENTS)]
    pub pod_max_clients: u32,

    /// With --pods, never switch the kernel's RCU grace periods to expedited
    /// (/sys/kernel/rcu_expedited) while pods wait in line to attach: each
    /// attachment then waits out a normal grace period, and pods started
    /// together are gated later (--no-expedite-rcu).
    #[arg(help_heading = "Pods (node agent)", long)]
    pub no_expedite_rcu: bool,

    /// Interface to gate; repeat for several (--iface eth0 --iface lo).
    /// Default: every interface of the namespace, loopback included.
    #[arg(help_heading = "Interfaces and namespaces", long = "iface", value_parser = parse_interface)]
    pub ifaces: Vec<String>,

    /// Hook on every interface (--hook tc). Default: xdp, and tc on loopback.
    #[arg(help_heading = "Interfaces and namespaces", long, value_parser = named::<Hook>())]
    pub hook: Option<Hook>,

    /// How XDP runs (--xdp-mode generic): auto lets the kernel pick native where the driver has it.
    #[arg(help_heading = "Interfaces and namespaces", long, value_parser = named::<XdpAttachMode>(), default_value_t = XdpAttachMode::Auto)]
    pub xdp_mode: XdpAttachMode,

    /// What a refusal gets, whatever it refuses (a handshake-completing ACK, a SYN while the port
    /// is full, a kept-alive connection's next request): drop sends nothing, rst a reset, http
    /// (plaintext HTTP/1.x) a 503 with Retry-After (--action rst).
    #[arg(help_heading = "Refusal", long, value_parser = named::<Action>(), default_value_t = Action::Drop)]
    pub action: Action,

    /// A fixed concurrency limit: admit while in-flight < limit (--limit 200). Implies --algo fixed.
    #[arg(help_heading = "Ports and limits", long, value_parser = parse_limit)]
    pub limit: Option<u32>,

    /// Limiter (--algo gradient). Default: queue, or fixed when --limit is given.
    #[arg(help_heading = "Controller", long, value_parser = named::<Algo>())]
    pub algo: Option<Algo>,

    /// Limit an adaptive controller starts from (--initial-limit 100).
    #[arg(help_heading = "Controller", long, value_parser = parse_limit)]
    pub initial_limit: Option<u32>,

    /// Lowest limit an adaptive controller may set (--min-limit 4).
    #[arg(help_heading = "Controller", long, value_parser = parse_limit, default_value_t = 4)]
    pub min_limit: u32,

    /// Highest limit an adaptive controller may set (--max-limit 10000).
    #[arg(help_heading = "Controller", long, value_parser = parse_limit, default_value_t = 10_000)]
    pub max_limit: u32,

    /// Control window in milliseconds (--window 100).
    #[arg(help_heading = "Controller", long, default_value = "100", value_parser = |s: &str| parse_millis(s, 20, 10_000))]
    pub window: Duration,

    /// Percentile of request latency (arrival to first response byte) the controller follows (--percentile 90).
    #[arg(help_heading = "Controller", long, default_value_t = 90, value_parser = parse_percentile)]
    pub percentile: u8,

    /// What in-flight counts (--count connections). Default: work (connections owing an answer),
    /// which judges each new request on a kept-alive connection too; connections and multiplexed
    /// judge a connection at its handshake only.
    #[arg(help_heading = "Ports and limits", long, value_parser = named::<Count>(), default_value_t = Count::Work)]
    pub count: Count,

    #[command(flatten)]
    pub guards: GuardArgs,

    /// Client tier by source network; repeat (--tier 10.0.0.0/8=critical --tier 2001:db8::/32=low).
    #[arg(help_heading = "Clients and tiers", long = "tier", value_parser = parse_assignment)]
    pub tiers: Vec<(Cidr, u8)>,

    /// TOML file of client tiers: [tiers] "10.0.0.0/8" = "critical" (--tier-file /etc/shed/tiers.toml).
    #[arg(help_heading = "Clients and tiers", long)]
    pub tier_file: Option<PathBuf>,

    /// Most established connections one client may hold; 0: no cap (--client-cap 20).
    #[arg(help_heading = "Clients and tiers", long, value_parser = parse_client_cap, default_value_t = 0)]
    pub client_cap: u32,

    /// Percent of the limit one client may hold while clients holding less are
    /// refused; 0: no share (--client-share 50). A lone client, or a NAT, may still fill the port.
    #[arg(help_heading = "Clients and tiers", long, value_parser = parse_client_share, default_value_t = shed_common::DEFAULT_CLIENT_SHARE)]
    pub client_share: u8,

    /// IPv6 clients are capped per prefix of this length (--client-prefix-v6 64); IPv4 per address.
    #[arg(help_heading = "Clients and tiers", long, value_parser = parse_prefix_v6, default_value_t = 64)]
    pub client_prefix_v6: u8,

    /// Most answers to refusals per second the port sends (resets, and the http action's
    /// SYN-ACKs and 503s); past it a refused handshake or request is dropped instead; 0: no cap (--rst-rate 20000).
    #[arg(help_heading = "Refusal", long, default_value_t = shed_common::DEFAULT_RST_PER_SEC)]
    pub rst_rate: u32,

    /// Most answers to refusals per second to one source prefix (IPv4 /24, IPv6 /48), as --rst-rate
    /// counts them; not for the port's largest client while it holds connections (a proxy: its
    /// users' refusals stay answered); 0: no cap (--rst-prefix-rate 1000).
    #[arg(help_heading = "Refusal", long, default_value_t = shed_common::DEFAULT_RST_PER_PREFIX_PER_SEC)]
    pub rst_prefix_rate: u32,

    /// Seconds the `http` action's 503 tells clients to wait (Retry-After, 1 to
    /// 999); 0: the controller's queue wait, rounded up, at least 1 (--retry-after 0).
    #[arg(help_heading = "Refusal", long, value_parser = parse_retry_after, default_value_t = 0)]
    pub retry_after: u16,

    /// Count what would be rejected, but admit everything (--dry-run).
    #[arg(help_heading = "Refusal", long, overrides_with = "no_dry_run")]
    pub dry_run: bool,

    /// Dry-run off, over a config file's `dry-run = true` (--no-dry-run).
    #[arg(help_heading = "Refusal", long, overrides_with = "dry_run")]
    pub no_dry_run: bool,

    /// Network namespace to gate: a name from `ip netns` or a path; repeat to gate several,
    /// each with its own limits and counts (--netns web --netns api).
    #[arg(help_heading = "Interfaces and namespaces", long, value_parser = parse_netns)]
    pub netns: Vec<String>,

    /// Milliseconds an admitted handshake-completing ACK holds its slot until the kernel
    /// reports the connection established (the same softirq: microseconds); 0: the
    /// default, about 8 ms (--handshake-window 0).
    #[arg(help_heading = "Ports and limits", long, default_value = "0", value_parser = parse_handshake_window)]
    pub handshake_window: Duration,

    /// Serve Prometheus metrics on this address at /metrics (--metrics 127.0.0.1:9464).
    #[arg(help_heading = "Metrics, health and logs", long, value_parser = parse_listen_addr)]
    pub metrics: Option<SocketAddr>,

    /// With --metrics: /metrics answers only a scrape that carries this file's
    /// token (`Authorization: Bearer TOKEN`); /healthz and /readyz stay open for
    /// probes (--metrics-token-file /etc/shed/metrics-token).
    #[arg(help_heading = "Metrics, health and logs", long)]
    pub metrics_token_file: Option<PathBuf>,

    /// Answer a load balancer's agent checks (HAProxy `agent-check`) on this port of
    /// every address of each gated namespace (a pod: its own address): one line, this
    /// backend's weight (`70%`), from 10% to 100%, never drain; with several ports, the one a
    /// check names (HAProxy's agent-send: the port, then a newline), else the lowest
    /// (--agent-port 9500).
    #[arg(help_heading = "Metrics, health and logs", long, allow_negative_numbers = true, value_parser = parse_port)]
    pub agent_port: Option<u16>,

    /// Seconds between routine healing passes, which read every held connection;
    /// evidence of drift (ports changed, the connection map full) brings one forward (--heal-interval 30).
    #[arg(help_heading = "Memory and maps", long, value_parser = parse_seconds, default_value = "30")]
    pub heal_interval: Duration,

    /// Most established connections counted across ports; past it new connections are
    /// admitted uncounted (connection_map_full). The table costs 16 bytes an entry at once
    /// (4 MiB at the default), then ~200 bytes a connection (--max-connections 262144).
    #[arg(help_heading = "Memory and maps", long, value_parser = parse_map_size, default_value_t = shed_common::capacity::MAX_SOCKS)]
    pub max_connections: u32,

    /// MiB the daemon may hold, its gates' maps included (the kernel charges them to its memory
    /// cgroup): a namespace or pod whose gate would not fit is refused instead of the daemon being
    /// OOM-killed; 0: 90% of the cgroup's memory limit, none if unlimited (--memory-budget 0).
    #[arg(help_heading = "Memory and maps", long, default_value_t = 0)]
    pub memory_budget: u32,

    /// Most clients tracked for --client-cap; past it new clients are not capped
    /// (client_map_full). Memory grows with use (--max-clients 65536).
    #[arg(help_heading = "Memory and maps", long, value_parser = parse_map_size, default_value_t = shed_common::capacity::MAX_CLIENTS)]
    pub max_clients: u32,

    /// Let the kernel programs log their rare paths (a map full, a reset that
    /// could not be sent, a header that could hide a SYN), each at most once a
    /// second, into this log; off by default (--kernel-log).
    #[arg(help_heading = "Metrics, health and logs", long)]
    pub kernel_log: bool,

    /// Attach even where netfilter NAT (a redirect, or a DNAT to this host)
    /// sends connections to or from a protected port past the gate; they are
    /// not judged (--allow-nat).
    #[arg(help_heading = "Interfaces and namespaces", long)]
    pub allow_nat: bool,

    /// With --metrics: /readyz says not ready while more than this percent of new
    /// connections are shed over --ready-window; 100: always ready (--ready-max-shed 50).
    #[arg(help_heading = "Metrics, health and logs", long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub ready_max_shed: u8,

    /// Seconds the shed share is measured over for /readyz (--ready-window 10).
    #[arg(help_heading = "Metrics, health and logs", long, default_value = "10", value_parser = parse_seconds)]
    pub ready_window: Duration,
}

impl AttachArgs {
    /// What the arguments ask of every port, and the client tiers, checked
    /// (the same for `attach` and a SIGHUP reload).
    pub(crate) fn plan(&self) -> anyhow::Result<(PortSpec, BTreeMap<Cidr, u8>)> {
        let mut ports = self.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        if ports.len() > shed_common::capacity::MAX_PORTS as usize {
            return Err(crate::error::Error::TooManyPorts { max: shed_common::capacity::MAX_PORTS }.into());
        }
        let (control, limit) = self.control().map_err(anyhow::Error::msg)?;
        if self.action == Action::Http {
            http_count(self.count).map_err(anyhow::Error::msg)?;
            for &port in &ports {
                http_port(port).map_err(anyhow::Error::msg)?;
            }
        }
        let mut assignments = self.tiers.clone();
        if let Some(file) = &self.tier_file {
            assignments.extend(tiers::load_tier_file(file).map_err(anyhow::Error::msg)?);
        }
        let tiers = tiers::merge(assignments).map_err(anyhow::Error::msg)?;
        let spec = PortSpec {
            client_cap: self.client_cap,
            client_prefix_v6: self.client_prefix_v6,
            client_share: self.client_share,
            rst_per_sec: self.rst_rate,
            rst_per_prefix_per_sec: self.rst_prefix_rate,
            retry_after_s: self.retry_after,
            ..PortSpec::new(limit, self.action.to_raw(), self.dry_run, self.count.to_raw(), control)
        };
        Ok((spec, tiers))
    }

    /// The plan of the gate these flags ask for ([`Self::plan`]'s checks first).
    pub(crate) fn gate_plan(&self) -> anyhow::Result<crate::daemon::plan::GatePlan> {
        let (spec, tiers) = self.plan()?;
        Ok(crate::daemon::plan::GatePlan {
            ports: self.ports.clone(),
            spec,
            tiers,
            action: self.action,
            count: self.count,
            dry_run: self.dry_run,
            window: self.window,
            handshake_window: self.handshake_window,
            agent_port: self.agent_port,
        })
    }

    /// The controller settings and the starting limit, checked for consistency.
    pub fn control(&self) -> Result<(ControlConfig, u32), String> {
        let algo = match (self.algo, self.limit) {
            (None, Some(_)) | (Some(Algo::Fixed), _) => Algo::Fixed,
            (None, None) => Settings::default().algo,
            (Some(algo), Some(_)) => {
                return Err(format!(
                    "--limit sets a fixed limit, but --algo {algo} adapts it: use --initial-limit to start {algo} from a value"
                ));
            }
            (Some(algo), None) => algo,
        };
        check_count_algo(self.count, algo)?;
        control_config(algo, self.min_limit, self.max_limit, self.window, self.percentile, &self.guards)
            .map(|c| (c, self.limit.or(self.initial_limit).unwrap_or(Settings::default().initial_limit)))
            .and_then(|(c, limit)| {
                if algo != Algo::Fixed && !(c.min_limit..=c.max_limit).contains(&limit) {
                    return Err(format!(
                        "--initial-limit {limit} is outside --min-limit {} .. --max-limit {}",
                        c.min_limit, c.max_limit
                    ));
                }
                Ok((c, limit))
            })
    }
}

/// Whether a limiter can run on what a port's count mode measures.
pub(crate) fn check_count_algo(count: Count, algo: Algo) -> Result<(), String> {
    if count == Count::Multiplexed && algo.follows_turns() {
        return Err(format!(
            "--algo {algo} follows request latency (arrival to answer), which a multiplexed connection (--count multiplexed) does not show: use --algo queue, a fixed --limit, or --count connections"
        ));
    }
    Ok(())
}

/// Controller settings as the daemon reads them from the map.
pub(crate) fn control_config(
    algo: Algo,
    min_limit: u32,
    max_limit: u32,
    window: Duration,
    percentile: u8,
    guards: &GuardArgs,
) -> Result<ControlConfig, String> {
    if min_limit > max_limit {
        return Err(format!("--min-limit {min_limit} is above --max-limit {max_limit}"));
    }
    Ok(ControlConfig {
        min_samples: guards.min_samples,
        cooldown_windows: guards.cooldown,
        baseline_windows: guards.baseline_span,
        probe_windows: guards.probe_windows,
        queue_target_us: guards.queue_target.as_micros() as u32,
        target_latency_ms: guards.target_latency.map_or(0, |d| d.as_millis() as u32),
        generation: 1,
        algo: algo.to_raw(),
        percentile,
        _pad: [0; 2],
        min_limit,
        max_limit,
        window_ms: window.as_millis() as u32,
        requested_limit: 0,
    })
}

/// The adaptive controllers' guards (see `shed::control`); the defaults suit most services.
#[derive(Clone, Debug, Args)]
pub struct GuardArgs {
    /// Completed requests a window needs before the limit may move; fewer carry over (--min-samples 10).
    #[arg(help_heading = "Controller", long, default_value_t = Settings::default().min_samples as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub min_samples: u32,

    /// Windows after a cut in which the limit may not grow (--cooldown 3).
    #[arg(help_heading = "Controller", long, default_value_t = Settings::default().cooldown_windows, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub cooldown: u32,

    /// Windows the baseline minimum spans, +/-10% jitter per port (--baseline-span 100).
    #[arg(help_heading = "Controller", long, default_value_t = Settings::default().baseline_windows as u32, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub baseline_span: u32,

    /// Windows of each baseline probe at a quarter of the limit; 0 turns probing off (--probe-windows 5).
    #[arg(help_heading = "Controller", long, default_value_t = Settings::default().probe_windows, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    pub probe_windows: u32,

    /// --algo queue: milliseconds of queue wait (arrival to pick-up, at --percentile) to hold
    /// admitted requests near (--queue-target 5).
    #[arg(help_heading = "Controller", long, default_value = "5", value_parser = |s: &str| parse_millis(s, 1, 10_000))]
    pub queue_target: Duration,

    /// Latency objective in milliseconds: what a request may take, waiting included (a client
    /// deadline). Requests the service can still answer within it are admitted, so bursts it
    /// can finish in time get in; latency within it is no reason to cut. It is also a bound
    /// (--algo queue): once the rate the service keeps up is measured, in-flight is held to
    /// that rate x the objective (Little's law), whatever the other signals say. Before that,
    /// the initial limit applies (--target-latency 1000). Default: none.
    #[arg(help_heading = "Controller", long, value_parser = |s: &str| parse_millis(s, 1, 600_000))]
    pub target_latency: Option<Duration>,
}

/// The namespace label `--netns` or `--pod` chooses (None: every gate).
pub(crate) fn chosen_netns(netns: Option<String>, pod: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(pod) = pod else { return Ok(netns) };
    crate::host::paths::label_of_pod(pod).map(Some).ok_or_else(|| {
        anyhow::anyhow!("no gated pod {pod}: `shedctl pods` shows the node's pods and which of them ask for a gate")
    })
}

#[derive(Debug, Args)]
pub struct PodsArgs {
    /// The container runtime's CRI socket; auto: the first there of containerd's, CRI-O's,
    /// and k3s's or RKE2's (--cri-socket /run/containerd/containerd.sock).
    #[arg(long, default_value = crate::host::cri::DEFAULT_SOCKET)]
    pub cri_socket: PathBuf,

    /// Print a JSON list, one object per pod (--json).
    #[arg(long)]
    pub json: bool,

    /// The node agent's config file: a pod's annotations lie over its settings, as the
    /// agent applies them (--config /etc/shed/shed.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Only this port (--port 8080).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_port)]
    pub port: Option<u16>,

    /// With several namespaces gated: only this one, by its label in `shedctl stats` (--netns web).
    #[arg(long)]
    pub netns: Option<String>,

    /// A pod's gate (`attach --pods`), by the pod's namespace and name (--pod default/web).
    #[arg(long, conflicts_with = "netns")]
    pub pod: Option<String>,

    /// Print a JSON list, one object per port (--json).
    #[arg(long)]
    pub json: bool,

    /// Refresh until interrupted (--watch).
    #[arg(long)]
    pub watch: bool,

    /// Milliseconds between the two samples that give the rates, and between refreshes (--interval 1000).
    #[arg(long, default_value = "500", value_parser = |s: &str| parse_millis(s, 50, 60_000))]
    pub interval: Duration,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Only this port (--port 8080).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_port)]
    pub port: Option<u16>,

    /// With several namespaces gated: only this one, by its label in `shedctl stats` (--netns web).
    #[arg(long)]
    pub netns: Option<String>,

    /// A pod's gate (`attach --pods`), by the pod's namespace and name (--pod default/web).
    #[arg(long, conflicts_with = "netns")]
    pub pod: Option<String>,

    /// Milliseconds between refreshes (--interval 250). Default: the ports' control window.
    #[arg(long, value_parser = |s: &str| parse_millis(s, 50, 60_000))]
    pub interval: Option<Duration>,

    /// Print one frame as text and exit (two samples, one interval apart), for scripts and reports (--once).
    #[arg(long)]
    pub once: bool,

    /// Samples --once takes (one interval apart) before it prints, so the sparklines have history (--samples 60).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=10_000), requires = "once")]
    pub samples: u32,

    /// Size of the --once frame (--size 110x24).
    #[arg(long, default_value = "110x24", value_parser = parse_size, requires = "once")]
    pub size: (u16, u16),
}

/// `COLSxROWS`, e.g. 110x24.
fn parse_size(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?} is not a size: give COLUMNSxROWS, e.g. 110x24 (at least 40x10)");
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let (w, h): (u16, u16) = (w.trim().parse().map_err(|_| bad())?, h.trim().parse().map_err(|_| bad())?);
    if w < 40 || h < 10 {
        return Err(bad());
    }
    Ok((w, h))
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("change").required(true).multiple(true).args(["limit", "action", "dry_run", "algo", "min_limit", "max_limit", "count", "shares", "tier_actions", "client_cap", "client_share", "retry_after", "no_dry_run"])))]
pub struct SetArgs {
    /// The protected port to change (--port 8080).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_port, required_unless_present = "all")]
    pub port: Option<u16>,

    /// Every port of every gate, pods included, with --dry-run or --dry-run=off only: the
    /// global dry-run, which gates that start while it is on start in too (--all --dry-run).
    #[arg(long, conflicts_with_all = ["port", "netns", "pod", "limit", "action", "algo", "min_limit", "max_limit", "count", "shares", "tier_actions", "client_cap", "client_share", "retry_after", "json"])]
    pub all: bool,

    /// With several namespaces gated: change the port only in this one (--netns web); without it, in every one.
    #[arg(long)]
    pub netns: Option<String>,

    /// A pod's gate (`attach --pods`), by the pod's namespace and name (--pod default/web).
    #[arg(long, conflicts_with = "netns")]
    pub pod: Option<String>,

    /// The limit, now (--limit 50); adaptive controllers continue from it.
    #[arg(long, value_parser = parse_limit)]
    pub limit: Option<u32>,

    /// Switch limiter (--algo aimd); the current limit is kept.
    #[arg(long, value_parser = named::<Algo>())]
    pub algo: Option<Algo>,

    /// New lowest adaptive limit (--min-limit 8).
    #[arg(long, value_parser = parse_limit)]
    pub min_limit: Option<u32>,

    /// New highest adaptive limit (--max-limit 500).
    #[arg(long, value_parser = parse_limit)]
    pub max_limit: Option<u32>,

    /// What in-flight counts (--count connections).
    #[arg(long, value_parser = named::<Count>())]
    pub count: Option<Count>,

    /// Share of the limit a tier may fill, in (0, 1]; repeat (--share low=0.6 --share normal=0.85).
    #[arg(long = "share", value_parser = parse_share)]
    pub shares: Vec<(u8, u16)>,

    /// Reject action for one tier; repeat (--tier-action low=drop).
    #[arg(long = "tier-action", value_parser = parse_tier_action)]
    pub tier_actions: Vec<(u8, Action)>,

    /// Most connections one client may hold; 0 removes the cap (--client-cap 20).
    #[arg(long, value_parser = parse_client_cap)]
    pub client_cap: Option<u32>,

    /// Percent of the limit one client may hold while others are refused; 0: none (--client-share 50).
    #[arg(long, value_parser = parse_client_share)]
    pub client_share: Option<u8>,

    /// Seconds the `http` action's 503 tells clients to wait; 0: derived from the controller (--retry-after 5).
    #[arg(long, value_parser = parse_retry_after)]
    pub retry_after: Option<u16>,

    /// New reject action (--action rst).
    #[arg(long, value_parser = named::<Action>())]
    pub action: Option<Action>,

    /// Dry-run on, as attach says it: count what would be refused, admit everything
    /// (--dry-run; an explicit --dry-run on|off is read too).
    #[arg(long, num_args = 0..=1, default_missing_value = "on")]
    pub dry_run: Option<Switch>,

    /// Dry-run off, as attach says it (--no-dry-run).
    #[arg(long, conflicts_with = "dry_run")]
    pub no_dry_run: bool,

    /// Print the port as it now is, a JSON list with one object per namespace
    /// changed, in `stats --json`'s fields (--json).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Stop gating only this port (--port 8080); without it the whole gate stops.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_port)]
    pub port: Option<u16>,

    /// With --port and several namespaces gated: only in this one (--netns web); without it, in every one.
    #[arg(long, requires = "port")]
    pub netns: Option<String>,

    /// Stop gating one pod of a node agent (`attach --pods`), every port of it, by the
    /// pod's namespace and name (--pod default/web); it stays ungated until the agent restarts.
    #[arg(long, conflicts_with_all = ["port", "netns", "now"])]
    pub pod: Option<String>,

    /// The emergency off: every gate goes at once, pods included, with no handover to a
    /// next agent (a node agent's SIGTERM leaves its pods judged for the next one for up
    /// to a minute); links left by an agent that already stopped go too (--now).
    #[arg(long, conflicts_with_all = ["port", "netns"])]
    pub now: bool,

    /// Milliseconds to wait for the daemon to exit (--timeout 5000).
    #[arg(long, default_value = "5000", value_parser = |s: &str| parse_millis(s, 100, 600_000))]
    pub timeout: Duration,
}

/// Every setting has one name on `attach`, `set` and in the config file (see
/// [`crate::observe::vocabulary`]).
#[cfg(test)]
mod vocabulary_tests {
    use clap::CommandFactory as _;

    use super::Cli;
    use crate::observe::vocabulary::{Kind, TERMS, flag, rule_broken};

    fn flags_of(verb: &str) -> Vec<String> {
        let cli = Cli::command();
        let sub = cli.find_subcommand(verb).unwrap_or_else(|| panic!("no verb {verb}"));
        sub.get_arguments().filter_map(|a| a.get_long().map(str::to_owned)).collect()
    }

    #[test]
    fn every_term_follows_the_naming_rules() {
        let broken: Vec<String> = TERMS.iter().filter_map(rule_broken).collect();
        assert!(broken.is_empty(), "{broken:#?}");
        let mut names: Vec<&str> = TERMS.iter().map(|t| t.json).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TERMS.len(), "a JSON name twice");
    }

    #[test]
    fn every_setting_is_one_name_on_attach_set_and_in_the_config_file() {
        let (attach, set) = (flags_of("attach"), flags_of("set"));
        for term in TERMS {
            let Kind::Setting { live } = term.kind else { continue };
            let flag = flag(term.json);
            assert!(attach.contains(&flag), "attach has no --{flag} (stats --json says {})", term.json);
            assert_eq!(set.contains(&flag), live, "`set --{flag}`: live is {live} for {}", term.json);
            assert!(crate::cli::config::has_key(&flag), "config file has no key `{flag}`");
        }
        // And the other way: every attach flag is a config key of the same name,
        // but for lists (a plural key) and flags about the command line itself.
        let command_line_only = ["config", "print-config", "no-dry-run", "help"];
        for flag in attach.iter().filter(|f| !command_line_only.contains(&f.as_str())) {
            let key = match flag.as_str() {
                "port" | "iface" => format!("{flag}s"),
                "tier" => "tiers".to_owned(),
                other => other.to_owned(),
            };
            assert!(crate::cli::config::has_key(&key), "--{flag} has no config key `{key}`");
        }
        // Every `set` flag is a setting of attach too, under the same name.
        for flag in set
            .iter()
            // `all` chooses every gate, as port, netns and pod choose one: no setting.
            .filter(|f| !["port", "netns", "pod", "all", "help", "share", "tier-action", "json"].contains(&f.as_str()))
        {
            assert!(attach.contains(flag), "set --{flag} is not an attach flag");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("shedctl").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `attach --help` is long: every flag falls under a heading, and the
    /// headings are these.
    #[test]
    fn attach_help_is_grouped_under_headings() {
        let mut cli = Cli::command();
        let attach = cli.find_subcommand_mut("attach").unwrap();
        let help = attach.render_long_help().to_string();
        let headings: Vec<&str> =
            help.lines().filter_map(|l| l.strip_suffix(':')).filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(
            headings,
            [
                "Options",
                "Config file",
                "Ports and limits",
                "Pods (node agent)",
                "Interfaces and namespaces",
                "Refusal",
                "Controller",
                "Clients and tiers",
                "Metrics, health and logs",
                "Memory and maps",
            ],
            "{help}"
        );
        let unheaded: Vec<String> = attach
            .get_arguments()
            .filter(|a| a.get_id() != "help" && a.get_help_heading().is_none())
            .map(|a| format!("--{}", a.get_long().unwrap_or_default()))
            .collect();
        assert!(unheaded.is_empty(), "attach flags under no heading: {unheaded:?}");
    }

    /// No help text describes the SYN-era gate, which judged SYNs only: a
    /// help that names a SYN names what else is judged (the handshake-completing
    /// ACK, a kept-alive connection's request), but for the parser's drop of
    /// headers that could hide a SYN.
    #[test]
    fn no_help_says_the_gate_judges_only_syns() {
        fn texts(cmd: &clap::Command, out: &mut Vec<(String, String)>) {
            let name = cmd.get_name().to_owned();
            for about in [cmd.get_about(), cmd.get_long_about()].into_iter().flatten() {
                out.push((name.clone(), about.to_string()));
            }
            for arg in cmd.get_arguments() {
                for help in [arg.get_help(), arg.get_long_help()].into_iter().flatten() {
                    out.push((format!("{name} --{}", arg.get_long().unwrap_or_default()), help.to_string()));
                }
            }
            for sub in cmd.get_subcommands() {
                texts(sub, out);
            }
        }
        let mut all = Vec::new();
        texts(&Cli::command(), &mut all);
        assert!(all.len() > 100, "only {} help texts found", all.len());
        let syn_era: Vec<String> = all
            .iter()
            .filter(|(_, text)| {
                let rest = text.replace("could hide a SYN", "");
                rest.contains("SYN") && !rest.contains("ACK") && !rest.contains("request")
            })
            .map(|(what, text)| format!("{what}: {text}"))
            .collect();
        assert!(syn_era.is_empty(), "help that says the gate judges SYNs only:\n{}", syn_era.join("\n"));
        for phrase in ["rejected SYN", "next SYN", "refused SYN"] {
            let found: Vec<&String> = all.iter().filter(|(_, t)| t.contains(phrase)).map(|(w, _)| w).collect();
            assert!(found.is_empty(), "{phrase:?} in the help of {found:?}");
        }
    }

    /// The README opens with the kernels shed runs on (the oldest `attach`
    /// accepts) and, while Debian 12's own 6.1 is refused, its way to a newer
    /// one; and it promises nothing the gate refuses or does not do.
    #[test]
    fn the_readme_opens_with_the_kernels_shed_runs_on() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let head = readme.lines().take(20).collect::<Vec<_>>().join(" ");
        let ((major, minor), _) = crate::host::system::KERNEL_FEATURES[0];
        assert!(head.contains(&format!("Linux {major}.{minor} or newer")), "the README's first lines: {head}");
        let debian_12_refused = crate::host::system::check_kernel_release("6.1.0-28-amd64").is_err();
        for route in ["Debian 12", "bookworm-backports", "linux-image-amd64"] {
            assert_eq!(head.contains(route), debian_12_refused, "{route} in the README's first lines: {head}");
        }
        if debian_12_refused {
            assert!(!readme.contains("fresh Debian 12"), "the README promises a Debian 12 whose kernel attach refuses");
        }
        let words = readme.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
        assert!(
            !words.contains("connections are never touched"),
            "every new request on a kept-alive connection is judged"
        );
    }

    #[test]
    fn the_http_action_is_refused_on_tls_ports_and_takes_a_retry_after() {
        let attach = |args: &[&str]| {
            let Command::Attach(a) = parse(&[&["attach"], args].concat()).unwrap().command else {
                unreachable!("attach")
            };
            a
        };
        let (spec, _) = attach(&["--port", "8080", "--action", "http", "--retry-after", "30"]).plan().unwrap();
        let e =
            attach(&["--port", "8080", "--action", "http", "--count", "multiplexed"]).plan().unwrap_err().to_string();
        assert!(e.contains("HTTP/2") && e.contains("--action rst"), "{e}");
        assert_eq!((spec.action, spec.retry_after_s), (shed_common::action::HTTP, 30));
        let e = attach(&["--port", "8080", "--port", "443", "--action", "http"]).plan().unwrap_err().to_string();
        assert!(e.contains("port 443 is served over TLS") && e.contains("--action rst"), "{e}");
        assert!(attach(&["--port", "443", "--action", "rst"]).plan().is_ok(), "rst answers TLS ports");
        let e = parse(&["attach", "--port", "80", "--retry-after", "1000"]).unwrap_err().to_string();
        assert!(e.contains("from 1 to 999"), "{e}");
        assert_eq!(crate::cli::tiers::parse_tier_action("low=http"), Ok((shed_common::tier::LOW, Action::Http)));
    }

    /// OPERATIONS' inventories are the code's: every `attach` flag is named
    /// in its `attach` section, every config key in its list of keys.
    #[test]
    fn the_operations_guide_names_every_attach_flag_and_config_key() {
        let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/OPERATIONS.md")).unwrap();
        let section = |from: &str, to: &str| {
            let start = guide.find(from).unwrap_or_else(|| panic!("OPERATIONS has no {from}"));
            let end = guide[start..].find(to).map_or(guide.len(), |e| start + e);
            guide[start..end].to_owned()
        };
        let attach_section = section("## `attach`", "\n## ");
        let keys_section = section("Every key:", "\n\n");
        let cli = Cli::command();
        let attach = cli.find_subcommand("attach").unwrap();
        let missing: Vec<String> = attach
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|&flag| flag != "help" && !attach_section.contains(&format!("`--{flag}")))
            .map(str::to_owned)
            .collect();
        assert!(missing.is_empty(), "attach flags OPERATIONS' `attach` section does not name: {missing:?}");
        let missing: Vec<&str> =
            crate::cli::config::keys().filter(|k| !keys_section.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty(), "config keys OPERATIONS' \"Every key\" list does not name: {missing:?}");
    }

    /// `--print-config` prints only what `attach` would run: a plan it
    /// refuses is refused here too (exit non-zero, nothing printed).
    #[test]
    fn print_config_refuses_what_attach_refuses() {
        let printed = |args: &[&str]| {
            let Command::Attach(a) = parse(&[&["attach", "--print-config"], args].concat()).unwrap().command else {
                unreachable!("attach")
            };
            crate::cli::commands::attach::printed_config(&a).map_err(|e| e.to_string())
        };
        let e = printed(&["--port", "443", "--action", "http"]).unwrap_err();
        assert!(e.contains("port 443 is served over TLS"), "{e}");
        let e = printed(&["--config", "/dev/null", "--action", "rst"]).unwrap_err();
        assert!(e.contains("no port to protect"), "{e}");
        let e = printed(&["--port", "8080", "--action", "http", "--count", "multiplexed"]).unwrap_err();
        assert!(e.contains("HTTP/2"), "{e}");
        let ok = printed(&["--port", "8080", "--action", "http"]).unwrap();
        assert!(ok.contains("action = \"http\""), "{ok}");
    }

    #[test]
    fn more_ports_than_a_gate_holds_are_refused_at_the_plan() {
        let max = shed_common::capacity::MAX_PORTS as u16;
        let attach = |n: u16| {
            let ports: Vec<String> = (0..n).flat_map(|i| ["--port".to_string(), (8000 + i).to_string()]).collect();
            let mut args = vec!["attach"];
            args.extend(ports.iter().map(String::as_str));
            // A port given twice counts once.
            args.extend(["--port", "8000"]);
            let Command::Attach(a) = parse(&args).unwrap().command else { unreachable!("attach") };
            a
        };
        assert!(attach(max).plan().is_ok());
        let e = attach(max + 1).plan().unwrap_err().to_string();
        assert!(e.contains(&format!("at most {max} ports")), "{e}");
    }

    #[test]
    fn attach_parses_everything() {
        let cli = parse(&[
            "attach",
            "--port",
            "8080",
            "--port",
            "9090",
            "--iface",
            "veth0",
            "--hook",
            "tc",
            "--action",
            "rst",
            "--limit",
            "5",
            "--dry-run",
            "--netns",
            "srv",
        ])
        .unwrap();
        let Command::Attach(a) = cli.command else { panic!("expected attach") };
        assert_eq!(a.ports, [8080, 9090]);
        assert_eq!(a.ifaces, ["veth0"]);
        assert_eq!((a.hook, a.action, a.limit, a.dry_run), (Some(Hook::Tc), Action::Rst, Some(5), true));
        assert_eq!(a.control().unwrap().0.algo, Algo::Fixed.to_raw(), "--limit alone means fixed");
        assert_eq!(a.netns, ["srv"]);
    }

    #[test]
    fn attach_defaults() {
        let Command::Attach(a) = parse(&["attach", "--port", "8080"]).unwrap().command else { panic!() };
        assert_eq!((a.hook, a.action, a.limit, a.dry_run, a.count), (None, Action::Drop, None, false, Count::Work));
        assert_eq!(a.handshake_window, Duration::ZERO);
        let (control, limit) = a.control().unwrap();
        assert_eq!(
            (Algo::from_raw(control.algo), limit, control.window_ms, control.percentile),
            (Algo::Queue, 100, 100, 90)
        );
    }

    /// The README's table of defaults says what `attach` does when not told.
    #[test]
    fn the_readme_s_defaults_are_attach_s() {
        use crate::named::Named as _;
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let table: Vec<(String, String)> = readme
            .lines()
            .skip_while(|l| !l.starts_with("### Defaults"))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells.len() > 3 && cells[1].starts_with("`--")).then(|| (cells[1].to_owned(), cells[2].to_owned()))
            })
            .collect();
        let Command::Attach(a) = parse(&["attach", "--port", "8080"]).unwrap().command else { panic!() };
        let (control, _) = a.control().unwrap();
        let actual = |flag: &str| -> String {
            match flag {
                "`--action`" => format!("`{}`", a.action.name()),
                "`--algo`" => format!("`{}`", Algo::from_raw(control.algo).name()),
                "`--count`" => format!("`{}`", a.count.name()),
                "`--client-share`" => format!("{}%", a.client_share),
                "`--metrics`, `/healthz`, `/readyz`" => if a.metrics.is_none() { "off" } else { "on" }.to_owned(),
                "`--agent-port`" => if a.agent_port.is_none() { "off" } else { "on" }.to_owned(),
                "`--metrics-token-file`" => if a.metrics_token_file.is_none() { "off" } else { "on" }.to_owned(),
                "`--kernel-log`" => if a.kernel_log { "on" } else { "off" }.to_owned(),
                "`--dry-run`" => if a.dry_run { "on" } else { "off" }.to_owned(),
                other => panic!("the README's defaults name {other}: add it here"),
            }
        };
        assert!(table.len() >= 8, "the README's defaults table: {table:?}");
        for (flag, said) in &table {
            assert_eq!(said, &actual(flag), "README says {flag} defaults to {said}");
        }
    }

    #[test]
    fn adaptive_flags_are_checked_together() {
        let control = |args: &[&str]| {
            let Command::Attach(a) = parse(&[&["attach", "--port", "8080"], args].concat()).unwrap().command else {
                panic!()
            };
            a.control()
        };
        assert!(control(&["--algo", "gradient", "--limit", "5"]).unwrap_err().contains("--initial-limit"));
        assert!(control(&["--min-limit", "50", "--max-limit", "10"]).unwrap_err().contains("above --max-limit"));
        assert!(control(&["--initial-limit", "3"]).unwrap_err().contains("outside"));
        let (c, limit) =
            control(&["--algo", "aimd", "--initial-limit", "20", "--window", "250", "--percentile", "p99"]).unwrap();
        assert_eq!((Algo::from_raw(c.algo), limit, c.window_ms, c.percentile), (Algo::Aimd, 20, 250, 99));
        assert_eq!(
            (c.min_samples, c.cooldown_windows, c.baseline_windows, c.probe_windows),
            (10, 3, 100, 5),
            "guard defaults"
        );
        let (c, _) =
            control(&["--min-samples", "50", "--cooldown", "0", "--baseline-span", "300", "--probe-windows", "0"])
                .unwrap();
        assert_eq!((c.min_samples, c.cooldown_windows, c.baseline_windows, c.probe_windows), (50, 0, 300, 0));
        assert_eq!(control(&["--algo", "fixed", "--limit", "7"]).unwrap().1, 7);
        // A multiplexed port shows queue waits only: queue by default, the request-latency limiters refused.
        let (c, _) = control(&["--count", "multiplexed"]).unwrap();
        assert_eq!(Algo::from_raw(c.algo), Algo::Queue);
        assert_eq!(Algo::from_raw(control(&["--count", "multiplexed", "--limit", "9"]).unwrap().0.algo), Algo::Fixed);
        for algo in ["gradient", "gradient2", "aimd"] {
            let err = control(&["--count", "multiplexed", "--algo", algo]).unwrap_err();
            assert!(err.contains(&format!("--algo {algo}")) && err.contains("--algo queue"), "{err}");
        }
        assert!(control(&["--count", "connections", "--algo", "gradient"]).is_ok());
    }

    #[test]
    fn a_negative_port_is_out_of_range_not_an_unknown_flag() {
        for args in
            [&["attach", "--port", "-1"][..], &["set", "--port", "-1", "--limit", "3"], &["stats", "--port", "-1"]]
        {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains("port -1 is out of range: give a port from 1 to 65535"), "{args:?}: {err}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_reasons() {
        let cases: &[(&[&str], &str)] = &[
            (&["attach"], "--port"),
            (&["attach", "--port", "0"], "port 0"),
            (&["attach", "--port", "70000"], "out of range"),
            (&["attach", "--port", "8080", "--limit", "0"], "limit 0"),
            (&["attach", "--port", "8080", "--limit", "99999999"], "maximum"),
            (&["attach", "--port", "8080", "--action", "reset"], "reset"),
            (&["attach", "--port", "8080", "--hook", "kprobe"], "kprobe"),
            (&["set", "--port", "8080"], "required"),
            (&["set", "--port", "8080", "--dry-run", "maybe"], "on or off"),
            (&["stats", "--interval", "1"], "out of range"),
            (&["attach", "--port", "8080", "--algo", "vegas"], "vegas"),
            (&["attach", "--port", "8080", "--percentile", "100"], "out of range"),
            (&["attach", "--port", "8080", "--window", "5"], "out of range"),
            (&["attach", "--port", "8080", "--count", "requests"], "requests"),
            (&["attach", "--port", "8080", "--tier", "10.0.0.1/8=low"], "host bits"),
            (&["attach", "--port", "8080", "--tier", "10.0.0.0/8=gold"], "unknown tier"),
            (&["set", "--port", "8080", "--share", "low=1.5"], "outside (0, 1]"),
            (&["tier", "add", "banana", "low"], "not a CIDR"),
            (&["attach", "--port", "8080", "--client-cap", "x"], "client cap"),
            (&["attach", "--port", "8080", "--min-samples", "0"], "not in 1..=1000000"),
            (&["attach", "--port", "8080", "--baseline-span", "1"], "not in 2..=100000"),
            (&["attach", "--port", "8080", "--client-prefix-v6", "200"], "out of range"),
            (&["tier", "add", "10.0.0.0/8", "platinum"], "unknown tier"),
            (&["top", "--once", "--size", "10x2"], "not a size"),
            (&["top", "--size", "110x24"], "--once"),
            (&["top", "--once", "--samples", "1"], "not in 2..=10000"),
            (&["attach", "--port", "8080", "--metrics", "9464"], "not a listen address"),
        ];
        for (args, expected) in cases {
            let err = parse(args).expect_err(&format!("{args:?} must be refused")).to_string();
            assert!(err.contains(expected), "{args:?}: expected {expected:?} in {err}");
        }
    }

    #[test]
    fn set_and_detach() {
        let Command::Set(s) = parse(&["set", "--port", "8080", "--dry-run", "off", "--limit", "7"]).unwrap().command
        else {
            panic!()
        };
        assert_eq!((s.port, s.limit, s.action, s.dry_run), (Some(8080), Some(7), None, Some(Switch(false))));
        // One syntax with attach: --dry-run alone turns it on, --no-dry-run off.
        let set = |args: &[&str]| match parse(&[&["set", "--port", "8080"], args].concat()).map(|c| c.command) {
            Ok(Command::Set(s)) => Ok((s.dry_run, s.no_dry_run, s.limit)),
            Ok(_) => unreachable!("set"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(set(&["--dry-run", "--limit", "7"]), Ok((Some(Switch(true)), false, Some(7))));
        assert_eq!(set(&["--no-dry-run"]), Ok((None, true, None)));
        assert!(set(&["--dry-run", "--no-dry-run"]).unwrap_err().contains("cannot be used with"));
        let Command::Detach(d) = parse(&["detach"]).unwrap().command else { panic!() };
        assert_eq!(d.port, None);
    }
}
