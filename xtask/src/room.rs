// SPDX-License-Identifier: MIT OR Apache-2.0
//! Room on disk for a test run, checked before it builds anything. A fresh
//! clone's run builds about 7 GiB into `target/` (the test binaries with
//! debug information, the kernel objects, the benchmarks' smoke builds); a
//! disk that fills meanwhile surfaces as a compiler's I/O error deep in a
//! build, long after the cause. Said first instead, with the numbers and
//! the fix.
use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// The least a run from a fresh clone needs: below it, the build is sure to
/// fill the disk (fresh clones' runs left 6.3-6.9 GiB in `target/`).
const FRESH_RUN_BYTES: u64 = 6 << 30;
/// The least a run needs over an earlier build (changed crates, new test binaries).
const AGAIN_RUN_BYTES: u64 = 1 << 30;

/// Fails, saying how much room there is and what to do, when the filesystem
/// of `target` (the workspace's `target/` directory) has too little free for
/// a test run.
pub(crate) fn check(target: &Path) -> Result<()> {
    let built_before = built_before(target);
    let at = if target.exists() { target } else { target.parent().unwrap_or(target) };
    let free = free_bytes(at).with_context(|| format!("reading the free space where {} is", at.display()))?;
    if let Some(problem) = shortfall(free, built_before) {
        bail!(
            "{problem} on the filesystem of {}: free some (old clones' target/ directories, `cargo clean` in other checkouts) and run it again",
            at.display()
        );
    }
    Ok(())
}

/// Whether a run built into `target` before: xtask itself is built by now,
/// so only the shedctl a run builds says so.
fn built_before(target: &Path) -> bool {
    target.join("debug/shedctl").exists()
}

/// What is missing, if `free` bytes are too few for a run (`built_before`: over an earlier build).
fn shortfall(free: u64, built_before: bool) -> Option<String> {
    let (need, run) = if built_before {
        (AGAIN_RUN_BYTES, "a run over an earlier build")
    } else {
        (FRESH_RUN_BYTES, "a run from a fresh clone")
    };
    (free < need).then(|| {
        // Tenths of a GiB, rounded down: a byte short must not read as enough.
        let tenths = |b: u64| (b * 10) >> 30;
        let (have, must) = (tenths(free), tenths(need));
        format!("only {}.{} GiB free, and {run} needs at least {}.{} GiB", have / 10, have % 10, must / 10, must % 10)
    })
}

fn free_bytes(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).context("a path with a NUL byte")?;
    // SAFETY: an all-zero statvfs is a valid output buffer; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; statvfs only writes the buffer.
    if unsafe { libc::statvfs(c_path.as_ptr(), &raw mut stat) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(stat.f_bavail * stat.f_frsize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_refused_one_byte_short_of_its_room_and_not_at_it() {
        assert_eq!(shortfall(FRESH_RUN_BYTES, false), None);
        assert_eq!(
            shortfall(FRESH_RUN_BYTES - 1, false).as_deref(),
            Some("only 5.9 GiB free, and a run from a fresh clone needs at least 6.0 GiB")
        );
        assert_eq!(shortfall(AGAIN_RUN_BYTES, true), None);
        assert_eq!(
            shortfall(AGAIN_RUN_BYTES - 1, true).as_deref(),
            Some("only 0.9 GiB free, and a run over an earlier build needs at least 1.0 GiB")
        );
        // An earlier build lowers the need: the room a fresh clone lacks is enough over one.
        assert_eq!(shortfall(2 << 30, true), None);
        assert!(shortfall(2 << 30, false).is_some());
    }

    #[test]
    fn an_earlier_build_is_told_by_its_shedctl_not_by_a_target_directory() {
        let target = tempfile::tempdir().unwrap();
        // xtask's own build makes target/ and target/debug before the check runs.
        std::fs::create_dir_all(target.path().join("debug/build")).unwrap();
        std::fs::write(target.path().join("debug/xtask"), b"").unwrap();
        assert!(!built_before(target.path()));
        std::fs::write(target.path().join("debug/shedctl"), b"").unwrap();
        assert!(built_before(target.path()));
    }
}
