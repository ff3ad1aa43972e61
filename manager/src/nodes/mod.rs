//! The agents' side of the manager: where their connections come from
//! ([`listener`]), one connected agent ([`session`]), and the node table with
//! its admission rules ([`registry`]).

pub mod listener;
pub mod registry;
pub mod session;
