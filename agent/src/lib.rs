//! drover-agent: runs on every node, drives that node's systemd over D-Bus and
//! keeps a link to the drover manager.
//!
//! # Layout, and why
//!
//! The agent has two outside worlds — the node's systemd and the manager —
//! and one rule between them: **local work never waits for the network**.
//! Imports run one way, from the drivers at the top, through the shared
//! state, to the parts and the systemd boundary at the bottom. A folder
//! counts as one unit for this rule: it holds parts or drives them, never
//! both, so [`link`] holds the link's parts and its driver, [`connection`],
//! sits at the top beside [`dispatch`] (the house test checks both levels).
//!
//! Drivers:
//! * [`agent`] — wires the rest together; [`cli`] — arguments, config,
//!   logging, signals for the thin binary; [`notify`] — what systemd hears
//!   (`READY=1`, `STATUS=` as the link changes, `WATCHDOG=1`, `RELOADING=1`).
//! * [`connection`] — the link to the manager: TCP connect, handshake,
//!   heartbeats, silence threshold, reconnect with jittered backoff.
//! * [`dispatch`] — one manager request → one systemd call → exactly one
//!   reply; [`node_api`] — the rest of the node API (unit properties, unit
//!   files, kill, freeze, log level, metrics), validated before systemd sees
//!   it; `drover_bus::marshal` converts D-Bus values to and from the
//!   protocol's `Marshalled`.
//! * [`fanout`] — the systemd event fan-out: the job stream to the dep
//!   waiters, the early start and the job tracker; the unit stream to the
//!   unit hub and the unit fence.
//! * [`api`] — the local `org.eclipse.bluechi.Agent` D-Bus API the proxy
//!   helper calls.
//! * [`exposition`] — the agent's own Prometheus `/metrics`
//!   (`MetricsListenAddress=`, off by default), served by `drover-metrics`.
//!
//! State: [`state::Shared`] gathers the parts below in one `Arc`.
//!
//! Parts:
//! * [`stats`] — the Prometheus figures kept as things happen (health check
//!   runs, jobs, the link's sessions).
//! * [`link`] — what the rest holds of the link: [`link::outbox`], the
//!   only way to the manager — bounded, never blocking, drops what belongs
//!   to a session that is gone, kills a session whose manager stopped
//!   reading; [`link::status`], the link as the local API shows it;
//!   [`link::target`], where it dials; [`link::heartbeat`] and
//!   [`link::tls`], the settings a session runs with.
//! * [`jobs`] — systemd job path ↔ manager job id; with [`early_events`],
//!   the buffering that makes a fast job's removal, arriving before
//!   `StartUnit` returns, impossible to lose.
//! * [`units`] — unit subscriptions of the manager: [`units::hub`] (sessions,
//!   lazy stream start, send order) and [`units::rules`] (virtual replay,
//!   real events with modification tags, daemon-reload settling).
//! * [`proxies`] — the requesting side of cross-node dependencies:
//!   [`proxies::registry`], the proxies of this node on units of other nodes
//!   (the state behind `drover-proxy@.service`), and
//!   [`proxies::early_start`], announcing a proxy as soon as its unit's start
//!   job runs.
//! * [`deps`] — the target side: [`deps::dep_unit`], `drover-dep@` units for
//!   other nodes' proxies on units here, waiting for job ends through
//!   [`deps::job_waiters`] and [`deps::unit_fence`].
//! * [`health`] — the checks units declare in `[X-Drover]` and the node's
//!   own health: [`health::table`] (state, what the manager was told),
//!   [`health::machine`] (the pure state machine); its driver,
//!   [`health::driver`], runs the checks and sends verdicts in the order of
//!   the unit events, and [`health::api`] takes pushed reports.
//!
//! Boundary:
//! * [`systemd`] — the narrow [`systemd::api::Systemd`] trait the rest is
//!   written against; [`systemd::dbus`] implements it over zbus,
//!   `systemd::fake` (test builds only) in memory for unit tests. systemd errors keep their
//!   D-Bus names.
//!
//! Sessions: every accepted handshake starts a new session number (`epoch`).
//! Requests, replies and job events carry the session they belong to; when a
//! link drops, what the old session still produces is dropped, because the
//! manager has already failed its requests and ended its jobs as
//! `disconnected` (docs/dev/architecture.md, "Jobs").
//!
//! Unit tests share one rig (`test_rig`, test builds only): a fake systemd,
//! the state, a dispatcher and an open session.

pub mod agent;
pub mod api;
pub mod caller;
pub mod cli;
pub mod connection;
pub mod deps;
pub mod dispatch;
pub mod early_events;
pub mod exposition;
pub mod fanout;
pub mod health;
pub mod jobs;
pub mod link;
pub mod node_api;
pub mod notify;
pub mod own_units;
pub mod proxies;
pub mod state;
pub mod stats;
pub mod systemd;
pub mod units;

#[cfg(test)]
mod test_rig;
