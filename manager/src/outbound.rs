//! What the manager's parts put on the bus, as an interface: property
//! changes, the controller's job signals, the node, job and metrics objects
//! that come and go, and the metrics signals; and the [`Port`] they reach it
//! through.
//!
//! The D-Bus layer implements it ([`crate::api::outbound::BusOutbound`]); the
//! node lifecycle ([`crate::nodes::lifecycle`]), the job runner
//! ([`crate::job_runner`]) and [`crate::metrics`] call it and never name a
//! D-Bus object, so the API's objects import those parts while they import
//! none of the objects.
//!
//! Invariants: every method is best effort and logs its own failures (a
//! signal that cannot be sent must not fail the transition that caused it),
//! except [`Outbound::serve_metrics`], whose failure `EnableMetrics` reports.
//! Calls made in order reach the bus in that order: implementations send
//! before they return. Every node object is exported through
//! [`Outbound::export_node`], the one way a node reaches the bus, so the
//! object tree `Introspect` describes (`crate::api::tree`) always names every
//! node `GetNode` answers for.

use crate::jobs::JobInfo;
use drover_protocol::NodeName;
use futures::future::BoxFuture;
use std::sync::{Arc, OnceLock};
use zbus::OwnedObjectPath;

/// Where the parts find the [`Outbound`]: empty until the API is served (and
/// in unit tests), then set once. Until then nothing is emitted.
#[derive(Default)]
pub struct Port {
    outbound: OnceLock<Arc<dyn Outbound>>,
}

impl Port {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Points the port at `outbound` (once; later calls are ignored).
    pub fn set(&self, outbound: Arc<dyn Outbound>) {
        let _ = self.outbound.set(outbound);
    }

    /// The outbound, once the API is served.
    pub fn get(&self) -> Option<&Arc<dyn Outbound>> {
        self.outbound.get()
    }
}

pub trait Outbound: Send + Sync + 'static {
    /// `PropertiesChanged` of one string property (`Node.Status`,
    /// `Controller.Status`, `Job.State`).
    fn property_changed<'a>(
        &'a self,
        path: &'a str,
        interface: &'static str,
        property: &'static str,
        value: &'a str,
    ) -> BoxFuture<'a, ()>;

    /// Exports the `Node` object of `node` at `path`: every node the manager
    /// knows, at start and whenever one becomes known (a reload that lists
    /// it, the first registration of a node admitted by a pattern or its
    /// certificate).
    fn export_node<'a>(
        &'a self,
        node: &'a NodeName,
        path: &'a OwnedObjectPath,
    ) -> BoxFuture<'a, ()>;

    /// Exports the `Job` object of `job` at `path`.
    fn export_job<'a>(&'a self, job: &'a JobInfo, path: &'a OwnedObjectPath) -> BoxFuture<'a, ()>;

    /// `Controller.JobNew`.
    fn job_new<'a>(&'a self, id: u32, path: &'a OwnedObjectPath) -> BoxFuture<'a, ()>;

    /// `Controller.JobRemoved`, then the job's object goes (if it was
    /// exported).
    fn job_removed<'a>(
        &'a self,
        job: &'a JobInfo,
        path: &'a OwnedObjectPath,
        result: &'a str,
    ) -> BoxFuture<'a, ()>;

    /// Serves the `Metrics` object (`on`) or takes it off the bus.
    fn serve_metrics(&self, on: bool) -> BoxFuture<'_, zbus::Result<()>>;

    /// `Metrics.StartUnitJobMetrics(node, job path, unit, gross µs, net µs)`.
    fn start_unit_job_metrics<'a>(
        &'a self,
        node: &'a str,
        job: &'a str,
        unit: &'a str,
        gross_micros: u64,
        net_micros: u64,
    ) -> BoxFuture<'a, ()>;

    /// `Metrics.AgentJobMetrics(node, unit, method, µs)`.
    fn agent_job_metrics<'a>(
        &'a self,
        node: &'a str,
        unit: &'a str,
        method: &'a str,
        micros: u64,
    ) -> BoxFuture<'a, ()>;
}
