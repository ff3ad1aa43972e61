//! The replay of a new `*` watch: a virtual `UnitNew("*")`, then per loaded
//! unit in unit-name order its health if it has one (as a watch by name
//! hears it, `hub/health.rs`), `UnitNew` and `UnitStateChanged`, for each node the
//! sink watches through `*` ([`crate::units::hub`] owns the sinks and
//! queues; this module decides what to tell next).
//!
//! Invariants:
//!
//! * The replay never counts as the sink being slow, however large the
//!   fleet: it is not copied into the queue at once but made from the
//!   records by a cursor per node ([`Replay`]), as far as the hub's room
//!   check allows (at most half the queue), and resumed when the owner has
//!   taken items. It holds names only, never events: its memory is one
//!   cursor per node.
//! * Past the pseudo unit `*`, a node's replay waits until its agent has
//!   confirmed a `*` subscription (or the node is offline): until then the
//!   agent's own answer (every loaded unit, virtual) is still arriving, and
//!   as news to the records it would otherwise reach the queue all at once;
//!   held back like any unit not reached yet, it is told from the records
//!   ([`Replay::release`] puts the node back in line).
//! * [`Replay::ahead`] says which events the sink must not get yet: those of
//!   a unit (or of the pseudo unit `*` of a node) the replay has not reached.
//!   They already changed the record, so the announcement carries their
//!   outcome and tag; every event after a unit's announcement succeeds it.

use crate::units::health::{HealthBook, health_replay};
use crate::units::records::{Change, Record, Records, UnitEvent};
use drover_protocol::{ModTag, NodeName, Reason, UnitName};
use std::collections::{HashMap, HashSet, VecDeque};

/// How far a sink's replay of one node's `*` has got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    /// Nothing told yet, not even the virtual `UnitNew("*")`.
    Start,
    /// Told `UnitNew("*")` (if the node was online) and every loaded unit
    /// up to and including this one, in name order (`None`: none yet).
    After(Option<UnitName>),
}

/// What the replay reads of one node it is telling a sink about.
pub struct NodeView<'a> {
    /// The node has a session.
    pub online: bool,
    /// Its agent confirmed the `*` subscription in this session.
    pub star_confirmed: bool,
    /// The tag of the pseudo unit's virtual `UnitNew("*")`.
    pub star_tag: ModTag,
    pub records: &'a Records,
    /// Every node's health: a unit's is told with it.
    pub health: &'a HealthBook,
}

/// The lazy replay of one sink's `*` watches: nodes in the order they were
/// watched, each with its cursor over the node's records. A node whose
/// agent has not confirmed a `*` subscription yet waits apart and rejoins
/// the order when it has, or when the node goes offline.
#[derive(Default)]
pub struct Replay {
    order: VecDeque<NodeName>,
    waiting: HashSet<NodeName>,
    /// Every node of `order` and `waiting`.
    cursors: HashMap<NodeName, Cursor>,
}

impl Replay {
    /// A new `*` watch of `node`: its replay starts, unless one is still
    /// under way (which keeps its cursor).
    pub fn begin(&mut self, node: &NodeName) {
        if !self.cursors.contains_key(node) {
            self.order.push_back(node.clone());
            self.cursors.insert(node.clone(), Cursor::Start);
        }
    }

    /// True while some node's replay is not told in full.
    pub fn is_running(&self) -> bool {
        !self.cursors.is_empty()
    }

    /// True when the replay has not told the sink of (node, unit) yet
    /// (`unit` `None`: the pseudo unit `*`).
    pub fn ahead(&self, node: &NodeName, unit: Option<&UnitName>) -> bool {
        if self.cursors.is_empty() {
            // The common case, on every delivery: no hashing.
            return false;
        }
        match (self.cursors.get(node), unit) {
            (None, _) => false,
            (Some(Cursor::Start), _) => true,
            (Some(Cursor::After(_)), None) => false,
            (Some(Cursor::After(None)), Some(_)) => true,
            (Some(Cursor::After(Some(last))), Some(u)) => u > last,
        }
    }

    /// `node`'s agent confirmed its `*` subscription, or the node went
    /// offline: a replay waiting for it gets back in line. True if one was
    /// waiting (then [`Replay::tell`] should run).
    pub fn release(&mut self, node: &NodeName) -> bool {
        let waited = self.waiting.remove(node);
        if waited {
            self.order.push_back(node.clone());
        }
        waited
    }

    /// The sink's last `*` watch of `node` went: a replay waiting for the
    /// agent's `*` there ends, since no confirmation may ever come for it.
    pub fn end_waiting(&mut self, node: &NodeName) {
        if self.waiting.remove(node) {
            self.cursors.remove(node);
        }
    }

    /// Tells the next events of the replay through `push` while `room`
    /// allows that many more; a node whose records are all told leaves the
    /// replay. `view` reads a node the sink still watches through `*`
    /// (`None`: no longer watched that way, or unknown: its replay ends).
    pub fn tell<'a>(
        &mut self,
        view: impl Fn(&NodeName) -> Option<NodeView<'a>>,
        room: impl Fn(usize) -> bool,
        mut push: impl FnMut(UnitEvent),
    ) {
        loop {
            let Some(node) = self.order.front() else {
                return;
            };
            let cursor = self.cursors.get(node);
            let ns = view(node);
            // The agent's answer to `*` (every loaded unit) is not all in
            // the records yet: what it brings would reach the queue as news,
            // all at once. Past the pseudo unit `*`, the node waits, its
            // events held back as for any unit not reached yet, until
            // `release`.
            if let (Some(ns), Some(Cursor::After(_))) = (&ns, cursor)
                && ns.online
                && !ns.star_confirmed
            {
                let node = node.clone();
                self.order.pop_front();
                self.waiting.insert(node);
                continue;
            }
            let (events, next) = match (ns, cursor) {
                (Some(ns), Some(Cursor::Start)) => {
                    let star = ns.online.then(|| UnitEvent {
                        node: node.clone(),
                        unit: None,
                        tag: ns.star_tag,
                        change: Change::New {
                            reason: Reason::Virtual,
                        },
                    });
                    (star.into_iter().collect(), Some(Cursor::After(None)))
                }
                (Some(ns), Some(Cursor::After(last))) => {
                    match ns.records.next_loaded_after(last.as_ref()) {
                        Some((u, rec)) => (
                            health_replay(ns.health, node, u)
                                .into_iter()
                                .chain(virtual_replay(node, u, rec))
                                .collect(),
                            Some(Cursor::After(Some(u.clone()))),
                        ),
                        None => (Vec::new(), None),
                    }
                }
                // No longer watched through `*`, or done.
                _ => (Vec::new(), None),
            };
            if !events.is_empty() && !room(events.len()) {
                return;
            }
            let node = node.clone();
            for event in events {
                push(event);
            }
            match next {
                Some(c) => {
                    self.cursors.insert(node, c);
                }
                None => {
                    self.order.pop_front();
                    self.cursors.remove(&node);
                }
            }
        }
    }
}

/// The virtual `UnitNew` (+ `UnitStateChanged` when the state is known) that
/// tells one new watch about a loaded unit from its record.
pub fn virtual_replay(node: &NodeName, unit: &UnitName, rec: &Record) -> Vec<UnitEvent> {
    let ev = |change| UnitEvent {
        node: node.clone(),
        unit: Some(unit.clone()),
        tag: rec.tag,
        change,
    };
    let mut events = vec![ev(Change::New {
        reason: Reason::Virtual,
    })];
    if !rec.active_state.is_empty() {
        events.push(ev(Change::State {
            active_state: rec.active_state.clone(),
            sub_state: rec.sub_state.clone(),
            reason: Reason::Virtual,
        }));
    }
    events
}
