//! BlueChi's public D-Bus objects, served on `org.eclipse.bluechi`.
//!
//! Each object is a thin adapter: it validates arguments, asks the part it
//! serves ([`handles::Handles`] names them all: the node table, the job runner, the
//! monitors, ...), and maps failures to BlueChi's error names.
//! Member names, argument names and signatures, property types and
//! `EmitsChangedSignal` annotations follow BlueChi's interface XML, so
//! `Introspect` describes exactly what is served (client libraries such as
//! dasbus build their proxies from it). Only the members implemented so far
//! are served — nothing is a stub.
//!
//! What the parts emit on their own (signals; node, job, metrics and
//! monitor objects that come and go) goes out through
//! [`outbound::BusOutbound`] and [`monitor::MonitorExport`], the bus side of
//! the interfaces they define; [`export`] installs both. Every export and
//! removal is recorded in a [`tree::Tree`], which gives the paths leading to
//! the objects sd-bus's flat `Introspect` (children named, not inlined).

pub mod controller;
pub mod counted;
pub mod drover_controller;
pub mod drover_node;
pub mod handles;
pub mod job;
pub mod metrics;
pub mod monitor;
pub mod node;
pub mod outbound;
pub mod replies;
pub mod tree;

use drover_bus::bluechi::CONTROLLER_PATH;
use std::sync::Arc;
use zbus::Connection;

/// Exports the controller, serves the monitors' objects, and points the
/// parts' [`crate::outbound::Port`] at `conn`. Node objects follow through the port (the node
/// lifecycle exports every known node: `Lifecycle::export_nodes`).
pub async fn export(handles: &Arc<handles::Handles>, conn: &Connection) -> zbus::Result<()> {
    let tree = tree::Tree::new();
    let server = conn.object_server();
    let calls = handles.metrics.counters().dbus_calls();
    server
        .at(
            CONTROLLER_PATH,
            counted::Counted::new(controller::ControllerObject::new(handles), calls),
        )
        .await?;
    tree.added(server, CONTROLLER_PATH).await;
    server
        .at(
            CONTROLLER_PATH,
            counted::Counted::new(
                drover_controller::DroverControllerObject::new(handles),
                calls,
            ),
        )
        .await?;
    handles.outbound.set(outbound::BusOutbound::new(
        conn.clone(),
        handles,
        tree.clone(),
    ));
    handles
        .monitors
        .serve(monitor::MonitorExport::new(handles, tree));
    tokio::spawn(crate::units::monitor::watch_owners(
        handles.monitors.clone(),
        conn.clone(),
    ));
    Ok(())
}
