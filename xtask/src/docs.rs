// SPDX-License-Identifier: MIT OR Apache-2.0
//! Shell completions and man pages, written by the shedctl binary itself
//! (`shedctl completions`, `shedctl man`) so they never drift from the real
//! flags, and xtask needs none of shed's crates to install them.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::run;

/// Writes completions under `share` (bash, zsh, fish in their usual folders)
/// and man pages under `share/man/man1` (shedctl.1 and one page per verb).
/// Returns the files written.
pub(crate) fn generate(shedctl: &Path, share: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (shell, file) in [
        ("bash", "bash-completion/completions/shedctl"),
        ("zsh", "zsh/vendor-completions/_shedctl"),
        ("fish", "fish/vendor_completions.d/shedctl.fish"),
    ] {
        let path = share.join(file);
        let dir = path.parent().expect("has a parent");
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let script = Command::new(shedctl).args(["completions", shell]).output()?;
        if !script.status.success() {
            bail!("{} completions {shell} failed", shedctl.display());
        }
        fs::write(&path, script.stdout).with_context(|| format!("write {}", path.display()))?;
        written.push(path);
    }
    let man = share.join("man/man1");
    fs::create_dir_all(&man).with_context(|| format!("create {}", man.display()))?;
    run(Command::new(shedctl).args(["man", "--dir"]).arg(&man))?;
    for entry in fs::read_dir(&man)? {
        written.push(entry?.path());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    #[test]
    fn completions_and_man_pages_cover_every_verb_and_flag() {
        // The shedctl `cargo xtask test` builds before the tests.
        let shedctl = workspace_root().join("target/debug/shedctl");
        let dir = tempfile::tempdir().unwrap();
        let files = generate(&shedctl, dir.path()).unwrap();
        let read = |rel: &str| fs::read_to_string(dir.path().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let bash = read("bash-completion/completions/shedctl");
        for word in ["attach", "stats", "set", "detach", "tier", "--client-cap", "--xdp-mode"] {
            assert!(bash.contains(word), "bash completion lacks {word}");
        }
        assert!(read("zsh/vendor-completions/_shedctl").contains("--handshake-window"));
        assert!(read("fish/vendor_completions.d/shedctl.fish").contains("rst-prefix-rate"));
        let attach = read("man/man1/shedctl-attach.1");
        assert!(
            attach.contains("\\-\\-limit") && attach.contains("\\-\\-tier\\-file"),
            "man page of attach lacks flags"
        );
        assert!(files.iter().any(|f| f.ends_with("shedctl.1")));
    }
}
