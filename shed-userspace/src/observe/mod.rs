// SPDX-License-Identifier: MIT OR Apache-2.0
//! What operators read of a running gate: `stats` (one port's figures from
//! a map snapshot, for `stats`, `top` and the metrics), `metrics`
//! (Prometheus), `endpoint` (the HTTP server: /metrics, /healthz,
//! /readyz), [`report`] (what the daemon's loops publish for the endpoint),
//! `top` and `table` (terminal views), [`vocabulary`] (one name per
//! setting and counter everywhere), and `agent` (a load balancer's weight,
//! `--agent-port`).

pub(crate) mod agent;
pub(crate) mod endpoint;
pub(crate) mod metrics;
pub mod report;
pub(crate) mod stats;
pub(crate) mod table;
pub(crate) mod top;
pub mod vocabulary;

/// A lock whose holder panicked still guards usable data (counters, a
/// history, weights): every reader of the daemon's shared figures takes it so.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
