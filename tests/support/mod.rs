// SPDX-License-Identifier: MIT OR Apache-2.0
//! Shared helpers of the integration tests: the test kit's, and what only
//! these tests need.
#![allow(dead_code, reason = "each test binary uses a different part")]

pub(crate) mod handshake;
pub(crate) mod outside;
pub(crate) mod shared;
#[allow(unused_imports, reason = "each test binary uses a different part")]
pub(crate) use shed_testkit::{frames, gate, kept, metrics};

/// Keeps the calling thread on one CPU (per-CPU counters, races between CPUs).
pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set), 0);
    }
}
