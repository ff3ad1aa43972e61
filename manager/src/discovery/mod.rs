//! Discovery: where a unit runs, and what is taken out of service
//! (docs/discovery.md).
//!
//! * [`drain`] — drained nodes and units, kept across restarts in the
//!   manager's state directory.

pub mod drain;
