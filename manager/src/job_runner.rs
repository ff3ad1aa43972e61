//! Running BlueChi jobs: `Node.StartUnit` & co and `StartTransientUnit` turn
//! into a request to the node's agent, and the agent's job events into
//! `Job.State` changes and exactly one `JobRemoved` (the rules are
//! [`crate::jobs`]'s).
//!
//! Invariants: a job id is taken before the request goes out and forgotten
//! without a signal if the request fails; on success the job object is
//! exported and `JobNew` emitted before the method replies, and an early
//! `JobDone` (held by the table) is emitted right after; a session's end ends
//! its jobs with `disconnected`, a shutdown every job with `cancelled due to
//! shutdown`, each with its `JobRemoved`. Job modes are checked against
//! [`drover_protocol::job::JOB_MODES`] before anything is sent; the
//! manager's [`crate::nodes::lifecycle::Phase`] may refuse jobs.
//!
//! The table is a plain mutex, never held across an await.

use crate::error::ApiError;
use crate::escape::job_path;
use crate::jobs::{Done, JobInfo, Jobs, RESULT_DISCONNECTED, RESULT_SHUTDOWN, valid_state};
use crate::metrics::Metrics;
use crate::nodes::lifecycle::Nodes;
use crate::nodes::session::Session;
use crate::outbound::Port;
use drover_bus::bluechi::JOB_IFACE;
use drover_protocol::job::check_mode;
use drover_protocol::{JobKind, NodeName, Request, Response, UnitName};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use zbus::OwnedObjectPath;

/// The manager's jobs (see the module docs).
pub struct JobRunner {
    table: Mutex<Jobs>,
    nodes: Arc<Nodes>,
    outbound: Arc<Port>,
    metrics: Arc<Metrics>,
    /// Per request to an agent.
    request_timeout: Duration,
}

impl JobRunner {
    pub fn new(
        nodes: Arc<Nodes>,
        outbound: Arc<Port>,
        metrics: Arc<Metrics>,
        request_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Jobs::new()),
            nodes,
            outbound,
            metrics,
            request_timeout,
        })
    }

    /// The job table (never held across an await).
    pub fn table(&self) -> MutexGuard<'_, Jobs> {
        // The guarded data is only changed by short, panic-free sections.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Node.StartUnit` & co (see [`crate::jobs`] for the ordering
    /// rules).
    pub async fn start_job(
        &self,
        node: &NodeName,
        unit: &str,
        mode: &str,
        kind: JobKind,
    ) -> Result<OwnedObjectPath, ApiError> {
        let unit = UnitName::new(unit).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        let mode = check_mode(mode).map_err(ApiError::invalid_args)?.to_owned();
        self.start_job_with(node, unit.clone(), kind, move |job_id| Request::UnitJob {
            kind,
            unit,
            mode,
            job_id,
        })
        .await
    }

    /// Runs a job: allocates its id, sends `make(id)` to the node, and on
    /// success exports the job and emits `JobNew` (see [`crate::jobs`]).
    /// `StartTransientUnit` uses it too.
    pub async fn start_job_with(
        &self,
        node: &NodeName,
        unit: UnitName,
        kind: JobKind,
        make: impl FnOnce(u32) -> Request,
    ) -> Result<OwnedObjectPath, ApiError> {
        self.nodes.serving()?;
        if let Some(refusal) = self.nodes.phase().refuses_jobs() {
            return Err(ApiError::failed(refusal));
        }
        let session = self.nodes.session_of(node)?;
        let id = self
            .table()
            .allocate(node.clone(), unit, kind, session.id());
        let body = make(id);
        match session.request(body, self.request_timeout).await {
            Ok(Response::Empty) => {}
            Ok(other) => {
                self.table().forget(id);
                return Err(ApiError::unexpected_reply(&other));
            }
            Err(e) => {
                self.table().forget(id);
                return Err(e);
            }
        }
        let path = job_path(id);
        let info = self.table().info(id).cloned();
        if let Some(out) = self.outbound.get() {
            if let Some(info) = info {
                out.export_job(&info, &path).await;
            }
            out.job_new(id, &path).await;
        }
        let early = self.table().exported(id);
        if let Some((job, result)) = early {
            self.job_removed(&job, &result).await;
        }
        Ok(path)
    }

    /// `Event::JobStateChanged` from `session`'s agent.
    pub async fn state_changed(&self, session: &Session, job_id: u32, state: &str) {
        if !valid_state(state) {
            tracing::debug!(
                node = %session.node(),
                "node {}: ignoring unknown job state for job {job_id}",
                session.node()
            );
            return;
        }
        let changed = self.table().state_changed(session.id(), job_id, state);
        if let (Some(job), Some(out)) = (changed, self.outbound.get()) {
            out.property_changed(job_path(job.id).as_str(), JOB_IFACE, "State", state)
                .await;
        }
    }

    /// `Event::JobDone` from `session`'s agent.
    pub async fn done(&self, session: &Session, job_id: u32, result: &str) {
        let result = sanitize_result(result);
        let done = self.table().job_done(session.id(), job_id, &result);
        match done {
            Done::Remove(job) => self.job_removed(&job, &result).await,
            Done::Held => {}
            Done::Unknown => {
                tracing::debug!(
                    node = %session.node(),
                    "node {}: JobDone for unknown job {job_id}",
                    session.node()
                )
            }
        }
    }

    /// The session `session_id` ended: its jobs end with `disconnected`.
    pub async fn end_session(&self, session_id: u64) {
        let ended = self.table().end_session(session_id, RESULT_DISCONNECTED);
        for job in ended {
            self.job_removed(&job, RESULT_DISCONNECTED).await;
        }
    }

    /// The manager shuts down: every job ends with `cancelled due to
    /// shutdown`, before the bus connection closes.
    pub async fn end_all(&self) {
        let ended = self.table().end_all(RESULT_SHUTDOWN);
        for job in ended {
            self.job_removed(&job, RESULT_SHUTDOWN).await;
        }
    }

    async fn job_removed(&self, job: &JobInfo, result: &str) {
        let path = job_path(job.id);
        self.metrics
            .job_finished(job, result, self.outbound.get(), || {
                self.nodes.session_of(&job.node).ok()
            });
        if let Some(out) = self.outbound.get() {
            out.job_removed(job, &path, result).await;
        }
        tracing::debug!(
            job = job.id,
            node = %job.node,
            unit = %job.unit,
            "job {} ({} on node {}) removed: {result}",
            job.id,
            job.unit,
            job.node
        );
    }
}

/// A job result goes on the bus as is when it looks like systemd's words;
/// anything else (NUL bytes, megabytes of text) is replaced.
fn sanitize_result(result: &str) -> String {
    let ok = !result.is_empty()
        && result.len() <= 64
        && result.chars().all(|c| c.is_ascii_graphic() || c == ' ');
    if ok {
        result.to_owned()
    } else {
        "invalid".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_sanitized() {
        assert_eq!(sanitize_result("done"), "done");
        assert_eq!(
            sanitize_result("cancelled due to shutdown"),
            "cancelled due to shutdown"
        );
        assert_eq!(sanitize_result("a\0b"), "invalid");
        assert_eq!(sanitize_result(&"x".repeat(100)), "invalid");
    }
}
