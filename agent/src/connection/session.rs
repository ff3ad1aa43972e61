//! One session with the manager that welcomed the agent: a reader, a writer
//! fed by the bounded outbox, a heartbeat timer and the resync digests
//! (step 2 of the module docs of `crate::connection`).
//!
//! Invariants: each request runs as its own task, at most
//! `MaxRequestsInFlight` at once, and the reader waits for a slot, so TCP
//! pushes back on the manager and nothing unbounded is fed from the network;
//! a request id still running is answered once (the second is ignored); the
//! session ends when the manager closes, sends something that is not a
//! valid frame, stays silent past the threshold, stops reading (the outbox
//! kills the session), is preempted or the agent shuts down; then the outbox
//! drops what the session still produces. A polite end (shutdown, switch)
//! flushes what is queued, bounded by a second; any other end kills the
//! writer at once. One message too big for a frame is dropped, not the link.

use super::config::LinkConfig;
use super::connect::LinkStream;
use super::outcome::SessionEnd;
use crate::dispatch::Dispatcher;
use crate::link::outbox::SessionKill;
use crate::link::{heartbeat, random_u64};
use crate::state::Shared;
use crate::systemd::api::Systemd;
use drover_protocol::link::AgentFramed;
use drover_protocol::{ToAgent, ToManager};
use futures::{SinkExt, StreamExt};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// What every session of the link shares: the dispatcher requests go to and
/// the slots that bound the requests running at once.
pub(super) struct Sessions<S> {
    dispatcher: Arc<Dispatcher<S>>,
    slots: Arc<Semaphore>,
    outbox_capacity: usize,
}

impl<S: Systemd> Sessions<S> {
    pub(super) fn new(cfg: &LinkConfig, systemd: Arc<S>, shared: Arc<Shared>) -> Self {
        Self {
            dispatcher: Arc::new(Dispatcher::new(systemd, shared)),
            slots: Arc::new(Semaphore::new(cfg.max_in_flight.max(1))),
            outbox_capacity: cfg.outbox_capacity,
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        self.dispatcher.shared()
    }

    /// Serves the session `epoch` on a welcomed connection until it ends
    /// (see the module docs for how), and says why it ended.
    pub(super) async fn serve(
        &self,
        epoch: u64,
        framed: AgentFramed<LinkStream>,
        beats: &heartbeat::Negotiated,
        resync: Duration,
        shutdown: &CancellationToken,
        preempt: &CancellationToken,
    ) -> SessionEnd {
        let (sink, mut stream) = framed.split();
        let (tx, rx) = mpsc::channel(self.outbox_capacity.max(1));
        let kill = SessionKill::new();
        self.shared().outbox.open(epoch, tx, kill.clone());
        // The outbox routes now: proxies re-announced here cannot be lost.
        // Health goes first: the manager knows which units have checks
        // before it hears anything else of this session.
        self.shared().session_opened(epoch).await;
        self.shared().status.connected();
        self.shared()
            .proxies
            .on_session(epoch, &self.shared().outbox);
        let mut writer = tokio::spawn(write_loop(sink, rx, kill.clone()));
        let heartbeat = beats.send_every.map(|every| {
            let shared = self.shared().clone();
            let kill = kill.clone();
            tokio::spawn(async move {
                let mut tick = heartbeat::timer(every);
                loop {
                    tokio::select! {
                        _ = kill.token().cancelled() => return,
                        _ = tick.tick() => { shared.outbox.send(epoch, ToManager::Heartbeat); }
                    }
                }
            })
        });

        // Resync digests (`crate::units::resync`), when the manager asks for them.
        let resync = (!resync.is_zero()).then(|| {
            let shared = self.shared().clone();
            let stop = kill.token().clone();
            tokio::spawn(async move {
                loop {
                    let wait = drover_protocol::resync::jittered(resync, random_u64());
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    let health = || shared.health.states();
                    if !crate::units::resync::send_digest(
                        &shared.units,
                        &shared.outbox,
                        epoch,
                        health,
                    )
                    .await
                    {
                        tracing::debug!("no resync digest this time (units not comparable now)");
                    }
                }
            })
        });

        let end = tokio::select! {
            end = self.read_loop(epoch, &mut stream, beats.silence, &kill, shutdown) => end,
            _ = preempt.cancelled() => SessionEnd::Switched,
        };

        self.shared().outbox.close(epoch);
        self.shared().session_ended(epoch);
        self.shared().status.disconnected();
        self.shared().stats.session_ended();
        if let Some(h) = heartbeat {
            h.abort();
        }
        if let Some(r) = resync {
            r.abort();
        }
        if matches!(end, SessionEnd::Shutdown | SessionEnd::Switched) {
            // Polite close: the writer drains what is queued, then shuts the
            // write side down. Bounded, a manager that does not read cannot
            // hold the shutdown.
            if tokio::time::timeout(Duration::from_secs(1), &mut writer)
                .await
                .is_err()
            {
                writer.abort();
            }
        } else {
            kill.kill(end.to_string());
            writer.abort();
        }
        end
    }

    async fn read_loop(
        &self,
        epoch: u64,
        stream: &mut futures::stream::SplitStream<AgentFramed<LinkStream>>,
        silence: Option<Duration>,
        kill: &Arc<SessionKill>,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let threshold = silence.unwrap_or(Duration::ZERO);
        let in_flight: Arc<Mutex<HashSet<u64>>> = Arc::default();
        loop {
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                _ = kill.token().cancelled() => return SessionEnd::Killed(kill.reason().unwrap_or_default()),
                next = next_within(stream, threshold) => next,
            };
            if let Ok(Some(Ok(_))) = &next {
                self.shared().status.seen();
            }
            let (id, body) = match next {
                Err(()) => return SessionEnd::HeartbeatExpired(threshold),
                Ok(None) => return SessionEnd::Closed,
                Ok(Some(Err(e))) => return SessionEnd::from_read_error(e),
                Ok(Some(Ok(ToAgent::Heartbeat))) => continue,
                Ok(Some(Ok(ToAgent::Notice(notice)))) => {
                    self.shared().on_notice(notice);
                    continue;
                }
                Ok(Some(Ok(ToAgent::Request { id, body }))) => (id, body),
            };
            if !in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id)
            {
                // Answering twice would break "one reply per id"; the first wins.
                tracing::warn!(
                    id,
                    "the manager reused the id of a request still running; ignoring the second"
                );
                continue;
            }
            // Waiting for a slot stops reading, so TCP pushes back on the
            // manager; the silence threshold only runs while we wait on it.
            let slot = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                _ = kill.token().cancelled() => return SessionEnd::Killed(kill.reason().unwrap_or_default()),
                slot = self.slots.clone().acquire_owned() => slot,
            };
            let Ok(slot) = slot else {
                return SessionEnd::Shutdown;
            };
            let dispatcher = self.dispatcher.clone();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                dispatcher.handle(epoch, id, body).await;
                in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                drop(slot);
            });
        }
    }
}

type Next = Option<Result<ToAgent, drover_protocol::FrameError>>;

/// The next frame, or `Err(())` when the threshold (if any) passed first.
async fn next_within(
    stream: &mut futures::stream::SplitStream<AgentFramed<LinkStream>>,
    threshold: Duration,
) -> Result<Next, ()> {
    if threshold.is_zero() {
        return Ok(stream.next().await);
    }
    tokio::time::timeout(threshold, stream.next())
        .await
        .map_err(|_| ())
}

/// The session's writer: what the outbox queued, batched into one flush;
/// on an error the session is killed with the reason.
pub(super) async fn write_loop(
    mut sink: futures::stream::SplitSink<AgentFramed<LinkStream>, ToManager>,
    mut rx: mpsc::Receiver<ToManager>,
    kill: Arc<SessionKill>,
) {
    let result = tokio::select! {
        _ = kill.token().cancelled() => return,
        r = async {
            while let Some(msg) = rx.recv().await {
                feed_fitting(&mut sink, msg).await?;
                // Batch what is already queued into one flush.
                while let Ok(more) = rx.try_recv() {
                    feed_fitting(&mut sink, more).await?;
                }
                sink.flush().await?;
            }
            // The outbox closed this session: flush and shut the write side.
            sink.close().await
        } => r,
    };
    if let Err(e) = result {
        kill.kill(format!("writing to the manager failed: {e}"));
    }
}

/// Feeds one message; one that does not fit a frame is logged and dropped.
/// One oversized message (an event carrying a huge property value) must not
/// take the whole link down (issue 14.2). Replies are measured earlier, in
/// the dispatcher, so the manager still gets an answer for them.
async fn feed_fitting(
    sink: &mut futures::stream::SplitSink<AgentFramed<LinkStream>, ToManager>,
    msg: ToManager,
) -> Result<(), drover_protocol::FrameError> {
    // Measured before it reaches the sink: the split sink would only report
    // the codec's refusal on the *next* message, which it then loses too.
    if let Some(len) = drover_protocol::codec::oversized(&msg) {
        tracing::error!(
            "not sent to the manager: a message of {len} bytes exceeds the maximum of {} bytes",
            drover_protocol::MAX_FRAME_LEN
        );
        return Ok(());
    }
    sink.feed(msg).await
}
