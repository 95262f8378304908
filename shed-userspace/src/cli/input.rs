// SPDX-License-Identifier: MIT OR Apache-2.0
//! Parsing and validation of operator input. Pure functions, used by clap's
//! value parsers so a bad value is refused before anything is touched.
use std::{str::FromStr, time::Duration};

use shed_common::MAX_LIMIT;

use crate::named::Named;

/// A TCP port an operator asked to protect (1-65535).
pub(crate) fn parse_port(s: &str) -> Result<u16, String> {
    let n: i64 = s.trim().parse().map_err(|_| format!("{s:?} is not a port number: give a number from 1 to 65535"))?;
    match u16::try_from(n) {
        Ok(0) => Err("port 0 cannot be protected: give a port from 1 to 65535".into()),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("port {n} is out of range: give a port from 1 to 65535")),
    }
}

/// An address to listen on, IP and port (`127.0.0.1:9464`, `[::1]:9464`).
pub(crate) fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a listen address: give IP:PORT, e.g. 127.0.0.1:9464 or [::]:9464"))
}

/// A concurrency limit (1..=MAX_LIMIT).
pub(crate) fn parse_limit(s: &str) -> Result<u32, String> {
    let n: u64 =
        s.trim().parse().map_err(|_| format!("{s:?} is not a limit: give a whole number from 1 to {MAX_LIMIT}"))?;
    if n == 0 {
        return Err("limit 0 would reject every connection: give a limit from 1 (use `detach` to stop gating)".into());
    }
    if n > u64::from(MAX_LIMIT) {
        return Err(format!("limit {n} is above the maximum of {MAX_LIMIT} in-flight connections"));
    }
    Ok(n as u32)
}

/// A per-client cap: 0 (none) up to the highest limit.
pub(crate) fn parse_client_cap(s: &str) -> Result<u32, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_limit(s).map_err(|e| e.replace("limit", "client cap"))
}

/// A client's share of the limit, in percent: 0 (none) to 100.
pub(crate) fn parse_client_share(s: &str) -> Result<u8, String> {
    match s.trim().trim_end_matches('%').parse::<u8>() {
        Ok(n) if n <= 100 => Ok(n),
        _ => Err(format!(
            "client share {s:?} is not a percent of the limit from 0 to 100 (0 turns the share off; the default is {})",
            shed_common::DEFAULT_CLIENT_SHARE
        )),
    }
}

/// Seconds for the `http` action's Retry-After: 0 (derived) or 1 to 999.
pub(crate) fn parse_retry_after(s: &str) -> Result<u16, String> {
    match s.trim().trim_end_matches('s').parse::<u32>() {
        Ok(n) if n <= shed_common::http::MAX_RETRY_AFTER => Ok(n as u16),
        _ => Err(format!(
            "retry-after {s:?} is not a number of seconds from 1 to {} (0: the controller's queue wait, rounded up)",
            shed_common::http::MAX_RETRY_AFTER
        )),
    }
}

/// Ports served over TLS by convention: the `http` action cannot answer them.
pub(crate) const TLS_PORTS: [u16; 4] = [443, 465, 993, 8443];

/// Whether `port` may take the `http` action: not a TLS port (a TLS
/// handshake cannot be answered without state the gate does not keep).
pub(crate) fn http_port(port: u16) -> Result<(), String> {
    if TLS_PORTS.contains(&port) {
        return Err(format!(
            "port {port} is served over TLS by convention, and the http action answers plaintext HTTP/1.x only \
             (answering TLS needs state the gate does not keep): use --action rst (or drop) for it"
        ));
    }
    Ok(())
}

/// Whether a port counted as `count` may take the `http` action: not a
/// multiplexed one (HTTP/2 with prior knowledge, gRPC), whose clients expect
/// a SETTINGS frame and stream state no stateless answer can give.
pub(crate) fn http_count(count: crate::kernel::options::Count) -> Result<(), String> {
    if count == crate::kernel::options::Count::Multiplexed {
        return Err("--count multiplexed is for HTTP/2 and gRPC, and the http action answers HTTP/1.x only \
             (an HTTP/2 client needs the server's SETTINGS and a GOAWAY on its own stream state, which the gate \
             does not keep): use --action rst for such ports (gRPC clients then retry with their own backoff)"
            .into());
    }
    Ok(())
}

/// An IPv6 prefix length for counting clients (1-128).
pub(crate) fn parse_prefix_v6(s: &str) -> Result<u8, String> {
    let n: u8 = s
        .trim()
        .trim_start_matches('/')
        .parse()
        .map_err(|_| format!("{s:?} is not a prefix length: give 1 to 128, e.g. 64"))?;
    if !(1..=128).contains(&n) {
        return Err(format!("prefix length {n} is out of range: give 1 to 128"));
    }
    Ok(n)
}

/// Whole seconds, 1 to 3600 (`--heal-interval`, `--ready-window`).
pub(crate) fn parse_seconds(s: &str) -> Result<Duration, String> {
    let d = duration_in(s, Duration::from_secs(1), "seconds, e.g. 30")?;
    if d.subsec_nanos() != 0 || !(1..=3600).contains(&d.as_secs()) {
        return Err(format!("{s} is out of range: give 1 to 3600 seconds (whole seconds)"));
    }
    Ok(d)
}

/// A duration the same way in every flag and config key that takes one: a
/// bare number in the flag's own unit (`--window 100` is milliseconds,
/// `--heal-interval 30` seconds), or a number with its unit: `250ms`, `2s`, `1m`.
fn duration_in(s: &str, unit: Duration, bare: &str) -> Result<Duration, String> {
    let t = s.trim();
    let not = || format!("{s:?} is not a duration: give {bare}, or a number with its unit (250ms, 2s, 1m)");
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, Duration::from_millis(1))
    } else if let Some(n) = t.strip_suffix('s') {
        (n, Duration::from_secs(1))
    } else if let Some(n) = t.strip_suffix('m') {
        (n, Duration::from_mins(1))
    } else {
        (t, unit)
    };
    let n: u32 = number.trim().parse().map_err(|_| not())?;
    scale.checked_mul(n).ok_or_else(not)
}

/// Smallest and largest `--max-connections` / `--max-clients`.
pub(crate) const MAP_SIZE_RANGE: std::ops::RangeInclusive<u32> = 1024..=16_777_216;

/// `--max-connections`, `--max-clients`: a map size within [`MAP_SIZE_RANGE`].
pub(crate) fn parse_map_size(s: &str) -> Result<u32, String> {
    let n: u32 =
        s.trim().replace('_', "").parse().map_err(|_| format!("{s:?} is not a number of entries: give e.g. 262144"))?;
    if !MAP_SIZE_RANGE.contains(&n) {
        return Err(format!(
            "{n} entries is out of range: give {} to {}",
            MAP_SIZE_RANGE.start(),
            MAP_SIZE_RANGE.end()
        ));
    }
    Ok(n)
}

/// A network namespace for `--netns`: an `ip netns` name or a path to a
/// namespace file (/proc/PID/ns/net).
pub(crate) fn parse_netns(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() || name.trim_matches('/').is_empty() {
        return Err("empty namespace: give a name from `ip netns list` or a path such as /proc/PID/ns/net".into());
    }
    if !name.contains('/') && (name == "." || name == ".." || name.chars().any(char::is_control)) {
        return Err(format!("{name:?} is not a namespace name: give a name from `ip netns list`"));
    }
    Ok(name.to_owned())
}

/// A duration in milliseconds within `[min_ms, max_ms]`.
pub(crate) fn parse_millis(s: &str, min_ms: u64, max_ms: u64) -> Result<Duration, String> {
    let d = duration_in(s, Duration::from_millis(1), "milliseconds, e.g. 2000")?;
    let ms = d.as_millis() as u64;
    if !(min_ms..=max_ms).contains(&ms) {
        return Err(format!("{ms} ms is out of range: give {min_ms} to {max_ms} ms"));
    }
    Ok(d)
}

/// `--handshake-window`: 0 (measured) or 1 to 2000 ms.
pub(crate) fn parse_handshake_window(s: &str) -> Result<Duration, String> {
    if duration_in(s, Duration::from_millis(1), "milliseconds").is_ok_and(|d| d.is_zero()) {
        return Ok(Duration::ZERO);
    }
    parse_millis(s, 1, 2000).map_err(|e| format!("{e} (or 0 for the default, about 8 ms)"))
}

/// A latency percentile (1-99).
pub(crate) fn parse_percentile(s: &str) -> Result<u8, String> {
    let p: u8 = s
        .trim()
        .trim_start_matches('p')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentile: give 1 to 99, e.g. 90"))?;
    if !(1..=99).contains(&p) {
        return Err(format!("percentile {p} is out of range: give 1 to 99"));
    }
    Ok(p)
}

/// `on`/`off` switch (for `set --dry-run on|off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switch(pub bool);

impl FromStr for Switch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "on" | "true" | "yes" | "1" => Ok(Self(true)),
            "off" | "false" | "no" | "0" => Ok(Self(false)),
            _ => Err(format!("{s:?} is not a switch: give on or off")),
        }
    }
}

/// Interface names as the kernel accepts them (IFNAMSIZ - 1 bytes, no '/' or whitespace).
pub(crate) fn parse_interface(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 15 || s.contains(['/', ' ', '\t', '\n', '\0']) || s == "." || s == ".." {
        return Err(format!("{s:?} is not a valid interface name (1-15 characters, no '/' or spaces)"));
    }
    Ok(s.to_owned())
}

/// A clap parser for a [`Named`] option: its names as the possible values
/// (with help, for `--help`, completions and man pages).
pub(crate) fn named<T: Named>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(T::ALL.iter().map(|v| PossibleValue::new(v.name()).help(v.help())))
        .map(|name| T::from_name(&name).expect("clap accepted one of the names"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::options::{Action, Count};
    use proptest::prelude::*;

    #[test]
    fn ports() {
        assert_eq!(parse_port("8080"), Ok(8080));
        assert_eq!(parse_port("65535"), Ok(65535));
        assert!(parse_port("0").unwrap_err().contains("port 0"));
        assert!(parse_port("65536").unwrap_err().contains("out of range"));
        assert!(parse_port("http").unwrap_err().contains("not a port"));
        assert!(parse_port("-1").is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("1"), Ok(1));
        assert_eq!(parse_limit(&MAX_LIMIT.to_string()), Ok(MAX_LIMIT));
        assert!(parse_limit("0").unwrap_err().contains("limit 0"));
        assert!(parse_limit(&(u64::from(MAX_LIMIT) + 1).to_string()).unwrap_err().contains("maximum"));
        assert!(parse_limit("lots").is_err());
    }

    #[test]
    fn heal_intervals_and_map_sizes() {
        assert_eq!(parse_seconds("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_seconds("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_seconds("0").unwrap_err().contains("1 to 3600"));
        assert!(parse_seconds("3601").unwrap_err().contains("out of range"));
        assert!(parse_seconds("soon").unwrap_err().contains("seconds"));
        // The same forms as every duration: a unit of its own, converted.
        assert_eq!(parse_seconds("2m"), Ok(Duration::from_mins(2)));
        assert_eq!(parse_seconds("5000ms"), Ok(Duration::from_secs(5)));
        assert!(parse_seconds("1500ms").unwrap_err().contains("whole seconds"));
        assert_eq!(parse_map_size("262144"), Ok(262_144));
        assert_eq!(parse_map_size("1_024"), Ok(1024));
        assert!(parse_map_size("1023").unwrap_err().contains("1024 to 16777216"));
        assert!(parse_map_size("16777217").unwrap_err().contains("out of range"));
        assert!(parse_map_size("-5").unwrap_err().contains("not a number"));
    }

    #[test]
    fn switches_and_interfaces() {
        assert_eq!("on".parse::<Switch>(), Ok(Switch(true)));
        assert_eq!("OFF".parse::<Switch>(), Ok(Switch(false)));
        assert!("maybe".parse::<Switch>().is_err());
        assert!(parse_interface("veth0").is_ok());
        assert!(parse_interface("a-very-long-interface").is_err());
        assert!(parse_interface("a/b").is_err());
        assert!(parse_interface("").is_err());
        assert!(parse_interface("abcdefghijklmno").is_ok(), "15 characters fit");
        assert!(parse_interface("abcdefghijklmnop").is_err(), "16 do not");
        assert!(parse_interface(".").is_err() && parse_interface("..").is_err());
    }

    #[test]
    fn namespaces_are_a_name_or_a_path() {
        assert_eq!(parse_netns(" blue "), Ok("blue".to_owned()));
        assert_eq!(parse_netns("/proc/1/ns/net"), Ok("/proc/1/ns/net".to_owned()));
        assert_eq!(parse_netns("./ns"), Ok("./ns".to_owned()), "a relative path");
        for empty in ["", "  ", "/", "//"] {
            assert!(parse_netns(empty).unwrap_err().contains("empty namespace"), "{empty:?}");
        }
        for bad in [".", "..", "a\tb", "x\u{7f}"] {
            assert!(parse_netns(bad).unwrap_err().contains("is not a namespace name"), "{bad:?}");
        }
    }

    #[test]
    fn millis() {
        assert_eq!(parse_millis("2000", 100, 60_000), Ok(Duration::from_secs(2)));
        assert_eq!(parse_millis("250ms", 100, 60_000), Ok(Duration::from_millis(250)));
        assert!(parse_millis("5", 100, 60_000).is_err());
        assert_eq!(parse_millis("2s", 100, 60_000), Ok(Duration::from_secs(2)));
        assert_eq!(parse_millis("1m", 100, 60_000), Ok(Duration::from_mins(1)));
        assert!(parse_millis("2m", 100, 60_000).unwrap_err().contains("120000 ms is out of range"));
        assert!(parse_millis("2h", 100, 60_000).unwrap_err().contains("a number with its unit"));
        assert!(parse_millis("-5ms", 1, 60_000).is_err());
        assert_eq!(parse_handshake_window("0"), Ok(Duration::ZERO), "0: follow the measurement");
        assert_eq!(parse_handshake_window("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_handshake_window("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_handshake_window("2000ms"), Ok(Duration::from_secs(2)));
        let e = parse_handshake_window("2001").unwrap_err();
        assert!(e.contains("out of range") && e.contains("or 0"), "{e}");
        assert!(parse_handshake_window("soon").is_err());
    }

    #[test]
    fn client_caps_and_prefixes() {
        assert_eq!(parse_client_cap("0"), Ok(0));
        assert_eq!(parse_client_share("0"), Ok(0));
        assert_eq!(parse_client_share("50%"), Ok(50));
        assert_eq!(parse_client_share("100"), Ok(100));
        assert!(parse_client_share("101").unwrap_err().contains("0 to 100"));
        assert!(parse_client_share("half").is_err());
        assert_eq!(parse_client_cap("20"), Ok(20));
        assert!(parse_client_cap("-1").is_err());
        assert!(parse_client_cap("99999999").unwrap_err().contains("client cap"));
        assert_eq!(parse_prefix_v6("/64"), Ok(64));
        assert!(parse_prefix_v6("0").is_err());
        assert!(parse_prefix_v6("129").is_err());
    }

    #[test]
    fn percentiles() {
        assert_eq!(parse_percentile("90"), Ok(90));
        assert_eq!(parse_percentile("p99"), Ok(99));
        assert!(parse_percentile("0").is_err());
        assert!(parse_percentile("100").is_err());
        for c in [Count::Work, Count::Connections, Count::Multiplexed] {
            assert_eq!(Count::from_raw(c.to_raw()), c);
        }
    }

    #[test]
    fn action_round_trips() {
        for a in [Action::Drop, Action::Rst] {
            assert_eq!(Action::from_raw(a.to_raw()), a);
        }
    }

    proptest! {
        #[test]
        fn port_parse_accepts_exactly_1_to_65535(n in 0u32..200_000) {
            prop_assert_eq!(parse_port(&n.to_string()).is_ok(), (1..=65535).contains(&n));
        }

        #[test]
        fn limit_parse_accepts_exactly_1_to_max(n in 0u64..(2 * u64::from(MAX_LIMIT))) {
            prop_assert_eq!(parse_limit(&n.to_string()).is_ok(), (1..=u64::from(MAX_LIMIT)).contains(&n));
        }
    }
}
