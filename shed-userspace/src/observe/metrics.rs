// SPDX-License-Identifier: MIT OR Apache-2.0
//! The Prometheus endpoint (`shedctl attach --metrics ADDR`): every scrape
//! reads the pinned maps and encodes them with `prometheus-client` in the
//! Prometheus text format. The values are those of `shedctl stats --json`
//! (both are built from [`PortStats`]), plus the latency histograms and the
//! controller's decisions, which only the daemon sees.
use std::net::{SocketAddr, TcpListener};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};
use shed_common::{PortLatency, latency, tier};

use crate::{
    control::Reason,
    error::Error,
    kernel::maps::GateMaps,
    observe::report::{Decisions, HealCounts, HealReport, Heartbeat, NatReport, NatSeen, PassReason, TaskErrors},
    observe::stats::{PortStats, TierStats, json_name},
};

/// The Content-Type of the Prometheus text exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram bucket edges in microseconds: powers of two from 16 us to 33.5 s.
/// Each is an edge of the kernel's log-linear buckets, so the counts are exact.
const EDGES_US: std::ops::RangeInclusive<u32> = 4..=25;

/// One port as a scrape sees it.
#[derive(Debug)]
pub(crate) struct PortMetrics {
    pub stats: PortStats,
    pub latency: PortLatency,
    pub decisions: Vec<(Reason, u64)>,
    /// A netfilter NAT statement takes this port past the gate.
    pub nat_bypassed: bool,
}

/// Everything one scrape reports; a [`Collector`] built anew per scrape.
#[derive(Debug)]
pub(crate) struct Scrape {
    /// Every protected port of every namespace.
    pub ports: Vec<PortMetrics>,
    /// What is counted once per namespace's gate.
    pub gates: Vec<GateMetrics>,
    pub process: ProcessStats,
    /// Pods left ungated for an annotation they could not use: `namespace/name` and the annotation.
    pub refused_pods: Vec<(String, String)>,
    /// A node agent's pod loop: its runtime and its pods by state (None: no `--pods`).
    pub pod_loop: Option<crate::observe::endpoint::PodLoopState>,
}

/// One namespace's gate, beyond its ports.
#[derive(Debug)]
pub(crate) struct GateMetrics {
    /// The namespace's label (see [`crate::host::paths::netns_label`]).
    pub netns: String,
    /// The pod it serves (`namespace/name`), for a pod's gate.
    pub pod: Option<String>,
    /// Gate-wide counters, by [`shed_common::gate_counter`] index.
    pub gate: [u64; shed_common::gate_counter::COUNT],
    /// What the healer did.
    pub heal: HealCounts,
    /// Failures of the daemon's periodic tasks, by task.
    pub task_errors: Vec<(&'static str, u64)>,
    /// Kernel memory held by the gate's maps.
    pub bpf_memory_bytes: u64,
    /// Netfilter NAT as the gate's loop last saw it.
    pub nat: NatSeen,
    /// Since the gate's control loop last ticked (zero before its first tick).
    pub loop_age: std::time::Duration,
    /// A pod's gate at the node's dispatcher (zero for a gate that counts its own).
    pub dispatch: shed_common::dispatch::DispatchBooks,
}

/// What a scrape reads of one namespace's gate: its maps and what its control loop counts.
pub(crate) struct GateSource<'a> {
    pub netns: &'a str,
    pub pod: Option<&'a str>,
    pub maps: &'a GateMaps,
    pub decisions: &'a Decisions,
    pub heal: &'a HealReport,
    pub task_errors: &'a TaskErrors,
    pub nat: &'a NatReport,
    pub heartbeat: &'a Heartbeat,
    pub dispatch: &'a crate::observe::report::DispatchReport,
}

/// The daemon process as Prometheus' process metrics name it, from /proc/self.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub open_fds: u64,
    pub start_time_seconds: f64,
}

impl ProcessStats {
    pub(crate) fn read() -> Self {
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        let (ticks, page) = (ticks.max(1) as f64, page.max(1) as u64);
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may hold spaces): state is field 3.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok()))
            .unwrap_or(0);
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let resident_pages = statm.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        Self {
            cpu_seconds: (field(14) + field(15)) as f64 / ticks,
            resident_bytes: resident_pages * page,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
            start_time_seconds: boot as f64 + field(22) as f64 / ticks,
        }
    }
}

impl Scrape {
    /// Reads every protected port of every namespace's gate.
    pub(crate) fn read(sources: &[GateSource], refused_pods: Vec<(String, String)>) -> Result<Self, Error> {
        let (mut ports, mut gates) = (Vec::new(), Vec::new());
        for source in sources {
            let maps = source.maps;
            let nat = source.nat.read();
            for snapshot in maps.snapshots(None)? {
                let mut stats = PortStats::new(&snapshot, None);
                source.netns.clone_into(&mut stats.netns);
                stats.pod = source.pod.map(str::to_owned);
                ports.push(PortMetrics {
                    stats,
                    latency: maps.latency(snapshot.config.slot)?,
                    decisions: source.decisions.of(snapshot.port),
                    nat_bypassed: nat.bypassed.contains_key(&snapshot.port),
                });
            }
            gates.push(GateMetrics {
                netns: source.netns.to_owned(),
                pod: source.pod.map(str::to_owned),
                gate: maps.gate_counters()?,
                heal: source.heal.read(),
                task_errors: source.task_errors.counts(),
                bpf_memory_bytes: maps.memory_bytes(),
                nat,
                loop_age: source.heartbeat.age().unwrap_or_default(),
                dispatch: source.dispatch.books(),
            });
        }
        Ok(Self { ports, gates, process: ProcessStats::read(), refused_pods, pod_loop: None })
    }

    /// The Prometheus text exposition.
    pub(crate) fn encode(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

type Labels = Vec<(&'static str, String)>;

/// Picks one of a port's three latency histograms.
type Buckets = fn(&PortLatency) -> &[u64; latency::BUCKETS];

fn port_label(stats: &PortStats) -> Labels {
    let mut labels = vec![("netns", stats.netns.clone())];
    labels.extend(pod_labels(stats.pod.as_deref()));
    labels.push(("port", stats.port.to_string()));
    labels
}

fn netns_label(gate: &GateMetrics) -> Labels {
    let mut labels = vec![("netns", gate.netns.clone())];
    labels.extend(pod_labels(gate.pod.as_deref()));
    labels
}

/// A pod's gate's `namespace` and `pod` labels (none for the node's own gates).
fn pod_labels(pod: Option<&str>) -> Labels {
    let Some((namespace, name)) = pod.and_then(|p| p.split_once('/')) else { return Vec::new() };
    vec![("namespace", namespace.to_owned()), ("pod", name.to_owned())]
}

fn with(mut labels: Labels, key: &'static str, value: impl ToString) -> Labels {
    labels.push((key, value.to_string()));
    labels
}

fn micros(us: u64) -> f64 {
    us as f64 / 1e6
}

/// A family of one figure per series: name, help, type, and the figure of
/// each source (a port's stats, a gate's, a tier's, the process's).
type Figure<T, V> = (&'static str, &'static str, MetricType, fn(&T) -> V);

/// The per-port families of one figure each, in the order they are written
/// (the families with labels of their own follow them in [`Scrape::encode`]).
const PORT_FAMILIES: &[Figure<PortStats, u64>] = &[
    ("shed_limit", "Current concurrency limit of the port.", MetricType::Gauge, |s| s.limit.into()),
    (
        "shed_retry_after_seconds",
        "Seconds the http action's 503 tells clients to wait (Retry-After): the port's --retry-after, else derived from the queue wait.",
        MetricType::Gauge,
        |s| s.retry_after.into(),
    ),
    ("shed_min_limit", "Lowest limit the adaptive controller may set (--min-limit).", MetricType::Gauge, |s| {
        s.min_limit.into()
    }),
    ("shed_max_limit", "Highest limit the adaptive controller may set (--max-limit).", MetricType::Gauge, |s| {
        s.max_limit.into()
    }),
    (
        "shed_in_flight",
        "What the limit is compared with: admissions not yet at work plus busy (count=work) or established (count=connections) connections.",
        MetricType::Gauge,
        |s| s.in_flight,
    ),
    ("shed_syn_seen", "SYNs seen for the port.", MetricType::Counter, |s| s.syn_seen),
    ("shed_admitted", "Connections admitted at their handshake-completing ACK.", MetricType::Counter, |s| s.admitted),
    (
        "shed_trickle_admitted",
        "Connections and requests admitted past a full tier share by the anti-starvation trickle.",
        MetricType::Counter,
        |s| s.trickle_admitted,
    ),
    (
        "shed_rst_sent",
        "Resets sent to refused SYNs, handshake-completing ACKs and kept-alive requests.",
        MetricType::Counter,
        |s| s.rst_sent,
    ),
    (
        "shed_http_syn_acks",
        "SYN-ACKs with a cookie sent to SYNs the http action refused (the gate completes the handshake itself).",
        MetricType::Counter,
        |s| s.http_syn_acks,
    ),
    (
        "shed_http_answers",
        "Requests the http action answered with 503 and Retry-After (a retransmitted request again).",
        MetricType::Counter,
        |s| s.http_answers,
    ),
    (
        "shed_http_not_http",
        "Segments on an http refusal's handshake that were not HTTP/1.x (TLS, HTTP/2, a FIN first): reset.",
        MetricType::Counter,
        |s| s.http_not_http,
    ),
    (
        "shed_http_bad_cookies",
        "ACKs to an http port that found no socket and carried no valid cookie: left to the kernel, which resets them.",
        MetricType::Counter,
        |s| s.http_bad_cookies,
    ),
    (
        "shed_rst_failed",
        "Resets the gate could not build (the refused segment was dropped instead).",
        MetricType::Counter,
        |s| s.rst_failed,
    ),
    (
        "shed_rst_rate_limited",
        "Refused segments dropped instead of answered because an RST cap was reached (the http action's answers spend the same caps).",
        MetricType::Counter,
        |s| s.rst_rate_limited,
    ),
    (
        "shed_would_reject",
        "Dry-run: connections and requests enforce mode would have shed (they were admitted).",
        MetricType::Counter,
        |s| s.would_reject,
    ),
    ("shed_dry_run", "1 while the port is in dry-run.", MetricType::Gauge, |s| s.dry_run.into()),
    (
        "shed_not_local",
        "SYNs to the port, and ACKs to an http port that found no socket, not addressed to this namespace (forwarded, or leaving local containers): passed untouched.",
        MetricType::Counter,
        |s| s.not_local,
    ),
    (
        "shed_handshakes_lapsed",
        "Handshake reservations (taken at the ACK) that lapsed without the kernel establishing the connection (the kernel dropped the ACK: a full accept queue, a bad checksum).",
        MetricType::Counter,
        |s| s.handshakes_lapsed,
    ),
    (
        "shed_idle_expired",
        "Work-mode connections that sent nothing for the whole idle grace and stopped counting in flight.",
        MetricType::Counter,
        |s| s.idle_expired,
    ),
    (
        "shed_late_completed",
        "Handshakes that completed after their reservation lapsed (counted from then on).",
        MetricType::Counter,
        |s| s.late_completed,
    ),
    (
        "shed_syn_passed",
        "SYNs passed to the kernel holding nothing, because the port had room (their handshake-completing ACK is judged).",
        MetricType::Counter,
        |s| s.syn_passed,
    ),
    (
        "shed_refused_at_ack",
        "Connections refused at their handshake-completing ACK (the port filled after their SYN passed); also in shed_rejected_total.",
        MetricType::Counter,
        |s| s.refused_at_ack,
    ),
    (
        "shed_refused_requests",
        "Requests refused on kept-alive connections at their first segment (the service never read them); also in shed_rejected_total.",
        MetricType::Counter,
        |s| s.refused_requests,
    ),
    (
        "shed_requests_admitted",
        "Requests on kept-alive connections judged at their first segment and admitted.",
        MetricType::Counter,
        |s| s.requests_admitted,
    ),
    (
        "shed_refused_requests_again",
        "Retransmissions of a refused request's first segment, given the same answer (not counted again as refusals).",
        MetricType::Counter,
        |s| s.refused_requests_again,
    ),
    (
        "shed_abandoned",
        "Requests whose connection closed (a client's reset, or destroyed) while they owed an answer; the controller counts them as work the service held, at their age.",
        MetricType::Counter,
        |s| s.abandoned,
    ),
    (
        "shed_rst_suppressed",
        "Resets withheld because the source cannot be a real client (multicast, broadcast, own address from outside).",
        MetricType::Counter,
        |s| s.rst_suppressed,
    ),
    (
        "shed_client_map_full",
        "Connections not counted against their client's cap because the client map was full (fail-open).",
        MetricType::Counter,
        |s| s.client_map_full,
    ),
    (
        "shed_connection_map_full",
        "Connections not counted at all because the connection map was full (fail-open; --max-connections).",
        MetricType::Counter,
        |s| s.connection_map_full,
    ),
    ("shed_drift_corrected", "Connections corrected against the kernel's socket table.", MetricType::Counter, |s| {
        s.drift_corrected
    }),
    (
        "shed_stalled_closed",
        "Requests closed because a client over its share of a contended port had its server sit on them unanswered for a second.",
        MetricType::Counter,
        |s| s.stalled_closed,
    ),
    (
        "shed_refused_closed",
        "Sockets of requests refused on kept-alive connections that the daemon closed (rst and http refusals), so the service holds no descriptor for them.",
        MetricType::Counter,
        |s| s.refused_closed,
    ),
    (
        "shed_listen_drops",
        "Listen-queue drops counted against the port (the namespace's, while its own accept queue was at least half full).",
        MetricType::Counter,
        |s| s.listen_drops,
    ),
    (
        "shed_accept_queue",
        "Connections waiting in the port's accept queues (its listeners' Recv-Q) at the last window's end.",
        MetricType::Gauge,
        |s| s.accept_queue.into(),
    ),
    ("shed_accept_backlog", "Capacity of the port's accept queues (the listeners' backlog).", MetricType::Gauge, |s| {
        s.accept_backlog.into()
    }),
];

/// The per-port families of one duration each, in seconds (kept in microseconds).
const PORT_SECONDS: &[Figure<PortStats, u64>] = &[
    (
        "shed_handshake_window_seconds",
        "How long an admitted handshake-completing ACK holds its slot at most, until the kernel reports the connection established.",
        MetricType::Gauge,
        |s| s.handshake_window_us,
    ),
    ("shed_baseline_seconds", "Request latency the controller treats as 'no queue'.", MetricType::Gauge, |s| {
        s.baseline_us
    }),
    (
        "shed_observed_seconds",
        "The latency percentile the controller follows, in its last window.",
        MetricType::Gauge,
        |s| s.observed_us,
    ),
];

/// The per-tier families of each port (a `tier` label).
const TIER_FAMILIES: &[Figure<TierStats, u64>] = &[
    (
        "shed_tier_admitted",
        "Connections admitted at their handshake-completing ACK, by client tier.",
        MetricType::Counter,
        |t| t.admitted,
    ),
    (
        "shed_tier_rejected",
        "Connections and requests shed (every reason, at the SYN, the ACK or a kept-alive request), by client tier.",
        MetricType::Counter,
        |t| t.rejected,
    ),
    ("shed_tier_held_back", "Slots held back from the tier while a tier above it is shed.", MetricType::Gauge, |t| {
        t.held_back.into()
    }),
];

/// The per-gate families of one figure each (a `netns` label).
const GATE_FAMILIES: &[Figure<GateMetrics, u64>] = &[
    (
        "shed_heal_checks",
        "Cheap checks of the counters between healing passes (about one a second).",
        MetricType::Counter,
        |g| g.heal.checks,
    ),
    (
        "shed_heal_records_read",
        "Per-connection records healing passes read (socket-table records and tracked sockets).",
        MetricType::Counter,
        |g| g.heal.records_read,
    ),
    (
        "shed_heal_adopt_failed",
        "Untracked connections a healing pass could not adopt because the connection map was full.",
        MetricType::Counter,
        |g| g.heal.adopt_failed,
    ),
    (
        "shed_bpf_memory_bytes",
        "Kernel memory held by the gate's maps (memlock as the kernel reports it; the connection and client maps grow with use).",
        MetricType::Gauge,
        |g| g.bpf_memory_bytes,
    ),
    (
        "shed_nat_readable",
        "1 while the gate can read its namespace's netfilter NAT rules (nft, or the legacy iptables tools), looked at every 5 s; 0: a NAT rule taking a port past the gate would go unseen (install nftables).",
        MetricType::Gauge,
        |g| u64::from(!g.nat.looked || g.nat.readable),
    ),
    (
        "shed_dispatch_followed",
        "A pod's connections the node's dispatcher follows now (each pod at most a quarter of --max-connections; 0 for a gate that counts its own).",
        MetricType::Gauge,
        |g| g.dispatch.followed,
    ),
    (
        "shed_dispatch_unfollowed",
        "A pod's connections the node's dispatcher did not follow: the pod held its quota (a quarter of --max-connections) or the table was full. Each still counts open in its gate until the healer corrects it; its requests and close go unseen.",
        MetricType::Counter,
        |g| g.dispatch.unfollowed,
    ),
    (
        "shed_later_fragments",
        "Later fragments passed (the first fragment carries the TCP header and is judged).",
        MetricType::Counter,
        |g| g.gate[shed_common::gate_counter::LATER_FRAGMENT],
    ),
    (
        "shed_unproven_acks",
        "ACKs on the 4-tuple of a handshake under way that did not acknowledge its SYN-ACK (blind forged, or stale) or fell outside its receive window (the kernel drops them): passed unjudged, holding nothing.",
        MetricType::Counter,
        |g| g.gate[shed_common::gate_counter::UNPROVEN_ACK],
    ),
];

/// The per-gate families of one duration each, in seconds.
const GATE_SECONDS: &[Figure<GateMetrics, f64>] = &[
    ("shed_heal_last_pass_seconds", "How long the last healing pass took.", MetricType::Gauge, |g| {
        g.heal.last_pass.as_secs_f64()
    }),
    (
        "shed_loop_tick_age_seconds",
        "Seconds since the gate's control loop last ticked (every 100 ms while it runs): a pod's stalled gate shows here, in its own series, and never fails the agent's /healthz.",
        MetricType::Gauge,
        |g| g.loop_age.as_secs_f64(),
    ),
];

/// The daemon process's own families (no labels), as Prometheus' client libraries name them.
const PROCESS_FAMILIES: &[Figure<ProcessStats, u64>] = &[
    ("process_resident_memory_bytes", "Resident memory of the daemon.", MetricType::Gauge, |p| p.resident_bytes),
    ("process_open_fds", "File descriptors the daemon holds open.", MetricType::Gauge, |p| p.open_fds),
];

/// The daemon process's times, in seconds.
const PROCESS_SECONDS: &[Figure<ProcessStats, f64>] = &[
    ("process_cpu_seconds", "CPU time of the daemon, user and system.", MetricType::Counter, |p| p.cpu_seconds),
    ("process_start_time_seconds", "When the daemon started, seconds since the epoch.", MetricType::Gauge, |p| {
        p.start_time_seconds
    }),
];

/// Writes each family of `table`, one series per source of `sources`.
fn figures<'a, T: 'a, V>(
    encoder: &mut DescriptorEncoder,
    table: &[Figure<T, V>],
    sources: impl Iterator<Item = (Labels, &'a T)> + Clone,
) -> Result<(), std::fmt::Error>
where
    V: Copy + prometheus_client::encoding::EncodeGaugeValue + prometheus_client::encoding::EncodeCounterValue,
{
    for &(name, help, kind, figure) in table {
        family(encoder, name, help, kind, sources.clone().map(|(labels, source)| (labels, figure(source))))?;
    }
    Ok(())
}

/// Writes one metric family: `rows` gives each series' labels and value.
fn family<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), std::fmt::Error>
where
    V: Copy + prometheus_client::encoding::EncodeGaugeValue + prometheus_client::encoding::EncodeCounterValue,
{
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in rows {
        let mut series = metric.encode_family(&labels)?;
        match kind {
            MetricType::Counter => series.encode_counter::<NoLabelSet, V, u64>(&value, None)?,
            _ => series.encode_gauge(&value)?,
        }
    }
    Ok(())
}

/// Cumulative-ready buckets `(upper edge in seconds, count)` and the
/// estimated sum (bucket midpoints: the kernel keeps counts only).
pub(crate) fn histogram(buckets: &[u64; latency::BUCKETS]) -> (Vec<(f64, u64)>, f64, u64) {
    let mut out: Vec<(f64, u64)> = EDGES_US.map(|e| (micros(1 << e), 0)).collect();
    out.push((f64::INFINITY, 0));
    let mut sum = 0.0;
    for (b, &n) in buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
        let (lo, hi) = (latency::lower_bound(b), latency::upper_bound(b).min(u64::from(u32::MAX)));
        sum += n as f64 * micros(lo + (hi - lo) / 2);
        // Every value of bucket b is below upper_bound(b) + 1 us.
        let slot = out.iter().position(|(edge, _)| micros(hi + 1) <= *edge).unwrap_or(out.len() - 1);
        out[slot].1 += n;
    }
    (out, sum, buckets.iter().sum())
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gates = || self.gates.iter().map(|g| (netns_label(g), g));
        self.encode_gate_breakdowns(&mut e)?;
        figures(&mut e, GATE_FAMILIES, gates())?;
        figures(&mut e, GATE_SECONDS, gates())?;
        let build =
            vec![("version", env!("CARGO_PKG_VERSION").to_owned()), ("commit", env!("SHED_GIT_COMMIT").to_owned())];
        family(
            &mut e,
            "shed_build_info",
            "1, with the build's version and commit as labels.",
            MetricType::Gauge,
            [(build, 1u64)],
        )?;
        let process = || std::iter::once((Labels::new(), &self.process));
        figures(&mut e, PROCESS_FAMILIES, process())?;
        figures(&mut e, PROCESS_SECONDS, process())?;

        let ports = || self.ports.iter().map(|p| (port_label(&p.stats), &p.stats));
        figures(&mut e, PORT_FAMILIES, ports())?;
        self.encode_port_breakdowns(&mut e)?;
        let tiers = || {
            self.ports.iter().flat_map(|p| {
                tier::NAMES.iter().map(move |t| (with(port_label(&p.stats), "tier", t), &p.stats.tiers[t]))
            })
        };
        figures(&mut e, TIER_FAMILIES, tiers())?;
        for &(name, help, kind, micros_of) in PORT_SECONDS {
            family(&mut e, name, help, kind, ports().map(|(labels, s)| (labels, micros(micros_of(s)))))?;
        }
        self.encode_histograms(&mut e)?;
        self.encode_port_info(&mut e)
    }
}

impl Scrape {
    /// The gate-wide families with a label of their own (a reason, a task).
    fn encode_gate_breakdowns(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(pod_loop) = &self.pod_loop {
            use crate::observe::endpoint::PodState;
            family(
                e,
                "shed_cri_up",
                "1 while the node agent's last look at the container runtime (CRI) answered, 0 while it does not (the pods gated stay gated; new pods wait).",
                MetricType::Gauge,
                std::iter::once((Vec::new(), u64::from(pod_loop.cri_up))),
            )?;
            family(
                e,
                "shed_cri_last_success_timestamp_seconds",
                "Unix time of the node agent's last successful look at the container runtime (0: none yet); /healthz fails past a minute without one.",
                MetricType::Gauge,
                std::iter::once((Vec::new(), pod_loop.last_success.map_or(0, |(_, unix)| unix as u64))),
            )?;
            let states =
                PodState::ALL.iter().zip(pod_loop.pods).map(|(s, n)| (vec![("state", s.name().to_owned())], n));
            family(
                e,
                "shed_pods",
                "The node agent's pods that ask for a gate, by state: gated (a gate judges it), waiting (its gate sets up, or it waits for room or to try again), handing_over (left judged for the next agent), refused (left ungated: an annotation it could not use, or its gate failed).",
                MetricType::Gauge,
                states,
            )?;
        }
        let refused = self.refused_pods.iter().filter_map(|(pod, key)| {
            let mut labels = pod_labels(Some(pod));
            labels.push(("annotation", key.clone()));
            (labels.len() == 3).then_some((labels, 1u64))
        });
        family(
            e,
            "shed_pod_refused",
            "1 for each pod left ungated (attach --pods): an annotation of its could not be used (the annotation), it did not fit the memory budget (memory-budget), or its gate failed and is tried again (netfilter-nat: a NAT rule in its namespace would take its connections past the gate; set-up: any other failure); the log says why.",
            MetricType::Gauge,
            refused,
        )?;
        use shed_common::gate_counter as g;
        let dropped = [
            ("tiny_fragment", g::TINY_FRAGMENT),
            ("overlapping_fragment", g::OVERLAP_FRAGMENT),
            ("ipv6_chain_unparsed", g::IPV6_CHAIN_UNPARSED),
        ]
        .into_iter()
        .flat_map(|(reason, i)| self.gates.iter().map(move |g| (with(netns_label(g), "reason", reason), g.gate[i])));
        family(
            e,
            "shed_gate_dropped",
            "Packets dropped before any port was known, because their headers could hide a SYN: tiny_fragment (first fragment without the TCP header), overlapping_fragment (TCP fragment at offset 8), ipv6_chain_unparsed (extension-header chain too long).",
            MetricType::Counter,
            dropped,
        )?;
        let passes = PassReason::ALL.iter().flat_map(|r| {
            self.gates
                .iter()
                .map(move |g| (with(netns_label(g), "reason", r.name()), g.heal.passes.get(r).copied().unwrap_or(0)))
        });
        family(
            e,
            "shed_heal_passes",
            "Healing passes (each reads every held connection), by reason: start, evidence (ports changed or the connection map was full), confirm, routine (--heal-interval).",
            MetricType::Counter,
            passes,
        )?;
        let task_errors = self
            .gates
            .iter()
            .flat_map(|g| g.task_errors.iter().map(move |(task, n)| (with(netns_label(g), "task", task), *n)));
        family(
            e,
            "shed_task_errors",
            "Failures of the daemon's periodic tasks (addresses, ports, control, heal, clients), by task: each is logged, retried with the last good state, and never ends the gate.",
            MetricType::Counter,
            task_errors,
        )
    }

    /// The per-port families with a label of their own (a state, a reason).
    fn encode_port_breakdowns(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        family(
            e,
            "shed_nat_bypassed",
            "1 while a netfilter NAT statement in the port's namespace takes its connections past the gate (they reach the listener unjudged; the log names the statement, /readyz says it unless --allow-nat), looked at every 5 s.",
            MetricType::Gauge,
            self.ports.iter().map(|p| (port_label(&p.stats), u64::from(p.nat_bypassed))),
        )?;
        let states = self.ports.iter().flat_map(|p| {
            let s = &p.stats;
            [("established", s.established), ("busy", s.busy), ("pending", s.pending), ("silent", s.silent)]
                .map(|(state, n)| (with(port_label(s), "state", state), n))
        });
        family(
            e,
            "shed_connections",
            "Connections by state: established (open), busy (owing an answer), pending (handshakes under way), silent (accepted within the idle grace, nothing sent yet).",
            MetricType::Gauge,
            states,
        )?;
        let reasons = self.ports.iter().flat_map(|p| {
            let r = &p.stats.rejected_by_reason;
            [("limit", r.limit), ("share", r.share), ("client_cap", r.client_cap), ("client_share", r.client_share)]
                .map(|(reason, n)| (with(port_label(&p.stats), "reason", reason), n))
        });
        family(
            e,
            "shed_rejected",
            "Connections and requests shed (at the SYN, the handshake-completing ACK or a kept-alive request) by reason: limit (in-flight at the limit), share (tier share full), client_cap (client at its cap), client_share (client at its share of the limit while clients holding less were refused). Sheds, not errors.",
            MetricType::Counter,
            reasons,
        )?;
        let decisions = self
            .ports
            .iter()
            .flat_map(|p| p.decisions.iter().map(|(r, n)| (with(port_label(&p.stats), "reason", json_name(r)), *n)));
        family(
            e,
            "shed_limit_decisions",
            "Controller windows by the reason for the limit they set.",
            MetricType::Counter,
            decisions,
        )
    }

    /// The three latency histograms of every port.
    fn encode_histograms(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let histograms: [(&str, &str, Buckets); 3] = [
            (
                "shed_queue_wait_seconds",
                "Request arrival to pick-up by the service (sum estimated from bucket midpoints).",
                |l| &l.queue_wait,
            ),
            ("shed_service_seconds", "Pick-up to first response byte (sum estimated from bucket midpoints).", |l| {
                &l.service
            }),
            (
                "shed_sojourn_seconds",
                "Request arrival to first response byte (sum estimated from bucket midpoints).",
                |l| &l.sojourn,
            ),
        ];
        for (name, help, of) in histograms {
            let mut metric = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for p in &self.ports {
                let (buckets, sum, count) = histogram(of(&p.latency));
                let labels = port_label(&p.stats);
                metric.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }

    /// What each port runs, as labels of a constant 1.
    fn encode_port_info(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let info = self.ports.iter().map(|p| {
            let s = &p.stats;
            let labels =
                with(with(with(port_label(s), "algo", s.algo), "action", s.action), "count", json_name(&s.count));
            (labels, 1u64)
        });
        family(
            e,
            "shed_port_info",
            "The port's limiter, reject action and what in-flight counts.",
            MetricType::Gauge,
            info,
        )
    }
}

/// Binds the endpoint; done before anything is attached, so a bad or busy
/// address refuses the attach.
pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr).map_err(|e| Error::io("listen for metrics on", addr.to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_address_is_refused_with_its_name() {
        let first = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr().unwrap();
        let err = bind(addr).unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
    }

    fn scrape() -> Scrape {
        let snapshot = crate::kernel::maps::PortSnapshot {
            port: 8080,
            config: shed_common::PortConfig::new(4, shed_common::action::RST, false, 0),
            limit: 77,
            control: shed_common::ControlConfig::default(),
            status: shed_common::ControlStatus::default(),
            reserve: shed_common::TierReserve::default(),
            state: shed_common::PortState { opened: 9, closed: 4, ..Default::default() },
            user: shed_common::UserPortState::default(),
            ring: shed_common::HandshakeRing::default(),
            silent: shed_common::HandshakeRing::default(),
            now_ns: 0,
            counters: shed_common::PortCounters::default(),
        };
        let mut stats = PortStats::new(&snapshot, None);
        "blue".clone_into(&mut stats.netns);
        let mut gate = [0; shed_common::gate_counter::COUNT];
        gate[shed_common::gate_counter::LATER_FRAGMENT] = 11;
        gate[shed_common::gate_counter::TINY_FRAGMENT] = 12;
        Scrape {
            ports: vec![PortMetrics {
                stats,
                latency: PortLatency::default(),
                decisions: vec![(Reason::Grow, 3)],
                nat_bypassed: true,
            }],
            refused_pods: vec![("shop/web-1".into(), "shed.io/limit".into())],
            pod_loop: Some(crate::observe::endpoint::PodLoopState {
                started: std::time::Instant::now(),
                cri_up: false,
                last_success: Some((std::time::Instant::now(), 1_765_000_000.5)),
                pods: [3, 1, 0, 2],
            }),
            gates: vec![GateMetrics {
                netns: "blue".into(),
                pod: None,
                gate,
                heal: HealCounts { checks: 5, last_pass: std::time::Duration::from_millis(250), ..Default::default() },
                task_errors: vec![("heal", 2)],
                bpf_memory_bytes: 4096,
                nat: NatSeen { looked: true, readable: false, ..NatSeen::default() },
                loop_age: std::time::Duration::from_millis(1500),
                dispatch: shed_common::dispatch::DispatchBooks { followed: 12, unfollowed: 3 },
            }],
            process: ProcessStats { cpu_seconds: 1.5, resident_bytes: 10, open_fds: 7, start_time_seconds: 100.0 },
        }
    }

    #[test]
    fn every_family_is_written_once_with_its_type_and_each_series_its_value() {
        let text = scrape().encode();
        fn names<T, V>(table: &[Figure<T, V>]) -> impl Iterator<Item = (&'static str, MetricType)> + '_ {
            table.iter().map(|f| (f.0, f.2))
        }
        let tables = names(PORT_FAMILIES)
            .chain(names(PORT_SECONDS))
            .chain(names(TIER_FAMILIES))
            .chain(names(GATE_FAMILIES))
            .chain(names(GATE_SECONDS))
            .chain(names(PROCESS_FAMILIES))
            .chain(names(PROCESS_SECONDS));
        for (name, kind) in tables {
            let typed =
                if kind == MetricType::Counter { format!("{name}_total counter") } else { format!("{name} gauge") };
            assert_eq!(text.matches(&format!("# TYPE {typed}\n")).count(), 1, "{typed}:\n{text}");
        }
        for line in [
            "shed_limit{netns=\"blue\",port=\"8080\"} 77",
            "shed_connections{netns=\"blue\",port=\"8080\",state=\"established\"} 5",
            "shed_heal_checks_total{netns=\"blue\"} 5",
            "shed_heal_last_pass_seconds{netns=\"blue\"} 0.25",
            "shed_later_fragments_total{netns=\"blue\"} 11",
            "shed_gate_dropped_total{netns=\"blue\",reason=\"tiny_fragment\"} 12",
            "shed_bpf_memory_bytes{netns=\"blue\"} 4096",
            "shed_nat_bypassed{netns=\"blue\",port=\"8080\"} 1",
            "shed_nat_readable{netns=\"blue\"} 0",
            "shed_loop_tick_age_seconds{netns=\"blue\"} 1.5",
            "shed_dispatch_followed{netns=\"blue\"} 12",
            "shed_dispatch_unfollowed_total{netns=\"blue\"} 3",
            "shed_task_errors_total{netns=\"blue\",task=\"heal\"} 2",
            "shed_limit_decisions_total{netns=\"blue\",port=\"8080\",reason=\"grow\"} 3",
            "shed_tier_admitted_total{netns=\"blue\",port=\"8080\",tier=\"critical\"} 0",
            "process_open_fds 7",
            "process_cpu_seconds_total 1.5",
            "shed_pod_refused{namespace=\"shop\",pod=\"web-1\",annotation=\"shed.io/limit\"} 1",
            "shed_cri_up 0",
            "shed_cri_last_success_timestamp_seconds 1765000000",
            "shed_pods{state=\"gated\"} 3",
            "shed_pods{state=\"waiting\"} 1",
            "shed_pods{state=\"handing_over\"} 0",
            "shed_pods{state=\"refused\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        // No family twice, whether from a table or written apart.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let distinct: std::collections::BTreeSet<&str> = types.iter().filter_map(|l| l.split(' ').nth(2)).collect();
        assert_eq!(distinct.len(), types.len(), "a family written twice:\n{text}");
        // Every metric `stats --json` names is served.
        for term in crate::observe::vocabulary::TERMS {
            if let Some(metric) = term.metric {
                assert!(text.contains(&format!("# TYPE {metric} ")), "{} names {metric}, not written", term.json);
            }
        }
    }

    #[test]
    fn histogram_buckets_are_exact_at_power_of_two_edges() {
        let mut h = [0u64; latency::BUCKETS];
        h[latency::bucket(15)] += 1; // below 16 us
        h[latency::bucket(16)] += 2; // exactly 16 us: the next edge
        h[latency::bucket(1_000)] += 3; // below 1024 us
        h[latency::bucket(40_000_000)] += 4; // beyond the last edge
        let (buckets, sum, count) = histogram(&h);
        assert_eq!(count, 10);
        assert_eq!(buckets[0], (16e-6, 1));
        assert_eq!(buckets[1], (32e-6, 2));
        let ms = buckets.iter().position(|(e, _)| *e == 1024e-6).unwrap();
        assert_eq!(buckets[ms].1, 3);
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 4));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), count);
        let exact = 15e-6 + 2.0 * 16e-6 + 3.0 * 1e-3 + 4.0 * 40.0;
        assert!((sum - exact).abs() / exact < 0.25, "sum {sum} vs {exact}");
    }
}
