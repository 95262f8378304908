//! Shared helpers of the integration tests.
#![allow(dead_code, reason = "each test binary uses a different part")]

pub mod frames;
pub mod gate;
pub mod outside;
