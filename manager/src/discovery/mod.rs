//! Discovery: where is a unit running, and healthy (`io.drover.Controller.
//! Where`, docs/discovery.md). The manager keeps a unit → nodes
//! [`Index`] fed by the unit events it already receives; a query never
//! walks the nodes.
//!
//! How the index is fed: discovery is one sink of the subscription hub
//! ([`crate::units::hub`]) that watches every indexed unit on every online
//! node (a node that registers gets the watches of all indexed units, so
//! "every node, present and future"). The hub's deliveries (unit events,
//! health changes) are applied by one task ([`Discovery::run`]) in order.
//!
//! Which units are indexed: every unit someone asked `Where` about, at
//! most [`index::DEFAULT_CAP`]; one more evicts the unit asked about least
//! recently (its watches end). So the index holds at most cap × nodes
//! rows, and the agents report only units someone cares about.
//!
//! A unit asked about for the first time is indexed within the call: it
//! is watched on every online node, the call waits until every agent
//! confirmed its subscription (the agent replays the unit's state before
//! it confirms) or [`FIRST_QUERY_WAIT`] passed, then until the task
//! applied what was queued, and answers from the index (`complete` is
//! false when not every agent answered in time).
//!
//! Last-good state: when a node's session ends, its rows are marked stale
//! (with the time) before the hub's virtual offline events, which the
//! index ignores (events of a node's dead session never change its rows).
//! Stale rows are left out of answers without the `stale` option, and
//! once `StaleRetention` passed they are left out always and removed.
//! When the node registers again and its agent confirmed the watches, the
//! stale rows of units its replay did not report are removed: the others
//! are fresh again. BlueChi's API is untouched by all this (the hub sends
//! its virtual events as before).
//!
//! Warm-up: after a start, until every node of the configuration
//! (`AllowedNodeNames` names) registered or `WarmUpTimeout` passed, every
//! answer is `complete = false` ([`Discovery::warming_up`]).
//!
//! Beside it: [`drain`], drained nodes and units, kept across restarts in
//! the manager's state directory.

pub mod drain;
pub mod index;
pub mod ports;
pub mod query;

use crate::units::hub::{Delivery, Subscriptions, WatchId, Watcher};
use crate::warm_up::WarmUp;
use drain::Drained;
use drover_config::DiscoverySettings;
use drover_protocol::ports::{PORT_UNITS_MAX, Ports};
use drover_protocol::{NodeName, UnitName};
use index::Index;
use ports::PortsBook;
use query::{Options, WhereRow, where_row};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};

/// The longest a first query of a unit waits for the agents' replays.
pub const FIRST_QUERY_WAIT: Duration = Duration::from_secs(5);

/// Deliveries the hub may queue for the index before the task takes them:
/// beyond, the hub drops the sink and [`Discovery::run`] builds the index
/// again from the hub. Channel memory grows only with what is queued.
const QUEUE: usize = 1 << 22;

/// Deliveries applied under one lock.
const BATCH: usize = 1024;

/// Why a `Where` call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WhereError {
    /// The answer would not fit in one D-Bus message.
    TooLarge { rows: usize },
}

enum Command {
    /// Answer once everything queued so far is applied.
    Barrier(oneshot::Sender<()>),
    /// `node`'s agent of `session` confirmed its watches: its stale rows
    /// of older sessions go.
    Refreshed(NodeName, u64),
}

struct Nodes {
    /// Online nodes: session and the node's address (its
    /// `AdvertiseAddress=`, else the address the manager sees).
    online: HashMap<NodeName, (u64, String)>,
    /// The last address of nodes that went offline (their stale rows).
    last_address: HashMap<NodeName, String>,
    /// The dead session of an offline node (its events are ignored).
    dead: HashMap<NodeName, u64>,
    /// Configured nodes that did not register since the start.
    warm_up: WarmUp,
    /// The ports each node's units declare (see [`PortsBook`]): kept while
    /// the node's stale rows are, replaced by its next session's.
    ports: PortsBook,
}

struct State {
    index: Index,
    watcher: Watcher,
    watches: HashMap<UnitName, HashMap<NodeName, WatchId>>,
    nodes: Nodes,
    /// Units indexed but not confirmed by every agent yet: what to wait for.
    warming: HashMap<UnitName, Vec<(NodeName, Option<UnitName>)>>,
    /// (deadline, node, session) of stale rows, oldest first.
    expiries: VecDeque<(Instant, NodeName, u64)>,
}

/// See the module docs.
pub struct Discovery {
    hub: Arc<Subscriptions>,
    state: Mutex<State>,
    settings: DiscoverySettings,
    /// The nodes of the configuration (what a warm-up awaits).
    configured: Vec<NodeName>,
    commands: mpsc::Sender<Command>,
    /// Taken by [`Discovery::run`].
    start: Mutex<Option<(mpsc::Receiver<Delivery>, mpsc::Receiver<Command>)>>,
}

fn usec(t: SystemTime) -> u64 {
    crate::units::health::usec(t)
}

impl Discovery {
    /// `configured`: the nodes of the configuration (the warm-up waits for
    /// them). Call [`Discovery::run`] on a runtime to feed the index.
    pub fn new(
        hub: Arc<Subscriptions>,
        settings: DiscoverySettings,
        configured: &[NodeName],
        cap: usize,
    ) -> Arc<Self> {
        let (watcher, rx) = hub.state_watcher(QUEUE);
        let (commands, cmd_rx) = mpsc::channel(1024);
        let nodes = Nodes {
            warm_up: WarmUp::new(
                configured.iter().cloned(),
                tokio::time::Instant::now() + settings.warm_up_timeout,
            ),
            online: HashMap::new(),
            last_address: HashMap::new(),
            dead: HashMap::new(),
            ports: PortsBook::default(),
        };
        Arc::new(Self {
            hub,
            state: Mutex::new(State {
                index: Index::new(cap),
                watcher,
                watches: HashMap::new(),
                nodes,
                warming: HashMap::new(),
                expiries: VecDeque::new(),
            }),
            settings,
            configured: configured.to_vec(),
            commands,
            start: Mutex::new(Some((rx, cmd_rx))),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No section under this lock panics on input; a poisoned lock
        // still holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This manager starts to lead (high availability): answers are
    /// incomplete again until the configured nodes that are not online
    /// registered, for the configured `WarmUpTimeout` at most.
    pub fn restart_warm_up(&self) {
        let mut st = self.lock();
        let absent: Vec<NodeName> = self
            .configured
            .iter()
            .filter(|n| !st.nodes.online.contains_key(*n))
            .cloned()
            .collect();
        st.nodes.warm_up = WarmUp::new(
            absent,
            tokio::time::Instant::now() + self.settings.warm_up_timeout,
        );
    }

    /// True while the manager is warming up (see the module docs).
    pub fn warming_up(&self) -> bool {
        self.lock().nodes.warm_up.is_on(tokio::time::Instant::now())
    }

    /// Units indexed now and rows held (stale ones included).
    pub fn size(&self) -> (usize, usize) {
        let st = self.lock();
        (st.index.len(), st.index.row_count())
    }

    /// A session of `node` was admitted (after the hub knows it): watch
    /// every indexed unit there; once its agent confirmed them, its stale
    /// rows of older sessions go.
    pub fn node_online(self: &Arc<Self>, node: &NodeName, session: u64, address: &str) {
        let mut st = self.lock();
        st.nodes
            .online
            .insert(node.clone(), (session, address.to_owned()));
        st.nodes.dead.remove(node);
        st.nodes.last_address.remove(node);
        st.nodes.ports.node_online(node, session);
        if st.nodes.warm_up.arrived(node) {
            tracing::info!("discovery: every configured node registered; warm-up over");
        }
        let units: Vec<UnitName> = st.index.units().cloned().collect();
        let mut watched = Vec::with_capacity(units.len());
        for u in units {
            if let Some(w) = st.watcher.watch(node, Some(&u)) {
                st.watches
                    .entry(u.clone())
                    .or_default()
                    .insert(node.clone(), w);
                watched.push((node.clone(), Some(u)));
            }
        }
        drop(st);
        let synced = self.synced(watched);
        let me = self.clone();
        let node = node.clone();
        tokio::spawn(async move {
            synced.await;
            let _ = me.commands.send(Command::Refreshed(node, session)).await;
        });
    }

    /// The session `session` of `node` ended: its rows go stale now. Call
    /// before the hub hears of it (its virtual offline events are then
    /// ignored here), and [`Discovery::forget_watches`] after.
    pub fn node_offline(&self, node: &NodeName, session: u64) {
        let mut st = self.lock();
        if st.nodes.online.get(node).map(|(s, _)| *s) != Some(session) {
            return;
        }
        if let Some((_, addr)) = st.nodes.online.remove(node) {
            st.nodes.last_address.insert(node.clone(), addr);
        }
        st.nodes.dead.insert(node.clone(), session);
        let n = st
            .index
            .node_offline(node, session, usec(SystemTime::now()));
        // Also without rows: the node's address and ports go at the deadline.
        let deadline = Instant::now() + self.settings.stale_retention;
        st.expiries.push_back((deadline, node.clone(), session));
        if n > 0 {
            tracing::info!(
                node = %node,
                "node {node} offline: {n} unit record(s) kept as stale for {}",
                drover_config::timespan::format(self.settings.stale_retention)
            );
        }
    }

    /// Ends the watches on an offline `node` (the hub forgets its records).
    pub fn forget_watches(&self, node: &NodeName) {
        let mut st = self.lock();
        if st.nodes.online.contains_key(node) {
            return;
        }
        let ids: Vec<WatchId> = st
            .watches
            .values_mut()
            .filter_map(|m| m.remove(node))
            .collect();
        for id in ids {
            st.watcher.unwatch(id);
        }
    }

    /// `node`'s agent (session `session`) says `unit` declares `ports`
    /// (empty: none). Ports of an older session are dropped; beyond
    /// [`PORT_UNITS_MAX`] units a node's new ones are not kept.
    pub fn set_ports(&self, node: &NodeName, session: u64, unit: UnitName, ports: Ports) {
        let mut st = self.lock();
        let current = st.nodes.online.get(node).map(|(s, _)| *s);
        if !st
            .nodes
            .ports
            .set(node, session, current, unit.clone(), ports)
            && current == Some(session)
        {
            tracing::debug!(node = %node, "node {node}: ports of {unit} not kept ({PORT_UNITS_MAX} units have ports)");
        }
    }

    /// `Where(unit, options)`: the rows and whether the answer is complete.
    /// `max_body`: the most bytes the rows may take on the wire; `drained`:
    /// what is out of service (a drained row is left out, or marked with
    /// the `drained` option).
    pub async fn find(
        &self,
        unit: &UnitName,
        options: &Options,
        max_body: usize,
        drained: &Drained,
    ) -> Result<(Vec<WhereRow>, bool), WhereError> {
        let mut complete = true;
        if let Some(wait) = self.index_unit(unit) {
            complete = tokio::time::timeout(FIRST_QUERY_WAIT, wait).await.is_ok();
            if complete {
                self.lock().warming.remove(unit);
            }
            self.barrier().await;
        }
        let now = usec(SystemTime::now());
        let retention =
            u64::try_from(self.settings.stale_retention.as_micros()).unwrap_or(u64::MAX);
        let out_of_service = drained.snapshot();
        let st = self.lock();
        let mut rows = Vec::new();
        let mut bytes = 0usize;
        if let Some(selected) = st.index.select(unit, &options.filter, now, retention) {
            for (node, row) in selected {
                let address = st.nodes.address(node);
                let drained = out_of_service.is_drained(node.as_str(), unit.as_str());
                if drained && !options.drained {
                    continue;
                }
                let ports = st.nodes.ports.pairs(node, unit);
                let r = where_row(node, row, address, drained, &ports);
                bytes += query::wire_size(&r);
                if bytes > max_body {
                    return Err(WhereError::TooLarge { rows: rows.len() });
                }
                rows.push(r);
            }
        }
        let complete = complete && !st.nodes.warm_up.is_on(tokio::time::Instant::now());
        Ok((rows, complete))
    }

    /// Indexes `unit` if it is not yet (watching it on every online node)
    /// and returns what to wait for while the agents have not all
    /// confirmed it; `None` when it is ready.
    fn index_unit(
        &self,
        unit: &UnitName,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static + use<>> {
        let mut st = self.lock();
        if st.index.contains(unit) {
            st.index.touch(unit);
            let list = st.warming.get(unit)?.clone();
            return Some(self.synced(list));
        }
        if let Some(evicted) = st.index.insert(unit) {
            tracing::debug!("discovery: index full, {evicted} evicted");
            st.warming.remove(&evicted);
            for (_, id) in st.watches.remove(&evicted).unwrap_or_default() {
                st.watcher.unwatch(id);
            }
        }
        let nodes: Vec<NodeName> = st.nodes.online.keys().cloned().collect();
        let mut list = Vec::with_capacity(nodes.len());
        let mut ids = HashMap::with_capacity(nodes.len());
        for node in nodes {
            if let Some(id) = st.watcher.watch(&node, Some(unit)) {
                ids.insert(node.clone(), id);
                list.push((node, Some(unit.clone())));
            }
        }
        st.watches.insert(unit.clone(), ids);
        st.warming.insert(unit.clone(), list.clone());
        Some(self.synced(list))
    }

    /// Once every agent in `watched` confirmed (see `Subscriptions::synced`).
    fn synced(
        &self,
        watched: Vec<(NodeName, Option<UnitName>)>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static + use<> {
        let hub = self.hub.clone();
        async move { hub.synced(&watched).await }
    }

    /// Returns once the task applied everything queued before the call.
    async fn barrier(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Barrier(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Applies deliveries to the index.
    fn apply(&self, batch: &[Delivery]) {
        let now = usec(SystemTime::now());
        let mut st = self.lock();
        for d in batch {
            let ev = &d.event;
            let Some(unit) = &ev.unit else { continue };
            // Events of a node's ended session (its late events, the hub's
            // virtual offline events) never change its last-good rows.
            if st.nodes.dead.get(&ev.node) == Some(&ev.tag.guid) {
                continue;
            }
            // Unit and health events carry the session's tag (guid).
            st.index.apply(&ev.node, ev.tag.guid, unit, &ev.change, now);
        }
    }

    /// Removes the stale rows whose retention ran out.
    fn expire(&self, now: Instant) {
        let mut st = self.lock();
        while st.expiries.front().is_some_and(|(t, _, _)| *t <= now) {
            let Some((_, node, session)) = st.expiries.pop_front() else {
                break;
            };
            let n = st.index.expire(&node, session);
            if n > 0 {
                tracing::info!(
                    node = %node,
                    "node {node}: {n} stale unit record(s) expired (StaleRetention)"
                );
            }
            if !st.nodes.online.contains_key(&node) && st.nodes.dead.get(&node) == Some(&session) {
                st.nodes.last_address.remove(&node);
            }
            st.nodes.ports.expire(&node, session);
        }
    }

    /// The hub dropped the index's sink (its queue overflowed): a new sink,
    /// the same watches, and the rows the events kept are built again from
    /// the replays (stale rows stay).
    fn rebuild(&self) -> mpsc::Receiver<Delivery> {
        tracing::warn!("discovery: the unit index fell behind the events; building it again");
        let (watcher, rx) = self.hub.state_watcher(QUEUE);
        let mut st = self.lock();
        st.index.clear_fresh();
        st.watcher = watcher;
        let units: Vec<UnitName> = st.index.units().cloned().collect();
        let nodes: Vec<NodeName> = st.nodes.online.keys().cloned().collect();
        st.watches.clear();
        for u in &units {
            let mut ids = HashMap::new();
            for n in &nodes {
                if let Some(id) = st.watcher.watch(n, Some(u)) {
                    ids.insert(n.clone(), id);
                }
            }
            st.watches.insert(u.clone(), ids);
        }
        rx
    }

    /// Feeds the index until the manager stops (one task).
    pub async fn run(self: Arc<Self>) {
        let taken = self.start.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((mut rx, mut commands)) = taken else {
            return;
        };
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        rx = self.rebuild();
                        continue;
                    }
                    self.apply(&batch);
                    batch.clear();
                }
                cmd = commands.recv() => {
                    let Some(cmd) = cmd else { return };
                    // Everything the hub queued before the command first.
                    while let Ok(d) = rx.try_recv() {
                        batch.push(d);
                        if batch.len() == BATCH {
                            self.apply(&batch);
                            batch.clear();
                        }
                    }
                    self.apply(&batch);
                    batch.clear();
                    match cmd {
                        Command::Barrier(done) => {
                            let _ = done.send(());
                        }
                        Command::Refreshed(node, session) => {
                            let mut st = self.lock();
                            if st.nodes.online.get(&node).map(|(s, _)| *s) == Some(session) {
                                st.index.drop_stale(&node, session);
                            }
                        }
                    }
                }
                _ = tick.tick() => self.expire(Instant::now()),
            }
        }
    }
}

impl Nodes {
    /// The address of `node` (its last one while offline), `""` if
    /// unknown.
    fn address(&self, node: &NodeName) -> &str {
        self.online
            .get(node)
            .map(|(_, a)| a.as_str())
            .or_else(|| self.last_address.get(node).map(String::as_str))
            .unwrap_or("")
    }
}
