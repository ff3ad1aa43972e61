//! The hub's side of health: agents' verdicts go into the [`HealthBook`]
//! under the hub's lock, and each change goes to the watchers of its unit
//! as a [`Change::Health`] event, in the order of the unit events (the agent
//! tags both from one counter), so a proxy relay never pairs a new
//! activation with an old verdict. A new watch of a unit with health hears
//! it first (before the unit's state, see `watch`): a target with a check
//! is never taken for one without (`drover_protocol::verdict`).
//!
//! The queries (`GetUnitHealth`, `ListHealth`, `ListNodeHealth`) read the
//! book under the same lock.

use super::*;
use crate::units::health::{
    HealthRow, HealthUnknown, Lookup, NodeEntry, NodeHealthRow, UnitChange, health_change, usec,
};
use drover_protocol::health::HealthState;
use std::time::SystemTime;

impl Subscriptions {
    /// A health event of `session` (`UnitHealth`, `HealthSnapshot`,
    /// `NodeHealth`; others are ignored): recorded, and each unit change
    /// queued to the unit's watchers. Returns the node's health when it
    /// changed (for the log and metrics).
    pub fn on_health(self: &Arc<Self>, session: &Session, event: Event) -> Option<NodeEntry> {
        let now = SystemTime::now();
        let node = session.node();
        let mut st = self.lock();
        let (changes, node_change) = match event {
            Event::UnitHealth { tag, unit, health } => (
                st.health
                    .unit(node, session.id(), tag, &unit, &health, now)
                    .into_iter()
                    .collect(),
                None,
            ),
            Event::HealthSnapshot { tag, part } => {
                st.health.snapshot(node, session.id(), tag, part, now)
            }
            Event::NodeHealth(health) => (
                Vec::new(),
                st.health.node_health(node, session.id(), &health, now),
            ),
            _ => return None,
        };
        let mut full = Vec::new();
        for change in changes {
            full.extend(st.deliver_health(node, session.id(), change));
        }
        if !full.is_empty() {
            full.sort_unstable();
            full.dedup();
            let mut syncs = Syncs::new();
            st.drop_overflowed(full, &mut syncs);
            drop(st);
            self.start_syncs(syncs);
        }
        node_change
    }

    /// The health of `unit` on `node`: (state, reason, since µs); `Err` with
    /// the reason when the node is unknown or offline.
    pub fn unit_health(
        &self,
        node: &NodeName,
        unit: &UnitName,
    ) -> Result<(HealthState, String, u64), HealthUnknown> {
        let st = self.lock();
        match st.health.get(node, unit) {
            Lookup::UnknownNode => Err(HealthUnknown::NeverConnected),
            Lookup::Offline => Err(HealthUnknown::Offline),
            Lookup::None => Ok((HealthState::None, String::new(), 0)),
            Lookup::Found(e) => Ok((e.state, e.reason.clone(), e.since_usec())),
        }
    }

    /// Every unit with health on every online node, sorted by (node, unit).
    pub fn list_health(&self) -> Vec<HealthRow> {
        let st = self.lock();
        st.health
            .rows()
            .into_iter()
            .map(|(n, u, e)| {
                (
                    n.to_string(),
                    u.to_string(),
                    e.state.as_str().to_owned(),
                    e.reason.clone(),
                    e.since_usec(),
                )
            })
            .collect()
    }

    /// The health of an online node, once its agent said it.
    pub fn node_health(&self, node: &NodeName) -> Option<NodeEntry> {
        self.lock().health.node(node).cloned()
    }

    /// [`Subscriptions::node_health`] of every online node that said it,
    /// sorted by node.
    pub fn list_node_health(&self) -> Vec<NodeHealthRow> {
        let st = self.lock();
        st.health
            .nodes()
            .into_iter()
            .map(|(n, e)| {
                (
                    n.to_string(),
                    e.state.as_str().to_owned(),
                    e.reason.clone(),
                    usec(e.since),
                    e.system_state.clone(),
                )
            })
            .collect()
    }

    /// Whether `node` has a session now.
    pub fn is_online(&self, node: &NodeName) -> bool {
        self.lock()
            .nodes
            .get(node)
            .is_some_and(|ns| ns.session.is_some())
    }
}

impl State {
    /// Queues one unit's health change to the watchers of the unit (by name
    /// or `*`) on `node`, if `session` is the node's current one; returns
    /// the sinks that overflowed.
    fn deliver_health(&mut self, node: &NodeName, session: u64, change: UnitChange) -> Vec<SinkId> {
        let Some(ns) = self.nodes.get_mut(node) else {
            return Vec::new();
        };
        if !ns.in_session(session) {
            return Vec::new();
        }
        // Virtual events made later (node offline) continue after this tag.
        if change.tag.guid == ns.guid && change.tag.index > ns.max_index {
            ns.max_index = change.tag.index;
        }
        let key = Some(change.unit);
        let sinks = State::sinks_for(ns, &key);
        if sinks.is_empty() {
            return Vec::new();
        }
        let event = Arc::new(UnitEvent {
            node: node.clone(),
            unit: key,
            tag: change.tag,
            change: health_change(change.entry.as_ref(), Reason::Real),
        });
        self.deliver(&sinks, &event)
    }
}
