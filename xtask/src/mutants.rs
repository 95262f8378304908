// SPDX-License-Identifier: MIT OR Apache-2.0
//! `cargo xtask mutants`: does the test suite catch a broken gate?
//!
//! - Without `--kernel`: cargo-mutants over the pure-logic modules (the list
//!   and the mutants judged equivalent, each with its reason, are in
//!   `.cargo/mutants.toml`), against their unit and property tests.
//! - With `--kernel`: every deliberate fault of `shed-ebpf/src/fault.rs`,
//!   compiled in one at a time, against the program tests first and the
//!   end-to-end tests after (only while none has failed yet).
//!
//! Both write their result to `docs/mutants/` (committed: re-run whenever the
//! code they cover changes).
use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{build_ebpf_with, cargo_command, run, workspace_root};

/// Test binaries that load the programs and feed them frames: fast, run first
/// (the quickest first: each stage stops at the first binary that fails).
const PROGRAM_TESTS: &[&str] = &["fuzz_decide", "prog_test_run"];
/// The rest, with real connections through a gate (minutes): run only for a
/// fault the program tests missed.
const END_TO_END_TESTS: &[&str] = &[
    // Seconds each: first.
    "e2e_namespaces",
    "e2e_pods",
    "e2e_soak",
    "e2e_tiers",
    "e2e_hardening",
    "e2e_gate",
    "e2e_http",
    "e2e_untrusted",
    "e2e_adaptive",
    "e2e_ops",
    "e2e_matrix",
    "e2e_scale",
    "e2e_multiplexed",
];
/// A fault can turn a bounded wait into a long one; past this a stage counts as caught.
const STAGE_TIMEOUT: Duration = Duration::from_mins(20);

/// One fault's result.
struct Verdict {
    name: String,
    planted: String,
    caught_by: Vec<String>,
    stage: String,
    took: Duration,
    /// The row as an earlier report showed it (kept by `--again`), else None.
    shown: Option<String>,
}

pub(crate) fn kernel(only: &[String], again: bool) -> Result<()> {
    let faults = faults()?;
    for name in only {
        if !faults.iter().any(|(n, _)| n == name) {
            bail!("no kernel fault named {name:?}; the faults are listed in shed-ebpf/src/fault.rs");
        }
    }
    // With --again: what the last report shows caught stays as it was.
    let kept: Vec<Verdict> = if again {
        read_kernel_report()?
            .into_iter()
            .filter(|v| v.stage != "missed")
            // What it plants as fault.rs says it now.
            .filter_map(|v| {
                faults.iter().find(|(n, _)| *n == v.name).map(|(_, planted)| Verdict { planted: planted.clone(), ..v })
            })
            .collect()
    } else {
        Vec::new()
    };
    let chosen: Vec<_> = faults
        .iter()
        .filter(|(n, _)| (only.is_empty() || only.contains(n)) && !kept.iter().any(|k| k.name == *n))
        .collect();
    let logs = workspace_root().join("target/mutants/kernel");
    fs::create_dir_all(&logs)?;
    let mut verdicts = Vec::new();
    let result = (|| -> Result<()> {
        for (name, planted) in &chosen {
            let start = Instant::now();
            println!("fault {name}: {planted}");
            build_ebpf_with(Some(name))?;
            let log = logs.join(format!("{name}.log"));
            let mut verdict = Verdict {
                name: name.clone(),
                planted: planted.clone(),
                caught_by: Vec::new(),
                stage: "missed".to_owned(),
                took: Duration::ZERO,
                shown: None,
            };
            for (stage, tests) in [("program tests", PROGRAM_TESTS), ("end-to-end tests", END_TO_END_TESTS)] {
                if tests == END_TO_END_TESTS {
                    // They run the shedctl beside them, which cargo does not rebuild for
                    // another package's tests: built here, it embeds this fault.
                    build_shedctl()?;
                }
                let failed = run_tests(tests, &log)?;
                if !failed.is_empty() {
                    verdict.caught_by = failed;
                    verdict.stage = if again { format!("{stage} (re-run {})", today()?) } else { stage.to_owned() };
                    break;
                }
            }
            verdict.took = start.elapsed();
            println!(
                "fault {name}: {} by {:?} ({:.0} s)",
                verdict.stage,
                verdict.caught_by,
                verdict.took.as_secs_f64()
            );
            verdicts.push(verdict);
        }
        Ok(())
    })();
    // Whatever happened, leave the real object (and a shedctl that embeds it) behind.
    build_ebpf_with(None)?;
    build_shedctl()?;
    result?;
    let missed: Vec<_> = verdicts.iter().filter(|v| v.stage == "missed").map(|v| v.name.clone()).collect();
    let verdicts_len = verdicts.len();
    if only.is_empty() {
        // In the order of fault.rs.
        let mut all: Vec<Verdict> = kept.into_iter().chain(verdicts).collect();
        all.sort_by_key(|v| faults.iter().position(|(n, _)| *n == v.name));
        write_kernel_report(&all)?;
        println!("{} of {} kernel faults caught", all.len() - missed.len(), all.len());
    } else {
        println!("{} of {} faults chosen caught", verdicts_len - missed.len(), verdicts_len);
    }
    if !missed.is_empty() {
        bail!("faults no test caught: {missed:?} (logs in {})", logs.display());
    }
    Ok(())
}

fn build_shedctl() -> Result<()> {
    run(cargo_command().args(["build", "--bin", "shedctl"])).context("build shedctl")
}

/// The fault list, read from the kernel crate's `fault.rs`: each entry a
/// `("name", "what"),`, on one line or (as rustfmt wraps a long one) on several.
fn faults() -> Result<Vec<(String, String)>> {
    let path = workspace_root().join("shed-ebpf/src/fault.rs");
    let text = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let list = text
        .split_once("FAULTS: &[(&str, &str)] = &[")
        .and_then(|(_, rest)| rest.split_once("];"))
        .map(|(list, _)| list)
        .with_context(|| format!("no FAULTS list in {}", path.display()))?;
    let faults = parse_faults(list);
    if faults.len() < 20 {
        bail!(
            "read only {} faults from {} (expected one `(\"name\", \"what\"),` per line)",
            faults.len(),
            path.display()
        );
    }
    Ok(faults)
}

/// The `("name", "what")` entries of a fault list, whatever their line breaks.
fn parse_faults(list: &str) -> Vec<(String, String)> {
    let joined: String = list.lines().map(str::trim).filter(|l| !l.starts_with("//")).collect::<Vec<_>>().join(" ");
    joined
        .split("),")
        .filter_map(|entry| {
            let entry = entry.trim().strip_prefix('(')?.trim();
            let (name, what) = entry.strip_prefix('"')?.split_once('"')?;
            let what = what.trim().strip_prefix(',')?.trim().trim_end_matches(',').trim_end();
            let what = what.strip_prefix('"')?.strip_suffix('"')?;
            Some((name.to_owned(), what.to_owned()))
        })
        .collect()
}

/// Runs test binaries in the order given, one test at a time, up to the first
/// binary with a failure; the names of the tests that failed there.
fn run_tests(tests: &[&str], log: &Path) -> Result<Vec<String>> {
    for test in tests {
        let failed = run_test_binary(test, log)?;
        if !failed.is_empty() {
            return Ok(failed);
        }
    }
    Ok(Vec::new())
}

/// One test binary; the names of its failed tests (one that did not finish in
/// time counts as one failed test).
fn run_test_binary(test: &str, log: &Path) -> Result<Vec<String>> {
    let mut cmd = cargo_command();
    cmd.args(["test", "--test", test, "--", "--test-threads=1"]);
    // Only this run's lines count: the log holds every stage before it.
    let from = fs::metadata(log).map_or(0, |m| m.len() as usize);
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let mut child = cmd.stdout(out.try_clone()?).stderr(out).stdin(Stdio::null()).spawn().context("run cargo test")?;
    let deadline = Instant::now() + STAGE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = fs::read_to_string(log).unwrap_or_default();
    let mut failed: Vec<String> = text
        .get(from..)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... FAILED").map(str::to_owned))
        .collect();
    failed.sort();
    failed.dedup();
    match status {
        None => failed.push(format!("(timed out after {} min)", STAGE_TIMEOUT.as_secs() / 60)),
        Some(s) if !s.success() && failed.is_empty() => failed.push(format!("(cargo test failed: {s})")),
        _ => {}
    }
    Ok(failed)
}

/// Today's date (UTC), for the reports.
fn today() -> Result<String> {
    let out = Command::new("date").args(["-u", "+%Y-%m-%d"]).output().context("run date")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The rows of docs/mutants/kernel.md, as [`write_kernel_report`] wrote them.
fn read_kernel_report() -> Result<Vec<Verdict>> {
    let path = workspace_root().join("docs/mutants/kernel.md");
    let text =
        fs::read_to_string(&path).with_context(|| format!("read {} (run a full `--kernel` first)", path.display()))?;
    Ok(text.lines().filter_map(parse_kernel_row).collect())
}

fn parse_kernel_row(line: &str) -> Option<Verdict> {
    let cells: Vec<&str> = line.strip_prefix("| `")?.strip_suffix(" |")?.split(" | ").collect();
    let [name, planted, by, stage, took] = cells[..] else { return None };
    let took = took.strip_suffix(" s")?.parse::<f64>().ok()?;
    Some(Verdict {
        name: name.strip_suffix('`')?.to_owned(),
        planted: planted.to_owned(),
        caught_by: Vec::new(),
        stage: stage.to_owned(),
        took: Duration::from_secs_f64(took),
        shown: Some(by.to_owned()),
    })
}

fn write_kernel_report(verdicts: &[Verdict]) -> Result<()> {
    let caught = verdicts.iter().filter(|v| v.stage != "missed").count();
    let mut md = String::new();
    writeln!(md, "# Kernel faults (`cargo xtask mutants --kernel`)\n")?;
    writeln!(
        md,
        "Each fault of `shed-ebpf/src/fault.rs` compiled in alone, then the program tests \
         ({}) and, only if they all pass, the end-to-end tests. Generated; re-run whenever the kernel code changes.\n",
        PROGRAM_TESTS.join(", ")
    )?;
    writeln!(md, "**{caught} of {} faults caught** (run of {}).\n", verdicts.len(), today()?)?;
    writeln!(md, "| fault | what it plants | caught by | stage | time |")?;
    writeln!(md, "|---|---|---|---|---|")?;
    for v in verdicts {
        let by = match (&v.shown, v.caught_by.is_empty()) {
            (Some(shown), _) => shown.clone(),
            (None, true) => "**missed**".to_owned(),
            (None, false) => first_few(&v.caught_by),
        };
        writeln!(md, "| `{}` | {} | {} | {} | {:.0} s |", v.name, v.planted, by, v.stage, v.took.as_secs_f64())?;
    }
    write_doc("kernel.md", &md)
}

fn first_few(tests: &[String]) -> String {
    let mut s = tests.iter().take(3).map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ");
    if tests.len() > 3 {
        let _ = write!(s, " and {} more", tests.len() - 3);
    }
    s
}

fn write_doc(name: &str, text: &str) -> Result<()> {
    let dir = workspace_root().join("docs/mutants");
    fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// cargo-mutants over the pure-logic modules (`.cargo/mutants.toml` names them).
/// `again`: test only what the last run did not catch (cargo-mutants `--iterate`).
pub(crate) fn logic(only: &[String], again: bool) -> Result<()> {
    ensure_cargo_mutants()?;
    let out = workspace_root().join("target/mutants/logic");
    fs::create_dir_all(&out)?;
    let mut cmd = cargo_command();
    // In place: the workspace's own target folder (a copy would rebuild everything,
    // the kernel object included); cargo-mutants restores each file after its mutant.
    cmd.args(["mutants", "--in-place", "--no-shuffle", "--timeout-multiplier", "3", "--output"]).arg(&out);
    for file in only {
        cmd.args(["--file", file]);
    }
    if again {
        cmd.arg("--iterate");
    }
    // cargo-mutants exits non-zero when mutants were missed: read its outcome files instead.
    let status = cmd.status().context("run cargo mutants")?;
    let results = out.join("mutants.out");
    let read = |name: &str| -> Vec<String> {
        fs::read_to_string(results.join(name)).unwrap_or_default().lines().map(str::to_owned).collect()
    };
    let (mut caught, missed, timeout, mut unviable) =
        (read("caught.txt"), read("missed.txt"), read("timeout.txt"), read("unviable.txt"));
    // With --iterate, what earlier runs caught or found unviable is listed apart,
    // in one list (`previously_caught.txt`); the unviable ones are kept here, in
    // `all_unviable.txt` beside the output folder cargo-mutants rotates, across
    // runs (the first --again reads the full run's own list). A mutant the code
    // no longer has (its line moved, its code changed) counts for nothing.
    let all_unviable = out.join("all_unviable.txt");
    if again {
        let earlier = fs::read_to_string(&all_unviable)
            .or_else(|_| fs::read_to_string(out.join("mutants.out.old/unviable.txt")))
            .unwrap_or_default();
        unviable.extend(earlier.lines().map(str::to_owned));
        unviable.sort();
        unviable.dedup();
    }
    fs::write(&all_unviable, unviable.iter().map(|m| m.clone() + "\n").collect::<String>())?;
    let current = current_mutants(only)?;
    unviable.retain(|m| current.contains(m));
    let earlier_caught: Vec<String> = read("previously_caught.txt")
        .into_iter()
        .filter(|m| current.contains(m) && !caught.contains(m) && !unviable.contains(m))
        .collect();
    let earlier = earlier_caught.len();
    caught.extend(earlier_caught);
    if caught.is_empty() && missed.is_empty() {
        bail!("cargo mutants found nothing to test ({status}); see {}", results.display());
    }
    let viable = caught.len() + missed.len() + timeout.len();
    let score = 100.0 * (caught.len() + timeout.len()) as f64 / viable as f64;
    if only.is_empty() {
        let mut md = String::new();
        writeln!(md, "# Logic mutants (`cargo xtask mutants`)\n")?;
        writeln!(
            md,
            "cargo-mutants over the pure-logic modules listed in `.cargo/mutants.toml`, against their unit \
             and property tests. Mutants judged equivalent are excluded there, each with its reason. \
             Generated; re-run whenever those modules change.\n"
        )?;
        writeln!(
            md,
            "**{score:.1}% of {viable} viable mutants caught** ({} caught{}, {} timed out (caught), {} missed; {} unviable; run of {}).\n",
            caught.len(),
            if earlier > 0 {
                format!(", {earlier} of them in the run before, this one re-testing the rest")
            } else {
                String::new()
            },
            timeout.len(),
            missed.len(),
            unviable.len(),
            today()?
        )?;
        writeln!(md, "Equivalent mutants, excluded with their reasons: `.cargo/mutants.toml`.\n")?;
        if !missed.is_empty() {
            writeln!(md, "## Missed, each with why it is left\n")?;
            for m in &missed {
                let why = ACCEPTED_MISSES.iter().find(|(part, _)| m.contains(part)).map(|(_, why)| *why);
                writeln!(
                    md,
                    "- `{m}`: {}",
                    why.unwrap_or("**not explained yet: a test to write, or a reason to give here**")
                )?;
            }
        }
        write_doc("logic.md", &md)?;
    }
    println!("{score:.1}% of {viable} viable mutants caught; missed: {missed:#?}");
    if score < MIN_SCORE {
        bail!("under {MIN_SCORE}% of viable mutants caught");
    }
    Ok(())
}

/// Misses the report names with why they are left: cargo-mutants' `exclude_re`
/// does not reach its struct-field deletions, so these are missed, not excluded.
const ACCEPTED_MISSES: &[(&str, &str)] = &[
    (
        "struct BatchAttr expression in lookup_batch",
        "the bpf(2) BPF_MAP_LOOKUP_BATCH call's attribute, which only a kernel reads (the healer's e2e tests read \
         every tracked socket through it); its other mutants are excluded as I/O",
    ),
    (
        "struct shed_common::PortState expression in Healer::pass",
        "the healer's pass over live maps (excluded as I/O; its arithmetic is drift_at_read, mutated and tested)",
    ),
];

/// The share of viable logic mutants a run must catch (the rest named in its report).
const MIN_SCORE: f64 = 95.0;

/// Every mutant cargo-mutants would make of the code as it is now (of `only`, when given).
fn current_mutants(only: &[String]) -> Result<std::collections::HashSet<String>> {
    let mut cmd = cargo_command();
    cmd.args(["mutants", "--list"]);
    for file in only {
        cmd.args(["--file", file]);
    }
    let out = cmd.output().context("cargo mutants --list")?;
    if !out.status.success() {
        bail!("cargo mutants --list failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
}

fn ensure_cargo_mutants() -> Result<()> {
    let have = Command::new("cargo").args(["mutants", "--version"]).output().is_ok_and(|o| o.status.success());
    if !have {
        run(Command::new("cargo").args(["install", "--locked", "cargo-mutants@27.1.0"]))
            .context("install cargo-mutants")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files cargo-mutants examines, from `.cargo/mutants.toml`'s `examine_globs`
    /// (plain paths and `dir/*.rs`), relative to the workspace.
    fn examined(config: &str) -> Vec<String> {
        let globs = config.split("examine_globs = [").nth(1).and_then(|rest| rest.split(']').next()).unwrap_or("");
        let mut files = Vec::new();
        for glob in globs.lines().filter_map(|l| l.trim().strip_prefix('"')?.split('"').next()) {
            match glob.strip_suffix("*.rs") {
                Some(dir) => {
                    for entry in std::fs::read_dir(workspace_root().join(dir)).unwrap() {
                        let name = entry.unwrap().file_name().into_string().unwrap();
                        if std::path::Path::new(&name).extension().is_some_and(|e| e == "rs") {
                            files.push(format!("{dir}{name}"));
                        }
                    }
                }
                None => files.push(glob.to_owned()),
            }
        }
        files
    }

    #[test]
    fn faults_are_read_whether_or_not_rustfmt_wrapped_them() {
        let list = r#"
    ("limit_off_by_one", "a SYN at the limit is admitted"),
    // a comment
    (
        "reservation_unchecked",
        "a reservation is not checked against the limit once taken (two CPUs racing)",
    ),
    ("rst_macs_kept", "the reset keeps the frame's MAC addresses"),
"#;
        let names: Vec<String> = parse_faults(list).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["limit_off_by_one", "reservation_unchecked", "rst_macs_kept"]);
        assert_eq!(
            parse_faults(list)[1].1,
            "a reservation is not checked against the limit once taken (two CPUs racing)"
        );
        // Every fault! site of the kernel crate names a listed fault, and every listed fault has a site.
        let listed: Vec<String> = faults().unwrap().into_iter().map(|(n, _)| n).collect();
        let mut sites = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(workspace_root().join("shed-ebpf/src")).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for site in text.split("fault!(\"").skip(1) {
                sites.insert(site.split('"').next().unwrap().to_owned());
            }
        }
        sites.remove("name"); // the macro's own doc
        let listed_set: std::collections::BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(sites, listed_set, "fault! sites vs shed-ebpf/src/fault.rs");
        assert_eq!(listed.len(), listed_set.len(), "a fault listed twice");
    }

    #[test]
    fn a_kernel_report_row_reads_back_as_written() {
        let row = "| `share_ignored` | a tier's share of the limit is not checked | `kernel_and_model_agree_on_every_frame` | program tests | 5 s |";
        let v = parse_kernel_row(row).expect("a row");
        assert_eq!((v.name.as_str(), v.stage.as_str(), v.took.as_secs()), ("share_ignored", "program tests", 5));
        assert_eq!(v.planted, "a tier's share of the limit is not checked");
        assert_eq!(v.shown.as_deref(), Some("`kernel_and_model_agree_on_every_frame`"));
        assert!(parse_kernel_row("| fault | what it plants | caught by | stage | time |").is_none());
    }

    /// An exclusion anchored by line and column (`file:line:col: replace OP with ...`)
    /// silently stops matching when the file changes, and the mutant it meant comes back
    /// as "missed", or worse, another mutant at that spot is hidden. Each anchor must
    /// still point at its operator in the one examined file it names.
    #[test]
    fn every_anchored_exclusion_points_at_its_operator() {
        let config = std::fs::read_to_string(workspace_root().join(".cargo/mutants.toml")).unwrap();
        let files = examined(&config);
        let mut anchors = 0;
        for line in config.lines().map(str::trim).filter(|l| l.starts_with('"') && l.contains(".rs:")) {
            let pattern = line.trim_matches(|c| c == '"' || c == ',').replace("\\\\", "");
            let (file, rest) = pattern.split_once(':').unwrap();
            let mut parts = rest.splitn(3, ':');
            let (Some(row), Some(col), Some(what)) = (parts.next(), parts.next(), parts.next()) else { continue };
            // Not anchored (`file.rs:.*in Type::fn`): a pattern by name.
            let (Ok(row), Ok(col)) = (row.parse::<usize>(), col.parse::<usize>()) else { continue };
            let operator = what.trim().strip_prefix("replace ").and_then(|w| w.split(" with ").next()).unwrap();
            let matches: Vec<&String> = files.iter().filter(|f| f.ends_with(&format!("/{file}"))).collect();
            assert_eq!(matches.len(), 1, "{file} names one examined file: {matches:?}");
            let source = std::fs::read_to_string(workspace_root().join(matches[0])).unwrap();
            let text = source.lines().nth(row - 1).unwrap_or_else(|| panic!("{pattern}: no line {row}"));
            assert!(
                text.get(col - 1..).is_some_and(|at| at.starts_with(operator)),
                "{pattern}: line {row} column {col} of {} is not `{operator}` but {text:?}: re-anchor it",
                matches[0]
            );
            anchors += 1;
        }
        assert!(anchors >= 5, "found {anchors} anchored exclusions");
    }
}
