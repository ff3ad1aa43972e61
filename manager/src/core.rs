//! The manager's state and the rules that tie sessions, nodes, jobs and the
//! D-Bus API together.
//!
//! The core is every session's [`SessionOwner`] (events and disconnects come
//! in through it) and puts what clients must hear on the bus through one
//! [`Outbound`] (set when the API is served; before that, and in unit tests,
//! nothing is emitted). It never names a D-Bus object: `api/` imports the
//! core, not the other way round.
//!
//! Locks: `registry` and `jobs` are plain mutexes, held for a few map
//! operations and never across an await. `announce` is an async mutex that
//! serialises every online/offline transition *with its D-Bus
//! announcement*, so `Node.Status` and `Controller.Status` changes reach
//! clients in the order they happened (an offline of an old session can
//! never overtake the online of its replacement).

use crate::error::ApiError;
use crate::escape::job_path;
use crate::fanout;
use crate::heap::{Churn, TrimState};
use crate::jobs::{Done, JobInfo, Jobs, RESULT_DISCONNECTED, RESULT_SHUTDOWN, valid_state};
use crate::metrics::Metrics;
use crate::nodes::gate::{Gate, Limits, LogLimiter, Ticket};
use crate::nodes::registry::{Admission, ControllerStatus, Policy as AdmitPolicy, Registry};
use crate::nodes::session::{Session, SessionOwner, spawn_io};
use crate::notify::NodeCounts;
use crate::outbound::Outbound;
use crate::proxies::driver::Proxies;
use crate::proxies::rules::Policy;
use crate::units::hub::Subscriptions;
use crate::units::monitor::Monitors;
use drover_bus::bluechi::{CONTROLLER_IFACE, CONTROLLER_PATH, JOB_IFACE, NODE_IFACE};
use drover_bus::systemd::{UnitTuple, unit_tuple};
use drover_bus::timestamp;
use drover_config::{LogHandle, LogLevel, ManagerConfig};
use drover_protocol::handshake::Accepted;
use drover_protocol::link::manager_read_hello;
use drover_protocol::{Event, JobKind, NodeName, RefuseReason, Request, Response, UnitName};
use drover_tls::{Acceptor, NodeIdentity};
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use zbus::OwnedObjectPath;

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

/// systemd job modes (`systemctl --job-mode`); anything else is refused
/// before it reaches a node.
pub const JOB_MODES: &[&str] = &[
    "replace",
    "fail",
    "isolate",
    "ignore-dependencies",
    "ignore-requirements",
    "flush",
    "triggering",
    "restart-dependencies",
    "replace-irreversibly",
];

/// Timings that are not config keys.
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// Per request to an agent (BlueChi: 30 s).
    pub request: Duration,
    /// For the agent's hello and for sending the verdict.
    pub handshake: Duration,
    /// Per node in a fleet-wide fan-out (`Controller.ListUnits`): below the
    /// 25 s default method timeout of D-Bus clients, so one hung node makes
    /// the answer slow and partial, never a client-side timeout.
    pub fanout: Duration,
    /// The most bytes the body of a fleet-wide answer may take (see
    /// [`crate::fanout`]); tests lower it.
    pub fleet_answer: usize,
    /// Caps on connections not yet admitted (see [`crate::nodes::gate`]).
    pub pre_auth: Limits,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            request: Duration::from_secs(30),
            // TLS handshake and hello together.
            handshake: Duration::from_secs(10),
            fanout: Duration::from_secs(20),
            fleet_answer: drover_bus::limits::MAX_REPLY_BODY,
            pre_auth: Limits::default(),
        }
    }
}

struct Announced {
    controller: ControllerStatus,
}

pub struct Core {
    config: ManagerConfig,
    timeouts: Timeouts,
    log_level: Mutex<LogLevel>,
    registry: Mutex<Registry>,
    jobs: Mutex<Jobs>,
    announce: tokio::sync::Mutex<Announced>,
    outbound: OnceLock<Arc<dyn Outbound>>,
    next_session: AtomicU64,
    shutting_down: AtomicBool,
    subscriptions: Arc<Subscriptions>,
    monitors: Arc<Monitors>,
    metrics: Metrics,
    log_handle: OnceLock<LogHandle>,
    proxies: Proxies,
    /// Mutual TLS on the agent port, when configured.
    tls: Option<Acceptor>,
    gate: Gate,
    refusals: LogLimiter,
    /// Nodes online / known, as last announced (the service manager's
    /// `STATUS=`, see [`crate::notify`]).
    node_counts: tokio::sync::watch::Sender<NodeCounts>,
    /// Where a reload reads the configuration from (set by the binary;
    /// unset in library use, where only `reload::reload` with a config is
    /// possible), and the lock that runs one reload at a time.
    config_source: OnceLock<ConfigSource>,
    reload_lock: tokio::sync::Mutex<()>,
    /// Connections accepted and sessions ended, for [`crate::heap`].
    churn: Churn,
}

/// Loads the configuration again, from the sources and flags of the start.
pub type ConfigSource =
    Box<dyn Fn() -> Result<ManagerConfig, drover_config::ConfigError> + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data is only changed by short, panic-free sections.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Core {
    /// `tls` must be the acceptor loaded from `config.tls` (`None` exactly
    /// when the config has no TLS keys): see [`crate::Manager::start`].
    pub fn new(config: ManagerConfig, timeouts: Timeouts, tls: Option<Acceptor>) -> Arc<Self> {
        let mut registry = Registry::new(&config.allowed_nodes);
        registry.set_policy(AdmitPolicy::from_config(&config));
        let controller = registry.controller_status();
        let counts = counts_of(&registry);
        let subscriptions = Subscriptions::new(timeouts.request);
        let monitors = Monitors::new(subscriptions.clone());
        let proxies = Proxies::new(
            Policy::from_config(&config, config.allowed_nodes.iter().cloned()),
            subscriptions.clone(),
            timeouts.request,
        );
        Arc::new(Self {
            log_level: Mutex::new(config.logging.level),
            registry: Mutex::new(registry),
            jobs: Mutex::new(Jobs::new()),
            announce: tokio::sync::Mutex::new(Announced { controller }),
            outbound: OnceLock::new(),
            // Seeded from the realtime clock so ids keep rising across
            // manager restarts: they are the guids of modification tags.
            next_session: AtomicU64::new(timestamp::realtime_us().max(1)),
            shutting_down: AtomicBool::new(false),
            subscriptions,
            proxies,
            monitors,
            metrics: Metrics::default(),
            log_handle: OnceLock::new(),
            tls,
            gate: Gate::new(timeouts.pre_auth),
            refusals: LogLimiter::default(),
            node_counts: tokio::sync::watch::Sender::new(counts),
            config_source: OnceLock::new(),
            reload_lock: tokio::sync::Mutex::new(()),
            churn: Churn::default(),
            config,
            timeouts,
        })
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// The TLS acceptor in force (reload swaps its settings).
    pub fn tls(&self) -> Option<&Acceptor> {
        self.tls.as_ref()
    }

    /// The caps on connections not yet admitted.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A connection was accepted or a session ended (see [`crate::heap`]).
    pub fn note_churn(&self) {
        self.churn.note();
    }

    /// Rate limits for the log lines about refused peers.
    pub fn refusals(&self) -> &LogLimiter {
        &self.refusals
    }

    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    pub fn jobs(&self) -> MutexGuard<'_, Jobs> {
        lock(&self.jobs)
    }

    /// Cross-node dependencies (see [`crate::proxies::driver`]).
    pub fn proxies(&self) -> &Proxies {
        &self.proxies
    }

    /// Unit subscriptions and records (monitors and proxies watch through it).
    pub fn subscriptions(&self) -> &Arc<Subscriptions> {
        &self.subscriptions
    }

    pub fn monitors(&self) -> &Arc<Monitors> {
        &self.monitors
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where signals and objects go, once the API is served.
    pub fn outbound(&self) -> Option<&Arc<dyn Outbound>> {
        self.outbound.get()
    }

    /// Where `SetLogLevel` applies the level (the daemon sets it once).
    pub fn set_log_handle(&self, handle: LogHandle) {
        let _ = self.log_handle.set(handle);
    }

    /// Where reloads read the configuration (once; later calls are ignored).
    pub fn set_config_source(&self, source: ConfigSource) {
        let _ = self.config_source.set(source);
    }

    /// The configuration loaded again, `None` without a source.
    pub fn load_config_again(&self) -> Option<Result<ManagerConfig, drover_config::ConfigError>> {
        self.config_source.get().map(|load| load())
    }

    /// Held for the whole of a reload, so two never interleave.
    pub async fn reload_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reload_lock.lock().await
    }

    /// `Controller.SetLogLevel`: the level reported and the level in force.
    pub fn set_log_level(&self, level: LogLevel) {
        *lock(&self.log_level) = level;
        if let Some(h) = self.log_handle.get() {
            h.set_level(level);
        }
    }

    pub fn log_level(&self) -> LogLevel {
        *lock(&self.log_level)
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Where signals and objects go (set once, when the API is served).
    pub fn set_outbound(&self, outbound: Arc<dyn Outbound>) {
        let _ = self.outbound.set(outbound);
    }

    /// How long one write to an agent may block before the agent counts as
    /// not reading.
    pub fn write_deadline(&self) -> Duration {
        match self.config.node_heartbeat_threshold_ms {
            0 => self.timeouts.request,
            ms => Duration::from_millis(ms),
        }
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
        socket: Option<crate::nodes::frames::MarkSocket>,
        peer: SocketAddr,
        identity: Option<NodeIdentity>,
        deadline: tokio::time::Instant,
        ticket: Option<Ticket>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let timeout = self.timeouts.handshake;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (pending, hello) = match manager_read_hello(io, left).await {
            Ok(ok) => ok,
            Err(e) => {
                self.refusals.warn("hello", || {
                    format!("{peer}: connection dropped before registration: {e}")
                });
                return;
            }
        };
        if self.is_shutting_down() {
            pending
                .refuse(
                    RefuseReason::ShuttingDown,
                    "the manager is shutting down",
                    timeout,
                )
                .await;
            return;
        }
        let peer_ip = peer.ip().to_canonical().to_string();
        let mut announced = self.announce.lock().await;
        let admission = self.registry().admit(
            &hello.node,
            identity.as_ref().map(NodeIdentity::node),
            timestamp::monotonic_us(),
            self.config.node_heartbeat_threshold_ms,
        );
        let name = match admission {
            Admission::Accept { node, new: false } => node,
            Admission::Accept { node, new: true } => {
                let added = self.registry().add_nodes(std::slice::from_ref(&node));
                for (name, path) in &added {
                    tracing::info!(
                        node = %name,
                        "node {name} registers for the first time (admitted by a pattern or its certificate)"
                    );
                    if let Some(out) = self.outbound() {
                        out.export_node(name, path).await;
                    }
                }
                node
            }
            Admission::Replace { node, old } => {
                tracing::warn!(
                    node = %node,
                    old_session = old.id(),
                    "node {node}: replacing a session that sent nothing for more than {} ms",
                    self.config.node_heartbeat_threshold_ms
                );
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
                // The log may say more than the peer is told: who holds the name.
                let holder = NodeName::new(hello.node.as_str())
                    .ok()
                    .and_then(|n| self.registry().session(n.as_str()))
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
        if self.registry().attach(session.clone()).is_err() {
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
                "{identity} registered over TLS from {peer}"
            ),
            None => tracing::info!(
                node = %session.node(),
                session = id,
                %peer,
                agent_version = %hello.agent_version.escape_default(),
                "node {} registered from {peer}",
                session.node()
            ),
        }
        self.subscriptions.node_online(&session);
        self.proxies.node_online(&session).await;
        self.metrics.node_online(&session);
        self.announce_node_locked(&mut announced, session.node())
            .await;
        drop(announced);

        let accepted = Accepted {
            session_id: id,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            heartbeat_threshold_ms: self.config.node_heartbeat_threshold_ms,
            manager_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        match pending.accept(accepted, timeout).await {
            Ok(framed) => spawn_io(
                self.clone(),
                session,
                framed,
                socket,
                rx,
                self.write_deadline(),
            ),
            Err(e) => {
                self.end_session(&session, &format!("could not send the welcome: {e}"))
                    .await
            }
        }
    }

    /// Ends a session and applies the disconnect rules: node offline (if it
    /// was the node's current session), pending requests fail with
    /// `Offline`, its jobs end with `disconnected`. Idempotent.
    pub async fn end_session(&self, session: &Arc<Session>, why: &str) {
        if session.mark_ended() {
            self.churn.note();
        }
        let mut announced = self.announce.lock().await;
        self.detach_locked(&mut announced, session, why).await;
    }

    async fn detach_locked(&self, announced: &mut Announced, session: &Arc<Session>, why: &str) {
        let was_online = self.registry().detach(session.node(), session.id());
        if was_online {
            tracing::info!(
                node = %session.node(),
                session = session.id(),
                "node {} disconnected: {why}",
                session.node()
            );
            self.subscriptions
                .node_offline(session.node(), session.id());
            self.proxies
                .node_offline(session.node(), session.id())
                .await;
            self.announce_node_locked(announced, session.node()).await;
        }
        let ended = self.jobs().end_session(session.id(), RESULT_DISCONNECTED);
        for job in ended {
            self.job_removed(&job, RESULT_DISCONNECTED).await;
        }
    }

    /// Nodes online and known, as announced; changes with every
    /// online/offline transition and every node added.
    pub fn node_counts(&self) -> tokio::sync::watch::Receiver<NodeCounts> {
        self.node_counts.subscribe()
    }

    /// Publishes the registry's counts (called under `announce`).
    fn publish_counts(&self, counts: NodeCounts) {
        self.node_counts.send_if_modified(|c| {
            let changed = *c != counts;
            *c = counts;
            changed
        });
    }

    /// Emits `Controller.Status` when it differs from what was last announced:
    /// a reload that adds (offline) nodes can change it with no node changing.
    pub async fn announce_controller(&self) {
        let mut announced = self.announce.lock().await;
        let (controller, counts) = {
            let registry = self.registry();
            (registry.controller_status(), counts_of(&registry))
        };
        self.publish_counts(counts);
        self.controller_status_locked(&mut announced, controller)
            .await;
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
            self.properties_changed(
                CONTROLLER_PATH,
                CONTROLLER_IFACE,
                "Status",
                controller.as_str(),
            )
            .await;
        }
    }

    /// Emits `Node.Status` and, when it crossed a threshold, `Controller.Status`.
    async fn announce_node_locked(&self, announced: &mut Announced, node: &NodeName) {
        let (status, path, controller, counts) = {
            let registry = self.registry();
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
        self.properties_changed(path.as_str(), NODE_IFACE, "Status", status)
            .await;
        // While shutting down, `shutdown` announces the final state once.
        if !self.is_shutting_down() {
            self.controller_status_locked(announced, controller).await;
        }
    }

    /// One pass of the heartbeat timer: drop silent sessions, and (when
    /// `send`) queue a heartbeat to every other one that is due one
    /// (`Session::heartbeat_if_due`).
    pub async fn heartbeat_tick(&self, send: bool) {
        let threshold = self.config.node_heartbeat_threshold_ms;
        let interval = Duration::from_millis(self.config.heartbeat_interval_ms);
        let now = timestamp::monotonic_us();
        let mut silent = Vec::new();
        {
            let registry = self.registry();
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
                &format!("nothing received for more than {threshold} ms"),
            )
            .await;
        }
    }

    /// The timer task: one for all sessions, so idle cost is one wakeup per
    /// tick plus a pass over the online sessions (a few atomic loads each).
    /// It ticks as [`heartbeat_ticks`] says.
    pub async fn heartbeat_loop(self: Arc<Self>) {
        let interval = self.config.heartbeat_interval_ms;
        let threshold = self.config.node_heartbeat_threshold_ms;
        let Some((tick_ms, every)) = heartbeat_ticks(interval, threshold) else {
            return;
        };
        let mut timer = tokio::time::interval(Duration::from_millis(tick_ms));
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut trim = TrimState::default();
        loop {
            timer.tick().await;
            if self.is_shutting_down() {
                return;
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

    /// An event from an agent.
    pub async fn on_event(&self, session: &Session, event: Event) {
        match event {
            Event::JobStateChanged { job_id, state } => {
                if !valid_state(&state) {
                    tracing::debug!(
                        node = %session.node(),
                        "node {}: ignoring unknown job state for job {job_id}",
                        session.node()
                    );
                    return;
                }
                let changed = self.jobs().state_changed(session.id(), job_id, &state);
                if let Some(job) = changed {
                    self.properties_changed(job_path(job.id).as_str(), JOB_IFACE, "State", &state)
                        .await;
                }
            }
            Event::JobDone { job_id, result } => {
                let result = sanitize_result(&result);
                let done = self.jobs().job_done(session.id(), job_id, &result);
                match done {
                    Done::Remove(job) => self.job_removed(&job, &result).await,
                    Done::Held => {}
                    Done::Unknown => {
                        tracing::debug!(
                            node = %session.node(),
                            "node {}: JobDone for unknown job {job_id}",
                            session.node()
                        )
                    }
                }
            }
            event @ (Event::UnitNew { .. }
            | Event::UnitStateChanged { .. }
            | Event::UnitPropertiesChanged { .. }
            | Event::UnitRemoved { .. }) => self.subscriptions.on_event(session, event),
            event @ (Event::ProxyNew { .. } | Event::ProxyRemoved { .. }) => {
                self.proxies.on_event(session, &event).await
            }
            Event::JobMetrics {
                unit,
                method,
                micros,
            } => {
                self.metrics
                    .agent_job(self.outbound(), session.node(), &unit, &method, micros)
                    .await
            }
        }
    }

    /// Ends every job and every session (SIGTERM). Jobs get `JobRemoved`
    /// with `cancelled due to shutdown` before the bus connection closes.
    /// Each node's `Status` goes `offline`; `Controller.Status` is announced
    /// once, at the end (`down`), not at each threshold crossed on the way
    /// (`degraded` first), as BlueChi's controller signals its shutdown.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let ended = self.jobs().end_all(RESULT_SHUTDOWN);
        for job in ended {
            self.job_removed(&job, RESULT_SHUTDOWN).await;
        }
        let sessions: Vec<_> = self.registry().sessions().cloned().collect();
        for session in &sessions {
            self.end_session(session, "the manager is shutting down")
                .await;
        }
        self.announce_controller().await;
        // Every agent sees its link end cleanly (TLS: `close_notify`), not
        // cut by the process's exit; each writer bounds its own close.
        let closing = sessions
            .iter()
            .map(|s| tokio::time::timeout(crate::nodes::session::CLOSE_DEADLINE, s.closed()));
        futures::future::join_all(closing).await;
    }

    // ---- what the D-Bus API asks for ------------------------------------

    /// The session of `node`, or `Offline`.
    pub fn session_of(&self, node: &NodeName) -> Result<Arc<Session>, ApiError> {
        self.registry()
            .session(node.as_str())
            .ok_or_else(ApiError::offline)
    }

    /// A request to `node`'s agent with the standard timeout.
    pub async fn node_request(&self, node: &NodeName, body: Request) -> Result<Response, ApiError> {
        let session = self.session_of(node)?;
        session.request(body, self.timeouts.request).await
    }

    /// `Node.StartUnit` & co (see [`crate::jobs`] for the ordering rules).
    pub async fn start_job(
        self: &Arc<Self>,
        node: &NodeName,
        unit: &str,
        mode: &str,
        kind: JobKind,
    ) -> Result<OwnedObjectPath, ApiError> {
        let unit = UnitName::new(unit).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        if !JOB_MODES.contains(&mode) {
            return Err(ApiError::invalid_args(format!(
                "invalid job mode '{}': expected one of {}",
                mode.escape_default(),
                JOB_MODES.join(", ")
            )));
        }
        let mode = mode.to_owned();
        self.start_job_with(node, unit.clone(), kind, move |job_id| Request::UnitJob {
            kind,
            unit,
            mode,
            job_id,
        })
        .await
    }

    /// Runs a job: allocates its id, sends `make(id)` to the node, and on
    /// success exports the job and emits `JobNew` (see [`crate::jobs`]).
    /// `StartTransientUnit` uses it too.
    pub async fn start_job_with(
        self: &Arc<Self>,
        node: &NodeName,
        unit: UnitName,
        kind: JobKind,
        make: impl FnOnce(u32) -> Request,
    ) -> Result<OwnedObjectPath, ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::failed(
                "Request not allowed: node is in shutdown state",
            ));
        }
        let session = self.session_of(node)?;
        let id = self.jobs().allocate(node.clone(), unit, kind, session.id());
        self.metrics.job_started(id);
        let body = make(id);
        match session.request(body, self.timeouts.request).await {
            Ok(Response::Empty) => {}
            Ok(other) => {
                self.jobs().forget(id);
                return Err(unexpected(&other));
            }
            Err(e) => {
                self.jobs().forget(id);
                return Err(e);
            }
        }
        let path = job_path(id);
        let info = self.jobs().info(id).cloned();
        if let Some(out) = self.outbound() {
            if let Some(info) = info {
                out.export_job(&info, &path).await;
            }
            out.job_new(id, &path).await;
        }
        let early = self.jobs().exported(id);
        if let Some((job, result)) = early {
            self.job_removed(&job, &result).await;
        }
        Ok(path)
    }

    /// `Controller.ListUnits`: every online node, at most
    /// [`crate::fanout::IN_FLIGHT`] at a time, all by one fan-out deadline.
    /// A node that fails or times out is left out of the answer and logged
    /// (BlueChi fails the whole call instead; one slow or broken node should
    /// not blind an operator to the rest of the fleet). An answer that would
    /// not fit one D-Bus reply is refused early: see [`crate::fanout`].
    pub async fn list_all_units(&self) -> Result<BTreeMap<String, Vec<UnitTuple>>, ApiError> {
        self.fleet_list(&fanout::LIST_UNITS, units_of).await
    }

    /// `Controller.ListUnitFiles`, as [`Core::list_all_units`].
    pub async fn list_all_unit_files(
        &self,
    ) -> Result<BTreeMap<String, Vec<(String, String)>>, ApiError> {
        self.fleet_list(&fanout::LIST_UNIT_FILES, unit_files).await
    }

    async fn fleet_list<T: serde::Serialize + zbus::wire::Type>(
        &self,
        list: &fanout::FleetList,
        rows: fn(Response) -> Result<Vec<T>, ApiError>,
    ) -> Result<BTreeMap<String, Vec<T>>, ApiError> {
        let sessions: Vec<_> = self.registry().sessions().cloned().collect();
        let t = &self.timeouts;
        fanout::gather(sessions, list, rows, t.fanout, t.fleet_answer).await
    }

    // ---- signals --------------------------------------------------------

    async fn job_removed(&self, job: &JobInfo, result: &str) {
        let path = job_path(job.id);
        self.metrics
            .job_finished(job, self.outbound(), || self.session_of(&job.node).ok());
        if let Some(out) = self.outbound() {
            out.job_removed(job, &path, result).await;
        }
        tracing::debug!(
            job = job.id,
            node = %job.node,
            unit = %job.unit,
            "job {} ({} on node {}) removed: {result}",
            job.id,
            job.unit,
            job.node
        );
    }

    async fn properties_changed(
        &self,
        path: &str,
        interface: &'static str,
        property: &'static str,
        value: &str,
    ) {
        if let Some(out) = self.outbound() {
            out.property_changed(path, interface, property, value).await;
        }
    }

    // ---- metrics ----------------------------------------------------------

    /// `Controller.EnableMetrics` (`on`) / `DisableMetrics`.
    pub async fn switch_metrics(&self, on: bool) -> Result<(), ApiError> {
        self.metrics
            .switch(on, self.outbound(), || {
                self.registry().sessions().cloned().collect()
            })
            .await
    }
}

/// The core is every session's owner: events go to [`Core::on_event`], the
/// end to [`Core::end_session`].
impl SessionOwner for Core {
    fn on_event<'a>(&'a self, session: &'a Session, event: Event) -> BoxFuture<'a, ()> {
        Box::pin(Core::on_event(self, session, event))
    }

    fn on_end<'a>(&'a self, session: &'a Arc<Session>, why: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.end_session(session, why))
    }

    fn on_bulk(&self) {
        self.churn.note();
    }
}

/// The log-limiter bucket of a refusal.
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

fn unexpected(response: &Response) -> ApiError {
    let kind = match response {
        Response::Empty => "empty",
        Response::Units(_) => "units",
        Response::UnitFiles(_) => "unit files",
        Response::Value(_) => "value",
        Response::Text(_) => "text",
        Response::Changes { .. } => "changes",
    };
    ApiError::failed(format!("unexpected reply from the agent ({kind})"))
}

/// The `(ssssssouso)` tuples of a `ListUnits` reply. Object paths that are
/// not valid object paths (a broken agent) become `/`.
pub fn units_of(response: Response) -> Result<Vec<UnitTuple>, ApiError> {
    match response {
        Response::Units(units) => Ok(units.into_iter().map(unit_tuple).collect()),
        other => Err(unexpected(&other)),
    }
}

/// The `(ss)` rows of a `ListUnitFiles` reply.
pub fn unit_files(response: Response) -> Result<Vec<(String, String)>, ApiError> {
    match response {
        Response::UnitFiles(files) => Ok(files),
        other => Err(unexpected(&other)),
    }
}

/// A job result goes on the bus as is when it looks like systemd's words;
/// anything else (NUL bytes, megabytes of text) is replaced.
fn sanitize_result(result: &str) -> String {
    let ok = !result.is_empty()
        && result.len() <= 64
        && result.chars().all(|c| c.is_ascii_graphic() || c == ' ');
    if ok {
        result.to_owned()
    } else {
        "invalid".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::UnitInfo;

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

    #[test]
    fn results_are_sanitized() {
        assert_eq!(sanitize_result("done"), "done");
        assert_eq!(
            sanitize_result("cancelled due to shutdown"),
            "cancelled due to shutdown"
        );
        assert_eq!(sanitize_result("a\0b"), "invalid");
        assert_eq!(sanitize_result(&"x".repeat(100)), "invalid");
    }

    #[test]
    fn session_ids_rise_across_restarts() {
        let a = Core::new(ManagerConfig::default(), Timeouts::default(), None);
        let first = a.next_session.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2));
        let b = Core::new(ManagerConfig::default(), Timeouts::default(), None);
        assert!(b.next_session.load(Ordering::Relaxed) > first);
    }

    #[test]
    fn bad_unit_paths_become_root() {
        let units = units_of(Response::Units(vec![UnitInfo {
            object_path: "not a path".into(),
            ..UnitInfo::loaded("a.service", "active", "running")
        }]))
        .unwrap();
        assert_eq!(units[0].6.as_str(), "/");
        assert!(units_of(Response::Empty).is_err());
    }
}
