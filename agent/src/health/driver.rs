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
//! * **Declarations** are read at start for every loaded unit, for every
//!   unit systemd loads later (`UnitNew`), and again for all after a
//!   daemon-reload has settled; a unit systemd unloads has none. Reading one
//!   holds the unit stream for a moment (two property calls and its files),
//!   so a unit that is loaded and started at once is known to have a check
//!   before its `active` can reach the manager.
//! * **Runners**: one task per active check, every `HealthInterval=`
//!   (`HealthStartupInterval=` while `starting`), start to start, the first
//!   run at activation. Exec checks resolve the unit's `User=`/`Group=` once
//!   per activation ([`super::exec::RunAs`]).
//! * **Node**: the node checks of `agent.conf` run the same way; systemd's
//!   `SystemState` is read at start, after reloads, and whenever a unit
//!   enters or leaves `failed` (what makes systemd `degraded`), and polled
//!   every [`SYSTEM_STATE_POLL`] while systemd is still starting.
//! * **Sessions**: the first thing a session hears after its handshake is
//!   the snapshot ([`session_started`]).
//!
//! Health needs the systemd bus connection (`HealthTable::set_bus`); an
//! agent without one (tests on the in-memory systemd) has no health.

use super::exec::RunAs;
use super::machine::Outcome;
use super::table::{Actions, Key, PushError, Start};
use crate::state::Shared;
use crate::units::hub::SEND_PATIENCE;
use drover_config::health::{CheckSpec, OnFailure, Probe};
use drover_protocol::{Event, HealthSnapshot, HealthState, ToManager, UnitName};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use zbus::Connection;

/// How often `SystemState` is read while systemd is still starting.
pub const SYSTEM_STATE_POLL: Duration = Duration::from_secs(5);

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
fn cached(shared: &Shared, unit: &UnitName) -> Option<String> {
    shared
        .units
        .cached_state(unit.as_str())
        .map(|(active, _)| active)
}

/// Starts health on `conn`: the node checks, `SystemState`, and the
/// declaration of every unit that runs. The unit stream must already run
/// (the hub's cache is the list of loaded units).
pub async fn start(shared: &Arc<Shared>, conn: Connection, node_checks: Vec<(String, CheckSpec)>) {
    shared.health.set_bus(conn);
    let order = shared.units.send_order().await;
    let now = Instant::now();
    let mut actions = shared.health.set_node_checks(node_checks, now);
    drop(order);
    perform_unordered(shared, &mut actions);
    refresh_system_state(shared).await;
    let _order = shared.units.send_order().await;
    rescan(shared).await;
}

/// A unit signal was applied by the hub (the caller holds its send order).
///
/// A unit's declaration is read the first time it is seen starting since
/// systemd loaded it — inline, so a unit loaded and started at once is known
/// to have a check before its `active` can reach the manager — and dropped
/// when systemd unloads it. Units systemd loads only to answer a query
/// (`systemctl status`) are never read: reading a unit's properties would
/// load it again, and its garbage collection would unload it again.
pub async fn on_unit_signal(shared: &Arc<Shared>, observed: Observed) {
    let Some(conn) = shared.health.bus() else {
        return;
    };
    let now = Instant::now();
    let actions = match observed {
        // During a daemon-reload systemd unloads and re-creates every unit;
        // the settle after it reads them all again (`rescan`).
        Observed::Removed(_) if shared.units.reload_open() => return,
        Observed::Removed(unit) => shared.health.unloaded(&unit, now),
        Observed::State(unit) => {
            let state = cached(shared, &unit).unwrap_or_default();
            if shared.health.note_failed(&unit, state == "failed") {
                spawn_system_state(shared);
            }
            if is_started(&state) && shared.health.first_start(&unit) {
                let declared = super::systemd::declaration(&conn, &unit).await;
                shared
                    .health
                    .declare(&unit, declared, is_active(&state), now)
            } else {
                shared.health.set_active(&unit, is_active(&state), now)
            }
        }
    };
    perform(shared, actions).await;
}

/// Reads the declarations again (at start and after a daemon-reload
/// settled; the caller holds the hub's send order): of every unit read
/// before that is still loaded, and of every loaded unit that runs.
pub async fn rescan(shared: &Arc<Shared>) {
    let Some(conn) = shared.health.bus() else {
        return;
    };
    let loaded = shared.units.cached_names();
    let mut actions = Actions::default();
    let mut read = 0usize;
    for unit in &loaded {
        let state = cached(shared, unit).unwrap_or_default();
        let known = shared.health.was_read(unit);
        if !known && !is_started(&state) {
            continue;
        }
        shared.health.first_start(unit);
        read += 1;
        let declared = super::systemd::declaration(&conn, unit).await;
        actions.merge_from(shared.health.declare(
            unit,
            declared,
            is_active(&state),
            Instant::now(),
        ));
    }
    let loaded: std::collections::HashSet<&UnitName> = loaded.iter().collect();
    actions.merge_from(shared.health.retain(|u| loaded.contains(u), Instant::now()));
    tracing::debug!(
        checked = shared.health.len(),
        "read the health declarations of {read} of {} loaded units",
        loaded.len()
    );
    perform(shared, actions).await;
    spawn_system_state(shared);
}

/// A session began: its first events are the snapshot (every declared
/// unit's health and the node's), in parts, one tag for all of them.
pub async fn session_started(shared: &Arc<Shared>, epoch: u64) {
    if shared.health.bus().is_none() {
        // No health on this agent: nothing to tell.
        return;
    }
    let _order = shared.units.send_order().await;
    let Some((tag_epoch, tag)) = shared.units.next_tag() else {
        return;
    };
    if tag_epoch != epoch {
        return;
    }
    let (units, node) = shared.health.snapshot(Instant::now());
    for part in HealthSnapshot::parts(units, node) {
        let sent = shared
            .outbox
            .send_paced(
                epoch,
                ToManager::Event(Event::HealthSnapshot { tag, part }),
                SEND_PATIENCE,
            )
            .await;
        if sent != crate::link::outbox::Sent::Queued {
            return;
        }
    }
}

/// `ReportHealth`: a pushed verdict for `unit`.
pub async fn push(
    shared: &Arc<Shared>,
    unit: &UnitName,
    state: HealthState,
    reason: &str,
    ttl: Duration,
) -> Result<(), PushError> {
    let _order = shared.units.send_order().await;
    let actions = shared
        .health
        .push(unit, state, reason, ttl, Instant::now())?;
    perform(shared, actions).await;
    Ok(())
}

/// Carries out `actions`; the caller holds the hub's send order.
async fn perform(shared: &Arc<Shared>, mut actions: Actions) {
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
        let Some((epoch, tag)) = shared.units.next_tag() else {
            continue;
        };
        let event = Event::UnitHealth { tag, unit, health };
        let _ = shared
            .outbox
            .send_paced(epoch, ToManager::Event(event), SEND_PATIENCE)
            .await;
    }
    perform_unordered(shared, &mut actions);
}

/// The part of [`perform`] that needs no order: node health, runners,
/// timers, restarts.
fn perform_unordered(shared: &Arc<Shared>, actions: &mut Actions) {
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
        if let Some(epoch) = shared.outbox.current() {
            shared
                .outbox
                .send(epoch, ToManager::Event(Event::NodeHealth(node)));
        }
    }
    for start in actions.starts.drain(..) {
        let key = start.key.clone();
        let generation = start.generation;
        let task = tokio::spawn(run_check(Arc::downgrade(shared), start));
        shared.health.attach(&key, generation, task);
    }
    for (unit, generation, at) in actions.expiries.drain(..) {
        let weak = Arc::downgrade(shared);
        let u = unit.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            let Some(shared) = weak.upgrade() else { return };
            let _order = shared.units.send_order().await;
            let actions = shared.health.push_expired(&u, generation, Instant::now());
            // Boxed: `perform` may spawn this future's kind again.
            Box::pin(perform(&shared, actions)).await;
        });
        shared.health.attach(&Key::Unit(unit), generation, task);
    }
    for (unit, what, reason) in actions.on_failure.drain(..) {
        let Some(conn) = shared.health.bus() else {
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
async fn run_check(shared: Weak<Shared>, start: Start) {
    let Start {
        key,
        generation,
        spec,
    } = start;
    let run_as = match (&key, &spec.probe) {
        (Key::Unit(unit), Probe::Cmd(_)) => match shared.upgrade().and_then(|s| s.health.bus()) {
            Some(conn) => resolve_user(&conn, unit).await,
            None => return,
        },
        _ => Ok(RunAs::own()),
    };
    let unit_name = match &key {
        Key::Unit(unit) => unit.to_string(),
        Key::Node(name) => format!("node check {name}"),
    };
    loop {
        let started = tokio::time::Instant::now();
        let outcome = match &run_as {
            Err(why) => Outcome::Fail(why.clone()),
            Ok(run_as) => probe(&spec, run_as, &unit_name).await,
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let pace = {
            let _order = shared.units.send_order().await;
            let (actions, pace) = shared
                .health
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
pub async fn probe(spec: &CheckSpec, run_as: &RunAs, unit: &str) -> Outcome {
    match &spec.probe {
        Probe::Cmd(argv) => super::exec::run(argv, run_as, unit, spec.timeout).await,
        Probe::Tcp { host, port } => super::probe::tcp(host, *port, spec.timeout).await,
        Probe::Http(url) => super::probe::http(url, spec.timeout).await,
        Probe::Push => Outcome::Fail("a pushed check does not run".into()),
    }
}

/// The user a unit's exec check runs as (see [`RunAs::resolve`]).
async fn resolve_user(conn: &Connection, unit: &UnitName) -> Result<RunAs, String> {
    let (user, group) = super::systemd::run_as(conn, unit.as_str())
        .await
        .map_err(|e| format!("cannot tell which user {unit} runs as: {e}"))?;
    tokio::task::spawn_blocking(move || RunAs::resolve(&user, &group))
        .await
        .map_err(|e| format!("looking up the user of {unit}: {e}"))?
}

fn spawn_system_state(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        if let Some(shared) = weak.upgrade() {
            refresh_system_state(&shared).await;
        }
    });
}

/// Reads `SystemState`; while systemd is still starting, a poller (one at a
/// time) reads it again every [`SYSTEM_STATE_POLL`] until it is not.
async fn refresh_system_state(shared: &Arc<Shared>) {
    if read_system_state(shared).await && shared.health.claim_poller() {
        let weak = Arc::downgrade(shared);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SYSTEM_STATE_POLL).await;
                let Some(shared) = weak.upgrade() else { return };
                if !read_system_state(&shared).await {
                    shared.health.release_poller();
                    return;
                }
            }
        });
    }
}

/// Reads `SystemState` into the table; true while systemd is starting.
async fn read_system_state(shared: &Arc<Shared>) -> bool {
    let Some(conn) = shared.health.bus() else {
        return false;
    };
    let state = match super::systemd::system_state(&conn).await {
        Ok(state) => state,
        Err(e) => {
            tracing::debug!("cannot read systemd's SystemState: {e}");
            return false;
        }
    };
    let mut actions = shared.health.set_system_state(&state, Instant::now());
    perform_unordered(shared, &mut actions);
    matches!(state.as_str(), "initializing" | "starting")
}
