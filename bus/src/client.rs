//! drover's public D-Bus API (BlueChi's, bus name `org.eclipse.bluechi`, and
//! drover's `io.drover.*` additions) as a client declares it: the row types of
//! its replies and zbus proxies of its objects. droverctl and the test kit both
//! use these; the server's side of the same members is the manager's `api/`,
//! and the interface XML the packages install
//! (`dist/usr/share/dbus-1/interfaces/`) is what a test compares that side with.
//! The names and paths are [`crate::bluechi`]'s; the `#[proxy]` attributes must
//! spell them as literals.
//!
//! Only members a client here calls are declared; their signatures are BlueChi's
//! exactly. A command or a test that needs another member adds it here.
//!
//! Node object paths are computed locally with systemd's bus-path escaping
//! ([`crate::bluechi::node_path`]), the way bluechictl does it, instead of asking
//! `Controller.GetNode`: one round trip less per command, and the manager must
//! serve exactly these paths anyway (BlueChi clients hard-code the rule). A path
//! that does not exist comes back as `org.freedesktop.DBus.Error.UnknownObject`.

use crate::systemd::UnitTuple;
use std::collections::HashMap;

use zbus::{ObjectPath, OwnedObjectPath, OwnedVariant, proxy};

/// One entry of `Controller.ListNodes` `a(soss)`: name, object path, status, peer IP.
pub type NodeTuple = (String, OwnedObjectPath, String, String);

/// One entry of systemd's `ListUnitFiles` `a(ss)`: unit file path, enablement state.
pub type UnitFileTuple = (String, String);

/// One change of `EnableUnitFiles` & co `a(sss)`: type (`symlink`/`unlink`), file,
/// destination.
pub type ChangeTuple = (String, String, String);

/// One entry of `io.drover.Monitor.Follow` `a(sssstt)`: node, unit, active state, sub
/// state, and the modification tag (guid, index) of that state.
pub type SnapshotRow = (String, String, String, String, u64, u64);

/// One entry of `io.drover.Monitor.UnitsChanged` `a(sssssstt)`: node, unit, kind
/// (`new`, `state`, `removed`), active state, sub state, reason (`real`, `virtual`), and
/// the modification tag (guid, index).
pub type ChangedRow = (String, String, String, String, String, String, u64, u64);

/// One entry of `io.drover.Controller.ListProxies` `a(sssssu)`: requesting node, target
/// node, unit, proxy state, target active state, number of references on the target.
pub type ProxyTuple = (String, String, String, String, String, u32);

#[proxy(
    interface = "org.eclipse.bluechi.Controller",
    default_service = "org.eclipse.bluechi",
    default_path = "/org/eclipse/bluechi"
)]
pub trait Controller {
    /// `ListNodes() -> a(soss)`.
    fn list_nodes(&self) -> zbus::Result<Vec<NodeTuple>>;

    /// `GetNode(s name) -> o path`.
    fn get_node(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

    /// `CreateMonitor() -> o`: a monitor owned by this connection.
    fn create_monitor(&self) -> zbus::Result<OwnedObjectPath>;

    /// `EnableMetrics()`.
    fn enable_metrics(&self) -> zbus::Result<()>;

    /// `DisableMetrics()`.
    fn disable_metrics(&self) -> zbus::Result<()>;

    /// `SetLogLevel(s)`: the manager's own log level.
    fn set_log_level(&self, level: &str) -> zbus::Result<()>;

    /// `JobNew(u id, o job)`.
    #[zbus(signal)]
    fn job_new(&self, id: u32, job: ObjectPath<'_>) -> zbus::Result<()>;

    /// `JobRemoved(u id, o job, s node, s unit, s result)`.
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: ObjectPath<'_>,
        node: &str,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

#[proxy(
    interface = "org.eclipse.bluechi.Node",
    default_service = "org.eclipse.bluechi",
    assume_defaults = false
)]
pub trait Node {
    /// `StartUnit(s name, s mode) -> o job`.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// `StopUnit(s name, s mode) -> o job`.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// `RestartUnit(s name, s mode) -> o job`.
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// `ReloadUnit(s name, s mode) -> o job`.
    fn reload_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// `ListUnits() -> a(ssssssouso)`.
    fn list_units(&self) -> zbus::Result<Vec<UnitTuple>>;
    /// `Reload()`: systemd daemon-reload on the node.
    fn reload(&self) -> zbus::Result<()>;
    /// `GetUnitProperties(s name, s interface) -> a{sv}` (empty interface = all).
    fn get_unit_properties(
        &self,
        name: &str,
        interface: &str,
    ) -> zbus::Result<HashMap<String, OwnedVariant>>;
    /// `EnableUnitFiles(as files, b runtime, b force) -> (b, a(sss))`.
    fn enable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<(bool, Vec<ChangeTuple>)>;
    /// `DisableUnitFiles(as files, b runtime) -> a(sss)`.
    fn disable_unit_files(&self, files: &[&str], runtime: bool) -> zbus::Result<Vec<ChangeTuple>>;
    /// `GetUnitFileState(s file) -> s`.
    fn get_unit_file_state(&self, file: &str) -> zbus::Result<String>;
    /// `ListUnitFiles() -> a(ss)`.
    fn list_unit_files(&self) -> zbus::Result<Vec<UnitFileTuple>>;
    /// `FreezeUnit(s)`.
    fn freeze_unit(&self, name: &str) -> zbus::Result<()>;
    /// `ThawUnit(s)`.
    fn thaw_unit(&self, name: &str) -> zbus::Result<()>;
    /// `KillUnit(s name, s who, i signal)`.
    fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::Result<()>;
    /// `ResetFailed()`: every failed unit of the node.
    fn reset_failed(&self) -> zbus::Result<()>;
    /// `ResetFailedUnit(s)`.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    /// `GetDefaultTarget() -> s`.
    fn get_default_target(&self) -> zbus::Result<String>;
    /// `SetDefaultTarget(s target, b force) -> a(sss)`.
    fn set_default_target(&self, target: &str, force: bool) -> zbus::Result<Vec<ChangeTuple>>;
    /// `SetLogLevel(s)`: the log level of the node's agent.
    fn set_log_level(&self, level: &str) -> zbus::Result<()>;
    /// Realtime µs of the node's registration or last heartbeat; 0 = never seen.
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp(&self) -> zbus::Result<u64>;
}

/// drover's extension of the controller object (not in BlueChi).
#[proxy(
    interface = "io.drover.Controller",
    default_service = "org.eclipse.bluechi",
    default_path = "/org/eclipse/bluechi"
)]
pub trait DroverController {
    /// `ListProxies() -> a(sssssu)`.
    fn list_proxies(&self) -> zbus::Result<Vec<ProxyTuple>>;

    /// `ListHealth() -> a(sssst)`: node, unit, state, reason, since (realtime µs).
    fn list_health(&self) -> zbus::Result<Vec<HealthTuple>>;

    /// `ListNodeHealth() -> a(sssts)`: node, state, reason, since, systemd's `SystemState`.
    fn list_node_health(&self) -> zbus::Result<Vec<NodeHealthTuple>>;

    /// `Drain(s node, as units)`: empty `units` = the whole node.
    fn drain(&self, node: &str, units: &[&str]) -> zbus::Result<()>;

    /// `Undrain(s node, as units)`: empty `units` = everything drained on the node.
    fn undrain(&self, node: &str, units: &[&str]) -> zbus::Result<()>;

    /// `ListDrained() -> a(ss)`: (node, unit), unit `""` for a whole node.
    fn list_drained(&self) -> zbus::Result<Vec<(String, String)>>;

    /// Whether this manager leads (always true without high availability).
    #[zbus(property)]
    fn leading(&self) -> zbus::Result<bool>;

    /// The leadership epoch this manager won or saw last; 0 without high availability.
    #[zbus(property)]
    fn epoch(&self) -> zbus::Result<u64>;

    /// Who leads as this manager knows it (`HOST:PORT`); `""` when alone or unknown.
    #[zbus(property(emits_changed_signal = "false"))]
    fn leader(&self) -> zbus::Result<String>;
    /// `Where(s unit, a{sv} options) -> (a(ssssstbba(sq)) rows, b complete)`.
    #[zbus(name = "Where")]
    fn where_(
        &self,
        unit: &str,
        options: HashMap<&str, zbus::Variant<'_>>,
    ) -> zbus::Result<(Vec<WhereTuple>, bool)>;
}

/// One row of `io.drover.Controller.Where` `a(ssssstbba(sq))`: node, active state, sub
/// state, health (`none`, `starting`, `healthy`, `unhealthy`), address, since (realtime
/// µs), stale, drained, ports as (name, port) (`""` for the unit's `Port=`).
pub type WhereTuple = (
    String,
    String,
    String,
    String,
    String,
    u64,
    bool,
    bool,
    Vec<(String, u16)>,
);

/// One entry of `io.drover.Controller.ListHealth` `a(sssst)`: node, unit, health state
/// (`starting`, `healthy`, `unhealthy`), reason, since (realtime µs).
pub type HealthTuple = (String, String, String, String, u64);

/// One entry of `io.drover.Controller.ListNodeHealth` `a(sssts)`: node, health state,
/// reason, since (realtime µs), systemd's `SystemState`.
pub type NodeHealthTuple = (String, String, String, u64, String);

/// `io.drover.Node.GetHealth`'s reply: state, reason, since, `SystemState`, and the
/// node checks as (name, state, reason, since).
pub type NodeHealthReply = (
    String,
    String,
    u64,
    String,
    Vec<(String, String, String, u64)>,
);

/// drover's extension of a node object (not in BlueChi); the path is the node's.
#[proxy(interface = "io.drover.Node", default_service = "org.eclipse.bluechi")]
pub trait DroverNode {
    /// `GetUnitHealth(s unit) -> (s state, s reason, t since_usec)`.
    fn get_unit_health(&self, unit: &str) -> zbus::Result<(String, String, u64)>;

    /// `GetHealth() -> (s, s, t, s, a(ssst))`.
    fn get_health(&self) -> zbus::Result<NodeHealthReply>;
}

/// A monitor object (`Controller.CreateMonitor`); signals go only to its owner and peers.
#[proxy(
    interface = "org.eclipse.bluechi.Monitor",
    default_service = "org.eclipse.bluechi",
    assume_defaults = false
)]
pub trait Monitor {
    /// `Subscribe(s node, s unit) -> u id`; `*` for every node / every unit.
    fn subscribe(&self, node: &str, unit: &str) -> zbus::Result<u32>;
    /// `SubscribeList(s node, as units) -> u id`.
    fn subscribe_list(&self, node: &str, units: &[&str]) -> zbus::Result<u32>;
    /// `Unsubscribe(u id)`.
    fn unsubscribe(&self, id: u32) -> zbus::Result<()>;
    /// `Close()`.
    fn close(&self) -> zbus::Result<()>;

    /// `PeerRemoved(s reason)`: this peer no longer gets the monitor's signals.
    #[zbus(signal)]
    fn peer_removed(&self, reason: &str) -> zbus::Result<()>;

    /// `UnitNew(s node, s unit, s reason)`.
    #[zbus(signal)]
    fn unit_new(&self, node: &str, unit: &str, reason: &str) -> zbus::Result<()>;
    /// `UnitRemoved(s node, s unit, s reason)`.
    #[zbus(signal)]
    fn unit_removed(&self, node: &str, unit: &str, reason: &str) -> zbus::Result<()>;
    /// `UnitStateChanged(s node, s unit, s active_state, s sub_state, s reason)`.
    #[zbus(signal)]
    fn unit_state_changed(
        &self,
        node: &str,
        unit: &str,
        active_state: &str,
        sub_state: &str,
        reason: &str,
    ) -> zbus::Result<()>;
    /// `UnitPropertiesChanged(s node, s unit, s interface, a{sv} props)`.
    #[zbus(signal)]
    fn unit_properties_changed(
        &self,
        node: &str,
        unit: &str,
        interface: &str,
        props: HashMap<String, OwnedVariant>,
    ) -> zbus::Result<()>;
}

/// drover's extension of a monitor object (not in BlueChi): a snapshot, then the
/// batched tagged stream.
#[proxy(
    interface = "io.drover.Monitor",
    default_service = "org.eclipse.bluechi",
    assume_defaults = false
)]
pub trait DroverMonitor {
    /// `Follow() -> a(sssstt)`: the records of what the monitor watches; from then on
    /// its events come only as `UnitsChanged`.
    fn follow(&self) -> zbus::Result<Vec<SnapshotRow>>;

    /// `UnitsChanged(a(sssssstt) units)`.
    #[zbus(signal)]
    fn units_changed(&self, units: Vec<ChangedRow>) -> zbus::Result<()>;
}

/// The metrics object; it exists only while metrics are enabled, but its signals can
/// be matched at any time.
#[proxy(
    interface = "org.eclipse.bluechi.Metrics",
    default_service = "org.eclipse.bluechi",
    default_path = "/org/eclipse/bluechi/metrics"
)]
pub trait Metrics {
    /// `StartUnitJobMetrics(s node, s job, s unit, t job_us, t unit_start_us)`.
    #[zbus(signal)]
    fn start_unit_job_metrics(
        &self,
        node_name: &str,
        job_id: &str,
        unit: &str,
        job_measured_time_micros: u64,
        unit_start_prop_time_micros: u64,
    ) -> zbus::Result<()>;
    /// `AgentJobMetrics(s node, s unit, s method, t systemd_job_us)`.
    #[zbus(signal)]
    fn agent_job_metrics(
        &self,
        node_name: &str,
        unit: &str,
        method: &str,
        systemd_job_time_micros: u64,
    ) -> zbus::Result<()>;
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::bluechi::node_path;

    #[test]
    fn node_paths_are_valid_object_paths() {
        for name in ["node-bar", "9lives", "", "host.example.com", "é x/y"] {
            let p = node_path(name);
            assert!(ObjectPath::try_from(p.as_str()).is_ok(), "{p}");
        }
        assert_eq!(
            node_path("node-bar"),
            "/org/eclipse/bluechi/node/node_2dbar"
        );
    }
}
