//! Unit news before job ends: a reply that reports the end of a job must not
//! overtake the unit state changes systemd announced before that end.
//!
//! systemd's signals reach the agent on one connection but through two
//! streams: the job stream (`JobNew`, `JobRemoved`, job states; read by
//! [`crate::jobs`], [`crate::deps::dep_unit`], [`crate::proxies::early_start`]) and the unit stream
//! (unit states; read by [`crate::units::hub`], which forwards them to the
//! manager). Each stream keeps systemd's order, but their readers run
//! independently, so the job stream can hand over a job's `JobRemoved` while
//! the unit reader is still behind on signals systemd sent before it.
//!
//! That matters for `StartDep`: the manager takes its reply as "the target was
//! started for this reference" and from then on lets "down" news of the
//! target fail a waiting proxy (`manager/src/proxies/`). A reply that
//! overtakes the target's own news, e.g. the `inactive` of a stop just before
//! this start, makes that stale news look newer than the start: a healthy
//! proxy failed with "db.service is inactive (dead)" (seen about once in 50
//! back-to-back activations on a loaded machine).
//!
//! The unit stream matches every systemd signal, `JobRemoved` included; its
//! reader reports each one here ([`UnitFence::passed`]) after it has sent what
//! the signals before it produced. Whoever saw a job end on the job stream and
//! is about to tell the manager waits here ([`UnitFence::wait_passed`]) until
//! the unit reader has reached the same `JobRemoved`. That only works if the
//! unit stream already ran when the job was queued (see
//! [`crate::units::hub::UnitHub::streaming`]); otherwise there is nothing to wait
//! for.
//!
//! **Earlier, at the target's `active`.** The dep's job only ends after
//! systemd has sent the target's state changes, the dep's own and the job
//! signals of both, one message at a time through the bus daemon: on a busy
//! machine a few milliseconds after the target is already active. So a
//! `StartDep` also watches the unit stream ([`UnitFence::watch_start`]): once
//! the reader has passed the `JobNew` of the dep's job (everything after it
//! reflects states after the job was queued) and then an `active` of the
//! target, which it sends on first, the start is confirmed. Anything else,
//! such as a target that was already active and does not change, waits for
//! the job's end as above.

use crate::deps::job_waiters::JobWaiters;
use crate::systemd::api::JobPath;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// Job ends the unit reader passed that nobody waited for yet, kept for a
/// waiter that comes late (its job ended before `StartUnit` even answered).
/// Every job on the node passes here, so the oldest are forgotten.
pub const PASSED_CAP: usize = 1024;

#[derive(Default)]
struct Inner {
    waiting: JobWaiters<()>,
    passed: VecDeque<JobPath>,
    watches: Vec<Watch>,
    next_watch: u64,
}

/// One `StartDep` watching for its target to go active.
struct Watch {
    id: u64,
    dep: String,
    target: String,
    /// The latest job of `dep` the reader passed, once it did.
    queued: Option<JobPath>,
    fire: Option<oneshot::Sender<JobPath>>,
}

/// A watch made by [`UnitFence::watch_start`]; dropping it ends the watch.
pub struct StartWatch<'a> {
    news: &'a UnitFence,
    id: u64,
    fired: oneshot::Receiver<JobPath>,
}

impl StartWatch<'_> {
    /// Resolves once the target went active after `job` (the dep's start
    /// job) was queued; never, if it went active after another job of the
    /// dep, or not at all.
    pub async fn target_active_after(&mut self, job: &str) {
        match (&mut self.fired).await {
            Ok(fired) if fired == job => {}
            _ => std::future::pending().await,
        }
    }
}

impl Drop for StartWatch<'_> {
    fn drop(&mut self) {
        self.news.lock().watches.retain(|w| w.id != self.id);
    }
}

/// See the module docs.
#[derive(Default)]
pub struct UnitFence {
    inner: Mutex<Inner>,
}

impl UnitFence {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Short sections without panics: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unit reader has sent everything systemd announced before `job`
    /// ended.
    pub fn passed(&self, job: &str) {
        let mut inner = self.lock();
        if inner.waiting.release(job, ()) {
            return;
        }
        if inner.passed.len() >= PASSED_CAP {
            inner.passed.pop_front();
        }
        inner.passed.push_back(job.to_string());
    }

    /// Waits until the unit reader has passed the end of `job`, at most
    /// `bound`; false if it did not (a unit reader that died or fell that far
    /// behind: the caller goes on rather than hold a reply forever).
    pub async fn wait_passed(&self, job: &str, bound: Duration) -> bool {
        let rx = {
            let mut inner = self.lock();
            if let Some(i) = inner.passed.iter().position(|j| j == job) {
                inner.passed.remove(i);
                return true;
            }
            inner.waiting.wait(job)
        };
        let passed = matches!(tokio::time::timeout(bound, rx).await, Ok(Ok(())));
        if !passed {
            self.lock().waiting.forget_abandoned(job);
        }
        passed
    }

    /// Before `StartUnit(dep)`: see the module docs.
    pub fn watch_start(&self, dep: &str, target: &str) -> StartWatch<'_> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        inner.next_watch += 1;
        let id = inner.next_watch;
        inner.watches.push(Watch {
            id,
            dep: dep.to_string(),
            target: target.to_string(),
            queued: None,
            fire: Some(tx),
        });
        StartWatch {
            news: self,
            id,
            fired: rx,
        }
    }

    /// The unit reader passed `JobNew` of `job`, a job of `unit`.
    pub fn queued(&self, job: &str, unit: &str) {
        for w in self.lock().watches.iter_mut().filter(|w| w.dep == unit) {
            w.queued = Some(job.to_string());
        }
    }

    /// The unit reader sent an `active` of `unit` to the manager.
    pub fn active(&self, unit: &str) {
        for w in self.lock().watches.iter_mut().filter(|w| w.target == unit) {
            if let Some(job) = w.queued.take()
                && let Some(fire) = w.fire.take()
            {
                let _ = fire.send(job);
            }
        }
    }

    /// No `StartDep` is watching (tests).
    pub fn watches_empty(&self) -> bool {
        self.lock().watches.is_empty()
    }

    /// Waiters and remembered job ends (tests).
    pub fn pending(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.waiting.len(), inner.passed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const J: &str = "/org/freedesktop/systemd1/job/7";

    #[tokio::test]
    async fn a_waiter_is_released_when_the_unit_reader_passes_its_job() {
        let news = std::sync::Arc::new(UnitFence::default());
        let waiter = tokio::spawn({
            let news = news.clone();
            async move { news.wait_passed(J, Duration::from_secs(5)).await }
        });
        tokio::task::yield_now().await;
        news.passed("/org/freedesktop/systemd1/job/6");
        assert!(!waiter.is_finished(), "another job's end releases nothing");
        news.passed(J);
        assert!(waiter.await.unwrap());
        assert_eq!(news.pending(), (0, 1), "only the other job is remembered");
    }

    #[tokio::test]
    async fn a_job_passed_before_anyone_waits_is_found_once() {
        let news = UnitFence::default();
        news.passed(J);
        assert!(news.wait_passed(J, Duration::from_secs(5)).await);
        assert_eq!(news.pending(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_passes_releases_the_waiter_at_the_bound() {
        let news = UnitFence::default();
        assert!(!news.wait_passed(J, Duration::from_millis(300)).await);
        assert_eq!(news.pending(), (0, 0), "the timed-out waiter is gone");
    }

    const DEP: &str = "drover-dep@db.service.service";

    #[tokio::test]
    async fn a_start_is_confirmed_by_the_first_active_after_its_job_was_queued() {
        let news = UnitFence::default();
        let mut watch = news.watch_start(DEP, "db.service");
        news.active("db.service");
        news.queued(J, "other.service");
        news.active("db.service");
        news.queued(J, DEP);
        news.active("other.service");
        news.active("db.service");
        tokio::time::timeout(Duration::from_secs(5), watch.target_active_after(J))
            .await
            .expect("confirmed");
        drop(watch);
        assert!(news.watches_empty(), "a dropped watch is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_after_another_job_of_the_dep_confirms_nothing() {
        let news = UnitFence::default();
        let mut watch = news.watch_start(DEP, "db.service");
        news.queued("/org/freedesktop/systemd1/job/6", DEP);
        news.active("db.service");
        news.queued(J, DEP);
        news.active("db.service");
        let waited =
            tokio::time::timeout(Duration::from_secs(60), watch.target_active_after(J)).await;
        assert!(waited.is_err(), "falls back to the job's end");
    }

    #[test]
    fn remembered_job_ends_are_bounded() {
        let news = UnitFence::default();
        for i in 0..(PASSED_CAP + 10) {
            news.passed(&format!("/org/freedesktop/systemd1/job/{i}"));
        }
        assert_eq!(news.pending(), (0, PASSED_CAP));
    }
}
