//! drover-manager: tracks the nodes of a fleet and serves BlueChi's public
//! D-Bus API (`org.eclipse.bluechi`) for them.
//!
//! Two wires meet here. Agents connect over TCP with drover's own protocol
//! (`drover-protocol`); clients (droverctl, bluechictl, python-bluechi,
//! busctl) talk D-Bus. One folder per feature:
//!
//! * [`nodes`] — the agents' side: [`nodes::listener`] (where the TCP
//!   listener comes from, socket activation or bind, and the accept loop that
//!   survives descriptor exhaustion), [`nodes::session`] (one connected
//!   agent: reader/writer tasks, request ↔ reply correlation with timeouts,
//!   liveness, bounded outgoing queue), [`nodes::registry`] (the node table
//!   and its admission rules: allowed names, one live session per name, dead
//!   sessions replaced), [`nodes::lifecycle`] (a node's life in one place:
//!   admission, session end, its object and status on the bus, the
//!   heartbeat timer, and the manager's phase).
//! * [`units`] — units as clients see them: [`units::records`] (unit events
//!   and the last state of each watched unit with its modification tag, by
//!   the tag rules), [`units::hub`] (who watches which unit, what each agent
//!   was told, fan-out of unit events), [`units::monitor`] (monitors:
//!   subscriptions, peers, the snapshot + tagged stream of
//!   `io.drover.Monitor`), [`units::signals`] (their events as unicast
//!   D-Bus messages).
//! * [`proxies`] — cross-node dependencies: [`proxies::rules`] (reference
//!   sets per target unit and their rules — grace periods, permissions, dep
//!   units — as plain data) and [`proxies::driver`] (carries out what they
//!   decide).
//! * [`jobs`] — BlueChi jobs and the ordering rules that make every job end
//!   with exactly one `JobRemoved` (plain data); [`job_runner`] — what
//!   `StartUnit` & co do and what a job's events put on the bus;
//!   [`metrics`] — what the manager measures: BlueChi's D-Bus `Metrics`
//!   signals, the Prometheus counters kept as things happen, and the
//!   bounded `/metrics` endpoint (`MetricsListenAddress`).
//! * [`discovery`] — where units run and what is taken out of service:
//!   [`discovery::drain`] (drained nodes and units, kept in the state
//!   directory). [`warm_up`] — the window after a start in which a node's
//!   absence proves nothing (discovery's answers are incomplete, orphan-dep
//!   sweeps wait).
//! * [`root`] — the composition root: builds every part above from the
//!   configuration, hands each what it needs, and says what a node's life
//!   means for the others (online → subscriptions, proxies, metrics; ended →
//!   jobs end). The parts emit through [`outbound::Outbound`] and never name
//!   a D-Bus object.
//! * [`api`] — the D-Bus objects (Controller, Node, Job, Monitor, Metrics)
//!   over those parts, and [`api::outbound::BusOutbound`], the parts'
//!   outbound side on a bus connection.
//! * [`reload`] applies a reloaded config (SIGHUP, `io.drover.Controller.Reload`);
//!   [`notify`] — what the service manager hears (`READY=1`, `STATUS=`,
//!   `RELOADING=1`, `WATCHDOG=1`, `STOPPING=1`); [`logs`] — the log level in
//!   force; [`escape`] — node and job object paths as zbus values;
//!   [`error`] — BlueChi's error replies; [`heap`] — freed heap back to the
//!   kernel after a burst of connections.
//! * [`server`] — start/stop of a whole manager ([`tls`]: its TLS settings
//!   from the config, shared with [`reload`]); [`cli`] — the command line
//!   and the process around it (runtime, signals, `sd_notify`).
//!
//! Imports run one way, between files and between folders: `server` →
//! `root`, `api` → `reload`, `job_runner` → `proxies`, `units`, `metrics`
//! → `nodes`, `outbound` → `jobs`. What runs the other way goes through an interface
//! the receiver defines: sessions report to their owner (the lifecycle)
//! through [`nodes::session::SessionOwner`], the lifecycle tells the other
//! parts through [`nodes::lifecycle::Followers`], the parts emit through
//! [`outbound::Outbound`], monitors export their objects through
//! [`units::monitor::MonitorObjects`].
//!
//! What the manager shares with other processes lives outside it: the wire
//! and every cross-process rule in `drover-protocol`; BlueChi's and systemd's
//! D-Bus names, the bus choice, the `ListUnits` row and D-Bus value
//! marshalling in `drover-bus`.
//!
//! Why this shape: all logic that decides something (admission, job
//! ordering, status words) is plain data behind a mutex and is unit-tested
//! without sockets or a bus; the async parts only move messages and call it.
//!
//! Where drover deliberately differs from BlueChi (same signatures, other
//! behaviour):
//!
//! * `Controller.ListUnits` leaves out a node that fails or does not answer
//!   within the fan-out timeout (and logs it) instead of failing the whole
//!   call: one broken node should not blind an operator to the fleet. An
//!   answer that would not fit one D-Bus reply (32 MiB, the system bus's
//!   cap) is refused with `LimitsExceeded` as soon as that is certain,
//!   before the manager has gathered it all ([`fanout`]).
//! * Every job ends with exactly one `JobRemoved`: `disconnected` when its
//!   node's session ends, `cancelled due to shutdown` on SIGTERM (BlueChi
//!   drops jobs of a disconnected node silently).
//! * A job whose agent reported `JobDone` before the manager replied to
//!   `StartUnit` gets `JobNew` then `JobRemoved` before the method reply.
//! * `Job.Cancel` waits for the agent and returns its error, if any
//!   (BlueChi replies at once and only logs failures).
//! * `NodeHeartbeatThreshold` is honoured whenever it is > 0, and a dead
//!   session is replaced by a new registration instead of blocking it.

pub mod api;
pub mod cli;
pub mod discovery;
pub mod error;
pub mod escape;
pub mod fanout;
pub mod ha;
pub mod heap;
pub mod job_runner;
pub mod jobs;
pub mod logs;
pub mod metrics;
pub mod nodes;
pub mod notify;
pub mod outbound;
pub mod proxies;
pub mod reload;
pub mod root;
pub mod server;
pub mod tls;
pub mod units;
pub mod warm_up;

pub use crate::root::Timeouts;
pub use drover_bus::Bus;
pub use error::ApiError;
pub use server::{Manager, StartError};
