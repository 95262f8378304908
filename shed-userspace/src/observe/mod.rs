// SPDX-License-Identifier: MIT OR Apache-2.0
//! What operators read of a running gate: `stats` (one port's figures from
//! a map snapshot, for `stats`, `top` and the metrics), `metrics`
//! (Prometheus), `endpoint` (the HTTP server: /metrics, /healthz,
//! /readyz), [`report`] (what the daemon's loops publish for the endpoint),
//! `top` and `table` (terminal views), and [`vocabulary`] (one name per
//! setting and counter everywhere).

pub(crate) mod agent;
pub(crate) mod endpoint;
pub(crate) mod metrics;
pub mod report;
pub(crate) mod stats;
pub(crate) mod table;
pub(crate) mod top;
pub mod vocabulary;
