//! The link to the manager: connect, handshake, serve a session, reconnect.
//!
//! One [`Link::run`] loop owns the connection for the agent's lifetime:
//!
//! 1. **Connect**: the manager's host is resolved again on every attempt (its
//!    address may change), TCP with `TCP_NODELAY`, `SO_KEEPALIVE` with the
//!    configured idle/interval/count, `IP_RECVERR` and `TCP_USER_TIMEOUT`
//!    ([`link_user_timeout`]), so a dead peer is seen quickly; with TLS configured ([`LinkConfig::tls`]) the TLS 1.3
//!    handshake, which refuses a manager whose certificate does not chain to
//!    the agent's CA bundle or does not name `TLSControllerName` (else the
//!    host dialled) — a rogue manager would own the node; then
//!    [`agent_hello`] with a timeout. A refusal is logged (at error level
//!    for certificate problems) and retried with the backoff below, as any
//!    failed attempt. In TLS 1.3 the manager judges the agent's own
//!    certificate after the agent's side of the handshake is done, so a
//!    refused agent certificate shows as an error reading the welcome.
//! 2. **Session** (one per accepted handshake, numbered by `epoch`): a reader,
//!    a writer task fed by the bounded [`Outbox`](crate::link::outbox::Outbox) queue, and a heartbeat
//!    timer, both timer and silence threshold negotiated with what the
//!    manager announced ([`crate::link::heartbeat`]). Each request runs as its own task, at most
//!    [`LinkConfig::max_in_flight`] at once (the reader waits for a slot, so
//!    TCP pushes back on the manager — nothing unbounded is fed from the
//!    network). The session ends when the manager closes, sends something
//!    that is not a valid frame, stays silent longer than the heartbeat
//!    threshold, stops reading (queue full), or the agent shuts down.
//! 3. **Backoff**: retries forever with jittered exponential backoff — the
//!    first retry after 100–250 ms, doubling, capped at
//!    max(`HeartbeatInterval`, 1 s) — so thousands of agents do not reconnect
//!    in lockstep. Failures are logged until `ConnectionRetryCountUntilQuiet`,
//!    which is said once; then only at debug level until connected again.
//!
//! 4. **Switch** (`SwitchController`, [`crate::link::target`]): the session or
//!    connection attempt in progress is dropped and the new endpoint dialled
//!    at once, without backoff. With TLS the manager's certificate must name
//!    `TLSControllerName` when it is set, whatever host is dialled; without
//!    it, the host dialled — after a switch, the new host
//!    ([`LinkConfig::tls_name_follows_host`]), as at start.
//!
//! 5. **Several managers** (a high-availability group: `ControllerHost=`
//!    lists more than one): one dialer per manager runs steps 1 and 3 on its
//!    own. A standby answers the hello with *parked* and keeps the link; the
//!    dialer waits on it, without a deadline (TCP keepalive sees a dead
//!    peer), for the welcome the standby sends the moment it leads. Every
//!    welcome goes to [`crate::link::follow::Follow`]: taken (a newer leader
//!    ends the session in progress politely, as a switch does), kept away
//!    (the session stays) or refused (an epoch lower than the highest seen).
//!    So a failover costs the agents no heartbeat threshold and no backoff:
//!    they hold a parked link to every standby beside their session, and
//!    also survive the leader's host dying without a TCP reset. A session
//!    that changes manager is a new session, exactly as after a manager
//!    restart: the agent resyncs, and stops no unit, proxy or dependency
//!    unit for it (proxies keep their grace period, `crate::proxies`).
//!
//! Invariants: replies and events of a session that ended are dropped (see
//! [`crate::link::outbox`]); a shutdown closes the connection politely (queued
//! messages are flushed, then the write side is shut down); nothing sent by
//! the manager can make the agent panic or grow memory without bound.

use crate::dispatch::Dispatcher;
use crate::link::follow::{Follow, Verdict};
use crate::link::heartbeat;
use crate::link::outbox::SessionKill;
use crate::link::target::Endpoint;
use crate::notify;
use crate::state::Shared;
use crate::systemd::api::Systemd;
use drover_protocol::link::{AgentFramed, Answer, HandshakeError, agent_hello};
use drover_protocol::{Hello, NodeName, RefuseReason, ToAgent, ToManager};
use futures::{SinkExt, StreamExt};
use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// Version sent in the handshake.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// TCP keepalive: idle time before probes, interval between them, probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

/// Everything the link needs; built from `AgentConfig` plus flags.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub node: NodeName,
    /// The first manager.
    pub host: String,
    pub port: u16,
    /// The other managers of a high-availability group (the rest of the
    /// `ControllerHost=` / `ControllerAddress=` list): the link holds a
    /// link to each and follows the leader ([`crate::link::follow`]).
    pub more: Vec<Endpoint>,
    /// Zero: no heartbeats (unless the manager watches for them, see
    /// [`crate::link::heartbeat`]).
    pub heartbeat_interval: Duration,
    /// Drop the link when nothing arrived for this long. Zero: never. Raised
    /// to fit the manager's announced interval; unused when it announces 0.
    pub heartbeat_threshold: Duration,
    pub quiet_after: u32,
    pub keepalive: Option<Keepalive>,
    pub ip_receive_errors: bool,
    /// Bound on resolving, connecting and the handshake, each.
    pub connect_timeout: Duration,
    /// Requests running at once.
    pub max_in_flight: usize,
    /// Messages queued for the manager before the link is dropped.
    pub outbox_capacity: usize,
    /// Mutual TLS to the manager (`None`: plaintext).
    pub tls: Option<drover_tls::Connector>,
    /// Tell the service manager the link's state (`STATUS=`, see
    /// [`crate::notify`]); the binary sets it, library users do not.
    pub notify: bool,
    /// `TLSControllerName` is unset: the certificate must name the host
    /// dialled, so a switch to another host checks that host's name.
    pub tls_name_follows_host: bool,
    /// `AdvertiseAddress=`: sent in every hello (`None`: the manager uses
    /// the address it sees).
    pub advertise_address: Option<std::net::IpAddr>,
}

/// What a link runs over: TCP, or TLS on TCP.
pub trait LinkIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> LinkIo for T {}
/// The connection of one session.
pub type LinkStream = Box<dyn LinkIo>;

impl LinkConfig {
    /// Defaults for everything but the endpoint and the name.
    pub fn new(node: NodeName, host: impl Into<String>, port: u16) -> Self {
        Self {
            node,
            host: host.into(),
            port,
            more: Vec::new(),
            heartbeat_interval: Duration::from_millis(2000),
            heartbeat_threshold: Duration::from_millis(6000),
            quiet_after: 10,
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(1),
                interval: Duration::from_secs(1),
                count: 6,
            }),
            ip_receive_errors: true,
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 64,
            outbox_capacity: 1024,
            tls: None,
            notify: false,
            tls_name_follows_host: false,
            advertise_address: None,
        }
    }

    /// Every manager the link dials: `host:port`, then [`LinkConfig::more`].
    pub fn managers(&self) -> Vec<Endpoint> {
        let mut all = vec![Endpoint {
            host: self.host.clone(),
            port: self.port,
        }];
        for more in &self.more {
            if !all.contains(more) {
                all.push(more.clone());
            }
        }
        all
    }

    /// Upper bound of the reconnect backoff.
    pub fn backoff_cap(&self) -> Duration {
        self.heartbeat_interval.max(Duration::from_secs(1))
    }
}

/// What the link is doing, for whoever wants to watch (tests, the local API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    Connecting { failures: u32 },
    Connected { epoch: u64, session_id: u64 },
    Stopped,
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("TLS with the manager at {addr} (expected name '{name}') failed: {source}")]
    Tls {
        addr: SocketAddr,
        name: String,
        source: std::io::Error,
    },
    /// The manager refused this node's certificate (a TLS alert it sent
    /// after the handshake, as TLS 1.3 does).
    #[error("the manager at {addr} refused this node: {why}")]
    CertificateRefused { addr: SocketAddr, why: String },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Shutdown,
    Closed,
    HeartbeatExpired(Duration),
    Malformed(String),
    /// The connection failed (reset, ...).
    Broken(String),
    Killed(String),
    /// `SwitchController` named another manager.
    Switched,
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::Shutdown => f.write_str("agent shutting down"),
            SessionEnd::Closed => f.write_str("the manager closed the connection"),
            SessionEnd::HeartbeatExpired(t) => {
                write!(f, "nothing heard from the manager for {t:?}")
            }
            SessionEnd::Malformed(e) => write!(f, "invalid data from the manager: {e}"),
            SessionEnd::Broken(e) => write!(f, "the connection failed: {e}"),
            SessionEnd::Killed(why) => f.write_str(why),
            SessionEnd::Switched => f.write_str("switching to another manager"),
        }
    }
}

impl SessionEnd {
    /// Why a read from the manager failed. A TLS stream that ends without
    /// `close_notify` (rustls's `UnexpectedEof`) is a closed connection, as
    /// a plaintext end is: the manager was killed or its host cut the link
    /// (a manager that stops sends `close_notify`). The agent reconnects
    /// either way; nothing read is trusted past the last whole frame.
    fn from_read_error(e: drover_protocol::FrameError) -> Self {
        use drover_protocol::FrameError;
        match e {
            FrameError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                SessionEnd::Closed
            }
            FrameError::Io(io) => SessionEnd::Broken(io.to_string()),
            other => SessionEnd::Malformed(other.to_string()),
        }
    }
}

/// A manager's welcome, handed by its dialer to [`Link::run`].
struct Offer {
    endpoint: Endpoint,
    framed: AgentFramed<LinkStream>,
    accepted: drover_protocol::handshake::Accepted,
    /// Dropped when the link is done with this manager's link: its dialer
    /// dials again.
    done: oneshot::Sender<()>,
}

/// The session in progress.
struct Current<'a> {
    endpoint: Endpoint,
    session: std::pin::Pin<Box<dyn std::future::Future<Output = SessionEnd> + Send + 'a>>,
    /// Ends the session politely (a newer leader, a switch).
    preempt: CancellationToken,
}

/// What [`Link::run`] does next.
enum Step {
    Switched,
    Ended(SessionEnd),
    Offer(Box<Offer>),
}

/// `a:1, b:2`, for log lines.
fn list(endpoints: &[Endpoint]) -> String {
    endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Jittered exponential backoff (see the module docs).
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    cap: Duration,
}

const BACKOFF_FLOOR: Duration = Duration::from_millis(100);
const BACKOFF_FIRST: Duration = Duration::from_millis(250);

impl Backoff {
    pub fn new(cap: Duration) -> Self {
        Self { attempt: 0, cap }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The next delay: uniform in [100 ms, min(cap, 250 ms · 2^attempt)].
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = BACKOFF_FIRST
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let floor = BACKOFF_FLOOR.min(ceiling);
        let span = (ceiling - floor).as_millis() as u64;
        floor + Duration::from_millis(random_u64() % (span + 1))
    }
}

/// Jitter only needs to differ between agents and attempts, not to be
/// unpredictable: std's randomly keyed hasher is enough.
fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::Instant::now())
}

/// The agent's end of the manager link.
pub struct Link<S> {
    cfg: LinkConfig,
    dispatcher: Arc<Dispatcher<S>>,
    slots: Arc<Semaphore>,
    state: watch::Sender<LinkState>,
}

impl<S: Systemd> Link<S> {
    pub fn new(cfg: LinkConfig, systemd: Arc<S>, shared: Arc<Shared>) -> Self {
        shared.controller.init(cfg.managers());
        let slots = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
        let (state, _) = watch::channel(LinkState::Connecting { failures: 0 });
        Self {
            cfg,
            dispatcher: Arc::new(Dispatcher::new(systemd, shared)),
            slots,
            state,
        }
    }

    /// Follows the link's state.
    pub fn watch(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    fn shared(&self) -> &Arc<Shared> {
        self.dispatcher.shared()
    }

    /// Connects and reconnects until `shutdown` is cancelled: one dialer per
    /// manager of the list (see the module docs, step 5), the session with
    /// the one [`Follow`] takes.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut epoch = 0u64;
        let mut follow = Follow::default();
        let mut switched = self.shared().controller.watch();
        'targets: loop {
            // Read after marking the watch seen: a switch from now on is news.
            switched.borrow_and_update();
            let targets = self.shared().controller.all();
            let (offers_tx, mut offers) = mpsc::channel::<Offer>(targets.len().max(1));
            let mut dialers =
                std::pin::pin!(futures::future::join_all(targets.iter().map(|target| {
                    self.dial(target, targets.len(), offers_tx.clone(), &shutdown)
                })));
            drop(offers_tx);
            let mut current: Option<Current<'_>> = None;
            loop {
                let step = tokio::select! {
                    biased;
                    _ = switched.changed() => Step::Switched,
                    end = async {
                        match current.as_mut() {
                            Some(c) => (&mut c.session).await,
                            None => std::future::pending().await,
                        }
                    } => Step::Ended(end),
                    offer = offers.recv() => match offer {
                        Some(offer) => Step::Offer(Box::new(offer)),
                        None => Step::Switched,
                    },
                    _ = &mut dialers, if !shutdown.is_cancelled() => Step::Switched,
                    _ = shutdown.cancelled(), if current.is_none() => break 'targets,
                };
                match step {
                    Step::Switched => {
                        if let Some(c) = current.take() {
                            c.preempt.cancel();
                            c.session.await;
                            follow.ended();
                        }
                        if shutdown.is_cancelled() {
                            break 'targets;
                        }
                        tracing::info!(
                            "SwitchController: leaving {}, dialling {}",
                            list(&targets),
                            list(&self.shared().controller.all())
                        );
                        self.state
                            .send_replace(LinkState::Connecting { failures: 0 });
                        continue 'targets;
                    }
                    Step::Ended(end) => {
                        let Some(c) = current.take() else { continue };
                        follow.ended();
                        self.state
                            .send_replace(LinkState::Connecting { failures: 0 });
                        if end == SessionEnd::Shutdown {
                            break 'targets;
                        }
                        tracing::warn!(
                            "lost the link to the manager at {}: {end}; reconnecting",
                            c.endpoint
                        );
                        if self.cfg.notify {
                            notify::retrying(
                                &c.endpoint.to_string(),
                                &FailureKind::Lost.with(&end.to_string()),
                                Duration::ZERO,
                            );
                        }
                        // Its dialer (waiting on `c.done`) dials again after its backoff.
                    }
                    Step::Offer(offer) => {
                        let leadership = offer.accepted.epoch;
                        match follow.offer(leadership) {
                            Verdict::Take => {}
                            Verdict::Keep { current: held } => {
                                tracing::debug!(
                                    "the manager at {} welcomed this node with epoch \
                                     {leadership}; staying with the session of epoch {held}",
                                    offer.endpoint
                                );
                                continue;
                            }
                            Verdict::Refuse { highest } => {
                                tracing::warn!(
                                    "refusing the manager at {}: its leadership epoch \
                                     {leadership} is lower than {highest}, the highest this \
                                     agent has seen (a deposed leader is never obeyed)",
                                    offer.endpoint
                                );
                                continue;
                            }
                        }
                        if let Some(c) = current.take() {
                            tracing::info!(
                                "the manager at {} leads now (epoch {leadership}); leaving \
                                 {}",
                                offer.endpoint,
                                c.endpoint
                            );
                            c.preempt.cancel();
                            c.session.await;
                        }
                        epoch += 1;
                        current = Some(self.start_session(epoch, *offer, &shutdown));
                    }
                }
            }
        }
        self.state.send_replace(LinkState::Stopped);
    }

    /// Starts the session of an offer the link took.
    fn start_session<'a>(
        &'a self,
        epoch: u64,
        offer: Offer,
        shutdown: &'a CancellationToken,
    ) -> Current<'a> {
        let Offer {
            endpoint,
            framed,
            accepted,
            done,
        } = offer;
        self.shared().tracker().new_session(epoch);
        self.shared().session_started(epoch, accepted.session_id);
        self.shared()
            .stats
            .session_started(endpoint.to_string(), accepted.epoch);
        self.shared()
            .status
            .set_controller(&endpoint.host, endpoint.port);
        tracing::info!(
            session = accepted.session_id,
            manager_version = %accepted.manager_version,
            "connected to the manager at {endpoint} as node '{}' (leadership epoch {})",
            self.cfg.node.as_str(),
            accepted.epoch
        );
        if self.cfg.notify {
            notify::connected(&endpoint.to_string(), self.cfg.node.as_str());
        }
        self.state.send_replace(LinkState::Connected {
            epoch,
            session_id: accepted.session_id,
        });
        let beats = heartbeat::negotiate(
            self.cfg.heartbeat_interval,
            self.cfg.heartbeat_threshold,
            accepted.heartbeat_interval_ms,
            accepted.heartbeat_threshold_ms,
        );
        for note in &beats.notes {
            tracing::warn!("{note}");
        }
        let resync = Duration::from_millis(accepted.resync_interval_ms);
        let preempt = CancellationToken::new();
        let stop = preempt.clone();
        let session = Box::pin(async move {
            let end = self
                .session(epoch, framed, &beats, resync, shutdown, &stop)
                .await;
            // The dialer of this manager dials again once the session is over.
            drop(done);
            end
        });
        Current {
            endpoint,
            session,
            preempt,
        }
    }

    /// One manager's dialer: connects, waits on a parked link for its
    /// verdict, hands a welcome to [`Link::run`] and waits until the link
    /// is done with it, then dials again after its backoff. Runs until the
    /// link stops polling it.
    async fn dial(
        &self,
        target: &Endpoint,
        managers: usize,
        offers: mpsc::Sender<Offer>,
        shutdown: &CancellationToken,
    ) {
        let endpoint = target.to_string();
        let mut failures = 0u32;
        let mut backoff = Backoff::new(self.cfg.backoff_cap());
        let mut said_parked: Option<String> = None;
        while !shutdown.is_cancelled() {
            let mut answer = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = self.connect(target) => a,
            };
            // A parked link waits (without a deadline) for its verdict.
            let accepted = loop {
                match answer {
                    Ok(Answer::Accepted(framed, accepted)) => break Ok((framed, accepted)),
                    Ok(Answer::Parked(link, message)) => {
                        if said_parked.as_deref() != Some(message.as_str()) {
                            tracing::info!(
                                "the manager at {endpoint} stands by ({message}); the link \
                                 waits there for it to lead"
                            );
                            said_parked = Some(message);
                        }
                        failures = 0;
                        backoff.reset();
                        answer = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            v = link.verdict() => v.map_err(ConnectError::from),
                        };
                    }
                    Err(e) => break Err(e),
                }
            };
            match accepted {
                Ok((framed, accepted)) => {
                    if failures > self.quiet_limit() {
                        tracing::info!(
                            "reached the manager at {endpoint} again after {failures} failed \
                             attempts"
                        );
                    }
                    failures = 0;
                    backoff.reset();
                    said_parked = None;
                    let (done, finished) = oneshot::channel::<()>();
                    let offer = Offer {
                        endpoint: target.clone(),
                        framed,
                        accepted,
                        done,
                    };
                    if offers.send(offer).await.is_err() {
                        return;
                    }
                    // Until the session ends, or the link turned the welcome down.
                    let _ = finished.await;
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    self.shared().stats.connect_failed();
                    self.log_failure(&endpoint, &err, failures);
                    // The link's state tells failures while no session runs.
                    self.state.send_if_modified(|s| match s {
                        LinkState::Connecting { failures: f } => {
                            *f = failures;
                            true
                        }
                        _ => false,
                    });
                    if self.cfg.notify && managers == 1 {
                        let (kind, why) = notify_failure(&err);
                        notify::retrying(&endpoint, &kind.with(&why), Duration::ZERO);
                    }
                }
            }
            let delay = backoff.next_delay();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    fn quiet_limit(&self) -> u32 {
        self.cfg.quiet_after.max(1)
    }

    fn log_failure(&self, endpoint: &str, err: &ConnectError, failures: u32) {
        let limit = self.quiet_limit();
        if failures > limit {
            tracing::debug!(
                "connecting to the manager at {endpoint} failed (attempt {failures}): {err}"
            );
            return;
        }
        let quiet = if failures == limit {
            format!(
                " (after {limit} failed attempts, further failures are logged at debug level until connected)"
            )
        } else {
            String::new()
        };
        match err {
            ConnectError::Handshake(HandshakeError::Refused { reason, message }) => {
                let node = self.cfg.node.as_str();
                match reason {
                    RefuseReason::UnknownNode
                    | RefuseReason::InvalidName
                    | RefuseReason::VersionMismatch => {
                        tracing::error!(
                            "the manager at {endpoint} refused node '{node}' ({reason:?}): {message}{quiet}"
                        )
                    }
                    _ => tracing::warn!(
                        "the manager at {endpoint} refused node '{node}' ({reason:?}): {message}{quiet}"
                    ),
                }
            }
            ConnectError::Handshake(HandshakeError::VersionMismatch { .. }) => {
                tracing::error!("cannot register with the manager at {endpoint}: {err}{quiet}")
            }
            ConnectError::Tls { .. } => tracing::error!(
                "refusing the manager at {endpoint}: {err}; check TLSCertificateAuthority and \
                 TLSControllerName{quiet}"
            ),
            ConnectError::CertificateRefused { why, .. } => tracing::error!(
                "the manager at {endpoint} refused node '{}': {why}; the manager's log says \
                 why, and a new certificate from the CA (drover-pki node) is the way back{quiet}",
                self.cfg.node.as_str()
            ),
            _ => tracing::warn!("cannot connect to the manager at {endpoint}: {err}{quiet}"),
        }
    }

    async fn connect(&self, target: &Endpoint) -> Result<Answer<LinkStream>, ConnectError> {
        let t = self.cfg.connect_timeout;
        let host = target.host.as_str();
        let addrs: Vec<SocketAddr> =
            tokio::time::timeout(t, tokio::net::lookup_host((host, target.port)))
                .await
                .map_err(|_| ConnectError::Timeout(t))?
                .map_err(|source| ConnectError::Resolve {
                    host: host.to_string(),
                    source,
                })?
                .collect();
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            match tokio::time::timeout(t, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(source)) => last = Some(ConnectError::Connect { addr, source }),
                Err(_) => last = Some(ConnectError::Timeout(t)),
            }
        }
        let Some(stream) = stream else {
            return Err(last.unwrap_or(ConnectError::NoAddress {
                host: host.to_string(),
            }));
        };
        configure_socket(&stream, &self.cfg);
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let stream: LinkStream = match &self.cfg.tls {
            None => Box::new(stream),
            Some(connector) => {
                let connector = &self.connector_for(connector, host)?;
                let addr = stream
                    .peer_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                let tls_err = |source| ConnectError::Tls {
                    addr,
                    name: server_name(connector),
                    source,
                };
                match tokio::time::timeout(t, connector.connect(stream)).await {
                    Ok(Ok(tls)) => Box::new(tls),
                    Ok(Err(source)) => return Err(tls_err(source)),
                    Err(_) => return Err(ConnectError::Timeout(t)),
                }
            }
        };
        let hello = Hello::new(self.cfg.node.as_str(), AGENT_VERSION)
            .advertising(self.cfg.advertise_address);
        match agent_hello(stream, &hello, t).await {
            Err(HandshakeError::Frame(drover_protocol::FrameError::Io(io))) => {
                match drover_tls::connector::alert_from_manager(&io) {
                    Some(why) => Err(ConnectError::CertificateRefused { addr: peer, why }),
                    None => Err(HandshakeError::Frame(drover_protocol::FrameError::Io(io)).into()),
                }
            }
            other => Ok(other?),
        }
    }

    /// The connector that checks the right manager name for `host` (see the
    /// module docs, step 4): the configured one, or — when the name follows
    /// the host and `SwitchController` changed the host — the same TLS
    /// settings checking the new host's name.
    fn connector_for(
        &self,
        connector: &drover_tls::Connector,
        host: &str,
    ) -> Result<drover_tls::Connector, ConnectError> {
        if !self.cfg.tls_name_follows_host || server_name(connector) == host {
            return Ok(connector.clone());
        }
        connector
            .with_server_name(host)
            .map_err(|e| ConnectError::Tls {
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                name: host.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            })
    }

    async fn session(
        &self,
        epoch: u64,
        framed: AgentFramed<LinkStream>,
        beats: &heartbeat::Negotiated,
        resync: Duration,
        shutdown: &CancellationToken,
        preempt: &CancellationToken,
    ) -> SessionEnd {
        let (sink, mut stream) = framed.split();
        let (tx, rx) = mpsc::channel(self.cfg.outbox_capacity.max(1));
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
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    let wait = crate::units::resync::jittered(resync, random_u64());
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

/// What a failure was, for the status line ([`notify::Failure`] borrows
/// its text; this owns it across the backoff computation).
#[derive(Clone, Copy)]
enum FailureKind {
    Unreachable,
    Refused,
    Tls,
    Lost,
}

impl FailureKind {
    fn with(self, text: &str) -> notify::Failure<'_> {
        match self {
            FailureKind::Unreachable => notify::Failure::Unreachable(text),
            FailureKind::Refused => notify::Failure::Refused(text),
            FailureKind::Tls => notify::Failure::Tls(text),
            FailureKind::Lost => notify::Failure::Lost(text),
        }
    }
}

fn notify_failure(err: &ConnectError) -> (FailureKind, String) {
    match err {
        ConnectError::Handshake(HandshakeError::Refused { reason, message }) => {
            (FailureKind::Refused, format!("{reason:?}: {message}"))
        }
        ConnectError::Handshake(e @ HandshakeError::VersionMismatch { .. }) => {
            (FailureKind::Refused, e.to_string())
        }
        ConnectError::Tls { source, .. } => (FailureKind::Tls, source.to_string()),
        ConnectError::CertificateRefused { why, .. } => (FailureKind::Refused, why.clone()),
        ConnectError::Connect { source, .. } => (FailureKind::Unreachable, source.to_string()),
        other => (FailureKind::Unreachable, other.to_string()),
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

async fn write_loop(
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

/// The manager name a connector checks, for messages.
fn server_name(connector: &drover_tls::Connector) -> String {
    connector.server_name().to_str().into_owned()
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

/// Best effort: a socket option that cannot be set is logged, not fatal.
fn configure_socket(stream: &TcpStream, cfg: &LinkConfig) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!("cannot set TCP_NODELAY: {e}");
    }
    let sock = socket2::SockRef::from(stream);
    if let Some(ka) = cfg.keepalive {
        let mut params = socket2::TcpKeepalive::new();
        if !ka.idle.is_zero() {
            params = params.with_time(ka.idle);
        }
        if !ka.interval.is_zero() {
            params = params.with_interval(ka.interval);
        }
        if ka.count > 0 {
            params = params.with_retries(ka.count);
        }
        if let Err(e) = sock.set_tcp_keepalive(&params) {
            tracing::warn!("cannot enable TCP keepalive: {e}");
        }
    }
    if cfg.ip_receive_errors
        && let Err(e) = drover_protocol::link::set_recv_err(stream)
    {
        tracing::warn!("cannot set IP_RECVERR: {e}");
    }
    if let Some(timeout) = link_user_timeout(cfg)
        && let Err(e) = drover_protocol::link::set_user_timeout(stream, timeout)
    {
        tracing::warn!("cannot set TCP_USER_TIMEOUT: {e}");
    }
}

/// The `TCP_USER_TIMEOUT` of the link's socket: the agent's heartbeats are
/// its probes of the manager (`drover_protocol::liveness`), so what it sent
/// unacknowledged for this long ends the link. From the configured pair,
/// set before the manager's answer: negotiation only makes the agent send
/// more often, except when its own interval is 0 (then it may send nothing,
/// and the whole threshold applies).
pub fn link_user_timeout(cfg: &LinkConfig) -> Option<Duration> {
    let sends_every = (!cfg.heartbeat_interval.is_zero()).then_some(cfg.heartbeat_interval);
    drover_protocol::liveness::user_timeout(cfg.heartbeat_threshold, sends_every)
}

#[cfg(test)]
mod tests;
