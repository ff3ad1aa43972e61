//! The unit → nodes index: for each indexed unit, one row per node where
//! the unit is loaded (its active and sub state, its health, when the row
//! last changed, and since when it is stale if its node went offline).
//!
//! Pure data, no tasks, no locks; [`crate::discovery`] feeds it from the
//! hub's unit events and asks it. Invariants:
//!
//! * At most `cap` units are indexed. Indexing one more evicts the unit
//!   asked about least recently ([`Index::insert`] returns it, so the caller
//!   drops its watches). Rows exist only for indexed units, so the index
//!   holds at most `cap` × nodes rows.
//! * A row is written only by the session (`session`) that last reported
//!   the unit; events of a node's dead session are the caller's to drop.
//! * A stale row is the last-good record of an offline node: it keeps its
//!   states and health, `stale_since_usec` says when it went stale, and it
//!   counts only until the retention runs out ([`Index::select`] leaves
//!   expired rows out even before [`Index::expire`] removes them).
//! * `since_usec` moves when the state, sub state, health or staleness of
//!   the row changes, not on a repeated report of the same thing.

use crate::units::records::Change;
use drover_config::NodePattern;
use drover_protocol::health::HealthState;
use drover_protocol::{NodeName, UnitName};
use std::collections::{BTreeMap, HashMap};

/// Units the index holds by default (see [`Index::new`]).
pub const DEFAULT_CAP: usize = 128;

/// One unit on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Empty until the first state is known (a health report may come
    /// first); such a row is never returned.
    pub active_state: String,
    pub sub_state: String,
    pub health: HealthState,
    /// The session that wrote the row last.
    pub session: u64,
    /// Realtime µs of the row's last change.
    pub since_usec: u64,
    /// Realtime µs when the node went offline, while the row is stale.
    pub stale_since_usec: Option<u64>,
}

impl Row {
    fn new(session: u64, now_usec: u64) -> Self {
        Self {
            active_state: String::new(),
            sub_state: String::new(),
            health: HealthState::None,
            session,
            since_usec: now_usec,
            stale_since_usec: None,
        }
    }

    /// Active or reloading (what a default `Where` lists).
    pub fn is_up(&self) -> bool {
        matches!(self.active_state.as_str(), "active" | "reloading")
    }

    /// Up, and healthy or without a declared check.
    pub fn is_healthy(&self) -> bool {
        self.is_up() && matches!(self.health, HealthState::Healthy | HealthState::None)
    }
}

/// Which nodes a query is about.
#[derive(Debug, Clone)]
pub enum NodeFilter {
    All,
    Name(NodeName),
    Pattern(NodePattern),
}

impl NodeFilter {
    /// `*` (or empty) = every node; a name without `*`, `?`, `[` is one
    /// node; anything else is a node-name pattern (`config::pattern`'s rules).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() || text == "*" {
            return Ok(Self::All);
        }
        if drover_config::pattern::is_pattern(text) {
            return NodePattern::new(text).map(Self::Pattern);
        }
        NodeName::new(text)
            .map(Self::Name)
            .map_err(|e| e.to_string())
    }

    pub fn matches(&self, node: &NodeName) -> bool {
        match self {
            Self::All => true,
            Self::Name(n) => n == node,
            Self::Pattern(p) => p.matches(node),
        }
    }
}

/// What a query asks for (the options of `Where`).
#[derive(Debug, Clone)]
pub struct Filter {
    pub healthy: bool,
    pub stale: bool,
    pub all: bool,
    pub nodes: NodeFilter,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            healthy: false,
            stale: false,
            all: false,
            nodes: NodeFilter::All,
        }
    }
}

impl Filter {
    /// Whether `row` of `node` belongs in the answer (drain aside), with
    /// stale rows older than `retention_usec` at `now_usec` left out.
    pub fn admits(&self, node: &NodeName, row: &Row, now_usec: u64, retention_usec: u64) -> bool {
        if row.active_state.is_empty() {
            return false;
        }
        if let Some(t) = row.stale_since_usec
            && (!self.stale || now_usec.saturating_sub(t) >= retention_usec)
        {
            return false;
        }
        let state_ok = if self.healthy {
            row.is_healthy()
        } else {
            self.all || row.is_up()
        };
        state_ok && self.nodes.matches(node)
    }
}

#[derive(Debug, Default)]
struct Entry {
    rows: BTreeMap<NodeName, Row>,
    /// When it was last asked about (the index's own counter).
    asked: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Index {
    units: HashMap<UnitName, Entry>,
    cap: usize,
    tick: u64,
}

impl Index {
    /// An index of at most `cap` units (at least 1).
    pub fn new(cap: usize) -> Self {
        Self {
            units: HashMap::new(),
            cap: cap.max(1),
            tick: 0,
        }
    }

    pub fn contains(&self, unit: &UnitName) -> bool {
        self.units.contains_key(unit)
    }

    /// The indexed units, in no order.
    pub fn units(&self) -> impl Iterator<Item = &UnitName> {
        self.units.keys()
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Rows held, stale ones included.
    pub fn row_count(&self) -> usize {
        self.units.values().map(|e| e.rows.len()).sum()
    }

    /// Marks `unit` as asked about now.
    pub fn touch(&mut self, unit: &UnitName) {
        self.tick += 1;
        if let Some(e) = self.units.get_mut(unit) {
            e.asked = self.tick;
        }
    }

    /// Indexes `unit` (asked about now); returns the unit evicted to stay
    /// within the cap, if any.
    pub fn insert(&mut self, unit: &UnitName) -> Option<UnitName> {
        if self.units.contains_key(unit) {
            self.touch(unit);
            return None;
        }
        let evicted = if self.units.len() >= self.cap {
            let oldest = self
                .units
                .iter()
                .min_by_key(|(u, e)| (e.asked, (*u).clone()))
                .map(|(u, _)| u.clone());
            if let Some(u) = &oldest {
                self.units.remove(u);
            }
            oldest
        } else {
            None
        };
        self.units.insert(unit.clone(), Entry::default());
        self.touch(unit);
        evicted
    }

    /// Applies one unit event of `session` on `node` at `now_usec`, if
    /// the unit is indexed. Property changes do not concern the index.
    pub fn apply(
        &mut self,
        node: &NodeName,
        session: u64,
        unit: &UnitName,
        change: &Change,
        now_usec: u64,
    ) {
        let Some(entry) = self.units.get_mut(unit) else {
            return;
        };
        match change {
            Change::Removed { .. } => {
                entry.rows.remove(node);
            }
            Change::New { .. } => {
                let row = entry
                    .rows
                    .entry(node.clone())
                    .or_insert_with(|| Row::new(session, now_usec));
                freshen(row, session, now_usec);
            }
            Change::State {
                active_state,
                sub_state,
                ..
            } => {
                let row = entry
                    .rows
                    .entry(node.clone())
                    .or_insert_with(|| Row::new(session, now_usec));
                if row.active_state != *active_state || row.sub_state != *sub_state {
                    row.active_state.clone_from(active_state);
                    row.sub_state.clone_from(sub_state);
                    row.since_usec = now_usec;
                }
                freshen(row, session, now_usec);
            }
            Change::Health { state, .. } => {
                let row = entry
                    .rows
                    .entry(node.clone())
                    .or_insert_with(|| Row::new(session, now_usec));
                if row.health != *state {
                    row.health = *state;
                    row.since_usec = now_usec;
                }
                freshen(row, session, now_usec);
            }
            Change::Properties { .. } => {}
        }
    }

    /// `session` of `node` ended at `now_usec`: its rows become stale.
    /// Returns how many did.
    pub fn node_offline(&mut self, node: &NodeName, session: u64, now_usec: u64) -> usize {
        let mut n = 0;
        for entry in self.units.values_mut() {
            if let Some(row) = entry.rows.get_mut(node)
                && row.session == session
                && row.stale_since_usec.is_none()
            {
                row.stale_since_usec = Some(now_usec);
                row.since_usec = now_usec;
                n += 1;
            }
        }
        n
    }

    /// Removes the stale rows of `node` written by a session other than
    /// `current` (the node registered again, its agent's replay is in, and
    /// these units are not loaded there any more). Returns how many.
    pub fn drop_stale(&mut self, node: &NodeName, current: u64) -> usize {
        self.remove_where(node, |r| {
            r.stale_since_usec.is_some() && r.session != current
        })
    }

    /// Removes the stale rows of `node` written by `session` (their
    /// retention ran out). Returns how many.
    pub fn expire(&mut self, node: &NodeName, session: u64) -> usize {
        self.remove_where(node, |r| {
            r.stale_since_usec.is_some() && r.session == session
        })
    }

    /// Removes every row that is not stale (the events that kept them are
    /// lost; a replay will write them again).
    pub fn clear_fresh(&mut self) {
        for entry in self.units.values_mut() {
            entry.rows.retain(|_, r| r.stale_since_usec.is_some());
        }
    }

    fn remove_where(&mut self, node: &NodeName, f: impl Fn(&Row) -> bool) -> usize {
        let mut n = 0;
        for entry in self.units.values_mut() {
            if entry.rows.get(node).is_some_and(&f) {
                entry.rows.remove(node);
                n += 1;
            }
        }
        n
    }

    /// The rows of `unit` the filter admits, in node order (`None`: the
    /// unit is not indexed).
    pub fn select<'a>(
        &'a self,
        unit: &UnitName,
        filter: &'a Filter,
        now_usec: u64,
        retention_usec: u64,
    ) -> Option<impl Iterator<Item = (&'a NodeName, &'a Row)> + 'a> {
        let entry = self.units.get(unit)?;
        let rows: Box<dyn Iterator<Item = (&NodeName, &Row)>> = match &filter.nodes {
            NodeFilter::Name(n) => Box::new(entry.rows.get_key_value(n).into_iter()),
            _ => Box::new(entry.rows.iter()),
        };
        Some(rows.filter(move |(n, r)| filter.admits(n, r, now_usec, retention_usec)))
    }
}

/// A report of `session` makes a row fresh again (and its own).
fn freshen(row: &mut Row, session: u64, now_usec: u64) {
    if row.stale_since_usec.take().is_some() {
        row.since_usec = now_usec;
    }
    row.session = session;
}

#[cfg(test)]
mod tests;
