//! The units waiting for a look at their declaration while the unit hub
//! does not follow systemd's units (no unit declares health yet): each job
//! systemd queues names a unit that may declare a check
//! (`super::driver::on_job_new`).
//!
//! One look at a time, from one worker, so jobs cost one D-Bus call after
//! the other instead of a task each. A unit is looked at once until the next
//! daemon-reload ([`Lookups::forget_seen`]); the set of units seen is bounded
//! by [`MAX_LOOKUPS`]. A burst (more than [`BURST`] units waiting: a target
//! that starts 20,000 units) is not looked at unit by unit, which would keep
//! the busy systemd answering: the queue is dropped, and once no job came
//! for [`QUIET`] the worker reads the units that run then
//! ([`Next::Rescan`]) — a unit with a check started in the burst runs, and
//! is found.

use drover_protocol::UnitName;
use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most units queued or remembered as seen.
pub const MAX_LOOKUPS: usize = 65_536;
/// Units waiting beyond which a burst is read as a whole, later.
pub const BURST: usize = 64;
/// How long without a job before a burst's rescan.
pub const QUIET: Duration = Duration::from_secs(2);

/// What the worker does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Look at this unit.
    Unit(UnitName),
    /// A burst: read the running units once no job came for [`QUIET`];
    /// the last job came this long ago.
    Rescan(Duration),
    /// Nothing left: the worker ends.
    Done,
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<UnitName>,
    queued: HashSet<UnitName>,
    seen: HashSet<UnitName>,
    /// A worker takes from the queue.
    working: bool,
    /// A burst is waiting for its rescan: the time of its last job.
    burst: Option<Instant>,
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
        self.push_at(unit, Instant::now())
    }

    fn push_at(&self, unit: UnitName, now: Instant) -> bool {
        let mut t = self.lock();
        if t.burst.is_some() {
            t.burst = Some(now);
            return false;
        }
        if t.seen.contains(&unit)
            || t.queued.contains(&unit)
            || t.seen.len() + t.queue.len() >= MAX_LOOKUPS
        {
            return false;
        }
        if t.queue.len() >= BURST {
            t.queue.clear();
            t.queued.clear();
            t.burst = Some(now);
        } else {
            t.queued.insert(unit.clone());
            t.queue.push_back(unit);
        }
        !std::mem::replace(&mut t.working, true)
    }

    /// What the worker does next; a unit it gets is now seen. `Done` ends
    /// the worker.
    pub fn next(&self) -> Next {
        self.next_at(Instant::now())
    }

    fn next_at(&self, now: Instant) -> Next {
        let mut t = self.lock();
        if let Some(last) = t.burst {
            let quiet = now.saturating_duration_since(last);
            if quiet < QUIET {
                return Next::Rescan(quiet);
            }
            t.burst = None;
            return Next::Rescan(quiet);
        }
        let Some(unit) = t.queue.pop_front() else {
            t.working = false;
            return Next::Done;
        };
        t.queued.remove(&unit);
        t.seen.insert(unit.clone());
        Next::Unit(unit)
    }

    /// Empties the queue (the hub follows the units from now on).
    pub fn clear(&self) {
        let mut t = self.lock();
        t.queue.clear();
        t.queued.clear();
        t.burst = None;
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
        assert_eq!(l.next(), Next::Unit(u("a.service")));
        assert!(!l.push(u("a.service")), "seen");
        assert_eq!(l.next(), Next::Unit(u("b.service")));
        assert_eq!(l.next(), Next::Done);
        assert!(l.push(u("c.service")), "the worker ended: a new one");
        l.clear();
        assert_eq!(l.next(), Next::Done);
        l.forget_seen();
        assert!(l.push(u("a.service")));
    }

    #[test]
    fn a_burst_is_read_once_it_is_quiet() {
        let l = Lookups::default();
        let t0 = Instant::now();
        for i in 0..BURST + 10 {
            l.push_at(u(&format!("u{i}.service")), t0);
        }
        assert!(l.lock().queue.is_empty(), "the burst's queue is dropped");
        let t1 = t0 + QUIET / 2;
        assert!(!l.push_at(u("late.service"), t1));
        assert_eq!(l.next_at(t1 + QUIET / 4), Next::Rescan(QUIET / 4));
        assert_eq!(l.next_at(t1 + QUIET), Next::Rescan(QUIET));
        // The rescan is taken: unit by unit again.
        assert_eq!(l.next_at(t1 + QUIET), Next::Done);
        assert!(l.push_at(u("after.service"), t1 + QUIET));
        assert_eq!(l.next(), Next::Unit(u("after.service")));
    }
}
