//! The node table: which nodes exist, which are online, and who may register.
//!
//! Rules (docs/dev/architecture.md "Agent ↔ manager session"):
//!
//! * Every configured node (`ManagerConfig::allowed_nodes`: the names in
//!   `AllowedNodeNames`, and the allowed `[node NAME]` sections) has an entry
//!   (and a D-Bus object) from start to exit, online or not, in config order.
//!   A node admitted without being configured — by a pattern of
//!   `AllowedNodeNames` (`edge-*`), or with TLS and `AllowCertifiedNodes=true`
//!   by its certificate — gets its entry when it first registers
//!   (`Admission::Accept { new: true }`) and keeps it, offline after it
//!   leaves, until the manager exits; unless its `[node NAME]` section says
//!   `Allowed=false`.
//! * With TLS, the hello's name must be the certificate's node name
//!   (`RefuseReason::IdentityMismatch` otherwise).
//! * Who may register follows the [`Policy`] in force; a reload replaces it
//!   (entries are never removed, a node taken off the list is refused and
//!   its session dropped by the reload).
//! * Refusal messages go to an unauthenticated peer: they never name another
//!   node's address or session (only the log line does).
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
use drover_config::{ManagerConfig, NodePattern};
use drover_protocol::{NodeName, RefuseReason};
use std::collections::{HashMap, HashSet};
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
    /// The address of the previous session ([`Session::address`]), kept
    /// while offline; `""` before the first.
    last_address: String,
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

    /// Where other programs reach the node's services: the agent's
    /// `AdvertiseAddress=`, else the address the manager sees its
    /// connection come from; while offline, the last session's; `""` if it
    /// never registered.
    pub fn address(&self) -> String {
        match &self.session {
            Some(s) => s.address(),
            None => self.last_address.clone(),
        }
    }
}

/// Who may register: the names allowed, the patterns allowed, the names
/// denied, and whether a certified node may register without being listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    allowed: HashSet<NodeName>,
    patterns: Vec<NodePattern>,
    denied: HashSet<NodeName>,
    certified: bool,
}

impl Policy {
    /// `AllowedNodeNames` (with `[node NAME]` `Allowed=`), and
    /// `AllowCertifiedNodes` when TLS is configured.
    pub fn from_config(config: &ManagerConfig) -> Self {
        Self {
            allowed: config.allowed_nodes.iter().cloned().collect(),
            patterns: config.allowed_patterns.clone(),
            denied: config
                .nodes
                .iter()
                .filter(|n| n.allowed == Some(false))
                .map(|n| n.name.clone())
                .collect(),
            certified: config.tls.is_some() && config.allow_certified_nodes,
        }
    }

    /// Names only (no certified admission).
    pub fn names(allowed: &[NodeName]) -> Self {
        Self {
            allowed: allowed.iter().cloned().collect(),
            ..Self::default()
        }
    }

    /// Whether `node` may register; `certified` when its TLS certificate
    /// names it. A listed name is allowed; else `Allowed=false` refuses, and
    /// a matching pattern or the certificate admits.
    pub fn allows(&self, node: &NodeName, certified: bool) -> bool {
        self.allowed.contains(node)
            || (!self.denied.contains(node)
                && ((certified && self.certified) || self.patterns.iter().any(|p| p.matches(node))))
    }
}

/// The verdict on a hello.
pub enum Admission {
    /// `new`: the node has no entry yet (the first visit of a node admitted
    /// by a pattern or its certificate).
    Accept {
        node: NodeName,
        new: bool,
    },
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
    policy: Policy,
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
                last_address: String::new(),
            });
        }
        Self {
            nodes,
            index,
            online: 0,
            policy: Policy::names(allowed),
        }
    }

    /// Puts `policy` in force for the next hellos.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn nodes(&self) -> &[NodeEntry] {
        &self.nodes
    }

    pub fn get(&self, name: &str) -> Option<&NodeEntry> {
        // Only valid names are keys; anything else is simply unknown.
        let name = NodeName::new(name).ok()?;
        self.index.get(&name).map(|&i| &self.nodes[i])
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

    /// Decides on a hello claiming `raw_name`, at monotonic time
    /// `now_mono_us`. `certified`: the node name the connection's TLS
    /// certificate proved (`None` on plaintext).
    pub fn admit(
        &self,
        raw_name: &str,
        certified: Option<&NodeName>,
        now_mono_us: u64,
        threshold_ms: u64,
    ) -> Admission {
        let name = match self.may_register(raw_name, certified) {
            Ok(name) => name,
            Err((reason, message)) => return Admission::Refuse(reason, message),
        };
        let Some(&i) = self.index.get(&name) else {
            return Admission::Accept {
                node: name,
                new: true,
            };
        };
        match &self.nodes[i].session {
            None => Admission::Accept {
                node: name,
                new: false,
            },
            Some(old) if old.is_silent(now_mono_us, threshold_ms) => Admission::Replace {
                node: name,
                old: old.clone(),
            },
            // Say nothing of the other session (its address, its id): the
            // peer is not authenticated on plaintext, and even a certified
            // one has no business knowing.
            Some(_) => Admission::Refuse(
                RefuseReason::AlreadyConnected,
                format!(
                    "node '{name}' is already connected and alive; a second agent with the \
                     same name is refused while the first one is"
                ),
            ),
        }
    }

    /// The rules of [`Registry::admit`] that do not depend on sessions: a
    /// valid name, the one its certificate proves (if any), allowed by the
    /// policy. A standby checks them before it parks a link.
    pub fn may_register(
        &self,
        raw_name: &str,
        certified: Option<&NodeName>,
    ) -> Result<NodeName, (RefuseReason, String)> {
        let name =
            NodeName::new(raw_name).map_err(|e| (RefuseReason::InvalidName, e.to_string()))?;
        if let Some(proven) = certified
            && *proven != name
        {
            return Err((
                RefuseReason::IdentityMismatch,
                format!(
                    "this connection's certificate is for node '{proven}', so it cannot \
                     register as node '{name}'"
                ),
            ));
        }
        if !self.policy.allows(&name, certified.is_some()) {
            let why = if certified.is_some() && self.policy.certified {
                "is denied by the manager's configuration (Allowed=false)"
            } else {
                "is not in the manager's AllowedNodeNames"
            };
            return Err((RefuseReason::UnknownNode, format!("node '{name}' {why}")));
        }
        Ok(name)
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
            entry.last_address = entry.address();
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
                last_address: String::new(),
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
            refused(r.admit("a b", None, 0, 6000)).0,
            RefuseReason::InvalidName
        );
        let (reason, msg) = refused(r.admit("zzz", None, 0, 6000));
        assert_eq!(reason, RefuseReason::UnknownNode);
        assert!(
            msg.contains("zzz") && msg.contains("AllowedNodeNames"),
            "{msg}"
        );
    }

    #[test]
    fn live_duplicate_is_refused_dead_one_is_replaced() {
        let mut r = Registry::new(&names(&["a"]));
        assert!(matches!(
            r.admit("a", None, 0, 6000),
            Admission::Accept { .. }
        ));
        let s1 = session(1, "a");
        let seen = s1.last_seen_mono_us();
        r.attach(s1.clone()).ok().unwrap();
        assert_eq!(r.get("a").unwrap().status(), ONLINE);
        assert_eq!(r.get("a").unwrap().peer_ip(), "10.0.0.1");

        let (reason, msg) = refused(r.admit("a", None, seen + 1_000_000, 6000));
        assert_eq!(reason, RefuseReason::AlreadyConnected);
        assert!(msg.contains("already connected"), "{msg}");
        assert!(
            !msg.contains("10.0.0.1") && !msg.contains("session"),
            "a refusal never tells another node's address or session: {msg}"
        );

        match r.admit("a", None, seen + 7_000_000, 6000) {
            Admission::Replace { old, .. } => assert_eq!(old.id(), 1),
            _ => panic!("a silent session must be replaced"),
        }
        // Threshold 0 disables liveness: the live-session rule alone applies.
        assert_eq!(
            refused(r.admit("a", None, seen + 700_000_000, 0)).0,
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
        let seen = r.get("a").unwrap().last_seen();
        assert!(seen.0 > 0 && seen.1 > 0);
        assert!(r.detach(&NodeName::new("a").unwrap(), 5));
        assert_eq!(r.online(), 0);
        assert_eq!(
            r.get("a").unwrap().last_seen(),
            seen,
            "last seen survives the disconnect"
        );
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
        r.set_policy(Policy::names(&names(&["a", "b", "c", "d"])));
        assert!(matches!(
            r.admit("d", None, 0, 6000),
            Admission::Accept { .. }
        ));
        assert_eq!(r.controller_status().as_str(), "degraded");
    }

    #[test]
    fn certificates_name_the_node_and_certified_nodes_may_register() {
        let mut r = Registry::new(&names(&["a"]));
        let a = NodeName::new("a").unwrap();
        let b = NodeName::new("b").unwrap();
        let (reason, msg) = refused(r.admit("b", Some(&a), 0, 6000));
        assert_eq!(reason, RefuseReason::IdentityMismatch);
        assert!(msg.contains("'a'") && msg.contains("'b'"), "{msg}");
        assert!(matches!(
            r.admit("a", Some(&a), 0, 6000),
            Admission::Accept { new: false, .. }
        ));
        // Not listed, certified, but AllowCertifiedNodes is off.
        assert_eq!(
            refused(r.admit("b", Some(&b), 0, 6000)).0,
            RefuseReason::UnknownNode
        );
        let config = ManagerConfig::parse_str(
            "[drover-manager]\nAllowedNodeNames=a\nAllowCertifiedNodes=true\n\
             TLSCertificate=/c\nTLSPrivateKey=/k\nTLSCertificateAuthority=/ca\n\
             [node c]\nAllowed=false\n",
        )
        .unwrap();
        r.set_policy(Policy::from_config(&config));
        assert!(matches!(
            r.admit("b", Some(&b), 0, 6000),
            Admission::Accept { new: true, .. }
        ));
        let c = NodeName::new("c").unwrap();
        assert_eq!(
            refused(r.admit("c", Some(&c), 0, 6000)).0,
            RefuseReason::UnknownNode,
            "a listed denial still narrows certified admission"
        );
        assert_eq!(
            refused(r.admit("b", None, 0, 6000)).0,
            RefuseReason::UnknownNode,
            "without a certificate only names count"
        );
        // A reload that drops a name refuses it at the next hello.
        r.set_policy(Policy::names(&[]));
        assert_eq!(
            refused(r.admit("a", Some(&a), 0, 6000)).0,
            RefuseReason::UnknownNode
        );
    }

    #[test]
    fn patterns_admit_unlisted_names_unless_denied() {
        let config = ManagerConfig::parse_str(
            "[drover-manager]\nAllowedNodeNames=a,edge-*\n[node edge-9]\nAllowed=false\n",
        )
        .unwrap();
        let mut r = Registry::new(&config.allowed_nodes);
        r.set_policy(Policy::from_config(&config));
        assert!(matches!(
            r.admit("edge-1", None, 0, 6000),
            Admission::Accept { new: true, .. }
        ));
        assert!(matches!(
            r.admit("a", None, 0, 6000),
            Admission::Accept { new: false, .. }
        ));
        for name in ["edge-9", "edge", "b"] {
            let (reason, msg) = refused(r.admit(name, None, 0, 6000));
            assert_eq!(reason, RefuseReason::UnknownNode, "{name}");
            assert!(msg.contains("AllowedNodeNames"), "{msg}");
        }
        // Its entry, added at its first registration, stays after it leaves.
        r.add_nodes(&names(&["edge-1"]));
        r.attach(session(1, "edge-1")).ok().unwrap();
        assert!(r.detach(&NodeName::new("edge-1").unwrap(), 1));
        assert_eq!(r.get("edge-1").unwrap().status(), OFFLINE);
        assert!(matches!(
            r.admit("edge-1", None, 0, 6000),
            Admission::Accept { new: false, .. }
        ));
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
