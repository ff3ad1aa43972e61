//! `org.eclipse.bluechi.Node` at `/org/eclipse/bluechi/node/<escaped name>`.
//!
//! Exported for every allowed node, online or not. Calls on an offline node
//! fail with `org.eclipse.bluechi.Offline`; invalid unit names and job modes
//! fail with `InvalidArgs` before anything is sent to the agent; systemd's
//! errors from the node come back with their own names.

use crate::core::{Core, UnitTuple, units_of};
use crate::error::ApiError;
use crate::jobs::JobType;
use crate::registry::OFFLINE;
use drover_protocol::{NodeName, Request, Response};
use std::sync::Arc;
use zbus::OwnedObjectPath;
use zbus::interface;

pub struct NodeObject {
    core: Arc<Core>,
    name: NodeName,
}

impl NodeObject {
    pub fn new(core: Arc<Core>, name: NodeName) -> Self {
        Self { core, name }
    }

    async fn job(
        &self,
        name: &str,
        mode: &str,
        job_type: JobType,
    ) -> Result<OwnedObjectPath, ApiError> {
        self.core.start_job(&self.name, name, mode, job_type).await
    }
}

#[interface(name = "org.eclipse.bluechi.Node", introspection_docs = false)]
impl NodeObject {
    #[zbus(out_args("job"))]
    async fn start_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobType::Start).await
    }

    #[zbus(out_args("job"))]
    async fn stop_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobType::Stop).await
    }

    #[zbus(out_args("job"))]
    async fn restart_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobType::Restart).await
    }

    #[zbus(out_args("job"))]
    async fn reload_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobType::Reload).await
    }

    #[zbus(out_args("units"))]
    async fn list_units(&self) -> Result<Vec<UnitTuple>, ApiError> {
        let response = self
            .core
            .node_request(&self.name, Request::ListUnits)
            .await?;
        units_of(response)
    }

    /// systemd daemon-reload on the node.
    async fn reload(&self) -> Result<(), ApiError> {
        match self.core.node_request(&self.name, Request::Reload).await? {
            Response::Empty => Ok(()),
            _ => Err(ApiError::failed("unexpected reply from the agent")),
        }
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn name(&self) -> String {
        self.name.to_string()
    }

    /// `online` / `offline`; every transition is announced by the core.
    #[zbus(property)]
    fn status(&self) -> String {
        self.core
            .registry()
            .get(self.name.as_str())
            .map(|n| n.status())
            .unwrap_or(OFFLINE)
            .to_owned()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn peer_ip(&self) -> String {
        self.core
            .registry()
            .get(self.name.as_str())
            .map(|n| n.peer_ip().to_owned())
            .unwrap_or_default()
    }

    /// Realtime µs of the last frame from the node (registration or any
    /// later frame); kept after a disconnect; 0 if never seen.
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp(&self) -> u64 {
        self.last_seen().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp_monotonic(&self) -> u64 {
        self.last_seen().1
    }
}

impl NodeObject {
    fn last_seen(&self) -> (u64, u64) {
        self.core.registry().last_seen(self.name.as_str())
    }
}
