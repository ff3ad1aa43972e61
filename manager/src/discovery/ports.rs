//! The ports each node's units declare (`[X-Drover] Port=`/`Ports=`), as the
//! node's agent last said, for `Where` rows and drover-dns's SRV records.
//!
//! Invariants:
//! * A node's book belongs to one session: what an older session said is
//!   dropped when a newer one speaks or comes online, and a late word of an
//!   older session changes nothing.
//! * At most [`PORT_UNITS_MAX`] units per node are kept; a unit already kept
//!   may change its ports beyond that.
//! * A book outlives its session only while the node's stale rows may be
//!   shown: [`PortsBook::expire`] drops it with them, so a node that left
//!   the fleet (removed from the configuration, never back) holds nothing.

use drover_protocol::ports::{PORT_UNITS_MAX, Ports};
use drover_protocol::{NodeName, UnitName};
use std::collections::HashMap;

/// See the module docs.
#[derive(Debug, Default)]
pub struct PortsBook {
    /// Per node: the session that told, and the units' ports.
    nodes: HashMap<NodeName, (u64, HashMap<UnitName, Ports>)>,
}

impl PortsBook {
    /// Session `session` of `node` came online: an older session's book goes.
    pub fn node_online(&mut self, node: &NodeName, session: u64) {
        if self.nodes.get(node).is_some_and(|(s, _)| *s != session) {
            self.nodes.remove(node);
        }
    }

    /// Session `session` of `node` says `unit` declares `ports` (empty:
    /// none). `current`: the node's session online now, if any (a word of
    /// another session is late and ignored). Whether the ports are kept.
    pub fn set(
        &mut self,
        node: &NodeName,
        session: u64,
        current: Option<u64>,
        unit: UnitName,
        ports: Ports,
    ) -> bool {
        if current.is_some_and(|s| s != session) {
            return false;
        }
        let book = self
            .nodes
            .entry(node.clone())
            .or_insert_with(|| (session, HashMap::new()));
        if book.0 != session {
            *book = (session, HashMap::new());
        }
        if ports.is_empty() {
            book.1.remove(&unit);
            if book.1.is_empty() {
                self.nodes.remove(node);
            }
            true
        } else if book.1.len() < PORT_UNITS_MAX || book.1.contains_key(&unit) {
            book.1.insert(unit, ports);
            true
        } else {
            false
        }
    }

    /// The ports `unit` declares on `node`, as `(name, port)` pairs.
    pub fn pairs(&self, node: &NodeName, unit: &UnitName) -> Vec<(String, u16)> {
        self.nodes
            .get(node)
            .and_then(|(_, units)| units.get(unit))
            .map(Ports::pairs)
            .unwrap_or_default()
    }

    /// The stale rows of `node`'s session `session` expired: its book goes
    /// with them (a newer session's stays).
    pub fn expire(&mut self, node: &NodeName, session: u64) {
        if self.nodes.get(node).is_some_and(|(s, _)| *s == session) {
            self.nodes.remove(node);
        }
    }

    /// Nodes with a book.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> NodeName {
        NodeName::new(n).unwrap()
    }

    fn unit(u: &str) -> UnitName {
        UnitName::new(u).unwrap()
    }

    fn ports(text: &str) -> Ports {
        let port = text.parse().unwrap();
        Ports::new(vec![drover_protocol::ports::Port {
            name: String::new(),
            port,
        }])
        .unwrap()
    }

    #[test]
    fn a_book_follows_its_session_and_leaves_with_its_stale_rows() {
        let (n, db) = (node("n1"), unit("db.service"));
        let mut book = PortsBook::default();
        book.node_online(&n, 5);
        assert!(book.set(&n, 5, Some(5), db.clone(), ports("5432")));
        assert_eq!(book.pairs(&n, &db), ports("5432").pairs());
        // A late word of an older session changes nothing.
        assert!(!book.set(&n, 4, Some(5), db.clone(), ports("1")));
        assert_eq!(book.pairs(&n, &db), ports("5432").pairs());
        // Offline: kept for the stale rows; their expiry takes it.
        book.expire(&n, 4);
        assert_eq!(book.nodes(), 1, "another session's expiry");
        book.expire(&n, 5);
        assert_eq!(book.nodes(), 0);
        assert!(book.pairs(&n, &db).is_empty());
        // A new session starts from nothing.
        book.set(&n, 5, None, db.clone(), ports("5432"));
        book.node_online(&n, 6);
        assert!(book.pairs(&n, &db).is_empty());
    }

    #[test]
    fn a_node_keeps_at_most_the_bound_and_none_is_no_book() {
        let n = node("n1");
        let mut book = PortsBook::default();
        for i in 0..PORT_UNITS_MAX {
            assert!(book.set(&n, 1, Some(1), unit(&format!("u{i}.service")), ports("80")));
        }
        assert!(!book.set(&n, 1, Some(1), unit("one-more.service"), ports("80")));
        assert!(book.set(&n, 1, Some(1), unit("u0.service"), ports("81")));
        for i in 0..PORT_UNITS_MAX {
            assert!(book.set(
                &n,
                1,
                Some(1),
                unit(&format!("u{i}.service")),
                Ports::default()
            ));
        }
        assert_eq!(
            book.nodes(),
            0,
            "a node whose units declare no port holds nothing"
        );
    }
}
