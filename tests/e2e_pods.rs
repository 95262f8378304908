// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real pods: sandboxes that a private containerd makes through the CRI API,
//! as the kubelet makes them, each in a network namespace of its own (CNI's
//! bridge and address). A gate attached to one pod's namespace (`--netns`
//! with the name the runtime reports) holds that pod's port to its limit,
//! and a second pod serving the same port is untouched. `shedctl pods` reads
//! the same runtime as the kubelet's would be read: each pod with what its
//! `shed.io/*` annotations ask for, or the annotation it cannot use. Needs
//! root, containerd, podman and a static busybox (`cargo xtask setup`).
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use shed_testkit::{
    cgroup::MemoryCgroup,
    cri::Runtime,
    gate::{Gate, exclusive, field, shedctl, wait_for_stats},
    testbed::{self, Backend, Service},
};

const PORT: u16 = 8080;

fn echo(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = testbed::connect(addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"hi")?;
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf)?;
    Ok(s)
}

#[test]
fn a_gate_in_one_pods_namespace_holds_its_limit_and_leaves_another_pod_alone() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod0", "10.233.71.0/24").expect("a private containerd");
    let gated = runtime.run_pod("gated", &[]).expect("pod");
    let other = runtime.run_pod("other", &[]).expect("pod");
    assert_ne!(gated.netns, other.netns, "a namespace per pod");
    let (gated_addr, other_addr) = (SocketAddr::from((gated.ip, PORT)), SocketAddr::from((other.ip, PORT)));
    let _servers = [
        Backend::start(&gated.netns, gated_addr, Service::Echo).expect("server in the gated pod"),
        Backend::start(&other.netns, other_addr, Service::Echo).expect("server in the other pod"),
    ];
    let _gate = Gate::attach(&[
        "--netns",
        &gated.netns,
        "--port",
        "8080",
        "--limit",
        "1",
        "--count",
        "connections",
        "--action",
        "rst",
    ]);
    // From the node, over the runtime's bridge, as a Service's traffic arrives.
    let held = echo(gated_addr).expect("the first connection to the gated pod");
    wait_for_stats(PORT, Duration::from_secs(5), "the held connection counted", |s| field(s, "established") == 1);
    let refused = testbed::connect(gated_addr, Duration::from_secs(2)).map(drop);
    assert_eq!(refused.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "over the gated pod's limit: reset");
    // The other pod's port is not the gated one's: both connections are served.
    let both = (echo(other_addr), echo(other_addr));
    assert!(both.0.is_ok() && both.1.is_ok(), "the other pod is untouched: {both:?}");
    let s = wait_for_stats(PORT, Duration::from_secs(5), "the refusal counted", |s| field(s, "rejected") == 1);
    assert_eq!((field(&s, "admitted"), field(&s, "syn_seen")), (1, 2), "only the gated pod's SYNs are judged: {s}");
    drop(held);
}

#[test]
fn shedctl_pods_shows_what_each_pods_annotations_ask_for() {
    let mut runtime = Runtime::start("shedpod1", "10.233.72.0/24").expect("a private containerd");
    runtime.run_pod("web", &[("shed.io/ports", "8080,9090"), ("shed.io/limit", "50"), ("app", "web")]).unwrap();
    runtime.run_pod("plain", &[("app", "plain")]).unwrap();
    runtime.run_pod("typo", &[("shed.io/ports", "8080"), ("shed.io/limt", "5")]).unwrap();
    let socket = runtime.socket().display().to_string();
    let out = shedctl(&["pods", "--cri-socket", &socket, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pods: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pod = |name: &str| pods.as_array().unwrap().iter().find(|p| p["name"] == name).cloned().expect(name);
    assert_eq!(pods.as_array().map(Vec::len), Some(3), "{pods}");
    let web = pod("web");
    assert_eq!((web["namespace"].as_str(), web["asks"].as_str()), (Some("default"), Some("gated")), "{web}");
    assert_eq!(web["ports"], serde_json::json!([8080, 9090]));
    assert_eq!(web["gated"], false, "it asks, and no agent runs to gate it: {web}");
    assert!(web["netns"].as_str().is_some_and(|p| p.contains("/netns/cni-")), "{web}");
    assert_eq!(web["annotations"].as_object().map(serde_json::Map::len), Some(2), "only shed's: {web}");
    assert_eq!(pod("plain")["asks"], "none");
    let typo = pod("typo");
    assert_eq!(typo["asks"], "refused");
    assert!(typo["error"].as_str().is_some_and(|e| e.starts_with("shed.io/limt: unknown key")), "{typo}");

    // A runtime that is not there: a clear error naming the socket, nothing else.
    let out = shedctl(&["pods", "--cri-socket", "/nonexistent/cri.sock"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/nonexistent/cri.sock"), "{err}");
    assert!(err.contains("no such socket") && err.contains("--cri-socket"), "the fix is named: {err}");
}

/// Waits until the agent says `pod`'s gate is set up (its programs attached), for at most 10 s.
fn wait_gated(gate: &Gate, netns: &str) {
    shed_testkit::gate::poll(
        Duration::from_secs(10),
        &format!("{netns} gated"),
        || gate.log(),
        |log| shed_testkit::gate::gated_line(log, netns).is_some(),
    );
}

/// `shedctl stats --json --netns <ns>`: the ports gated in one namespace, if it is gated.
fn stats_of(netns: &str) -> Option<serde_json::Value> {
    let out = shedctl(&["stats", "--json", "--interval", "50", "--netns", netns]);
    out.status.success().then(|| serde_json::from_slice(&out.stdout).expect("stats --json is JSON"))
}

#[test]
fn pods_that_ask_are_gated_as_they_come_and_ungated_as_they_go() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod2", "10.233.73.0/24").expect("a private containerd");
    let limited = [
        ("shed.io/ports", "8080"),
        ("shed.io/limit", "1"),
        ("shed.io/count", "connections"),
        ("shed.io/action", "rst"),
        ("shed.io/agent-port", "9500"),
    ];
    let web = runtime.run_pod("web", &limited).expect("pod");
    let plain = runtime.run_pod("plain", &[]).expect("pod");
    let typo = runtime.run_pod("typo", &[("shed.io/ports", "8080"), ("shed.io/limt", "1")]).expect("pod");
    let addr = |pod: &shed_testkit::cri::Pod| SocketAddr::from((pod.ip, PORT));
    let mut servers: Vec<Backend> = [&web, &plain, &typo]
        .iter()
        .map(|p| Backend::start(&p.netns, addr(p), Service::Echo).expect("server in the pod"))
        .collect();
    let socket = runtime.socket().display().to_string();
    // The agent alone: no port of the node's own, only the pods that ask.
    const METRICS: &str = "127.0.0.1:19479";
    let gate = Gate::attach(&["--pods", "--cri-socket", &socket, "--metrics", METRICS]);
    wait_gated(&gate, &web.netns);
    // One set of programs for every pod (the node's shared object): the TC
    // judge and its turn program, and the four dispatchers, however many pods.
    let programs = || {
        let mut names = shed_testkit::gate::loaded_shed_programs();
        names.sort();
        names
    };
    let shared_set = programs();
    assert_eq!(shared_set.len(), 6, "the shared object's six programs with one pod gated: {shared_set:?}");
    let web_stats = stats_of(&web.netns).expect("the annotated pod is gated");
    assert_eq!(web_stats[0]["port"], 8080, "{web_stats}");
    assert_eq!(web_stats[0]["limit"], 1, "its annotations' limit: {web_stats}");
    assert_eq!(web_stats[0]["pod"], "default/web", "named by its pod: {web_stats}");
    let table = String::from_utf8_lossy(&shedctl(&["stats", "--interval", "50"]).stdout).into_owned();
    assert!(table.contains(&format!("pod default/web (netns {}):", web.netns)), "{table}");
    // The metrics name the pod, and the pod left ungated with its annotation.
    let scrape = shed_testkit::metrics::scrape(METRICS);
    let web_labels = [("namespace", "default"), ("pod", "web"), ("port", "8080")];
    assert_eq!(shed_testkit::metrics::value(&scrape, "shed_limit", &web_labels), 1.0);
    let typo_labels = [("namespace", "default"), ("pod", "typo"), ("annotation", "shed.io/limt")];
    assert_eq!(shed_testkit::metrics::value(&scrape, "shed_pod_refused", &typo_labels), 1.0);
    let (health, _) = shed_testkit::metrics::http_get(METRICS, "/healthz");
    assert_eq!(health, "HTTP/1.1 200 OK");
    assert!(stats_of(&plain.netns).is_none() && stats_of(&typo.netns).is_none(), "the others are not gated");
    assert!(gate.log().contains("shed.io/limt: unknown key"), "the bad annotation is said: {}", gate.log());
    // The pod's agent answers a balancer's check on the pod's own address; a pod that did not ask has none.
    let agent = |pod: &shed_testkit::cri::Pod| {
        let mut conn = testbed::connect(SocketAddr::from((pod.ip, 9500)), Duration::from_secs(2))?;
        let mut line = String::new();
        std::io::Read::read_to_string(&mut conn, &mut line).map(|_| line)
    };
    assert_eq!(agent(&web).expect("the pod's agent"), "100%\n", "nothing refused yet: its full weight");
    assert_eq!(agent(&plain).map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "no agent unasked");

    let held = echo(addr(&web)).expect("the first connection to the gated pod");
    let refused = testbed::connect(addr(&web), Duration::from_secs(2)).map(drop);
    assert_eq!(refused.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "over its limit: reset");
    for pod in [&plain, &typo] {
        let both = (echo(addr(pod)), echo(addr(pod)));
        assert!(both.0.is_ok() && both.1.is_ok(), "{}: ungated, untouched: {both:?}", pod.netns);
    }

    // A pod that comes later is gated once its sandbox is ready.
    let later = runtime.run_pod("later", &limited).expect("pod");
    servers.push(Backend::start(&later.netns, addr(&later), Service::Echo).expect("server"));
    let ready = std::time::Instant::now();
    wait_gated(&gate, &later.netns);
    println!("a new pod was gated {:?} after its sandbox was ready", ready.elapsed());
    assert_eq!(programs(), shared_set, "a second pod gated loads no program of its own");
    let _later_held = echo(addr(&later)).expect("the new pod's first connection");
    let refused = testbed::connect(addr(&later), Duration::from_secs(2)).map(drop);
    assert_eq!(refused.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "the new pod's limit holds");
    // Tuned live by the pod's name.
    let out = shedctl(&["set", "--pod", "default/later", "--port", "8080", "--limit", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _second = echo(addr(&later)).expect("a second connection, under the raised limit");
    // Its two connections are followed by the node's dispatcher, within its quota.
    let dispatch = |name: &str| {
        let scrape = shed_testkit::metrics::scrape(METRICS);
        shed_testkit::metrics::value(&scrape, name, &[("pod", "later")])
    };
    shed_testkit::gate::poll(
        Duration::from_secs(3),
        "the dispatcher to follow the pod's 2",
        || dispatch("shed_dispatch_followed"),
        |&n| n == 2.0,
    );
    assert_eq!(dispatch("shed_dispatch_unfollowed_total"), 0.0);
    let out = shedctl(&["stats", "--pod", "default/nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no gated pod default/nope") && err.contains("shedctl pods"),
        "{err}"
    );

    // A pod removed mid-traffic (a connection open) takes its gate and pins; the
    // agent and the other pods go on.
    runtime.remove_pod(&web.id).expect("remove the pod");
    let pins = shed::host::paths::gate_pin_dir(Some(&web.netns));
    shed_testkit::gate::poll(Duration::from_secs(10), "the removed pod's pins gone", || pins.exists(), |e| !e);
    let scrape = shed_testkit::metrics::scrape(METRICS);
    assert!(!scrape.samples.iter().any(|s| s.labels.get("pod") == Some("web")), "its series went with it");
    assert_eq!(shed_testkit::metrics::value(&scrape, "shed_limit", &[("pod", "later")]), 2.0, "the other's stay");
    assert!(stats_of(&later.netns).is_some(), "the other pod's gate runs on");
    assert!(gate.log().contains("the pod is gone"), "{}", gate.log());
    drop(held);

    // The agent restarted (SIGTERM) leaves the pod judged by its programs
    // until the next agent takes it over: its limit (2, both held) still refuses.
    gate.leave_for_successor();
    let left = std::path::Path::new(shed::host::paths::HANDOVER_PIN_DIR);
    assert!(left.exists(), "the agent left its links for the next one");
    let refused = testbed::connect(addr(&later), Duration::from_secs(2)).map(drop);
    assert_eq!(refused.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "judged with no agent running");
    // And shown as judged, handed over, with the counts its left programs judge by.
    let handed = stats_of(&later.netns).expect("a pod left judging is shown while no agent runs");
    assert_eq!(
        (handed[0]["state"].as_str(), handed[0]["pod"].as_str(), handed[0]["established"].as_u64()),
        (Some("handing_over"), Some("default/later"), Some(2)),
        "{handed}"
    );
    assert!(handed[0]["rejected"].as_u64() > Some(0), "its refusals counted: {handed}");
    let out = shedctl(&["pods", "--cri-socket", &socket, "--json"]);
    let pods: serde_json::Value = serde_json::from_slice(&out.stdout).expect("pods --json is JSON");
    let left_pod = pods.as_array().unwrap().iter().find(|p| p["name"] == "later").cloned().expect("later");
    assert_eq!((left_pod["gated"].as_bool(), left_pod["state"].as_str()), (Some(true), Some("handing_over")), "{pods}");
    let out = shedctl(&["top", "--once", "--netns", &later.netns, "--size", "160x20"]);
    let frame = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && frame.contains("HANDING OVER"), "{frame}{}", String::from_utf8_lossy(&out.stderr));
    // The agent restarted takes the pod's link over (judged throughout),
    // with its open connections adopted and counted first: its limit holds
    // against them from the moment it judges (a healing pass would count
    // them only seconds later, admitting a limit's worth meanwhile).
    let gate = Gate::attach(&["--pods", "--cri-socket", &socket]);
    wait_gated(&gate, &later.netns);
    assert!(gate.log().contains("took over the last agent's TC link: judged throughout"), "{}", gate.log());
    let taken = stats_of(&later.netns).expect("gated");
    assert_eq!(
        (taken[0]["state"].as_str(), taken[0]["established"].as_u64()),
        (Some("gated"), Some(2)),
        "counted as it was taken over: {taken}"
    );
    let out = shedctl(&["pods", "--cri-socket", &socket, "--json"]);
    let pods: serde_json::Value = serde_json::from_slice(&out.stdout).expect("pods --json is JSON");
    let taken = pods.as_array().unwrap().iter().find(|p| p["name"] == "later").cloned().expect("later");
    assert_eq!(taken["state"], "gated", "{pods}");
    let through_restart = std::time::Instant::now();
    let mut passed = 0;
    while through_restart.elapsed() < Duration::from_secs(3) {
        passed += usize::from(testbed::connect(addr(&later), Duration::from_secs(2)).is_ok());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(passed, 0, "admitted past the limit in the new agent's first seconds: {}", gate.log());
    shed_testkit::gate::poll(Duration::from_secs(5), "the last agent's object gone", || left.exists(), |e| !e);
    shed_testkit::gate::poll(Duration::from_secs(5), "only the new agent's programs", programs, |p| *p == shared_set);
    shed_testkit::gate::poll(
        Duration::from_secs(10),
        "the held connections adopted",
        || stats_of(&later.netns).map(|s| s[0]["established"].as_u64()),
        |held| *held == Some(Some(2)),
    );
    let refused = testbed::connect(addr(&later), Duration::from_secs(2)).map(drop);
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused),
        "the adopted connections (2) fill the limit (its annotation's 1 again: `set` lasts as long as the gate): {}",
        gate.log()
    );
}

/// A pod whose gate cannot be set up (here: NAT in its namespace that would
/// take connections past the gate) is left ungated, said, and tried again:
/// once what stood in the way is gone, it is gated without an agent restart.
#[test]
fn a_pod_whose_gate_could_not_be_set_up_is_tried_again() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod3", "10.233.74.0/24").expect("a private containerd");
    let pod = runtime.run_pod("natted", &[("shed.io/ports", "8080"), ("shed.io/limit", "1")]).expect("pod");
    let nft = |rules: &str| {
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &pod.netns, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("run nft (cargo xtask setup installs nftables)");
        child.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "nft refused:\n{rules}");
    };
    nft(
        "table ip shednat {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 80 redirect to :8080; }\n}\n",
    );
    let socket = runtime.socket().display().to_string();
    // A port of the node's own too: the agent serves stats (and `attach` returns) with no pod gated.
    const METRICS: &str = "127.0.0.1:19484";
    let gate =
        Gate::attach(&["--pods", "--cri-socket", &socket, "--port", "18081", "--iface", "lo", "--metrics", METRICS]);
    shed_testkit::gate::poll(
        Duration::from_secs(10),
        "the failed set-up said, with its next try",
        || gate.log(),
        |log| log.contains("netfilter rewrites") && log.contains("the pod is left ungated; trying again in 2 s"),
    );
    assert!(stats_of(&pod.netns).is_none(), "not gated while the NAT is there");
    // Loud in the metrics too: refused, for its NAT rule.
    let refused = |scrape: &prometheus_parse::Scrape| {
        let of_pod =
            |s: &&prometheus_parse::Sample| s.metric == "shed_pod_refused" && s.labels.get("pod") == Some("natted");
        scrape
            .samples
            .iter()
            .filter(of_pod)
            .map(|s| s.labels.get("annotation").unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    shed_testkit::gate::poll(
        Duration::from_secs(5),
        "refused for its NAT rule",
        || refused(&shed_testkit::metrics::scrape(METRICS)),
        |r| r == &["netfilter-nat"],
    );
    // Not shown as gated while nothing judges it.
    let shown_gated = || {
        let out = shedctl(&["pods", "--cri-socket", &socket, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let pods: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let natted = pods.as_array().unwrap().iter().find(|p| p["name"] == "natted").cloned().expect("the pod");
        (natted["asks"].as_str().map(str::to_owned), natted["gated"].as_bool())
    };
    assert_eq!(shown_gated(), (Some("gated".to_owned()), Some(false)), "asks, not gated");
    nft("delete table ip shednat\n");
    wait_gated(&gate, &pod.netns);
    assert_eq!(shown_gated(), (Some("gated".to_owned()), Some(true)), "gated once the NAT is gone");
    let stats = stats_of(&pod.netns).expect("gated on a later try");
    assert_eq!((stats[0]["port"].as_u64(), stats[0]["limit"].as_u64()), (Some(8080), Some(1)), "{stats}");
    // Gated, it is no longer refused (within a look of its gate's first tick).
    shed_testkit::gate::poll(
        Duration::from_secs(5),
        "its refusal gone once gated",
        || refused(&shed_testkit::metrics::scrape(METRICS)),
        Vec::is_empty,
    );
    // A redirect added after its gate (a mesh's init container runs after the
    // sandbox is ready) is reported in the pod's own series within a look.
    nft(
        "table ip shednat {\n chain prerouting { type nat hook prerouting priority -100; tcp dport 80 redirect to :8080; }\n}\n",
    );
    let bypassed = || {
        let scrape = shed_testkit::metrics::scrape(METRICS);
        let of = |s: &&prometheus_parse::Sample| {
            s.metric == "shed_nat_bypassed"
                && s.labels.get("pod") == Some("natted")
                && s.labels.get("port") == Some("8080")
        };
        scrape.samples.iter().find(of).map(|s| s.value.clone())
    };
    shed_testkit::gate::poll(Duration::from_secs(12), "the late redirect reported", bypassed, |v| {
        v == &Some(prometheus_parse::Value::Gauge(1.0))
    });
    // An agent's restart (a rolling update) takes the pod over as it was,
    // gated and reported: the rule it finds is not a reason to ungate it.
    gate.leave_for_successor();
    let gate =
        Gate::attach(&["--pods", "--cri-socket", &socket, "--port", "18081", "--iface", "lo", "--metrics", METRICS]);
    wait_gated(&gate, &pod.netns);
    assert!(gate.log().contains("took over the last agent's TC link: judged throughout"), "{}", gate.log());
    assert_eq!(shown_gated(), (Some("gated".to_owned()), Some(true)), "still gated after the restart");
    shed_testkit::gate::poll(Duration::from_secs(12), "the redirect reported by the new agent", bypassed, |v| {
        v == &Some(prometheus_parse::Value::Gauge(1.0))
    });
    assert!(refused(&shed_testkit::metrics::scrape(METRICS)).is_empty(), "not refused: {}", gate.log());
}

/// A pod's loopback is the pod's own: a sidecar proxy (Istio, Linkerd) hands
/// the app every request over it, so the node's `127.0.0.0/8 = exempt` (the
/// shipped ConfigMap's) does not follow the agent into its pods. A "sidecar"
/// in the pod's namespace connecting to the app on 127.0.0.1 is held to the
/// pod's limit; carried into the pod, the node's tier would admit it all.
#[test]
fn a_pods_sidecar_to_app_connections_are_judged_though_the_node_exempts_loopback() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod7", "10.233.79.0/24").expect("a private containerd");
    let asks = [
        ("shed.io/ports", "8080"),
        ("shed.io/limit", "1"),
        ("shed.io/count", "connections"),
        ("shed.io/action", "rst"),
    ];
    let pod = runtime.run_pod("meshed", &asks).expect("pod");
    let _app = Backend::start(&pod.netns, SocketAddr::from(([0, 0, 0, 0], PORT)), Service::Echo).expect("the app");
    let socket = runtime.socket().display().to_string();
    let gate = Gate::attach(&["--pods", "--cri-socket", &socket, "--tier", "127.0.0.0/8=exempt"]);
    wait_gated(&gate, &pod.netns);
    let sidecar = || {
        testbed::spawn_in(&pod.netns, || echo(SocketAddr::from(([127, 0, 0, 1], PORT))))
            .join()
            .expect("the sidecar's thread")
            .expect("in the pod's namespace")
    };
    let _held = sidecar().expect("the sidecar's first connection to the app");
    let second = sidecar().map(drop);
    assert_eq!(second.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused), "over the pod's limit: reset");
    let stats = stats_of(&pod.netns).expect("gated");
    assert_eq!((field(&stats[0], "admitted"), field(&stats[0], "rejected")), (1, 1), "{stats}");
}

/// The pod agent in a memory cgroup of the shipped DaemonSet's limit, with a
/// budget a little over what it holds with no pod: the pods past it are
/// left ungated and shown refused for memory (never gated and refused at
/// once), the agent lives and is never OOM-killed, and a refused pod is
/// gated once the gated ones go.
#[test]
fn pods_past_the_memory_budget_are_refused_until_there_is_room() {
    use shed_testkit::gate::{Log, poll};

    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod5", "10.233.77.0/24").expect("a private containerd");
    let socket = runtime.socket().display().to_string();
    const METRICS: &str = "127.0.0.1:19481";
    let healthy = || {
        TcpStream::connect_timeout(&METRICS.parse().unwrap(), Duration::from_millis(200)).is_ok()
            && shed_testkit::metrics::http_get(METRICS, "/healthz").0 == "HTTP/1.1 200 OK"
    };
    // What the agent holds with no pod (its shared programs and tables), in
    // a cgroup of its own: what it frees after it exits is not charged to the next.
    let held_mib = {
        let cgroup = MemoryCgroup::create("shed-e2e-pod-idle", shed_testkit::cgroup::daemonset_memory_limit());
        let args = ["--pods", "--cri-socket", &socket, "--metrics", METRICS];
        let idle = Gate::spawn(cgroup.shedctl(), &args, Log::Capture).expect("the agent");
        poll(Duration::from_secs(20), "the agent up", healthy, |&up| up);
        std::thread::sleep(Duration::from_secs(2));
        let held = cgroup.current() >> 20;
        drop(idle);
        held
    };
    // Room for two pods setting up at once (4 MiB booked each), or about ten
    // set up (about 1 MiB each, B10): of 20 pods, some are refused.
    let cgroup = MemoryCgroup::create("shed-e2e-pod-budget", shed_testkit::cgroup::daemonset_memory_limit());
    let budget = (held_mib + 10).to_string();
    let args = ["--pods", "--cri-socket", &socket, "--metrics", METRICS, "--memory-budget", &budget];
    let gate = Gate::spawn(cgroup.shedctl(), &args, Log::Capture).expect("the agent");
    poll(Duration::from_secs(20), "the agent up again", healthy, |&up| up);
    let asks = [("shed.io/ports", "8080"), ("shed.io/limit", "10")];
    let pods: Vec<_> = (0..20).map(|i| runtime.run_pod(&format!("m{i}"), &asks).expect("pod")).collect();
    let refused_for_memory = |pod: &str| {
        let scrape = shed_testkit::metrics::scrape(METRICS);
        let labels = [("pod", pod), ("annotation", "memory-budget")];
        scrape.samples.iter().any(|s| {
            s.metric == "shed_pod_refused"
                && s.value == prometheus_parse::Value::Gauge(1.0)
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })
    };
    let gated = |netns: &str| shed_testkit::gate::gated_line(&gate.log(), netns).is_some();
    // Settled: each pod gated or refused for memory.
    let sorted = || {
        let (mut gated_pods, mut refused) = (Vec::new(), Vec::new());
        for (i, pod) in pods.iter().enumerate() {
            match (gated(&pod.netns), refused_for_memory(&format!("m{i}"))) {
                (true, false) => gated_pods.push(i),
                (false, true) => refused.push(i),
                (g, r) => return Err(format!("m{i}: gated {g}, refused for memory {r}")),
            }
        }
        Ok((gated_pods, refused))
    };
    let (gated_pods, refused) =
        poll(Duration::from_secs(20), "every pod gated or refused", sorted, Result::is_ok).expect("settled");
    println!("{held_mib} MiB held with no pod, a budget of {budget} MiB: gated {gated_pods:?}, refused {refused:?}");
    assert!(!gated_pods.is_empty() && !refused.is_empty(), "the budget holds some of the 20 pods, not all");
    // And said in the log, by the pod's name.
    let pod_field = format!("pod=default/m{}", refused[0]);
    let log = gate.log();
    let said = log.lines().any(|l| {
        l.contains("the pod is left ungated until there is room") && l.split_whitespace().any(|w| w == pod_field)
    });
    assert!(said, "the refusal of m{} is logged with its name: {log}", refused[0]);
    let alive = std::path::Path::new(&format!("/proc/{}", gate.pid())).exists();
    assert!(alive && healthy(), "the agent lives: {}", gate.log());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");
    // The gated pods go: their memory comes back, and a refused pod is gated.
    for &i in &gated_pods {
        runtime.remove_pod(&pods[i].id).expect("remove a gated pod");
    }
    poll(
        Duration::from_secs(20),
        "a pod refused for memory gated once there is room",
        || refused.iter().filter(|&&i| gated(&pods[i].netns)).count(),
        |&n| n > 0,
    );
    assert_eq!(cgroup.oom_kills(), 0);
    drop(gate);
}

/// With `--kernel-log`, the node agent's shared programs log a pod's rare
/// path (a first fragment too short to show its TCP header, which could hide
/// a SYN: dropped) in the agent's log, as a node gate's programs do.
#[test]
fn the_pod_agents_kernel_log_reports_a_pods_rare_path() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod6", "10.233.78.0/24").expect("a private containerd");
    let pod = runtime.run_pod("logged", &[("shed.io/ports", "8080")]).expect("pod");
    let socket = runtime.socket().display().to_string();
    let gate = Gate::attach(&["--pods", "--cri-socket", &socket, "--kernel-log"]);
    wait_gated(&gate, &pod.netns);
    let said = "dropped a packet whose headers could hide a SYN";
    assert!(!gate.log().contains(said), "nothing to say yet:\n{}", gate.log());
    // From the node, across the runtime's bridge (its gateway's address), to the pod.
    let [a, b, c, _] = pod.ip.octets();
    let node = std::net::Ipv4Addr::new(a, b, c, 1);
    let raw = testbed::RawSender::new().expect("raw socket");
    let sent = (0..20).filter(|_| raw.send(&testbed::tiny_fragment(node, pod.ip, PORT))).count();
    assert_eq!(sent, 20);
    let log = shed_testkit::gate::poll(
        Duration::from_secs(5),
        "the shared programs' log line",
        || gate.log(),
        |log| log.contains(said),
    );
    assert!(log.lines().any(|l| l.contains(said) && l.contains("WARN")), "a warning:\n{log}");
    assert!(gate.log().contains("one set of programs"), "under the shared object:\n{}", gate.log());
}

/// The kernel's `/sys/kernel/rcu_expedited`, put back as it was when dropped.
struct RcuSwitch(String);

impl RcuSwitch {
    const PATH: &str = "/sys/kernel/rcu_expedited";
    const MARK: &str = "/run/shed/rcu-expedited";

    fn save() -> Self {
        Self(std::fs::read_to_string(Self::PATH).expect("read /sys/kernel/rcu_expedited").trim().to_owned())
    }

    fn set(on: bool) {
        std::fs::write(Self::PATH, if on { "1" } else { "0" }).expect("write /sys/kernel/rcu_expedited");
    }

    fn on() -> bool {
        std::fs::read_to_string(Self::PATH).unwrap().trim() != "0"
    }
}

impl Drop for RcuSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
        let _ = std::fs::remove_file(Self::MARK);
    }
}

/// Pods found together queue to attach, and the agent expedites the
/// kernel's grace periods only while they wait: the switch is off again once
/// they are gated. One that a dead agent left on (its mark says so) is turned
/// off at the next agent's start; one the operator turned on stays on.
#[test]
fn rcu_grace_periods_are_expedited_only_while_pods_queue_and_left_as_found() {
    let _one = exclusive();
    let _saved = RcuSwitch::save();
    let mut runtime = Runtime::start("shedpod4", "10.233.75.0/24").expect("a private containerd");
    let socket = runtime.socket().display().to_string();
    let asks = [("shed.io/ports", "8080"), ("shed.io/limit", "4")];
    // There before the agent: its first look sets all eight up at once, and they queue to attach.
    let names: Vec<String> = (0..8).map(|i| format!("burst-{i}")).collect();
    let pods = runtime.run_pods_together(&names, &asks).expect("pods");
    let agent = || {
        let gate = Gate::spawn(
            std::path::Path::new(&shed_testkit::gate::shedctl_path()),
            &["--pods", "--cri-socket", &socket],
            shed_testkit::gate::Log::Capture,
        )
        .expect("start the agent");
        for (pod, _) in &pods {
            wait_gated(&gate, &pod.netns);
        }
        gate
    };
    let mark = std::path::Path::new(RcuSwitch::MARK);
    // What an agent killed mid-burst leaves: the switch on, and its mark.
    RcuSwitch::set(true);
    std::fs::create_dir_all("/run/shed").unwrap();
    std::fs::write(mark, "1").unwrap();
    let gate = agent();
    let log = gate.log();
    assert!(log.contains("the agent before this one died while pods queued to attach"), "{log}");
    assert!(log.contains("pods queue to attach: RCU grace periods expedited"), "{log}");
    assert!(!RcuSwitch::on() && !mark.exists(), "off, its mark gone, once every pod attached: {log}");
    drop(gate);
    // The operator's switch: on, no mark. Neither a burst nor the agent's end turns it off.
    RcuSwitch::set(true);
    let gate = agent();
    let log = gate.log();
    drop(gate);
    assert!(RcuSwitch::on() && !mark.exists(), "the operator's switch stays on: {log}");
    assert!(!log.contains("RCU grace periods expedited"), "not the agent's to turn: {log}");
}

/// The emergency off, one command each, on a node agent with real pods:
/// `set --all --dry-run` lets every pod's refused connection through (and
/// `--dry-run=off` ends it); `detach --pod` ungates one pod and leaves the
/// other judged; `detach --now` removes everything at once, with no pod left
/// judged for a next agent (a plain SIGTERM leaves them for a minute). The
/// metrics show the runtime up and the pods by state, and /healthz covers
/// the pod loop.
#[test]
fn a_node_agent_is_turned_off_at_once_pod_by_pod_or_into_dry_run() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedoff", "10.233.74.0/24").expect("a private containerd");
    let limited = [
        ("shed.io/ports", "8080"),
        ("shed.io/limit", "1"),
        ("shed.io/count", "connections"),
        ("shed.io/action", "rst"),
    ];
    let web = runtime.run_pod("web", &limited).expect("pod");
    let api = runtime.run_pod("api", &limited).expect("pod");
    let addr = |pod: &shed_testkit::cri::Pod| SocketAddr::from((pod.ip, PORT));
    let _servers: Vec<Backend> = [&web, &api]
        .iter()
        .map(|p| Backend::start(&p.netns, addr(p), Service::Echo).expect("server in the pod"))
        .collect();
    let socket = runtime.socket().display().to_string();
    const METRICS: &str = "127.0.0.1:19481";
    let mut gate = Gate::attach(&["--pods", "--cri-socket", &socket, "--metrics", METRICS]);
    wait_gated(&gate, &web.netns);
    wait_gated(&gate, &api.netns);
    let gated = |m: &prometheus_parse::Scrape| shed_testkit::metrics::value(m, "shed_pods", &[("state", "gated")]);
    let scrape = shed_testkit::gate::poll(
        Duration::from_secs(5),
        "both pods counted gated",
        || shed_testkit::metrics::scrape(METRICS),
        |m| gated(m) == 2.0,
    );
    assert_eq!(shed_testkit::metrics::value(&scrape, "shed_cri_up", &[]), 1.0);
    assert!(shed_testkit::metrics::value(&scrape, "shed_cri_last_success_timestamp_seconds", &[]) > 1.7e9);
    assert_eq!(shed_testkit::metrics::http_get(METRICS, "/healthz").0, "HTTP/1.1 200 OK");
    let over_limit = |pod: &shed_testkit::cri::Pod| {
        let held = echo(addr(pod)).expect("the first connection");
        let second = echo(addr(pod)).map(drop).map_err(|e| e.kind());
        drop(held);
        // Its close is counted before the next try.
        std::thread::sleep(Duration::from_millis(300));
        second
    };
    assert!(over_limit(&web).is_err() && over_limit(&api).is_err(), "both pods hold their limit of 1");

    // Global dry-run: nothing refused anywhere, until it is ended.
    let out = shedctl(&["set", "--all", "--dry-run"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((over_limit(&web), over_limit(&api)), (Ok(()), Ok(())), "dry-run everywhere");
    let out = shedctl(&["set", "--all", "--dry-run=off"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(over_limit(&web).is_err(), "dry-run ended: the limit holds again");

    // One pod off: web passes, api is still judged.
    let out = shedctl(&["detach", "--pod", "default/web"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    shed_testkit::gate::poll(Duration::from_secs(5), "web ungated", || stats_of(&web.netns), Option::is_none);
    assert_eq!(over_limit(&web), Ok(()), "web is no longer judged");
    assert!(over_limit(&api).is_err(), "api is still judged");

    // Everything off at once: no pod left judged for a next agent.
    let out = shedctl(&["detach", "--now"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && said.contains("no handover"), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!gate.is_running(), "the agent stopped");
    assert!(shed::kernel::handover::left().is_empty(), "no links left for a successor");
    assert_eq!(over_limit(&api), Ok(()), "api passes at once, not after a lease");
    assert!(
        shed_testkit::gate::shed_programs_left(&[]).is_empty(),
        "no program left: {:?}",
        shed_testkit::gate::loaded_shed_programs()
    );
}

/// A node agent's cost stays flat in the connections its pods hold, and in
/// a trickle of requests. Each gate wakes as often as its ports need
/// (`daemon::pace`): an idle kept-alive connection owes no answer, so pods
/// that hold them are as quiet as pods that hold none (they were not,
/// where connections are counted: each such pod ran ten windows a second,
/// 0.35-0.55% of a core apiece), and a pod serving a request a second
/// judges one window a second, not ten. Measured over 8 s spans (fewer
/// tenths of a percent than that would be noise).
#[test]
fn a_node_agents_cost_stays_flat_in_the_connections_its_pods_hold_and_a_trickle_of_requests() {
    let _one = exclusive();
    let mut runtime = Runtime::start("shedpod9", "10.233.79.0/24").expect("a private containerd");
    let asks = [
        ("shed.io/ports", "8080"),
        ("shed.io/limit", "50"),
        ("shed.io/count", "connections"),
        ("shed.io/action", "rst"),
    ];
    let pods: Vec<_> = (0..4).map(|i| runtime.run_pod(&format!("flat{i}"), &asks).expect("pod")).collect();
    let addr = |pod: &shed_testkit::cri::Pod| SocketAddr::from((pod.ip, PORT));
    let _servers: Vec<Backend> =
        pods.iter().map(|p| Backend::start(&p.netns, addr(p), Service::Echo).expect("server in the pod")).collect();
    let socket = runtime.socket().display().to_string();
    let gate = Gate::attach(&["--pods", "--cri-socket", &socket]);
    for pod in &pods {
        wait_gated(&gate, &pod.netns);
    }
    const SPAN: Duration = Duration::from_secs(8);
    // Past the set-up, and each gate past its first look's busy seconds.
    std::thread::sleep(Duration::from_secs(5));
    let none_held = gate.cpu_percent_over(SPAN);
    // Three pods hold nine kept-alive connections each, answered and idle.
    let mut held: Vec<Vec<TcpStream>> =
        pods[..3].iter().map(|p| (0..9).map(|_| echo(addr(p)).expect("a kept-alive connection")).collect()).collect();
    for pod in &pods[..3] {
        let stats = stats_of(&pod.netns).expect("gated");
        assert_eq!(stats[0]["established"], 9, "{stats}");
    }
    std::thread::sleep(Duration::from_secs(3));
    let holding = gate.cpu_percent_over(SPAN);
    // Then a request a second on each of those pods, for the span and the seconds before it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut asked = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for conns in &mut held {
                    let conn = &mut conns[asked % 9];
                    let mut buf = [0u8; 2];
                    conn.write_all(b"hi").and_then(|()| conn.read_exact(&mut buf)).expect("answered");
                }
                asked += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            asked
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    let trickling = gate.cpu_percent_over(SPAN);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let asked = trickle.join().expect("the trickle");
    eprintln!(
        "agent CPU: {none_held:.3}% none held, {holding:.3}% holding 27, {trickling:.3}% with a request a second to three pods ({asked} rounds)"
    );
    let bound = 1.5 * none_held + 0.2;
    assert!(
        holding <= bound,
        "holding 27 idle connections: {holding:.3}% of a core, against {none_held:.3}% with none"
    );
    assert!(
        trickling <= bound,
        "a request a second to three pods: {trickling:.3}% of a core, against {none_held:.3}% idle"
    );
    assert!(asked >= 12, "the trickle ran through the span: {asked} rounds");
}
