//! Monitors (`org.eclipse.bluechi.Monitor` + `io.drover.Monitor`): the
//! table, their subscriptions and peers, and the task that sends their unit
//! events as unicast signals (built by [`crate::units::signals`]). Their
//! D-Bus objects come and go through [`MonitorObjects`].
//!
//! Invariants:
//!
//! * A monitor belongs to the unique bus name that created it. Only that
//!   name may call its methods, or a root caller (BlueChi checks no owner,
//!   and its policy lets only root call at all, so root keeps that reach);
//!   anyone else gets `AccessDenied` ([`crate::api::monitor`]).
//! * Each client (unique bus name) may hold [`MAX_MONITORS_PER_CLIENT`]
//!   monitors, all clients together [`MAX_MONITORS`]; over either,
//!   `CreateMonitor` is `LimitsExceeded` and nothing changes. A client's
//!   monitors count against it until they are closed, which happens at the
//!   latest when it leaves the bus, so one client cannot take them all. It ends when
//!   the owner calls `Close`, when the owner leaves the bus
//!   (NameOwnerChanged), or when it does not keep up: its event queue
//!   ([`MONITOR_QUEUE`] items) is bounded and a full queue drops the monitor
//!   (see [`crate::units::hub`]) instead of buffering. The replay of a new
//!   `*` subscription does not count: it fills at most half the queue and
//!   goes on each time the monitor's task has taken a batch, so `Subscribe
//!   ("*", "*")` works on any fleet; while it runs, the monitor hears of a
//!   unit first by its virtual `UnitNew` + `UnitStateChanged` (with the
//!   state of that moment), then its real events (the hub's module docs). Either way every
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
//!   as few signals as the bounds allow (see [`crate::units::signals`]); BlueChi's per-event signals stop for that
//!   monitor, so a follower pays one message per batch instead of one per
//!   event. Events the tagged stream does not carry (property changes, the
//!   pseudo unit `*`) are then not sent at all. Events queued before the
//!   switch still go out as BlueChi's signals, before the first batch. The
//!   snapshot and the switch happen under the subscription lock, so there
//!   is no gap and no duplicate between them.

use crate::error::ApiError;
use crate::units::hub::{Delivery, Subscriptions, WatchId, Watcher};
use crate::units::records::WILDCARD;
use crate::units::signals::messages_for_batch;
use drover_bus::bluechi::{MONITOR_IFACE, MONITOR_PATH_PREFIX};
use drover_bus::client::SnapshotRow;
use drover_protocol::error_names::LIMITS_EXCEEDED;
use drover_protocol::{NodeName, UnitName};
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::sync::mpsc;
use zbus::names::{BusName, OwnedUniqueName, UniqueName};
use zbus::{Connection, Message, OwnedObjectPath};

/// Events a monitor may have queued before it counts as not keeping up.
pub const MONITOR_QUEUE: usize = 8192;
/// Monitors one client (unique bus name) may hold at once.
pub const MAX_MONITORS_PER_CLIENT: usize = 16;
/// Monitors at once, manager-wide (each holds a queue): a ceiling far above
/// what well-behaved clients use, against many clients at their own cap.
pub const MAX_MONITORS: usize = 1024;
const _: () = assert!(MAX_MONITORS >= 32 * MAX_MONITORS_PER_CLIENT);
/// Peers per monitor.
pub const MAX_PEERS: usize = 64;
/// Events taken from a monitor's queue per socket write.
const BATCH: usize = 4096;

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

/// True for a unit name that is valid but for its missing (or unknown) type
/// suffix: no unit systemd loads is called that, so a watch of it would
/// never see an event.
fn never_matches(unit: &str) -> bool {
    UnitName::new(format!("{unit}.service")).is_ok()
}

/// `configured`: every node of the registry, in config order. A unit that
/// [`never_matches`] takes no place in the targets; the subscription that
/// names only such units holds no watch but is a subscription all the same.
fn parse_targets(
    configured: &[NodeName],
    node: &str,
    units: &[String],
) -> Result<(Targets, bool), ApiError> {
    if units.is_empty() {
        return Err(ApiError::invalid_args("no unit given to subscribe to"));
    }
    let mut parsed = Vec::with_capacity(units.len());
    for u in units {
        if u == WILDCARD {
            parsed.push(None);
        } else {
            match UnitName::new(u.as_str()) {
                Ok(unit) => parsed.push(Some(unit)),
                // As BlueChi: a name without a unit type suffix (`web`) is
                // accepted and never matches, since systemd names every
                // unit with one. Anything else wrong with it is refused.
                Err(_) if never_matches(u) => {}
                Err(e) => return Err(ApiError::invalid_args(e.to_string())),
            }
        }
    }
    parsed.sort();
    parsed.dedup();
    let (nodes, known) = if node == WILDCARD {
        (configured.to_vec(), true)
    } else {
        let name = NodeName::new(node).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        let known = configured.contains(&name);
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

/// Whether a client that holds `owned` monitors may create one more while
/// `total` exist; the refusal says which bound was hit.
fn admit(owner: &str, owned: usize, total: usize) -> Result<(), ApiError> {
    if owned >= MAX_MONITORS_PER_CLIENT {
        return Err(ApiError::new(
            LIMITS_EXCEEDED,
            format!(
                "{owner} holds {owned} monitors, the most one client may hold ({MAX_MONITORS_PER_CLIENT}); close one first"
            ),
        ));
    }
    if total >= MAX_MONITORS {
        return Err(ApiError::new(
            LIMITS_EXCEEDED,
            format!("too many monitors (at most {MAX_MONITORS} for all clients together)"),
        ));
    }
    Ok(())
}

/// A monitor's D-Bus objects, put on and taken off the bus by the D-Bus
/// layer ([`crate::api::monitor::MonitorExport`]); this module only decides
/// when.
pub trait MonitorObjects: Send + Sync + 'static {
    /// Exports the objects of `monitor` at its path.
    fn export<'a>(
        &'a self,
        conn: &'a Connection,
        monitor: &'a Arc<Monitor>,
    ) -> BoxFuture<'a, zbus::Result<()>>;

    /// Removes whatever objects are at `monitor`'s path.
    fn unexport<'a>(&'a self, conn: &'a Connection, monitor: &'a Monitor) -> BoxFuture<'a, ()>;
}

/// The manager's monitors.
pub struct Monitors {
    table: Mutex<HashMap<u32, Arc<Monitor>>>,
    next_monitor: AtomicU32,
    next_sub: AtomicU32,
    next_peer: AtomicU32,
    /// Where monitors watch units.
    hub: Arc<Subscriptions>,
    /// Set once, when the API is served.
    objects: OnceLock<Arc<dyn MonitorObjects>>,
    /// Monitors closed for not keeping up, and because their owner left.
    drops: [AtomicU64; 2],
}

impl Monitors {
    pub fn new(hub: Arc<Subscriptions>) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(HashMap::new()),
            next_monitor: AtomicU32::new(1),
            next_sub: AtomicU32::new(2),
            next_peer: AtomicU32::new(1),
            hub,
            objects: OnceLock::new(),
            drops: Default::default(),
        })
    }

    /// Monitors closed (since the start) because their receivers did not
    /// keep up, and because their owner left the bus (for the metrics).
    ///
    /// A monitor is counted only once it is out of the table ([`Self::close`]):
    /// read these before [`Self::len`], and a drop seen here is never still
    /// counted as open there.
    pub fn drops(&self) -> (u64, u64) {
        let [slow, gone] = &self.drops;
        (slow.load(Ordering::Acquire), gone.load(Ordering::Acquire))
    }

    /// How monitors' objects are exported (set once, when the API is served).
    pub fn serve(&self, objects: Arc<dyn MonitorObjects>) {
        let _ = self.objects.set(objects);
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
        self: &Arc<Self>,
        conn: &Connection,
        owner: &UniqueName<'_>,
    ) -> Result<OwnedObjectPath, ApiError> {
        let monitors = self;
        // A first look, so a refused client costs no id and no watcher; the
        // count that decides is taken again under the lock of the insert.
        monitors.admit_locked(&lock(&monitors.table), owner)?;
        let id = monitors.next_monitor.fetch_add(1, Ordering::Relaxed);
        let path = OwnedObjectPath::try_from(format!("{MONITOR_PATH_PREFIX}/{id}"))
            .map_err(|e| ApiError::failed(e.to_string()))?;
        let (watcher, rx) = self.hub.watcher(MONITOR_QUEUE);
        let monitor = Arc::new(Monitor {
            id,
            path: path.clone(),
            owner: owner.to_owned().into(),
            watcher: Mutex::new(Some(watcher)),
            inner: Mutex::new(Inner::default()),
            closed: AtomicBool::new(false),
        });
        {
            let mut table = lock(&monitors.table);
            monitors.admit_locked(&table, owner)?;
            table.insert(id, monitor.clone());
        }
        let exported = match self.objects.get() {
            Some(objects) => objects.export(conn, &monitor).await,
            None => Ok(()),
        };
        if let Err(e) = exported {
            self.close(conn, &monitor, REASON_CLOSED).await;
            return Err(ApiError::failed(format!("cannot export the monitor: {e}")));
        }
        tokio::spawn(emit_loop(self.clone(), conn.clone(), monitor.clone(), rx));
        // The owner may have left before we started watching for it.
        let (monitors2, conn2, m2) = (self.clone(), conn.clone(), monitor.clone());
        tokio::spawn(async move {
            let gone = match zbus::fdo::DBusProxy::new(&conn2).await {
                Ok(p) => matches!(
                    p.name_has_owner(BusName::from(m2.owner.as_ref())).await,
                    Ok(false)
                ),
                Err(_) => false,
            };
            if gone {
                monitors2.close(&conn2, &m2, REASON_OWNER_GONE).await;
            }
        });
        tracing::debug!(monitor = id, owner = %owner, "monitor created");
        Ok(path)
    }

    /// [`admit`] for `owner` against the table as it is.
    fn admit_locked(
        &self,
        table: &HashMap<u32, Arc<Monitor>>,
        owner: &UniqueName<'_>,
    ) -> Result<(), ApiError> {
        let owned = table
            .values()
            .filter(|m| m.owner.as_str() == owner.as_str())
            .count();
        admit(owner.as_str(), owned, table.len())
    }

    /// How many monitors `owner` holds.
    pub fn owned_by(&self, owner: &str) -> usize {
        lock(&self.table)
            .values()
            .filter(|m| m.owner.as_str() == owner)
            .count()
    }

    /// `Subscribe` / `SubscribeList`: one subscription id for every node ×
    /// unit given. `configured`: the registry's nodes (node `*` means them).
    /// Returns once the agents of the online nodes have the subscription
    /// (bounded by the request timeout; see `Subscriptions::synced`), so
    /// whatever the caller changes afterwards reaches it as real events.
    pub async fn subscribe(
        &self,
        monitor: &Monitor,
        configured: &[NodeName],
        node: &str,
        units: &[String],
    ) -> Result<u32, ApiError> {
        let (targets, known) = parse_targets(configured, node, units)?;
        if !known {
            tracing::info!(
                monitor = monitor.id,
                "subscription to node '{node}', which is not configured (it can never register)"
            );
        }
        let (id, synced) = {
            let watcher = lock(&monitor.watcher);
            let Some(watcher) = watcher.as_ref() else {
                return Err(ApiError::failed("the monitor is closed"));
            };
            let mut watches = Vec::new();
            let mut watched = Vec::new();
            for n in &targets.nodes {
                for u in &targets.units {
                    match watcher.watch(n, u.as_ref()) {
                        Some(w) => {
                            watches.push(w);
                            watched.push((n.clone(), u.clone()));
                        }
                        None => {
                            for w in watches {
                                watcher.unwatch(w);
                            }
                            return Err(ApiError::failed("the monitor was dropped"));
                        }
                    }
                }
            }
            let id = self.next_sub.fetch_add(1, Ordering::Relaxed);
            lock(&monitor.inner).subs.insert(id, watches);
            (id, watcher.synced(watched))
        };
        synced.await;
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

    pub fn add_peer(&self, monitor: &Monitor, name: &str) -> Result<u32, ApiError> {
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
        let id = self.next_peer.fetch_add(1, Ordering::Relaxed);
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
    pub async fn close(&self, conn: &Connection, monitor: &Arc<Monitor>, reason: &str) {
        if monitor.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Out of the table first, then counted (see `drops`): a scrape never
        // shows a dropped monitor as still open.
        lock(&self.table).remove(&monitor.id);
        match reason {
            REASON_TOO_SLOW => self.drops[0].fetch_add(1, Ordering::Release),
            REASON_OWNER_GONE => self.drops[1].fetch_add(1, Ordering::Release),
            _ => 0,
        };
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
        if let Some(objects) = self.objects.get() {
            objects.unexport(conn, monitor).await;
        }
        tracing::debug!(monitor = monitor.id, "monitor closed: {reason}");
    }

    /// A unique name left the bus: close the monitors it owns, forget it as
    /// a peer.
    pub async fn name_gone(&self, conn: &Connection, name: &str) {
        let all: Vec<_> = lock(&self.table).values().cloned().collect();
        for m in all {
            if m.owner.as_str() == name {
                self.close(conn, &m, REASON_OWNER_GONE).await;
            } else {
                lock(&m.inner).peers.retain(|_, p| p.as_str() != name);
            }
        }
    }

    /// Closes every monitor (manager shutdown).
    pub async fn close_all(&self, conn: &Connection) {
        let all: Vec<_> = lock(&self.table).values().cloned().collect();
        for m in all {
            self.close(conn, &m, REASON_CLOSED).await;
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

/// Drains the monitor's queue in batches into unicast signals. The queue
/// ends when the monitor is closed, or when it overflowed: then the
/// monitor is closed here.
async fn emit_loop(
    monitors: Arc<Monitors>,
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
        // Room was made: the replay of a new `*` subscription goes on
        // behind what was taken (see `crate::units::hub`).
        if let Some(w) = lock(&monitor.watcher).as_ref() {
            w.refill();
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
        monitors.close(&conn, &monitor, REASON_TOO_SLOW).await;
    }
}

/// Closes monitors whose owner leaves the bus, and forgets peers that
/// leave. Runs until the connection closes.
pub async fn watch_owners(monitors: Arc<Monitors>, conn: Connection) {
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
        if name.starts_with(':') && args.new_owner.is_none() && !monitors.is_empty() {
            monitors.name_gone(&conn, name).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_has_its_own_cap_under_a_far_higher_ceiling() {
        assert!(admit(":1.1", 0, 0).is_ok());
        assert!(admit(":1.1", MAX_MONITORS_PER_CLIENT - 1, 500).is_ok());
        let e = admit(":1.1", MAX_MONITORS_PER_CLIENT, MAX_PEERS).unwrap_err();
        assert_eq!(e.name(), LIMITS_EXCEEDED);
        assert!(e.message().contains(":1.1 holds 16 monitors"), "{e}");
        // Another client is not held back by the first one's monitors...
        assert!(admit(":1.2", 0, MAX_MONITORS_PER_CLIENT).is_ok());
        // ...only by the ceiling for all.
        let e = admit(":1.2", 0, MAX_MONITORS).unwrap_err();
        assert_eq!(e.name(), LIMITS_EXCEEDED);
        assert!(e.message().contains("all clients together"), "{e}");
    }
}
