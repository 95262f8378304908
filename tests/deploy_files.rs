// SPDX-License-Identifier: MIT OR Apache-2.0
//! The deployment files are valid for the tools that consume them.
use std::{path::Path, process::Command};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

/// The flags a config file stands for, through shedctl's own config parser
/// (each `--flag=value` as the two words `--flag`, `value`).
fn config_flags(name: &str, text: &str) -> Vec<String> {
    shed::cli::config::file_args(Path::new(name), text, &|_| false)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .flat_map(|a| {
            let a = a.into_string().unwrap();
            match a.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => vec![flag.to_owned(), value.to_owned()],
                _ => vec![a],
            }
        })
        .collect()
}

/// The `shed.toml` a ConfigMap's text carries (its block under `shed.toml: |`).
fn configmap_toml(configmap: &str) -> String {
    configmap
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("shed.toml: |"))
        .skip(1)
        .flat_map(|l| [l.strip_prefix("    ").unwrap_or(l), "\n"])
        .collect()
}

#[test]
fn example_config_file_is_accepted() {
    let text = std::fs::read_to_string(format!("{DEPLOY}/shed.toml")).unwrap();
    let flags = config_flags("shed.toml", &text);
    for expected in ["--port", "--action", "--metrics", "--tier"] {
        assert!(flags.iter().any(|f| f == expected), "{expected} in {flags:?}");
    }
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd/shed.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/shedctl attach --config /etc/shed/shed.toml"),
        "the unit runs the installed shedctl with the config file"
    );
    // verify checks that ExecStart's binary exists: point it at the one just built.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shed.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/shedctl", &shed_testkit::gate::shedctl_path())).unwrap();
    // verify also opens the Documentation= man pages: give it the ones `cargo xtask install` installs.
    let man1 = dir.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    clap_mangen::generate_to(<shed::cli::Cli as clap::CommandFactory>::command(), &man1).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .expect("systemd-analyze (systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.contains("shed.service")).collect();
    assert!(out.status.success() && complaints.is_empty(), "systemd-analyze verify: {stderr}");
}

/// The unit survives a reboot: every directory under /run the daemon writes
/// is made by systemd at start (`RuntimeDirectory=`), for on an empty /run a
/// `ReadWritePaths=` entry that does not exist fails the service
/// (226/NAMESPACE) before shedctl runs; and its sandbox holds the exposure
/// `systemd-analyze security` reports at or under 3.0 (6.1, then 4.4, before
/// it was tightened; `cargo xtask systemd` boots it under a real systemd).
#[test]
fn systemd_unit_makes_its_run_directory_and_stays_sandboxed() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd/shed.service");
    let unit = std::fs::read_to_string(path).unwrap();
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .flat_map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    };
    let run_dir = std::path::Path::new(shed::host::paths::PID_FILE).parent().unwrap();
    let name = run_dir.strip_prefix("/run").expect("the daemon's files are under /run");
    assert!(
        values("RuntimeDirectory").iter().any(|d| std::path::Path::new(d) == name),
        "RuntimeDirectory= makes {} at start: {:?}",
        run_dir.display(),
        values("RuntimeDirectory")
    );
    for rw in values("ReadWritePaths") {
        assert!(!rw.trim_start_matches('-').starts_with("/run"), "{rw}: missing after a reboot; use RuntimeDirectory=");
    }
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=30", path])
        .output()
        .expect("systemd-analyze (systemd)");
    let report = String::from_utf8_lossy(&out.stdout);
    let overall = report.lines().find(|l| l.contains("Overall exposure level")).unwrap_or("");
    assert!(out.status.success(), "exposure above 3.0: {overall}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// Every config file shipped (the example `shed.toml`, the ConfigMap's) is
/// one `attach` accepts: `--print-config` runs attach's own checks on it
/// and prints it back.
#[test]
fn every_shipped_config_passes_attach_s_checks() {
    let configmap = std::fs::read_to_string(format!("{DEPLOY}/kubernetes/configmap.yaml")).unwrap();
    let from_configmap = configmap_toml(&configmap);
    let dir = tempfile::tempdir().unwrap();
    let configmap_toml = dir.path().join("configmap-shed.toml");
    std::fs::write(&configmap_toml, &from_configmap).unwrap();
    for file in [std::path::PathBuf::from(format!("{DEPLOY}/shed.toml")), configmap_toml] {
        let out = Command::new(shed_testkit::gate::shedctl_path())
            .args(["attach", "--print-config", "--config"])
            .arg(&file)
            .output()
            .expect("run shedctl");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && printed.contains("action ="),
            "{}: {}{printed}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes");
    let files: Vec<String> = ["configmap.yaml", "daemonset.yaml", "example-deployment.yaml", "example-hpa.yaml"]
        .iter()
        .map(|f| format!("{dir}/{f}"))
        .collect();
    // Through python3 -m: the entry-point script may not be on PATH, the module is where pip put it.
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .output()
        .expect("python3 with kubernetes-validate (installed by `cargo xtask setup`)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("passed").count(), 4, "{text}");
    let daemonset = std::fs::read_to_string(&files[1]).unwrap();
    for needed in [
        "hostNetwork: true",
        "/sys/fs/bpf",
        "/sys/kernel/tracing",
        "BPF",
        "NET_ADMIN",
        "PERFMON",
        "--config",
        // The node agent: pods' namespaces, the runtime's socket, entering a namespace.
        "/run/netns",
        "SYS_ADMIN",
        "hostPID: true",
    ] {
        assert!(daemonset.contains(needed), "the DaemonSet needs {needed}");
    }
    // Every runtime's socket that `--cri-socket auto` looks for is in the
    // container at its host path: a directory of the host's mounted there.
    let mounts = daemonset_mounts(&files[1]);
    for socket in shed::host::cri::KNOWN_SOCKETS {
        // /var/run is /run on every distribution the kubelet runs on.
        let socket = socket.strip_prefix("/var").unwrap_or(socket);
        let dir = std::path::Path::new(socket).parent().unwrap().to_str().unwrap();
        assert!(
            mounts.iter().any(|(container, host)| container == dir && host == dir),
            "the DaemonSet mounts {dir} from the host, for {socket}: {mounts:?}"
        );
    }
    let configmap = std::fs::read_to_string(&files[0]).unwrap();
    assert!(configmap.contains("cri-socket = \"auto\""), "the ConfigMap finds the node's runtime");
    // The ConfigMap's shed.toml is what the pod runs with: shedctl must accept it,
    // and it serves its endpoint on the node's loopback, for the probes (the
    // scrape variant moves it: the_quick_start_starts_without_the_secret...).
    let toml = configmap_toml(&configmap);
    let flags = config_flags("configmap.yaml:shed.toml", &toml);
    let metrics = flags.iter().position(|f| f == "--metrics").map(|i| flags[i + 1].as_str());
    assert_eq!(metrics, Some("127.0.0.1:9464"), "{flags:?}");
    assert!(flags.iter().any(|f| f == "--pods"), "the DaemonSet runs the node agent: {flags:?}");
    // The example's annotations are what a pod may ask: each one accepted.
    let example = std::fs::read_to_string(&files[2]).unwrap();
    let annotations: std::collections::BTreeMap<String, String> = example
        .lines()
        .filter_map(|l| l.trim().strip_prefix("shed.io/"))
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (format!("shed.io/{k}"), v.trim_matches('"').to_owned())
        })
        .collect();
    assert!(annotations.len() >= 4, "{annotations:?}");
    // Over the ConfigMap's defaults, as the node agent reads a pod.
    let dir = tempfile::tempdir().unwrap();
    let defaults = dir.path().join("shed.toml");
    std::fs::write(&defaults, &toml).unwrap();
    let asks = shed::cli::annotations::pod_attach_args(&annotations, Some(&defaults)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(asks.map(|a| a.ports), Some(vec![8080]));
    // A pod that names only its ports gets the ConfigMap's action, not the command line's default.
    let only_ports = std::collections::BTreeMap::from([("shed.io/ports".to_owned(), "8080".to_owned())]);
    let asks = shed::cli::annotations::pod_attach_args(&only_ports, Some(&defaults)).unwrap().unwrap();
    assert!(flags.windows(2).any(|w| w[0] == "--action" && w[1] == "rst"), "the ConfigMap's action: {flags:?}");
    assert_eq!(asks.action, shed::kernel::options::Action::Rst);
}

/// The DaemonSet's agent container's mounts of host paths: (path in the
/// container, path on the host), read with PyYAML (kubernetes-validate's).
fn daemonset_mounts(path: &str) -> Vec<(String, String)> {
    let script = "import json, sys, yaml\n\
        spec = yaml.safe_load(open(sys.argv[1]))['spec']['template']['spec']\n\
        hosts = {v['name']: v['hostPath']['path'] for v in spec['volumes'] if 'hostPath' in v}\n\
        mounts = spec['containers'][0]['volumeMounts']\n\
        print(json.dumps([[m['mountPath'], hosts[m['name']]] for m in mounts if m['name'] in hosts]))\n";
    let out = Command::new("python3").args(["-c", script, path]).output().expect("python3 with PyYAML");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the mounts as JSON")
}

/// The override OPERATIONS.md documents, on the shipped config: a fixed limit
/// over the file's adaptive limiter is taken, not refused (refused, systemd's
/// `Restart=on-failure` would loop).
#[test]
fn the_shipped_config_takes_the_documented_override() {
    let config = format!("{DEPLOY}/shed.toml");
    let cli = shed::cli::config::parse_cli(["shedctl", "attach", "--config", &config, "--limit", "50"])
        .unwrap_or_else(|e| panic!("{e}"));
    let shed::cli::Command::Attach(args) = cli.command else { panic!("attach") };
    let (control, limit) = args.control().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((shed::control::Algo::from_raw(control.algo), limit), (shed::control::Algo::Fixed, 50));
}

/// `--print-config` writes only what `attach` accepts.
#[test]
fn print_config_refuses_what_attach_would_refuse() {
    let out = Command::new(shed_testkit::gate::shedctl_path())
        .args(["attach", "--port", "8080", "--print-config", "--algo", "gradient", "--limit", "5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "refused, nothing printed: {stderr}");
    assert!(stderr.contains("--initial-limit"), "{stderr}");
    let out = Command::new(shed_testkit::gate::shedctl_path())
        .args(["attach", "--port", "8080", "--print-config", "--algo", "queue", "--target-latency", "800"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("target-latency = 800") && text.contains("algo = \"queue\""), "{text}");
}

/// Completions and man pages from the binary alone (a package or an image has no cargo).
#[test]
fn completions_and_man_pages_come_from_the_binary() {
    let run = |args: &[&str]| Command::new(shed_testkit::gate::shedctl_path()).args(args).output().unwrap();
    for (shell, word) in [("bash", "--client-cap"), ("zsh", "--handshake-window"), ("fish", "rst-prefix-rate")] {
        let out = run(&["completions", shell]);
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(word), "{shell}");
    }
    let out = run(&["man"]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && page.contains(".TH shedctl") && page.contains("attach"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in ["shedctl.1", "shedctl-attach.1", "shedctl-tier-add.1"] {
        assert!(dir.path().join(page).exists(), "{page}");
    }
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(format!("{DEPLOY}/prometheus"))
        .output()
        .expect("run promtool (apt-get install prometheus, or cargo xtask setup)")
}

/// The alert and recording rules load, and fire (and stay silent) where their unit tests say.
#[test]
fn prometheus_rules_pass_promtool_check_and_unit_tests() {
    let out = promtool(&["check", "rules", "shed-rules.yml"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let out = promtool(&["test", "rules", "shed-rules.test.yml"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let rules = std::fs::read_to_string(format!("{DEPLOY}/prometheus/shed-rules.yml")).unwrap();
    for alert in [
        "ShedDown",
        "ShedAbsent",
        "ShedTargetVanished",
        "ShedSheddingSustained",
        "ShedLimitPinnedAtMin",
        "ShedLimitPinnedAtMax",
        "ShedFailOpen",
        "ShedRstCapHit",
        "ShedDriftCorrectedOften",
        "ShedGateStalled",
        "ShedNatBypassed",
        "ShedNatUnreadable",
        "ShedPodRefused",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "{alert}");
    }
}

/// Validates each YAML document of `docs` (a file) whose kind a vendored CRD
/// in tests/data defines against that CRD's schema (kubernetes-validate has
/// no schema for custom resources); returns how many it validated.
fn validate_against_crds(docs: &std::path::Path) -> usize {
    let check = r#"
import sys, glob, yaml, jsonschema
schemas = {}
for path in glob.glob(sys.argv[1] + "/*.yaml"):
    crd = yaml.safe_load(open(path))
    if crd.get("kind") != "CustomResourceDefinition":
        continue
    for version in crd["spec"]["versions"]:
        key = (crd["spec"]["group"] + "/" + version["name"], crd["spec"]["names"]["kind"])
        schemas[key] = version["schema"]["openAPIV3Schema"]
n = 0
for doc in yaml.safe_load_all(open(sys.argv[2])):
    key = (doc["apiVersion"], doc["kind"])
    if key in schemas:
        # Not jsonschema.validate: it first checks the schema itself, whose Go
        # regexes (`^(?i)...`) Python's re rejects.
        jsonschema.Draft7Validator(schemas[key]).validate(doc)
        n += 1
print("validated", n)
"#;
    let out = Command::new("python3")
        .args(["-c", check, concat!(env!("CARGO_MANIFEST_DIR"), "/data")])
        .arg(docs)
        .output()
        .expect("python3 with PyYAML and jsonschema (installed by `cargo xtask setup`)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}: {text}", docs.display());
    text.trim().strip_prefix("validated ").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

/// The autoscaling examples scale on the offered load the gates measure, never
/// on CPU; KEDA's ScaledObject is checked against KEDA's own CRD schema.
#[test]
fn autoscaling_examples_scale_on_offered_load_and_validate() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes");
    assert_eq!(validate_against_crds(std::path::Path::new(&format!("{dir}/keda-scaledobject.yaml"))), 1);
    for file in ["example-hpa.yaml", "keda-scaledobject.yaml"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let spec: String = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
        assert!(!spec.contains("cpu") && !spec.contains("Utilization"), "{file} must not scale on CPU:\n{spec}");
        assert!(text.contains("shed:offered:rate1m"), "{file} scales on the offered-load rule");
    }
    // The rule they read is in the rules file (and tested by promtool above).
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/shed-rules.yml")).unwrap();
    assert!(rules.contains("record: shed:offered:rate1m") && rules.contains("record: shed:refused_share:rate1m"));
}

/// `kubectl kustomize` of the base and of monitoring/: the base validates
/// against the Kubernetes schemas, the PodMonitor and PrometheusRule against
/// the Prometheus Operator's CRDs; the PrometheusRule holds exactly the rules
/// of deploy/prometheus/shed-rules.yml, and the PodMonitor scrapes the
/// DaemonSet's own pods and port.
#[test]
fn the_kustomize_bases_build_and_validate() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes");
    let kustomize = |path: &str| {
        let out = Command::new("kubectl")
            .args(["kustomize", path])
            .output()
            .expect("kubectl (apt-get install kubernetes-client, or cargo xtask setup)");
        assert!(out.status.success(), "kubectl kustomize {path}: {}", String::from_utf8_lossy(&out.stderr));
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &out.stdout).unwrap();
        file
    };
    let base = kustomize(dir);
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(base.path())
        .output()
        .expect("python3 with kubernetes-validate (installed by `cargo xtask setup`)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.matches("passed").count() == 2, "{text}");

    let monitoring = kustomize(&format!("{dir}/monitoring"));
    assert_eq!(validate_against_crds(monitoring.path()), 2, "the PodMonitor and the PrometheusRule");
    let check = r#"
import sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
rules = yaml.safe_load(open(sys.argv[2]))
assert docs["PrometheusRule"]["spec"]["groups"] == rules["groups"], "prometheusrule.yaml differs from shed-rules.yml"
daemonset = next(d for d in yaml.safe_load_all(open(sys.argv[3])) if d["kind"] == "DaemonSet")
pod = daemonset["spec"]["template"]
selector = docs["PodMonitor"]["spec"]["selector"]["matchLabels"]
assert all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items()), selector
ports = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
assert all(e["port"] in ports for e in docs["PodMonitor"]["spec"]["podMetricsEndpoints"]), ports
print("consistent")
"#;
    let out = Command::new("python3")
        .args(["-c", check])
        .arg(monitoring.path())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/shed-rules.yml"))
        .arg(base.path())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("consistent"), "{text}");

    let daemonset = std::fs::read_to_string(format!("{dir}/daemonset.yaml")).unwrap();
    for needed in [
        "automountServiceAccountToken: false",
        "app.kubernetes.io/instance: shed",
        "app.kubernetes.io/version:",
        "app.kubernetes.io/component: node-agent",
        "app.kubernetes.io/part-of: shed",
        "`privileged` level",
    ] {
        assert!(daemonset.contains(needed), "the DaemonSet needs {needed}");
    }
}

/// Every `shedctl` command the README and the guides show in a code block
/// parses with the CLI as built: a flag renamed, removed or never given to a
/// verb in the words fails here (`set --retry-after` once did). Each also
/// runs against a live gate: `e2e_ops`'s `every_documented_shedctl_command_runs`.
#[test]
fn every_documented_shedctl_command_parses() {
    use clap::Parser as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commands = shed_testkit::docs::documented_commands(&root);
    for c in &commands {
        if let Err(e) = shed::cli::Cli::try_parse_from(&c.words) {
            panic!("{}: `{}` does not parse:\n{e}", c.doc.display(), c.command);
        }
    }
    let checked = commands.len();
    assert!(checked >= 25, "only {checked} documented commands found: is the parsing above still right?");
}

/// Every document `kubectl kustomize DIR` builds, as JSON (through PyYAML).
fn kustomized(dir: &str) -> Vec<serde_json::Value> {
    let out = Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
        .expect("kubectl (apt-get install kubernetes-client, or cargo xtask setup)");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    yaml_documents(&out.stdout)
}

/// The YAML documents of `text`, as JSON (through PyYAML, kubernetes-validate's).
fn yaml_documents(text: &[u8]) -> Vec<serde_json::Value> {
    use std::io::Write as _;
    let mut child = Command::new("python3")
        .args(["-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with PyYAML");
    child.stdin.take().unwrap().write_all(text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the documents as JSON")
}

/// The one document of `kind` named `name`.
fn document<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {docs:?}"))
}

/// The attach command a kustomized DaemonSet runs, parsed by shedctl's own
/// parser (`shed::cli::config`) over the ConfigMap's shed.toml, as the agent
/// reads it in its pod; and the agent's container.
fn agent_attach_args(docs: &[serde_json::Value], dir: &std::path::Path) -> (shed::cli::AttachArgs, serde_json::Value) {
    let pod = &document(docs, "DaemonSet", "shed")["spec"]["template"]["spec"];
    let container = pod["containers"][0].clone();
    let mut argv: Vec<String> =
        container["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    let at = argv.iter().position(|a| a == "--config").expect("the agent runs with --config") + 1;
    // The config file is the ConfigMap's shed.toml, mounted where --config points.
    let config = std::path::PathBuf::from(&argv[at]);
    let (volume, key) = mounted_volume(pod, &container, &config).expect("--config is mounted");
    let configmap = volume["configMap"]["name"].as_str().expect("--config comes from a ConfigMap");
    let toml = document(docs, "ConfigMap", configmap)["data"][&key].as_str().expect("the ConfigMap holds the file");
    let file = dir.join(&key);
    std::fs::write(&file, toml).unwrap();
    argv[at] = file.display().to_string();
    let cli = shed::cli::config::parse_cli(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let shed::cli::Command::Attach(args) = cli.command else { panic!("{argv:?} is not attach") };
    (args, container)
}

/// The pod volume a file of the container comes from, and the file's name
/// within it (the key of a ConfigMap or Secret): the mount whose path is the
/// file's longest prefix.
fn mounted_volume(
    pod: &serde_json::Value,
    container: &serde_json::Value,
    file: &std::path::Path,
) -> Option<(serde_json::Value, String)> {
    let mount = container["volumeMounts"]
        .as_array()?
        .iter()
        .filter(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
        .max_by_key(|m| m["mountPath"].as_str().unwrap().len())?;
    let key = file.strip_prefix(mount["mountPath"].as_str().unwrap()).ok()?.display().to_string();
    let volume = pod["volumes"].as_array()?.iter().find(|v| v["name"] == mount["name"])?.clone();
    Some((volume, key))
}

/// `kubectl apply -k deploy/kubernetes` starts on a cluster that has only
/// what the quick start makes: every file the agent reads at start comes from
/// a volume that is always there (before, the ConfigMap named a token file
/// from an optional Secret, and without the Secret every node's agent exited
/// 1); the metrics endpoint is off the pod network (loopback) or guarded by a
/// token; and the probes reach it. The scrape variant (deploy/kubernetes-scrape,
/// the Secret's way to turn scraping on) serves it on the node's address,
/// guarded, from a Secret it requires, and asks to be scraped; the base does not.
#[test]
fn the_quick_start_starts_without_the_secret_and_keeps_metrics_off_the_pod_network() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let dir = tempfile::tempdir().unwrap();
    for (variant, scraped) in [("deploy/kubernetes", false), ("deploy/kubernetes-scrape", true)] {
        let docs = kustomized(&format!("{root}/{variant}"));
        let (args, container) = agent_attach_args(&docs, dir.path());
        let pod = &document(&docs, "DaemonSet", "shed")["spec"]["template"];
        for file in args.metrics_token_file.iter().chain(&args.tier_file) {
            let (volume, _) = mounted_volume(&pod["spec"], &container, file).unwrap_or_else(|| {
                panic!("{variant}: the agent reads {} at start, and nothing mounts it", file.display())
            });
            let source = volume.get("secret").or(volume.get("configMap")).unwrap_or(&serde_json::Value::Null);
            assert!(
                source["optional"] != true,
                "{variant}: the agent reads {} at start, from a volume that may be missing ({volume}): \
                 without it the agent exits 1 on every node",
                file.display()
            );
        }
        let metrics = args.metrics.unwrap_or_else(|| panic!("{variant}: the probes need the endpoint"));
        assert!(
            metrics.ip().is_loopback() || args.metrics_token_file.is_some(),
            "{variant}: /metrics on {metrics} (the host network: every pod reaches it) without a token"
        );
        assert_eq!(metrics.ip().is_loopback(), !scraped, "{variant}: the endpoint is on {metrics}");
        let port_named = |port: &serde_json::Value| match port.as_str() {
            Some(name) => {
                container["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["containerPort"]
                    .as_u64()
            }
            None => port.as_u64(),
        };
        for probe in ["livenessProbe", "readinessProbe"] {
            let get = &container[probe]["httpGet"];
            assert_eq!(port_named(&get["port"]), Some(u64::from(metrics.port())), "{variant}: {probe} {get}");
            // No host: the pod's address, the node's on the host network.
            let host = get["host"].as_str().map(|h| h.parse::<std::net::IpAddr>().unwrap());
            assert!(
                metrics.ip().is_unspecified() || host == Some(metrics.ip()),
                "{variant}: {probe} asks {host:?}, the endpoint listens on {metrics}"
            );
        }
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"] == "true", scraped, "{variant}: {annotations}");
        if scraped {
            assert_eq!(annotations["prometheus.io/port"], metrics.port().to_string(), "{variant}");
        }
    }
    // The scrape variant is a valid DaemonSet, as the base is.
    let file = dir.path().join("scrape.yaml");
    let out =
        Command::new("kubectl").args(["kustomize", &format!("{root}/deploy/kubernetes-scrape")]).output().unwrap();
    std::fs::write(&file, &out.stdout).unwrap();
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(&file)
        .output()
        .expect("python3 with kubernetes-validate (installed by `cargo xtask setup`)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.matches("passed").count() == 2, "{text}");
}

/// Under the Prometheus Operator the series keep the gate's own labels and
/// every query finds them: the PodMonitor honors the scraped labels (else the
/// Operator's namespace and pod, the agent's, replace a gated pod's), no rule
/// and no dashboard query names the job `shed` outright (the Operator's is
/// `kube-system/shed`), a rule catches a target gone from discovery, and the
/// dashboard chooses its job by a variable. The rules' behaviour on
/// Operator-shaped series is promtool's test (shed-rules.test.yml).
#[test]
fn monitoring_works_under_the_prometheus_operator() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let docs = kustomized(&format!("{root}/deploy/kubernetes/monitoring"));
    for endpoint in document(&docs, "PodMonitor", "shed")["spec"]["podMetricsEndpoints"].as_array().unwrap() {
        assert_eq!(endpoint["honorLabels"], true, "the gate's namespace and pod labels are kept: {endpoint}");
    }
    let rules = &yaml_documents(&std::fs::read(format!("{DEPLOY}/prometheus/shed-rules.yml")).unwrap())[0];
    let exprs: Vec<&str> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["expr"].as_str().unwrap())
        .collect();
    for expr in &exprs {
        assert!(!expr.contains("job=\""), "a fixed job, which the Operator's is not: {expr}");
    }
    assert!(exprs.iter().any(|e| e.starts_with("absent(up{")), "a rule for targets gone: {exprs:?}");

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DEPLOY}/grafana/shed-dashboard.json")).unwrap())
            .unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let job = variables.iter().find(|v| v["name"] == "job").expect("a job variable");
    assert!(!job["query"].as_str().unwrap().contains("job="), "the job variable lists every job: {job}");
    let mut queries: Vec<&str> = variables
        .iter()
        .filter(|v| v["type"] == "query" && v["name"] != "job")
        .map(|v| v["query"].as_str().unwrap())
        .collect();
    for panel in dashboard["panels"].as_array().unwrap() {
        queries.extend(panel["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap()));
    }
    for query in queries {
        assert!(!query.contains("job=\""), "a fixed job: {query}");
        // Every series selector of the query chooses the job by the variable.
        assert_eq!(
            query.matches("job=~\"$job\"").count(),
            query.matches('{').count(),
            "every selector by $job: {query}"
        );
    }
}

/// The project's address, as the .deb's Homepage names it.
const PROJECT_URL: &str = "https://github.com/shed/shed";

/// The anchor GitHub gives a Markdown heading: lower case, punctuation but
/// `-` and `_` dropped, spaces as `-`.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every alert carries a runbook_url to its own entry in docs/RUNBOOK.md: a
/// heading of the alert's name, with what it means, three first checks and
/// the fixes; and every `shedctl` command the runbook names inline parses
/// (those in its code blocks: every_documented_shedctl_command_parses).
#[test]
fn every_alert_links_its_runbook_entry() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let package = std::fs::read_to_string(format!("{root}/xtask/src/package.rs")).unwrap();
    assert!(package.contains(&format!("Homepage: {PROJECT_URL}\\n")), "the .deb names the project {PROJECT_URL}");
    let runbook = std::fs::read_to_string(format!("{root}/docs/RUNBOOK.md")).expect("docs/RUNBOOK.md");
    // Each entry: its heading's anchor, and its text up to the next heading of its level.
    let entries: std::collections::BTreeMap<String, &str> =
        runbook.split("\n## ").skip(1).map(|entry| (heading_anchor(entry.lines().next().unwrap()), entry)).collect();
    let rules = &yaml_documents(&std::fs::read(format!("{DEPLOY}/prometheus/shed-rules.yml")).unwrap())[0];
    let alerts: Vec<&serde_json::Value> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect();
    assert!(alerts.len() >= 13, "{alerts:?}");
    for rule in alerts {
        let alert = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{alert} has no runbook_url"));
        let anchor = url
            .strip_prefix(&format!("{PROJECT_URL}/blob/main/docs/RUNBOOK.md#"))
            .unwrap_or_else(|| panic!("{alert}: {url} is not docs/RUNBOOK.md of {PROJECT_URL}"));
        assert_eq!(anchor, heading_anchor(alert), "{alert}: its own entry");
        let entry = entries.get(anchor).unwrap_or_else(|| panic!("{alert}: no heading #{anchor} in docs/RUNBOOK.md"));
        let checks = entry.split("**First three checks.**").nth(1).and_then(|c| c.split("**Fixes.**").next());
        let checks = checks.unwrap_or_else(|| panic!("{alert}: no first checks, or no fixes"));
        let numbered = |n: usize| checks.lines().any(|l| l.starts_with(&format!("{n}. ")));
        assert!(entry.contains("**What it means.**"), "{alert}: what it means");
        assert!(numbered(1) && numbered(2) && numbered(3) && !numbered(4), "{alert}: three checks:\n{checks}");
    }
    // The commands the runbook names inline (`shedctl ...`) are as real as those of its code blocks.
    let mut inline = 0;
    for span in runbook.split('`').skip(1).step_by(2) {
        let command = span.strip_prefix("sudo ").unwrap_or(span);
        if command.starts_with("shedctl ") {
            let words = shed_testkit::docs::shell_words(command);
            if let Err(e) = <shed::cli::Cli as clap::Parser>::try_parse_from(&words) {
                panic!("docs/RUNBOOK.md: `{command}` does not parse:\n{e}");
            }
            inline += 1;
        }
    }
    assert!(inline >= 5, "only {inline} inline commands found");
}

/// Paragraphs of prose in `markdown` (runs of non-blank lines outside code
/// fences, tables, headings and lists; a list runs to its next blank line),
/// each with its first line's number and its words.
fn prose_paragraphs(markdown: &str) -> Vec<(usize, usize)> {
    let (mut paragraphs, mut fenced, mut in_list) = (Vec::new(), false, false);
    let mut current: Option<(usize, usize)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let line = line.trim();
        let words = line.split_whitespace().count();
        let list_item = line.starts_with("- ")
            || line.starts_with("* ")
            || line.split_once(". ").is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if line.starts_with("```") {
            fenced = !fenced;
        }
        in_list = !(fenced || line.is_empty() || line.starts_with("```")) && (in_list || list_item);
        // Code, a blank line, a table, a heading or a list is no prose.
        let other = fenced || line.is_empty() || line.starts_with("```") || line.starts_with('|');
        let prose = !(other || line.starts_with('#') || in_list);
        match (prose, &mut current) {
            (true, Some((_, count))) => *count += words,
            (true, None) => current = Some((n + 1, words)),
            (false, _) => paragraphs.extend(current.take()),
        }
    }
    paragraphs.extend(current);
    paragraphs
}

/// No paragraph of docs/OPERATIONS.md is longer than 150 words: one that is
/// must be split along its sense (one was 802 words, with the emergency stop
/// inside it).
#[test]
fn operations_paragraphs_are_at_most_150_words() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/OPERATIONS.md")).unwrap();
    let paragraphs = prose_paragraphs(&guide);
    assert!(paragraphs.len() > 50, "only {} paragraphs found: is the parsing right?", paragraphs.len());
    let long: Vec<String> = paragraphs
        .iter()
        .filter(|(_, words)| *words > 150)
        .map(|(line, words)| format!("line {line}: {words} words"))
        .collect();
    assert!(long.is_empty(), "docs/OPERATIONS.md paragraphs over 150 words: {long:?}");
    // The parser sees a paragraph as one, and leaves lists, tables and code alone.
    let sample = "One two\nthree.\n\n- a list item\n  continued\n\n| a | table |\n\n```\ncode here\n```\nFour five.\n";
    assert_eq!(prose_paragraphs(sample), vec![(1, 3), (12, 2)]);
}
