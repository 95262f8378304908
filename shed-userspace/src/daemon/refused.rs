// SPDX-License-Identifier: MIT OR Apache-2.0
//! Requests the gate refused on kept-alive connections: the gate answered the
//! client (`rst`: a reset; `http`: the `503` with FIN) and consumed the
//! request's first segment, so the service never reads it. The server's
//! socket is still there, idle; each tick the daemon closes it through
//! sock_diag (`SOCK_DESTROY`, what `ss -K` does), so the connection holds no
//! descriptor of the service and the client's later segments find no socket.
//! A `drop` refusal is left alone: its client is not answered, and its
//! retransmissions are dropped by the gate's record until the client gives up.
use std::collections::BTreeMap;

use shed_common::PortConfig;

use crate::{host::sockdiag::Closer, kernel::maps::GateMaps};

/// Closes refused requests' sockets; opened on the gate's thread, inside its namespace.
#[derive(Default)]
pub(super) struct RefusedRequests {
    closer: Closer,
}

impl RefusedRequests {
    /// Closes the sockets of the requests refused since the last tick, each
    /// counted on its port (`refused_closed`); returns how many it closed.
    pub(super) fn close(
        &mut self,
        maps: &mut GateMaps,
        ports: &BTreeMap<u16, PortConfig>,
    ) -> Result<usize, crate::error::Error> {
        let turns = maps.take_refused_turns()?;
        if turns.is_empty() {
            return Ok(0);
        }
        let left_open = "the sockets of requests refused on kept-alive connections stay open until their servers \
                         close them (they hold nothing under the limit)";
        let mut by_port: BTreeMap<u16, Vec<&shed_common::FlowKey>> = BTreeMap::new();
        for turn in &turns {
            by_port.entry(turn.flow.server_port).or_default().push(&turn.flow);
        }
        let mut total = 0;
        for (port, flows) in by_port {
            let (closed, failed) = self.closer.close(flows, left_open);
            total += closed;
            // A port detached since the request was refused has no count to keep.
            if let Some(config) = ports.get(&port) {
                maps.add_refused_closed(config.slot, closed as u64)?;
            }
            if let Some(e) = failed {
                return Err(crate::error::Error::io("close a refused request's socket", "sock_diag", e));
            }
        }
        Ok(total)
    }
}
