//! The systemd event fan-out: the two readers of systemd's signal streams
//! and where each signal goes.
//!
//! * **Job stream** ([`pump_events`], subscribed once at start, before any
//!   request): every `JobNew` / job state / `JobRemoved` goes, in systemd's
//!   order, to the dep waiters (`crate::deps::dep_unit`), the early start of
//!   proxies (`crate::proxies::early_start`) and the job tracker
//!   (`crate::jobs`) — see `crate::state::Shared::on_systemd_event`. A proxy
//!   job to classify is asked about in a task of its own, so the stream
//!   never waits for systemd's answer.
//! * **Unit stream** ([`start_units`], started with the agent; read by
//!   `pump_units`): unit signals go to the unit hub (`crate::units::hub`),
//!   which also decides what the stream follows, and the snapshot that marks
//!   each change; job signals seen on it go to the unit fence
//!   (`crate::deps::unit_fence`), all under the hub's send order, so the
//!   fence hears of a job's end only after what systemd said before it has
//!   gone to the manager. Health (`crate::health::driver`) hears each unit
//!   signal right after the hub, and the settle of a daemon-reload, under
//!   the same order.
//!
//! Both readers end when their stream does (systemd connection lost); the
//! unit reader also when the agent's state is gone.

use crate::health::driver::{self as health, Observed};
use crate::state::Shared;
use crate::systemd::api::{EventStream, Systemd, UnitSignal, UnitSignalStream};
use drover_protocol::RemoteError;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long after the last `Reloading` signal a daemon-reload is settled.
pub const RELOAD_SETTLE: Duration = Duration::from_millis(500);

/// Drains systemd's event stream into the tracker until it ends (systemd
/// connection lost). Proxy start jobs are classified by their own tasks, so
/// the stream never waits for systemd's answer.
pub async fn pump_events<S: Systemd>(
    mut events: EventStream,
    shared: Arc<Shared>,
    systemd: Arc<S>,
) {
    while let Some(event) = events.recv().await {
        if let crate::systemd::api::SystemdEvent::JobNew { unit, .. } = &event {
            // A unit about to change may declare health (see there).
            health::on_job_new(&shared, unit);
        }
        if let Some(job) = shared.on_systemd_event(event) {
            let (shared, systemd) = (shared.clone(), systemd.clone());
            tokio::spawn(async move {
                let info = systemd.job_info(&job).await;

                shared
                    .early_start
                    .classified(&job, info, &shared.proxies, &shared.outbox);
            });
        }
    }
}

/// Starts the unit stream and its reader the first time; a no-op once they
/// run. A failure is the caller's error; the next call tries again.
pub async fn start_units<S: Systemd>(
    systemd: &Arc<S>,
    shared: &Arc<Shared>,
) -> Result<(), RemoteError> {
    if let Some(stream) = shared.units.start(systemd).await? {
        tokio::spawn(pump_units(stream, systemd.clone(), Arc::downgrade(shared)));
    }
    Ok(())
}

/// Applies systemd's unit signals until the stream ends (systemd connection
/// lost) or the agent is gone.
///
/// A snapshot in the stream (a change of what it follows) is applied where
/// it stands: what came before it is older, what comes after newer.
///
/// `snapshot_at` is the position of the last settle's `ListUnits`, which is
/// made here, not in the stream: its answer can come while signals systemd
/// sent before it still wait in the stream; they are applied as older than
/// the snapshot (`crate::units::rules`, "Snapshots"), so a state the snapshot
/// already moved past never goes out as a real change.
///
/// A daemon-reload is settled [`RELOAD_SETTLE`] after its `Reloading(false)`
/// with a `ListUnits`: systemd sends that signal and the `UnitNew` burst from
/// its idle queue, so neither their order nor their timing is exact (the
/// `false` of one reload can even arrive after the `true` of the next); a
/// settle that finds a reload still open waits another round.
async fn pump_units<S: Systemd>(
    mut stream: UnitSignalStream<S::Position>,
    systemd: Arc<S>,
    shared: Weak<Shared>,
) {
    let mut snapshot_at = S::Position::default();
    let mut settle_at: Option<tokio::time::Instant> = None;
    // Rounds a settle waited for a reload that never said it ended.
    let mut waited = 0u32;
    loop {
        let signal = match settle_at {
            Some(at) => tokio::select! {
                s = stream.recv() => s,
                () = tokio::time::sleep_until(at) => {
                    settle_at = None;
                    let Some(shared) = shared.upgrade() else { return };
                    let hub = &shared.units;
                    if hub.reload_open() && waited < 20 {
                        waited += 1;
                        settle_at = Some(tokio::time::Instant::now() + RELOAD_SETTLE);
                        continue;
                    }
                    waited = 0;
                    let _order = hub.send_order().await;
                    let listed = systemd.list_units_at().await.map(|(units, at)| {
                        snapshot_at = at;
                        units
                    });
                    hub.settle(&shared.outbox, listed).await;
                    // Unit files may have changed: read the declarations again.
                    health::rescan(&shared).await;
                    continue;
                }
            },
            None => stream.recv().await,
        };
        let Some((position, signal)) = signal else {
            break;
        };
        let older = position < snapshot_at;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if matches!(signal, UnitSignal::Reloading { .. }) {
            settle_at = Some(tokio::time::Instant::now() + RELOAD_SETTLE);
        }
        let hub = &shared.units;
        let _order = hub.send_order().await;
        if let UnitSignal::Snapshot {
            id,
            followed,
            units,
        } = signal
        {
            hub.apply_snapshot(id, followed, units);
            continue;
        }
        match &signal {
            UnitSignal::JobRemoved { job } => {
                // Everything systemd said before this job ended has been sent.
                shared.fence.passed(job);
                continue;
            }
            UnitSignal::JobNew { job, unit } => {
                shared.fence.queued(job, unit);
                continue;
            }
            _ => {}
        }
        let active = match &signal {
            UnitSignal::Changed {
                unit,
                active_state: Some(state),
                ..
            } if state == "active" => Some(unit.clone()),
            _ => None,
        };
        let observed = Observed::of(&signal);
        hub.apply(&shared.outbox, signal, older).await;
        if let Some(observed) = observed {
            // After the hub, in its order: health follows the state the
            // hub just sent (`crate::health::driver`).
            health::on_unit_signal(&shared, observed).await;
        }
        if let Some(unit) = active {
            // After it went to the manager: a StartDep reply it releases
            // must not overtake it.
            shared.fence.active(&unit);
        }
    }
    tracing::warn!("systemd's unit signal stream ended; unit events stop");
}
