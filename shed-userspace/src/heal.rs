//! Drift healing: the kernel's counts are kept by events, and an event that
//! never arrives (a socket established before the gate, an eviction, a
//! missed close) would skew them for good. Once a second the daemon compares
//! the tracked sockets with the kernel's own socket table for the gated
//! namespace (/proc/thread-self/net/tcp and tcp6) and with the counters:
//! - a tracked socket that is gone from the table is forgotten;
//! - a live connection of a protected port that is not tracked is adopted
//!   (counted as open; its request turns are not seen, so it is never busy);
//! - a count that differs from the tracked sockets by the same amount on two
//!   passes in a row is corrected, and the correction reported.
//!
//! Every change waits for a second pass that sees the same thing, so a
//! connection opening or closing during a pass is never "healed" by mistake.
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fs,
};

use shed_common::{FlowKey, PortConfig, SockEntry, ipv4_mapped};

use crate::{Error, maps::GateMaps};

/// Socket states from ESTABLISHED to the final close, as /proc/net/tcp prints them
/// (established, fin-wait-1/2, close, close-wait, last-ack, closing).
const HELD_STATES: [u8; 7] = [0x01, 0x04, 0x05, 0x07, 0x08, 0x09, 0x0b];

/// Keys of adopted sockets: user-space addresses, never a kernel socket's.
const ADOPTED_KEY_BASE: u64 = 0x0000_5eed_0000_0000;

fn hex_addr(s: &str) -> Option<[u8; 16]> {
    match s.len() {
        8 => Some(ipv4_mapped(u32::from_str_radix(s, 16).ok()?.to_le_bytes())),
        32 => {
            let mut out = [0u8; 16];
            for (i, word) in out.chunks_mut(4).enumerate() {
                word.copy_from_slice(&u32::from_str_radix(&s[8 * i..8 * i + 8], 16).ok()?.to_le_bytes());
            }
            Some(out)
        }
        _ => None,
    }
}

fn endpoint(s: &str) -> Option<([u8; 16], u16)> {
    let (addr, port) = s.split_once(':')?;
    Some((hex_addr(addr)?, u16::from_str_radix(port, 16).ok()?))
}

/// Connections held on `ports` in a /proc/net/tcp{,6} text.
pub fn parse_socket_table(text: &str, ports: &BTreeSet<u16>) -> Vec<FlowKey> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let (local, local_port) = endpoint(fields.next()?)?;
            let (remote, remote_port) = endpoint(fields.next()?)?;
            let state = u8::from_str_radix(fields.next()?, 16).ok()?;
            (ports.contains(&local_port) && HELD_STATES.contains(&state)).then_some(FlowKey {
                client_addr: remote,
                server_addr: local,
                client_port: remote_port,
                server_port: local_port,
            })
        })
        .collect()
}

#[derive(Default)]
pub struct Healer {
    /// What the last pass would have changed, to be confirmed by this one.
    stale_before: HashSet<u64>,
    untracked_before: HashSet<FlowKey>,
    drift_before: BTreeMap<u32, (i64, i64)>,
}

impl Healer {
    pub fn run(&mut self, maps: &mut GateMaps) -> Result<(), Error> {
        let configs: BTreeMap<u16, PortConfig> = maps.port_configs()?;
        let ports: BTreeSet<u16> = configs.keys().copied().collect();
        // The tracked sockets first, then the table: a socket that closes in
        // between is gone from both; one that opens in between is caught next pass.
        let tracked: Vec<(u64, SockEntry)> = maps.socks.iter().filter_map(Result::ok).collect();
        let mut live = HashSet::new();
        for path in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
            let text = fs::read_to_string(path).map_err(|e| Error::io("read socket table", path, e))?;
            live.extend(parse_socket_table(&text, &ports));
        }

        let ours = |e: &SockEntry| configs.get(&e.port).is_some_and(|c| c.slot == e.slot);
        let stale: HashSet<u64> =
            tracked.iter().filter(|(_, e)| ours(e) && !live.contains(&e.flow)).map(|(k, _)| *k).collect();
        let gone: HashSet<u64> = confirmed(&stale, &self.stale_before).copied().collect();
        for (key, entry) in tracked.iter().filter(|(k, _)| gone.contains(k)) {
            if maps.socks.remove(key).is_ok() && entry.capped != 0 {
                // The close was missed, so its client still counts it. A read-modify-write:
                // a kernel add racing it (microseconds, on a connection whose close we
                // missed) would be lost, loosening that client's cap by one.
                let client = shed_common::ClientKey { slot: entry.slot, addr: entry.client };
                if let Ok(held) = maps.clients.get(&client, 0) {
                    let _ = maps.clients.insert(client, (held - 1).max(0), 0);
                }
            }
        }
        self.stale_before = stale;

        let tracked_flows: HashSet<FlowKey> = tracked.iter().map(|(_, e)| e.flow).collect();
        let untracked: HashSet<FlowKey> = live.difference(&tracked_flows).copied().collect();
        for flow in confirmed(&untracked, &self.untracked_before) {
            let Some(config) = configs.get(&flow.server_port) else { continue };
            // Exempt clients are never counted, so never adopted either.
            let tier = maps.tiers.get(&aya::maps::lpm_trie::Key::new(128, flow.client_addr), 0).ok();
            if tier == Some(u32::from(shed_common::tier::EXEMPT)) {
                continue;
            }
            let entry = SockEntry {
                slot: config.slot,
                port: flow.server_port,
                busy: 0,
                capped: 0,
                arrival_ns: 0,
                pickup_ns: 0,
                client: config.client_key(&flow.client_addr).addr,
                flow: *flow,
                _pad2: [0; 4],
            };
            let key = ADOPTED_KEY_BASE | (fxhash(flow) & 0xffff_ffff);
            const BPF_NOEXIST: u64 = 1;
            let _ = maps.socks.insert(key, entry, BPF_NOEXIST);
        }
        self.untracked_before = untracked;

        // Counts against the tracked sockets.
        let tracked: Vec<SockEntry> = maps.socks.iter().filter_map(Result::ok).map(|(_, e)| e).collect();
        for (&port, config) in &configs {
            let slot = config.slot;
            let open = tracked.iter().filter(|e| e.slot == slot && e.port == port).count() as i64;
            let busy = tracked.iter().filter(|e| e.slot == slot && e.port == port && e.busy != 0).count() as i64;
            let snapshot = maps.snapshot(port, *config)?;
            let drift = (snapshot.established() as i64 - open, snapshot.busy() as i64 - busy);
            if let Some(drift) = drift_to_correct(self.drift_before.get(&slot), drift) {
                let n = (drift.0.unsigned_abs()).max(drift.1.unsigned_abs());
                let mut user = snapshot.user;
                user.established_adjust -= drift.0;
                user.busy_adjust -= drift.1;
                user.drift_corrected += n;
                maps.user_state.set(slot, user, 0).map_err(|e| Error::map("write drift correction", e))?;
                tracing::warn!(
                    port,
                    established_drift = drift.0,
                    busy_drift = drift.1,
                    "corrected in-flight drift against the socket table"
                );
                self.drift_before.remove(&slot);
            } else {
                self.drift_before.insert(slot, drift);
            }
        }
        Ok(())
    }
}

/// What two passes in a row found: a socket, flow or drift is acted on only
/// when the pass before saw it too (one pass can race a connection opening
/// or closing between the map read and the socket-table read).
fn confirmed<'a, T: Eq + std::hash::Hash>(now: &'a HashSet<T>, before: &'a HashSet<T>) -> impl Iterator<Item = &'a T> {
    now.intersection(before)
}

/// The drift of a port's counts to correct now: a non-zero one, the same in
/// this pass and the last (a drift that changes is still moving: wait).
fn drift_to_correct(before: Option<&(i64, i64)>, now: (i64, i64)) -> Option<(i64, i64)> {
    (now != (0, 0) && before == Some(&now)).then_some(now)
}

fn fxhash(flow: &FlowKey) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in flow
        .client_addr
        .iter()
        .chain(&flow.server_addr)
        .chain(&flow.client_port.to_le_bytes())
        .chain(&flow.server_port.to_le_bytes())
    {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acts_only_on_what_two_passes_in_a_row_found() {
        let set = |v: &[u64]| v.iter().copied().collect::<HashSet<u64>>();
        let mut both: Vec<u64> = confirmed(&set(&[1, 2, 3]), &set(&[2, 3, 4])).copied().collect();
        both.sort_unstable();
        assert_eq!(both, [2, 3], "seen once (1 now, 4 before) is not acted on");
        assert_eq!(confirmed(&set(&[1]), &set(&[])).count(), 0, "the first pass acts on nothing");

        assert_eq!(drift_to_correct(None, (2, 1)), None, "a drift seen once waits");
        assert_eq!(drift_to_correct(Some(&(2, 1)), (2, 1)), Some((2, 1)), "seen twice: corrected");
        assert_eq!(drift_to_correct(Some(&(2, 1)), (3, 1)), None, "still moving: waits");
        assert_eq!(drift_to_correct(Some(&(-1, 0)), (-1, 0)), Some((-1, 0)), "an over-count is corrected too");
        assert_eq!(drift_to_correct(Some(&(0, 0)), (0, 0)), None, "no drift, nothing to do");
    }

    #[test]
    fn adopted_flows_get_distinct_keys() {
        let keys: HashSet<u64> = (0..2_000u16)
            .map(|port| {
                let flow = FlowKey {
                    client_addr: shed_common::ipv4_mapped([10, 0, (port >> 8) as u8, port as u8]),
                    server_addr: shed_common::ipv4_mapped([10, 0, 0, 1]),
                    client_port: 40_000 + port,
                    server_port: 8080,
                };
                fxhash(&flow) & 0xffff_ffff
            })
            .collect();
        assert_eq!(keys.len(), 2_000, "one map key per adopted connection");
    }

    #[test]
    fn parses_the_kernel_socket_tables() {
        let ports = BTreeSet::from([8080]);
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100C80A:1F90 0200C80A:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1
   1: 0100C80A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100C80A:1F91 0200C80A:D432 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
   3: 0100C80A:1F90 0200C80A:D433 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0
   4: 0100C80A:1F90 0200C80A:D434 08 00000000:00000000 00:00000000 00000000     0        0 4 1 0 20 4 30 10 -1
";
        let flows = parse_socket_table(v4, &ports);
        assert_eq!(flows.len(), 2, "established and close-wait on 8080; not listen, other ports or time-wait");
        assert_eq!(flows[0].server_addr, ipv4_mapped([10, 200, 0, 1]));
        assert_eq!(flows[0].client_addr, ipv4_mapped([10, 200, 0, 2]));
        assert_eq!((flows[0].server_port, flows[0].client_port), (8080, 0xd431));
        let v6 = "  sl  local_address                         remote_address                        st
   0: B80D0120000000000000000001000000:1F90 B80D0120000000000000000002000000:D431 01 0:0 0:0 0 0 0 1 1
";
        let flows = parse_socket_table(v6, &ports);
        assert_eq!(flows[0].server_addr, "2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    }
}
