//! `Introspect` of the paths that lead to objects (`/`, `/org`, …,
//! `/org/eclipse/bluechi`, `…/node`, `…/job`, `…/monitor`): each names its
//! children as `<node name="x"/>` only, as sd-bus (and so BlueChi) does.
//!
//! zbus describes a path's whole subtree inline, every child with all its
//! interfaces; `busctl tree org.eclipse.bluechi` then prints a warning per
//! nested signal. zbus offers no switch for it, so [`FlatIntrospectable`]
//! replaces zbus's `org.freedesktop.DBus.Introspectable` on those paths.
//! Leaf objects (nodes, jobs, monitors, metrics) keep zbus's, which has no
//! children to inline.
//!
//! Invariants: [`Tree`] records every exported object path (the API's export
//! and removal sites call [`Tree::added`] / [`Tree::removed`]), and a path's
//! children are the next labels of the recorded paths below it, so the XML
//! names exactly the objects served. The paths below one are a contiguous
//! range of the sorted set, so exporting an object (a job on every
//! `StartUnit`) costs a few ordered lookups whatever the number of nodes,
//! never a scan of every path. zbus creates the nodes leading to an
//! object with its own `Introspectable` and destroys them when their last
//! child goes; [`Tree::added`] therefore replaces it on every ancestor that
//! the new object (re)created. The interfaces of the controller path (the
//! only path with both children and interfaces of its own) are described by
//! their own zbus code, so the XML stays exact.

use crate::api::controller::ControllerObject;
use crate::api::counted::Counted;
use crate::api::drover_controller::DroverControllerObject;
use drover_bus::bluechi::CONTROLLER_PATH;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use zbus::interface;
use zbus::names::InterfaceName;
use zbus::object_server::{Interface, ObjectServer};

const INTROSPECTABLE: &str = "org.freedesktop.DBus.Introspectable";

/// The standard interfaces every path serves, as zbus describes them.
const STANDARD_XML: &str = r#"  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping">
    </method>
    <method name="GetMachineId">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Properties">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg type="v" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg type="a{sv}" direction="out"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{sv}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>
"#;

/// Every object path the API exports (see the module docs).
#[derive(Default)]
pub struct Tree {
    paths: Mutex<BTreeSet<String>>,
}

/// The strict ancestors of `path`, root first (`/a/b/c` → `/`, `/a`, `/a/b`).
fn ancestors(path: &str) -> Vec<String> {
    let mut out = vec!["/".to_owned()];
    let labels: Vec<&str> = path.split('/').filter(|l| !l.is_empty()).collect();
    for i in 1..labels.len() {
        out.push(format!("/{}", labels[..i].join("/")));
    }
    out
}

/// The recorded paths strictly below `parent`, as the label right below
/// `parent` of each: one ordered range of the set (every string that starts
/// with `parent/` sorts right after it, and nothing else does).
fn labels_below<'a>(paths: &'a BTreeSet<String>, parent: &str) -> impl Iterator<Item = &'a str> {
    let prefix = if parent == "/" {
        "/".to_owned()
    } else {
        format!("{parent}/")
    };
    let parent = parent.to_owned();
    paths
        .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
        .take_while(move |p| p.starts_with(&prefix))
        .filter_map(move |p| child_label(&parent, p))
}

/// The label right below `parent` on the way to `path`, if `path` is below it.
fn child_label<'a>(parent: &str, path: &'a str) -> Option<&'a str> {
    let rest = if parent == "/" {
        path.strip_prefix('/')?
    } else {
        path.strip_prefix(parent)?.strip_prefix('/')?
    };
    rest.split('/').next().filter(|l| !l.is_empty())
}

impl Tree {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.paths.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next labels below `parent`, sorted.
    pub fn children(&self, parent: &str) -> BTreeSet<String> {
        labels_below(&self.lock(), parent)
            .map(str::to_owned)
            .collect()
    }

    /// `path` was just exported on `server`: record it and give every
    /// ancestor it (re)created the flat `Introspect`.
    pub async fn added(self: &Arc<Self>, server: &ObjectServer, path: &str) {
        let fresh: Vec<String> = {
            let mut paths = self.lock();
            // An ancestor under which nothing was exported before was just
            // created by zbus (or re-created after its last child went).
            let fresh = ancestors(path)
                .into_iter()
                .filter(|a| labels_below(&paths, a).next().is_none())
                .collect();
            paths.insert(path.to_owned());
            fresh
        };
        for ancestor in fresh {
            self.flatten(server, &ancestor).await;
        }
    }

    /// `path` is no longer exported.
    pub fn removed(&self, path: &str) {
        self.lock().remove(path);
    }

    /// Replaces zbus's `Introspectable` at `path` with [`FlatIntrospectable`].
    async fn flatten(self: &Arc<Self>, server: &ObjectServer, path: &str) {
        let flat = FlatIntrospectable {
            tree: self.clone(),
            path: path.to_owned(),
        };
        let name = InterfaceName::from_static_str_unchecked(INTROSPECTABLE);
        if let Err(e) = server.remove_named(path, name).await {
            tracing::debug!("introspection of {path}: {e}");
            return;
        }
        if let Err(e) = server.at(path, flat).await {
            tracing::debug!("introspection of {path}: {e}");
        }
    }
}

/// `org.freedesktop.DBus.Introspectable` of one path that leads to objects.
pub struct FlatIntrospectable {
    tree: Arc<Tree>,
    path: String,
}

#[interface(
    name = "org.freedesktop.DBus.Introspectable",
    introspection_docs = false
)]
impl FlatIntrospectable {
    /// The path's own interfaces, then its children by name only.
    async fn introspect(&self, #[zbus(object_server)] server: &ObjectServer) -> String {
        let mut xml = String::from(
            "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \
             \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n",
        );
        xml.push_str(STANDARD_XML);
        if self.path == CONTROLLER_PATH {
            if let Ok(iface) = server
                .interface::<_, Counted<ControllerObject>>(CONTROLLER_PATH)
                .await
            {
                iface.get().await.introspect_to_writer(&mut xml, 2);
            }
            if let Ok(iface) = server
                .interface::<_, Counted<DroverControllerObject>>(CONTROLLER_PATH)
                .await
            {
                iface.get().await.introspect_to_writer(&mut xml, 2);
            }
        }
        for child in self.tree.children(&self.path) {
            let _ = writeln!(xml, "  <node name=\"{child}\"/>");
        }
        xml.push_str("</node>\n");
        xml
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_and_children() {
        assert_eq!(
            ancestors("/org/eclipse/bluechi"),
            ["/", "/org", "/org/eclipse"]
        );
        assert_eq!(ancestors("/a"), ["/"]);
        assert_eq!(child_label("/", "/org/eclipse"), Some("org"));
        assert_eq!(child_label("/org", "/org/eclipse/x"), Some("eclipse"));
        assert_eq!(child_label("/org/ecl", "/org/eclipse"), None);
        assert_eq!(child_label("/org", "/org"), None);
        let t = Tree::default();
        for p in [
            "/org/eclipse/bluechi",
            "/org/eclipse/bluechi/node/n1",
            "/org/eclipse/bluechi/node/n2",
            "/org/eclipse/bluechi/job/7",
        ] {
            t.lock().insert(p.into());
        }
        let c: Vec<String> = t.children("/org/eclipse/bluechi").into_iter().collect();
        assert_eq!(c, ["job", "node"]);
        let c: Vec<String> = t
            .children("/org/eclipse/bluechi/node")
            .into_iter()
            .collect();
        assert_eq!(c, ["n1", "n2"]);
        t.removed("/org/eclipse/bluechi/job/7");
        assert!(t.children("/org/eclipse/bluechi/job").is_empty());
    }

    /// Paths that share a parent's spelling without being below it sort on
    /// both sides of its range ('-' and '.' before '/', '0' after); none is
    /// taken for a child, and every path below is.
    #[test]
    fn the_range_below_a_path_holds_its_children_and_nothing_else() {
        let paths: BTreeSet<String> = [
            "/",
            "/a",
            "/a/node",
            "/a/node-x",
            "/a/node.y",
            "/a/node/n1",
            "/a/node/n2/deep",
            "/a/node0",
            "/a/nodes/z",
            "/b",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let below = |parent: &str| labels_below(&paths, parent).collect::<Vec<_>>();
        assert_eq!(below("/a/node"), ["n1", "n2"]);
        assert_eq!(below("/a/nodes"), ["z"]);
        assert!(below("/a/node-x").is_empty());
        assert!(below("/a/nod").is_empty());
        assert!(below("/b").is_empty());
        let mut root = below("/");
        root.dedup();
        assert_eq!(root, ["a", "b"]);
        // The same answers as looking at every path, for every parent.
        for parent in &paths {
            let every: Vec<&str> = paths
                .iter()
                .filter_map(|p| child_label(parent, p))
                .collect();
            assert_eq!(below(parent), every, "below {parent}");
        }
    }
}
