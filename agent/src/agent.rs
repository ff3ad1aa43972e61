//! Wiring: systemd connection → event subscription → READY → link loop.
//!
//! Order matters: the systemd event subscription exists before the first
//! request can arrive (so no job's removal is missed), and readiness is
//! announced once systemd answers — the manager may be down for a long time
//! and the node's own units must not wait for it.
//!
//! The agent stops when asked to (shutdown token) or when its systemd
//! connection is lost (an error: the service manager restarts it).

use crate::dispatch::{Shared, pump_events};
use crate::link::{Link, LinkConfig};
use crate::systemd::dbus::{ConnectError, ZbusSystemd};
use crate::systemd::{BusTarget, Systemd};
use drover_protocol::RemoteError;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("cannot subscribe to systemd's job signals: {0}")]
    Subscribe(RemoteError),
    #[error("lost the connection to systemd")]
    SystemdLost,
}

/// Runs the agent against the systemd on `bus` until `shutdown`.
/// `on_ready` is called once systemd answers and events are subscribed.
pub async fn run(
    bus: &BusTarget,
    link: LinkConfig,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    let systemd = ZbusSystemd::connect(bus).await?;
    tracing::info!("connected to systemd on {bus}");
    run_with(Arc::new(systemd), link, shutdown, on_ready).await
}

/// [`run`] with any [`Systemd`] (the fake in tests).
pub async fn run_with<S: Systemd>(
    systemd: Arc<S>,
    link: LinkConfig,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(),
) -> Result<(), AgentError> {
    let events = systemd.subscribe().await.map_err(AgentError::Subscribe)?;
    on_ready();
    let shared = Arc::new(Shared::default());
    let link = Link::new(link, systemd, shared.clone());
    tokio::select! {
        () = link.run(shutdown) => Ok(()),
        () = pump_events(events, shared) => Err(AgentError::SystemdLost),
    }
}
