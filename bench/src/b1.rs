// SPDX-License-Identifier: MIT OR Apache-2.0
//! B1: what the gate's decision costs per packet, timed by the kernel
//! (BPF_PROG_TEST_RUN) against an empty program on the same frames.
use std::fmt::Write as _;

use anyhow::Result;
use aya::{TestRun as _, TestRunOptions};
use shed::{kernel::maps::PortSpec, kernel::programs::Loaded};
use shed_common::{ControlConfig, action, count_mode};

use crate::common::{PORT, Scale, load_object, median_min_max};

/// A B1 frame: TCP (or `proto`) with 20 bytes of options, from 192.0.2.2 or 2001:db8::2.
fn frame(v6: bool, proto: u8, flags: u8, dport: u16, client_port: u16) -> Vec<u8> {
    use shed_testkit::frames::{Spec, frame};
    frame(&Spec { v6, protocol: proto, flags, server_port: dport, client_port, ..Spec::default() })
}

struct Case {
    name: &'static str,
    v6: bool,
    proto: u8,
    flags: u8,
    dport: u16,
    /// Limit for the run: 0 rejects every SYN.
    limit: u32,
    act: u8,
}

impl Case {
    /// An IPv4 packet the gate passes, whatever the limit.
    const fn passing(name: &'static str, proto: u8, flags: u8, dport: u16) -> Self {
        Self { name, v6: false, proto, flags, dport, limit: 100_000, act: action::DROP }
    }

    /// A SYN to the protected port; with room under `limit` it is admitted (a
    /// repeat of the same SYN is admitted again: no per-flow state).
    const fn syn(name: &'static str, v6: bool, limit: u32, act: u8) -> Self {
        Self { name, v6, proto: 6, flags: 0x02, dport: PORT, limit, act }
    }

    /// Whether the kernel can repeat the run on one frame: the verdict leaves it as it
    /// was (a RST rewrites the frame).
    const fn repeatable(&self) -> bool {
        self.act != action::RST
    }
}

/// Mean ns per packet of `data`, as the kernel times it: one run repeated
/// `n` times in the kernel where the verdict leaves the frame as it was
/// (`repeatable`), else `n` single runs (a reply rewrites the frame), each
/// after `before_each` (untimed).
fn timed_ns(
    loaded: &mut Loaded,
    pass_only: bool,
    data: &[u8],
    n: u32,
    repeatable: bool,
    mut before_each: impl FnMut(&mut Loaded) -> Result<()>,
) -> Result<f64> {
    fn run(loaded: &mut Loaded, pass_only: bool, opts: TestRunOptions<'_>) -> Result<aya::programs::TestRunResult> {
        Ok(if pass_only { loaded.xdp_pass()?.test_run(opts)? } else { loaded.xdp()?.test_run(opts)? })
    }
    if repeatable {
        let opts = TestRunOptions { data_in: Some(data), repeat: n, ..Default::default() };
        return Ok(run(loaded, pass_only, opts)?.duration.as_nanos() as f64);
    }
    let mut total = 0u128;
    let mut out = vec![0u8; data.len() + 64];
    for _ in 0..n {
        before_each(loaded)?;
        let opts = TestRunOptions { data_in: Some(data), data_out: Some(&mut out), ..Default::default() };
        total += run(loaded, pass_only, opts)?.duration.as_nanos();
    }
    Ok(total as f64 / f64::from(n))
}

/// `case`'s frame through [`timed_ns`].
fn per_packet_ns(loaded: &mut Loaded, pass_only: bool, case: &Case, n: u32) -> Result<f64> {
    let data = frame(case.v6, case.proto, case.flags, case.dport, 40_000);
    timed_ns(loaded, pass_only, &data, n, case.repeatable(), |_| Ok(()))
}

/// One B1 row from its samples (gate and empty program, ns, pairwise): the
/// table row, the JSON point and the progress line.
fn report_row(name: &str, samples: &[(f64, f64)], rows: &mut Vec<String>, json: &mut Vec<serde_json::Value>) {
    let (g, gmin, gmax) = median_min_max(samples.iter().map(|s| s.0).collect());
    let (e, _, _) = median_min_max(samples.iter().map(|s| s.1).collect());
    let (x, xmin, xmax) = median_min_max(samples.iter().map(|s| s.0 - s.1).collect());
    rows.push(format!(
        "| {name} | {g:.1} ({gmin:.1}-{gmax:.1}) | {e:.1} | {x:+.1} ({xmin:+.1} to {xmax:+.1}) | {:.2}x |",
        g / e
    ));
    json.push(serde_json::json!({"case": name, "gate_ns": g, "gate_min_ns": gmin, "gate_max_ns": gmax, "empty_ns": e, "extra_ns": x, "extra_min_ns": xmin, "extra_max_ns": xmax, "ratio": g / e}));
    println!("B1 {name:<28} gate {g:7.1} ns  empty {e:7.1} ns  extra {x:+6.1} ns");
}

/// B1: decision cost per packet, against an empty XDP_PASS program in the same run.
/// Returns the JSON result and the report section.
pub(crate) fn b1(scale: Scale) -> Result<(serde_json::Value, String)> {
    let cases = [
        Case::passing("non-TCP (UDP)", 17, 0x02, PORT),
        Case::passing("ACK to the protected port (socket lookup)", 6, 0x10, PORT),
        Case::passing("SYN, unprotected port", 6, 0x02, 9999),
        Case::syn("SYN passed, room (IPv4)", false, 1_000_000, action::DROP),
        Case::syn("SYN passed, room (IPv6)", true, 1_000_000, action::DROP),
        Case::syn("SYN rejected, drop (IPv4)", false, 0, action::DROP),
        Case::syn("SYN rejected, drop (IPv6)", true, 0, action::DROP),
        Case::syn("SYN rejected, RST (IPv4)", false, 0, action::RST),
        Case::syn("SYN rejected, RST (IPv6)", true, 0, action::RST),
    ];
    let (runs, n) = scale.pick((7, 60_000), (3, 5_000), (1, 500));
    let repeat = scale.pick(1_000_000, 100_000, 10_000);
    let mut loaded = load_object()?;
    let spec = PortSpec {
        rst_per_sec: 0,
        rst_per_prefix_per_sec: 0,
        ..PortSpec::new(1, action::DROP, false, count_mode::CONNECTIONS, ControlConfig::default())
    };
    let slot = loaded.maps.protect(PORT, &spec)?.slot;
    // The frames' destinations are this host's: their SYNs are judged.
    let local =
        [shed_common::ipv4_mapped([192, 0, 2, 1]), std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).octets()]
            .map(|a| (a, shed_common::local_addr::UNICAST));
    loaded.maps.set_local_addrs(&local.into_iter().collect())?;
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for case in &cases {
        let mut config = loaded.maps.config(PORT)?;
        config.action = case.act;
        loaded.maps.write_config(PORT, config)?;
        loaded.maps.set_limit(slot, case.limit)?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            loaded.maps.clear_handshakes();
            let count = if case.repeatable() { repeat } else { n };
            let e = per_packet_ns(&mut loaded, true, case, count)?;
            let g = per_packet_ns(&mut loaded, false, case, count)?;
            samples.push((g, e));
        }
        report_row(case.name, &samples, &mut rows, &mut json);
    }
    for (name, refused) in [
        ("request on an idle kept-alive connection, admitted", false),
        ("request on an idle kept-alive connection, refused (RST)", true),
    ] {
        let mut turns = Turns::open(refused)?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            let e = turns.per_packet_ns(true, if refused { n } else { repeat })?;
            let g = turns.per_packet_ns(false, if refused { n } else { repeat })?;
            samples.push((g, e));
        }
        let judged = turns.judged()?;
        anyhow::ensure!(judged > 0, "B1 {name}: the gate judged none of the requests (is the connection idle?)");
        report_row(name, &samples, &mut rows, &mut json);
    }
    let result = serde_json::json!({
        "benchmark": "B1 decision cost",
        "method": format!("BPF_PROG_TEST_RUN of shed_xdp vs the empty shed_xdp_pass, {runs} samples; each the kernel's ns per packet over {repeat} in-kernel repeats, or over {n} single runs where the frame cannot be repeated (RSTs)"),
        "cases": json,
    });
    let mut md = String::new();
    let _ = writeln!(md, "## B1: decision cost per packet (XDP, BPF_PROG_TEST_RUN)\n");
    let _ = writeln!(
        md,
        "Median of {runs} samples (min-max). A sample is the kernel's mean ns per packet over {repeat} in-kernel repeats, or, where a frame cannot be repeated (a RST rewrites the frame), over {n} single runs, which carry the test runner's own timing overhead for both programs alike. \"extra\" is the gate minus an empty XDP_PASS program in the same sample.\n"
    );
    let _ = writeln!(md, "| case | gate ns | empty ns | extra ns | ratio |\n|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    Ok((result, md))
}

/// The port B1's kept-alive connection is made to (on loopback).
const KEPT_PORT: u16 = 18_474;

/// A gate of its own (its accounting programs attached, so that its books
/// know the connection) over one real kept-alive loopback connection that
/// owes no answer: the segment that starts its next request is a turn.
/// Refused: the port's limit is 0 and its action `rst`; each timed run is a
/// fresh refusal (the record of the last is cleared between runs, untimed).
struct Turns {
    loaded: Loaded,
    kept: shed_testkit::kept::IdleKeptAlive,
    refused: bool,
    _listener: std::net::TcpListener,
}

impl Turns {
    fn open(refused: bool) -> Result<Self> {
        let mut loaded = load_object()?;
        let (limit, act) = if refused { (0, action::RST) } else { (1_000_000, action::DROP) };
        let spec = PortSpec {
            rst_per_sec: 0,
            rst_per_prefix_per_sec: 0,
            ..PortSpec::new(limit, act, false, count_mode::WORK, ControlConfig::default())
        };
        loaded.maps.protect(KEPT_PORT, &spec)?;
        loaded.attach_accounting()?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", KEPT_PORT))?;
        let kept = shed_testkit::kept::IdleKeptAlive::open(&listener, std::net::TcpStream::connect)?;
        anyhow::ensure!(
            shed_testkit::kept::wait_idle(&loaded.maps, KEPT_PORT, 1),
            "B1: the kept-alive connection is not idle in the gate's books"
        );
        Ok(Self { loaded, kept, refused, _listener: listener })
    }

    /// Mean ns per request segment: `n` in-kernel repeats (admitted: the frame
    /// is left as it was), or `n` single runs (refused: a reset rewrites it).
    fn per_packet_ns(&mut self, pass_only: bool, n: u32) -> Result<f64> {
        // A fresh refusal each run: the record of the last one is forgotten first.
        let forget = |loaded: &mut Loaded| -> Result<()> {
            for sk in loaded.maps.raw().refused_turns.keys().filter_map(Result::ok).collect::<Vec<_>>() {
                loaded.maps.raw_mut().refused_turns.remove(&sk)?;
            }
            Ok(())
        };
        timed_ns(&mut self.loaded, pass_only, &self.kept.frame, n, !self.refused, forget)
    }

    /// Requests the gate judged (admitted or refused afresh): the rows time the turn, not a pass.
    fn judged(&self) -> Result<u64> {
        let config = self.loaded.maps.config(KEPT_PORT)?;
        let c = self.loaded.maps.snapshot(KEPT_PORT, config)?.counters.values;
        Ok(c[shed_common::counter::REQUEST_ADMITTED] + c[shed_common::counter::REFUSED_REQUEST])
    }
}
