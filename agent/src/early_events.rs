//! Job events that overtake the call naming their job.
//!
//! systemd can queue, run and remove a fast job before the reply to
//! `StartUnit` (& co) gives us its path: the job stream then delivers
//! events for a path nobody knows yet. Whoever queues jobs counts its calls
//! in flight ([`EarlyEvents::call_started`]) and offers every event for an
//! unknown path here ([`EarlyEvents::offer`]); once a call returns its path,
//! [`EarlyEvents::call_finished`] hands back what arrived for that path, in
//! order. Used by the job tracker (`crate::jobs`, manager jobs) and the dep
//! waiters (`crate::deps::dep_unit`, dep start jobs).
//!
//! Invariants:
//! * Only kept while a call is in flight: with none, an unknown path is
//!   someone else's job, and what is left when the last call returns is
//!   dropped (no call can claim it any more).
//! * Bounded in count (oldest dropped first) and age (older than the TTL is
//!   dropped before anything is handed back).

use crate::systemd::api::JobPath;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// See the module docs. `E` is what the owner keeps of an event.
#[derive(Debug)]
pub struct EarlyEvents<E> {
    in_flight: usize,
    kept: VecDeque<(Instant, JobPath, E)>,
    ttl: Duration,
    cap: usize,
}

impl<E> EarlyEvents<E> {
    /// Keeps events at most `ttl` and at most `cap` of them (at least one).
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            in_flight: 0,
            kept: VecDeque::new(),
            ttl,
            cap: cap.max(1),
        }
    }

    /// A job call is about to be sent to systemd.
    pub fn call_started(&mut self) {
        self.in_flight += 1;
    }

    /// An event for `job`, a path nobody follows: kept if a call is in
    /// flight (true), dropped otherwise.
    pub fn offer(&mut self, now: Instant, job: &str, event: E) -> bool {
        if self.in_flight == 0 {
            return false;
        }
        self.prune(now);
        if self.kept.len() >= self.cap {
            self.kept.pop_front();
        }
        self.kept.push_back((now, job.to_string(), event));
        true
    }

    /// A job call ended, with the path it returned (`None`: it failed). The
    /// events kept for that path, oldest first.
    pub fn call_finished(&mut self, now: Instant, job: Option<&str>) -> Vec<E> {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.prune(now);
        let mut mine = Vec::new();
        if let Some(job) = job {
            let mut rest = VecDeque::with_capacity(self.kept.len());
            for (at, path, event) in self.kept.drain(..) {
                if path == job {
                    mine.push(event);
                } else {
                    rest.push_back((at, path, event));
                }
            }
            self.kept = rest;
        }
        if self.in_flight == 0 {
            self.kept.clear();
        }
        mine
    }

    /// Events kept now.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    fn prune(&mut self, now: Instant) {
        while let Some((at, _, _)) = self.kept.front() {
            if now.saturating_duration_since(*at) > self.ttl {
                self.kept.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_only_while_a_call_is_in_flight_and_handed_back_in_order() {
        let mut e = EarlyEvents::new(Duration::from_secs(10), 8);
        let now = Instant::now();
        assert!(!e.offer(now, "/job/1", 1), "idle: someone else's job");
        e.call_started();
        e.call_started();
        assert!(e.offer(now, "/job/1", 1));
        assert!(e.offer(now, "/job/2", 2));
        assert!(e.offer(now, "/job/1", 3));
        assert_eq!(e.call_finished(now, Some("/job/1")), vec![1, 3]);
        assert_eq!(e.len(), 1, "the other call may still claim its event");
        assert_eq!(e.call_finished(now, None), Vec::<i32>::new());
        assert!(e.is_empty(), "nobody left to claim anything");
    }

    #[test]
    fn bounded_in_count_and_age() {
        let mut e = EarlyEvents::new(Duration::from_secs(1), 2);
        let start = Instant::now();
        e.call_started();
        for n in 1..=3 {
            e.offer(start, "/job/1", n);
        }
        assert_eq!(e.len(), 2, "oldest dropped first");
        let late = start + Duration::from_secs(5);
        assert!(e.call_finished(late, Some("/job/1")).is_empty());
    }
}
