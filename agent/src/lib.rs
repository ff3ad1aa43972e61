//! drover-agent: runs on every node, drives that node's systemd over D-Bus and
//! keeps a link to the drover manager.
//!
//! # Layout, and why
//!
//! The agent has two outside worlds — the node's systemd and the manager —
//! and one rule between them: **local work never waits for the network**.
//!
//! * [`systemd`] — the narrow [`systemd::Systemd`] trait the rest is written
//!   against; [`systemd::dbus`] implements it over zbus, [`systemd::fake`] in
//!   memory for unit tests. systemd errors keep their D-Bus names.
//! * [`jobs`] — systemd job path ↔ manager job id; the buffering that makes a
//!   fast job's removal, arriving before `StartUnit` returns, impossible to lose.
//! * [`dispatch`] — one manager request → one systemd call → exactly one reply.
//! * [`outbox`] — the only way to the manager: bounded, never blocking, drops
//!   what belongs to a session that is gone, kills a session whose manager
//!   stopped reading.
//! * [`link`] — TCP connect, handshake, heartbeats, silence threshold,
//!   reconnect with jittered backoff.
//! * [`units`] — unit subscriptions of the manager: virtual replay, forwarding
//!   of real unit events with modification tags, per session.
//! * [`node_api`] — the rest of the node API (unit properties, unit files,
//!   kill, freeze, log level, metrics), validated before systemd sees it;
//!   `drover_bus::marshal` converts D-Bus values to and from the protocol's
//!   `Marshalled`.
//! * [`proxy`] — proxies of this node on units of other nodes (the state
//!   behind `drover-proxy@.service`); [`api`] — the local
//!   `org.eclipse.bluechi.Agent` D-Bus API the proxy helper calls;
//!   [`deps`] — `drover-dep@` units for other nodes' proxies on units here,
//!   waiting for job ends through [`waiters`] and [`news`].
//! * [`agent`] — wires the above together; [`cli`] — arguments, config,
//!   logging, signals, `sd_notify` for the thin binary.
//!
//! Sessions: every accepted handshake starts a new session number (`epoch`).
//! Requests, replies and job events carry the session they belong to; when a
//! link drops, what the old session still produces is dropped, because the
//! manager has already failed its requests and ended its jobs as
//! `disconnected` (docs/architecture.md, "Jobs").

pub mod agent;
pub mod ahead;
pub mod api;
pub mod cli;
pub mod deps;
pub mod dispatch;
pub mod jobs;
pub mod link;
pub mod news;
pub mod node_api;
pub mod outbox;
pub mod proxy;
pub mod systemd;
pub mod units;
pub mod waiters;
