// SPDX-License-Identifier: MIT OR Apache-2.0
//! shed-bench: the benchmarks (B1-B13) and the live demo, as their own binary
//! so that `cargo xtask` compiles only what set-up needs. `cargo xtask bench`
//! and `cargo xtask demo` build the kernel object, shedctl and this, then run
//! it (as root: every benchmark loads real programs).
//!
//! Measurements, not tests: each benchmark writes `bench/results/<name>.json`
//! and a section of `bench/results/REPORT.md`. Figures are medians of repeated
//! runs with min-max, and every comparison is taken in the same run (absolute
//! numbers drift between machines). The smoke tests only check that each one
//! still measures what it reports.
use std::{fs, path::PathBuf};

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

use crate::common::{Scale, results_dir};

mod b1;
mod b10;
mod b11;
mod b12;
mod b13;
mod b14;
mod b2;
mod b3;
mod b4;
mod b5;
mod b6;
mod b7;
mod b8;
mod b9;
mod common;
mod demo;
mod plot;
#[cfg(test)]
mod smoke;

#[derive(Parser)]
#[command(name = "shed-bench", about = "shed's benchmarks and demo (root)")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run benchmarks: writes bench/results/<name>.json and REPORT.md.
    Run {
        /// Fewer and shorter samples.
        #[arg(long)]
        quick: bool,
        /// Benchmarks to run (default: all): b1, b4, b9.
        names: Vec<String>,
    },
    /// The live demo in throwaway network namespaces.
    Demo {
        /// Seconds to run.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
    /// (Internal, for B9) hold connections in a process of its own until stdin closes:
    /// serve on ADDR, or with --from open COUNT connections to ADDR.
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        netns: String,
        #[arg(long)]
        addr: std::net::SocketAddr,
        #[arg(long)]
        from: Option<std::net::IpAddr>,
        #[arg(long, default_value_t = 0)]
        count: usize,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Run { quick, names } => run(quick, &names),
        Task::Demo { seconds } => demo::run(&PathBuf::from(shed_testkit::gate::shedctl_path()), seconds),
        Task::Hold { netns, addr, from, count } => b9::hold(&netns, addr, from, count),
    }
}

fn run(quick: bool, names: &[String]) -> Result<()> {
    let scale = if quick { Scale::Quick } else { Scale::Full };
    let all = ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12", "b13", "b14"];
    for n in names {
        if !all.contains(&n.to_ascii_lowercase().as_str()) {
            bail!("unknown benchmark {n:?}: available: {}", all.join(", "));
        }
    }
    let wanted = |n: &str| names.is_empty() || names.iter().any(|w| w.eq_ignore_ascii_case(n));
    let header = format!(
        "Measured {} on {} ({} CPUs), kernel {}{}.\n\n",
        chrono_free_date(),
        std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        if quick { " (--quick)" } else { "" }
    );
    fs::create_dir_all(results_dir())?;
    // Each benchmark keeps its own JSON and report section, so running one leaves the others' results in place.
    let save = |name: &str, (json, md): (serde_json::Value, String)| -> Result<()> {
        fs::write(results_dir().join(format!("{name}.json")), serde_json::to_string_pretty(&json)?)?;
        fs::write(results_dir().join(format!("{name}.md")), format!("{header}{md}"))?;
        Ok(())
    };
    if wanted("b1") {
        save("b1", b1::b1(scale)?)?;
    }
    // `$SHEDCTL` may name another build: say which one is measured.
    let shedctl = PathBuf::from(shed_testkit::gate::shedctl_path());
    println!("shed-bench: measuring {}", shedctl.display());
    if wanted("b2") {
        save("b2", b2::b2(&shedctl, scale)?)?;
    }
    if wanted("b3") {
        save("b3", b3::b3(&shedctl, scale)?)?;
    }
    if wanted("b4") {
        save("b4", b4::b4(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b5") {
        save("b5", b5::b5(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b6") {
        save("b6", b6::b6(&shedctl, scale)?)?;
    }
    if wanted("b7") {
        save("b7", b7::b7(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b8") {
        save("b8", b8::b8(&shedctl, scale)?)?;
    }
    if wanted("b9") {
        save("b9", b9::b9(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b10") {
        save("b10", b10::b10(&shedctl, scale)?)?;
    }
    if wanted("b11") {
        save("b11", b11::b11(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b12") {
        save("b12", b12::b12(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b13") {
        save("b13", b13::b13(&shedctl, scale, &results_dir())?)?;
    }
    if wanted("b14") {
        save("b14", b14::b14(&shedctl, scale)?)?;
    }
    let mut report = String::from("# shed benchmark report\n\n");
    for name in all {
        if let Ok(section) = fs::read_to_string(results_dir().join(format!("{name}.md"))) {
            report.push_str(&section);
            report.push('\n');
        }
    }
    fs::write(results_dir().join("REPORT.md"), report)?;
    println!("wrote {}", results_dir().join("REPORT.md").display());
    Ok(())
}

/// Today's date (UTC) without a date crate: `date -u +%F`.
fn chrono_free_date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
