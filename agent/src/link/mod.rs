//! The link to the manager.
//!
//! * [`connection`] — connect, handshake, serve a session (reader, writer,
//!   heartbeats, one task per request), reconnect with jittered backoff.
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

pub mod connection;
pub mod heartbeat;
pub mod outbox;
pub mod status;
pub mod target;
pub mod tls;
