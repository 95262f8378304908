// SPDX-License-Identifier: MIT OR Apache-2.0
//! The kernel side as userspace holds it: the embedded object and how it is
//! loaded ([`object`]), its programs and where they attach ([`programs`]),
//! the typed maps, pinned or fresh ([`maps`]), and the options the maps hold
//! ([`options`]), and a node agent's one set of socket-tracepoint programs
//! for all its pods' gates ([`dispatch`]), which a restarting agent leaves
//! judging for its successor ([`handover`]).

pub mod dispatch;
pub mod handover;
pub mod maps;
pub mod object;
pub mod options;
pub mod programs;
