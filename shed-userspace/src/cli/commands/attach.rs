// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl attach`: check everything before anything changes, plan, and run
//! the daemon (`daemon::process`).
use crate::{
    cli::{AttachArgs, annotations, commands::reload, config},
    daemon::{
        plan::{GatePlan, NodePlan, PodSource},
        process,
    },
    host::system::{self, Need},
};

pub fn execute(args: AttachArgs) -> anyhow::Result<()> {
    if args.print_config {
        print!("{}", printed_config(&args)?);
        return Ok(());
    }
    let gate = checked_plan(&args)?;
    let metrics_token = args.metrics_token_file.as_deref().map(metrics_token).transpose()?;
    // `auto`: the runtime's socket found here, before anything changes.
    let cri_socket =
        if args.pods { crate::host::cri::resolve_socket(&args.cri_socket)? } else { args.cri_socket.clone() };
    // Every check runs before anything changes, so a refusal leaves the host untouched.
    system::check_privileges(if args.netns.is_empty() && !args.pods { Need::Attach } else { Need::AttachNetns })?;
    // With --pods alone, the node's own namespace is not gated: only the pods that ask.
    let namespaces = if args.ports.is_empty() { Vec::new() } else { process::namespaces(&args.netns)? };
    system::check_kernel()?;
    system::check_bpffs()?;
    // tracefs (the regular tracepoint's id and record layout) only where the
    // raw tracepoint cannot count connections: a kernel whose BTF lacks the
    // socket's layout. Containers and sandboxed units often lack tracefs.
    if crate::kernel::object::SockStateHook::Auto.program() == shed_common::program::SOCK_STATE {
        system::check_tracefs()?;
        system::check_tracepoint_layouts()?;
    }
    process::run(NodePlan {
        gate,
        namespaces,
        ifaces: args.ifaces.clone(),
        hook: args.hook,
        xdp_mode: args.xdp_mode,
        max_connections: args.max_connections,
        max_clients: args.max_clients,
        pod_max_connections: args.pod_max_connections,
        pod_max_clients: args.pod_max_clients,
        kernel_log: args.kernel_log,
        allow_nat: args.allow_nat,
        heal_interval: args.heal_interval,
        metrics: args.metrics,
        metrics_token,
        memory_budget: crate::daemon::budget::Budget::of(args.memory_budget, system::cgroup_memory()),
        ready_max_shed: args.ready_max_shed,
        ready_window: args.ready_window,
        reloader: reload::reloader(&args),
        pods: args.pods.then(|| {
            // A pod's annotations over the agent's own config file (the ConfigMap's defaults).
            let defaults = args.config.clone();
            PodSource {
                socket: cri_socket,
                read: Box::new(move |pod| annotations::pod_settings(pod, defaults.as_deref())),
                expedite_rcu: !args.no_expedite_rcu,
            }
        }),
    })
}

/// What `attach` would be given, checked as `attach` checks it before
/// anything changes (ports, the plan: limits, tiers, `http` on a TLS port),
/// but for the host's own readiness.
fn checked_plan(args: &AttachArgs) -> anyhow::Result<GatePlan> {
    if args.ports.is_empty() && !args.pods {
        return Err(crate::error::Error::InvalidPlan {
            reason: "no port to protect: give --port, or `ports = [8080]` in the config file (or --pods)".into(),
        }
        .into());
    }
    if args.metrics_token_file.is_some() && args.metrics.is_none() {
        return Err(crate::error::Error::InvalidPlan {
            reason: "--metrics-token-file guards the metrics endpoint, and there is none: give --metrics too".into(),
        }
        .into());
    }
    // A plan refused for its flags is a usage error (the typed refusals keep their own kind).
    args.gate_plan().map_err(|e| {
        if e.downcast_ref::<crate::error::Error>().is_some() {
            e
        } else {
            crate::error::Error::InvalidPlan { reason: format!("{e:#}") }.into()
        }
    })
}

/// `--print-config`: only a file that `attach` accepts (the same checks
/// first, the namespaces and the token file included; not the host's
/// privileges and kernel, which the file's reader may have).
pub(crate) fn printed_config(args: &AttachArgs) -> anyhow::Result<String> {
    checked_plan(args)?;
    args.metrics_token_file.as_deref().map(metrics_token).transpose()?;
    if !args.ports.is_empty() {
        process::namespaces(&args.netns)?;
    }
    Ok(config::render(args))
}

/// The token in `--metrics-token-file` (surrounding whitespace dropped). A
/// file that cannot be read or holds no usable token is the host's refusal
/// (exit 4), before anything changes.
fn metrics_token(file: &std::path::Path) -> anyhow::Result<std::sync::Arc<str>> {
    let refused = |reason: String| crate::error::Error::MetricsToken { path: file.to_owned(), reason };
    let text = std::fs::read_to_string(file).map_err(|e| refused(format!("cannot read it ({e})")))?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(char::is_whitespace) {
        return Err(refused(
            if token.is_empty() { "it is empty" } else { "the token has whitespace inside" }.to_owned(),
        )
        .into());
    }
    Ok(token.into())
}
