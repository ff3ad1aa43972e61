//! Giving the heap that a burst of connections freed back to the kernel.
//!
//! glibc's malloc keeps what a program frees inside its arenas, and only
//! the top of an arena goes back to the kernel by itself. A fleet's cold
//! start (thousands of hellos and TLS handshakes, each with buffers freed
//! once its session runs) or a mass disconnect leaves free chunks between
//! the sessions' live ones, resident for good: 1.5 KiB per node at 2,000
//! plaintext nodes in `drover-bench fleet` (docs/dev/notes/fleet-scale.md), and it
//! varied with how the burst happened to interleave.
//!
//! [`Churn`] counts accepted connections, ended sessions and large list
//! replies (the orphan-dep sweep lists every node's units one grace period
//! after it registered: 7.5 KiB per node stayed resident at 10,000 nodes
//! with 100 units each); the heartbeat
//! timer, which ticks anyway, calls [`Churn::tick`]. Once at least
//! [`BURST`] of them came since the last trim and a whole tick passed with
//! none, the burst is over and `malloc_trim(0)` hands every arena's free
//! pages back (`MADV_DONTNEED`; the address space stays, so a later burst
//! costs only page faults).
//!
//! Invariants: no trim while connections keep coming (it would only be
//! undone); at most one trim per burst; a handful of reconnects never
//! trims; elsewhere than glibc it does nothing.

use std::sync::atomic::{AtomicU64, Ordering};

/// Connections accepted or sessions ended since the last trim before one is
/// worth it (one session's churn frees a few KiB).
pub const BURST: u64 = 100;

/// The counter the connection paths bump, and the timer's view of it.
#[derive(Debug, Default)]
pub struct Churn {
    count: AtomicU64,
}

/// What the timer remembers between ticks (one timer task owns it).
#[derive(Debug, Default)]
pub struct TrimState {
    seen: u64,
    trimmed: u64,
}

impl Churn {
    /// A connection was accepted or a session ended.
    pub fn note(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Called once per timer tick: trims when a burst has just ended, and
    /// returns the churn the trim followed.
    pub fn tick(&self, state: &mut TrimState) -> Option<u64> {
        let burst = state.due(self.count.load(Ordering::Relaxed))?;
        release_free_heap();
        Some(burst)
    }
}

impl TrimState {
    /// With `count` the churn so far: the size of the burst that just ended
    /// (a quiet tick after at least [`BURST`]), if a trim is due now.
    fn due(&mut self, count: u64) -> Option<u64> {
        let quiet = count == self.seen;
        self.seen = count;
        let burst = count.saturating_sub(self.trimmed);
        if quiet && burst >= BURST {
            self.trimmed = count;
            Some(burst)
        } else {
            None
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_heap() {
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointer and only walks malloc's own
    // arenas under their locks; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_heap() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_after_a_burst_has_ended() {
        let mut s = TrimState::default();
        assert_eq!(s.due(0), None, "nothing happened");
        assert_eq!(s.due(500), None, "the burst is still going");
        assert_eq!(s.due(2_000), None, "still going");
        assert_eq!(s.due(2_000), Some(2_000), "a quiet tick ends it");
        assert_eq!(s.due(2_000), None, "one trim per burst");
        assert_eq!(s.due(2_000), None);
    }

    #[test]
    fn a_few_reconnects_never_trim() {
        let mut s = TrimState::default();
        let mut count = 0;
        for _ in 0..10 {
            count += BURST / 4;
            assert_eq!(s.due(count), None);
        }
        // ... but they add up: 10 × 25 since the last trim, then quiet.
        assert_eq!(s.due(count), Some(count));
        assert_eq!(s.due(count + 3), None);
        assert_eq!(s.due(count + 3), None, "3 since the trim are too few");
    }

    #[test]
    fn the_next_burst_counts_from_the_last_trim() {
        let mut s = TrimState::default();
        s.due(300);
        assert_eq!(s.due(300), Some(300));
        s.due(300 + BURST);
        assert_eq!(s.due(300 + BURST), Some(BURST));
    }

    #[test]
    fn trimming_for_real_is_harmless() {
        let churn = Churn::default();
        let mut s = TrimState::default();
        for _ in 0..BURST {
            churn.note();
        }
        let live = vec![1u8; 1 << 20];
        assert_eq!(
            churn.tick(&mut s),
            None,
            "the first tick sees the burst going"
        );
        assert_eq!(churn.tick(&mut s), Some(BURST));
        assert!(live.iter().all(|&b| b == 1), "live memory is untouched");
    }
}
