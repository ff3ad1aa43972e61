//! Unit subscriptions of the manager on this node.
//!
//! * [`hub`] — the [`hub::UnitHub`]: sessions, the start of the unit
//!   signal stream, the send order, sending through the outbox.
//! * [`fault`] — a test knob (debug builds only) that drops one event, for
//!   the resync tests.
//! * [`following`] — what the unit stream follows: the watched units and
//!   those held for a subscription on its way or a dep start; plain
//!   bookkeeping around one call to systemd per change.
//! * [`resync`] — the periodic digest of what the manager holds for this
//!   node, and the snapshot the manager asks for when it does not match.
//! * [`rules`] — what each systemd unit signal means for the manager: the
//!   cache of loaded units, virtual replay, real events, daemon-reload
//!   settling and modification tags; plain data, no I/O.
//!
//! The unit signal stream itself is read by `crate::fanout`, which hands
//! each signal to the hub and the job ones to the unit fence.

pub mod fault;
pub mod following;
pub mod hub;
pub mod resync;
pub mod rules;
