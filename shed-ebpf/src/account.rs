//! In-flight accounting from `sock:inet_sock_set_state`.
//!
//! A passive-open socket of a protected port is counted when it goes
//! SYN_RECV -> ESTABLISHED and released at its final CLOSE. Membership in
//! `SHED_SOCKS` makes both exactly-once: only the CPU whose insert (or delete)
//! succeeds touches the counters.
use aya_ebpf::{bindings::BPF_NOEXIST, programs::TracePointContext};
use shed_common::{FlowKey, SockEntry, sock_state_tp as tp, tcp_state};

use crate::{
    decide::atomic_add,
    maps::{SHED_PENDING, SHED_PORT_STATE, SHED_PORTS, SHED_SOCKS},
};

const IPPROTO_TCP: u16 = 6;

#[inline(always)]
pub fn on_sock_state(ctx: &TracePointContext) {
    let _ = try_on_sock_state(ctx);
}

fn try_on_sock_state(ctx: &TracePointContext) -> Result<(), i32> {
    // SAFETY: offsets from the tracepoint's format, checked by userspace at attach.
    let protocol: u16 = unsafe { ctx.read_at(tp::PROTOCOL)? };
    if protocol != IPPROTO_TCP {
        return Ok(());
    }
    let newstate: i32 = unsafe { ctx.read_at(tp::NEWSTATE)? };
    let skaddr: u64 = unsafe { ctx.read_at(tp::SKADDR)? };

    if newstate == tcp_state::CLOSE {
        // SAFETY: plain data copied out of the map.
        let Some(entry) = (unsafe { SHED_SOCKS.get(&skaddr) }).copied() else {
            return Ok(());
        };
        if SHED_SOCKS.remove(&skaddr).is_ok() {
            if let Some(state) = SHED_PORT_STATE.get_ptr_mut(entry.slot) {
                atomic_add(unsafe { &raw mut (*state).closed }, 1);
            }
        }
        return Ok(());
    }

    let oldstate: i32 = unsafe { ctx.read_at(tp::OLDSTATE)? };
    if newstate != tcp_state::ESTABLISHED || oldstate != tcp_state::SYN_RECV {
        return Ok(());
    }
    let local_port: u16 = unsafe { ctx.read_at(tp::SPORT)? };
    let Some(config) = (unsafe { SHED_PORTS.get(&local_port) }) else {
        return Ok(());
    };
    let slot = config.slot;
    let Some(state) = SHED_PORT_STATE.get_ptr_mut(slot) else {
        return Ok(());
    };
    let entry = SockEntry { slot, port: local_port, _pad: [0; 2] };
    if SHED_SOCKS.insert(&skaddr, &entry, u64::from(BPF_NOEXIST)).is_ok() {
        atomic_add(unsafe { &raw mut (*state).opened }, 1);
    }

    let key = FlowKey {
        client_addr: unsafe { ctx.read_at(tp::DADDR_V6)? },
        server_addr: unsafe { ctx.read_at(tp::SADDR_V6)? },
        client_port: unsafe { ctx.read_at(tp::DPORT)? },
        server_port: local_port,
    };
    if SHED_PENDING.remove(&key).is_ok() {
        atomic_add(unsafe { &raw mut (*state).released }, 1);
    }
    Ok(())
}
