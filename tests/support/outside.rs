// SPDX-License-Identifier: MIT OR Apache-2.0
//! BPF_PROG_TEST_RUN frames that arrive on a real interface. The test runner
//! otherwise presents every frame as arriving on loopback, where the gate
//! (rightly) answers local sources; attackers' frames come from outside.
use shed_testkit::testbed::{self, Testbed};

/// A testbed whose server namespace the calling thread enters, and the index
/// of its veth there (the test runner looks the interface up in the caller's namespace).
pub(crate) fn enter(name: &str) -> (Testbed, u32) {
    let bed = Testbed::create(name).expect("testbed");
    testbed::enter(&bed.server_ns).expect("enter the namespace");
    let ifname = std::ffi::CString::new(bed.server_if.as_str()).unwrap();
    // SAFETY: valid C string.
    let ifindex = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
    assert!(ifindex > 1, "the veth has an index of its own");
    (bed, ifindex)
}

/// `struct xdp_md` for a frame of `len` bytes arriving on `ifindex`:
/// data, data_end (= len), data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
pub(crate) fn xdp_ctx(ifindex: u32, len: usize) -> Vec<u8> {
    [0, len as u32, 0, ifindex, 0, 0].iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// `struct __sk_buff` (192 bytes) with only `ifindex` (offset 40) set.
pub(crate) fn skb_ctx(ifindex: u32) -> Vec<u8> {
    let mut skb = vec![0u8; 192];
    skb[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    skb
}
