// SPDX-License-Identifier: MIT OR Apache-2.0
//! shed's userspace library, in layers; each imports only the layers above
//! it in this list, never one below:
//!
//! - [`host`]: facts about the machine: privileges, namespaces, interfaces,
//!   BTF, sock_diag, where the gate keeps its files;
//! - [`kernel`]: the kernel object, its programs and typed maps, and the
//!   options they hold (action, hook, count, client networks);
//! - [`control`]: the controllers, pure: one window's figures in, a limit out;
//! - [`daemon`]: the loop that owns a gate: windows, healing, audit, the lock;
//! - [`observe`]: what operators read: stats, Prometheus, `top`, tables;
//! - [`cli`]: `shedctl`'s command line, config file and verbs (the only layer
//!   that knows clap).
//!
//! [`error`] and `named` are leaves every layer may use.

pub mod cli;
pub mod control;
pub mod daemon;
pub mod error;
pub mod host;
pub mod kernel;
pub(crate) mod named;
pub mod observe;

pub use error::Error;
