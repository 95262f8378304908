// SPDX-License-Identifier: MIT OR Apache-2.0
//! One module per `shedctl` verb, each with an `execute` function.
pub mod attach;
pub mod config_save;
pub mod detach;
pub mod docs;
pub mod pods;
pub mod reload;
pub mod set;
pub mod stats;
pub mod tier;
pub mod top;
