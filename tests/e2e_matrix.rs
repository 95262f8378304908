// SPDX-License-Identifier: MIT OR Apache-2.0
//! The verifier and attach matrix: the programs load and gate under XDP
//! (native and generic) and TC, on veth and on loopback, for IPv4 and IPv6.
//! Needs root.
mod support;

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use aya::programs::XdpMode;
use shed::kernel::programs::Loaded;
use shed_testkit::testbed::{self, Backend, Service, Testbed};
use support::gate::{Gate, exclusive, field, wait_for_stats};

const PORT: u16 = 8080;

/// Limit 1, rst: one client holds the slot, the next is refused at once.
fn refuses_over_limit(bed: &Testbed, client_ns: &str, addr: SocketAddr, what: &str) {
    let first = testbed::run_in(client_ns, move || testbed::connect(addr, Duration::from_secs(1))).unwrap();
    let _held = first.unwrap_or_else(|e| panic!("{what}: first client: {e}"));
    wait_for_stats(PORT, Duration::from_secs(3), "one in flight", |s| field(s, "in_flight") == 1);
    let second = testbed::run_in(client_ns, move || testbed::connect(addr, Duration::from_secs(1))).unwrap();
    let e = second.expect_err(&format!("{what}: over the limit"));
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{what}: {e}");
    let _ = bed;
}

fn veth_case(name: &str, hook: &str, xdp_mode: &str) {
    for v6 in [false, true] {
        let _one = exclusive();
        let bed = Testbed::create(name).expect("testbed");
        // A peer XDP program so native XDP_TX frames are delivered (harmless otherwise).
        let iface = bed.client_if.clone();
        let _peer = testbed::run_in(&bed.client_ns, move || {
            let mut loaded = Loaded::new(None).expect("load object");
            loaded.xdp_pass().unwrap().attach(&iface, XdpMode::default()).expect("peer XDP");
            loaded
        })
        .unwrap();
        let addr = bed.server_addr(v6, PORT);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let gate = Gate::start(
            &bed,
            &[
                "--port",
                "8080",
                "--limit",
                "1",
                "--action",
                "rst",
                "--count",
                "connections",
                "--hook",
                hook,
                "--xdp-mode",
                xdp_mode,
            ],
        );
        refuses_over_limit(&bed, &bed.client_ns, addr, &format!("veth {hook} {xdp_mode} v6={v6}"));
        // Native XDP RSTs on a veth need the peer's XDP (as here): the operator is warned.
        let warned = gate.log().contains("reach the other end only if it runs an XDP program");
        assert_eq!(warned, hook == "xdp" && xdp_mode == "native", "{hook} {xdp_mode}:\n{}", gate.log());
    }
}

fn loopback_case(name: &str, hook: &str, xdp_mode: &str) {
    for v6 in [false, true] {
        let _one = exclusive();
        let bed = Testbed::create(name).expect("testbed");
        let ip = if v6 { IpAddr::V6(Ipv6Addr::LOCALHOST) } else { IpAddr::V4(Ipv4Addr::LOCALHOST) };
        let addr = SocketAddr::new(ip, PORT);
        let _backend = Backend::start(&bed.server_ns, addr, Service::Echo).expect("backend");
        let _gate = Gate::start_on(
            &bed,
            "lo",
            &[
                "--port",
                "8080",
                "--limit",
                "1",
                "--action",
                "rst",
                "--count",
                "connections",
                "--hook",
                hook,
                "--xdp-mode",
                xdp_mode,
            ],
        );
        refuses_over_limit(&bed, &bed.server_ns, addr, &format!("loopback {hook} {xdp_mode} v6={v6}"));
    }
}

#[test]
fn veth_xdp_native() {
    veth_case("shedm1", "xdp", "native");
}

#[test]
fn veth_xdp_generic() {
    veth_case("shedm2", "xdp", "generic");
}

#[test]
fn veth_tc() {
    veth_case("shedm3", "tc", "auto");
}

#[test]
fn loopback_tc() {
    loopback_case("shedm4", "tc", "auto");
}

#[test]
fn loopback_xdp_generic() {
    loopback_case("shedm5", "xdp", "generic");
}
