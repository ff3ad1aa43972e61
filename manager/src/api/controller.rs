//! `org.eclipse.bluechi.Controller` at `/org/eclipse/bluechi`.

use crate::core::{Core, UnitTuple};
use crate::error::{ApiError, SERVICE_UNKNOWN};
use std::collections::HashMap;
use std::sync::Arc;
use zbus::interface;
use zbus::object_server::SignalEmitter;
use zbus::{ObjectPath, OwnedObjectPath};

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
    async fn list_nodes(&self) -> Vec<(String, OwnedObjectPath, String, String)> {
        self.core
            .registry()
            .nodes()
            .iter()
            .map(|n| {
                (
                    n.name.to_string(),
                    n.path.clone(),
                    n.status().to_owned(),
                    n.peer_ip().to_owned(),
                )
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

    /// Units of every online node; see `Core::list_all_units` for failures.
    #[zbus(out_args("units"))]
    async fn list_units(&self) -> HashMap<String, Vec<UnitTuple>> {
        self.core.list_all_units().await
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
