// SPDX-License-Identifier: MIT OR Apache-2.0
//! Handshake accounting without per-flow map inserts.
//!
//! An unverified SYN must not buy a slot for long: a forged source never
//! completes its handshake, so whatever it reserves has to lapse by itself,
//! within about one handshake time. Each port therefore keeps a small ring of
//! epoch cells ([`HandshakeRing`]): an admitted SYN adds one to the current
//! epoch's `admitted`; a completed handshake adds one to its admission epoch's
//! `completed`; only the last [`LIVE_EPOCHS`] epochs count. The epoch length
//! is `2^shift` ns, set by the daemon from the measured handshake time (see
//! [`shift_for_window`]), so a reservation lives between `3 * 2^shift` and
//! `4 * 2^shift` ns. A connection is counted for real when the kernel confirms
//! it (the socket becomes ESTABLISHED); the ring only bounds bursts of SYNs
//! whose handshakes are still under way.
//!
//! [`HandshakeStamp`]s, one array slot per flow hash and port, remember when
//! and in which epoch a flow was admitted, so its completion releases the
//! right cell and yields the handshake time. A flow's stamp goes in the first
//! of [`STAMP_PROBES`] slots from its hash that holds no other handshake
//! still under way, so concurrent handshakes do not overwrite each other's.
//! Only when all are taken is the first overwritten: that completion then
//! releases nothing, and the admission lapses with its epoch (counting a
//! little too much, never too little).

/// Cells per ring.
pub const RING: usize = 4;
/// Epochs whose admissions still count: the current one and the three before.
pub const LIVE_EPOCHS: u64 = RING as u64;
/// Stamps per port (a power of two).
pub const STAMPS_PER_PORT: u32 = 1024;
/// Slots a flow's stamp may take, from its hash on.
pub const STAMP_PROBES: u32 = 4;
/// Shortest epoch shift: 2^16 ns = 65.5 us (handshake windows of about
/// 0.25 ms, for handshakes of under 50 us, as on a LAN or a veth).
pub const MIN_SHIFT: u32 = 16;
/// Longest: 2^29 ns = 537 ms (windows of about 2 s, for very distant clients).
pub const MAX_SHIFT: u32 = 29;
/// Until the daemon has measured handshakes: 2^21 ns = 2.1 ms (windows of
/// about 8 ms; a longer handshake is measured, and the window grows at once).
pub const DEFAULT_SHIFT: u32 = 21;

/// Epoch shift of a port's silent ring: connections accepted in
/// [`crate::count_mode::WORK`] that have sent nothing yet. 2^27 ns = 134 ms,
/// so a silent connection counts in flight for 0.40 to 0.54 s after it is
/// accepted and then no more until its first bytes arrive. A real client's
/// request follows its handshake-completing ACK at once (on the same path, so
/// at any RTT); the grace only covers that gap, so a burst of connections
/// whose requests are a moment behind cannot overshoot the limit, while
/// connections that send nothing stop holding the port.
pub const DEFAULT_SILENT_SHIFT: u32 = 27;
/// Shortest silent epoch: 2^20 ns (a grace of about 4 ms).
pub const MIN_SILENT_SHIFT: u32 = 20;
/// Longest: 2^33 ns (a grace of about 34 s).
pub const MAX_SILENT_SHIFT: u32 = 33;

/// One epoch's handshakes. Both counters only grow while the epoch lives; the
/// first admission of a later epoch that maps to the same cell resets it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandshakeCell {
    pub epoch: u64,
    pub admitted: u64,
    pub completed: u64,
}

/// A port's handshakes in flight. Kernel-written (atomics); read by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandshakeRing {
    pub cells: [HandshakeCell; RING],
    /// Admissions that lapsed without completing, summed as their cells are reused.
    pub lapsed: u64,
    pub _pad: u64,
}
const _: () = assert!(core::mem::size_of::<HandshakeRing>() == 24 * RING + 16);

/// Whether a cell of `cell_epoch` still counts at `now_epoch`.
#[inline(always)]
pub const fn live(cell_epoch: u64, now_epoch: u64) -> bool {
    cell_epoch <= now_epoch && now_epoch - cell_epoch < LIVE_EPOCHS
}

/// A ring's handshakes at one epoch, by where they stand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handshakes {
    /// Open in the current epoch's cell.
    pub current: u64,
    /// Open in the other live cells.
    pub others: u64,
    /// Open in cells whose epoch has ended (not yet folded into `lapsed`):
    /// handshakes that would now complete late.
    pub lapsed: u64,
}

impl Handshakes {
    /// Admitted and not yet completed handshakes of the live epochs.
    #[inline(always)]
    pub const fn outstanding(&self) -> u64 {
        self.current + self.others
    }
}

impl HandshakeRing {
    /// The ring's handshakes at `now_epoch`, every field read through `load`
    /// (the kernel reads them as other CPUs add to them).
    #[inline(always)]
    pub fn split(&self, now_epoch: u64, load: impl Fn(&u64) -> u64) -> Handshakes {
        let mut out = Handshakes::default();
        let mut i = 0;
        while i < RING {
            let c = &self.cells[i];
            let epoch = load(&c.epoch);
            let open = load(&c.admitted).saturating_sub(load(&c.completed));
            if epoch == now_epoch {
                out.current += open;
            } else if live(epoch, now_epoch) || epoch == now_epoch + 1 {
                // The next epoch's cell: another CPU's clock read is already
                // past the edge this one has not reached. Its admissions are
                // live; counted as lapsed, a burst across the edge could give
                // the last place once on each side. (Cells further ahead were
                // written under a shorter epoch, before the shift grew: stale.)
                out.others += open;
            } else {
                out.lapsed += open;
            }
            i += 1;
        }
        out
    }

    /// Admitted and not yet completed handshakes of the live epochs.
    pub fn outstanding(&self, now_epoch: u64) -> u64 {
        self.split(now_epoch, |v| *v).outstanding()
    }

    /// Open handshakes of ended epochs, not yet folded into `lapsed`.
    pub fn lapsed_unfolded(&self, now_epoch: u64) -> u64 {
        self.split(now_epoch, |v| *v).lapsed
    }
}

/// Cell index of an epoch.
#[inline(always)]
pub const fn cell_of(epoch: u64) -> usize {
    (epoch as usize) & (RING - 1)
}

/// The epoch shift that makes a reservation live at least `window_ns`
/// (three full epochs), clamped to [`MIN_SHIFT`]..=[`MAX_SHIFT`].
pub const fn shift_for_window(window_ns: u64) -> u32 {
    let mut shift = MIN_SHIFT;
    while shift < MAX_SHIFT && (3u64 << shift) < window_ns {
        shift += 1;
    }
    shift
}

/// Where a flow was admitted. `flow` is the flow hash (never 0 for a used stamp).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandshakeStamp {
    pub flow: u32,
    /// One of [`stamp_state`].
    pub state: u32,
    /// The epoch whose cell holds the reservation.
    pub epoch: u64,
    /// When the SYN was admitted (ns, kernel monotonic clock).
    pub syn_ns: u64,
}
const _: () = assert!(core::mem::size_of::<HandshakeStamp>() == 24);

pub mod stamp_state {
    /// The handshake holds a reservation in the cell of its epoch.
    pub const ADMITTED: u32 = 1;
    /// The handshake completed (its reservation was released).
    pub const COMPLETED: u32 = 2;
    /// A CPU is judging the flow's handshake-completing ACK right now: set
    /// and resolved (to admitted, or back to free) within one program run,
    /// so it never goes stale. The flow's other segments meanwhile pass as
    /// duplicates, and other flows leave the slot alone.
    pub const CLAIMED: u32 = 3;
}

/// The name of the kernel object's global that holds [`keyed_flow_hash`]'s
/// secret, drawn by userspace at every load.
pub const FLOW_SECRET_GLOBAL: &str = "SHED_FLOW_SECRET";

/// The name of the kernel object's global that holds the byte offset of
/// `snt_isn` in the running kernel's `struct tcp_request_sock` (from its BTF,
/// found by userspace at every load; 0 when it could not be found).
pub const SNT_ISN_OFFSET_GLOBAL: &str = "SHED_SNT_ISN_OFFSET";

/// The name of the global that holds the byte offset of `rcv_isn` in the
/// running kernel's `struct tcp_request_sock` (0 when it could not be found:
/// a handshake-completing ACK is then judged whatever its sequence number).
pub const RCV_ISN_OFFSET_GLOBAL: &str = "SHED_RCV_ISN_OFFSET";

/// The most a request socket's receive window can be: the kernel accepts a
/// segment to it only if it falls within `rcv_isn + 1` and this much more
/// (`tcp_synack_window`: a SYN-ACK's window is never scaled).
pub const SYNACK_WINDOW_MAX: u32 = 65_535;

/// Whether a segment `[seq, end_seq)` to a request socket whose peer's ISN is
/// `rcv_isn` falls in its receive window as the kernel checks it
/// (`tcp_in_window` against `rcv_isn + 1` and [`SYNACK_WINDOW_MAX`] more),
/// so that it may complete the handshake. One outside is dropped by the
/// kernel: it completes nothing and may take no reservation.
#[inline(always)]
pub const fn in_synack_window(seq: u32, end_seq: u32, rcv_isn: u32) -> bool {
    let start = rcv_isn.wrapping_add(1);
    let from = seq.wrapping_sub(start) as i32;
    let to = end_seq.wrapping_sub(start) as i32;
    from == 0 || (to > 0 && from < SYNACK_WINDOW_MAX as i32) || (from == SYNACK_WINDOW_MAX as i32 && seq == end_seq)
}

/// The name of the global that holds the byte offset of `rcv_nxt` in the
/// running kernel's `struct tcp_sock` (0 when it could not be found: a
/// kept-alive connection's next request is then told by its socket's state
/// alone).
pub const RCV_NXT_OFFSET_GLOBAL: &str = "SHED_RCV_NXT_OFFSET";

/// A 32-bit hash of a flow (never 0), unkeyed: for tables whose slots
/// userspace must find too (the local addresses) or whose collisions only
/// ever refuse more (the RST prefix buckets).
#[inline(always)]
pub fn flow_hash(client: &[u8; 16], server: &[u8; 16], client_port: u16, server_port: u16) -> u32 {
    keyed_flow_hash(0, client, server, client_port, server_port)
}

/// A 32-bit hash of a flow (never 0) under a secret `key`, for the handshake
/// stamps: a client that picks its ports cannot aim its flows at another
/// handshake's stamp without the secret. Mixes the addresses as 32-bit words
/// (IPv4-mapped addresses share their first three words, so they add
/// nothing). Not a cryptographic MAC: it keeps collisions to chance.
#[inline(always)]
pub fn keyed_flow_hash(key: u64, client: &[u8; 16], server: &[u8; 16], client_port: u16, server_port: u16) -> u32 {
    let mut h: u32 = 0x811c_9dc5 ^ (key as u32);
    let mut i = 0;
    while i < 16 {
        let c = u32::from_ne_bytes([client[i], client[i + 1], client[i + 2], client[i + 3]]);
        let s = u32::from_ne_bytes([server[i], server[i + 1], server[i + 2], server[i + 3]]);
        h = (h ^ c).wrapping_mul(0x9e37_79b1).rotate_left(13);
        h = (h ^ s).wrapping_mul(0x85eb_ca77).rotate_left(15);
        i += 4;
    }
    h ^= (u32::from(client_port) << 16) | u32::from(server_port);
    h = (h ^ (key >> 32) as u32).wrapping_mul(0xcc9e_2d51).rotate_left(15);
    h = (h ^ (h >> 16)).wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    // 0 marks an unused stamp.
    if h == 0 { 1 } else { h }
}

/// Index of a flow's `probe`th stamp slot (0..[`STAMP_PROBES`]): in the
/// port's own block, so one port's flood cannot overwrite another port's stamps.
#[inline(always)]
pub const fn stamp_index(slot: u32, hash: u32, probe: u32) -> u32 {
    slot * STAMPS_PER_PORT + (hash.wrapping_add(probe) & (STAMPS_PER_PORT - 1))
}

impl HandshakeStamp {
    /// The stamp's first word, `flow` and `state` as one `u64` (the fields'
    /// order in memory on a little-endian target), so that taking a slot is
    /// one compare-and-swap.
    #[inline(always)]
    pub const fn head(flow: u32, state: u32) -> u64 {
        flow as u64 | ((state as u64) << 32)
    }

    /// Whether this slot holds `flow`'s handshake at `now_epoch`: admitted and
    /// still reserved, or being judged by a CPU right now. Another
    /// handshake-completing segment of the flow (a duplicate, or the request
    /// right behind the ACK on another CPU) then holds its reservation already.
    #[inline(always)]
    pub const fn holds(&self, flow: u32, now_epoch: u64) -> bool {
        self.flow == flow
            && (self.state == stamp_state::CLAIMED
                || (self.state == stamp_state::ADMITTED && live(self.epoch, now_epoch)))
    }

    /// Whether `flow`, admitted at `now_epoch`, may take this slot: it holds no
    /// other flow's handshake still under way (unused, completed, lapsed, or its
    /// own), and no CPU is judging one in it.
    #[inline(always)]
    pub const fn free_for(&self, flow: u32, now_epoch: u64) -> bool {
        self.state != stamp_state::CLAIMED
            && (self.flow == 0
                || self.flow == flow
                || self.state != stamp_state::ADMITTED
                || !live(self.epoch, now_epoch))
    }
}
#[cfg(target_endian = "little")]
const _: () = assert!(core::mem::offset_of!(HandshakeStamp, state) == 4);

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `tcp_in_window`, as written in net/ipv4/tcp_minisocks.c
    /// (`before`/`after` as signed differences).
    fn kernel_in_window(seq: u32, end_seq: u32, s_win: u32, e_win: u32) -> bool {
        let before = |a: u32, b: u32| (a.wrapping_sub(b) as i32) < 0;
        let after = |a: u32, b: u32| before(b, a);
        if seq == s_win {
            return true;
        }
        if after(end_seq, s_win) && before(seq, e_win) {
            return true;
        }
        seq == e_win && seq == end_seq
    }

    proptest::proptest! {
        /// The request socket's window as the kernel checks it, with the
        /// largest window a SYN-ACK can offer, anywhere in sequence space.
        #[test]
        fn the_synack_window_is_the_kernels(rcv_isn: u32, offset in -70_000i64..140_000, len in 0u32..3000) {
            let start = rcv_isn.wrapping_add(1);
            let seq = start.wrapping_add(offset as u32);
            let end_seq = seq.wrapping_add(len);
            proptest::prop_assert_eq!(
                in_synack_window(seq, end_seq, rcv_isn),
                kernel_in_window(seq, end_seq, start, start.wrapping_add(SYNACK_WINDOW_MAX))
            );
        }
    }

    #[test]
    fn the_synack_windows_edges() {
        let isn = u32::MAX - 10;
        let start = isn.wrapping_add(1);
        for (seq, len, inside) in [
            (start, 0, true),
            (start.wrapping_add(65_534), 0, true),
            (start.wrapping_add(65_535), 0, true),
            (start.wrapping_add(65_535), 1, false),
            (start.wrapping_add(65_536), 0, false),
            (start.wrapping_sub(1), 0, false),
            (start.wrapping_sub(1), 1, false),
            (start.wrapping_sub(1), 2, true),
        ] {
            assert_eq!(in_synack_window(seq, seq.wrapping_add(len), isn), inside, "{seq} + {len}");
        }
    }

    #[test]
    fn only_live_cells_count() {
        let mut ring = HandshakeRing::default();
        ring.cells[cell_of(100)] = HandshakeCell { epoch: 100, admitted: 5, completed: 2 };
        ring.cells[cell_of(101)] = HandshakeCell { epoch: 101, admitted: 1, completed: 0 };
        ring.cells[cell_of(98)] = HandshakeCell { epoch: 98, admitted: 7, completed: 7 };
        assert_eq!(ring.outstanding(101), 4);
        assert_eq!(ring.outstanding(103), 4, "epoch 100 still lives at 103");
        assert_eq!(ring.outstanding(104), 1, "epoch 100 lapsed at 104");
        assert_eq!(ring.lapsed_unfolded(104), 3);
        assert_eq!(ring.outstanding(105), 0);
        assert_eq!(ring.outstanding(99), 3, "the next epoch's cell counts: another CPU is past the edge");
        assert_eq!(ring.outstanding(98), 0, "cells further ahead (written under a shorter epoch) do not");
        // A late completion (completed > admitted) never counts below zero.
        ring.cells[cell_of(101)].completed = 3;
        assert_eq!(ring.outstanding(101), 3);
    }

    #[test]
    fn windows_map_to_shifts() {
        assert_eq!(shift_for_window(0), MIN_SHIFT);
        assert_eq!(shift_for_window(3 << 20), 20);
        assert_eq!(shift_for_window((3 << 20) + 1), 21);
        assert_eq!(shift_for_window(u64::MAX), MAX_SHIFT);
        for w in [1u64, 500_000, 3_000_000, 40_000_000, 1_000_000_000] {
            let s = shift_for_window(w);
            assert!((3u64 << s) >= w.min(3 << MAX_SHIFT), "{w} -> {s}");
            assert!(s == MIN_SHIFT || (3u64 << (s - 1)) < w, "{w} -> {s} is not the smallest");
        }
    }

    #[test]
    fn the_secret_moves_every_flow() {
        let v4 = |last: u8| crate::ipv4_mapped([10, 0, 0, last]);
        let mut moved = 0;
        for port in 1000..2000u16 {
            let plain = keyed_flow_hash(0, &v4(1), &v4(2), port, 80);
            assert_eq!(plain, flow_hash(&v4(1), &v4(2), port, 80));
            let keyed = keyed_flow_hash(0x1234_5678_9abc_def0, &v4(1), &v4(2), port, 80);
            let other = keyed_flow_hash(0x1234_5678_0000_def0, &v4(1), &v4(2), port, 80);
            moved += usize::from(keyed & (STAMPS_PER_PORT - 1) != plain & (STAMPS_PER_PORT - 1));
            assert_ne!(keyed, other, "both halves of the key count");
        }
        assert!(moved > 990, "flows that collide unkeyed scatter under a secret: {moved} of 1000 moved");
    }

    /// Every bit of the secret counts: one a forger could ignore halves its work.
    #[test]
    fn every_bit_of_the_secret_changes_the_hash() {
        let v4 = |last: u8| crate::ipv4_mapped([10, 0, 0, last]);
        for key in [0u64, u64::MAX, 0x1234_5678_9abc_def0] {
            let base = keyed_flow_hash(key, &v4(1), &v4(2), 40_000, 80);
            for bit in 0..64 {
                let flipped = keyed_flow_hash(key ^ (1 << bit), &v4(1), &v4(2), 40_000, 80);
                assert_ne!(flipped, base, "key {key:#x} bit {bit}");
            }
        }
    }

    #[test]
    fn flow_hashes_spread_and_are_never_zero() {
        let v4 = |last: u8| crate::ipv4_mapped([10, 0, 0, last]);
        let mut seen = std::collections::HashSet::new();
        let mut slots = std::collections::HashSet::new();
        for port in 1000..3000u16 {
            let h = flow_hash(&v4(1), &v4(2), port, 80);
            assert_ne!(h, 0);
            seen.insert(h);
            slots.insert(h & (STAMPS_PER_PORT - 1));
        }
        assert_eq!(seen.len(), 2000, "distinct flows, distinct hashes");
        assert!(slots.len() > 800, "2000 flows fill most of 1024 stamps: {}", slots.len());
        assert_ne!(flow_hash(&v4(1), &v4(2), 1, 2), flow_hash(&v4(2), &v4(1), 1, 2));
        assert_eq!(stamp_index(3, 0xffff_ffff, 0), 3 * STAMPS_PER_PORT + STAMPS_PER_PORT - 1);
        assert_eq!(stamp_index(3, 0xffff_ffff, 1), 3 * STAMPS_PER_PORT, "probes wrap inside the port's block");
    }

    #[test]
    #[expect(clippy::decimal_bitwise_operands, reason = "port numbers read as ports")]
    fn every_bit_of_the_four_tuple_changes_the_hash() {
        let client: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        let server: [u8; 16] = [0x20, 1, 0xd, 0xb8, 9, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8];
        let base = flow_hash(&client, &server, 40_000, 8080);
        for byte in 0..16 {
            for bit in 0..8 {
                let mut c = client;
                c[byte] ^= 1 << bit;
                assert_ne!(flow_hash(&c, &server, 40_000, 8080), base, "client byte {byte} bit {bit}");
                let mut s = server;
                s[byte] ^= 1 << bit;
                assert_ne!(flow_hash(&client, &s, 40_000, 8080), base, "server byte {byte} bit {bit}");
            }
        }
        for bit in 0..16 {
            assert_ne!(flow_hash(&client, &server, 40_000 ^ (1 << bit), 8080), base, "client port bit {bit}");
            assert_ne!(flow_hash(&client, &server, 40_000, 8080 ^ (1 << bit)), base, "server port bit {bit}");
        }
        // Stamp slots spread for flows that differ only in the client address's last byte.
        let slots: std::collections::HashSet<u32> = (0..=255u8)
            .map(|last| {
                let mut c = client;
                c[15] = last;
                flow_hash(&c, &server, 40_000, 8080) & (STAMPS_PER_PORT - 1)
            })
            .collect();
        assert!(slots.len() > 200, "256 clients over 1024 slots: {}", slots.len());
    }

    #[test]
    fn a_stamp_is_free_unless_another_handshake_holds_it() {
        let held = HandshakeStamp { flow: 7, state: stamp_state::ADMITTED, epoch: 100, syn_ns: 1 };
        assert!(!held.free_for(8, 100), "another flow's live handshake");
        assert!(!held.free_for(8, 103), "still live three epochs on");
        assert!(held.free_for(8, 104), "lapsed");
        assert!(held.free_for(7, 100), "its own flow (a retransmitted SYN)");
        assert!(HandshakeStamp { state: stamp_state::COMPLETED, ..held }.free_for(8, 100), "completed");
        assert!(HandshakeStamp::default().free_for(8, 100), "never used");
        let claimed = HandshakeStamp { state: stamp_state::CLAIMED, epoch: 1, ..held };
        assert!(!claimed.free_for(8, 100), "claimed by a CPU, whatever its stale epoch");
        assert!(!claimed.free_for(7, 100), "not even by its own flow");
    }

    #[test]
    fn a_flow_holds_its_stamp_while_admitted_and_live_or_claimed() {
        let held = HandshakeStamp { flow: 7, state: stamp_state::ADMITTED, epoch: 100, syn_ns: 1 };
        assert!(held.holds(7, 100) && held.holds(7, 103));
        assert!(!held.holds(7, 104), "lapsed: judged again");
        assert!(!held.holds(8, 100), "another flow's");
        assert!(!HandshakeStamp { state: stamp_state::COMPLETED, ..held }.holds(7, 100), "completed");
        assert!(HandshakeStamp { state: stamp_state::CLAIMED, epoch: 0, ..held }.holds(7, 100), "being judged");
    }

    #[test]
    fn the_head_word_is_the_flow_and_state_fields() {
        let stamp = HandshakeStamp { flow: 0xdead_beef, state: stamp_state::CLAIMED, epoch: 9, syn_ns: 9 };
        // SAFETY: reading the first 8 bytes of a repr(C) struct of at least 24.
        let word = unsafe { core::ptr::from_ref(&stamp).cast::<u64>().read() };
        assert_eq!(word, HandshakeStamp::head(0xdead_beef, stamp_state::CLAIMED));
    }
}
