//! BlueChi's D-Bus metrics (`Controller.EnableMetrics`): whether they are
//! on, and what to measure when a job ends (its start is
//! [`JobInfo::started`]). Served on D-Bus by [`crate::api::metrics`];
//! emitted through [`Outbound`]. The same events feed the Prometheus
//! counters ([`Counters`]), whether the signals are on or not.
//!
//! * `StartUnitJobMetrics(node, job path, unit, gross µs, net µs)` after a
//!   `start` job ends: gross = from job creation to `JobRemoved` as the
//!   manager saw it; net = `ActiveEnterTimestampMonotonic -
//!   InactiveExitTimestampMonotonic` of the unit, asked from the node by a
//!   spawned task (BlueChi blocks its loop on two synchronous calls here).
//! * `AgentJobMetrics(node, unit, method, µs)`: the agent's own measure of
//!   each systemd job, relayed.
//!
//! Enabling tells every online agent (and every agent that registers while
//! enabled) to report; disabling tells them to stop. Both are broadcast
//! signals, as in BlueChi. Invariants: enable/disable are serialised with
//! their export and agent requests; nothing is kept per job here (the job
//! table holds its start).

use crate::error::ApiError;
use crate::escape::job_path;
use crate::jobs::JobInfo;
use crate::metrics::counters::Counters;
use crate::nodes::session::Session;
use crate::outbound::Outbound;
use drover_bus::marshal;
use drover_bus::systemd::UNIT_IFACE;
use drover_protocol::{JobKind, NodeName, Request, Response, UnitName};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use zbus::OwnedVariant;

/// Per request to an agent made for metrics.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct Metrics {
    enabled: AtomicBool,
    /// Serialises enable/disable with their export and agent requests.
    toggle: tokio::sync::Mutex<()>,
    /// What Prometheus is shown, counted as things happen.
    counters: Arc<Counters>,
}

fn tell(session: Arc<Session>, body: Request) {
    tokio::spawn(async move {
        if let Err(e) = session.request(body, AGENT_TIMEOUT).await {
            tracing::warn!(
                node = %session.node(),
                "metrics switch not applied on the agent of node {}: {e}",
                session.node()
            );
        }
    });
}

impl Metrics {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// `EnableMetrics` (`on`) / `DisableMetrics`: serves or withdraws the
    /// object through `out` (when the API is served), then tells every
    /// session `sessions` lists at that moment.
    pub async fn switch(
        &self,
        on: bool,
        out: Option<&Arc<dyn Outbound>>,
        sessions: impl FnOnce() -> Vec<Arc<Session>>,
    ) -> Result<(), ApiError> {
        let _guard = self.toggle.lock().await;
        if self.is_enabled() == on {
            return Err(ApiError::failed(if on {
                "Metrics already enabled"
            } else {
                "Metrics already disabled"
            }));
        }
        if let Some(out) = out {
            let served = out.serve_metrics(on).await;
            if on {
                served.map_err(|e| ApiError::failed(format!("cannot export metrics: {e}")))?;
            }
        }
        self.enabled.store(on, Ordering::SeqCst);
        let body = if on {
            Request::EnableMetrics
        } else {
            Request::DisableMetrics
        };
        for s in sessions() {
            tell(s, body.clone());
        }
        Ok(())
    }

    /// A node registered: it starts with metrics off.
    pub fn node_online(&self, session: &Arc<Session>) {
        if self.is_enabled() {
            tell(session.clone(), Request::EnableMetrics);
        }
    }

    /// The Prometheus counters these events feed.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// A job ended with `result`: counted for Prometheus; and when the
    /// signals are on, for a `start` job, measure the unit on `session()`
    /// (the job's node, if online) and emit `StartUnitJobMetrics` through
    /// `out`, in a task.
    pub fn job_finished(
        &self,
        job: &JobInfo,
        result: &str,
        out: Option<&Arc<dyn Outbound>>,
        session: impl FnOnce() -> Option<Arc<Session>>,
    ) {
        let took = job.started.elapsed();
        self.counters.job_done(job.job_type, result, took);
        let (true, JobKind::Start) = (self.is_enabled(), job.job_type) else {
            return;
        };
        let gross = took.as_micros() as u64;
        let Some(out) = out.cloned() else {
            return;
        };
        let Some(session) = session() else {
            return;
        };
        let job = job.clone();
        tokio::spawn(async move {
            let net = net_start_time(&session, &job.unit).await.unwrap_or(0);
            let path = job_path(job.id);
            out.start_unit_job_metrics(
                job.node.as_str(),
                path.as_str(),
                job.unit.as_str(),
                gross,
                net,
            )
            .await;
        });
    }

    /// `Event::JobMetrics` from a node's agent, relayed through `out`.
    pub async fn agent_job(
        &self,
        out: Option<&Arc<dyn Outbound>>,
        node: &NodeName,
        unit: &UnitName,
        method: &str,
        micros: u64,
    ) {
        if !self.is_enabled() {
            return;
        }
        let Some(out) = out else {
            return;
        };
        let method: String = method
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        out.agent_job_metrics(node.as_str(), unit.as_str(), &method, micros)
            .await;
    }
}

async fn unit_u64(session: &Session, unit: &UnitName, property: &str) -> Option<u64> {
    let request = Request::GetUnitProperty {
        unit: unit.clone(),
        interface: UNIT_IFACE.into(),
        property: property.into(),
    };
    match session.request(request, AGENT_TIMEOUT).await {
        Ok(Response::Value(m)) => marshal::decode::<OwnedVariant>(&m)
            .ok()
            .and_then(|v| u64::try_from(v).ok()),
        _ => None,
    }
}

/// `ActiveEnterTimestampMonotonic - InactiveExitTimestampMonotonic`, 0 if
/// unknown.
async fn net_start_time(session: &Session, unit: &UnitName) -> Option<u64> {
    let enter = unit_u64(session, unit, "ActiveEnterTimestampMonotonic").await?;
    let exit = unit_u64(session, unit, "InactiveExitTimestampMonotonic").await?;
    Some(enter.saturating_sub(exit))
}
