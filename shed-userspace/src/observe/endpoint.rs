// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon's HTTP endpoint (`shedctl attach --metrics ADDR`), on axum and
//! tokio in a thread of its own: `/metrics` (Prometheus), `/healthz` (the
//! control loop and the gate's maps are alive) and `/readyz` (not ready while
//! the gate sheds more than `--ready-max-shed` percent of new connections over
//! `--ready-window`: load balancers and Kubernetes can move traffic away
//! before clients see refusals). Every connection is a task of its own, so a
//! slow or stuck client stalls nobody, and a scrape never waits for the
//! control loop.
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};

use crate::{
    kernel::maps::GateMaps,
    observe::lock,
    observe::metrics::{CONTENT_TYPE, GateSource, Scrape},
    observe::report::{Decisions, HEALTHY_WITHIN, HealReport, Heartbeat, NatReport, TaskErrors},
    observe::stats::PortStats,
};

/// When `/readyz` says not ready.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ReadinessRule {
    /// Shed share of new connections (percent) above which the gate is not ready; 100: never.
    pub max_shed_percent: u8,
    /// Over this long.
    pub window: Duration,
}

/// Fewer new connections than this in the window say nothing about shedding.
const READY_MIN_ATTEMPTS: u64 = 20;

/// Admitted and rejected totals over time, sampled every second.
#[derive(Debug, Default)]
pub(crate) struct ShedHistory {
    samples: VecDeque<(Instant, u64, u64)>,
}

impl ShedHistory {
    pub(crate) fn push(&mut self, at: Instant, admitted: u64, rejected: u64, keep: Duration) {
        self.samples.push_back((at, admitted, rejected));
        while self.samples.len() > 2 && self.samples.front().is_some_and(|s| at.duration_since(s.0) > keep) {
            self.samples.pop_front();
        }
    }

    /// Why the gate is not ready under `rule`, if it is not.
    pub(crate) fn not_ready(&self, rule: ReadinessRule) -> Option<String> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let (admitted, rejected) = (last.1.saturating_sub(first.1), last.2.saturating_sub(first.2));
        let attempts = admitted + rejected;
        let shed = rejected as f64 * 100.0 / attempts.max(1) as f64;
        (attempts >= READY_MIN_ATTEMPTS && shed > f64::from(rule.max_shed_percent)).then(|| {
            format!(
                "shedding {shed:.0}% of new connections over the last {:.0} s ({rejected} of {attempts}); not ready above {}%\n",
                last.0.duration_since(first.0).as_secs_f64(),
                rule.max_shed_percent
            )
        })
    }
}

/// What the endpoint serves: every namespace's gate (pods' gates join and
/// leave as they come and go), the pods refused, and the readiness rule.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub gates: GateRegistry,
    pub refused_pods: RefusedPods,
    /// A node agent's pod loop (`attach --pods`): its container runtime and its pods' states.
    pub pod_loop: PodLoop,
    pub readiness: ReadinessRule,
    /// `--metrics-token-file`: /metrics answers only `Authorization: Bearer` it.
    pub token: Option<Arc<str>>,
}

/// The gates the endpoint serves, shared with the daemon, which adds a pod's
/// gate when it starts one (an ended gate is left out and then let go).
#[derive(Clone, Debug, Default)]
pub(crate) struct GateRegistry(Arc<Mutex<Vec<EndpointGate>>>);

impl GateRegistry {
    pub(crate) fn add(&self, gate: EndpointGate) {
        let mut gates = lock(&self.0);
        gates.retain(|g| !g.ended.load(std::sync::atomic::Ordering::Relaxed));
        gates.push(gate);
    }

    fn current(&self) -> Vec<EndpointGate> {
        lock(&self.0).clone()
    }
}

/// Pods whose annotations could not be used, by `namespace/name`: the annotation and why.
#[derive(Clone, Debug, Default)]
pub(crate) struct RefusedPods(Arc<Mutex<std::collections::BTreeMap<String, (String, String)>>>);

impl RefusedPods {
    pub(crate) fn set(&self, pod: &str, key: &str, reason: &str) {
        lock(&self.0).insert(pod.to_owned(), (key.to_owned(), reason.to_owned()));
    }

    pub(crate) fn clear(&self, pod: &str) {
        lock(&self.0).remove(pod);
    }

    pub(crate) fn current(&self) -> Vec<(String, String)> {
        lock(&self.0).iter().map(|(pod, (key, _))| (pod.clone(), key.clone())).collect()
    }
}

/// How long a node agent's pod loop may go without a successful look at the
/// container runtime before `/healthz` fails: a minute of a runtime that does
/// not answer (or a loop that stopped looking) is longer than any restart of
/// the runtime, and the kubelet, restarting the agent, hands its pods over.
pub(crate) const CRI_LIVE_WITHIN: Duration = Duration::from_mins(1);

/// A pod's state, as the pods-by-state gauge counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PodState {
    /// Its gate judges it.
    Gated,
    /// Its gate is setting up, or it waits: for room in the memory budget, or to try again.
    Waiting,
    /// Left judged by this agent's programs for the next agent (SIGTERM).
    HandingOver,
    /// Left ungated: an annotation of its could not be used, or its gate failed.
    Refused,
}

impl PodState {
    pub(crate) const ALL: [Self; 4] = [Self::Gated, Self::Waiting, Self::HandingOver, Self::Refused];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Gated => "gated",
            Self::Waiting => "waiting",
            Self::HandingOver => "handing_over",
            Self::Refused => "refused",
        }
    }
}

/// What a node agent's pod loop last saw, for `/healthz` and the metrics.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodLoop(Arc<Mutex<Option<PodLoopState>>>);

/// The pod loop's state (None in [`PodLoop`]: the daemon gates no pods).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PodLoopState {
    pub started: std::time::Instant,
    /// Whether the last look at the runtime succeeded.
    pub cri_up: bool,
    /// The last successful look: when (monotonic) and its wall-clock time (Unix seconds).
    pub last_success: Option<(std::time::Instant, f64)>,
    /// Pods by state ([`PodState::ALL`]'s order).
    pub pods: [u64; 4],
}

impl PodLoop {
    /// A pod loop starts (`attach --pods`).
    pub(crate) fn start(&self) {
        *lock(&self.0) =
            Some(PodLoopState { started: std::time::Instant::now(), cri_up: false, last_success: None, pods: [0; 4] });
    }

    /// A look at the runtime ended: it answered or not.
    pub(crate) fn looked(&self, answered: bool) {
        if let Some(state) = lock(&self.0).as_mut() {
            state.cri_up = answered;
            if answered {
                let unix =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                state.last_success = Some((std::time::Instant::now(), unix));
            }
        }
    }

    /// The pods by state, after a look.
    pub(crate) fn set_pods(&self, pods: [u64; 4]) {
        if let Some(state) = lock(&self.0).as_mut() {
            state.pods = pods;
        }
    }

    pub(crate) fn current(&self) -> Option<PodLoopState> {
        *lock(&self.0)
    }
}

impl PodLoopState {
    /// `/healthz`'s word on the pod loop: why it is not alive, if it is not.
    pub(crate) fn liveness(&self, now: std::time::Instant) -> Result<(), String> {
        let since = self.last_success.map_or(self.started, |(at, _)| at);
        let age = now.saturating_duration_since(since);
        if age <= CRI_LIVE_WITHIN {
            return Ok(());
        }
        Err(match self.last_success {
            Some(_) => format!(
                "the pod loop's last successful look at the container runtime was {:.0} s ago (at most {} s)\n",
                age.as_secs_f64(),
                CRI_LIVE_WITHIN.as_secs()
            ),
            None => format!(
                "the pod loop has not reached the container runtime in {:.0} s (at most {} s)\n",
                age.as_secs_f64(),
                CRI_LIVE_WITHIN.as_secs()
            ),
        })
    }
}

/// One namespace's gate as the endpoint reads it.
#[derive(Clone, Debug)]
pub(crate) struct EndpointGate {
    /// The namespace's label (see [`crate::host::paths::netns_label`]).
    pub netns: String,
    /// The pod it serves (`namespace/name`), for a pod's gate.
    pub pod: Option<String>,
    /// Where its maps are pinned.
    pub pin_dir: std::path::PathBuf,
    pub decisions: Decisions,
    pub heal: HealReport,
    pub heartbeat: Heartbeat,
    pub task_errors: TaskErrors,
    pub nat: NatReport,
    /// Set when the gate's loop has ended (its ports all detached): it is
    /// then left out of every answer, and its maps are let go.
    pub ended: Arc<std::sync::atomic::AtomicBool>,
    /// A pod's gate at the node's dispatcher.
    pub dispatch: crate::observe::report::DispatchReport,
}

/// One gate's maps and shedding history, opened once by the endpoint thread.
/// Each behind a lock of its own: `/healthz` and `/readyz` never wait for a scrape.
struct OpenGate {
    gate: EndpointGate,
    /// None once the gate has ended.
    maps: Mutex<Option<GateMaps>>,
    history: Mutex<ShedHistory>,
}

impl OpenGate {
    fn ended(&self) -> bool {
        self.gate.ended.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The maps of a gate still running (an ended gate's are closed here, freeing them).
    fn maps(&self) -> std::sync::MutexGuard<'_, Option<GateMaps>> {
        let mut maps = lock(&self.maps);
        if self.ended() {
            *maps = None;
        }
        maps
    }
}

#[derive(Clone)]
struct Shared {
    /// The gates opened so far, by pin folder.
    open: Arc<Mutex<Vec<Arc<OpenGate>>>>,
    registry: GateRegistry,
    refused_pods: RefusedPods,
    pod_loop: PodLoop,
    readiness: ReadinessRule,
    token: Option<Arc<str>>,
}

impl Shared {
    /// The gates to answer for: every registered one not ended, its maps
    /// opened once (a gate whose pins are not there yet waits for the next call).
    fn gates(&self) -> Vec<Arc<OpenGate>> {
        let mut open = lock(&self.open);
        open.retain(|g| !g.ended());
        for gate in self.registry.current() {
            if gate.ended.load(std::sync::atomic::Ordering::Relaxed)
                || open.iter().any(|o| o.gate.pin_dir == gate.pin_dir)
            {
                continue;
            }
            match GateMaps::open_pinned_at(&gate.pin_dir) {
                Ok(maps) => {
                    open.push(Arc::new(OpenGate { gate, maps: Mutex::new(Some(maps)), history: Mutex::default() }));
                }
                Err(e) => {
                    tracing::debug!(netns = %gate.netns, "metrics endpoint: gate not open yet: {}", crate::error::chain(&e));
                }
            }
        }
        open.clone()
    }
}

/// Serves the endpoint on its own thread until the process exits.
pub(crate) fn serve(listener: std::net::TcpListener, endpoint: Endpoint) {
    std::thread::Builder::new()
        .name("shed-http".into())
        .spawn(move || {
            let shared = Shared {
                open: Arc::default(),
                registry: endpoint.gates,
                refused_pods: endpoint.refused_pods,
                pod_loop: endpoint.pod_loop,
                readiness: endpoint.readiness,
                token: endpoint.token,
            };
            // The gates set up before the endpoint starts are all there: their maps open now.
            let expected = shared.registry.current().len();
            if shared.gates().len() < expected {
                return tracing::error!("metrics endpoint disabled: a gate's maps cannot be opened");
            }
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => return tracing::error!("metrics endpoint disabled: no runtime: {e}"),
            };
            if let Err(e) = runtime.block_on(run(listener, shared)) {
                tracing::error!("metrics endpoint stopped: {e}");
            }
        })
        .expect("spawn the endpoint thread");
}

async fn run(listener: std::net::TcpListener, shared: Shared) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(sample_shedding(shared.clone()));
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { (StatusCode::NOT_FOUND, "shed serves /metrics, /healthz and /readyz\n") })
        .with_state(shared);
    let mut live = LiveConnections::default();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of files or memory: the gate goes on; try again shortly.
            Err(e) => {
                tracing::debug!("metrics endpoint accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let last_request = Arc::new(std::sync::atomic::AtomicU64::new(live.now_ms()));
        let (app, seen) = (app.clone(), last_request.clone());
        let started = live.started;
        let service = hyper::service::service_fn(move |request: axum::extract::Request<hyper::body::Incoming>| {
            seen.store(started.elapsed().as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
            tower_service::Service::call(&mut app.clone(), request)
        });
        let task = tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
        });
        live.add(task.abort_handle(), last_request);
    }
}

/// Connections the endpoint serves at once; past this, the one that has been
/// quiet longest is closed for the new one, so idle clients cannot keep a
/// scrape or a health check out, nor the daemon out of files.
const MAX_CONNECTIONS: usize = 128;
/// A connection must send a whole request head within this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest life of one connection, keep-alive included.
const CONNECTION_LIFETIME: Duration = Duration::from_mins(1);

/// The endpoint's open connections, each with when it last sent a request.
struct LiveConnections {
    started: Instant,
    open: Vec<(tokio::task::AbortHandle, Arc<std::sync::atomic::AtomicU64>)>,
}

impl Default for LiveConnections {
    fn default() -> Self {
        Self { started: Instant::now(), open: Vec::new() }
    }
}

impl LiveConnections {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Tracks a new connection, closing the quietest open one when full.
    fn add(&mut self, task: tokio::task::AbortHandle, last_request: Arc<std::sync::atomic::AtomicU64>) {
        self.open.retain(|(t, _)| !t.is_finished());
        if self.open.len() >= MAX_CONNECTIONS {
            let quietest = self
                .open
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, last))| last.load(std::sync::atomic::Ordering::Relaxed))
                .map(|(i, _)| i);
            if let Some(i) = quietest {
                self.open.swap_remove(i).0.abort();
            }
        }
        self.open.push((task, last_request));
    }
}

/// Every second: the admitted and rejected totals of every namespace's ports, for `/readyz`.
async fn sample_shedding(shared: Shared) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let gates = shared.gates();
        let keep = shared.readiness.window;
        let _ = tokio::task::spawn_blocking(move || {
            for open in &gates {
                let Some(Ok(snapshots)) = open.maps().as_ref().map(|m| m.snapshots(None)) else { continue };
                let (admitted, rejected) = snapshots
                    .iter()
                    .map(|s| PortStats::new(s, None))
                    .fold((0, 0), |(a, r), p| (a + p.admitted, r + p.rejected));
                lock(&open.history).push(Instant::now(), admitted, rejected, keep);
            }
        })
        .await;
    }
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in
/// time that does not depend on where a guess first differs.
fn authorized(headers: &axum::http::HeaderMap, token: &str) -> bool {
    let Some(given) = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(given) = given.strip_prefix("Bearer ") else { return false };
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
}

async fn metrics(State(shared): State<Shared>, headers: axum::http::HeaderMap) -> axum::response::Response {
    if let Some(token) = &shared.token
        && !authorized(&headers, token)
    {
        // Every tenant's per-pod series: only for the scraper that holds the token.
        return (
            StatusCode::UNAUTHORIZED,
            [("content-type", "text/plain"), ("www-authenticate", "Bearer")],
            "/metrics needs `Authorization: Bearer <token>` (the daemon's --metrics-token-file)\n",
        )
            .into_response();
    }
    let scrape = tokio::task::spawn_blocking(move || {
        let gates = shared.gates();
        let maps: Vec<_> = gates.iter().map(|g| g.maps()).collect();
        let sources: Vec<GateSource> = gates
            .iter()
            .zip(&maps)
            .filter_map(|(g, maps)| {
                let maps = maps.as_ref()?;
                Some(GateSource {
                    netns: &g.gate.netns,
                    pod: g.gate.pod.as_deref(),
                    maps,
                    decisions: &g.gate.decisions,
                    heal: &g.gate.heal,
                    task_errors: &g.gate.task_errors,
                    nat: &g.gate.nat,
                    heartbeat: &g.gate.heartbeat,
                    dispatch: &g.gate.dispatch,
                })
            })
            .collect();
        Scrape::read(&sources, shared.refused_pods.current())
            .map(|scrape| Scrape { pod_loop: shared.pod_loop.current(), ..scrape })
            .map(Scrape::encode)
    })
    .await;
    match scrape {
        Ok(Ok(body)) => (StatusCode::OK, [("content-type", CONTENT_TYPE)], body).into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("content-type", "text/plain")],
            format!("reading the gate's maps: {}\n", crate::error::chain(&e)),
        )
            .into_response(),
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], format!("{e}\n")).into_response()
        }
    }
}

async fn healthz(State(shared): State<Shared>) -> impl IntoResponse {
    let gates = shared.gates();
    let pod_loop = shared.pod_loop.current().map_or(Ok(()), |p| p.liveness(std::time::Instant::now()));
    match liveness(gates.iter().map(|g| &g.gate)).and(pod_loop) {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// `/healthz`: why the daemon is not alive, if it is not: a gate of the
/// node's own whose control loop has not started or has not ticked within
/// [`HEALTHY_WITHIN`]. Liveness is the daemon's own: a pod's stalled gate
/// shows in its own series (`shed_loop_tick_age_seconds`), since restarting
/// the agent for it would leave every other pod of the node ungated meanwhile.
fn liveness<'a>(gates: impl Iterator<Item = &'a EndpointGate> + Clone) -> Result<(), String> {
    let several = gates.clone().count() > 1;
    let open = |g: &&EndpointGate| !g.ended.load(std::sync::atomic::Ordering::Relaxed) && g.pod.is_none();
    for gate in gates.filter(open) {
        let of = if several { format!(" of namespace {}", gate.netns) } else { String::new() };
        match gate.heartbeat.age() {
            Some(age) if age <= HEALTHY_WITHIN => {}
            Some(age) => return Err(format!("the control loop{of} has not ticked for {:.1} s\n", age.as_secs_f64())),
            None => return Err(format!("the control loop{of} has not started\n")),
        }
    }
    Ok(())
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    let gates = shared.gates();
    let several = gates.len() > 1;
    // Readiness is the node's own services': a pod that sheds says so in its metrics.
    for open in gates.iter().filter(|g| !g.ended() && g.gate.pod.is_none()) {
        let why = open.gate.nat.not_ready().or_else(|| lock(&open.history).not_ready(shared.readiness));
        if let Some(why) = why {
            let why = if several { format!("namespace {}: {why}", open.gate.netns) } else { why };
            return (StatusCode::SERVICE_UNAVAILABLE, why);
        }
    }
    (StatusCode::OK, "ready\n".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(netns: &str, pod: Option<&str>, last_beat: Option<Duration>) -> EndpointGate {
        let heartbeat = Heartbeat::default();
        if let Some(ago) = last_beat {
            heartbeat.beat_ago(ago);
        }
        EndpointGate {
            netns: netns.to_owned(),
            pod: pod.map(str::to_owned),
            pin_dir: std::path::PathBuf::new(),
            decisions: Decisions::default(),
            heal: HealReport::default(),
            heartbeat,
            task_errors: TaskErrors::default(),
            nat: NatReport::default(),
            ended: Arc::default(),
            dispatch: crate::observe::report::DispatchReport::default(),
        }
    }

    #[test]
    fn a_pods_stalled_gate_never_fails_the_agents_liveness_and_the_nodes_own_does() {
        let stalled = HEALTHY_WITHIN + Duration::from_secs(1);
        let fresh = Duration::ZERO;
        // The agent with pods only: one stalled, one never started, one ticking.
        let pods = [
            gate("cni-1", Some("shop/web-0"), Some(stalled)),
            gate("cni-2", Some("shop/web-1"), None),
            gate("cni-3", Some("shop/web-2"), Some(fresh)),
        ];
        assert_eq!(liveness(pods.iter()), Ok(()));
        // A gate of the node's own beside them: its stall is the agent's.
        let mut all = pods.to_vec();
        all.push(gate("host", None, Some(stalled)));
        let why = liveness(all.iter()).unwrap_err();
        assert!(why.starts_with("the control loop of namespace host has not ticked for 6."), "{why}");
        all.last_mut().unwrap().heartbeat.beat();
        assert_eq!(liveness(all.iter()), Ok(()));
        // The node's own gate alone, not started yet; once ended, it is not asked.
        let node = [gate("host", None, None)];
        assert_eq!(liveness(node.iter()), Err("the control loop has not started\n".to_owned()));
        node[0].ended.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(liveness(node.iter()), Ok(()));
    }

    /// A node agent's liveness covers its pod loop: it fails once the loop has
    /// gone [`CRI_LIVE_WITHIN`] without a successful look at the runtime
    /// (counted from its start before the first), and passes while one came
    /// within it; a runtime that answers again makes it pass again.
    #[test]
    fn a_pod_loop_that_cannot_reach_its_runtime_fails_liveness_after_a_minute() {
        let pod_loop = PodLoop::default();
        assert!(pod_loop.current().is_none(), "no --pods: nothing to say");
        pod_loop.start();
        let state = pod_loop.current().unwrap();
        let t0 = state.started;
        let just = CRI_LIVE_WITHIN;
        assert_eq!(state.liveness(t0 + just), Ok(()), "a minute to reach the runtime at start");
        let why = state.liveness(t0 + just + Duration::from_secs(1)).unwrap_err();
        assert!(why.contains("has not reached the container runtime"), "{why}");
        pod_loop.looked(false);
        assert!(!pod_loop.current().unwrap().cri_up);
        assert!(pod_loop.current().unwrap().last_success.is_none(), "a failed look is no success");
        pod_loop.looked(true);
        let state = pod_loop.current().unwrap();
        let (at, unix) = state.last_success.unwrap();
        assert!(state.cri_up && unix > 1.7e9, "{unix}");
        assert_eq!(state.liveness(at + just), Ok(()));
        let why = state.liveness(at + just + Duration::from_millis(1)).unwrap_err();
        assert!(why.contains("last successful look"), "{why}");
        pod_loop.set_pods([1, 2, 0, 3]);
        assert_eq!(pod_loop.current().unwrap().pods, [1, 2, 0, 3]);
    }

    #[test]
    fn not_ready_only_while_shedding_past_the_threshold_over_the_window() {
        let rule = ReadinessRule { max_shed_percent: 50, window: Duration::from_secs(10) };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut h = ShedHistory::default();
        assert_eq!(h.not_ready(rule), None, "no samples: ready");
        h.push(at(0), 0, 0, rule.window);
        h.push(at(1), 10, 9, rule.window);
        assert_eq!(h.not_ready(rule), None, "19 attempts are too few to judge");
        h.push(at(2), 20, 60, rule.window);
        let why = h.not_ready(rule).expect("75% shed");
        assert!(why.contains("shedding 75%") && why.contains("above 50%"), "{why}");
        // Shedding stops; once the window has passed, ready again.
        for s in 3..=13 {
            h.push(at(s), 20 + s * 100, 60, rule.window);
        }
        assert_eq!(h.not_ready(rule), None);
        let never = ReadinessRule { max_shed_percent: 100, ..rule };
        let mut h = ShedHistory::default();
        h.push(at(0), 0, 0, rule.window);
        h.push(at(1), 0, 1_000, rule.window);
        assert_eq!(h.not_ready(never), None, "100%: never unready");
    }
}
