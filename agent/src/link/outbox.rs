//! The single way anything reaches the manager.
//!
//! Request handlers, the job event pump and the heartbeat timer all hand
//! their messages to the [`Outbox`] together with the link session (`epoch`)
//! they belong to. The outbox never waits:
//!
//! * no session open, or a different session than the message's → the
//!   message is dropped (a reply or job event of a session that is gone means
//!   nothing to the manager on a new session; the manager already failed those
//!   requests and ended those jobs as `disconnected`);
//! * the session's bounded queue is full, i.e. the manager stopped reading →
//!   the session is killed (the link reconnects) instead of the queue growing.
//!
//! So local work (systemd subscriptions, job tracking) never blocks on the link.

use drover_protocol::ToManager;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio_util::sync::CancellationToken;

/// Why a session ended early, recorded by whoever ends it first.
#[derive(Debug, Default)]
pub struct SessionKill {
    token: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl SessionKill {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Ends the session; the first reason given wins.
    pub fn kill(&self, reason: impl Into<String>) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        drop(slot);
        self.token.cancel();
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

struct Open {
    epoch: u64,
    tx: mpsc::Sender<ToManager>,
    kill: Arc<SessionKill>,
}

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// Its session is not the open one (or none is open); dropped.
    Stale,
    /// The queue was full; dropped, and the session is being killed.
    Overflow,
}

/// See the module docs.
#[derive(Default)]
pub struct Outbox {
    open: Mutex<Option<Open>>,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, Option<Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts routing messages of session `epoch` into `tx`.
    pub fn open(&self, epoch: u64, tx: mpsc::Sender<ToManager>, kill: Arc<SessionKill>) {
        *self.lock() = Some(Open { epoch, tx, kill });
    }

    /// Stops routing messages of session `epoch` (dropping its sender lets the
    /// writer drain what is queued and finish).
    pub fn close(&self, epoch: u64) {
        let mut open = self.lock();
        if open.as_ref().is_some_and(|o| o.epoch == epoch) {
            *open = None;
        }
    }

    /// The open session, if any.
    pub fn current(&self) -> Option<u64> {
        self.lock().as_ref().map(|o| o.epoch)
    }

    /// Queues `msg` for session `epoch`; never waits.
    pub fn send(&self, epoch: u64, msg: ToManager) -> Sent {
        let open = self.lock();
        let Some(o) = open.as_ref().filter(|o| o.epoch == epoch) else {
            return Sent::Stale;
        };
        match o.tx.try_send(msg) {
            Ok(()) => Sent::Queued,
            Err(TrySendError::Closed(_)) => Sent::Stale,
            Err(TrySendError::Full(_)) => {
                o.kill
                    .kill("the manager stopped reading (outgoing queue full)");
                Sent::Overflow
            }
        }
    }
}

impl Outbox {
    /// Queues `msg` for session `epoch` once at least half of the session's
    /// queue is free, waiting up to `patience` for the manager to read.
    ///
    /// For bulk producers (unit events, whose bursts — a `*` subscription's
    /// replay, a daemon-reload — can exceed the queue): they slow down to the
    /// manager's pace instead of overflowing, and the other half stays free
    /// for [`Outbox::send`], which never waits. A manager that reads nothing
    /// for `patience` gets its session killed, as an overflow would.
    pub async fn send_paced(
        &self,
        epoch: u64,
        msg: ToManager,
        patience: std::time::Duration,
    ) -> Sent {
        let (tx, kill) = {
            let open = self.lock();
            let Some(o) = open.as_ref().filter(|o| o.epoch == epoch) else {
                return Sent::Stale;
            };
            (o.tx.clone(), o.kill.clone())
        };
        let half = (tx.max_capacity() / 2).max(1);
        let reserved = tokio::select! {
            _ = kill.token().cancelled() => return Sent::Stale,
            r = tokio::time::timeout(patience, tx.reserve_many(half)) => r,
        };
        match reserved {
            Ok(Ok(mut permits)) => match permits.next() {
                Some(permit) => {
                    permit.send(msg);
                    Sent::Queued
                }
                None => Sent::Stale,
            },
            Ok(Err(_)) => Sent::Stale,
            Err(_) => {
                kill.kill(format!(
                    "the manager read nothing for {patience:?} (outgoing queue full)"
                ));
                Sent::Overflow
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_only_to_the_open_session_and_kills_on_overflow() {
        let outbox = Outbox::default();
        assert_eq!(
            outbox.send(1, ToManager::Heartbeat),
            Sent::Stale,
            "nothing open"
        );
        let (tx, mut rx) = mpsc::channel(2);
        let kill = SessionKill::new();
        outbox.open(1, tx, kill.clone());
        assert_eq!(
            outbox.send(0, ToManager::Heartbeat),
            Sent::Stale,
            "old session"
        );
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Queued);
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Queued);
        assert!(!kill.token().is_cancelled());
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Overflow);
        assert!(kill.token().is_cancelled());
        assert!(kill.reason().is_some_and(|r| r.contains("queue full")));
        assert_eq!(rx.try_recv().ok(), Some(ToManager::Heartbeat));
        outbox.close(1);
        assert_eq!(outbox.current(), None);
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Stale);
    }

    #[tokio::test]
    async fn paced_sends_leave_half_the_queue_and_give_up_on_a_silent_manager() {
        let outbox = Outbox::default();
        let (tx, mut rx) = mpsc::channel(4);
        let kill = SessionKill::new();
        outbox.open(1, tx, kill.clone());
        let patience = std::time::Duration::from_millis(50);
        assert_eq!(
            outbox.send_paced(1, ToManager::Heartbeat, patience).await,
            Sent::Queued
        );
        assert_eq!(
            outbox.send_paced(1, ToManager::Heartbeat, patience).await,
            Sent::Queued
        );
        // Two of four slots used: a paced send waits, a plain send still fits.
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Queued);
        rx.recv().await;
        rx.recv().await;
        assert_eq!(
            outbox.send_paced(1, ToManager::Heartbeat, patience).await,
            Sent::Queued
        );
        assert_eq!(outbox.send(1, ToManager::Heartbeat), Sent::Queued);
        assert!(!kill.token().is_cancelled());
        // Three of four used and nobody reads any more: the paced send gives up and kills the session.
        assert_eq!(
            outbox.send_paced(1, ToManager::Heartbeat, patience).await,
            Sent::Overflow
        );
        assert!(kill.token().is_cancelled());
        assert_eq!(
            outbox.send_paced(2, ToManager::Heartbeat, patience).await,
            Sent::Stale
        );
    }
}
