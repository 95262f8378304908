// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `shedctl` commands the README and the guides show in their code
//! blocks, as an operator would copy them: checked by the tests (each parses
//! with the CLI as built, and each runs against a live gate).
use std::path::{Path, PathBuf};

/// One documented command: the file it is in, the line as written (without
/// `sudo`, a comment, a pipe or a redirect) and its words.
#[derive(Clone, Debug)]
pub struct Documented {
    pub doc: PathBuf,
    pub command: String,
    pub words: Vec<String>,
}

/// Every `shedctl` command in a code block of the README and of `docs/*.md`
/// under `root` (the workspace), in the order the files show them.
pub fn documented_commands(root: &Path) -> Vec<Documented> {
    let mut docs = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    guides.sort();
    docs.extend(guides);
    let mut found = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("a doc");
        let (mut in_block, mut pending) = (false, String::new());
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if !in_block {
                continue;
            }
            // A continued line joins the next.
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                continue;
            }
            let line = std::mem::take(&mut pending) + line;
            // The command alone: no comment, pipe, redirect or second command.
            let command = line.split(" #").next().unwrap().split(['|', ';', '>', '&']).next().unwrap().trim();
            let command = command.strip_prefix("sudo ").unwrap_or(command).trim();
            if !command.starts_with("shedctl ") {
                continue;
            }
            found.push(Documented { doc: doc.clone(), command: command.to_owned(), words: shell_words(command) });
        }
    }
    found
}

/// Splits a command line into words as a shell would for plain quoting.
pub fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut started) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            // Inside quotes, or a plain character.
            (_, c) => word.push(c),
        }
    }
    if started || !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_as_a_shell_splits_plain_quoting() {
        assert_eq!(shell_words("shedctl set --port 8080"), ["shedctl", "set", "--port", "8080"]);
        assert_eq!(shell_words("a 'b c' \"\" d"), ["a", "b c", "", "d"]);
    }
}
