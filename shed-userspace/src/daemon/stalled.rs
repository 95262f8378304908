// SPDX-License-Identifier: MIT OR Apache-2.0
//! The client share, held to what a client already holds. The gate judges the
//! share when a client opens a connection, so a client that filled the port
//! before anyone else came kept it: ten connections that each sent one byte
//! of a request (its server read it and waits for the rest, forever) held
//! `--limit 10` shut against every other client. While the port is contended
//! (a verified client under its share was refused within the last second),
//! the daemon closes the requests that a client over its share has had its
//! server sit on unanswered for [`STALL_GRACE`], oldest first, until the
//! client is back at its share (of the port's count: on a port counting
//! work, its busy connections; an idle pool holds none): through sock_diag (`SOCK_DESTROY`, what
//! `ss -K` does), so both ends are reset and the server's worker is freed.
//! Counted in `stalled_closed`.
//!
//! Why only then: alone, a client (or a NAT full of users) may fill the port
//! and be as slow as it likes; a request read and worked on for a second is
//! real work for a server that reads at once, so it is only taken from a
//! client holding more than its share while others wait. Requests still
//! unread (queued in the socket) and idle kept-alive connections are never
//! closed: the first are waiting for a worker, the second hold no work.
use std::{collections::BTreeMap, time::Duration};

use shed_common::{CONTENDED_FOR_NS, Contention, FlowKey, PortConfig, SockEntry, count_mode};

use crate::{
    host::{sockdiag::Closer, system::monotonic_ns},
    kernel::maps::GateMaps,
};

/// How long a server may sit on a request it read, unanswered, before the
/// request is closed when its client is over its share of a contended port:
/// the deadline most clients give a request, and many times a normal
/// request's service time.
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(1);

/// Least time between two looks at the connection map (a look reads every
/// entry, so not every tick; contention lasts a second after each refusal).
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// One client's holding of a port, and its stalled requests: when its
/// server read each (ns) and the connection.
#[derive(Default)]
struct Held {
    holding: u64,
    stalled: Vec<(u64, FlowKey)>,
}

/// The requests to close on the port in `slot`: of each client holding more
/// than `cap` in `entries`, the ones whose server read them at least
/// `grace_ns` before `now_ns` and has not answered, oldest first, at most as
/// many as the client holds past `cap`. `work`: the port counts work, so a
/// client holds its busy connections (an idle kept-alive pool holds none of
/// the limit, and closing its idle connections frees nothing); else every
/// connection it has open.
pub(crate) fn stalled_over_share(
    entries: &[SockEntry],
    slot: u32,
    cap: u64,
    work: bool,
    now_ns: u64,
    grace_ns: u64,
) -> Vec<FlowKey> {
    let mut by_client: BTreeMap<[u8; 16], Held> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.slot == slot) {
        let held = by_client.entry(entry.client).or_default();
        held.holding += u64::from(!work || entry.busy != 0);
        let read_unanswered = entry.busy != 0 && entry.multiplexed == 0 && entry.pickup_ns != 0;
        if read_unanswered && now_ns.saturating_sub(entry.pickup_ns) >= grace_ns {
            held.stalled.push((entry.pickup_ns, entry.flow));
        }
    }
    let mut close = Vec::new();
    for Held { holding, mut stalled } in by_client.into_values() {
        let past_share = holding.saturating_sub(cap) as usize;
        stalled.sort_unstable_by_key(|&(picked_up, _)| picked_up);
        close.extend(stalled.into_iter().take(past_share).map(|(_, flow)| flow));
    }
    close
}

/// Whether a port's share binds at `now_ns`: a client under it was refused
/// for room lately, and the port's largest client holds more than `cap`. A
/// refusal stamped a moment after `now_ns` (read after it) counts as now.
pub(crate) fn share_binds(contention: &Contention, cap: u64, now_ns: u64) -> bool {
    let seen =
        contention.refused_ns != 0 && (now_ns.max(contention.refused_ns) - contention.refused_ns) < CONTENDED_FOR_NS;
    seen && contention.largest_held > cap
}

/// Closes stalled requests of clients over their share; opened on the gate's
/// thread, inside its namespace.
#[derive(Default)]
pub(super) struct StalledRequests {
    closer: Closer,
    last_look: Option<std::time::Instant>,
}

impl StalledRequests {
    /// One tick: closes what [`stalled_over_share`] picks on every contended
    /// port; returns how many it closed.
    pub(super) fn close(
        &mut self,
        maps: &mut GateMaps,
        ports: &BTreeMap<u16, PortConfig>,
    ) -> Result<usize, crate::error::Error> {
        if self.last_look.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return Ok(0);
        }
        let mut bound = Vec::new();
        for (&port, config) in ports {
            let limit = maps.limit(config.slot)?;
            let Some(cap) = config.share_cap(limit) else { continue };
            let contention = maps.contention_of(config.slot)?;
            if share_binds(&contention, cap, monotonic_ns()) {
                bound.push((port, *config, cap));
            }
        }
        if bound.is_empty() {
            return Ok(0);
        }
        self.last_look = Some(std::time::Instant::now());
        let entries: Vec<SockEntry> = maps.tracked_sockets()?.into_values().collect();
        let (now_ns, grace_ns) = (monotonic_ns(), STALL_GRACE.as_nanos() as u64);
        let left_open = "requests a client over its share stalls are not closed";
        let mut closed = 0;
        for (port, config, cap) in bound {
            let work = config.count_mode == count_mode::WORK;
            let flows = stalled_over_share(&entries, config.slot, cap, work, now_ns, grace_ns);
            let (here, failed) = self.closer.close(&flows, left_open);
            if here > 0 {
                tracing::info!(
                    port,
                    closed = here,
                    "closed requests a client over its share left unanswered for {STALL_GRACE:?} while others were refused"
                );
                maps.add_stalled_closed(config.slot, here as u32)?;
                closed += here;
            }
            if let Some(e) = failed {
                return Err(crate::error::Error::io("close a stalled request's socket", "sock_diag", e));
            }
        }
        Ok(closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn entry(slot: u32, client: u8, port: u16, busy: bool, pickup_ns: u64) -> SockEntry {
        let mut addr = [0u8; 16];
        addr[15] = client;
        SockEntry {
            slot,
            port: 8080,
            busy: u8::from(busy),
            capped: 1,
            arrival_ns: pickup_ns.saturating_sub(1),
            pickup_ns,
            client: addr,
            flow: FlowKey { client_addr: addr, server_addr: [0; 16], client_port: port, server_port: 8080 },
            multiplexed: 0,
            silent: 0,
            refused_request: 0,
            _pad2: 0,
            silent_epoch: 0,
        }
    }

    fn ports(flows: &[FlowKey]) -> Vec<u16> {
        flows.iter().map(|f| f.client_port).collect()
    }

    #[test]
    fn a_client_over_its_share_loses_its_oldest_stalled_requests_down_to_the_share() {
        let now = 100 * SEC;
        // Client 1 holds 8 connections (cap 5): 6 stalled (read 1-6 s ago), one read just now, one idle.
        let mut entries: Vec<SockEntry> = (1..=6).map(|i| entry(0, 1, i as u16, true, now - i * SEC)).collect();
        entries.push(entry(0, 1, 7, true, now - SEC / 2));
        entries.push(entry(0, 1, 8, false, 0));
        // Client 2 holds 2, both stalled: under the share, untouched.
        entries.push(entry(0, 2, 20, true, now - 9 * SEC));
        entries.push(entry(0, 2, 21, true, now - 9 * SEC));
        // Another port's connections of client 1: not this port's.
        entries.extend((30..40).map(|p| entry(1, 1, p, true, now - 9 * SEC)));
        let close = stalled_over_share(&entries, 0, 5, false, now, SEC);
        assert_eq!(ports(&close), [6, 5, 4], "counting connections: three past the share, the oldest first");
        // Counting work, client 1 holds its 7 busy connections (the idle one holds none of the limit).
        let close = stalled_over_share(&entries, 0, 5, true, now, SEC);
        assert_eq!(ports(&close), [6, 5], "counting work: two past the share");
    }

    #[test]
    fn nothing_is_closed_within_the_grace_or_unread_or_idle() {
        let now = 100 * SEC;
        let mut entries: Vec<SockEntry> = (1..=4).map(|i| entry(0, 1, i, true, now - SEC + 1)).collect();
        // Unread (waiting for a worker): arrival set, no pick-up.
        entries.extend((5..=8).map(|i| SockEntry { arrival_ns: now - 5 * SEC, ..entry(0, 1, i, true, 0) }));
        entries.extend((9..=12).map(|i| entry(0, 1, i, false, 0)));
        assert!(stalled_over_share(&entries, 0, 1, true, now, SEC).is_empty());
        // Exactly the grace: closed.
        let at_grace = [entry(0, 1, 1, true, now - SEC), entry(0, 1, 2, true, now - SEC)];
        assert_eq!(ports(&stalled_over_share(&at_grace, 0, 1, false, now, SEC)), [1]);
        // A multiplexed connection is busy until closed: never a stalled request.
        let multiplexed = [SockEntry { multiplexed: 1, ..entry(0, 1, 1, true, 1) }, entry(0, 1, 2, false, 0)];
        assert!(stalled_over_share(&multiplexed, 0, 1, false, now, SEC).is_empty());
    }

    #[test]
    fn at_its_share_a_client_keeps_everything() {
        let now = 100 * SEC;
        let entries: Vec<SockEntry> = (1..=5).map(|i| entry(0, 1, i, true, 1)).collect();
        assert!(stalled_over_share(&entries, 0, 5, true, now, SEC).is_empty());
        assert_eq!(stalled_over_share(&entries, 0, 4, true, now, SEC).len(), 1);
    }

    #[test]
    fn the_share_binds_only_while_contended_and_over_it() {
        let now = 100 * SEC;
        let contended = Contention { refused_ns: now - SEC / 2, largest_held: 6, ..Contention::default() };
        assert!(share_binds(&contended, 5, now));
        assert!(!share_binds(&contended, 6, now), "at the share");
        assert!(!share_binds(&Contention { refused_ns: now - SEC, ..contended }, 5, now), "a second on");
        assert!(!share_binds(&Contention { refused_ns: 0, ..contended }, 5, now), "never refused");
        assert!(
            share_binds(&Contention { refused_ns: now + 5, ..contended }, 5, now),
            "refused after the clock was read"
        );
    }
}
