// SPDX-License-Identifier: MIT OR Apache-2.0
//! A pod's gate under the node agent's shared object, built as the agent
//! builds one (`daemon/gate.rs`): the pod's maps alone
//! (`Loaded::maps_only`), its port protected, its addresses local, its
//! namespace handed to the dispatcher, the shared TC program attached to its
//! interfaces.
use std::{net::Ipv4Addr, os::unix::fs::MetadataExt as _, sync::Arc};

use shed::kernel::{
    dispatch::Dispatcher,
    maps::PortSpec,
    object::LoadOptions,
    programs::{Loaded, SharedJudge as _},
};
use shed_testkit::testbed;

/// Namespace `ns` gated under `dispatcher`: `connections` in the pod's
/// table, `port` protected as `spec` says, `addrs` local, `ifaces` attached.
pub(crate) fn gate_under_shared(
    dispatcher: &Arc<Dispatcher>,
    ns: &str,
    ifaces: &[&str],
    addrs: &[Ipv4Addr],
    connections: u32,
    port: u16,
    spec: PortSpec,
) -> Loaded {
    let dispatcher = dispatcher.clone();
    let ifaces: Vec<String> = ifaces.iter().map(ToString::to_string).collect();
    let local = addrs
        .iter()
        .map(|addr| {
            let mut mapped = [0u8; 16];
            mapped[10..12].copy_from_slice(&[0xff, 0xff]);
            mapped[12..].copy_from_slice(&addr.octets());
            (mapped, shed_common::local_addr::UNICAST)
        })
        .collect();
    testbed::run_in(ns, move || {
        let mut loaded = Loaded::maps_only(None, LoadOptions::pod(connections, 256, false)).expect("the pod's maps");
        loaded.maps.protect(port, &spec).expect("protect the port");
        loaded.maps.set_local_addrs(&local).expect("addresses");
        let inum = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino() as u32;
        loaded.dispatched = Some(Box::new(dispatcher.add(&mut loaded, inum).expect("hand the namespace over")));
        let ifaces: Vec<&str> = ifaces.iter().map(String::as_str).collect();
        loaded.shared_links.extend(dispatcher.attach_tc(&ifaces).expect("attach the shared TC program"));
        loaded
    })
    .expect("namespace")
}
