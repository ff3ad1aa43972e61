//! The hub's side of resync (`drover_protocol::resync`): an agent's digest
//! is compared with the node's records and health entries, and on a
//! mismatch the agent is asked for a snapshot, which replaces the node's
//! records; only the units that really differ are told to their watchers,
//! with the reason `resync`.
//!
//! Invariants:
//! * **Same tag.** A digest is read in the node's event order (the
//!   session's reader hands events over one at a time), so the records have
//!   taken in exactly the events the agent sent before taking it; the
//!   agent's tag invariant (`drover_protocol::resync`) makes the two
//!   comparable however busy the node is. A digest whose watch set is not
//!   the manager's (a `Subscribe`/`Unsubscribe` under way), or that comes
//!   while a health snapshot is being gathered, is skipped, not counted as
//!   a mismatch. A snapshot is read in the same order, so it replaces the
//!   records at its own tag, with no later event applied yet.
//! * **Bounded.** A node's digests are read at most one per half interval
//!   (its agent was told the interval at registration); the manager asks a
//!   node for at most one snapshot per interval, one at a time, and reads
//!   only the snapshot it asked for (at most
//!   `drover_protocol::resync::UNITS_MAX` rows gathered). So an agent that
//!   mismatches every time, or sends digests or parts unasked, costs the
//!   manager one comparison per half interval and one snapshot per
//!   interval.
//! * **Counted** ([`ResyncStats`]): digests compared, snapshots asked for,
//!   unit records repaired.

use super::*;
use crate::units::health::HealthBook;
use crate::units::resync::ResyncStats;
use drover_protocol::resync::{
    Digest, SnapshotPart, Sum, UNITS_MAX, UnitRow, health_sum, units_sum, watch_hash,
};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The manager's side of a digest: (watch hash, units, health).
fn digest_of(ns: &NodeState, book: &HealthBook, node: &NodeName) -> (u64, Sum, Sum) {
    let watch = watch_hash(
        ns.watchers.contains_key(&None),
        ns.watchers.keys().flatten(),
    );
    // Records exist only for units the agent reports (`NodeState::reports`:
    // watched, or not unsubscribed yet).
    let units = units_sum(
        ns.records
            .iter()
            .filter(|(_, r)| r.loaded)
            .map(|(u, r)| (u, r.active_state.as_str(), r.sub_state.as_str())),
    );
    (watch, units, health_sum(book.unit_states(node)))
}

impl Subscriptions {
    /// What resync has done so far.
    pub fn resync_stats(&self) -> &ResyncStats {
        &self.resync
    }

    /// `Event::ResyncDigest` or `Event::ResyncSnapshot` of `session`
    /// (others are ignored): see the module docs.
    pub fn on_resync(self: &Arc<Self>, session: &Session, event: Event) {
        match event {
            Event::ResyncDigest(digest) => self.on_digest(session, digest),
            Event::ResyncSnapshot { tag, part } => self.on_snapshot(session, tag, part),
            _ => {}
        }
    }

    fn on_digest(self: &Arc<Self>, session: &Session, digest: Digest) {
        let now = Instant::now();
        let node = session.node();
        let mut st = self.lock();
        let State { nodes, health, .. } = &mut *st;
        let Some(ns) = nodes.get_mut(node) else {
            return;
        };
        if !ns.accepts(session.id(), digest.tag) {
            return;
        }
        let interval = ns.resync.interval;
        if interval.is_zero()
            || ns
                .resync
                .last_digest
                .is_some_and(|t| now.duration_since(t) < interval / 2)
        {
            tracing::debug!(node = %node, "a resync digest of node {node} sooner than half its interval: ignored");
            return;
        }
        ns.resync.last_digest = Some(now);
        self.resync.digests.fetch_add(1, Ordering::Relaxed);
        if health.gathering(node) {
            return;
        }
        let (watch, units, health_sum) = digest_of(ns, health, node);
        if watch != digest.watch {
            tracing::debug!(node = %node, "resync digest of node {node} skipped: a subscription is under way");
            return;
        }
        if units == digest.units && health_sum == digest.health {
            return;
        }
        self.resync.mismatches.fetch_add(1, Ordering::Relaxed);
        let limited = ns.resync.asked
            || ns
                .resync
                .last_asked
                .is_some_and(|t| now.duration_since(t) < interval);
        tracing::info!(
            node = %node,
            "node {node} holds {} units and {} health verdicts at tag {}, the manager {} and {}: {}",
            digest.units.count,
            digest.health.count,
            digest.tag.index,
            units.count,
            health_sum.count,
            if limited { "a snapshot was asked within the interval, the next digest tells" } else { "asking for a snapshot" }
        );
        if limited {
            return;
        }
        let Some(target) = ns.session.clone() else {
            return;
        };
        ns.resync.last_asked = Some(now);
        ns.resync.asked = true;
        drop(st);
        self.resync.snapshots.fetch_add(1, Ordering::Relaxed);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let hub = self.clone();
        rt.spawn(async move {
            // The parts come before the reply on the same ordered link: when
            // the reply is in, every part was read.
            if let Err(e) = target.request(Request::Resync, hub.request_timeout).await {
                tracing::warn!(node = %target.node(), "resync snapshot of node {} failed: {e}", target.node());
            }
            let mut st = hub.lock();
            if let Some(ns) = st.nodes.get_mut(target.node())
                && ns.in_session(target.id())
            {
                ns.resync.asked = false;
                ns.resync.pending = None;
            }
        });
    }

    fn on_snapshot(self: &Arc<Self>, session: &Session, tag: ModTag, part: SnapshotPart) {
        let node = session.node();
        let mut st = self.lock();
        let State { nodes, health, .. } = &mut *st;
        let Some(ns) = nodes.get_mut(node) else {
            return;
        };
        if !ns.accepts(session.id(), tag) || !ns.resync.asked {
            tracing::debug!(node = %node, "a resync snapshot part node {node} was not asked for: ignored");
            return;
        }
        if ns.resync.pending.as_ref().is_none_or(|(t, _)| *t != tag) {
            ns.resync.pending = Some((tag, Vec::new()));
        }
        let Some((_, rows)) = ns.resync.pending.as_mut() else {
            return;
        };
        if rows.len() + part.units.len() > UNITS_MAX {
            tracing::warn!(node = %node, "node {node} sent a resync snapshot of more than {UNITS_MAX} units: ignored");
            ns.resync.asked = false;
            ns.resync.pending = None;
            return;
        }
        rows.extend(part.units);
        if !part.last {
            return;
        }
        let Some((_, rows)) = ns.resync.pending.take() else {
            return;
        };
        let (watch, _, _) = digest_of(ns, health, node);
        if watch != part.watch {
            tracing::debug!(node = %node, "resync snapshot of node {node} skipped: a subscription is under way");
            return;
        }
        let events = repair(ns, node, tag, rows);
        let repaired = events
            .iter()
            .map(|(_, e)| &e.unit)
            .collect::<HashSet<_>>()
            .len();
        self.resync
            .repairs
            .fetch_add(repaired as u64, Ordering::Relaxed);
        if repaired > 0 {
            tracing::info!(node = %node, "resync repaired {repaired} unit records of node {node}");
        }
        let mut full = Vec::new();
        for (sinks, ev) in &events {
            full.extend(st.deliver(sinks, ev));
        }
        if !full.is_empty() {
            full.sort_unstable();
            full.dedup();
            let mut syncs = Syncs::new();
            st.drop_overflowed(full, &mut syncs);
            drop(st);
            self.start_syncs(syncs);
        }
    }
}

/// Replaces `ns`'s records by the snapshot `rows` taken at `tag`; the
/// events of the units that really differ, with their sinks: `New` (tag
/// `T`) of a unit not known loaded, `State` (tag `T + 1`) of a changed or
/// new one, `Removed` (`T + 1`) of one the node no longer has; all with the
/// reason `resync`.
fn repair(
    ns: &mut NodeState,
    node: &NodeName,
    tag: ModTag,
    rows: Vec<UnitRow>,
) -> Vec<(Vec<SinkId>, Arc<UnitEvent>)> {
    let later = ModTag::new(tag.guid, tag.index.saturating_add(1));
    let listed: BTreeMap<UnitName, (String, String)> = rows
        .into_iter()
        .map(|r| (r.unit, (r.active_state, r.sub_state)))
        .collect();
    let mut changes: Vec<(UnitName, ModTag, Change)> = Vec::new();
    let gone: Vec<UnitName> = ns
        .records
        .iter()
        .filter(|(u, r)| r.loaded && !listed.contains_key(*u))
        .map(|(u, _)| u.clone())
        .collect();
    for unit in gone {
        let change = Change::Removed {
            reason: Reason::Resync,
        };
        if ns.records.apply(&unit, later, &change) == Applied::Changed {
            changes.push((unit, later, change));
        }
    }
    for (unit, (active_state, sub_state)) in listed {
        let key = Some(unit);
        if !ns.reports(&key) {
            continue;
        }
        let Some(unit) = key else { continue };
        let known = ns.records.get(&unit).filter(|r| r.loaded);
        if known.is_some_and(|r| r.active_state == active_state && r.sub_state == sub_state) {
            continue;
        }
        if known.is_none() {
            let change = Change::New {
                reason: Reason::Resync,
            };
            if ns.records.apply(&unit, tag, &change) == Applied::Changed {
                changes.push((unit.clone(), tag, change));
            }
        }
        let change = Change::State {
            active_state,
            sub_state,
            reason: Reason::Resync,
        };
        if ns.records.apply(&unit, later, &change) == Applied::Changed {
            changes.push((unit, later, change));
        }
    }
    if tag.guid == ns.guid && later.index > ns.max_index {
        ns.max_index = later.index;
    }
    changes
        .into_iter()
        .map(|(unit, tag, change)| {
            let key = Some(unit);
            let sinks = State::sinks_for(ns, &key);
            let event = UnitEvent {
                node: node.clone(),
                unit: key,
                tag,
                change,
            };
            (sinks, Arc::new(event))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::resync::unit_entry;
    use drover_protocol::{Response, ToAgent};

    /// Long enough that only [`rewind`] lets a second digest in.
    const LONG: Duration = Duration::from_secs(3600);

    fn n1() -> NodeName {
        NodeName::new("n1").unwrap()
    }

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    /// An agent that answers every request at once but `Resync`, whose ids
    /// it hands to the test.
    struct Agent {
        session: Arc<Session>,
        resyncs: mpsc::UnboundedReceiver<u64>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Agent {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn online(hub: &Arc<Subscriptions>, id: u64) -> Agent {
        let (session, mut rx) = Session::new(id, n1(), "127.0.0.1".into());
        session.set_resync_interval(LONG);
        let (tx, resyncs) = mpsc::unbounded_channel();
        let s = session.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if let ToAgent::Request { id, body } = msg {
                    if body == Request::Resync {
                        let _ = tx.send(id);
                    } else {
                        s.complete(id, Ok(Response::Empty));
                    }
                }
            }
        });
        hub.node_online(&session);
        Agent {
            session,
            resyncs,
            task,
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// As if half an interval had passed since the last digest.
    fn rewind(hub: &Subscriptions) {
        if let Some(ns) = hub.lock().nodes.get_mut(&n1()) {
            ns.resync.last_digest = None;
        }
    }

    fn state(index: u64, u: &str, a: &str, s: &str) -> Event {
        Event::UnitStateChanged {
            tag: ModTag::new(7, index),
            unit: unit(u),
            active_state: a.into(),
            sub_state: s.into(),
            reason: Reason::Real,
        }
    }

    fn digest(index: u64, all: bool, units: &[(&str, &str, &str)]) -> Event {
        let mut sum = Sum::default();
        for (u, a, s) in units {
            sum.add(unit_entry(&unit(u), a, s));
        }
        Event::ResyncDigest(Digest {
            tag: ModTag::new(7, index),
            watch: watch_hash(all, []),
            units: sum,
            health: Sum::default(),
        })
    }

    fn part(index: u64, units: &[(&str, &str, &str)], last: bool) -> Event {
        Event::ResyncSnapshot {
            tag: ModTag::new(7, index),
            part: SnapshotPart {
                watch: watch_hash(true, []),
                units: units
                    .iter()
                    .map(|(u, a, s)| UnitRow {
                        unit: unit(u),
                        active_state: (*a).into(),
                        sub_state: (*s).into(),
                    })
                    .collect(),
                last,
            },
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Delivery>) -> Vec<(String, ModTag, Change)> {
        let mut out = Vec::new();
        while let Ok(d) = rx.try_recv() {
            out.push((
                d.event.unit_str().to_owned(),
                d.event.tag,
                d.event.change.clone(),
            ));
        }
        out
    }

    const RESYNC: Reason = Reason::Resync;

    #[tokio::test]
    async fn only_a_mismatch_asks_and_the_snapshot_repairs_only_what_differs() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let (w, mut rx) = hub.watcher(64);
        w.watch(&n1(), None).unwrap();
        let mut agent = online(&hub, 7);
        settle().await;
        let s = agent.session.clone();
        hub.on_event(&s, state(1, "a.service", "active", "running"));
        hub.on_event(&s, state(2, "b.service", "active", "running"));
        drain(&mut rx);
        let stats = || {
            let r = hub.resync_stats();
            (r.digests(), r.mismatches(), r.snapshots(), r.repairs())
        };
        let both = [
            ("a.service", "active", "running"),
            ("b.service", "active", "running"),
        ];

        // The same picture: nothing asked.
        hub.on_resync(&s, digest(2, true, &both));
        assert_eq!(stats(), (1, 0, 0, 0));
        // Sooner than half an interval: not even compared.
        hub.on_resync(&s, digest(2, true, &[]));
        assert_eq!(stats(), (1, 0, 0, 0));
        // Another watch set (a subscription under way): skipped.
        rewind(&hub);
        hub.on_resync(&s, digest(2, false, &[]));
        assert_eq!(stats(), (2, 0, 0, 0));
        settle().await;
        assert!(agent.resyncs.try_recv().is_err(), "no snapshot asked");

        // a failed and the event was lost; c appeared; b went.
        rewind(&hub);
        hub.on_resync(
            &s,
            digest(
                3,
                true,
                &[
                    ("a.service", "failed", "failed"),
                    ("c.service", "active", "running"),
                ],
            ),
        );
        let asked = agent.resyncs.recv().await.unwrap();
        assert_eq!(stats(), (3, 1, 1, 0));
        // Mismatching again while it is asked: no second snapshot.
        rewind(&hub);
        hub.on_resync(&s, digest(3, true, &[]));
        settle().await;
        assert!(agent.resyncs.try_recv().is_err());
        assert_eq!(stats(), (4, 2, 1, 0));

        // The snapshot, in two parts, at tag 4 (reserving 5).
        hub.on_resync(&s, part(4, &[("a.service", "failed", "failed")], false));
        assert!(drain(&mut rx).is_empty(), "nothing before the last part");
        hub.on_resync(&s, part(4, &[("c.service", "active", "running")], true));
        let later = ModTag::new(7, 5);
        assert_eq!(
            drain(&mut rx),
            vec![
                (
                    "b.service".into(),
                    later,
                    Change::Removed { reason: RESYNC }
                ),
                (
                    "a.service".into(),
                    later,
                    Change::State {
                        active_state: "failed".into(),
                        sub_state: "failed".into(),
                        reason: RESYNC
                    }
                ),
                (
                    "c.service".into(),
                    ModTag::new(7, 4),
                    Change::New { reason: RESYNC }
                ),
                (
                    "c.service".into(),
                    later,
                    Change::State {
                        active_state: "active".into(),
                        sub_state: "running".into(),
                        reason: RESYNC
                    }
                ),
            ]
        );
        assert_eq!(stats().3, 3, "three unit records repaired");
        assert_eq!(
            hub.record(&n1(), &unit("a.service")).unwrap().active_state,
            "failed"
        );
        // The agent's next event succeeds the repair.
        hub.on_event(&s, state(6, "a.service", "active", "running"));
        assert_eq!(drain(&mut rx).len(), 1);
        agent.session.complete(asked, Ok(Response::Empty));
        settle().await;

        // Parts nobody asked for change nothing.
        hub.on_resync(&s, part(9, &[("d.service", "active", "running")], true));
        assert!(drain(&mut rx).is_empty());
        assert_eq!(hub.record(&n1(), &unit("d.service")), None);
        // A mismatch within the interval of the last snapshot asks nothing.
        rewind(&hub);
        hub.on_resync(&s, digest(9, true, &[]));
        settle().await;
        assert!(agent.resyncs.try_recv().is_err());
        assert_eq!(stats().2, 1, "one snapshot per interval");
    }

    #[tokio::test]
    async fn digests_of_another_session_or_an_unknown_node_are_ignored() {
        let hub = Subscriptions::new(Duration::from_secs(5));
        let (w, _rx) = hub.watcher(8);
        w.watch(&n1(), None).unwrap();
        let agent = online(&hub, 7);
        settle().await;
        // A foreign tag guid.
        let mut d = digest(1, true, &[("x.service", "active", "running")]);
        if let Event::ResyncDigest(d) = &mut d {
            d.tag.guid = 6;
        }
        hub.on_resync(&agent.session, d);
        // A session that is not the node's current one.
        let (old, _out) = Session::new(6, n1(), "127.0.0.1".into());
        hub.on_resync(&old, digest(1, true, &[("x.service", "active", "running")]));
        // A node nobody watches.
        let (other, _out2) = Session::new(8, NodeName::new("n2").unwrap(), "127.0.0.1".into());
        hub.on_resync(&other, digest(1, true, &[]));
        assert_eq!(hub.resync_stats().digests(), 0);
    }
}
