//! The subscription hub: who watches which unit on which node, which agent
//! was told to report what, and the fan-out of unit events to the watchers.
//! The last known state of every watched unit is held here too, as the
//! [`Records`] of [`crate::units::records`], which owns the tag rules.
//!
//! Vocabulary:
//!
//! * A **sink** is one receiver of events: a monitor, a proxy relay, a test.
//!   It owns a bounded queue ([`Delivery`] items). Create one with
//!   [`Subscriptions::watcher`]; dropping the returned [`Watcher`] removes
//!   the sink and all its watches.
//! * A **watch** is (sink, node, unit or `*`). A sink may hold several watches
//!   that match the same event (an exact unit and `*`, two monitor
//!   subscriptions): it still gets the event **once**.
//!
//! Rules (docs/dev/architecture.md "Unit subscriptions and modification tags"):
//!
//! * Watches are merged per (node, unit or `*`): the first watcher makes the
//!   node's agent `Subscribe`, the last one `Unsubscribe`. A sink has a
//!   [`Scope`]: a monitor's ([`Subscriptions::watcher`]) is everything, the
//!   manager's own users' (proxies, discovery:
//!   [`Subscriptions::state_watcher`]) the state alone, and a unit is
//!   subscribed at the widest scope of its watchers (`SubscribeState` when
//!   none needs more, `*` always everything), again whenever that changes.
//!   A sink of the state alone may still get property events, of a unit a
//!   monitor watches too; a monitor that joins a unit watched for its state
//!   hears its property changes once the agent confirmed the wider scope.
//!   Requests go out from one task per node that reconciles "what is
//!   watched" with "what the agent was told", so they are ordered and never
//!   lost; while the node is offline nothing is sent, and on
//!   (re)registration everything watched is replayed.
//! * Unit events are applied to per-(node, unit) [`Record`]s by the tag rules
//!   of `drover_protocol::tag` (see
//!   [`Records::apply`]); a stale event is
//!   dropped, a virtual event that changes nothing is not forwarded, and only
//!   events of the node's current session are accepted (a replaced session's
//!   reader may still be draining).
//! * A new watch of a unit known to be loaded gets a virtual `UnitNew` (and a
//!   virtual `UnitStateChanged` if the state is known) on its own queue; a new
//!   `*` watch on an online node gets a virtual `UnitNew("*")` and the same
//!   pair for every loaded unit known here, and all `*` watchers get the
//!   `UnitNew("*")` when the node registers again. Virtual events go to the
//!   watch that is new and to nobody else: the agent's replay of a
//!   `Subscribe` (virtual `UnitNew` + `UnitStateChanged` of what is loaded)
//!   is forwarded only for what the records did not know yet (a new unit,
//!   a changed state), so a client watching `node/*` does not make every
//!   other monitor of that node's units hear "created" again (BlueChi sends a
//!   new subscription's virtual events to its own monitor only).
//! * Node disconnect (BlueChi's §2.4): for every loaded record, a virtual
//!   `UnitStateChanged(inactive, agent-offline)` unless it was already
//!   inactive, then a virtual `UnitRemoved`; the same pair for `*` watchers.
//!   The virtual events carry tags that continue the session's index, so a
//!   client following tags applies them like any other event.
//! * No queue grows without bound: delivery is `try_send`; a sink whose queue
//!   is full is **dropped** (its watches are removed and its queue closes
//!   after the items already in it). Its owner sees the end of the queue and
//!   decides what that means (a monitor closes itself).
//! * The replay of a new `*` watch (virtual `UnitNew("*")`, then `UnitNew` +
//!   `UnitStateChanged` per loaded unit in unit-name order) never counts as
//!   the sink being slow, however large the fleet: it is made lazily from the
//!   records ([`crate::units::replay`]), filling at most half the queue, and
//!   resumes when the owner has taken items and calls
//!   [`Subscriptions::refill`]. Only real events (and the bounded replay of a
//!   unit watched by name) can fill the other half, so a sink that does not
//!   read is still dropped.
//! * What a sink sees while its `*` replay of a node runs: a unit is
//!   announced once, with its state at the moment it is announced; real
//!   events of a unit already announced go out in order after it; events of
//!   a unit not announced yet (and of the pseudo unit `*` of a node not
//!   reached yet) are not queued: they already changed the record, so the
//!   announcement carries their outcome and tag (a unit removed before it is
//!   reached is never announced; a property change before its announcement
//!   is not sent: the client can read the properties). A unit the sink also
//!   watches by name is not held back. So nothing the client is told is
//!   stale or out of order: every event after a unit's announcement
//!   succeeds it.
//!
//! Locking: one mutex over plain data, never held across an await; applying
//! an event and queueing it to every sink happen under it, which is what
//! makes [`Subscriptions::snapshot`] + the queue a stream without gap or
//! duplicate.
//!
//! This file is the sinks' side (watchers, watches, fan-out, snapshots); the
//! nodes' side (sessions that begin and end, agents' unit events, what each
//! agent is told) is `hub/agents.rs`, on the same state.

use crate::nodes::session::Session;
use crate::units::health::{HealthBook, HealthCounts, health_replay};
use crate::units::records::{Applied, Change, Record, Records, UnitEvent, WILDCARD};
use crate::units::replay::{NodeView, Replay, virtual_replay};
use crate::units::resync::{NodeResync, ResyncStats};
use drover_bus::client::SnapshotRow;
use drover_protocol::{Event, ModTag, NodeName, Reason, Request, Scope, UnitName};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

// The nodes' side of the hub (see the module docs).
mod agents;
// Health: the book and the fan-out of its changes.
mod health;
// Resync: digests compared, snapshots asked for and applied.
mod resync;

/// Sub state of the virtual `inactive` BlueChi sends when a node goes offline.
pub const AGENT_OFFLINE: &str = "agent-offline";

/// A sink (one receiver with one queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SinkId(u64);

/// One watch of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchId(u64);

/// One queued item. `follow` is decided when the event is queued: true once
/// the sink took a snapshot with [`Subscriptions::snapshot`], so everything
/// after the snapshot, and nothing before it, is marked.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: Arc<UnitEvent>,
    pub follow: bool,
}

struct SinkState {
    tx: mpsc::Sender<Delivery>,
    follow: bool,
    /// What the sink needs of the units it watches.
    scope: Scope,
    watches: HashSet<WatchId>,
    /// The `*` replays this sink has not been told in full yet.
    replay: Replay,
}

/// Whether `n` more replay events may go into a queue now: the replay
/// fills at most half of it (and at least room for one unit), so the other
/// half is for real events and only a client that does not read overflows.
fn replay_room(tx: &mpsc::Sender<Delivery>, n: usize) -> bool {
    let free = tx.capacity();
    let used = tx.max_capacity().saturating_sub(free);
    free >= n && used + n <= (tx.max_capacity() / 2).max(n)
}

/// One sink's watches of one unit (or `*`) of a node.
#[derive(Debug, Clone, Copy)]
struct Watching {
    /// Number of the sink's watches there.
    count: usize,
    /// The sink's scope.
    scope: Scope,
}

#[derive(Default)]
struct NodeState {
    /// Watchers per unit (`None` = `*`).
    watchers: HashMap<Option<UnitName>, HashMap<SinkId, Watching>>,
    records: Records,
    session: Option<Arc<Session>>,
    /// Guid of the current (or last) session and the largest index seen in it.
    guid: u64,
    max_index: u64,
    /// What the current session's agent was told, at which scope
    /// (confirmed by a reply).
    sent: HashMap<Option<UnitName>, Scope>,
    /// Session id whose sync task is running, if any.
    syncing: Option<u64>,
    /// Digests and snapshots of this node (`hub/resync.rs`).
    resync: NodeResync,
}

impl NodeState {
    /// `key`: `Some(unit)` as the watcher map spells it (taken by
    /// reference so the per-event path does not copy the name to look up).
    fn covers(&self, key: &Option<UnitName>) -> bool {
        self.watchers.contains_key(&None) || self.watchers.contains_key(key)
    }

    /// Whether the agent reports `key` (`Some(unit)`): it is watched, or the
    /// agent was told to report it and not told otherwise yet. The records
    /// of such units are kept and kept current (`on_event`): a unit whose
    /// last watcher went and which is watched again before the `Unsubscribe`
    /// went out is never subscribed again, so no replay would restore them.
    fn reports(&self, key: &Option<UnitName>) -> bool {
        self.covers(key) || self.sent.contains_key(&None) || self.sent.contains_key(key)
    }

    /// Forgets the records of units the agent no longer reports: `key`'s
    /// alone, or every one not reported when `key` is `*`.
    fn forget_unreported(&mut self, key: &Option<UnitName>) {
        match key {
            Some(u) => {
                if !self.reports(key) {
                    self.records.remove(u);
                }
            }
            None => {
                if self.reports(&None) {
                    return;
                }
                let (watchers, sent) = (&self.watchers, &self.sent);
                self.records.retain(|u, _| {
                    let k = Some(u.clone());
                    watchers.contains_key(&k) || sent.contains_key(&k)
                });
            }
        }
    }

    /// Whether `session` is the node's current session.
    fn in_session(&self, session: u64) -> bool {
        self.session.as_ref().map(|s| s.id()) == Some(session)
    }

    /// Whether an event tagged `tag`, read from `session`, belongs to the
    /// node's current session (a replaced session's reader may still be
    /// draining; a tag of another guid is not this session's).
    fn accepts(&self, session: u64, tag: ModTag) -> bool {
        self.in_session(session) && tag.guid == session
    }

    fn next_tag(&mut self) -> ModTag {
        self.max_index += 1;
        ModTag::new(self.guid, self.max_index)
    }

    /// The scope the agent must report `key` at: the widest of its
    /// watchers' (`*`: everything); `None` when nobody watches it.
    fn wanted(&self, key: &Option<UnitName>) -> Option<Scope> {
        let watchers = self.watchers.get(key)?;
        if key.is_none() {
            return Some(Scope::Everything);
        }
        watchers.values().map(|w| w.scope).max()
    }

    /// The next request that brings the agent in line with what is watched:
    /// a subscription to make or rescope (`key`, its scope), before one to
    /// end (`key`, `None`).
    fn next_sync(&self) -> Option<(Option<UnitName>, Option<Scope>)> {
        let differs = self.watchers.keys().find_map(|k| {
            let wanted = self.wanted(k);
            (self.sent.get(k).copied() != wanted).then(|| (k.clone(), wanted))
        });
        differs.or_else(|| {
            self.sent
                .keys()
                .find(|k| !self.watchers.contains_key(*k))
                .map(|k| (k.clone(), None))
        })
    }

    fn needs_sync(&self) -> bool {
        self.next_sync().is_some()
    }

    /// Whether the agent confirmed that it reports `key` as widely as its
    /// watchers need.
    fn confirmed(&self, key: &Option<UnitName>) -> bool {
        self.sent.contains_key(&None)
            || self
                .sent
                .get(key)
                .is_some_and(|sent| self.wanted(key).is_none_or(|w| *sent >= w))
    }
}

#[derive(Default)]
struct State {
    /// Boxed: a map's table has room for up to twice its entries, and a
    /// slot of a name and a box is an eighth of a name and a node's state
    /// (32 bytes against 280).
    nodes: HashMap<NodeName, Box<NodeState>>,
    watches: HashMap<WatchId, (SinkId, NodeName, Option<UnitName>)>,
    sinks: HashMap<SinkId, SinkState>,
    next_id: u64,
    /// Every node's unit and node health (`crate::units::health`).
    health: HealthBook,
}

/// Sync tasks to start once the lock is released: (node, session).
type Syncs = Vec<(NodeName, Arc<Session>)>;

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Queues `event` to `sinks` (deduplicated by the caller); returns the
    /// sinks that overflowed. A sink whose `*` replay has not reached the
    /// event's unit yet does not get it (unless it also watches that unit
    /// by name): the replay will tell it the unit's state then, from the
    /// record this event already updated.
    fn deliver(&self, sinks: &[SinkId], event: &Arc<UnitEvent>) -> Vec<SinkId> {
        let mut full = Vec::new();
        for id in sinks {
            if let Some(sink) = self.sinks.get(id) {
                if sink.replay.ahead(&event.node, event.unit.as_ref()) && !self.names(*id, event) {
                    continue;
                }
                let item = Delivery {
                    event: event.clone(),
                    follow: sink.follow,
                };
                if let Err(mpsc::error::TrySendError::Full(_)) = sink.tx.try_send(item) {
                    full.push(*id);
                }
            }
        }
        full
    }

    /// True when `sink` watches the event's unit by name (not only via `*`).
    fn names(&self, sink: SinkId, event: &UnitEvent) -> bool {
        event.unit.is_some()
            && self
                .nodes
                .get(&event.node)
                .and_then(|ns| ns.watchers.get(&event.unit))
                .is_some_and(|w| w.contains_key(&sink))
    }

    /// Puts the next events of `sink`'s `*` replay into its queue while
    /// [`replay_room`] allows (see [`crate::units::replay`]). Never
    /// overflows a queue.
    fn refill(&mut self, id: SinkId) {
        let State {
            nodes,
            sinks,
            health,
            ..
        } = self;
        let Some(sink) = sinks.get_mut(&id) else {
            return;
        };
        let (tx, follow) = (&sink.tx, sink.follow);
        let view = |node: &NodeName| {
            nodes
                .get(node)
                .filter(|ns| ns.watchers.get(&None).is_some_and(|w| w.contains_key(&id)))
                .map(|ns| NodeView {
                    online: ns.session.is_some(),
                    star_confirmed: ns.sent.contains_key(&None),
                    star_tag: ModTag::new(ns.guid, ns.max_index),
                    records: &ns.records,
                    health,
                })
        };
        sink.replay.tell(
            view,
            |n| replay_room(tx, n),
            |event| {
                // Cannot be full: `replay_room` said so under the lock.
                let _ = tx.try_send(Delivery {
                    event: Arc::new(event),
                    follow,
                });
            },
        );
    }

    /// `node`'s agent confirmed its `*` subscription, or the node went
    /// offline: the replays waiting for it go on.
    fn release_waiting(&mut self, node: &NodeName) {
        let ids: Vec<SinkId> = self
            .sinks
            .iter_mut()
            .filter_map(|(id, sink)| sink.replay.release(node).then_some(*id))
            .collect();
        for id in ids {
            self.refill(id);
        }
    }

    /// Sinks watching (node, unit) exactly or through `*`, each once.
    /// `key`: `Some(unit)` or `None` for the pseudo unit `*` alone.
    fn sinks_for(node: &NodeState, key: &Option<UnitName>) -> Vec<SinkId> {
        let mut out: Vec<SinkId> = Vec::new();
        if key.is_some()
            && let Some(w) = node.watchers.get(key)
        {
            out.extend(w.keys());
        }
        if let Some(w) = node.watchers.get(&None) {
            out.extend(w.keys());
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Removes a watch; returns a sync to start if the node needs one.
    fn remove_watch(&mut self, id: WatchId, syncs: &mut Syncs) -> bool {
        let Some((sink, node, unit)) = self.watches.remove(&id) else {
            return false;
        };
        if let Some(s) = self.sinks.get_mut(&sink) {
            s.watches.remove(&id);
        }
        if let Some(ns) = self.nodes.get_mut(&node) {
            if let Some(w) = ns.watchers.get_mut(&unit) {
                if let Some(n) = w.get_mut(&sink) {
                    n.count -= 1;
                    if n.count == 0 {
                        w.remove(&sink);
                    }
                }
                if w.is_empty() {
                    ns.watchers.remove(&unit);
                    // Records the agent no longer reports are forgotten (those
                    // it still reports go once it confirmed the `Unsubscribe`).
                    ns.forget_unreported(&unit);
                }
            }
            schedule_sync(&node, ns, syncs);
            if ns.watchers.is_empty() && ns.session.is_none() && ns.syncing.is_none() {
                self.nodes.remove(&node);
            }
        }
        // A replay waiting for the agent's `*` ends with the sink's last `*`
        // watch there: no confirmation may ever come for it.
        let still_star = self
            .nodes
            .get(&node)
            .and_then(|ns| ns.watchers.get(&None))
            .is_some_and(|w| w.contains_key(&sink));
        if unit.is_none()
            && !still_star
            && let Some(s) = self.sinks.get_mut(&sink)
        {
            s.replay.end_waiting(&node);
        }
        true
    }

    fn remove_sink(&mut self, id: SinkId, syncs: &mut Syncs) {
        if let Some(sink) = self.sinks.remove(&id) {
            for w in sink.watches {
                self.remove_watch(w, syncs);
            }
        }
    }

    fn drop_overflowed(&mut self, full: Vec<SinkId>, syncs: &mut Syncs) {
        for id in full {
            tracing::warn!(
                sink = id.0,
                "a watcher does not keep up with unit events (queue full); dropping it"
            );
            self.remove_sink(id, syncs);
        }
    }
}

fn schedule_sync(node: &NodeName, ns: &mut NodeState, syncs: &mut Syncs) {
    let Some(session) = &ns.session else { return };
    if ns.syncing == Some(session.id()) || !ns.needs_sync() {
        return;
    }
    ns.syncing = Some(session.id());
    syncs.push((node.clone(), session.clone()));
}

/// The subscription table of a manager (see the module docs).
pub struct Subscriptions {
    state: Mutex<State>,
    request_timeout: Duration,
    /// Woken whenever what an agent was told may have changed (a sync step
    /// done, a session gone): [`Subscriptions::synced`] looks again.
    sync_progress: tokio::sync::Notify,
    /// What resync has done (`hub/resync.rs`).
    resync: ResyncStats,
    /// Units of online nodes by health state (the health book's counts).
    health_counts: Arc<HealthCounts>,
}

/// A sink handle: watches go through it; dropping it removes them all.
pub struct Watcher {
    hub: Arc<Subscriptions>,
    sink: SinkId,
}

impl Watcher {
    pub fn id(&self) -> SinkId {
        self.sink
    }

    /// Watches `unit` (`None` = every unit) on `node`; see
    /// [`Subscriptions::watch`].
    pub fn watch(&self, node: &NodeName, unit: Option<&UnitName>) -> Option<WatchId> {
        self.hub.watch(self.sink, node, unit)
    }

    pub fn unwatch(&self, id: WatchId) -> bool {
        self.hub.unwatch(id)
    }

    /// See [`Subscriptions::synced`].
    pub fn synced(
        &self,
        watched: Vec<(NodeName, Option<UnitName>)>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let hub = self.hub.clone();
        async move { hub.synced(&watched).await }
    }

    /// See [`Subscriptions::refill`].
    pub fn refill(&self) {
        self.hub.refill(self.sink)
    }

    /// See [`Subscriptions::snapshot`].
    pub fn snapshot(&self) -> Option<Vec<SnapshotRow>> {
        self.hub.snapshot(self.sink)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.hub.drop_sink(self.sink);
    }
}

impl Subscriptions {
    /// `request_timeout` bounds each `Subscribe`/`Unsubscribe` to an agent.
    pub fn new(request_timeout: Duration) -> Arc<Self> {
        let state = State::default();
        let health_counts = state.health.counts();
        Arc::new(Self {
            state: Mutex::new(state),
            request_timeout,
            sync_progress: tokio::sync::Notify::new(),
            resync: ResyncStats::default(),
            health_counts,
        })
    }

    /// Units of online nodes by health state, read without the lock.
    pub fn health_counts(&self) -> &HealthCounts {
        &self.health_counts
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Sections under this lock do not panic on input; a poisoned lock
        // still holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new sink with a queue of `capacity` items (at least 1), for
    /// everything of what it watches (a monitor: state and property changes).
    pub fn watcher(self: &Arc<Self>, capacity: usize) -> (Watcher, mpsc::Receiver<Delivery>) {
        self.sink(capacity, Scope::Everything)
    }

    /// A new sink with a queue of `capacity` items (at least 1), for the
    /// state of what it watches: the agents are not asked for property
    /// changes on its account.
    pub fn state_watcher(self: &Arc<Self>, capacity: usize) -> (Watcher, mpsc::Receiver<Delivery>) {
        self.sink(capacity, Scope::State)
    }

    fn sink(
        self: &Arc<Self>,
        capacity: usize,
        scope: Scope,
    ) -> (Watcher, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let mut st = self.lock();
        let sink = SinkId(st.id());
        st.sinks.insert(
            sink,
            SinkState {
                tx,
                follow: false,
                scope,
                watches: HashSet::new(),
                replay: Replay::default(),
            },
        );
        drop(st);
        (
            Watcher {
                hub: self.clone(),
                sink,
            },
            rx,
        )
    }

    /// Adds a watch of `unit` (`None` = `*`) on `node` for `sink`, queues the
    /// virtual events of a new watch to that sink, and subscribes the agent
    /// if this is the first watcher. `None` if the sink is gone (dropped or
    /// overflowed). The node need not be known or online.
    pub fn watch(
        self: &Arc<Self>,
        sink: SinkId,
        node: &NodeName,
        unit: Option<&UnitName>,
    ) -> Option<WatchId> {
        let mut syncs = Syncs::new();
        let mut st = self.lock();
        if !st.sinks.contains_key(&sink) {
            return None;
        }
        let id = WatchId(st.id());
        st.watches.insert(id, (sink, node.clone(), unit.cloned()));
        let mut scope = Scope::Everything;
        if let Some(s) = st.sinks.get_mut(&sink) {
            s.watches.insert(id);
            scope = s.scope;
        }
        let ns = st.nodes.entry(node.clone()).or_default();
        ns.watchers
            .entry(unit.cloned())
            .or_default()
            .entry(sink)
            .or_insert(Watching { count: 0, scope })
            .count += 1;
        // Virtual events for this sink only.
        let mut virtual_events = Vec::new();
        match unit {
            Some(u) => {
                if let Some(rec) = ns.records.get(u).filter(|r| r.loaded) {
                    virtual_events.extend(virtual_replay(node, u, rec));
                }
                // Its health before its state (`hub/health.rs`).
                if let Some(ev) = health_replay(&st.health, node, u) {
                    virtual_events.insert(0, ev);
                }
            }
            // `UnitNew("*")` and the loaded units already known here
            // (watched by others: the agent's replay of `*` is no news for
            // them, see `on_event`) come from the records, lazily: the
            // sink's replay resumes whenever its queue has room. A node
            // whose replay is still under way keeps its cursor.
            None => {
                if let Some(s) = st.sinks.get_mut(&sink) {
                    s.replay.begin(node);
                }
            }
        }
        // Inserted above; the lock was held since.
        let ns = st.nodes.get_mut(node)?;
        schedule_sync(node, ns, &mut syncs);
        let mut full = Vec::new();
        for ev in virtual_events {
            full.extend(st.deliver(&[sink], &Arc::new(ev)));
        }
        full.dedup();
        st.drop_overflowed(full, &mut syncs);
        st.refill(sink);
        drop(st);
        self.start_syncs(syncs);
        Some(id)
    }

    /// Resumes `sink`'s `*` replay as far as its queue has room (see
    /// `State::refill`). Call it after taking items from the queue; a sink
    /// that watches `*` and never calls it gets only the first part of the
    /// replay (half its queue).
    pub fn refill(&self, sink: SinkId) {
        self.lock().refill(sink);
    }

    /// True while `sink` has a `*` replay not told in full.
    pub fn replaying(&self, sink: SinkId) -> bool {
        self.lock()
            .sinks
            .get(&sink)
            .is_some_and(|s| s.replay.is_running())
    }

    /// Removes a watch; unsubscribes the agent if it was the last watcher of
    /// that unit. False if there is no such watch.
    pub fn unwatch(self: &Arc<Self>, id: WatchId) -> bool {
        let mut syncs = Syncs::new();
        let removed = self.lock().remove_watch(id, &mut syncs);
        self.start_syncs(syncs);
        removed
    }

    /// Removes a sink and all its watches (its queue closes).
    pub fn drop_sink(self: &Arc<Self>, sink: SinkId) {
        let mut syncs = Syncs::new();
        self.lock().remove_sink(sink, &mut syncs);
        self.start_syncs(syncs);
    }

    /// True while the sink exists (not dropped, not overflowed).
    pub fn has_sink(&self, sink: SinkId) -> bool {
        self.lock().sinks.contains_key(&sink)
    }

    /// Loaded records of everything `sink` watches, each once, sorted by
    /// (node, unit); and from now on the sink's deliveries carry
    /// `follow = true`. Atomic with respect to events. `None` if the sink is
    /// gone.
    pub fn snapshot(&self, sink: SinkId) -> Option<Vec<SnapshotRow>> {
        let mut st = self.lock();
        let s = st.sinks.get_mut(&sink)?;
        s.follow = true;
        let mut rows = Vec::new();
        let mut seen: HashSet<(&NodeName, &UnitName)> = HashSet::new();
        let watches: Vec<_> = st.sinks[&sink]
            .watches
            .iter()
            .filter_map(|w| st.watches.get(w))
            .collect();
        for (_, node, unit) in watches {
            let Some(ns) = st.nodes.get(node) else {
                continue;
            };
            let mut add = |u: &'_ UnitName, r: &Record| {
                if r.loaded {
                    rows.push((
                        node.to_string(),
                        u.to_string(),
                        r.active_state.clone(),
                        r.sub_state.clone(),
                        r.tag.guid,
                        r.tag.index,
                    ));
                }
            };
            match unit {
                Some(u) => {
                    if let Some((key, r)) = ns.records.get_key_value(u)
                        && seen.insert((node, key))
                    {
                        add(key, r);
                    }
                }
                None => {
                    for (u, r) in ns.records.iter() {
                        if seen.insert((node, u)) {
                            add(u, r);
                        }
                    }
                }
            }
        }
        rows.sort();
        Some(rows)
    }

    /// The record of (node, unit), if it is watched and known.
    pub fn record(&self, node: &NodeName, unit: &UnitName) -> Option<Record> {
        self.lock()
            .nodes
            .get(node)
            .and_then(|n| n.records.get(unit).cloned())
    }

    /// Units the agent of `node` is (to be) subscribed to, `None` = `*`.
    pub fn watched(&self, node: &NodeName) -> Vec<Option<UnitName>> {
        let st = self.lock();
        let mut v: Vec<_> = st
            .nodes
            .get(node)
            .map(|n| n.watchers.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{Request, Response, ToAgent};

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    fn node(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    fn state(a: &str, s: &str, reason: Reason) -> Change {
        Change::State {
            active_state: a.into(),
            sub_state: s.into(),
            reason,
        }
    }

    const REAL: Reason = Reason::Real;

    // ---- the hub, with sessions whose requests a test task answers -------

    struct FakeNode {
        session: Arc<Session>,
        requests: Arc<Mutex<Vec<Request>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for FakeNode {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn online(hub: &Arc<Subscriptions>, name: &str, id: u64) -> FakeNode {
        let (session, mut rx) = Session::new(id, node(name), "127.0.0.1".into());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let session = session.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                while let Some(msg) = rx.recv().await {
                    if let ToAgent::Request { id, body } = msg {
                        requests.lock().unwrap().push(body);
                        session.complete(id, Ok(Response::Empty));
                    }
                }
            })
        };
        hub.node_online(&session);
        FakeNode {
            session,
            requests,
            task,
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Delivery>) -> Vec<(String, Change)> {
        let mut out = Vec::new();
        while let Ok(d) = rx.try_recv() {
            out.push((d.event.unit_str().to_owned(), d.event.change.clone()));
        }
        out
    }

    fn ev_state(tag: ModTag, u: &str, a: &str, s: &str) -> Event {
        Event::UnitStateChanged {
            tag,
            unit: unit(u),
            active_state: a.into(),
            sub_state: s.into(),
            reason: REAL,
        }
    }

    #[tokio::test]
    async fn first_and_last_watcher_drive_the_agent_and_replay_on_registration() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let a = unit("a.service");
        let (w1, _rx1) = hub.watcher(8);
        let (w2, _rx2) = hub.watcher(8);
        // Offline: nothing is sent, but the watch is kept.
        let id1 = w1.watch(&n, Some(&a)).unwrap();
        let agent = online(&hub, "n1", 10);
        settle().await;
        assert_eq!(
            *agent.requests.lock().unwrap(),
            vec![Request::Subscribe {
                unit: Some(a.clone())
            }]
        );
        let id2 = w2.watch(&n, Some(&a)).unwrap();
        assert!(w1.unwatch(id1));
        assert!(!w1.unwatch(id1), "twice is an unknown id");
        settle().await;
        assert_eq!(
            agent.requests.lock().unwrap().len(),
            1,
            "still watched by w2"
        );
        assert!(w2.unwatch(id2));
        settle().await;
        assert_eq!(
            agent.requests.lock().unwrap()[1],
            Request::Unsubscribe {
                unit: Some(a.clone())
            }
        );
        // A new session gets every watched unit again.
        w2.watch(&n, None).unwrap();
        settle().await;
        hub.node_offline(&n, 10);
        let agent2 = online(&hub, "n1", 11);
        settle().await;
        assert_eq!(
            *agent2.requests.lock().unwrap(),
            vec![Request::Subscribe { unit: None }]
        );
        drop(w2);
        settle().await;
        assert_eq!(
            agent2.requests.lock().unwrap()[1],
            Request::Unsubscribe { unit: None }
        );
        assert!(hub.watched(&n).is_empty());
    }

    /// A unit is subscribed at the widest scope its watchers need: the state
    /// alone for a proxy or discovery, everything once a monitor joins,
    /// the state again when it leaves; `*` is always everything.
    #[tokio::test]
    async fn a_unit_is_subscribed_at_the_widest_scope_of_its_watchers() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let a = unit("a.service");
        let agent = online(&hub, "n1", 10);
        let requests = || agent.requests.lock().unwrap().clone();
        let (proxy, _rx_p) = hub.state_watcher(8);
        let (monitor, _rx_m) = hub.watcher(8);
        let for_state = Request::SubscribeState { unit: a.clone() };
        let for_everything = Request::Subscribe {
            unit: Some(a.clone()),
        };

        proxy.watch(&n, Some(&a)).unwrap();
        settle().await;
        assert_eq!(requests(), vec![for_state.clone()]);
        // A second state watcher changes nothing.
        let (discovery, _rx_d) = hub.state_watcher(8);
        let d = discovery.watch(&n, Some(&a)).unwrap();
        settle().await;
        assert_eq!(requests().len(), 1);

        let m = monitor.watch(&n, Some(&a)).unwrap();
        settle().await;
        assert_eq!(requests(), vec![for_state.clone(), for_everything.clone()]);
        assert!(monitor.unwatch(m));
        settle().await;
        assert_eq!(requests()[2], for_state, "narrowed when the monitor left");
        assert!(discovery.unwatch(d));
        drop(proxy);
        settle().await;
        assert_eq!(
            requests()[3],
            Request::Unsubscribe {
                unit: Some(a.clone())
            }
        );
        assert_eq!(requests().len(), 4);

        // `*` of a state watcher is still everything.
        let (star, _rx_s) = hub.state_watcher(8);
        star.watch(&n, None).unwrap();
        settle().await;
        assert_eq!(requests()[4], Request::Subscribe { unit: None });

        // A new session is told each unit at its scope.
        let (proxy, _rx_p) = hub.state_watcher(8);
        proxy.watch(&n, Some(&a)).unwrap();
        settle().await;
        hub.node_offline(&n, 10);
        let again = online(&hub, "n1", 11);
        settle().await;
        let mut told = again.requests.lock().unwrap().clone();
        told.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(told, vec![Request::Subscribe { unit: None }, for_state]);
    }

    /// The last watcher of a unit goes and a new one comes before the node's
    /// sync task ran: nothing is sent (the agent was told to report the unit
    /// and still is), so the manager must keep the unit's record current.
    /// It used to forget it with the last watcher, and the new watcher, and
    /// `Where`, missed the unit on that node until the next resync.
    #[tokio::test]
    async fn a_unit_watched_again_before_its_unsubscribe_went_out_keeps_its_record() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let (n, a) = (node("n1"), unit("a.service"));
        let agent = online(&hub, "n1", 10);
        let (w1, _rx1) = hub.watcher(8);
        let id1 = w1.watch(&n, Some(&a)).unwrap();
        hub.synced(&[(n.clone(), Some(a.clone()))]).await;
        hub.on_event(
            &agent.session,
            Event::UnitNew {
                tag: ModTag::new(10, 1),
                unit: a.clone(),
                reason: REAL,
            },
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(10, 2), "a.service", "active", "running"),
        );
        // No await between: the sync task the unwatch scheduled has not run.
        assert!(w1.unwatch(id1));
        let (w2, mut rx2) = hub.watcher(8);
        w2.watch(&n, Some(&a)).unwrap();
        settle().await;
        assert_eq!(
            *agent.requests.lock().unwrap(),
            vec![Request::Subscribe {
                unit: Some(a.clone())
            }],
            "the agent stays subscribed: nothing to send"
        );
        let rec = hub.record(&n, &a).expect("the record is kept");
        assert!(rec.loaded);
        assert_eq!(rec.active_state, "active");
        assert_eq!(
            drain(&mut rx2),
            vec![
                (
                    "a.service".into(),
                    Change::New {
                        reason: Reason::Virtual
                    }
                ),
                (
                    "a.service".into(),
                    state("active", "running", Reason::Virtual)
                ),
            ],
            "the new watcher is told the unit's state"
        );
        // And kept current.
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(10, 3), "a.service", "failed", "failed"),
        );
        assert_eq!(hub.record(&n, &a).unwrap().active_state, "failed");
        assert_eq!(
            drain(&mut rx2),
            vec![("a.service".into(), state("failed", "failed", REAL))]
        );
        // Once nobody watches it and the agent confirmed the `Unsubscribe`,
        // the record goes.
        drop(w2);
        settle().await;
        assert_eq!(
            agent.requests.lock().unwrap().last(),
            Some(&Request::Unsubscribe {
                unit: Some(a.clone())
            })
        );
        assert!(
            hub.record(&n, &a).is_none(),
            "forgotten after the Unsubscribe"
        );
    }

    /// Found by the 20-run loop: a monitor subscribed, the test started the
    /// unit at once, and the agent got its `Subscribe` after the start: the
    /// client heard only a virtual "active" from the agent's replay, never the
    /// start. `synced` (what `Subscribe`/`SubscribeList` now wait for) returns
    /// only once the agent answered, or at once for an offline node.
    #[tokio::test]
    async fn synced_waits_for_the_agents_answer_and_not_for_offline_nodes() {
        use futures::FutureExt;
        let hub = Subscriptions::new(Duration::from_secs(30));
        let (n1, n2, a) = (node("n1"), node("n2"), unit("a.service"));
        let (session, mut to_agent) = Session::new(7, n1.clone(), "127.0.0.1".into());
        hub.node_online(&session);
        let (w, _rx) = hub.watcher(8);
        w.watch(&n1, Some(&a)).unwrap();
        w.watch(&n2, Some(&a)).unwrap();
        let watched = vec![(n1.clone(), Some(a.clone())), (n2.clone(), Some(a.clone()))];
        let mut synced = Box::pin(w.synced(watched.clone()));
        let Some(ToAgent::Request { id, body }) = to_agent.recv().await else {
            panic!("a request to the agent");
        };
        assert_eq!(
            body,
            Request::Subscribe {
                unit: Some(a.clone())
            }
        );
        assert!(
            synced.as_mut().now_or_never().is_none(),
            "the agent has not answered yet"
        );
        session.complete(id, Ok(Response::Empty));
        tokio::time::timeout(Duration::from_secs(5), synced)
            .await
            .expect("synced once the agent answered");
        // Covered already: at once. Offline: at once.
        w.synced(watched.clone())
            .now_or_never()
            .expect("nothing to wait for");
        hub.node_offline(&n1, 7);
        w.synced(vec![(n1.clone(), None)])
            .now_or_never()
            .expect("an offline node is not waited for");
    }

    #[tokio::test]
    async fn fan_out_is_deduplicated_per_sink_and_filtered_by_unit() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 7);
        let (both, mut rx_both) = hub.watcher(16);
        let (only_b, mut rx_b) = hub.watcher(16);
        both.watch(&n, Some(&unit("a.service"))).unwrap();
        both.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        only_b.watch(&n, Some(&unit("b.service"))).unwrap();
        drain(&mut rx_both);
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(7, 1), "a.service", "active", "running"),
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(7, 2), "b.service", "failed", "failed"),
        );
        // Stale, foreign guid, and an event of another session are dropped.
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(7, 1), "a.service", "inactive", "dead"),
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(99, 3), "a.service", "inactive", "dead"),
        );
        let (other, _) = Session::new(6, n.clone(), String::new());
        hub.on_event(
            &other,
            ev_state(ModTag::new(6, 3), "a.service", "inactive", "dead"),
        );
        let got = drain(&mut rx_both);
        assert_eq!(
            got,
            vec![
                ("a.service".into(), state("active", "running", REAL)),
                ("b.service".into(), state("failed", "failed", REAL)),
            ]
        );
        assert_eq!(
            drain(&mut rx_b),
            vec![("b.service".into(), state("failed", "failed", REAL))]
        );
        // A late watcher of a loaded unit gets the virtual replay, alone.
        let (late, mut rx_late) = hub.watcher(16);
        late.watch(&n, Some(&unit("a.service"))).unwrap();
        assert_eq!(
            drain(&mut rx_late),
            vec![
                (
                    "a.service".into(),
                    Change::New {
                        reason: Reason::Virtual
                    }
                ),
                (
                    "a.service".into(),
                    state("active", "running", Reason::Virtual)
                ),
            ]
        );
        assert!(drain(&mut rx_both).is_empty());
    }

    #[tokio::test]
    async fn disconnect_sends_virtual_offline_events_and_wildcard_pseudo_unit() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 3);
        let (w, mut rx) = hub.watcher(32);
        w.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        assert_eq!(
            drain(&mut rx),
            vec![(
                "*".into(),
                Change::New {
                    reason: Reason::Virtual
                }
            )]
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(3, 1), "a.service", "active", "running"),
        );
        hub.on_event(
            &agent.session,
            Event::UnitNew {
                tag: ModTag::new(3, 2),
                unit: unit("b.service"),
                reason: REAL,
            },
        );
        drain(&mut rx);
        hub.node_offline(&n, 2); // not the current session: ignored
        assert!(drain(&mut rx).is_empty());
        hub.node_offline(&n, 3);
        let removed = Change::Removed {
            reason: Reason::Virtual,
        };
        let offline = state("inactive", AGENT_OFFLINE, Reason::Virtual);
        assert_eq!(
            drain(&mut rx),
            vec![
                ("a.service".into(), offline.clone()),
                ("a.service".into(), removed.clone()),
                // b was inactive: only the removal.
                ("b.service".into(), removed.clone()),
                ("*".into(), offline),
                ("*".into(), removed),
            ]
        );
        let rec = hub.record(&n, &unit("a.service")).unwrap();
        assert!(!rec.loaded);
        assert_eq!(
            rec.tag,
            ModTag::new(3, 4),
            "virtual tags continue the index"
        );
        // Back online: `*` watchers hear of it.
        let _agent2 = online(&hub, "n1", 4);
        assert_eq!(
            drain(&mut rx),
            vec![(
                "*".into(),
                Change::New {
                    reason: Reason::Virtual
                }
            )]
        );
    }

    #[tokio::test]
    async fn a_stuck_watcher_is_dropped_not_buffered() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 5);
        let (stuck, mut rx_stuck) = hub.watcher(4);
        let (fine, mut rx_fine) = hub.watcher(1024);
        stuck.watch(&n, None).unwrap();
        fine.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        drain(&mut rx_fine);
        for i in 1..=100u64 {
            let a = if i % 2 == 0 { "active" } else { "inactive" };
            hub.on_event(
                &agent.session,
                ev_state(ModTag::new(5, i), "a.service", a, "x"),
            );
        }
        assert!(!hub.has_sink(stuck.id()));
        assert!(hub.has_sink(fine.id()));
        assert_eq!(drain(&mut rx_fine).len(), 100);
        // The stuck queue holds what fit and then ends.
        let mut n_items = 0;
        while rx_stuck.recv().await.is_some() {
            n_items += 1;
        }
        assert_eq!(n_items, 4);
        assert!(
            stuck.watch(&n, None).is_none(),
            "a dropped sink cannot watch"
        );
    }

    #[tokio::test]
    async fn a_wildcard_replay_larger_than_the_queue_is_told_lazily_without_loss() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 9);
        // Another watcher makes the records know 40 loaded units.
        let (_other, _rx_other) = hub.watcher(1024);
        _other.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        let name = |i: u64| format!("u{i:02}.service");
        for i in 1..=40u64 {
            hub.on_event(
                &agent.session,
                ev_state(ModTag::new(9, i), &name(i), "active", "running"),
            );
        }
        // 81 replay events into a queue of 8: not dropped, half filled.
        let (w, mut rx) = hub.watcher(8);
        w.watch(&n, None).unwrap();
        assert!(hub.has_sink(w.id()) && hub.replaying(w.id()));
        let mut got = drain(&mut rx);
        assert_eq!(got.len(), 3, "`*` and the first unit: {got:?}");
        // A real event of a unit already told goes out in order; one of a
        // unit not told yet is folded into that unit's replay.
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(9, 41), &name(1), "inactive", "dead"),
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(9, 42), &name(30), "failed", "failed"),
        );
        hub.on_event(
            &agent.session,
            Event::UnitRemoved {
                tag: ModTag::new(9, 43),
                unit: unit(&name(31)),
                reason: REAL,
            },
        );
        loop {
            w.refill();
            let more = drain(&mut rx);
            if more.is_empty() {
                break;
            }
            got.extend(more);
        }
        assert!(!hub.replaying(w.id()));
        let virt = Change::New {
            reason: Reason::Virtual,
        };
        let mut want = vec![
            ("*".to_owned(), virt.clone()),
            (name(1), virt.clone()),
            (name(1), state("active", "running", Reason::Virtual)),
            (name(1), state("inactive", "dead", REAL)),
        ];
        for i in 2..=40 {
            let st = match i {
                30 => state("failed", "failed", Reason::Virtual),
                31 => continue,
                _ => state("active", "running", Reason::Virtual),
            };
            want.push((name(i), virt.clone()));
            want.push((name(i), st));
        }
        assert_eq!(got, want);
        // After the replay, events flow as usual.
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(9, 44), &name(30), "active", "running"),
        );
        assert_eq!(
            drain(&mut rx),
            vec![(name(30), state("active", "running", REAL))]
        );
    }

    #[tokio::test]
    async fn a_node_going_offline_mid_replay_ends_it_with_what_was_told() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 6);
        let (_other, _rx_other) = hub.watcher(1024);
        _other.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        for i in 1..=40u64 {
            hub.on_event(
                &agent.session,
                ev_state(
                    ModTag::new(6, i),
                    &format!("u{i:02}.service"),
                    "active",
                    "running",
                ),
            );
        }
        let (w, mut rx) = hub.watcher(8);
        w.watch(&n, None).unwrap();
        let mut got = drain(&mut rx);
        hub.node_offline(&n, 6);
        w.refill();
        got.extend(drain(&mut rx));
        assert!(!hub.replaying(w.id()));
        let virt = Change::New {
            reason: Reason::Virtual,
        };
        let offline = state("inactive", AGENT_OFFLINE, Reason::Virtual);
        let removed = Change::Removed {
            reason: Reason::Virtual,
        };
        // Only the unit it was told of goes offline for it; the others are
        // never announced (they are no longer loaded when the replay gets there).
        assert_eq!(
            got,
            vec![
                ("*".into(), virt.clone()),
                ("u01.service".into(), virt),
                (
                    "u01.service".into(),
                    state("active", "running", Reason::Virtual)
                ),
                ("u01.service".into(), offline.clone()),
                ("u01.service".into(), removed.clone()),
                ("*".into(), offline),
                ("*".into(), removed),
            ]
        );
    }

    /// The first `*` watch of a node: the manager knows none of its units,
    /// and the agent answers the `Subscribe` with every loaded unit (its
    /// virtual replay) before its reply. Those are news to the records, yet
    /// they reach the watcher lazily like any replay: a fleet of 100 nodes
    /// with 100 units each once overflowed a monitor's queue this way.
    #[tokio::test]
    async fn the_agents_own_replay_of_a_first_wildcard_watch_is_told_lazily() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 5);
        let (w, mut rx) = hub.watcher(8);
        w.watch(&n, None).unwrap();
        let virt = Change::New {
            reason: Reason::Virtual,
        };
        assert_eq!(drain(&mut rx), vec![("*".to_owned(), virt.clone())]);
        // The agent's answer: 40 loaded units, 80 events, into a queue of 8,
        // before the reply to `Subscribe` (the fake agent answers once this
        // test awaits).
        let name = |i: u64| format!("u{i:02}.service");
        for i in 1..=40u64 {
            hub.on_event(
                &agent.session,
                Event::UnitNew {
                    tag: ModTag::new(5, 2 * i - 1),
                    unit: unit(&name(i)),
                    reason: Reason::Virtual,
                },
            );
            hub.on_event(
                &agent.session,
                Event::UnitStateChanged {
                    tag: ModTag::new(5, 2 * i),
                    unit: unit(&name(i)),
                    active_state: "active".into(),
                    sub_state: "running".into(),
                    reason: Reason::Virtual,
                },
            );
        }
        assert!(
            hub.has_sink(w.id()),
            "the agent's replay overflowed the queue"
        );
        assert!(drain(&mut rx).is_empty(), "held back until the reply");
        assert!(hub.replaying(w.id()));
        hub.synced(&[(n.clone(), None)]).await;
        let mut got = Vec::new();
        loop {
            let more = drain(&mut rx);
            if more.is_empty() {
                break;
            }
            got.extend(more);
            w.refill();
        }
        assert!(hub.has_sink(w.id()) && !hub.replaying(w.id()));
        let mut want = Vec::new();
        for i in 1..=40 {
            want.push((name(i), virt.clone()));
            want.push((name(i), state("active", "running", Reason::Virtual)));
        }
        assert_eq!(got, want);
    }

    /// A `*` watch removed before its agent answered: the replay that
    /// waited for the answer ends with it, and a new `*` watch waits afresh.
    #[tokio::test]
    async fn a_replay_waiting_for_the_agent_ends_with_its_watch() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let _agent = online(&hub, "n1", 8);
        let (w, mut rx) = hub.watcher(8);
        let star = w.watch(&n, None).unwrap();
        assert!(hub.replaying(w.id()));
        assert!(w.unwatch(star));
        assert!(!hub.replaying(w.id()), "nothing left to wait for");
        w.watch(&n, None).unwrap();
        assert!(hub.replaying(w.id()));
        hub.synced(&[(n.clone(), None)]).await;
        assert!(!hub.replaying(w.id()));
        let virt = Change::New {
            reason: Reason::Virtual,
        };
        assert_eq!(
            drain(&mut rx),
            vec![("*".to_owned(), virt.clone()), ("*".to_owned(), virt)]
        );
    }

    /// A node that goes offline before its agent answered `*`: the waiting
    /// replay ends with what the records hold (nothing loaded by then).
    #[tokio::test]
    async fn a_replay_waiting_for_the_agent_ends_when_the_node_goes_offline() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 7);
        let (w, mut rx) = hub.watcher(8);
        w.watch(&n, None).unwrap();
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(7, 1), "a.service", "active", "running"),
        );
        assert!(hub.replaying(w.id()));
        hub.node_offline(&n, 7);
        assert!(!hub.replaying(w.id()), "released when the node went away");
        // It heard of the node (`*`), never of a unit it was not told of:
        // a.service's offline events are not for it.
        assert_eq!(
            drain(&mut rx),
            vec![
                (
                    "*".to_owned(),
                    Change::New {
                        reason: Reason::Virtual
                    }
                ),
                (
                    "*".to_owned(),
                    state("inactive", AGENT_OFFLINE, Reason::Virtual)
                ),
                (
                    "*".to_owned(),
                    Change::Removed {
                        reason: Reason::Virtual
                    }
                ),
            ]
        );
        assert!(hub.has_sink(w.id()));
    }

    #[tokio::test]
    async fn a_replaying_watcher_that_does_not_read_is_still_dropped() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 4);
        let (_other, _rx_other) = hub.watcher(1024);
        _other.watch(&n, None).unwrap();
        // The agent has answered `*` (as `Subscribe` waits for).
        hub.synced(&[(n.clone(), None)]).await;
        for i in 1..=40u64 {
            hub.on_event(
                &agent.session,
                ev_state(
                    ModTag::new(4, i),
                    &format!("u{i:02}.service"),
                    "active",
                    "running",
                ),
            );
        }
        let (w, _rx) = hub.watcher(8);
        w.watch(&n, None).unwrap();
        // Real events of a unit already told fill the rest of the queue.
        for i in 41..=60u64 {
            let a = if i % 2 == 0 { "active" } else { "inactive" };
            hub.on_event(
                &agent.session,
                ev_state(ModTag::new(4, i), "u01.service", a, "x"),
            );
        }
        assert!(
            !hub.has_sink(w.id()),
            "a queue full of real events drops it"
        );
    }

    #[tokio::test]
    async fn snapshot_then_stream_has_no_gap_and_no_duplicate() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let n = node("n1");
        let agent = online(&hub, "n1", 8);
        let (w, mut rx) = hub.watcher(64);
        w.watch(&n, None).unwrap();
        w.watch(&n, Some(&unit("a.service"))).unwrap();
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(8, 1), "a.service", "active", "running"),
        );
        let snap = w.snapshot().unwrap();
        assert_eq!(
            snap,
            vec![(
                "n1".into(),
                "a.service".into(),
                "active".into(),
                "running".into(),
                8,
                1
            )]
        );
        hub.on_event(
            &agent.session,
            ev_state(ModTag::new(8, 2), "a.service", "inactive", "dead"),
        );
        let items: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        let followed: Vec<_> = items.iter().filter(|d| d.follow).collect();
        assert_eq!(followed.len(), 1);
        assert_eq!(followed[0].event.tag, ModTag::new(8, 2));
        assert!(
            items
                .iter()
                .filter(|d| !d.follow)
                .all(|d| d.event.tag.index <= 1),
            "what the snapshot holds is not marked"
        );
    }
}
