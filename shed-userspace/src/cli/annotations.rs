// SPDX-License-Identifier: MIT OR Apache-2.0
//! A pod's `shed.io/*` annotations: what its gate would be, named as the
//! config file names it (`shed.io/ports: "8080,9090"`, `shed.io/limit: "50"`,
//! `shed.io/tiers: "10.0.0.0/8=critical"`). Every value goes through the
//! flag's own parser, as a config file's does, so a pod, a file and the
//! command line accept the same values and give the same reasons; a bad one
//! is that pod's error, naming the annotation.
use std::collections::BTreeMap;

use crate::{
    cli::{AttachArgs, Command, config},
    daemon::plan::{GatePlan, PodRefusal},
};

pub use crate::cli::config::ANNOTATION_PREFIX as PREFIX;

/// Why a pod's annotations do not make a gate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}: {reason}")]
pub struct AnnotationError {
    /// The annotation (`shed.io/limit`), or `shed.io/*` for a conflict between several.
    pub key: String,
    pub reason: String,
}

/// The `attach` settings a pod's annotations ask for; `None` when it asks
/// for nothing (no `shed.io/` annotation at all). Over `defaults`, the node
/// agent's own config file (the ConfigMap's `shed.toml`), as `attach
/// --config FILE --flag ...` merges a file under its flags: what a pod's
/// annotations set wins, the file gives the rest.
pub fn pod_attach_args(
    annotations: &BTreeMap<String, String>,
    defaults: Option<&std::path::Path>,
) -> Result<Option<AttachArgs>, AnnotationError> {
    let ours: BTreeMap<&str, &str> =
        annotations.iter().filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?, v.as_str()))).collect();
    if ours.is_empty() {
        return Ok(None);
    }
    if !ours.contains_key("ports") {
        return Err(AnnotationError {
            key: format!("{PREFIX}ports"),
            reason: "missing: the pod's other shed.io settings apply to its ports (shed.io/ports: \"8080\")".into(),
        });
    }
    let mut argv: Vec<std::ffi::OsString> = vec!["shedctl".into(), "attach".into()];
    if let Some(file) = defaults {
        argv.extend(["--config".into(), file.as_os_str().to_owned()]);
    }
    for (key, value) in &ours {
        let args = config::annotation_args(key, value)
            .map_err(|reason| AnnotationError { key: format!("{PREFIX}{key}"), reason })?;
        argv.extend(args);
    }
    let all = || AnnotationError { key: format!("{PREFIX}*"), reason: String::new() };
    let refused = |reason: String| AnnotationError { reason: config::in_annotation_terms(&reason), ..all() };
    let cli = config::parse_cli(argv).map_err(|e| match e {
        config::CliError::Clap(e) => refused(config::clap_reason(&e)),
        config::CliError::Config(e) => refused(e.to_string()),
    })?;
    let Command::Attach(args) = cli.command else { unreachable!("parsed as attach") };
    // The checks across settings (a limiter's bounds, the http action's ports, ...).
    args.plan().map_err(|e| refused(format!("{e:#}")))?;
    let ports: std::collections::BTreeSet<u16> = args.ports.iter().copied().collect();
    let most = shed_common::capacity::POD_MAX_PORTS as usize;
    if ports.len() > most {
        return Err(AnnotationError {
            key: format!("{PREFIX}ports"),
            reason: format!(
                "{} ports: a pod's gate protects at most {most} (its maps are sized for a pod): list the ports \
                 clients call, or run the busiest on a pod of their own",
                ports.len()
            ),
        });
    }
    Ok(Some(args))
}

/// [`pod_attach_args`] as the daemon reads a pod (`attach --pods`): the
/// plan of its gate, or why it cannot have one.
pub(crate) fn pod_settings(
    annotations: &BTreeMap<String, String>,
    defaults: Option<&std::path::Path>,
) -> Result<Option<GatePlan>, PodRefusal> {
    let refused = |e: AnnotationError| PodRefusal { annotation: Some(e.key), reason: e.reason };
    let Some(args) = pod_attach_args(annotations, defaults).map_err(refused)? else { return Ok(None) };
    Ok(Some(
        args.gate_plan()
            .map_err(|e| refused(AnnotationError { key: format!("{PREFIX}*"), reason: format!("{e:#}") }))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::options::Action;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_pod_without_shed_annotations_asks_for_nothing() {
        let other = annotations(&[("kubernetes.io/config.source", "api"), ("shed.iox/limit", "5")]);
        assert!(matches!(pod_attach_args(&other, None), Ok(None)));
    }

    #[test]
    fn annotations_are_the_config_files_keys() {
        let pod = annotations(&[
            ("shed.io/ports", "8080, 9090"),
            ("shed.io/limit", "50"),
            ("shed.io/action", "rst"),
            ("shed.io/count", "connections"),
            ("shed.io/tiers", "10.0.0.0/8=critical, 192.168.0.0/16=low"),
            ("shed.io/dry-run", "true"),
            ("shed.io/client-cap", "7"),
            ("app", "web"),
        ]);
        let args = pod_attach_args(&pod, None).unwrap().expect("asks for a gate");
        assert_eq!(args.ports, [8080, 9090]);
        assert_eq!(args.action, Action::Rst);
        assert!(args.dry_run);
        let (spec, tiers) = args.plan().unwrap();
        assert_eq!(spec.limit, 50);
        assert_eq!(tiers.len(), 2);
        assert_eq!(spec.client_cap, 7);
        let adaptive =
            annotations(&[("shed.io/ports", "8080"), ("shed.io/algo", "gradient2"), ("shed.io/target-latency", "200")]);
        assert!(pod_attach_args(&adaptive, None).unwrap().is_some());
    }

    #[test]
    fn a_bad_annotation_is_named_with_its_reason() {
        let error = |pairs: &[(&str, &str)]| pod_attach_args(&annotations(pairs), None).unwrap_err();
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/limit", "lots")]);
        assert_eq!(e.key, "shed.io/limit");
        assert!(e.reason.contains("lots"), "{e}");
        let e = error(&[("shed.io/ports", "80800")]);
        assert_eq!(e.key, "shed.io/ports", "{e}");
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/limt", "5")]);
        assert!(e.reason.contains("unknown key `limt`") && e.reason.contains("limit"), "{e}");
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/iface", "eth0")]);
        assert!(
            e.reason.contains("unknown key `iface`") && !e.reason.contains("ifaces"),
            "node keys are not offered: {e}"
        );
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/limit", "-5")]);
        assert_eq!(e.key, "shed.io/limit", "a negative value is the value, not a flag: {e}");
        assert!(!e.reason.contains("--"), "named as annotations, not flags: {e}");
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/limit", " ")]);
        assert_eq!((e.key.as_str(), e.reason.as_str()), ("shed.io/limit", "empty: give a value"));
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/hook", "xdp")]);
        assert!(e.reason.contains("the node's setting"), "{e}");
        let e = error(&[("shed.io/ports", "8080"), ("shed.io/dry-run", "yes")]);
        assert_eq!((e.key.as_str(), e.reason.contains("true or false")), ("shed.io/dry-run", true), "{e}");
        let e = error(&[("shed.io/limit", "5")]);
        assert_eq!(e.key, "shed.io/ports", "settings without ports: {e}");
        let most = shed_common::capacity::POD_MAX_PORTS as u16;
        let listed = |n: u16| (0..n).map(|i| (8000 + i).to_string()).collect::<Vec<_>>().join(",");
        let fits = annotations(&[("shed.io/ports", &listed(most))]);
        assert_eq!(pod_attach_args(&fits, None).unwrap().unwrap().ports.len(), usize::from(most));
        let e = error(&[("shed.io/ports", &listed(most + 1))]);
        assert_eq!(e.key, "shed.io/ports", "{e}");
        assert!(e.reason.starts_with(&format!("{} ports: a pod's gate protects at most {most} ", most + 1)), "{e}");
        let e = error(&[("shed.io/ports", "")]);
        assert_eq!(e.key, "shed.io/ports", "{e}");
        assert!(e.to_string().starts_with("annotation shed.io/ports: "), "{e}");
    }

    #[test]
    fn settings_that_conflict_are_the_pods_error_too() {
        let e = pod_attach_args(
            &annotations(&[("shed.io/ports", "8080"), ("shed.io/limit", "50"), ("shed.io/algo", "gradient")]),
            None,
        )
        .unwrap_err();
        assert_eq!(e.key, "shed.io/*", "{e}");
        assert!(e.reason.contains("shed.io/limit") && !e.reason.contains("--"), "in annotation terms: {e}");
    }

    /// A pod's annotations lie over the node agent's config file (the
    /// ConfigMap's defaults): what a pod does not set comes from the file,
    /// what it sets wins.
    #[test]
    fn a_pod_gets_the_agent_s_config_under_its_annotations() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shed.toml");
        std::fs::write(
            &file,
            "pods = true\naction = \"rst\"\nalgo = \"queue\"\nclient-cap = 7\n[tiers]\n\"127.0.0.0/8\" = \"exempt\"\n",
        )
        .unwrap();
        let only_ports = annotations(&[("shed.io/ports", "8080")]);
        let args = pod_attach_args(&only_ports, Some(&file)).unwrap().expect("asks for a gate");
        assert_eq!((args.ports.clone(), args.action, args.client_cap), (vec![8080], Action::Rst, 7), "the file's");
        assert_eq!(args.tiers.len(), 1, "the file's tiers: {:?}", args.tiers);
        let without = pod_attach_args(&only_ports, None).unwrap().expect("asks for a gate");
        assert_eq!(without.action, Action::Drop, "no file: the command line's defaults");
        let own = annotations(&[("shed.io/ports", "8080"), ("shed.io/action", "http"), ("shed.io/client-cap", "2")]);
        let args = pod_attach_args(&own, Some(&file)).unwrap().expect("asks for a gate");
        assert_eq!((args.action, args.client_cap), (Action::Http, 2), "the pod's own win");
        let limited = annotations(&[("shed.io/ports", "8080"), ("shed.io/limit", "50")]);
        let args = pod_attach_args(&limited, Some(&file)).unwrap().expect("a fixed limit over the file's queue");
        assert_eq!(args.limit, Some(50));
    }

    #[test]
    fn a_pods_settings_are_its_gates_plan_or_a_refusal_naming_the_annotation() {
        let plain = annotations(&[("app", "web")]);
        assert!(matches!(pod_settings(&plain, None), Ok(None)), "no shed annotations: no gate");
        let pod = annotations(&[("shed.io/ports", "8080"), ("shed.io/limit", "12"), ("shed.io/action", "http")]);
        let plan = pod_settings(&pod, None).unwrap().expect("a gate");
        assert_eq!((plan.ports.as_slice(), plan.action, plan.spec.limit), ([8080].as_slice(), Action::Http, 12));
        let bad = annotations(&[("shed.io/ports", "8080"), ("shed.io/limit", "lots")]);
        let refusal = pod_settings(&bad, None).unwrap_err();
        assert_eq!(refusal.annotation.as_deref(), Some("shed.io/limit"));
        assert!(refusal.reason.contains("lots"), "{}", refusal.reason);
    }
}
