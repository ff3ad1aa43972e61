//! The node's systemd, behind a narrow trait of our own.
//!
//! [`Systemd`] is everything the agent asks of systemd: list units, queue a
//! unit job (start/stop/restart/reload) and get its job path, cancel a job,
//! daemon-reload, and — once, at start — [`Systemd::subscribe`] to a stream of
//! [`SystemdEvent`]s (job state changes and job removals).
//!
//! Two implementations: [`dbus::ZbusSystemd`] talks to a real systemd over
//! D-Bus; [`fake::FakeSystemd`] is an in-memory stand-in for unit tests of the
//! job tracking and request dispatch logic.
//!
//! Invariants:
//! * Errors are [`RemoteError`]s that carry systemd's D-Bus error name
//!   (`org.freedesktop.systemd1.NoSuchUnit`, …) unchanged, so the manager can
//!   hand them to its D-Bus caller as they are. They are never flattened to a
//!   generic failure when systemd gave a name.
//! * The event stream is subscribed *before* any job is queued (the agent
//!   calls `subscribe` once at start), so a `JobRemoved` that systemd emits
//!   before the `StartUnit` reply reaches us is still seen; the job tracker
//!   (`crate::jobs`) buffers such early events.
//! * Events of one stream arrive in the order systemd sent them.

pub mod dbus;
pub mod fake;

use drover_protocol::{RemoteError, UnitInfo};
use std::future::Future;
use tokio::sync::mpsc;

/// A systemd job object path, e.g. `/org/freedesktop/systemd1/job/42`.
pub type JobPath = String;

/// D-Bus error name used when a request needs something this agent does not do.
pub const ERR_NOT_SUPPORTED: &str = "org.freedesktop.DBus.Error.NotSupported";
/// D-Bus error name systemd gives for a job id it does not know.
pub const ERR_NO_SUCH_JOB: &str = "org.freedesktop.systemd1.NoSuchJob";
/// D-Bus error name systemd gives for a unit it does not know.
pub const ERR_NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// D-Bus error name of a method the peer does not implement (an old systemd).
pub const ERR_UNKNOWN_METHOD: &str = "org.freedesktop.DBus.Error.UnknownMethod";

/// Capacity of the event channel between the D-Bus signal reader and the job
/// tracker. systemd is not the network, but every queue has a bound: when it
/// is full the reader waits (and zbus queues, then stops reading the socket).
pub const EVENT_QUEUE: usize = 1024;

/// The four unit operations that queue a systemd job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    Start,
    Stop,
    Restart,
    Reload,
}

impl JobKind {
    /// systemd's `org.freedesktop.systemd1.Manager` method for this operation.
    pub fn method(self) -> &'static str {
        match self {
            JobKind::Start => "StartUnit",
            JobKind::Stop => "StopUnit",
            JobKind::Restart => "RestartUnit",
            JobKind::Reload => "ReloadUnit",
        }
    }
}

/// What the agent hears from systemd after subscribing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemdEvent {
    /// `Manager.JobRemoved(id, job, unit, result)`: the job finished;
    /// `result` is systemd's word (`done`, `failed`, `canceled`, `timeout`, …).
    JobRemoved {
        id: u32,
        job: JobPath,
        unit: String,
        result: String,
    },
    /// The `State` property of a job changed (`waiting` / `running`).
    JobState { job: JobPath, state: String },
}

/// Receiving end of the subscription; ends when the systemd connection is lost.
pub type EventStream = mpsc::Receiver<SystemdEvent>;

/// The node's systemd manager, as far as the agent needs it.
///
/// Futures are `Send` so request handlers can run as independent tasks.
pub trait Systemd: Send + Sync + 'static {
    /// `Manager.ListUnits`.
    fn list_units(&self) -> impl Future<Output = Result<Vec<UnitInfo>, RemoteError>> + Send;

    /// `Manager.{Start,Stop,Restart,Reload}Unit(unit, mode)`: returns the job path.
    fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        mode: &str,
    ) -> impl Future<Output = Result<JobPath, RemoteError>> + Send;

    /// `Job.Cancel` on the job object.
    fn cancel_job(&self, job: &str) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.Reload` (daemon-reload).
    fn reload(&self) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.Subscribe` plus the signal stream. Called once, before any job.
    fn subscribe(&self) -> impl Future<Output = Result<EventStream, RemoteError>> + Send;
}

/// Where the agent finds systemd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusTarget {
    /// The system bus (default).
    System,
    /// The session bus (`--user`): the user's systemd instance.
    Session,
    /// Any bus address where systemd owns `org.freedesktop.systemd1`.
    Address(String),
}

impl std::fmt::Display for BusTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusTarget::System => f.write_str("the system bus"),
            BusTarget::Session => f.write_str("the session bus"),
            BusTarget::Address(a) => write!(f, "bus {a}"),
        }
    }
}
