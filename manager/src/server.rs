//! Starting and stopping a whole manager: its parts ([`crate::root`]), bus
//! connection, exported objects, bus name, agent listener, heartbeat timer.
//!
//! Start order matters: the objects are exported *before* the name
//! `org.eclipse.bluechi` is requested, so no client call can arrive at an
//! empty object tree; the listener starts once the name is owned, so an
//! agent's registration is always announced on the bus. Stop order is the
//! reverse: stop accepting, enter the `Stopping` phase, end every job with
//! `JobRemoved` (while the bus connection is still open), close the
//! sessions, announce the end state, release the name.
//!
//! With etcd keys (high availability, [`crate::ha`]) the manager starts as a
//! standby and its election runs on a thread of its own
//! ([`crate::ha::thread`]); `ManagerSeat` is what leading and standing by
//! do here, applied on the manager's runtime. A stop resigns first.

use crate::api;
use crate::api::handles::Handles;
use crate::discovery::Discovery;
use crate::fanout::limit::{FleetCalls, ListKind};
use crate::ha::election::Election;
use crate::ha::etcd::Etcd;
use crate::ha::seat::Seat;
use crate::ha::thread::ElectionThread;
use crate::job_runner::JobRunner;
use crate::logs::LogControl;
use crate::metrics::exposition::Live;
use crate::nodes::lifecycle::{Lifecycle, Phase};
use crate::nodes::link_stats::Disconnect;
use crate::nodes::listener::{Accept, accept_loop};
use crate::nodes::session::CLOSE_DEADLINE;
use crate::proxies::driver::Proxies;
use crate::reload::Reloader;
use crate::root::{Parts, Timeouts};
use crate::units::monitor::Monitors;
use drover_bus::Bus;
use drover_bus::bluechi::{BUS_NAME, CONTROLLER_PATH, DROVER_CONTROLLER_IFACE};
use drover_config::ManagerConfig;
use drover_metrics::{Exposition, http};
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zbus::Connection;

/// How long a starting manager waits behind the current owner of
/// [`BUS_NAME`]: the manager a restart replaces releases it as its connection
/// closes, which takes the bus daemon well under this.
pub const NAME_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot connect to {bus}: {source}")]
    Bus { bus: Bus, source: zbus::Error },
    #[error("cannot export the D-Bus objects: {0}")]
    Export(zbus::Error),
    #[error("cannot own the bus name {BUS_NAME}: {0}")]
    Name(drover_bus::name::NameError),
    #[error("cannot use the agent listener: {0}")]
    Listener(std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] drover_tls::Error),
    #[error("etcd's TLS (EtcdTLSCertificate, EtcdTLSPrivateKey, EtcdTLSCertificateAuthority): {0}")]
    EtcdTls(drover_tls::Error),
    #[error("cannot start the election's thread: {0}")]
    ElectionThread(std::io::Error),
    #[error("cannot listen for metrics on {addr} (MetricsListenAddress): {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub use crate::tls::load_tls;

/// A running manager. Dropping it without [`Manager::shutdown`] stops the
/// tasks but skips the orderly end of jobs.
pub struct Manager {
    parts: Parts,
    /// What the D-Bus objects work with (they and the outbound hold it
    /// weakly or by share; the manager keeps it alive).
    _handles: Arc<Handles>,
    conn: Connection,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    /// The election (HA only); ended and awaited first at shutdown, so
    /// the leader resigns before anything else stops.
    election: Option<ElectionThread>,
}

async fn connect(bus: &Bus) -> Result<Connection, StartError> {
    bus.connect().await.map_err(|source| StartError::Bus {
        bus: bus.clone(),
        source,
    })
}

impl Manager {
    /// Connects to `bus`, serves the API, owns the name, and starts
    /// accepting agents on `listener`. Must run inside a tokio runtime.
    pub async fn start(
        config: ManagerConfig,
        bus: &Bus,
        listener: std::net::TcpListener,
        timeouts: Timeouts,
    ) -> Result<Self, StartError> {
        let tls = load_tls(&config)?;
        let etcd_tls = config
            .ha
            .tls
            .as_ref()
            .map(drover_tls::settings::service_client_config)
            .transpose()
            .map_err(StartError::EtcdTls)?;
        let parts = Parts::build(config, timeouts, tls);
        let conn = connect(bus).await?;
        let handles = Arc::new(Handles {
            nodes: parts.lifecycle.nodes().clone(),
            jobs: parts.jobs.clone(),
            monitors: parts.monitors.clone(),
            metrics: parts.metrics.clone(),
            outbound: parts.outbound.clone(),
            proxies: parts.proxies.clone(),
            reloader: parts.reloader.clone(),
            subscriptions: parts.subscriptions.clone(),
            discovery: parts.discovery.clone(),
            log: parts.log.clone(),
            drained: parts.drained.clone(),
            log_target: parts.config.logging.target.as_str(),
            request: parts.timeouts.request,
            fanout: parts.timeouts.fanout,
            fleet_answer: parts.timeouts.fleet_answer,
            fleet_calls: Arc::new(FleetCalls::new(ListKind::Fleet, parts.timeouts.fleet_calls)),
            node_lists: Arc::new(FleetCalls::new(ListKind::Node, parts.timeouts.node_lists)),
        });
        api::export(&handles, &conn)
            .await
            .map_err(StartError::Export)?;
        // Every known node's object, through the port just set.
        parts.lifecycle.export_nodes().await;

        // One owner, never replaced (BlueChi allows replacement), a short wait
        // behind a manager on its way out (`drover_bus::name`).
        drover_bus::name::own(&conn, BUS_NAME, NAME_WAIT)
            .await
            .map_err(StartError::Name)?;

        listener
            .set_nonblocking(true)
            .map_err(StartError::Listener)?;
        let local_addr = listener.local_addr().map_err(StartError::Listener)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(StartError::Listener)?;
        crate::nodes::listener::warn_if_plaintext(&parts.config, local_addr);
        let accept = Arc::new(Accept {
            lifecycle: parts.lifecycle.clone(),
            gate: parts.gate.clone(),
            refusals: parts.refusals.clone(),
            tls: parts.tls.clone(),
            config: parts.config.clone(),
            handshake: parts.timeouts.handshake,
            churn: parts.churn.clone(),
        });
        let stop = CancellationToken::new();
        let metrics = match parts.config.metrics.listen {
            Some(addr) => Some(metrics_listener(&parts, addr).await?),
            None => None,
        };
        let metrics_addr = metrics.as_ref().map(|(addr, _, _)| *addr);
        let mut tasks = vec![
            tokio::spawn(accept_loop(accept, listener, stop.clone())),
            tokio::spawn(parts.lifecycle.clone().heartbeat_loop()),
            tokio::spawn(parts.proxies.clone().timer_loop()),
            tokio::spawn(parts.discovery.clone().run()),
        ];
        if let Some((addr, listener, exposition)) = metrics {
            tracing::info!("serving Prometheus metrics at http://{addr}/metrics");
            tasks.push(tokio::spawn(http::serve(
                listener,
                exposition,
                stop.clone(),
            )));
        }
        let election = if parts.config.ha.enabled() {
            start_election(&parts, &conn, local_addr, etcd_tls, stop.clone())
                .map_err(StartError::ElectionThread)?
        } else {
            None
        };
        tracing::info!(
            "serving {BUS_NAME} with {} allowed node(s); agents connect to {local_addr}{}",
            parts.lifecycle.nodes().registry().total(),
            if parts.tls.is_some() {
                " over mutual TLS"
            } else {
                ""
            }
        );
        Ok(Self {
            parts,
            _handles: handles,
            conn,
            stop,
            tasks,
            local_addr,
            metrics_addr,
            election,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/metrics` is served (`MetricsListenAddress=`), if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The node lifecycle (the node table, the counts `STATUS=` shows).
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.parts.lifecycle
    }

    pub fn jobs(&self) -> &Arc<JobRunner> {
        &self.parts.jobs
    }

    pub fn monitors(&self) -> &Arc<Monitors> {
        &self.parts.monitors
    }

    /// Reloads (SIGHUP, `io.drover.Controller.Reload`).
    pub fn reloader(&self) -> &Arc<Reloader> {
        &self.parts.reloader
    }

    /// The log level in force (`SetLogLevel`, reloads).
    pub fn log(&self) -> &Arc<LogControl> {
        &self.parts.log
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Resolves when the bus connection is gone (the bus daemon died or
    /// dropped us). Nothing reconnects it: clients can no longer reach this
    /// manager and the name `org.eclipse.bluechi` is lost with the
    /// connection, so the process exits with a failure status and its unit
    /// (`Restart=on-failure`) starts a fresh manager that owns the name on
    /// the bus as it is now (docs/dev/architecture.md, "Processes").
    pub async fn bus_lost(&self) {
        self.conn.closed().await;
    }

    /// Resolves if the bus says this manager lost `org.eclipse.bluechi`
    /// (`drover_bus::name::lost`); the process then exits with a failure status
    /// and its unit restarts it.
    pub fn name_lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        drover_bus::name::lost(self.conn.clone(), BUS_NAME)
    }

    /// Orderly stop (SIGTERM): see the module docs for the order.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        // A leader resigns first (its election revokes the lease within a
        // call's deadline), so a standby takes over without waiting a TTL.
        if let Some(election) = self.election.take()
            && !election.resign(RESIGN_WAIT).await
        {
            tracing::warn!("the election did not end within {RESIGN_WAIT:?}");
        }
        // Ends every job and every session. Jobs get `JobRemoved` with
        // `cancelled due to shutdown` before the bus connection closes; each
        // node's `Status` goes `offline`; `Controller.Status` is announced
        // once, at the end (`down`), not at each threshold crossed on the way
        // (`degraded` first), as BlueChi's controller signals its shutdown.
        let lifecycle = &self.parts.lifecycle;
        lifecycle.enter(Phase::Stopping);
        self.parts.jobs.end_all().await;
        let sessions = lifecycle
            .end_all_sessions(Disconnect::Shutdown, "the manager is shutting down")
            .await;
        lifecycle.announce_controller().await;
        // Every agent sees its link end cleanly (TLS: `close_notify`), not
        // cut by the process's exit; each writer bounds its own close.
        let closing = sessions
            .iter()
            .map(|s| tokio::time::timeout(CLOSE_DEADLINE, s.closed()));
        futures::future::join_all(closing).await;
        let tasks: Vec<_> = self.tasks.drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // An aborted task lets go of what it owns (the agents' and the
        // metrics listeners) only once it is dropped, at its next poll: wait
        // for that, so the ports are free when `shutdown` returns and a
        // manager started right after (in the same process) can bind them.
        for task in tasks {
            let _ = task.await;
        }
        if let Err(e) = self.conn.release_name(BUS_NAME).await {
            tracing::debug!("releasing {BUS_NAME}: {e}");
        }
        tracing::info!("manager stopped");
    }
}

/// Binds the metrics endpoint at `addr` and builds what it serves.
async fn metrics_listener(
    parts: &Parts,
    addr: SocketAddr,
) -> Result<(SocketAddr, tokio::net::TcpListener, Arc<Exposition>), StartError> {
    let failed = |source| StartError::Metrics { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    let live = Live {
        lifecycle: parts.lifecycle.clone(),
        jobs_in_flight: {
            let jobs = parts.jobs.clone();
            Box::new(move || jobs.table().len())
        },
        monitors: parts.monitors.clone(),
        gate: parts.gate.clone(),
        subscriptions: parts.subscriptions.clone(),
        proxies: parts.proxies.stats(),
        per_node: parts.config.metrics.per_node,
    };
    let exposition = Arc::new(crate::metrics::exposition::exposition(
        parts.metrics.counters(),
        live,
    ));
    Ok((bound, listener, exposition))
}

/// How long a stopping manager waits for its election to resign.
const RESIGN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Starts the election of an HA manager on its thread (`None` when the
/// etcd settings name nothing to dial, which the config check already
/// refuses).
fn start_election(
    parts: &Parts,
    conn: &Connection,
    local_addr: SocketAddr,
    etcd_tls: Option<Arc<rustls::ClientConfig>>,
    stop: CancellationToken,
) -> std::io::Result<Option<ElectionThread>> {
    let Some(fence) = parts.lifecycle.nodes().fence().cloned() else {
        return Ok(None);
    };
    let ha = &parts.config.ha;
    let seat = Arc::new(ManagerSeat {
        lifecycle: parts.lifecycle.clone(),
        conn: conn.clone(),
        proxies: parts.proxies.clone(),
        discovery: parts.discovery.clone(),
        warm_up: parts.config.discovery.warm_up_timeout,
    });
    let election = Election {
        etcd: Etcd::new(ha.endpoints.clone(), etcd_tls),
        key: ha.leader_key().into_bytes(),
        me: leader_name(&host_name(), local_addr),
        ttl_s: ha.lease_ttl_s,
        fence,
    };
    tracing::info!(
        "campaigning for {} on etcd ({}), lease {} s",
        ha.leader_key(),
        ha.endpoints
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        ha.lease_ttl_s
    );
    ElectionThread::start(election, seat, stop).map(Some)
}

/// What this manager is called in the leader key, which standbys and
/// `droverctl` show: the address it listens on when that is one address
/// (what the agents' `ControllerHost=` lists name, and distinct for two
/// managers on one host), else this host's name; with the agent port.
fn leader_name(host: &str, local_addr: SocketAddr) -> String {
    if local_addr.ip().is_unspecified() {
        format!("{host}:{}", local_addr.port())
    } else {
        local_addr.to_string()
    }
}

/// This host's name as the kernel has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What leading means for this manager (see [`Seat`]).
struct ManagerSeat {
    lifecycle: Arc<Lifecycle>,
    conn: Connection,
    proxies: Proxies,
    discovery: Arc<Discovery>,
    warm_up: std::time::Duration,
}

impl ManagerSeat {
    /// `PropertiesChanged` of `Leading`, `Epoch` and `Leader`.
    async fn announce(&self) {
        let nodes = self.lifecycle.nodes();
        let leading = nodes.phase() == Phase::Leading;
        let epoch = nodes.fence().map_or(0, |f| f.epoch());
        let leader = nodes.fence().and_then(|f| f.leader()).unwrap_or_default();
        let Ok(emitter) = zbus::object_server::SignalEmitter::new(&self.conn, CONTROLLER_PATH)
        else {
            return;
        };
        let Ok(iface) = zbus::names::InterfaceName::try_from(DROVER_CONTROLLER_IFACE) else {
            return;
        };
        let changed = std::collections::HashMap::from([
            ("Leading", zbus::Variant::from(leading)),
            ("Epoch", zbus::Variant::from(epoch)),
            ("Leader", zbus::Variant::from(leader)),
        ]);
        if let Err(e) = zbus::fdo::Properties::properties_changed(
            &emitter,
            iface,
            changed,
            std::borrow::Cow::Borrowed(&[]),
        )
        .await
        {
            tracing::debug!("cannot announce the leadership: {e}");
        }
    }
}

impl Seat for ManagerSeat {
    fn lead(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // A new leader knows what a restarted manager knows: the
            // warm-up starts again before the first agent is admitted.
            self.discovery.restart_warm_up();
            self.proxies.restart_warm_up(self.warm_up).await;
            self.lifecycle.enter(Phase::Leading);
            self.lifecycle.announce_controller().await;
            self.announce().await;
        })
    }

    fn stand_by<'a>(&'a self, why: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.lifecycle.enter(Phase::Standby);
            self.announce().await;
            // Agents reconnect and find the leader; their units keep running.
            let sessions = self
                .lifecycle
                .end_all_sessions(
                    Disconnect::Standby,
                    &format!("this manager no longer leads: {why}"),
                )
                .await;
            let closing = sessions
                .iter()
                .map(|s| tokio::time::timeout(CLOSE_DEADLINE, s.closed()));
            futures::future::join_all(closing).await;
            self.lifecycle.announce_controller().await;
        })
    }

    fn saw_leader(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.announce())
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        // The election first, so it ends without resigning (as the tasks
        // end without their orderly stop).
        self.election = None;
        self.stop.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::leader_name;

    #[test]
    fn a_manager_on_one_address_is_named_by_it_else_by_its_host() {
        let named = |addr: &str| leader_name("mgr-a", addr.parse().expect("an address"));
        assert_eq!(named("0.0.0.0:842"), "mgr-a:842");
        assert_eq!(named("[::]:842"), "mgr-a:842");
        assert_eq!(named("127.0.0.2:842"), "127.0.0.2:842");
        assert_eq!(named("[fd00::7]:842"), "[fd00::7]:842");
    }
}
