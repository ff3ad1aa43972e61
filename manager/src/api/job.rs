//! `org.eclipse.bluechi.Job` at `/org/eclipse/bluechi/job/<id>`.
//!
//! Exported between `JobNew` and `JobRemoved` (see [`crate::jobs`]).

use crate::api::handles::Handles;
use crate::error::ApiError;
use crate::job_runner::JobRunner;
use crate::jobs::JobInfo;
use crate::nodes::lifecycle::Nodes;
use drover_protocol::{Request, Response};
use std::sync::Arc;
use std::time::Duration;
use zbus::interface;

pub struct JobObject {
    nodes: Arc<Nodes>,
    jobs: Arc<JobRunner>,
    request_timeout: Duration,
    info: JobInfo,
}

impl JobObject {
    pub fn new(handles: &Handles, info: JobInfo) -> Self {
        Self {
            nodes: handles.nodes.clone(),
            jobs: handles.jobs.clone(),
            request_timeout: handles.request,
            info,
        }
    }
}

#[interface(name = "org.eclipse.bluechi.Job", introspection_docs = false)]
impl JobObject {
    /// Asks the node to cancel the systemd job; the job then ends with
    /// systemd's `canceled` through the usual `JobRemoved`.
    async fn cancel(&self) -> Result<(), ApiError> {
        let session = self.nodes.session_of(&self.info.node)?;
        if session.id() != self.info.session_id {
            // The agent that ran this job is gone (and the job with it).
            return Err(ApiError::offline());
        }
        let request = Request::JobCancel {
            job_id: self.info.id,
        };
        match session.request(request, self.request_timeout).await? {
            Response::Empty => Ok(()),
            _ => Err(ApiError::failed("unexpected reply from the agent")),
        }
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn id(&self) -> u32 {
        self.info.id
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn node(&self) -> String {
        self.info.node.to_string()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn unit(&self) -> String {
        self.info.unit.to_string()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn job_type(&self) -> String {
        self.info.job_type.job_type().to_owned()
    }

    /// `waiting` / `running`; changes are announced by the job runner.
    #[zbus(property)]
    fn state(&self) -> String {
        self.jobs
            .table()
            .state(self.info.id)
            .unwrap_or("running")
            .to_owned()
    }
}
