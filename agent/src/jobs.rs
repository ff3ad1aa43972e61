//! Job tracking: systemd job path ↔ the manager's job id.
//!
//! The manager names a job (`job_id`) before the agent asks systemd for it;
//! systemd names it by its object path. The [`JobTracker`] joins the two and
//! turns systemd's job signals into the protocol's `JobStateChanged` and
//! exactly one `JobDone` per tracked job.
//!
//! Invariants:
//! * **No lost job.** A fast job can be removed before `StartUnit` returns its
//!   path. While any job call is in flight ([`JobTracker::call_started`]),
//!   events for paths we do not know yet are buffered (bounded in count and
//!   age: `crate::early_events`); [`JobTracker::call_finished`] replays the
//!   buffered events of the path it registers, in order. Events for unknown
//!   paths while no call is in flight belong to someone else's job and are
//!   ignored.
//! * **Exactly one `JobDone`.** A job leaves the tracker when its removal is
//!   reported; a second removal for the same path finds nothing.
//! * **Sessions.** Every job belongs to the link session (`epoch`) whose request
//!   created it. Outputs carry that `epoch`; the link drops outputs of a session
//!   that is gone (the manager already ended those jobs as `disconnected`).
//!   [`JobTracker::new_session`] forgets jobs of older sessions, and a
//!   `JobCancel` only finds jobs of the session it arrived on.
//! * `JobStateChanged` is sent only when the state really changed.
//!
//! Pure logic, no I/O: callers hold it in a mutex and send the outputs.

use crate::early_events::EarlyEvents;
use crate::systemd::api::{JobPath, SystemdEvent};
use drover_protocol::Event;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an event for a not-yet-registered job path is kept.
pub const EARLY_EVENT_TTL: Duration = Duration::from_secs(10);
/// How many such events are kept at most (oldest dropped first).
pub const EARLY_EVENT_CAP: usize = 4096;

/// An event for the manager, tagged with the session it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub epoch: u64,
    pub event: Event,
}

/// One systemd job; several manager jobs can share it when systemd merged
/// their requests into a job it already had (it returns the same path).
#[derive(Debug)]
struct Tracked {
    owners: Vec<(u64, u32)>,
    state: String,
}

/// See the module docs.
#[derive(Debug)]
pub struct JobTracker {
    by_path: HashMap<JobPath, Tracked>,
    by_id: HashMap<(u64, u32), JobPath>,
    early: EarlyEvents<SystemdEvent>,
}

impl Default for JobTracker {
    fn default() -> Self {
        Self::new(EARLY_EVENT_TTL, EARLY_EVENT_CAP)
    }
}

fn event_path(ev: &SystemdEvent) -> &str {
    match ev {
        SystemdEvent::JobNew { job, .. }
        | SystemdEvent::JobRemoved { job, .. }
        | SystemdEvent::JobState { job, .. } => job,
    }
}

impl JobTracker {
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            by_path: HashMap::new(),
            by_id: HashMap::new(),
            early: EarlyEvents::new(ttl, cap),
        }
    }

    /// Number of jobs being followed.
    pub fn len(&self) -> usize {
        self.by_path.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty()
    }

    /// A job call (`StartUnit` & co) is about to be sent to systemd.
    pub fn call_started(&mut self) {
        self.early.call_started();
    }

    /// The job call ended. On success (`Some(path)`), the job is tracked for
    /// session `epoch` under the manager's `job_id`, and the events systemd sent
    /// for it before the call returned are processed now.
    ///
    /// A path that is already tracked (systemd merged the request into a job
    /// it already had) gains a second owner: both manager jobs end with it.
    pub fn call_finished(
        &mut self,
        now: Instant,
        registered: Option<(JobPath, u64, u32)>,
    ) -> Vec<Output> {
        let path = registered.as_ref().map(|(path, _, _)| path.as_str());
        let mine = self.early.call_finished(now, path);
        let Some((path, epoch, job_id)) = registered else {
            return Vec::new();
        };
        self.by_id.insert((epoch, job_id), path.clone());
        self.by_path
            .entry(path.clone())
            .or_insert_with(|| Tracked {
                owners: Vec::new(),
                state: "waiting".into(),
            })
            .owners
            .push((epoch, job_id));

        let mut out = Vec::new();
        for ev in mine {
            out.extend(self.on_event(now, ev));
        }
        out
    }

    /// Processes one systemd event; returns what to tell the manager (one
    /// output per manager job that owns the systemd job).
    pub fn on_event(&mut self, now: Instant, event: SystemdEvent) -> Vec<Output> {
        if matches!(event, SystemdEvent::JobNew { .. }) {
            // A job is followed from the reply that names it, not its birth.
            return Vec::new();
        }
        let path = event_path(&event);
        if !self.by_path.contains_key(path) {
            let path = path.to_owned();
            self.early.offer(now, &path, event);
            return Vec::new();
        }
        match event {
            SystemdEvent::JobState { job, state } => {
                let Some(tracked) = self.by_path.get_mut(&job) else {
                    return Vec::new();
                };
                if tracked.state == state {
                    return Vec::new();
                }
                tracked.state.clone_from(&state);
                tracked
                    .owners
                    .iter()
                    .map(|&(epoch, job_id)| Output {
                        epoch,
                        event: Event::JobStateChanged {
                            job_id,
                            state: state.clone(),
                        },
                    })
                    .collect()
            }
            SystemdEvent::JobNew { .. } => Vec::new(),
            SystemdEvent::JobRemoved { job, result, .. } => {
                let Some(tracked) = self.by_path.remove(&job) else {
                    return Vec::new();
                };
                tracked
                    .owners
                    .into_iter()
                    .map(|(epoch, job_id)| {
                        self.by_id.remove(&(epoch, job_id));
                        Output {
                            epoch,
                            event: Event::JobDone {
                                job_id,
                                result: result.clone(),
                            },
                        }
                    })
                    .collect()
            }
        }
    }

    /// The systemd job behind the manager's `job_id` in session `epoch`.
    pub fn job_path(&self, epoch: u64, job_id: u32) -> Option<&str> {
        self.by_id.get(&(epoch, job_id)).map(String::as_str)
    }

    /// A new link session began: jobs of older sessions can never be reported
    /// again (the manager ended them as `disconnected`), so forget them.
    pub fn new_session(&mut self, epoch: u64) {
        let before = self.by_id.len();
        self.by_id.retain(|(g, _), _| *g >= epoch);
        self.by_path.retain(|_, t| {
            t.owners.retain(|(g, _)| *g >= epoch);
            !t.owners.is_empty()
        });
        let dropped = before - self.by_id.len();
        if dropped > 0 {
            tracing::debug!(dropped, "forgot jobs of earlier manager sessions");
        }
    }

    /// Events buffered for not-yet-registered paths (for tests and metrics).
    pub fn buffered(&self) -> usize {
        self.early.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u32) -> String {
        format!("/org/freedesktop/systemd1/job/{n}")
    }

    fn removed(n: u32, result: &str) -> SystemdEvent {
        SystemdEvent::JobRemoved {
            id: n,
            job: job(n),
            unit: "a.service".into(),
            result: result.into(),
        }
    }

    fn state(n: u32, s: &str) -> SystemdEvent {
        SystemdEvent::JobState {
            job: job(n),
            state: s.into(),
        }
    }

    fn done(epoch: u64, job_id: u32, result: &str) -> Output {
        Output {
            epoch,
            event: Event::JobDone {
                job_id,
                result: result.into(),
            },
        }
    }

    fn changed(epoch: u64, job_id: u32, s: &str) -> Output {
        Output {
            epoch,
            event: Event::JobStateChanged {
                job_id,
                state: s.into(),
            },
        }
    }

    #[test]
    fn normal_job_reports_running_then_one_done() {
        let mut t = JobTracker::default();
        let now = Instant::now();
        t.call_started();
        assert!(t.call_finished(now, Some((job(5), 1, 100))).is_empty());
        assert_eq!(
            t.on_event(now, state(5, "running")),
            vec![changed(1, 100, "running")]
        );
        assert_eq!(
            t.on_event(now, state(5, "running")),
            vec![],
            "no change, no event"
        );
        assert_eq!(
            t.on_event(now, removed(5, "done")),
            vec![done(1, 100, "done")]
        );
        assert_eq!(
            t.on_event(now, removed(5, "done")),
            vec![],
            "exactly one JobDone"
        );
        assert!(t.is_empty());
    }

    #[test]
    fn removal_before_the_reply_is_replayed_in_order() {
        let mut t = JobTracker::default();
        let now = Instant::now();
        t.call_started();
        assert_eq!(t.on_event(now, state(7, "running")), vec![]);
        assert_eq!(t.on_event(now, removed(7, "done")), vec![]);
        assert_eq!(t.buffered(), 2);
        let out = t.call_finished(now, Some((job(7), 3, 42)));
        assert_eq!(out, vec![changed(3, 42, "running"), done(3, 42, "done")]);
        assert!(t.is_empty());
        assert_eq!(t.buffered(), 0);
    }

    #[test]
    fn foreign_jobs_are_ignored_when_no_call_is_in_flight() {
        let mut t = JobTracker::default();
        let now = Instant::now();
        assert_eq!(t.on_event(now, removed(9, "done")), vec![]);
        assert_eq!(t.buffered(), 0, "nothing buffered while idle");
    }

    #[test]
    fn early_events_expire_and_are_bounded() {
        let mut t = JobTracker::new(Duration::from_secs(1), 3);
        let start = Instant::now();
        t.call_started();
        for n in 1..=5 {
            t.on_event(start, removed(n, "done"));
        }
        assert_eq!(t.buffered(), 3, "capped");
        // A registration long after: the buffered removal has expired, so the
        // job waits for a real removal instead of reporting a stale one.
        let late = start + Duration::from_secs(5);
        assert!(t.call_finished(late, Some((job(5), 1, 1))).is_empty());
        assert_eq!(t.buffered(), 0);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn failed_call_registers_nothing() {
        let mut t = JobTracker::default();
        t.call_started();
        assert!(t.call_finished(Instant::now(), None).is_empty());
        assert!(t.is_empty());
        // And the in-flight count went back to zero: foreign events are ignored again.
        t.on_event(Instant::now(), removed(1, "done"));
        assert_eq!(t.buffered(), 0);
    }

    #[test]
    fn cancel_lookup_is_per_session_and_new_session_forgets_old_jobs() {
        let mut t = JobTracker::default();
        let now = Instant::now();
        t.call_started();
        t.call_finished(now, Some((job(1), 1, 10)));
        assert_eq!(t.job_path(1, 10), Some(job(1).as_str()));
        assert_eq!(t.job_path(2, 10), None, "same id, other session");
        t.new_session(2);
        assert_eq!(t.job_path(1, 10), None);
        assert_eq!(
            t.on_event(now, removed(1, "done")),
            vec![],
            "old session's job is not reported"
        );
    }

    #[test]
    fn merged_job_ends_every_manager_job_that_shares_it() {
        let mut t = JobTracker::default();
        let now = Instant::now();
        t.call_started();
        t.call_started();
        t.call_finished(now, Some((job(3), 1, 1)));
        t.call_finished(now, Some((job(3), 1, 2)));
        assert_eq!(
            t.on_event(now, removed(3, "done")),
            vec![done(1, 1, "done"), done(1, 2, "done")]
        );
        assert_eq!(t.job_path(1, 2), None);
        assert!(t.is_empty());
    }
}
