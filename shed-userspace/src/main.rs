// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl`: the daemon and the operator's CLI.
use shed::{
    cli::Command,
    cli::{commands, config},
};

fn main() {
    shed::host::system::limit_malloc_arenas();
    let logs = tracing_subscriber::fmt()
        // SHED_LOG, else the Rust ecosystem's RUST_LOG, else info.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHED_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr);
    // SHED_LOG_FORMAT=json: one JSON object per line, for log shippers.
    if std::env::var("SHED_LOG_FORMAT").is_ok_and(|f| f == "json") {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
    let cli = match config::parse_cli(std::env::args_os()) {
        Ok(cli) => cli,
        Err(config::CliError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("shedctl: error: {e}");
            std::process::exit(shed::error::exit::USAGE);
        }
    };
    let result = match cli.command {
        Command::Attach(args) => commands::attach::execute(args),
        Command::Stats(args) => commands::stats::execute(args),
        Command::Pods(args) => commands::pods::execute(&args),
        Command::Top(args) => commands::top::execute(args),
        Command::Set(args) => commands::set::execute(args),
        Command::Detach(args) => commands::detach::execute(args),
        Command::Tier(command) => commands::tier::execute(command),
        Command::Config(shed::cli::ConfigCommand::Save { file, netns }) => {
            commands::config_save::execute(&file, netns.as_deref())
        }
        Command::Completions { shell } => {
            commands::docs::completions(shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir: Some(dir) } => commands::docs::man_pages(&dir),
        Command::Man { dir: None } => commands::docs::man_page(&mut std::io::stdout()),
    };
    if let Err(err) = result {
        eprintln!("shedctl: error: {}", chain_message(&err));
        std::process::exit(shed::error::Error::exit_code_of(&err));
    }
}

/// The error and its causes, each said once ([`shed::error::said_once`]).
fn chain_message(err: &anyhow::Error) -> String {
    shed::error::said_once(err.to_string(), err.chain().skip(1).map(ToString::to_string))
}
