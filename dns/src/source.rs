//! Where answers come from: the [`Source`] trait (the manager's
//! `io.drover.Controller.Where`, asked with `healthy=true`), and the rows it
//! gives. The D-Bus implementation is [`crate::feed`]; unit tests use a fake.

use std::future::Future;

/// One node of a `Where` answer: only what DNS needs of the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The node's name as the manager knows it.
    pub node: String,
    /// The node's address as the manager reports it (`AdvertiseAddress=` or
    /// the agent's peer address); `""` when unknown: such a row gives no
    /// A/AAAA record.
    pub address: String,
    /// `[X-Drover]` ports: `("", port)` for `Port=`, `(name, port)` for `Ports=`.
    pub ports: Vec<(String, u16)>,
}

/// One answer of the source for one unit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub rows: Vec<Row>,
    /// False while the manager is warming up: missing rows may only be late.
    pub complete: bool,
}

/// Why the source gave no answer: the manager is unreachable, refused or
/// answered something this program does not understand. Every failure is
/// treated alike (serve stale, else SERVFAIL); the text is for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// The nodes where a unit is active and healthy.
pub trait Source: Send + Sync + 'static {
    /// `Where(unit, {healthy: true})`.
    fn lookup(&self, unit: &str) -> impl Future<Output = Result<Answer, SourceError>> + Send;
}
