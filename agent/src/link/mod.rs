//! The link to the manager: the parts the rest of the agent holds.
//!
//! The loop that drives the link — connect, handshake, serve a session,
//! reconnect — is [`crate::connection`], one level up beside the other
//! drivers: it imports the shared state and the dispatcher, and they import
//! these parts, so nothing in this folder imports anything outside it but
//! [`crate::notify`] (imports run one way; the house test checks it).
//!
//! * [`follow`] — which manager of a list the agent obeys: the welcome
//!   with the highest leadership epoch, never a lower one than it has seen.
//! * [`heartbeat`] — the heartbeat interval and silence threshold of a
//!   session, negotiated with what the manager announces.
//! * [`outbox`] — the only way to the manager: bounded, never blocking,
//!   drops what belongs to a session that is gone, kills a session whose
//!   manager stopped reading.
//! * [`status`] — the link's state as the local API shows it (online,
//!   last seen, controller address, log settings).
//! * [`target`] — where the link dials, switchable at run time
//!   (`SwitchController`).
//! * [`tls`] — the agent's TLS settings: loaded and checked at start, read
//!   again on `SIGHUP` for the next dial.
//! * [`random_u64`] — the draw behind the link's jitter and heartbeat slot.

pub mod follow;
pub mod heartbeat;
pub mod outbox;
pub mod status;
pub mod target;
pub mod tls;

use std::hash::{BuildHasher, RandomState};

/// A number that differs between agents, sessions and calls, for the
/// link's spreading draws (the reconnect back-off's jitter, the heartbeat
/// slot, the resync timer's jitter). They need no unpredictability, only
/// difference: std's randomly keyed hasher is enough.
pub fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::Instant::now())
}
