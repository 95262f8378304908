// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! Epoch rings ([`shed_common::handshake`]): counts that lapse by themselves.
//! A port keeps two: handshakes admitted and not yet established, and `work`
//! connections accepted that have sent nothing yet (the silent ring).
use shed_common::{
    HandshakeCell, HandshakeRing,
    handshake::{LIVE_EPOCHS, cell_of, live},
};

use crate::atomic;

/// Adds one to `epoch`'s cell (reusing the cell of an ended epoch); the cell
/// and the count open in it with this one, judged with the value the
/// fetch-add returned (so racing CPUs each see their own place).
#[inline(always)]
pub fn open(ring: *mut HandshakeRing, epoch: u64) -> Option<(*mut HandshakeCell, u64)> {
    // SAFETY: map value; `cell_of` is < RING.
    let ring = unsafe { &mut *ring };
    let cell = ring.cells.get_mut(cell_of(epoch))?;
    if atomic::load(&cell.epoch) != epoch {
        start_epoch(cell, &mut ring.lapsed, epoch);
    }
    let before = atomic::add(&raw mut cell.admitted, 1);
    Some((cell, (before + 1).saturating_sub(atomic::load(&cell.completed))))
}

/// Takes back an [`open`] that was refused.
#[inline(always)]
pub fn undo(cell: *mut HandshakeCell) {
    // SAFETY: the cell [`open`] returned, in a map value valid for this run.
    atomic::add(unsafe { &raw mut (*cell).admitted }, u64::MAX);
}

/// Takes back an [`open`] of `epoch` refused after the fact (by a later
/// check), if its cell still holds that epoch (the same program run: it does).
#[inline(always)]
pub fn undo_at(ring: *mut HandshakeRing, epoch: u64) {
    // SAFETY: map value; `cell_of` is < RING.
    if let Some(cell) = unsafe { (*ring).cells.get_mut(cell_of(epoch)) }
        && atomic::load(&cell.epoch) == epoch
    {
        undo(cell);
    }
}

/// Releases one opened at `epoch`, if its cell still holds that epoch and it
/// is live at `now_epoch`, short of its last live epoch; false if not
/// (nothing released: it lapses with its epoch). Not in the last one: the
/// cell is reused the epoch after, and a release racing that reset could land
/// in the new epoch's count (its places would read one too low, past the limit).
#[inline(always)]
pub fn close(ring: *mut HandshakeRing, epoch: u64, now_epoch: u64) -> bool {
    // SAFETY: map value; `cell_of` is < RING.
    let Some(cell) = (unsafe { (*ring).cells.get_mut(cell_of(epoch)) }) else { return false };
    if !live(epoch, now_epoch) || now_epoch - epoch >= LIVE_EPOCHS - 1 || atomic::load(&cell.epoch) != epoch {
        return false;
    }
    atomic::add(&raw mut cell.completed, 1);
    true
}

/// Reuses a cell of an ended epoch for `epoch`. One CPU wins the epoch swap
/// and subtracts what the old epoch held (its adders are gone: nobody adds to
/// a dead epoch), so adds racing the reset are not lost. Completions first:
/// a CPU that opens the cell between the swap and the last subtraction then
/// finds its place too high (refused, at worst), never too low (an old
/// epoch's completions subtracted from this one's admissions would give
/// every CPU that opens the cell meanwhile place 0: with three CPUs or more,
/// past the limit).
#[inline(always)]
fn start_epoch(cell: &mut HandshakeCell, lapsed: &mut u64, epoch: u64) {
    let old = atomic::load(&cell.epoch);
    let admitted = atomic::load(&cell.admitted);
    let completed = atomic::load(&cell.completed);
    if old == epoch || !atomic::compare_exchange(&raw mut cell.epoch, old, epoch) {
        return;
    }
    atomic::add(&raw mut cell.completed, completed.wrapping_neg());
    atomic::add(&raw mut cell.admitted, admitted.wrapping_neg());
    if admitted > completed {
        atomic::add(lapsed, admitted - completed);
    }
}

/// Opened and not yet closed in the live epochs at `now_epoch`: (in the
/// other live cells, in the current one).
/// A subprogram: its branches per cell, inlined, multiply the paths the
/// verifier walks through the rest of the decision.
#[inline(never)]
pub fn outstanding(ring: *const HandshakeRing, now_epoch: u64) -> (u64, u64) {
    // SAFETY: map value; cells are read field by field while other CPUs add to them.
    let ring = unsafe { &*ring };
    let h = ring.split(now_epoch, |field| atomic::load(field));
    (h.others, h.current)
}
