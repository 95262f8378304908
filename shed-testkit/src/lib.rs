// SPDX-License-Identifier: MIT OR Apache-2.0
//! What shed's integration tests, benchmarks and demo share, kept out of the
//! shipped library: throwaway network namespaces with backends and clients
//! ([`testbed`]), a fleet behind HAProxy ([`fleet`]), a link with a round-trip time ([`delay`]), a private container
//! runtime with pod sandboxes ([`cri`]), a memory cgroup of a container's limit ([`cgroup`]), the reference model of the SYN policy ([`model`]), one
//! frame builder ([`frames`]), one launcher for the real `shedctl` ([`gate`]),
//! a reader of its Prometheus endpoint ([`metrics`]), and real servers
//! that read every request at once ([`servers`]).

pub mod cgroup;
pub mod cri;
pub mod delay;
pub mod docs;
pub mod fleet;
pub mod frames;
pub mod gate;
pub mod kept;
pub mod metrics;
pub mod model;
pub mod servers;
pub mod testbed;
