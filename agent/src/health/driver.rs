//! The async side of health: reads what units declare, runs their checks,
//! and sends what the table ([`super::table`]) decides.
//!
//! **Order with unit events.** Health verdicts travel on the unit event
//! stream: every one is tagged from the unit hub's counter and sent under
//! its send order (`crate::units::hub::UnitHub::send_order`), and a unit's
//! activity comes from the same stream the hub reads (the systemd unit
//! signals, through `crate::fanout`), applied right after the hub applied
//! them. So the manager hears a unit leave `active` before it hears its
//! health reset to `starting`, and never pairs a new activation with the
//! verdict of the previous one.
//!
//! * **Declarations** are read the first time a unit is seen starting
//!   since systemd loaded it (inline, holding the unit stream for two
//!   property calls and its files, so a unit loaded and started at once is
//!   known to have a check before its `active` can reach the manager), and
//!   again for every started unit after a daemon-reload has settled; a unit
//!   systemd unloads has none. The unit stream itself starts only once a
//!   unit declares something ([`start`]).
//! * **Runners**: one task per active check, every `HealthInterval=`
//!   (`HealthStartupInterval=` while `starting`), start to start, the first
//!   run at activation. Exec checks read the unit's `User=`/`Group=` once
//!   per activation and hand them to systemd ([`super::exec`]).
//! * **Node**: the node checks of `agent.conf` run the same way; systemd's
//!   `SystemState` is read every [`SYSTEM_STATE_POLL`], and at once when a
//!   unit enters or leaves `failed` (what makes systemd `degraded`).
//! * **Sessions**: the first thing a session hears after its handshake is
//!   the snapshot ([`session_started`]).
//!
//! Health needs the systemd bus connection (`HealthTable::set_bus`); an
//! agent without one (tests on the in-memory systemd) has no health.

use super::exec::RunFor;
use super::lookups::{Next, QUIET};
use super::machine::Outcome;
use super::table::{Actions, Follow, HealthTable, Key, PushError, Start};
use drover_config::health::{CheckSpec, OnFailure, Probe};
use drover_protocol::ports::Ports;
use drover_protocol::{Event, HealthSnapshot, HealthState, ModTag, UnitName};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use zbus::Connection;

/// What health needs of the agent around it (`crate::state::Shared`
/// implements it): the table, the unit hub's order, view and tags, and the
/// way to the manager. Defined here, below the agent's state, so health
/// imports nothing above it.
pub trait Host: Send + Sync + 'static {
    fn health(&self) -> &HealthTable;
    /// Where check runs are counted (`drover_agent_health_checks_total`).
    fn stats(&self) -> &crate::stats::Stats;
    /// The lock of the unit event order, held while tagging and sending.
    fn order(&self) -> impl Future<Output = tokio::sync::MutexGuard<'_, ()>> + Send;
    /// A loaded unit's active state as the unit hub knows it.
    fn active_state(&self, unit: &UnitName) -> Option<String>;
    /// The loaded units, sorted.
    fn loaded_units(&self) -> Vec<UnitName>;
    /// A daemon-reload has not settled yet.
    fn reload_open(&self) -> bool;
    /// The unit stream follows every unit for health (health then hears
    /// every unit's activity through [`on_unit_signal`]).
    fn streaming(&self) -> bool;
    /// Sends the events `build` makes with the next unit event tag, in order,
    /// on the open session (only if it is `epoch`, when given); the caller
    /// holds [`Host::order`].
    fn send_tagged(
        &self,
        epoch: Option<u64>,
        build: impl FnOnce(ModTag) -> Vec<Event> + Send,
    ) -> impl Future<Output = ()> + Send;
    /// Sends `event` on the open session, if any, untagged.
    fn send(&self, event: Event);
}

/// How often `SystemState` is read.
pub const SYSTEM_STATE_POLL: Duration = Duration::from_secs(10);

/// What one unit signal says that health cares about (taken before the hub
/// consumes the signal).
#[derive(Debug, Clone)]
pub enum Observed {
    Removed(UnitName),
    /// A state change.
    State(UnitName),
}

impl Observed {
    /// What `signal` says, if anything.
    pub fn of(signal: &crate::systemd::api::UnitSignal) -> Option<Observed> {
        use crate::systemd::api::UnitSignal;
        let name = |u: &str| UnitName::new(u).ok();
        match signal {
            UnitSignal::Removed { unit } => name(unit).map(Observed::Removed),
            UnitSignal::Changed {
                unit,
                active_state: Some(_),
                ..
            } => name(unit).map(Observed::State),
            _ => None,
        }
    }
}

fn is_active(state: &str) -> bool {
    // A reload keeps the service up: its checks keep running.
    matches!(state, "active" | "reloading")
}

/// Whether a unit in `state` is running or on its way (its declaration is
/// read then, not for every unit systemd merely loads).
fn is_started(state: &str) -> bool {
    !matches!(state, "inactive" | "failed")
}

/// `unit`'s active state as the unit hub's cache knows it.
fn cached<H: Host>(shared: &H, unit: &UnitName) -> Option<String> {
    shared.active_state(unit)
}

/// How long after a `Reloading(false)` a daemon-reload counts as settled
/// (while the hub does not follow the units; it has its own settle).
pub const RELOAD_SETTLE: Duration = Duration::from_millis(500);

/// Starts health on `conn`: the node checks, `SystemState` (read now and
/// every [`SYSTEM_STATE_POLL`]), and the units.
///
/// Unit health needs every unit's activity, so it runs on the unit hub's
/// stream of systemd's unit signals — but that stream costs the agent a
/// wake-up for every state change of every unit on the node (it follows
/// their state alone, not the `Service` interface's changes), which a
/// node without checks should not pay (a node that loads 20,000 units at
/// once would feel it). So the stream is started only once a unit that
/// runs is found to declare something: at start (every running unit is
/// read), at every job systemd queues (its unit is read), and after every
/// daemon-reload (running units are read again). A node that a monitor or a
/// proxy watches follows its units anyway.
pub async fn start<H: Host>(
    shared: &Arc<H>,
    conn: Connection,
    node_checks: Vec<(String, CheckSpec)>,
    follow: Follow,
) {
    shared.health().set_bus(conn.clone());
    shared.health().set_follow(follow);
    let order = shared.order().await;
    let now = Instant::now();
    let mut actions = shared.health().set_node_checks(node_checks, now);
    drop(order);
    perform_unordered(shared, &mut actions);
    spawn_system_state_poller(shared);
    spawn_reload_watcher(shared, conn);
    if shared.streaming() {
        let _order = shared.order().await;
        rescan(shared).await;
    } else {
        discover(shared).await;
    }
}

/// Without the unit stream: reads the declaration of every running unit;
/// the first that declares something starts the stream.
async fn discover<H: Host>(shared: &Arc<H>) {
    let Some(conn) = shared.health().bus() else {
        return;
    };
    let running = match super::systemd::running_units(&conn).await {
        Ok(units) => units,
        Err(e) => {
            tracing::warn!("cannot list the units to look for health checks: {e}");
            return;
        }
    };
    for unit in running {
        if declares_something(&conn, &unit).await {
            follow_units(shared).await;
            return;
        }
    }
}

/// A job was queued for `unit` (the job stream; every agent follows it):
/// while the unit hub does not follow the units, the unit is read, and the
/// stream starts if it declares something.
pub fn on_job_new<H: Host>(shared: &Arc<H>, unit: &str) {
    if shared.streaming() || crate::own_units::is_own(unit) {
        return;
    }
    let (Some(conn), Ok(unit)) = (shared.health().bus(), UnitName::new(unit)) else {
        return;
    };
    if !shared.health().lookups.push(unit) {
        return;
    }
    // One worker, one look at a time (`super::lookups`).
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let unit = match shared.health().lookups.next() {
                Next::Done => return,
                Next::Rescan(quiet) if quiet < QUIET => {
                    drop(shared);
                    tokio::time::sleep(QUIET - quiet).await;
                    continue;
                }
                // A burst, now quiet: the units that run now.
                Next::Rescan(_) => {
                    if !shared.streaming() {
                        discover(&shared).await;
                    }
                    continue;
                }
                Next::Unit(unit) => unit,
            };
            if shared.streaming() {
                shared.health().lookups.clear();
                continue;
            }
            drop(shared);
            if declares_something(&conn, &unit).await
                && let Some(shared) = weak.upgrade()
            {
                shared.health().lookups.clear();
                follow_units(&shared).await;
            }
        }
    });
}

/// Whether `unit` declares a check, a `StopWhenUnhealthy=`, ports, or a
/// bad section.
async fn declares_something(conn: &Connection, unit: &UnitName) -> bool {
    let d = super::systemd::declaration(conn, unit).await;
    !d.ports.is_empty()
        || match d.health {
            Ok(d) => d.check.is_some() || d.stop_when_unhealthy,
            Err(_) => true,
        }
}

/// `unit` declares `ports` now: tells the manager if they changed.
fn set_ports<H: Host>(shared: &Arc<H>, unit: &UnitName, ports: Ports) {
    if let Some(ports) = shared.health().ports.set(unit, ports) {
        tracing::debug!("{unit} declares ports {:?}", ports.pairs());
        shared.send(Event::UnitPorts {
            unit: unit.clone(),
            ports,
        });
    }
}

/// Starts the unit hub's stream (once) and reads every running unit under
/// the unit event order.
async fn follow_units<H: Host>(shared: &Arc<H>) {
    if shared.streaming() {
        return;
    }
    let Some(started) = shared.health().follow() else {
        return;
    };
    match started.await {
        Ok(()) => {
            tracing::info!("a unit declares health: following systemd's units");
            let _order = shared.order().await;
            rescan(shared).await;
        }
        Err(e) => tracing::error!("cannot follow systemd's units, so no health checks run: {e}"),
    }
}

/// Reads every running unit again after a daemon-reload, while the hub does
/// not follow the units (it settles reloads itself, then calls [`rescan`]).
fn spawn_reload_watcher<H: Host>(shared: &Arc<H>, conn: Connection) {
    let weak = Arc::downgrade(shared);
    let stopped = shared.health().stopped();
    tokio::spawn(async move {
        // The task holds the connection: it ends when the agent stops.
        stopped.run_until_cancelled(watch_reloads(weak, conn)).await;
    });
}

async fn watch_reloads<H: Host>(weak: Weak<H>, conn: Connection) {
    let mut reloads = match super::systemd::reload_signals(&conn).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!("cannot watch systemd's reloads for health declarations: {e}");
            return;
        }
    };
    while let Some(active) = reloads.recv().await {
        if active {
            continue;
        }
        // Quiet for a moment: a reload is one signal pair, a burst of
        // reloads is settled once.
        loop {
            match tokio::time::timeout(RELOAD_SETTLE, reloads.recv()).await {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let Some(shared) = weak.upgrade() else { return };
        if !shared.streaming() {
            shared.health().lookups.forget_seen();
            discover(&shared).await;
        }
    }
}

/// A unit signal was applied by the hub (the caller holds its send order).
///
/// A unit's declaration is read the first time it is seen starting since
/// systemd loaded it — inline, so a unit loaded and started at once is known
/// to have a check before its `active` can reach the manager — and dropped
/// when systemd unloads it. Units systemd loads only to answer a query
/// (`systemctl status`) are never read: reading a unit's properties would
/// load it again, and its garbage collection would unload it again.
pub async fn on_unit_signal<H: Host>(shared: &Arc<H>, observed: Observed) {
    let Some(conn) = shared.health().bus() else {
        return;
    };
    let now = Instant::now();
    let actions = match observed {
        // During a daemon-reload systemd unloads and re-creates every unit;
        // the settle after it reads them all again (`rescan`).
        Observed::Removed(_) if shared.reload_open() => return,
        Observed::Removed(unit) => {
            set_ports(shared, &unit, Ports::default());
            shared.health().unloaded(&unit, now)
        }
        Observed::State(unit) => {
            let state = cached(&**shared, &unit).unwrap_or_default();
            if shared.health().note_failed(&unit, state == "failed") {
                spawn_system_state(shared);
            }
            if is_started(&state) && shared.health().first_start(&unit) {
                let declared = super::systemd::declaration(&conn, &unit).await;
                set_ports(shared, &unit, declared.ports);
                shared
                    .health()
                    .declare(&unit, declared.health, is_active(&state), now)
            } else {
                shared.health().set_active(&unit, is_active(&state), now)
            }
        }
    };
    perform(shared, actions).await;
}

/// Reads the declarations again (at start and after a daemon-reload
/// settled; the caller holds the hub's send order): of every unit read
/// before that is still loaded, and of every loaded unit that runs.
pub async fn rescan<H: Host>(shared: &Arc<H>) {
    let Some(conn) = shared.health().bus() else {
        return;
    };
    let loaded = shared.loaded_units();
    let mut actions = Actions::default();
    let mut read = 0usize;
    for unit in &loaded {
        let state = cached(&**shared, unit).unwrap_or_default();
        let known = shared.health().was_read(unit);
        if !known && !is_started(&state) {
            continue;
        }
        shared.health().first_start(unit);
        read += 1;
        let declared = super::systemd::declaration(&conn, unit).await;
        set_ports(shared, unit, declared.ports);
        actions.merge_from(shared.health().declare(
            unit,
            declared.health,
            is_active(&state),
            Instant::now(),
        ));
    }
    let loaded: std::collections::HashSet<&UnitName> = loaded.iter().collect();
    for unit in shared.health().ports.retain(|u| loaded.contains(u)) {
        shared.send(Event::UnitPorts {
            unit,
            ports: Ports::default(),
        });
    }
    actions.merge_from(
        shared
            .health()
            .retain(|u| loaded.contains(u), Instant::now()),
    );
    tracing::debug!(
        checked = shared.health().len(),
        "read the health declarations of {read} of {} loaded units",
        loaded.len()
    );
    perform(shared, actions).await;
    spawn_system_state(shared);
}

/// A session began: its first events are the snapshot (every declared
/// unit's health and the node's), in parts, one tag for all of them.
pub async fn session_started<H: Host>(shared: &Arc<H>, epoch: u64) {
    if shared.health().bus().is_none() {
        // No health on this agent: nothing to tell.
        return;
    }
    let _order = shared.order().await;
    let (units, node) = shared.health().snapshot(Instant::now());
    shared
        .send_tagged(Some(epoch), move |tag| {
            HealthSnapshot::parts(units, node)
                .into_iter()
                .map(|part| Event::HealthSnapshot { tag, part })
                .collect()
        })
        .await;
    // The manager keeps a session's ports only: all of them again.
    for (unit, ports) in shared.health().ports.all() {
        shared.send(Event::UnitPorts { unit, ports });
    }
}

/// `ReportHealth`: a pushed verdict for `unit`.
pub async fn push<H: Host>(
    shared: &Arc<H>,
    unit: &UnitName,
    state: HealthState,
    reason: &str,
    ttl: Duration,
) -> Result<(), PushError> {
    let _order = shared.order().await;
    let actions = shared
        .health()
        .push(unit, state, reason, ttl, Instant::now())?;
    shared.stats().check_pushed(state);
    perform(shared, actions).await;
    Ok(())
}

/// Carries out `actions`; the caller holds the hub's send order.
async fn perform<H: Host>(shared: &Arc<H>, mut actions: Actions) {
    for (unit, health) in std::mem::take(&mut actions.units) {
        tracing::info!(
            "{unit} is {}{}",
            health.state,
            if health.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", drover_protocol::health::one_line(&health.reason))
            }
        );
        shared
            .send_tagged(None, move |tag| {
                vec![Event::UnitHealth { tag, unit, health }]
            })
            .await;
    }
    perform_unordered(shared, &mut actions);
}

/// The part of [`perform`] that needs no order: node health, runners,
/// timers, restarts.
fn perform_unordered<H: Host>(shared: &Arc<H>, actions: &mut Actions) {
    if let Some(node) = actions.node.take() {
        tracing::info!(
            "node health: {}{}",
            node.health.state,
            if node.health.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", node.health.reason)
            }
        );
        shared.send(Event::NodeHealth(node));
    }
    for start in actions.starts.drain(..) {
        let key = start.key.clone();
        let generation = start.generation;
        let task = tokio::spawn(run_check(Arc::downgrade(shared), start));
        shared.health().attach(&key, generation, task);
    }
    for (unit, generation, at) in actions.expiries.drain(..) {
        let weak = Arc::downgrade(shared);
        let u = unit.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            let Some(shared) = weak.upgrade() else { return };
            let _order = shared.order().await;
            let actions = shared.health().push_expired(&u, generation, Instant::now());
            // Boxed: `perform` may spawn this future's kind again.
            Box::pin(perform(&shared, actions)).await;
        });
        shared.health().attach(&Key::Unit(unit), generation, task);
    }
    for (unit, what, reason) in actions.on_failure.drain(..) {
        let Some(conn) = shared.health().bus() else {
            continue;
        };
        let method = match what {
            OnFailure::Restart => "RestartUnit",
            OnFailure::Stop => "StopUnit",
            OnFailure::None => continue,
        };
        tracing::warn!(
            "{unit} is unhealthy ({}): asking systemd to {} it (HealthOnFailure={})",
            drover_protocol::health::one_line(&reason),
            what.as_str(),
            what.as_str()
        );
        tokio::spawn(async move {
            if let Err(e) = super::systemd::unit_job(&conn, method, unit.as_str()).await {
                tracing::error!("{unit}: HealthOnFailure={} failed: {e}", what.as_str());
            }
        });
    }
}

/// One check's runner: runs it, feeds the results in, until the table says
/// this generation is over (or the agent is gone).
async fn run_check<H: Host>(shared: Weak<H>, start: Start) {
    let Start {
        key,
        generation,
        spec,
    } = start;
    let Some(conn) = shared.upgrade().and_then(|s| s.health().bus()) else {
        return;
    };
    let run_for = match (&key, &spec.probe) {
        (Key::Unit(unit), Probe::Cmd(_)) => run_for(&conn, unit).await,
        (Key::Unit(unit), _) => Ok(RunFor {
            unit: unit.to_string(),
            ..RunFor::default()
        }),
        (Key::Node(name), _) => Ok(RunFor {
            unit: format!("node check {name}"),
            ..RunFor::default()
        }),
    };
    loop {
        let started = tokio::time::Instant::now();
        let outcome = match &run_for {
            Err(why) => Outcome::Fail(why.clone()),
            Ok(what) => probe(&conn, &spec, what).await,
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.stats().check_ran(
            crate::stats::kind_label(&spec.probe),
            outcome.passed(),
            started.elapsed(),
        );
        let pace = {
            let _order = shared.order().await;
            let (actions, pace) =
                shared
                    .health()
                    .result(&key, generation, Instant::now(), &outcome);
            Box::pin(perform(&shared, actions)).await;
            pace
        };
        drop(shared);
        let Some(pace) = pace else {
            return;
        };
        tokio::time::sleep_until(started + pace).await;
    }
}

/// One run of `spec`'s probe.
pub async fn probe(conn: &Connection, spec: &CheckSpec, what: &RunFor) -> Outcome {
    match &spec.probe {
        Probe::Cmd(argv) => super::exec::run(conn, argv, what, spec.timeout).await,
        Probe::Tcp { host, port } => super::probe::tcp(host, *port, spec.timeout).await,
        Probe::Http(url) => super::probe::http(url, spec.timeout).await,
        Probe::Push => Outcome::Fail("a pushed check does not run".into()),
    }
}

/// Who a unit's exec check runs as: its `User=`, `Group=` and
/// `SupplementaryGroups=`, read once per activation.
async fn run_for(conn: &Connection, unit: &UnitName) -> Result<RunFor, String> {
    let (user, group, groups) = super::systemd::run_as(conn, unit.as_str())
        .await
        .map_err(|e| format!("cannot tell which user {unit} runs as: {e}"))?;
    Ok(RunFor {
        unit: unit.to_string(),
        user,
        group,
        groups,
    })
}

fn spawn_system_state<H: Host>(shared: &Arc<H>) {
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        if let Some(shared) = weak.upgrade() {
            read_system_state(&shared).await;
        }
    });
}

/// Reads `SystemState` every [`SYSTEM_STATE_POLL`] (and now): a unit that
/// fails makes systemd `degraded` without a signal of the manager's own.
/// While the hub follows the units, a unit entering or leaving `failed`
/// reads it at once too.
fn spawn_system_state_poller<H: Host>(shared: &Arc<H>) {
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SYSTEM_STATE_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            read_system_state(&shared).await;
        }
    });
}

/// Reads `SystemState` into the table.
async fn read_system_state<H: Host>(shared: &Arc<H>) {
    let Some(conn) = shared.health().bus() else {
        return;
    };
    let state = match super::systemd::system_state(&conn).await {
        Ok(state) => state,
        Err(e) => {
            tracing::debug!("cannot read systemd's SystemState: {e}");
            return;
        }
    };
    let mut actions = shared.health().set_system_state(&state, Instant::now());
    perform_unordered(shared, &mut actions);
}
