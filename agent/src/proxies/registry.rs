//! Proxies on the requesting node: the state behind `drover-proxy@NODE_UNIT.service`
//! (and BlueChi's `bluechi-proxy@NODE_UNIT.service`, [`ProxyTemplate`]; a
//! proxy is its proxy unit, node and unit, so one unit of each family for the
//! same target are two proxies). The families differ in one thing, how a
//! proxy ends when its target goes down after it was active: drover's ends
//! `failed` with the reason (its stop's `RemoveProxy` answers it), BlueChi's
//! ends `inactive`, as BlueChi's does (`RemoveProxy` succeeds; a helper that
//! asks only after that still succeeds, and the unit is stopped).
//!
//! `drover-proxy create` calls the local API's `CreateProxy(local, node, unit)`
//! ([`crate::api`]); this module keeps one `Proxy` per call and decides how
//! the call ends. The manager relays the target's fate as [`Notice`]s; the
//! agent announces its proxies with `Event::ProxyNew` / `Event::ProxyRemoved`.
//!
//! Life of a proxy:
//!
//! ```text
//!   CreateProxy ──► Waiting ──(target active, real or virtual)──► Active
//!                     │  (target failed/inactive/removed real,       │ (target failed/inactive/
//!                     │   ProxyError, RemoveProxy, caller left,      │  removed real, ProxyError)
//!                     │   agent shutdown)                            ▼
//!                     └──► reply ActivationFailed, forget     stop the local proxy unit, forget
//!                                                             (RemoveProxy: forget only)
//! ```
//!
//! A proxy may also begin before its call: when systemd runs the proxy unit's
//! start job, [`crate::proxies::early_start`] announces it ([`Proxies::start_ahead`]) so the
//! target starts while the helper process starts. The helper's `CreateProxy`
//! then *claims* it (answered at once if the target is already active, or with
//! the reason if it already failed); a proxy nobody claims is dropped when its
//! job ends ([`Proxies::job_ended`]).
//!
//! Invariants:
//! * **One proxy per (local unit, node, unit).** A second `CreateProxy` for a
//!   triple that is waiting or active is refused; nothing changes. (Claiming a
//!   proxy started ahead is not a second call: it is the first.)
//! * **Ids are unique per agent process** (a counter from 1, never reused), so
//!   the manager can tell a re-announced proxy from a new one.
//! * **Every waiting call ends exactly once**: its reply channel is consumed by
//!   the first verdict; a forgotten proxy has no channel left.
//! * **The manager hears of every live proxy in every session.** A `ProxyNew`
//!   goes out at once when a session is open; [`Proxies::on_session`] re-sends
//!   it for every live proxy not yet announced in that session (the manager
//!   rebuilds its references from these). A `ProxyRemoved` that could not be
//!   sent (no session) for a proxy the manager had heard of is kept (bounded)
//!   and sent first thing in the next session, so references converge.
//! * Virtual target events (node offline, replays) never fail or stop a proxy:
//!   the target may well still run. Only `real` ones, and `ProxyError`, do.
//! * Disconnects change nothing here: waiting proxies keep waiting (the proxy
//!   unit's start timeout bounds them), active ones stay active.
//! * An agent that starts adopts the proxy units it finds active
//!   ([`Proxies::adopt`]): they are followed again instead of staying up with
//!   nobody watching their target. A stop of the agent, clean or not, leaves
//!   active proxy units (and what is bound to them) running, and the manager
//!   keeps their references for its grace period ([`Proxies::shutdown`]), so
//!   `systemctl restart drover-agent` disturbs nothing. (BlueChi stops every
//!   active proxy unit on a clean stop.)
//!
//! Pure bookkeeping under one mutex; the only I/O is queueing messages on the
//! [`Outbox`] (never blocks) and handing local units to stop to
//! [`Proxies::run_stopper`].

use crate::link::outbox::{Outbox, Sent};
use crate::systemd::api::{JobPath, Systemd};
use drover_protocol::JobKind;
use drover_protocol::offline::offline_reason;
use drover_protocol::proxy_instance::{ProxyInstance, ProxyTemplate, proxy_templates_text};
use drover_protocol::verdict::{TargetView, Verdict};
use drover_protocol::{Event, HealthState, NodeName, Notice, TargetChange, ToManager, UnitName};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, oneshot};

/// systemd's refusal of a job that would reverse a pending one (mode `fail`).
const TRANSACTION_IS_DESTRUCTIVE: &str = "org.freedesktop.systemd1.TransactionIsDestructive";

/// Removals kept for the next session at most (oldest dropped first).
pub const UNSENT_REMOVALS_CAP: usize = 4096;
/// Failures of proxies started ahead kept for their helpers at most.
pub const AHEAD_FAILURES_CAP: usize = 1024;

/// The id [`Proxies::create`] returns when the call ended before any proxy
/// existed (a target that failed while its proxy was started ahead).
pub const NO_PROXY: u64 = 0;

/// How a `CreateProxy` call ends: `Err` carries the one-line reason.
pub type Outcome = Result<(), String>;

/// The validated arguments of `CreateProxy` / `RemoveProxy`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProxyKey {
    /// The local proxy unit, `drover-proxy@NODE_UNIT.service` or
    /// `bluechi-proxy@NODE_UNIT.service`.
    pub local: UnitName,
    /// The target node.
    pub node: NodeName,
    /// The target unit on that node.
    pub unit: UnitName,
}

impl ProxyKey {
    /// Validates the three strings of a D-Bus call; the error says which one
    /// is wrong and why.
    pub fn parse(local: &str, node: &str, unit: &str) -> Result<Self, String> {
        let local_name = UnitName::new(local)
            .map_err(|e| format!("local_service_name: {e}"))
            .and_then(|name| {
                if ProxyTemplate::of_unit(name.as_str()).is_some() {
                    Ok(name)
                } else {
                    Err(format!(
                        "local_service_name '{}' is not an instance of {}",
                        local.escape_default(),
                        proxy_templates_text()
                    ))
                }
            })?;
        let node = NodeName::new(node).map_err(|e| format!("node: {e}"))?;
        let unit = UnitName::new(unit).map_err(|e| format!("unit: {e}"))?;
        if unit.is_template() {
            return Err(format!(
                "unit: '{}' is a template; name an instance",
                unit.as_str()
            ));
        }
        Ok(Self {
            local: local_name,
            node,
            unit,
        })
    }
}

impl ProxyKey {
    /// The family of its proxy unit.
    pub fn template(&self) -> ProxyTemplate {
        ProxyTemplate::of_unit(self.local.as_str()).unwrap_or(ProxyTemplate::Drover)
    }

    /// The key behind a proxy unit's own name, by the helper's rule
    /// ([`ProxyInstance::from_unit_name`]). `None` for anything else.
    pub fn from_unit_name(local: &str) -> Option<Self> {
        let p = ProxyInstance::from_unit_name(local)?;
        Some(Self {
            local: p.proxy_unit().clone(),
            node: p.node().clone(),
            unit: p.unit().clone(),
        })
    }
}

/// Why `CreateProxy` was refused before anything happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    #[error("proxy already exists: {local} for {unit} on node {node} is {phase}")]
    Duplicate {
        local: String,
        node: String,
        unit: String,
        phase: &'static str,
    },
    #[error("drover-agent is shutting down")]
    ShuttingDown,
}

/// Phase of a proxy, as [`Proxies::list`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Waiting,
    Active,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Active => "active",
        }
    }
}

/// One live proxy, as [`Proxies::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInfo {
    pub id: u64,
    pub key: ProxyKey,
    pub phase: Phase,
}

struct Proxy {
    key: ProxyKey,
    /// `Some` while a `CreateProxy` call waits: its deferred reply.
    reply: Option<oneshot::Sender<Outcome>>,
    /// The manager reported the target active.
    active: bool,
    /// Started ahead of its helper ([`Proxies::start_ahead`]): the proxy
    /// unit's start job, until a `CreateProxy` claims the proxy.
    ahead: Option<JobPath>,
    /// The session in which the manager was last told about it.
    announced: Option<u64>,
    /// While waiting: the manager said the target's node is offline, since
    /// this moment on our clock (`None`: not connected since the manager
    /// started). What the proxy says if it is stopped while it waits.
    node_offline: Option<Option<SystemTime>>,
    /// What the manager said of the target: active or not, its health
    /// (`drover_protocol::verdict`).
    view: TargetView,
}

impl Proxy {
    fn new(key: ProxyKey) -> Self {
        Self {
            key,
            reply: None,
            active: false,
            ahead: None,
            announced: None,
            node_offline: None,
            view: TargetView::default(),
        }
    }

    /// Why it still waits, if known: its target's node is offline, or the
    /// target is active but not healthy.
    fn waiting_reason(&self) -> Option<String> {
        match self.node_offline {
            Some(since) => Some(offline_reason(
                self.key.node.as_str(),
                since,
                SystemTime::now(),
            )),
            None => self
                .view
                .waiting_reason(self.key.unit.as_str(), self.key.node.as_str()),
        }
    }

    fn phase(&self) -> Phase {
        if self.active {
            Phase::Active
        } else {
            Phase::Waiting
        }
    }
}

/// A proxy started ahead of its helper whose target failed before the helper
/// asked: the helper gets the reason. Kept until claimed, or until the start
/// job or a `RemoveProxy` ends it.
struct AheadFailure {
    job: JobPath,
    why: String,
    /// A `bluechi-proxy@` proxy whose target was active first: as BlueChi's,
    /// its helper succeeds and the unit is then stopped (it ends `inactive`).
    completes: bool,
}

#[derive(Default)]
struct Table {
    last_id: u64,
    by_id: BTreeMap<u64, Proxy>,
    by_key: HashMap<ProxyKey, u64>,
    unsent_removals: VecDeque<Event>,
    stops: VecDeque<UnitName>,
    failed_ahead: HashMap<ProxyKey, AheadFailure>,
    /// Active proxies stopped because their target failed: the reason, for
    /// the `RemoveProxy` of that stop ([`Proxies::take_failure`]).
    failed_stops: HashMap<UnitName, String>,
    /// Stops refused while the unit's start job still ran (see
    /// [`Proxies::run_stopper`]); sent again when a job ends.
    deferred_stops: Vec<UnitName>,
    /// systemd jobs ended so far (a wake-up a deferral cannot miss).
    jobs_ended: u64,
    closed: bool,
}

/// What a notice means for the proxy: the target's state by the rule the
/// manager applies too ([`drover_protocol::verdict`]), or a refusal.
enum Fate {
    Active,
    /// The target's health check turned unhealthy (`why`): a waiting proxy
    /// keeps waiting; an active one is reported.
    Unhealthy {
        why: String,
    },
    /// `failed`: the target failed (not stopped, unloaded or refused): an
    /// active proxy then ends `failed`, not `inactive`.
    Down {
        why: String,
        failed: bool,
    },
    Ignore,
}

fn fate(key: &ProxyKey, view: &mut TargetView, notice: Notice) -> Fate {
    let change = match notice {
        // A refusal fails a waiting proxy (its call's answer); an active one
        // (a permission revoked) is stopped, as when its target is stopped.
        Notice::ProxyError { message, .. } => {
            return Fate::Down {
                why: one_line(&message),
                failed: false,
            };
        }
        Notice::ProxyTarget { change, .. } => change,
        // News of the target's node decides nothing (see `Proxies::on_notice`).
        Notice::TargetNodeOffline { .. } | Notice::TargetNodeOnline { .. } => return Fate::Ignore,
    };
    let target = format!("{} on node {}", key.unit, key.node);
    match (view.apply(&change), change) {
        (Verdict::Up, _) => Fate::Active,
        (Verdict::Unhealthy, TargetChange::Health(health)) => Fate::Unhealthy {
            why: match drover_protocol::health::one_line(&health.reason) {
                "" => format!("{target} is unhealthy"),
                reason => format!("{target} is unhealthy: {}", one_line(reason)),
            },
        },
        (Verdict::Unhealthy, _) => Fate::Unhealthy {
            why: format!("{target} is unhealthy"),
        },
        (
            Verdict::RealDown,
            TargetChange::State {
                active_state,
                sub_state,
                ..
            },
        ) => Fate::Down {
            failed: active_state == "failed",
            why: format!(
                "{target} is {} ({})",
                one_line(&active_state),
                one_line(&sub_state)
            ),
        },
        (Verdict::RealDown, _) => Fate::Down {
            why: format!("{target} was unloaded"),
            failed: false,
        },
        (Verdict::Undecided, _) => Fate::Ignore,
    }
}

/// The reason goes to the journal through the helper: one printable line.
fn one_line(s: &str) -> String {
    s.chars()
        .take(400)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Queues `event` on the open session; the session it went to, if any.
fn tell(outbox: &Outbox, event: Event) -> Option<u64> {
    let epoch = outbox.current()?;
    (outbox.send(epoch, ToManager::Event(event)) == Sent::Queued).then_some(epoch)
}

impl Table {
    /// Files `proxy` under the next id and announces it to the manager (now
    /// if a session is open, else when the next one opens); `announced` is
    /// set here. Returns the id and the filed proxy.
    fn add(&mut self, mut proxy: Proxy, outbox: &Outbox) -> (u64, &Proxy) {
        self.last_id += 1;
        let id = self.last_id;
        // Under the table lock: `on_session` either already ran (then the
        // session is open and this sends) or runs after us and sends it.
        proxy.announced = tell(
            outbox,
            Event::ProxyNew {
                node: proxy.key.node.clone(),
                unit: proxy.key.unit.clone(),
                proxy_id: id,
                template: proxy.key.template(),
            },
        );
        self.by_key.insert(proxy.key.clone(), id);
        (id, self.by_id.entry(id).or_insert(proxy))
    }

    /// Forgets proxy `id` and tells the manager (now, or next session).
    fn forget(&mut self, id: u64, outbox: &Outbox) -> Option<Proxy> {
        let proxy = self.by_id.remove(&id)?;
        self.by_key.remove(&proxy.key);
        let removed = Event::ProxyRemoved {
            node: proxy.key.node.clone(),
            unit: proxy.key.unit.clone(),
            proxy_id: id,
        };
        // A manager that never heard of it needs no removal.
        if proxy.announced.is_some() && tell(outbox, removed.clone()).is_none() {
            if self.unsent_removals.len() >= UNSENT_REMOVALS_CAP {
                self.unsent_removals.pop_front();
                tracing::warn!(
                    "more than {UNSENT_REMOVALS_CAP} proxy removals wait for the manager; dropping the oldest"
                );
            }
            self.unsent_removals.push_back(removed);
        }
        Some(proxy)
    }
}

/// See the module docs.
#[derive(Default)]
pub struct Proxies {
    table: Mutex<Table>,
    stop_wake: Notify,
}

impl Proxies {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Sections under the lock do not panic; a poisoned lock still holds
        // consistent state.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a proxy and announces it if a session is open. The receiver
    /// yields the outcome of the call (see the module docs).
    pub fn create(
        &self,
        key: ProxyKey,
        outbox: &Outbox,
    ) -> Result<(u64, oneshot::Receiver<Outcome>), CreateError> {
        let mut t = self.lock();
        if t.closed {
            return Err(CreateError::ShuttingDown);
        }
        let (tx, rx) = oneshot::channel();
        // A new start: an old failure is no longer what a stop would report.
        t.failed_stops.remove(&key.local);
        if let Some(failure) = t.failed_ahead.remove(&key) {
            // Started ahead, and the target failed before we were asked.
            if failure.completes {
                // BlueChi's family: the proxy was active, so its start
                // succeeds, and then it stops (deferred until this start job
                // ends, see `run_stopper`).
                tracing::info!(
                    "proxy {} claimed by its helper: its target was active, then went down: {}",
                    key.local,
                    failure.why
                );
                let _ = tx.send(Ok(()));
                t.stops.push_back(key.local);
                drop(t);
                self.stop_wake.notify_one();
            } else {
                let _ = tx.send(Err(failure.why));
            }
            return Ok((NO_PROXY, rx));
        }
        if let Some(&id) = t.by_key.get(&key)
            && let Some(proxy) = t.by_id.get_mut(&id)
            && proxy.ahead.take().is_some()
        {
            tracing::info!(
                proxy = id,
                "proxy {} claimed by its helper{}",
                key.local,
                if proxy.active {
                    ": the target is already active"
                } else {
                    ""
                }
            );
            if proxy.active {
                let _ = tx.send(Ok(()));
            } else {
                proxy.reply = Some(tx);
            }
            return Ok((id, rx));
        }
        if let Some(id) = t.by_key.get(&key) {
            let phase = t.by_id.get(id).map_or("waiting", |p| p.phase().as_str());
            return Err(CreateError::Duplicate {
                local: key.local.to_string(),
                node: key.node.to_string(),
                unit: key.unit.to_string(),
                phase,
            });
        }
        let (id, p) = t.add(
            Proxy {
                reply: Some(tx),
                ..Proxy::new(key)
            },
            outbox,
        );
        tracing::info!(
            proxy = id,
            "proxy {} for {} on node {} created{}",
            p.key.local,
            p.key.unit,
            p.key.node,
            if p.announced.is_some() {
                ""
            } else {
                " (the manager is told once connected)"
            }
        );
        Ok((id, rx))
    }

    /// Takes over a proxy unit that is already active (a previous agent
    /// process started it and died without stopping it): it becomes an
    /// active proxy with a fresh id, announced like any other, so the
    /// manager keeps its reference and a real stop of the target still stops
    /// the unit. `None` if the triple is already known.
    pub fn adopt(&self, key: ProxyKey, outbox: &Outbox) -> Option<u64> {
        let mut t = self.lock();
        if t.closed || t.by_key.contains_key(&key) {
            return None;
        }
        let (id, p) = t.add(
            Proxy {
                active: true,
                ..Proxy::new(key)
            },
            outbox,
        );
        tracing::info!(
            proxy = id,
            "{} was already active: following {} on node {} again",
            p.key.local,
            p.key.unit,
            p.key.node
        );
        Some(id)
    }

    /// systemd runs the start job `job` of proxy unit `key.local`: its helper
    /// is about to be spawned and will call `CreateProxy`. Announcing the
    /// proxy now lets the target start while the helper process starts; the
    /// helper's call then claims this proxy instead of creating one. Nothing
    /// happens if the triple is known or the agent is closing. If no call
    /// claims it, [`Proxies::job_ended`] drops it when the job ends.
    pub fn start_ahead(&self, key: ProxyKey, job: JobPath, outbox: &Outbox) -> Option<u64> {
        let mut t = self.lock();
        if t.closed || t.by_key.contains_key(&key) || t.failed_ahead.contains_key(&key) {
            return None;
        }
        let (id, p) = t.add(
            Proxy {
                ahead: Some(job),
                ..Proxy::new(key)
            },
            outbox,
        );
        tracing::debug!(
            proxy = id,
            "systemd runs {} for {}: starting {} on node {} ahead of the helper",
            p.ahead.as_deref().unwrap_or_default(),
            p.key.local,
            p.key.unit,
            p.key.node
        );
        Some(id)
    }

    /// systemd's job `job` ended: a proxy started ahead for it that no
    /// `CreateProxy` claimed (the job was cancelled, or the unit failed
    /// before its helper ran) is dropped, and so is a failure kept for it.
    pub fn job_ended(&self, job: &str, outbox: &Outbox) {
        let mut t = self.lock();
        t.jobs_ended = t.jobs_ended.wrapping_add(1);
        if !t.deferred_stops.is_empty() {
            let deferred = std::mem::take(&mut t.deferred_stops);
            t.stops.extend(deferred);
            self.stop_wake.notify_one();
        }
        t.failed_ahead.retain(|_, f| f.job != job);
        let unclaimed = t
            .by_id
            .iter()
            .find(|(_, p)| p.ahead.as_deref() == Some(job))
            .map(|(id, _)| *id);
        if let Some(id) = unclaimed
            && let Some(proxy) = t.forget(id, outbox)
        {
            tracing::info!(
                proxy = id,
                "the start job of {} ended before its helper asked; proxy dropped",
                proxy.key.local
            );
        }
    }

    /// Whether a proxy for `key` is live (waiting or active).
    pub fn knows(&self, key: &ProxyKey) -> bool {
        self.lock().by_key.contains_key(key)
    }

    /// `RemoveProxy`: forgets the proxy if it exists (a waiting call fails).
    /// Returns whether it existed.
    pub fn remove(&self, key: &ProxyKey, outbox: &Outbox) -> bool {
        let mut t = self.lock();
        t.failed_ahead.remove(key);
        let Some(id) = t.by_key.get(key).copied() else {
            return false;
        };
        if let Some(mut proxy) = t.forget(id, outbox)
            && let Some(reply) = proxy.reply.take()
        {
            // The waiting call's answer is what the helper, stopped while it
            // waits (its start timeout ran out), reports as the reason.
            let why = match proxy.waiting_reason() {
                Some(reason) => {
                    tracing::warn!(
                        proxy = id,
                        "proxy {} stopped while waiting: {reason}",
                        key.local
                    );
                    reason
                }
                None => format!(
                    "{} was removed before {} on node {} became active",
                    key.local, key.unit, key.node
                ),
            };
            let _ = reply.send(Err(why));
        }
        tracing::info!(proxy = id, "proxy {} removed", key.local);
        true
    }

    /// Why the active proxy behind `key` was stopped, if it was stopped because
    /// its target failed: `RemoveProxy` (the stop's
    /// `ExecStop=`) answers it as an error, so the proxy unit ends `failed`
    /// with the target's reason, as one whose target fails while it waits.
    /// Taken once. Only a `drover-proxy@` proxy: BlueChi's `bluechi-proxy@`
    /// ends `inactive` there, as BlueChi's does.
    pub fn take_failure(&self, key: &ProxyKey) -> Option<String> {
        self.lock().failed_stops.remove(&key.local)
    }

    /// The `CreateProxy` caller left the bus while the proxy was waiting (its
    /// `ExecStart` was killed: stop or start timeout). systemd runs no
    /// `ExecStop` for a start that failed, so nobody would remove it: forget it.
    pub fn abandon(&self, id: u64, outbox: &Outbox) {
        let mut t = self.lock();
        if t.by_id.get(&id).is_some_and(|p| p.reply.is_some())
            && let Some(proxy) = t.forget(id, outbox)
        {
            tracing::info!(
                proxy = id,
                "the caller of CreateProxy for {} left before the target was active; proxy dropped{}",
                proxy.key.local,
                proxy
                    .waiting_reason()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
        }
    }

    /// A session with the manager is open (its outbox is routing): tell it
    /// about removals it missed, then about every live proxy.
    pub fn on_session(&self, epoch: u64, outbox: &Outbox) {
        let mut t = self.lock();
        while let Some(removed) = t.unsent_removals.pop_front() {
            if outbox.send(epoch, ToManager::Event(removed.clone())) != Sent::Queued {
                // The session is already gone; the next one gets it.
                t.unsent_removals.push_front(removed);
                return;
            }
        }
        for (id, proxy) in t.by_id.iter_mut() {
            if proxy.announced == Some(epoch) {
                continue;
            }
            let event = Event::ProxyNew {
                node: proxy.key.node.clone(),
                unit: proxy.key.unit.clone(),
                proxy_id: *id,
                template: proxy.key.template(),
            };
            if outbox.send(epoch, ToManager::Event(event)) != Sent::Queued {
                return;
            }
            proxy.announced = Some(epoch);
        }
    }

    /// News from the manager about one of our proxies (see the module docs).
    /// Returns the key of an active proxy whose target just turned unhealthy
    /// (the caller decides whether it stops: [`Proxies::stop_unhealthy`]).
    pub fn on_notice(&self, notice: Notice, outbox: &Outbox) -> Option<ProxyKey> {
        let id = notice.proxy_id();
        let mut t = self.lock();
        let Some(proxy) = t.by_id.get_mut(&id) else {
            // Late news about a proxy that is gone: nothing to do.
            tracing::debug!(proxy = id, ?notice, "notice for an unknown proxy ignored");
            return None;
        };
        let key = proxy.key.clone();
        match notice {
            // Only a waiting proxy is told; it keeps waiting either way.
            Notice::TargetNodeOffline { offline_for_ms, .. } => {
                let since = offline_for_ms.map(|ms| {
                    let now = SystemTime::now();
                    now.checked_sub(Duration::from_millis(ms)).unwrap_or(now)
                });
                proxy.node_offline = Some(since);
                if let Some(reason) = proxy.waiting_reason() {
                    tracing::info!(proxy = id, "proxy {} waits: {reason}", key.local);
                }
                return None;
            }
            Notice::TargetNodeOnline { .. } => {
                proxy.node_offline = None;
                return None;
            }
            Notice::ProxyError { .. } | Notice::ProxyTarget { .. } => {}
        }
        match fate(&key, &mut proxy.view, notice) {
            Fate::Ignore => {}
            Fate::Unhealthy { why } => {
                if proxy.active && proxy.reply.is_none() && proxy.ahead.is_none() {
                    return Some(key);
                }
                tracing::info!(proxy = id, "proxy {} waits: {why}", key.local);
            }
            Fate::Active => {
                proxy.active = true;
                proxy.node_offline = None;
                let reply = proxy.reply.take()?;

                if reply.send(Ok(())).is_ok() {
                    tracing::info!(
                        proxy = id,
                        "{} is active on node {}: proxy {} started",
                        key.unit,
                        key.node,
                        key.local
                    );
                } else {
                    // The call already ended (caller gone): nobody will
                    // ever remove this proxy, so do it now.
                    t.forget(id, outbox);
                }
            }
            Fate::Down { why, failed } => {
                let reply = proxy.reply.take();
                let ahead = proxy.ahead.take();
                let was_active = proxy.active;
                t.forget(id, outbox);
                match (reply, ahead) {
                    (Some(reply), _) => {
                        tracing::warn!(proxy = id, "proxy {} cannot start: {why}", key.local);
                        let _ = reply.send(Err(why));
                    }
                    (None, Some(job)) => {
                        tracing::warn!(proxy = id, "proxy {} cannot start: {why}", key.local);
                        if t.failed_ahead.len() >= AHEAD_FAILURES_CAP {
                            t.failed_ahead.clear();
                        }
                        // BlueChi's proxy, having seen its target active,
                        // started and then stopped.
                        let completes = was_active && key.template() == ProxyTemplate::Bluechi;
                        t.failed_ahead.insert(
                            key,
                            AheadFailure {
                                job,
                                why,
                                completes,
                            },
                        );
                    }
                    (None, None) => {
                        tracing::warn!(proxy = id, "stopping proxy {}: {why}", key.local);
                        // A failed `drover-proxy@` stop's `RemoveProxy`
                        // (ExecStop=) gets `why` as its error: the proxy ends
                        // `failed`, and its journal says why. (BlueChi's
                        // `bluechi-proxy@` ends `inactive`: its `RemoveProxy`
                        // succeeds.)
                        let failure =
                            (failed && key.template() == ProxyTemplate::Drover).then_some(why);
                        self.stop_local(t, key.local, failure);
                    }
                }
            }
        }
        None
    }

    /// Queues the stop of proxy unit `local` (already forgotten); with
    /// `failure`, its stop's `RemoveProxy` (ExecStop=) gets that as its
    /// error: the proxy ends `failed`, and its journal says why.
    fn stop_local(&self, mut t: MutexGuard<'_, Table>, local: UnitName, failure: Option<String>) {
        if let Some(why) = failure {
            if t.failed_stops.len() >= AHEAD_FAILURES_CAP {
                t.failed_stops.clear();
            }
            t.failed_stops.insert(local.clone(), why);
        }
        t.stops.push_back(local);
        drop(t);
        self.stop_wake.notify_one();
    }

    /// Stops the active proxy `key` because its target is unhealthy (its
    /// unit asked for it: `StopWhenUnhealthy=yes`); the proxy unit ends
    /// `failed` with the reason. False when the proxy is gone, not active,
    /// or its target is no longer unhealthy.
    pub fn stop_unhealthy(&self, key: &ProxyKey, outbox: &Outbox) -> bool {
        let t = self.lock();
        let Some(&id) = t.by_key.get(key) else {
            return false;
        };
        let why = match t.by_id.get(&id) {
            Some(p) if p.active && p.view.health().state == HealthState::Unhealthy => {
                let reason = drover_protocol::health::one_line(&p.view.health().reason);
                if reason.is_empty() {
                    format!("{} on node {} is unhealthy", key.unit, key.node)
                } else {
                    format!(
                        "{} on node {} is unhealthy: {}",
                        key.unit,
                        key.node,
                        one_line(reason)
                    )
                }
            }
            _ => return false,
        };
        let mut t = t;
        t.forget(id, outbox);
        tracing::warn!(
            proxy = id,
            "stopping proxy {} (StopWhenUnhealthy=yes): {why}",
            key.local
        );
        self.stop_local(t, key.local.clone(), Some(why));
        true
    }

    /// Clean shutdown: no new proxies; proxies not yet active end (waiting
    /// calls fail, the manager is told). Active proxies are left as they are:
    /// their units keep running, the manager is not told (it keeps their
    /// references for its grace period), and the next agent adopts them.
    /// Returns the local units left active.
    pub fn shutdown(&self, outbox: &Outbox) -> Vec<UnitName> {
        let mut t = self.lock();
        t.closed = true;
        let ids: Vec<u64> = t.by_id.keys().copied().collect();
        let mut kept = Vec::new();
        for id in ids {
            let Some(proxy) = t.by_id.get(&id) else {
                continue;
            };
            if proxy.active && proxy.ahead.is_none() {
                kept.push(proxy.key.local.clone());
                continue;
            }
            if let Some(mut proxy) = t.forget(id, outbox)
                && let Some(reply) = proxy.reply.take()
            {
                let _ = reply.send(Err("drover-agent is shutting down".into()));
            }
        }
        kept
    }

    /// The live proxies, by id.
    pub fn list(&self) -> Vec<ProxyInfo> {
        self.lock()
            .by_id
            .iter()
            .map(|(id, p)| ProxyInfo {
                id: *id,
                key: p.key.clone(),
                phase: p.phase(),
            })
            .collect()
    }

    /// Local units waiting to be stopped (tests; [`Proxies::run_stopper`]
    /// drains them).
    pub fn pending_stops(&self) -> Vec<UnitName> {
        self.lock().stops.iter().cloned().collect()
    }

    /// Stops the local proxy units this module gave up on, forever. Each stop
    /// is `StopUnit(unit, "fail")`: while the unit's start job still runs
    /// (its helper was answered a moment ago and is exiting), systemd refuses
    /// it, and it is sent again once a job ends. A stop that replaced that
    /// start job would cancel it, so the unit would end `inactive` without
    /// running `ExecStop=`, and a failing target's reason would be lost.
    /// Any other failure is logged (the unit's dependents then stay up,
    /// which is what the log line must say).
    pub async fn run_stopper<S: Systemd>(&self, systemd: &S) {
        loop {
            let (next, jobs_ended) = {
                let mut t = self.lock();
                (t.stops.pop_front(), t.jobs_ended)
            };
            let Some(unit) = next else {
                self.stop_wake.notified().await;
                continue;
            };
            match systemd.unit_job(JobKind::Stop, unit.as_str(), "fail").await {
                Ok(_) => {}
                Err(e) if e.name == TRANSACTION_IS_DESTRUCTIVE => {
                    let mut t = self.lock();
                    if t.jobs_ended == jobs_ended {
                        tracing::debug!("{unit} is still starting; stopping it once the job ends");
                        t.deferred_stops.push(unit);
                    } else {
                        // A job ended meanwhile: try again at once.
                        t.stops.push_back(unit);
                    }
                }
                Err(e) => tracing::error!(
                    "cannot stop {unit} after its target went down; units bound to it keep running: {e}"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::outbox::SessionKill;
    use crate::systemd::fake::{FakeSystemd, Script};
    use drover_protocol::Reason;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn key(local: &str, node: &str, unit: &str) -> ProxyKey {
        ProxyKey::parse(local, node, unit).unwrap()
    }

    fn db() -> ProxyKey {
        key("drover-proxy@bar_db.service", "bar", "db.service")
    }

    /// A fake manager link: an outbox with session `epoch` open.
    fn session(outbox: &Outbox, epoch: u64) -> mpsc::Receiver<ToManager> {
        let (tx, rx) = mpsc::channel(64);
        outbox.open(epoch, tx, SessionKill::new());
        rx
    }

    fn drain(rx: &mut mpsc::Receiver<ToManager>) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(msg) = rx.try_recv() {
            match msg {
                ToManager::Event(e) => out.push(e),
                other => panic!("unexpected {other:?}"),
            }
        }
        out
    }

    fn new(id: u64) -> Event {
        new_of(id, ProxyTemplate::Drover)
    }

    fn new_of(id: u64, template: ProxyTemplate) -> Event {
        Event::ProxyNew {
            node: NodeName::new("bar").unwrap(),
            unit: UnitName::new("db.service").unwrap(),
            proxy_id: id,
            template,
        }
    }

    fn removed(id: u64) -> Event {
        Event::ProxyRemoved {
            node: NodeName::new("bar").unwrap(),
            unit: UnitName::new("db.service").unwrap(),
            proxy_id: id,
        }
    }

    fn state(id: u64, active: &str, sub: &str, reason: Reason) -> Notice {
        Notice::ProxyTarget {
            proxy_id: id,
            change: TargetChange::State {
                active_state: active.into(),
                sub_state: sub.into(),
                reason,
            },
        }
    }

    #[test]
    fn arguments_are_validated_with_a_clear_reason() {
        assert!(ProxyKey::parse("drover-proxy@bar_db.service", "bar", "db.service").is_ok());
        assert!(ProxyKey::parse("drover-proxy@bar_t.timer", "bar", "t.timer").is_ok());
        for (local, node, unit, says) in [
            ("db.service", "bar", "db.service", "not an instance"),
            (
                "drover-proxy@.service",
                "bar",
                "db.service",
                "not an instance",
            ),
            ("drover-proxy@x", "bar", "db.service", "local_service_name"),
            ("drover-proxy@bar_db.service", "bar_x", "db.service", "node"),
            ("drover-proxy@bar_db.service", "", "db.service", "node"),
            ("drover-proxy@bar_db.service", "bar", "db", "unit"),
            (
                "drover-proxy@bar_db.service",
                "bar",
                "a@.service",
                "template",
            ),
            ("drover-proxy@bar_db.service", "bar", "a b.service", "unit"),
        ] {
            let err = ProxyKey::parse(local, node, unit).unwrap_err();
            assert!(err.contains(says), "{local} {node} {unit}: {err}");
        }
    }

    #[tokio::test]
    async fn waiting_proxy_succeeds_on_active_and_is_announced_at_once() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let (id, reply) = p.create(db(), &outbox).unwrap();
        assert_eq!(id, 1);
        assert_eq!(drain(&mut rx), vec![new(1)]);
        // Replays and virtual news do not end the wait.
        p.on_notice(
            Notice::ProxyTarget {
                proxy_id: 1,
                change: TargetChange::New {
                    reason: Reason::Virtual,
                },
            },
            &outbox,
        );
        p.on_notice(state(1, "inactive", "dead", Reason::Virtual), &outbox);
        p.on_notice(
            Notice::ProxyTarget {
                proxy_id: 1,
                change: TargetChange::Removed {
                    reason: Reason::Virtual,
                },
            },
            &outbox,
        );
        p.on_notice(state(1, "activating", "start", Reason::Real), &outbox);
        assert_eq!(p.list()[0].phase, Phase::Waiting);
        p.on_notice(state(1, "active", "running", Reason::Virtual), &outbox);
        assert_eq!(reply.await.unwrap(), Ok(()));
        assert_eq!(p.list()[0].phase, Phase::Active);
        assert!(drain(&mut rx).is_empty(), "nothing more to tell");
    }

    const JOB: &str = "/org/freedesktop/systemd1/job/9";

    #[tokio::test]
    async fn a_proxy_started_ahead_is_claimed_by_its_helper_waiting_or_active() {
        for active_first in [false, true] {
            let outbox = Outbox::default();
            let mut rx = session(&outbox, 1);
            let p = Proxies::default();
            assert_eq!(p.start_ahead(db(), JOB.into(), &outbox), Some(1));
            assert_eq!(drain(&mut rx), vec![new(1)], "announced before any call");
            assert_eq!(p.list()[0].phase, Phase::Waiting);
            if active_first {
                p.on_notice(state(1, "active", "running", Reason::Real), &outbox);
                assert_eq!(p.list()[0].phase, Phase::Active);
            }
            // The helper's call takes the same proxy: no second announcement.
            let (id, reply) = p.create(db(), &outbox).unwrap();
            assert_eq!(id, 1);
            if !active_first {
                p.on_notice(state(1, "active", "running", Reason::Real), &outbox);
            }
            assert_eq!(reply.await.unwrap(), Ok(()));
            assert!(drain(&mut rx).is_empty());
            // Claimed: its job's end changes nothing, a second call is a duplicate.
            p.job_ended(JOB, &outbox);
            assert_eq!(p.list().len(), 1);
            assert!(matches!(
                p.create(db(), &outbox),
                Err(CreateError::Duplicate { .. })
            ));
        }
    }

    #[tokio::test]
    async fn a_target_failing_before_the_helper_asks_fails_its_call() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        p.start_ahead(db(), JOB.into(), &outbox).unwrap();
        p.on_notice(
            Notice::ProxyError {
                proxy_id: 1,
                message: "no such unit db.service on node bar".into(),
            },
            &outbox,
        );
        assert!(p.list().is_empty());
        assert_eq!(drain(&mut rx), vec![new(1), removed(1)]);
        // Nothing is started again for it before the helper asks.
        assert_eq!(p.start_ahead(db(), JOB.into(), &outbox), None);
        let (id, reply) = p.create(db(), &outbox).unwrap();
        assert_eq!(id, NO_PROXY);
        assert_eq!(
            reply.await.unwrap(),
            Err("no such unit db.service on node bar".into())
        );
        assert!(drain(&mut rx).is_empty(), "the call announces nothing");
        // The failure was for that call only.
        let (id, _reply) = p.create(db(), &outbox).unwrap();
        assert_eq!(id, 2);
    }

    #[tokio::test]
    async fn an_unclaimed_proxy_goes_with_its_job_and_on_shutdown() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        p.start_ahead(db(), JOB.into(), &outbox).unwrap();
        p.on_notice(state(1, "active", "running", Reason::Real), &outbox);
        p.job_ended("/org/freedesktop/systemd1/job/10", &outbox);
        assert_eq!(p.list().len(), 1, "another job's end is not ours");
        p.job_ended(JOB, &outbox);
        assert!(p.list().is_empty());
        assert_eq!(drain(&mut rx), vec![new(1), removed(1)]);
        // A kept failure goes with its job too.
        p.start_ahead(db(), JOB.into(), &outbox).unwrap();
        p.on_notice(state(2, "failed", "failed", Reason::Real), &outbox);
        p.job_ended(JOB, &outbox);
        let (id, _reply) = p.create(db(), &outbox).unwrap();
        assert_ne!(id, NO_PROXY, "a new call starts afresh");
        p.remove(&db(), &outbox);
        // Shutdown: an unclaimed active proxy has no local unit to stop.
        p.start_ahead(db(), JOB.into(), &outbox).unwrap();
        p.on_notice(state(4, "active", "running", Reason::Real), &outbox);
        assert!(p.shutdown(&outbox).is_empty());
        assert!(p.pending_stops().is_empty());
    }

    #[tokio::test]
    async fn real_failure_error_and_removal_fail_a_waiting_proxy() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let cases: [(Notice, &str); 4] = [
            (
                state(1, "failed", "failed", Reason::Real),
                "db.service on node bar is failed (failed)",
            ),
            (
                state(2, "inactive", "dead", Reason::Real),
                "db.service on node bar is inactive (dead)",
            ),
            (
                Notice::ProxyTarget {
                    proxy_id: 3,
                    change: TargetChange::Removed {
                        reason: Reason::Real,
                    },
                },
                "db.service on node bar was unloaded",
            ),
            (
                Notice::ProxyError {
                    proxy_id: 4,
                    message: "node foo may not depend on node bar\n".into(),
                },
                "node foo may not depend on node bar ",
            ),
        ];
        for (n, (notice, want)) in cases.into_iter().enumerate() {
            let id = n as u64 + 1;
            let (got, reply) = p.create(db(), &outbox).unwrap();
            assert_eq!(got, id);
            p.on_notice(notice, &outbox);
            assert_eq!(reply.await.unwrap(), Err(want.to_string()));
            assert!(p.list().is_empty(), "a failed proxy is forgotten");
            assert_eq!(drain(&mut rx), vec![new(id), removed(id)]);
        }
        assert!(p.pending_stops().is_empty(), "nothing was active");
    }

    #[tokio::test]
    async fn real_stop_after_success_stops_the_local_unit_once() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Arc::new(Proxies::default());
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
        assert_eq!(reply.await.unwrap(), Ok(()));
        // The target node went offline: keep running.
        p.on_notice(
            state(id, "inactive", "agent-offline", Reason::Virtual),
            &outbox,
        );
        assert_eq!(p.list().len(), 1);
        p.on_notice(state(id, "deactivating", "stop", Reason::Real), &outbox);
        assert_eq!(p.list().len(), 1);
        p.on_notice(state(id, "inactive", "dead", Reason::Real), &outbox);
        assert!(p.list().is_empty());
        assert_eq!(drain(&mut rx), vec![new(id), removed(id)]);
        assert_eq!(
            p.pending_stops(),
            vec![UnitName::new("drover-proxy@bar_db.service").unwrap()]
        );
        // A late duplicate changes nothing.
        p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        assert_eq!(p.pending_stops().len(), 1);

        let fake = FakeSystemd::new();
        fake.add_unit("drover-proxy@bar_db.service", Script::Finish("done".into()));
        let stopper = {
            let p = p.clone();
            let fake = fake.clone();
            tokio::spawn(async move { p.run_stopper(&fake).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !fake
            .calls()
            .contains(&"StopUnit drover-proxy@bar_db.service fail".to_string())
        {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", fake.calls());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(p.pending_stops().is_empty());
        stopper.abort();
    }

    #[tokio::test]
    async fn duplicates_are_refused_and_remove_unknown_is_fine() {
        let outbox = Outbox::default();
        let p = Proxies::default();
        let (_, _reply) = p.create(db(), &outbox).unwrap();
        let err = p.create(db(), &outbox).unwrap_err();
        assert!(err.to_string().starts_with("proxy already exists"), "{err}");
        assert_eq!(p.list().len(), 1, "the refusal changed nothing");
        // Another local unit, node or unit is another proxy.
        let (id2, _r2) = p
            .create(
                key("drover-proxy@bar_db.service", "bar", "db.socket"),
                &outbox,
            )
            .unwrap();
        assert_eq!(id2, 2);
        assert!(!p.remove(
            &key("drover-proxy@baz_db.service", "baz", "db.service"),
            &outbox
        ));
        assert_eq!(p.list().len(), 2);
    }

    #[tokio::test]
    async fn remove_fails_a_waiting_call_and_tells_the_manager() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 3);
        let p = Proxies::default();
        let (id, reply) = p.create(db(), &outbox).unwrap();
        assert!(p.remove(&db(), &outbox));
        let why = reply.await.unwrap().unwrap_err();
        assert!(why.contains("removed"), "{why}");
        assert_eq!(drain(&mut rx), vec![new(id), removed(id)]);
        // And the triple can be created again, with a fresh id.
        let (id2, _r) = p.create(db(), &outbox).unwrap();
        assert_eq!(id2, id + 1);
    }

    #[tokio::test]
    async fn offline_proxies_are_announced_on_every_session_and_removals_catch_up() {
        let outbox = Outbox::default();
        let p = Proxies::default();
        // Created while no session is open: waits, nothing sent.
        let (a, _ra) = p.create(db(), &outbox).unwrap();
        let mut rx = session(&outbox, 1);
        p.on_session(1, &outbox);
        assert_eq!(drain(&mut rx), vec![new(a)]);
        // Calling it twice for one session does not repeat it.
        p.on_session(1, &outbox);
        assert!(drain(&mut rx).is_empty());
        let (b, _rb) = p
            .create(
                key("drover-proxy@bar_x.service", "bar", "x.service"),
                &outbox,
            )
            .unwrap();
        assert_eq!(drain(&mut rx).len(), 1);

        // The link drops; `a` is removed meanwhile; a new session opens.
        outbox.close(1);
        assert!(p.remove(&db(), &outbox));
        let mut rx2 = session(&outbox, 2);
        p.on_session(2, &outbox);
        assert_eq!(
            drain(&mut rx2),
            vec![
                removed(a),
                Event::ProxyNew {
                    node: NodeName::new("bar").unwrap(),
                    unit: UnitName::new("x.service").unwrap(),
                    proxy_id: b,
                    template: ProxyTemplate::Drover,
                }
            ]
        );
        // A proxy removed before the manager ever heard of it is not mentioned.
        outbox.close(2);
        let (c, _rc) = p
            .create(
                key("drover-proxy@bar_y.service", "bar", "y.service"),
                &outbox,
            )
            .unwrap();
        assert!(p.remove(
            &key("drover-proxy@bar_y.service", "bar", "y.service"),
            &outbox
        ));
        let mut rx3 = session(&outbox, 3);
        p.on_session(3, &outbox);
        let got = drain(&mut rx3);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(!format!("{got:?}").contains(&format!("proxy_id: {c}")));
    }

    #[tokio::test]
    async fn an_active_proxy_whose_target_fails_is_stopped_with_a_failure_to_report() {
        let outbox = Outbox::default();
        let _rx = session(&outbox, 3);
        let p = Proxies::default();
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
        reply.await.unwrap().unwrap();
        p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        assert_eq!(p.pending_stops(), vec![db().local]);
        // The stop's RemoveProxy hears why, once.
        assert!(!p.remove(&db(), &outbox), "already forgotten");
        assert_eq!(
            p.take_failure(&db()).as_deref(),
            Some("db.service on node bar is failed (failed)")
        );
        assert_eq!(p.take_failure(&db()), None);

        // A clean stop of the target is no failure of the proxy.
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
        reply.await.unwrap().unwrap();
        p.on_notice(state(id, "inactive", "dead", Reason::Real), &outbox);
        assert_eq!(p.take_failure(&db()), None);

        // A failure not yet reported is dropped by the next start of the proxy.
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
        reply.await.unwrap().unwrap();
        p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        let (_id, _reply) = p.create(db(), &outbox).unwrap();
        assert_eq!(p.take_failure(&db()), None);
    }

    #[tokio::test]
    async fn a_proxy_stopped_while_its_target_node_is_offline_says_so_and_since_when() {
        let outbox = Outbox::default();
        let _rx = session(&outbox, 3);
        let p = Proxies::default();
        let (id, reply) = p.create(db(), &outbox).unwrap();
        // The manager: bar went offline 93 s ago. The proxy keeps waiting.
        p.on_notice(
            Notice::TargetNodeOffline {
                proxy_id: id,
                offline_for_ms: Some(93_000),
            },
            &outbox,
        );
        assert_eq!(p.list()[0].phase, Phase::Waiting);
        assert!(p.remove(&db(), &outbox));
        let why = reply.await.unwrap().unwrap_err();
        assert!(why.starts_with("node bar is offline (since "), "{why}");
        assert!(why.contains(" UTC, 93 s ago)"), "{why}");

        // Back online: the reason goes with it.
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(
            Notice::TargetNodeOffline {
                proxy_id: id,
                offline_for_ms: None,
            },
            &outbox,
        );
        p.on_notice(Notice::TargetNodeOnline { proxy_id: id }, &outbox);
        assert!(p.remove(&db(), &outbox));
        let why = reply.await.unwrap().unwrap_err();
        assert!(why.contains("was removed before"), "{why}");

        // Never connected since the manager started.
        let (id, reply) = p.create(db(), &outbox).unwrap();
        p.on_notice(
            Notice::TargetNodeOffline {
                proxy_id: id,
                offline_for_ms: None,
            },
            &outbox,
        );
        assert!(p.remove(&db(), &outbox));
        let why = reply.await.unwrap().unwrap_err();
        assert_eq!(
            why,
            "node bar is offline (not connected since the manager started)"
        );
        // A node notice for a proxy that is gone changes nothing.
        p.on_notice(Notice::TargetNodeOnline { proxy_id: id }, &outbox);
        assert!(p.list().is_empty());
    }

    #[tokio::test]
    async fn abandoned_waiting_proxy_is_forgotten_but_an_active_one_is_not() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let (a, ra) = p.create(db(), &outbox).unwrap();
        drop(ra);
        p.abandon(a, &outbox);
        assert!(p.list().is_empty());
        assert_eq!(drain(&mut rx), vec![new(a), removed(a)]);

        let (b, rb) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(b, "active", "running", Reason::Real), &outbox);
        assert_eq!(rb.await.unwrap(), Ok(()));
        p.abandon(b, &outbox);
        assert_eq!(p.list().len(), 1, "the helper exits after success");

        // Success arriving after the caller left: nobody will remove it later.
        let (c, rc) = p
            .create(
                key("drover-proxy@bar_x.service", "bar", "x.service"),
                &outbox,
            )
            .unwrap();
        drop(rc);
        p.on_notice(state(c, "active", "running", Reason::Real), &outbox);
        assert_eq!(p.list().len(), 1);
        assert_eq!(p.list()[0].id, b);
    }

    #[tokio::test]
    async fn a_bluechi_and_a_drover_proxy_of_one_target_are_two_proxies() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let bluechi = key("bluechi-proxy@bar_db.service", "bar", "db.service");
        let (b, b_reply) = p.create(bluechi.clone(), &outbox).unwrap();
        let (d, d_reply) = p.create(db(), &outbox).unwrap();
        assert_ne!(b, d);
        assert_eq!(p.list().len(), 2);
        p.on_notice(state(b, "active", "running", Reason::Real), &outbox);
        p.on_notice(state(d, "active", "running", Reason::Real), &outbox);
        assert_eq!(b_reply.await.unwrap(), Ok(()));
        assert_eq!(d_reply.await.unwrap(), Ok(()));
        // Releasing one leaves the other.
        assert!(p.remove(&bluechi, &outbox));
        assert_eq!(p.list().len(), 1);
        assert_eq!(p.list()[0].key, db());
        assert_eq!(
            drain(&mut rx),
            vec![new_of(b, ProxyTemplate::Bluechi), new(d), removed(b)]
        );
        // The target's real stop stops the remaining proxy unit by its own name.
        p.on_notice(state(d, "inactive", "dead", Reason::Real), &outbox);
        assert_eq!(
            p.pending_stops(),
            vec![UnitName::new("drover-proxy@bar_db.service").unwrap()]
        );
    }

    #[test]
    fn parse_accepts_both_families_and_names_the_rest() {
        ProxyKey::parse("bluechi-proxy@bar_db.service", "bar", "db.service").unwrap();
        let e = ProxyKey::parse("hirte-proxy@bar_db.service", "bar", "db.service").unwrap_err();
        assert!(
            e.contains("not an instance of drover-proxy@.service or bluechi-proxy@.service"),
            "{e}"
        );
    }

    #[test]
    fn unit_names_map_back_to_their_proxy() {
        let k = ProxyKey::from_unit_name("drover-proxy@bar_db.service").unwrap();
        assert_eq!((k.node.as_str(), k.unit.as_str()), ("bar", "db.service"));
        let k = ProxyKey::from_unit_name("drover-proxy@bar_my_db.socket.service").unwrap();
        assert_eq!((k.node.as_str(), k.unit.as_str()), ("bar", "my_db.socket"));
        // BlueChi's proxy units are proxies too, of the same targets.
        let k = ProxyKey::from_unit_name("bluechi-proxy@bar_db.service").unwrap();
        assert_eq!(
            (k.local.as_str(), k.node.as_str(), k.unit.as_str()),
            ("bluechi-proxy@bar_db.service", "bar", "db.service")
        );
        for bad in [
            "bluechi-proxy@.service",
            "bluechi-proxy@nounderscore.service",
            "bluechi-dep@db.service",
            "drover-proxy@.service",
            "drover-proxy@bar.service",
            "drover-proxy@_db.service",
            "drover-proxy@bar_.service",
            "drover-proxy@bar_db.socket",
            "other@bar_db.service",
        ] {
            assert!(ProxyKey::from_unit_name(bad).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn adopted_proxies_are_active_announced_and_stopped_on_a_real_stop() {
        let outbox = Outbox::default();
        let p = Proxies::default();
        let id = p.adopt(db(), &outbox).unwrap();
        assert_eq!(p.adopt(db(), &outbox), None, "once");
        assert_eq!(p.list()[0].phase, Phase::Active);
        let mut rx = session(&outbox, 1);
        p.on_session(1, &outbox);
        assert_eq!(drain(&mut rx), vec![new(id)]);
        p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        assert_eq!(drain(&mut rx), vec![removed(id)]);
        assert_eq!(p.pending_stops(), vec![db().local]);
    }

    #[tokio::test]
    async fn shutdown_fails_waiting_keeps_active_and_refuses_new() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let (a, ra) = p.create(db(), &outbox).unwrap();
        p.on_notice(state(a, "active", "running", Reason::Real), &outbox);
        assert_eq!(ra.await.unwrap(), Ok(()));
        let (b, rb) = p
            .create(
                key("drover-proxy@bar_x.service", "bar", "x.service"),
                &outbox,
            )
            .unwrap();
        let kept = p.shutdown(&outbox);
        assert_eq!(
            kept,
            vec![UnitName::new("drover-proxy@bar_db.service").unwrap()]
        );
        assert_eq!(
            rb.await.unwrap(),
            Err("drover-agent is shutting down".into())
        );
        // The active one stays, unannounced as removed: the manager keeps its
        // reference through its grace period, and nothing is stopped here.
        assert_eq!(p.list().len(), 1);
        assert!(p.pending_stops().is_empty());
        let events = drain(&mut rx);
        assert_eq!(events.len(), 3, "two new, one removed: {events:?}");
        assert!(
            matches!(events.last(), Some(Event::ProxyRemoved { proxy_id, .. }) if *proxy_id == b),
            "{events:?}"
        );
        assert!(!events.contains(&removed(a)), "{events:?}");
        assert_eq!(
            p.create(db(), &outbox).unwrap_err(),
            CreateError::ShuttingDown
        );
    }

    fn bluechi_db() -> ProxyKey {
        key("bluechi-proxy@bar_db.service", "bar", "db.service")
    }

    /// A target that fails after its proxies were active: drover's proxy unit
    /// is stopped with the reason for its `RemoveProxy` (it ends `failed`),
    /// BlueChi's without (it ends `inactive`, as BlueChi's). Both are stopped.
    #[tokio::test]
    async fn a_failing_target_ends_a_drover_proxy_failed_and_a_bluechi_one_inactive() {
        let outbox = Outbox::default();
        let mut rx = session(&outbox, 1);
        let p = Proxies::default();
        let (b, b_reply) = p.create(bluechi_db(), &outbox).unwrap();
        let (d, d_reply) = p.create(db(), &outbox).unwrap();
        assert_eq!(
            drain(&mut rx),
            vec![new_of(b, ProxyTemplate::Bluechi), new(d)],
            "each announced with its family"
        );
        for id in [b, d] {
            p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
        }
        assert_eq!(b_reply.await.unwrap(), Ok(()));
        assert_eq!(d_reply.await.unwrap(), Ok(()));
        for id in [b, d] {
            p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        }
        assert_eq!(
            p.pending_stops(),
            vec![bluechi_db().local, db().local],
            "both proxy units are stopped"
        );
        assert_eq!(p.take_failure(&bluechi_db()), None);
        assert!(
            p.take_failure(&db())
                .is_some_and(|why| why.contains("db.service on node bar is failed")),
        );
    }

    /// BlueChi's proxy started ahead of its helper, whose target was active and
    /// then failed before the helper asked: the helper's call succeeds (the
    /// proxy ran, as BlueChi's would have) and the unit is stopped. Drover's
    /// fails the call with the reason.
    #[tokio::test]
    async fn a_bluechi_proxy_started_ahead_completes_then_stops_if_its_target_ran() {
        let outbox = Outbox::default();
        let _rx = session(&outbox, 1);
        let p = Proxies::default();
        let b = p.start_ahead(bluechi_db(), JOB.into(), &outbox).unwrap();
        let d = p
            .start_ahead(db(), "/org/freedesktop/systemd1/job/10".into(), &outbox)
            .unwrap();
        for id in [b, d] {
            p.on_notice(state(id, "active", "running", Reason::Real), &outbox);
            p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        }
        assert!(p.list().is_empty());
        assert!(
            p.pending_stops().is_empty(),
            "nothing to stop before the helpers ask"
        );
        let (_, b_reply) = p.create(bluechi_db(), &outbox).unwrap();
        assert_eq!(b_reply.await.unwrap(), Ok(()));
        assert_eq!(p.pending_stops(), vec![bluechi_db().local]);
        let (_, d_reply) = p.create(db(), &outbox).unwrap();
        assert!(
            d_reply
                .await
                .unwrap()
                .is_err_and(|why| why.contains("db.service on node bar is failed"))
        );
        assert_eq!(p.take_failure(&bluechi_db()), None);
        // A BlueChi proxy whose target never ran fails like drover's.
        p.start_ahead(bluechi_db(), JOB.into(), &outbox).unwrap();
        let id = p.list()[0].id;
        p.on_notice(state(id, "failed", "failed", Reason::Real), &outbox);
        let (_, reply) = p.create(bluechi_db(), &outbox).unwrap();
        assert!(reply.await.unwrap().is_err());
    }
}
