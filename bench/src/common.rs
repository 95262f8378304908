// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the benchmarks share: the scale, the gate launcher, the kernel
//! object, the quantiles and an nftables cap to compare against.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use shed::kernel::programs::Loaded;
use shed_testkit::{
    gate::{Gate, Log},
    testbed::Testbed,
};

pub(crate) const PORT: u16 = 8080;

/// How long a benchmark runs: the full report, `--quick` (under 5 minutes in
/// all), or a smoke run in the tests that only checks it still works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scale {
    Full,
    Quick,
    Smoke,
}

impl Scale {
    pub(crate) fn pick<T>(self, full: T, quick: T, smoke: T) -> T {
        match self {
            Self::Full => full,
            Self::Quick => quick,
            Self::Smoke => smoke,
        }
    }
}

/// `shedctl attach` on the testbed's server side (no per-prefix RST cap: one
/// client host makes all the load), waiting until it is ready. Dropping the
/// gate stops it and removes its pins.
pub(crate) fn start_gate(shedctl: &Path, bed: &Testbed, args: &[&str]) -> Result<Gate> {
    let mut all =
        vec!["--port", "8080", "--rst-prefix-rate", "0", "--netns", &bed.server_ns, "--iface", &bed.server_if];
    all.extend_from_slice(args);
    Gate::launch(shedctl, &all, Log::Discard).with_context(|| format!("shedctl attach {args:?}"))
}

/// The kernel object this binary embeds (`cargo xtask bench` builds it first),
/// or, with `SHED_BENCH_OBJECT`, another build's object read from disk, for an
/// A/B in one sitting.
pub(crate) fn load_object() -> Result<Loaded> {
    match std::env::var_os("SHED_BENCH_OBJECT") {
        None => Loaded::new(None).context("load the embedded kernel object (root)"),
        Some(object) => Loaded::from_file(Path::new(&object), None)
            .with_context(|| format!("load SHED_BENCH_OBJECT {}", Path::new(&object).display())),
    }
}

pub(crate) fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// The `p` quantile (0-1) of sorted samples, by rank; `None` when there are none.
/// `p` as a fraction (0.99), by nearest rank: see [`shed::control::window::nearest_rank`].
pub(crate) fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    shed::control::window::nearest_rank(sorted, p * 100.0)
}

/// Attaches one of the object's XDP programs (by `pick`) to `iface` in `ns`; detached on drop.
pub(crate) fn xdp_in(
    ns: &str,
    iface: &str,
    pick: fn(&mut Loaded) -> Result<&mut aya::programs::Xdp, shed::Error>,
) -> Result<Loaded> {
    let iface = iface.to_owned();
    shed_testkit::testbed::run_in(ns, move || -> Result<Loaded> {
        let mut loaded = load_object()?;
        pick(&mut loaded)?.attach(&iface, aya::programs::XdpMode::default())?;
        Ok(loaded)
    })?
}

/// Programs that do nothing at every hook the gate uses, on `iface` in `ns`
/// and on the socket tracepoints ([`Loaded::attach_do_nothing`]): the floor
/// under any gate at those hooks. Detached when dropped.
pub(crate) fn do_nothing_in(ns: &str, iface: &str) -> Result<Loaded> {
    let iface = iface.to_owned();
    shed_testkit::testbed::run_in(ns, move || -> Result<Loaded> {
        let mut loaded = load_object()?;
        loaded.attach_do_nothing(&iface)?;
        Ok(loaded)
    })?
}

pub(crate) fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A static connection cap in nftables: `ct count over CAP reject with tcp reset` on port 8080.
pub(crate) fn nft_cap(ns: &str, cap: u32) -> Result<()> {
    let rules = format!(
        "table inet shedbench {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
         tcp dport 8080 ct state new ct count over {cap} reject with tcp reset\n  }}\n}}\n"
    );
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("run nft (install nftables: apt-get install nftables)")?;
    std::io::Write::write_all(child.stdin.as_mut().expect("piped"), rules.as_bytes())?;
    if !child.wait()?.success() {
        bail!("nft refused the ruleset");
    }
    Ok(())
}
