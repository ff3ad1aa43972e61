//! The agent's shared state: one [`Shared`] per agent process, held in an
//! `Arc` by the link, the request handlers, the systemd event fan-out and the
//! local API.
//!
//! Each part is its own module's state and keeps its own invariants under its
//! own lock; this file only gathers them and holds the few steps that touch
//! several at once (a systemd job event, a finished job, a session starting).
//! It imports the parts, never the code that drives them (`crate::dispatch`,
//! `crate::fanout`, `crate::connection`, `crate::api`), so those import
//! it and the imports run one way.
//!
//! Lock order, where two are taken together: the job tracker's lock is taken
//! last (the tracker never calls out while holding it).

use crate::deps::dep_unit::Deps;
use crate::deps::unit_fence::UnitFence;
use crate::health::table::HealthTable;
use crate::jobs::{JobTracker, Output};
use crate::link::outbox::Outbox;
use crate::link::status::AgentStatus;
use crate::link::target::{ControllerTarget, Endpoint};
use crate::node_api::NodeState;
use crate::proxies::early_start::EarlyStart;
use crate::proxies::registry::Proxies;
use crate::stats::Stats;
use crate::systemd::api::{JobPath, SystemdEvent};
use crate::units::hub::UnitHub;
use drover_protocol::{Event, ToManager};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// State shared by request handlers, the event fan-out and the link.
#[derive(Default)]
pub struct Shared {
    tracker: Mutex<JobTracker>,
    pub outbox: Outbox,
    /// Proxies of this (requesting) node: `crate::proxies::registry`.
    pub proxies: Proxies,
    /// Proxy start jobs being classified: `crate::proxies::early_start`.
    pub early_start: EarlyStart,
    /// Dep units of this (target) node: `crate::deps::dep_unit`.
    pub deps: Deps,
    /// Job ends the unit reader has passed: `crate::deps::unit_fence`.
    pub fence: UnitFence,
    /// The link as the local API shows it: `crate::link::status`.
    pub status: AgentStatus,
    /// Where the link dials: `crate::link::target`.
    pub controller: ControllerTarget,
    /// Unit subscriptions of the manager: `crate::units::hub`.
    pub units: UnitHub,
    /// Metrics and log level: `crate::node_api`.
    pub node: NodeState,
    /// Health of this node's units and of the node: `crate::health`.
    pub health: HealthTable,
    /// Prometheus figures kept as things happen: `crate::stats`.
    pub stats: Stats,
}

/// Health's view of the agent (`crate::health::driver::Host`): the unit
/// hub's order, view and tags, and the outbox.
impl crate::health::driver::Host for Shared {
    fn health(&self) -> &HealthTable {
        &self.health
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn order(&self) -> impl std::future::Future<Output = tokio::sync::MutexGuard<'_, ()>> + Send {
        self.units.send_order()
    }

    fn active_state(&self, unit: &drover_protocol::UnitName) -> Option<String> {
        self.units
            .cached_state(unit.as_str())
            .map(|(active, _)| active)
    }

    fn loaded_units(&self) -> Vec<drover_protocol::UnitName> {
        self.units.cached_names()
    }

    fn reload_open(&self) -> bool {
        self.units.reload_open()
    }

    fn streaming(&self) -> bool {
        self.health.holding()
    }

    async fn send_tagged(
        &self,
        epoch: Option<u64>,
        build: impl FnOnce(drover_protocol::ModTag) -> Vec<Event> + Send,
    ) {
        let Some((open, tag)) = self.units.next_tag() else {
            return;
        };
        if epoch.is_some_and(|want| want != open) {
            return;
        }
        for event in build(tag) {
            let sent = self
                .outbox
                .send_paced(
                    open,
                    ToManager::Event(event),
                    crate::units::hub::SEND_PATIENCE,
                )
                .await;
            if sent != crate::link::outbox::Sent::Queued {
                return;
            }
        }
    }

    fn send(&self, event: Event) {
        if let Some(epoch) = self.outbox.current() {
            self.outbox.send(epoch, ToManager::Event(event));
        }
    }
}

impl Shared {
    /// A manager session's outbox is open: health's snapshot goes first.
    pub async fn session_opened(self: &std::sync::Arc<Self>, epoch: u64) {
        crate::health::driver::session_started(self, epoch).await;
    }

    /// `SwitchController`: the link dials `address` from now on, and the
    /// local API shows it as `ControllerAddress` (changed before the link
    /// drops its session, as BlueChi orders it).
    pub fn switch_controller(&self, address: &str) -> Result<Endpoint, String> {
        let new = self.controller.switch(address)?;
        self.status.set_controller(&new.host, new.port);
        Ok(new)
    }

    pub fn tracker(&self) -> MutexGuard<'_, JobTracker> {
        // The tracker is only mutated by short, non-panicking sections; a
        // poisoned lock still holds consistent state.
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds one systemd job event to its readers (dep waiters, early start,
    /// the job tracker) and forwards what the tracker produced. Returns a
    /// proxy start job to classify (see `crate::proxies::early_start`).
    pub fn on_systemd_event(&self, event: SystemdEvent) -> Option<JobPath> {
        self.deps.on_event(&event);
        let classify = self
            .early_start
            .on_event(&event, &self.proxies, &self.outbox);
        let mut tracker = self.tracker();
        for out in tracker.on_event(Instant::now(), event) {
            self.forward_job(out);
        }
        classify
    }

    /// Sends one job output; a `JobDone` is followed by its metrics, if on.
    pub fn forward_job(&self, out: Output) {
        let done = match &out.event {
            Event::JobDone { job_id, result } => {
                self.stats.job_done(result);
                Some(*job_id)
            }
            _ => None,
        };
        self.outbox.send(out.epoch, ToManager::Event(out.event));
        if let Some(metrics) = done.and_then(|job_id| self.node.job_done(out.epoch, job_id)) {
            self.outbox.send(out.epoch, ToManager::Event(metrics));
        }
    }

    /// News from the manager about one of our proxies. A target of an active
    /// proxy that turned unhealthy is reported, and stops the proxy only
    /// where its unit says `StopWhenUnhealthy=yes` (so a flapping check does
    /// not cascade through `BindsTo=` unless asked to).
    pub fn on_notice(&self, notice: drover_protocol::Notice) {
        let Some(key) = self.proxies.on_notice(notice, &self.outbox) else {
            return;
        };
        if self.health.stop_when_unhealthy(&key.local) {
            self.proxies.stop_unhealthy(&key, &self.outbox);
        } else {
            tracing::warn!(
                "{} on node {} is unhealthy; proxy {} stays active (StopWhenUnhealthy=yes in its [X-Drover] section would stop it)",
                key.unit,
                key.node,
                key.local
            );
        }
    }

    /// A manager session began (`session_id` from its handshake).
    pub fn session_started(&self, epoch: u64, session_id: u64) {
        self.units.session_started(epoch, session_id);
        self.node.session_started();
    }

    /// The manager session `epoch` ended; the unit stream stops following
    /// what it watched (in a task of its own: that waits for systemd).
    pub fn session_ended(self: &Arc<Self>, epoch: u64) {
        self.units.session_ended(epoch);
        let shared = self.clone();
        tokio::spawn(async move { shared.units.follow_watched().await });
    }
}
