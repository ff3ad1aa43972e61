//! The health of every node's units and of the nodes themselves, as their
//! agents report it (`drover_protocol::health`): what
//! `io.drover.Node.GetUnitHealth`, `io.drover.Controller.ListHealth` and
//! `ListNodeHealth` answer, and the changes the hub fans out to the watchers
//! of a unit (`crate::units::hub`, file `hub/health.rs`).
//!
//! Pure data, no lock, no task: the hub keeps one [`HealthBook`] under its
//! own lock, so recording a change and queueing it to the watchers are one
//! step, in the order of the unit events the agent tagged from the same
//! counter.
//!
//! Rules:
//!
//! * Only a node's current session writes its entries (the tag's guid is
//!   the session id); an event of an older session is dropped.
//! * A unit's entry is replaced only by a newer tag ([`ModTag::succeeds`]);
//!   a verdict that says what the entry says (state and reason) is no
//!   change and goes nowhere. `none` removes the entry.
//! * A session starts with a snapshot in parts; the parts are gathered
//!   (at most [`MAX_UNITS_PER_NODE`] units) and applied when the last one
//!   arrives: every unit it lists is set, and every unit the book held from
//!   before and the snapshot lacks turns `none` (its check went away while
//!   the node was offline), unless a later event already spoke for it.
//! * [`HealthCounts`] holds the units by state over the online nodes,
//!   moved by every change of an entry and by a node going on- or offline
//!   (for the metrics endpoint, read without the hub's lock).
//! * An offline node keeps its entries, marked offline: the queries say the
//!   node is offline rather than repeat a verdict nobody checks any more,
//!   and the next session's snapshot tells what changed meanwhile.
//! * Bounded, whatever an agent sends: at most [`MAX_UNITS_PER_NODE`] units
//!   per node (the extra ones are ignored), each reason at most
//!   `drover_protocol::health::REASON_MAX` bytes (the decoder's bound), and
//!   the reasons of one node's units together at most
//!   [`REASON_BYTES_PER_NODE`] (a reason that would pass it is cut to what
//!   is left); a snapshot being gathered is bounded the same way, apart.
//!   So one node costs at most about [`MAX_UNITS_PER_NODE`] times a unit
//!   name and an entry, plus [`REASON_BYTES_PER_NODE`], twice while a
//!   snapshot is gathered. Each bound is logged once per session when an agent hits it.

use crate::units::records::{Change, UnitEvent};
use drover_protocol::health::{Health, HealthSnapshot, HealthState, NodeHealth, cut_to};
use drover_protocol::{ModTag, NodeName, Reason, UnitName};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A row of `ListHealth`: node, unit, state, reason, since (realtime µs).
pub type HealthRow = (String, String, String, String, u64);
/// A row of `ListNodeHealth`: node, state, reason, since, system state.
pub type NodeHealthRow = (String, String, String, u64, String);

/// Why a unit's health is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthUnknown {
    /// The node did not connect since the manager started.
    NeverConnected,
    /// The node is offline.
    Offline,
}

/// Most units with health one node may have in the book (the agent's own
/// bound: it checks no more).
pub const MAX_UNITS_PER_NODE: usize = drover_protocol::health::UNITS_MAX;

/// Most bytes of reasons the book holds for one node's units (and, apart,
/// for a snapshot being gathered): 256 full check outputs.
pub const REASON_BYTES_PER_NODE: usize = 256 * drover_protocol::health::REASON_MAX;

/// One unit's verdict as the manager keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub state: HealthState,
    pub reason: String,
    /// When the state began, on the manager's clock.
    pub since: SystemTime,
    /// The tag of the event that set it.
    pub tag: ModTag,
}

impl Entry {
    /// `since` as realtime µs (0 before the epoch).
    pub fn since_usec(&self) -> u64 {
        usec(self.since)
    }
}

/// Realtime µs of `t` (0 before the epoch), as D-Bus carries times.
pub fn usec(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A node's own health as the manager keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub state: HealthState,
    pub reason: String,
    pub since: SystemTime,
    /// systemd's `SystemState` (`running`, `degraded`, ...), empty if unknown.
    pub system_state: String,
    /// The node checks of `agent.conf`: (name, state, reason, since).
    pub checks: Vec<(String, HealthState, String, SystemTime)>,
}

/// The [`Change::Health`] of a unit's entry (`None`: no health any more).
pub fn health_change(entry: Option<&Entry>, origin: Reason) -> Change {
    match entry {
        Some(e) => Change::Health {
            state: e.state,
            reason: e.reason.clone(),
            since_usec: e.since_usec(),
            origin,
        },
        None => Change::Health {
            state: HealthState::None,
            reason: String::new(),
            since_usec: 0,
            origin,
        },
    }
}

/// The virtual health event a new watch of `unit` on `node` (by name or
/// through `*`) hears before the unit's state, if the unit has health now.
pub fn health_replay(book: &HealthBook, node: &NodeName, unit: &UnitName) -> Option<UnitEvent> {
    let entry = book.current(node, unit)?;
    Some(UnitEvent {
        node: node.clone(),
        unit: Some(unit.clone()),
        tag: entry.tag,
        change: health_change(Some(entry), Reason::Virtual),
    })
}

/// A unit's health changed: what the hub tells the unit's watchers. `entry`
/// is `None` when the unit has no health any more (`none`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitChange {
    pub unit: UnitName,
    pub tag: ModTag,
    pub entry: Option<Entry>,
}

/// What a lookup of one unit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The node never connected since the manager started.
    UnknownNode,
    /// The node is offline: its last verdicts are not current.
    Offline,
    /// The unit declares no check (or the node did not say so yet).
    None,
    Found(&'a Entry),
}

#[derive(Debug, Default)]
struct NodeBook {
    /// The current session, `None` while offline.
    session: Option<u64>,
    units: BTreeMap<UnitName, Entry>,
    node: Option<NodeEntry>,
    /// Bytes of the reasons in `units`.
    reason_bytes: usize,
    /// Snapshot parts gathered so far in the current session: (tag, units).
    pending: Option<(ModTag, Vec<(UnitName, Health)>)>,
    /// Bytes of the reasons in `pending`.
    pending_bytes: usize,
    /// Whether the cap on units was reported for this session (log once).
    capped: bool,
    /// Whether the cap on reason bytes was reported for this session.
    cut: bool,
}

impl NodeBook {
    fn writes(&self, session: u64, tag: Option<&ModTag>) -> bool {
        self.session == Some(session) && tag.is_none_or(|t| t.guid == session)
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct HealthBook {
    /// Boxed, as the unit hub's nodes: a map's table has room for up to
    /// twice its entries, and every node has a book (224 bytes with its
    /// name, against 32 for the name and the box).
    nodes: HashMap<NodeName, Box<NodeBook>>,
    counts: Arc<HealthCounts>,
}

/// Units of online nodes by health state (`starting`, `healthy`,
/// `unhealthy`: `none` is no entry), kept as entries change.
#[derive(Debug, Default)]
pub struct HealthCounts([AtomicI64; 3]);

impl HealthCounts {
    /// The states counted, in [`HealthCounts::get`]'s order.
    pub const STATES: [HealthState; 3] = [
        HealthState::Starting,
        HealthState::Healthy,
        HealthState::Unhealthy,
    ];

    pub fn get(&self) -> [i64; 3] {
        self.0.each_ref().map(|a| a.load(Ordering::Relaxed))
    }

    fn add(&self, state: HealthState, by: i64) {
        if let Some(i) = Self::STATES.iter().position(|s| *s == state) {
            self.0[i].fetch_add(by, Ordering::Relaxed);
        }
    }
}

fn since(now: SystemTime, ms_ago: u64) -> SystemTime {
    now.checked_sub(Duration::from_millis(ms_ago))
        .unwrap_or(UNIX_EPOCH)
}

impl HealthBook {
    /// `node` registered with `session`: only that session writes from now.
    pub fn online(&mut self, node: &NodeName, session: u64) {
        let book = self.nodes.entry(node.clone()).or_default();
        if book.session.is_none() {
            for e in book.units.values() {
                self.counts.add(e.state, 1);
            }
        }
        book.session = Some(session);
        book.pending = None;
        book.pending_bytes = 0;
        book.capped = false;
        book.cut = false;
    }

    /// `session` of `node` ended (if it is the current one).
    pub fn offline(&mut self, node: &NodeName, session: u64) {
        if let Some(book) = self.nodes.get_mut(node)
            && book.session == Some(session)
        {
            book.session = None;
            book.pending = None;
            book.pending_bytes = 0;
            for e in book.units.values() {
                self.counts.add(e.state, -1);
            }
        }
    }

    /// Units of online nodes by health state (see [`HealthCounts`]).
    pub fn counts(&self) -> Arc<HealthCounts> {
        self.counts.clone()
    }

    /// `Event::UnitHealth`: the change to fan out, if any.
    pub fn unit(
        &mut self,
        node: &NodeName,
        session: u64,
        tag: ModTag,
        unit: &UnitName,
        health: &Health,
        now: SystemTime,
    ) -> Option<UnitChange> {
        let book = self.nodes.get_mut(node)?;
        if !book.writes(session, Some(&tag)) {
            return None;
        }
        set(book, &self.counts, node, tag, unit, health, now)
    }

    /// One part of `Event::HealthSnapshot`: once the last part is in, the
    /// unit changes to fan out and the node's health if it changed.
    pub fn snapshot(
        &mut self,
        node: &NodeName,
        session: u64,
        tag: ModTag,
        part: HealthSnapshot,
        now: SystemTime,
    ) -> (Vec<UnitChange>, Option<NodeEntry>) {
        let mut changes = Vec::new();
        let Some(book) = self.nodes.get_mut(node) else {
            return (changes, None);
        };
        if !book.writes(session, Some(&tag)) {
            return (changes, None);
        }
        if book.pending.as_ref().is_none_or(|(t, _)| *t != tag) {
            // A new snapshot (another tag) replaces one never finished.
            book.pending = Some((tag, Vec::new()));
            book.pending_bytes = 0;
        }
        let NodeBook {
            pending,
            pending_bytes,
            capped,
            cut,
            ..
        } = &mut **book;
        let Some((_, gathered)) = pending else {
            return (changes, None);
        };
        let room = MAX_UNITS_PER_NODE.saturating_sub(gathered.len());
        if part.units.len() > room && !*capped {
            *capped = true;
            tracing::warn!(
                node = %node,
                "node {node} reports health for more than {MAX_UNITS_PER_NODE} units; the rest is ignored"
            );
        }
        for mut u in part.units.into_iter().take(room) {
            let left = REASON_BYTES_PER_NODE.saturating_sub(*pending_bytes);
            if u.health.reason.len() > left {
                u.health.reason = cut_to(&u.health.reason, left).to_owned();
                warn_cut(node, cut);
            }
            *pending_bytes += u.health.reason.len();
            gathered.push((u.unit, u.health));
        }
        let Some(node_health) = part.node else {
            return (changes, None);
        };
        let Some((_, listed)) = book.pending.take() else {
            return (changes, None);
        };
        book.pending_bytes = 0;
        let listed: BTreeMap<UnitName, Health> = listed.into_iter().collect();
        // Units of before that the snapshot lacks: their check went away.
        let gone: Vec<UnitName> = book
            .units
            .iter()
            .filter(|(u, e)| !listed.contains_key(*u) && tag.succeeds(&e.tag))
            .map(|(u, _)| u.clone())
            .collect();
        for unit in gone {
            let none = Health::default();
            changes.extend(set(book, &self.counts, node, tag, &unit, &none, now));
        }
        for (unit, health) in &listed {
            let newer = book.units.get(unit).is_none_or(|e| tag.succeeds(&e.tag));
            if newer {
                changes.extend(set(book, &self.counts, node, tag, unit, health, now));
            }
        }
        let node_change = set_node(book, &node_health, now);
        (changes, node_change)
    }

    /// `Event::NodeHealth`: the node's new health, if it changed.
    pub fn node_health(
        &mut self,
        node: &NodeName,
        session: u64,
        health: &NodeHealth,
        now: SystemTime,
    ) -> Option<NodeEntry> {
        let book = self.nodes.get_mut(node)?;
        if !book.writes(session, None) {
            return None;
        }
        set_node(book, health, now)
    }

    /// The health of `unit` on `node`.
    pub fn get(&self, node: &NodeName, unit: &UnitName) -> Lookup<'_> {
        match self.nodes.get(node) {
            None => Lookup::UnknownNode,
            Some(b) if b.session.is_none() => Lookup::Offline,
            Some(b) => b.units.get(unit).map_or(Lookup::None, Lookup::Found),
        }
    }

    /// The current entry of `unit` on an online `node`, if any.
    pub fn current(&self, node: &NodeName, unit: &UnitName) -> Option<&Entry> {
        match self.get(node, unit) {
            Lookup::Found(e) => Some(e),
            _ => None,
        }
    }

    /// Every unit with health on every online node, by (node, unit).
    pub fn rows(&self) -> Vec<(&NodeName, &UnitName, &Entry)> {
        let mut rows: Vec<_> = self
            .nodes
            .iter()
            .filter(|(_, b)| b.session.is_some())
            .flat_map(|(n, b)| b.units.iter().map(move |(u, e)| (n, u, e)))
            .collect();
        rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        rows
    }

    /// The health of an online node, once its agent said it.
    pub fn node(&self, node: &NodeName) -> Option<&NodeEntry> {
        self.nodes
            .get(node)
            .filter(|b| b.session.is_some())
            .and_then(|b| b.node.as_ref())
    }

    /// Every online node that said its health, by name.
    pub fn nodes(&self) -> Vec<(&NodeName, &NodeEntry)> {
        let mut rows: Vec<_> = self
            .nodes
            .iter()
            .filter(|(_, b)| b.session.is_some())
            .filter_map(|(n, b)| b.node.as_ref().map(|e| (n, e)))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        rows
    }

    /// The state of every unit with health on an online `node`, by unit
    /// (none while it is offline), for a resync digest.
    pub fn unit_states<'a>(
        &'a self,
        node: &NodeName,
    ) -> impl Iterator<Item = (&'a UnitName, HealthState)> + 'a {
        self.nodes
            .get(node)
            .filter(|b| b.session.is_some())
            .into_iter()
            .flat_map(|b| b.units.iter().map(|(u, e)| (u, e.state)))
    }

    /// Whether a health snapshot of `node` is being gathered (its parts not
    /// all in yet).
    pub fn gathering(&self, node: &NodeName) -> bool {
        self.nodes.get(node).is_some_and(|b| b.pending.is_some())
    }

    /// Units with health on `node` (any state), for tests and metrics.
    pub fn unit_count(&self, node: &NodeName) -> usize {
        self.nodes.get(node).map_or(0, |b| b.units.len())
    }

    /// Bytes of reasons held for `node`: its units' and a snapshot's being
    /// gathered (each at most [`REASON_BYTES_PER_NODE`]).
    pub fn reason_bytes(&self, node: &NodeName) -> (usize, usize) {
        self.nodes
            .get(node)
            .map_or((0, 0), |b| (b.reason_bytes, b.pending_bytes))
    }
}

/// Logs once per session that `node`'s reasons are cut to the budget.
fn warn_cut(node: &NodeName, cut: &mut bool) {
    if !*cut {
        *cut = true;
        tracing::warn!(
            node = %node,
            "node {node} reports more than {REASON_BYTES_PER_NODE} bytes of health reasons; \
             the rest is cut"
        );
    }
}

/// Sets (or removes, for `none`) one unit's entry; the change, if any.
/// Sets `unit`'s entry in `book` (of an online node), moving `counts`.
fn set(
    book: &mut NodeBook,
    counts: &HealthCounts,
    node: &NodeName,
    tag: ModTag,
    unit: &UnitName,
    health: &Health,
    now: SystemTime,
) -> Option<UnitChange> {
    if let Some(e) = book.units.get(unit)
        && !tag.succeeds(&e.tag)
    {
        return None;
    }
    if health.state == HealthState::None {
        return book.units.remove(unit).map(|old| {
            book.reason_bytes -= old.reason.len();
            counts.add(old.state, -1);
            UnitChange {
                unit: unit.clone(),
                tag,
                entry: None,
            }
        });
    }
    // What the other units' reasons leave for this one.
    let old_len = book.units.get(unit).map_or(0, |e| e.reason.len());
    let left = REASON_BYTES_PER_NODE.saturating_sub(book.reason_bytes - old_len);
    if health.reason.len() > left {
        warn_cut(node, &mut book.cut);
    }
    let entry = Entry {
        state: health.state,
        reason: cut_to(&health.reason, left).to_owned(),
        since: since(now, health.changed_ms_ago),
        tag,
    };
    let full = book.units.len() >= MAX_UNITS_PER_NODE;
    match book.units.get_mut(unit) {
        Some(e) if e.state == entry.state && e.reason == entry.reason => {
            e.tag = tag;
            None
        }
        Some(e) => {
            book.reason_bytes = book.reason_bytes - e.reason.len() + entry.reason.len();
            counts.add(e.state, -1);
            counts.add(entry.state, 1);
            *e = entry.clone();
            Some(UnitChange {
                unit: unit.clone(),
                tag,
                entry: Some(entry),
            })
        }
        None if full => {
            if !book.capped {
                book.capped = true;
                tracing::warn!(
                    node = %node,
                    "node {node} reports health for more than {MAX_UNITS_PER_NODE} units; {unit} is ignored"
                );
            }
            None
        }
        None => {
            book.reason_bytes += entry.reason.len();
            counts.add(entry.state, 1);
            book.units.insert(unit.clone(), entry.clone());
            Some(UnitChange {
                unit: unit.clone(),
                tag,
                entry: Some(entry),
            })
        }
    }
}

fn set_node(book: &mut NodeBook, health: &NodeHealth, now: SystemTime) -> Option<NodeEntry> {
    let entry = NodeEntry {
        state: health.health.state,
        reason: health.health.reason.clone(),
        since: since(now, health.health.changed_ms_ago),
        system_state: health.system_state.clone(),
        checks: health
            .checks
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    c.health.state,
                    c.health.reason.clone(),
                    since(now, c.health.changed_ms_ago),
                )
            })
            .collect(),
    };
    let same = book.node.as_ref().is_some_and(|old| {
        old.state == entry.state
            && old.reason == entry.reason
            && old.system_state == entry.system_state
            && old.checks.len() == entry.checks.len()
            && old
                .checks
                .iter()
                .zip(&entry.checks)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && a.2 == b.2)
    });
    if same {
        return None;
    }
    book.node = Some(entry.clone());
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::{Healthy, Starting, Unhealthy};
    use drover_protocol::health::{NodeCheck, SNAPSHOT_PART_MAX, UnitHealth};

    fn n(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }
    fn u(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }
    fn h(state: HealthState, reason: &str) -> Health {
        Health::new(state, reason, 0)
    }
    fn t(guid: u64, index: u64) -> ModTag {
        ModTag::new(guid, index)
    }
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000)
    }

    fn state_of(book: &HealthBook, node: &str, unit: &str) -> Option<HealthState> {
        book.current(&n(node), &u(unit)).map(|e| e.state)
    }

    #[test]
    fn only_changes_count_and_only_the_current_session_writes() {
        let mut b = HealthBook::default();
        let (a, db) = (n("a"), u("db.service"));
        // Unknown node: nothing.
        assert!(
            b.unit(&a, 1, t(1, 1), &db, &h(Healthy, ""), now())
                .is_none()
        );
        b.online(&a, 5);
        let c = b
            .unit(&a, 5, t(5, 1), &db, &h(Starting, ""), now())
            .unwrap();
        assert_eq!(c.entry.unwrap().state, Starting);
        // The same verdict again: no change.
        assert!(
            b.unit(&a, 5, t(5, 2), &db, &h(Starting, ""), now())
                .is_none()
        );
        // A foreign guid, an older session, an older tag: dropped.
        assert!(
            b.unit(&a, 5, t(4, 9), &db, &h(Healthy, ""), now())
                .is_none()
        );
        assert!(
            b.unit(&a, 4, t(4, 9), &db, &h(Healthy, ""), now())
                .is_none()
        );
        assert!(
            b.unit(&a, 5, t(5, 2), &db, &h(Healthy, ""), now())
                .is_none()
        );
        assert_eq!(state_of(&b, "a", "db.service"), Some(Starting));
        let c = b
            .unit(
                &a,
                5,
                t(5, 3),
                &db,
                &Health::new(Unhealthy, "refused", 1500),
                now(),
            )
            .unwrap();
        let e = c.entry.unwrap();
        assert_eq!((e.state, e.reason.as_str()), (Unhealthy, "refused"));
        assert_eq!(e.since, now() - Duration::from_millis(1500));
        // A new reason is a change; `none` removes.
        assert!(
            b.unit(&a, 5, t(5, 4), &db, &h(Unhealthy, "timeout"), now())
                .is_some()
        );
        let c = b
            .unit(&a, 5, t(5, 5), &db, &h(HealthState::None, ""), now())
            .unwrap();
        assert_eq!(c.entry, None);
        assert_eq!(b.get(&a, &db), Lookup::None);
        assert!(
            b.unit(&a, 5, t(5, 6), &db, &h(HealthState::None, ""), now())
                .is_none()
        );
    }

    #[test]
    fn offline_nodes_keep_entries_but_answer_offline() {
        let mut b = HealthBook::default();
        let (a, db) = (n("a"), u("db.service"));
        assert_eq!(b.get(&a, &db), Lookup::UnknownNode);
        b.online(&a, 1);
        b.unit(&a, 1, t(1, 1), &db, &h(Healthy, ""), now());
        assert_eq!(b.rows().len(), 1);
        b.offline(&a, 0); // not the current session: nothing
        assert!(matches!(b.get(&a, &db), Lookup::Found(_)));
        b.offline(&a, 1);
        assert_eq!(b.get(&a, &db), Lookup::Offline);
        assert!(b.rows().is_empty());
        assert_eq!(b.unit_count(&a), 1);
        assert!(
            b.unit(&a, 1, t(1, 2), &db, &h(Unhealthy, ""), now())
                .is_none()
        );
    }

    /// The counts follow every entry change, and count online nodes only.
    #[test]
    fn counts_follow_entries_of_online_nodes() {
        let mut b = HealthBook::default();
        let counts = b.counts();
        let (a, c, db, web) = (n("a"), n("c"), u("db.service"), u("web.service"));
        b.online(&a, 1);
        b.online(&c, 2);
        b.unit(&a, 1, t(1, 1), &db, &h(Starting, ""), now());
        b.unit(&a, 1, t(1, 2), &web, &h(Healthy, ""), now());
        b.unit(&c, 2, t(2, 1), &db, &h(Unhealthy, "x"), now());
        assert_eq!(counts.get(), [1, 1, 1]);
        b.unit(&a, 1, t(1, 3), &db, &h(Healthy, ""), now());
        assert_eq!(counts.get(), [0, 2, 1]);
        // The same state with another reason moves nothing.
        b.unit(&c, 2, t(2, 2), &db, &h(Unhealthy, "y"), now());
        assert_eq!(counts.get(), [0, 2, 1]);
        b.unit(&a, 1, t(1, 4), &web, &h(HealthState::None, ""), now());
        assert_eq!(counts.get(), [0, 1, 1]);
        // Offline: its units leave the counts; back: they return.
        b.offline(&c, 2);
        assert_eq!(counts.get(), [0, 1, 0]);
        b.online(&c, 3);
        assert_eq!(counts.get(), [0, 1, 1]);
        b.online(&c, 4); // a new session without an offline: counted once
        assert_eq!(counts.get(), [0, 1, 1]);
        // A snapshot that lacks a unit turns it `none`.
        b.snapshot(
            &c,
            4,
            t(4, 1),
            part(&[], Some(NodeHealth::default())),
            now(),
        );
        assert_eq!(counts.get(), [0, 1, 0]);
        let walked: usize = b.rows().len();
        assert_eq!(counts.get().iter().sum::<i64>(), walked as i64);
    }

    fn part(units: &[(&str, HealthState)], node: Option<NodeHealth>) -> HealthSnapshot {
        HealthSnapshot {
            units: units
                .iter()
                .map(|(name, s)| UnitHealth {
                    unit: u(name),
                    health: h(*s, ""),
                })
                .collect(),
            node,
        }
    }

    #[test]
    fn a_snapshot_in_parts_replaces_what_the_last_session_said() {
        let mut b = HealthBook::default();
        let a = n("a");
        b.online(&a, 1);
        b.unit(&a, 1, t(1, 1), &u("old.service"), &h(Unhealthy, "x"), now());
        b.unit(&a, 1, t(1, 2), &u("db.service"), &h(Healthy, ""), now());
        b.offline(&a, 1);
        b.online(&a, 2);
        let (c, node) = b.snapshot(
            &a,
            2,
            t(2, 1),
            part(&[("db.service", Healthy)], None),
            now(),
        );
        assert!(
            c.is_empty() && node.is_none(),
            "nothing until the last part"
        );
        // An event after the snapshot began speaks for web.service already.
        b.unit(&a, 2, t(2, 2), &u("web.service"), &h(Starting, ""), now());
        let nh = NodeHealth {
            health: h(Healthy, ""),
            system_state: "running".into(),
            checks: vec![],
        };
        let (c, node) = b.snapshot(
            &a,
            2,
            t(2, 1),
            part(
                &[("web.service", Healthy), ("new.service", Starting)],
                Some(nh),
            ),
            now(),
        );
        let mut changed: Vec<(String, Option<HealthState>)> = c
            .iter()
            .map(|c| (c.unit.to_string(), c.entry.as_ref().map(|e| e.state)))
            .collect();
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        // db unchanged; old gone; web kept from the later event; new added.
        assert_eq!(
            changed,
            [
                ("new.service".to_owned(), Some(Starting)),
                ("old.service".to_owned(), None)
            ]
        );
        assert_eq!(state_of(&b, "a", "web.service"), Some(Starting));
        assert_eq!(node.unwrap().system_state, "running");
        assert_eq!(b.node(&a).unwrap().state, Healthy);
    }

    #[test]
    fn node_health_changes_and_the_cap_holds() {
        let mut b = HealthBook::default();
        let a = n("a");
        b.online(&a, 1);
        let nh = |state, sys: &str, checks: Vec<NodeCheck>| NodeHealth {
            health: h(state, ""),
            system_state: sys.into(),
            checks,
        };
        assert!(
            b.node_health(&a, 1, &nh(Healthy, "running", vec![]), now())
                .is_some()
        );
        assert!(
            b.node_health(&a, 1, &nh(Healthy, "running", vec![]), now())
                .is_none()
        );
        assert!(
            b.node_health(&a, 2, &nh(Unhealthy, "degraded", vec![]), now())
                .is_none()
        );
        let disk = NodeCheck {
            name: "disk".into(),
            health: h(Unhealthy, "97%"),
        };
        let e = b
            .node_health(&a, 1, &nh(Unhealthy, "degraded", vec![disk]), now())
            .unwrap();
        assert_eq!(e.checks[0].0, "disk");
        // More units than the cap: the extra ones are ignored.
        for i in 0..MAX_UNITS_PER_NODE + 3 {
            b.unit(
                &a,
                1,
                t(1, i as u64 + 1),
                &u(&format!("u{i}.service")),
                &h(Healthy, ""),
                now(),
            );
        }
        assert_eq!(b.unit_count(&a), MAX_UNITS_PER_NODE);
    }

    /// Hostile input: what an agent sends may not make the book hold more
    /// than its bounds, whatever the mix; an honest node beside it keeps
    /// its full reasons, and the book's byte count stays exact.
    #[test]
    fn garbage_from_an_agent_holds_bounded_memory() {
        use drover_protocol::health::REASON_MAX;
        let mut b = HealthBook::default();
        let (bad, good) = (n("bad"), n("good"));
        b.online(&bad, 1);
        b.online(&good, 2);
        let long_name = |i: usize| u(&format!("{i:0>240}.service"));
        let reason = |i: usize| format!("{i}").repeat(REASON_MAX)[..REASON_MAX].to_owned();
        let states = [Starting, Healthy, Unhealthy, HealthState::None];
        let mut index = 0;
        let mut tag = || {
            index += 1;
            t(1, index)
        };
        for i in 0..MAX_UNITS_PER_NODE + 500 {
            let h = Health::new(states[i % 3], &reason(i), i as u64);
            b.unit(&bad, 1, tag(), &long_name(i), &h, now());
            // Now and then, a change of an early unit, or its removal.
            if i % 7 == 0 {
                let h = Health::new(states[i % 4], &reason(i + 1), 0);
                b.unit(&bad, 1, tag(), &long_name(i / 2), &h, now());
            }
            // Snapshot parts that never end.
            if i % 64 == 0 {
                let units = (0..SNAPSHOT_PART_MAX)
                    .map(|j| UnitHealth {
                        unit: long_name(i + j),
                        health: Health::new(Unhealthy, &reason(j), 0),
                    })
                    .collect();
                let part = HealthSnapshot { units, node: None };
                b.snapshot(&bad, 1, t(1, 1_000_000), part, now());
            }
        }
        let held: usize = b
            .rows()
            .iter()
            .filter(|(n, _, _)| **n == bad)
            .map(|(_, _, e)| e.reason.len())
            .sum();
        let (units, pending) = b.reason_bytes(&bad);
        assert_eq!(units, held, "the byte count is exact");
        assert!(units <= REASON_BYTES_PER_NODE, "{units}");
        assert!(pending <= REASON_BYTES_PER_NODE, "{pending}");
        assert!(b.unit_count(&bad) <= MAX_UNITS_PER_NODE);
        // The honest node is not charged for the other's garbage.
        let full = reason(7);
        b.unit(
            &good,
            2,
            t(2, 1),
            &u("db.service"),
            &h(Unhealthy, &full),
            now(),
        );
        assert_eq!(b.current(&good, &u("db.service")).unwrap().reason, full);
        // A new session starts with nothing gathered.
        b.offline(&bad, 1);
        b.online(&bad, 3);
        assert_eq!(b.reason_bytes(&bad).1, 0);
    }
}
