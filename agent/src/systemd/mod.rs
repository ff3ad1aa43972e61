//! The node's systemd, behind a narrow trait of our own.
//!
//! * [`api`] — the [`api::Systemd`] trait and the types it speaks (job and
//!   unit signals, job info): everything the rest of the agent is written
//!   against, and all it may import from here.
//! * [`dbus`] — the real systemd over zbus, with `#[zbus::proxy]` traits for
//!   systemd's interfaces; errors keep systemd's D-Bus names.
//! * [`fake`] — an in-memory stand-in for unit tests.
//!
//! Declarations only: the children import each other's items from their
//! defining files (`dbus` and `fake` from `api`), never through here.

pub mod api;
pub mod dbus;
pub mod fake;
