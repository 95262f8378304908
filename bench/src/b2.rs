// SPDX-License-Identifier: MIT OR Apache-2.0
//! B2: rejection cost at the packet level. A raw-socket SYN generator in the
//! client namespace floods the server veth; every SYN is rejected. CPU is
//! read from /proc/stat over the whole flood (generator included, the same
//! in every configuration); the server's share is what a configuration costs
//! above an XDP program that only drops, measured in the same run.
use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use shed::{kernel::maps::GateMaps, kernel::programs::Loaded};
use shed_testkit::testbed::{self, Backend, Service, Testbed};

use crate::common::{PORT, Scale, median_min_max, nft_cap, start_gate, xdp_in};

/// A port nothing listens on: the kernel answers with an RST.
const CLOSED_PORT: u16 = 8081;

/// Busy CPU time of the whole machine so far (every CPU; /proc/stat ticks).
pub(super) fn busy_cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat is empty")?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    if ticks.len() < 8 {
        bail!("unexpected /proc/stat: {line}");
    }
    // user nice system idle iowait irq softirq steal
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(busy * 1_000_000_000 / hz))
}

#[derive(Clone, Copy)]
enum Reject {
    /// The baseline: an XDP program that drops every frame.
    XdpDrop,
    Shed(&'static [&'static str]),
    Nftables,
    KernelClosedPort,
    /// No gate: the kernel answers every SYN with a SYN cookie (`tcp_syncookies=2`).
    KernelCookie,
    /// shed with room on the port (the SYN passes holding nothing), then the kernel's cookie.
    ShedPassCookie,
}

struct Config {
    name: &'static str,
    how: Reject,
}

const CONFIGS: [Config; 10] = [
    Config { name: "XDP drop only (baseline)", how: Reject::XdpDrop },
    Config { name: "shed drop (XDP)", how: Reject::Shed(&["--hook", "xdp", "--action", "drop"]) },
    Config { name: "shed RST (XDP)", how: Reject::Shed(&["--hook", "xdp", "--action", "rst"]) },
    Config { name: "shed RST (TC)", how: Reject::Shed(&["--hook", "tc", "--action", "rst"]) },
    Config { name: "nftables ct count reject with tcp reset", how: Reject::Nftables },
    Config { name: "kernel RST (closed port)", how: Reject::KernelClosedPort },
    Config { name: "kernel SYN cookie (no gate, tcp_syncookies=2)", how: Reject::KernelCookie },
    Config { name: "shed passes (room), then the kernel's SYN cookie", how: Reject::ShedPassCookie },
    // The http action answers a refused SYN with a SYN-ACK carrying its own cookie.
    Config { name: "shed http SYN-ACK (XDP)", how: Reject::Shed(&["--hook", "xdp", "--action", "http"]) },
    Config { name: "shed http SYN-ACK (TC)", how: Reject::Shed(&["--hook", "tc", "--action", "http"]) },
];

/// Index of the kernel's cookie answer and of shed passing before it, in [`CONFIGS`].
const KERNEL_COOKIE: usize = 6;
const SHED_PASS_COOKIE: usize = 7;

fn syncookies(ns: &str, mode: u8) -> Result<()> {
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-qw", &format!("net.ipv4.tcp_syncookies={mode}")])
        .status()?;
    if !status.success() {
        bail!("sysctl net.ipv4.tcp_syncookies={mode} in {ns} failed");
    }
    Ok(())
}

/// One flood: SYNs sent, seconds, busy CPU.
fn flood(bed: &Testbed, port: u16, count: u32) -> Result<(u32, Duration, Duration)> {
    let dst = match bed.server_addr(false, port).ip() {
        std::net::IpAddr::V4(v4) => v4,
        std::net::IpAddr::V6(_) => unreachable!("asked for IPv4"),
    };
    // The client's own address (routable, so every kind of RST can reach it), a new port per SYN.
    let src = Ipv4Addr::new(10, 200, 0, 2);
    let cpu_before = busy_cpu()?;
    let start = Instant::now();
    let sent = testbed::run_in(&bed.client_ns, move || testbed::syn_flood(dst, port, count, |_| src))??;
    // Let the last frames and replies drain before reading the CPU again.
    std::thread::sleep(Duration::from_millis(20));
    let elapsed = start.elapsed();
    Ok((sent, elapsed, busy_cpu()?.saturating_sub(cpu_before)))
}

pub(crate) fn b2(shedctl: &Path, scale: Scale) -> Result<(serde_json::Value, String)> {
    let (count, runs) = scale.pick((400_000, 5), (150_000, 1), (20_000, 1));
    let bed = Testbed::create("shedb2")?;
    // Every configuration has the same listener. The client end drops every
    // frame it receives in XDP (an XDP program there is also what lets veth
    // deliver XDP_TX replies), so the RSTs cost the client the same tiny
    // amount whoever sent them; and neighbours are permanent both ways, since
    // the baselines drop ARP too.
    let _backend = Backend::start(&bed.server_ns, bed.server_addr(false, PORT), Service::Echo)?;
    let _peer = xdp_in(&bed.client_ns, &bed.client_if, Loaded::xdp_drop)?;
    let mac = |ns: &str, dev: &str| -> Result<String> {
        let out = std::process::Command::new("ip").args(["-n", ns, "-o", "link", "show", "dev", dev]).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).map(str::to_owned).context("veth MAC")
    };
    for (ns, dev, ip, peer_mac) in [
        (&bed.client_ns, &bed.client_if, "10.200.0.1", mac(&bed.server_ns, &bed.server_if)?),
        (&bed.server_ns, &bed.server_if, "10.200.0.2", mac(&bed.client_ns, &bed.client_if)?),
    ] {
        let status = std::process::Command::new("ip")
            .args(["-n", ns, "neigh", "replace", ip, "lladdr", &peer_mac, "nud", "permanent", "dev", dev])
            .status()?;
        if !status.success() {
            bail!("ip neigh replace {ip} in {ns} failed");
        }
    }
    // CPU ns per SYN, per configuration, per run.
    let mut per_syn: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    let mut rejected_fraction: Vec<Option<f64>> = vec![None; CONFIGS.len()];
    for r in 0..runs {
        for (i, config) in CONFIGS.iter().enumerate() {
            let mut port = PORT;
            let mut gate = None;
            let mut drop_prog = None;
            let mut held = None;
            let server = bed.server_addr(false, PORT);
            match config.how {
                Reject::XdpDrop => drop_prog = Some(xdp_in(&bed.server_ns, &bed.server_if, Loaded::xdp_drop)?),
                Reject::Shed(args) => {
                    // Limit 1, held by one real connection (made over the server's own loopback:
                    // the client end drops every frame): every SYN of the flood is refused.
                    let base = ["--limit", "1", "--rst-rate", "0", "--count", "connections"];
                    gate = Some(start_gate(shedctl, &bed, &[&base[..], args].concat())?);
                    held = Some(testbed::run_in(&bed.server_ns, move || {
                        testbed::connect(server, Duration::from_secs(1))
                    })??);
                }
                Reject::Nftables => nft_cap(&bed.server_ns, 0)?,
                Reject::KernelClosedPort => port = CLOSED_PORT,
                Reject::KernelCookie => syncookies(&bed.server_ns, 2)?,
                Reject::ShedPassCookie => {
                    syncookies(&bed.server_ns, 2)?;
                    gate = Some(start_gate(shedctl, &bed, &["--limit", "1000", "--hook", "xdp"])?);
                }
            }
            let (sent, elapsed, cpu) = flood(&bed, port, count)?;
            if gate.is_some() {
                let maps = GateMaps::open_pinned()?;
                let s = maps.snapshot(PORT, maps.config(PORT)?)?;
                let rejected = s.counter(shed_common::counter::REJECTED_LIMIT);
                rejected_fraction[i] = Some(rejected as f64 / f64::from(sent.max(1)));
            }
            drop(held);
            if let Some(g) = gate {
                drop(g);
            }
            if matches!(config.how, Reject::KernelCookie | Reject::ShedPassCookie) {
                syncookies(&bed.server_ns, 1)?;
            }
            drop(drop_prog);
            if matches!(config.how, Reject::Nftables) {
                std::process::Command::new("ip")
                    .args(["netns", "exec", &bed.server_ns, "nft", "flush", "ruleset"])
                    .status()?;
            }
            let ns = cpu.as_nanos() as f64 / f64::from(sent.max(1));
            println!(
                "B2 run {r} {:<42} {sent} SYNs in {:.2} s ({:.0}/s), {ns:.0} ns CPU per SYN",
                config.name,
                elapsed.as_secs_f64(),
                f64::from(sent) / elapsed.as_secs_f64()
            );
            per_syn[i].push(ns);
        }
    }
    let medians: Vec<(f64, f64, f64)> = per_syn.iter().map(|v| median_min_max(v.clone())).collect();
    let baseline = medians[0].0;
    let server = |i: usize| (medians[i].0 - baseline).max(1.0);
    let shed_rst = server(2);
    let mut md = String::new();
    let _ = writeln!(md, "\n## B2: rejection cost per SYN\n");
    let _ = writeln!(
        md,
        "A raw-socket generator in the client namespace sends {count} SYNs (the client's address, a new source port each) to the server veth; every one is rejected. CPU is the whole machine's busy time over the flood (/proc/stat), per SYN; the generator is the same in every configuration and the client end drops every reply in XDP, so the server's cost is the configuration's CPU above an XDP program that only drops, measured in the same run. Rejections per second per core = 1 s / server CPU per SYN. Median of {runs} runs (min-max). shed runs with limit 1 and no RST caps; nftables with `ct state new ct count over 0 reject with tcp reset`.\n"
    );
    let _ = writeln!(
        md,
        "| configuration | CPU ns per SYN (all) | server ns per SYN | rejections/s per core | shed RST (XDP) is ... x cheaper |\n|---|---|---|---|---|"
    );
    let mut json = Vec::new();
    for (i, config) in CONFIGS.iter().enumerate() {
        let (m, lo, hi) = medians[i];
        let (srv, per_core, ratio) = if i == 0 {
            ("-".to_owned(), "-".to_owned(), "-".to_owned())
        } else {
            (format!("{:.0}", server(i)), format!("{:.2} M", 1e3 / server(i)), format!("{:.1}", server(i) / shed_rst))
        };
        let _ = writeln!(md, "| {} | {m:.0} ({lo:.0}-{hi:.0}) | {srv} | {per_core} | {ratio} |", config.name);
        json.push(serde_json::json!({
            "config": config.name,
            "cpu_ns_per_syn": m, "cpu_ns_min": lo, "cpu_ns_max": hi,
            "server_ns_per_syn": if i == 0 { None } else { Some(server(i)) },
            "rejections_per_sec_per_core": if i == 0 { None } else { Some(1e9 / server(i)) },
            "shed_rejected_fraction": rejected_fraction[i],
        }));
    }
    let vs_nft = server(4) / shed_rst;
    let vs_kernel = server(5) / shed_rst;
    let _ = writeln!(
        md,
        "\nshed RST (XDP) per core: {vs_nft:.1}x nftables reject (goal 4x: {}), {vs_kernel:.1}x kernel RST (goal 6x: {}).",
        if vs_nft >= 4.0 { "met" } else { "missed" },
        if vs_kernel >= 6.0 { "met" } else { "missed" }
    );
    // What a forged SYN costs the server when the port has room: shed's pass on top of the
    // kernel's own cookie answer, against that answer alone.
    let cookie = server(KERNEL_COOKIE);
    let shed_pass = (medians[SHED_PASS_COOKIE].0 - medians[KERNEL_COOKIE].0).max(0.0);
    let pass_share = shed_pass / cookie;
    let _ = writeln!(
        md,
        "\nA forged SYN on a port with room: the kernel's SYN cookie costs the server {cookie:.0} ns; shed adds {shed_pass:.0} ns before passing it ({:.0}% of the cookie; goal at most 50%: {}).",
        pass_share * 100.0,
        if pass_share <= 0.5 { "met" } else { "missed" }
    );
    Ok((
        serde_json::json!({"benchmark": "B2 rejection cost", "syns_per_run": count, "runs": runs, "configs": json, "shed_rst_vs_nftables": vs_nft, "shed_rst_vs_kernel_rst": vs_kernel, "kernel_cookie_ns": cookie, "shed_pass_ns": shed_pass, "shed_pass_vs_kernel_cookie": pass_share}),
        md,
    ))
}
