// SPDX-License-Identifier: MIT OR Apache-2.0
//! Operating the gate: the Prometheus endpoint, `shedctl top` and the config
//! file, end to end against the real kernel programs. Needs root.
mod support;

use std::{net::SocketAddr, time::Duration};

use shed_testkit::testbed::{self, Backend, Outcome, Service, Testbed};
use support::{
    gate::{Gate, exclusive, field, shedctl, stats, wait_for_stats},
    metrics::{http_get, value},
};

const PORT: u16 = 8080;
const METRICS: &str = "127.0.0.1:19464";

fn scrape() -> prometheus_parse::Scrape {
    support::metrics::scrape(METRICS)
}

fn histogram(scrape: &prometheus_parse::Scrape, metric: &str) -> Vec<(f64, f64)> {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && s.labels.get("port") == Some("8080"))
        .unwrap_or_else(|| panic!("no histogram {metric}"));
    match &sample.value {
        prometheus_parse::Value::Histogram(buckets) => buckets.iter().map(|b| (b.less_than, b.count)).collect(),
        other => panic!("{metric} is not a histogram: {other:?}"),
    }
}

#[test]
fn attach_from_a_config_file_serves_metrics_that_agree_with_stats_json() {
    let _one = exclusive();
    let bed = Testbed::create("shedm").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let service_us = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(5_000));
    let _backend = Backend::start(&bed.server_ns, addr, Service::Workers { workers: 2, service_us }).expect("backend");
    // The settings come from a config file; the testbed's --netns and --iface are flags.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shed.toml");
    std::fs::write(
        &config,
        format!("ports = [8080]\nlimit = 3\naction = \"rst\"\ncount = \"connections\"\nmetrics = \"{METRICS}\"\n"),
    )
    .unwrap();
    let gate = Gate::start(&bed, &["--config", config.to_str().unwrap()]);

    // Answered requests fill the latency histograms; three held connections
    // fill the limit and five more are shed with an RST.
    let answered = testbed::run_in(&bed.client_ns, move || {
        (0..20).filter(|_| matches!(testbed::request(addr, Duration::from_secs(2)), Outcome::Answered(_))).count()
    })
    .unwrap();
    assert_eq!(answered, 20);
    // The last answered connection still counts until the backend has closed it
    // (the client's FIN makes it owe an answer again); then hold exactly three.
    wait_for_stats(PORT, Duration::from_secs(5), "nothing in flight", |s| field(s, "in_flight") == 0);
    let held = testbed::run_in(&bed.client_ns, move || {
        let held: Vec<_> = (0..3).map(|_| testbed::connect(addr, Duration::from_secs(1)).expect("admitted")).collect();
        let refused = (0..5).filter(|_| testbed::connect(addr, Duration::from_secs(1)).is_err()).count();
        (held, refused)
    })
    .unwrap();
    assert_eq!(held.1, 5);
    let stats = wait_for_stats(PORT, Duration::from_secs(5), "3 established, 5 rejected", |s| {
        field(s, "established") == 3 && field(s, "rejected") == 5
    });

    let m = scrape();
    let port = [("port", "8080")];
    type Series<'a> = (&'a str, &'a [(&'a str, &'a str)], u64);
    let pairs: [Series; 9] = [
        ("shed_limit", &port, field(&stats, "limit")),
        ("shed_in_flight", &port, field(&stats, "in_flight")),
        ("shed_connections", &[("port", "8080"), ("state", "established")], field(&stats, "established")),
        ("shed_connections", &[("port", "8080"), ("state", "pending")], field(&stats, "pending")),
        ("shed_admitted_total", &port, field(&stats, "admitted")),
        (
            "shed_rejected_total",
            &[("port", "8080"), ("reason", "limit")],
            stats["rejected_by_reason"]["limit"].as_u64().unwrap(),
        ),
        ("shed_rst_sent_total", &port, field(&stats, "rst_sent")),
        ("shed_syn_seen_total", &port, field(&stats, "syn_seen")),
        (
            "shed_tier_rejected_total",
            &[("port", "8080"), ("tier", "normal")],
            stats["tiers"]["normal"]["rejected"].as_u64().unwrap(),
        ),
    ];
    for (metric, labels, expected) in pairs {
        assert_eq!(value(&m, metric, labels), expected as f64, "{metric}{labels:?} vs stats --json {stats}");
    }
    assert_eq!((field(&stats, "limit"), field(&stats, "admitted"), field(&stats, "rst_sent")), (3, 23, 5));
    assert_eq!(value(&m, "shed_rejected_total", &[("port", "8080"), ("reason", "client_cap")]), 0.0);
    assert_eq!(value(&m, "shed_port_info", &[("port", "8080"), ("algo", "fixed"), ("action", "rst")]), 1.0);
    // At least the attach's own limit; the fixed controller may log it again per window.
    assert!(value(&m, "shed_limit_decisions_total", &[("port", "8080"), ("reason", "operator")]) >= 1.0);

    // Real histograms: cumulative, +Inf equals _count, and every answered request
    // (5 ms service) lands between 4 ms and 1 s.
    for metric in ["shed_queue_wait_seconds", "shed_service_seconds", "shed_sojourn_seconds"] {
        let buckets = histogram(&m, metric);
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{metric} cumulative: {buckets:?}");
        let (last_edge, total) = *buckets.last().unwrap();
        assert!(last_edge.is_infinite());
        assert_eq!(value(&m, &format!("{metric}_count"), &port), total, "{metric}");
    }
    let sojourn = histogram(&m, "shed_sojourn_seconds");
    let total = sojourn.last().unwrap().1;
    assert!(total >= 20.0, "every answered request is a sample: {sojourn:?}");
    let below = |edge: f64| sojourn.iter().find(|(e, _)| *e >= edge).map_or(0.0, |b| b.1);
    assert_eq!(below(0.004), 0.0, "a 5 ms service cannot answer within 4 ms: {sojourn:?}");
    assert_eq!(below(1.0), total, "{sojourn:?}");
    let sum = value(&m, "shed_sojourn_seconds_sum", &port);
    assert!((0.004 * total..=1.0 * total).contains(&sum), "sum {sum} of {total}");
    let baseline_us = field(&stats, "baseline_us") as f64;
    assert_eq!(value(&m, "shed_baseline_seconds", &port), baseline_us / 1e6, "baseline vs stats {stats}");

    assert_eq!(http_get(METRICS, "/").0, "HTTP/1.1 404 Not Found");
    every_metric_the_dashboard_and_rules_query_is_served(&m);
    one_vocabulary_in_stats_json_the_scrape_and_the_docs(&stats, &m);
    assert_eq!(value(&m, "shed_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert!(value(&m, "process_resident_memory_bytes", &[]) > 1e6 && value(&m, "process_open_fds", &[]) > 3.0);
    assert_eq!(http_get(METRICS, "/healthz"), ("HTTP/1.1 200 OK".to_owned(), "ok\n".to_owned()));

    // A client that never finishes its request stalls nobody.
    let mut slow = std::net::TcpStream::connect(METRICS).unwrap();
    std::io::Write::write_all(&mut slow, b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    let start = std::time::Instant::now();
    assert_eq!(http_get(METRICS, "/metrics").0, "HTTP/1.1 200 OK");
    assert!(start.elapsed() < Duration::from_secs(1), "scrape beside a stuck client took {:?}", start.elapsed());
    drop(slow);

    // `shedctl top` reads the same maps: one frame as text.
    let out = shedctl(&["top", "--once", "--interval", "200", "--size", "110x24"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let screen = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "port 8080 · fixed",
        "action rst",
        "limit 3",
        "in-flight 3",
        "established 3",
        "normal",
        "sojourn",
        "queue wait",
    ] {
        assert!(screen.contains(expected), "{expected:?} not in top's frame:\n{screen}");
    }
    // The summary fits the 110 columns: its last figure is whole, not cut at the frame.
    let summary = screen.lines().find(|l| l.contains("in-flight 3")).expect("the summary line");
    let inside = summary.trim_end().trim_end_matches('│').trim_end();
    assert!(inside.ends_with("/s") || inside.ends_with("kept-alive)"), "top's summary is cut: {summary}");
    let refused = shedctl(&["top", "--once", "--port", "9"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("port 9 is not protected"));
    drop(held);
    drop(gate);
}

/// `/readyz` turns not ready while the gate sheds past `--ready-max-shed`
/// over `--ready-window`, and ready again when the shedding stops.
#[test]
fn readyz_follows_the_shed_share() {
    let _one = exclusive();
    let bed = Testbed::create("shedrz").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let endpoint = "127.0.0.1:19465";
    let _gate = Gate::start(
        &bed,
        &["--port", "8080", "--limit", "1", "--action", "rst", "--metrics", endpoint, "--ready-window", "2"],
    );
    assert_eq!(http_get(endpoint, "/readyz"), ("HTTP/1.1 200 OK".to_owned(), "ready\n".to_owned()));
    // One connection holds the only slot; 40 more are shed at once.
    let held = testbed::run_in(&bed.client_ns, move || {
        let held = testbed::connect(addr, Duration::from_secs(1)).expect("admitted");
        let refused = (0..40).filter(|_| testbed::connect(addr, Duration::from_secs(1)).is_err()).count();
        (held, refused)
    })
    .unwrap();
    assert_eq!(held.1, 40);
    let (status, why) = support::gate::poll(
        Duration::from_secs(5),
        "/readyz not ready",
        || http_get(endpoint, "/readyz"),
        |(status, _)| status == "HTTP/1.1 503 Service Unavailable",
    );
    assert!(why.contains("shedding") && why.contains("not ready above 50%"), "{status}: {why}");
    // No more attempts: once the window has passed, ready again.
    support::gate::poll(
        Duration::from_secs(6),
        "/readyz ready again",
        || http_get(endpoint, "/readyz").0,
        |s| s == "HTTP/1.1 200 OK",
    );
    drop(held);
}

/// The metric names in a PromQL text: `shed_*` and `process_*` words.
fn metric_names(promql: &str) -> Vec<String> {
    promql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("shed_") || w.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// Every query of deploy/grafana's dashboard and every metric deploy/prometheus's
/// rules read names a series this live gate serves (a renamed metric breaks here,
/// not on an operator's screen).
fn every_metric_the_dashboard_and_rules_query_is_served(m: &prometheus_parse::Scrape) {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    let mut served = std::collections::BTreeSet::new();
    // Families declared without a series here count too: shed_pod_refused has one
    // only on a node agent with a refused pod (tests/e2e_pods.rs reads it there).
    served.extend(m.docs.keys().filter(|name| name.as_str() == "shed_pod_refused").cloned());
    for s in &m.samples {
        served.insert(s.metric.clone());
        if matches!(s.value, prometheus_parse::Value::Histogram(_)) {
            for suffix in ["_bucket", "_count", "_sum"] {
                served.insert(format!("{}{suffix}", s.metric));
            }
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{deploy}/grafana/shed-dashboard.json")).unwrap())
            .unwrap();
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    let rules = std::fs::read_to_string(format!("{deploy}/prometheus/shed-rules.yml")).unwrap();
    queries.extend(rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(str::to_owned));
    for query in &queries {
        for name in metric_names(query) {
            assert!(served.contains(&name), "{name} (in `{query}`) is not served; served: {served:?}");
        }
    }
}

/// `stats --json` has exactly the fields the vocabulary names, in its order;
/// the scrape serves every metric it names; every served family is in the
/// operations guide; `--print-config` writes only keys that are flags.
fn one_vocabulary_in_stats_json_the_scrape_and_the_docs(stats: &serde_json::Value, m: &prometheus_parse::Scrape) {
    use shed::observe::vocabulary::{TERMS, flag};
    let fields: Vec<&str> = stats.as_object().unwrap().keys().map(String::as_str).collect();
    let named: Vec<&str> = TERMS.iter().map(|t| t.json).collect();
    let mut sorted = (fields.clone(), named.clone());
    sorted.0.sort_unstable();
    sorted.1.sort_unstable();
    assert_eq!(sorted.0, sorted.1, "stats --json fields vs shed::observe::vocabulary::TERMS");
    let served: std::collections::BTreeSet<&str> = m.samples.iter().map(|s| s.metric.as_str()).collect();
    for term in TERMS {
        if let Some(metric) = term.metric {
            assert!(served.contains(metric), "{} names {metric}, which is not served: {served:?}", term.json);
        }
    }
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/OPERATIONS.md")).unwrap();
    for metric in served.iter().filter(|n| n.starts_with("shed_")) {
        // A histogram's _count and _sum go with its family's name.
        let family = metric.strip_suffix("_count").or(metric.strip_suffix("_sum")).unwrap_or(metric);
        let named = guide.contains(&format!("`{family}`")) || guide.contains(&format!("`{family}{{"));
        assert!(named, "{metric} is served but not named in docs/OPERATIONS.md");
    }
    for term in TERMS {
        assert!(
            guide.contains(&format!("`{}`", term.json)),
            "stats field `{}` is not in docs/OPERATIONS.md",
            term.json
        );
        if matches!(term.kind, shed::observe::vocabulary::Kind::Setting { .. }) {
            assert!(
                guide.contains(&format!("`--{}`", flag(term.json))),
                "--{} is not in docs/OPERATIONS.md",
                flag(term.json)
            );
        }
    }
    let out = shedctl(&["attach", "--print-config", "--port", "8080", "--limit", "5"]);
    let table: toml::Table = String::from_utf8_lossy(&out.stdout).parse().expect("--print-config writes TOML");
    for key in table.keys() {
        assert!(shed::cli::config::has_key(key), "--print-config wrote `{key}`, which is not a key");
    }
}

/// SIGHUP re-reads the config file: what can change live is applied (and
/// audited), what takes a restart is named, and a bad file changes nothing.
#[test]
fn sighup_reloads_the_config_and_refuses_a_bad_one() {
    let _one = exclusive();
    let bed = Testbed::create("shedhu").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shed.toml");
    std::fs::write(&config, "ports = [8080]\nlimit = 3\naction = \"rst\"\n").unwrap();
    let gate = Gate::start(&bed, &["--config", config.to_str().unwrap()]);
    let hup = || {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(gate.pid(), libc::SIGHUP) }, 0);
    };
    std::fs::write(
        &config,
        "ports = [8080]\nlimit = 5\naction = \"drop\"\ndry-run = true\nmetrics = \"127.0.0.1:19466\"\n[tiers]\n\"10.1.0.0/16\" = \"low\"\n",
    )
    .unwrap();
    hup();
    let s = wait_for_stats(PORT, Duration::from_secs(3), "the reloaded settings", |s| {
        field(s, "limit") == 5 && s["action"] == "drop" && s["dry_run"] == true
    });
    assert_eq!(s["algo"], "fixed", "{s}");
    let tiers = shedctl(&["tier", "ls", "--json"]);
    assert!(String::from_utf8_lossy(&tiers.stdout).contains("\"cidr\":\"10.1.0.0/16\",\"tier\":\"low\""));
    let log =
        support::gate::poll(Duration::from_secs(3), "the audit line", || gate.log(), |l| l.contains("operator change"));
    assert!(log.contains("settings that take a restart") && log.contains("changed=metrics"), "{log}");
    assert!(log.contains("action rst -> drop, dry-run off -> on") && log.contains("SIGHUP: reload of"), "{log}");
    // A file that fails a check: refused whole, the running settings kept.
    std::fs::write(&config, "ports = [8080]\nlimit = 9\naction = \"rst\"\nwindow = 1\n").unwrap();
    hup();
    let log =
        support::gate::poll(Duration::from_secs(3), "the refusal", || gate.log(), |l| l.contains("reload refused"));
    assert!(log.contains("nothing changed") && log.contains("out of range"), "{log}");
    let s = support::gate::stats(PORT);
    assert_eq!((field(&s, "limit"), s["action"].as_str()), (5, Some("drop")), "{s}");
}

/// `shedctl config save` writes the live settings back, keeping the file's
/// other keys, as a file `attach` accepts.
#[test]
fn config_save_writes_the_live_settings_back() {
    let _one = exclusive();
    let bed = Testbed::create("shedcs").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shed.toml");
    std::fs::write(&config, "ports = [8080]\nlimit = 3\naction = \"rst\"\nmetrics = \"127.0.0.1:19467\"\n").unwrap();
    let _gate = Gate::start(&bed, &["--config", config.to_str().unwrap()]);
    for args in [
        &["set", "--port", "8080", "--action", "drop", "--algo", "queue", "--max-limit", "300"][..],
        &["tier", "add", "10.1.0.0/16", "low"],
    ] {
        let out = shedctl(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = shedctl(&["config", "save", "--file", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&config).unwrap();
    for expected in [
        "action = \"drop\"",
        "algo = \"queue\"",
        "max-limit = 300",
        "metrics = \"127.0.0.1:19467\"",
        "\"10.1.0.0/16\" = \"low\"",
    ] {
        assert!(text.contains(expected), "{expected} in:\n{text}");
    }
    assert!(!text.lines().any(|l| l.starts_with("limit ")), "an adaptive limiter has no fixed limit:\n{text}");
    assert!(text.contains(&format!("netns = [\"{}\"]", bed.server_ns)), "the gated namespace is kept:\n{text}");
    // Saved to a new file too, the namespace the gate judges is written.
    let fresh = dir.path().join("new.toml");
    let out = shedctl(&["config", "save", "--file", fresh.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&fresh).unwrap();
    assert!(text.contains(&format!("netns = [\"{}\"]", bed.server_ns)), "a new file names the namespace:\n{text}");
    let cli = shed::cli::config::parse_cli(["shedctl", "attach", "--config", config.to_str().unwrap()]).unwrap();
    let shed::cli::Command::Attach(args) = cli.command else { panic!() };
    let (control, _) = args.control().unwrap();
    assert_eq!((shed::control::Algo::from_raw(control.algo), control.max_limit), (shed::control::Algo::Queue, 300));
}

/// `shedctl`'s exit status says what kind of failure it was (documented in
/// OPERATIONS, "Exit codes"): 2 for flags that do not go together, 4 for a
/// request the running gate refuses before anything changes, 3 when no gate
/// runs, 0 on success.
#[test]
fn exit_codes_tell_usage_refusal_and_absence_apart() {
    let _one = exclusive();
    let status = |args: &[&str]| shedctl(args).status.code();
    assert_eq!(status(&["attach", "--port", "443", "--action", "http"]), Some(2), "http on a TLS port");
    assert_eq!(status(&["attach", "--port", "8080", "--limit", "nope"]), Some(2), "clap's own usage error");
    {
        let bed = Testbed::create("shedex").expect("testbed");
        let addr: SocketAddr = bed.server_addr(false, PORT);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let _gate = Gate::start(&bed, &["--port", "8080", "--limit", "5"]);
        assert_eq!(status(&["stats", "--json"]), Some(0));
        assert_eq!(status(&["set", "--port", "9999", "--limit", "5"]), Some(4), "a port the gate does not protect");
    }
    assert_eq!(status(&["stats"]), Some(3), "no gate running");
    // Each documented refusal exits by the contract (2: the command line or
    // config; 4: refused before anything changed), never 1, which systemd's
    // Restart=on-failure would restart in a loop. Each fails before a gate starts.
    let bed = Testbed::create("shedex2").expect("testbed");
    let unreadable = "/nonexistent/shed-token";
    let twice = [&["--netns", &bed.server_ns][..], &["--netns", &bed.server_ns][..]].concat();
    let cases: [(Vec<&str>, i32, &str); 5] = [
        (vec!["attach", "--port", "8080", "--netns", "host"], 2, "--netns host"),
        ([&["attach", "--port", "8080"][..], &twice[..]].concat(), 2, "a namespace given twice"),
        (vec!["attach", "--port", "8080", "--netns", "shed-no-such-ns"], 4, "an unknown --netns"),
        (
            vec!["attach", "--port", "8080", "--metrics", "127.0.0.1:19465", "--metrics-token-file", unreadable],
            4,
            "an unreadable --metrics-token-file",
        ),
        (vec!["pods", "--cri-socket", "auto"], 4, "pods with no CRI socket"),
    ];
    for (args, code, what) in cases {
        // `pods` with `auto` finds a socket where a runtime runs: then there is nothing to refuse.
        if args[0] == "pods" && shed::host::cri::KNOWN_SOCKETS.iter().any(|p| std::path::Path::new(p).exists()) {
            continue;
        }
        let out = shedctl(&args);
        assert_eq!(out.status.code(), Some(code), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        // --print-config refuses what attach refuses, with the same status.
        if args[0] == "attach" {
            let printed = shedctl(&[&args[..], &["--print-config"][..]].concat());
            assert_eq!(
                printed.status.code(),
                Some(code),
                "--print-config, {what}: {}",
                String::from_utf8_lossy(&printed.stderr)
            );
        }
    }
    {
        let addr: SocketAddr = bed.server_addr(false, PORT);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let _gate = Gate::start(&bed, &["--port", "8080"]);
        let out = shedctl(&["set", "--port", "8080", "--limit", "2"]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "set --limit below --min-limit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Under systemd (`Type=notify`): READY=1 comes once the port is judged (a
/// connection made the moment it arrives is judged at its handshake), the
/// watchdog is fed while the control loop lives, and STOPPING=1 on SIGTERM.
#[test]
fn systemd_hears_ready_once_the_port_is_judged_then_the_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let _one = exclusive();
    let bed = Testbed::create("notify").unwrap();
    let _backend = Backend::start(&bed.server_ns, bed.server_addr(false, 8080), Service::Echo).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let systemd = UnixDatagram::bind(&path).unwrap();
    systemd.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let shedctl = support::gate::shedctl_path();
    let env = [("NOTIFY_SOCKET", path.to_str().unwrap()), ("WATCHDOG_USEC", "1000000")];
    let args = ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080"];
    let mut gate = Gate::spawn_env(std::path::Path::new(&shedctl), &args, support::gate::Log::Capture, &env).unwrap();
    let next = || {
        let mut buf = [0u8; 256];
        let n = systemd.recv(&mut buf).unwrap_or_else(|e| panic!("no notification: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next();
    assert!(ready.starts_with("READY=1\nSTATUS=gating port(s) 8080\nMAINPID="), "{ready}");
    let addr = bed.server_addr(false, 8080);
    let conn = testbed::run_in(&bed.client_ns, move || testbed::connect(addr, Duration::from_secs(2))).unwrap();
    assert!(conn.is_ok(), "{conn:?}");
    let s = stats(8080);
    assert_eq!((field(&s, "admitted"), field(&s, "late_completed")), (1, 0), "judged from READY on: {s}");
    // Half of WATCHDOG_USEC apart, while the loop lives.
    assert_eq!(next(), "WATCHDOG=1");
    assert_eq!(next(), "WATCHDOG=1");
    drop(conn);
    assert!(gate.stop().success(), "{}", gate.log());
    assert_eq!(next(), "STOPPING=1");
}

/// `--metrics-token-file`: `/metrics` answers only a scrape that carries the
/// token (every tenant's series are behind it on a node's host network);
/// `/healthz` and `/readyz` stay open for probes. An empty token file, or a
/// token with nothing to guard, is refused at attach with the fix.
#[test]
fn metrics_answer_only_a_scrape_with_the_token() {
    const ADDR: &str = "127.0.0.1:19492";
    let _one = exclusive();
    let bed = Testbed::create("shedmt").expect("testbed");
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-Token_42\n").unwrap();
    let token = token_file.to_str().unwrap();
    let shedctl_path = std::path::PathBuf::from(shed_testkit::gate::shedctl_path());
    let base = ["--netns", bed.server_ns.as_str(), "--iface", bed.server_if.as_str(), "--port", "8080"];
    let refused = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        Gate::launch(&shedctl_path, &args, shed_testkit::gate::Log::Capture)
            .err()
            .unwrap_or_else(|| panic!("attach {extra:?} is refused"))
            .to_string()
    };
    let why = refused(&["--metrics-token-file", token]);
    assert!(why.contains("--metrics-token-file") && why.contains("give --metrics too"), "{why}");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, " \n").unwrap();
    let why = refused(&["--metrics", ADDR, "--metrics-token-file", empty.to_str().unwrap()]);
    assert!(why.contains("it is empty") && why.contains("write one token"), "{why}");

    let args: Vec<&str> = base.iter().copied().chain(["--metrics", ADDR, "--metrics-token-file", token]).collect();
    let _gate = Gate::attach(&args);
    let get = |path: &str, headers: &[&str]| support::metrics::http_get_with(ADDR, path, headers);
    let (status, body) = get("/metrics", &[]);
    assert_eq!(status, "HTTP/1.1 401 Unauthorized", "{body}");
    assert!(body.contains("Authorization: Bearer") && !body.contains("shed_limit"), "{body}");
    for wrong in [
        "Authorization: Bearer s3cret-Token_4",
        "Authorization: Bearer s3cret-Token_43",
        "Authorization: s3cret-Token_42",
    ] {
        assert_eq!(get("/metrics", &[wrong]).0, "HTTP/1.1 401 Unauthorized", "{wrong}");
    }
    let (status, body) = get("/metrics", &["Authorization: Bearer s3cret-Token_42"]);
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.contains("shed_limit{"), "{body}");
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(get(probe, &[]).0, "HTTP/1.1 200 OK", "{probe} needs no token");
    }
}

/// Network namespaces the guides name (`--netns web --netns api`), created
/// for a test (loopback up) and deleted after it.
struct NamedNamespaces(Vec<&'static str>);

impl NamedNamespaces {
    fn create(names: &[&'static str]) -> Self {
        for name in names {
            let _ = std::process::Command::new("ip").args(["netns", "del", name]).status();
            let ok = std::process::Command::new("ip").args(["netns", "add", name]).status().unwrap().success()
                && std::process::Command::new("ip")
                    .args(["-n", name, "link", "set", "lo", "up"])
                    .status()
                    .unwrap()
                    .success();
            assert!(ok, "create the namespace {name}");
        }
        Self(names.to_vec())
    }
}

impl Drop for NamedNamespaces {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = std::process::Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Runs `shedctl <args>` as an operator would. A live view (`top`, `stats
/// --watch`) must still be running after 1.5 s, having printed something,
/// and is then stopped; any other command must exit 0 within 5 s. Returns
/// what it printed. `top` draws on a terminal: it runs on one (`script`, from
/// bsdutils, essential in Debian), as an operator's.
fn run_as_documented(args: &[String]) -> Result<String, String> {
    use std::io::Read as _;
    let shedctl = support::gate::shedctl_path();
    let mut command = if args[0] == "top" {
        // `; true` keeps the shell (not top) as the terminal's session
        // leader, and SIGHUP is ignored as under nohup (inherited across
        // exec, and a shell cannot take that back): no SIGHUP ever reaches
        // top, which must still end when its terminal hangs up.
        let line = std::iter::once(shedctl).chain(args.iter().cloned()).collect::<Vec<_>>().join(" ");
        let mut c = std::process::Command::new("script");
        c.args(["-qfec", &format!("{line}; true"), "/dev/null"]);
        // SAFETY: only async-signal-safe work between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                Ok(())
            });
        }
        c
    } else {
        let mut c = std::process::Command::new(shedctl);
        c.args(args);
        c
    };
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let live_view = args[0] == "top" || (args[0] == "stats" && args.iter().any(|a| a == "--watch"));
    let allowed = Duration::from_millis(if live_view { 1_500 } else { 5_000 });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if start.elapsed() > allowed {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    if args[0] == "top" {
        // `script` gone, its terminal hangs up: top, in a session of its own
        // on it, must end too (it once spun a CPU for as long as a gate ran).
        let pattern = format!("^{} top", support::gate::shedctl_path());
        let left = || {
            let out = std::process::Command::new("pgrep").args(["-f", &pattern]).output().expect("pgrep");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let since = std::time::Instant::now();
        while !left().is_empty() && since.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let pids = left();
        if !pids.is_empty() {
            let _ = std::process::Command::new("kill").args(["-9"]).args(pids.split_whitespace()).status();
            return Err(format!("top outlived its terminal by 3 s (pids {pids})"));
        }
    }
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    match (status, live_view) {
        (Some(s), false) if s.success() => Ok(out),
        (Some(s), _) => Err(format!("exited with {s}: {err}")),
        (None, true) if !out.trim().is_empty() => Ok(out),
        (None, true) => Err(format!("ran 1.5 s and printed nothing: {err}")),
        (None, false) => Err(format!("still running after 5 s: {out} {err}")),
    }
}

/// Every `shedctl` command the README and the guides show runs as written:
/// each `attach` comes up and serves (in a test namespace, or in the guides'
/// own `web` and `api`), and every other verb runs against a live gate as
/// the guide sets it up (one namespace gated, or `web` and `api` for the
/// commands that name them) and exits 0 (a live view prints and keeps
/// going). `deploy_files` checks that they parse; this, that they work.
/// Only `shedctl pods` and `attach --pods` need a container runtime: the
/// first runs in `e2e_pods` against containerd, the second is checked with
/// `--print-config` (the plan's own checks) here.
#[test]
fn every_documented_shedctl_command_runs() {
    let _one = exclusive();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commands = shed_testkit::docs::documented_commands(&root);
    let _named = NamedNamespaces::create(&["web", "api"]);
    let bed = Testbed::create("shedcm").expect("testbed");
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let one_namespace = ["--netns", bed.server_ns.as_str(), "--port", "8080", "--limit", "200"];
    let two_namespaces = ["--netns", "web", "--netns", "api", "--port", "8080", "--limit", "200"];
    let (mut gate, mut gate_names_namespaces): (Option<Gate>, bool) = (None, false);
    let mut ran = 0;
    for c in &commands {
        let args = &c.words[1..];
        let at = format!("{}: `{}`", c.doc.display(), c.command);
        let names_namespaces = args.iter().any(|a| a == "--netns");
        match args[0].as_str() {
            "pods" => continue,
            // A pod's gate needs a node agent and a runtime: e2e_pods runs these.
            _ if args.iter().any(|a| a == "--pod") => continue,
            "attach" if args.iter().any(|a| a == "--pods") => {
                let mut checked = args.to_vec();
                checked.push("--print-config".into());
                run_as_documented(&checked).unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            "attach" => {
                drop(gate.take());
                let mut own: Vec<&str> = args[1..].iter().map(String::as_str).collect();
                if !names_namespaces {
                    own.splice(0..0, ["--netns", bed.server_ns.as_str()]);
                }
                let up = Gate::launch(
                    std::path::Path::new(&support::gate::shedctl_path()),
                    &own,
                    support::gate::Log::Capture,
                );
                up.unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            _ => {
                let live = gate.as_mut().is_some_and(Gate::is_running) && gate_names_namespaces == names_namespaces;
                if !live {
                    drop(gate.take());
                    let setup: &[&str] = if names_namespaces { &two_namespaces } else { &one_namespace };
                    gate = Some(Gate::attach(setup));
                    gate_names_namespaces = names_namespaces;
                }
                let out = run_as_documented(args).unwrap_or_else(|e| panic!("{at}: {e}"));
                if args[0] == "stats" && args.iter().any(|a| a == "--json") {
                    let first = out.lines().next().unwrap_or_default();
                    serde_json::from_str::<serde_json::Value>(first)
                        .unwrap_or_else(|e| panic!("{at}: not JSON ({e}): {out}"));
                }
            }
        }
        ran += 1;
    }
    println!("{ran} documented commands ran");
    assert!(ran >= 28, "only {ran} documented commands ran: is the extraction still right?");
}

/// The kernel driver behind `iface` of the current namespace (its sysfs link).
fn driver_of(iface: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/net/{iface}/device/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// A device whose driver has native XDP but refuses it here gets generic XDP
/// under `--xdp-mode auto` (the default), and the log says so: the gate
/// judges as it would natively. A veth whose peer's MTU is too large for
/// native XDP stands in for a cloud VM's virtio_net (which refuses it while
/// the guest's offloads are on); `--hook xdp` because a veth's default hook
/// is TC. Before: `attach` failed with "bpf_link_create failed".
#[test]
fn a_device_that_refuses_native_xdp_is_gated_with_generic_xdp() {
    let _one = exclusive();
    let bed = Testbed::create("shedxg").expect("testbed");
    for (ns, iface) in [(&bed.server_ns, &bed.server_if), (&bed.client_ns, &bed.client_if)] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "ip", "link", "set", iface, "mtu", "9000"])
            .output()
            .expect("ip link");
        assert!(out.status.success(), "mtu 9000 on {iface}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let addr: SocketAddr = bed.server_addr(false, PORT);
    let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
    let gate = Gate::start(
        &bed,
        &["--port", "8080", "--limit", "1", "--count", "connections", "--action", "rst", "--hook", "xdp"],
    );
    let log = gate.log();
    assert!(log.contains("native XDP refused") && log.contains("generic XDP"), "the log says which and why: {log}");
    // It judges: one connection is held, the next is refused with a RST.
    let held = testbed::run_in(&bed.client_ns, move || {
        let first = testbed::connect(addr, Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(300));
        let second = testbed::request(addr, Duration::from_secs(1));
        (first.is_ok(), second)
    })
    .expect("client");
    assert_eq!(held, (true, Outcome::Refused), "limit 1 on generic XDP: {}", gate.log());
}

/// The README's first production command, exactly as written, on this
/// host's own NIC when it is a cloud VM's virtio_net (it refuses native XDP
/// with the guest's offloads on): it attaches (generic XDP), serves stats, and
/// detaches on SIGTERM. Before: it failed with "bpf_link_create failed:
/// Operation not supported". On another NIC there is nothing to show here.
#[test]
fn the_readmes_attach_runs_as_written_on_a_virtio_nic() {
    let _one = exclusive();
    let Some(nic) =
        ["eth0", "ens3", "ens4", "enp0s3"].into_iter().find(|n| driver_of(n).as_deref() == Some("virtio_net"))
    else {
        println!("no virtio_net NIC on this host: the README's command is tested on a veth stand-in only");
        return;
    };
    let mut gate = Gate::attach(&["--port", "8080"]);
    let s = stats(PORT);
    assert_eq!(field(&s, "port"), u64::from(PORT), "{s}");
    let log = gate.log();
    assert!(log.contains(&format!("iface={nic}")), "{nic} is gated: {log}");
    assert!(gate.stop().success(), "detached cleanly: {}", gate.log());
    assert!(support::gate::shed_programs_left(&[]).is_empty(), "nothing left attached");
}
