//! Shell completions and man pages, generated from shedctl's clap definitions
//! so they never drift from the real flags.
use std::{fs, path::Path};

use anyhow::{Context as _, Result};
use clap_complete::Shell;

/// Writes completions under `share` (bash, zsh, fish in their usual folders)
/// and man pages under `share/man/man1`. Returns the files written.
pub fn generate(share: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    for (shell, dir, file) in [
        (Shell::Bash, "bash-completion/completions", "shedctl"),
        (Shell::Zsh, "zsh/vendor-completions", "_shedctl"),
        (Shell::Fish, "fish/vendor_completions.d", "shedctl.fish"),
    ] {
        let dir = share.join(dir);
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let path = dir.join(file);
        let mut out = Vec::new();
        shed::cli::commands::docs::completions(shell, &mut out);
        fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
        written.push(path);
    }
    let man = share.join("man/man1");
    fs::create_dir_all(&man).with_context(|| format!("create {}", man.display()))?;
    // shedctl.1 plus one page per verb (shedctl-attach.1, ...).
    shed::cli::commands::docs::man_pages(&man)?;
    for entry in fs::read_dir(&man)? {
        written.push(entry?.path());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_man_pages_cover_every_verb_and_flag() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path()).unwrap();
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
