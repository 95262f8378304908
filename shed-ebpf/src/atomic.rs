// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! 64-bit atomics on map values. The BPF target has no `AtomicU64` methods
//! (no compare-and-swap in its target description), so the intrinsics are
//! called directly; they lower to `BPF_ATOMIC` instructions (kernel >= 5.12).
use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd};

/// Adds `delta` (two's complement for subtraction) and returns the previous value.
#[inline(always)]
pub fn add(field: *mut u64, delta: u64) -> u64 {
    // SeqCst, not Relaxed: LLVM 22's BPF backend lowers a Relaxed add whose result
    // is used to the non-fetching `lock +=` and hands back the operand instead of
    // the old value (seen in the disassembly; tests/prog_test_run.rs catches it).
    // SAFETY: `field` points into a map value, valid and 8-byte aligned for the program's run.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(field, delta) }
}

/// Stores `new` if the field still holds `old`; whether it did (`BPF_CMPXCHG`).
#[inline(always)]
pub fn compare_exchange(field: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: as for `add`.
    unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(field, old, new) }.1
}

/// Reads a field other CPUs update, without the compiler caching it.
#[inline(always)]
pub fn load(field: *const u64) -> u64 {
    // SAFETY: as for `add`.
    unsafe { core::ptr::read_volatile(field) }
}
