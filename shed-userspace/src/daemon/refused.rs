// SPDX-License-Identifier: MIT OR Apache-2.0
//! Requests the gate refused on kept-alive connections: the gate answered the
//! client (`rst`: a reset; `http`: the `503` with FIN) and consumed the
//! request's first segment, so the service never reads it. The server's
//! socket is still there, idle; each tick the daemon closes it through
//! sock_diag (`SOCK_DESTROY`, what `ss -K` does), so the connection holds no
//! descriptor of the service and the client's later segments find no socket.
//! A `drop` refusal is left alone: its client is not answered, and its
//! retransmissions are dropped by the gate's record until the client gives up.
use crate::{host::sockdiag::Closer, kernel::maps::GateMaps};

/// Closes refused requests' sockets; opened on the gate's thread, inside its namespace.
#[derive(Default)]
pub(super) struct RefusedRequests {
    closer: Closer,
}

impl RefusedRequests {
    /// Closes the sockets of the requests refused since the last tick; returns how many it closed.
    pub(super) fn close(&mut self, maps: &mut GateMaps) -> Result<usize, crate::error::Error> {
        let turns = maps.take_refused_turns()?;
        if turns.is_empty() {
            return Ok(0);
        }
        let left_open = "the sockets of requests refused on kept-alive connections stay open until their servers \
                         close them (they hold nothing under the limit)";
        match self.closer.close(turns.iter().map(|turn| &turn.flow), left_open) {
            (closed, None) => Ok(closed),
            (_, Some(e)) => Err(crate::error::Error::io("close a refused request's socket", "sock_diag", e)),
        }
    }
}
