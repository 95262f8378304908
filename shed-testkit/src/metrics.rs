// SPDX-License-Identifier: MIT OR Apache-2.0
//! Reading a running gate's Prometheus endpoint.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

/// One HTTP GET; returns the status line and the body.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    http_get_with(addr, path, &[])
}

/// [`http_get`] with extra header lines (`"Authorization: Bearer x"`).
pub fn http_get_with(addr: &str, path: &str, headers: &[&str]) -> (String, String) {
    let mut conn = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).expect("connect metrics");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let extra: String = headers.iter().flat_map(|h| [*h, "\r\n"]).collect();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a header and a body");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// `/metrics` at `addr`, parsed.
pub fn scrape(addr: &str) -> prometheus_parse::Scrape {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text format")
}

/// The value of the one series named `metric` whose labels include `labels`.
pub fn value(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(matching.len(), 1, "one series {metric}{labels:?}, found {}", matching.len());
    match &matching[0].value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        other => panic!("{metric} is not a number: {other:?}"),
    }
}
