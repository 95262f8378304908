// SPDX-License-Identifier: MIT OR Apache-2.0
//! The namespace's TCP counters, as `/proc/net/netstat` shows them.

/// Parses `ListenDrops` (which includes overflows) out of /proc/net/netstat.
pub fn listen_drops(netstat: &str) -> Option<u64> {
    let mut lines = netstat.lines();
    while let Some(header) = lines.next() {
        let values = lines.next()?;
        if !header.starts_with("TcpExt:") {
            continue;
        }
        let idx = header.split_whitespace().position(|f| f == "ListenDrops")?;
        return values.split_whitespace().nth(idx)?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstat_listen_drops() {
        let netstat =
            "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 7 9\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(listen_drops(netstat), Some(9));
        assert_eq!(listen_drops("IpExt: A\nIpExt: 1\n"), None);
    }
}
