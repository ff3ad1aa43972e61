//! What an unauthenticated connection may cost, who gives way when the
//! manager is full, and how loudly refusals are logged.
//!
//! Before a peer has proven anything (TLS handshake, then the hello), it holds
//! a [`Ticket`] from the [`Gate`]: at most [`Limits::handshakes`] connections
//! are in that state at once. The ticket is dropped when the connection is
//! admitted or refused, so a registered agent never counts against the cap.
//! Together with the handshake deadline (TLS + hello, `Timeouts::handshake`)
//! and the 512-byte hello cap this bounds pre-authentication memory at
//! roughly `handshakes` × (one TLS handshake message, under 64 KiB, plus the
//! socket buffers).
//!
//! **Who gives way.** A full gate is not a locked door. Each ticket knows how
//! long its connection has waited *on its peer* in all ([`PeerWait`], kept by
//! the [`Watched`] stream the handshake reads through): time blocked on a
//! read with nothing to read. A real agent waits on its peer about one round
//! trip (TLS 1.3 is one round trip, and its hello follows its Finished); a
//! connection that sent nothing, or half a ClientHello, or a byte now and
//! then, waits on its peer the whole time. When a new connection is waiting
//! to be let in and every place is taken, the accept loop evicts the
//! connection that is **ripe** — waited on its peer at least
//! [`Limits::ripe_after`] — from the address that holds the most places,
//! the longest waiter of that address first ([`Gate::evict_ripest`]). Only a
//! connection blocked on its peer at that moment may go: one with bytes
//! waiting unread in its socket, or one the manager is working on (its
//! hello may be judged that instant), waits on the manager, not on its peer,
//! and is never evicted (a busy manager does not evict the agents it is slow
//! to serve). Eviction shuts the socket down;
//! its handshake fails at once and its place frees. While nothing is ripe the
//! newcomer waits (in the listener's lobby, `crate::nodes::lobby`, beyond it
//! in the listen backlog) until a place frees or the first connection
//! ripens.
//!
//! What this buys, and its bounds:
//!
//! * Junk holds a place for about `ripe_after`, not for the handshake
//!   deadline, however many addresses it comes from: places turn over at
//!   about 256 / `ripe_after` a second (256 at 1 s). The lobby lets a
//!   newcomer in after one turn of each address with connections waiting,
//!   so with `A` flooding addresses it waits about `A × ripe_after / 256`
//!   (125 addresses: ~0.5 s), then its handshake runs uncontested.
//! * Why 1 s and not less: at a fleet's cold start or after a manager
//!   restart, thousands of real agents fill the places and the lobby, and
//!   an agent slow to answer (a loaded host) must not be evicted and sent
//!   to the back; 150 ms was measured fine under a flood but leaves no
//!   margin there.
//! * No address is refused for its address: agents behind one NAT, or on the
//!   host that floods, get in as any other.
//! * An agent whose round trip to the manager exceeds `ripe_after` can be
//!   evicted while the gate is full of junk (never otherwise); it retries
//!   with its backoff.
//! * A cold start of thousands of real agents evicts nobody: they wait on
//!   the manager, not on themselves, and they do not ripen.
//!
//! Refusals of peers are logged through a [`LogLimiter`]: a token bucket per
//! reason (a burst of [`LOG_BURST`], then [`LOG_PER_SEC`] a second), so a
//! flood of junk costs log lines at a fixed rate, and the number suppressed
//! is said in the next line that gets through.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Refusal log lines allowed in a burst, per reason.
pub const LOG_BURST: f64 = 10.0;
/// Refusal log lines allowed per second in the long run, per reason.
pub const LOG_PER_SEC: f64 = 1.0;

/// The pre-authentication caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in the TLS handshake or before their hello's verdict.
    pub handshakes: usize,
    /// How long a connection may wait on its peer before a newcomer may
    /// evict it from a full gate.
    pub ripe_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshakes: 256,
            ripe_after: Duration::from_secs(1),
        }
    }
}

/// Hands out [`Slot`]s within the total cap and [`Ticket`]s for them, and
/// evicts ripe connections (module docs).
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    total: Arc<Semaphore>,
    table: Arc<Mutex<Table>>,
    /// Connections evicted so far (for the metrics endpoint).
    evictions: AtomicU64,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    entries: HashMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    wait: Arc<PeerWait>,
    /// A second descriptor of the connection's socket, to look at its
    /// receive queue and shut it down; closed with the entry.
    socket: Option<OwnedFd>,
}

/// A place under the total cap, taken before the connection gets its ticket.
/// Freed on drop.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// One unauthenticated connection's place; freed on drop, which also ends
/// its [`PeerWait`] accounting.
#[derive(Debug)]
pub struct Ticket {
    _slot: Slot,
    id: u64,
    wait: Arc<PeerWait>,
    table: Arc<Mutex<Table>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.wait.done.store(true, Ordering::Release);
        let mut table = lock(&self.table);
        if let Some(entry) = table.entries.remove(&self.id)
            && let Some(n) = table.per_ip.get_mut(&entry.ip)
        {
            *n -= 1;
            if *n == 0 {
                table.per_ip.remove(&entry.ip);
            }
        }
    }
}

/// What [`Gate::evict_ripest`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// This connection was evicted: its address and how long it had waited on
    /// its peer.
    Evicted { ip: IpAddr, waited: Duration },
    /// An eviction is still under way (its place frees when its task ends).
    Pending,
    /// Nothing is ripe; the first could ripen in this long (`None`: no
    /// connection waits on its peer now).
    NotYet(Option<Duration>),
}

impl Gate {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            total: Arc::new(Semaphore::new(limits.handshakes.max(1))),
            table: Arc::default(),
            evictions: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A place under the total cap if one is free now.
    pub fn try_slot(&self) -> Option<Slot> {
        self.total
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|p| Slot { _permit: p })
    }

    /// Waits for a place under the total cap. `None` only if the gate's
    /// semaphore were closed, which nothing does.
    pub async fn slot(&self) -> Option<Slot> {
        self.total
            .clone()
            .acquire_owned()
            .await
            .ok()
            .map(|p| Slot { _permit: p })
    }

    /// Ties `slot` to a connection from `ip`; `socket` is its socket (a
    /// second descriptor is kept to look at it and to shut it down on
    /// eviction; without one, the connection is never evicted). Its stream
    /// must be read through [`Watched`] with the returned ticket's
    /// [`Ticket::peer_wait`].
    pub fn enter(&self, slot: Slot, ip: IpAddr, socket: Option<&impl AsFd>) -> Ticket {
        let ip = ip.to_canonical();
        let wait = Arc::new(PeerWait::default());
        let socket = socket.and_then(|s| s.as_fd().try_clone_to_owned().ok());
        let mut table = lock(&self.table);
        let id = table.next;
        table.next += 1;
        table.entries.insert(
            id,
            Entry {
                ip,
                wait: wait.clone(),
                socket,
            },
        );
        *table.per_ip.entry(ip).or_insert(0) += 1;
        drop(table);
        Ticket {
            _slot: slot,
            id,
            wait,
            table: self.table.clone(),
        }
    }

    /// Evicts the ripest connection if there is one (module docs); at most one
    /// eviction is under way at a time.
    pub fn evict_ripest(&self) -> Eviction {
        self.evict_ripest_with(Instant::now(), |fd| {
            crate::nodes::arrival::unread_bytes(fd.as_raw_fd()).unwrap_or(0) > 0
        })
    }

    fn evict_ripest_with(&self, now: Instant, has_unread: impl Fn(&OwnedFd) -> bool) -> Eviction {
        let ripe = self.limits.ripe_after;
        let table = lock(&self.table);
        if table.entries.values().any(|e| e.wait.evicted()) {
            return Eviction::Pending;
        }
        let mut best: Option<(usize, Duration, &Entry)> = None;
        let mut soonest: Option<Duration> = None;
        for entry in table.entries.values() {
            let Some(socket) = &entry.socket else {
                continue;
            };
            // Only a connection blocked on its peer right now: one the
            // manager is busy with (its hello may be judged this instant) is
            // never cut off.
            let Some((waited, true)) = entry.wait.waited(now) else {
                continue;
            };
            if waited < ripe {
                let left = ripe - waited;
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
                continue;
            }
            let places = table.per_ip.get(&entry.ip).copied().unwrap_or(0);
            let better = best.is_none_or(|(p, w, _)| (places, waited) > (p, w));
            if better && !has_unread(socket) {
                best = Some((places, waited, entry));
            }
        }
        let Some((_, waited, entry)) = best else {
            return Eviction::NotYet(soonest);
        };
        entry.wait.evict();
        if let Some(socket) = &entry.socket {
            // The handshake's pending read wakes up and fails (see `Watched`).
            let _ = socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Both);
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        Eviction::Evicted {
            ip: entry.ip,
            waited,
        }
    }

    /// Connections evicted since the gate was made.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Places taken now (tickets and slots not yet tied to a connection).
    pub fn in_flight(&self) -> usize {
        self.limits.handshakes.max(1) - self.total.available_permits()
    }
}

impl Ticket {
    /// The connection's wait on its peer, for its [`Watched`] stream.
    pub fn peer_wait(&self) -> Arc<PeerWait> {
        self.wait.clone()
    }
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // Every update leaves the table consistent; a panic cannot half-write it.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// Microseconds since the first use, the clock of [`PeerWait`]'s atomics.
fn clock_us(now: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(now.saturating_duration_since(base).as_micros()).unwrap_or(u64::MAX)
}

/// How long a connection has waited on its peer, all told (module docs).
#[derive(Debug, Default)]
pub struct PeerWait {
    /// Waits that ended, in µs.
    waited_us: AtomicU64,
    /// Start of the wait under way, [`clock_us`] + 1; 0 when not waiting.
    since: AtomicU64,
    /// The ticket is gone: nothing is accounted, nothing evicted any more.
    done: AtomicBool,
    evicted: AtomicBool,
}

impl PeerWait {
    fn waiting(&self, now: Instant) {
        if self.since.load(Ordering::Relaxed) == 0 {
            self.since.store(clock_us(now) + 1, Ordering::Relaxed);
        }
    }

    fn progressed(&self, now: Instant) {
        let since = self.since.swap(0, Ordering::Relaxed);
        if since != 0 {
            let spent = clock_us(now).saturating_sub(since - 1);
            self.waited_us.fetch_add(spent, Ordering::Relaxed);
        }
    }

    /// The total so far, and whether a wait is under way, while the ticket
    /// lives.
    fn waited(&self, now: Instant) -> Option<(Duration, bool)> {
        if self.done.load(Ordering::Acquire) {
            return None;
        }
        let mut us = self.waited_us.load(Ordering::Relaxed);
        let since = self.since.load(Ordering::Relaxed);
        if since != 0 {
            us += clock_us(now).saturating_sub(since - 1);
        }
        Some((Duration::from_micros(us), since != 0))
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
    }

    fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire) && !self.done.load(Ordering::Acquire)
    }
}

/// The stream an unauthenticated connection is read through: it keeps the
/// ticket's [`PeerWait`] (a read that finds nothing waits on the peer; one
/// that returns bytes or the end ends the wait), and once the connection is
/// evicted its reads fail with an error that says so. After the ticket is
/// dropped it only passes bytes through.
#[derive(Debug)]
pub struct Watched<IO> {
    io: IO,
    wait: Arc<PeerWait>,
}

impl<IO> Watched<IO> {
    pub fn new(io: IO, wait: Arc<PeerWait>) -> Self {
        Self { io, wait }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.wait.done.load(Ordering::Acquire) {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        if this.wait.evicted() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "evicted: it waited on its peer while newcomers waited for its place",
            )));
        }
        let res = Pin::new(&mut this.io).poll_read(cx, buf);
        match &res {
            Poll::Pending => this.wait.waiting(Instant::now()),
            Poll::Ready(_) => this.wait.progressed(Instant::now()),
        }
        res
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Token buckets keyed by a reason.
#[derive(Debug, Default)]
pub struct LogLimiter {
    buckets: Mutex<HashMap<&'static str, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(n)` when a line for `reason` may be logged now, `n` being how
    /// many were suppressed since the last one; `None` to stay quiet.
    pub fn allow(&self, reason: &'static str) -> Option<u64> {
        self.allow_at(reason, Instant::now())
    }

    fn allow_at(&self, reason: &'static str, now: Instant) -> Option<u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(reason).or_insert(Bucket {
            tokens: LOG_BURST,
            at: now,
            suppressed: 0,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * LOG_PER_SEC).min(LOG_BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Some(std::mem::take(&mut b.suppressed))
        } else {
            b.suppressed += 1;
            None
        }
    }

    /// Logs `line()` at warn level if the bucket of `reason` allows it (the
    /// line is only built then).
    pub fn warn(&self, reason: &'static str, line: impl FnOnce() -> String) {
        match self.allow(reason) {
            None => {}
            Some(0) => tracing::warn!("{}", line()),
            Some(n) => tracing::warn!("{} ({n} similar lines suppressed)", line()),
        }
    }
}

#[cfg(test)]
mod tests;
