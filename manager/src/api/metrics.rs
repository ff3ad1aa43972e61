//! `org.eclipse.bluechi.Metrics` at `/org/eclipse/bluechi/metrics`, served
//! only while metrics are enabled (`Controller.EnableMetrics`).
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
//! signals, as in BlueChi.

use crate::core::Core;
use crate::error::ApiError;
use crate::escape::job_path;
use crate::jobs::JobInfo;
use crate::session::Session;
use drover_bus::bluechi::{METRICS_IFACE, METRICS_PATH};
use drover_bus::marshal;
use drover_bus::systemd::UNIT_IFACE;
use drover_protocol::{JobKind, NodeName, Request, Response, UnitName};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbus::names::BusName;
use zbus::object_server::SignalEmitter;
use zbus::{OwnedVariant, interface};

/// Per request to an agent made for metrics.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Start times kept at most (jobs that never end must not grow the map).
const MAX_TRACKED: usize = 65_536;

pub struct MetricsObject;

#[interface(name = "org.eclipse.bluechi.Metrics", introspection_docs = false)]
impl MetricsObject {
    #[zbus(signal)]
    async fn start_unit_job_metrics(
        emitter: &SignalEmitter<'_>,
        node_name: &str,
        job_id: &str,
        unit: &str,
        job_measured_time_micros: u64,
        unit_start_prop_time_micros: u64,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn agent_job_metrics(
        emitter: &SignalEmitter<'_>,
        node_name: &str,
        unit: &str,
        method: &str,
        systemd_job_time_micros: u64,
    ) -> zbus::Result<()>;
}

#[derive(Default)]
pub struct Metrics {
    enabled: AtomicBool,
    /// Serialises enable/disable with their export and agent requests.
    toggle: tokio::sync::Mutex<()>,
    starts: Mutex<HashMap<u32, Instant>>,
}

fn tell(session: Arc<Session>, body: Request) {
    tokio::spawn(async move {
        if let Err(e) = session.request(body, AGENT_TIMEOUT).await {
            tracing::warn!(node = %session.node(), "metrics switch not applied on the agent: {e}");
        }
    });
}

impl Metrics {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    pub async fn enable(&self, core: &Core) -> Result<(), ApiError> {
        self.switch(core, true).await
    }

    pub async fn disable(&self, core: &Core) -> Result<(), ApiError> {
        self.switch(core, false).await
    }

    async fn switch(&self, core: &Core, on: bool) -> Result<(), ApiError> {
        let _guard = self.toggle.lock().await;
        if self.is_enabled() == on {
            return Err(ApiError::failed(if on {
                "Metrics already enabled"
            } else {
                "Metrics already disabled"
            }));
        }
        if let Some(conn) = core.connection() {
            let server = conn.object_server();
            if on {
                server
                    .at(METRICS_PATH, MetricsObject)
                    .await
                    .map_err(|e| ApiError::failed(format!("cannot export metrics: {e}")))?;
            } else {
                let _ = server.remove::<MetricsObject, _>(METRICS_PATH).await;
            }
        }
        self.enabled.store(on, Ordering::SeqCst);
        if !on {
            self.starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        let body = if on {
            Request::EnableMetrics
        } else {
            Request::DisableMetrics
        };
        let sessions: Vec<_> = core.registry().sessions().cloned().collect();
        for s in sessions {
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

    pub fn job_started(&self, id: u32) {
        if !self.is_enabled() {
            return;
        }
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        if starts.len() >= MAX_TRACKED {
            starts.clear();
        }
        starts.insert(id, Instant::now());
    }

    /// A job ended: for a `start` job with a known start, compute and emit
    /// `StartUnitJobMetrics` in a task.
    pub fn job_finished(&self, core: &Core, job: &JobInfo) {
        let started = self
            .starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job.id);
        let (Some(started), true, JobKind::Start) = (started, self.is_enabled(), job.job_type)
        else {
            return;
        };
        let gross = started.elapsed().as_micros() as u64;
        let (Some(conn), Ok(session)) = (core.connection().cloned(), core.session_of(&job.node))
        else {
            return;
        };
        let job = job.clone();
        tokio::spawn(async move {
            let net = net_start_time(&session, &job.unit).await.unwrap_or(0);
            let path = job_path(job.id);
            let body = (
                job.node.as_str(),
                path.as_str(),
                job.unit.as_str(),
                gross,
                net,
            );
            if let Err(e) = conn
                .emit_signal(
                    None::<BusName<'_>>,
                    METRICS_PATH,
                    METRICS_IFACE,
                    "StartUnitJobMetrics",
                    &body,
                )
                .await
            {
                tracing::debug!("cannot emit StartUnitJobMetrics: {e}");
            }
        });
    }

    /// `Event::JobMetrics` from a node's agent.
    pub async fn agent_job(
        &self,
        core: &Core,
        node: &NodeName,
        unit: &UnitName,
        method: &str,
        micros: u64,
    ) {
        if !self.is_enabled() {
            return;
        }
        let Some(conn) = core.connection() else {
            return;
        };
        let method: String = method
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        let body = (node.as_str(), unit.as_str(), method.as_str(), micros);
        if let Err(e) = conn
            .emit_signal(
                None::<BusName<'_>>,
                METRICS_PATH,
                METRICS_IFACE,
                "AgentJobMetrics",
                &body,
            )
            .await
        {
            tracing::debug!("cannot emit AgentJobMetrics: {e}");
        }
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
