//! `start|stop|restart|reload NODE UNIT [--timeout SECONDS]`: run a job on a node and
//! wait for its end.
//!
//! Order matters and is the one BlueChi clients use: subscribe to
//! `Controller.JobRemoved` (and to owner changes of `org.eclipse.bluechi`) *before*
//! calling `Node.StartUnit` etc., because a fast job can end before the call returns;
//! signals that arrive early are kept until we know our job path. The two `AddMatch`
//! and the call go out in one write without waiting in between (`Pipelined`): the bus
//! handles a connection's messages in order, so the order holds, and the command costs
//! one wait for the bus plus the job (zbus proxy signal streams awaited three calls
//! before the job call: `AddMatch`, `GetNameOwner`, `AddMatch`). A `JobRemoved` counts
//! only when it comes from the manager that answered the call.
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
use zbus::message::Type;
use zbus::{MatchRule, Message, MessageStream, OwnedObjectPath};

use drover_bus::bluechi::{self, node_path};
use drover_protocol::job::DEFAULT_JOB_MODE;
use drover_protocol::{JobKind, NodeName, UnitName};

use crate::client::{CallContext, METHOD_TIMEOUT};
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::output::json;
use crate::parse::{parse_job_unit, parse_node, parse_timeout};

/// How many `JobRemoved` of this node and unit are kept while the call is in flight
/// (there are normally zero or one).
const EARLY_SIGNALS_MAX: usize = 64;

// Arguments shared by the four job commands (a plain comment: a doc comment would
// become their help text, since clap applies it after the command's own).
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

job_command!(Start, JobKind::Start);
job_command!(Stop, JobKind::Stop);
job_command!(Restart, JobKind::Restart);
job_command!(Reload, JobKind::Reload);

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

/// The bus daemon's own name, path and interface (sender of `NameOwnerChanged`).
const DBUS: &str = "org.freedesktop.DBus";
const DBUS_PATH: &str = "/org/freedesktop/DBus";

/// How waiting for the job ended, short of a result.
enum WaitEnd {
    /// The call itself failed.
    Call(zbus::Error),
    /// A subscription (`AddMatch`) was refused.
    Subscribe(zbus::Error),
    /// The manager's name changed owner; with the job path.
    ManagerGone(String),
    BusClosed,
    /// `--timeout` ran out; with the job path once the call had returned.
    Timeout(Option<String>),
    /// The manager did not answer the call within [`METHOD_TIMEOUT`].
    NoAnswer,
}

/// The three messages of a job command, sent in one write: the two subscriptions
/// (`AddMatch`) and the call. The bus daemon handles a connection's messages in order,
/// so both matches are in place before the manager sees the call; waiting for each
/// answer in turn would cost two round trips more.
struct Pipelined {
    matches: [Message; 2],
    call: Message,
}

impl Pipelined {
    fn new(op: JobKind, node: &NodeName, unit: &UnitName) -> zbus::Result<Pipelined> {
        // Only JobRemoved of this node and unit are delivered (the bus filters on the
        // string arguments), so a busy fleet's other jobs do not reach us.
        let removed = MatchRule::builder()
            .msg_type(Type::Signal)
            .sender(bluechi::BUS_NAME)
            .path(bluechi::CONTROLLER_PATH)
            .interface(bluechi::CONTROLLER_IFACE)
            .member("JobRemoved")
            .arg(2, node.as_str())
            .arg(3, unit.as_str())
            .build()?;
        // Any change of owner of the manager's name means the manager that holds our job
        // is gone (a restarted manager knows nothing of it).
        let owner = MatchRule::builder()
            .msg_type(Type::Signal)
            .sender(DBUS)
            .path(DBUS_PATH)
            .interface(DBUS)
            .member("NameOwnerChanged")
            .arg(0, bluechi::BUS_NAME)
            .build()?;
        let add_match = |rule: MatchRule<'_>| {
            Message::method_call(DBUS_PATH, "AddMatch")
                .destination(DBUS)
                .interface(DBUS)
                .build(&(rule.to_string(),))
        };
        Ok(Pipelined {
            matches: [add_match(removed)?, add_match(owner)?],
            call: Message::method_call(node_path(node.as_str()), op.method())
                .destination(bluechi::BUS_NAME)
                .interface(bluechi::NODE_IFACE)
                .build(&(unit.as_str(), DEFAULT_JOB_MODE))?,
        })
    }
}

/// What arrives for a job command, in order, until its end.
#[derive(Default)]
struct JobWatch {
    /// The job path and the manager's unique name, once the call returned.
    job: Option<(String, String)>,
    /// `JobRemoved` (sender, job, result) that came before the call returned; there
    /// are normally zero or one. Bounded: ours, if it comes early, is among the newest.
    early: VecDeque<(String, String, String)>,
    /// The manager's name changed owner after we subscribed.
    owner_changed: bool,
}

impl JobWatch {
    /// Takes one incoming message; `Some` once the job's end is known.
    fn take(&mut self, msg: &Message, sent: &Pipelined) -> Option<Result<String, WaitEnd>> {
        let header = msg.header();
        if let Some(reply_to) = header.reply_serial() {
            let is_error = msg.message_type() == Type::Error;
            if reply_to == sent.call.primary_header().serial_num() {
                if is_error {
                    return Some(Err(WaitEnd::Call(zbus::Error::from(msg.clone()))));
                }
                let manager = header.sender().map(|s| s.to_string()).unwrap_or_default();
                let job = match msg.body().deserialize::<OwnedObjectPath>() {
                    Ok(path) => path.to_string(),
                    Err(e) => return Some(Err(WaitEnd::Call(e))),
                };
                let result = self
                    .early
                    .iter()
                    .find(|(sender, path, _)| *sender == manager && *path == job)
                    .map(|(.., result)| result.clone());
                self.job = Some((job, manager));
                return result.map(Ok);
            }
            let to_match = sent
                .matches
                .iter()
                .any(|m| m.primary_header().serial_num() == reply_to);
            if to_match && is_error {
                return Some(Err(WaitEnd::Subscribe(zbus::Error::from(msg.clone()))));
            }
            return None;
        }
        if msg.message_type() != Type::Signal {
            return None;
        }
        let sender = header.sender().map(|s| s.as_str()).unwrap_or_default();
        let member = header.member().map(|m| m.as_str()).unwrap_or_default();
        let interface = header.interface().map(|i| i.as_str()).unwrap_or_default();
        if sender == DBUS && interface == DBUS && member == "NameOwnerChanged" {
            let owned = msg.body().deserialize::<(String, String, String)>();
            if owned.is_ok_and(|(name, ..)| name == bluechi::BUS_NAME) {
                self.owner_changed = true;
                if self.job.is_some() {
                    return Some(Err(WaitEnd::ManagerGone(String::new())));
                }
            }
            return None;
        }
        if interface != bluechi::CONTROLLER_IFACE || member != "JobRemoved" {
            return None;
        }
        // A signal that does not parse is not ours; keep waiting.
        let Ok((_, path, _, _, result)) = msg
            .body()
            .deserialize::<(u32, OwnedObjectPath, String, String, String)>()
        else {
            return None;
        };
        match &self.job {
            // Only the manager that took the call speaks for its job: anyone can send
            // a signal to our unique name.
            Some((job, manager)) => {
                (sender == manager && path.as_str() == job).then_some(Ok(result))
            }
            None => {
                if self.early.len() == EARLY_SIGNALS_MAX {
                    self.early.pop_front();
                }
                self.early
                    .push_back((sender.to_owned(), path.to_string(), result));
                None
            }
        }
    }
}

/// Sends the job's messages and follows what comes back until the job's end, the
/// manager's departure, the bus closing, or a deadline.
async fn follow_job(
    conn: &zbus::Connection,
    op: JobKind,
    args: &JobArgs,
    deadline: Option<Instant>,
) -> Result<(String, String), WaitEnd> {
    // Every message the connection receives, taken before anything is sent.
    let mut incoming = MessageStream::from(conn);
    let sent = Pipelined::new(op, &args.node, &args.unit).map_err(WaitEnd::Call)?;
    let all = [
        sent.matches[0].clone(),
        sent.matches[1].clone(),
        sent.call.clone(),
    ];
    conn.send_all(&all).await.map_err(WaitEnd::Call)?;
    let mut watch = JobWatch::default();
    let no_answer = Instant::now() + METHOD_TIMEOUT;
    loop {
        // Until the call returns, the manager has METHOD_TIMEOUT to answer; `--timeout`
        // bounds the whole command.
        let until = match (&watch.job, deadline) {
            (None, Some(d)) => Some(d.min(no_answer)),
            (None, None) => Some(no_answer),
            (Some(_), d) => d,
        };
        let next = match until {
            Some(until) => match tokio::time::timeout_at(until, incoming.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let job = watch.job.map(|(job, _)| job);
                    return Err(match deadline {
                        Some(d) if Instant::now() >= d => WaitEnd::Timeout(job),
                        _ => WaitEnd::NoAnswer,
                    });
                }
            },
            None => incoming.next().await,
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            Some(Err(_)) => continue,
            None => return Err(WaitEnd::BusClosed),
        };
        if let Some(end) = watch.take(&msg, &sent) {
            let job = watch.job.as_ref().map(|(job, _)| job.clone());
            return match (end, job) {
                (Ok(result), Some(job)) => Ok((job, result)),
                (Err(WaitEnd::ManagerGone(_)), Some(job)) => Err(WaitEnd::ManagerGone(job)),
                (Err(e), _) => Err(e),
                (Ok(_), None) => Err(WaitEnd::BusClosed),
            };
        }
        if watch.owner_changed && watch.job.is_some() {
            let job = watch.job.map(|(job, _)| job).unwrap_or_default();
            return Err(WaitEnd::ManagerGone(job));
        }
    }
}

async fn run_job(op: JobKind, args: JobArgs, ctx: &mut Context) -> Result<(), CtlError> {
    let deadline = args.timeout.map(|d| Instant::now() + d);
    let client = ctx.client().await?;
    let what = format!("{} of {} on node {}", op.method(), args.unit, args.node);
    let call_ctx = CallContext::on(&what, &args.node, Some(&args.unit));

    let (job, result) = match follow_job(client.connection(), op, &args, deadline).await {
        Ok(done) => done,
        Err(WaitEnd::Call(e) | WaitEnd::Subscribe(e)) => {
            return Err(client.classify(e, call_ctx).await);
        }
        Err(WaitEnd::NoAnswer) => {
            let e =
                zbus::Error::InputOutput(std::io::Error::from(std::io::ErrorKind::TimedOut).into());
            return Err(client.classify(e, call_ctx).await);
        }
        Err(WaitEnd::Timeout(job)) => {
            return Err(CtlError::Timeout {
                after: args.timeout.unwrap_or_default(),
                job,
                operation: op.method(),
                unit: args.unit.to_string(),
                node: args.node.to_string(),
            });
        }
        Err(WaitEnd::ManagerGone(job)) => {
            return Err(CtlError::ManagerVanished {
                bus: client.target().to_string(),
                job,
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
        job,
        result,
    };
    let why = if outcome.result == "dependency" {
        match client.node(&args.node).await {
            Ok(node) => failed_dependencies(&node, &args.node, &args.unit).await,
            Err(_) => String::new(),
        }
    } else {
        String::new()
    };
    let text = if ctx.json() {
        json(std::slice::from_ref(&outcome))
    } else {
        outcome.line()
    };
    ctx.emit(&text)?;
    if outcome.succeeded() {
        return Ok(());
    }
    Err(CtlError::JobFailed {
        operation: outcome.operation,
        unit: outcome.unit,
        node: outcome.node,
        result: outcome.result,
        why,
    })
}

/// The dependency properties whose failure makes a job end `dependency`.
const HARD_DEPENDENCIES: &[&str] = &["Requires", "Requisite", "BindsTo"];

/// Which of `unit`'s hard dependencies are not active, one line each (each
/// starting with a newline), and where a drover proxy's reason is. Best
/// effort: what cannot be read is left out.
async fn failed_dependencies(
    node_proxy: &drover_bus::client::NodeProxy<'static>,
    node: &NodeName,
    unit: &UnitName,
) -> String {
    const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
    let Ok(props) = node_proxy
        .get_unit_properties(unit.as_str(), UNIT_IFACE)
        .await
    else {
        return String::new();
    };
    let mut lines = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for key in HARD_DEPENDENCIES {
        let Some(value) = props.get(*key) else {
            continue;
        };
        let Ok(deps) = <Vec<String>>::try_from(value.clone()) else {
            continue;
        };
        for dep in deps {
            if !seen.insert(dep.clone()) {
                continue;
            }
            let Ok(state) = node_proxy.get_unit_properties(&dep, UNIT_IFACE).await else {
                continue;
            };
            let text = |k: &str| {
                state
                    .get(k)
                    .and_then(|v| String::try_from(v.clone()).ok())
                    .unwrap_or_default()
            };
            let (active, sub) = (text("ActiveState"), text("SubState"));
            if active == "active" || active == "activating" || active == "reloading" {
                continue;
            }
            lines.push_str(&format!(
                "\n  {key}={dep} on node {node} is {active} ({sub})"
            ));
            if let Some(proxy) = drover_protocol::ProxyInstance::from_unit_name(&dep) {
                lines.push_str(&format!(
                    " ({} on node {}): why is in journalctl -u {dep} on node {node}",
                    proxy.unit(),
                    proxy.node()
                ));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(result: &str) -> JobOutcome {
        JobOutcome {
            node: "node-a".into(),
            unit: "web.service".into(),
            operation: JobKind::Restart.method(),
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
        let all = [
            JobKind::Start,
            JobKind::Stop,
            JobKind::Restart,
            JobKind::Reload,
        ];
        let names: Vec<_> = all.iter().map(|o| o.method()).collect();
        assert_eq!(
            names,
            ["StartUnit", "StopUnit", "RestartUnit", "ReloadUnit"]
        );
    }
}
