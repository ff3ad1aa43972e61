//! `org.eclipse.bluechi.Controller` at `/org/eclipse/bluechi`.

use crate::api::handles::Handles;
use crate::api::replies::{unit_files, units_of};
use crate::error::ApiError;
use crate::fanout;
use crate::fanout::limit::FleetCalls;
use crate::logs::LogControl;
use crate::metrics::Metrics;
use crate::nodes::lifecycle::Nodes;
use crate::nodes::session::Session;
use crate::outbound::Port;
use crate::units::monitor::Monitors;
use drover_bus::client::NodeTuple;
use drover_bus::systemd::UnitTuple;
use drover_config::LogLevel;
use drover_protocol::NodeName;
use drover_protocol::Response;
use drover_protocol::error_names::SERVICE_UNKNOWN;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use zbus::interface;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::Type;
use zbus::{Connection, ObjectPath, OwnedObjectPath};

/// One `ListNodes` row, `(soss)`: name, object path, status, peer IP. The
/// IP is read from the session when the reply is written, so a fleet's
/// rows cost one string each (the name) rather than three.
struct NodeRow {
    name: NodeName,
    path: OwnedObjectPath,
    status: &'static str,
    session: Option<Arc<Session>>,
}

impl Type for NodeRow {
    const SIGNATURE: &'static zbus::Signature = <NodeTuple>::SIGNATURE;
}

impl Serialize for NodeRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ip = self.session.as_deref().map_or("", Session::peer_ip);
        (self.name.as_str(), &self.path, self.status, ip).serialize(serializer)
    }
}

pub struct ControllerObject {
    nodes: Arc<Nodes>,
    monitors: Arc<Monitors>,
    metrics: Arc<Metrics>,
    outbound: Arc<Port>,
    log: Arc<LogControl>,
    log_target: &'static str,
    fanout: Duration,
    fleet_answer: usize,
    fleet_calls: Arc<FleetCalls>,
}

impl ControllerObject {
    pub fn new(handles: &Handles) -> Self {
        Self {
            nodes: handles.nodes.clone(),
            monitors: handles.monitors.clone(),
            metrics: handles.metrics.clone(),
            outbound: handles.outbound.clone(),
            log: handles.log.clone(),
            log_target: handles.log_target,
            fanout: handles.fanout,
            fleet_answer: handles.fleet_answer,
            fleet_calls: handles.fleet_calls.clone(),
        }
    }

    /// A fleet-wide list: every online node, at most
    /// [`crate::fanout::IN_FLIGHT`] at a time, all by one fan-out deadline.
    /// A node that fails or times out is left out of the answer and logged
    /// (BlueChi fails the whole call instead; one slow or broken node should
    /// not blind an operator to the rest of the fleet). An answer that would
    /// not fit one D-Bus reply is refused early: see [`crate::fanout`].
    ///
    /// Each caller waits its turn, and is refused over its share or when
    /// too many wait ([`crate::fanout::limit`]).
    async fn fleet_list<T: serde::Serialize + zbus::wire::Type>(
        &self,
        header: &Header<'_>,
        list: &fanout::FleetList,
        rows: fn(Response) -> Result<Vec<T>, ApiError>,
    ) -> Result<BTreeMap<String, Vec<T>>, ApiError> {
        self.nodes.serving()?;
        let client = header.sender().map(|s| s.as_str()).unwrap_or("");
        let _turn = self.fleet_calls.turn(client, list.method).await?;
        let sessions = self.nodes.sessions();
        fanout::gather(sessions, list, rows, self.fanout, self.fleet_answer).await
    }

    /// `EnableMetrics` (`on`) / `DisableMetrics`.
    async fn switch_metrics(&self, on: bool) -> Result<(), ApiError> {
        self.nodes.serving()?;
        self.metrics
            .switch(on, self.outbound.get(), || self.nodes.sessions())
            .await
    }
}

#[interface(name = "org.eclipse.bluechi.Controller", introspection_docs = false)]
impl ControllerObject {
    /// Every configured node in config order: name, object path, status, peer IP.
    #[zbus(out_args("nodes"))]
    async fn list_nodes(&self) -> Result<Vec<NodeRow>, ApiError> {
        self.nodes.serving()?;
        Ok(self
            .nodes
            .registry()
            .nodes()
            .iter()
            .map(|n| NodeRow {
                name: n.name.clone(),
                path: n.path.clone(),
                status: n.status(),
                session: n.session.clone(),
            })
            .collect())
    }

    #[zbus(out_args("path"))]
    async fn get_node(&self, name: String) -> Result<OwnedObjectPath, ApiError> {
        self.nodes.serving()?;
        self.nodes
            .registry()
            .get(&name)
            .map(|n| n.path.clone())
            .ok_or_else(|| {
                ApiError::new(
                    SERVICE_UNKNOWN,
                    format!("Node not found: {}", name.escape_default()),
                )
            })
    }

    /// Units of every online node, keyed by node name; see
    /// `ControllerObject::fleet_list` for nodes left out and answers too
    /// large.
    #[zbus(out_args("units"))]
    async fn list_units(
        &self,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<BTreeMap<String, Vec<UnitTuple>>, ApiError> {
        self.fleet_list(&header, &fanout::LIST_UNITS, units_of)
            .await
    }

    /// Unit files of every online node, keyed by node name (as `ListUnits`).
    #[zbus(out_args("unitfiles"))]
    async fn list_unit_files(
        &self,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<BTreeMap<String, Vec<(String, String)>>, ApiError> {
        self.fleet_list(&header, &fanout::LIST_UNIT_FILES, unit_files)
            .await
    }

    /// A monitor owned by the caller; it closes when the caller leaves the bus.
    #[zbus(out_args("monitor"))]
    async fn create_monitor(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, ApiError> {
        self.nodes.serving()?;
        let Some(owner) = header.sender() else {
            return Err(ApiError::failed("the call carries no sender"));
        };
        self.monitors.create(conn, owner).await
    }

    async fn enable_metrics(&self) -> Result<(), ApiError> {
        self.switch_metrics(true).await
    }

    async fn disable_metrics(&self) -> Result<(), ApiError> {
        self.switch_metrics(false).await
    }

    /// The manager's own log level: DEBUG, INFO, WARN or ERROR. Not persisted.
    async fn set_log_level(&self, loglevel: String) -> Result<(), ApiError> {
        let Some(level) = LogLevel::parse(&loglevel) else {
            return Err(ApiError::invalid_args(format!(
                "invalid log level '{}': expected DEBUG, INFO, WARN or ERROR",
                loglevel.escape_default()
            )));
        };
        self.log.set(level);
        tracing::info!("log level set to {}", level.as_str());
        Ok(())
    }

    #[zbus(signal)]
    pub async fn job_new(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        node: &str,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    /// `up`, `degraded` or `down`; changes are announced by the node
    /// lifecycle only when the value crosses a threshold.
    #[zbus(property)]
    fn status(&self) -> String {
        self.nodes
            .registry()
            .controller_status()
            .as_str()
            .to_owned()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn log_level(&self) -> String {
        self.log.get().as_str().to_owned()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn log_target(&self) -> String {
        self.log_target.to_owned()
    }
}
