//! When the manager tells its service manager what (the messages themselves:
//! `drover_config::notify`).
//!
//! * `READY=1` once the API is served and agents are accepted, with the
//!   first `STATUS=`.
//! * `STATUS=N of M nodes online` on every change of either number (M: the
//!   nodes the manager knows, from `AllowedNodeNames` and `[node NAME]`
//!   sections, and certified nodes it has admitted) — [`status_line`]. The
//!   node lifecycle publishes the counts
//!   ([`crate::nodes::lifecycle::Lifecycle::node_counts`]) under the lock
//!   that orders online/offline announcements; [`follow_status`] sends
//!   them, a burst of registrations as its latest numbers.
//! * `RELOADING=1` … `READY=1` around every reload ([`reloading`],
//!   [`reloaded`], called by [`crate::reload::reload_from_source`]).
//! * `WATCHDOG=1` at half of `WATCHDOG_USEC` ([`Watchdog`]), from the
//!   manager's main loop after its liveness check (see [`crate::cli`]);
//!   nothing without `WatchdogSec=`.
//! * `STOPPING=1` when the manager begins to shut down.

use drover_config::notify;
use std::time::Duration;
use tokio::sync::watch;

/// The counts `STATUS=` shows: nodes online, nodes known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeCounts {
    pub online: usize,
    pub known: usize,
}

/// `N of M nodes online` (`1 of 1 node online`).
pub fn status_line(counts: NodeCounts) -> String {
    let noun = if counts.known == 1 { "node" } else { "nodes" };
    format!("{} of {} {noun} online", counts.online, counts.known)
}

/// `READY=1` with the status line.
pub fn ready(counts: NodeCounts) {
    notify::ready(&status_line(counts));
}

/// A reload begins.
pub fn reloading() {
    notify::reloading("reloading the configuration");
}

/// The reload is applied (or refused, the running configuration kept).
pub fn reloaded(counts: NodeCounts) {
    notify::ready(&status_line(counts));
}

/// The manager begins to shut down.
pub fn stopping() {
    notify::stopping("shutting down");
}

/// Sends the node counts as `STATUS=` whenever they change, until the
/// sender is dropped. A burst of changes sends the latest counts once.
pub async fn follow_status(mut counts: watch::Receiver<NodeCounts>) {
    while counts.changed().await.is_ok() {
        let now = *counts.borrow_and_update();
        notify::status(&status_line(now));
    }
}

/// The watchdog as the service manager configured it.
pub struct Watchdog {
    interval: Option<tokio::time::Interval>,
}

impl Watchdog {
    /// From `WATCHDOG_USEC`/`WATCHDOG_PID`. Must run inside a tokio runtime.
    pub fn from_env() -> Self {
        Self::every(notify::watchdog_every())
    }

    /// Pings every `every` (`None`: never).
    pub fn every(every: Option<Duration>) -> Self {
        let interval = every.map(|every| {
            let mut i = tokio::time::interval(every);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        Self { interval }
    }

    /// How often it pings; `None`: never.
    pub fn period(&self) -> Option<Duration> {
        self.interval.as_ref().map(tokio::time::Interval::period)
    }

    /// Waits until the next ping is due (forever when the watchdog is off),
    /// then awaits `alive` (the daemon's proof that its event loop works)
    /// and sends `WATCHDOG=1`. The first ping is due at once.
    pub async fn ping_when_due(&mut self, alive: impl Future<Output = ()>) {
        match &mut self.interval {
            Some(i) => {
                i.tick().await;
                alive.await;
                notify::watchdog();
            }
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        let c = |online, known| NodeCounts { online, known };
        assert_eq!(status_line(c(0, 0)), "0 of 0 nodes online");
        assert_eq!(status_line(c(1, 1)), "1 of 1 node online");
        assert_eq!(status_line(c(2, 3)), "2 of 3 nodes online");
    }

    #[tokio::test]
    async fn no_watchdog_means_no_ping() {
        let mut off = Watchdog::every(None);
        assert_eq!(off.period(), None);
        let pinged =
            tokio::time::timeout(Duration::from_millis(50), off.ping_when_due(async {})).await;
        assert!(pinged.is_err(), "an unset watchdog never pings");
        let on = Watchdog::every(Some(Duration::from_secs(5)));
        assert_eq!(on.period(), Some(Duration::from_secs(5)));
    }
}
