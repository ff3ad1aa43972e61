//! `start|stop|restart|reload NODE UNIT [--timeout SECONDS]`: run a job on a node and
//! wait for its end.
//!
//! Order matters and is the one BlueChi clients use: subscribe to
//! `Controller.JobRemoved` (and to owner changes of `org.eclipse.bluechi`) *before*
//! calling `Node.StartUnit` etc., because a fast job can end before the call returns;
//! signals that arrive early wait in the stream until we know our job path.
//!
//! Prints `Unit UNIT StartUnit operation result: RESULT` like bluechictl, but exits 0
//! only for `done` (bluechictl always exits 0). A job always ends with `JobRemoved` in
//! drover (node disconnect gives `disconnected`); if the manager itself leaves the
//! bus, or `--timeout` runs out, droverctl says so and exits 1 instead of hanging.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::time::Instant;

use drover_protocol::{NodeName, UnitName};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_job_unit, parse_node, parse_timeout};

/// How many `JobRemoved` of this node and unit are kept while the call is in flight
/// (there are normally zero or one).
const EARLY_SIGNALS_MAX: usize = 64;

/// The mode every job is queued with, as bluechictl does.
pub const JOB_MODE: &str = "replace";

/// Which Node method a command calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOp {
    Start,
    Stop,
    Restart,
    Reload,
}

impl JobOp {
    /// The D-Bus method name, also printed in the result line.
    pub fn method(self) -> &'static str {
        match self {
            JobOp::Start => "StartUnit",
            JobOp::Stop => "StopUnit",
            JobOp::Restart => "RestartUnit",
            JobOp::Reload => "ReloadUnit",
        }
    }
}

/// Arguments shared by the four job commands.
#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// Node the unit lives on
    #[arg(value_name = "NODE", value_parser = parse_node)]
    pub node: NodeName,

    /// Unit name; without a type suffix '.service' is assumed
    #[arg(value_name = "UNIT", value_parser = parse_job_unit)]
    pub unit: UnitName,

    /// Give up waiting after this many seconds (default: wait until the job ends)
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
}

macro_rules! job_command {
    ($name:ident, $op:expr) => {
        #[derive(Debug, clap::Args)]
        pub struct $name {
            #[command(flatten)]
            pub args: JobArgs,
        }

        impl Run for $name {
            async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
                run_job($op, self.args, ctx).await
            }
        }
    };
}

job_command!(Start, JobOp::Start);
job_command!(Stop, JobOp::Stop);
job_command!(Restart, JobOp::Restart);
job_command!(Reload, JobOp::Reload);

/// The JSON form of a finished job. Keys are a stable interface.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct JobOutcome {
    pub node: String,
    pub unit: String,
    pub operation: &'static str,
    pub job: String,
    pub result: String,
}

impl JobOutcome {
    /// bluechictl's result line.
    pub fn line(&self) -> String {
        format!(
            "Unit {} {} operation result: {}\n",
            self.unit, self.operation, self.result
        )
    }

    pub fn succeeded(&self) -> bool {
        self.result == "done"
    }
}

/// How the wait for `JobRemoved` ended, short of a result.
enum WaitEnd {
    ManagerGone,
    BusClosed,
}

async fn run_job(op: JobOp, args: JobArgs, ctx: &mut Context) -> Result<(), CtlError> {
    let deadline = args.timeout.map(|d| Instant::now() + d);
    let timed_out = |job: Option<String>| CtlError::Timeout {
        after: args.timeout.unwrap_or_default(),
        job,
        operation: op.method(),
        unit: args.unit.to_string(),
        node: args.node.to_string(),
    };

    let client = ctx.client().await?;
    let controller = client.controller().await?;
    let node = client.node(&args.node).await?;
    let what = format!("{} of {} on node {}", op.method(), args.unit, args.node);
    let call_ctx = CallContext::on(&what, &args.node, Some(&args.unit));

    // Subscribe first: the job may end before the call below returns. Only
    // JobRemoved of this node and unit are delivered (the bus filters on the string
    // arguments), so a busy fleet's other jobs do not flood us.
    let filter = [(2u8, args.node.as_str()), (3u8, args.unit.as_str())];
    let mut removed = match controller.receive_job_removed_with_args(&filter).await {
        Ok(s) => s,
        Err(e) => return Err(client.classify(e, call_ctx).await),
    };
    let mut owner = match controller.inner().receive_owner_changed().await {
        Ok(s) => s,
        Err(e) => return Err(client.classify(e, call_ctx).await),
    };

    let unit = args.unit.as_str();
    let call = async {
        match op {
            JobOp::Start => node.start_unit(unit, JOB_MODE).await,
            JobOp::Stop => node.stop_unit(unit, JOB_MODE).await,
            JobOp::Restart => node.restart_unit(unit, JOB_MODE).await,
            JobOp::Reload => node.reload_unit(unit, JOB_MODE).await,
        }
    };
    // While the call is in flight, keep draining JobRemoved into `early`: zbus
    // applies back-pressure when a signal queue is full, which would also hold up
    // the reply we are waiting for. Ours, if it comes early, is among the newest, so
    // the bounded buffer drops the oldest.
    let mut early: VecDeque<(String, String)> = VecDeque::new();
    let call_phase = async {
        tokio::pin!(call);
        loop {
            tokio::select! {
                reply = &mut call => return reply,
                Some(signal) = removed.next() => {
                    if let Ok(a) = signal.args() {
                        if early.len() == EARLY_SIGNALS_MAX {
                            early.pop_front();
                        }
                        early.push_back((a.job().to_string(), a.result().to_string()));
                    }
                }
            }
        }
    };
    let called = match deadline {
        Some(d) => tokio::time::timeout_at(d, call_phase)
            .await
            .map_err(|_| timed_out(None))?,
        None => call_phase.await,
    };
    let job = match called {
        Ok(path) => path,
        Err(e) => return Err(client.classify(e, call_ctx).await),
    };

    let already = early
        .iter()
        .find(|(path, _)| path.as_str() == job.as_str())
        .map(|(_, result)| result.clone());
    let wait = async {
        if let Some(result) = already {
            return Ok(result);
        }
        loop {
            tokio::select! {
                signal = removed.next() => {
                    let Some(signal) = signal else { return Err(WaitEnd::BusClosed) };
                    // A signal that does not parse is not ours; keep waiting.
                    let Ok(a) = signal.args() else { continue };
                    if a.job().as_str() == job.as_str() {
                        return Ok(a.result().to_string());
                    }
                }
                change = owner.next() => {
                    // Any change of owner means the manager that holds our job is gone
                    // (a restarted manager knows nothing of it).
                    if change.is_some() {
                        return Err(WaitEnd::ManagerGone);
                    }
                    return Err(WaitEnd::BusClosed);
                }
            }
        }
    };
    let waited = match deadline {
        Some(d) => tokio::time::timeout_at(d, wait)
            .await
            .map_err(|_| timed_out(Some(job.to_string())))?,
        None => wait.await,
    };
    let result = match waited {
        Ok(r) => r,
        Err(WaitEnd::ManagerGone) => {
            return Err(CtlError::ManagerVanished {
                bus: client.target().to_string(),
                job: job.to_string(),
                operation: op.method(),
                unit: args.unit.to_string(),
                node: args.node.to_string(),
            });
        }
        Err(WaitEnd::BusClosed) => {
            return Err(CtlError::BusClosed {
                bus: client.target().to_string(),
            });
        }
    };

    let outcome = JobOutcome {
        node: args.node.to_string(),
        unit: args.unit.to_string(),
        operation: op.method(),
        job: job.to_string(),
        result,
    };
    let text = if ctx.json() {
        json(std::slice::from_ref(&outcome))
    } else {
        outcome.line()
    };
    ctx.emit(&text)?;
    if outcome.succeeded() {
        Ok(())
    } else {
        Err(CtlError::JobFailed {
            operation: outcome.operation,
            unit: outcome.unit,
            node: outcome.node,
            result: outcome.result,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(result: &str) -> JobOutcome {
        JobOutcome {
            node: "node-a".into(),
            unit: "web.service".into(),
            operation: JobOp::Restart.method(),
            job: "/org/eclipse/bluechi/job/7".into(),
            result: result.into(),
        }
    }

    #[test]
    fn result_line_is_bluechictls() {
        assert_eq!(
            outcome("done").line(),
            "Unit web.service RestartUnit operation result: done\n"
        );
        assert!(outcome("done").succeeded());
        for r in [
            "failed",
            "canceled",
            "disconnected",
            "cancelled due to shutdown",
            "",
        ] {
            assert!(!outcome(r).succeeded(), "{r}");
        }
    }

    #[test]
    fn json_shape() {
        let v: serde_json::Value =
            serde_json::from_str(&json(std::slice::from_ref(&outcome("done")))).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"node": "node-a", "unit": "web.service",
                "operation": "RestartUnit", "job": "/org/eclipse/bluechi/job/7", "result": "done"}])
        );
    }

    #[test]
    fn methods() {
        let all = [JobOp::Start, JobOp::Stop, JobOp::Restart, JobOp::Reload];
        let names: Vec<_> = all.iter().map(|o| o.method()).collect();
        assert_eq!(
            names,
            ["StartUnit", "StopUnit", "RestartUnit", "ReloadUnit"]
        );
    }
}
