// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl completions` and `shedctl man`: generated from the clap
//! definitions, so they never drift from the real flags, and available from
//! the binary alone (a package or an image has no cargo).
use std::{io::Write, path::Path};

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;

/// Writes `shell`'s completion script for shedctl to `out`.
pub fn completions(shell: Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "shedctl", out);
}

/// Writes shedctl.1 and one page per verb (shedctl-attach.1, ...) into `dir`.
pub fn man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir).with_context(|| format!("write man pages to {}", dir.display()))
}

/// shedctl(1) as roff, to `out`.
pub fn man_page(out: &mut dyn Write) -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command()).render(out).context("render the man page")
}
