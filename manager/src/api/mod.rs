//! BlueChi's public D-Bus objects, served on `org.eclipse.bluechi`.
//!
//! Each object is a thin adapter: it validates arguments, asks the
//! [`Core`](crate::core::Core), and maps failures to BlueChi's error names.
//! Member names, argument names and signatures, property types and
//! `EmitsChangedSignal` annotations follow BlueChi's interface XML, so
//! `Introspect` describes exactly what is served (client libraries such as
//! dasbus build their proxies from it). Only the members implemented so far
//! are served — nothing is a stub.

pub mod controller;
pub mod drover_controller;
pub mod job;
pub mod metrics;
pub mod monitor;
pub mod node;

use crate::core::Core;
use drover_bus::bluechi::CONTROLLER_PATH;
use std::sync::Arc;
use zbus::Connection;

/// Exports the controller and one node object per allowed node.
pub async fn export(core: &Arc<Core>, conn: &Connection) -> zbus::Result<()> {
    let server = conn.object_server();
    server
        .at(
            CONTROLLER_PATH,
            controller::ControllerObject::new(core.clone()),
        )
        .await?;
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
    }
    tokio::spawn(crate::monitor::watch_owners(core.clone(), conn.clone()));
    Ok(())
}
