//! Monitors (`org.eclipse.bluechi.Monitor` + `io.drover.Monitor`): the
//! table, their subscriptions and peers, and the task that turns unit events
//! into unicast signals.
//!
//! Invariants:
//!
//! * A monitor belongs to the unique bus name that created it. It ends when
//!   the owner calls `Close`, when the owner leaves the bus
//!   (NameOwnerChanged), or when it does not keep up: its event queue
//!   ([`MONITOR_QUEUE`] items) is bounded and a full queue drops the monitor
//!   (see [`crate::subscriptions`]) instead of buffering. Either way every
//!   peer gets `PeerRemoved` with the reason and the objects are unexported.
//! * Signals go to the owner and to each peer, one unicast message each
//!   (destination set), never broadcast: other clients cannot eavesdrop on
//!   what a monitor watches.
//! * Every subscription is validated completely before anything changes:
//!   node `*` or a valid node name (a valid but unknown node is accepted and
//!   logged, as BlueChi does; garbage is `InvalidArgs`), unit `*` or a valid
//!   unit name.
//! * Ids: monitors from 1, subscriptions from 2 (BlueChi's first value),
//!   peers from 1, each from one manager-wide counter.
//! * After `Follow()` (io.drover.Monitor) the monitor's events go out ONLY
//!   as `UnitsChanged(a(sssssstt))`, to the owner and each peer: every
//!   tagged event taken from the queue for one socket write, in order, in
//!   as few signals as the bounds allow ([`MAX_ROWS_PER_SIGNAL`],
//!   [`MAX_SIGNAL_BYTES`]); BlueChi's per-event signals stop for that
//!   monitor, so a follower pays one message per batch instead of one per
//!   event. Events the tagged stream does not carry (property changes, the
//!   pseudo unit `*`) are then not sent at all. Events queued before the
//!   switch still go out as BlueChi's signals, before the first batch. The
//!   snapshot and the switch happen under the subscription lock, so there
//!   is no gap and no duplicate between them.

use crate::api::monitor::{DroverMonitorObject, MonitorObject};
use crate::core::Core;
use crate::error::ApiError;
use crate::subscriptions::{Change, Delivery, SnapshotRow, UnitEvent, WILDCARD, WatchId, Watcher};
use drover_bus::bluechi::{DROVER_MONITOR_IFACE, MONITOR_IFACE, MONITOR_PATH_PREFIX};
use drover_bus::marshal::{self, PropertyMap};
use drover_protocol::error_names::LIMITS_EXCEEDED;
use drover_protocol::{NodeName, UnitName};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use zbus::names::{BusName, OwnedUniqueName, UniqueName};
use zbus::{Connection, Message, OwnedObjectPath};

/// Events a monitor may have queued before it counts as not keeping up.
pub const MONITOR_QUEUE: usize = 8192;
/// Monitors at once, manager-wide (each holds a queue).
pub const MAX_MONITORS: usize = 1024;
/// Peers per monitor.
pub const MAX_PEERS: usize = 64;
/// Events taken from a monitor's queue per socket write.
const BATCH: usize = 4096;
/// Rows per `UnitsChanged` signal at most.
pub const MAX_ROWS_PER_SIGNAL: usize = 4096;
/// Marshalled rows per `UnitsChanged` signal at most (about; see
/// [`row_bytes`]), far below D-Bus's message size limit.
pub const MAX_SIGNAL_BYTES: usize = 512 * 1024;

pub const REASON_CLOSED: &str = "monitor closed";
pub const REASON_OWNER_GONE: &str = "monitor owner left the bus";
pub const REASON_TOO_SLOW: &str = "monitor dropped: its receivers did not keep up with events";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Inner {
    /// Subscription id → its watches.
    subs: BTreeMap<u32, Vec<WatchId>>,
    /// Peer id → unique name.
    peers: BTreeMap<u32, OwnedUniqueName>,
}

pub struct Monitor {
    id: u32,
    path: OwnedObjectPath,
    owner: OwnedUniqueName,
    /// `None` once closed; dropping it removes every watch.
    watcher: Mutex<Option<Watcher>>,
    inner: Mutex<Inner>,
    closed: AtomicBool,
}

impl Monitor {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn path(&self) -> &OwnedObjectPath {
        &self.path
    }

    pub fn owner(&self) -> &str {
        self.owner.as_str()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn destinations(&self) -> Vec<OwnedUniqueName> {
        let inner = lock(&self.inner);
        std::iter::once(self.owner.clone())
            .chain(inner.peers.values().cloned())
            .collect()
    }

    pub fn subscription_count(&self) -> usize {
        lock(&self.inner).subs.len()
    }
}

/// Validated targets of one `Subscribe`/`SubscribeList` call.
struct Targets {
    nodes: Vec<NodeName>,
    units: Vec<Option<UnitName>>,
}

fn parse_targets(core: &Core, node: &str, units: &[String]) -> Result<(Targets, bool), ApiError> {
    if units.is_empty() {
        return Err(ApiError::invalid_args("no unit given to subscribe to"));
    }
    let mut parsed = Vec::with_capacity(units.len());
    for u in units {
        if u == WILDCARD {
            parsed.push(None);
        } else {
            let unit =
                UnitName::new(u.as_str()).map_err(|e| ApiError::invalid_args(e.to_string()))?;
            parsed.push(Some(unit));
        }
    }
    parsed.sort();
    parsed.dedup();
    let (nodes, known) = if node == WILDCARD {
        let nodes: Vec<_> = core
            .registry()
            .nodes()
            .iter()
            .map(|n| n.name.clone())
            .collect();
        (nodes, true)
    } else {
        let name = NodeName::new(node).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        let known = core.registry().get(name.as_str()).is_some();
        (vec![name], known)
    };
    Ok((
        Targets {
            nodes,
            units: parsed,
        },
        known,
    ))
}

/// The manager's monitors.
pub struct Monitors {
    table: Mutex<HashMap<u32, Arc<Monitor>>>,
    next_monitor: AtomicU32,
    next_sub: AtomicU32,
    next_peer: AtomicU32,
}

impl Default for Monitors {
    fn default() -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            next_monitor: AtomicU32::new(1),
            next_sub: AtomicU32::new(2),
            next_peer: AtomicU32::new(1),
        }
    }
}

impl Monitors {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn len(&self) -> usize {
        lock(&self.table).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, id: u32) -> Option<Arc<Monitor>> {
        lock(&self.table).get(&id).cloned()
    }

    /// `Controller.CreateMonitor` for `owner` (the caller's unique name).
    pub async fn create(
        core: &Arc<Core>,
        conn: &Connection,
        owner: &UniqueName<'_>,
    ) -> Result<OwnedObjectPath, ApiError> {
        let monitors = core.monitors();
        if monitors.len() >= MAX_MONITORS {
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!("too many monitors (at most {MAX_MONITORS})"),
            ));
        }
        let id = monitors.next_monitor.fetch_add(1, Ordering::Relaxed);
        let path = OwnedObjectPath::try_from(format!("{MONITOR_PATH_PREFIX}/{id}"))
            .map_err(|e| ApiError::failed(e.to_string()))?;
        let (watcher, rx) = core.subscriptions().watcher(MONITOR_QUEUE);
        let monitor = Arc::new(Monitor {
            id,
            path: path.clone(),
            owner: owner.to_owned().into(),
            watcher: Mutex::new(Some(watcher)),
            inner: Mutex::new(Inner::default()),
            closed: AtomicBool::new(false),
        });
        lock(&monitors.table).insert(id, monitor.clone());
        let server = conn.object_server();
        let exported = async {
            server
                .at(
                    path.as_str(),
                    MonitorObject::new(core.clone(), monitor.clone()),
                )
                .await?;
            server
                .at(
                    path.as_str(),
                    DroverMonitorObject::new(core.clone(), monitor.clone()),
                )
                .await
        }
        .await;
        if let Err(e) = exported {
            Self::close(core, conn, &monitor, REASON_CLOSED).await;
            return Err(ApiError::failed(format!("cannot export the monitor: {e}")));
        }
        tokio::spawn(emit_loop(core.clone(), conn.clone(), monitor.clone(), rx));
        // The owner may have left before we started watching for it.
        let (core2, conn2, m2) = (core.clone(), conn.clone(), monitor.clone());
        tokio::spawn(async move {
            let gone = match zbus::fdo::DBusProxy::new(&conn2).await {
                Ok(p) => matches!(
                    p.name_has_owner(BusName::from(m2.owner.as_ref())).await,
                    Ok(false)
                ),
                Err(_) => false,
            };
            if gone {
                Monitors::close(&core2, &conn2, &m2, REASON_OWNER_GONE).await;
            }
        });
        tracing::debug!(monitor = id, owner = %owner, "monitor created");
        Ok(path)
    }

    /// `Subscribe` / `SubscribeList`: one subscription id for every node ×
    /// unit given.
    pub fn subscribe(
        core: &Core,
        monitor: &Monitor,
        node: &str,
        units: &[String],
    ) -> Result<u32, ApiError> {
        let (targets, known) = parse_targets(core, node, units)?;
        if !known {
            tracing::info!(
                monitor = monitor.id,
                "subscription to node '{node}', which is not configured (it can never register)"
            );
        }
        let watcher = lock(&monitor.watcher);
        let Some(watcher) = watcher.as_ref() else {
            return Err(ApiError::failed("the monitor is closed"));
        };
        let mut watches = Vec::new();
        for n in &targets.nodes {
            for u in &targets.units {
                match watcher.watch(n, u.as_ref()) {
                    Some(w) => watches.push(w),
                    None => {
                        for w in watches {
                            watcher.unwatch(w);
                        }
                        return Err(ApiError::failed("the monitor was dropped"));
                    }
                }
            }
        }
        let id = core.monitors().next_sub.fetch_add(1, Ordering::Relaxed);
        lock(&monitor.inner).subs.insert(id, watches);
        Ok(id)
    }

    pub fn unsubscribe(monitor: &Monitor, id: u32) -> Result<(), ApiError> {
        let Some(watches) = lock(&monitor.inner).subs.remove(&id) else {
            return Err(ApiError::failed(format!("Subscription '{id}' not found")));
        };
        if let Some(watcher) = lock(&monitor.watcher).as_ref() {
            for w in watches {
                watcher.unwatch(w);
            }
        }
        Ok(())
    }

    pub fn add_peer(core: &Core, monitor: &Monitor, name: &str) -> Result<u32, ApiError> {
        let peer = UniqueName::try_from(name).map_err(|_| {
            ApiError::invalid_args(format!(
                "Peer name '{}' is not a valid unique bus name",
                name.escape_default()
            ))
        })?;
        if monitor.is_closed() {
            return Err(ApiError::failed("the monitor is closed"));
        }
        let mut inner = lock(&monitor.inner);
        if peer.as_str() == monitor.owner.as_str()
            || inner.peers.values().any(|p| p.as_str() == peer.as_str())
        {
            return Err(ApiError::invalid_args(format!(
                "Peer name '{name}' has already been added"
            )));
        }
        if inner.peers.len() >= MAX_PEERS {
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!("a monitor has at most {MAX_PEERS} peers"),
            ));
        }
        let id = core.monitors().next_peer.fetch_add(1, Ordering::Relaxed);
        inner.peers.insert(id, peer.to_owned().into());
        Ok(id)
    }

    pub async fn remove_peer(
        conn: &Connection,
        monitor: &Monitor,
        id: u32,
        reason: &str,
    ) -> Result<(), ApiError> {
        let Some(peer) = lock(&monitor.inner).peers.remove(&id) else {
            return Err(ApiError::failed(format!("Peer with ID '{id}' not found.")));
        };
        send_peer_removed(conn, monitor, &peer, reason).await;
        Ok(())
    }

    /// `Follow()`: see the module docs.
    pub fn follow(monitor: &Monitor) -> Result<Vec<SnapshotRow>, ApiError> {
        lock(&monitor.watcher)
            .as_ref()
            .and_then(Watcher::snapshot)
            .ok_or_else(|| ApiError::failed("the monitor is closed"))
    }

    /// Ends a monitor (idempotent): watches go, peers get `PeerRemoved`
    /// with `reason`, objects are unexported.
    pub async fn close(core: &Core, conn: &Connection, monitor: &Arc<Monitor>, reason: &str) {
        if monitor.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let watcher = lock(&monitor.watcher).take();
        drop(watcher);
        let peers: Vec<_> = {
            let mut inner = lock(&monitor.inner);
            inner.subs.clear();
            std::mem::take(&mut inner.peers).into_values().collect()
        };
        for peer in &peers {
            send_peer_removed(conn, monitor, peer, reason).await;
        }
        lock(&core.monitors().table).remove(&monitor.id);
        let server = conn.object_server();
        let _ = server
            .remove::<MonitorObject, _>(monitor.path.as_str())
            .await;
        let _ = server
            .remove::<DroverMonitorObject, _>(monitor.path.as_str())
            .await;
        tracing::debug!(monitor = monitor.id, "monitor closed: {reason}");
    }

    /// A unique name left the bus: close the monitors it owns, forget it as
    /// a peer.
    pub async fn name_gone(core: &Core, conn: &Connection, name: &str) {
        let all: Vec<_> = lock(&core.monitors().table).values().cloned().collect();
        for m in all {
            if m.owner.as_str() == name {
                Self::close(core, conn, &m, REASON_OWNER_GONE).await;
            } else {
                lock(&m.inner).peers.retain(|_, p| p.as_str() != name);
            }
        }
    }

    /// Closes every monitor (manager shutdown).
    pub async fn close_all(core: &Core, conn: &Connection) {
        let all: Vec<_> = lock(&core.monitors().table).values().cloned().collect();
        for m in all {
            Self::close(core, conn, &m, REASON_CLOSED).await;
        }
    }
}

async fn send_peer_removed(
    conn: &Connection,
    monitor: &Monitor,
    peer: &OwnedUniqueName,
    reason: &str,
) {
    let msg = Message::signal(monitor.path.as_ref(), MONITOR_IFACE, "PeerRemoved")
        .destination(peer.as_ref())
        .build(&(reason,));
    match msg {
        Ok(msg) => {
            if let Err(e) = conn.send(&msg).await {
                tracing::debug!(monitor = monitor.id, "cannot send PeerRemoved: {e}");
            }
        }
        Err(e) => tracing::error!("cannot build PeerRemoved: {e}"),
    }
}

fn reason_str(change: &Change) -> &'static str {
    match change {
        Change::New { reason } | Change::State { reason, .. } | Change::Removed { reason } => {
            reason.as_str()
        }
        Change::Properties { .. } => "real",
    }
}

/// BlueChi's signal for one event, prepared once and then built for each
/// destination (so property dictionaries are decoded once per event, not
/// once per owner and peer). Only for deliveries queued before `Follow()`.
enum BluechiSignal<'a> {
    /// `UnitNew` / `UnitRemoved`: (node, unit, reason).
    Short(&'static str, (&'a str, &'a str, &'static str)),
    /// `UnitStateChanged`: (node, unit, active, sub, reason).
    State((&'a str, &'a str, &'a str, &'a str, &'static str)),
    /// `UnitPropertiesChanged`: (node, unit, interface, props).
    Properties(
        (
            &'a str,
            &'a str,
            &'a str,
            HashMap<String, zbus::OwnedVariant>,
        ),
    ),
}

impl<'a> BluechiSignal<'a> {
    /// `None` for properties the agent sent undecodable (dropped, logged).
    fn of(event: &'a UnitEvent) -> Option<Self> {
        let node = event.node.as_str();
        let unit = event.unit_str();
        let reason = reason_str(&event.change);
        Some(match &event.change {
            Change::New { .. } => Self::Short("UnitNew", (node, unit, reason)),
            Change::Removed { .. } => Self::Short("UnitRemoved", (node, unit, reason)),
            Change::State {
                active_state,
                sub_state,
                ..
            } => Self::State((node, unit, active_state, sub_state, reason)),
            Change::Properties {
                interface,
                properties,
            } => match marshal::decode::<PropertyMap>(properties) {
                Ok(props) => Self::Properties((node, unit, interface, props)),
                Err(e) => {
                    tracing::debug!(
                        node,
                        unit,
                        "undecodable properties from the agent dropped: {e}"
                    );
                    return None;
                }
            },
        })
    }

    fn build(&self, path: &OwnedObjectPath, dest: &OwnedUniqueName) -> zbus::Result<Message> {
        let signal = |member: &'static str| {
            Message::signal(path.as_ref(), MONITOR_IFACE, member).destination(dest.as_ref())
        };
        match self {
            Self::Short(member, body) => signal(member).build(body),
            Self::State(body) => signal("UnitStateChanged").build(body),
            Self::Properties(body) => signal("UnitPropertiesChanged").build(body),
        }
    }
}

/// One entry of `io.drover.Monitor.UnitsChanged`, `(sssssstt)`: node, unit,
/// kind, active_state, sub_state, reason, guid, index. Borrowed from the
/// queued events, so building a batch copies no string.
type TaggedRow<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    u64,
    u64,
);

/// The tagged entry of an event, or `None` for what the tagged stream does
/// not carry (property changes, the pseudo unit `*`).
fn tagged_row(event: &UnitEvent) -> Option<TaggedRow<'_>> {
    event.unit.as_ref()?;
    let (kind, active, sub) = match &event.change {
        Change::New { .. } => ("new", "inactive", "dead"),
        Change::State {
            active_state,
            sub_state,
            ..
        } => ("state", active_state.as_str(), sub_state.as_str()),
        Change::Removed { .. } => ("removed", "", ""),
        Change::Properties { .. } => return None,
    };
    Some((
        event.node.as_str(),
        event.unit_str(),
        kind,
        active,
        sub,
        reason_str(&event.change),
        event.tag.guid,
        event.tag.index,
    ))
}

/// Upper bound of a row's marshalled size: struct alignment (8), each
/// string's length word, NUL and padding (at most 8 over its length), the
/// two u64 with their alignment.
fn row_bytes(row: &TaggedRow<'_>) -> usize {
    let strings = [row.0, row.1, row.2, row.3, row.4, row.5];
    8 + strings.iter().map(|s| s.len() + 8).sum::<usize>() + 24
}

/// Tagged rows waiting to go out as `UnitsChanged`, cut into signals of at
/// most [`MAX_ROWS_PER_SIGNAL`] rows and about [`MAX_SIGNAL_BYTES`].
struct TaggedBatch<'a> {
    /// Finished chunks (each one signal per destination), in order.
    chunks: Vec<Vec<TaggedRow<'a>>>,
    bytes: usize,
}

impl<'a> TaggedBatch<'a> {
    fn new() -> Self {
        Self {
            chunks: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, row: TaggedRow<'a>) {
        let size = row_bytes(&row);
        let full = self
            .chunks
            .last()
            .is_none_or(|c| c.len() >= MAX_ROWS_PER_SIGNAL || self.bytes + size > MAX_SIGNAL_BYTES);
        if full {
            self.chunks.push(Vec::new());
            self.bytes = 0;
        }
        self.bytes += size;
        if let Some(c) = self.chunks.last_mut() {
            c.push(row);
        }
    }

    /// Appends one `UnitsChanged` per chunk per destination (chunk-major,
    /// so each destination sees the rows in order) and empties the batch.
    fn flush(
        &mut self,
        path: &OwnedObjectPath,
        dests: &[OwnedUniqueName],
        out: &mut Vec<Message>,
    ) -> zbus::Result<()> {
        for chunk in self.chunks.drain(..) {
            for dest in dests {
                out.push(
                    Message::signal(path.as_ref(), DROVER_MONITOR_IFACE, "UnitsChanged")
                        .destination(dest.as_ref())
                        .build(&(&chunk,))?,
                );
            }
        }
        self.bytes = 0;
        Ok(())
    }
}

/// Turns one drained batch of deliveries into the messages for every
/// destination, in queue order: deliveries queued before `Follow()` as
/// BlueChi's per-event signals, those after it as `UnitsChanged` batches
/// only.
fn messages_for_batch(
    path: &OwnedObjectPath,
    dests: &[OwnedUniqueName],
    batch: &[Delivery],
    out: &mut Vec<Message>,
) -> zbus::Result<()> {
    let mut tagged = TaggedBatch::new();
    for d in batch {
        if d.follow {
            if let Some(row) = tagged_row(&d.event) {
                tagged.push(row);
            }
            continue;
        }
        // A plain delivery after followed ones cannot happen (follow only
        // turns on), but keep the order right regardless.
        tagged.flush(path, dests, out)?;
        if let Some(signal) = BluechiSignal::of(&d.event) {
            for dest in dests {
                out.push(signal.build(path, dest)?);
            }
        }
    }
    tagged.flush(path, dests, out)
}

/// Drains the monitor's queue in batches into unicast signals. The queue
/// ends when the monitor is closed, or when it overflowed: then the
/// monitor is closed here.
async fn emit_loop(
    core: Arc<Core>,
    conn: Connection,
    monitor: Arc<Monitor>,
    mut rx: mpsc::Receiver<Delivery>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut msgs = Vec::new();
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            break;
        }
        if monitor.is_closed() {
            break;
        }
        let dests = monitor.destinations();
        if let Err(e) = messages_for_batch(&monitor.path, &dests, &batch, &mut msgs) {
            tracing::error!(monitor = monitor.id, "cannot build a monitor signal: {e}");
        }
        batch.clear();
        if let Err(e) = conn.send_all(&msgs).await {
            tracing::warn!(monitor = monitor.id, "cannot send monitor signals: {e}");
        }
        msgs.clear();
    }
    if !monitor.is_closed() {
        tracing::warn!(
            monitor = monitor.id,
            owner = %monitor.owner,
            "closing a monitor whose receivers did not keep up (queue of {MONITOR_QUEUE} events full)"
        );
        Monitors::close(&core, &conn, &monitor, REASON_TOO_SLOW).await;
    }
}

/// Closes monitors whose owner leaves the bus, and forgets peers that
/// leave. Runs until the connection closes.
pub async fn watch_owners(core: Arc<Core>, conn: Connection) {
    use futures::StreamExt;
    let proxy = match zbus::fdo::DBusProxy::new(&conn).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("cannot watch bus names; monitors of vanished clients stay: {e}");
            return;
        }
    };
    let Ok(mut changes) = proxy.receive_name_owner_changed().await else {
        return;
    };
    while let Some(signal) = changes.next().await {
        let Ok(args) = signal.args() else { continue };
        let name = args.name.as_str();
        if name.starts_with(':') && args.new_owner.is_none() && !core.monitors().is_empty() {
            Monitors::name_gone(&core, &conn, name).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{ModTag, Reason};

    fn event(unit: Option<&str>, index: u64, change: Change) -> Delivery {
        event_on("node1", unit, index, change)
    }

    fn event_on(node: &str, unit: Option<&str>, index: u64, change: Change) -> Delivery {
        Delivery {
            event: Arc::new(UnitEvent {
                node: NodeName::new(node).unwrap(),
                unit: unit.map(|u| UnitName::new(u).unwrap()),
                tag: ModTag::new(7, index),
                change,
            }),
            follow: true,
        }
    }

    fn state(index: u64) -> Delivery {
        event(
            Some("a.service"),
            index,
            Change::State {
                active_state: "active".into(),
                sub_state: "running".into(),
                reason: Reason::Real,
            },
        )
    }

    fn path() -> OwnedObjectPath {
        OwnedObjectPath::try_from("/org/eclipse/bluechi/monitor/1").unwrap()
    }

    fn dests(names: &[&str]) -> Vec<OwnedUniqueName> {
        names
            .iter()
            .map(|n| UniqueName::try_from(*n).unwrap().into())
            .collect()
    }

    type Row = (String, String, String, String, String, String, u64, u64);

    /// (destination, member, rows) of each message, in order.
    fn decode(msgs: &[Message]) -> Vec<(String, String, Vec<Row>)> {
        msgs.iter()
            .map(|m| {
                let h = m.header();
                let dest = h.destination().map(|d| d.to_string()).unwrap_or_default();
                let member = h.member().map(|m| m.to_string()).unwrap_or_default();
                let rows = if member == "UnitsChanged" {
                    m.body().deserialize::<(Vec<Row>,)>().unwrap().0
                } else {
                    Vec::new()
                };
                (dest, member, rows)
            })
            .collect()
    }

    #[test]
    fn followed_events_go_out_as_one_batch_per_destination_in_order() {
        let batch: Vec<Delivery> = (1..=100).map(state).collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5", ":1.9"]), &batch, &mut out).unwrap();
        let got = decode(&out);
        assert_eq!(got.len(), 2, "one UnitsChanged per destination");
        for (dest, (d, member, rows)) in [":1.5", ":1.9"].iter().zip(&got) {
            assert_eq!(d, dest);
            assert_eq!(member, "UnitsChanged");
            let indexes: Vec<u64> = rows.iter().map(|r| r.7).collect();
            assert_eq!(indexes, (1..=100).collect::<Vec<_>>());
            assert_eq!(
                rows[0],
                (
                    "node1".into(),
                    "a.service".into(),
                    "state".into(),
                    "active".into(),
                    "running".into(),
                    "real".into(),
                    7,
                    1
                )
            );
        }
    }

    #[test]
    fn batches_stay_within_the_entry_and_size_bounds() {
        // Many small entries: cut by count.
        let batch: Vec<Delivery> = (1..=(MAX_ROWS_PER_SIGNAL as u64 * 2 + 5))
            .map(state)
            .collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        let sizes: Vec<usize> = decode(&out).iter().map(|m| m.2.len()).collect();
        assert_eq!(sizes, vec![MAX_ROWS_PER_SIGNAL, MAX_ROWS_PER_SIGNAL, 5]);
        // Large entries (long unit names): cut by bytes; the estimate must
        // bound the real marshalled size, and nothing is lost or reordered.
        let long = "x".repeat(240);
        let batch: Vec<Delivery> = (1..=3000)
            .map(|i| {
                event(
                    Some(&format!("{long}{i}.service")),
                    i,
                    Change::New {
                        reason: Reason::Virtual,
                    },
                )
            })
            .collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        assert!(out.len() >= 2, "split by size: {} signal(s)", out.len());
        for m in &out {
            assert!(
                m.body().len() <= MAX_SIGNAL_BYTES,
                "{} bytes in one signal",
                m.body().len()
            );
        }
        let indexes: Vec<u64> = decode(&out)
            .into_iter()
            .flat_map(|m| m.2)
            .map(|r| r.7)
            .collect();
        assert_eq!(indexes, (1..=3000).collect::<Vec<_>>());
    }

    #[test]
    fn events_queued_before_follow_go_first_as_bluechi_signals_and_untagged_ones_are_dropped() {
        let mut early = state(1);
        early.follow = false;
        let batch = vec![
            early,
            state(2),
            // The pseudo unit and property changes have no tagged entry.
            event(
                None,
                3,
                Change::New {
                    reason: Reason::Virtual,
                },
            ),
            event(
                Some("a.service"),
                4,
                Change::Properties {
                    interface: "org.freedesktop.systemd1.Unit".into(),
                    properties: drover_protocol::Marshalled::default(),
                },
            ),
            event(
                Some("a.service"),
                5,
                Change::Removed {
                    reason: Reason::Real,
                },
            ),
        ];
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        let got = decode(&out);
        let members: Vec<&str> = got.iter().map(|m| m.1.as_str()).collect();
        assert_eq!(members, vec!["UnitStateChanged", "UnitsChanged"]);
        let rows: Vec<(&str, u64)> = got[1].2.iter().map(|r| (r.2.as_str(), r.7)).collect();
        assert_eq!(rows, vec![("state", 2), ("removed", 5)]);
        assert_eq!(
            got[1].2[1],
            (
                "node1".into(),
                "a.service".into(),
                "removed".into(),
                "".into(),
                "".into(),
                "real".into(),
                7,
                5
            )
        );
    }
}
