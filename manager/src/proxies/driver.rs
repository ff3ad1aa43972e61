//! The async side of cross-node dependencies: carries out what
//! [`crate::proxies::rules`] decides and feeds back what happened.
//!
//! * Agent events (`ProxyNew`, `ProxyRemoved`), node online/offline and
//!   config reloads go in through the hooks the core calls.
//! * Target states come from one [`Watcher`] of the subscription table; a
//!   relay task feeds them in. If the watcher is dropped for falling behind,
//!   a new one is made and every target watched again (the subscription
//!   layer replays the known states as virtual events, so nothing is lost
//!   that matters: the latest state).
//! * Dep commands run in one task per command; [`References`] allows at most
//!   one in flight per target, so they stay ordered. **Their outcomes go
//!   through the relay task**, after the target events queued before them:
//!   B's agent sends the target's news up to the end of a dep start before
//!   it answers `StartDep`, and the session reader queues that news to the
//!   watcher before it completes the request — but the relay is a task of
//!   its own, so a confirmation applied straight from the command's task
//!   could overtake it and meet a stale target state (the rules then replay
//!   old news to a waiting proxy, or hold back a failure that was this
//!   start's outcome until the proxy's start timeout: issue 14 item 6). The
//!   relay prefers queued events over outcomes (`biased` select), so an
//!   outcome is applied only once every event queued before it is. `StartDep` may take as
//!   long as the target's start (the agent answers when the dep's job is
//!   done, bounded by 90 s), hence its own, longer timeout.
//! * A timer task wakes at [`References::next_deadline`] for grace periods
//!   and orphan sweeps.
//!
//! Locking: one async mutex over the reference state and the sessions it
//! sends to. Notices are queued under it, in the order the state machine
//! produced them, so a requesting agent sees its target's changes in order.
//! Queueing a notice waits at most [`NOTICE_TIMEOUT`] (a full queue means the
//! agent does not read; its session is dropped by the write deadline soon,
//! and it re-announces its proxies when it is back). Dep requests and
//! `ListUnits` for sweeps are awaited outside the lock.

use crate::nodes::session::Session;
use crate::proxies::rules::{Action, DepCommand, DepOutcome, Policy, ProxyRow, References};
use crate::proxies::stats::ProxyStats;
use crate::units::health::usec;
use crate::units::hub::{Delivery, Subscriptions, WatchId, Watcher};
use crate::units::records::Change;
use drover_bus::client::ProxyTuple;
use drover_protocol::dep_unit::dep_target;
use drover_protocol::error_names::OFFLINE;
use drover_protocol::health::Health;
use drover_protocol::{Event, NodeName, Request, Response, TargetChange, UnitName};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{Mutex, Notify, mpsc};
use tokio::time::Instant;

/// Longest wait for room in an agent's outgoing queue for one notice.
pub const NOTICE_TIMEOUT: Duration = Duration::from_secs(1);
/// `StartDep`: the agent answers when the dep's start job ends (at most
/// 90 s, see the agent's `deps` module), plus slack.
pub const START_DEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Queue of the target-state watcher.
pub const WATCH_QUEUE: usize = 4096;

struct Inner {
    refs: References,
    /// Current session per online node (the ones notices and deps go to).
    sessions: HashMap<NodeName, Arc<Session>>,
    watcher: Option<Watcher>,
    /// Every watched target; `None` while the watcher is being renewed.
    watches: HashMap<(NodeName, UnitName), Option<WatchId>>,
    /// Dep command outcomes for the relay task to apply in order with the
    /// target events (see the module docs); `None` while no relay runs.
    outcomes: Option<mpsc::UnboundedSender<(DepCommand, DepOutcome)>>,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Notify,
    subs: Arc<Subscriptions>,
    /// Timeout of `StopDep` and `ListUnits` (the core's request timeout).
    request_timeout: Duration,
    /// The references' figures, read by a scrape without the lock.
    stats: Arc<ProxyStats>,
}

/// Handle to the proxy machinery (cheap to clone).
#[derive(Clone)]
pub struct Proxies {
    shared: Arc<Shared>,
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Proxies {
    /// `warm_up`: how long after now orphan-dep sweeps may wait for the
    /// nodes that may depend on others ([`References::warm_up_until`]).
    pub fn new(
        policy: Policy,
        subs: Arc<Subscriptions>,
        request_timeout: Duration,
        warm_up: Duration,
    ) -> Self {
        let refs = References::new(policy).warm_up_until(Instant::now() + warm_up);
        let stats = refs.stats();
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    refs,
                    sessions: HashMap::new(),
                    watcher: None,
                    watches: HashMap::new(),
                    outcomes: None,
                }),
                wake: Notify::new(),
                subs,
                request_timeout,
                stats,
            }),
        }
    }

    /// This manager starts to lead (high availability): sweeps wait for
    /// the nodes that may depend on others again, for `warm_up` at most.
    pub async fn restart_warm_up(&self, warm_up: Duration) {
        let mut inner = self.shared.inner.lock().await;
        inner.refs.restart_warm_up(Instant::now() + warm_up);
        drop(inner);
        self.shared.wake.notify_one();
    }

    /// What the references count as they change (for `/metrics`).
    pub fn stats(&self) -> Arc<ProxyStats> {
        self.shared.stats.clone()
    }

    // ---- hooks for the core -----------------------------------------------

    /// A session was admitted for its node.
    pub async fn node_online(&self, session: &Arc<Session>) {
        let mut inner = self.shared.inner.lock().await;
        inner
            .sessions
            .insert(session.node().clone(), session.clone());
        let actions = inner
            .refs
            .node_online(session.node(), session.id(), Instant::now());
        self.run(&mut inner, actions).await;
        self.shared.wake.notify_one();
    }

    /// The current session of `node` ended.
    pub async fn node_offline(&self, node: &NodeName, session_id: u64) {
        let mut inner = self.shared.inner.lock().await;
        if inner.sessions.get(node).map(|s| s.id()) != Some(session_id) {
            return;
        }
        inner.sessions.remove(node);
        let actions = inner.refs.node_offline(node, Instant::now());
        self.run(&mut inner, actions).await;
        self.shared.wake.notify_one();
    }

    /// `ProxyNew` / `ProxyRemoved` from `session`'s agent; other events are
    /// ignored.
    pub async fn on_event(&self, session: &Session, event: &Event) {
        let mut inner = self.shared.inner.lock().await;
        // Events of a session that is no longer current (a replaced one
        // still draining) must not resurrect references.
        if inner.sessions.get(session.node()).map(|s| s.id()) != Some(session.id()) {
            return;
        }
        let actions = match event {
            Event::ProxyNew {
                node,
                unit,
                proxy_id,
                template,
            } => {
                tracing::debug!(requester = %session.node(), %node, %unit, proxy_id, "proxy announced");
                inner.refs.proxy_new_of(
                    *template,
                    session.node(),
                    session.id(),
                    node,
                    unit,
                    *proxy_id,
                    Instant::now(),
                )
            }
            Event::ProxyRemoved {
                node,
                unit,
                proxy_id,
            } => {
                tracing::debug!(requester = %session.node(), %node, %unit, proxy_id, "proxy removed");
                inner
                    .refs
                    .proxy_removed(session.node(), node, unit, *proxy_id, Instant::now())
            }
            _ => return,
        };
        self.run(&mut inner, actions).await;
        self.shared.wake.notify_one();
    }

    /// A reloaded configuration.
    pub async fn reload(&self, policy: Policy) {
        let mut inner = self.shared.inner.lock().await;
        let actions = inner.refs.reload(policy);
        self.run(&mut inner, actions).await;
        self.shared.wake.notify_one();
    }

    /// `ListProxies`.
    pub async fn list(&self) -> Vec<ProxyTuple> {
        let inner = self.shared.inner.lock().await;
        inner.refs.rows().into_iter().map(tuple).collect()
    }

    /// Grace periods and sweeps; runs until the manager stops (abort).
    pub async fn timer_loop(self) {
        loop {
            let next = self.shared.inner.lock().await.refs.next_deadline();
            let notified = self.shared.wake.notified();
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = notified => continue,
                    }
                }
                None => {
                    notified.await;
                    continue;
                }
            }
            let mut inner = self.shared.inner.lock().await;
            let actions = inner.refs.tick(Instant::now());
            self.run(&mut inner, actions).await;
        }
    }

    // ---- carrying out -------------------------------------------------------

    /// Carries out `actions`, then sends whatever dep commands are due.
    /// Boxed with an explicit `Send`: the tasks it spawns call it again.
    fn run<'a>(
        &'a self,
        inner: &'a mut Inner,
        actions: Vec<Action>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(self.run_inner(inner, actions))
    }

    async fn run_inner(&self, inner: &mut Inner, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Notify {
                    to,
                    session,
                    notice,
                } => {
                    let Some(s) = inner.sessions.get(&to).filter(|s| s.id() == session) else {
                        continue;
                    };
                    if let Err(e) = s.notify(notice, NOTICE_TIMEOUT).await {
                        tracing::warn!(node = %to, "proxy notice to node {to} not delivered: {e}");
                    }
                }
                Action::Watch { node, unit } => self.watch(inner, node, unit),
                Action::Unwatch { node, unit } => {
                    if let (Some(Some(id)), Some(w)) =
                        (inner.watches.remove(&(node, unit)), &inner.watcher)
                    {
                        w.unwatch(id);
                    }
                }
                Action::Sweep { node, session } => {
                    if let Some(s) = inner.sessions.get(&node).filter(|s| s.id() == session) {
                        let task: BoxFuture = Box::pin(self.clone().sweep(s.clone()));
                        tokio::spawn(task);
                    }
                }
            }
        }
        for cmd in inner.refs.dep_commands() {
            match inner.sessions.get(&cmd.node) {
                Some(s) if s.id() == cmd.session => {
                    let task: BoxFuture = Box::pin(self.clone().drive(s.clone(), cmd));
                    tokio::spawn(task);
                }
                // Cannot happen (commands are only made for online nodes);
                // if it did, the want is sent again on the next register.
                _ => {
                    let _ = inner.refs.dep_result(&cmd, DepOutcome::Offline);
                }
            }
        }
    }

    fn watch(&self, inner: &mut Inner, node: NodeName, unit: UnitName) {
        if inner.watcher.is_none() {
            let (watcher, rx) = self.shared.subs.state_watcher(WATCH_QUEUE);
            // At most one outcome per target is in flight: bounded by the
            // number of targets.
            let (outcomes, outcomes_rx) = mpsc::unbounded_channel();
            let task: BoxFuture = Box::pin(self.clone().relay(rx, outcomes_rx));
            tokio::spawn(task);
            inner.watcher = Some(watcher);
            inner.outcomes = Some(outcomes);
        }
        let id = inner
            .watcher
            .as_ref()
            .and_then(|w| w.watch(&node, Some(&unit)));
        // `None`: the watcher was dropped (overflow); its relay task renews
        // it and watches everything again, this one included.
        inner.watches.insert((node, unit), id);
    }

    /// Feeds target states into the references; renews the watcher when the
    /// subscription layer dropped it.
    async fn relay(
        self,
        mut rx: mpsc::Receiver<Delivery>,
        mut outcomes: mpsc::UnboundedReceiver<(DepCommand, DepOutcome)>,
    ) {
        loop {
            loop {
                let delivery = tokio::select! {
                    // Events first: an outcome waits for those queued before it.
                    biased;
                    delivery = rx.recv() => match delivery {
                        Some(delivery) => delivery,
                        None => break,
                    },
                    Some((cmd, outcome)) = outcomes.recv() => {
                        let mut inner = self.shared.inner.lock().await;
                        let actions = inner.refs.dep_result(&cmd, outcome);
                        self.run(&mut inner, actions).await;
                        continue;
                    }
                };
                let event = &delivery.event;
                let Some(unit) = &event.unit else { continue };
                let change = match &event.change {
                    Change::New { reason } => TargetChange::New { reason: *reason },
                    Change::State {
                        active_state,
                        sub_state,
                        reason,
                    } => TargetChange::State {
                        active_state: active_state.clone(),
                        sub_state: sub_state.clone(),
                        reason: *reason,
                    },
                    Change::Removed { reason } => TargetChange::Removed { reason: *reason },
                    Change::Health {
                        state,
                        reason,
                        since_usec,
                        ..
                    } => TargetChange::Health(Health::new(
                        *state,
                        reason,
                        usec(SystemTime::now()).saturating_sub(*since_usec) / 1000,
                    )),
                    Change::Properties { .. } => continue,
                };
                let mut inner = self.shared.inner.lock().await;
                let actions = inner.refs.target_event(&event.node, unit, &change);
                self.run(&mut inner, actions).await;
            }
            // The queue closed: dropped for falling behind (or shutdown).
            let mut inner = self.shared.inner.lock().await;
            inner.watcher = None;
            let targets: Vec<(NodeName, UnitName)> = inner.watches.keys().cloned().collect();
            inner.watches.clear();
            if targets.is_empty() {
                // No relay from here on: outcomes are applied where they
                // end, and those already queued now.
                inner.outcomes = None;
                while let Ok((cmd, outcome)) = outcomes.try_recv() {
                    let actions = inner.refs.dep_result(&cmd, outcome);
                    self.run(&mut inner, actions).await;
                }
                return;
            }
            tracing::warn!(
                "proxy target watcher fell behind; watching {} targets again",
                targets.len()
            );
            let (watcher, new_rx) = self.shared.subs.state_watcher(WATCH_QUEUE);
            for (node, unit) in targets {
                let id = watcher.watch(&node, Some(&unit));
                inner.watches.insert((node, unit), id);
            }
            inner.watcher = Some(watcher);
            rx = new_rx;
        }
    }

    /// Sends one dep command and reports how it ended.
    async fn drive(self, session: Arc<Session>, cmd: DepCommand) {
        let (body, timeout) = if cmd.start {
            (
                Request::StartDep {
                    unit: cmd.unit.clone(),
                },
                START_DEP_TIMEOUT,
            )
        } else {
            (
                Request::StopDep {
                    unit: cmd.unit.clone(),
                },
                self.shared.request_timeout,
            )
        };
        let what = if cmd.start { "StartDep" } else { "StopDep" };
        let outcome = match session.request(body, timeout).await {
            Ok(_) => DepOutcome::Done,
            Err(e) if e.name() == OFFLINE => DepOutcome::Offline,
            Err(e) => {
                tracing::warn!(
                    node = %cmd.node,
                    unit = %cmd.unit,
                    "{what} of {} on node {} failed: {}",
                    cmd.unit,
                    cmd.node,
                    e.message()
                );
                DepOutcome::Failed(e.message().to_owned())
            }
        };
        let mut inner = self.shared.inner.lock().await;
        // Through the relay, after the target news B sent before answering
        // (see the module docs); straight away when no relay runs.
        let (cmd, outcome) = match &inner.outcomes {
            Some(relay) => match relay.send((cmd, outcome)) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => back,
            },
            None => (cmd, outcome),
        };
        let actions = inner.refs.dep_result(&cmd, outcome);
        self.run(&mut inner, actions).await;
    }

    /// Lists the dep units running on the node of `session` and stops those
    /// nobody references (see the module docs of [`crate::proxies::rules`]).
    async fn sweep(self, session: Arc<Session>) {
        let units = match session
            .request(Request::ListUnits, self.shared.request_timeout)
            .await
        {
            Ok(Response::Units(units)) => units,
            Ok(_) => return,
            Err(e) => {
                tracing::info!(
                    node = %session.node(),
                    "cannot list the units of node {} for the dep sweep: {e}",
                    session.node()
                );
                return;
            }
        };
        let running: Vec<UnitName> = units
            .iter()
            .filter(|u| {
                matches!(
                    u.active_state.as_str(),
                    "active" | "activating" | "reloading"
                )
            })
            .filter_map(|u| dep_target(&u.name))
            .collect();
        let mut inner = self.shared.inner.lock().await;
        inner
            .refs
            .sweep_result(session.node(), session.id(), &running);
        self.run(&mut inner, Vec::new()).await;
    }
}

fn tuple(row: ProxyRow) -> ProxyTuple {
    (
        row.requester.to_string(),
        row.node.to_string(),
        row.unit.to_string(),
        row.state.to_owned(),
        row.target_state,
        row.references,
    )
}
