// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl attach --config FILE`: a TOML file that says what the attach flags
//! say, one key per flag (`min-limit = 4` is `--min-limit 4`; the repeatable
//! ones are lists: `ports`, `ifaces`, and the `[tiers]` table).
//!
//! Every value goes through the flag's own clap value parser, so the file and
//! the command line accept exactly the same values and give the same reasons;
//! the file's errors name the file and line. A flag given on the command line
//! replaces the file's key. The merged result is parsed once more by clap.
use std::{
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
};

use clap::{CommandFactory as _, FromArgMatches as _, parser::ValueSource};
use toml::{Spanned, Value};

use crate::named::Named as _;
use crate::{
    cli::{AttachArgs, Cli, Command},
    control::Algo,
};

/// The shape a key's value must have.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Int,
    Str,
    /// A duration: a whole number in the flag's unit, or a string with its
    /// unit (`window = 100` or `window = "100ms"`, `heal-interval = "1m"`).
    Duration,
    Bool,
    IntList,
    StrList,
    /// A string, or a list of them (`netns = "web"` or `netns = ["web", "api"]`).
    StrOrList,
    /// `[tiers]`: CIDR = tier.
    TierTable,
}

/// Every annotation of shed's starts with this: a pod's `shed.io/limit` is the file's `limit`.
pub const ANNOTATION_PREFIX: &str = "shed.io/";

/// Every key: (key, the flag it stands for, its shape).
const KEYS: &[(&str, &str, Kind)] = &[
    ("ports", "port", Kind::IntList),
    ("ifaces", "iface", Kind::StrList),
    ("hook", "hook", Kind::Str),
    ("xdp-mode", "xdp-mode", Kind::Str),
    ("action", "action", Kind::Str),
    ("limit", "limit", Kind::Int),
    ("algo", "algo", Kind::Str),
    ("initial-limit", "initial-limit", Kind::Int),
    ("min-limit", "min-limit", Kind::Int),
    ("max-limit", "max-limit", Kind::Int),
    ("window", "window", Kind::Duration),
    ("percentile", "percentile", Kind::Int),
    ("count", "count", Kind::Str),
    ("min-samples", "min-samples", Kind::Int),
    ("cooldown", "cooldown", Kind::Int),
    ("baseline-span", "baseline-span", Kind::Int),
    ("probe-windows", "probe-windows", Kind::Int),
    ("queue-target", "queue-target", Kind::Duration),
    ("target-latency", "target-latency", Kind::Duration),
    ("tiers", "tier", Kind::TierTable),
    ("tier-file", "tier-file", Kind::Str),
    ("client-cap", "client-cap", Kind::Int),
    ("client-share", "client-share", Kind::Int),
    ("client-prefix-v6", "client-prefix-v6", Kind::Int),
    ("rst-rate", "rst-rate", Kind::Int),
    ("rst-prefix-rate", "rst-prefix-rate", Kind::Int),
    ("retry-after", "retry-after", Kind::Int),
    ("dry-run", "dry-run", Kind::Bool),
    ("netns", "netns", Kind::StrOrList),
    ("handshake-window", "handshake-window", Kind::Duration),
    ("metrics", "metrics", Kind::Str),
    ("metrics-token-file", "metrics-token-file", Kind::Str),
    ("agent-port", "agent-port", Kind::Int),
    ("heal-interval", "heal-interval", Kind::Duration),
    ("max-connections", "max-connections", Kind::Int),
    ("max-clients", "max-clients", Kind::Int),
    ("memory-budget", "memory-budget", Kind::Int),
    ("kernel-log", "kernel-log", Kind::Bool),
    ("allow-nat", "allow-nat", Kind::Bool),
    ("ready-max-shed", "ready-max-shed", Kind::Int),
    ("ready-window", "ready-window", Kind::Duration),
    ("pods", "pods", Kind::Bool),
    ("cri-socket", "cri-socket", Kind::Str),
    ("pod-max-connections", "pod-max-connections", Kind::Int),
    ("pod-max-clients", "pod-max-clients", Kind::Int),
    ("no-expedite-rcu", "no-expedite-rcu", Kind::Bool),
];

/// Every key of the config file.
pub fn keys() -> impl Iterator<Item = &'static str> {
    KEYS.iter().map(|(k, _, _)| *k)
}

/// Whether the config file has a key of this name.
pub fn has_key(key: &str) -> bool {
    KEYS.iter().any(|(k, _, _)| *k == key)
}

/// A config file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{}", if *line == 0 { format!("{file}: {reason}") } else { format!("{file}:{line}: {reason}") })]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the problem is not on one line (the file cannot be read).
    pub line: usize,
    pub reason: String,
}

/// Parses the command line (`argv` includes the program name); with
/// `attach --config FILE`, merges the file under the flags.
pub fn parse_cli<I, T>(argv: I) -> Result<Cli, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let matches = Cli::command().try_get_matches_from(&argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let Command::Attach(AttachArgs { config: Some(path), .. }) = &cli.command else {
        return Ok(cli);
    };
    let attach = matches.subcommand_matches("attach").expect("attach was parsed");
    let given = |id: &str| {
        let on_line = |id: &str| attach.value_source(id) == Some(ValueSource::CommandLine);
        match id {
            // Not a flag: an adaptive limiter named on the command line (see `overridden`).
            ADAPTIVE_ALGO => on_line("algo") && attach.get_one::<Algo>("algo").is_some_and(|a| *a != Algo::Fixed),
            _ => on_line(id),
        }
    };
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.display().to_string(),
        line: 0,
        reason: format!("cannot read the config file: {e}"),
    })?;
    let file_args = file_args(path, &text, &given)?;
    let merged = <Cli as clap::Parser>::try_parse_from(argv.into_iter().chain(file_args))?;
    Ok(merged)
}

/// Why the command line (with its config file) was refused.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error("{0}")]
    Config(#[from] ConfigError),
}

/// The flags a config file stands for, leaving out those `given` on the
/// command line; every value already checked by its flag's parser.
pub fn file_args(path: &Path, text: &str, given: &dyn Fn(&str) -> bool) -> Result<Vec<OsString>, ConfigError> {
    let at = |span: std::ops::Range<usize>, reason: String| ConfigError {
        file: path.display().to_string(),
        line: text[..span.start.min(text.len())].matches('\n').count() + 1,
        reason,
    };
    let table: BTreeMap<Spanned<String>, Spanned<Value>> = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigError { file: path.display().to_string(), line, reason: e.message().trim().to_owned() }
    })?;
    let command = Cli::command();
    let attach = command.find_subcommand("attach").expect("attach exists");
    let mut args = Vec::new();
    for (key, value) in &table {
        let Some(&(_, flag, kind)) = KEYS.iter().find(|(k, _, _)| *k == key.get_ref()) else {
            let known: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
            return Err(at(key.span(), format!("unknown key `{}`: the keys are {}", key.get_ref(), known.join(", "))));
        };
        let arg = attach.get_arguments().find(|a| a.get_long() == Some(flag)).expect("every key names a flag");
        let mut raw = raw_values(kind, value.get_ref())
            .map_err(|reason| at(value.span(), format!("`{}`: {reason}", key.get_ref())))?;
        if flag == "tier-file" {
            raw = raw.into_iter().map(|f| resolve_relative(path, f.into()).display().to_string()).collect();
        }
        let flags =
            flag_args(flag, kind, raw).map_err(|reason| at(value.span(), format!("`{}`: {reason}", key.get_ref())))?;
        if given(arg.get_id().as_str()) || overridden(key.get_ref(), given) {
            continue; // the command line wins
        }
        args.extend(flags);
    }
    Ok(args)
}

/// The flags that `raw` values of a key stand for, each checked by the
/// flag's own parser (`shedctl attach --config - --<flag> <value>`).
fn flag_args(flag: &str, kind: Kind, raw: Vec<String>) -> Result<Vec<OsString>, String> {
    let mut args = Vec::new();
    for r in raw {
        if kind == Kind::Bool {
            if r == "true" {
                args.push(format!("--{flag}").into());
            }
            continue;
        }
        // One word, `--flag=value`: a value that starts with `-` is the flag's value, not another flag.
        let arg = format!("--{flag}={r}");
        let probe = ["shedctl", "attach", "--config", "-", &arg].map(OsStr::new);
        Cli::command().try_get_matches_from(probe).map_err(|e| clap_reason(&e))?;
        args.push(arg.into());
    }
    Ok(args)
}

/// `reason` (a flag's refusal) as a pod author reads it: each `--flag` named
/// as the annotation that stands for it (`--limit` is `shed.io/limit`).
pub(crate) fn in_annotation_terms(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let len = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(after.len());
        let flag = &after[..len];
        match KEYS.iter().find(|(_, f, _)| *f == flag) {
            Some((key, _, _)) => {
                out.push_str(ANNOTATION_PREFIX);
                out.push_str(key);
            }
            None => out.push_str(&rest[at..at + 2 + len]),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Keys that are the node's, not a pod's: where and how the gate attaches,
/// the daemon's endpoint, healing, map sizes and logging, and files on the
/// node's disk.
const NODE_KEYS: &[&str] = &[
    "ifaces",
    "hook",
    "xdp-mode",
    "netns",
    "metrics",
    "metrics-token-file",
    "heal-interval",
    "max-connections",
    "max-clients",
    "memory-budget",
    "kernel-log",
    "allow-nat",
    "ready-max-shed",
    "ready-window",
    "tier-file",
    "pods",
    "cri-socket",
    "pod-max-connections",
    "pod-max-clients",
    "no-expedite-rcu",
];

/// The flags a pod's annotation stands for: `key` a config key that concerns
/// the pod's own ports, `value` as an annotation holds it (a string; lists
/// comma-separated, tiers as `CIDR=tier` pairs, switches `true` or `false`).
pub(crate) fn annotation_args(key: &str, value: &str) -> Result<Vec<OsString>, String> {
    if NODE_KEYS.contains(&key) {
        return Err(format!("`{key}` is the node's setting (the agent's config file), not a pod's"));
    }
    let Some(&(_, flag, kind)) = KEYS.iter().find(|(k, _, _)| *k == key) else {
        let known: Vec<&str> = KEYS.iter().map(|k| k.0).filter(|k| !NODE_KEYS.contains(k)).collect();
        return Err(format!("unknown key `{key}`: a pod's keys are {}", known.join(", ")));
    };
    let list = || value.split(',').map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned).collect::<Vec<_>>();
    let raw = match kind {
        Kind::Int | Kind::Str | Kind::Duration => {
            Some(value.trim().to_owned()).filter(|v| !v.is_empty()).into_iter().collect()
        }
        Kind::Bool => match value.trim() {
            v @ ("true" | "false") => vec![v.to_owned()],
            other => return Err(format!("expected true or false, found `{other}`")),
        },
        Kind::IntList | Kind::StrList | Kind::StrOrList | Kind::TierTable => list(),
    };
    if raw.is_empty() {
        return Err("empty: give a value".to_owned());
    }
    flag_args(flag, kind, raw).map_err(|reason| in_annotation_terms(&reason))
}

/// Stands for "an adaptive `--algo` was given on the command line" in `given`.
const ADAPTIVE_ALGO: &str = "<adaptive algo>";

/// Whether a flag on the command line replaces a config key of another name:
/// the two would contradict each other, and the command line is the newer word
/// (the documented override `--config shed.toml --limit 50` over a file that
/// names an adaptive limiter must not be a restart loop under systemd).
fn overridden(key: &str, given: &dyn Fn(&str) -> bool) -> bool {
    match key {
        // A fixed limit replaces the file's limiter and its starting point.
        "algo" | "initial-limit" => given("limit"),
        // An adaptive limiter, or where it starts, replaces the file's fixed limit.
        "limit" => given("initial_limit") || given(ADAPTIVE_ALGO),
        "dry-run" => given("no_dry_run"),
        _ => false,
    }
}

/// The value(s) of a key as the flag would be given them.
fn raw_values(kind: Kind, value: &Value) -> Result<Vec<String>, String> {
    let scalar = |v: &Value, want: Kind| -> Result<String, String> {
        match (want, v) {
            (Kind::Int | Kind::Duration, Value::Integer(n)) => Ok(n.to_string()),
            (Kind::Str | Kind::Duration, Value::String(s)) => Ok(s.clone()),
            (Kind::Duration, other) => Err(format!(
                "expected a duration (a whole number, or a string such as \"2s\"), found {}",
                other.type_str()
            )),
            (Kind::Int, other) => Err(format!("expected a whole number, found {}", other.type_str())),
            (_, other) => Err(format!("expected a string, found {}", other.type_str())),
        }
    };
    match (kind, value) {
        (Kind::Int | Kind::Str | Kind::Duration, v) => Ok(vec![scalar(v, kind)?]),
        (Kind::Bool, Value::Boolean(b)) => Ok(vec![b.to_string()]),
        (Kind::Bool, other) => Err(format!("expected true or false, found {}", other.type_str())),
        (Kind::IntList | Kind::StrList, Value::Array(items)) => {
            let item = if kind == Kind::IntList { Kind::Int } else { Kind::Str };
            items.iter().map(|v| scalar(v, item)).collect()
        }
        (Kind::IntList | Kind::StrList, other) => Err(format!("expected a list, found {}", other.type_str())),
        (Kind::StrOrList, Value::Array(items)) => items.iter().map(|v| scalar(v, Kind::Str)).collect(),
        (Kind::StrOrList, v) => Ok(vec![scalar(v, Kind::Str)?]),
        (Kind::TierTable, Value::Table(entries)) => entries
            .iter()
            .map(|(cidr, tier)| match tier {
                Value::String(t) => Ok(format!("{cidr}={t}")),
                other => Err(format!("{cidr}: expected a tier name, found {}", other.type_str())),
            })
            .collect(),
        (Kind::TierTable, other) => Err(format!("expected a table of CIDR = tier, found {}", other.type_str())),
    }
}

/// The reason of a clap error, without its usage lines.
pub(crate) fn clap_reason(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_owned()
}

/// The config file that says what `args` say (for `--print-config`).
pub(crate) fn render(args: &AttachArgs) -> String {
    let mut t = toml::Table::new();
    let int = |n: u64| Value::Integer(n as i64);
    let s = |v: &dyn std::fmt::Display| Value::String(v.to_string());
    t.insert("ports".into(), Value::Array(args.ports.iter().map(|&p| int(p.into())).collect()));
    if !args.ifaces.is_empty() {
        t.insert("ifaces".into(), Value::Array(args.ifaces.iter().map(|i| s(i)).collect()));
    }
    if let Some(hook) = args.hook {
        t.insert("hook".into(), s(&hook));
    }
    t.insert("xdp-mode".into(), s(&args.xdp_mode.name()));
    t.insert("action".into(), s(&args.action));
    render_judging(&mut t, args);
    match args.netns.as_slice() {
        [] => {}
        [one] => _ = t.insert("netns".into(), s(one)),
        several => _ = t.insert("netns".into(), Value::Array(several.iter().map(|n| s(n)).collect())),
    }
    t.insert("handshake-window".into(), int(args.handshake_window.as_millis() as u64));
    if let Some(metrics) = args.metrics {
        t.insert("metrics".into(), s(&metrics));
    }
    if let Some(file) = &args.metrics_token_file {
        t.insert("metrics-token-file".into(), s(&file.display()));
    }
    if let Some(port) = args.agent_port {
        t.insert("agent-port".into(), int(port.into()));
    }
    t.insert("heal-interval".into(), int(args.heal_interval.as_secs()));
    t.insert("max-connections".into(), int(args.max_connections.into()));
    t.insert("max-clients".into(), int(args.max_clients.into()));
    t.insert("memory-budget".into(), int(args.memory_budget.into()));
    t.insert("kernel-log".into(), Value::Boolean(args.kernel_log));
    t.insert("allow-nat".into(), Value::Boolean(args.allow_nat));
    t.insert("ready-max-shed".into(), int(args.ready_max_shed.into()));
    t.insert("ready-window".into(), int(args.ready_window.as_secs()));
    t.insert("pods".into(), Value::Boolean(args.pods));
    t.insert("cri-socket".into(), s(&args.cri_socket.display()));
    t.insert("pod-max-connections".into(), int(args.pod_max_connections.into()));
    t.insert("pod-max-clients".into(), int(args.pod_max_clients.into()));
    t.insert("no-expedite-rcu".into(), Value::Boolean(args.no_expedite_rcu));
    toml::to_string(&t).expect("a table always serializes")
}

/// The keys of how a port is judged (the limiter, tiers, clients, resets), in `render`'s order.
fn render_judging(t: &mut toml::Table, args: &AttachArgs) {
    let int = |n: u64| Value::Integer(n as i64);
    let s = |v: &dyn std::fmt::Display| Value::String(v.to_string());
    if let Some(limit) = args.limit {
        t.insert("limit".into(), int(limit.into()));
    }
    // Complete: the limiter and its starting limit as attach takes them, defaults included.
    let defaults = crate::control::Settings::default();
    let algo = match (args.algo, args.limit) {
        (Some(algo), _) => algo,
        (None, Some(_)) => crate::control::Algo::Fixed,
        (None, None) => defaults.algo,
    };
    t.insert("algo".into(), s(&algo));
    if algo != crate::control::Algo::Fixed {
        t.insert("initial-limit".into(), int(args.initial_limit.unwrap_or(defaults.initial_limit).into()));
    }
    t.insert("min-limit".into(), int(args.min_limit.into()));
    t.insert("max-limit".into(), int(args.max_limit.into()));
    t.insert("window".into(), int(args.window.as_millis() as u64));
    t.insert("percentile".into(), int(args.percentile.into()));
    t.insert("count".into(), s(&args.count.name()));
    t.insert("min-samples".into(), int(args.guards.min_samples.into()));
    t.insert("cooldown".into(), int(args.guards.cooldown.into()));
    t.insert("baseline-span".into(), int(args.guards.baseline_span.into()));
    t.insert("probe-windows".into(), int(args.guards.probe_windows.into()));
    t.insert("queue-target".into(), int(args.guards.queue_target.as_millis() as u64));
    if let Some(objective) = args.guards.target_latency {
        t.insert("target-latency".into(), int(objective.as_millis() as u64));
    }
    if !args.tiers.is_empty() {
        let tiers = args
            .tiers
            .iter()
            .map(|(cidr, tier)| (cidr.to_string(), s(&shed_common::tier::NAMES[usize::from(*tier)])))
            .collect();
        t.insert("tiers".into(), Value::Table(tiers));
    }
    if let Some(file) = &args.tier_file {
        t.insert("tier-file".into(), s(&file.display()));
    }
    t.insert("client-cap".into(), int(args.client_cap.into()));
    t.insert("client-share".into(), int(args.client_share.into()));
    t.insert("client-prefix-v6".into(), int(args.client_prefix_v6.into()));
    t.insert("rst-rate".into(), int(args.rst_rate.into()));
    t.insert("rst-prefix-rate".into(), int(args.rst_prefix_rate.into()));
    t.insert("retry-after".into(), int(args.retry_after.into()));
    t.insert("dry-run".into(), Value::Boolean(args.dry_run));
}

/// Where a relative `tier-file` in a config file points: next to the config file.
fn resolve_relative(config: &Path, file: PathBuf) -> PathBuf {
    if file.is_relative() { config.parent().unwrap_or(Path::new(".")).join(file) } else { file }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(cli: Cli) -> AttachArgs {
        match cli.command {
            Command::Attach(a) => AttachArgs { config: None, ..a },
            other => panic!("expected attach, got {other:?}"),
        }
    }

    /// `--print-config` writes a complete file: the limiter and its start, and
    /// the node agent's keys, defaults included (before, the keys not given
    /// were left out, and a file written for one host read differently on a
    /// host with other defaults); and what it writes reads back the same.
    #[test]
    fn the_printed_config_is_complete_and_reads_back_the_same() {
        let args = attach(parse_cli(["shedctl", "attach", "--port", "8080"]).unwrap());
        let printed = render(&args);
        let table: toml::Table = printed.parse().unwrap();
        let defaults = crate::control::Settings::default();
        assert_eq!(table["algo"].as_str(), Some(defaults.algo.name()));
        assert_eq!(table["initial-limit"].as_integer(), Some(i64::from(defaults.initial_limit)));
        for key in ["pods", "cri-socket", "pod-max-connections", "pod-max-clients", "no-expedite-rcu"] {
            assert!(table.contains_key(key), "{key} in:\n{printed}");
        }
        assert!(table.keys().all(|k| has_key(k)), "only config keys:\n{printed}");
        let fixed = render(&attach(parse_cli(["shedctl", "attach", "--port", "8080", "--limit", "7"]).unwrap()));
        let fixed: toml::Table = fixed.parse().unwrap();
        assert_eq!(
            (fixed["algo"].as_str(), fixed.get("initial-limit")),
            (Some("fixed"), None),
            "a fixed limit starts nowhere else"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("printed.toml");
        std::fs::write(&file, &printed).unwrap();
        let again = attach(parse_cli(["shedctl", "attach", "--config", file.to_str().unwrap()]).unwrap());
        assert_eq!(render(&again), printed, "read back, it prints the same");
    }

    fn with_file(text: &str, flags: &[&str]) -> Result<AttachArgs, CliError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shed.toml");
        std::fs::write(&path, text).unwrap();
        let head = ["shedctl", "attach", "--config", path.to_str().unwrap()];
        let argv = head.iter().copied().chain(flags.iter().copied());
        parse_cli(argv.map(str::to_owned)).map(attach)
    }

    /// Every flag set to a value other than its default.
    const EVERY_FLAG: &[&str] = &[
        "shedctl",
        "attach",
        "--port",
        "8080",
        "--port",
        "8443",
        "--iface",
        "lo",
        "--iface",
        "eth0",
        "--hook",
        "tc",
        "--xdp-mode",
        "generic",
        "--action",
        "rst",
        "--algo",
        "aimd",
        "--initial-limit",
        "40",
        "--min-limit",
        "8",
        "--max-limit",
        "900",
        "--window",
        "250",
        "--percentile",
        "99",
        "--count",
        "connections",
        "--min-samples",
        "20",
        "--cooldown",
        "5",
        "--baseline-span",
        "300",
        "--probe-windows",
        "0",
        "--queue-target",
        "8",
        "--target-latency",
        "750",
        "--tier",
        "10.0.0.0/8=critical",
        "--tier",
        "2001:db8::/32=low",
        "--tier-file",
        "/etc/shed/tiers.toml",
        "--client-cap",
        "20",
        "--client-prefix-v6",
        "56",
        "--rst-rate",
        "5000",
        "--rst-prefix-rate",
        "300",
        "--retry-after",
        "9",
        "--dry-run",
        "--netns",
        "srv",
        "--handshake-window",
        "40",
        "--metrics",
        "127.0.0.1:9464",
        "--metrics-token-file",
        "/etc/shed/metrics-token",
        "--agent-port",
        "9500",
        "--heal-interval",
        "12",
        "--max-connections",
        "500000",
        "--max-clients",
        "2048",
        "--memory-budget",
        "400",
        "--kernel-log",
        "--allow-nat",
        "--ready-max-shed",
        "80",
        "--ready-window",
        "30",
        "--pods",
        "--cri-socket",
        "/run/k3s/containerd/containerd.sock",
        "--pod-max-connections",
        "32768",
        "--pod-max-clients",
        "1024",
        "--no-expedite-rcu",
    ];

    #[test]
    fn a_refusal_names_each_flag_as_its_annotation_and_leaves_other_dashes() {
        assert_eq!(
            in_annotation_terms("--limit is fixed; --algo adapts it (see --help, -- or --no-such-flag)"),
            "shed.io/limit is fixed; shed.io/algo adapts it (see --help, -- or --no-such-flag)"
        );
        // A flag spelled other than its key is named by the key.
        assert_eq!(in_annotation_terms("--port 8080 twice; --tier a=b"), "shed.io/ports 8080 twice; shed.io/tiers a=b");
        assert_eq!(in_annotation_terms("ends with --ready-window"), "ends with shed.io/ready-window");
    }

    #[test]
    fn only_the_files_own_keys_are_keys() {
        assert!(has_key("limit") && has_key("ready-window"));
        assert!(!has_key("no-such-key") && !has_key("") && !has_key("Limit"));
        // keys() lists each of them once (the docs' check walks it).
        let listed: Vec<&str> = keys().collect();
        let distinct: std::collections::BTreeSet<&str> = listed.iter().copied().collect();
        assert_eq!((listed.len(), distinct.len()), (KEYS.len(), KEYS.len()), "{listed:?}");
        assert!(["ports", "limit", "ready-window", "cri-socket"].iter().all(|k| listed.contains(k)), "{listed:?}");
        assert!(listed.iter().all(|k| has_key(k)));
    }

    #[test]
    fn every_field_round_trips_through_a_file() {
        let from_flags = attach(parse_cli(EVERY_FLAG.iter().copied()).unwrap());
        let text = render(&from_flags);
        for (key, _, _) in KEYS.iter().filter(|k| k.0 != "limit") {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{key} ")) || l == format!("[{key}]")),
                "{key} missing:\n{text}"
            );
        }
        let from_file = with_file(&text, &[]).unwrap();
        assert_eq!(format!("{from_file:?}"), format!("{from_flags:?}"), "file:\n{text}");
        // --limit (fixed) is the one flag the adaptive set above leaves out.
        let fixed = with_file("ports = [9000]\nlimit = 12\n", &[]).unwrap();
        assert_eq!((fixed.ports.as_slice(), fixed.limit), (&[9000][..], Some(12)));
    }

    #[test]
    fn netns_is_one_name_or_a_list() {
        assert_eq!(with_file("ports = [80]\nnetns = \"web\"\n", &[]).unwrap().netns, ["web"]);
        let two = with_file("ports = [80]\nnetns = [\"web\", \"api\"]\n", &[]).unwrap();
        assert_eq!(two.netns, ["web", "api"]);
        // Rendered as it was given, and read back the same.
        let text = render(&two);
        assert!(text.contains("netns = [\"web\", \"api\"]"), "{text}");
        assert_eq!(with_file(&text, &[]).unwrap().netns, ["web", "api"]);
        // The command line replaces the file's list.
        assert_eq!(with_file("ports = [80]\nnetns = [\"web\", \"api\"]\n", &["--netns", "db"]).unwrap().netns, ["db"]);
        let err = with_file("ports = [80]\nnetns = 3\n", &[]).unwrap_err().to_string();
        assert!(err.contains(":2:") && err.contains("`netns`: expected a string"), "{err}");
        let err = with_file("ports = [80]\nnetns = [\"\"]\n", &[]).unwrap_err().to_string();
        assert!(err.contains("empty namespace"), "{err}");
    }

    #[test]
    fn flags_override_the_file() {
        let text = "ports = [1000, 2000]\nlimit = 5\naction = \"rst\"\ndry-run = true\n";
        let a = with_file(text, &["--port", "3000", "--limit", "7"]).unwrap();
        assert_eq!(
            (a.ports, a.limit, a.action, a.dry_run),
            (vec![3000], Some(7), crate::kernel::options::Action::Rst, true)
        );
        let a = with_file(text, &[]).unwrap();
        assert_eq!((a.ports, a.limit), (vec![1000, 2000], Some(5)));
        // Flags of another name that contradict a key replace it (a refusal would be a
        // systemd restart loop): a fixed limit over the file's limiter, a limiter over
        // its fixed limit, --no-dry-run over its dry-run.
        let adaptive = "ports = [80]\nalgo = \"gradient\"\ninitial-limit = 40\ndry-run = true\n";
        let a = with_file(adaptive, &["--limit", "50", "--no-dry-run"]).unwrap();
        assert_eq!((a.algo, a.initial_limit, a.limit, a.dry_run), (None, None, Some(50), false));
        assert_eq!(a.control().unwrap().1, 50);
        let a = with_file(text, &["--algo", "queue"]).unwrap();
        assert_eq!((a.algo, a.limit), (Some(Algo::Queue), None));
        assert!(a.control().is_ok());
        let a = with_file(text, &["--initial-limit", "30"]).unwrap();
        assert_eq!((a.limit, a.control().unwrap().1), (None, 30));
        // --algo fixed agrees with the file's limit: kept.
        let a = with_file(text, &["--algo", "fixed"]).unwrap();
        assert_eq!(a.control().unwrap().1, 5);
    }

    #[test]
    fn a_file_that_cannot_be_read_names_it_without_a_line() {
        let err = parse_cli(["shedctl", "attach", "--config", "/nonexistent/shed.toml"]).unwrap_err().to_string();
        assert!(err.starts_with("/nonexistent/shed.toml: cannot read the config file"), "{err}");
        let err = crate::cli::tiers::load_tier_file(Path::new("/nonexistent/tiers.toml")).unwrap_err();
        assert!(err.starts_with("cannot read the tier file /nonexistent/tiers.toml"), "{err}");
    }

    /// Durations take the same forms in a file as on the command line: a
    /// whole number in the flag's unit, or a string with its unit.
    #[test]
    fn durations_take_the_flags_forms_in_the_file() {
        let file = "ports = [80]\nwindow = \"1s\"\nqueue-target = 8\nheal-interval = \"2m\"\nready-window = \"15s\"\n";
        let a = with_file(file, &[]).unwrap();
        assert_eq!(a.window, std::time::Duration::from_secs(1));
        assert_eq!(a.guards.queue_target, std::time::Duration::from_millis(8));
        assert_eq!(a.heal_interval, std::time::Duration::from_mins(2));
        assert_eq!(a.ready_window, std::time::Duration::from_secs(15));
        let flags =
            parse_cli(["shedctl", "attach", "--port", "80", "--window", "1s", "--heal-interval", "2m"]).unwrap();
        let crate::cli::Command::Attach(f) = flags.command else { unreachable!("attach") };
        assert_eq!((f.window, f.heal_interval), (a.window, a.heal_interval), "the same values from the flags");
    }

    #[test]
    fn relative_tier_file_is_next_to_the_config() {
        let a = with_file("ports = [80]\ntier-file = \"tiers.toml\"\n", &[]).unwrap();
        let tier_file = a.tier_file.unwrap();
        assert!(tier_file.is_absolute() && tier_file.ends_with("tiers.toml"), "{tier_file:?}");
    }

    #[test]
    fn each_kind_of_bad_input_names_file_line_and_reason() {
        let cases: &[(&str, usize, &str)] = &[
            ("ports = [80]\nlimt = 5\n", 2, "unknown key `limt`"),
            ("ports = [80]\n\nlimit = 0\n", 3, "limit 0 would reject every connection"),
            ("ports = [80]\nlimit = \"many\"\n", 2, "expected a whole number, found string"),
            ("ports = [0]\n", 1, "port 0 cannot be protected"),
            ("ports = 80\n", 1, "expected a list, found integer"),
            ("ports = [80]\naction = \"reset\"\n", 2, "invalid value 'reset'"),
            ("ports = [80]\ndry-run = \"yes\"\n", 2, "expected true or false"),
            ("ports = [80]\n[tiers]\n\"10.0.0.1/8\" = \"critical\"\n", 2, "did you mean 10.0.0.0/8"),
            ("ports = [80]\n[tiers]\n\"10.0.0.0/8\" = \"gold\"\n", 2, "unknown tier"),
            ("ports = [80]\nwindow = 5\n", 2, "out of range"),
            (
                "ports = [80]\nwindow = 1.5\n",
                2,
                "expected a duration (a whole number, or a string such as \"2s\"), found float",
            ),
            ("ports = [80]\nheal-interval = \"soon\"\n", 2, "a number with its unit (250ms, 2s, 1m)"),
            ("ports = [80]\nmetrics = \"localhost\"\n", 2, "not a listen address"),
            ("ports = [80\n", 1, ""),
            ("ports = [80]\nlimit = 5\nlimit = 6\n", 3, "duplicate key"),
        ];
        for (text, line, reason) in cases {
            let err = match with_file(text, &[]) {
                Err(CliError::Config(e)) => e,
                other => panic!("{text:?} must be refused by the config check, got {other:?}"),
            };
            assert!(err.file.ends_with("shed.toml"), "{err}");
            assert_eq!(err.line, *line, "{text:?}: {err}");
            assert!(err.reason.contains(reason), "{text:?}: expected {reason:?} in {err}");
        }
        match parse_cli(["shedctl", "attach", "--config", "/nonexistent/shed.toml"]) {
            Err(CliError::Config(e)) => assert_eq!(e.line, 0, "not on a line: {e}"),
            other => panic!("a missing file must be refused, got {other:?}"),
        }
    }
}
