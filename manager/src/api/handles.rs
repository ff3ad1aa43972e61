//! [`Handles`]: the parts of the manager the D-Bus objects work with, as
//! the composition root hands them over ([`crate::server`]). Each object
//! takes only its share when it is made; [`crate::api::outbound::BusOutbound`]
//! and [`crate::api::monitor::MonitorExport`] hold the handles weakly to make
//! the objects that come and go.

use crate::discovery::Discovery;
use crate::discovery::drain::Drained;
use crate::fanout::limit::FleetCalls;
use crate::job_runner::JobRunner;
use crate::logs::LogControl;
use crate::metrics::Metrics;
use crate::nodes::lifecycle::Nodes;
use crate::outbound::Port;
use crate::proxies::driver::Proxies;
use crate::reload::Reloader;
use crate::units::hub::Subscriptions;
use crate::units::monitor::Monitors;
use std::sync::Arc;
use std::time::Duration;

/// What the D-Bus objects work with; each object takes its share when it is
/// made.
pub struct Handles {
    pub nodes: Arc<Nodes>,
    pub jobs: Arc<JobRunner>,
    pub monitors: Arc<Monitors>,
    pub metrics: Arc<Metrics>,
    /// Where `EnableMetrics` serves the metrics object.
    pub outbound: Arc<Port>,
    pub proxies: Proxies,
    pub reloader: Arc<Reloader>,
    /// Unit and node health (`crate::units::hub`, `hub/health.rs`).
    pub subscriptions: Arc<Subscriptions>,
    /// The unit → nodes index (`Where`).
    pub discovery: Arc<Discovery>,
    pub log: Arc<LogControl>,
    /// Drained nodes and units (`io.drover.Controller.Drain`).
    pub drained: Arc<Drained>,
    /// `Controller.LogTarget`.
    pub log_target: &'static str,
    /// Per request to an agent.
    pub request: Duration,
    /// Per node in a fleet-wide fan-out (see [`crate::fanout`]).
    pub fanout: Duration,
    /// The most bytes a fleet-wide answer's body may take.
    pub fleet_answer: usize,
    /// How many fleet-wide lists run and wait (see [`crate::fanout::limit`]).
    pub fleet_calls: Arc<FleetCalls>,
    /// How many lists of one node run and wait (same module).
    pub node_lists: Arc<FleetCalls>,
}
