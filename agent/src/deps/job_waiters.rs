//! One-shot waiters keyed by systemd job path.
//!
//! A `StartDep` waits for its dep job's `JobRemoved` ([`crate::deps::dep_unit`]), and
//! then for the unit reader to pass that same removal ([`crate::deps::unit_fence`]).
//! Both park a sender here under the job's path; the event releases every
//! waiter of that job at once. A waiter that gives up (its bound passed)
//! drops its receiver, and [`JobWaiters::forget_abandoned`] clears what is
//! left of it, so the map only holds jobs somebody still waits for.

use crate::systemd::api::JobPath;
use std::collections::HashMap;
use tokio::sync::oneshot;

/// See the module docs.
#[derive(Debug)]
pub struct JobWaiters<T> {
    waiting: HashMap<JobPath, Vec<oneshot::Sender<T>>>,
}

impl<T> Default for JobWaiters<T> {
    fn default() -> Self {
        Self {
            waiting: HashMap::new(),
        }
    }
}

impl<T: Clone> JobWaiters<T> {
    /// A receiver that gets the value `job` is released with.
    pub fn wait(&mut self, job: &str) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        self.waiting.entry(job.to_string()).or_default().push(tx);
        rx
    }

    /// Sends `value` to every waiter of `job`; false when nobody waited.
    pub fn release(&mut self, job: &str, value: T) -> bool {
        let Some(waiters) = self.waiting.remove(job) else {
            return false;
        };
        for tx in waiters {
            let _ = tx.send(value.clone());
        }
        true
    }

    /// Drops the waiters of `job` whose receivers are gone.
    pub fn forget_abandoned(&mut self, job: &str) {
        if let Some(list) = self.waiting.get_mut(job) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                self.waiting.remove(job);
            }
        }
    }

    /// Jobs somebody waits for.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const J: &str = "/org/freedesktop/systemd1/job/7";

    #[test]
    fn every_waiter_of_a_job_gets_its_value_and_no_other_job_does() {
        let mut w = JobWaiters::default();
        let mut a = w.wait(J);
        let mut b = w.wait(J);
        let mut other = w.wait("/org/freedesktop/systemd1/job/8");
        assert!(w.release(J, "done".to_string()));
        assert_eq!(a.try_recv().unwrap(), "done");
        assert_eq!(b.try_recv().unwrap(), "done");
        assert!(other.try_recv().is_err());
        assert_eq!(w.len(), 1);
        assert!(!w.release(J, "again".to_string()), "nobody waits any more");
    }

    #[test]
    fn abandoned_waiters_are_forgotten_and_the_rest_kept() {
        let mut w = JobWaiters::<()>::default();
        let gone = w.wait(J);
        let mut kept = w.wait(J);
        drop(gone);
        w.forget_abandoned(J);
        assert_eq!(w.len(), 1);
        assert!(w.release(J, ()));
        assert!(kept.try_recv().is_ok());
        let gone = w.wait(J);
        drop(gone);
        w.forget_abandoned(J);
        assert!(w.is_empty());
        w.forget_abandoned("/no/such/job");
    }
}
