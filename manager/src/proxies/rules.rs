//! Cross-node dependencies, manager side: per target (node B, unit U) the set
//! of references (requesting node A, proxy id), and the rules that turn
//! agents' proxy announcements, target state changes, disconnects, timers and
//! config reloads into actions (notices to requesting agents, dep starts and
//! stops on target agents, unit watches).
//!
//! This module is plain data: no sockets, no bus, no tasks. Inputs are method
//! calls with the current [`Instant`], one file per input: the node
//! lifecycle (`rules/nodes.rs`), requesting agents' announcements
//! (`rules/announcements.rs`), target units' news (`rules/targets.rs`),
//! target agents' dep commands and their outcomes (`rules/deps.rs`), the
//! clock (`rules/timers.rs`), config reloads (`rules/reload.rs`); what is
//! shown comes from `rules/report.rs`. Outputs are [`Action`]s and
//! [`DepCommand`]s that the async glue ([`crate::proxies::driver`]) carries out and
//! whose outcome it feeds back ([`References::dep_result`],
//! [`References::sweep_result`]). Everything here is unit-tested with paused
//! tokio time.
//!
//! # Invariants
//!
//! * One reference per proxy: per (A, B, U) as many as A announces proxies
//!   for that target (A's proxy units are distinct: BlueChi's
//!   `bluechi-proxy@b_u.service` and drover's `drover-proxy@b_u.service` on
//!   one node are two proxies of one target, and each counts). A reference is
//!   keyed by (A, a sequence number of its own), never by the proxy id, which
//!   a new agent process numbers afresh. An announcement of a proxy id A
//!   already has a reference for in this session re-adds that reference; a
//!   new one adds a reference and replaces A's failed or ended ones for that
//!   target (their outcome is old news to a new proxy).
//! * A reference is **live** while it is `waiting` or `active`. The dep unit
//!   `drover-dep@U.service` on B is wanted exactly while (B, U) has a live
//!   reference. Wants are level-triggered and numbered: every (re)add bumps
//!   the generation so `StartDep` is sent again (it covers a dep that stopped
//!   along with its target); the commands for one target are serialised (at
//!   most one in flight), so a `StopDep` can never overtake a later
//!   `StartDep`. Whatever B has not acknowledged in its current session is
//!   sent again when B registers — that is the replay of outstanding dep
//!   starts, and of dep stops that could not be sent while B was offline.
//! * A waiting reference hears nothing of its target until B confirms the dep
//!   start that covers it (news from before that start says nothing about
//!   it); the confirmation replays the target's state as known, and B's agent
//!   sends it only after the target's news up to the end of the start job.
//!   Failing starts reach it as `ProxyError` with B's reason.
//! * **After the confirmation, a down target fails a waiting reference,
//!   however the manager learnt it.** The driver applies the confirmation
//!   only after every target event B sent before it (see
//!   [`crate::proxies::driver`]), so the state known then is the target's
//!   state at the end of the start job or later: if that is `failed` or
//!   `inactive`, the target went down after this start — it is the start's
//!   outcome, not old news. The same holds for a *virtual* down that comes
//!   after the confirmation (B's agent answering a `Subscribe` that reached
//!   it after the start job: a replay of the current state), except
//!   `agent-offline`, which says nothing about the target. Such a reference
//!   fails with `ProxyError` ("db.service on node b is failed (failed)"):
//!   relayed as the virtual state it is, the requesting agent would ignore
//!   it and its proxy would hang `activating` until its start timeout (issue
//!   14 item 6: a target that exits ~4 ms after its start, 3 tries in 75).
//! * **BlueChi's proxy names keep BlueChi's ending.** A `bluechi-proxy@`
//!   reference (the family comes with `ProxyNew`) whose target came up during
//!   its start (B's real `active`, held back as above) and is down when the
//!   start is confirmed, or goes down while the reference still waits, is
//!   told that `active` and then the down as real news: its agent completes
//!   the proxy and stops it, so it ends `inactive` as BlueChi's does (BlueChi
//!   relays the `active` at once). A `drover-proxy@` reference fails with the
//!   reason instead, and so does any reference whose target never came up.
//! * The manager applies the agent's own rule to the target states it relays,
//!   so both sides agree on a proxy's fate without an extra message: a waiting
//!   proxy becomes active when the target is `active` (real or virtual) and
//!   fails on a *real* `failed`/`inactive`/removal; an active proxy ends on a
//!   real `failed`/`inactive`/removal (agent A stops the proxy unit, its later
//!   `ProxyRemoved` finds nothing). Failed and ended references are not live;
//!   they are kept (bounded per requesting node) so that a requesting node
//!   that was away learns the outcome when it re-announces the same proxy, and
//!   so that `ListProxies` can show failures (a failed one for a grace period
//!   after its agent removed it).
//! * Notices go only to the session of A that owns the reference, so a stale
//!   proxy id never reaches a newer agent process.
//!
//! # Disconnects (`ProxyGracePeriod`)
//!
//! * A offline: its references stay for the grace period, then are dropped
//!   (dep stopped if it was the last). A re-announcement from A's next session
//!   within the grace period *resumes* the reference — matched on (A, B, U),
//!   not on the id, which may be new — and nothing is sent to B; A gets the
//!   target's current state (or the outcome it missed) replayed.
//! * B offline: the target states of B become `inactive`/`agent-offline`
//!   (virtual), so no new proxy completes on stale news. Active proxies on B
//!   stay active for the grace period; past it every active reference on B
//!   ends and its requester is told `inactive`/`agent-offline` with reason
//!   `real`, which makes agent A stop the proxy unit. Waiting proxies keep
//!   waiting (their own start timeout bounds them); they are told that B is
//!   offline and for how long (`Notice::TargetNodeOffline`, also for a proxy
//!   announced while B is away), and that it is back when B registers, so a
//!   proxy stopped while it waits can say why (issue 14 item 9).
//! * B registers: every unacknowledged dep want is sent again; one grace
//!   period later the manager sweeps B: every running `drover-dep@` unit that
//!   no live reference wants is stopped. This is what makes a manager restart
//!   leak nothing: the new manager knows no references, agents re-announce
//!   theirs (a re-announced reference only restarts a dep that is already
//!   running, a no-op for systemd), and deps that nobody re-announced within
//!   the grace period are stopped. A dep someone started by hand is stopped
//!   by the sweep as well.
//! * Config reload: references the new `AllowDependenciesOn` (or node list)
//!   no longer permits are dropped at once, their requesters get
//!   `ProxyError`; a new grace period applies to disconnects from then on.

use crate::proxies::stats::{ErrorReason, ProxyStats, Slot, Tally};
use crate::warm_up::WarmUp;
use drover_config::ManagerConfig;
use drover_protocol::ProxyTemplate;
use drover_protocol::health::{Health, HealthState};
use drover_protocol::verdict::{ACTIVE, TargetView, Verdict, is_down, verdict};
use drover_protocol::{NodeName, Notice, Reason, TargetChange, UnitName};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

// The rules, one file per input (each an `impl References`); the state and
// the steps they share are here.
mod announcements;
mod deps;
mod nodes;
mod reload;
mod report;
mod targets;
mod timers;

/// Failed or ended references kept per requesting node for reporting; the
/// oldest go first. Bounds what a misbehaving agent can make us hold.
pub const MAX_DEAD_PER_REQUESTER: usize = 256;

/// The sub state the manager reports for a target whose node is offline.
pub const AGENT_OFFLINE: &str = "agent-offline";

/// Who may depend on whom, and the grace period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    known: HashSet<NodeName>,
    allow: HashMap<NodeName, HashSet<NodeName>>,
    grace: Duration,
}

impl Policy {
    /// `known`: the nodes that exist (the registry's names).
    pub fn new(
        known: impl IntoIterator<Item = NodeName>,
        allow: impl IntoIterator<Item = (NodeName, Vec<NodeName>)>,
        grace: Duration,
    ) -> Self {
        let mut map: HashMap<NodeName, HashSet<NodeName>> = HashMap::new();
        for (a, targets) in allow {
            map.entry(a).or_default().extend(targets);
        }
        Self {
            known: known.into_iter().collect(),
            allow: map,
            grace,
        }
    }

    /// `known`: the registry's names. With certified admission
    /// (`AllowCertifiedNodes`) or a pattern of `AllowedNodeNames` a node may
    /// be admitted before its first registration, so every such node some
    /// node may depend on is known too (unless `Allowed=false` keeps it
    /// out; with patterns, only the names a pattern matches): a requester that registers
    /// first, after a manager restart, waits for such a target as for a
    /// listed one that is offline, instead of failing with "no such node".
    pub fn from_config(config: &ManagerConfig, known: impl IntoIterator<Item = NodeName>) -> Self {
        let certified = config.tls.is_some() && config.allow_certified_nodes;
        let denied = |b: &NodeName| {
            config
                .nodes
                .iter()
                .any(|n| &n.name == b && n.allowed == Some(false))
        };
        let targets: Vec<NodeName> = config
            .nodes
            .iter()
            .flat_map(|n| n.allow_dependencies_on.iter())
            .filter(|b| (certified || config.pattern_matches(b)) && !denied(b))
            .cloned()
            .collect();
        Self::new(
            known.into_iter().chain(targets),
            config
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.allow_dependencies_on.clone())),
            Duration::from_millis(config.proxy_grace_ms()),
        )
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Ok if A may depend on units of B; else the one-line reason for A.
    pub fn check(&self, a: &NodeName, b: &NodeName) -> Result<(), String> {
        if !self.known.contains(b) {
            return Err(format!("no such node {b}"));
        }
        if self.allow.get(a).is_some_and(|set| set.contains(b)) {
            Ok(())
        } else {
            Err(format!(
                "node {a} may not depend on units of node {b}: add {b} to AllowDependenciesOn in [node {a}]"
            ))
        }
    }
}

/// What the glue must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send `notice` to node `to`, if `session` is still its session.
    Notify {
        to: NodeName,
        session: u64,
        notice: Notice,
    },
    /// Start forwarding state changes of (node, unit) to
    /// [`References::target_event`]; the known state is fed in the same way.
    Watch {
        node: NodeName,
        unit: UnitName,
    },
    Unwatch {
        node: NodeName,
        unit: UnitName,
    },
    /// List B's units and report its running dep units with
    /// [`References::sweep_result`] (`session` guards against a newer one).
    Sweep {
        node: NodeName,
        session: u64,
    },
}

/// `StartDep`/`StopDep` to send to `node`; report the outcome with
/// [`References::dep_result`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepCommand {
    pub node: NodeName,
    pub unit: UnitName,
    pub start: bool,
    pub generation: u64,
    /// B's session the command is for.
    pub session: u64,
}

/// How a [`DepCommand`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DepOutcome {
    Done,
    /// B went away before answering: sent again when it registers.
    Offline,
    /// The agent (or its systemd) refused: the message goes to the waiting
    /// requesters of a `StartDep`.
    Failed(String),
}

/// One row of `ListProxies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRow {
    pub requester: NodeName,
    pub node: NodeName,
    pub unit: UnitName,
    /// `waiting`, `active` or `failed`.
    pub state: &'static str,
    /// The target's active state as last known, or `unknown`.
    pub target_state: String,
    /// Live references on the target.
    pub references: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum Known {
    Unknown,
    Loaded {
        active: String,
        sub: String,
        reason: Reason,
    },
    Removed,
}

#[derive(Debug, Clone, PartialEq)]
enum RefState {
    Waiting,
    Active,
    /// The proxy failed; the message is what its requester was (or will be)
    /// told.
    Failed(String),
    /// The target really stopped after the proxy was active; the change is
    /// what its requester was (or will be) told.
    Ended(TargetChange),
}

impl RefState {
    fn is_live(&self) -> bool {
        matches!(self, RefState::Waiting | RefState::Active)
    }
}

#[derive(Debug)]
struct Ref {
    proxy_id: u64,
    /// The family of A's proxy unit: how the proxy ends when its target
    /// comes up during its start and goes down again ([`ran_then_down`]).
    template: ProxyTemplate,
    /// A's session that announced (or resumed) it.
    session: u64,
    state: RefState,
    /// The want generation of its (re)add: a failed `StartDep` fails only the
    /// waiting references it was sent for.
    added_gen: u64,
    /// Set while A is offline: dropped at this instant.
    grace_until: Option<Instant>,
    /// Its count in [`ProxyStats`]: moved by the state changes below.
    tally: Tally,
}

impl Ref {
    fn activate(&mut self) {
        self.state = RefState::Active;
        self.tally.set(Slot::Active, None);
    }

    fn fail(&mut self, message: String, reason: ErrorReason) {
        self.state = RefState::Failed(message);
        self.tally.set(Slot::Failed, Some(reason));
    }

    fn end(&mut self, change: TargetChange) {
        self.state = RefState::Ended(change);
        self.tally.set(Slot::Ended, None);
    }

    /// `notice` (given the proxy id) for requester `a`, if `a` is online
    /// (`online`, its current session) in the session that made this
    /// reference: a proxy of an older session is gone.
    fn notice(
        &self,
        a: &NodeName,
        online: Option<u64>,
        notice: impl FnOnce(u64) -> Notice,
    ) -> Option<Action> {
        (online == Some(self.session)).then(|| Action::Notify {
            to: a.clone(),
            session: self.session,
            notice: notice(self.proxy_id),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Want {
    running: bool,
    generation: u64,
}

/// A reference's key in its target: the requesting node and the reference's
/// own sequence number (kept when a re-announcement resumes it; the order of
/// insertion, so the oldest dead references are evicted first).
type RefKey = (NodeName, u64);

#[derive(Debug)]
struct Target {
    refs: BTreeMap<RefKey, Ref>,
    known: Known,
    watched: bool,
    /// `generation == 0`: no dep was ever wanted here, nothing to send.
    want: Want,
    /// What B acknowledged in its current session.
    acked: Option<Want>,
    in_flight: bool,
    /// B's real `active` of the target that came while a dep start not yet
    /// confirmed was wanted, with that want's generation: the target ran
    /// during the start (see [`ran_then_down`]).
    ran: Option<(u64, TargetChange)>,
    /// The target's last health (`none` until it says otherwise): a
    /// reference is up once the target is active and its health passes
    /// ([`drover_protocol::verdict::TargetView`]).
    health: Health,
}

impl Target {
    fn new() -> Self {
        Self {
            refs: BTreeMap::new(),
            known: Known::Unknown,
            watched: false,
            want: Want {
                running: false,
                generation: 0,
            },
            acked: None,
            in_flight: false,
            ran: None,
            health: Health::default(),
        }
    }

    fn live(&self) -> usize {
        self.refs.values().filter(|r| r.state.is_live()).count()
    }

    fn needs_command(&self) -> bool {
        self.want.generation > 0 && !self.in_flight && self.acked != Some(self.want)
    }

    /// What an announcement of `proxy_id` by `a` in `session` is to this
    /// target's references (see the module docs).
    fn announcement(&self, a: &NodeName, proxy_id: u64, session: u64) -> Announcement {
        let mine = || self.refs.iter().filter(move |((n, _), _)| n == a);
        if let Some(((_, seq), r)) = mine().find(|(_, r)| r.proxy_id == proxy_id) {
            return match (r.state.is_live(), r.session == session) {
                (true, false) => Announcement::Resume(*seq),
                (false, _) => Announcement::TellAgain(*seq),
                (true, true) => Announcement::Readd(Some(*seq)),
            };
        }
        // Another process (or session) of A re-announcing: any of A's live
        // references not yet resumed in this session stands for it; they
        // are alike (same requester, same target).
        mine()
            .find(|(_, r)| r.state.is_live() && r.session != session)
            .map_or(Announcement::Readd(None), |((_, seq), _)| {
                Announcement::Resume(*seq)
            })
    }

    /// Forgets `a`'s failed and ended references.
    fn drop_dead_of(&mut self, a: &NodeName) {
        self.refs.retain(|(n, _), r| n != a || r.state.is_live());
    }

    fn removable(&self) -> bool {
        self.refs.is_empty()
            && !self.watched
            && !self.in_flight
            && (self.want.generation == 0 || self.acked == Some(self.want))
            && !self.want.running
    }
}

/// See [`Target::announcement`].
enum Announcement {
    /// A live reference of an earlier session: resume it.
    Resume(u64),
    /// The same proxy after it failed or ended: tell it again.
    TellAgain(u64),
    /// (Re)add: a new reference, replacing the one given.
    Readd(Option<u64>),
}

pub struct References {
    policy: Policy,
    /// Online nodes and their session ids.
    online: HashMap<NodeName, u64>,
    targets: BTreeMap<(NodeName, UnitName), Target>,
    /// Target nodes that are offline: when their active proxies end.
    offline_until: HashMap<NodeName, Instant>,
    /// Nodes that went offline: since when (what a waiting proxy is told).
    /// A node in neither this nor `online` has not connected since we started.
    offline_since: HashMap<NodeName, Instant>,
    /// Orphan-dep sweeps due: node → (session, when).
    sweeps: HashMap<NodeName, (u64, Instant)>,
    /// The nodes that may depend on others, awaited after a start: a
    /// target's sweep waits while one that may depend on it is awaited.
    warm_up: WarmUp,
    next_gen: u64,
    next_seq: u64,
    /// What the metrics endpoint shows, counted as things change.
    stats: Arc<ProxyStats>,
}

/// Whether B confirmed a dep start at least as new as `generation`.
fn covers(acked: Option<Want>, generation: u64) -> bool {
    acked.is_some_and(|w| w.running && w.generation >= generation)
}

impl References {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            online: HashMap::new(),
            targets: BTreeMap::new(),
            offline_until: HashMap::new(),
            offline_since: HashMap::new(),
            sweeps: HashMap::new(),
            warm_up: WarmUp::over(),
            next_gen: 1,
            next_seq: 1,
            stats: Arc::default(),
        }
    }

    /// After a manager start (or when it starts to lead): until every node
    /// that may depend on others and is not online registered, or `until`
    /// passed, no orphan-dep sweep runs on a node that one of the absent
    /// ones may depend on (its deps may be wanted by references it has not
    /// re-announced yet).
    pub fn warm_up_until(mut self, until: Instant) -> Self {
        self.restart_warm_up(until);
        self
    }

    /// See [`References::warm_up_until`].
    pub fn restart_warm_up(&mut self, until: Instant) {
        let requesters = self
            .policy
            .allow
            .iter()
            .filter(|(a, targets)| !targets.is_empty() && !self.online.contains_key(*a))
            .map(|(a, _)| a.clone());
        self.warm_up = WarmUp::new(requesters, until);
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The figures counted as references change (read without a lock).
    pub fn stats(&self) -> Arc<ProxyStats> {
        self.stats.clone()
    }

    fn bump(&mut self) -> u64 {
        let g = self.next_gen;
        self.next_gen += 1;
        g
    }

    fn session_of(&self, node: &NodeName) -> Option<u64> {
        self.online.get(node).copied()
    }

    // ---- internals --------------------------------------------------------

    /// Tells reference `rk` (of node A) on (b, unit), if it waits, that B is
    /// offline and for how long, when B is offline.
    fn tell_node_offline(
        &self,
        rk: &RefKey,
        b: &NodeName,
        unit: &UnitName,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if self.online.contains_key(b) {
            return;
        }
        let Some(r) = self
            .targets
            .get(&(b.clone(), unit.clone()))
            .and_then(|t| t.refs.get(rk))
            .filter(|r| r.state == RefState::Waiting)
        else {
            return;
        };
        let offline_for_ms = self.offline_since.get(b).map(|since| {
            u64::try_from(now.saturating_duration_since(*since).as_millis()).unwrap_or(u64::MAX)
        });
        let a = &rk.0;
        out.extend(r.notice(a, self.session_of(a), |proxy_id| {
            Notice::TargetNodeOffline {
                proxy_id,
                offline_for_ms,
            }
        }));
    }

    /// Replays the known target state to reference `rk` on (b, unit), and
    /// applies the agent's rule to it (a known `active` completes it). Not to
    /// a waiting reference whose dep start B has not confirmed yet (see
    /// `target_event`).
    fn replay(&mut self, rk: &RefKey, b: &NodeName, unit: &UnitName, out: &mut Vec<Action>) {
        let a = &rk.0;
        let online = self.session_of(a);
        let Some(target) = self.targets.get_mut(&(b.clone(), unit.clone())) else {
            return;
        };
        let acked = target.acked;
        let Some(r) = target.refs.get_mut(rk) else {
            return;
        };
        if r.state == RefState::Waiting && !covers(acked, r.added_gen) {
            return;
        }
        let Known::Loaded { active, sub, .. } = &target.known else {
            return;
        };
        // A down state known once the start is confirmed is that start's
        // outcome (see the module docs), not news to ignore.
        if r.state == RefState::Waiting
            && let Some(message) = down_after_start(
                unit,
                b,
                &TargetChange::State {
                    active_state: active.clone(),
                    sub_state: sub.clone(),
                    reason: Reason::Virtual,
                },
            )
        {
            let down = TargetChange::State {
                active_state: active.clone(),
                sub_state: sub.clone(),
                reason: Reason::Real,
            };
            let ran = target.ran.as_ref();
            if !ran_then_down(r, ran, &target.health, (a, online), (b, unit), &down, out) {
                fail_waiting(r, a, online, message, out);
            }
            return;
        }
        // Its health first: a target with a check is never taken for one
        // without (`drover_protocol::verdict`).
        let health = (target.health.state != HealthState::None)
            .then(|| TargetChange::Health(target.health.clone()));
        let changes = health.into_iter().chain([
            TargetChange::New {
                reason: Reason::Virtual,
            },
            TargetChange::State {
                active_state: active.clone(),
                sub_state: sub.clone(),
                reason: Reason::Virtual,
            },
        ]);
        // The view the requester's new proxy builds from these same changes.
        let mut view = TargetView::default();
        for change in changes {
            out.extend(r.notice(a, online, |proxy_id| Notice::ProxyTarget {
                proxy_id,
                change: change.clone(),
            }));
            let v = view.apply(&change);
            apply_rule(r, b, unit, &change, v);
        }
    }

    /// Brings watch and want of (b, unit) in line with its live references,
    /// and forgets the target once nothing is left to do for it.
    fn settle(&mut self, b: &NodeName, unit: &UnitName, out: &mut Vec<Action>) {
        let key = (b.clone(), unit.clone());
        let Some(target) = self.targets.get_mut(&key) else {
            return;
        };
        let live = target.live();
        if live > 0 && !target.watched {
            target.watched = true;
            self.stats.target_watched(true);
            out.push(Action::Watch {
                node: b.clone(),
                unit: unit.clone(),
            });
        } else if live == 0 && target.watched {
            target.watched = false;
            self.stats.target_watched(false);
            target.known = Known::Unknown;
            target.health = Health::default();
            out.push(Action::Unwatch {
                node: b.clone(),
                unit: unit.clone(),
            });
        }
        if live == 0 && target.want.running {
            let generation = self.next_gen;
            self.next_gen += 1;
            target.want = Want {
                running: false,
                generation,
            };
        }
        if target.removable() {
            self.targets.remove(&key);
        }
    }

    /// Keeps at most [`MAX_DEAD_PER_REQUESTER`] failed/ended references of `a`.
    fn evict_dead(&mut self, a: &NodeName) {
        loop {
            let dead: Vec<(u64, (NodeName, UnitName))> = self
                .targets
                .iter()
                .flat_map(|(key, t)| {
                    t.refs
                        .iter()
                        .filter(|((n, _), r)| n == a && !r.state.is_live())
                        .map(|((_, seq), _)| (*seq, key.clone()))
                })
                .collect();
            if dead.len() <= MAX_DEAD_PER_REQUESTER {
                return;
            }
            let Some((seq, key)) = dead.into_iter().min_by_key(|(seq, _)| *seq) else {
                return;
            };
            if let Some(t) = self.targets.get_mut(&key) {
                t.refs.remove(&(a.clone(), seq));
            }
            let mut sink = Vec::new();
            self.settle(&key.0, &key.1, &mut sink);
        }
    }
}

/// For a waiting reference whose dep start B confirmed: the reason to fail
/// it when `change` says the target is down, but is a virtual state the
/// verdict rule would ignore (a real one fails the reference by that rule).
/// `agent-offline` says nothing about the target and fails nothing.
fn down_after_start(unit: &UnitName, b: &NodeName, change: &TargetChange) -> Option<String> {
    match change {
        TargetChange::State {
            active_state,
            sub_state,
            reason: Reason::Virtual,
        } if is_down(active_state) && sub_state != AGENT_OFFLINE => Some(format!(
            "{unit} on node {b} is {active_state} ({sub_state})"
        )),
        _ => None,
    }
}

/// How a `bluechi-proxy@` reference ends when its target came up during its
/// start (`ran`: B's real `active`, held back until the start was confirmed)
/// and is down now (`down`, as real news): as BlueChi's proxy does, which
/// heard that `active` at once — it is told the `active` (its agent
/// completes the proxy) and then the down (its agent stops the proxy unit,
/// which ends `inactive`). Returns false, doing nothing, for any other
/// reference: a `drover-proxy@` one, or a target that never came up (a
/// oneshot failing in its start, which fails BlueChi's proxy too), fails
/// with the reason.
///
/// A target with a check is told its `health` first, as in a replay: both
/// sides judge the `active` against it ([`TargetView`]), so a target that ran
/// but never turned healthy fails the reference (health is drover's, and a
/// proxy waits for it whatever its family).
fn ran_then_down(
    r: &mut Ref,
    ran: Option<&(u64, TargetChange)>,
    health: &Health,
    (a, online): (&NodeName, Option<u64>),
    (b, unit): (&NodeName, &UnitName),
    down: &TargetChange,
    out: &mut Vec<Action>,
) -> bool {
    let Some((generation, up)) = ran else {
        return false;
    };
    if r.template != ProxyTemplate::Bluechi
        || r.state != RefState::Waiting
        || *generation < r.added_gen
    {
        return false;
    }
    let health = (health.state != HealthState::None).then(|| TargetChange::Health(health.clone()));
    let mut view = TargetView::default();
    for change in health.iter().chain([up, down]) {
        out.extend(r.notice(a, online, |proxy_id| Notice::ProxyTarget {
            proxy_id,
            change: change.clone(),
        }));
        let v = view.apply(change);
        apply_rule(r, b, unit, change, v);
    }
    true
}

/// `change` as real news (a virtual down that is a start's outcome, told
/// as such to a reference that ends with it).
fn real_down(change: &TargetChange) -> TargetChange {
    match change {
        TargetChange::State {
            active_state,
            sub_state,
            ..
        } => TargetChange::State {
            active_state: active_state.clone(),
            sub_state: sub_state.clone(),
            reason: Reason::Real,
        },
        other => other.clone(),
    }
}

/// Fails a waiting reference with `message`, told to its requester.
fn fail_waiting(
    r: &mut Ref,
    a: &NodeName,
    online: Option<u64>,
    message: String,
    out: &mut Vec<Action>,
) {
    out.extend(r.notice(a, online, |proxy_id| Notice::ProxyError {
        proxy_id,
        message: message.clone(),
    }));
    r.fail(message, ErrorReason::TargetDown);
}

/// The agent's rule for one reference and one target change: the agent's own
/// rule ([`drover_protocol::verdict`]) applied to one reference, so both
/// sides agree on the proxy's fate.
///
/// `v` is the change's verdict against what is known of the target (its
/// [`TargetView`]): `Up` only once it is active and its health passes. An
/// `Unhealthy` verdict changes no reference: a waiting one keeps waiting
/// (its proxy's start timeout ends it, with the reason), an active one is
/// the requesting agent's to stop, where its unit asks for that.
fn apply_rule(r: &mut Ref, b: &NodeName, unit: &UnitName, change: &TargetChange, v: Verdict) {
    match r.state {
        RefState::Waiting if v == Verdict::Up => r.activate(),
        RefState::Waiting if v == Verdict::RealDown => {
            let what = match change {
                TargetChange::State { active_state, .. } => active_state.as_str(),
                _ => "removed",
            };
            r.fail(
                format!("unit {unit} on node {b} is {what}"),
                ErrorReason::TargetDown,
            );
        }
        RefState::Active if v == Verdict::RealDown => r.end(change.clone()),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
