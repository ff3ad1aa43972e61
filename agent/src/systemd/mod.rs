//! The node's systemd, behind a narrow trait of our own.
//!
//! * [`api`] — the [`api::Systemd`] trait and the types it speaks (job and
//!   unit signals, job info): everything the rest of the agent is written
//!   against, and all it may import from here.
//! * [`dbus`] — the real systemd over zbus, with `#[zbus::proxy]` traits for
//!   systemd's interfaces; errors keep systemd's D-Bus names.
//! * [`errors`] — the errors of calls to systemd, as the manager forwards them.
//! * [`signals`] — systemd's signals: their match rules, who may send them,
//!   what a message says (the job stream's and the unit stream's).
//! * [`unit_stream`] — the real unit stream: match rules for what is
//!   followed, merged in the connection's order, switched at a snapshot.
//! * `fake` — an in-memory stand-in for unit tests (test builds only).
//!
//! Declarations only: the children import each other's items from their
//! defining files (`dbus` and `fake` from `api`), never through here.

pub mod api;
pub mod dbus;
pub mod errors;
#[cfg(test)]
pub mod fake;
pub mod signals;
pub mod unit_stream;
