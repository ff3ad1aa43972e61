//! [`Fence`]: whether this manager may act as the leader, judged on the
//! local monotonic clock, and what it knows of who leads.
//!
//! Invariant: [`Fence::leading`] is true only before the moment the last
//! lease renewal proves etcd cannot yet have expired the lease. That moment
//! is taken from the *send* time of the renewal (etcd counts the lease from
//! when it receives it, later), minus a margin, so a leader stops acting
//! before any other manager can be elected. Every question about leading
//! reads the clock: a process paused (SIGSTOP) past its lease and resumed
//! refuses at once, before any timer of its own has fired.
//!
//! Imports nothing of the manager: the node lifecycle asks it in its phase
//! (`crate::nodes::lifecycle::Nodes::phase`), the API in its properties.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// See the module docs.
pub struct Fence {
    base: Instant,
    /// Nanoseconds after `base` until which this manager leads; 0: it does
    /// not lead.
    until: AtomicU64,
    /// The epoch of the last leadership this manager won or saw (the
    /// leader key's creation revision).
    epoch: AtomicU64,
    /// Times this manager started or stopped leading.
    transitions: AtomicU64,
    /// Who leads as far as this manager knows (the leader key's value).
    leader: Mutex<Option<String>>,
}

impl Default for Fence {
    fn default() -> Self {
        Self::new()
    }
}

impl Fence {
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            until: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            transitions: AtomicU64::new(0),
            leader: Mutex::new(None),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        // At least 1: 0 means "not leading".
        (at.saturating_duration_since(self.base).as_nanos() as u64).max(1)
    }

    /// Whether this manager may act as the leader now.
    pub fn leading(&self) -> bool {
        let until = self.until.load(Ordering::SeqCst);
        until != 0 && self.nanos(Instant::now()) < until
    }

    /// When leading ends unless renewed; `None` while not leading.
    pub fn deadline(&self) -> Option<Instant> {
        match self.until.load(Ordering::SeqCst) {
            0 => None,
            until => Some(self.base + std::time::Duration::from_nanos(until)),
        }
    }

    /// Starts leading with `epoch` until `until`.
    pub fn lead(&self, epoch: u64, until: Instant, me: &str) {
        self.epoch.store(epoch, Ordering::SeqCst);
        self.set_leader(Some(me.to_string()));
        self.until.store(self.nanos(until), Ordering::SeqCst);
        self.transitions.fetch_add(1, Ordering::SeqCst);
    }

    /// Moves the end of leadership to `until` (a renewal), unless this
    /// manager has stopped leading meanwhile: a renewal that comes back
    /// after the deadline passed never revives a leadership.
    pub fn extend(&self, until: Instant) -> bool {
        let now = self.nanos(Instant::now());
        let new = self.nanos(until);
        self.until
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                (cur != 0 && now < cur).then_some(new.max(cur))
            })
            .is_ok()
    }

    /// Stops leading (deadline passed, resign, shutdown). Returns whether
    /// this manager was leading by its record (even if the clock already
    /// ran out).
    pub fn stand_down(&self) -> bool {
        let was = self.until.swap(0, Ordering::SeqCst) != 0;
        if was {
            self.transitions.fetch_add(1, Ordering::SeqCst);
            // Not this manager any more; the next campaign says who.
            self.set_leader(None);
        }
        was
    }

    /// A leader elsewhere, as seen in etcd. Returns whether the epoch or
    /// the leader changed (what the bus announces).
    pub fn saw_leader(&self, leader: Option<String>, epoch: u64) -> bool {
        let raised = epoch > 0 && self.epoch.fetch_max(epoch, Ordering::SeqCst) < epoch;
        self.set_leader(leader) || raised
    }

    /// Returns whether the leader changed.
    fn set_leader(&self, leader: Option<String>) -> bool {
        let mut held = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *held != leader;
        *held = leader;
        changed
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::SeqCst)
    }

    pub fn leader(&self) -> Option<String> {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What a standby tells an agent whose link it parks.
    pub fn parked_message(&self) -> String {
        match self.leader() {
            Some(l) => format!("parked: {l} leads (epoch {})", self.epoch()),
            None => "parked: no leader known".into(),
        }
    }

    /// Why a call is refused on a manager that does not lead, naming the
    /// leader when one is known.
    pub fn refusal(&self) -> String {
        match self.leader() {
            Some(l) => format!(
                "this drover manager stands by; the leader is {l} (epoch {})",
                self.epoch()
            ),
            None => "this drover manager stands by; no leader is elected at the moment".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn leads_until_the_deadline_only() {
        let f = Fence::new();
        assert!(!f.leading());
        f.lead(7, Instant::now() + Duration::from_secs(2), "a:1");
        assert!(f.leading());
        assert_eq!((f.epoch(), f.transitions()), (7, 1));
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(f.extend(Instant::now() + Duration::from_secs(2)));
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(f.leading());
        tokio::time::advance(Duration::from_millis(2)).await;
        // Past the deadline: not leading, and a late renewal does not revive it.
        assert!(!f.leading());
        assert!(!f.extend(Instant::now() + Duration::from_secs(2)));
        assert!(!f.leading());
        assert!(f.stand_down());
        assert!(!f.stand_down());
        assert_eq!(f.transitions(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn refusal_names_the_leader() {
        let f = Fence::new();
        assert!(f.refusal().contains("no leader"));
        assert_eq!(f.parked_message(), "parked: no leader known");
        assert!(f.saw_leader(Some("host-b:842".into()), 12));
        assert!(!f.saw_leader(Some("host-b:842".into()), 3));
        assert!(!f.saw_leader(Some("host-b:842".into()), 12));
        assert_eq!(f.epoch(), 12);
        assert!(
            f.refusal().contains("host-b:842 (epoch 12)"),
            "{}",
            f.refusal()
        );
        assert_eq!(f.parked_message(), "parked: host-b:842 leads (epoch 12)");
    }
}
