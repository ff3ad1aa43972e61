//! [`Seat`]: what leading and standing by do to the manager, and the
//! [`Relay`] that carries the election's word to it.
//!
//! The election runs on a thread of its own ([`crate::ha::thread`]); the
//! seat's work (the phase, the agents' sessions, the bus) runs on the
//! manager's runtime. The relay is an ordered queue between the two: the
//! election never waits for the manager's runtime while it leads (a
//! renewal must not wait behind 10,000 sessions' work), and the seat
//! applies every call in the order the election made them.
//!
//! Invariants:
//! * [`Relay::lead`] and [`Relay::saw_leader`] only queue; the fence
//!   already says what they announce, and the fence is what refuses
//!   (`Nodes::phase` reads it), so a late seat call never lets a manager
//!   act without leading.
//! * [`Relay::stand_by`] waits until the seat has applied it and every
//!   call before it: a manager that lost its lease drops its sessions
//!   before it campaigns again, so no session of an old epoch lives on
//!   under a new one.
//! * The queue holds at most three calls: a lead is always followed by a
//!   stand-by that is waited for (or by the end of the election), and a
//!   `saw_leader` already queued is not queued again (the seat reads the
//!   fence when it applies it).

use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// What leading and standing by do to the manager (implemented by the
/// server). Applied on the manager's runtime, in the election's order.
pub trait Seat: Send + Sync + 'static {
    /// This manager leads (the fence said so when the call was made; it
    /// may have stopped since: the fence decides).
    fn lead(&self) -> BoxFuture<'_, ()>;
    /// This manager no longer leads (the fence already says so): refuse,
    /// drop the agents' sessions.
    fn stand_by<'a>(&'a self, why: &'a str) -> BoxFuture<'a, ()>;
    /// A standby learned who leads (the fence's leader and epoch).
    fn saw_leader(&self) -> BoxFuture<'_, ()>;
}

enum Call {
    Lead,
    StandBy {
        why: String,
        applied: oneshot::Sender<()>,
    },
    SawLeader,
}

/// The election's end of the queue (see the module docs).
pub struct Relay {
    calls: mpsc::UnboundedSender<Call>,
    /// A `SawLeader` is queued and not yet taken.
    announcing: Arc<AtomicBool>,
}

impl Relay {
    /// Starts the seat's end of the queue on the current tokio runtime
    /// (the manager's); it ends once the relay is dropped and every call
    /// queued before has been applied.
    pub fn start(seat: Arc<dyn Seat>) -> (Relay, JoinHandle<()>) {
        let (calls, mut queued) = mpsc::unbounded_channel();
        let announcing = Arc::new(AtomicBool::new(false));
        let flag = announcing.clone();
        let applier = tokio::spawn(async move {
            while let Some(call) = queued.recv().await {
                match call {
                    Call::Lead => seat.lead().await,
                    Call::StandBy { why, applied } => {
                        seat.stand_by(&why).await;
                        let _ = applied.send(());
                    }
                    Call::SawLeader => {
                        // Cleared first: a change seen from now on is
                        // announced again.
                        flag.store(false, Ordering::SeqCst);
                        seat.saw_leader().await;
                    }
                }
            }
        });
        (Relay { calls, announcing }, applier)
    }

    /// Queues [`Seat::lead`].
    pub fn lead(&self) {
        let _ = self.calls.send(Call::Lead);
    }

    /// Queues [`Seat::stand_by`] and waits until it is applied (or the
    /// seat's end is gone: the manager is stopping).
    pub async fn stand_by(&self, why: &str) {
        let (applied, done) = oneshot::channel();
        let call = Call::StandBy {
            why: why.to_string(),
            applied,
        };
        if self.calls.send(call).is_ok() {
            let _ = done.await;
        }
    }

    /// Queues [`Seat::saw_leader`] unless one is queued already.
    pub fn saw_leader(&self) {
        if !self.announcing.swap(true, Ordering::SeqCst) {
            let _ = self.calls.send(Call::SawLeader);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl Recorded {
        fn push(&self, s: &str) {
            self.0.lock().expect("not poisoned").push(s.to_string());
        }
        fn calls(&self) -> Vec<String> {
            self.0.lock().expect("not poisoned").clone()
        }
    }

    impl Seat for Recorded {
        fn lead(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move { self.push("lead") })
        }
        fn stand_by<'a>(&'a self, why: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move { self.push(&format!("stand_by: {why}")) })
        }
        fn saw_leader(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move { self.push("saw_leader") })
        }
    }

    /// On a current-thread runtime the applier runs only when the test
    /// awaits: what is queued before is applied in order, `saw_leader`s
    /// queued back to back count once, and a stand-by returns only once
    /// it and everything before it is applied.
    #[tokio::test]
    async fn calls_are_applied_in_order_and_a_stand_by_waits_for_them() {
        let seat = Arc::new(Recorded::default());
        let (relay, applier) = Relay::start(seat.clone());
        relay.saw_leader();
        relay.saw_leader();
        relay.lead();
        assert!(seat.calls().is_empty(), "nothing applied before awaiting");
        relay.stand_by("lost").await;
        assert_eq!(seat.calls(), ["saw_leader", "lead", "stand_by: lost"]);
        relay.saw_leader();
        drop(relay);
        applier.await.expect("the applier ends");
        assert_eq!(seat.calls().last().map(String::as_str), Some("saw_leader"));
        assert_eq!(seat.calls().len(), 4);
    }

    #[tokio::test]
    async fn a_stand_by_does_not_hang_when_the_seat_is_gone() {
        let seat = Arc::new(Recorded::default());
        let (relay, applier) = Relay::start(seat.clone());
        applier.abort();
        let _ = applier.await;
        relay.stand_by("gone").await;
        assert!(seat.calls().is_empty());
    }
}
