//! What the manager hears about this node's units, and with which tag: the
//! rules behind [`crate::units::hub`], as plain data and functions (no
//! locks, no I/O), over a [`View`] of systemd's loaded units and the session
//! that watches them (docs/dev/architecture.md, "Unit subscriptions and
//! modification tags"; the replay is what BlueChi's agent does).
//!
//! * **Virtual replay** ([`View::subscribe`]): a new subscription is
//!   answered with a virtual `UnitNew` + `UnitStateChanged` (current
//!   `ActiveState`/`SubState`) for the unit if systemd has it loaded — for
//!   every loaded unit in the case of `*`.
//! * **Scopes.** A unit is watched at a [`Scope`]: `Subscribe` watches
//!   everything of it, `SubscribeState` its state alone; subscribing a
//!   watched unit at the other scope changes the scope (no replay: the
//!   manager has the state), at the same scope is an error. `*` is
//!   everything of every unit.
//! * **Real events** ([`View::on_signal`]): for watched units, systemd's
//!   `UnitNew` and `UnitRemoved`, every `PropertiesChanged` of the unit object
//!   as `UnitPropertiesChanged` (the changed `a{sv}`, in systemd's order;
//!   not for a unit watched for its state alone), and
//!   a real `UnitStateChanged` only when `ActiveState` or `SubState` actually
//!   changed (systemd repeats both in every change signal of the Unit
//!   interface). The state event of a signal goes out before its property
//!   event, as BlueChi sends them.
//!   "Loaded" and "changed" are read from the view's cache of systemd's
//!   loaded units and their states.
//! * **Daemon-reload.** systemd unloads every unit (`UnitRemoved`) and
//!   re-creates it (`UnitNew`, without a state signal) between
//!   `Reloading(true)` and shortly after `Reloading(false)`. Forwarding that
//!   would tell the manager every unit vanished and came back inactive — and
//!   stop every proxy on the node. Instead, removals during a reload are held
//!   back with their state; a `UnitNew` for a held-back (or still cached) unit
//!   is no news; and when the reload ends a `ListUnits` settles what really
//!   changed ([`View::resync`]): units gone get a real `UnitRemoved`, new ones
//!   a real `UnitNew` (+ state), changed states a real `UnitStateChanged`.
//! * **Coverage.** The cache holds the units the unit stream follows
//!   ([`Followed`]: every unit, or the watched ones), as last heard; a
//!   signal of a unit it does not cover changes nothing (it can only be one
//!   that came before the stream stopped following it). Each change of what
//!   is followed comes with a snapshot of it, in the stream's order
//!   ([`View::apply_snapshot`]), which sets the cache anew.
//! * **Snapshots.** The cache is set from a snapshot when what is followed
//!   changes (see above) and from `ListUnits` after each reload (the
//!   resync). systemd sends its answers and
//!   signals in the order it acts, but the agent reads the answer while
//!   signals sent before it may still wait in the stream; each carries its
//!   position, and one from before the snapshot is *older*: the snapshot
//!   already includes what it did. An older `UnitNew`/`UnitRemoved` is no
//!   news and an older signal's state changes nothing (else a unit that had
//!   started by the snapshot would go back to the `inactive` of a signal sent
//!   before its start, and that would go out as a real stop: a proxy on
//!   another node ended for a target that runs); its properties still go
//!   out, they are real events.
//! * **Tags.** Every event for the session carries `ModTag { guid:
//!   session_id, index }` with `index` rising by one per event from 1 in each
//!   session; only events of units the session watches are tagged (and sent).
//!
//! The agent's own units (`crate::own_units`: the transient services that
//! run health checks) are skipped everywhere: the manager never hears of
//! them.
//!
//! Invariants: the cache and the watch set are capped ([`MAX_UNITS`],
//! [`MAX_WATCHED`]); unit names from systemd that are not valid
//! [`UnitName`]s are logged and skipped; `Subscribe` twice (at the same
//! scope) or `Unsubscribe` without a subscription is
//! `org.freedesktop.DBus.Error.Failed` ("already subscribed" / "not
//! subscribed") and changes nothing.

use crate::systemd::api::{Followed, UnitSignal};
use drover_bus::systemd::UNIT_IFACE;
use drover_protocol::error_names;
use drover_protocol::resync::{UnitRow, watch_hash};
use drover_protocol::tag::TagCounter;
use drover_protocol::{Event, ModTag, Reason, RemoteError, Scope, UnitInfo, UnitName};
use std::collections::{HashMap, HashSet};

/// Most loaded units the cache follows. Beyond it, new units are not cached:
/// their subscriptions get no virtual replay and every state signal of theirs
/// is forwarded (as if it were a change) — degraded, never unbounded.
pub const MAX_UNITS: usize = 65_536;
/// Most single-unit subscriptions per session.
pub const MAX_WATCHED: usize = 65_536;

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
    watched: HashMap<UnitName, Scope>,
}

impl Session {
    fn watches(&self, unit: &UnitName) -> bool {
        self.all || self.watched.contains_key(unit)
    }

    /// Whether the manager hears `unit`'s property changes.
    fn tells_properties(&self, unit: &UnitName) -> bool {
        self.all || self.watched.get(unit) == Some(&Scope::Everything)
    }

    /// What the stream must follow for the watched units one by one.
    fn followed(&self) -> Followed {
        Followed::units(self.watched.iter().map(|(u, scope)| (u.clone(), *scope)))
    }
}

/// [`View::resync_rows`]: the session, its last tag, the watch set's hash
/// and the loaded watched units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncRows {
    pub epoch: u64,
    pub tag: ModTag,
    pub watch: u64,
    pub rows: Vec<UnitRow>,
}

/// A batch of tagged events for one session, to be sent in order.
pub struct Batch {
    pub epoch: u64,
    pub events: Vec<Event>,
}

/// systemd's loaded units as last heard, and the session watching them. See
/// the module docs.
pub struct View {
    /// Loaded units the stream follows → last known state.
    cache: HashMap<UnitName, UnitState>,
    /// What the stream follows, as of its last snapshot.
    covered: Followed,
    session: Option<Session>,
    cache_full_logged: bool,
    /// From `Reloading(true)` until the resync after the last
    /// `Reloading(false)`: removals are held back, with the last state, in
    /// `reload_removed`. Most units come back.
    reloading: bool,
    /// `Reloading(true)` signals not yet matched by a `Reloading(false)`.
    reloads_open: u32,
    reload_removed: HashMap<UnitName, UnitState>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            cache: HashMap::new(),
            covered: Followed::nothing(),
            session: None,
            cache_full_logged: false,
            reloading: false,
            reloads_open: 0,
            reload_removed: HashMap::new(),
        }
    }
}

fn failed(message: String) -> RemoteError {
    RemoteError::failed(message)
}

/// `session` if it is of `epoch` and may subscribe `unit` (`None`: `*`) at
/// `scope`: the one check [`View::subscribe`] makes and
/// [`View::may_subscribe`] foresees. Errors: the session has ended, already
/// watches `unit` at that scope, or watches [`MAX_WATCHED`] single units.
fn subscribing<S: std::borrow::Borrow<Session>>(
    session: Option<S>,
    epoch: u64,
    unit: Option<&UnitName>,
    scope: Scope,
) -> Result<S, RemoteError> {
    let Some(session) = session.filter(|s| s.borrow().epoch == epoch) else {
        return Err(failed(
            "the manager session of this request has ended".into(),
        ));
    };
    let s = session.borrow();
    let (already, rescope) = match unit {
        None => (s.all, false),
        Some(u) => match s.watched.get(u) {
            Some(was) => (*was == scope, true),
            None => (false, false),
        },
    };
    if already {
        return Err(failed(format!("already subscribed to {}", describe(unit))));
    }
    if unit.is_some() && !rescope && s.watched.len() >= MAX_WATCHED {
        return Err(RemoteError::new(
            error_names::LIMITS_EXCEEDED,
            format!("more than {MAX_WATCHED} units subscribed on this node"),
        ));
    }
    Ok(session)
}

/// `*` for every unit, else the unit's name.
pub fn describe(unit: Option<&UnitName>) -> &str {
    unit.map_or("*", UnitName::as_str)
}

impl View {
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

    /// A manager session began: no subscriptions, tags `(session_id, 1..)`.
    pub fn session_started(&mut self, epoch: u64, session_id: u64) {
        self.session = Some(Session {
            epoch,
            tags: TagCounter::new(session_id),
            all: false,
            watched: HashMap::new(),
        });
    }

    /// The manager session `epoch` ended: its subscriptions are gone.
    pub fn session_ended(&mut self, epoch: u64) {
        if self.session.as_ref().is_some_and(|s| s.epoch == epoch) {
            self.session = None;
        }
    }

    /// What session `epoch` watches: (`*`?, number of single units).
    pub fn watching(&self, epoch: u64) -> Option<(bool, usize)> {
        let s = self.session.as_ref().filter(|s| s.epoch == epoch)?;
        Some((s.all, s.watched.len()))
    }

    /// Number of loaded units the cache follows.
    pub fn cached_units(&self) -> usize {
        self.cache.len()
    }

    /// The cached (active, sub) state of a loaded unit.
    pub fn cached_state(&self, unit: &UnitName) -> Option<(String, String)> {
        let s = self.cache.get(unit)?;
        Some((s.active.clone(), s.sub.clone()))
    }

    /// `Reloading(true)` signals not yet matched by a `Reloading(false)`.
    /// The names of the loaded units the cache follows, sorted.
    pub fn cached_names(&self) -> Vec<UnitName> {
        let mut names: Vec<UnitName> = self.cache.keys().cloned().collect();
        names.sort();
        names
    }

    /// What the manager should hold of this node's units now, for a
    /// resync (`drover_protocol::resync`): the watched units that are
    /// loaded, with their states, sorted. `None` while that cannot be
    /// compared: no session, a daemon-reload not settled yet (its removals
    /// are held back), a full cache, or a watched unit the stream does not
    /// follow yet (its state is unknown here).
    pub fn resync_rows(&self) -> Option<ResyncRows> {
        let s = self.session.as_ref()?;
        if self.reloading
            || self.reloads_open > 0
            || !self.reload_removed.is_empty()
            || self.cache.len() >= MAX_UNITS
        {
            return None;
        }
        let followed = if s.all {
            matches!(self.covered, Followed::Every(_))
        } else {
            s.watched.keys().all(|u| self.covered.covers(u))
        };
        if !followed {
            return None;
        }
        let mut rows: Vec<UnitRow> = self
            .cache
            .iter()
            .filter(|(u, _)| s.watches(u))
            .map(|(u, st)| UnitRow {
                unit: u.clone(),
                active_state: st.active.clone(),
                sub_state: st.sub.clone(),
            })
            .collect();
        rows.sort_by(|a, b| a.unit.cmp(&b.unit));
        Some(ResyncRows {
            epoch: s.epoch,
            tag: s.tags.last(),
            watch: watch_hash(s.all, s.watched.keys()),
            rows,
        })
    }

    /// The next tag of the open session, for an event of another producer
    /// (health verdicts) in the same order; `None` without a session.
    pub fn next_tag(&mut self) -> Option<(u64, ModTag)> {
        self.session.as_mut().map(|s| (s.epoch, s.tags.next_tag()))
    }

    pub fn reloads_open(&self) -> u32 {
        self.reloads_open
    }

    /// What the stream must follow for the current session: every unit for
    /// `*`, else the watched units at their scopes ([`Followed::units`]);
    /// nothing without a session.
    pub fn wanted(&self) -> Followed {
        match &self.session {
            Some(s) if s.all => Followed::Every(Scope::Everything),
            Some(s) => s.followed(),
            None => Followed::nothing(),
        }
    }

    /// The errors [`View::subscribe`] of `unit` (`None`: `*`) at `scope`
    /// would give, without changing anything.
    pub fn may_subscribe(
        &self,
        epoch: u64,
        unit: Option<&UnitName>,
        scope: Scope,
    ) -> Result<(), RemoteError> {
        subscribing(self.session.as_ref(), epoch, unit, scope).map(|_| ())
    }

    /// What the stream follows, as of its last snapshot.
    pub fn covered(&self) -> &Followed {
        &self.covered
    }

    /// The stream follows `followed` from here on, and `units` is what
    /// systemd had loaded of it: the cache starts over from them.
    pub fn apply_snapshot(&mut self, followed: Followed, units: Vec<UnitInfo>) {
        self.cache.clear();
        self.covered = followed;
        for u in units {
            if crate::own_units::is_own(&u.name) {
                continue;
            }
            match UnitName::new(u.name.as_str()) {
                Ok(name) if self.covered.covers(&name) => self.cache_insert(
                    name,
                    UnitState {
                        active: u.active_state,
                        sub: u.sub_state,
                    },
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("systemd lists a unit drover cannot name: {e}")
                }
            }
        }
        let covered = &self.covered;
        self.reload_removed.retain(|u, _| covered.covers(u));
    }

    /// `Subscribe` (`SubscribeState`: `scope` is [`Scope::State`]) of
    /// session `epoch`: records the subscription and returns its virtual
    /// replay, tagged; a new scope of a watched unit has none.
    pub fn subscribe(
        &mut self,
        epoch: u64,
        unit: Option<&UnitName>,
        scope: Scope,
    ) -> Result<Batch, RemoteError> {
        let View {
            cache,
            session,
            reload_removed,
            ..
        } = self;
        let session = subscribing(session.as_mut(), epoch, unit, scope)?;
        let mut replay: Vec<(&UnitName, &UnitState)> = match unit {
            None => {
                session.all = true;
                cache.iter().chain(reload_removed.iter()).collect()
            }
            Some(u) => {
                if session.watched.insert(u.clone(), scope).is_some() {
                    // Watched already, at the other scope: the manager has
                    // its state.
                    return Ok(Batch {
                        epoch,
                        events: Vec::new(),
                    });
                }
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
        Ok(Batch { epoch, events })
    }

    /// `Unsubscribe` of session `epoch`.
    pub fn unsubscribe(&mut self, epoch: u64, unit: Option<&UnitName>) -> Result<(), RemoteError> {
        let Some(session) = self.session.as_mut().filter(|s| s.epoch == epoch) else {
            return Err(failed(
                "the manager session of this request has ended".into(),
            ));
        };
        let was = match unit {
            None => std::mem::take(&mut session.all),
            Some(u) => session.watched.remove(u).is_some(),
        };
        if was {
            Ok(())
        } else {
            Err(failed(format!("not subscribed to {}", describe(unit))))
        }
    }

    /// Applies one systemd unit signal to the cache and tags what the
    /// current session must hear about it. A `Reloading` opens or closes a
    /// reload, whose end is settled later by [`View::resync`]; job signals
    /// are no unit news. `older`: systemd sent it before the last snapshot
    /// (module docs, "Snapshots").
    pub fn on_signal(&mut self, signal: UnitSignal, older: bool) -> Option<Batch> {
        let raw = match &signal {
            UnitSignal::Reloading { active } => {
                if *active {
                    self.reloading = true;
                    self.reloads_open = self.reloads_open.saturating_add(1);
                    tracing::debug!("systemd reloads");
                } else {
                    self.reloads_open = self.reloads_open.saturating_sub(1);
                }
                return None;
            }
            // Not unit news: the fan-out reports them to the unit fence and
            // applies snapshots.
            UnitSignal::JobNew { .. }
            | UnitSignal::JobRemoved { .. }
            | UnitSignal::Snapshot { .. } => return None,
            UnitSignal::New { unit }
            | UnitSignal::Removed { unit }
            | UnitSignal::Changed { unit, .. } => unit,
        };
        if crate::own_units::is_own(raw) {
            // The agent's own check units are nobody's news.
            return None;
        }
        let unit = match UnitName::new(raw.as_str()) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!("ignoring a signal for a unit drover cannot name: {e}");
                return None;
            }
        };
        if !self.covered.covers(&unit) {
            // From before the stream stopped following it.
            return None;
        }
        let mut events = Vec::new();
        match signal {
            UnitSignal::Reloading { .. }
            | UnitSignal::JobNew { .. }
            | UnitSignal::JobRemoved { .. }
            | UnitSignal::Snapshot { .. } => {}
            // The snapshot already has the unit, or it was gone by then.
            UnitSignal::New { .. } | UnitSignal::Removed { .. } if older => {}
            UnitSignal::New { .. } => {
                if self.cache.contains_key(&unit) {
                    // Announced again after a reload resync: no news.
                } else if let Some(state) = self.reload_removed.remove(&unit) {
                    // Re-created by a daemon-reload: still the same unit, in
                    // the same state (systemd sends no state signal).
                    self.cache_insert(unit, state);
                } else {
                    self.cache_insert(unit.clone(), UnitState::inactive());
                    events.push(Event::UnitNew {
                        tag: ModTag::ZERO,
                        unit,
                        reason: Reason::Real,
                    });
                }
            }
            UnitSignal::Removed { .. } => {
                let state = self.cache.remove(&unit);
                if self.reloading {
                    // Most units come back when the reload finishes; which
                    // did not is settled by the resync.
                    if self.reload_removed.len() < MAX_UNITS {
                        self.reload_removed
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
                let changed_state = if !older
                    && interface == UNIT_IFACE
                    && (active_state.is_some() || sub_state.is_some())
                {
                    let before = self.cache.get(&unit).cloned();
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
                        self.cache_insert(unit.clone(), now.clone());
                        Some(now)
                    }
                } else {
                    None
                };
                // The state first, then the properties that carried it: the
                // order BlueChi's agent sends them in, which its clients
                // (`bluechictl monitor`) rely on.
                if let Some(now) = changed_state {
                    events.push(state_event(&unit, &now, Reason::Real));
                }
                // Decoded only for a unit watched for its properties (see
                // `ChangedProperties`).
                if self
                    .session
                    .as_ref()
                    .is_some_and(|s| s.tells_properties(&unit))
                {
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
            }
        }
        self.tag_for_session(events)
    }

    /// After `Reloading(false)`: `ListUnits` says which units the reload
    /// really unloaded, loaded or changed; only those are news.
    pub fn resync(&mut self, listed: Vec<UnitInfo>) -> Option<Batch> {
        self.reloading = false;
        self.reloads_open = 0;
        let mut removed = std::mem::take(&mut self.reload_removed);
        let mut seen = HashSet::new();
        let mut events = Vec::new();
        for u in listed {
            if crate::own_units::is_own(&u.name) {
                continue;
            }
            let Ok(unit) = UnitName::new(u.name.as_str()) else {
                continue;
            };
            if !self.covered.covers(&unit) {
                continue;
            }
            let now = UnitState {
                active: u.active_state,
                sub: u.sub_state,
            };
            seen.insert(unit.clone());
            let before = match self.cache.get(&unit) {
                Some(s) => Some(s.clone()),
                None => removed.remove(&unit),
            };
            match before {
                Some(before) if before == now => {
                    self.cache_insert(unit, now);
                }
                Some(_) => {
                    self.cache_insert(unit.clone(), now.clone());
                    events.push(state_event(&unit, &now, Reason::Real));
                }
                None => {
                    self.cache_insert(unit.clone(), now.clone());
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
        let gone: Vec<UnitName> = self
            .cache
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for unit in gone {
            self.cache.remove(&unit);
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
        self.tag_for_session(events)
    }

    /// A reload finished but `ListUnits` failed: assume every unit came back
    /// as it was (the next state signals correct what changed).
    pub fn resync_failed(&mut self) {
        self.reloading = false;
        self.reloads_open = 0;
        let back = std::mem::take(&mut self.reload_removed);
        for (unit, state) in back {
            self.cache_insert(unit, state);
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::Marshalled;

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    fn row(name: &str, active: &str, sub: &str) -> UnitInfo {
        UnitInfo {
            name: name.into(),
            description: String::new(),
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: sub.into(),
            followed: String::new(),
            object_path: "/".into(),
            job_id: 0,
            job_type: String::new(),
            job_path: "/".into(),
        }
    }

    fn changed(u: &str, active: &str, sub: &str) -> UnitSignal {
        UnitSignal::Changed {
            unit: u.into(),
            interface: UNIT_IFACE.into(),
            properties: Marshalled::default().into(),
            active_state: Some(active.into()),
            sub_state: Some(sub.into()),
        }
    }

    #[test]
    fn the_cache_holds_what_is_followed_and_nothing_else() {
        let mut view = View::default();
        view.session_started(1, 7);
        let a = unit("a.service");
        let followed = Followed::Units([(a.clone(), Scope::Everything)].into());
        // systemd answered with more than was asked: only `a` is kept.
        view.apply_snapshot(
            followed,
            vec![
                row("a.service", "active", "running"),
                row("b.service", "active", "running"),
            ],
        );
        assert_eq!(view.cached_units(), 1);
        // A late signal of a unit no longer followed changes nothing.
        assert!(
            view.on_signal(changed("b.service", "failed", "failed"), false)
                .is_none()
        );
        assert_eq!(view.cached_state(&unit("b.service")), None);
        view.on_signal(changed("a.service", "failed", "failed"), false);
        assert_eq!(
            view.cached_state(&a),
            Some(("failed".into(), "failed".into()))
        );
        // Following nothing: the cache is empty.
        view.apply_snapshot(Followed::nothing(), Vec::new());
        assert_eq!(view.cached_units(), 0);
        assert!(
            view.on_signal(changed("a.service", "active", "running"), false)
                .is_none()
        );
        assert_eq!(view.cached_units(), 0);
    }

    #[test]
    fn what_a_session_wants_followed() {
        const ALL: Scope = Scope::Everything;
        let mut view = View::default();
        assert_eq!(view.wanted(), Followed::nothing(), "no session");
        view.session_started(1, 7);
        let a = unit("a.service");
        assert!(view.may_subscribe(1, Some(&a), ALL).is_ok());
        assert!(
            view.may_subscribe(2, Some(&a), ALL).is_err(),
            "another session"
        );
        view.subscribe(1, Some(&a), ALL).unwrap();
        assert_eq!(view.wanted(), Followed::Units([(a.clone(), ALL)].into()));
        assert!(
            view.may_subscribe(1, Some(&a), ALL).is_err(),
            "already subscribed, nothing to change"
        );
        assert!(view.may_subscribe(1, None, ALL).is_ok());
        view.subscribe(1, None, ALL).unwrap();
        assert_eq!(view.wanted(), Followed::Every(Scope::Everything));
        view.unsubscribe(1, None).unwrap();
        assert_eq!(view.wanted(), Followed::Units([(a, ALL)].into()));
        view.session_ended(1);
        assert_eq!(view.wanted(), Followed::nothing());
    }

    /// A unit watched for its state: its state changes go out, its
    /// property changes do not, and the stream follows its state alone;
    /// widened to everything (a monitor joined), its properties go out too,
    /// without a second replay; narrowed back, they stop.
    #[test]
    fn a_unit_watched_for_its_state_is_told_without_its_properties() {
        let mut view = View::default();
        view.session_started(1, 7);
        let a = unit("a.service");
        view.apply_snapshot(
            Followed::Units([(a.clone(), Scope::State)].into()),
            vec![row("a.service", "inactive", "dead")],
        );
        let replay = view.subscribe(1, Some(&a), Scope::State).unwrap();
        assert_eq!(
            replay.events.len(),
            2,
            "UnitNew + state: {:?}",
            replay.events
        );
        assert_eq!(
            view.wanted(),
            Followed::Units([(a.clone(), Scope::State)].into())
        );
        assert!(
            view.subscribe(1, Some(&a), Scope::State).is_err(),
            "already subscribed at that scope"
        );

        let kinds = |batch: Option<Batch>| -> Vec<&'static str> {
            batch
                .map(|b| b.events)
                .unwrap_or_default()
                .iter()
                .map(|e| match e {
                    Event::UnitStateChanged { .. } => "state",
                    Event::UnitPropertiesChanged { .. } => "properties",
                    _ => "other",
                })
                .collect()
        };
        assert_eq!(
            kinds(view.on_signal(changed("a.service", "active", "running"), false)),
            ["state"]
        );
        let service_iface = UnitSignal::Changed {
            unit: "a.service".into(),
            interface: "org.freedesktop.systemd1.Service".into(),
            properties: Marshalled::default().into(),
            active_state: None,
            sub_state: None,
        };
        assert!(kinds(view.on_signal(service_iface.clone(), false)).is_empty());

        let widened = view.subscribe(1, Some(&a), Scope::Everything).unwrap();
        assert!(widened.events.is_empty(), "no replay: {:?}", widened.events);
        assert_eq!(
            view.wanted(),
            Followed::Units([(a.clone(), Scope::Everything)].into())
        );
        assert_eq!(
            kinds(view.on_signal(changed("a.service", "failed", "failed"), false)),
            ["state", "properties"]
        );
        assert_eq!(
            kinds(view.on_signal(service_iface.clone(), false)),
            ["properties"]
        );

        view.subscribe(1, Some(&a), Scope::State).unwrap();
        assert!(kinds(view.on_signal(service_iface, false)).is_empty());
        // The digest's watch set does not depend on the scope.
        let rows = view.resync_rows().unwrap();
        assert_eq!(rows.watch, watch_hash(false, [&a]));
        view.unsubscribe(1, Some(&a)).unwrap();
        assert_eq!(view.wanted(), Followed::nothing());
    }

    /// Past [`MAX_WATCHED`] single units, `Subscribe` is refused, and
    /// [`View::may_subscribe`] says so before anything changes what is
    /// followed; `*`, and a new scope of a watched unit, are still allowed.
    #[test]
    fn a_session_watches_at_most_max_watched_single_units() {
        const ALL: Scope = Scope::Everything;
        let mut view = View::default();
        view.session_started(1, 7);
        for i in 0..MAX_WATCHED {
            view.subscribe(1, Some(&unit(&format!("u{i}.service"))), ALL)
                .unwrap();
        }
        let one_more = unit("one-more.service");
        let refused = view.may_subscribe(1, Some(&one_more), ALL).unwrap_err();
        assert_eq!(refused.name, error_names::LIMITS_EXCEEDED, "{refused:?}");
        let refused = view.subscribe(1, Some(&one_more), ALL).err().unwrap();
        assert_eq!(refused.name, error_names::LIMITS_EXCEEDED, "{refused:?}");
        assert_eq!(view.watching(1), Some((false, MAX_WATCHED)));
        view.subscribe(1, Some(&unit("u0.service")), Scope::State)
            .unwrap();
        assert!(view.may_subscribe(1, None, ALL).is_ok());
        view.subscribe(1, None, ALL).unwrap();
        assert_eq!(view.watching(1), Some((true, MAX_WATCHED)));
    }
}
