//! Wiring: systemd connection → event subscription → READY → link loop.
//!
//! Order matters: the systemd event subscription and the unit stream exist
//! before the first request can arrive (so no job's removal is missed), and
//! readiness is
//! announced once systemd answers — the manager may be down for a long time
//! and the node's own units must not wait for it.
//!
//! The local `org.eclipse.bluechi.Agent` API ([`crate::api`]) is served on
//! the systemd bus before readiness, so a proxy unit ordered after the agent
//! finds it.
//!
//! The metrics endpoint (`crate::exposition`, when `MetricsListenAddress=`
//! is set) listens from the start, so a taken port fails the start; it
//! closes when the agent stops.
//!
//! Health (`crate::health`) starts with the local API, before the link
//! dials: the node checks, and every running unit's declaration (a unit that
//! declares health starts the unit stream), so the first session's snapshot
//! is complete.
//!
//! The agent stops when asked to (shutdown token) or when its systemd
//! connection is lost (an error: the service manager restarts it). A clean
//! stop closes the proxies first (see [`crate::proxies::registry`]), then the link.

use crate::connection::{Link, LinkConfig};
use crate::fanout::{pump_events, start_units};
use crate::state::Shared;
use crate::systemd::api::Systemd;
use crate::systemd::dbus::{ConnectError, ZbusSystemd};
use drover_bus::Bus;
use drover_config::health::CheckSpec;
use drover_config::logging::LoggingConfig;
use drover_protocol::RemoteError;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("cannot subscribe to systemd's job signals: {0}")]
    Subscribe(RemoteError),
    #[error("cannot start systemd's unit signal stream: {0}")]
    UnitStream(RemoteError),
    #[error("lost the connection to systemd")]
    SystemdLost,
    #[error(
        "lost the bus name org.eclipse.bluechi.Agent: the proxy helper no longer reaches this agent"
    )]
    NameLost,
    #[error("cannot serve the local API: {0}")]
    Api(#[from] crate::api::ServeError),
    #[error("cannot listen for metrics on {addr} (MetricsListenAddress): {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Runs the agent against the systemd on `bus` until `shutdown`.
/// `on_ready` is called once systemd answers and events are subscribed.
pub async fn run(
    bus: &Bus,
    link: LinkConfig,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    run_configured(
        bus,
        link,
        &LoggingConfig::default(),
        Vec::new(),
        None,
        shutdown,
        on_ready,
    )
    .await
}

/// [`run`], with the logging settings the local API shows, the node
/// checks of `agent.conf` and where to serve metrics
/// (`MetricsListenAddress=`; `None`: no listener); the local
/// `org.eclipse.bluechi.Agent` API is served on `bus` before `on_ready`,
/// and the metrics endpoint listens before it too.
pub async fn run_configured(
    bus: &Bus,
    link: LinkConfig,
    logging: &LoggingConfig,
    node_checks: Vec<(String, CheckSpec)>,
    metrics: Option<SocketAddr>,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    let systemd = ZbusSystemd::connect(bus).await?;
    tracing::info!("connected to systemd on {bus}");
    let api_bus = systemd.connection().clone();
    let ended = run_inner(
        Arc::new(systemd),
        Some(api_bus.clone()),
        link,
        logging,
        node_checks,
        metrics,
        shutdown,
        on_ready,
    )
    .await;
    // The signal readers hold the connection for as long as it is open:
    // closing it ends them and gives the bus name back at once (a next
    // agent in the same process, as in tests, can then take it).
    if let Err(e) = api_bus.close().await {
        tracing::debug!("closing the bus connection: {e}");
    }
    ended
}

/// [`run`] with any [`Systemd`] (the fake in tests), without the local API.
pub async fn run_with<S: Systemd>(
    systemd: Arc<S>,
    link: LinkConfig,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    let logging = LoggingConfig::default();
    run_inner(
        systemd,
        None,
        link,
        &logging,
        Vec::new(),
        None,
        shutdown,
        on_ready,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn run_inner<S: Systemd>(
    systemd: Arc<S>,
    api_bus: Option<zbus::Connection>,
    link: LinkConfig,
    logging: &LoggingConfig,
    node_checks: Vec<(String, CheckSpec)>,
    metrics: Option<SocketAddr>,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    let events = systemd.subscribe().await.map_err(AgentError::Subscribe)?;
    let shared = Arc::new(Shared::default());
    // Bound now, so a port taken fails the start before READY=1.
    let metrics_stop = CancellationToken::new();
    let _metrics_stop = metrics_stop.clone().drop_guard();
    if let Some(addr) = metrics {
        let failed = |source| AgentError::Metrics { addr, source };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
        let bound = listener.local_addr().map_err(failed)?;
        tracing::info!("serving Prometheus metrics at http://{bound}/metrics");
        tokio::spawn(drover_metrics::http::serve(
            listener,
            Arc::new(crate::exposition::exposition(&shared)),
            metrics_stop,
        ));
    }
    // From the start, so the fence works for every dep start and a start's
    // cost never depends on whether anything was ever watched.
    start_units(&systemd, &shared)
        .await
        .map_err(AgentError::UnitStream)?;
    shared.deps.set_node(link.node.clone());
    shared.status.set_log_level(logging.level.as_str());
    shared.status.set_log_target(logging.target.as_str());
    shared.status.set_controller(&link.host, link.port);
    let served = match &api_bus {
        Some(conn) => {
            let served = crate::api::serve(conn, shared.clone()).await?;
            crate::health::api::serve(conn, shared.clone())
                .await
                .map_err(crate::api::ServeError::Export)?;
            Some(served)
        }
        None => None,
    };
    // Never headless: losing the local API's name ends the agent.
    let name_lost = async {
        match served.as_ref().map(crate::api::Served::lost) {
            Some(lost) => lost.await,
            None => std::future::pending().await,
        }
    };
    if let Some(conn) = &api_bus {
        start_health(&shared, conn.clone(), node_checks).await;
    }
    on_ready();
    adopt_proxies(&*systemd, &shared).await;
    let link = Link::new(link, systemd.clone(), shared.clone());
    // On shutdown the proxies go first, while the link can still tell the
    // manager and the local API still answers their ExecStop.
    let link_stop = CancellationToken::new();
    let close = async {
        shutdown.cancelled().await;
        close_proxies(&shared);
        link_stop.cancel();
        std::future::pending::<()>().await
    };
    let ended = tokio::select! {
        () = link.run(link_stop.clone()) => Ok(()),
        () = pump_events(events, shared.clone(), systemd.clone()) => Err(AgentError::SystemdLost),
        () = shared.proxies.run_stopper(&*systemd) => Ok(()),
        () = close => Ok(()),
        () = name_lost => Err(AgentError::NameLost),
    };
    // Health's tasks that hold the bus connection end now.
    shared.health.stop();
    // The next agent (a restart) owns the name at once, not when this
    // process's connection is gone.
    if let Some(served) = &served {
        served.release().await;
    }
    ended
}

/// Health: node checks now; unit health once a unit declares some, on the
/// unit hub's stream, which it may start (`crate::health::driver::start`).
async fn start_health(
    shared: &Arc<Shared>,
    conn: zbus::Connection,
    node_checks: Vec<(String, CheckSpec)>,
) {
    // The hook health calls once a unit declares something: the unit
    // stream then follows every unit's state (a hold of `*` at
    // `Scope::State`, `crate::units::following`: systemd's other
    // interfaces stay off the agent's socket), and health sees each unit's
    // activity. Weak: the hook lives in the agent's state, which the bus's
    // object server holds.
    let weak = Arc::downgrade(shared);
    let follow: crate::health::table::Follow = Box::new(move || {
        let weak = weak.clone();
        Box::pin(async move {
            let Some(shared) = weak.upgrade() else {
                return Err("the agent is stopping".to_owned());
            };
            shared
                .units
                .hold_caught_up(None, drover_protocol::Scope::State)
                .await
                .map_err(|e| e.to_string())?;
            shared.health.set_holding();
            Ok(())
        })
    });
    crate::health::driver::start(shared, conn, node_checks, follow).await;
    tracing::info!(
        "health: {} unit(s) declare a check{}",
        shared.health.len(),
        if shared.health.holding() {
            ""
        } else {
            " (units are read as they start)"
        }
    );
}

/// Proxy units left active by a previous agent process (one that crashed)
/// are followed again (see [`crate::proxies::registry::Proxies::adopt`]).
async fn adopt_proxies<S: Systemd>(systemd: &S, shared: &Shared) {
    let units = match systemd.list_units().await {
        Ok(units) => units,
        Err(e) => {
            tracing::warn!("cannot look for proxy units left by an earlier agent: {e}");
            return;
        }
    };
    for unit in units.iter().filter(|u| u.active_state == "active") {
        if let Some(key) = crate::proxies::registry::ProxyKey::from_unit_name(&unit.name) {
            shared.proxies.adopt(key, &shared.outbox);
        }
    }
}

/// Clean shutdown of the proxies: waiting ones fail; active ones keep their
/// units running, for the next agent to adopt (see [`crate::proxies::registry`]; BlueChi
/// stops them, which takes down every unit bound to a proxy on a mere
/// `systemctl restart` of the agent).
fn close_proxies(shared: &Shared) {
    let kept = shared.proxies.shutdown(&shared.outbox);
    if !kept.is_empty() {
        let names: Vec<&str> = kept.iter().map(|u| u.as_str()).collect();
        tracing::info!(
            "leaving {} active proxy unit(s) running for the next agent: {}",
            kept.len(),
            names.join(", ")
        );
    }
}
