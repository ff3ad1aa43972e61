//! The node's systemd, behind a narrow trait of our own.
//!
//! [`Systemd`] is everything the agent asks of systemd: list units, queue a
//! unit job (start/stop/restart/reload) and get its job path, cancel a job,
//! daemon-reload, and — once, at start — [`Systemd::subscribe`] to a stream of
//! [`SystemdEvent`]s (job state changes and job removals).
//!
//! For unit subscriptions there is a second, separate stream:
//! [`Systemd::unit_stream`] yields [`UnitSignal`]s (`UnitNew`,
//! `UnitRemoved`, `PropertiesChanged` of unit objects, daemon-reloads, and
//! the `JobNew`/`JobRemoved` the unit fence needs). It carries only what the
//! agent follows ([`Systemd::follow`]: every unit, or the units the manager
//! watches, or none of them), so an agent nobody watches does not wake up
//! for every unit change on the node, and one that watches a few units not
//! for the changes of the others. Each change of what is followed is marked
//! in the stream by a [`UnitSignal::Snapshot`] of what systemd has loaded of
//! it, in the order systemd answered.
//!
//! The remaining methods are plain pass-throughs of the node API (unit
//! properties, unit files, kill, freeze, …); values whose D-Bus type is only
//! known at run time travel as [`Marshalled`] (see `drover_bus::marshal`).
//!
//! Two implementations: `super::dbus::ZbusSystemd` talks to a real systemd
//! over D-Bus; `super::fake::FakeSystemd` is an in-memory stand-in for unit
//! tests of the job tracking and request dispatch logic. This file names
//! neither: the trait is the boundary, they sit behind it.
//!
//! Invariants:
//! * Errors are [`RemoteError`]s that carry systemd's D-Bus error name
//!   (`org.freedesktop.systemd1.NoSuchUnit`, …) unchanged, so the manager can
//!   hand them to its D-Bus caller as they are. They are never flattened to a
//!   generic failure when systemd gave a name.
//! * The event stream is subscribed *before* any job is queued (the agent
//!   calls `subscribe` once at start), so a `JobRemoved` that systemd emits
//!   before the `StartUnit` reply reaches us is still seen; the job tracker
//!   (`crate::jobs`) buffers such early events (`crate::early_events`).
//! * Events of one stream arrive in the order systemd sent them.

use drover_bus::marshal;
use drover_protocol::{JobKind, Marshalled, RemoteError, Scope, UnitInfo, UnitName};
use std::collections::BTreeMap;
use std::future::Future;
use tokio::sync::mpsc;

/// A systemd job object path, e.g. `/org/freedesktop/systemd1/job/42`.
pub type JobPath = String;

/// Capacity of the event channel between the D-Bus signal reader and the job
/// tracker. systemd is not the network, but every queue has a bound: when it
/// is full the reader waits (and zbus queues, then stops reading the socket).
pub const EVENT_QUEUE: usize = 1024;

/// What the agent hears from systemd after subscribing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemdEvent {
    /// `Manager.JobNew(id, job, unit)`: systemd queued a job.
    JobNew { id: u32, job: JobPath, unit: String },
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

/// What the unit stream carries ([`Systemd::unit_stream`]). Unit names are
/// systemd's, not yet validated.
#[derive(Debug, Clone)]
pub enum UnitSignal {
    /// `Manager.UnitNew`: the unit was loaded.
    New { unit: String },
    /// `Manager.UnitRemoved`: the unit was unloaded.
    Removed { unit: String },
    /// `Manager.Reloading(active)`: a daemon-reload starts (`true`) or has
    /// finished (`false`). During one, systemd unloads and re-creates every
    /// unit, announcing each with `UnitRemoved` and a later `UnitNew`
    /// without any state change signal.
    Reloading { active: bool },
    /// `Manager.JobNew`: what follows reflects states after `job` was
    /// queued (see `crate::deps::unit_fence`).
    JobNew { job: String, unit: String },
    /// `Manager.JobRemoved`: every unit signal systemd sent before it has
    /// been delivered (see `crate::deps::unit_fence`).
    JobRemoved { job: String },
    /// The stream follows `followed` from here on ([`Systemd::follow`] with
    /// this `id`): `units` is what systemd had loaded of it when it answered.
    /// Signals before it in the stream are of what was followed before;
    /// signals after it are newer than `units`.
    Snapshot {
        id: u64,
        followed: Followed,
        units: Vec<UnitInfo>,
    },
    /// `PropertiesChanged` on the unit's object for one interface.
    Changed {
        unit: String,
        interface: String,
        /// The changed properties, `a{sv}`, encoded only when wanted.
        properties: ChangedProperties,
        /// `ActiveState` / `SubState` when the signal carries them
        /// (interface `org.freedesktop.systemd1.Unit`).
        active_state: Option<String>,
        sub_state: Option<String>,
    },
}

/// The changed properties of one `PropertiesChanged` signal.
///
/// Most unit signals on a node concern units no subscription watches, and a
/// unit's service interface alone carries dozens of properties. So the real
/// systemd's signal is kept as it came (a cheap reference to the message) and
/// decoded into a [`Marshalled`] only for a watched unit
/// ([`ChangedProperties::marshal`]); only `ActiveState`/`SubState` are read
/// from every signal. In `drover-bench proxy` this cut the agent's CPU time on
/// the target node by about a fifth.
#[derive(Clone, Debug)]
pub struct ChangedProperties(Changed);

#[derive(Clone, Debug)]
enum Changed {
    Encoded(Marshalled),
    Signal(zbus::Message),
}

impl ChangedProperties {
    /// The `a{sv}` of a `PropertiesChanged` message, decoded on demand.
    pub fn from_signal(msg: zbus::Message) -> Self {
        Self(Changed::Signal(msg))
    }

    /// The properties as the protocol carries them; an error when the
    /// signal's body does not decode.
    pub fn marshal(&self) -> Result<Marshalled, RemoteError> {
        match &self.0 {
            Changed::Encoded(m) => Ok(m.clone()),
            Changed::Signal(msg) => changed_properties(msg),
        }
    }
}

impl From<Marshalled> for ChangedProperties {
    fn from(m: Marshalled) -> Self {
        Self(Changed::Encoded(m))
    }
}

/// The changed properties of a `PropertiesChanged` message, as a
/// [`Marshalled`] `a{sv}` (see [`ChangedProperties`]).
fn changed_properties(msg: &zbus::Message) -> Result<Marshalled, RemoteError> {
    // Ordered: systemd's order is what BlueChi forwards and clients show.
    let (_, changed, _): (String, marshal::OrderedProperties, Vec<String>) = msg
        .body()
        .deserialize()
        .map_err(|e| RemoteError::failed(format!("malformed PropertiesChanged signal: {e}")))?;
    marshal::encode(&changed)
}

/// Receiving end of the unit stream: each signal with the
/// [`Systemd::Position`] at which the agent received it.
pub type UnitSignalStream<P> = mpsc::Receiver<(P, UnitSignal)>;

/// What the unit stream follows besides the jobs (see [`Systemd::follow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// Every unit (BlueChi's `*`, health's hold of every unit, or more
    /// units than [`MAX_FOLLOWED_UNITS`]): every signal of systemd
    /// ([`Scope::Everything`]), or its units' `Unit` interface's property
    /// changes and its manager's signals alone ([`Scope::State`]).
    Every(Scope),
    /// These units only, each with what is followed of it: every interface's
    /// property changes ([`Scope::Everything`]) or the `Unit` interface's
    /// alone ([`Scope::State`], which carries `ActiveState` and `SubState`);
    /// none at all when empty.
    Units(BTreeMap<UnitName, Scope>),
}

/// Most units followed one by one; beyond, the unit stream follows every
/// unit. Each unit followed by itself costs the bus two match rules (its
/// object, and `UnitNew`/`UnitRemoved` of its name), and a bus limits them
/// per connection (dbus-daemon's system bus: 512).
pub const MAX_FOLLOWED_UNITS: usize = 64;

impl Followed {
    /// Nothing but the jobs.
    pub fn nothing() -> Self {
        Self::Units(BTreeMap::new())
    }

    /// `units` one by one, a unit named twice with the wider of its scopes,
    /// or every unit when they are more than [`MAX_FOLLOWED_UNITS`].
    pub fn units(units: impl IntoIterator<Item = (UnitName, Scope)>) -> Self {
        let mut merged: BTreeMap<UnitName, Scope> = BTreeMap::new();
        for (unit, scope) in units {
            let entry = merged.entry(unit).or_insert(scope);
            *entry = (*entry).max(scope);
        }
        if merged.len() > MAX_FOLLOWED_UNITS {
            Self::Every(merged.into_values().max().unwrap_or(Scope::State))
        } else {
            Self::Units(merged)
        }
    }

    /// Whether the signals of `unit` are followed.
    pub fn covers(&self, unit: &UnitName) -> bool {
        match self {
            Self::Every(_) => true,
            Self::Units(units) => units.contains_key(unit),
        }
    }
}

impl std::fmt::Display for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Every(Scope::Everything) => f.write_str("*"),
            Self::Every(Scope::State) => f.write_str("*(state)"),
            Self::Units(units) => {
                let names: Vec<String> = units
                    .iter()
                    .map(|(u, scope)| match scope {
                        Scope::Everything => u.to_string(),
                        Scope::State => format!("{u}(state)"),
                    })
                    .collect();
                write!(f, "[{}]", names.join(" "))
            }
        }
    }
}

/// `(type, file, destination)` of `EnableUnitFiles` and friends.
pub type UnitFileChange = (String, String, String);

/// What [`Systemd::job_info`] tells about one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// `JobType`: `start`, `stop`, `restart`, `verify-active`, `reload`, `nop`.
    pub kind: String,
    /// `State`: `waiting` or `running`.
    pub state: String,
}

/// The node's systemd manager, as far as the agent needs it.
///
/// Futures are `Send` so request handlers can run as independent tasks.
pub trait Systemd: Send + Sync + 'static {
    /// Where a message from systemd stands in the order the agent received
    /// systemd's messages. systemd answers and signals on one connection, in
    /// the order it acts, so a signal received before a `ListUnits` answer
    /// says nothing the answer does not already include: its state is as old
    /// as the answer or older (see `crate::units::rules`, "Snapshots").
    type Position: Copy + Ord + Default + Send + Sync + std::fmt::Debug + 'static;

    /// `Manager.ListUnits`.
    fn list_units(&self) -> impl Future<Output = Result<Vec<UnitInfo>, RemoteError>> + Send;

    /// `Manager.ListUnits`, with the position of its answer among the unit
    /// signals of [`Systemd::unit_stream`].
    fn list_units_at(
        &self,
    ) -> impl Future<Output = Result<(Vec<UnitInfo>, Self::Position), RemoteError>> + Send;

    /// `Manager.{Start,Stop,Restart,Reload}Unit(unit, mode)`: returns the job path.
    fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        mode: &str,
    ) -> impl Future<Output = Result<JobPath, RemoteError>> + Send;

    /// Type and state of `job` (`Properties.GetAll` on the job object); an
    /// error once the job is gone.
    fn job_info(&self, job: &str) -> impl Future<Output = Result<JobInfo, RemoteError>> + Send;

    /// `Job.Cancel` on the job object.
    fn cancel_job(&self, job: &str) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.Reload` (daemon-reload).
    fn reload(&self) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.Subscribe` plus the signal stream. Called once, before any job.
    fn subscribe(&self) -> impl Future<Output = Result<EventStream, RemoteError>> + Send;

    /// The unit stream, following nothing but the jobs (`JobNew`,
    /// `JobRemoved`) until [`Systemd::follow`] says more. Its match rules are
    /// in place when this returns, so nothing emitted afterwards is missed.
    /// Called once.
    fn unit_stream(
        &self,
    ) -> impl Future<Output = Result<UnitSignalStream<Self::Position>, RemoteError>> + Send;

    /// Makes the unit stream follow `followed` (and the jobs) instead of what
    /// it followed so far: the match rules `followed` needs are in place,
    /// then systemd is asked what it has loaded of it, and the answer goes
    /// into the stream as [`UnitSignal::Snapshot`] with this `id`, at its
    /// place among the signals. Signals of what was followed before come
    /// before it; after it, only `followed`'s. Rules nothing follows any more
    /// are taken off the bus. An error changes nothing.
    fn follow(
        &self,
        followed: &Followed,
        id: u64,
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Properties.GetAll(interface)` on the unit's object (`GetUnit`, falling
    /// back to `LoadUnit`); an empty interface means all of them. `a{sv}`.
    fn get_unit_properties(
        &self,
        unit: &str,
        interface: &str,
    ) -> impl Future<Output = Result<Marshalled, RemoteError>> + Send;

    /// `Properties.Get(interface, property)` on the unit's object. `v`.
    fn get_unit_property(
        &self,
        unit: &str,
        interface: &str,
        property: &str,
    ) -> impl Future<Output = Result<Marshalled, RemoteError>> + Send;

    /// `Manager.SetUnitProperties(unit, runtime, a(sv))`.
    fn set_unit_properties(
        &self,
        unit: &str,
        runtime: bool,
        properties: &Marshalled,
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Unit.Freeze` (`freeze == true`) or `Unit.Thaw` on the unit's object.
    fn freeze_unit(
        &self,
        unit: &str,
        freeze: bool,
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.KillUnit(unit, whom, signal)`.
    fn kill_unit(
        &self,
        unit: &str,
        whom: &str,
        signal: i32,
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.EnableUnitFiles`: (carries install info, changes).
    fn enable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
        force: bool,
    ) -> impl Future<Output = Result<(bool, Vec<UnitFileChange>), RemoteError>> + Send;

    /// `Manager.DisableUnitFiles`.
    fn disable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
    ) -> impl Future<Output = Result<Vec<UnitFileChange>, RemoteError>> + Send;

    /// `Manager.GetUnitFileState`.
    fn get_unit_file_state(
        &self,
        file: &str,
    ) -> impl Future<Output = Result<String, RemoteError>> + Send;

    /// `Manager.ListUnitFiles`: (path, state).
    fn list_unit_files(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, String)>, RemoteError>> + Send;

    /// `Manager.ResetFailed` (`None`) or `Manager.ResetFailedUnit`.
    fn reset_failed(
        &self,
        unit: Option<&str>,
    ) -> impl Future<Output = Result<(), RemoteError>> + Send;

    /// `Manager.GetDefaultTarget`.
    fn get_default_target(&self) -> impl Future<Output = Result<String, RemoteError>> + Send;

    /// `Manager.SetDefaultTarget`.
    fn set_default_target(
        &self,
        target: &str,
        force: bool,
    ) -> impl Future<Output = Result<Vec<UnitFileChange>, RemoteError>> + Send;

    /// `Manager.StartTransientUnit(unit, mode, a(sv), a(sa(sv)))`: the job path.
    fn start_transient_unit(
        &self,
        unit: &str,
        mode: &str,
        properties: &Marshalled,
        aux: &Marshalled,
    ) -> impl Future<Output = Result<JobPath, RemoteError>> + Send;
}
