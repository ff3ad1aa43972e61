//! The target side of a cross-node dependency: `StartDep` / `StopDep`.
//!
//! The manager asks the target node's agent to start `drover-dep@…` while
//! some proxy somewhere needs a unit here, and to stop it when none does.
//!
//! **Dep unit name** ([`drover_protocol::dep_unit`], agreed with
//! `dist/usr/lib/systemd/system/drover-dep@.service`): the instance is the *full* target unit
//! name, so any unit type works:
//! `db.service` → `drover-dep@db.service.service`, `web.socket` →
//! `drover-dep@web.socket.service`. The template says `BindsTo=%i` and
//! `After=%i` (`%i` is the raw instance, i.e. the target unit's name), so
//! starting the dep starts the target first and the dep goes down with it.
//!
//! `StartDep` replies only once the dep's start job has finished (bounded by
//! [`DEP_JOB_BOUND`]; past it the reply is `Empty`, and a later failure still
//! reaches the requesters as the target's real state): `done` is success;
//! anything else — typically `dependency`, because the target is missing,
//! unloadable or failed to start — is a [`RemoteError`] whose message says in
//! one line what is wrong, built from the target's `LoadState`/`LoadError`,
//! e.g. `unit nope.service on node bar cannot be started: not found`. The
//! manager turns that into `ProxyError` for the requesters.
//!
//! The `StartDep` reply also waits until the unit signals systemd sent before
//! the dep's job ended have gone to the manager ([`crate::deps::unit_fence`]): the
//! manager must see the target's news of this start before the reply that
//! confirms it, never after. It comes earlier when the unit stream shows the
//! target active after the dep's job was queued (also [`crate::deps::unit_fence`]): the
//! dep, which only waits for its target, cannot fail after that.
//!
//! `StopDep` replies once systemd accepted the stop job; a dep that is not
//! loaded has nothing to stop and is a success.
//!
//! Job completion: the systemd event stream passes through [`Deps::on_event`].
//! A fast job can be removed before `StartUnit` even returns its path; while
//! a dep job call is in flight, removals of unknown jobs are kept (bounded in
//! count and age) and matched once the path is known — the same buffer
//! ([`crate::early_events`]) the job tracker ([`crate::jobs`]) uses for
//! manager jobs.

use crate::deps::job_waiters::JobWaiters;
use crate::deps::unit_fence::{StartWatch, UnitFence};
use crate::early_events::EarlyEvents;
use crate::systemd::api::{JobPath, Systemd, SystemdEvent};
use drover_bus::marshal::{self, PropertyMap};
use drover_bus::systemd::UNIT_IFACE;
use drover_protocol::JobKind;
use drover_protocol::dep_unit::{DEP_PREFIX, DEP_SUFFIX, dep_unit_of};
use drover_protocol::error_names::{FAILED, INVALID_ARGS, NO_SUCH_UNIT};
use drover_protocol::{NodeName, RemoteError, Response, UnitName};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Longest wait for a dep's start job before replying anyway.
pub const DEP_JOB_BOUND: Duration = Duration::from_secs(90);
/// Longest wait, once the job ended, for the unit reader to catch up
/// ([`crate::deps::unit_fence`]); it normally takes well under a millisecond.
pub const NEWS_BOUND: Duration = Duration::from_secs(5);
/// Removals of not-yet-known jobs kept while a call is in flight.
const EARLY_CAP: usize = 1024;
const EARLY_TTL: Duration = Duration::from_secs(10);

/// `drover-dep@<target>.service` ([`drover_protocol::dep_unit`]); an error
/// for the manager when the result would be longer than systemd allows.
pub fn dep_unit(target: &UnitName) -> Result<UnitName, RemoteError> {
    dep_unit_of(target).map_err(|e| {
        RemoteError::new(
            INVALID_ARGS,
            format!("unit {target} cannot be a dependency target: {e}"),
        )
    })
}

/// How waiting for a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// systemd removed the job with this result (`done`, `dependency`, …).
    Finished(String),
    /// A dep's target went active after its start job was queued, and that
    /// news went to the manager first ([`crate::deps::unit_fence`]).
    TargetActive,
    /// Still running when the bound passed.
    StillRunning,
}

struct Waiters {
    /// Results of removals that overtook their `StartUnit` reply.
    early: EarlyEvents<String>,
    waiting: JobWaiters<String>,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            early: EarlyEvents::new(EARLY_TTL, EARLY_CAP),
            waiting: JobWaiters::default(),
        }
    }
}

/// See the module docs.
#[derive(Default)]
pub struct Deps {
    node: OnceLock<NodeName>,
    jobs: Mutex<Waiters>,
}

impl Deps {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // Short sections without panics: a poisoned lock is still consistent.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's name, for error messages (set once at start).
    pub fn set_node(&self, node: NodeName) {
        let _ = self.node.set(node);
    }

    fn node(&self) -> &str {
        self.node.get().map_or("(this node)", NodeName::as_str)
    }

    /// Every systemd event passes here (see the module docs).
    pub fn on_event(&self, event: &SystemdEvent) {
        let SystemdEvent::JobRemoved { job, result, .. } = event else {
            return;
        };
        let mut w = self.lock();
        if !w.waiting.release(job, result.clone()) {
            w.early.offer(Instant::now(), job, result.clone());
        }
    }

    /// Starts `dep`, the dep unit of `target`, and waits (at most `bound`)
    /// for the job's result; with `news`, also until the unit reader has
    /// passed the job's end, or until it has shown `target` active after the
    /// job was queued ([`crate::deps::unit_fence`]).
    async fn start_and_wait<S: Systemd>(
        &self,
        systemd: &S,
        dep: &UnitName,
        target: &UnitName,
        bound: Duration,
        news: Option<&UnitFence>,
    ) -> Result<JobEnd, RemoteError> {
        let mut watch = news.map(|news| news.watch_start(dep.as_str(), target.as_str()));
        let (path, end) = self
            .job_end(systemd, dep.as_str(), bound, watch.as_mut())
            .await?;
        if let (Some(news), JobEnd::Finished(_)) = (news, &end)
            && !news.wait_passed(&path, NEWS_BOUND).await
        {
            tracing::warn!(
                "the unit signals before the end of {path} ({dep}) did not arrive within {NEWS_BOUND:?}; replying anyway"
            );
        }
        Ok(end)
    }

    /// Queues the start job of `unit` and waits for its end, or for `watch`.
    async fn job_end<S: Systemd>(
        &self,
        systemd: &S,
        unit: &str,
        bound: Duration,
        watch: Option<&mut StartWatch<'_>>,
    ) -> Result<(JobPath, JobEnd), RemoteError> {
        self.lock().early.call_started();
        let called = systemd.unit_job(JobKind::Start, unit, "replace").await;
        let rx = {
            let mut w = self.lock();
            let early = w
                .early
                .call_finished(Instant::now(), called.as_deref().ok())
                .into_iter()
                .next();
            let path = called?;
            if let Some(result) = early {
                return Ok((path, JobEnd::Finished(result)));
            }
            let rx = w.waiting.wait(&path);
            (path, rx)
        };
        let (path, rx) = rx;
        let removed = tokio::time::timeout(bound, rx);
        let removed = match watch {
            Some(watch) => tokio::select! {
                r = removed => Some(r),
                () = watch.target_active_after(&path) => None,
            },
            None => Some(removed.await),
        };
        let end = match removed {
            Some(Ok(Ok(result))) => return Ok((path, JobEnd::Finished(result))),
            Some(Ok(Err(_)) | Err(_)) => JobEnd::StillRunning,
            None => JobEnd::TargetActive,
        };
        // Drop our (and any other abandoned) waiter for this job.
        self.lock().waiting.forget_abandoned(&path);
        Ok((path, end))
    }

    /// `StartDep { unit }` (see the module docs); `news` when the unit
    /// reader ran before the call.
    pub async fn start_dep<S: Systemd>(
        &self,
        systemd: &S,
        target: &UnitName,
        news: Option<&UnitFence>,
    ) -> Result<Response, RemoteError> {
        self.start_dep_within(systemd, target, DEP_JOB_BOUND, news)
            .await
    }

    /// [`Deps::start_dep`] with another bound (tests).
    pub async fn start_dep_within<S: Systemd>(
        &self,
        systemd: &S,
        target: &UnitName,
        bound: Duration,
        news: Option<&UnitFence>,
    ) -> Result<Response, RemoteError> {
        let dep = dep_unit(target)?;
        match self
            .start_and_wait(systemd, &dep, target, bound, news)
            .await
        {
            Ok(JobEnd::TargetActive) => {
                tracing::info!("{dep} starting, {target} active: it is wanted by another node");
                Ok(Response::Empty)
            }
            Ok(JobEnd::Finished(result)) if result == "done" => {
                tracing::info!("{dep} started: {target} is wanted by another node");
                Ok(Response::Empty)
            }
            Ok(JobEnd::StillRunning) => {
                tracing::info!(
                    "{dep} is still starting after {bound:?}; its outcome reaches the requesters as {target}'s state"
                );
                Ok(Response::Empty)
            }
            Ok(JobEnd::Finished(result)) => {
                let err = self.explain(systemd, target, &result, None).await;
                tracing::warn!("{dep}: start job ended '{result}': {}", err.message);
                Err(err)
            }
            Err(call) => {
                let err = self.explain(systemd, target, "", Some(&call)).await;
                tracing::warn!("{dep}: StartUnit refused: {}", err.message);
                Err(err)
            }
        }
    }

    /// `StopDep { unit }` (see the module docs).
    pub async fn stop_dep<S: Systemd>(
        &self,
        systemd: &S,
        target: &UnitName,
    ) -> Result<Response, RemoteError> {
        let dep = dep_unit(target)?;
        match systemd
            .unit_job(JobKind::Stop, dep.as_str(), "replace")
            .await
        {
            Ok(_) => {
                tracing::info!("{dep} stopped: no other node needs {target} any more");
                Ok(Response::Empty)
            }
            Err(e) if e.name == NO_SUCH_UNIT => Ok(Response::Empty),
            Err(e) => Err(e),
        }
    }

    /// The one-line reason why the dep of `target` could not start: the
    /// target's load state says most; `call` is systemd's refusal of the
    /// `StartUnit` itself, if that is what failed.
    async fn explain<S: Systemd>(
        &self,
        systemd: &S,
        target: &UnitName,
        result: &str,
        call: Option<&RemoteError>,
    ) -> RemoteError {
        let node = self.node();
        let status = unit_status(systemd, target.as_str()).await;
        let (name, why) = match &status {
            Ok(s) => match reason(s, result) {
                Some(r) => r,
                None => match call {
                    // The target is fine, so the dep unit itself is the problem.
                    Some(call) => {
                        return RemoteError::new(
                            call.name.clone(),
                            format!(
                                "cannot start {DEP_PREFIX}{target}{DEP_SUFFIX} on node {node}: {} (is {DEP_PREFIX}{DEP_SUFFIX} installed?)",
                                call.message
                            ),
                        );
                    }
                    None => (FAILED, format!("its dependency job ended '{result}'")),
                },
            },
            Err(e) => match call {
                Some(call) => (call.name.as_str(), call.message.clone()),
                None => (
                    FAILED,
                    format!(
                        "the start job ended '{result}' (state unknown: {})",
                        e.message
                    ),
                ),
            },
        };
        RemoteError::new(
            name,
            format!("unit {target} on node {node} cannot be started: {why}"),
        )
    }
}

/// What systemd knows about a unit's loading and state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitStatus {
    pub load_state: String,
    /// The message of `LoadError`, empty when there is none.
    pub load_error: String,
    pub active_state: String,
    pub sub_state: String,
}

/// Reads [`UnitStatus`] (systemd loads the unit if needed, so a missing one
/// says `not-found`; a systemd that refuses with `NoSuchUnit` means the same).
pub async fn unit_status<S: Systemd>(systemd: &S, unit: &str) -> Result<UnitStatus, RemoteError> {
    let props = match systemd.get_unit_properties(unit, UNIT_IFACE).await {
        Ok(m) => marshal::decode::<PropertyMap>(&m)?,
        Err(e) if e.name == NO_SUCH_UNIT => {
            return Ok(UnitStatus {
                load_state: "not-found".into(),
                ..UnitStatus::default()
            });
        }
        Err(e) => return Err(e),
    };
    let text = |key: &str| {
        props
            .get(key)
            .and_then(|v| <&str>::try_from(v).ok())
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let load_error = props
        .get("LoadError")
        .and_then(|v| <(String, String)>::try_from(zbus::Variant::from(v.try_clone().ok()?)).ok())
        .map(|(_, message)| message)
        .unwrap_or_default();
    let load_state = text("LoadState");
    Ok(UnitStatus {
        // A status without the key (a minimal systemd stand-in) is loaded.
        load_state: if load_state.is_empty() {
            "loaded".into()
        } else {
            load_state
        },
        load_error,
        active_state: text("ActiveState"),
        sub_state: text("SubState"),
    })
}

/// What is wrong with a target, from its status and the dep job's result;
/// `None` when the target looks healthy.
fn reason(s: &UnitStatus, result: &str) -> Option<(&'static str, String)> {
    let detail = |what: &str| {
        if s.load_error.is_empty() {
            what.to_string()
        } else {
            format!("{what}: {}", s.load_error)
        }
    };
    match s.load_state.as_str() {
        "not-found" => Some((NO_SUCH_UNIT, "not found".into())),
        "bad-setting" => Some((FAILED, detail("its unit file has a bad setting"))),
        "error" => Some((FAILED, detail("it failed to load"))),
        "masked" => Some((FAILED, "it is masked".into())),
        _ => match result {
            "" | "done" => None,
            "timeout" => Some((FAILED, "its start timed out".into())),
            "canceled" => Some((FAILED, "its start was canceled".into())),
            _ => Some((
                FAILED,
                format!("it failed to start ({}/{})", s.active_state, s.sub_state),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::{FakeSystemd, Script};
    use std::sync::Arc;

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    /// Deps fed by the fake's event stream, as the agent wires it.
    async fn rig() -> (FakeSystemd, Arc<Deps>) {
        let fake = FakeSystemd::new();
        let deps = Arc::new(Deps::default());
        deps.set_node(NodeName::new("bar").unwrap());
        let mut events = fake.subscribe().await.unwrap();
        let d = deps.clone();
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                d.on_event(&ev);
            }
        });
        (fake, deps)
    }

    #[test]
    fn dep_names_carry_the_full_target_name() {
        assert_eq!(
            dep_unit(&unit("db.service")).unwrap().as_str(),
            "drover-dep@db.service.service"
        );
        assert_eq!(
            dep_unit(&unit("web.socket")).unwrap().as_str(),
            "drover-dep@web.socket.service"
        );
        assert_eq!(
            dep_unit(&unit("getty@tty1.service")).unwrap().as_str(),
            "drover-dep@getty@tty1.service.service"
        );
        let long = format!("{}.service", "a".repeat(240));
        let err = dep_unit(&unit(&long)).unwrap_err();
        assert!(
            err.message.contains("cannot be a dependency target"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn start_dep_succeeds_when_the_job_is_done_even_if_removed_before_the_reply() {
        let (fake, deps) = rig().await;
        fake.add_unit("db.service", Script::Finish("done".into()));
        fake.add_unit(
            "drover-dep@db.service.service",
            Script::FinishBeforeReply("done".into()),
        );
        assert_eq!(
            deps.start_dep(&fake, &unit("db.service"), None).await,
            Ok(Response::Empty)
        );
        fake.add_unit(
            "drover-dep@db.service.service",
            Script::Finish("done".into()),
        );
        assert_eq!(
            deps.start_dep(&fake, &unit("db.service"), None).await,
            Ok(Response::Empty)
        );
        assert!(
            fake.calls()
                .contains(&"StartUnit drover-dep@db.service.service replace".to_string())
        );
        assert!(deps.lock().waiting.is_empty() && deps.lock().early.is_empty());
    }

    #[tokio::test]
    async fn start_dep_replies_only_once_the_unit_reader_passed_the_job_end() {
        let (fake, deps) = rig().await;
        fake.add_unit(
            "drover-dep@db.service.service",
            Script::Finish("done".into()),
        );
        let news = UnitFence::default();
        let db = unit("db.service");
        let reply = deps.start_dep(&fake, &db, Some(&news));
        tokio::pin!(reply);
        // The job ends, but the unit signals before its end are not sent yet.
        let early = tokio::time::timeout(Duration::from_millis(200), &mut reply).await;
        assert!(early.is_err(), "replied before the unit news: {early:?}");
        assert!(deps.lock().waiting.is_empty(), "the job did end");
        news.passed("/org/freedesktop/systemd1/job/1");
        assert_eq!(reply.await, Ok(Response::Empty));
        assert_eq!(news.pending(), (0, 0));
    }

    #[tokio::test]
    async fn start_dep_replies_once_the_target_is_active_after_the_job_was_queued() {
        let (fake, deps) = rig().await;
        // The dep's job does not end by itself: only the target's news can
        // confirm the start.
        fake.add_unit("drover-dep@db.service.service", Script::Hang);
        let news = UnitFence::default();
        let db = unit("db.service");
        let reply = deps.start_dep(&fake, &db, Some(&news));
        tokio::pin!(reply);
        let job = "/org/freedesktop/systemd1/job/1";
        // An `active` from before the job was queued is old news.
        news.active("db.service");
        let early = tokio::time::timeout(Duration::from_millis(200), &mut reply).await;
        assert!(early.is_err(), "replied on old news: {early:?}");
        news.queued(job, "drover-dep@db.service.service");
        news.active("db.service");
        assert_eq!(reply.await, Ok(Response::Empty));
        assert!(news.watches_empty(), "the watch ended with the reply");
    }

    #[tokio::test]
    async fn missing_target_is_a_clear_error() {
        let (fake, deps) = rig().await;
        // The dep loads, but its BindsTo= target does not: the job ends
        // `dependency`.
        fake.add_unit(
            "drover-dep@nope.service.service",
            Script::Finish("dependency".into()),
        );
        let err = deps
            .start_dep(&fake, &unit("nope.service"), None)
            .await
            .unwrap_err();
        assert_eq!(err.name, NO_SUCH_UNIT);
        assert_eq!(
            err.message,
            "unit nope.service on node bar cannot be started: not found"
        );
    }

    #[tokio::test]
    async fn failing_target_and_missing_template_are_explained() {
        let (fake, deps) = rig().await;
        fake.add_unit("bad.service", Script::Finish("failed".into()));
        fake.add_unit(
            "drover-dep@bad.service.service",
            Script::Finish("dependency".into()),
        );
        let err = deps
            .start_dep(&fake, &unit("bad.service"), None)
            .await
            .unwrap_err();
        assert!(
            err.message
                .starts_with("unit bad.service on node bar cannot be started: it failed to start"),
            "{err}"
        );
        // The target exists, but no drover-dep@ template is installed.
        fake.add_unit("db.service", Script::Finish("done".into()));
        let err = deps
            .start_dep(&fake, &unit("db.service"), None)
            .await
            .unwrap_err();
        assert_eq!(err.name, NO_SUCH_UNIT);
        assert!(
            err.message.contains("is drover-dep@.service installed?"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_slow_start_replies_after_the_bound_and_leaves_no_waiter() {
        let (fake, deps) = rig().await;
        fake.add_unit("slow.service", Script::Hang);
        fake.add_unit("drover-dep@slow.service.service", Script::Hang);
        let r = deps
            .start_dep_within(
                &fake,
                &unit("slow.service"),
                Duration::from_millis(50),
                None,
            )
            .await;
        assert_eq!(r, Ok(Response::Empty));
        assert!(deps.lock().waiting.is_empty());
    }

    #[tokio::test]
    async fn stop_dep_stops_and_a_missing_dep_is_fine() {
        let (fake, deps) = rig().await;
        fake.add_unit(
            "drover-dep@db.service.service",
            Script::Finish("done".into()),
        );
        assert_eq!(
            deps.stop_dep(&fake, &unit("db.service")).await,
            Ok(Response::Empty)
        );
        assert_eq!(
            deps.stop_dep(&fake, &unit("other.service")).await,
            Ok(Response::Empty)
        );
        assert!(
            fake.calls()
                .contains(&"StopUnit drover-dep@db.service.service replace".to_string())
        );
    }
}
