//! [`ElectionThread`]: the election on an OS thread of its own, with its
//! own current-thread tokio runtime.
//!
//! Why: the leader's renewals must not wait behind the manager's work.
//! On the manager's runtime, a leader serving 10,000 sessions on a loaded
//! machine renewed its lease late and lost it with nothing wrong
//! (docs/dev/ha.md, "Failover with simulated agents"). Here the campaign,
//! the renewals, the guard of the key, the wake-up at the fence's deadline
//! and a standby's watch run on a runtime that runs nothing else, so they
//! wait only for the kernel's scheduler and etcd. (No priority is asked
//! for: raising a thread's priority needs privileges a manager may not
//! have.)
//!
//! What crosses between the thread and the manager: the [`Fence`] (atomics
//! and a mutex, read by `Nodes::phase` on every call, so refusing never
//! depends on the manager's runtime having run) and the seat's [`Relay`]
//! (the manager's runtime applies what leading means, in order).
//!
//! [`Fence`]: crate::ha::fence::Fence

use crate::ha::election::Election;
use crate::ha::seat::{Relay, Seat};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// See the module docs. Dropped without [`ElectionThread::resign`], the
/// election ends at once without resigning (a lease then lapses in etcd,
/// as a killed manager's does), and the seat applies nothing more.
pub struct ElectionThread {
    /// Ends the election without resigning.
    abort: CancellationToken,
    /// Fires when the election's thread is done.
    ended: Option<oneshot::Receiver<()>>,
    /// The seat's end of the relay, on the manager's runtime.
    applier: JoinHandle<()>,
}

impl ElectionThread {
    /// Starts `election` on its own thread; `seat` is applied on the
    /// current tokio runtime (the manager's). The election runs until
    /// `stop` is cancelled; a leader then resigns.
    pub fn start(
        election: Election,
        seat: Arc<dyn Seat>,
        stop: CancellationToken,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("drover-election")
            .build()?;
        let (relay, applier) = Relay::start(seat);
        let abort = CancellationToken::new();
        let (done, ended) = oneshot::channel();
        let aborted = abort.clone();
        let spawned = std::thread::Builder::new()
            .name("drover-election".into())
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        biased;
                        _ = aborted.cancelled() => {}
                        _ = election.run(&relay, stop) => {}
                    }
                });
                // The relay goes first (the seat's end then finishes what
                // was queued), then the runtime with whatever it still had
                // (an etcd connection's task).
                drop(relay);
                drop(runtime);
                let _ = done.send(());
            });
        match spawned {
            Ok(_) => Ok(Self {
                abort,
                ended: Some(ended),
                applier,
            }),
            Err(e) => {
                applier.abort();
                Err(e)
            }
        }
    }

    /// Waits at most `limit` for the election to end (after its `stop`:
    /// a leader revokes its lease) and for the seat to apply everything
    /// the election asked. Returns false when that took longer: the
    /// election is then ended without resigning and nothing more is
    /// applied.
    pub async fn resign(mut self, limit: Duration) -> bool {
        let ended = self.ended.take();
        let applier = &mut self.applier;
        tokio::time::timeout(limit, async move {
            if let Some(ended) = ended {
                let _ = ended.await;
            }
            let _ = applier.await;
        })
        .await
        .is_ok()
    }
}

impl Drop for ElectionThread {
    fn drop(&mut self) {
        self.abort.cancel();
        self.applier.abort();
    }
}
