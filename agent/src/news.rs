//! Unit news before job ends: a reply that reports the end of a job must not
//! overtake the unit state changes systemd announced before that end.
//!
//! systemd's signals reach the agent on one connection but through two
//! streams: the job stream (`JobNew`, `JobRemoved`, job states; read by
//! [`crate::jobs`], [`crate::deps`], [`crate::ahead`]) and the unit stream
//! (unit states; read by [`crate::units`], which forwards them to the
//! manager). Each stream keeps systemd's order, but their readers run
//! independently, so the job stream can hand over a job's `JobRemoved` while
//! the unit reader is still behind on signals systemd sent before it.
//!
//! That matters for `StartDep`: the manager takes its reply as "the target was
//! started for this reference" and from then on lets "down" news of the
//! target fail a waiting proxy (`manager/src/references.rs`). A reply that
//! overtakes the target's own news, e.g. the `inactive` of a stop just before
//! this start, makes that stale news look newer than the start: a healthy
//! proxy failed with "db.service is inactive (dead)" (seen about once in 50
//! back-to-back activations on a loaded machine).
//!
//! The unit stream matches every systemd signal, `JobRemoved` included; its
//! reader reports each one here ([`JobNews::passed`]) after it has sent what
//! the signals before it produced. Whoever saw a job end on the job stream and
//! is about to tell the manager waits here ([`JobNews::wait_passed`]) until
//! the unit reader has reached the same `JobRemoved`. That only works if the
//! unit stream already ran when the job was queued (see
//! [`crate::units::UnitHub::streaming`]); otherwise there is nothing to wait
//! for.

use crate::systemd::JobPath;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// Job ends the unit reader passed that nobody waited for yet, kept for a
/// waiter that comes late (its job ended before `StartUnit` even answered).
/// Every job on the node passes here, so the oldest are forgotten.
pub const PASSED_CAP: usize = 1024;

#[derive(Default)]
struct Inner {
    waiting: HashMap<JobPath, Vec<oneshot::Sender<()>>>,
    passed: VecDeque<JobPath>,
}

/// See the module docs.
#[derive(Default)]
pub struct JobNews {
    inner: Mutex<Inner>,
}

impl JobNews {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Short sections without panics: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unit reader has sent everything systemd announced before `job`
    /// ended.
    pub fn passed(&self, job: &str) {
        let mut inner = self.lock();
        if let Some(waiters) = inner.waiting.remove(job) {
            for tx in waiters {
                let _ = tx.send(());
            }
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
            let (tx, rx) = oneshot::channel();
            inner.waiting.entry(job.to_string()).or_default().push(tx);
            rx
        };
        let passed = matches!(tokio::time::timeout(bound, rx).await, Ok(Ok(())));
        if !passed {
            let mut inner = self.lock();
            if let Some(list) = inner.waiting.get_mut(job) {
                list.retain(|tx| !tx.is_closed());
                if list.is_empty() {
                    inner.waiting.remove(job);
                }
            }
        }
        passed
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
        let news = std::sync::Arc::new(JobNews::default());
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
        let news = JobNews::default();
        news.passed(J);
        assert!(news.wait_passed(J, Duration::from_secs(5)).await);
        assert_eq!(news.pending(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_passes_releases_the_waiter_at_the_bound() {
        let news = JobNews::default();
        assert!(!news.wait_passed(J, Duration::from_millis(300)).await);
        assert_eq!(news.pending(), (0, 0), "the timed-out waiter is gone");
    }

    #[test]
    fn remembered_job_ends_are_bounded() {
        let news = JobNews::default();
        for i in 0..(PASSED_CAP + 10) {
            news.passed(&format!("/org/freedesktop/systemd1/job/{i}"));
        }
        assert_eq!(news.pending(), (0, PASSED_CAP));
    }
}
