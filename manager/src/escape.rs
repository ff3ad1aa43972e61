//! Object paths of nodes and jobs.
//!
//! Node paths use systemd's bus label escaping (the rule BlueChi and
//! `bluechictl` use to build node paths themselves;
//! [`drover_protocol::bus_label`]).

use zbus::OwnedObjectPath;

pub const CONTROLLER_PATH: &str = "/org/eclipse/bluechi";
pub const NODE_PATH_PREFIX: &str = "/org/eclipse/bluechi/node";
pub const JOB_PATH_PREFIX: &str = "/org/eclipse/bluechi/job";

pub use drover_protocol::bus_label::{bus_label_escape, bus_label_unescape};

fn path(s: String) -> OwnedObjectPath {
    // Escaped labels and decimal ids only contain [A-Za-z0-9_], so the path is
    // valid by construction.
    OwnedObjectPath::try_from(s).expect("escaped object path is valid")
}

/// `/org/eclipse/bluechi/node/<escaped name>`.
pub fn node_path(name: &str) -> OwnedObjectPath {
    path(format!("{NODE_PATH_PREFIX}/{}", bus_label_escape(name)))
}

/// `/org/eclipse/bluechi/job/<id>`.
pub fn job_path(id: u32) -> OwnedObjectPath {
    path(format!("{JOB_PATH_PREFIX}/{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            node_path("node-bar").as_str(),
            "/org/eclipse/bluechi/node/node_2dbar"
        );
        assert_eq!(job_path(17).as_str(), "/org/eclipse/bluechi/job/17");
        // Anything, even bytes a node name can never have, gives a valid path.
        assert!(node_path("a/b c\0").as_str().starts_with(NODE_PATH_PREFIX));
    }
}
