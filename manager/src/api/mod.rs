//! BlueChi's public D-Bus objects, served on `org.eclipse.bluechi`.
//!
//! Each object is a thin adapter: it validates arguments, asks the
//! [`Core`], and maps failures to BlueChi's error names.
//! Member names, argument names and signatures, property types and
//! `EmitsChangedSignal` annotations follow BlueChi's interface XML, so
//! `Introspect` describes exactly what is served (client libraries such as
//! dasbus build their proxies from it). Only the members implemented so far
//! are served — nothing is a stub.
//!
//! What the core and the monitors emit on their own (signals, job, metrics
//! and monitor objects that come and go) goes out through
//! [`outbound::BusOutbound`] and [`monitor::MonitorExport`], the bus side of
//! the interfaces they define; [`export`] installs both. Every export and
//! removal is recorded in a [`tree::Tree`], which gives the paths leading to
//! the objects sd-bus's flat `Introspect` (children named, not inlined).

pub mod controller;
pub mod drover_controller;
pub mod job;
pub mod metrics;
pub mod monitor;
pub mod node;
pub mod outbound;
pub mod tree;

use crate::core::Core;
use drover_bus::bluechi::CONTROLLER_PATH;
use std::sync::Arc;
use zbus::Connection;

/// Exports the controller and one node object per allowed node, and points
/// the core's and the monitors' output at `conn`.
pub async fn export(core: &Arc<Core>, conn: &Connection) -> zbus::Result<()> {
    let tree = tree::Tree::new();
    core.set_outbound(outbound::BusOutbound::new(conn.clone(), core, tree.clone()));
    let server = conn.object_server();
    server
        .at(
            CONTROLLER_PATH,
            controller::ControllerObject::new(core.clone()),
        )
        .await?;
    tree.added(server, CONTROLLER_PATH).await;
    server
        .at(
            CONTROLLER_PATH,
            drover_controller::DroverControllerObject::new(core.proxies().clone()),
        )
        .await?;
    let nodes: Vec<_> = core
        .registry()
        .nodes()
        .iter()
        .map(|n| (n.name.clone(), n.path.clone()))
        .collect();
    for (name, path) in nodes {
        server
            .at(path.as_str(), node::NodeObject::new(core.clone(), name))
            .await?;
        tree.added(server, path.as_str()).await;
    }
    core.monitors()
        .serve(monitor::MonitorExport::new(core, tree.clone()));
    tokio::spawn(crate::units::monitor::watch_owners(
        core.monitors().clone(),
        conn.clone(),
    ));
    Ok(())
}
