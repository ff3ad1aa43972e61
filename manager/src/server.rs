//! Starting and stopping a whole manager: bus connection, exported objects,
//! bus name, agent listener, heartbeat timer.
//!
//! Start order matters: the objects are exported *before* the name
//! `org.eclipse.bluechi` is requested, so no client call can arrive at an
//! empty object tree; the listener starts once the name is owned, so an
//! agent's registration is always announced on the bus. Stop order is the
//! reverse: stop accepting, end every job with `JobRemoved` (while the bus
//! connection is still open), close the sessions, release the name.

use crate::api;
use crate::core::{Core, Timeouts};
use crate::nodes::listener::accept_loop;
use drover_bus::Bus;
use drover_bus::bluechi::BUS_NAME;
use drover_config::ManagerConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zbus::Connection;
use zbus::fdo::{RequestNameFlags, RequestNameReply};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot connect to {bus}: {source}")]
    Bus { bus: Bus, source: zbus::Error },
    #[error("cannot export the D-Bus objects: {0}")]
    Export(zbus::Error),
    #[error("cannot own the bus name {BUS_NAME}: {0}")]
    Name(String),
    #[error("cannot use the agent listener: {0}")]
    Listener(std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] drover_tls::Error),
}

pub use crate::tls::load_tls;

/// A running manager. Dropping it without [`Manager::shutdown`] stops the
/// tasks but skips the orderly end of jobs.
pub struct Manager {
    core: Arc<Core>,
    conn: Connection,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    local_addr: SocketAddr,
}

async fn connect(bus: &Bus) -> Result<Connection, StartError> {
    bus.connect().await.map_err(|source| StartError::Bus {
        bus: bus.clone(),
        source,
    })
}

/// Resolves when the bus daemon tells us we lost `org.eclipse.bluechi`
/// (zbus matches `NameLost` on the sender `org.freedesktop.DBus` exactly,
/// so no other client can send it). drover requests the name without
/// `AllowReplacement`, so this does not happen while the connection lives;
/// if it ever does, the manager must not run on headless: its caller exits.
async fn name_lost(conn: Connection) {
    use futures::StreamExt;
    let lost = async {
        let proxy = zbus::fdo::DBusProxy::new(&conn).await?;
        let mut lost = proxy.receive_name_lost().await?;
        while let Some(signal) = lost.next().await {
            if signal.args().is_ok_and(|a| a.name.as_str() == BUS_NAME) {
                return Ok(());
            }
        }
        Err(zbus::Error::Failure("the bus connection closed".into()))
    };
    if let Err(e) = lost.await {
        tracing::debug!("not watching {BUS_NAME}: {e}");
        std::future::pending::<()>().await;
    }
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
        let core = Core::new(config, timeouts, tls);
        let conn = connect(bus).await?;
        api::export(&core, &conn)
            .await
            .map_err(StartError::Export)?;

        // One owner, never replaced (BlueChi allows replacement): another
        // process that took the name would leave this manager running with
        // no client able to reach it. Never wait in the queue either.
        let flags = RequestNameFlags::DO_NOT_QUEUE;
        match conn.request_name_with_flags(BUS_NAME, flags).await {
            Ok(RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner) => {}
            Ok(other) => {
                return Err(StartError::Name(format!(
                    "the bus answered {other:?}: another process owns it"
                )));
            }
            Err(zbus::Error::NameTaken) => {
                return Err(StartError::Name(
                    "another process owns it (drover never takes the name over)".to_owned(),
                ));
            }
            Err(e) => return Err(StartError::Name(e.to_string())),
        }

        listener
            .set_nonblocking(true)
            .map_err(StartError::Listener)?;
        let local_addr = listener.local_addr().map_err(StartError::Listener)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(StartError::Listener)?;
        crate::nodes::listener::warn_if_plaintext(core.config(), local_addr);
        let stop = CancellationToken::new();
        let tasks = vec![
            tokio::spawn(accept_loop(core.clone(), listener, stop.clone())),
            tokio::spawn(core.clone().heartbeat_loop()),
            tokio::spawn(core.proxies().clone().timer_loop()),
        ];
        tracing::info!(
            "serving {BUS_NAME} with {} allowed node(s); agents connect to {local_addr}{}",
            core.registry().total(),
            if core.tls().is_some() {
                " over mutual TLS"
            } else {
                ""
            }
        );
        Ok(Self {
            core,
            conn,
            stop,
            tasks,
            local_addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn core(&self) -> &Arc<Core> {
        &self.core
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
    /// (`name_lost` in this module); the process then exits with a failure status
    /// and its unit restarts it.
    pub fn name_lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        name_lost(self.conn.clone())
    }

    /// Orderly stop (SIGTERM): see the module docs for the order.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        self.core.shutdown().await;
        for task in self.tasks.drain(..) {
            task.abort();
        }
        if let Err(e) = self.conn.release_name(BUS_NAME).await {
            tracing::debug!("releasing {BUS_NAME}: {e}");
        }
        tracing::info!("manager stopped");
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}
