//! The hub's side towards the nodes: a node's session begins (subscriptions
//! replayed, `*` watchers told) or ends (virtual offline events), its
//! agent's unit events are applied and fanned out, and each agent is
//! brought in line with what is watched (`Subscribe`/`Unsubscribe`, one
//! request at a time per node, from one task per session), which
//! [`Subscriptions::synced`] waits for.

use super::*;

impl Subscriptions {
    /// Returns once the agent of every online node in `watched` has
    /// confirmed a subscription covering its unit (`None` = `*`; a `*`
    /// covers every unit), the node is offline or unknown, or the request
    /// timeout has passed. From then on the agent reports every change of
    /// those units as it happens: a client that subscribes and then starts a
    /// unit hears the start as real events, never only as the state of a
    /// late virtual replay.
    ///
    /// Each wake-up looks only from the first entry not confirmed yet (an
    /// entry found confirmed is not looked at again), so waiting for every
    /// node of a fleet costs one look per node and per wake-up, not the
    /// whole list per agent's answer (which at 10,000 nodes held the hub's
    /// lock for seconds in all).
    pub async fn synced(&self, watched: &[(NodeName, Option<UnitName>)]) {
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let mut next = 0;
        loop {
            let progress = self.sync_progress.notified();
            tokio::pin!(progress);
            // Registered before the look, so no step done after it is missed.
            progress.as_mut().enable();
            {
                let st = self.lock();
                next += watched[next..]
                    .iter()
                    .take_while(|(node, key)| {
                        st.nodes
                            .get(node)
                            .is_none_or(|ns| ns.session.is_none() || ns.confirmed(key))
                    })
                    .count();
            }
            if next == watched.len() {
                return;
            }
            if tokio::time::timeout_at(deadline, progress).await.is_err() {
                tracing::debug!("subscriptions not confirmed by every agent in time");
                return;
            }
        }
    }

    /// A session was admitted for its node (before it reads any event):
    /// replay the subscriptions, tell `*` watchers with a virtual `UnitNew`.
    pub fn node_online(self: &Arc<Self>, session: &Arc<Session>) {
        let mut syncs = Syncs::new();
        let mut st = self.lock();
        let node = session.node().clone();
        let ns = st.nodes.entry(node.clone()).or_default();
        ns.session = Some(session.clone());
        ns.guid = session.id();
        ns.max_index = 0;
        ns.sent.clear();
        ns.resync.online(session.resync_interval());
        // Tombstones guard against late events of older sessions, which are
        // refused by session from now on.
        ns.records.retain(|_, r| r.loaded);
        st.health.online(&node, session.id());
        let Some(ns) = st.nodes.get_mut(&node) else {
            return;
        };
        let wildcard = State::sinks_for(ns, &None);
        let event = Arc::new(UnitEvent {
            node: node.clone(),
            unit: None,
            tag: ModTag::new(ns.guid, 0),
            change: Change::New {
                reason: Reason::Virtual,
            },
        });
        schedule_sync(&node, ns, &mut syncs);
        let full = st.deliver(&wildcard, &event);
        st.drop_overflowed(full, &mut syncs);
        drop(st);
        self.start_syncs(syncs);
    }

    /// The session `session_id` of `node` ended while it was the node's
    /// current one: virtual offline events (see the module docs).
    pub fn node_offline(self: &Arc<Self>, node: &NodeName, session_id: u64) {
        let mut syncs = Syncs::new();
        let mut st = self.lock();
        let Some(ns) = st.nodes.get_mut(node) else {
            return;
        };
        if !ns.in_session(session_id) {
            return;
        }
        ns.session = None;
        ns.syncing = None;
        ns.sent.clear();
        ns.resync.offline();
        st.health.offline(node, session_id);
        let Some(ns) = st.nodes.get_mut(node) else {
            return;
        };
        self.sync_progress.notify_waiters();
        let mut loaded: Vec<(UnitName, bool)> = ns
            .records
            .iter()
            .filter(|(_, r)| r.loaded)
            .map(|(u, r)| (u.clone(), r.active_state != "inactive"))
            .collect();
        loaded.sort();
        let mut events: Vec<(Vec<SinkId>, Arc<UnitEvent>)> = Vec::new();
        for (unit, active) in loaded {
            let sinks = State::sinks_for(ns, &Some(unit.clone()));
            let mut changes = Vec::new();
            if active {
                changes.push(Change::State {
                    active_state: "inactive".into(),
                    sub_state: AGENT_OFFLINE.into(),
                    reason: Reason::Virtual,
                });
            }
            changes.push(Change::Removed {
                reason: Reason::Virtual,
            });
            for change in changes {
                let tag = ns.next_tag();
                ns.records.apply(&unit, tag, &change);
                let ev = UnitEvent {
                    node: node.clone(),
                    unit: Some(unit.clone()),
                    tag,
                    change,
                };
                events.push((sinks.clone(), Arc::new(ev)));
            }
        }
        let wildcard = State::sinks_for(ns, &None);
        if !wildcard.is_empty() {
            let state = Change::State {
                active_state: "inactive".into(),
                sub_state: AGENT_OFFLINE.into(),
                reason: Reason::Virtual,
            };
            for change in [
                state,
                Change::Removed {
                    reason: Reason::Virtual,
                },
            ] {
                let ev = UnitEvent {
                    node: node.clone(),
                    unit: None,
                    tag: ModTag::new(ns.guid, ns.max_index),
                    change,
                };
                events.push((wildcard.clone(), Arc::new(ev)));
            }
        }
        let drop_node = ns.watchers.is_empty();
        if drop_node {
            st.nodes.remove(node);
        }
        let mut full = Vec::new();
        for (sinks, ev) in &events {
            full.extend(st.deliver(sinks, ev));
        }
        full.sort_unstable();
        full.dedup();
        st.drop_overflowed(full, &mut syncs);
        // No answer to `*` will come from this session: what the records
        // hold now is all a waiting replay can tell.
        st.release_waiting(node);
        drop(st);
        self.start_syncs(syncs);
    }

    /// A unit event from `session`. Other events are ignored. Events of a
    /// session that is not the node's current one, tags whose guid is not
    /// the session id, and events for units nobody watches are dropped.
    pub fn on_event(self: &Arc<Self>, session: &Session, event: Event) {
        let (tag, unit, change) = match event {
            Event::UnitNew { tag, unit, reason } => (tag, unit, Change::New { reason }),
            Event::UnitStateChanged {
                tag,
                unit,
                active_state,
                sub_state,
                reason,
            } => (
                tag,
                unit,
                Change::State {
                    active_state,
                    sub_state,
                    reason,
                },
            ),
            Event::UnitPropertiesChanged {
                tag,
                unit,
                interface,
                properties,
            } => (
                tag,
                unit,
                Change::Properties {
                    interface,
                    properties,
                },
            ),
            Event::UnitRemoved { tag, unit, reason } => (tag, unit, Change::Removed { reason }),
            _ => return,
        };
        if tag.guid != session.id() {
            tracing::debug!(
                node = %session.node(),
                "unit event of node {} with a foreign tag guid {} dropped",
                session.node(),
                tag.guid
            );
            return;
        }
        let mut st = self.lock();
        let Some(ns) = st.nodes.get_mut(session.node()) else {
            return;
        };
        let key = Some(unit);
        if !ns.in_session(session.id()) || !ns.reports(&key) {
            return;
        }
        if tag.index > ns.max_index {
            ns.max_index = tag.index;
        }
        let real = match &change {
            Change::New { reason } | Change::State { reason, .. } | Change::Removed { reason } => {
                *reason == Reason::Real
            }
            Change::Properties { .. } => true,
            Change::Health { .. } => return,
        };
        let Some(unit) = key.as_ref() else { return };
        match ns.records.apply(unit, tag, &change) {
            Applied::Stale => return,
            Applied::Same if !real => return,
            _ => {}
        }
        let sinks = State::sinks_for(ns, &key);
        if sinks.is_empty() {
            return;
        }
        let event = Arc::new(UnitEvent {
            node: session.node().clone(),
            unit: key,
            tag,
            change,
        });
        let full = st.deliver(&sinks, &event);
        if !full.is_empty() {
            let mut syncs = Syncs::new();
            st.drop_overflowed(full, &mut syncs);
            drop(st);
            self.start_syncs(syncs);
        }
    }

    pub(super) fn start_syncs(self: &Arc<Self>, syncs: Syncs) {
        if syncs.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!("subscription changes outside a runtime cannot reach the agents");
            return;
        };
        for (node, session) in syncs {
            rt.spawn(self.clone().sync_node(node, session));
        }
    }

    /// Brings the agent of `session` in line with what is watched, one
    /// request at a time, until nothing differs or the session ends.
    async fn sync_node(self: Arc<Self>, node: NodeName, session: Arc<Session>) {
        loop {
            let (key, scope) = {
                let mut st = self.lock();
                let Some(ns) = st.nodes.get_mut(&node) else {
                    return;
                };
                if ns.syncing != Some(session.id()) {
                    return;
                }
                match ns.next_sync() {
                    Some(n) => n,
                    None => {
                        ns.syncing = None;
                        return;
                    }
                }
            };
            let body = match (&key, scope) {
                (_, None) => Request::Unsubscribe { unit: key.clone() },
                (None, Some(_)) => Request::Subscribe { unit: None },
                (Some(unit), Some(scope)) => scope.subscribe(unit.clone()),
            };
            let subscribe = scope.is_some();
            let request = body.name();
            let result = session.request(body, self.request_timeout).await;
            let what = key.as_ref().map(UnitName::as_str).unwrap_or(WILDCARD);
            match &result {
                Err(e) if e.name() == drover_protocol::error_names::OFFLINE => {
                    self.sync_progress.notify_waiters();
                    return;
                }
                Err(e) => tracing::warn!(
                    node = %node,
                    unit = what,
                    "{request} failed on the agent of node {node} (counted as done): {e}"
                ),
                Ok(_) => {}
            }
            let mut st = self.lock();
            let Some(ns) = st.nodes.get_mut(&node) else {
                return;
            };
            if ns.syncing != Some(session.id()) {
                return;
            }
            let star = subscribe && key.is_none();
            if let Some(scope) = scope {
                ns.sent.insert(key, scope);
            } else {
                ns.sent.remove(&key);
                ns.forget_unreported(&key);
            }
            if star {
                st.release_waiting(&node);
            }
            drop(st);
            self.sync_progress.notify_waiters();
        }
    }
}
