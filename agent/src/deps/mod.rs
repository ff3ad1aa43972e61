//! The target side of a cross-node dependency: `drover-dep@UNIT` units that
//! other nodes' proxies need started here.
//!
//! * [`dep_unit`] — `StartDep` / `StopDep`: start the dep unit, wait for its
//!   job's end, explain a failure in one line.
//! * [`unit_fence`] — the fence between the unit stream and a `StartDep`
//!   reply: the reply never overtakes the target's unit news that systemd
//!   sent before the dep's job ended.
//! * [`job_waiters`] — one-shot waiters keyed by systemd job path, used by
//!   both.
//!
//! The requesting side (proxies) is `crate::proxies`.

pub mod dep_unit;
pub mod job_waiters;
pub mod unit_fence;
