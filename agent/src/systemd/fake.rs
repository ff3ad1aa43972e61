//! An in-memory systemd for unit tests of pure agent logic (job tracking,
//! request dispatch, the link). It is not a simulation of systemd: each known
//! unit has a [`Script`] saying what a job on it does, and every call is
//! recorded so tests can assert what the agent asked for.
//!
//! Unit subscriptions: [`FakeSystemd::set_state`] sets what `ListUnits`
//! reports for a unit, [`FakeSystemd::emit_unit`] sends a unit signal as
//! systemd would, if what the agent follows covers it, as the bus's match
//! rules would ([`FakeSystemd::followed`]). The pass-through methods answer
//! canned values (`NoSuchUnit` for units never added) and record their
//! arguments.
//!
//! The real thing is exercised against `systemd --user` in the tests of
//! [`super::dbus`].

use super::api::{
    EVENT_QUEUE, EventStream, Followed, JobInfo, JobPath, Systemd, SystemdEvent, UnitFileChange,
    UnitSignal, UnitSignalStream,
};
use drover_bus::marshal::{self, AuxUnits, PropertyList, PropertyMap};
use drover_bus::systemd::{JOB_PATH_PREFIX, UNIT_IFACE, UNIT_PATH_PREFIX};
use drover_protocol::JobKind;
use drover_protocol::error_names::{NO_SUCH_JOB, NO_SUCH_UNIT, UNKNOWN_METHOD};
use drover_protocol::{Marshalled, RemoteError, Scope, UnitInfo, UnitName};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// What a job on a unit does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    /// The call returns the job path; then the job runs and is removed with
    /// this result (`done`, `failed`, …).
    Finish(String),
    /// The job runs and is removed with this result *before* the call
    /// returns its path: the race a fast oneshot causes on a real systemd.
    FinishBeforeReply(String),
    /// The job runs and stays until it is cancelled (result `canceled`).
    Hang,
}

#[derive(Default)]
struct State {
    units: BTreeMap<String, Script>,
    next_job: u32,
    events: Option<mpsc::Sender<SystemdEvent>>,
    calls: Vec<String>,
    /// Jobs that hang, by path: (id, unit).
    hanging: HashMap<JobPath, (u32, String)>,
    call_delay: Duration,
    /// Methods that answer `UnknownMethod`, like an old systemd.
    missing: Vec<&'static str>,
    /// (active, sub) reported by `ListUnits`; inactive/dead when absent.
    states: HashMap<String, (String, String)>,
    unit_events: Option<mpsc::Sender<(u64, UnitSignal)>>,
    /// What the unit stream follows (the bus's match rules, for a real
    /// systemd).
    followed: Option<Followed>,
    /// Positions handed out so far: every unit signal and every `ListUnits`
    /// answer takes the next one, in the order they are made.
    positions: u64,
    /// Calls made to wait ([`FakeSystemd::hold`]), by method.
    holds: HashMap<&'static str, HeldCall>,
    /// What `job_info` reports, by job path.
    job_infos: HashMap<JobPath, JobInfo>,
}

/// See the module docs. Cheap to clone; clones share state.
#[derive(Clone, Default)]
pub struct FakeSystemd {
    state: Arc<Mutex<State>>,
}

impl FakeSystemd {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `unit` known; jobs on it follow `script`.
    pub fn add_unit(&self, unit: &str, script: Script) {
        self.lock().units.insert(unit.to_string(), script);
    }

    /// Every call so far, as `Method arg…` lines.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Makes every call take this long (a slow systemd).
    pub fn set_call_delay(&self, delay: Duration) {
        self.lock().call_delay = delay;
    }

    /// Makes `method` answer `UnknownMethod`, like an older systemd.
    pub fn remove_method(&self, method: &'static str) {
        self.lock().missing.push(method);
    }

    /// Sets what `job_info` reports for `job` (absent: no such job).
    pub fn set_job_info(&self, job: &str, info: JobInfo) {
        self.lock().job_infos.insert(job.to_string(), info);
    }

    /// Sends an arbitrary event (e.g. a job someone else started).
    pub async fn emit(&self, event: SystemdEvent) {
        let (tx, units) = self.job_streams();
        if let Some(tx) = tx {
            deliver(&tx, units.as_ref(), event).await;
        }
    }

    /// Where job events go: the job stream and, for `JobRemoved`, the unit
    /// stream too, as systemd's one signal reaches both of the agent's.
    fn job_streams(&self) -> (Option<mpsc::Sender<SystemdEvent>>, Option<UnitSender>) {
        let events = self.lock().events.clone();
        (events, self.unit_sender())
    }

    /// The unit stream's sender, if the agent subscribed to unit signals.
    fn unit_sender(&self) -> Option<UnitSender> {
        let tx = self.lock().unit_events.clone()?;
        Some(UnitSender {
            tx,
            fake: self.clone(),
        })
    }

    /// The next position (see `State::positions`).
    fn next_position(&self) -> u64 {
        let mut st = self.lock();
        st.positions += 1;
        st.positions
    }

    /// Sets the state `ListUnits` reports for `unit` (which becomes known).
    pub fn set_state(&self, unit: &str, active: &str, sub: &str) {
        let mut st = self.lock();
        st.units
            .entry(unit.to_string())
            .or_insert_with(|| Script::Finish("done".into()));
        st.states
            .insert(unit.to_string(), (active.to_string(), sub.to_string()));
    }

    /// Forgets `unit` (systemd unloaded it); `ListUnits` no longer has it.
    pub fn remove_unit(&self, unit: &str) {
        let mut st = self.lock();
        st.units.remove(unit);
        st.states.remove(unit);
    }

    /// Sends a unit signal, if the agent subscribed to them, at the next
    /// position.
    pub async fn emit_unit(&self, signal: UnitSignal) {
        if let Some(tx) = self.unit_sender() {
            tx.send(signal).await;
        }
    }

    /// True once the agent subscribed to unit signals.
    pub fn units_subscribed(&self) -> bool {
        self.lock().unit_events.is_some()
    }

    /// What the unit stream follows now (`None` before it started).
    pub fn followed(&self) -> Option<Followed> {
        self.lock().followed.clone()
    }

    fn known(&self, unit: &str) -> Result<(), RemoteError> {
        if self.lock().units.contains_key(unit) {
            Ok(())
        } else {
            Err(RemoteError::new(
                NO_SUCH_UNIT,
                format!("Unit {unit} not found."),
            ))
        }
    }

    /// Ends the event stream, as a lost systemd connection does.
    pub fn disconnect(&self) {
        self.lock().events = None;
    }

    /// Makes the next call of `method` wait, once it is made, until the
    /// returned [`Hold`] is released: a test does what systemd would do
    /// while the call is in flight, with no timing involved.
    pub fn hold(&self, method: &'static str) -> Hold {
        let (reached_tx, reached) = tokio::sync::oneshot::channel();
        let release = Arc::new(tokio::sync::Notify::new());
        self.lock().holds.insert(
            method,
            HeldCall {
                reached: reached_tx,
                release: release.clone(),
            },
        );
        Hold { reached, release }
    }

    async fn enter(&self, call: String, method: &'static str) -> Result<(), RemoteError> {
        let held = self.lock().holds.remove(method);
        if let Some(held) = held {
            let _ = held.reached.send(());
            held.release.notified().await;
        }
        let delay = {
            let mut st = self.lock();
            st.calls.push(call);
            if st.missing.contains(&method) {
                return Err(RemoteError::new(
                    UNKNOWN_METHOD,
                    format!(
                        "Unknown method {method} or interface org.freedesktop.systemd1.Manager."
                    ),
                ));
            }
            st.call_delay
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }
}

impl FakeSystemd {
    /// A job call (`StartUnit`, …, `StartTransientUnit`) on a known unit.
    async fn unit_job_named(
        &self,
        method: &'static str,
        unit: &str,
        mode: &str,
    ) -> Result<JobPath, RemoteError> {
        self.enter(format!("{method} {unit} {mode}"), method)
            .await?;
        let (id, job, script, tx) = {
            let mut st = self.lock();
            let Some(script) = st.units.get(unit).cloned() else {
                return Err(RemoteError::new(
                    NO_SUCH_UNIT,
                    format!("Unit {unit} not found."),
                ));
            };
            st.next_job += 1;
            let id = st.next_job;
            let job = format!("{JOB_PATH_PREFIX}/{id}");
            if script == Script::Hang {
                st.hanging.insert(job.clone(), (id, unit.to_string()));
            }
            (id, job, script, st.events.clone())
        };
        let units = self.unit_sender();
        let Some(tx) = tx else { return Ok(job) };
        match script {
            Script::Finish(result) => {
                let events = job_events(id, &job, unit, &result);
                tokio::spawn(async move {
                    // After the reply, as on an idle systemd.
                    tokio::task::yield_now().await;
                    for ev in events {
                        deliver(&tx, units.as_ref(), ev).await;
                    }
                });
            }
            Script::FinishBeforeReply(result) => {
                for ev in job_events(id, &job, unit, &result) {
                    deliver(&tx, units.as_ref(), ev).await;
                }
                // Give the agent's event pump the chance to see the removal
                // before the reply, as happens on a busy real node.
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
            }
            Script::Hang => {
                let _ = tx
                    .send(SystemdEvent::JobState {
                        job: job.clone(),
                        state: "running".into(),
                    })
                    .await;
            }
        }
        Ok(job)
    }
}

fn file_changes(kind: &str, files: &[String]) -> Vec<UnitFileChange> {
    files
        .iter()
        .map(|f| {
            (
                kind.to_string(),
                format!("/fake/wants/{f}"),
                format!("/fake/{f}"),
            )
        })
        .collect()
}

/// Sends a job event; a `JobNew` or `JobRemoved` also to the unit stream,
/// after it, as real systemd's signals reach both streams.
/// A call made to wait by [`FakeSystemd::hold`].
pub struct Hold {
    reached: tokio::sync::oneshot::Receiver<()>,
    release: Arc<tokio::sync::Notify>,
}

impl Hold {
    /// Returns once the held call has been made.
    pub async fn reached(&mut self) {
        (&mut self.reached).await.expect("the fake is alive");
    }

    /// Lets the held call go on.
    pub fn release(self) {
        self.release.notify_one();
    }
}

struct HeldCall {
    reached: tokio::sync::oneshot::Sender<()>,
    release: Arc<tokio::sync::Notify>,
}

/// Sends unit signals at the next position each.
struct UnitSender {
    tx: mpsc::Sender<(u64, UnitSignal)>,
    fake: FakeSystemd,
}

impl UnitSender {
    /// Sends `signal` at the next position if what is followed covers it
    /// (as the bus's match rules would). Position and queue are taken under
    /// one lock, so the stream's order is the positions' order.
    async fn send(&self, signal: UnitSignal) {
        let mut st = self.fake.lock();
        let Some(followed) = &st.followed else { return };
        if !carries(followed, &signal) {
            return;
        }
        st.positions += 1;
        let _ = self.tx.try_send((st.positions, signal));
    }
}

/// Whether a unit stream following `followed` carries `signal`
/// (`super::unit_stream`, "Rules").
fn carries(followed: &Followed, signal: &UnitSignal) -> bool {
    match signal {
        UnitSignal::JobNew { .. } | UnitSignal::JobRemoved { .. } => true,
        UnitSignal::Snapshot { .. } => true,
        UnitSignal::Reloading { .. } => match followed {
            Followed::Every(_) => true,
            Followed::Units(units) => !units.is_empty(),
        },
        UnitSignal::New { unit } | UnitSignal::Removed { unit } => match followed {
            Followed::Every(_) => true,
            Followed::Units(_) => UnitName::new(unit.as_str()).is_ok_and(|u| followed.covers(&u)),
        },
        // A unit followed for its state: its `Unit` interface alone.
        UnitSignal::Changed {
            unit, interface, ..
        } => {
            let scope = match followed {
                Followed::Every(scope) => Some(*scope),
                Followed::Units(units) => UnitName::new(unit.as_str())
                    .ok()
                    .and_then(|u| units.get(&u).copied()),
            };
            scope.is_some_and(|scope| scope == Scope::Everything || interface == UNIT_IFACE)
        }
    }
}

/// `ListUnits`'s row of `name` in `st`.
fn unit_row(st: &State, name: &str) -> UnitInfo {
    UnitInfo {
        name: name.to_string(),
        description: format!("fake {name}"),
        load_state: "loaded".into(),
        active_state: st
            .states
            .get(name)
            .map_or("inactive", |s| s.0.as_str())
            .into(),
        sub_state: st.states.get(name).map_or("dead", |s| s.1.as_str()).into(),
        followed: String::new(),
        object_path: format!("{UNIT_PATH_PREFIX}/{}", name.replace(['.', '-', '@'], "_")),
        job_id: 0,
        job_type: String::new(),
        job_path: "/".into(),
    }
}

async fn deliver(tx: &mpsc::Sender<SystemdEvent>, units: Option<&UnitSender>, event: SystemdEvent) {
    let copy = match &event {
        SystemdEvent::JobRemoved { job, .. } => Some(UnitSignal::JobRemoved { job: job.clone() }),
        SystemdEvent::JobNew { job, unit, .. } => Some(UnitSignal::JobNew {
            job: job.clone(),
            unit: unit.clone(),
        }),
        _ => None,
    };
    let _ = tx.send(event).await;
    if let (Some(units), Some(signal)) = (units, copy) {
        units.send(signal).await;
    }
}

fn job_events(id: u32, job: &str, unit: &str, result: &str) -> [SystemdEvent; 2] {
    [
        SystemdEvent::JobState {
            job: job.to_string(),
            state: "running".into(),
        },
        SystemdEvent::JobRemoved {
            id,
            job: job.to_string(),
            unit: unit.to_string(),
            result: result.to_string(),
        },
    ]
}

impl Systemd for FakeSystemd {
    /// See `State::positions`.
    type Position = u64;

    async fn list_units(&self) -> Result<Vec<UnitInfo>, RemoteError> {
        Ok(self.list_units_at().await?.0)
    }

    /// The answer is made, and takes its position, once the call's delay
    /// ([`FakeSystemd::set_call_delay`]) is over: signals emitted meanwhile
    /// come before it, as on a real systemd.
    async fn list_units_at(&self) -> Result<(Vec<UnitInfo>, u64), RemoteError> {
        self.enter("ListUnits".into(), "ListUnits").await?;
        let position = self.next_position();
        let st = self.lock();
        let units = st.units.keys().map(|name| unit_row(&st, name)).collect();
        Ok((units, position))
    }

    async fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        mode: &str,
    ) -> Result<JobPath, RemoteError> {
        self.unit_job_named(kind.method(), unit, mode).await
    }

    async fn job_info(&self, job: &str) -> Result<JobInfo, RemoteError> {
        self.enter(format!("JobInfo {job}"), "JobInfo").await?;
        self.lock()
            .job_infos
            .get(job)
            .cloned()
            .ok_or_else(|| RemoteError::new(NO_SUCH_JOB, format!("Job {job} does not exist.")))
    }

    async fn cancel_job(&self, job: &str) -> Result<(), RemoteError> {
        self.enter(format!("CancelJob {job}"), "CancelJob").await?;
        let (found, tx) = {
            let mut st = self.lock();
            (st.hanging.remove(job), st.events.clone())
        };
        let units = self.unit_sender();
        let Some((id, unit)) = found else {
            return Err(RemoteError::new(
                NO_SUCH_JOB,
                format!("Job {job} does not exist."),
            ));
        };
        if let Some(tx) = tx {
            let removed = SystemdEvent::JobRemoved {
                id,
                job: job.to_string(),
                unit,
                result: "canceled".into(),
            };
            deliver(&tx, units.as_ref(), removed).await;
        }
        Ok(())
    }

    async fn reload(&self) -> Result<(), RemoteError> {
        self.enter("Reload".into(), "Reload").await
    }

    async fn subscribe(&self) -> Result<EventStream, RemoteError> {
        self.enter("Subscribe".into(), "Subscribe").await?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        self.lock().events = Some(tx);
        Ok(rx)
    }

    async fn unit_stream(&self) -> Result<UnitSignalStream<u64>, RemoteError> {
        self.enter("SubscribeUnits".into(), "SubscribeUnits")
            .await?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut st = self.lock();
        st.unit_events = Some(tx);
        st.followed = Some(Followed::nothing());
        Ok(rx)
    }

    /// The rules first (`Follow …`), then the snapshot's call, which a test
    /// can hold (`ListUnits` for every unit, `ListUnitsByPatterns` for some,
    /// `Ping` for none); its answer is made and queued at once, under one
    /// lock, as a real systemd answers between two signals.
    async fn follow(&self, followed: &Followed, id: u64) -> Result<(), RemoteError> {
        self.enter(format!("Follow {followed}"), "Follow").await?;
        let tx = {
            let mut st = self.lock();
            st.followed = Some(followed.clone());
            st.unit_events.clone()
        };
        let tx = tx.ok_or_else(|| RemoteError::failed("the unit stream has not started"))?;
        let method = match followed {
            Followed::Every(_) => "ListUnits",
            Followed::Units(units) if units.is_empty() => "Ping",
            Followed::Units(_) => "ListUnitsByPatterns",
        };
        self.enter(format!("{method} {followed}"), method).await?;
        let mut st = self.lock();
        let units = st
            .units
            .keys()
            .filter(|name| UnitName::new(name.as_str()).is_ok_and(|n| followed.covers(&n)))
            .map(|name| unit_row(&st, name))
            .collect();
        st.positions += 1;
        let snapshot = UnitSignal::Snapshot {
            id,
            followed: followed.clone(),
            units,
        };
        tx.try_send((st.positions, snapshot))
            .map_err(|_| RemoteError::failed("the fake's unit stream is full or closed"))
    }

    async fn get_unit_properties(
        &self,
        unit: &str,
        interface: &str,
    ) -> Result<Marshalled, RemoteError> {
        self.enter(format!("GetAll {unit} {interface}"), "GetAll")
            .await?;
        self.known(unit)?;
        let (active, sub) = {
            let st = self.lock();
            st.states
                .get(unit)
                .cloned()
                .unwrap_or_else(|| ("inactive".into(), "dead".into()))
        };
        let mut map = PropertyMap::new();
        let text = |s: String| zbus::OwnedVariant::from(zbus::Str::from(s));
        map.insert("Id".into(), text(unit.to_string()));
        map.insert("ActiveState".into(), text(active));
        map.insert("SubState".into(), text(sub));
        marshal::encode(&map)
    }

    async fn get_unit_property(
        &self,
        unit: &str,
        interface: &str,
        property: &str,
    ) -> Result<Marshalled, RemoteError> {
        self.enter(format!("Get {unit} {interface} {property}"), "Get")
            .await?;
        self.known(unit)?;
        marshal::encode_variant(&zbus::OwnedVariant::from(zbus::Str::from(unit.to_string())))
    }

    async fn set_unit_properties(
        &self,
        unit: &str,
        runtime: bool,
        properties: &Marshalled,
    ) -> Result<(), RemoteError> {
        let props: PropertyList = marshal::decode(properties)?;
        let names: Vec<&str> = props.iter().map(|(k, _)| k.as_str()).collect();
        self.enter(
            format!("SetUnitProperties {unit} {runtime} {}", names.join(",")),
            "SetUnitProperties",
        )
        .await?;
        self.known(unit)
    }

    async fn freeze_unit(&self, unit: &str, freeze: bool) -> Result<(), RemoteError> {
        let method = if freeze { "Freeze" } else { "Thaw" };
        self.enter(format!("{method} {unit}"), method).await?;
        self.known(unit)
    }

    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<(), RemoteError> {
        self.enter(format!("KillUnit {unit} {whom} {signal}"), "KillUnit")
            .await?;
        self.known(unit)
    }

    async fn enable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
        force: bool,
    ) -> Result<(bool, Vec<UnitFileChange>), RemoteError> {
        self.enter(
            format!("EnableUnitFiles {} {runtime} {force}", files.join(",")),
            "EnableUnitFiles",
        )
        .await?;
        Ok((true, file_changes("symlink", files)))
    }

    async fn disable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.enter(
            format!("DisableUnitFiles {} {runtime}", files.join(",")),
            "DisableUnitFiles",
        )
        .await?;
        Ok(file_changes("unlink", files))
    }

    async fn get_unit_file_state(&self, file: &str) -> Result<String, RemoteError> {
        self.enter(format!("GetUnitFileState {file}"), "GetUnitFileState")
            .await?;
        self.known(file)?;
        Ok("static".into())
    }

    async fn list_unit_files(&self) -> Result<Vec<(String, String)>, RemoteError> {
        self.enter("ListUnitFiles".into(), "ListUnitFiles").await?;
        let st = self.lock();
        Ok(st
            .units
            .keys()
            .map(|u| (format!("/fake/{u}"), "static".to_string()))
            .collect())
    }

    async fn reset_failed(&self, unit: Option<&str>) -> Result<(), RemoteError> {
        match unit {
            None => self.enter("ResetFailed".into(), "ResetFailed").await,
            Some(unit) => {
                self.enter(format!("ResetFailedUnit {unit}"), "ResetFailedUnit")
                    .await?;
                self.known(unit)
            }
        }
    }

    async fn get_default_target(&self) -> Result<String, RemoteError> {
        self.enter("GetDefaultTarget".into(), "GetDefaultTarget")
            .await?;
        Ok("default.target".into())
    }

    async fn set_default_target(
        &self,
        target: &str,
        force: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.enter(
            format!("SetDefaultTarget {target} {force}"),
            "SetDefaultTarget",
        )
        .await?;
        self.known(target)?;
        Ok(file_changes("symlink", &[target.to_string()]))
    }

    async fn start_transient_unit(
        &self,
        unit: &str,
        mode: &str,
        properties: &Marshalled,
        aux: &Marshalled,
    ) -> Result<JobPath, RemoteError> {
        let props: PropertyList = marshal::decode(properties)?;
        let _aux: AuxUnits = marshal::decode(aux)?;
        let script = if props.iter().any(|(k, _)| k == "FakeHang") {
            Script::Hang
        } else {
            Script::Finish("done".into())
        };
        self.lock().units.insert(unit.to_string(), script);
        self.unit_job_named("StartTransientUnit", unit, mode).await
    }
}
