//! Health: whether this node's units (and the node) work, not only whether
//! they run (docs/health.md for users).
//!
//! * [`machine`] — the check state machine, pure (counters, start period,
//!   retries), held against the documented rules by a property test.
//! * [`table`] — every declared unit's state and what the manager was told;
//!   returns what to do, never does it.
//! * [`driver`] — reads declarations, runs checks, sends verdicts in the unit
//!   event order, asks systemd for `HealthOnFailure=`.
//! * [`exec`], [`probe`] — one run of `HealthCmd=` (as the unit's user, its
//!   own process group, a timeout), of `HealthTCP=` and `HealthHTTP=`.
//! * [`systemd`] — what health asks of systemd (unit files, `User=`,
//!   `SystemState`, restart/stop).
//! * [`api`] — `io.drover.Agent`: pushed health (`ReportHealth`).
//! * [`ports`] — the ports units declare, as told to the manager.
//! * [`lookups`] — units whose declaration is looked at, one at a time,
//!   while no unit declares health (the unit stream is off).
//!
//! The declarations themselves (keys, defaults, checks) are
//! `drover_config::health`; states and the wire are `drover_protocol::health`.

pub mod api;
pub mod driver;
pub mod exec;
pub mod lookups;
pub mod machine;
pub mod ports;
pub mod probe;
pub mod systemd;
pub mod table;
