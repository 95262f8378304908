//! shed's userspace library: loading and attaching the kernel programs,
//! reading and tuning the pinned maps, and the daemon that owns them.
//!
//! The `shedctl` binary is a thin layer over this crate; the integration
//! tests drive the same functions.

pub mod audit;
pub mod btf;
pub mod cli;
pub mod commands;
pub mod config;
pub mod control;
pub mod daemon;
pub mod endpoint;
pub mod error;
pub mod gate;
pub mod heal;
pub mod input;
pub mod maps;
pub mod metrics;
pub mod model;
pub mod object;
pub mod paths;
pub mod sim;
pub mod sockdiag;
pub mod stats;
pub mod system;
pub mod table;
pub mod testbed;
pub mod tiers;
pub mod top;
pub mod vocabulary;

pub use error::Error;
