//! `org.eclipse.bluechi.Monitor` and `io.drover.Monitor` at
//! `/org/eclipse/bluechi/monitor/<id>`: thin adapters over
//! [`crate::units::monitor`]. The signals are declared here so `Introspect`
//! describes them; they are emitted by the monitor's task as unicast
//! messages (see [`crate::units::monitor`]), never through these declarations.
//!
//! Every method of a monitor (`Close`, `Subscribe`, `SubscribeList`,
//! `Unsubscribe`, `AddPeer`, `RemovePeer`, `Follow`) is for the client that
//! created it ([`owner_or_root`]): its unique name is the sender, or the
//! sender is root (uid 0 by the bus's `GetConnectionUnixUser`). BlueChi
//! checks no owner, but its policy lets only root call; drover's policy also
//! lets the read-only group call monitor methods, so a reader who guesses a
//! path cannot close, redirect or follow another client's monitor. Anyone
//! else gets `AccessDenied` and nothing changes.

use crate::api::counted::Counted;
use crate::api::handles::Handles;
use crate::api::tree::Tree;
use crate::error::ApiError;
use crate::nodes::lifecycle::Nodes;
use crate::units::monitor::{Monitor, MonitorObjects, Monitors, REASON_CLOSED};
use drover_bus::client::{ChangedRow, SnapshotRow};
use drover_protocol::NodeName;
use drover_protocol::error_names::ACCESS_DENIED;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use zbus::message::Header;
use zbus::names::BusName;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, OwnedVariant, interface};

/// Exports [`MonitorObject`] and [`DroverMonitorObject`] for each monitor
/// (see [`MonitorObjects`]). Holds the handles weakly: the monitors, among
/// them, hold it.
pub struct MonitorExport {
    handles: Weak<Handles>,
    /// Every exported path, for `Introspect` (`crate::api::tree`).
    tree: Arc<Tree>,
}

impl MonitorExport {
    pub fn new(handles: &Arc<Handles>, tree: Arc<Tree>) -> Arc<Self> {
        Arc::new(Self {
            handles: Arc::downgrade(handles),
            tree,
        })
    }
}

impl MonitorObjects for MonitorExport {
    fn export<'a>(
        &'a self,
        conn: &'a Connection,
        monitor: &'a Arc<Monitor>,
    ) -> BoxFuture<'a, zbus::Result<()>> {
        Box::pin(async move {
            let Some(handles) = self.handles.upgrade() else {
                return Err(zbus::Error::Failure("the manager is stopping".into()));
            };
            let server = conn.object_server();
            let path = monitor.path().as_str();
            let calls = handles.metrics.counters().dbus_calls();
            server
                .at(
                    path,
                    Counted::new(MonitorObject::new(&handles, monitor.clone()), calls),
                )
                .await?;
            server
                .at(
                    path,
                    Counted::new(DroverMonitorObject::new(monitor.clone()), calls),
                )
                .await?;
            self.tree.added(server, path).await;
            Ok(())
        })
    }

    fn unexport<'a>(&'a self, conn: &'a Connection, monitor: &'a Monitor) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let server = conn.object_server();
            let path = monitor.path().as_str();
            self.tree.removed(path);
            let _ = server.remove::<Counted<MonitorObject>, _>(path).await;
            let _ = server.remove::<Counted<DroverMonitorObject>, _>(path).await;
        })
    }
}

/// Lets a monitor call through when it comes from the monitor's owner or
/// from root (see the module docs); `AccessDenied` otherwise, also when the
/// bus cannot say who the caller is.
pub async fn owner_or_root(
    conn: &Connection,
    header: &Header<'_>,
    monitor: &Monitor,
) -> Result<(), ApiError> {
    let Some(sender) = header.sender() else {
        return Err(ApiError::new(ACCESS_DENIED, "the call carries no sender"));
    };
    if sender.as_str() == monitor.owner() {
        return Ok(());
    }
    let denied = |why: String| {
        tracing::info!(
            monitor = monitor.id(),
            owner = monitor.owner(),
            "refused a monitor call from {sender}: {why}"
        );
        ApiError::new(
            ACCESS_DENIED,
            format!(
                "monitor {} belongs to {}; only its owner or root may call it ({why})",
                monitor.path().as_str(),
                monitor.owner()
            ),
        )
    };
    let uid = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(|e| denied(format!("cannot ask the bus about {sender}: {e}")))?
        .get_connection_unix_user(BusName::from(sender.clone()))
        .await
        .map_err(|e| denied(format!("the bus does not know the uid of {sender}: {e}")))?;
    if uid == 0 {
        Ok(())
    } else {
        Err(denied(format!("{sender} is uid {uid}")))
    }
}

pub struct MonitorObject {
    monitors: Arc<Monitors>,
    nodes: Arc<Nodes>,
    monitor: Arc<Monitor>,
}

impl MonitorObject {
    pub fn new(handles: &Handles, monitor: Arc<Monitor>) -> Self {
        Self {
            monitors: handles.monitors.clone(),
            nodes: handles.nodes.clone(),
            monitor,
        }
    }

    fn monitors(&self) -> &Monitors {
        &self.monitors
    }

    /// Every configured node, in config order.
    fn configured(&self) -> Vec<NodeName> {
        self.nodes
            .registry()
            .nodes()
            .iter()
            .map(|n| n.name.clone())
            .collect()
    }
}

#[interface(name = "org.eclipse.bluechi.Monitor", introspection_docs = false)]
impl MonitorObject {
    /// Removes the subscriptions, sends `PeerRemoved("monitor closed")` to
    /// each peer, unexports the monitor.
    async fn close(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        if self.monitor.is_closed() {
            return Err(ApiError::failed("Monitor already closed"));
        }
        self.monitors()
            .close(conn, &self.monitor, REASON_CLOSED)
            .await;
        Ok(())
    }

    #[zbus(out_args("id"))]
    async fn subscribe(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        node: String,
        unit: String,
    ) -> Result<u32, ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        self.monitors()
            .subscribe(&self.monitor, &self.configured(), &node, &[unit])
            .await
    }

    #[zbus(out_args("id"))]
    async fn subscribe_list(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        node: String,
        units: Vec<String>,
    ) -> Result<u32, ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        self.monitors()
            .subscribe(&self.monitor, &self.configured(), &node, &units)
            .await
    }

    async fn unsubscribe(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        id: u32,
    ) -> Result<(), ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        Monitors::unsubscribe(&self.monitor, id)
    }

    #[zbus(out_args("id"))]
    async fn add_peer(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<u32, ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        self.monitors().add_peer(&self.monitor, &name)
    }

    async fn remove_peer(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        id: u32,
        reason: String,
    ) -> Result<(), ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        Monitors::remove_peer(conn, &self.monitor, id, &reason).await
    }

    #[zbus(signal)]
    async fn unit_properties_changed(
        emitter: &SignalEmitter<'_>,
        node: &str,
        unit: &str,
        interface: &str,
        props: HashMap<String, OwnedVariant>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn unit_state_changed(
        emitter: &SignalEmitter<'_>,
        node: &str,
        unit: &str,
        active_state: &str,
        sub_state: &str,
        reason: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn unit_new(
        emitter: &SignalEmitter<'_>,
        node: &str,
        unit: &str,
        reason: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn unit_removed(
        emitter: &SignalEmitter<'_>,
        node: &str,
        unit: &str,
        reason: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn peer_removed(emitter: &SignalEmitter<'_>, reason: &str) -> zbus::Result<()>;
}

/// drover's extension on the same object: snapshot + batched tagged stream.
pub struct DroverMonitorObject {
    monitor: Arc<Monitor>,
}

impl DroverMonitorObject {
    pub fn new(monitor: Arc<Monitor>) -> Self {
        Self { monitor }
    }
}

#[interface(name = "io.drover.Monitor", introspection_docs = false)]
impl DroverMonitorObject {
    /// Current records of every loaded unit this monitor subscribes to:
    /// `(node, unit, active_state, sub_state, guid, index)`. From the
    /// snapshot on, the monitor's events (to the owner and every peer) come
    /// only as `UnitsChanged` batches, no longer as BlueChi's signals; drop
    /// each entry whose `(guid, index)` does not succeed the record you hold.
    #[zbus(out_args("units"))]
    async fn follow(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<SnapshotRow>, ApiError> {
        owner_or_root(conn, &header, &self.monitor).await?;
        Monitors::follow(&self.monitor)
    }

    /// Every tagged event queued for the monitor at one socket write, in
    /// order. Entry: `(node, unit, kind, active_state, sub_state, reason,
    /// guid, index)`; `kind`: `new`, `state` or `removed`; `reason`: `real`
    /// or `virtual`.
    #[zbus(signal)]
    async fn units_changed(emitter: &SignalEmitter<'_>, units: Vec<ChangedRow>)
    -> zbus::Result<()>;
}
