// SPDX-License-Identifier: MIT OR GPL-2.0-only
//! A port's clients: their established connections (`SHED_CLIENTS`, counted
//! by the socket tracepoint), their admissions still under way
//! (`SHED_PENDING_CLIENTS`, charged at the ACK), and the port's largest
//! client (`SHED_CONTENTION`), which the client cap and share judge.
use shed_common::{ClientKey, HandshakeRing, PortConfig, counter};

use crate::{
    atomic,
    fault::fault,
    maps::{SHED_EMPTY_RING, gate},
    parse::Segment,
    ring,
};

/// Whether a client already holds its cap of established connections (read only:
/// the tracepoint counts connections when the kernel confirms them).
#[inline(never)]
pub(crate) fn over_client_cap(config: &PortConfig, client: &[u8; 16]) -> bool {
    if config.client_cap == 0 {
        return false;
    }
    client_held(config, client) >= u64::from(config.client_cap) + u64::from(fault!("client_cap_off_by_one"))
}

/// The established connections `client` holds on the port (0 when it holds
/// none, or clients are not counted).
#[inline(always)]
pub(crate) fn client_held(config: &PortConfig, client: &[u8; 16]) -> u64 {
    let key: ClientKey = if fault!("client_key_misread") {
        PortConfig { client_prefix_v6: 48, ..*config }.client_key(client)
    } else {
        config.client_key(client)
    };
    established_of(&key)
}

/// The established connections the socket tracepoint counts for `key`.
#[inline(always)]
fn established_of(key: &ClientKey) -> u64 {
    // SAFETY: plain data.
    unsafe { gate::clients().and_then(|m| m.get(key)) }.map_or(0, |&held| if held < 0 { 0 } else { held as u64 })
}

/// A client's admissions at the ACK that the kernel has not established yet
/// ([`shed_common::map::PENDING_CLIENTS`]): a `TCP_DEFER_ACCEPT` listener keeps
/// them as request sockets until their first bytes, so without them one
/// address could stack admissions past its cap before any is established.
/// Charged in the port's handshake epochs, they lapse like the port's own
/// reservations.
///
/// Charges one admission to `seg`'s client, judged with the value the
/// fetch-add returned (so racing CPUs cannot stack one client past its cap
/// either): nothing charged, and the refusal's counter returned
/// (`REJECTED_CLIENT_CAP`, `REJECTED_CLIENT_SHARE`), if the client's
/// established connections and its admissions under way would pass its cap,
/// or `share` (what it may hold while the share binds; `u64::MAX` when it
/// does not); 0 when charged. A subprogram: the ACK path's one extra call.
#[inline(never)]
pub(crate) fn charge_client(config: &PortConfig, seg: &Segment, epoch: u64, share: u64) -> usize {
    if !config.counts_clients() || fault!("client_pending_ignored") {
        return 0;
    }
    let key = &config.client_key(&seg.client_addr);
    // No room in the table: counted once established, as before it had one.
    let Some(pending) = pending_ring(key, true) else { return 0 };
    // The ring walked here, not in `ring::outstanding`: a call deeper would
    // pass the 512-byte stack (XDP entry, `ack`, this). Its paths merge after.
    // SAFETY: map value; cells are read field by field while other CPUs add to them.
    let others = crate::maps::forget(unsafe { &*pending }.split(epoch, |field| atomic::load(field)).others);
    let Some((cell, mine)) = ring::open(pending, epoch) else { return 0 };
    let cap = u64::from(config.client_cap);
    let held = established_of(key) + others + mine;
    let over_cap = cap != 0 && held > cap + u64::from(fault!("client_cap_off_by_one"));
    if over_cap || held > share {
        ring::undo(cell);
        return if over_cap { counter::REJECTED_CLIENT_CAP } else { counter::REJECTED_CLIENT_SHARE };
    }
    0
}

/// The ring of `key`'s admissions under way; `create`: a client without one
/// gets one (the table is an LRU: the least recent client's goes, its
/// admissions then counted once established).
#[inline(always)]
pub(crate) fn pending_ring(key: &ClientKey, create: bool) -> Option<*mut HandshakeRing> {
    if let Some(pending) = gate::pending_clients().and_then(|m| m.get_ptr_mut(key)) {
        return Some(pending);
    }
    if !create {
        return None;
    }
    let empty = SHED_EMPTY_RING.get(0)?;
    // Another CPU may insert it first: this then finds that one.
    let _ =
        gate::pending_clients().map_or(Err(-1), |m| m.insert(key, empty, u64::from(aya_ebpf::bindings::BPF_NOEXIST)));
    gate::pending_clients().and_then(|m| m.get_ptr_mut(key))
}

/// Releases an admission charged to `seg`'s client at `epoch` (its handshake
/// completed, or the port refused it after the charge), unless it lapsed.
#[inline(never)]
pub(crate) fn uncharge_client(config: &PortConfig, client: &[u8; 16], epoch: u64, now_epoch: u64) {
    if config.counts_clients() {
        release_charge(&config.client_key(client), epoch, now_epoch);
    }
}

/// Releases an admission charged to `key` at `epoch`, unless it lapsed: the
/// one release of a charge, whether its handshake completed or the port
/// refused it after the charge.
#[inline(always)]
pub(crate) fn release_charge(key: &ClientKey, epoch: u64, now_epoch: u64) {
    if fault!("client_pending_not_released") {
        return;
    }
    if let Some(pending) = pending_ring(key, false) {
        ring::close(pending, epoch, now_epoch);
    }
}

/// Releases one connection of `client` (it closed).
#[inline(always)]
pub fn client_release(client: &ClientKey) {
    if let Some(held) = gate::clients().and_then(|m| m.get_ptr_mut(client)) {
        let before = atomic::add(held.cast::<u64>(), u64::MAX);
        note_client(client, before.wrapping_sub(1));
    }
}

/// Counts one more established connection for `client`; false if the client
/// map is full (the connection is then not counted against the cap).
#[inline(always)]
pub fn client_add(client: &ClientKey) -> bool {
    if gate::clients().and_then(|m| m.get_ptr_mut(client)).is_none() {
        // A port at its quota of the shared client map adds no new client (its
        // connections go uncounted against caps and shares), so that one port's
        // clients, say a /48 of /64s, cannot fill the map for every port.
        let Some(state) = gate::port_state().and_then(|m| m.get_ptr_mut(client.slot)) else { return false };
        let user = gate::user_state().and_then(|m| m.get(client.slot)).copied().unwrap_or_default();
        // SAFETY: map value, copied as plain data.
        if !user.client_room(&unsafe { *state }) && !fault!("client_quota_ignored") {
            return false;
        }
        // A zero on the stack, not `&0i64`: a pointer to a constant lands in
        // `.rodata.cst8`, which the loader relocates to offset 0 of the wrong
        // data section (it read back the stamps' secret as the count).
        let mut zero = 1i64;
        // SAFETY: a write to a local.
        unsafe { core::ptr::write_volatile(&mut zero, 0) };
        if gate::clients()
            .map_or(Err(-1), |m| m.insert(client, &zero, u64::from(aya_ebpf::bindings::BPF_NOEXIST)))
            .is_ok()
        {
            // SAFETY: `state` is a slot of an array map, valid for this run; a raw pointer, no reference is made.
            atomic::add(unsafe { &raw mut (*state).clients_added }, 1);
        }
    }
    let Some(held) = gate::clients().and_then(|m| m.get_ptr_mut(client)) else { return false };
    let before = atomic::add(held.cast::<u64>(), 1);
    note_client(client, before + 1);
    true
}

/// A verified client (its ACK answered a SYN-ACK) was refused: if it holds
/// less than its share of `limit`, the share binds for a while
/// ([`shed_common::CONTENDED_FOR_NS`]): a client holding its share is then
/// refused, and the daemon closes what such a client's server sits on.
#[inline(never)]
pub(crate) fn note_verified_refusal(config: &PortConfig, limit: u32, client: &[u8; 16], now_ns: u64) {
    let Some(cap) = config.share_cap(limit) else { return };
    let Some(contention) = gate::contention().and_then(|m| m.get_ptr_mut(config.slot)) else { return };
    if client_held(config, client) < cap {
        // SAFETY: map value; a plain store.
        unsafe { (*contention).refused_ns = now_ns };
    }
}

/// Keeps the port's largest client current: `client` now holds `held`.
/// Plain stores: CPUs racing here at worst leave a count one off until the
/// next open or close of that client sets it again.
#[inline(never)]
pub(crate) fn note_client(client: &ClientKey, held: u64) {
    // A close of a count the healer already took back reads below zero: none held.
    let held = if (held as i64) < 0 { 0 } else { held };
    let Some(c) = gate::contention().and_then(|m| m.get_ptr_mut(client.slot)) else { return };
    // SAFETY: map value, plain data.
    unsafe {
        if (*c).largest == client.addr {
            (*c).largest_held = held;
        } else if held > (*c).largest_held {
            (*c).largest = client.addr;
            (*c).largest_held = held;
        }
    }
}
