//! `io.drover.Controller` at `/org/eclipse/bluechi`: drover's additions to the
//! controller object, on an interface of their own so BlueChi's
//! `org.eclipse.bluechi.Controller` stays exactly as BlueChi defines it.
//!
//! `Reload()` is what the shipped unit's `ExecReload=` calls
//! (`drover-manager --reload`): it returns once the configuration is
//! applied, or fails with the reason and keeps the running one. Root only
//! on the system bus (the D-Bus policy); the method itself also refuses any
//! caller that is neither root nor the manager's own user (a session bus).
//!
//! `ListHealth()` and `ListNodeHealth()` list the health the agents report
//! (`crate::units::health`).

use crate::api::handles::Handles;
use crate::error::ApiError;
use crate::nodes::lifecycle::{Nodes, Phase};
use crate::proxies::driver::Proxies;
use crate::reload::{ReloadError, Reloader, reload_from_source};
use crate::units::health::{HealthRow, NodeHealthRow};
use crate::units::hub::Subscriptions;
use drover_bus::client::ProxyTuple;
use drover_protocol::error_names::ACCESS_DENIED;
use std::sync::Arc;
use zbus::message::Header;
use zbus::names::BusName;
use zbus::{Connection, interface};

pub struct DroverControllerObject {
    proxies: Proxies,
    reloader: Arc<Reloader>,
    subscriptions: Arc<Subscriptions>,
    nodes: Arc<Nodes>,
}

impl DroverControllerObject {
    pub fn new(handles: &Handles) -> Self {
        Self {
            proxies: handles.proxies.clone(),
            reloader: handles.reloader.clone(),
            subscriptions: handles.subscriptions.clone(),
            nodes: handles.nodes.clone(),
        }
    }
}

#[interface(name = "io.drover.Controller", introspection_docs = false)]
impl DroverControllerObject {
    /// Every cross-node dependency the manager tracks, ordered by target
    /// (node, unit) then requesting node: (requesting node, target node,
    /// unit, proxy state `waiting`/`active`/`failed`, target active state as
    /// last known or `unknown`, number of live references on the target).
    #[zbus(out_args("proxies"))]
    async fn list_proxies(&self) -> Vec<ProxyTuple> {
        self.proxies.list().await
    }

    /// The health of every unit that declares a check, on every online node,
    /// sorted by (node, unit): (node, unit, state `starting`/`healthy`/
    /// `unhealthy`, reason, since as realtime µs). From what the manager
    /// holds: no request to any agent.
    #[zbus(out_args("units"))]
    async fn list_health(&self) -> Vec<HealthRow> {
        self.subscriptions.list_health()
    }

    /// The health of every online node that reported it, sorted by node:
    /// (node, state, reason, since as realtime µs, systemd's `SystemState`).
    #[zbus(out_args("nodes"))]
    async fn list_node_health(&self) -> Vec<NodeHealthRow> {
        self.subscriptions.list_node_health()
    }

    /// Loads the configuration again, as `SIGHUP` does, and returns once it
    /// is applied (see [`crate::reload`]).
    async fn reload(
        &self,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<(), ApiError> {
        root_or_self(conn, &header).await?;
        match reload_from_source(&self.reloader).await {
            Ok(_) => Ok(()),
            Err(e @ (ReloadError::NoSource | ReloadError::Config(_))) => {
                Err(ApiError::failed(e.to_string()))
            }
        }
    }

    /// Whether this manager leads: always true for a manager alone; with
    /// high availability, while its etcd lease is proven (docs/ha.md).
    /// Read on the clock, so a manager paused past its lease says false at
    /// once.
    #[zbus(property)]
    fn leading(&self) -> bool {
        self.nodes.phase() == Phase::Leading
    }

    /// The leadership epoch this manager last won or saw (the etcd leader
    /// key's creation revision); 0 for a manager alone.
    #[zbus(property)]
    fn epoch(&self) -> u64 {
        self.nodes.fence().map_or(0, |f| f.epoch())
    }
}

/// Lets a call through from root or from the user the manager runs as.
async fn root_or_self(conn: &Connection, header: &Header<'_>) -> Result<(), ApiError> {
    let denied = |why: String| ApiError::new(ACCESS_DENIED, format!("Reload: {why}"));
    let Some(sender) = header.sender() else {
        return Err(denied("the call carries no sender".into()));
    };
    let bus = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(|e| denied(format!("cannot ask the bus about {sender}: {e}")))?;
    let uid_of = |name: BusName<'static>| {
        let bus = bus.clone();
        async move { bus.get_connection_unix_user(name).await }
    };
    let caller = uid_of(BusName::from(sender.to_owned()))
        .await
        .map_err(|e| denied(format!("the bus does not know the uid of {sender}: {e}")))?;
    if caller == 0 {
        return Ok(());
    }
    let own = match conn.unique_name() {
        Some(me) => uid_of(BusName::from(me.to_owned())).await.ok(),
        None => None,
    };
    if own == Some(caller) {
        Ok(())
    } else {
        tracing::info!("refused Reload from {sender} (uid {caller})");
        Err(denied(format!(
            "only root or the manager's own user may reload it; {sender} is uid {caller}"
        )))
    }
}
