//! What the core puts on the bus, as an interface: property changes, the
//! controller's job signals, the job and metrics objects that come and go,
//! and the metrics signals.
//!
//! The D-Bus layer implements it ([`crate::api::outbound::BusOutbound`]); the
//! core and [`crate::metrics`] call it and never name a D-Bus object, so the
//! API's objects import the core while the core imports none of them.
//!
//! Invariants: every method is best effort and logs its own failures (a
//! signal that cannot be sent must not fail the transition that caused it),
//! except [`Outbound::serve_metrics`], whose failure `EnableMetrics` reports.
//! Calls made in order reach the bus in that order: implementations send
//! before they return.

use crate::jobs::JobInfo;
use drover_protocol::NodeName;
use futures::future::BoxFuture;
use zbus::OwnedObjectPath;

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

    /// Exports the `Node` object of a node that became known while running
    /// (a certified node's first registration).
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
