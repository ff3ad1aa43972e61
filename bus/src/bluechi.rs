//! BlueChi's public D-Bus names: the bus names drover's manager and agent
//! own, the object paths they serve and the interfaces on them
//! (BlueChi's interface XML, `docs/api/*.xml`), plus drover's own extension interfaces
//! on the same objects (`io.drover.*`).
//!
//! Clients hard-code these (bluechictl, BlueChi's Python bindings): they are
//! the contract, never to change. Object paths that name a node use systemd's
//! label escaping ([`crate::label`]), so a client can build them itself
//! ([`node_path`]).
//!
//! zbus's `#[interface(name = …)]` and `#[proxy(interface = …)]` attributes
//! need literal strings; those spell the interface names again, next to the
//! code that serves or calls them.

use crate::label::bus_label_escape;

/// The well-known name drover-manager owns (BlueChi's controller).
pub const BUS_NAME: &str = "org.eclipse.bluechi";
/// The well-known name drover-agent owns on its node's bus.
pub const AGENT_BUS_NAME: &str = "org.eclipse.bluechi.Agent";

/// The controller object.
pub const CONTROLLER_PATH: &str = "/org/eclipse/bluechi";
/// The agent's object on its node's bus.
pub const AGENT_PATH: &str = "/org/eclipse/bluechi";
/// Node objects: `NODE_PATH_PREFIX/<escaped node name>`.
pub const NODE_PATH_PREFIX: &str = "/org/eclipse/bluechi/node";
/// Job objects: `JOB_PATH_PREFIX/<id>`.
pub const JOB_PATH_PREFIX: &str = "/org/eclipse/bluechi/job";
/// Monitor objects: `MONITOR_PATH_PREFIX/<id>`.
pub const MONITOR_PATH_PREFIX: &str = "/org/eclipse/bluechi/monitor";
/// The metrics object (exported only while metrics are enabled).
pub const METRICS_PATH: &str = "/org/eclipse/bluechi/metrics";

/// The controller's interface (nodes, fleet-wide listings, monitors).
pub const CONTROLLER_IFACE: &str = "org.eclipse.bluechi.Controller";
/// One node's interface (unit operations on that node).
pub const NODE_IFACE: &str = "org.eclipse.bluechi.Node";
/// One job's interface.
pub const JOB_IFACE: &str = "org.eclipse.bluechi.Job";
/// One monitor's interface (subscriptions, unit signals).
pub const MONITOR_IFACE: &str = "org.eclipse.bluechi.Monitor";
/// The metrics object's interface.
pub const METRICS_IFACE: &str = "org.eclipse.bluechi.Metrics";
/// The agent's local interface (`CreateProxy`, `RemoveProxy`, link status).
pub const AGENT_IFACE: &str = "org.eclipse.bluechi.Agent";

/// drover's extensions of the controller object (`ListProxies`, snapshots).
pub const DROVER_CONTROLLER_IFACE: &str = "io.drover.Controller";
/// drover's extensions of monitor objects (tagged snapshot + stream).
pub const DROVER_MONITOR_IFACE: &str = "io.drover.Monitor";
/// drover's extensions of node objects (`GetUnitHealth`, `GetHealth`).
pub const DROVER_NODE_IFACE: &str = "io.drover.Node";
/// The interface name of the `UnitPropertiesChanged` a BlueChi monitor gets
/// when a unit's health changes (properties `State` s, `Reason` s, `Since` t
/// realtime µs). No object serves it: it only names the properties.
pub const HEALTH_IFACE: &str = "io.drover.Health";

/// One entry of `io.drover.Monitor.UnitsChanged` `a(sssssstt)`: node, unit,
/// kind (`new`, `state`, `removed`), active state, sub state, reason, tag
/// guid, tag index. Kind `health`: the health state (`none`, `starting`,
/// `healthy`, `unhealthy`) in place of the active state and the first line of
/// its reason in place of the sub state. Borrowed: the manager builds it from its queued events
/// without copying a string, a client reads it out of the message.
pub type UnitsChangedRow<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    u64,
    u64,
);

/// `/org/eclipse/bluechi/node/<escaped name>`: valid for any input.
pub fn node_path(name: &str) -> String {
    format!("{NODE_PATH_PREFIX}/{}", bus_label_escape(name))
}

/// `/org/eclipse/bluechi/job/<id>`.
pub fn job_path(id: u32) -> String {
    format!("{JOB_PATH_PREFIX}/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_built_as_bluechi_clients_build_them() {
        assert_eq!(
            node_path("node-bar"),
            "/org/eclipse/bluechi/node/node_2dbar"
        );
        assert_eq!(node_path("node1"), "/org/eclipse/bluechi/node/node1");
        assert_eq!(job_path(17), "/org/eclipse/bluechi/job/17");
    }
}
