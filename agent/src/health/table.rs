//! The health of this node's units and of the node itself: what each unit
//! declares, its check's state machine ([`super::machine`]), and what the
//! manager was told. Bookkeeping under one mutex; every method returns the
//! [`Actions`] it decided (events to send, checks to start, units to restart
//! or stop), and the driver ([`super::driver`]) carries them out.
//!
//! Invariants:
//! * **Only changes travel.** An event is produced when a unit's state
//!   changes (or it appears with a check, or loses it: `none`), never for a
//!   check run that confirms the state; the node's health is sent when its
//!   verdict, its `SystemState` or one of its checks' states changes.
//! * **One runner per check.** A check runs while its unit is active and
//!   declares it; every start gets a new generation, and a result or expiry
//!   from an older generation is ignored, so a stopped or replaced runner can
//!   never change a verdict. Runner tasks are owned here and aborted when
//!   their check stops.
//! * **Declared on the node only.** Checks come from unit files (and
//!   `agent.conf`), never from the network; a bad declaration is the unit's
//!   health (`unhealthy`, naming file, line and key) and runs nothing.
//! * **Bounded.** At most [`MAX_CHECKED`] units with a declaration; beyond
//!   it, new ones are refused with a warning (one per unit name is not kept).

use super::machine::{Machine, NOT_ACTIVE, Outcome, Rules};
use drover_config::health::{CheckSpec, OnFailure, Probe, UnitDeclaration};
use drover_protocol::health::{NodeCheck, NodeHealth, UnitHealth};
use drover_protocol::{Health, HealthState, UnitName};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How the unit hub is made to follow every unit's signals for health (a
/// hold of `*` on the unit stream, `crate::units::hub`), handed in by the
/// wiring.
pub type Follow = Box<dyn Fn() -> Following + Send + Sync>;

/// The start of the unit hub's stream, under way.
pub type Following =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Most units with a health declaration followed.
pub const MAX_CHECKED: usize = drover_protocol::health::UNITS_MAX;

/// Reason while a pushed unit waits for its first report.
pub const NO_REPORT_YET: &str = "no report yet";

/// Whose check.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Unit(UnitName),
    /// A node check of `agent.conf`, by name.
    Node(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Unit(u) => write!(f, "{u}"),
            Key::Node(n) => write!(f, "node check {n}"),
        }
    }
}

/// A check to start: run `spec` for `key` until its generation is replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub key: Key,
    pub generation: u64,
    pub spec: CheckSpec,
}

/// What the driver must do after a table call, in order.
#[derive(Debug, Default, PartialEq)]
pub struct Actions {
    /// Unit health changes to send.
    pub units: Vec<(UnitName, Health)>,
    /// The node's health changed: send it.
    pub node: Option<NodeHealth>,
    /// Checks to start (each in a task of its own).
    pub starts: Vec<Start>,
    /// Pushed units whose report expires: (unit, generation, when).
    pub expiries: Vec<(UnitName, u64, Instant)>,
    /// Units that turned unhealthy and ask systemd for a restart or stop.
    pub on_failure: Vec<(UnitName, OnFailure, String)>,
}

impl Actions {
    pub fn is_empty(&self) -> bool {
        *self == Actions::default()
    }

    /// Appends `other`'s actions to these (the later node health wins).
    pub fn merge_from(&mut self, other: Actions) {
        self.units.extend(other.units);
        if other.node.is_some() {
            self.node = other.node;
        }
        self.starts.extend(other.starts);
        self.expiries.extend(other.expiries);
        self.on_failure.extend(other.on_failure);
    }
}

/// Why a pushed report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error(
        "{0} declares no pushed health (HealthPush=yes in its [X-Drover] section), or is not loaded"
    )]
    NotPushed(UnitName),
    #[error("{0} is not active; its health is reported while it runs")]
    NotActive(UnitName),
}

enum Declared {
    Bad(String),
    Check {
        spec: Box<CheckSpec>,
        machine: Machine,
    },
}

struct Entry {
    declared: Declared,
    state: HealthState,
    reason: String,
    changed_at: Instant,
    active: bool,
    generation: u64,
    runner: Option<JoinHandle<()>>,
    /// Pushed units: the state of the last report and when it expires.
    pushed: Option<(HealthState, Instant)>,
}

impl Entry {
    fn health(&self, now: Instant) -> Health {
        Health::new(self.state, &self.reason, ms_since(self.changed_at, now))
    }

    fn stop_runner(&mut self) {
        if let Some(task) = self.runner.take() {
            task.abort();
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.stop_runner();
    }
}

fn ms_since(then: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(then).as_millis()).unwrap_or(u64::MAX)
}

fn rules(spec: &CheckSpec) -> Rules {
    Rules {
        retries: spec.retries,
        start_period: spec.start_period,
        interval: spec.interval,
        startup_interval: spec.startup_interval,
    }
}

struct NodeCheckState {
    spec: CheckSpec,
    machine: Machine,
    generation: u64,
    runner: Option<JoinHandle<()>>,
    changed_at: Instant,
}

#[derive(Default)]
struct Inner {
    units: BTreeMap<UnitName, Entry>,
    stop_when_unhealthy: HashSet<UnitName>,
    node_checks: BTreeMap<String, NodeCheckState>,
    system_state: String,
    /// The node's health as last produced, and since when.
    node: Option<NodeHealth>,
    node_changed_at: Option<Instant>,
    next_generation: u64,
    full_logged: bool,
}

/// See the module docs.
#[derive(Default)]
pub struct HealthTable {
    inner: Mutex<Inner>,
    /// The systemd bus health works on (unset: no health).
    /// Taken away when the agent stops ([`HealthTable::stop`]): the bus's
    /// object server holds the agent's state, which holds this, so keeping
    /// it would keep the connection, and the agent's bus name, forever.
    bus: Mutex<Option<zbus::Connection>>,
    /// Units last seen `failed` (their coming and going changes `SystemState`).
    failed: Mutex<HashSet<UnitName>>,
    /// How the unit hub's stream is started (`Follow`).
    follow: std::sync::OnceLock<Follow>,
    /// Units whose declaration was read since systemd loaded them (at most
    /// [`MAX_READ`]).
    read: Mutex<HashSet<UnitName>>,
    /// Cancelled when the agent stops: the tasks that hold the bus
    /// connection (the reload watcher) end with it, so the connection and
    /// the agent's bus name go with the agent.
    stopped: tokio_util::sync::CancellationToken,
    /// Units to look at while the hub does not follow the units.
    pub lookups: super::lookups::Lookups,
    /// The ports units declare (read with their declarations).
    pub ports: super::ports::PortsBook,
    /// The unit stream follows every unit for health (`Follow` succeeded).
    holding: std::sync::atomic::AtomicBool,
}

/// Most units remembered as read (a unit beyond it is read at each start).
pub const MAX_READ: usize = 65_536;

impl Inner {
    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Records `entry`'s new state and the event for it.
    fn changed(
        actions: &mut Actions,
        unit: &UnitName,
        entry: &mut Entry,
        state: HealthState,
        reason: &str,
        now: Instant,
    ) {
        if entry.state == state {
            return;
        }
        entry.state = state;
        drover_protocol::health::cut_reason(reason).clone_into(&mut entry.reason);
        entry.changed_at = now;
        actions.units.push((unit.clone(), entry.health(now)));
    }

    /// Starts or stops `unit`'s runner to match its activity.
    fn run_or_stop(&mut self, actions: &mut Actions, unit: &UnitName, now: Instant) {
        let generation = self.generation();
        let Some(entry) = self.units.get_mut(unit) else {
            return;
        };
        entry.stop_runner();
        entry.generation = generation;
        entry.pushed = None;
        let Declared::Check { spec, machine } = &mut entry.declared else {
            return;
        };
        let (state, reason) = if entry.active {
            machine.activate(now);
            if spec.probe != Probe::Push {
                actions.starts.push(Start {
                    key: Key::Unit(unit.clone()),
                    generation,
                    spec: (**spec).clone(),
                });
                (HealthState::Starting, String::new())
            } else {
                (HealthState::Starting, NO_REPORT_YET.to_owned())
            }
        } else {
            machine.deactivate();
            (HealthState::Starting, NOT_ACTIVE.to_owned())
        };
        // A fresh activation is `starting`, whatever the reason says.
        let entry = self.units.get_mut(unit).expect("present above");
        if entry.state != state {
            Self::changed(actions, unit, entry, state, &reason, now);
        } else {
            entry.reason = reason;
        }
    }

    fn node_health(&mut self, now: Instant) -> Option<NodeHealth> {
        let checks: Vec<NodeCheck> = self
            .node_checks
            .iter()
            .map(|(name, c)| NodeCheck {
                name: name.clone(),
                health: Health::new(
                    c.machine.state(),
                    c.machine.reason(),
                    ms_since(c.changed_at, now),
                ),
            })
            .collect();
        let (state, reason) = NodeHealth::summarize(&self.system_state, &checks);
        let same = self.node.as_ref().is_some_and(|old| {
            old.health.state == state
                && old.system_state == self.system_state
                && old.checks.len() == checks.len()
                && old
                    .checks
                    .iter()
                    .zip(&checks)
                    .all(|(a, b)| a.name == b.name && a.health.state == b.health.state)
        });
        if same {
            return None;
        }
        let changed_at = match (&self.node, self.node_changed_at) {
            (Some(old), Some(at)) if old.health.state == state => at,
            _ => now,
        };
        self.node_changed_at = Some(changed_at);
        let health = NodeHealth {
            health: Health::new(state, &reason, ms_since(changed_at, now)),
            system_state: self.system_state.clone(),
            checks,
        };
        self.node = Some(health.clone());
        Some(health)
    }
}

impl HealthTable {
    /// Health works on `conn` from now on (set once, never after a stop).
    pub fn set_bus(&self, conn: zbus::Connection) {
        let mut bus = self.bus.lock().unwrap_or_else(|p| p.into_inner());
        if bus.is_none() && !self.stopped.is_cancelled() {
            *bus = Some(conn);
        }
    }

    /// The agent stops: see `stopped`.
    pub fn stop(&self) {
        self.stopped.cancel();
        self.bus.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Cancelled once the agent stops.
    pub fn stopped(&self) -> tokio_util::sync::CancellationToken {
        self.stopped.clone()
    }

    /// The systemd bus, once health runs.
    pub fn bus(&self) -> Option<zbus::Connection> {
        self.bus.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes whether `unit` is `failed` now; true when that changed (so
    /// `SystemState` may have).
    pub fn note_failed(&self, unit: &UnitName, failed: bool) -> bool {
        let mut set = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed {
            set.insert(unit.clone())
        } else {
            set.remove(unit)
        }
    }

    /// True the first time `unit` is seen starting since it was loaded (its
    /// declaration is to be read now); remembers it.
    pub fn first_start(&self, unit: &UnitName) -> bool {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if read.len() >= MAX_READ && !read.contains(unit) {
            return true;
        }
        read.insert(unit.clone())
    }

    /// Whether `unit`'s declaration was read since it was loaded.
    pub fn was_read(&self, unit: &UnitName) -> bool {
        self.read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(unit)
    }

    /// systemd unloaded `unit`: its declaration goes (`none`), and it is read
    /// again at its next start.
    pub fn unloaded(&self, unit: &UnitName, now: Instant) -> Actions {
        self.read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(unit);
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(unit);
        self.forget(unit, now)
    }

    /// `Follow` succeeded: the unit stream follows every unit.
    pub fn set_holding(&self) {
        self.holding
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the unit stream follows every unit for health.
    pub fn holding(&self) -> bool {
        self.holding.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How the unit hub's stream starts (set once, by the driver).
    pub fn set_follow(&self, follow: Follow) {
        let _ = self.follow.set(follow);
    }

    /// Starts the unit hub's stream, if it can be.
    pub fn follow(&self) -> Option<Following> {
        self.follow.get().map(|f| f())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Sections under the lock do not panic; a poisoned lock still holds
        // consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `unit`'s unit files declare (`Err`: the first problem, naming
    /// file, line and key), and whether it is active now. A declaration equal
    /// to the known one changes nothing (a daemon-reload that left the unit
    /// alone keeps its verdict and its runner).
    pub fn declare(
        &self,
        unit: &UnitName,
        declaration: Result<UnitDeclaration, String>,
        active: bool,
        now: Instant,
    ) -> Actions {
        let mut actions = Actions::default();
        let mut t = self.lock();
        let declared = match declaration {
            Ok(d) => {
                if d.stop_when_unhealthy {
                    t.stop_when_unhealthy.insert(unit.clone());
                } else {
                    t.stop_when_unhealthy.remove(unit);
                }
                match d.check {
                    Some(spec) => Ok(spec),
                    None => {
                        drop(t);
                        return self.forget(unit, now);
                    }
                }
            }
            Err(why) => Err(why),
        };
        if let Some(entry) = t.units.get_mut(unit) {
            let same = match (&entry.declared, &declared) {
                (Declared::Check { spec, .. }, Ok(new)) => **spec == *new,
                (Declared::Bad(old), Err(new)) => old == new,
                _ => false,
            };
            if same {
                drop(t);
                return self.set_active(unit, active, now);
            }
        } else if t.units.len() >= MAX_CHECKED {
            if !t.full_logged {
                t.full_logged = true;
                tracing::warn!(
                    "more than {MAX_CHECKED} units declare health checks; {unit} and later ones are not checked"
                );
            }
            return actions;
        }
        let generation = t.generation();
        let entry = t.units.entry(unit.clone()).or_insert_with(|| Entry {
            declared: Declared::Bad(String::new()),
            state: HealthState::None,
            reason: String::new(),
            changed_at: now,
            active,
            generation,
            runner: None,
            pushed: None,
        });
        entry.stop_runner();
        entry.active = active;
        match declared {
            Err(why) => {
                tracing::warn!("{unit}: bad [X-Drover] section: {why}");
                // A new reason is news even when the state stays unhealthy.
                entry.state = HealthState::None;
                entry.declared = Declared::Bad(why.clone());
                Inner::changed(&mut actions, unit, entry, HealthState::Unhealthy, &why, now);
            }
            Ok(spec) => {
                let machine = Machine::new(rules(&spec));
                entry.declared = Declared::Check {
                    spec: Box::new(spec),
                    machine,
                };
                // Re-declared: start from `starting`, announced once.
                if entry.state != HealthState::Starting {
                    entry.state = HealthState::None;
                }
                t.run_or_stop(&mut actions, unit, now);
            }
        }
        actions
    }

    /// `unit` became active or stopped being so.
    pub fn set_active(&self, unit: &UnitName, active: bool, now: Instant) -> Actions {
        let mut actions = Actions::default();
        let mut t = self.lock();
        let Some(entry) = t.units.get_mut(unit) else {
            return actions;
        };
        if entry.active == active {
            return actions;
        }
        entry.active = active;
        if matches!(entry.declared, Declared::Check { .. }) {
            t.run_or_stop(&mut actions, unit, now);
        }
        actions
    }

    /// `unit` has no declaration any more (unloaded, or its check removed):
    /// its health is `none`.
    pub fn forget(&self, unit: &UnitName, now: Instant) -> Actions {
        let mut actions = Actions::default();
        let mut t = self.lock();
        if let Some(mut entry) = t.units.remove(unit)
            && entry.state != HealthState::None
        {
            Inner::changed(&mut actions, unit, &mut entry, HealthState::None, "", now);
        }
        actions
    }

    /// Forgets every unit `keep` says no (units no longer loaded).
    pub fn retain(&self, keep: impl Fn(&UnitName) -> bool, now: Instant) -> Actions {
        let gone: Vec<UnitName> = {
            let t = self.lock();
            let mut gone: Vec<UnitName> = t.units.keys().filter(|u| !keep(u)).cloned().collect();
            gone.extend(t.stop_when_unhealthy.iter().filter(|u| !keep(u)).cloned());
            gone
        };
        self.read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|u| keep(u));
        let mut actions = Actions::default();
        for unit in gone {
            self.lock().stop_when_unhealthy.remove(&unit);
            actions.merge_from(self.forget(&unit, now));
        }
        actions
    }

    /// Registers the runner task of `start`; aborts it if its generation is
    /// already replaced.
    pub fn attach(&self, key: &Key, generation: u64, task: JoinHandle<()>) {
        let mut t = self.lock();
        let slot = match key {
            Key::Unit(unit) => t
                .units
                .get_mut(unit)
                .filter(|e| e.generation == generation)
                .map(|e| &mut e.runner),
            Key::Node(name) => t
                .node_checks
                .get_mut(name)
                .filter(|c| c.generation == generation)
                .map(|c| &mut c.runner),
        };
        match slot {
            Some(slot) => {
                if let Some(old) = slot.replace(task) {
                    old.abort();
                }
            }
            None => task.abort(),
        }
    }

    /// A result of `key`'s runner of `generation`. The actions, and the time
    /// to the next run (`None`: this runner is stale and must end).
    pub fn result(
        &self,
        key: &Key,
        generation: u64,
        now: Instant,
        outcome: &Outcome,
    ) -> (Actions, Option<Duration>) {
        let mut actions = Actions::default();
        let mut t = self.lock();
        match key {
            Key::Unit(unit) => {
                let Some(entry) = t.units.get_mut(unit).filter(|e| e.generation == generation)
                else {
                    return (actions, None);
                };
                let Declared::Check { spec, machine } = &mut entry.declared else {
                    return (actions, None);
                };
                let on_failure = spec.on_failure;
                let changed = machine.result(now, outcome);
                let pace = machine.pace();
                let reason = machine.reason().to_owned();
                if let Some(state) = changed {
                    Inner::changed(&mut actions, unit, entry, state, &reason, now);
                    if state == HealthState::Unhealthy && on_failure != OnFailure::None {
                        actions.on_failure.push((unit.clone(), on_failure, reason));
                    }
                }
                (actions, Some(pace))
            }
            Key::Node(name) => {
                let Some(check) = t
                    .node_checks
                    .get_mut(name)
                    .filter(|c| c.generation == generation)
                else {
                    return (actions, None);
                };
                let changed = check.machine.result(now, outcome);
                let pace = check.machine.pace();
                if changed.is_some() {
                    check.changed_at = now;
                    actions.node = t.node_health(now);
                }
                (actions, Some(pace))
            }
        }
    }

    /// A pushed report for `unit` (`ReportHealth`), valid for `ttl`.
    pub fn push(
        &self,
        unit: &UnitName,
        state: HealthState,
        reason: &str,
        ttl: Duration,
        now: Instant,
    ) -> Result<Actions, PushError> {
        let mut actions = Actions::default();
        let mut t = self.lock();
        let Some(entry) = t.units.get_mut(unit) else {
            return Err(PushError::NotPushed(unit.clone()));
        };
        let on_failure = match &entry.declared {
            Declared::Check { spec, .. } if spec.probe == Probe::Push => spec.on_failure,
            _ => return Err(PushError::NotPushed(unit.clone())),
        };
        if !entry.active {
            return Err(PushError::NotActive(unit.clone()));
        }
        let expires = now + ttl;
        entry.pushed = Some((state, expires));
        actions
            .expiries
            .push((unit.clone(), entry.generation, expires));
        let was = entry.state;
        Inner::changed(&mut actions, unit, entry, state, reason, now);
        if was != HealthState::Unhealthy
            && state == HealthState::Unhealthy
            && on_failure != OnFailure::None
        {
            actions
                .on_failure
                .push((unit.clone(), on_failure, reason.to_owned()));
        }
        Ok(actions)
    }

    /// The report of `unit` (runner `generation`) may have expired at `now`.
    pub fn push_expired(&self, unit: &UnitName, generation: u64, now: Instant) -> Actions {
        let mut actions = Actions::default();
        let mut t = self.lock();
        let Some(entry) = t.units.get_mut(unit).filter(|e| e.generation == generation) else {
            return actions;
        };
        let Some((last, expires)) = entry.pushed else {
            return actions;
        };
        if now < expires {
            return actions;
        }
        entry.pushed = None;
        let on_failure = match &entry.declared {
            Declared::Check { spec, .. } => spec.on_failure,
            Declared::Bad(_) => OnFailure::None,
        };
        let reason = format!("no report within its time to live (the last one said {last})");
        let was = entry.state;
        Inner::changed(
            &mut actions,
            unit,
            entry,
            HealthState::Unhealthy,
            &reason,
            now,
        );
        if was != HealthState::Unhealthy && on_failure != OnFailure::None {
            actions.on_failure.push((unit.clone(), on_failure, reason));
        }
        actions
    }

    /// The node checks of `agent.conf`, started at once.
    pub fn set_node_checks(&self, checks: Vec<(String, CheckSpec)>, now: Instant) -> Actions {
        let mut actions = Actions::default();
        let mut t = self.lock();
        for (name, spec) in checks {
            let generation = t.generation();
            let mut machine = Machine::new(rules(&spec));
            machine.activate(now);
            actions.starts.push(Start {
                key: Key::Node(name.clone()),
                generation,
                spec: spec.clone(),
            });
            t.node_checks.insert(
                name,
                NodeCheckState {
                    spec,
                    machine,
                    generation,
                    runner: None,
                    changed_at: now,
                },
            );
        }
        actions.node = t.node_health(now);
        actions
    }

    /// systemd's `SystemState` as just read.
    pub fn set_system_state(&self, state: &str, now: Instant) -> Actions {
        let mut t = self.lock();
        let state = drover_protocol::health::cut_reason(state);
        let state = &state[..state
            .len()
            .min(drover_protocol::health::NODE_CHECK_NAME_MAX)];
        if t.system_state == state && t.node.is_some() {
            return Actions::default();
        }
        state.clone_into(&mut t.system_state);
        Actions {
            node: t.node_health(now),
            ..Actions::default()
        }
    }

    /// Everything the manager must know at the start of a session: every
    /// unit that declares something, and the node.
    pub fn snapshot(&self, now: Instant) -> (Vec<UnitHealth>, NodeHealth) {
        let mut t = self.lock();
        let units = t
            .units
            .iter()
            .filter(|(_, e)| e.state != HealthState::None)
            .map(|(unit, e)| UnitHealth {
                unit: unit.clone(),
                health: e.health(now),
            })
            .collect();
        if t.node.is_none() {
            t.node_health(now);
        }
        let mut node = t.node.clone().unwrap_or_default();
        if let Some(at) = t.node_changed_at {
            node.health.changed_ms_ago = ms_since(at, now);
        }
        (units, node)
    }

    /// Every unit's health state other than `none` (what the manager's
    /// book holds of this node), for a resync digest.
    pub fn states(&self) -> Vec<(UnitName, HealthState)> {
        self.lock()
            .units
            .iter()
            .filter(|(_, e)| e.state != HealthState::None)
            .map(|(u, e)| (u.clone(), e.state))
            .collect()
    }

    /// `unit`'s health now (`none` when it declares nothing).
    pub fn get(&self, unit: &UnitName, now: Instant) -> Health {
        self.lock()
            .units
            .get(unit)
            .map(|e| e.health(now))
            .unwrap_or_default()
    }

    /// Whether proxy unit `unit` says `StopWhenUnhealthy=yes`.
    pub fn stop_when_unhealthy(&self, unit: &UnitName) -> bool {
        self.lock().stop_when_unhealthy.contains(unit)
    }

    /// The node check `name`'s spec (its runner's `generation` must match).
    pub fn node_check_spec(&self, name: &str) -> Option<CheckSpec> {
        self.lock().node_checks.get(name).map(|c| c.spec.clone())
    }

    /// Units with a declaration (tests, logs).
    pub fn len(&self) -> usize {
        self.lock().units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
