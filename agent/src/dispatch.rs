//! Requests from the manager → systemd calls → exactly one reply each.
//!
//! [`Dispatcher::handle`] runs one request to completion and sends its one
//! reply through the outbox ([`crate::link::outbox`]); the link spawns it as
//! its own task, so a slow systemd call never holds up heartbeats or other
//! requests. The rest of the node API is [`crate::node_api`]; unit
//! subscriptions start the unit signal stream through [`crate::fanout`].
//!
//! Job requests (`StartUnit`, `StopUnit`, `RestartUnit`, `ReloadUnit`): the
//! tracker is told a call is in flight *before* systemd is asked, so a removal
//! that overtakes the reply is buffered. Once systemd returns the job path,
//! the job is registered and the `Empty` reply is queued **under the tracker
//! lock**, followed by any events that overtook it: the manager always sees
//! the reply before the job's `JobStateChanged`/`JobDone`.
//!
//! A `Units` or `UnitFiles` reply too large for one frame (a node with
//! thousands of units) goes as `ReplyPart`s and a final `Reply`, each at
//! most half a frame of rows; the manager concatenates them (issue 14.3).
//!
//! Requests this agent does not implement yet are answered with
//! `org.freedesktop.DBus.Error.NotSupported`.

use crate::fanout::start_units;
use crate::node_api;
use crate::state::Shared;
use crate::systemd::api::{JobPath, Systemd};
use drover_protocol::JobKind;
use drover_protocol::codec::encode_body;
use drover_protocol::error_names::{LIMITS_EXCEEDED, NO_SUCH_JOB, NOT_SUPPORTED};
use drover_protocol::{MAX_FRAME_LEN, RemoteError, Request, Response, Scope, ToManager, UnitName};

use std::sync::Arc;
use std::time::Instant;

/// Rows per frame of a split list reply are packed up to this many bytes,
/// half the frame cap, so row and framing overhead never push a part over.
const PART_BUDGET: usize = MAX_FRAME_LEN / 2;

/// Splits a `Units` / `UnitFiles` list into parts that each fit a frame
/// (one part when it fits already; a single row too large for a frame stays
/// alone in its part, and the size check of the reply refuses it).
fn split_list(list: Response) -> Vec<Response> {
    fn pack<T: serde::Serialize>(rows: Vec<T>, wrap: fn(Vec<T>) -> Response) -> Vec<Response> {
        let mut parts = Vec::new();
        let mut part = Vec::new();
        let mut used = 0usize;
        for row in rows {
            let len = drover_protocol::codec::encoded_len(&row);
            if !part.is_empty() && used.saturating_add(len) > PART_BUDGET {
                parts.push(wrap(std::mem::take(&mut part)));
                used = 0;
            }
            used = used.saturating_add(len);
            part.push(row);
        }
        parts.push(wrap(part));
        parts
    }
    match list {
        Response::Units(rows) => pack(rows, Response::Units),
        Response::UnitFiles(rows) => pack(rows, Response::UnitFiles),
        other => vec![other],
    }
}

/// See the module docs.
pub struct Dispatcher<S> {
    systemd: Arc<S>,
    shared: Arc<Shared>,
}

impl<S: Systemd> Dispatcher<S> {
    pub fn new(systemd: Arc<S>, shared: Arc<Shared>) -> Self {
        Self { systemd, shared }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn reply(&self, epoch: u64, id: u64, result: Result<Response, RemoteError>) {
        let result = match result {
            Ok(list @ (Response::Units(_) | Response::UnitFiles(_))) => {
                let mut parts = split_list(list);
                let last = parts.pop().unwrap_or(Response::Empty);
                for part in parts {
                    self.shared
                        .outbox
                        .send(epoch, ToManager::ReplyPart { id, part });
                }
                Ok(last)
            }
            other => other,
        };
        let mut msg = ToManager::Reply { id, result };
        if !matches!(
            msg,
            ToManager::Reply {
                result: Ok(Response::Empty),
                ..
            }
        ) {
            // A reply over the frame cap would be dropped by the writer and
            // leave the manager waiting: answer with an error instead. Lists
            // and errors (which may echo a caller's huge argument) can get
            // that big, so measure those.
            let len = encode_body(&msg).map(|b| b.len()).unwrap_or(usize::MAX);
            if len > MAX_FRAME_LEN {
                tracing::warn!(id, len, "reply too large for one frame");
                let err = RemoteError::new(
                    LIMITS_EXCEEDED,
                    format!(
                        "the reply is {len} bytes, more than the {MAX_FRAME_LEN} bytes one frame may carry"
                    ),
                );
                msg = ToManager::Reply {
                    id,
                    result: Err(err),
                };
            }
        }
        self.shared.outbox.send(epoch, msg);
    }

    /// Runs request `id` of session `epoch` and sends its one reply.
    pub async fn handle(&self, epoch: u64, id: u64, body: Request) {
        let name = body.name();
        tracing::debug!(id, request = name, "request from the manager");
        match body {
            Request::ListUnits => {
                let result = self.systemd.list_units().await.map(Response::Units);
                self.reply(epoch, id, result);
            }
            Request::UnitJob {
                kind,
                unit,
                mode,
                job_id,
            } => self.unit_job(epoch, id, kind, &unit, &mode, job_id).await,
            Request::JobCancel { job_id } => {
                let path = self
                    .shared
                    .tracker()
                    .job_path(epoch, job_id)
                    .map(str::to_owned);
                let result = match path {
                    Some(path) => self
                        .systemd
                        .cancel_job(&path)
                        .await
                        .map(|()| Response::Empty),
                    None => Err(RemoteError::new(
                        NO_SUCH_JOB,
                        format!("no job {job_id} is running on this node"),
                    )),
                };
                self.reply(epoch, id, result);
            }
            Request::Reload => {
                let result = self.systemd.reload().await.map(|()| Response::Empty);
                self.reply(epoch, id, result);
            }
            Request::Resync => {
                let shared = &self.shared;
                let result =
                    crate::units::resync::send_snapshot(&shared.units, &shared.outbox, epoch).await;
                if result.is_ok() {
                    crate::health::driver::session_started(shared, epoch).await;
                }
                self.reply(epoch, id, result.map(|()| Response::Empty));
            }
            Request::StartDep { unit } => {
                // Decided before the job is queued: only a unit stream that
                // already runs is sure to see the job's end, and only one
                // that follows the target sees it go active
                // (crate::deps::unit_fence): the stream follows the target
                // while the dep starts.
                let units = &self.shared.units;
                let held = units.streaming()
                    && match units.hold(Some(unit.clone()), Scope::State).await {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::warn!("{unit} is not followed while its dep starts: {e}");
                            false
                        }
                    };
                let news = units.streaming().then_some(&self.shared.fence);
                let result = self
                    .shared
                    .deps
                    .start_dep(&*self.systemd, &unit, news)
                    .await;
                self.reply(epoch, id, result);
                if held {
                    units.release(Some(unit), Scope::State).await;
                }
            }
            Request::StopDep { unit } => {
                let result = self.shared.deps.stop_dep(&*self.systemd, &unit).await;
                self.reply(epoch, id, result);
            }
            Request::Subscribe { unit } => {
                self.subscribe(epoch, id, unit, Scope::Everything).await;
            }
            Request::SubscribeState { unit } => {
                self.subscribe(epoch, id, Some(unit), Scope::State).await;
            }
            Request::Unsubscribe { unit } => {
                let result = self.shared.units.unsubscribe(epoch, unit.as_ref()).await;
                self.reply(epoch, id, result);
            }
            Request::StartTransientUnit {
                unit,
                mode,
                properties,
                aux,
                job_id,
            } => {
                let call =
                    self.systemd
                        .start_transient_unit(unit.as_str(), &mode, &properties, &aux);
                self.job_call(epoch, id, "StartTransientUnit", &unit, job_id, call)
                    .await
            }
            other => {
                let result = node_api::handle(
                    &*self.systemd,
                    &self.shared.node,
                    &self.shared.status,
                    &other,
                )
                .await
                .unwrap_or_else(|| {
                    Err(RemoteError::new(
                        NOT_SUPPORTED,
                        format!("{name} is not supported by this drover-agent yet"),
                    ))
                });
                self.reply(epoch, id, result);
            }
        }
    }

    /// `Subscribe` / `SubscribeState`: once the unit stream runs.
    async fn subscribe(&self, epoch: u64, id: u64, unit: Option<UnitName>, scope: Scope) {
        let result = match start_units(&self.systemd, &self.shared).await {
            Ok(()) => {
                self.shared
                    .units
                    .subscribe(&self.shared.outbox, epoch, unit, scope)
                    .await
            }
            Err(e) => Err(e),
        };
        self.reply(epoch, id, result);
    }

    async fn unit_job(
        &self,
        epoch: u64,
        id: u64,
        kind: JobKind,
        unit: &UnitName,
        mode: &str,
        job_id: u32,
    ) {
        let call = self.systemd.unit_job(kind, unit.as_str(), mode);
        self.job_call(epoch, id, kind.method(), unit, job_id, call)
            .await
    }

    /// Runs a systemd call that queues a job (`call`, `method` for logs and
    /// metrics) and tracks the job under the manager's `job_id`.
    async fn job_call(
        &self,
        epoch: u64,
        id: u64,
        method: &'static str,
        unit: &UnitName,
        job_id: u32,
        call: impl std::future::Future<Output = Result<JobPath, RemoteError>>,
    ) {
        self.shared.tracker().call_started();
        self.shared.node.job_call(epoch, job_id, unit, method);
        let result = call.await;
        let mut tracker = self.shared.tracker();
        match result {
            Ok(path) => {
                tracing::debug!(job_id, %path, unit = unit.as_str(), "{method} queued");
                let overtaken = tracker.call_finished(Instant::now(), Some((path, epoch, job_id)));
                // Still under the lock: reply first, then what overtook it.
                self.reply(epoch, id, Ok(Response::Empty));
                for out in overtaken {
                    self.shared.forward_job(out);
                }
            }
            Err(err) => {
                tracker.call_finished(Instant::now(), None);
                drop(tracker);
                self.shared.node.job_call_failed(epoch, job_id);
                self.reply(epoch, id, Err(err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14.3: a list larger than a frame splits into parts that each
    /// fit one, and that join back to the same rows in the same order.
    #[test]
    fn a_list_over_a_frame_splits_into_fitting_parts() {
        let rows: Vec<drover_protocol::UnitInfo> = (0..2500)
            .map(|i| drover_protocol::UnitInfo {
                name: format!("u{i:05}.service"),
                description: "d".repeat(500),
                load_state: "loaded".into(),
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                followed: String::new(),
                object_path: format!("/org/freedesktop/systemd1/unit/u{i:05}_2eservice"),
                job_id: 0,
                job_type: String::new(),
                job_path: "/".into(),
            })
            .collect();
        let whole = Response::Units(rows.clone());
        assert!(drover_protocol::codec::oversized(&whole).is_some());
        let parts = split_list(whole);
        assert!(parts.len() >= 3, "{} parts", parts.len());
        let mut joined = Vec::new();
        for (i, part) in parts.into_iter().enumerate() {
            let msg = ToManager::ReplyPart { id: u64::MAX, part };
            assert_eq!(drover_protocol::codec::oversized(&msg), None, "part {i}");
            let ToManager::ReplyPart {
                part: Response::Units(r),
                ..
            } = msg
            else {
                unreachable!()
            };
            joined.extend(r);
        }
        assert_eq!(joined, rows);
        assert_eq!(
            split_list(Response::Units(vec![])),
            vec![Response::Units(vec![])]
        );
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;
    use crate::link::outbox::SessionKill;
    use crate::systemd::api::SystemdEvent;
    use crate::systemd::fake::Script;
    use crate::test_rig::{Rig, next, unit};
    use drover_protocol::Event;
    use std::time::Duration;
    use tokio::sync::mpsc;

    async fn rig() -> Rig {
        Rig::new(1).await
    }

    fn start(u: &str, job_id: u32) -> Request {
        Request::UnitJob {
            kind: JobKind::Start,
            unit: unit(u),
            mode: "replace".into(),
            job_id,
        }
    }

    /// A `StartDep` makes the unit stream follow its target while the dep
    /// starts (so the unit fence sees the target go active), and no longer.
    #[tokio::test]
    async fn a_dep_start_follows_its_target_while_it_runs() {
        use crate::fanout::start_units;
        use crate::systemd::api::Followed;
        let mut r = rig().await;
        start_units(&Arc::new(r.fake.clone()), &r.shared)
            .await
            .unwrap();
        r.fake.add_unit(
            "drover-dep@db.service.service",
            Script::Finish("done".into()),
        );
        let mut queued = r.fake.hold("StartUnit");
        let d = r.d.clone();
        let call = tokio::spawn(async move {
            d.handle(
                1,
                1,
                Request::StartDep {
                    unit: unit("db.service"),
                },
            )
            .await;
        });
        queued.reached().await;
        assert_eq!(
            r.fake.followed(),
            Some(Followed::Units([(unit("db.service"), Scope::State)].into())),
            "followed (its state) before the dep's job is queued"
        );
        queued.release();
        call.await.unwrap();
        assert!(matches!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 1,
                result: Ok(Response::Empty)
            }
        ));
        assert_eq!(r.fake.followed(), Some(Followed::nothing()));
    }

    /// The event pump asks systemd about each new proxy job in a task of its
    /// own and announces the proxy once the start job runs.
    #[tokio::test]
    async fn a_running_proxy_start_job_is_announced_through_the_event_pump() {
        use crate::systemd::api::JobInfo;
        let mut r = rig().await;
        let proxy = "drover-proxy@bar_db.service";
        let (stop_job, start_job) = (
            "/org/freedesktop/systemd1/job/1",
            "/org/freedesktop/systemd1/job/2",
        );
        let info = |kind: &str, state: &str| JobInfo {
            kind: kind.into(),
            state: state.into(),
        };
        r.fake.set_job_info(stop_job, info("stop", "running"));
        r.fake.set_job_info(start_job, info("start", "waiting"));
        for (id, job) in [(1, stop_job), (2, start_job)] {
            r.fake
                .emit(SystemdEvent::JobNew {
                    id,
                    job: job.into(),
                    unit: proxy.into(),
                })
                .await;
        }
        // Both asked about; the stop job is dropped, the start job waits.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while r
            .fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("JobInfo"))
            .count()
            < 2
            || r.d.shared().early_start.pending() != 1
        {
            assert!(std::time::Instant::now() < deadline, "never classified");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(r.rx.try_recv().is_err(), "announced before it ran");
        r.fake
            .emit(SystemdEvent::JobState {
                job: start_job.into(),
                state: "running".into(),
            })
            .await;
        match next(&mut r.rx).await {
            ToManager::Event(Event::ProxyNew { node, unit, .. }) => {
                assert_eq!((node.as_str(), unit.as_str()), ("bar", "db.service"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(r.d.shared().early_start.pending(), 0);
        assert!(r.rx.try_recv().is_err(), "announced once");
    }

    #[tokio::test]
    async fn start_replies_empty_then_running_then_one_done() {
        let mut r = rig().await;
        r.fake.add_unit("a.service", Script::Finish("done".into()));
        r.d.handle(1, 11, start("a.service", 5)).await;
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 11,
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobStateChanged {
                job_id: 5,
                state: "running".into()
            })
        );
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobDone {
                job_id: 5,
                result: "done".into()
            })
        );
        assert_eq!(
            r.fake.calls(),
            vec!["Subscribe", "StartUnit a.service replace"]
        );
    }

    #[tokio::test]
    async fn removal_before_reply_still_gives_reply_then_done() {
        let mut r = rig().await;
        r.fake
            .add_unit("fast.service", Script::FinishBeforeReply("done".into()));
        // Let the pump process the early events before the call returns: the
        // fake sends them into the channel before returning the path.
        r.d.handle(1, 1, start("fast.service", 9)).await;
        let mut got = vec![
            next(&mut r.rx).await,
            next(&mut r.rx).await,
            next(&mut r.rx).await,
        ];
        assert_eq!(
            got.remove(0),
            ToManager::Reply {
                id: 1,
                result: Ok(Response::Empty)
            },
            "reply comes first"
        );
        assert_eq!(
            got,
            vec![
                ToManager::Event(Event::JobStateChanged {
                    job_id: 9,
                    state: "running".into()
                }),
                ToManager::Event(Event::JobDone {
                    job_id: 9,
                    result: "done".into()
                }),
            ]
        );
    }

    #[tokio::test]
    async fn failing_unit_reports_failed() {
        let mut r = rig().await;
        r.fake
            .add_unit("bad.service", Script::Finish("failed".into()));
        r.d.handle(
            1,
            2,
            Request::UnitJob {
                kind: JobKind::Restart,
                unit: unit("bad.service"),
                mode: "replace".into(),
                job_id: 3,
            },
        )
        .await;
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 2,
                result: Ok(Response::Empty)
            }
        );
        next(&mut r.rx).await;
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobDone {
                job_id: 3,
                result: "failed".into()
            })
        );
        assert_eq!(r.fake.calls()[1], "RestartUnit bad.service replace");
    }

    #[tokio::test]
    async fn systemd_error_is_forwarded_with_its_name_and_no_job_is_created() {
        let mut r = rig().await;
        r.d.handle(1, 4, start("missing.service", 1)).await;
        match next(&mut r.rx).await {
            ToManager::Reply {
                id: 4,
                result: Err(e),
            } => {
                assert_eq!(e.name, "org.freedesktop.systemd1.NoSuchUnit");
                assert!(e.message.contains("missing.service"), "{e}");
            }
            other => panic!(
                "unexpected {}",
                format!("{other:?}").chars().take(300).collect::<String>()
            ),
        }
        assert!(r.d.shared().tracker().is_empty());
    }

    #[tokio::test]
    async fn old_systemd_without_a_method_is_a_clear_error() {
        let mut r = rig().await;
        r.fake.remove_method("Reload");
        r.d.handle(1, 8, Request::Reload).await;
        match next(&mut r.rx).await {
            ToManager::Reply {
                id: 8,
                result: Err(e),
            } => assert_eq!(e.name, "org.freedesktop.DBus.Error.UnknownMethod"),
            other => panic!(
                "unexpected {}",
                format!("{other:?}").chars().take(300).collect::<String>()
            ),
        }
    }

    #[tokio::test]
    async fn cancel_ends_a_hanging_job_as_canceled() {
        let mut r = rig().await;
        r.fake.add_unit("slow.service", Script::Hang);
        r.d.handle(1, 1, start("slow.service", 77)).await;
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 1,
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobStateChanged {
                job_id: 77,
                state: "running".into()
            })
        );
        r.d.handle(1, 2, Request::JobCancel { job_id: 77 }).await;
        let mut got = [next(&mut r.rx).await, next(&mut r.rx).await];
        got.sort_by_key(|m| matches!(m, ToManager::Event(_)));
        assert_eq!(
            got[0],
            ToManager::Reply {
                id: 2,
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(
            got[1],
            ToManager::Event(Event::JobDone {
                job_id: 77,
                result: "canceled".into()
            })
        );
        // A second cancel finds no job.
        r.d.handle(1, 3, Request::JobCancel { job_id: 77 }).await;
        match next(&mut r.rx).await {
            ToManager::Reply {
                id: 3,
                result: Err(e),
            } => assert_eq!(e.name, NO_SUCH_JOB),
            other => panic!(
                "unexpected {}",
                format!("{other:?}").chars().take(300).collect::<String>()
            ),
        }
    }

    #[tokio::test]
    async fn list_units_and_freeze_reach_systemd() {
        let mut r = rig().await;
        r.fake.add_unit("a.service", Script::Hang);
        r.d.handle(1, 1, Request::ListUnits).await;
        match next(&mut r.rx).await {
            ToManager::Reply {
                id: 1,
                result: Ok(Response::Units(units)),
            } => {
                assert_eq!(units.len(), 1);
                assert_eq!(units[0].name, "a.service");
            }
            other => panic!(
                "unexpected {}",
                format!("{other:?}").chars().take(300).collect::<String>()
            ),
        }
        r.d.handle(
            1,
            2,
            Request::FreezeUnit {
                unit: unit("a.service"),
            },
        )
        .await;
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Reply {
                id: 2,
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(
            r.fake.calls().last().map(String::as_str),
            Some("Freeze a.service")
        );
    }

    #[tokio::test]
    async fn a_list_too_large_for_a_frame_comes_in_parts() {
        let mut r = rig().await;
        for n in 0..6000 {
            r.fake.add_unit(
                &format!("a-unit-with-quite-a-long-name-to-fill-frames-{n:05}.service"),
                Script::Hang,
            );
        }
        r.d.handle(1, 1, Request::ListUnits).await;
        let mut rows = 0;
        let mut parts = 0;
        loop {
            let msg = next(&mut r.rx).await;
            assert_eq!(drover_protocol::codec::oversized(&msg), None);
            match msg {
                ToManager::ReplyPart {
                    id: 1,
                    part: Response::Units(u),
                } => {
                    parts += 1;
                    rows += u.len();
                }
                ToManager::Reply {
                    id: 1,
                    result: Ok(Response::Units(u)),
                } => {
                    rows += u.len();
                    break;
                }
                other => panic!(
                    "unexpected {}",
                    format!("{other:?}").chars().take(300).collect::<String>()
                ),
            }
        }
        assert!(parts >= 1);
        assert_eq!(rows, 6000);
    }

    #[tokio::test]
    async fn events_of_an_old_session_are_dropped() {
        let mut r = rig().await;
        r.fake.add_unit("slow.service", Script::Hang);
        r.d.handle(1, 1, start("slow.service", 1)).await;
        next(&mut r.rx).await; // reply
        next(&mut r.rx).await; // running
        // The link drops and a new session opens.
        let shared = r.d.shared().clone();
        shared.outbox.close(1);
        let (tx, mut rx2) = mpsc::channel(8);
        shared.outbox.open(2, tx, SessionKill::new());
        shared.tracker().new_session(2);
        r.d.handle(2, 5, Request::JobCancel { job_id: 1 }).await;
        match next(&mut rx2).await {
            ToManager::Reply {
                id: 5,
                result: Err(e),
            } => assert_eq!(e.name, NO_SUCH_JOB),
            other => panic!(
                "unexpected {}",
                format!("{other:?}").chars().take(300).collect::<String>()
            ),
        }
        // The old job's removal reaches nobody.
        r.fake
            .emit(SystemdEvent::JobRemoved {
                id: 1,
                job: "/org/freedesktop/systemd1/job/1".into(),
                unit: "slow.service".into(),
                result: "done".into(),
            })
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(rx2.try_recv().is_err());
        assert!(r.rx.try_recv().is_err());
    }
}
