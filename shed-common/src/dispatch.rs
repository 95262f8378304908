// SPDX-License-Identifier: MIT OR Apache-2.0
//! One set of socket-tracepoint programs for all of a node agent's pod gates.
//!
//! Every gate's accounting programs would otherwise run on every socket event
//! of the host, one per gated pod: with 100 pods a connection anywhere on the
//! node ran 100 programs per state change. The agent attaches one dispatcher
//! per tracepoint instead. A pod's gate loads its accounting programs (its
//! maps are its own) without attaching them; the agent puts them in
//! `SHED_DISPATCH_TARGETS` at [`target`]`(gate, event)` and the pod's
//! namespace in `SHED_DISPATCH_NETNS`. The dispatcher tail-calls the gate of
//! the socket's pod: at a handshake's end by the socket's namespace (and
//! remembers the socket's gate in `SHED_DISPATCH_SOCKS`), later by the socket.
//! A socket of no gated pod costs one hash lookup per event.

/// Gates one dispatcher serves (pods of one node gated at once).
pub const GATES: u32 = 1024;

/// Events per gate: the state change, then the three per-request events, in
/// the order of [`crate::program::DISPATCHERS`].
pub const EVENTS: u32 = 4;
pub const SOCK_STATE: u32 = 0;
pub const DATA_READY: u32 = 1;
pub const RECV: u32 = 2;
pub const SEND: u32 = 3;

/// Entries of `SHED_DISPATCH_TARGETS`.
pub const SLOTS: u32 = GATES * EVENTS;

/// A gate may have at most this share (1 / `QUOTA_DIVISOR`) of the
/// dispatcher's connections followed at once: one pod's connections, on any
/// port, cannot fill the node-wide table and blind the other pods' accounting.
/// Past it a pod's new connection still counts open in its gate (which its
/// healer corrects), unfollowed: counted in its [`DispatchBooks::unfollowed`].
pub const QUOTA_DIVISOR: u32 = 4;

/// The name of the dispatcher object's global holding the per-gate quota
/// (connections / [`QUOTA_DIVISOR`]), written at load.
pub const QUOTA_GLOBAL: &str = "SHED_DISPATCH_QUOTA";

/// The shared object (shed-ebpf built with its `shared` feature, embedded
/// beside the gate's): its programs judge and count for every pod of the
/// node, each pod's state in maps of its own that the agent puts in the
/// object's `ArrayOfMaps` at the pod's gate (`map::GATED`); its TC program
/// finds the gate by the namespace of the packet's device, its dispatchers
/// by the socket's (both in `SHED_DISPATCH_NETNS`). The programs are verified once per agent,
/// not once per pod. A pod's maps come from the gate's object, loaded at a
/// pod's sizes, which the shared object's inner maps are declared with.
pub const SHARED_OBJECT: &str = "shed-shared";

/// One gate's books at the dispatcher (`SHED_DISPATCH_BOOKS`, one per gate).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchBooks {
    /// Connections followed now (added at the handshake's end, taken at the close).
    pub followed: u64,
    /// Connections not followed: the gate was at its quota, or the table full.
    pub unfollowed: u64,
}
const _: () = assert!(core::mem::size_of::<DispatchBooks>() == 16);

#[cfg(feature = "user")]
// SAFETY: plain integers, no padding.
unsafe impl aya::Pod for DispatchBooks {}

/// The index of `gate`'s program for `event` in `SHED_DISPATCH_TARGETS`
/// (past [`SLOTS`] for a gate out of range, which the tail call refuses).
pub const fn target(gate: u32, event: u32) -> u32 {
    gate.saturating_mul(EVENTS).saturating_add(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gate_has_its_own_four_targets() {
        let mut seen = std::collections::BTreeSet::new();
        for gate in 0..GATES {
            for event in [SOCK_STATE, DATA_READY, RECV, SEND] {
                let index = target(gate, event);
                assert!(index < SLOTS, "gate {gate} event {event}");
                assert!(seen.insert(index), "gate {gate} event {event} shares {index}");
            }
        }
        assert_eq!(seen.len() as u32, SLOTS);
        assert!(target(GATES, SOCK_STATE) >= SLOTS, "a gate past the table has no target");
        assert!(target(u32::MAX, SEND) >= SLOTS, "no wrap-around into another gate's");
    }

    #[test]
    fn the_events_follow_the_dispatchers_order() {
        let events = [SOCK_STATE, DATA_READY, RECV, SEND];
        for (event, &(_, _, program)) in events.into_iter().zip(&crate::program::DISPATCHERS) {
            let expected = match event {
                SOCK_STATE => crate::program::SOCK_STATE_RAW,
                DATA_READY => crate::program::DATA_READY,
                RECV => crate::program::RECV,
                _ => crate::program::SEND,
            };
            assert_eq!(program, expected, "event {event}");
        }
    }
}
