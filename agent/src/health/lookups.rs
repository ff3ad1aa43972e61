//! The units waiting for a look at their declaration while the unit hub
//! does not follow systemd's units (no unit declares health yet): each job
//! systemd queues names a unit that may declare a check
//! (`super::driver::on_job_new`).
//!
//! One look at a time, from one worker, so a burst of jobs (a target that
//! starts 20,000 units) costs one D-Bus call after the other instead of
//! 20,000 tasks at once that would starve the agent's link. A unit is looked
//! at once until the next daemon-reload ([`Lookups::forget_seen`]); the queue
//! and the set of units seen are bounded by [`MAX_LOOKUPS`] (a unit beyond it
//! is not queued: the next daemon-reload's rescan reads every running unit).

use drover_protocol::UnitName;
use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// Most units queued or remembered as seen.
pub const MAX_LOOKUPS: usize = 65_536;

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<UnitName>,
    queued: HashSet<UnitName>,
    seen: HashSet<UnitName>,
    /// A worker takes from the queue.
    working: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Lookups {
    inner: Mutex<Inner>,
}

impl Lookups {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `unit` unless it was seen or is queued; true when the caller
    /// must start a worker (none is working).
    pub fn push(&self, unit: UnitName) -> bool {
        let mut t = self.lock();
        if t.seen.contains(&unit)
            || t.queued.contains(&unit)
            || t.seen.len() + t.queue.len() >= MAX_LOOKUPS
        {
            return false;
        }
        t.queued.insert(unit.clone());
        t.queue.push_back(unit);
        !std::mem::replace(&mut t.working, true)
    }

    /// The next unit for the worker (now seen); `None` ends the worker.
    pub fn next(&self) -> Option<UnitName> {
        let mut t = self.lock();
        let Some(unit) = t.queue.pop_front() else {
            t.working = false;
            return None;
        };
        t.queued.remove(&unit);
        t.seen.insert(unit.clone());
        Some(unit)
    }

    /// Empties the queue (the hub follows the units from now on).
    pub fn clear(&self) {
        let mut t = self.lock();
        t.queue.clear();
        t.queued.clear();
    }

    /// A daemon-reload: unit files may have changed, every unit is looked at
    /// again at its next job.
    pub fn forget_seen(&self) {
        self.lock().seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    #[test]
    fn one_worker_each_unit_once_until_a_reload() {
        let l = Lookups::default();
        assert!(l.push(u("a.service")), "the first push starts a worker");
        assert!(!l.push(u("b.service")), "one worker at a time");
        assert!(!l.push(u("a.service")), "queued already");
        assert_eq!(l.next(), Some(u("a.service")));
        assert!(!l.push(u("a.service")), "seen");
        assert_eq!(l.next(), Some(u("b.service")));
        assert_eq!(l.next(), None);
        assert!(l.push(u("c.service")), "the worker ended: a new one");
        l.clear();
        assert_eq!(l.next(), None);
        l.forget_seen();
        assert!(l.push(u("a.service")));
    }

    #[test]
    fn bounded() {
        let l = Lookups::default();
        for i in 0..MAX_LOOKUPS + 10 {
            l.push(u(&format!("u{i}.service")));
        }
        assert_eq!(l.lock().queue.len(), MAX_LOOKUPS);
    }
}
