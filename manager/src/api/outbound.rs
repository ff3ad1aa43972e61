//! [`BusOutbound`]: the parts' [`Outbound`] on a zbus connection — signals
//! go out on it, node, job and metrics objects are exported and removed on
//! its object server, each recorded in the [`Tree`] `Introspect` reads.
//!
//! It holds the API's [`Handles`] weakly (the parts hold it through their
//! port): a `Node` or `Job` object made here holds its share of the parts
//! strongly, as every object does, and a manager that is gone exports
//! nothing.

use crate::api::controller::ControllerObject;
use crate::api::counted::Counted;
use crate::api::drover_node::DroverNodeObject;
use crate::api::handles::Handles;
use crate::api::job::JobObject;
use crate::api::metrics::MetricsObject;
use crate::api::node::NodeObject;
use crate::api::tree::Tree;
use crate::jobs::JobInfo;
use crate::outbound::Outbound;
use drover_bus::bluechi::{CONTROLLER_PATH, METRICS_IFACE, METRICS_PATH};
use drover_protocol::NodeName;
use futures::future::BoxFuture;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use zbus::names::BusName;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, OwnedObjectPath, Variant};

pub struct BusOutbound {
    conn: Connection,
    handles: Weak<Handles>,
    /// Every exported path, for `Introspect` (`crate::api::tree`).
    tree: Arc<Tree>,
}

impl BusOutbound {
    pub fn new(conn: Connection, handles: &Arc<Handles>, tree: Arc<Tree>) -> Arc<Self> {
        Arc::new(Self {
            conn,
            handles: Arc::downgrade(handles),
            tree,
        })
    }

    async fn emit_metrics<B>(&self, member: &'static str, body: &B)
    where
        B: zbus::export::serde::Serialize + zbus::zvariant::DynamicType,
    {
        if let Err(e) = self
            .conn
            .emit_signal(
                None::<BusName<'_>>,
                METRICS_PATH,
                METRICS_IFACE,
                member,
                body,
            )
            .await
        {
            tracing::debug!("cannot emit {member}: {e}");
        }
    }
}

impl Outbound for BusOutbound {
    fn property_changed<'a>(
        &'a self,
        path: &'a str,
        interface: &'static str,
        property: &'static str,
        value: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let emitter = match SignalEmitter::new(&self.conn, path) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!("bad object path {path}: {e}");
                    return;
                }
            };
            let Ok(interface) = zbus::names::InterfaceName::try_from(interface) else {
                return;
            };
            let changed = HashMap::from([(property, Variant::from(value))]);
            if let Err(e) = zbus::fdo::Properties::properties_changed(
                &emitter,
                interface,
                changed,
                Cow::Borrowed(&[]),
            )
            .await
            {
                tracing::warn!("cannot emit PropertiesChanged for {path} {property}: {e}");
            }
        })
    }

    fn export_node<'a>(
        &'a self,
        node: &'a NodeName,
        path: &'a OwnedObjectPath,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(handles) = self.handles.upgrade() else {
                return;
            };
            let calls = handles.metrics.counters().dbus_calls();
            let object = Counted::new(NodeObject::new(&handles, node.clone()), calls);
            let server = self.conn.object_server();
            let exported = match server.at(path.as_str(), object).await {
                Ok(_) => {
                    let drover = DroverNodeObject::new(&handles, node.clone());
                    server.at(path.as_str(), Counted::new(drover, calls)).await
                }
                Err(e) => Err(e),
            };
            match exported {
                Ok(_) => self.tree.added(server, path.as_str()).await,
                Err(e) => tracing::error!(%node, "cannot export the object of node {node}: {e}"),
            }
        })
    }

    fn export_job<'a>(&'a self, job: &'a JobInfo, path: &'a OwnedObjectPath) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(handles) = self.handles.upgrade() else {
                return;
            };
            let calls = handles.metrics.counters().dbus_calls();
            let object = Counted::new(JobObject::new(&handles, job.clone()), calls);
            let server = self.conn.object_server();
            match server.at(path.as_str(), object).await {
                Ok(_) => self.tree.added(server, path.as_str()).await,
                Err(e) => tracing::error!("cannot export {}: {e}", path.as_str()),
            }
        })
    }

    fn job_new<'a>(&'a self, id: u32, path: &'a OwnedObjectPath) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match SignalEmitter::new(&self.conn, CONTROLLER_PATH) {
                Ok(emitter) => {
                    if let Err(e) = ControllerObject::job_new(&emitter, id, path.as_ref()).await {
                        tracing::warn!("cannot emit JobNew for job {id}: {e}");
                    }
                }
                Err(e) => tracing::error!("bad controller path: {e}"),
            }
        })
    }

    fn job_removed<'a>(
        &'a self,
        job: &'a JobInfo,
        path: &'a OwnedObjectPath,
        result: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match SignalEmitter::new(&self.conn, CONTROLLER_PATH) {
                Ok(emitter) => {
                    if let Err(e) = ControllerObject::job_removed(
                        &emitter,
                        job.id,
                        path.as_ref(),
                        job.node.as_str(),
                        job.unit.as_str(),
                        result,
                    )
                    .await
                    {
                        tracing::warn!("cannot emit JobRemoved for job {}: {e}", job.id);
                    }
                }
                Err(e) => tracing::error!("bad controller path: {e}"),
            }
            // Out of the tree first: a job exported meanwhile then sees its
            // parent as new and gives it the flat `Introspect` again.
            self.tree.removed(path.as_str());
            // Only errors if it was never exported, which is fine.
            let _ = self
                .conn
                .object_server()
                .remove::<Counted<JobObject>, _>(path.as_str())
                .await;
        })
    }

    fn serve_metrics(&self, on: bool) -> BoxFuture<'_, zbus::Result<()>> {
        Box::pin(async move {
            let server = self.conn.object_server();
            if on {
                server.at(METRICS_PATH, MetricsObject).await?;
                self.tree.added(server, METRICS_PATH).await;
            } else {
                self.tree.removed(METRICS_PATH);
                let _ = server.remove::<MetricsObject, _>(METRICS_PATH).await;
            }
            Ok(())
        })
    }

    fn start_unit_job_metrics<'a>(
        &'a self,
        node: &'a str,
        job: &'a str,
        unit: &'a str,
        gross_micros: u64,
        net_micros: u64,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let body = (node, job, unit, gross_micros, net_micros);
            self.emit_metrics("StartUnitJobMetrics", &body).await
        })
    }

    fn agent_job_metrics<'a>(
        &'a self,
        node: &'a str,
        unit: &'a str,
        method: &'a str,
        micros: u64,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let body = (node, unit, method, micros);
            self.emit_metrics("AgentJobMetrics", &body).await
        })
    }
}
