//! The composition root: every part of a manager built once from its
//! configuration, each handed exactly what it needs.
//!
//! ```text
//!                 ┌──────────── Lifecycle (nodes/lifecycle.rs) ───────────┐
//!   listener ───► │ admission, session end, announcements, heartbeats     │
//!                 └──────┬───────────────────────────────┬────────────────┘
//!                        │ Followers (this module)       │ Outbound port
//!        ┌───────────────┼─────────────┬───────────┐     ▼
//!        ▼               ▼             ▼           ▼   the bus (api/)
//!   JobRunner     Subscriptions     Proxies     Metrics
//!   (jobs/)       + Monitors        (proxies/)
//!                 (units/)
//! ```
//!
//! Nothing but this module (and [`crate::server`], which starts what it
//! built) sees all the parts together: the node lifecycle knows the others
//! only as its [`Followers`], the D-Bus objects get their share through
//! [`crate::api::handles::Handles`], the listener through
//! [`crate::nodes::listener::Accept`], reloads through
//! [`crate::reload::Reloader`].
//!
//! `Following` is the one implementation of [`Followers`]: what a node's
//! life means for the rest — online: its unit subscriptions are replayed, the
//! unit index watches it, its proxies' references resume, metrics are switched on if enabled; offline:
//! the same parts in that order; ended: its jobs end; and every event of its
//! agent goes to the part it concerns.

use crate::discovery::Discovery;
use crate::discovery::drain::Drained;
use crate::fanout::limit::FleetCallLimits;
use crate::ha::fence::Fence;
use crate::heap::Churn;
use crate::job_runner::JobRunner;
use crate::logs::LogControl;
use crate::metrics::Metrics;
use crate::nodes::gate::{Gate, Limits, LogLimiter};
use crate::nodes::lifecycle::{Followers, Lifecycle, Nodes, Timing};
use crate::nodes::registry::{Policy as AdmitPolicy, Registry};
use crate::nodes::session::Session;
use crate::outbound::Port;
use crate::proxies::driver::Proxies;
use crate::proxies::rules::Policy;
use crate::reload::Reloader;
use crate::units::hub::Subscriptions;
use crate::units::monitor::Monitors;
use drover_config::ManagerConfig;
use drover_protocol::{Event, NodeName, RefuseReason};
use drover_tls::Acceptor;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

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
    /// Fleet-wide lists at once (see [`crate::fanout::limit`]).
    pub fleet_calls: FleetCallLimits,
    /// One node's lists at once, all nodes together (same module).
    pub node_lists: FleetCallLimits,
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
            fleet_calls: FleetCallLimits::default(),
            node_lists: FleetCallLimits::node_lists(),
        }
    }
}

/// Every part of one manager (see the module docs).
pub struct Parts {
    pub config: Arc<ManagerConfig>,
    pub timeouts: Timeouts,
    /// Mutual TLS on the agent port, when configured.
    pub tls: Option<Acceptor>,
    pub outbound: Arc<Port>,
    pub log: Arc<LogControl>,
    pub gate: Arc<Gate>,
    pub refusals: Arc<LogLimiter>,
    pub churn: Arc<Churn>,
    pub metrics: Arc<Metrics>,
    pub subscriptions: Arc<Subscriptions>,
    pub monitors: Arc<Monitors>,
    /// The unit → nodes index behind `Where` ([`crate::discovery`]).
    pub discovery: Arc<Discovery>,
    pub proxies: Proxies,
    pub jobs: Arc<JobRunner>,
    pub lifecycle: Arc<Lifecycle>,
    pub reloader: Arc<Reloader>,
    /// Drained nodes and units, kept in the state directory.
    pub drained: Arc<Drained>,
}

/// The parts that follow a node's life (see the module docs).
struct Following {
    jobs: Arc<JobRunner>,
    subscriptions: Arc<Subscriptions>,
    discovery: Arc<Discovery>,
    proxies: Proxies,
    metrics: Arc<Metrics>,
    outbound: Arc<Port>,
}

impl Parts {
    /// Builds a manager's parts. `tls` must be the acceptor loaded from
    /// `config.tls` (`None` exactly when the config has no TLS keys): see
    /// [`crate::Manager::start`].
    pub fn build(config: ManagerConfig, timeouts: Timeouts, tls: Option<Acceptor>) -> Self {
        let config = Arc::new(config);
        let mut registry = Registry::new(&config.allowed_nodes);
        registry.set_policy(AdmitPolicy::from_config(&config));
        // With etcd keys a manager stands by until its election makes it
        // lead; without them it leads from the start, as it always has.
        let nodes = if config.ha.enabled() {
            Nodes::with_fence(registry, Arc::new(Fence::new()))
        } else {
            Nodes::new(registry)
        };
        let outbound = Port::new();
        let metrics = Arc::new(Metrics::default());
        let subscriptions = Subscriptions::new(timeouts.request);
        let monitors = Monitors::new(subscriptions.clone());
        let discovery = Discovery::new(
            subscriptions.clone(),
            config.discovery,
            &config.allowed_nodes,
            crate::discovery::index::DEFAULT_CAP,
        );
        let proxies = Proxies::new(
            Policy::from_config(&config, config.allowed_nodes.iter().cloned()),
            subscriptions.clone(),
            timeouts.request,
            config.discovery.warm_up_timeout,
        );
        let jobs = JobRunner::new(
            nodes.clone(),
            outbound.clone(),
            metrics.clone(),
            timeouts.request,
        );
        let following = Arc::new(Following {
            jobs: jobs.clone(),
            subscriptions: subscriptions.clone(),
            discovery: discovery.clone(),
            proxies: proxies.clone(),
            metrics: metrics.clone(),
            outbound: outbound.clone(),
        });
        let refusals = Arc::new(LogLimiter::default());
        let churn = Arc::new(Churn::default());
        let timing = Timing {
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            heartbeat_threshold_ms: config.node_heartbeat_threshold_ms,
            handshake: timeouts.handshake,
            request: timeouts.request,
            resync_interval_ms: config.resync_interval_ms,
        };
        let lifecycle = Lifecycle::new(
            nodes,
            timing,
            outbound.clone(),
            following,
            refusals.clone(),
            churn.clone(),
        );
        let log = Arc::new(LogControl::new(config.logging.level));
        let reloader = Reloader::new(
            config.clone(),
            tls.clone(),
            log.clone(),
            lifecycle.clone(),
            proxies.clone(),
        );
        let state_env = std::env::var_os("STATE_DIRECTORY");
        let drained = Arc::new(Drained::load(
            config.state_directory(state_env.as_deref()).as_deref(),
        ));
        Self {
            gate: Arc::new(Gate::new(timeouts.pre_auth)),
            drained,
            refusals,
            churn,
            log,
            metrics,
            subscriptions,
            monitors,
            discovery,
            proxies,
            jobs,
            outbound,
            lifecycle,
            reloader,
            tls,
            timeouts,
            config,
        }
    }
}

/// What a node's life means for the other parts (see the module docs).
impl Followers for Following {
    fn online<'a>(&'a self, session: &'a Arc<Session>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.subscriptions.node_online(session);
            self.discovery
                .node_online(session.node(), session.id(), &session.address());
            self.proxies.node_online(session).await;
            self.metrics.node_online(session);
            self.metrics.counters().registered();
        })
    }

    fn offline<'a>(&'a self, node: &'a NodeName, session_id: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The index marks the node's rows stale before the hub's
            // virtual offline events (which it ignores), then lets go.
            self.discovery.node_offline(node, session_id);
            self.subscriptions.node_offline(node, session_id);
            self.discovery.forget_watches(node);
            self.proxies.node_offline(node, session_id).await;
        })
    }

    fn refused(&self, reason: Option<RefuseReason>) {
        self.metrics.counters().refused(reason);
    }

    fn ended(&self, session_id: u64) -> BoxFuture<'_, ()> {
        Box::pin(self.jobs.end_session(session_id))
    }

    fn event<'a>(&'a self, session: &'a Session, event: Event) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match event {
                Event::JobStateChanged { job_id, state } => {
                    self.jobs.state_changed(session, job_id, &state).await
                }
                Event::JobDone { job_id, result } => self.jobs.done(session, job_id, &result).await,
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
                        .agent_job(self.outbound.get(), session.node(), &unit, &method, micros)
                        .await
                }
                Event::UnitPorts { unit, ports } => {
                    self.discovery
                        .set_ports(session.node(), session.id(), unit, ports)
                }
                event @ (Event::ResyncDigest(_) | Event::ResyncSnapshot { .. }) => {
                    self.subscriptions.on_resync(session, event)
                }
                event @ (Event::UnitHealth { .. }
                | Event::HealthSnapshot { .. }
                | Event::NodeHealth(_)) => {
                    if let Some(node) = self.subscriptions.on_health(session, event) {
                        session.set_system_state(&node.system_state);
                        tracing::info!(
                            node = %session.node(),
                            "node {} is {}{}{}",
                            session.node(),
                            node.state,
                            if node.reason.is_empty() { "" } else { ": " },
                            node.reason
                        );
                        // `io.drover.Node.Health`: what `droverctl status -w`
                        // refreshes on, as on a `Status` change.
                        if let Some(out) = self.outbound.get() {
                            let path = drover_bus::bluechi::node_path(session.node().as_str());
                            out.property_changed(
                                &path,
                                drover_bus::bluechi::DROVER_NODE_IFACE,
                                "Health",
                                node.state.as_str(),
                            )
                            .await;
                        }
                    }
                }
            }
        })
    }
}
