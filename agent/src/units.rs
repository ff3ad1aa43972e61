//! Unit subscriptions: which units the manager watches on this node, and the
//! unit events the agent sends it (docs/architecture.md, "Unit subscriptions
//! and modification tags"; BlueChi's agent, bluechi-facts §3.7).
//!
//! The manager sends `Subscribe { unit }` for a unit (or `None`: every unit,
//! BlueChi's `*`) and `Unsubscribe` when nobody watches it any more. The
//! [`UnitHub`] then:
//!
//! * answers a subscription with a **virtual** `UnitNew` + `UnitStateChanged`
//!   (current `ActiveState`/`SubState`) for the unit if systemd has it loaded
//!   — for every loaded unit in the case of `*`;
//! * forwards, for watched units, systemd's `UnitNew` and `UnitRemoved`,
//!   every `PropertiesChanged` of the unit object as `UnitPropertiesChanged`
//!   (the changed `a{sv}`), and a **real** `UnitStateChanged` only when
//!   `ActiveState` or `SubState` actually changed (systemd repeats both in
//!   every change signal of the Unit interface).
//!
//! To know "loaded" and "changed", the hub keeps a cache of systemd's loaded
//! units and their states. It is built lazily, on the first subscription
//! since the agent started: the unit signal stream is subscribed first, then
//! the cache is seeded from `ListUnits`, and only then are the queued signals
//! applied, in order, on top of it — so nothing between the two is lost, and
//! a subscriber sees the snapshot first and real changes after it.
//!
//! **Daemon-reload.** systemd unloads every unit (`UnitRemoved`) and
//! re-creates it (`UnitNew`, without a state signal) between `Reloading(true)`
//! and shortly after `Reloading(false)`. Forwarding that would tell the
//! manager every unit vanished and came back inactive — and stop every proxy
//! on the node. Instead, removals during a reload are held back with their
//! state; a `UnitNew` for a held-back (or still cached) unit is no news; and
//! when the reload ends a `ListUnits` settles what really changed: units gone
//! get a real `UnitRemoved`, new ones a real `UnitNew` (+ state), changed
//! states a real `UnitStateChanged`.
//!
//! Invariants:
//! * **Sessions.** Subscriptions belong to one manager session; they are
//!   dropped when it ends ([`UnitHub::session_ended`]) and start empty in the
//!   next ([`UnitHub::session_started`]) — the manager replays them. Every
//!   event carries `ModTag { guid: session_id, index }` with `index` rising
//!   by one per event from 1 in each session.
//! * **Order.** Producers (the signal pump, a subscription's replay) tag and
//!   send under one async lock, so the manager receives events in tag order.
//! * **Bounds.** The cache and the watch set are capped ([`MAX_UNITS`],
//!   [`MAX_WATCHED`]); events leave through [`Outbox::send_paced`], which
//!   waits for the manager instead of letting a burst overflow the queue.
//! * Unit names from systemd that are not valid [`UnitName`]s are logged and
//!   skipped. Errors: `Subscribe` twice or `Unsubscribe` without a
//!   subscription is `org.freedesktop.DBus.Error.Failed` ("already
//!   subscribed" / "not subscribed") and changes nothing.
//!
//! [`Outbox::send_paced`]: crate::outbox::Outbox::send_paced

use crate::dispatch::Shared;
use crate::systemd::{Systemd, UnitSignal, UnitSignalStream};
use drover_bus::systemd::UNIT_IFACE;
use drover_protocol::error_names;
use drover_protocol::tag::TagCounter;
use drover_protocol::{Event, ModTag, Reason, RemoteError, Response, ToManager, UnitName};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Most loaded units the cache follows. Beyond it, new units are not cached:
/// their subscriptions get no virtual replay and every state signal of theirs
/// is forwarded (as if it were a change) — degraded, never unbounded.
pub const MAX_UNITS: usize = 65_536;
/// Most single-unit subscriptions per session.
pub const MAX_WATCHED: usize = 65_536;
/// How long unit events wait for the manager to read before the session is
/// given up (the heartbeat threshold normally notices a dead manager first).
pub const SEND_PATIENCE: Duration = Duration::from_secs(30);

/// How long after the last `Reloading` signal a daemon-reload is settled.
pub const RELOAD_SETTLE: Duration = Duration::from_millis(500);

const INACTIVE: &str = "inactive";
const DEAD: &str = "dead";

#[derive(Debug, Clone, PartialEq, Eq)]
struct UnitState {
    active: String,
    sub: String,
}

impl UnitState {
    fn inactive() -> Self {
        Self {
            active: INACTIVE.into(),
            sub: DEAD.into(),
        }
    }
}

struct Session {
    epoch: u64,
    tags: TagCounter,
    all: bool,
    watched: HashSet<UnitName>,
}

impl Session {
    fn watches(&self, unit: &UnitName) -> bool {
        self.all || self.watched.contains(unit)
    }
}

#[derive(Default)]
struct Inner {
    /// Loaded units → last known state (only once the stream is started).
    cache: HashMap<UnitName, UnitState>,
    session: Option<Session>,
    cache_full_logged: bool,
    /// From `Reloading(true)` until the resync [`RELOAD_SETTLE`] after the
    /// last `Reloading(false)`: removals are held back, with the last state,
    /// in `reload_removed`. Most units come back.
    reloading: bool,
    /// `Reloading(true)` signals not yet matched by a `Reloading(false)`.
    reloads_open: u32,
    reload_removed: HashMap<UnitName, UnitState>,
}

impl Inner {
    fn cache_insert(&mut self, unit: UnitName, state: UnitState) {
        if self.cache.len() >= MAX_UNITS && !self.cache.contains_key(&unit) {
            if !self.cache_full_logged {
                self.cache_full_logged = true;
                tracing::warn!(
                    "more than {MAX_UNITS} loaded units: further units are not cached \
                     (no virtual events for them, every state signal is forwarded)"
                );
            }
            return;
        }
        self.cache.insert(unit, state);
    }
}

/// A batch of tagged events for one session.
struct Batch {
    epoch: u64,
    events: Vec<Event>,
}

/// See the module docs. Lives in [`Shared`]; all methods are cheap except
/// `subscribe` (which may start the stream) and the sends.
#[derive(Default)]
pub struct UnitHub {
    inner: Mutex<Inner>,
    /// Held by whoever tags and sends events, across the sends.
    send_order: tokio::sync::Mutex<()>,
    started: tokio::sync::OnceCell<()>,
}

fn failed(message: String) -> RemoteError {
    RemoteError::failed(message)
}

fn describe(unit: Option<&UnitName>) -> &str {
    unit.map_or("*", UnitName::as_str)
}

impl UnitHub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Critical sections are short and do not panic; a poisoned lock still
        // holds consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A manager session began: no subscriptions, tags `(session_id, 1..)`.
    pub fn session_started(&self, epoch: u64, session_id: u64) {
        self.lock().session = Some(Session {
            epoch,
            tags: TagCounter::new(session_id),
            all: false,
            watched: HashSet::new(),
        });
    }

    /// The manager session `epoch` ended: its subscriptions are gone.
    pub fn session_ended(&self, epoch: u64) {
        let mut inner = self.lock();
        if inner.session.as_ref().is_some_and(|s| s.epoch == epoch) {
            inner.session = None;
        }
    }

    /// What session `epoch` watches: (`*`?, number of single units).
    pub fn watching(&self, epoch: u64) -> Option<(bool, usize)> {
        let inner = self.lock();
        let s = inner.session.as_ref().filter(|s| s.epoch == epoch)?;
        Some((s.all, s.watched.len()))
    }

    /// True once the unit signal stream runs (it then sees every later
    /// `JobRemoved` too: `crate::news`).
    pub fn streaming(&self) -> bool {
        self.started.initialized()
    }

    /// Number of loaded units the cache follows.
    pub fn cached_units(&self) -> usize {
        self.lock().cache.len()
    }

    /// The cached (active, sub) state of a loaded unit.
    pub fn cached_state(&self, unit: &str) -> Option<(String, String)> {
        let unit = UnitName::new(unit).ok()?;
        let inner = self.lock();
        let s = inner.cache.get(&unit)?;
        Some((s.active.clone(), s.sub.clone()))
    }

    /// `Request::Subscribe` of session `epoch`: starts the unit stream if
    /// needed, records the subscription and sends the virtual replay.
    pub async fn subscribe<S: Systemd>(
        &self,
        systemd: &Arc<S>,
        shared: &Arc<Shared>,
        epoch: u64,
        unit: Option<UnitName>,
    ) -> Result<Response, RemoteError> {
        self.start(systemd, shared).await?;
        let _order = self.send_order.lock().await;
        let batch = {
            let mut inner = self.lock();
            let Inner {
                cache,
                session,
                reload_removed,
                ..
            } = &mut *inner;
            let Some(session) = session.as_mut().filter(|s| s.epoch == epoch) else {
                return Err(failed(
                    "the manager session of this request has ended".into(),
                ));
            };
            let already = match &unit {
                None => session.all,
                Some(u) => session.watched.contains(u),
            };
            if already {
                return Err(failed(format!(
                    "already subscribed to {}",
                    describe(unit.as_ref())
                )));
            }
            let mut replay: Vec<(&UnitName, &UnitState)> = match &unit {
                None => {
                    session.all = true;
                    cache.iter().chain(reload_removed.iter()).collect()
                }
                Some(u) => {
                    if session.watched.len() >= MAX_WATCHED {
                        return Err(RemoteError::new(
                            error_names::LIMITS_EXCEEDED,
                            format!("more than {MAX_WATCHED} units subscribed on this node"),
                        ));
                    }
                    session.watched.insert(u.clone());
                    cache
                        .get_key_value(u)
                        .or_else(|| reload_removed.get_key_value(u))
                        .into_iter()
                        .collect()
                }
            };
            replay.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            let mut events = Vec::with_capacity(replay.len() * 2);
            for (name, state) in replay {
                events.push(Event::UnitNew {
                    tag: session.tags.next_tag(),
                    unit: name.clone(),
                    reason: Reason::Virtual,
                });
                events.push(Event::UnitStateChanged {
                    tag: session.tags.next_tag(),
                    unit: name.clone(),
                    active_state: state.active.clone(),
                    sub_state: state.sub.clone(),
                    reason: Reason::Virtual,
                });
            }
            Batch { epoch, events }
        };
        tracing::debug!(
            unit = describe(unit.as_ref()),
            replayed = batch.events.len(),
            "subscribed"
        );
        send(shared, batch).await;
        Ok(Response::Empty)
    }

    /// `Request::Unsubscribe` of session `epoch`.
    pub fn unsubscribe(
        &self,
        epoch: u64,
        unit: Option<&UnitName>,
    ) -> Result<Response, RemoteError> {
        let mut inner = self.lock();
        let Some(session) = inner.session.as_mut().filter(|s| s.epoch == epoch) else {
            return Err(failed(
                "the manager session of this request has ended".into(),
            ));
        };
        let was = match unit {
            None => std::mem::take(&mut session.all),
            Some(u) => session.watched.remove(u),
        };
        if was {
            Ok(Response::Empty)
        } else {
            Err(failed(format!("not subscribed to {}", describe(unit))))
        }
    }

    /// Starts the unit signal stream and seeds the cache, once. A failure is
    /// the subscription's error; the next subscription tries again.
    async fn start<S: Systemd>(
        &self,
        systemd: &Arc<S>,
        shared: &Arc<Shared>,
    ) -> Result<(), RemoteError> {
        self.started
            .get_or_try_init(|| async {
                let stream = systemd.subscribe_units().await?;
                let units = systemd.list_units().await?;
                {
                    let mut inner = self.lock();
                    inner.cache.clear();
                    for u in units {
                        match UnitName::new(u.name.as_str()) {
                            Ok(name) => inner.cache_insert(
                                name,
                                UnitState {
                                    active: u.active_state,
                                    sub: u.sub_state,
                                },
                            ),
                            Err(e) => {
                                tracing::warn!("systemd lists a unit drover cannot name: {e}")
                            }
                        }
                    }
                }
                tracing::debug!(units = self.cached_units(), "following systemd's units");
                tokio::spawn(pump_units(stream, systemd.clone(), Arc::downgrade(shared)));
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Applies one systemd unit signal to the cache and tags what the
    /// current session must hear about it.
    fn on_signal(&self, signal: UnitSignal) -> Option<Batch> {
        let raw = match &signal {
            UnitSignal::Reloading { active } => {
                let mut inner = self.lock();
                if *active {
                    inner.reloading = true;
                    inner.reloads_open = inner.reloads_open.saturating_add(1);
                    tracing::debug!("systemd reloads");
                } else {
                    inner.reloads_open = inner.reloads_open.saturating_sub(1);
                }
                // The end of a reload is settled later (see `pump_units`).
                return None;
            }
            // Not unit news: `pump_units` reports it to `crate::news`.
            UnitSignal::JobNew { .. } | UnitSignal::JobRemoved { .. } => return None,
            UnitSignal::New { unit }
            | UnitSignal::Removed { unit }
            | UnitSignal::Changed { unit, .. } => unit,
        };
        let unit = match UnitName::new(raw.as_str()) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!("ignoring a signal for a unit drover cannot name: {e}");
                return None;
            }
        };
        let mut inner = self.lock();
        let mut events = Vec::new();
        match signal {
            UnitSignal::Reloading { .. }
            | UnitSignal::JobNew { .. }
            | UnitSignal::JobRemoved { .. } => {}
            UnitSignal::New { .. } => {
                if inner.cache.contains_key(&unit) {
                    // Announced again after a reload resync: no news.
                } else if let Some(state) = inner.reload_removed.remove(&unit) {
                    // Re-created by a daemon-reload: still the same unit, in
                    // the same state (systemd sends no state signal).
                    inner.cache_insert(unit, state);
                } else {
                    inner.cache_insert(unit.clone(), UnitState::inactive());
                    events.push(Event::UnitNew {
                        tag: ModTag::ZERO,
                        unit,
                        reason: Reason::Real,
                    });
                }
            }
            UnitSignal::Removed { .. } => {
                let state = inner.cache.remove(&unit);
                if inner.reloading {
                    // Most units come back when the reload finishes; which
                    // did not is settled by the resync.
                    if inner.reload_removed.len() < MAX_UNITS {
                        inner
                            .reload_removed
                            .insert(unit, state.unwrap_or_else(UnitState::inactive));
                    }
                } else {
                    events.push(Event::UnitRemoved {
                        tag: ModTag::ZERO,
                        unit,
                        reason: Reason::Real,
                    });
                }
            }
            UnitSignal::Changed {
                interface,
                properties,
                active_state,
                sub_state,
                ..
            } => {
                let changed_state =
                    if interface == UNIT_IFACE && (active_state.is_some() || sub_state.is_some()) {
                        let before = inner.cache.get(&unit).cloned();
                        let now = UnitState {
                            active: active_state
                                .or_else(|| before.as_ref().map(|b| b.active.clone()))
                                .unwrap_or_default(),
                            sub: sub_state
                                .or_else(|| before.as_ref().map(|b| b.sub.clone()))
                                .unwrap_or_default(),
                        };
                        if before.as_ref() == Some(&now) {
                            None
                        } else {
                            inner.cache_insert(unit.clone(), now.clone());
                            Some(now)
                        }
                    } else {
                        None
                    };
                // Decoded only for a watched unit (see `ChangedProperties`).
                if inner.session.as_ref().is_some_and(|s| s.watches(&unit)) {
                    match properties.marshal() {
                        Ok(properties) => events.push(Event::UnitPropertiesChanged {
                            tag: ModTag::ZERO,
                            unit: unit.clone(),
                            interface,
                            properties,
                        }),
                        Err(e) => tracing::warn!("ignoring a signal of {unit}: {}", e.message),
                    }
                }
                if let Some(now) = changed_state {
                    events.push(state_event(&unit, &now, Reason::Real));
                }
            }
        }
        inner.tag_for_session(events)
    }

    /// After `Reloading(false)`: `ListUnits` says which units the reload
    /// really unloaded, loaded or changed; only those are news.
    fn resync(&self, listed: Vec<drover_protocol::UnitInfo>) -> Option<Batch> {
        let mut inner = self.lock();
        inner.reloading = false;
        inner.reloads_open = 0;
        let mut removed = std::mem::take(&mut inner.reload_removed);
        let mut seen = HashSet::new();
        let mut events = Vec::new();
        for u in listed {
            let Ok(unit) = UnitName::new(u.name.as_str()) else {
                continue;
            };
            let now = UnitState {
                active: u.active_state,
                sub: u.sub_state,
            };
            seen.insert(unit.clone());
            let before = match inner.cache.get(&unit) {
                Some(s) => Some(s.clone()),
                None => removed.remove(&unit),
            };
            match before {
                Some(before) if before == now => {
                    inner.cache_insert(unit, now);
                }
                Some(_) => {
                    inner.cache_insert(unit.clone(), now.clone());
                    events.push(state_event(&unit, &now, Reason::Real));
                }
                None => {
                    inner.cache_insert(unit.clone(), now.clone());
                    events.push(Event::UnitNew {
                        tag: ModTag::ZERO,
                        unit: unit.clone(),
                        reason: Reason::Real,
                    });
                    if now != UnitState::inactive() {
                        events.push(state_event(&unit, &now, Reason::Real));
                    }
                }
            }
        }
        let gone: Vec<UnitName> = inner
            .cache
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for unit in gone {
            inner.cache.remove(&unit);
            removed.insert(unit, UnitState::inactive());
        }
        let mut gone: Vec<UnitName> = removed.into_keys().collect();
        gone.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        for unit in gone {
            events.push(Event::UnitRemoved {
                tag: ModTag::ZERO,
                unit,
                reason: Reason::Real,
            });
        }
        tracing::debug!(changes = events.len(), "resynced after a systemd reload");
        inner.tag_for_session(events)
    }

    /// A reload finished but `ListUnits` failed: assume every unit came back
    /// as it was (the next state signals correct what changed).
    fn resync_failed(&self) {
        let mut inner = self.lock();
        inner.reloading = false;
        inner.reloads_open = 0;
        let back = std::mem::take(&mut inner.reload_removed);
        for (unit, state) in back {
            inner.cache_insert(unit, state);
        }
    }
}

impl Inner {
    /// Tags the events the current session watches (in order) into a batch.
    fn tag_for_session(&mut self, events: Vec<Event>) -> Option<Batch> {
        let session = self.session.as_mut()?;
        let mut out = Vec::new();
        for mut event in events {
            let watched = event_unit(&event).is_some_and(|u| session.watches(u));
            if watched {
                set_tag(&mut event, session.tags.next_tag());
                out.push(event);
            }
        }
        (!out.is_empty()).then_some(Batch {
            epoch: session.epoch,
            events: out,
        })
    }
}

fn state_event(unit: &UnitName, state: &UnitState, reason: Reason) -> Event {
    Event::UnitStateChanged {
        tag: ModTag::ZERO,
        unit: unit.clone(),
        active_state: state.active.clone(),
        sub_state: state.sub.clone(),
        reason,
    }
}

fn event_unit(event: &Event) -> Option<&UnitName> {
    match event {
        Event::UnitNew { unit, .. }
        | Event::UnitRemoved { unit, .. }
        | Event::UnitStateChanged { unit, .. }
        | Event::UnitPropertiesChanged { unit, .. } => Some(unit),
        _ => None,
    }
}

fn set_tag(event: &mut Event, new: ModTag) {
    match event {
        Event::UnitNew { tag, .. }
        | Event::UnitRemoved { tag, .. }
        | Event::UnitStateChanged { tag, .. }
        | Event::UnitPropertiesChanged { tag, .. } => *tag = new,
        _ => {}
    }
}

async fn send(shared: &Shared, batch: Batch) {
    for event in batch.events {
        let sent = shared
            .outbox
            .send_paced(batch.epoch, ToManager::Event(event), SEND_PATIENCE)
            .await;
        if sent != crate::outbox::Sent::Queued {
            // The session is gone (or going): the rest means nothing to the
            // manager's next session, which starts from a replay.
            return;
        }
    }
}

/// Applies systemd's unit signals until the stream ends (systemd connection
/// lost) or the agent is gone.
///
/// A daemon-reload is settled [`RELOAD_SETTLE`] after its `Reloading(false)`
/// with a `ListUnits`: systemd sends that signal and the `UnitNew` burst from
/// its idle queue, so neither their order nor their timing is exact (the
/// `false` of one reload can even arrive after the `true` of the next); a
/// settle that finds a reload still open waits another round.
async fn pump_units<S: Systemd>(
    mut stream: UnitSignalStream,
    systemd: Arc<S>,
    shared: Weak<Shared>,
) {
    let mut settle_at: Option<tokio::time::Instant> = None;
    // Rounds a settle waited for a reload that never said it ended.
    let mut waited = 0u32;
    loop {
        let signal = match settle_at {
            Some(at) => tokio::select! {
                s = stream.recv() => s,
                () = tokio::time::sleep_until(at) => {
                    settle_at = None;
                    let Some(shared) = shared.upgrade() else { return };
                    let hub = &shared.units;
                    if hub.lock().reloads_open > 0 && waited < 20 {
                        waited += 1;
                        settle_at = Some(tokio::time::Instant::now() + RELOAD_SETTLE);
                        continue;
                    }
                    waited = 0;
                    let _order = hub.send_order.lock().await;
                    let batch = match systemd.list_units().await {
                        Ok(listed) => hub.resync(listed),
                        Err(e) => {
                            tracing::warn!("cannot list units after a systemd reload: {e}");
                            hub.resync_failed();
                            None
                        }
                    };
                    if let Some(batch) = batch {
                        send(&shared, batch).await;
                    }
                    continue;
                }
            },
            None => stream.recv().await,
        };
        let Some(signal) = signal else { break };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if matches!(signal, UnitSignal::Reloading { .. }) {
            settle_at = Some(tokio::time::Instant::now() + RELOAD_SETTLE);
        }
        let hub = &shared.units;
        let _order = hub.send_order.lock().await;
        match &signal {
            UnitSignal::JobRemoved { job } => {
                // Everything systemd said before this job ended has been sent.
                shared.news.passed(job);
                continue;
            }
            UnitSignal::JobNew { job, unit } => {
                shared.news.queued(job, unit);
                continue;
            }
            _ => {}
        }
        let active = match &signal {
            UnitSignal::Changed {
                unit,
                active_state: Some(state),
                ..
            } if state == "active" => Some(unit.clone()),
            _ => None,
        };
        if let Some(batch) = hub.on_signal(signal) {
            send(&shared, batch).await;
        }
        if let Some(unit) = active {
            // After it went to the manager: a StartDep reply it releases
            // must not overtake it.
            shared.news.active(&unit);
        }
    }
    tracing::warn!("systemd's unit signal stream ended; unit events stop");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Dispatcher;
    use crate::outbox::SessionKill;
    use crate::systemd::fake::FakeSystemd;
    use drover_protocol::{Marshalled, ModTag, Request};
    use tokio::sync::mpsc;

    const T: Duration = Duration::from_secs(5);

    struct Rig {
        fake: FakeSystemd,
        d: Arc<Dispatcher<FakeSystemd>>,
        shared: Arc<Shared>,
        rx: mpsc::Receiver<ToManager>,
    }

    fn rig_with(capacity: usize) -> Rig {
        let fake = FakeSystemd::new();
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(capacity);
        shared.outbox.open(1, tx, SessionKill::new());
        shared.session_started(1, 77);
        let d = Arc::new(Dispatcher::new(Arc::new(fake.clone()), shared.clone()));
        Rig {
            fake,
            d,
            shared,
            rx,
        }
    }

    fn rig() -> Rig {
        rig_with(256)
    }

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    async fn next(rx: &mut mpsc::Receiver<ToManager>) -> ToManager {
        tokio::time::timeout(T, rx.recv())
            .await
            .expect("a message in time")
            .expect("queue open")
    }

    async fn next_event(rx: &mut mpsc::Receiver<ToManager>) -> Event {
        match next(rx).await {
            ToManager::Event(e) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    fn ok_reply(id: u64) -> ToManager {
        ToManager::Reply {
            id,
            result: Ok(Response::Empty),
        }
    }

    fn tag(e: &Event) -> ModTag {
        match e {
            Event::UnitNew { tag, .. }
            | Event::UnitRemoved { tag, .. }
            | Event::UnitStateChanged { tag, .. }
            | Event::UnitPropertiesChanged { tag, .. } => *tag,
            other => panic!("not a unit event: {other:?}"),
        }
    }

    fn state_signal(u: &str, active: &str, sub: &str) -> UnitSignal {
        UnitSignal::Changed {
            unit: u.into(),
            interface: UNIT_IFACE.into(),
            properties: Marshalled {
                signature: "a{sv}".into(),
                data: vec![0, 0, 0, 0],
            }
            .into(),
            active_state: Some(active.into()),
            sub_state: Some(sub.into()),
        }
    }

    fn new_virtual(t: u64, u: &str) -> Event {
        Event::UnitNew {
            tag: ModTag::new(77, t),
            unit: unit(u),
            reason: Reason::Virtual,
        }
    }

    fn state(t: u64, u: &str, active: &str, sub: &str, reason: Reason) -> Event {
        Event::UnitStateChanged {
            tag: ModTag::new(77, t),
            unit: unit(u),
            active_state: active.into(),
            sub_state: sub.into(),
            reason,
        }
    }

    async fn subscribe(r: &mut Rig, id: u64, u: Option<&str>) -> Result<Response, RemoteError> {
        r.d.handle(1, id, Request::Subscribe { unit: u.map(unit) })
            .await;
        // Virtual events come before the reply; return the reply.
        loop {
            if let ToManager::Reply { id: got, result } = next(&mut r.rx).await {
                assert_eq!(got, id);
                return result;
            }
        }
    }

    #[tokio::test]
    async fn subscribing_a_loaded_unit_replays_it_virtually_an_unknown_one_does_not() {
        let mut r = rig();
        r.fake.set_state("a.service", "active", "running");
        assert!(
            !r.fake.units_subscribed(),
            "no unit stream before a subscription"
        );
        r.d.handle(
            1,
            1,
            Request::Subscribe {
                unit: Some(unit("a.service")),
            },
        )
        .await;
        assert_eq!(next_event(&mut r.rx).await, new_virtual(1, "a.service"));
        assert_eq!(
            next_event(&mut r.rx).await,
            state(2, "a.service", "active", "running", Reason::Virtual)
        );
        assert_eq!(next(&mut r.rx).await, ok_reply(1));
        assert!(r.fake.units_subscribed());

        // Not loaded: subscribed, but nothing to replay.
        r.d.handle(
            1,
            2,
            Request::Subscribe {
                unit: Some(unit("b.service")),
            },
        )
        .await;
        assert_eq!(next(&mut r.rx).await, ok_reply(2));
        // Its real UnitNew is forwarded with the next tag.
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "b.service".into(),
            })
            .await;
        assert_eq!(
            next_event(&mut r.rx).await,
            Event::UnitNew {
                tag: ModTag::new(77, 3),
                unit: unit("b.service"),
                reason: Reason::Real
            }
        );
        let calls = r.fake.calls();
        assert_eq!(
            calls.iter().filter(|c| *c == "SubscribeUnits").count(),
            1,
            "the stream is started once: {calls:?}"
        );
    }

    #[tokio::test]
    async fn only_real_state_changes_become_unit_state_changed() {
        let mut r = rig();
        r.fake.set_state("a.service", "active", "running");
        r.fake.set_state("other.service", "active", "running");
        subscribe(&mut r, 1, Some("a.service")).await.unwrap();
        // (tags 1 and 2 were the replay)

        // Same state repeated (systemd does that for any Unit property change).
        r.fake
            .emit_unit(state_signal("a.service", "active", "running"))
            .await;
        let e = next_event(&mut r.rx).await;
        assert!(
            matches!(&e, Event::UnitPropertiesChanged { interface, .. } if interface == UNIT_IFACE),
            "{e:?}"
        );
        assert_eq!(tag(&e), ModTag::new(77, 3));

        // An unwatched unit changes: nothing.
        r.fake
            .emit_unit(state_signal("other.service", "failed", "failed"))
            .await;
        // A real change: properties, then the state.
        r.fake
            .emit_unit(state_signal("a.service", "deactivating", "stop-sigterm"))
            .await;
        let e = next_event(&mut r.rx).await;
        assert!(matches!(e, Event::UnitPropertiesChanged { .. }), "{e:?}");
        assert_eq!(tag(&e), ModTag::new(77, 4));
        assert_eq!(
            next_event(&mut r.rx).await,
            state(5, "a.service", "deactivating", "stop-sigterm", Reason::Real)
        );

        // Another interface: forwarded as properties, never as a state.
        r.fake
            .emit_unit(UnitSignal::Changed {
                unit: "a.service".into(),
                interface: "org.freedesktop.systemd1.Service".into(),
                properties: Marshalled::default().into(),
                active_state: None,
                sub_state: None,
            })
            .await;
        let e = next_event(&mut r.rx).await;
        assert!(
            matches!(&e, Event::UnitPropertiesChanged { interface, .. } if interface == "org.freedesktop.systemd1.Service"),
            "{e:?}"
        );
        assert_eq!(tag(&e), ModTag::new(77, 6));

        // Only SubState in a signal: merged with the known ActiveState.
        r.fake
            .emit_unit(UnitSignal::Changed {
                unit: "a.service".into(),
                interface: UNIT_IFACE.into(),
                properties: Marshalled::default().into(),
                active_state: None,
                sub_state: Some("stop-sigkill".into()),
            })
            .await;
        next_event(&mut r.rx).await;
        assert_eq!(
            next_event(&mut r.rx).await,
            state(8, "a.service", "deactivating", "stop-sigkill", Reason::Real)
        );

        // Removal is forwarded; a new load starts from inactive/dead.
        r.fake
            .emit_unit(UnitSignal::Removed {
                unit: "a.service".into(),
            })
            .await;
        assert_eq!(
            next_event(&mut r.rx).await,
            Event::UnitRemoved {
                tag: ModTag::new(77, 9),
                unit: unit("a.service"),
                reason: Reason::Real
            }
        );
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "a.service".into(),
            })
            .await;
        assert!(matches!(
            next_event(&mut r.rx).await,
            Event::UnitNew {
                reason: Reason::Real,
                ..
            }
        ));
        r.fake
            .emit_unit(state_signal("a.service", "inactive", "dead"))
            .await;
        let e = next_event(&mut r.rx).await;
        assert!(matches!(e, Event::UnitPropertiesChanged { .. }), "{e:?}");
        r.fake
            .emit_unit(state_signal("a.service", "active", "running"))
            .await;
        next_event(&mut r.rx).await;
        assert_eq!(
            next_event(&mut r.rx).await,
            state(13, "a.service", "active", "running", Reason::Real)
        );
    }

    #[tokio::test]
    async fn unit_names_systemd_should_never_send_are_skipped() {
        let mut r = rig();
        subscribe(&mut r, 1, None).await.unwrap();
        for bad in ["", "no suffix", "a/b.service", &"x".repeat(300)] {
            r.fake.emit_unit(UnitSignal::New { unit: bad.into() }).await;
            r.fake
                .emit_unit(state_signal(bad, "active", "running"))
                .await;
        }
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "good.service".into(),
            })
            .await;
        assert_eq!(
            next_event(&mut r.rx).await,
            Event::UnitNew {
                tag: ModTag::new(77, 1),
                unit: unit("good.service"),
                reason: Reason::Real
            },
            "the bad ones left no event and used no tag"
        );
    }

    #[tokio::test]
    async fn star_replays_every_loaded_unit_and_follows_all_of_them() {
        let mut r = rig();
        r.fake.set_state("b.service", "active", "running");
        r.fake.set_state("a.socket", "active", "listening");
        r.d.handle(1, 1, Request::Subscribe { unit: None }).await;
        assert_eq!(next_event(&mut r.rx).await, new_virtual(1, "a.socket"));
        assert_eq!(
            next_event(&mut r.rx).await,
            state(2, "a.socket", "active", "listening", Reason::Virtual)
        );
        assert_eq!(next_event(&mut r.rx).await, new_virtual(3, "b.service"));
        assert_eq!(
            next_event(&mut r.rx).await,
            state(4, "b.service", "active", "running", Reason::Virtual)
        );
        assert_eq!(next(&mut r.rx).await, ok_reply(1));

        // Twice is an error and changes nothing.
        let e = subscribe(&mut r, 2, None).await.unwrap_err();
        assert_eq!(e.name, "org.freedesktop.DBus.Error.Failed");
        assert!(e.message.contains("already subscribed to *"), "{e}");

        r.fake
            .emit_unit(state_signal("c.service", "active", "running"))
            .await;
        next_event(&mut r.rx).await;
        assert_eq!(
            next_event(&mut r.rx).await,
            state(6, "c.service", "active", "running", Reason::Real),
            "a unit first seen in a signal has changed by definition"
        );

        r.d.handle(1, 3, Request::Unsubscribe { unit: None }).await;
        assert_eq!(next(&mut r.rx).await, ok_reply(3));
        r.d.handle(1, 4, Request::Unsubscribe { unit: None }).await;
        match next(&mut r.rx).await {
            ToManager::Reply {
                id: 4,
                result: Err(e),
            } => {
                assert_eq!(e.name, "org.freedesktop.DBus.Error.Failed");
                assert!(e.message.contains("not subscribed to *"), "{e}");
            }
            other => panic!("unexpected {other:?}"),
        }
        r.d.handle(
            1,
            5,
            Request::Unsubscribe {
                unit: Some(unit("b.service")),
            },
        )
        .await;
        assert!(matches!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 5,
                result: Err(_)
            }
        ));

        // Nothing is watched any more; a watched unit shows what still flows.
        r.fake
            .emit_unit(state_signal("b.service", "failed", "failed"))
            .await;
        subscribe(&mut r, 6, Some("d.service")).await.unwrap();
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "d.service".into(),
            })
            .await;
        assert!(
            matches!(next_event(&mut r.rx).await, Event::UnitNew { unit, tag, .. } if unit.as_str() == "d.service" && tag == ModTag::new(77, 7)),
            "b.service's change was not forwarded"
        );
    }

    #[tokio::test]
    async fn subscriptions_and_tags_are_per_session() {
        let mut r = rig();
        r.fake.set_state("a.service", "active", "running");
        subscribe(&mut r, 1, Some("a.service")).await.unwrap();
        assert_eq!(r.shared.units.watching(1), Some((false, 1)));

        // The link drops; a new session (new guid) opens.
        r.shared.outbox.close(1);
        r.shared.session_ended(1);
        assert_eq!(r.shared.units.watching(1), None);
        let (tx, mut rx2) = mpsc::channel(64);
        r.shared.outbox.open(2, tx, SessionKill::new());
        r.shared.session_started(2, 90);

        // Not subscribed in the new session until the manager replays.
        r.fake
            .emit_unit(state_signal("a.service", "failed", "failed"))
            .await;
        let deadline = std::time::Instant::now() + T;
        while r.shared.units.cached_state("a.service")
            != Some(("failed".to_string(), "failed".to_string()))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the signal is applied"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        r.d.handle(
            2,
            1,
            Request::Unsubscribe {
                unit: Some(unit("a.service")),
            },
        )
        .await;
        assert!(matches!(
            next(&mut rx2).await,
            ToManager::Reply {
                id: 1,
                result: Err(_)
            }
        ));
        r.d.handle(
            2,
            2,
            Request::Subscribe {
                unit: Some(unit("a.service")),
            },
        )
        .await;
        assert_eq!(
            next_event(&mut rx2).await,
            Event::UnitNew {
                tag: ModTag::new(90, 1),
                unit: unit("a.service"),
                reason: Reason::Virtual
            }
        );
        assert_eq!(
            next_event(&mut rx2).await,
            Event::UnitStateChanged {
                tag: ModTag::new(90, 2),
                unit: unit("a.service"),
                active_state: "failed".into(),
                sub_state: "failed".into(),
                reason: Reason::Virtual
            },
            "the cache followed systemd while nobody watched"
        );
        assert_eq!(next(&mut rx2).await, ok_reply(2));
        // A request of the old session finds no subscriptions to change.
        r.d.handle(1, 9, Request::Subscribe { unit: None }).await;
        assert!(r.rx.try_recv().is_err());
        assert_eq!(r.shared.units.watching(2), Some((false, 1)));
    }

    #[tokio::test]
    async fn a_daemon_reload_is_no_news_but_what_it_changed_is() {
        let mut r = rig();
        r.fake.set_state("a.service", "active", "running");
        r.fake.set_state("b.service", "active", "running");
        r.fake.set_state("c.service", "failed", "failed");
        subscribe(&mut r, 1, None).await.unwrap(); // tags 1..=6
        // The reload: b's file is gone, c was reset, d appeared.
        r.fake.remove_unit("b.service");
        r.fake.set_state("c.service", "inactive", "dead");
        r.fake.set_state("d.service", "active", "running");
        for signal in [
            UnitSignal::Reloading { active: true },
            UnitSignal::Removed {
                unit: "a.service".into(),
            },
            UnitSignal::Removed {
                unit: "b.service".into(),
            },
            UnitSignal::Removed {
                unit: "c.service".into(),
            },
            UnitSignal::Reloading { active: false },
            UnitSignal::New {
                unit: "a.service".into(),
            },
        ] {
            r.fake.emit_unit(signal).await;
        }
        // Settled after RELOAD_SETTLE: only what changed, all real.
        let got = [
            next_event(&mut r.rx).await,
            next_event(&mut r.rx).await,
            next_event(&mut r.rx).await,
            next_event(&mut r.rx).await,
        ];
        assert_eq!(
            got,
            [
                state(7, "c.service", "inactive", "dead", Reason::Real),
                Event::UnitNew {
                    tag: ModTag::new(77, 8),
                    unit: unit("d.service"),
                    reason: Reason::Real
                },
                state(9, "d.service", "active", "running", Reason::Real),
                Event::UnitRemoved {
                    tag: ModTag::new(77, 10),
                    unit: unit("b.service"),
                    reason: Reason::Real
                },
            ]
        );
        // The late UnitNew burst for units already known is no news either;
        // a's state survived the reload.
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "c.service".into(),
            })
            .await;
        assert_eq!(
            r.shared.units.cached_state("a.service"),
            Some(("active".into(), "running".into()))
        );
        r.fake
            .emit_unit(state_signal("a.service", "deactivating", "stop-sigterm"))
            .await;
        assert!(matches!(
            next_event(&mut r.rx).await,
            Event::UnitPropertiesChanged { .. }
        ));
        assert_eq!(
            next_event(&mut r.rx).await,
            state(
                12,
                "a.service",
                "deactivating",
                "stop-sigterm",
                Reason::Real
            )
        );
    }

    #[tokio::test]
    async fn a_big_replay_is_paced_to_the_manager_instead_of_overflowing() {
        // 1500 units = 3000 virtual events through a queue of 64.
        let mut r = rig_with(64);
        for n in 0..1500 {
            r.fake
                .set_state(&format!("u{n:04}.service"), "active", "running");
        }
        let d = r.d.clone();
        let task = tokio::spawn(async move {
            d.handle(1, 1, Request::Subscribe { unit: None }).await;
        });
        let mut last = 0;
        loop {
            match next(&mut r.rx).await {
                ToManager::Event(e) => {
                    let t = tag(&e);
                    assert_eq!(t.index, last + 1, "in tag order, no gap");
                    last = t.index;
                }
                reply => {
                    assert_eq!(reply, ok_reply(1));
                    break;
                }
            }
        }
        assert_eq!(last, 3000);
        task.await.unwrap();
        assert_eq!(r.shared.outbox.current(), Some(1), "the session survived");
    }
}
