//! One connected agent: request correlation, liveness, and the socket tasks.
//!
//! A [`Session`] is created when the manager accepts an agent's hello and
//! lives until the connection ends. Invariants:
//!
//! * Every request gets exactly one outcome: the agent's reply, a timeout, or
//!   `org.eclipse.bluechi.Offline` when the session ends first. Ending a
//!   session drains the pending table, so no caller waits forever.
//! * The outgoing queue is bounded. Heartbeats are only queued when there is
//!   room, and only when nothing else was written to the agent within half
//!   the heartbeat interval (`drover_protocol::liveness`); a request waits
//!   for room at most its own timeout. A peer that stops
//!   reading blocks the writer, whose every write has a deadline: the session
//!   is dropped, never buffered forever.
//! * No message fails the session for its size: a request or notice over
//!   the frame cap is refused to its caller (`LimitsExceeded`, with the
//!   sizes) before it is queued, and the writer drops (and fails) anything
//!   that still does not fit instead of ending the session (issue 14.2).
//! * A list reply too large for one frame arrives as `ReplyPart`s and a
//!   final `Reply`; the rows are joined (at most [`MAX_LIST_ROWS`]) and the
//!   caller sees one reply. Parts die with their request (timeout, end).
//! * Any frame from the agent counts as a sign of life (`last seen`); a frame
//!   that does not decode ends the session (the stream is out of sync).
//! * [`Session::mark_ended`] is idempotent: the first caller does the
//!   teardown, later ones do nothing, whichever of the reader, the writer, the
//!   heartbeat checker or a replacing registration noticed the end first.
//! * A session reports to its owner (the core) only through [`SessionOwner`]:
//!   every event in the order it arrived, then its end, once.
//! * An idle session is small: it holds no read or write buffer while it
//!   waits (the reader takes [`SESSION_BUFFER`] bytes for a read and more
//!   only for a frame that needs more, the writer what its frames need; each
//!   gives its buffer back once it is empty; `drover-bench fleet` measures
//!   the memory per node), and its outgoing
//!   queue holds one pointer a slot (`Outgoing`): tokio's bounded channel
//!   allocates its slots 32 at a time, so a queue of whole [`ToAgent`]s
//!   cost every session 32 of them at once.
//! * An idle session is cheap: on a plaintext link and on a TLS 1.3 link
//!   the reader is woken for a batch of heartbeats at a time
//!   ([`crate::nodes::frames`]), and the reader and the writer wait for the
//!   end on an `EndSignal` (a flag and a waker slot each; a
//!   `CancellationToken` locks a mutex on every poll, which the reader did
//!   once per wake-up).
//! * A session that ends in order (the manager stops, a reload drops it, a
//!   new connection replaces it) closes its stream: on TLS the agent gets a
//!   `close_notify` and sees a clean end, not a truncated stream. A writer
//!   that failed or was blocked does not wait for that, and closing has a
//!   deadline ([`CLOSE_DEADLINE`]); [`Session::closed`] resolves once the
//!   writer is done, which is what a stopping manager waits for.

use crate::error::ApiError;
use crate::nodes::arrival::Arrivals;
use crate::nodes::frames::{Frames, MarkSocket};
use crate::nodes::link_stats::{Disconnect, HeartbeatGaps};
use bytes::BytesMut;
use drover_bus::timestamp;
use drover_protocol::FrameCodec;
use drover_protocol::codec::oversized;
use drover_protocol::error_names::{LIMITS_EXCEEDED, NO_REPLY};
use drover_protocol::link::ManagerFramed;
use drover_protocol::{
    Event, MAX_FRAME_LEN, NodeName, Notice, RemoteError, Request, Response, ToAgent, ToManager,
};
use drover_tls::NodeIdentity;
use futures::future::BoxFuture;
use futures::task::AtomicWaker;
use futures::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedWrite;

/// Room for this many queued messages per session.
pub const OUTGOING_QUEUE: usize = 256;

/// Most rows one list reply may carry in parts (a node with 20,000 units
/// needs 20,000; a row is about 0.5 KiB, so this bounds a reply near 100 MiB).
pub const MAX_LIST_ROWS: usize = 200_000;

type Reply = Result<Response, RemoteError>;

/// Who a session reports to. The core implements it; a session knows
/// nothing else of its owner.
pub trait SessionOwner: Send + Sync + 'static {
    /// An event from the agent. The reader waits for it before reading on,
    /// so events are handled one at a time, in the order they arrived.
    fn on_event<'a>(&'a self, session: &'a Session, event: Event) -> BoxFuture<'a, ()>;

    /// The session ended (`why`; its cause recorded on the session,
    /// [`Session::end_cause`]): run the disconnect rules. Called once per
    /// reader, after its last event.
    fn on_end<'a>(&'a self, session: &'a Arc<Session>, why: &'a str) -> BoxFuture<'a, ()>;

    /// A list reply of at least [`BULK_ROWS`] rows came (and is freed once
    /// its caller is done): heap churn, like a connection (`crate::heap`).
    fn on_bulk(&self);

    /// A heartbeat was read, `gap_us` after the one before it as far as the
    /// reader can tell ([`HeartbeatGaps`]; for the metrics, nothing by
    /// default).
    fn on_heartbeat(&self, gap_us: u64) {
        let _ = gap_us;
    }
}

/// Rows from which a list reply counts as heap churn: the orphan-dep sweep
/// lists every node's units one grace period after the node registered, so
/// after a fleet's start, tens of MiB of rows are allocated and freed.
pub const BULK_ROWS: usize = 64;

pub struct Session {
    id: u64,
    node: NodeName,
    peer_ip: String,
    /// The agent's `AdvertiseAddress=` from its hello, set once before the
    /// session is attached ([`Session::set_advertise_address`]).
    advertise_address: std::sync::OnceLock<std::net::IpAddr>,
    /// What the TLS client certificate proved (`None` on plaintext): a
    /// reload drops the session when its serial is revoked.
    identity: Option<NodeIdentity>,
    outgoing: mpsc::Sender<Outgoing>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    /// Rows of list replies that came in parts, per request id, until the
    /// final `Reply` (bounded by [`MAX_LIST_ROWS`]; gone with the request).
    parts: Mutex<HashMap<u64, Response>>,
    next_request: AtomicU64,
    last_seen_mono_us: AtomicU64,
    last_seen_real_us: AtomicU64,
    /// The kernel's word on when data last came in, for the silence check.
    arrivals: Arrivals,
    /// When the writer last put a frame on the wire (monotonic µs).
    last_written_mono_us: AtomicU64,
    ended: AtomicBool,
    /// Why it ended: a [`Disconnect`] as `u8`, 0 until the first cause is
    /// recorded ([`Session::set_end_cause`]).
    end_cause: AtomicU8,
    /// systemd's `SystemState` as the agent last said it: an index in
    /// [`crate::nodes::system_state::SYSTEM_STATES`] plus 1; 0 until said.
    system_state: AtomicU8,
    /// The resync interval this session's agent was told (ms; 0 = none):
    /// `drover_protocol::resync`. Set once, before the session is announced.
    resync_interval_ms: AtomicU64,
    /// Stops the reader and the writer (set at the end, or by the writer).
    stop: EndSignal,
}

/// How the socket tasks learn that their session is over: a flag, and one
/// waker slot for the reader and one for the writer. Polling it is two atomic
/// operations; no lock, no allocation.
#[derive(Default)]
struct EndSignal {
    set: AtomicBool,
    reader: AtomicWaker,
    writer: AtomicWaker,
    /// The writer is done (its stream closed, or given up on).
    closed: AtomicBool,
    /// One task waiting for `closed` ([`Session::closed`]).
    closer: AtomicWaker,
}

impl EndSignal {
    /// Sets the flag and wakes both tasks; idempotent.
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.reader.wake();
        self.writer.wake();
    }

    /// Resolves once [`EndSignal::set`] was called; `slot` is the waiting
    /// task's own ([`EndSignal::reader`] or [`EndSignal::writer`]).
    async fn wait(&self, slot: &AtomicWaker) {
        Self::wait_for(&self.set, slot).await
    }

    /// Resolves once `flag` is set; `slot` is the waiting task's own.
    async fn wait_for(flag: &AtomicBool, slot: &AtomicWaker) {
        std::future::poll_fn(|cx| {
            if flag.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            slot.register(cx.waker());
            // A `set` between the load and the registration woke nobody.
            if flag.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// The writer is done.
    fn set_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closer.wake();
    }
}

impl Session {
    /// A session and the receiving end of its outgoing queue (for the writer).
    pub fn new(id: u64, node: NodeName, peer_ip: String) -> (Arc<Self>, Outbox) {
        Self::authenticated(id, node, peer_ip, None)
    }

    /// [`Session::new`] for a connection whose certificate proved `identity`.
    pub fn authenticated(
        id: u64,
        node: NodeName,
        peer_ip: String,
        identity: Option<NodeIdentity>,
    ) -> (Arc<Self>, Outbox) {
        let (outgoing, rx) = mpsc::channel(OUTGOING_QUEUE);
        let session = Arc::new(Self {
            id,
            node,
            peer_ip,
            advertise_address: std::sync::OnceLock::new(),
            identity,
            outgoing,
            pending: Mutex::new(HashMap::new()),
            parts: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            last_seen_mono_us: AtomicU64::new(timestamp::monotonic_us()),
            last_seen_real_us: AtomicU64::new(timestamp::realtime_us()),
            arrivals: Arrivals::default(),
            last_written_mono_us: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            end_cause: AtomicU8::new(0),
            system_state: AtomicU8::new(0),
            resync_interval_ms: AtomicU64::new(0),
            stop: EndSignal::default(),
        });
        (session, Outbox(rx))
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Resolves once the writer is done with the stream: closed after an
    /// orderly end (on TLS, `close_notify` sent), or given up after a
    /// failed or blocked write. One task may wait at a time. A session
    /// whose writer never ran (tests) never resolves: bound the wait.
    pub async fn closed(&self) {
        EndSignal::wait_for(&self.stop.closed, &self.stop.closer).await
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn peer_ip(&self) -> &str {
        &self.peer_ip
    }

    /// Records the agent's `AdvertiseAddress=` (only the first call counts).
    pub fn set_advertise_address(&self, address: std::net::IpAddr) {
        let _ = self.advertise_address.set(address);
    }

    /// The agent's `AdvertiseAddress=`, if it sent one.
    pub fn advertise_address(&self) -> Option<std::net::IpAddr> {
        self.advertise_address.get().copied()
    }

    /// Where other programs reach this node's services: its
    /// `AdvertiseAddress=`, else the address its connection came from.
    pub fn address(&self) -> String {
        match self.advertise_address() {
            Some(ip) => ip.to_string(),
            None => self.peer_ip.clone(),
        }
    }

    /// The certificate identity of a TLS session.
    pub fn identity(&self) -> Option<&NodeIdentity> {
        self.identity.as_ref()
    }

    pub fn last_seen_real_us(&self) -> u64 {
        self.last_seen_real_us.load(Ordering::Relaxed)
    }

    pub fn last_seen_mono_us(&self) -> u64 {
        self.last_seen_mono_us.load(Ordering::Relaxed)
    }

    /// A frame arrived.
    pub fn touch(&self) {
        self.last_seen_mono_us
            .store(timestamp::monotonic_us(), Ordering::Relaxed);
        self.last_seen_real_us
            .store(timestamp::realtime_us(), Ordering::Relaxed);
    }

    /// True when nothing arrived for longer than `threshold_ms` (0 = never):
    /// no frame read, and no data waiting unread in the socket newer than
    /// that ([`crate::nodes::arrival`]: the reader lets lone heartbeats wait,
    /// and may be behind). Unread data counts as a frame read when it
    /// arrived.
    pub fn is_silent(&self, now_mono_us: u64, threshold_ms: u64) -> bool {
        let limit_us = threshold_ms.saturating_mul(1000);
        if threshold_ms == 0 || now_mono_us.saturating_sub(self.last_seen_mono_us()) <= limit_us {
            return false;
        }
        match self.arrivals.unread_since_ms() {
            Some(age_ms) if u64::from(age_ms).saturating_mul(1000) <= limit_us => {
                self.seen_ago(age_ms);
                false
            }
            _ => true,
        }
    }

    /// Counts data waiting unread in the socket as seen when it arrived, so
    /// that `LastSeenTimestamp` is as fresh as the agent's last send, not
    /// the reader's last read (one `ioctl` and one `getsockopt`).
    pub fn refresh_seen(&self) {
        if let Some(age_ms) = self.arrivals.unread_since_ms() {
            self.seen_ago(age_ms);
        }
    }

    /// Seen `age_ms` ago (never moves last seen back).
    fn seen_ago(&self, age_ms: u32) {
        let age_us = u64::from(age_ms).saturating_mul(1000);
        self.last_seen_mono_us.fetch_max(
            timestamp::monotonic_us().saturating_sub(age_us),
            Ordering::Relaxed,
        );
        self.last_seen_real_us.fetch_max(
            timestamp::realtime_us().saturating_sub(age_us),
            Ordering::Relaxed,
        );
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// A frame was written to the agent.
    fn wrote(&self) {
        self.last_written_mono_us
            .store(timestamp::monotonic_us(), Ordering::Relaxed);
    }

    /// Queues a heartbeat when one is due at `now_mono_us` for a manager
    /// sending every `interval` (nothing else was written within half of
    /// it: `drover_protocol::liveness::manager_heartbeat_due`). Returns
    /// whether one was queued.
    pub fn heartbeat_if_due(&self, now_mono_us: u64, interval: Duration) -> bool {
        let since = now_mono_us.saturating_sub(self.last_written_mono_us.load(Ordering::Relaxed));
        drover_protocol::liveness::manager_heartbeat_due(Duration::from_micros(since), interval)
            && self.try_heartbeat()
    }

    /// Queues a heartbeat if there is room. A full queue means the writer is
    /// already busy (or stuck, which its write deadline catches), so skipping
    /// a heartbeat loses nothing.
    fn try_heartbeat(&self) -> bool {
        self.outgoing.try_send(Outgoing::Heartbeat).is_ok()
    }

    /// Records the resync interval the agent is told at its registration.
    pub fn set_resync_interval(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.resync_interval_ms.store(ms, Ordering::Relaxed);
    }

    /// The resync interval the agent was told (zero: it sends no digests).
    pub fn resync_interval(&self) -> Duration {
        Duration::from_millis(self.resync_interval_ms.load(Ordering::Relaxed))
    }

    /// Sends `body` and waits for the reply, at most `timeout` in all.
    pub async fn request(&self, body: Request, timeout: Duration) -> Result<Response, ApiError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let msg = ToAgent::Request { id, body };
        if let Some(len) = oversized(&msg) {
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!(
                    "the request to node '{}' is {len} bytes encoded, more than the \
                     {MAX_FRAME_LEN} bytes one frame to an agent may carry; nothing was sent",
                    self.node
                ),
            ));
        }
        let (tx, rx) = oneshot::channel();
        self.lock_pending().insert(id, tx);
        // However this call ends — a reply, a timeout, or its caller dropping
        // it (a fleet-wide list that stops early) — its entry and any parts
        // that came for it go.
        let _forget = Forget { session: self, id };
        // Checked after inserting: `mark_ended` sets the flag before draining,
        // so either it drains our entry or we see the flag here.
        if self.is_ended() {
            return Err(ApiError::offline());
        }
        let msg = Outgoing::Message(Box::new(msg));
        let sent = tokio::time::timeout_at(deadline, self.outgoing.send(msg)).await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ApiError::offline()),
            Err(_) => return Err(self.no_reply(timeout)),
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => reply.map_err(ApiError::from),
            Ok(Err(_)) => Err(ApiError::offline()),
            Err(_) => Err(self.no_reply(timeout)),
        }
    }

    /// Queues a one-way notice (proxies), waiting at most `timeout` for room
    /// in the outgoing queue.
    pub async fn notify(&self, notice: Notice, timeout: Duration) -> Result<(), ApiError> {
        if self.is_ended() {
            return Err(ApiError::offline());
        }
        let msg = ToAgent::Notice(notice);
        if let Some(len) = oversized(&msg) {
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!("a notice of {len} bytes does not fit one frame ({MAX_FRAME_LEN} bytes)"),
            ));
        }
        let msg = Outgoing::Message(Box::new(msg));
        match tokio::time::timeout(timeout, self.outgoing.send(msg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(ApiError::offline()),
            Err(_) => Err(self.no_reply(timeout)),
        }
    }

    fn no_reply(&self, timeout: Duration) -> ApiError {
        ApiError::new(
            NO_REPLY,
            format!(
                "node '{}' did not answer within {} ms",
                self.node,
                timeout.as_millis()
            ),
        )
    }

    /// Hands a reply to the waiting request. Replies to unknown ids (the
    /// request timed out, or the agent is confused) are dropped.
    pub fn complete(&self, id: u64, reply: Reply) -> bool {
        let earlier = self.lock_parts().remove(&id);
        let reply = match (earlier, reply) {
            (Some(first), Ok(last)) => join_parts(first, last),
            (_, reply) => reply,
        };
        let waiter = self.lock_pending().remove(&id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(reply);
                true
            }
            None => false,
        }
    }

    /// Rows of list reply `id` that came ahead of its final `Reply`. Parts
    /// of unknown ids (timed out) are dropped; a reply growing past
    /// [`MAX_LIST_ROWS`] fails its request with `LimitsExceeded`.
    pub fn add_part(&self, id: u64, part: Response) {
        if !self.lock_pending().contains_key(&id) {
            return;
        }
        let mut parts = self.lock_parts();
        let merged = match parts.remove(&id) {
            None => Ok(part),
            Some(first) => join_parts(first, part),
        };
        match merged {
            Ok(rows) if list_rows(&rows) <= MAX_LIST_ROWS => {
                parts.insert(id, rows);
            }
            Ok(_) => {
                drop(parts);
                self.complete(
                    id,
                    Err(RemoteError::new(
                        LIMITS_EXCEEDED,
                        format!(
                            "node '{}' sent a list of more than {MAX_LIST_ROWS} rows",
                            self.node
                        ),
                    )),
                );
                // Later parts find no request and are dropped.
            }
            Err(e) => {
                drop(parts);
                self.complete(id, Err(e));
            }
        }
    }

    fn lock_parts(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Response>> {
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records why the session ends, unless a cause was recorded before: the
    /// first one is the cause (a heartbeat timeout ends the reader too, which
    /// must not count it again as a lost connection). Whoever ends a session
    /// records its cause before it stops the socket tasks.
    pub fn set_end_cause(&self, cause: Disconnect) {
        let _ = self
            .end_cause
            .compare_exchange(0, cause as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Why the session ended (`None`: it has not, or no cause was recorded).
    pub fn end_cause(&self) -> Option<Disconnect> {
        Disconnect::from_u8(self.end_cause.load(Ordering::SeqCst))
    }

    /// Records systemd's `SystemState` the agent said (empty: not known).
    pub fn set_system_state(&self, state: &str) {
        let code = crate::nodes::system_state::system_state_index(state)
            .and_then(|i| u8::try_from(i + 1).ok())
            .unwrap_or(0);
        self.system_state.store(code, Ordering::Relaxed);
    }

    /// The index in [`crate::nodes::system_state::SYSTEM_STATES`] of the node's
    /// `SystemState`, once its agent said it.
    pub fn system_state(&self) -> Option<usize> {
        usize::from(self.system_state.load(Ordering::Relaxed)).checked_sub(1)
    }

    /// Marks the session ended: stops its socket tasks and fails every pending
    /// request (their senders are dropped → `Offline`). Returns true for the
    /// first caller only.
    pub fn mark_ended(&self) -> bool {
        if self.ended.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.stop.set();
        let drained: Vec<_> = self.lock_pending().drain().collect();
        drop(drained);
        self.lock_parts().clear();
        true
    }

    pub fn pending_requests(&self) -> usize {
        self.lock_pending().len()
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Reply>>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (single inserts/removes), so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One slot of a session's outgoing queue: a heartbeat without an
/// allocation, anything else boxed, so that a slot is one pointer.
enum Outgoing {
    Heartbeat,
    Message(Box<ToAgent>),
}

/// The receiving end of a session's outgoing queue: the writer's, or a
/// test's standing in for the agent.
pub struct Outbox(mpsc::Receiver<Outgoing>);

impl Outbox {
    /// The next message to the agent; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<ToAgent> {
        self.0.recv().await.map(|slot| match slot {
            Outgoing::Heartbeat => ToAgent::Heartbeat,
            Outgoing::Message(msg) => *msg,
        })
    }
}

/// Rows of a list response (0 for anything else).
fn list_rows(r: &Response) -> usize {
    match r {
        Response::Units(rows) => rows.len(),
        Response::UnitFiles(rows) => rows.len(),
        _ => 0,
    }
}

/// Removes request `id`'s pending entry and parts when the request ends,
/// also when its future is dropped before the reply.
struct Forget<'a> {
    session: &'a Session,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.session.lock_pending().remove(&self.id);
        self.session.lock_parts().remove(&self.id);
    }
}

/// `first`'s rows followed by `last`'s; parts of different kinds are a
/// broken agent, told as such.
fn join_parts(first: Response, last: Response) -> Reply {
    match (first, last) {
        (Response::Units(mut a), Response::Units(b)) => {
            a.extend(b);
            Ok(Response::Units(a))
        }
        (Response::UnitFiles(mut a), Response::UnitFiles(b)) => {
            a.extend(b);
            Ok(Response::UnitFiles(a))
        }
        _ => Err(RemoteError::failed(
            "the agent sent parts of a list reply that do not fit together",
        )),
    }
}

/// Bytes a session's reader takes for a read when it holds no buffer. Most
/// frames are heartbeats and small events; the buffer grows for a larger
/// frame when one comes, and is given back once empty (so 10,000 idle
/// sessions hold none; tokio-util's default of 8 KiB kept for each was two
/// thirds of a session's memory at fleet size).
pub const SESSION_BUFFER: usize = 512;

/// How long an orderly end may take to close the stream (flush what is
/// queued, `close_notify`, FIN) before the writer gives up on it.
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(1);

/// Starts the reader and writer tasks of an accepted session. When either
/// ends (EOF, error, undecodable frame, a write blocked past
/// `write_deadline`), the session ends and `owner` runs the disconnect rules.
/// `socket` is the TCP socket under `framed` (`None` for other streams, in
/// tests): the reader may mark it and then reads heartbeats in batches
/// ([`crate::nodes::frames`]), and the silence check asks the kernel about
/// it ([`crate::nodes::arrival`]).
pub fn spawn_io<IO>(
    owner: Arc<dyn SessionOwner>,
    session: Arc<Session>,
    framed: ManagerFramed<IO>,
    socket: Option<MarkSocket>,
    rx: Outbox,
    write_deadline: Duration,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let parts = framed.into_parts();
    let (read, write) = tokio::io::split(parts.io);
    // Whatever was read past the handshake belongs to the session. The
    // reader's half keeps the socket open as long as the reader lives.
    if let Some(socket) = &socket {
        session.arrivals.watch(socket.fd());
    }
    let stream = Frames::new(read, &parts.read_buf, SESSION_BUFFER, socket);
    let mut sink = Writer(FramedWrite::with_capacity(
        write,
        FrameCodec::<ToManager, ToAgent>::default(),
        0,
    ));
    sink.0
        .write_buffer_mut()
        .extend_from_slice(&parts.write_buf);
    tokio::spawn(write_loop(session.clone(), sink, rx, write_deadline));
    tokio::spawn(read_loop(owner, session, stream));
}

/// A session's frame writer: it gives its buffer back after every flush, so
/// an idle session holds none (a write takes what its frames need; the
/// manager writes to an idle agent rarely).
struct Writer<W>(FramedWrite<W, FrameCodec<ToManager, ToAgent>>);

impl<W: AsyncWrite + Unpin> futures::Sink<ToAgent> for Writer<W> {
    type Error = drover_protocol::FrameError;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.0).poll_ready(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, item: ToAgent) -> Result<(), Self::Error> {
        Pin::new(&mut self.0).start_send(item)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let flushed = Pin::new(&mut self.0).poll_flush(cx);
        let buf = self.0.write_buffer_mut();
        if matches!(flushed, Poll::Ready(Ok(()))) && buf.is_empty() && buf.capacity() > 0 {
            *buf = BytesMut::new();
        }
        flushed
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

async fn write_loop<S>(session: Arc<Session>, mut sink: S, mut rx: Outbox, deadline: Duration)
where
    S: futures::Sink<ToAgent, Error = drover_protocol::FrameError> + Unpin,
{
    let cancelled = session.stop.wait(&session.stop.writer);
    tokio::pin!(cancelled);
    // Whether the stream is still fit to be closed in order.
    let mut orderly = true;
    loop {
        // The message and its send (the timer with it) live in a box for
        // the send's time: a waiting writer, one per node, keeps no room
        // for them (`an_idle_sessions_tasks_keep_no_room_for_a_message`).
        let (request_id, send) = {
            let msg = tokio::select! {
                biased;
                _ = &mut cancelled => break,
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => break,
                },
            };
            let request_id = match &msg {
                ToAgent::Request { id, .. } => Some(*id),
                _ => None,
            };
            (
                request_id,
                Box::pin(tokio::time::timeout(deadline, sink.send(msg))),
            )
        };
        match send.await {
            Ok(Ok(())) => session.wrote(),
            Ok(Err(e @ drover_protocol::FrameError::TooLarge { .. })) => {
                // Refused by the codec before a byte was written: the stream
                // is intact, so only this message fails, never the session.
                tracing::error!(
                    node = %session.node,
                    session = session.id,
                    "not sent to the agent of node {}: {e}",
                    session.node
                );
                if let Some(id) = request_id {
                    session.complete(
                        id,
                        Err(RemoteError::new(LIMITS_EXCEEDED, format!("not sent: {e}"))),
                    );
                }
            }
            Ok(Err(e)) => {
                session.set_end_cause(Disconnect::ConnectionLost);
                tracing::info!(
                    node = %session.node,
                    session = session.id,
                    "cannot write to the agent of node {}: {e}",
                    session.node
                );
                orderly = false;
                break;
            }
            Err(_) => {
                session.set_end_cause(Disconnect::WriteBlocked);
                tracing::warn!(
                    node = %session.node,
                    session = session.id,
                    "the agent of node {} does not read (write blocked for {} ms); dropping the session",
                    session.node,
                    deadline.as_millis()
                );
                orderly = false;
                break;
            }
        }
    }
    // Wake the reader so the owner runs the disconnect rules once.
    session.stop.set();
    if orderly {
        // Flushes what is queued, then shuts the stream down: on TLS a
        // `close_notify` first, so the agent sees a clean end.
        let _ = Box::pin(tokio::time::timeout(
            deadline.min(CLOSE_DEADLINE),
            sink.close(),
        ))
        .await;
    }
    session.stop.set_closed();
}

async fn read_loop<S>(owner: Arc<dyn SessionOwner>, session: Arc<Session>, mut stream: S)
where
    S: futures::Stream<Item = Result<ToManager, drover_protocol::FrameError>> + Unpin,
{
    let cancelled = session.stop.wait(&session.stop.reader);
    tokio::pin!(cancelled);
    let mut gaps = HeartbeatGaps::new(session.last_seen_mono_us());
    let (cause, why) = loop {
        // Only an event's handling is awaited, and the frame is gone by
        // then (its scope ends with the block): a waiting reader, one per
        // node, keeps no room for a frame or a message.
        let handling = {
            let frame = tokio::select! {
                biased;
                // Whoever ended it recorded why; this is the fallback.
                _ = &mut cancelled => break (Disconnect::ConnectionLost, "session ended".to_owned()),
                frame = stream.next() => frame,
            };
            match frame {
                None => {
                    break (
                        Disconnect::AgentClosed,
                        "the agent closed the connection".to_owned(),
                    );
                }
                Some(Err(e)) => break (cause_of(&e), format!("bad input from the agent: {e}")),
                Some(Ok(msg)) => take(&*owner, &session, &mut gaps, msg),
            }
        };
        if let Some(handling) = handling {
            handling.await;
        }
    };
    // The socket may close once the reader lets go of it.
    session.arrivals.forget();
    drop(stream);
    session.set_end_cause(cause);
    owner.on_end(&session, &why).await;
}

/// Why a session ends on a frame that could not be read.
fn cause_of(e: &drover_protocol::FrameError) -> Disconnect {
    match e {
        drover_protocol::FrameError::Io(_) | drover_protocol::FrameError::Truncated => {
            Disconnect::ConnectionLost
        }
        drover_protocol::FrameError::Malformed(_)
        | drover_protocol::FrameError::TooLarge { .. } => Disconnect::ProtocolError,
    }
}

/// Takes one message from the agent: everything but an event is handled
/// here and now; an event's handling is returned, for the reader to await.
fn take<'a>(
    owner: &'a dyn SessionOwner,
    session: &'a Session,
    gaps: &mut HeartbeatGaps,
    msg: ToManager,
) -> Option<BoxFuture<'a, ()>> {
    session.touch();
    let heartbeat = matches!(msg, ToManager::Heartbeat);
    gaps.read(session.last_seen_mono_us(), heartbeat, |gap_us| {
        owner.on_heartbeat(gap_us)
    });
    match msg {
        ToManager::Heartbeat => None,
        ToManager::Reply { id, result } => {
            if result.as_ref().is_ok_and(|r| list_rows(r) >= BULK_ROWS) {
                owner.on_bulk();
            }
            if !session.complete(id, result) {
                tracing::debug!(
                    node = %session.node,
                    "reply from node {} to unknown or expired request {id}",
                    session.node
                );
            }
            None
        }
        ToManager::Event(event) => Some(owner.on_event(session, event)),
        ToManager::ReplyPart { id, part } => {
            session.add_part(id, part);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> (Arc<Session>, Outbox) {
        Session::new(1, NodeName::new("n1").unwrap(), "127.0.0.1".into())
    }

    #[tokio::test]
    async fn reply_reaches_the_request() {
        let (s, mut rx) = session();
        let s2 = s.clone();
        let call =
            tokio::spawn(async move { s2.request(Request::Reload, Duration::from_secs(5)).await });
        let Some(ToAgent::Request { id, body }) = rx.recv().await else {
            panic!("no request queued")
        };
        assert_eq!(body, Request::Reload);
        assert!(s.complete(id, Ok(Response::Empty)));
        assert_eq!(call.await.unwrap(), Ok(Response::Empty));
        assert_eq!(s.pending_requests(), 0);
    }

    #[tokio::test]
    async fn end_fails_pending_requests_with_offline() {
        let (s, _rx) = session();
        let s2 = s.clone();
        let call =
            tokio::spawn(async move { s2.request(Request::Reload, Duration::from_secs(5)).await });
        while s.pending_requests() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(s.mark_ended());
        assert!(!s.mark_ended(), "only the first caller tears down");
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.name(), drover_protocol::error_names::OFFLINE);
        // And after the end, nothing is even queued.
        let err = s
            .request(Request::Reload, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.name(), drover_protocol::error_names::OFFLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_request_times_out_and_is_forgotten() {
        let (s, _rx) = session();
        let err = s
            .request(Request::Reload, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(err.name(), NO_REPLY);
        assert_eq!(s.pending_requests(), 0);
        assert!(
            !s.complete(1, Ok(Response::Empty)),
            "a late reply finds nobody"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_times_out_instead_of_growing() {
        let (s, _rx) = session();
        for _ in 0..OUTGOING_QUEUE {
            assert!(s.try_heartbeat());
        }
        assert!(!s.try_heartbeat(), "a full queue takes no heartbeat");
        let err = s
            .request(Request::Reload, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.name(), NO_REPLY);
    }

    /// A heartbeat goes only to an agent nothing else was written to within
    /// half the interval.
    #[tokio::test]
    async fn recent_traffic_replaces_the_heartbeat() {
        let (s, mut rx) = session();
        let interval = Duration::from_millis(2000);
        let now = timestamp::monotonic_us();
        assert!(s.heartbeat_if_due(now, interval), "nothing written yet");
        assert_eq!(rx.recv().await, Some(ToAgent::Heartbeat));
        s.wrote();
        let written = s.last_written_mono_us.load(Ordering::Relaxed);
        assert!(!s.heartbeat_if_due(written + 999_999, interval));
        assert!(rx.0.try_recv().is_err(), "nothing queued");
        assert!(s.heartbeat_if_due(written + 1_000_000, interval));
        assert_eq!(rx.recv().await, Some(ToAgent::Heartbeat));
    }

    /// The session's writer gives its buffer back after every flush, and
    /// what it wrote is the frame.
    #[tokio::test]
    async fn the_writer_holds_no_buffer_between_writes() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(4096);
        let mut w = Writer(FramedWrite::with_capacity(
            near,
            FrameCodec::<ToManager, ToAgent>::default(),
            0,
        ));
        let msg = ToAgent::Notice(Notice::TargetNodeOnline { proxy_id: 9 });
        w.send(msg.clone()).await.unwrap();
        assert_eq!(w.0.write_buffer().capacity(), 0);
        let body = drover_protocol::codec::encode_body(&msg).unwrap();
        let mut want = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        want.extend_from_slice(&body);
        let mut got = vec![0; want.len()];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, want);
    }

    /// The writer records what it wrote, so the heartbeat timer sees it.
    #[tokio::test]
    async fn the_writer_records_each_write() {
        let (s, rx) = session();
        let (sink, _keep) = futures::channel::mpsc::unbounded::<ToAgent>();
        let sink = sink.sink_map_err(|_| drover_protocol::FrameError::Truncated);
        let writer = tokio::spawn(write_loop(s.clone(), sink, rx, Duration::from_secs(5)));
        assert_eq!(s.last_written_mono_us.load(Ordering::Relaxed), 0);
        s.notify(
            Notice::TargetNodeOnline { proxy_id: 1 },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        while s.last_written_mono_us.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!s.heartbeat_if_due(timestamp::monotonic_us(), Duration::from_secs(2)));
        s.mark_ended();
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_queue_slot_is_one_pointer_and_order_is_kept() {
        // tokio allocates 32 slots per block for every session: keep them small.
        assert_eq!(
            std::mem::size_of::<Outgoing>(),
            std::mem::size_of::<usize>()
        );
        let (s, mut rx) = session();
        assert!(s.try_heartbeat());
        s.notify(
            Notice::ProxyError {
                proxy_id: 7,
                message: "m".into(),
            },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert!(s.try_heartbeat());
        assert_eq!(rx.recv().await, Some(ToAgent::Heartbeat));
        assert!(matches!(
            rx.recv().await,
            Some(ToAgent::Notice(Notice::ProxyError { proxy_id: 7, .. }))
        ));
        assert_eq!(rx.recv().await, Some(ToAgent::Heartbeat));
    }

    /// Records how its sessions ended.
    #[derive(Default)]
    struct Ends(Mutex<Vec<String>>);

    impl SessionOwner for Ends {
        fn on_event<'a>(&'a self, _: &'a Session, _: Event) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn on_end<'a>(&'a self, _: &'a Arc<Session>, why: &'a str) -> BoxFuture<'a, ()> {
            self.0.lock().unwrap().push(why.to_owned());
            Box::pin(async {})
        }
        fn on_bulk(&self) {
            self.0.lock().unwrap().push("bulk".to_owned());
        }
    }

    /// A list reply of many rows counts as heap churn; a small one does not.
    #[tokio::test]
    async fn a_large_list_reply_is_reported_as_churn() {
        let (s, _rx) = session();
        let owner = Arc::new(Ends::default());
        let rows = |n: usize| {
            let row = drover_protocol::UnitInfo::loaded("a.service", "active", "running");
            Ok(ToManager::Reply {
                id: 99,
                result: Ok(Response::Units(vec![row; n])),
            })
        };
        let replies = futures::stream::iter([rows(BULK_ROWS - 1), rows(BULK_ROWS)]);
        read_loop(owner.clone(), s.clone(), replies).await;
        assert_eq!(
            *owner.0.lock().unwrap(),
            ["bulk", "the agent closed the connection"]
        );
        assert_eq!(s.end_cause(), Some(Disconnect::AgentClosed));
    }

    #[test]
    fn the_system_state_is_one_of_the_known_ones_or_none() {
        let (s, _rx) = session();
        assert_eq!(s.system_state(), None);
        s.set_system_state("degraded");
        assert_eq!(s.system_state(), Some(3));
        s.set_system_state("bogus");
        assert_eq!(s.system_state(), Some(8));
        s.set_system_state("");
        assert_eq!(s.system_state(), None);
    }

    /// Why a reader ended is the session's cause: garbage is a protocol
    /// error, a broken stream a lost connection; a cause recorded first
    /// (by whoever ended the session) stays.
    #[tokio::test]
    async fn the_reader_records_why_the_session_ended() {
        use drover_protocol::FrameError;
        for (error, want) in [
            (
                FrameError::Malformed("garbage".into()),
                Disconnect::ProtocolError,
            ),
            (
                FrameError::TooLarge {
                    len: 1 << 30,
                    max: 1 << 20,
                },
                Disconnect::ProtocolError,
            ),
            (FrameError::Truncated, Disconnect::ConnectionLost),
            (
                FrameError::Io(std::io::ErrorKind::ConnectionReset.into()),
                Disconnect::ConnectionLost,
            ),
        ] {
            let (s, _rx) = session();
            let owner = Arc::new(Ends::default());
            read_loop(owner, s.clone(), futures::stream::iter([Err(error)])).await;
            assert_eq!(s.end_cause(), Some(want));
        }
        let (s, _rx) = session();
        s.set_end_cause(Disconnect::HeartbeatTimeout);
        assert!(s.mark_ended());
        let owner = Arc::new(Ends::default());
        read_loop(owner, s.clone(), futures::stream::pending()).await;
        assert_eq!(s.end_cause(), Some(Disconnect::HeartbeatTimeout));
    }

    /// A session's socket tasks live as long as the session, one pair per
    /// node: each byte of their state is paid 10,000 times on a large
    /// fleet. While they wait they hold their own state alone, not a message
    /// and what sending or reading one takes (the writer's send is boxed for
    /// its time, the reader's frame is gone before an event's handling is
    /// awaited). With this test's stream and sink, 200 and 248 bytes in a
    /// debug build; 432 and 632 when they kept that room.
    #[test]
    fn an_idle_sessions_tasks_keep_no_room_for_a_message() {
        const READER: usize = 256;
        const WRITER: usize = 320;
        let (s, rx) = session();
        let owner: Arc<dyn SessionOwner> = Arc::new(Ends::default());
        let silent = futures::stream::pending::<Result<ToManager, drover_protocol::FrameError>>();
        let reader = read_loop(owner, s.clone(), silent);
        let (sink, _keep) = futures::channel::mpsc::unbounded::<ToAgent>();
        let sink = sink.sink_map_err(|_| drover_protocol::FrameError::Truncated);
        let writer = write_loop(s, sink, rx, Duration::from_secs(5));
        let (reader, writer) = (
            std::mem::size_of_val(&reader),
            std::mem::size_of_val(&writer),
        );
        assert!(reader <= READER, "the reader's task is {reader} bytes");
        assert!(writer <= WRITER, "the writer's task is {writer} bytes");
    }

    /// The end of a session stops its writer and its reader, even one whose
    /// agent never sends, and the owner hears of it once.
    #[tokio::test]
    async fn the_end_stops_both_socket_tasks() {
        let (s, rx) = session();
        let owner = Arc::new(Ends::default());
        let (sink, _keep) = futures::channel::mpsc::unbounded::<ToAgent>();
        let sink = sink.sink_map_err(|_| drover_protocol::FrameError::Truncated);
        let writer = tokio::spawn(write_loop(s.clone(), sink, rx, Duration::from_secs(5)));
        let silent = futures::stream::pending::<Result<ToManager, drover_protocol::FrameError>>();
        let reader = tokio::spawn(read_loop(owner.clone(), s.clone(), silent));
        tokio::task::yield_now().await;
        assert!(s.mark_ended());
        writer.await.unwrap();
        reader.await.unwrap();
        assert_eq!(*owner.0.lock().unwrap(), ["session ended"]);
        assert_eq!(s.end_cause(), Some(Disconnect::ConnectionLost));
    }

    /// A writer that fails (here: its sink is gone) wakes the reader, which
    /// reports the end; an end signalled before a task waits still counts.
    #[tokio::test]
    async fn a_failed_writer_ends_the_reader_too() {
        let (s, rx) = session();
        let owner = Arc::new(Ends::default());
        let (sink, gone) = futures::channel::mpsc::unbounded::<ToAgent>();
        drop(gone);
        let sink = sink.sink_map_err(|_| drover_protocol::FrameError::Truncated);
        let silent = futures::stream::pending::<Result<ToManager, drover_protocol::FrameError>>();
        let reader = tokio::spawn(read_loop(owner.clone(), s.clone(), silent));
        s.notify(
            Notice::TargetNodeOnline { proxy_id: 1 },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        write_loop(s.clone(), sink, rx, Duration::from_secs(5)).await;
        reader.await.unwrap();
        assert_eq!(*owner.0.lock().unwrap(), ["session ended"]);
        assert_eq!(s.end_cause(), Some(Disconnect::ConnectionLost));
        // Already set: a new wait resolves at once.
        s.stop.wait(&s.stop.reader).await;
    }

    /// A reader that fell behind does not make its node silent: a heartbeat
    /// waiting unread in the socket counts, and dates the session.
    #[test]
    fn an_unread_heartbeat_keeps_the_session_alive() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (s, _rx) = session();
        let (manager, mut agent) = crate::nodes::arrival::tcp_pair();
        s.arrivals.watch(manager.as_raw_fd());
        let now = timestamp::monotonic_us();
        s.last_seen_mono_us
            .store(now - 10_000_000, Ordering::Relaxed);
        agent.write_all(&frame_of(&ToManager::Heartbeat)).unwrap();
        assert!(!s.is_silent(now, 6000), "the heartbeat waits in the socket");
        assert!(
            s.last_seen_mono_us() + 1_000_000 >= now,
            "dated by the kernel"
        );
        // Once the reader let go of the socket, only frames read count.
        s.arrivals.forget();
        s.last_seen_mono_us
            .store(now - 10_000_000, Ordering::Relaxed);
        assert!(s.is_silent(now, 6000));
    }

    /// Data older than the threshold does not keep a session alive: a frozen
    /// agent whose last bytes wait unread is silent once they are old.
    #[test]
    fn a_socket_quiet_past_the_threshold_is_silent() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (s, _rx) = session();
        let (manager, mut agent) = crate::nodes::arrival::tcp_pair();
        s.arrivals.watch(manager.as_raw_fd());
        agent.write_all(&frame_of(&ToManager::Heartbeat)).unwrap();
        // Let 300 ms pass with the heartbeat unread and nothing after it.
        std::thread::sleep(Duration::from_millis(300));
        let now = timestamp::monotonic_us();
        s.last_seen_mono_us
            .store(now - 10_000_000, Ordering::Relaxed);
        assert!(s.is_silent(now, 200));
        assert!(
            !s.is_silent(now, 6000),
            "within the threshold of the unread heartbeat"
        );
    }

    /// A peer that dribbles a frame a byte at a time, read as it comes,
    /// completes no frame and keeps nothing waiting: the kernel's arrival
    /// time does not keep it alive, so it is dropped as before.
    #[test]
    fn bytes_already_read_keep_no_session_alive() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let (s, _rx) = session();
        let (mut manager, mut agent) = crate::nodes::arrival::tcp_pair();
        s.arrivals.watch(manager.as_raw_fd());
        let now = timestamp::monotonic_us();
        s.last_seen_mono_us
            .store(now - 10_000_000, Ordering::Relaxed);
        agent.write_all(&[0]).unwrap();
        manager.read_exact(&mut [0]).unwrap();
        assert!(s.is_silent(now, 6000), "the byte was read: nothing waits");
    }

    /// The reader forgets its socket when it ends, before it closes it.
    #[tokio::test]
    async fn the_reader_forgets_its_socket_at_the_end() {
        use std::os::fd::AsRawFd;
        let (s, _rx) = session();
        let owner = Arc::new(Ends::default());
        let (manager, agent) = crate::nodes::arrival::tcp_pair();
        s.arrivals.watch(manager.as_raw_fd());
        assert!(s.arrivals.is_watching());
        manager.set_nonblocking(true).unwrap();
        let io = tokio::net::TcpStream::from_std(manager).unwrap();
        let frames = Frames::new(io, &[], 64, None);
        drop(agent);
        read_loop(owner.clone(), s.clone(), frames).await;
        assert_eq!(
            *owner.0.lock().unwrap(),
            ["the agent closed the connection"]
        );
        // Its descriptor is closed now and may be reused: never asked again.
        assert!(!s.arrivals.is_watching());
    }

    fn frame_of(msg: &ToManager) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        tokio_util::codec::Encoder::encode(
            &mut drover_protocol::FrameCodec::<ToAgent, ToManager>::default(),
            msg.clone(),
            &mut buf,
        )
        .unwrap();
        buf.to_vec()
    }

    #[test]
    fn silence_threshold() {
        let (s, _rx) = session();
        let seen = s.last_seen_mono_us();
        assert!(!s.is_silent(seen + 5_000_000, 6000));
        assert!(s.is_silent(seen + 6_000_001, 6000));
        assert!(!s.is_silent(seen + 600_000_000, 0), "0 disables the check");
    }
}
