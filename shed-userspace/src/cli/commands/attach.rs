// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl attach`: check everything before anything changes, plan, and run
//! the daemon (`daemon::process`).
use crate::{
    cli::{AttachArgs, annotations, commands::reload, config},
    daemon::{
        gate::{Plan, PodSource},
        process,
    },
    host::system::{self, Need},
};

pub fn execute(args: AttachArgs) -> anyhow::Result<()> {
    if args.print_config {
        // Only a file that `attach` accepts: the same checks first.
        args.control().map_err(anyhow::Error::msg)?;
        print!("{}", config::render(&args));
        return Ok(());
    }
    if args.ports.is_empty() && !args.pods {
        anyhow::bail!("no port to protect: give --port, or `ports = [8080]` in the config file (or --pods)");
    }
    let (spec, tiers) = args.plan()?;
    // Every check runs before anything changes, so a refusal leaves the host untouched.
    system::check_privileges(if args.netns.is_empty() && !args.pods { Need::Attach } else { Need::AttachNetns })?;
    // With --pods alone, the node's own namespace is not gated: only the pods that ask.
    let namespaces = if args.ports.is_empty() { Vec::new() } else { process::namespaces(&args.netns)? };
    system::check_bpffs()?;
    system::check_tracefs()?;
    system::check_tracepoint_layouts()?;
    process::run(Plan {
        ports: args.ports.clone(),
        spec,
        tiers,
        namespaces,
        ifaces: args.ifaces.clone(),
        hook: args.hook,
        xdp_mode: args.xdp_mode,
        action: args.action,
        count: args.count,
        dry_run: args.dry_run,
        max_connections: args.max_connections,
        max_clients: args.max_clients,
        kernel_log: args.kernel_log,
        allow_nat: args.allow_nat,
        window: args.window,
        handshake_window: args.handshake_window,
        heal_interval: args.heal_interval,
        metrics: args.metrics,
        ready_max_shed: args.ready_max_shed,
        ready_window: args.ready_window,
        reloader: reload::reloader(&args),
        pods: args
            .pods
            .then(|| PodSource { socket: args.cri_socket.clone(), read: Box::new(annotations::pod_settings) }),
        dispatcher: None,
        spare: std::sync::Mutex::new(None),
    })
}
