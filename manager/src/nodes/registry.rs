//! The node table: which nodes exist, which are online, and who may register.
//!
//! Rules (docs/architecture.md "Agent ↔ manager session"):
//!
//! * Only names in `AllowedNodeNames` exist; every one of them has an entry
//!   (and a D-Bus object) from start to exit, online or not, in config order.
//! * A name has at most one session. A newcomer for a name whose session has
//!   been silent longer than the heartbeat threshold replaces it (the old one
//!   is ended as a disconnect); otherwise the newcomer is refused with
//!   `AlreadyConnected` — a dead session never blocks reconnects for long.
//! * A session is detached only by its own id, so the end of an old session
//!   never takes a newer session of the same name offline.
//!
//! The registry is plain data behind one mutex; it never awaits. Announcing
//! changes on D-Bus is the core's job.

use crate::escape::node_path;
use crate::nodes::session::Session;
use drover_protocol::{NodeName, RefuseReason};
use std::collections::HashMap;
use std::sync::Arc;
use zbus::OwnedObjectPath;

pub const ONLINE: &str = "online";
pub const OFFLINE: &str = "offline";

pub struct NodeEntry {
    pub name: NodeName,
    pub path: OwnedObjectPath,
    pub session: Option<Arc<Session>>,
    /// Last frame of the previous session (realtime µs, monotonic µs), kept
    /// while offline like BlueChi does.
    last_seen: (u64, u64),
}

impl NodeEntry {
    /// (realtime µs, monotonic µs) of the last frame seen from this node; 0 if never.
    pub fn last_seen(&self) -> (u64, u64) {
        match &self.session {
            Some(s) => (s.last_seen_real_us(), s.last_seen_mono_us()),
            None => self.last_seen,
        }
    }

    pub fn status(&self) -> &'static str {
        if self.session.is_some() {
            ONLINE
        } else {
            OFFLINE
        }
    }

    pub fn peer_ip(&self) -> &str {
        self.session.as_deref().map(Session::peer_ip).unwrap_or("")
    }
}

/// The verdict on a hello.
pub enum Admission {
    Accept(NodeName),
    /// Accept after ending `old`, whose heartbeat expired.
    Replace {
        node: NodeName,
        old: Arc<Session>,
    },
    Refuse(RefuseReason, String),
}

/// `Controller.Status`: `down` with no node online, `up` with every
/// configured node online, `degraded` in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerStatus {
    Up,
    Degraded,
    Down,
}

impl ControllerStatus {
    pub fn compute(online: usize, total: usize) -> Self {
        if online == 0 {
            Self::Down
        } else if online >= total {
            Self::Up
        } else {
            Self::Degraded
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Degraded => "degraded",
            Self::Down => "down",
        }
    }
}

pub struct Registry {
    nodes: Vec<NodeEntry>,
    index: HashMap<NodeName, usize>,
    online: usize,
}

impl Registry {
    /// One entry per allowed name, duplicates dropped, order kept.
    pub fn new(allowed: &[NodeName]) -> Self {
        let mut nodes = Vec::with_capacity(allowed.len());
        let mut index = HashMap::with_capacity(allowed.len());
        for name in allowed {
            if index.contains_key(name) {
                continue;
            }
            index.insert(name.clone(), nodes.len());
            nodes.push(NodeEntry {
                name: name.clone(),
                path: node_path(name.as_str()),
                session: None,
                last_seen: (0, 0),
            });
        }
        Self {
            nodes,
            index,
            online: 0,
        }
    }

    pub fn nodes(&self) -> &[NodeEntry] {
        &self.nodes
    }

    pub fn get(&self, name: &str) -> Option<&NodeEntry> {
        // Only valid names are keys; anything else is simply unknown.
        let name = NodeName::new(name).ok()?;
        self.index.get(&name).map(|&i| &self.nodes[i])
    }

    /// See [`NodeEntry::last_seen`]; (0, 0) for unknown names.
    pub fn last_seen(&self, name: &str) -> (u64, u64) {
        self.get(name).map(NodeEntry::last_seen).unwrap_or((0, 0))
    }

    pub fn session(&self, name: &str) -> Option<Arc<Session>> {
        self.get(name).and_then(|n| n.session.clone())
    }

    pub fn online(&self) -> usize {
        self.online
    }

    pub fn total(&self) -> usize {
        self.nodes.len()
    }

    pub fn controller_status(&self) -> ControllerStatus {
        ControllerStatus::compute(self.online, self.nodes.len())
    }

    /// Decides on a hello claiming `raw_name`, at monotonic time `now_mono_us`.
    pub fn admit(&self, raw_name: &str, now_mono_us: u64, threshold_ms: u64) -> Admission {
        let name = match NodeName::new(raw_name) {
            Ok(name) => name,
            Err(e) => return Admission::Refuse(RefuseReason::InvalidName, e.to_string()),
        };
        let Some(&i) = self.index.get(&name) else {
            return Admission::Refuse(
                RefuseReason::UnknownNode,
                format!("node '{name}' is not in the manager's AllowedNodeNames"),
            );
        };
        match &self.nodes[i].session {
            None => Admission::Accept(name),
            Some(old) if old.is_silent(now_mono_us, threshold_ms) => Admission::Replace {
                node: name,
                old: old.clone(),
            },
            Some(old) => {
                let silent_ms = now_mono_us.saturating_sub(old.last_seen_mono_us()) / 1000;
                Admission::Refuse(
                    RefuseReason::AlreadyConnected,
                    format!(
                        "node '{name}' is already connected from {} (session {}, last heard {silent_ms} ms ago); \
                         a second agent with the same name is refused while the first one is alive",
                        old.peer_ip(),
                        old.id()
                    ),
                )
            }
        }
    }

    /// Puts `session` online. Fails (returns it back) if the name is unknown
    /// or still held by another session.
    pub fn attach(&mut self, session: Arc<Session>) -> Result<(), Arc<Session>> {
        let Some(&i) = self.index.get(session.node()) else {
            return Err(session);
        };
        let entry = &mut self.nodes[i];
        if entry.session.is_some() {
            return Err(session);
        }
        entry.session = Some(session);
        self.online += 1;
        Ok(())
    }

    /// Takes the node offline if `session_id` is its current session.
    pub fn detach(&mut self, name: &NodeName, session_id: u64) -> bool {
        let Some(&i) = self.index.get(name) else {
            return false;
        };
        let entry = &mut self.nodes[i];
        if entry.session.as_ref().is_some_and(|s| s.id() == session_id) {
            entry.last_seen = entry.last_seen();
            entry.session = None;
            self.online -= 1;
            true
        } else {
            false
        }
    }

    /// Every online session.
    pub fn sessions(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.nodes.iter().filter_map(|n| n.session.as_ref())
    }

    /// Adds an offline entry for every name not known yet, after the others
    /// and in the given order (config reload); returns the added entries'
    /// names and paths. Known names are left alone: a reload never takes a
    /// node away.
    pub fn add_nodes(&mut self, names: &[NodeName]) -> Vec<(NodeName, OwnedObjectPath)> {
        let mut added = Vec::new();
        for name in names {
            if self.index.contains_key(name) {
                continue;
            }
            self.index.insert(name.clone(), self.nodes.len());
            let path = node_path(name.as_str());
            self.nodes.push(NodeEntry {
                name: name.clone(),
                path: path.clone(),
                session: None,
                last_seen: (0, 0),
            });
            added.push((name.clone(), path));
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<NodeName> {
        v.iter().map(|s| NodeName::new(*s).unwrap()).collect()
    }

    fn session(id: u64, node: &str) -> Arc<Session> {
        Session::new(id, NodeName::new(node).unwrap(), "10.0.0.1".into()).0
    }

    fn refused(a: Admission) -> (RefuseReason, String) {
        match a {
            Admission::Refuse(r, m) => (r, m),
            _ => panic!("expected a refusal"),
        }
    }

    #[test]
    fn config_order_and_duplicates() {
        let r = Registry::new(&names(&["b", "a", "b", "node-bar"]));
        let order: Vec<_> = r.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(order, ["b", "a", "node-bar"]);
        assert_eq!(
            r.get("node-bar").unwrap().path.as_str(),
            "/org/eclipse/bluechi/node/node_2dbar"
        );
        assert!(
            r.nodes()
                .iter()
                .all(|n| n.status() == OFFLINE && n.peer_ip().is_empty())
        );
    }

    #[test]
    fn invalid_and_unknown_names_are_refused() {
        let r = Registry::new(&names(&["a"]));
        assert_eq!(
            refused(r.admit("a b", 0, 6000)).0,
            RefuseReason::InvalidName
        );
        let (reason, msg) = refused(r.admit("zzz", 0, 6000));
        assert_eq!(reason, RefuseReason::UnknownNode);
        assert!(
            msg.contains("zzz") && msg.contains("AllowedNodeNames"),
            "{msg}"
        );
    }

    #[test]
    fn live_duplicate_is_refused_dead_one_is_replaced() {
        let mut r = Registry::new(&names(&["a"]));
        assert!(matches!(r.admit("a", 0, 6000), Admission::Accept(_)));
        let s1 = session(1, "a");
        let seen = s1.last_seen_mono_us();
        r.attach(s1.clone()).ok().unwrap();
        assert_eq!(r.get("a").unwrap().status(), ONLINE);
        assert_eq!(r.get("a").unwrap().peer_ip(), "10.0.0.1");

        let (reason, msg) = refused(r.admit("a", seen + 1_000_000, 6000));
        assert_eq!(reason, RefuseReason::AlreadyConnected);
        assert!(msg.contains("already connected"), "{msg}");

        match r.admit("a", seen + 7_000_000, 6000) {
            Admission::Replace { old, .. } => assert_eq!(old.id(), 1),
            _ => panic!("a silent session must be replaced"),
        }
        // Threshold 0 disables liveness: the live-session rule alone applies.
        assert_eq!(
            refused(r.admit("a", seen + 700_000_000, 0)).0,
            RefuseReason::AlreadyConnected
        );
        // A second attach while held fails.
        assert!(r.attach(session(2, "a")).is_err());
    }

    #[test]
    fn detach_only_by_current_session_id() {
        let mut r = Registry::new(&names(&["a"]));
        r.attach(session(5, "a")).ok().unwrap();
        assert!(
            !r.detach(&NodeName::new("a").unwrap(), 4),
            "an old session's end must not take a newer one down"
        );
        assert_eq!(r.online(), 1);
        let seen = r.last_seen("a");
        assert!(seen.0 > 0 && seen.1 > 0);
        assert!(r.detach(&NodeName::new("a").unwrap(), 5));
        assert_eq!(r.online(), 0);
        assert_eq!(r.last_seen("a"), seen, "last seen survives the disconnect");
        assert!(r.session("a").is_none());
    }

    #[test]
    fn reload_adds_nodes_after_the_others() {
        let mut r = Registry::new(&names(&["a", "b"]));
        r.attach(session(1, "a")).ok().unwrap();
        let added = r.add_nodes(&names(&["b", "c", "a", "d", "c"]));
        let added: Vec<_> = added
            .iter()
            .map(|(n, p)| (n.as_str(), p.as_str()))
            .collect();
        assert_eq!(
            added,
            [
                ("c", "/org/eclipse/bluechi/node/c"),
                ("d", "/org/eclipse/bluechi/node/d")
            ]
        );
        let order: Vec<_> = r.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(order, ["a", "b", "c", "d"]);
        assert_eq!(r.get("a").unwrap().status(), ONLINE, "untouched");
        assert_eq!(r.get("d").unwrap().status(), OFFLINE);
        assert!(matches!(r.admit("d", 0, 6000), Admission::Accept(_)));
        assert_eq!(r.controller_status().as_str(), "degraded");
    }

    #[test]
    fn controller_status_thresholds() {
        assert_eq!(ControllerStatus::compute(0, 3), ControllerStatus::Down);
        assert_eq!(ControllerStatus::compute(1, 3), ControllerStatus::Degraded);
        assert_eq!(ControllerStatus::compute(3, 3), ControllerStatus::Up);
        assert_eq!(ControllerStatus::compute(0, 0), ControllerStatus::Down);
        let mut r = Registry::new(&names(&["a", "b"]));
        assert_eq!(r.controller_status().as_str(), "down");
        r.attach(session(1, "a")).ok().unwrap();
        assert_eq!(r.controller_status().as_str(), "degraded");
        r.attach(session(2, "b")).ok().unwrap();
        assert_eq!(r.controller_status().as_str(), "up");
    }
}
