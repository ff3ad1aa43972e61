//! The agents' side of the manager: where their connections come from
//! ([`listener`]), one connected agent ([`session`]) and how its frames are
//! read ([`frames`]) and when its socket last received data ([`arrival`]),
//! the node table with its admission rules ([`registry`]), and a node's
//! life from hello to disconnect with its announcements ([`lifecycle`]);
//! what an unauthenticated connection may cost, who gives way when the
//! manager is full, and how refusals are logged ([`gate`]); in which order
//! waiting connections are let in ([`lobby`]); what the links count for
//! the metrics ([`link_stats`]); systemd's `SystemState` as a fixed set
//! ([`system_state`]).

pub mod arrival;
pub mod frames;
pub mod gate;
pub mod lifecycle;
pub mod link_stats;
pub mod listener;
pub mod lobby;
pub mod registry;
pub mod session;
pub mod system_state;
