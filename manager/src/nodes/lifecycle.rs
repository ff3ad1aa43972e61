//! A node's life, in one place: admission of a hello, the session's start
//! and end, the node's object and its status on the bus, the silence check.
//!
//! ```text
//!   known (object on the bus, offline) ──hello admitted──► online (a session)
//!        ▲                                                      │
//!        └────────── session ends: silent, EOF, replaced, ──────┘
//!                    dropped by a reload, shutdown
//! ```
//!
//! * [`Lifecycle::serve_connection`] reads a connection's hello, admits it by
//!   the [`Registry`]'s rules (and the manager's [`Phase`]), attaches the
//!   session, tells the other parts ([`Followers::online`]), announces
//!   `Node.Status` (and `Controller.Status` when it crossed a threshold) and
//!   runs the session. A node that becomes known while running (a reload
//!   that lists it, the first hello of a node admitted by a pattern or its
//!   certificate) gets its entry and its object here too
//!   ([`Lifecycle::reconfigure`]); every node object goes on the bus through
//!   the [`crate::outbound::Outbound`] port, so `Introspect` names every node `GetNode`
//!   answers for.
//! * [`Lifecycle::end_session`] runs the disconnect rules once per session:
//!   node offline (if it was the node's current session), the followers told
//!   ([`Followers::offline`], then [`Followers::ended`]: its jobs end),
//!   `Node.Status` announced.
//! * [`Lifecycle::heartbeat_loop`]: the one timer of all sessions (silent
//!   sessions end, heartbeats go out when the manager sends them).
//!
//! **Phases.** What the manager does with nodes depends on one state, its
//! [`Phase`], asked in one place for each question: may a hello be admitted,
//! may a job run, is `Controller.Status` announced at each change, does the
//! timer watch sessions. `Leading` is the manager at work; `Stopping` is the
//! shutdown ([`Lifecycle::enter`]). A manager that stands by while another
//! leads (high availability) is one more phase with its own answers, entered
//! and left through [`Lifecycle::enter`]; nothing else checks a flag.
//!
//! **Parked links.** A standby does not refuse an agent: after TLS and the
//! hello, and once the node passes the admission rules that do not depend on
//! sessions ([`Registry::may_register`]), it answers *parked* (who leads)
//! and keeps the link, at most [`PARKED_MAX`] of them; the link then holds
//! no pre-authentication place of the gate. Every [`Lifecycle::enter`] wakes
//! the parked links, which are judged again: a manager that now leads admits
//! them as any hello (the welcome carries its epoch) without waiting for the
//! agent to dial again, a stopping one refuses them. A parked peer that
//! closes, fails or sends anything is dropped.
//!
//! Locks: the registry is a plain mutex ([`Nodes`]), held for a few map
//! operations and never across an await. `announce` is an async mutex that
//! serialises every online/offline transition *with its D-Bus announcement*
//! (and every node added with its export), so `Node.Status` and
//! `Controller.Status` changes reach clients in the order they happened (an
//! offline of an old session can never overtake the online of its
//! replacement).
//!
//! The other parts hear of a node's life only through [`Followers`], which
//! the composition root implements ([`crate::root`]); this module imports
//! none of them.

use crate::error::ApiError;
use crate::ha::fence::Fence;
use crate::heap::{Churn, TrimState};
use crate::nodes::frames::MarkSocket;
use crate::nodes::gate::{LogLimiter, Ticket};
use crate::nodes::link_stats::{Disconnect, LinkStats};
use crate::nodes::registry::{Admission, ControllerStatus, Policy, Registry};
use crate::nodes::session::{Session, SessionOwner, spawn_io};
use crate::notify::NodeCounts;
use crate::outbound::Port;
use drover_bus::bluechi::{CONTROLLER_IFACE, CONTROLLER_PATH, NODE_IFACE};
use drover_bus::timestamp;
use drover_protocol::error_names::NOT_LEADER;
use drover_protocol::handshake::Accepted;
use drover_protocol::link::manager_read_hello;
use drover_protocol::{Event, NodeName, RefuseReason};
use drover_tls::NodeIdentity;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Where the manager is in its life (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Serving its nodes: admits agents, runs jobs, announces every change.
    Leading = 0,
    /// Shutting down: refuses agents and jobs, ends every session, announces
    /// `Controller.Status` once, at the end.
    Stopping = 1,
    /// Another manager leads (high availability, `crate::ha`): parks
    /// agents (below), refuses jobs and BlueChi's calls (naming the leader),
    /// watches no session. Also what `Leading` reads as once the fence's deadline has
    /// passed ([`Nodes::phase`]).
    Standby = 2,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Phase::Leading,
            2 => Phase::Standby,
            _ => Phase::Stopping,
        }
    }

    /// Why a hello is refused in this phase, if it is.
    pub fn refuses_nodes(self) -> Option<(RefuseReason, &'static str)> {
        match self {
            Phase::Leading => None,
            Phase::Stopping => Some((RefuseReason::ShuttingDown, "the manager is shutting down")),
            // Only when a standby cannot park the link (a manager without
            // a fence never stands by).
            Phase::Standby => Some((
                RefuseReason::ShuttingDown,
                "this manager stands by while another leads",
            )),
        }
    }

    /// Why a job is refused in this phase, if it is (BlueChi's words).
    pub fn refuses_jobs(self) -> Option<&'static str> {
        match self {
            Phase::Leading => None,
            Phase::Stopping => Some("Request not allowed: node is in shutdown state"),
            Phase::Standby => Some("this drover manager stands by while another leads"),
        }
    }

    /// Whether `Controller.Status` is announced as it changes (while
    /// stopping, [`Lifecycle::announce_controller`] tells the end state once).
    pub fn announces_controller(self) -> bool {
        self == Phase::Leading
    }

    /// Whether the heartbeat timer runs.
    pub fn watches_sessions(self) -> bool {
        self == Phase::Leading
    }
}

/// Links a standby holds at most ([`Lifecycle`], "Parked links"): above the
/// 10,000 agents a manager is measured with, so a whole fleet parks on a
/// standby, and a bound on what a flood of allowed names can hold.
pub const PARKED_MAX: usize = 16_384;

/// The node table and the phase, as every part that asks about nodes reads
/// them (the D-Bus objects, the job runner, metrics, reloads).
pub struct Nodes {
    registry: Mutex<Registry>,
    phase: AtomicU8,
    /// With high availability: whether this manager may lead now.
    fence: Option<Arc<Fence>>,
}

impl Nodes {
    /// A manager alone: it leads from the start.
    pub fn new(registry: Registry) -> Arc<Self> {
        Arc::new(Self {
            registry: Mutex::new(registry),
            phase: AtomicU8::new(Phase::Leading as u8),
            fence: None,
        })
    }

    /// A manager of an HA group: it stands by until its election makes it
    /// lead, and leads only while `fence` says so.
    pub fn with_fence(registry: Registry, fence: Arc<Fence>) -> Arc<Self> {
        Arc::new(Self {
            registry: Mutex::new(registry),
            phase: AtomicU8::new(Phase::Standby as u8),
            fence: Some(fence),
        })
    }

    /// The fence of an HA manager (`None` for a manager alone).
    pub fn fence(&self) -> Option<&Arc<Fence>> {
        self.fence.as_ref()
    }

    /// `Ok` while this manager serves BlueChi's API; on a standby the
    /// error names the leader.
    pub fn serving(&self) -> Result<(), ApiError> {
        match (self.phase(), &self.fence) {
            (Phase::Standby, Some(fence)) => Err(ApiError::new(NOT_LEADER, fence.refusal())),
            (Phase::Standby, None) => Err(ApiError::new(
                NOT_LEADER,
                "this drover manager stands by while another leads",
            )),
            _ => Ok(()),
        }
    }

    /// The node table (never held across an await).
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        // The guarded data is only changed by short, panic-free sections.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The phase, with the fence's clock read: a leader whose lease
    /// deadline has passed is a standby from that instant, whatever its
    /// election task has done yet.
    pub fn phase(&self) -> Phase {
        let phase = Phase::from_u8(self.phase.load(Ordering::SeqCst));
        match &self.fence {
            Some(fence) if phase == Phase::Leading && !fence.leading() => Phase::Standby,
            _ => phase,
        }
    }

    /// The session of `node`, or `Offline`.
    pub fn session_of(&self, node: &NodeName) -> Result<Arc<Session>, ApiError> {
        self.serving()?;
        self.registry()
            .session(node.as_str())
            .ok_or_else(ApiError::offline)
    }

    /// Every online session, as of now.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.registry().sessions().cloned().collect()
    }
}

/// The parts that follow a node's life (units, proxies, metrics, jobs),
/// told by the lifecycle; the composition root implements it.
pub trait Followers: Send + Sync + 'static {
    /// `session` became its node's current session (under the announcement
    /// lock, before `Node.Status` says `online`).
    fn online<'a>(&'a self, session: &'a Arc<Session>) -> BoxFuture<'a, ()>;

    /// The current session `session_id` of `node` ended (under the
    /// announcement lock, before `Node.Status` says `offline`).
    fn offline<'a>(&'a self, node: &'a NodeName, session_id: u64) -> BoxFuture<'a, ()>;

    /// A session ended, current or not (after [`Followers::offline`]).
    fn ended(&self, session_id: u64) -> BoxFuture<'_, ()>;

    /// An event from `session`'s agent, in the order the agent sent them.
    fn event<'a>(&'a self, session: &'a Session, event: Event) -> BoxFuture<'a, ()>;

    /// A peer was refused registration (`None`: it sent no valid hello).
    fn refused(&self, reason: Option<RefuseReason>);
}

/// The timings and heartbeat settings a node's life follows.
#[derive(Debug, Clone)]
pub struct Timing {
    /// `HeartbeatInterval` (ms; 0: the manager sends none).
    pub heartbeat_interval_ms: u64,
    /// `NodeHeartbeatThreshold` (ms; 0: silence is never watched).
    pub heartbeat_threshold_ms: u64,
    /// For the agent's hello and for sending the verdict.
    pub handshake: Duration,
    /// Per request to an agent.
    pub request: Duration,
    /// `ResyncInterval` (ms; 0: no resync), before its growth with the
    /// fleet's size.
    pub resync_interval_ms: u64,
}

impl Timing {
    /// How long one write to an agent may block before the agent counts as
    /// not reading.
    pub fn write_deadline(&self) -> Duration {
        match self.heartbeat_threshold_ms {
            0 => self.request,
            ms => Duration::from_millis(ms),
        }
    }
}

/// The manager's one heartbeat timer: its period (ms) and every how many
/// ticks it sends a round of heartbeats (0: never), `None` when it has
/// nothing to do (no heartbeats sent, no threshold watched). The period is
/// at most a sixth of the threshold and 1 s (not below 10 ms for that), and
/// divides the heartbeat interval (at least 10 ms) into whole ticks,
/// rounding the interval down to them. A silent node is dropped at most one tick after its threshold; a
/// pass costs a few atomic loads per online node, so 10,000 nodes cost
/// little even at one pass a second.
pub fn heartbeat_ticks(interval_ms: u64, threshold_ms: u64) -> Option<(u64, u64)> {
    let limit = match threshold_ms / 6 {
        0 if threshold_ms == 0 => 1000,
        v => v.clamp(10, 1000),
    };
    if interval_ms == 0 {
        return (threshold_ms > 0).then_some((limit, 0));
    }
    let interval = interval_ms.max(10);
    let every = interval.div_ceil(limit).max(1);
    Some((interval / every, every))
}

fn counts_of(registry: &Registry) -> NodeCounts {
    NodeCounts {
        online: registry.online(),
        known: registry.total(),
    }
}

/// What was last announced, guarded by the announcement lock.
struct Announced {
    controller: ControllerStatus,
}

/// What a reload changed in the node table ([`Lifecycle::reconfigure`]).
#[derive(Default)]
pub struct Reconfigured {
    /// Online sessions the new rules no longer admit, with why (not ended
    /// yet: the caller ends them once the rest of the reload applied).
    pub drop: Vec<(Arc<Session>, String)>,
    /// Nodes that became known, in config order (exported and announced).
    pub added: Vec<NodeName>,
    /// Every known node, in table order.
    pub known: Vec<NodeName>,
}

/// The node lifecycle (see the module docs).
pub struct Lifecycle {
    nodes: Arc<Nodes>,
    timing: Timing,
    announce: tokio::sync::Mutex<Announced>,
    next_session: AtomicU64,
    outbound: Arc<Port>,
    followers: Arc<dyn Followers>,
    /// Rate limits for the log lines about refused peers.
    refusals: Arc<LogLimiter>,
    /// Connections accepted and sessions ended, for [`crate::heap`].
    churn: Arc<Churn>,
    /// Nodes online / known, as last announced (the service manager's
    /// `STATUS=`, see [`crate::notify`]).
    node_counts: tokio::sync::watch::Sender<NodeCounts>,
    /// TLS handshakes and heartbeat lateness, for the metrics.
    link_stats: LinkStats,
    /// Bumped by every [`Lifecycle::enter`]: parked links look again.
    phase_changed: tokio::sync::watch::Sender<u64>,
    /// Links parked now (at most [`PARKED_MAX`]).
    parked: Arc<AtomicUsize>,
}

/// One parked link's count; given back on drop.
struct ParkedPlace(Arc<AtomicUsize>);

impl ParkedPlace {
    fn take(count: &Arc<AtomicUsize>) -> Option<Self> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < PARKED_MAX).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(count.clone()))
    }
}

impl Drop for ParkedPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lifecycle {
    pub fn new(
        nodes: Arc<Nodes>,
        timing: Timing,
        outbound: Arc<Port>,
        followers: Arc<dyn Followers>,
        refusals: Arc<LogLimiter>,
        churn: Arc<Churn>,
    ) -> Arc<Self> {
        let (controller, counts) = {
            let registry = nodes.registry();
            (registry.controller_status(), counts_of(&registry))
        };
        Arc::new(Self {
            nodes,
            timing,
            announce: tokio::sync::Mutex::new(Announced { controller }),
            // Seeded from the realtime clock so ids keep rising across
            // manager restarts: they are the guids of modification tags.
            next_session: AtomicU64::new(timestamp::realtime_us().max(1)),
            outbound,
            followers,
            refusals,
            churn,
            node_counts: tokio::sync::watch::Sender::new(counts),
            link_stats: LinkStats::default(),
            phase_changed: tokio::sync::watch::Sender::new(0),
            parked: Arc::default(),
        })
    }

    /// TLS handshakes and heartbeat lateness (read by the metrics).
    pub fn link_stats(&self) -> &LinkStats {
        &self.link_stats
    }

    /// The node table and the phase.
    pub fn nodes(&self) -> &Arc<Nodes> {
        &self.nodes
    }

    /// Nodes online and known, as announced; changes with every
    /// online/offline transition and every node added.
    pub fn node_counts(&self) -> tokio::sync::watch::Receiver<NodeCounts> {
        self.node_counts.subscribe()
    }

    /// Puts the manager in `phase` (see [`Phase`]); what the phase refuses is
    /// refused from then on.
    /// Parked links are woken and judged again.
    pub fn enter(&self, phase: Phase) {
        self.nodes.phase.store(phase as u8, Ordering::SeqCst);
        self.phase_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Links parked on this standby now.
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::SeqCst)
    }

    // ---- the bus --------------------------------------------------------

    /// Exports every known node's object through the port (just set, when
    /// the API is served); nodes added meanwhile wait for the lock, so none
    /// is missed or exported twice.
    pub async fn export_nodes(&self) {
        let _announced = self.announce.lock().await;
        let Some(out) = self.outbound.get() else {
            return;
        };
        let nodes: Vec<_> = self
            .nodes
            .registry()
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), n.path.clone()))
            .collect();
        for (name, path) in &nodes {
            out.export_node(name, path).await;
        }
    }

    /// Adds an offline entry for every name of `names` not known yet (in
    /// order) and exports its object; returns the names added. Called under
    /// `announce`.
    async fn add_nodes_locked(&self, names: &[NodeName]) -> Vec<NodeName> {
        let added = self.nodes.registry().add_nodes(names);
        if let Some(out) = self.outbound.get() {
            for (name, path) in &added {
                out.export_node(name, path).await;
            }
        }
        added.into_iter().map(|(name, _)| name).collect()
    }

    /// A reload's new rules: `policy` decides the next hellos; online
    /// sessions it no longer admits, or whose certificate `revoked` says is
    /// revoked, are returned to be dropped; nodes of `allowed` not known yet
    /// become known (object exported, `Controller.Status` announced: new
    /// nodes start offline, `up` may have become `degraded`).
    pub async fn reconfigure(
        &self,
        policy: Policy,
        revoked: impl Fn(&NodeIdentity) -> bool,
        allowed: &[NodeName],
    ) -> Reconfigured {
        let mut announced = self.announce.lock().await;
        let mut out = Reconfigured::default();
        {
            let mut registry = self.nodes.registry();
            registry.set_policy(policy);
            for session in registry.sessions() {
                let why = match session.identity() {
                    Some(identity) if revoked(identity) => {
                        format!("its certificate (serial {}) is revoked", identity.serial())
                    }
                    _ if !registry
                        .policy()
                        .allows(session.node(), session.identity().is_some()) =>
                    {
                        "it is no longer allowed to register".to_owned()
                    }
                    _ => continue,
                };
                out.drop.push((session.clone(), why));
            }
        }
        out.added = self.add_nodes_locked(allowed).await;
        out.known = self
            .nodes
            .registry()
            .nodes()
            .iter()
            .map(|n| n.name.clone())
            .collect();
        if !out.added.is_empty() {
            self.announce_controller_locked(&mut announced).await;
        }
        out
    }

    // ---- sessions -------------------------------------------------------

    /// Reads the hello of a connection (already through TLS when `identity`
    /// is set: the node its certificate proved) and, if admitted, runs the
    /// session. The hello must arrive by `deadline`. `ticket` is the
    /// connection's pre-authentication place, given up once the verdict is
    /// out. `socket` is the TCP socket under `io` (see
    /// [`crate::nodes::session::spawn_io`]).
    pub async fn serve_connection<IO>(
        self: &Arc<Self>,
        io: IO,
        socket: Option<MarkSocket>,
        peer: SocketAddr,
        identity: Option<NodeIdentity>,
        deadline: tokio::time::Instant,
        ticket: Option<Ticket>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let timeout = self.timing.handshake;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (mut pending, hello) = match manager_read_hello(io, left).await {
            Ok(ok) => ok,
            Err(e) => {
                self.followers.refused(None);
                self.refusals.warn("hello", || {
                    format!("{peer}: connection dropped before registration: {e}")
                });
                return;
            }
        };
        let mut ticket = ticket;
        let mut phase_changed = self.phase_changed.subscribe();
        let mut place: Option<ParkedPlace> = None;
        loop {
            // Marked seen before the phase is read: a change from now on wakes us.
            phase_changed.borrow_and_update();
            let fence = match (self.nodes.phase(), self.nodes.fence()) {
                (Phase::Standby, Some(fence)) => fence.clone(),
                _ => break,
            };
            let certified = identity.as_ref().map(NodeIdentity::node);
            let checked = self.nodes.registry().may_register(&hello.node, certified);
            if let Err((reason, message)) = checked {
                self.followers.refused(Some(reason));
                self.refusals.warn(refuse_key(reason), || {
                    format!(
                        "{peer}: '{}' not parked: {message}",
                        hello.node.escape_default()
                    )
                });
                pending.refuse(reason, &message, timeout).await;
                return;
            }
            if place.is_none() {
                place = ParkedPlace::take(&self.parked);
                if place.is_none() {
                    self.followers.refused(Some(RefuseReason::ShuttingDown));
                    self.refusals.warn("parked: full", || {
                        format!("{peer}: not parked: {PARKED_MAX} links are parked already")
                    });
                    let message = format!(
                        "this manager stands by and holds {PARKED_MAX} parked links already; {}",
                        fence.parked_message()
                    );
                    pending
                        .refuse(RefuseReason::ShuttingDown, &message, timeout)
                        .await;
                    return;
                }
            }
            // Parked: past the gate (TLS and the hello are done).
            drop(ticket.take());
            if let Err(e) = pending.park(&fence.parked_message(), timeout).await {
                tracing::debug!("{peer}: could not park: {e}");
                return;
            }
            tokio::select! {
                _ = phase_changed.changed() => {}
                gone = pending.gone() => {
                    tracing::debug!("{peer}: parked link of '{}' ended: {gone}", hello.node.escape_default());
                    return;
                }
            }
        }
        drop(place);
        if let Some((reason, message)) = self.nodes.phase().refuses_nodes() {
            self.followers.refused(Some(reason));
            pending.refuse(reason, message, timeout).await;
            return;
        }
        let threshold = self.timing.heartbeat_threshold_ms;
        let peer_ip = peer.ip().to_canonical().to_string();
        let mut announced = self.announce.lock().await;
        let admission = self.nodes.registry().admit(
            &hello.node,
            identity.as_ref().map(NodeIdentity::node),
            timestamp::monotonic_us(),
            threshold,
        );
        let name = match admission {
            Admission::Accept { node, new: false } => node,
            Admission::Accept { node, new: true } => {
                for name in self.add_nodes_locked(std::slice::from_ref(&node)).await {
                    tracing::info!(
                        node = %name,
                        "node {name} registers for the first time (admitted by a pattern or its certificate)"
                    );
                }
                node
            }
            Admission::Replace { node, old } => {
                tracing::warn!(
                    node = %node,
                    old_session = old.id(),
                    "node {node}: replacing a session that sent nothing for more than {threshold} ms"
                );
                old.set_end_cause(Disconnect::Replaced);
                old.mark_ended();
                self.detach_locked(
                    &mut announced,
                    &old,
                    "heartbeat expired; replaced by a new connection",
                )
                .await;
                node
            }
            Admission::Refuse(reason, message) => {
                drop(announced);
                self.followers.refused(Some(reason));
                // The log may say more than the peer is told: who holds the name.
                let holder = NodeName::new(hello.node.as_str())
                    .ok()
                    .and_then(|n| self.nodes.registry().session(n.as_str()))
                    .filter(|_| reason == RefuseReason::AlreadyConnected)
                    .map(|s| format!(" (held by session {} from {})", s.id(), s.peer_ip()))
                    .unwrap_or_default();
                let proven = identity
                    .as_ref()
                    .map(|i| format!(", certificate: {i}"))
                    .unwrap_or_default();
                self.refusals.warn(refuse_key(reason), || {
                    format!(
                        "{peer}: registration as '{}' refused{proven}: {message}{holder}",
                        hello.node.escape_default()
                    )
                });
                pending.refuse(reason, &message, timeout).await;
                return;
            }
        };
        drop(ticket);
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let (session, rx) = Session::authenticated(id, name, peer_ip, identity);
        if let Some(address) = hello.advertise_address {
            session.set_advertise_address(address);
        }
        if self.nodes.registry().attach(session.clone()).is_err() {
            // Cannot happen: admission and attach run under `announce`.
            drop(announced);
            pending
                .refuse(
                    RefuseReason::AlreadyConnected,
                    "the node is already connected",
                    timeout,
                )
                .await;
            return;
        }
        match session.identity() {
            Some(identity) => tracing::info!(
                node = %session.node(),
                session = id,
                %peer,
                agent_version = %hello.agent_version.escape_default(),
                "{identity} registered over TLS from {peer}{}",
                advertises(&hello)
            ),
            None => tracing::info!(
                node = %session.node(),
                session = id,
                %peer,
                agent_version = %hello.agent_version.escape_default(),
                "node {} registered from {peer}{}",
                session.node(),
                advertises(&hello)
            ),
        }
        // Resync digests come less often as the fleet grows
        // (`drover_protocol::resync::interval_for`).
        let online = u64::try_from(self.node_counts.borrow().online).unwrap_or(u64::MAX);
        let resync_interval_ms =
            drover_protocol::resync::interval_for(self.timing.resync_interval_ms, online);
        session.set_resync_interval(Duration::from_millis(resync_interval_ms));
        self.followers.online(&session).await;
        self.announce_node_locked(&mut announced, session.node())
            .await;
        drop(announced);

        let accepted = Accepted {
            session_id: id,
            heartbeat_interval_ms: self.timing.heartbeat_interval_ms,
            heartbeat_threshold_ms: threshold,
            manager_version: env!("CARGO_PKG_VERSION").to_owned(),
            resync_interval_ms,
            epoch: self.nodes.fence().map_or(0, |f| f.epoch()),
        };
        match pending.accept(accepted, timeout).await {
            Ok(framed) => spawn_io(
                self.clone(),
                session,
                framed,
                socket,
                rx,
                self.timing.write_deadline(),
            ),
            Err(e) => {
                self.end_session(
                    &session,
                    Disconnect::ConnectionLost,
                    &format!("could not send the welcome: {e}"),
                )
                .await
            }
        }
    }

    /// Ends a session and applies the disconnect rules: node offline (if it
    /// was the node's current session), pending requests fail with
    /// `Offline`, its jobs end with `disconnected`. Idempotent: the first
    /// `cause` recorded on the session is the one counted.
    pub async fn end_session(&self, session: &Arc<Session>, cause: Disconnect, why: &str) {
        session.set_end_cause(cause);
        if session.mark_ended() {
            self.churn.note();
        }
        let mut announced = self.announce.lock().await;
        self.detach_locked(&mut announced, session, why).await;
    }

    /// Ends every online session for `cause` (shutdown, standby) with `why`;
    /// returns them, to wait for their links to close.
    pub async fn end_all_sessions(&self, cause: Disconnect, why: &str) -> Vec<Arc<Session>> {
        let sessions = self.nodes.sessions();
        for session in &sessions {
            self.end_session(session, cause, why).await;
        }
        sessions
    }

    async fn detach_locked(&self, announced: &mut Announced, session: &Arc<Session>, why: &str) {
        let was_online = self.nodes.registry().detach(session.node(), session.id());
        if was_online {
            self.link_stats
                .disconnected(session.end_cause().unwrap_or(Disconnect::ConnectionLost));
            tracing::info!(
                node = %session.node(),
                session = session.id(),
                "node {} disconnected: {why}",
                session.node()
            );
            self.followers.offline(session.node(), session.id()).await;
            self.announce_node_locked(announced, session.node()).await;
        }
        self.followers.ended(session.id()).await;
    }

    // ---- announcements --------------------------------------------------

    /// Publishes the registry's counts (called under `announce`).
    fn publish_counts(&self, counts: NodeCounts) {
        self.node_counts.send_if_modified(|c| {
            let changed = *c != counts;
            *c = counts;
            changed
        });
    }

    /// Emits `Controller.Status` when it differs from what was last announced:
    /// a reload that adds (offline) nodes can change it with no node changing,
    /// and a shutdown tells its end state once.
    pub async fn announce_controller(&self) {
        let mut announced = self.announce.lock().await;
        self.announce_controller_locked(&mut announced).await;
    }

    async fn announce_controller_locked(&self, announced: &mut Announced) {
        let (controller, counts) = {
            let registry = self.nodes.registry();
            (registry.controller_status(), counts_of(&registry))
        };
        self.publish_counts(counts);
        self.controller_status_locked(announced, controller).await;
    }

    /// Emits `Controller.Status` when `controller` differs from what was last
    /// announced, and remembers it (called under `announce`).
    async fn controller_status_locked(
        &self,
        announced: &mut Announced,
        controller: ControllerStatus,
    ) {
        if controller != announced.controller {
            announced.controller = controller;
            if let Some(out) = self.outbound.get() {
                out.property_changed(
                    CONTROLLER_PATH,
                    CONTROLLER_IFACE,
                    "Status",
                    controller.as_str(),
                )
                .await;
            }
        }
    }

    /// Emits `Node.Status` and, when it crossed a threshold, `Controller.Status`.
    async fn announce_node_locked(&self, announced: &mut Announced, node: &NodeName) {
        let (status, path, controller, counts) = {
            let registry = self.nodes.registry();
            let Some(entry) = registry.get(node.as_str()) else {
                return;
            };
            (
                entry.status(),
                entry.path.clone(),
                registry.controller_status(),
                counts_of(&registry),
            )
        };
        self.publish_counts(counts);
        if let Some(out) = self.outbound.get() {
            out.property_changed(path.as_str(), NODE_IFACE, "Status", status)
                .await;
        }
        if self.nodes.phase().announces_controller() {
            self.controller_status_locked(announced, controller).await;
        }
    }

    // ---- the heartbeat timer --------------------------------------------

    /// One pass of the heartbeat timer: drop silent sessions, and (when
    /// `send`) queue a heartbeat to every other one that is due one
    /// (`Session::heartbeat_if_due`).
    pub async fn heartbeat_tick(&self, send: bool) {
        let threshold = self.timing.heartbeat_threshold_ms;
        let interval = Duration::from_millis(self.timing.heartbeat_interval_ms);
        let now = timestamp::monotonic_us();
        let mut silent = Vec::new();
        {
            let registry = self.nodes.registry();
            for session in registry.sessions() {
                if session.is_silent(now, threshold) {
                    silent.push(session.clone());
                } else if send {
                    session.heartbeat_if_due(now, interval);
                }
            }
        }
        for session in silent {
            self.end_session(
                &session,
                Disconnect::HeartbeatTimeout,
                &format!("nothing received for more than {threshold} ms"),
            )
            .await;
        }
    }

    /// The timer task: one for all sessions, so idle cost is one wakeup per
    /// tick plus a pass over the online sessions (a few atomic loads each).
    /// It ticks as [`heartbeat_ticks`] says, while the phase watches
    /// sessions; each tick also lets [`Churn`] return a burst's freed heap.
    pub async fn heartbeat_loop(self: Arc<Self>) {
        let Some((tick_ms, every)) = heartbeat_ticks(
            self.timing.heartbeat_interval_ms,
            self.timing.heartbeat_threshold_ms,
        ) else {
            return;
        };
        let mut timer = tokio::time::interval(Duration::from_millis(tick_ms));
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut trim = TrimState::default();
        loop {
            timer.tick().await;
            match self.nodes.phase() {
                Phase::Stopping => return,
                // A standby has no sessions to watch; it may lead later.
                phase if !phase.watches_sessions() => continue,
                _ => {}
            }
            let send = every > 0 && ticks.is_multiple_of(every);
            ticks = ticks.wrapping_add(1);
            self.heartbeat_tick(send).await;
            let started = std::time::Instant::now();
            if let Some(burst) = self.churn.tick(&mut trim) {
                tracing::info!(
                    "returned freed heap to the kernel after {burst} connections came or went \
                     ({} µs)",
                    started.elapsed().as_micros()
                );
            }
        }
    }
}

/// The lifecycle is every session's owner: events go to the followers, the
/// end to [`Lifecycle::end_session`].
impl SessionOwner for Lifecycle {
    fn on_event<'a>(&'a self, session: &'a Session, event: Event) -> BoxFuture<'a, ()> {
        self.followers.event(session, event)
    }

    fn on_end<'a>(&'a self, session: &'a Arc<Session>, why: &'a str) -> BoxFuture<'a, ()> {
        // The reader recorded the cause; the fallback is never the one counted.
        Box::pin(self.end_session(session, Disconnect::ConnectionLost, why))
    }

    fn on_bulk(&self) {
        self.churn.note();
    }

    fn on_heartbeat(&self, gap_us: u64) {
        self.link_stats
            .heartbeat(gap_us, self.timing.heartbeat_threshold_ms);
    }
}

/// The log-limiter bucket of a refusal.
/// `, advertising ADDRESS` when the hello carries `AdvertiseAddress=`.
fn advertises(hello: &drover_protocol::handshake::Hello) -> String {
    hello
        .advertise_address
        .map(|a| format!(", advertising {a}"))
        .unwrap_or_default()
}

fn refuse_key(reason: RefuseReason) -> &'static str {
    match reason {
        RefuseReason::VersionMismatch => "refused: version",
        RefuseReason::InvalidName => "refused: invalid name",
        RefuseReason::UnknownNode => "refused: unknown node",
        RefuseReason::AlreadyConnected => "refused: already connected",
        RefuseReason::BadHandshake => "refused: bad handshake",
        RefuseReason::ShuttingDown => "refused: shutting down",
        RefuseReason::IdentityMismatch => "refused: identity mismatch",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_timer_ticks_often_enough_for_the_threshold() {
        // (tick, ticks per heartbeat round)
        assert_eq!(heartbeat_ticks(0, 6000), Some((1000, 0)), "the default");
        assert_eq!(heartbeat_ticks(2000, 6000), Some((1000, 2)));
        assert_eq!(heartbeat_ticks(500, 2000), Some((250, 2)));
        assert_eq!(heartbeat_ticks(3000, 9000), Some((1000, 3)));
        assert_eq!(heartbeat_ticks(0, 30), Some((10, 0)));
        assert_eq!(heartbeat_ticks(0, 3), Some((10, 0)));
        assert_eq!(heartbeat_ticks(100, 0), Some((100, 1)));
        assert_eq!(heartbeat_ticks(5, 0), Some((10, 1)));
        assert_eq!(heartbeat_ticks(0, 86_400_000), Some((1000, 0)));
        assert_eq!(heartbeat_ticks(0, 0), None);
        for interval in [1, 10, 99, 100, 500, 1000, 2000, 2001, 8000, 86_400_000] {
            for threshold in [0, 1, 30, 2000, 6000, 86_400_000] {
                let Some((tick, every)) = heartbeat_ticks(interval, threshold) else {
                    panic!("{interval}/{threshold}: no timer");
                };
                assert!((5..=1000).contains(&tick), "{interval}/{threshold}: {tick}");
                assert!(every >= 1);
                let round = tick * every;
                assert!(
                    round <= interval.max(10) && round * 2 > interval,
                    "{interval}/{threshold}: rounds every {round} ms"
                );
                if threshold >= 60 {
                    assert!(tick <= threshold / 6, "{interval}/{threshold}: {tick}");
                }
            }
        }
    }

    struct Silent;

    impl Followers for Silent {
        fn online<'a>(&'a self, _: &'a Arc<Session>) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn offline<'a>(&'a self, _: &'a NodeName, _: u64) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn ended(&self, _: u64) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
        fn event<'a>(&'a self, _: &'a Session, _: Event) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn refused(&self, _: Option<RefuseReason>) {}
    }

    fn lifecycle() -> Arc<Lifecycle> {
        let timing = Timing {
            heartbeat_interval_ms: 0,
            heartbeat_threshold_ms: 6000,
            handshake: Duration::from_secs(10),
            request: Duration::from_secs(30),
            resync_interval_ms: 0,
        };
        Lifecycle::new(
            Nodes::new(Registry::new(&[])),
            timing,
            Port::new(),
            Arc::new(Silent),
            Arc::default(),
            Arc::default(),
        )
    }

    #[test]
    fn session_ids_rise_across_restarts() {
        let a = lifecycle();
        let first = a.next_session.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2));
        let b = lifecycle();
        assert!(b.next_session.load(Ordering::Relaxed) > first);
    }

    #[test]
    fn phases_say_what_they_refuse() {
        let l = lifecycle();
        assert_eq!(l.nodes().phase(), Phase::Leading);
        assert!(Phase::Leading.refuses_nodes().is_none());
        assert!(Phase::Leading.refuses_jobs().is_none());
        l.enter(Phase::Stopping);
        let phase = l.nodes().phase();
        assert_eq!(phase, Phase::Stopping);
        assert_eq!(
            phase.refuses_nodes().map(|r| r.0),
            Some(RefuseReason::ShuttingDown)
        );
        assert!(phase.refuses_jobs().is_some());
        assert!(!phase.announces_controller() && !phase.watches_sessions());
    }

    /// The fencing rule in one place: a leader whose lease deadline has
    /// passed is a standby at that instant, before its election task has
    /// done anything (a process resumed after SIGSTOP).
    #[tokio::test(start_paused = true)]
    async fn a_leader_past_its_deadline_is_a_standby_at_once() {
        use std::time::Duration;
        use tokio::time::Instant;
        let fence = Arc::new(Fence::new());
        let nodes = Nodes::with_fence(Registry::new(&[]), fence.clone());
        assert_eq!(nodes.phase(), Phase::Standby, "HA starts standing by");
        assert_eq!(
            nodes.serving().map_err(|e| e.name().to_string()),
            Err(NOT_LEADER.to_string())
        );
        fence.lead(5, Instant::now() + Duration::from_secs(2), "a:842");
        nodes.phase.store(Phase::Leading as u8, Ordering::SeqCst);
        assert_eq!(nodes.phase(), Phase::Leading);
        assert!(nodes.serving().is_ok());
        tokio::time::advance(Duration::from_secs(2)).await;
        // Nothing stored Standby: the clock alone says so.
        assert_eq!(nodes.phase(), Phase::Standby);
        assert!(nodes.phase().refuses_jobs().is_some());
        assert!(nodes.phase().refuses_nodes().is_some());
        assert!(nodes.serving().is_err());
        // A manager alone never reads a fence.
        let alone = Nodes::new(Registry::new(&[]));
        assert_eq!(alone.phase(), Phase::Leading);
        assert!(alone.serving().is_ok());
    }
}
