//! The node's systemd, behind a narrow trait of our own.
//!
//! * [`api`] — the [`api::Systemd`] trait and the types it speaks (job and
//!   unit signals, job info): everything the rest of the agent is written
//!   against, and all it may import from here.
//! * [`dbus`] — the real systemd over zbus, with `#[zbus::proxy]` traits for
//!   systemd's interfaces; errors keep systemd's D-Bus names.
//! * [`unit_stream`] — the real unit stream: match rules for what is
//!   followed, merged in the connection's order, switched at a snapshot.
//! * `fake` — an in-memory stand-in for unit tests (test builds only).
//!
//! Declarations only: the children import each other's items from their
//! defining files (`dbus` and `fake` from `api`), never through here.

pub mod api;
pub mod dbus;
#[cfg(test)]
pub mod fake;
pub mod unit_stream;
