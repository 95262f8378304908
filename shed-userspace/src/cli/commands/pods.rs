// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl pods`: the node's ready pods as the container runtime reports
//! them, and what each one's `shed.io/*` annotations ask for: the ports and
//! settings of its gate, nothing, or the annotation that cannot be used and why.
use std::{collections::BTreeSet, fmt::Write as _};

use crate::{
    cli::{
        PodsArgs,
        annotations::{AnnotationError, pod_attach_args},
    },
    host::{
        cri::{self, PodSandbox},
        paths,
    },
};

/// One pod and what it asks of shed.
#[derive(Debug, serde::Serialize)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub id: String,
    /// Its network namespace's path (null: none of its own).
    pub netns: Option<std::path::PathBuf>,
    /// `gated` (its annotations ask for a gate), `none` (they do not), `refused` (they cannot be used).
    pub asks: &'static str,
    /// Whether a gate judges it now: its namespace's gate runs (its maps
    /// pinned, as `stats` finds them; root reads them), or a stopped agent
    /// left its programs judging it for the next. A pod that asks and is not gated
    /// was refused (`shed_pod_refused`, and the agent's log, say why) or is
    /// still being set up.
    pub gated: bool,
    /// `gated` (the running agent's gate judges it), `handing_over` (a
    /// stopped agent's programs judge it until the next agent takes it
    /// over), or `ungated`.
    pub state: &'static str,
    /// The ports its annotations name.
    pub ports: Vec<u16>,
    /// Its `shed.io/*` annotations, as written.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Why they cannot be used (`asks` = `refused`).
    pub error: Option<String>,
}

impl PodView {
    /// `pod` as the agent reads it, over its config file `defaults`; `running`:
    /// the labels of the namespaces whose gate runs (read once for every pod).
    fn of(pod: PodSandbox, defaults: Option<&std::path::Path>, judging: &Judging) -> Self {
        let refused = |why: &str| ("refused", Vec::new(), Some(why.to_owned()));
        let (asks, mut ports, error) = match (pod_attach_args(&pod.annotations, defaults), &pod.netns) {
            (Ok(None), _) => ("none", Vec::new(), None),
            (Ok(Some(_)), _) if pod.host_network => refused(
                "a host-network pod shares the node's namespace: gate its ports with the node's own `attach --port`",
            ),
            (Ok(Some(_)), None) => refused("the runtime reports no network namespace for the pod"),
            (Ok(Some(args)), Some(_)) => ("gated", args.ports, None),
            (Err(AnnotationError { key, reason }), _) => ("refused", Vec::new(), Some(format!("{key}: {reason}"))),
        };
        ports.sort_unstable();
        ports.dedup();
        let annotations =
            pod.annotations.into_iter().filter(|(k, _)| k.starts_with(crate::cli::annotations::PREFIX)).collect();
        let label = pod.netns.as_deref().map(|path| paths::netns_label(Some(&paths::netns_name(path))));
        let state = match label {
            Some(label) if judging.handing_over.contains(&label) => "handing_over",
            Some(label) if judging.running.contains(&label) => "gated",
            _ => "ungated",
        };
        let gated = state != "ungated";
        Self {
            namespace: pod.namespace,
            name: pod.name,
            id: pod.id,
            netns: pod.netns,
            asks,
            gated,
            state,
            ports,
            annotations,
            error,
        }
    }
}

/// The namespaces a gate judges now, by label.
#[derive(Default)]
struct Judging {
    /// The running gates' (as `stats` finds them: a folder with the ports map pinned).
    running: BTreeSet<String>,
    /// Those a stopped node agent left judging for the next, not yet taken over.
    handing_over: BTreeSet<String>,
}

impl Judging {
    fn now() -> Self {
        Self {
            running: crate::kernel::maps::pinned_gate_dirs().into_iter().map(|(label, _)| label).collect(),
            handing_over: crate::kernel::handover::handing_over_labels(),
        }
    }
}

pub fn execute(args: &PodsArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let pods = runtime.block_on(async {
        let socket = cri::resolve_socket(&args.cri_socket)?;
        let mut client = cri::connect(&socket).await?;
        cri::pod_sandboxes(&mut client, &socket, &mut cri::Networks::default()).await
    })?;
    let judging = Judging::now();
    let views: Vec<PodView> = pods.into_iter().map(|pod| PodView::of(pod, args.config.as_deref(), &judging)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&views)?);
    } else {
        print!("{}", table(&views));
    }
    Ok(())
}

fn table(views: &[PodView]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<40}  {:<8}  {:<8}  {:<12}  NETNS", "POD", "ASKS", "GATED", "PORTS");
    for v in views {
        let ports = if v.ports.is_empty() {
            "-".to_owned()
        } else {
            v.ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        };
        let netns = v.netns.as_ref().map_or_else(|| "-".to_owned(), |p| p.display().to_string());
        let gated = match v.state {
            "handing_over" => "handover",
            _ if v.gated => "yes",
            _ => "no",
        };
        let pod = format!("{}/{}", v.namespace, v.name);
        let _ = writeln!(out, "{pod:<40}  {:<8}  {gated:<8}  {ports:<12}  {netns}", v.asks);
        if let Some(error) = &v.error {
            let _ = writeln!(out, "    {error}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, annotations: &[(&str, &str)], netns: bool) -> PodSandbox {
        PodSandbox {
            id: format!("id-{name}"),
            namespace: "default".into(),
            name: name.into(),
            annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            netns: netns.then(|| format!("/var/run/netns/cni-{name}").into()),
            host_network: !netns,
        }
    }

    #[test]
    fn each_pod_shows_what_it_asks_for_or_why_not() {
        let views: Vec<PodView> = [
            pod("web", &[("shed.io/ports", "9090,8080,8080"), ("shed.io/limit", "50"), ("app", "web")], true),
            pod("plain", &[("app", "plain")], true),
            pod("bad", &[("shed.io/ports", "8080"), ("shed.io/limit", "lots")], true),
            pod("host", &[("shed.io/ports", "8080")], false),
        ]
        .into_iter()
        .chain([pod("left", &[("shed.io/ports", "8080")], true)])
        .map(|pod| {
            // `left`'s gate is pinned by the next agent, which has not taken it over yet.
            let judging = Judging {
                running: BTreeSet::from(["cni-web", "cni-elsewhere", "cni-left"].map(str::to_owned)),
                handing_over: BTreeSet::from(["cni-left", "cni-gone"].map(str::to_owned)),
            };
            PodView::of(pod, None, &judging)
        })
        .collect();
        assert_eq!(
            (views[0].asks, views[0].ports.as_slice(), views[0].error.as_deref()),
            ("gated", &[8080, 9090][..], None)
        );
        assert_eq!(views[0].annotations.len(), 2, "only shed's annotations: {:?}", views[0].annotations);
        assert_eq!((views[1].asks, views[1].ports.is_empty()), ("none", true));
        assert_eq!(views[2].asks, "refused");
        assert!(views[2].error.as_deref().is_some_and(|e| e.starts_with("shed.io/limit: ")), "{:?}", views[2].error);
        assert_eq!(views[3].asks, "refused", "a host-network pod");
        assert!(views[3].error.as_deref().is_some_and(|e| e.contains("host-network")), "{:?}", views[3].error);
        assert_eq!(
            views.iter().map(|v| v.gated).collect::<Vec<_>>(),
            [true, false, false, false, true],
            "web's gate runs"
        );
        assert_eq!(
            views.iter().map(|v| v.state).collect::<Vec<_>>(),
            ["gated", "ungated", "ungated", "ungated", "handing_over"],
            "left is judged by the last agent's programs until taken over"
        );
        let text = table(&views);
        assert!(
            text.contains("default/web") && text.contains("8080,9090") && text.contains("    shed.io/limit: "),
            "{text}"
        );
        let web = text.lines().find(|l| l.starts_with("default/web ")).unwrap();
        assert_eq!(web.split_whitespace().take(3).collect::<Vec<_>>(), ["default/web", "gated", "yes"], "{text}");
        let left = text.lines().find(|l| l.starts_with("default/left ")).unwrap();
        assert_eq!(
            left.split_whitespace().take(3).collect::<Vec<_>>(),
            ["default/left", "gated", "handover"],
            "{text}"
        );
    }
}
