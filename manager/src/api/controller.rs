//! `org.eclipse.bluechi.Controller` at `/org/eclipse/bluechi`.

use crate::core::Core;
use crate::error::ApiError;
use crate::nodes::session::Session;
use drover_bus::systemd::UnitTuple;
use drover_config::LogLevel;
use drover_protocol::NodeName;
use drover_protocol::error_names::SERVICE_UNKNOWN;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
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
    const SIGNATURE: &'static zbus::Signature =
        <(String, OwnedObjectPath, String, String)>::SIGNATURE;
}

impl Serialize for NodeRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ip = self.session.as_deref().map_or("", Session::peer_ip);
        (self.name.as_str(), &self.path, self.status, ip).serialize(serializer)
    }
}

pub struct ControllerObject {
    core: Arc<Core>,
}

impl ControllerObject {
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

#[interface(name = "org.eclipse.bluechi.Controller", introspection_docs = false)]
impl ControllerObject {
    /// Every configured node in config order: name, object path, status, peer IP.
    #[zbus(out_args("nodes"))]
    async fn list_nodes(&self) -> Vec<NodeRow> {
        self.core
            .registry()
            .nodes()
            .iter()
            .map(|n| NodeRow {
                name: n.name.clone(),
                path: n.path.clone(),
                status: n.status(),
                session: n.session.clone(),
            })
            .collect()
    }

    #[zbus(out_args("path"))]
    async fn get_node(&self, name: String) -> Result<OwnedObjectPath, ApiError> {
        self.core
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
    /// `Core::list_all_units` for nodes left out and answers too large.
    #[zbus(out_args("units"))]
    async fn list_units(&self) -> Result<BTreeMap<String, Vec<UnitTuple>>, ApiError> {
        self.core.list_all_units().await
    }

    /// Unit files of every online node, keyed by node name (as `ListUnits`).
    #[zbus(out_args("unitfiles"))]
    async fn list_unit_files(&self) -> Result<BTreeMap<String, Vec<(String, String)>>, ApiError> {
        self.core.list_all_unit_files().await
    }

    /// A monitor owned by the caller; it closes when the caller leaves the bus.
    #[zbus(out_args("monitor"))]
    async fn create_monitor(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, ApiError> {
        let Some(owner) = header.sender() else {
            return Err(ApiError::failed("the call carries no sender"));
        };
        self.core.monitors().create(conn, owner).await
    }

    async fn enable_metrics(&self) -> Result<(), ApiError> {
        self.core.switch_metrics(true).await
    }

    async fn disable_metrics(&self) -> Result<(), ApiError> {
        self.core.switch_metrics(false).await
    }

    /// The manager's own log level: DEBUG, INFO, WARN or ERROR. Not persisted.
    async fn set_log_level(&self, loglevel: String) -> Result<(), ApiError> {
        let Some(level) = LogLevel::parse(&loglevel) else {
            return Err(ApiError::invalid_args(format!(
                "invalid log level '{}': expected DEBUG, INFO, WARN or ERROR",
                loglevel.escape_default()
            )));
        };
        self.core.set_log_level(level);
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

    /// `up`, `degraded` or `down`; changes are announced by the core only
    /// when the value crosses a threshold.
    #[zbus(property)]
    fn status(&self) -> String {
        self.core.registry().controller_status().as_str().to_owned()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn log_level(&self) -> String {
        self.core.log_level().as_str().to_owned()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn log_target(&self) -> String {
        self.core.config().logging.target.as_str().to_owned()
    }
}
