//! Jittered exponential backoff between connection attempts.
//!
//! Invariants: the first delay after a [`Backoff::reset`] is uniform in
//! [100 ms, 250 ms]; every further one doubles the ceiling, never above the
//! cap, never below 100 ms (or the cap, when smaller); delays differ between
//! agents and attempts, so thousands of agents do not reconnect in lockstep.
//! The jitter needs no unpredictability, only difference
//! ([`crate::link::random_u64`]).

use crate::link::random_u64;
use std::time::Duration;

/// Jittered exponential backoff (see the module docs).
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    cap: Duration,
}

const BACKOFF_FLOOR: Duration = Duration::from_millis(100);
const BACKOFF_FIRST: Duration = Duration::from_millis(250);

impl Backoff {
    pub fn new(cap: Duration) -> Self {
        Self { attempt: 0, cap }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The next delay: uniform in [100 ms, min(cap, 250 ms · 2^attempt)].
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = BACKOFF_FIRST
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let floor = BACKOFF_FLOOR.min(ceiling);
        let span = (ceiling - floor).as_millis() as u64;
        floor + Duration::from_millis(random_u64() % (span + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_small_doubles_and_is_capped() {
        let mut b = Backoff::new(Duration::from_secs(2));
        for _ in 0..50 {
            let mut b1 = b.clone();
            b1.reset();
            let first = b1.next_delay();
            assert!(
                first >= Duration::from_millis(100) && first <= Duration::from_millis(250),
                "{first:?}"
            );
        }
        let delays: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(100) && *d <= Duration::from_secs(2)),
            "{delays:?}"
        );
        // Jitter: not all the same once the window is wide.
        let later: Vec<_> = (0..20).map(|_| b.next_delay()).collect();
        assert!(later.iter().any(|d| *d != later[0]), "{later:?}");
    }
}
