//! What the reference rules count as they go, for the Prometheus endpoint:
//! references by state, targets with live references, proxy errors by
//! reason class, references collected as stale, and the time from a
//! reference's announcement to its proxy's activation.
//!
//! Invariants: every figure is an atomic (or prometheus-client's atomic
//! histogram), changed by [`Tally`] as a reference is made, changes state
//! or is dropped: reading them takes no lock and walks nothing. The state
//! gauges are exact because a [`Tally`] lives inside each reference and
//! moves its count on every change, including its drop. Labels are the
//! fixed sets [`Slot::LABELS`] and [`ErrorReason::LABELS`].

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use tokio::time::Instant;

/// A reference's state as counted (`RefState` without its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Waiting = 0,
    Active = 1,
    Failed = 2,
    Ended = 3,
}

impl Slot {
    /// The `state` label of each slot, in slot order.
    pub const LABELS: [&'static str; 4] = ["waiting", "active", "failed", "ended"];
}

/// Why a proxy failed, as a bounded class (the message itself, which names
/// units and nodes, goes to the requester only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    /// The target node is not one the manager knows.
    UnknownNode = 0,
    /// `AllowDependenciesOn` does not permit it (also: revoked by a reload).
    NotAllowed = 1,
    /// The target's agent or its systemd could not start the dep unit (no
    /// such unit, a failed start job, ...).
    StartFailed = 2,
    /// The target went down (failed, inactive, removed) before the proxy was
    /// up.
    TargetDown = 3,
}

impl ErrorReason {
    /// The `reason` label of each class, in order.
    pub const LABELS: [&'static str; 4] =
        ["unknown_node", "not_allowed", "start_failed", "target_down"];
}

/// The figures (see the module docs); shared by the rules and the scrape.
#[derive(Debug)]
pub struct ProxyStats {
    states: [AtomicI64; 4],
    targets: AtomicI64,
    errors: [AtomicU64; 4],
    stale: AtomicU64,
    activation: Histogram,
}

impl Default for ProxyStats {
    fn default() -> Self {
        Self {
            states: Default::default(),
            targets: AtomicI64::new(0),
            errors: Default::default(),
            stale: AtomicU64::new(0),
            // 5 ms .. 82 s, as the jobs' durations.
            activation: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
        }
    }
}

impl ProxyStats {
    /// References per state, in [`Slot::LABELS`] order.
    pub fn states(&self) -> [i64; 4] {
        self.states.each_ref().map(|a| a.load(Ordering::Relaxed))
    }

    /// Targets (node, unit) with live references: their dep units are wanted.
    pub fn targets(&self) -> i64 {
        self.targets.load(Ordering::Relaxed)
    }

    /// Errors per class, in [`ErrorReason::LABELS`] order.
    pub fn errors(&self) -> [u64; 4] {
        self.errors.each_ref().map(|a| a.load(Ordering::Relaxed))
    }

    /// Live references dropped because their requester stayed away past
    /// the grace period.
    pub fn stale(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }

    /// Announcement to activation, in seconds.
    pub fn activation(&self) -> &Histogram {
        &self.activation
    }

    pub(crate) fn error(&self, reason: ErrorReason) {
        self.errors[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn collected_stale(&self) {
        self.stale.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn target_watched(&self, watched: bool) {
        self.targets
            .fetch_add(if watched { 1 } else { -1 }, Ordering::Relaxed);
    }

    fn count(&self, slot: Slot, by: i64) {
        self.states[slot as usize].fetch_add(by, Ordering::Relaxed);
    }
}

/// One reference's share of [`ProxyStats`]: counted under its slot from
/// its making to its drop.
#[derive(Debug)]
pub struct Tally {
    stats: Arc<ProxyStats>,
    slot: Slot,
    /// When the reference was announced (activation time is from here).
    since: Instant,
}

impl Tally {
    pub fn new(stats: &Arc<ProxyStats>, slot: Slot, since: Instant) -> Self {
        stats.count(slot, 1);
        Self {
            stats: stats.clone(),
            slot,
            since,
        }
    }

    /// Moves the reference to `slot`; `error` counts a failure, and an
    /// activation is timed.
    pub fn set(&mut self, slot: Slot, error: Option<ErrorReason>) {
        if slot == self.slot {
            return;
        }
        self.stats.count(self.slot, -1);
        self.stats.count(slot, 1);
        if slot == Slot::Active {
            // Measured only: no rule reads the clock here.
            let took = Instant::now().saturating_duration_since(self.since);
            self.stats.activation.observe(took.as_secs_f64());
        }
        if let Some(reason) = error {
            self.stats.error(reason);
        }
        self.slot = slot;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.stats.count(self.slot, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tally_moves_its_count_and_gives_it_back() {
        let stats = Arc::new(ProxyStats::default());
        let mut t = Tally::new(&stats, Slot::Waiting, Instant::now());
        let other = Tally::new(&stats, Slot::Waiting, Instant::now());
        assert_eq!(stats.states(), [2, 0, 0, 0]);
        tokio::time::advance(std::time::Duration::from_millis(300)).await;
        t.set(Slot::Active, None);
        assert_eq!(stats.states(), [1, 1, 0, 0]);
        t.set(Slot::Ended, None);
        assert_eq!(stats.states(), [1, 0, 0, 1]);
        drop(other);
        drop(t);
        assert_eq!(stats.states(), [0, 0, 0, 0]);
        let (count, sum) = crate::nodes::link_stats::totals(stats.activation());
        assert_eq!(count, 1);
        assert!((sum - 0.3).abs() < 1e-6, "{sum}");
    }
}
