//! Warm-up after a manager start: the window in which the absence of a
//! node, or of what it would report, proves nothing, because nodes known
//! before the start may not have registered again yet (docs/discovery.md).
//!
//! A [`WarmUp`] awaits a set of nodes until a deadline. Invariants: it is
//! over once every awaited node registered or the deadline passed, and it
//! never starts again (a node that goes away later is a real absence); a
//! node stops being awaited at its first registration. Pure: the caller
//! passes the clock.

use drover_protocol::NodeName;
use std::collections::HashSet;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct WarmUp {
    awaited: HashSet<NodeName>,
    until: Instant,
}

impl WarmUp {
    /// Awaits `nodes` until `until`.
    pub fn new(nodes: impl IntoIterator<Item = NodeName>, until: Instant) -> Self {
        Self {
            awaited: nodes.into_iter().collect(),
            until,
        }
    }

    /// A warm-up that is over from the start.
    pub fn over() -> Self {
        Self::new([], Instant::now())
    }

    /// `node` registered. True when it was the last one awaited (the
    /// warm-up ends now, unless its deadline ended it before).
    pub fn arrived(&mut self, node: &NodeName) -> bool {
        self.awaited.remove(node) && self.awaited.is_empty()
    }

    /// Whether the warm-up still runs at `now`.
    pub fn is_on(&self, now: Instant) -> bool {
        now < self.until && !self.awaited.is_empty()
    }

    /// Whether `node` has not registered since the start (regardless of
    /// the deadline).
    pub fn awaits(&self, node: &NodeName) -> bool {
        self.awaited.contains(node)
    }

    /// When the warm-up ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn n(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    #[test]
    fn ends_when_the_last_awaited_node_arrives_or_at_the_deadline() {
        let t0 = Instant::now();
        let mut w = WarmUp::new([n("a"), n("b")], t0 + Duration::from_secs(60));
        assert!(w.is_on(t0));
        assert!(!w.arrived(&n("c")), "a node not awaited changes nothing");
        assert!(!w.arrived(&n("a")));
        assert!(w.is_on(t0) && w.awaits(&n("b")) && !w.awaits(&n("a")));
        assert!(
            !w.is_on(t0 + Duration::from_secs(60)),
            "the deadline ends it"
        );
        assert!(w.arrived(&n("b")));
        assert!(!w.is_on(t0));
        assert!(!w.arrived(&n("b")), "it ends once");
        assert!(!WarmUp::over().is_on(t0));
    }
}
