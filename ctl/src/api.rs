//! The slice of drover's public D-Bus API (BlueChi's, bus name `org.eclipse.bluechi`)
//! that droverctl uses, as zbus proxies, plus the node object-path rule.
//!
//! Only members droverctl calls are declared; their signatures are BlueChi's exactly
//! (bluechi-facts §2). Adding a command that needs another member means adding it here.
//!
//! Node object paths are computed locally with systemd's bus-path escaping, the way
//! bluechictl does it, instead of asking `Controller.GetNode`: one round trip less per
//! command, and the manager must serve exactly these paths anyway (BlueChi clients
//! hard-code the rule). A path that does not exist comes back as
//! `org.freedesktop.DBus.Error.UnknownObject`, which droverctl reports as an unknown node.

use std::collections::HashMap;
use std::fmt::Write as _;

use zbus::{ObjectPath, OwnedObjectPath, proxy};

/// The well-known bus name drover-manager owns.
pub const BUS_NAME: &str = "org.eclipse.bluechi";
/// The controller object.
pub const CONTROLLER_PATH: &str = "/org/eclipse/bluechi";
/// Node objects live below this prefix, one escaped label per node.
pub const NODE_PATH_PREFIX: &str = "/org/eclipse/bluechi/node/";

/// systemd's `ListUnits` tuple `(ssssssouso)`, passed through by the manager: name,
/// description, load state, active state, sub state, followed unit, unit object path,
/// job id, job type, job object path.
pub type UnitTuple = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

/// One entry of `Controller.ListNodes` `a(soss)`: name, object path, status, peer IP.
pub type NodeTuple = (String, OwnedObjectPath, String, String);

#[proxy(
    interface = "org.eclipse.bluechi.Controller",
    default_service = "org.eclipse.bluechi",
    default_path = "/org/eclipse/bluechi"
)]
pub trait Controller {
    /// `ListUnits() -> a{sa(ssssssouso)}`: units of every online node, keyed by node.
    fn list_units(&self) -> zbus::Result<HashMap<String, Vec<UnitTuple>>>;

    /// `ListNodes() -> a(soss)`.
    fn list_nodes(&self) -> zbus::Result<Vec<NodeTuple>>;

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
    /// Realtime µs of the node's registration or last heartbeat; 0 = never seen.
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp(&self) -> zbus::Result<u64>;
}

/// Escape one object-path label the way systemd (and BlueChi) do: every byte that is
/// not an ASCII letter, and a digit in first position, becomes `_` + two lowercase hex
/// digits; the empty string becomes `_`. The result is always a valid path element.
pub fn escape_path_label(s: &str) -> String {
    if s.is_empty() {
        return "_".to_owned();
    }
    let mut out = String::with_capacity(s.len() * 3);
    for (i, b) in s.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "_{b:02x}");
        }
    }
    out
}

/// The object path of node `name`: `/org/eclipse/bluechi/node/<escaped name>`.
pub fn node_path(name: &str) -> String {
    format!("{NODE_PATH_PREFIX}{}", escape_path_label(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_matches_systemd() {
        assert_eq!(escape_path_label("node-bar"), "node_2dbar");
        assert_eq!(escape_path_label("node1"), "node1");
        assert_eq!(escape_path_label("9lives"), "_39lives");
        assert_eq!(escape_path_label("a.b"), "a_2eb");
        assert_eq!(escape_path_label(""), "_");
        assert_eq!(escape_path_label("A_Z"), "A_5fZ");
        // Non-ASCII is escaped byte by byte, lowercase hex.
        assert_eq!(escape_path_label("é"), "_c3_a9");
    }

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
