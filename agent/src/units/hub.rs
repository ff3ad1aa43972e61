//! Unit subscriptions: which units the manager watches on this node, what
//! the unit stream follows for them, and the unit events the agent sends.
//! The [`UnitHub`] holds the [`View`] of systemd's units under a lock and
//! sends what the rules in [`crate::units::rules`] decide.
//!
//! The manager sends `Subscribe { unit }` for a unit (or `None`: every unit,
//! BlueChi's `*`), `SubscribeState { unit }` for a unit whose state alone
//! its watchers need (and either again when that changes), and
//! `Unsubscribe` when nobody watches it any more.
//!
//! **Following only what is watched.** The unit stream
//! ([`crate::systemd::api::Systemd::unit_stream`], started once, with the
//! agent) carries the signals of what the session watches and nothing else:
//! every unit while it watches `*` (or more than
//! [`crate::systemd::api::MAX_FOLLOWED_UNITS`] units; while health holds
//! every unit's state alone, the `Unit` interface of every unit), else the watched units
//! one by one (a unit watched for its state: its `Unit` interface alone),
//! else none (jobs only, for the unit fence). Each `Subscribe`
//! first makes the stream follow its unit too, and waits until the reader
//! applied that change's snapshot ([`crate::units::rules::View::apply_snapshot`]),
//! so its virtual replay is systemd's state from then on; each `Unsubscribe`
//! and the end of a session make the stream follow what is left
//! ([`UnitHub::follow_watched`]), which takes the other match rules off the
//! bus. The bookkeeping (what is held besides the subscriptions, one change
//! at a time) is [`crate::units::following`]'s.
//!
//! Invariants:
//! * **Sessions.** Subscriptions belong to one manager session; they are
//!   dropped when it ends ([`UnitHub::session_ended`]) and start empty in the
//!   next ([`UnitHub::session_started`]) — the manager replays them.
//! * **Order.** Producers (the signal pump, a subscription's replay) tag and
//!   send under one async lock ([`UnitHub::send_order`]), so the manager
//!   receives events in tag order. Lock order: the following lock
//!   (`crate::units::following`), then `send_order`, then the view.
//! * **Bounds.** Events leave through [`Outbox::send_paced`], which waits for
//!   the manager instead of letting a burst overflow the queue; a session
//!   that does not read within [`SEND_PATIENCE`] is given up. A change of
//!   what is followed waits at most as long for its snapshot.

use crate::link::outbox::{Outbox, Sent};
use crate::systemd::api::{Followed, Systemd, UnitSignal, UnitSignalStream};
use crate::units::following::{Follower, Following, Held};
use crate::units::rules::{Batch, ResyncRows, View, describe};
use drover_protocol::{RemoteError, Response, Scope, ToManager, UnitInfo, UnitName};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long unit events wait for the manager to read before the session is
/// given up (the heartbeat threshold normally notices a dead manager first).
pub const SEND_PATIENCE: Duration = Duration::from_secs(30);

/// See the module docs. Lives in `crate::state::Shared`; all methods are
/// cheap except `start`, the (un)subscriptions and holds (which may change
/// what is followed) and the sends.
#[derive(Default)]
pub struct UnitHub {
    view: Mutex<View>,
    /// Held by whoever tags and sends events, across the sends.
    send_order: tokio::sync::Mutex<()>,
    started: tokio::sync::OnceCell<()>,
    following: Following,
}

impl UnitHub {
    fn lock(&self) -> MutexGuard<'_, View> {
        // Critical sections are short and do not panic; a poisoned lock still
        // holds consistent state.
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A manager session began: no subscriptions, tags `(session_id, 1..)`.
    pub fn session_started(&self, epoch: u64, session_id: u64) {
        self.lock().session_started(epoch, session_id);
    }

    /// The manager session `epoch` ended: its subscriptions are gone. What
    /// the stream follows is changed by [`UnitHub::follow_watched`], which
    /// the caller runs (it waits for systemd).
    pub fn session_ended(&self, epoch: u64) {
        self.lock().session_ended(epoch);
    }

    /// What session `epoch` watches: (`*`?, number of single units).
    pub fn watching(&self, epoch: u64) -> Option<(bool, usize)> {
        self.lock().watching(epoch)
    }

    /// True once the unit stream runs (it then sees every later `JobNew`
    /// and `JobRemoved` too: `crate::deps::unit_fence`).
    pub fn streaming(&self) -> bool {
        self.started.initialized()
    }

    /// Number of loaded units the cache follows.
    pub fn cached_units(&self) -> usize {
        self.lock().cached_units()
    }

    /// The loaded units the cache follows, sorted.
    pub fn cached_names(&self) -> Vec<UnitName> {
        self.lock().cached_names()
    }

    /// The next tag of the open session (with its epoch), for events other
    /// producers send in the hub's order (health verdicts); the caller holds
    /// [`UnitHub::send_order`] until it has sent the event.
    pub fn next_tag(&self) -> Option<(u64, drover_protocol::ModTag)> {
        self.lock().next_tag()
    }

    /// What the manager should hold of this node's units now (see
    /// [`crate::units::rules::View::resync_rows`]); the caller holds
    /// [`UnitHub::send_order`], so the tag is the last one sent.
    pub fn resync_rows(&self) -> Option<ResyncRows> {
        self.lock().resync_rows()
    }

    /// Takes the two tags of a resync snapshot of session `epoch` (`T` and
    /// `T + 1`, `drover_protocol::resync`) and returns `T`; `None` when
    /// `epoch` is not the open session. The caller holds
    /// [`UnitHub::send_order`] until the snapshot is sent.
    pub fn snapshot_tag(&self, epoch: u64) -> Option<drover_protocol::ModTag> {
        let mut view = self.lock();
        match view.next_tag() {
            Some((e, tag)) if e == epoch => {
                view.next_tag();
                Some(tag)
            }
            _ => None,
        }
    }

    /// The cached (active, sub) state of a loaded unit.
    pub fn cached_state(&self, unit: &str) -> Option<(String, String)> {
        let unit = UnitName::new(unit).ok()?;
        self.lock().cached_state(&unit)
    }

    /// Starts the unit stream, once: the stream the first time (its reader
    /// is the caller's to start), `None` once it runs. A failure is the
    /// caller's error; the next call tries again.
    pub async fn start<S: Systemd>(
        &self,
        systemd: &Arc<S>,
    ) -> Result<Option<UnitSignalStream<S::Position>>, RemoteError> {
        let mut fresh = None;
        self.started
            .get_or_try_init(|| async {
                let stream = systemd.unit_stream().await?;
                let systemd = systemd.clone();
                let follower: Follower = Box::new(move |followed, id| {
                    let systemd = systemd.clone();
                    Box::pin(async move { systemd.follow(&followed, id).await })
                });
                self.following.started(follower);
                fresh = Some(stream);
                Ok::<(), RemoteError>(())
            })
            .await?;
        Ok(fresh)
    }

    /// What the session watches, as the stream must follow it.
    fn watched(&self) -> Followed {
        self.lock().wanted()
    }

    /// Makes the stream follow `unit` (`None`: every unit) at `scope` until
    /// [`UnitHub::release`], whatever the subscriptions
    /// ([`crate::units::following`]): its match rules are on the bus when
    /// this returns, so every signal systemd sends of it from now on reaches
    /// the reader (a `StartDep` holds its target's state, so the unit fence
    /// sees it go active). Returns the change to wait for before relying on
    /// the cache. An error holds nothing.
    pub async fn hold(&self, unit: Option<UnitName>, scope: Scope) -> Result<u64, RemoteError> {
        self.following.hold(&(unit, scope), || self.watched()).await
    }

    /// [`UnitHub::hold`], then waits until the reader applied that change
    /// (the cache covers `unit` when this returns).
    pub async fn hold_caught_up(
        &self,
        unit: Option<UnitName>,
        scope: Scope,
    ) -> Result<(), RemoteError> {
        let id = self.hold(unit, scope).await?;
        self.following.caught_up(id, SEND_PATIENCE).await
    }

    /// Ends one [`UnitHub::hold`] of `unit` at `scope`; the stream then
    /// follows what is left (a failure is logged, the next change tries
    /// again).
    pub async fn release(&self, unit: Option<UnitName>, scope: Scope) {
        let held: Held = (unit, scope);
        if let Err(e) = self.following.release(&held, || self.watched()).await {
            tracing::warn!("cannot change which units are followed: {e}");
        }
    }

    /// Makes the stream follow what is watched and held now (nothing without
    /// a session), and waits until the reader is there; a failure is
    /// logged, the next change tries again.
    pub async fn follow_watched(&self) {
        let changed = match self.following.refollow(|_| {}, || self.watched()).await {
            Ok(id) => self.following.caught_up(id, SEND_PATIENCE).await,
            Err(e) => Err(e),
        };
        if let Err(e) = changed {
            tracing::warn!("cannot change which units are followed: {e}");
        }
    }

    /// The reader reached the snapshot of change `id`: the stream follows
    /// `followed`, of which systemd had `units` loaded. The caller holds
    /// [`UnitHub::send_order`].
    pub fn apply_snapshot(&self, id: u64, followed: Followed, units: Vec<UnitInfo>) {
        self.lock().apply_snapshot(followed, units);
        self.following.applied(id);
    }

    /// `Request::Subscribe` (`scope` [`Scope::Everything`]) or
    /// `Request::SubscribeState` ([`Scope::State`]) of session `epoch`, once
    /// the stream runs ([`UnitHub::start`]): makes the stream follow the
    /// unit at that scope too (held until the subscription is recorded),
    /// waits until the reader applied that change, records the subscription
    /// and sends the virtual replay. A unit narrowed to its state is
    /// followed as before until the hold ends, then for its state alone.
    pub async fn subscribe(
        &self,
        outbox: &Outbox,
        epoch: u64,
        unit: Option<UnitName>,
        scope: Scope,
    ) -> Result<Response, RemoteError> {
        self.lock().may_subscribe(epoch, unit.as_ref(), scope)?;
        let change = self.hold(unit.clone(), scope).await?;
        let result = self
            .subscribe_held(outbox, epoch, unit.as_ref(), scope, change)
            .await;
        self.release(unit, scope).await;
        result
    }

    async fn subscribe_held(
        &self,
        outbox: &Outbox,
        epoch: u64,
        unit: Option<&UnitName>,
        scope: Scope,
        change: u64,
    ) -> Result<Response, RemoteError> {
        self.following.caught_up(change, SEND_PATIENCE).await?;
        let _order = self.send_order.lock().await;
        let batch = self.lock().subscribe(epoch, unit, scope)?;
        tracing::debug!(
            unit = describe(unit),
            ?scope,
            replayed = batch.events.len(),
            "subscribed"
        );
        send(outbox, batch).await;
        Ok(Response::Empty)
    }

    /// `Request::Unsubscribe` of session `epoch`: the stream then follows
    /// what is left.
    pub async fn unsubscribe(
        &self,
        epoch: u64,
        unit: Option<&UnitName>,
    ) -> Result<Response, RemoteError> {
        self.lock().unsubscribe(epoch, unit)?;
        self.follow_watched().await;
        Ok(Response::Empty)
    }

    /// The lock every producer of unit events holds while it tags and sends.
    pub async fn send_order(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.send_order.lock().await
    }

    /// A daemon-reload has not said it ended yet.
    pub fn reload_open(&self) -> bool {
        self.lock().reloads_open() > 0
    }

    /// Applies one unit signal; sends what the session must hear. `older`:
    /// it came before the last snapshot of the units (`ListUnits`), which
    /// already says what it did. The caller holds [`UnitHub::send_order`].
    pub async fn apply(&self, outbox: &Outbox, signal: UnitSignal, older: bool) {
        let batch = self.lock().on_signal(signal, older);
        if let Some(batch) = batch {
            send(outbox, batch).await;
        }
    }

    /// Settles a finished daemon-reload with what `ListUnits` said (`Err`:
    /// it failed, assume every unit came back as it was). The caller holds
    /// [`UnitHub::send_order`].
    pub async fn settle(&self, outbox: &Outbox, listed: Result<Vec<UnitInfo>, RemoteError>) {
        let batch = match listed {
            Ok(listed) => self.lock().resync(listed),
            Err(e) => {
                tracing::warn!("cannot list units after a systemd reload: {e}");
                self.lock().resync_failed();
                None
            }
        };
        if let Some(batch) = batch {
            send(outbox, batch).await;
        }
    }
}

async fn send(outbox: &Outbox, batch: Batch) {
    for event in batch.events {
        if crate::units::fault::drops(&event) {
            continue;
        }
        let sent = outbox
            .send_paced(batch.epoch, ToManager::Event(event), SEND_PATIENCE)
            .await;
        if sent != Sent::Queued {
            // The session is gone (or going): the rest means nothing to the
            // manager's next session, which starts from a replay.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::outbox::SessionKill;
    use crate::systemd::api::MAX_FOLLOWED_UNITS;
    use crate::test_rig::{Rig, next, unit};
    use drover_bus::systemd::UNIT_IFACE;
    use drover_protocol::{Event, Marshalled, ModTag, Reason, Request};
    use tokio::sync::mpsc;

    fn rig_with(capacity: usize) -> Rig {
        Rig::without_events(capacity, 77)
    }

    fn rig() -> Rig {
        rig_with(256)
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
        // A real change: the state, then the properties (BlueChi's order).
        r.fake
            .emit_unit(state_signal("a.service", "deactivating", "stop-sigterm"))
            .await;
        assert_eq!(
            next_event(&mut r.rx).await,
            state(4, "a.service", "deactivating", "stop-sigterm", Reason::Real)
        );
        let e = next_event(&mut r.rx).await;
        assert!(matches!(e, Event::UnitPropertiesChanged { .. }), "{e:?}");
        assert_eq!(tag(&e), ModTag::new(77, 5));

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
        assert_eq!(
            next_event(&mut r.rx).await,
            state(7, "a.service", "deactivating", "stop-sigkill", Reason::Real)
        );
        next_event(&mut r.rx).await;

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
        assert_eq!(
            next_event(&mut r.rx).await,
            state(12, "a.service", "active", "running", Reason::Real)
        );
        next_event(&mut r.rx).await;
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
        assert_eq!(
            next_event(&mut r.rx).await,
            state(5, "c.service", "active", "running", Reason::Real),
            "a unit first seen in a signal has changed by definition"
        );
        next_event(&mut r.rx).await;

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

        // Nobody watches: nothing is followed, nothing cached (the session's
        // end changes what is followed in a task; this is the same step).
        r.shared.units.follow_watched().await;
        assert_eq!(r.fake.followed(), Some(Followed::nothing()));
        assert_eq!(r.shared.units.cached_units(), 0);
        // Not subscribed in the new session until the manager replays; what
        // systemd does meanwhile is not followed.
        r.fake.set_state("a.service", "failed", "failed");
        r.fake
            .emit_unit(state_signal("a.service", "failed", "failed"))
            .await;
        assert_eq!(r.shared.units.cached_state("a.service"), None);
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
            "the replay is systemd's state when the unit is followed again"
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
        assert_eq!(
            next_event(&mut r.rx).await,
            state(
                11,
                "a.service",
                "deactivating",
                "stop-sigterm",
                Reason::Real
            )
        );
        assert!(matches!(
            next_event(&mut r.rx).await,
            Event::UnitPropertiesChanged { .. }
        ));
    }

    fn properties_of(u: &str) -> impl Fn(&Event) -> bool + '_ {
        move |e| matches!(e, Event::UnitPropertiesChanged { unit: got, .. } if got.as_str() == u)
    }

    /// Issue 14's flake in `bluechi_compat`: a daemon-reload on the target
    /// node, settled by a `ListUnits` whose answer came while signals sent
    /// before it (the target still `inactive`, loaded for its start) waited
    /// in the stream. The answer already says `active`; the older `inactive`
    /// went out after it as a *real* stop, and the manager ended a proxy
    /// whose target ran. Now a signal from before the snapshot changes no
    /// state; its properties still go out, and later signals count again.
    #[tokio::test]
    async fn signals_older_than_a_resync_do_not_undo_it() {
        let mut r = rig();
        subscribe(&mut r, 1, Some("db.service")).await.unwrap();
        let mut list = r.fake.hold("ListUnits");
        for signal in [
            UnitSignal::Reloading { active: true },
            UnitSignal::Reloading { active: false },
        ] {
            r.fake.emit_unit(signal).await;
        }
        // The settle's ListUnits is in flight; systemd loads db, says so,
        // starts it, then answers.
        list.reached().await;
        r.fake
            .emit_unit(UnitSignal::New {
                unit: "db.service".into(),
            })
            .await;
        r.fake
            .emit_unit(state_signal("db.service", "inactive", "dead"))
            .await;
        r.fake.set_state("db.service", "active", "running");
        list.release();
        assert_eq!(
            [next_event(&mut r.rx).await, next_event(&mut r.rx).await],
            [
                Event::UnitNew {
                    tag: ModTag::new(77, 1),
                    unit: unit("db.service"),
                    reason: Reason::Real,
                },
                state(2, "db.service", "active", "running", Reason::Real),
            ]
        );
        // The older signal: its properties only.
        assert!(properties_of("db.service")(&next_event(&mut r.rx).await));
        assert_eq!(
            r.shared.units.cached_state("db.service"),
            Some(("active".into(), "running".into()))
        );
        // Signals after the answer are news again.
        r.fake
            .emit_unit(state_signal("db.service", "deactivating", "stop-sigterm"))
            .await;
        assert_eq!(
            next_event(&mut r.rx).await,
            state(
                4,
                "db.service",
                "deactivating",
                "stop-sigterm",
                Reason::Real
            )
        );
    }

    /// The same race when the stream starts following a unit: the
    /// snapshot's answer is newer than a signal systemd sent while it was
    /// asked. The signal comes before the snapshot in the stream, so it is
    /// told by the snapshot and goes out neither as a state nor as
    /// properties (it is from before the subscription).
    #[tokio::test]
    async fn signals_older_than_the_seed_do_not_undo_it() {
        let mut r = rig();
        r.fake.set_state("a.service", "activating", "start");
        let mut list = r.fake.hold("ListUnits");
        let d = r.d.clone();
        let sub = tokio::spawn(async move {
            d.handle(1, 1, Request::Subscribe { unit: None }).await;
        });
        list.reached().await;
        r.fake
            .emit_unit(state_signal("a.service", "activating", "start"))
            .await;
        r.fake.set_state("a.service", "active", "running");
        list.release();
        sub.await.unwrap();
        assert_eq!(
            [next_event(&mut r.rx).await, next_event(&mut r.rx).await],
            [
                new_virtual(1, "a.service"),
                state(2, "a.service", "active", "running", Reason::Virtual),
            ]
        );
        assert_eq!(next(&mut r.rx).await, ok_reply(1));
        // Later signals are news: another interface's properties, then the
        // Unit interface's with the same state (properties only).
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
            matches!(&e, Event::UnitPropertiesChanged { interface, tag, .. }
                if interface == "org.freedesktop.systemd1.Service" && *tag == ModTag::new(77, 3)),
            "the older signal left nothing behind: {e:?}"
        );
        r.fake
            .emit_unit(state_signal("a.service", "active", "running"))
            .await;
        assert!(properties_of("a.service")(&next_event(&mut r.rx).await));
        assert_eq!(
            r.shared.units.cached_state("a.service"),
            Some(("active".into(), "running".into()))
        );
    }

    /// What the unit stream follows is what the session watches, and no
    /// more: one unit, some units, every unit, none.
    #[tokio::test]
    async fn the_stream_follows_what_is_watched_and_nothing_once_nobody_watches() {
        let mut r = rig();
        for u in ["a.service", "b.service", "c.service"] {
            r.fake.set_state(u, "active", "running");
        }
        let units =
            |names: &[&str]| Followed::units(names.iter().map(|n| (unit(n), Scope::Everything)));
        subscribe(&mut r, 1, Some("a.service")).await.unwrap();
        assert_eq!(r.fake.followed(), Some(units(&["a.service"])));
        subscribe(&mut r, 2, Some("b.service")).await.unwrap();
        assert_eq!(r.fake.followed(), Some(units(&["a.service", "b.service"])));
        assert_eq!(r.shared.units.cached_units(), 2, "only the followed units");
        let calls = r.fake.calls();
        assert!(
            calls.contains(&"ListUnitsByPatterns [a.service b.service]".to_string()),
            "each change is marked by a snapshot of what it follows: {calls:?}"
        );
        // A change of a unit nobody watches does not even reach the agent.
        r.fake
            .emit_unit(state_signal("c.service", "failed", "failed"))
            .await;
        assert_eq!(r.shared.units.cached_state("c.service"), None);

        subscribe(&mut r, 3, None).await.unwrap();
        assert_eq!(r.fake.followed(), Some(Followed::Every(Scope::Everything)));
        assert_eq!(r.shared.units.cached_units(), 3);
        r.d.handle(1, 4, Request::Unsubscribe { unit: None }).await;
        assert_eq!(next(&mut r.rx).await, ok_reply(4));
        assert_eq!(r.fake.followed(), Some(units(&["a.service", "b.service"])));
        assert_eq!(r.shared.units.cached_units(), 2);

        for (id, u) in [(5, "a.service"), (6, "b.service")] {
            r.d.handle(
                1,
                id,
                Request::Unsubscribe {
                    unit: Some(unit(u)),
                },
            )
            .await;
            assert_eq!(next(&mut r.rx).await, ok_reply(id));
        }
        assert_eq!(r.fake.followed(), Some(Followed::nothing()));
        assert_eq!(r.shared.units.cached_units(), 0);

        // The end of a session is the end of its subscriptions.
        subscribe(&mut r, 7, Some("c.service")).await.unwrap();
        assert_eq!(r.fake.followed(), Some(units(&["c.service"])));
        r.shared.outbox.close(1);
        r.shared.session_ended(1);
        r.shared.units.follow_watched().await;
        assert_eq!(r.fake.followed(), Some(Followed::nothing()));
        assert_eq!(r.shared.units.cached_units(), 0);
        let calls = r.fake.calls();
        assert_eq!(
            calls.iter().filter(|c| *c == "SubscribeUnits").count(),
            1,
            "one stream, whatever it follows: {calls:?}"
        );
    }

    /// Past [`MAX_FOLLOWED_UNITS`] single units the stream follows every
    /// unit (the bus limits match rules per connection), and goes back to
    /// single units below it.
    #[tokio::test]
    async fn more_units_than_the_bus_should_match_one_by_one_are_followed_as_every_unit() {
        let mut r = rig();
        let name = |n: usize| format!("u{n:03}.service");
        for n in 0..MAX_FOLLOWED_UNITS {
            subscribe(&mut r, n as u64 + 1, Some(&name(n)))
                .await
                .unwrap();
        }
        assert!(matches!(
            r.fake.followed(),
            Some(Followed::Units(u)) if u.len() == MAX_FOLLOWED_UNITS
        ));
        let one_more = MAX_FOLLOWED_UNITS as u64 + 1;
        subscribe(&mut r, one_more, Some(&name(MAX_FOLLOWED_UNITS)))
            .await
            .unwrap();
        assert_eq!(r.fake.followed(), Some(Followed::Every(Scope::Everything)));
        r.d.handle(
            1,
            one_more + 1,
            Request::Unsubscribe {
                unit: Some(unit(&name(0))),
            },
        )
        .await;
        assert_eq!(next(&mut r.rx).await, ok_reply(one_more + 1));
        assert!(matches!(
            r.fake.followed(),
            Some(Followed::Units(u)) if u.len() == MAX_FOLLOWED_UNITS && !u.contains_key(&unit(&name(0)))
        ));
    }

    /// Health's hold of every unit's state follows every unit for its state
    /// alone while no monitor wants more of one.
    #[tokio::test]
    async fn every_unit_held_for_its_state_is_followed_for_its_state_while_no_monitor_wants_more() {
        let mut r = rig();
        for u in ["a.service", "b.service"] {
            r.fake.set_state(u, "active", "running");
        }
        // A monitor's subscription (which starts the stream), then health.
        subscribe(&mut r, 1, Some("a.service")).await.unwrap();
        r.shared
            .units
            .hold_caught_up(None, Scope::State)
            .await
            .unwrap();
        assert_eq!(r.fake.followed(), Some(Followed::Every(Scope::Everything)));
        r.d.handle(
            1,
            2,
            Request::Unsubscribe {
                unit: Some(unit("a.service")),
            },
        )
        .await;
        assert_eq!(next(&mut r.rx).await, ok_reply(2));
        assert_eq!(r.fake.followed(), Some(Followed::Every(Scope::State)));
        assert_eq!(r.shared.units.cached_units(), 2, "every unit's state");
        r.shared.units.release(None, Scope::State).await;
        assert_eq!(r.fake.followed(), Some(Followed::nothing()));
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
