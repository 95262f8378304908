//! The `shedctl` command line (clap derive). Every flag documents itself and
//! validates its value before anything is changed.
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::input::{Action, Hook, Switch, parse_interface, parse_limit, parse_millis, parse_port};

#[derive(Debug, Parser)]
#[command(
    name = "shedctl",
    version,
    about = "shed: an eBPF admission gate that sheds new TCP connections before a service overloads",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach the gate, then run in the foreground until SIGINT/SIGTERM.
    ///
    /// Example: sudo shedctl attach --port 8080 --limit 200 --action rst
    Attach(AttachArgs),
    /// Show limit, in-flight, admitted and rejected per protected port.
    ///
    /// Example: shedctl stats --port 8080 --json
    Stats(StatsArgs),
    /// Change a protected port's settings live; the next SYN sees them.
    ///
    /// Example: shedctl set --port 8080 --limit 50
    Set(SetArgs),
    /// Stop gating one port, or stop the gate entirely.
    ///
    /// Example: shedctl detach --port 8080
    Detach(DetachArgs),
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Port to protect; repeat for several (--port 8080 --port 8443).
    #[arg(long = "port", required = true, value_parser = parse_port)]
    pub ports: Vec<u16>,

    /// Interface to gate; repeat for several (--iface eth0 --iface lo).
    /// Default: every interface of the namespace, loopback included.
    #[arg(long = "iface", value_parser = parse_interface)]
    pub ifaces: Vec<String>,

    /// Hook on every interface (--hook tc). Default: xdp, and tc on loopback.
    #[arg(long, value_enum)]
    pub hook: Option<Hook>,

    /// What a rejected SYN gets (--action rst).
    #[arg(long, value_enum, default_value_t = Action::Drop)]
    pub action: Action,

    /// Concurrency limit: admit while in-flight < limit (--limit 200).
    #[arg(long, value_parser = parse_limit, default_value_t = 100)]
    pub limit: u32,

    /// Count what would be rejected, but admit everything (--dry-run).
    #[arg(long)]
    pub dry_run: bool,

    /// Network namespace to gate: a name from `ip netns` or a path (--netns srv).
    #[arg(long)]
    pub netns: Option<String>,

    /// Milliseconds an admitted handshake may hold its slot before it expires (--pending-timeout 2000).
    #[arg(long, default_value = "2000", value_parser = |s: &str| parse_millis(s, 100, 60_000))]
    pub pending_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Only this port (--port 8080).
    #[arg(long, value_parser = parse_port)]
    pub port: Option<u16>,

    /// Print a JSON list, one object per port (--json).
    #[arg(long)]
    pub json: bool,

    /// Refresh until interrupted (--watch).
    #[arg(long)]
    pub watch: bool,

    /// Milliseconds between the two samples that give the rates, and between refreshes (--interval 1000).
    #[arg(long, default_value = "500", value_parser = |s: &str| parse_millis(s, 50, 60_000))]
    pub interval: Duration,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("change").required(true).multiple(true).args(["limit", "action", "dry_run"])))]
pub struct SetArgs {
    /// The protected port to change (--port 8080).
    #[arg(long, value_parser = parse_port)]
    pub port: u16,

    /// New concurrency limit (--limit 50).
    #[arg(long, value_parser = parse_limit)]
    pub limit: Option<u32>,

    /// New reject action (--action rst).
    #[arg(long, value_enum)]
    pub action: Option<Action>,

    /// Dry-run on or off (--dry-run on).
    #[arg(long)]
    pub dry_run: Option<Switch>,
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Stop gating only this port (--port 8080); without it the whole gate stops.
    #[arg(long, value_parser = parse_port)]
    pub port: Option<u16>,

    /// Milliseconds to wait for the daemon to exit (--timeout 5000).
    #[arg(long, default_value = "5000", value_parser = |s: &str| parse_millis(s, 100, 600_000))]
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("shedctl").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn attach_parses_everything() {
        let cli = parse(&[
            "attach", "--port", "8080", "--port", "9090", "--iface", "veth0", "--hook", "tc", "--action", "rst",
            "--limit", "5", "--dry-run", "--netns", "srv",
        ])
        .unwrap();
        let Command::Attach(a) = cli.command else { panic!("expected attach") };
        assert_eq!(a.ports, [8080, 9090]);
        assert_eq!(a.ifaces, ["veth0"]);
        assert_eq!((a.hook, a.action, a.limit, a.dry_run), (Some(Hook::Tc), Action::Rst, 5, true));
        assert_eq!(a.netns.as_deref(), Some("srv"));
    }

    #[test]
    fn attach_defaults() {
        let Command::Attach(a) = parse(&["attach", "--port", "8080"]).unwrap().command else { panic!() };
        assert_eq!((a.hook, a.action, a.limit, a.dry_run), (None, Action::Drop, 100, false));
        assert_eq!(a.pending_timeout, Duration::from_secs(2));
    }

    #[test]
    fn bad_values_are_refused_with_reasons() {
        let cases: &[(&[&str], &str)] = &[
            (&["attach"], "--port"),
            (&["attach", "--port", "0"], "port 0"),
            (&["attach", "--port", "70000"], "out of range"),
            (&["attach", "--port", "8080", "--limit", "0"], "limit 0"),
            (&["attach", "--port", "8080", "--limit", "99999999"], "maximum"),
            (&["attach", "--port", "8080", "--action", "reset"], "reset"),
            (&["attach", "--port", "8080", "--hook", "kprobe"], "kprobe"),
            (&["set", "--port", "8080"], "required"),
            (&["set", "--port", "8080", "--dry-run", "maybe"], "on or off"),
            (&["stats", "--interval", "1"], "out of range"),
        ];
        for (args, expected) in cases {
            let err = parse(args).expect_err(&format!("{args:?} must be refused")).to_string();
            assert!(err.contains(expected), "{args:?}: expected {expected:?} in {err}");
        }
    }

    #[test]
    fn set_and_detach() {
        let Command::Set(s) = parse(&["set", "--port", "8080", "--dry-run", "off", "--limit", "7"]).unwrap().command else {
            panic!()
        };
        assert_eq!((s.port, s.limit, s.action, s.dry_run), (8080, Some(7), None, Some(Switch(false))));
        let Command::Detach(d) = parse(&["detach"]).unwrap().command else { panic!() };
        assert_eq!(d.port, None);
    }
}
