//! Object paths of nodes and jobs, as the zbus values the API serves.
//!
//! The rules are BlueChi's and live in [`drover_bus::bluechi`] (node paths
//! use systemd's bus label escaping, the rule `bluechictl` builds node paths
//! with); this module only makes them [`OwnedObjectPath`]s.

use drover_bus::bluechi;
use zbus::OwnedObjectPath;

fn path(s: String) -> OwnedObjectPath {
    // Escaped labels and decimal ids only contain [A-Za-z0-9_], so the path is
    // valid by construction.
    OwnedObjectPath::try_from(s).expect("escaped object path is valid")
}

/// `/org/eclipse/bluechi/node/<escaped name>`.
pub fn node_path(name: &str) -> OwnedObjectPath {
    path(bluechi::node_path(name))
}

/// `/org/eclipse/bluechi/job/<id>`.
pub fn job_path(id: u32) -> OwnedObjectPath {
    path(bluechi::job_path(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_bus::bluechi::NODE_PATH_PREFIX;

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
