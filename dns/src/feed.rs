//! The manager as a [`Source`]: `io.drover.Controller.Where(unit,
//! {healthy: true})` on the manager's bus (the system bus, `--user` or
//! `--bus ADDRESS`, as droverctl chooses).
//!
//! The connection is made when first needed and dropped when a call fails
//! for a reason that may be the connection's (the bus went away, the call
//! timed out), so the next fetch connects afresh: drover-dns outlives a
//! restart of the bus or of the manager and serves stale answers meanwhile.
//! A `Where` row this program does not need (state, health, stale, drained)
//! is filtered by the manager (`healthy=true`; stale and drained rows are
//! left out by default), so only node, address and ports are kept.

use crate::source::{Answer, Row, Source, SourceError};
use drover_bus::bus::Bus;
use drover_bus::client::{DroverControllerProxy, WhereTuple};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::Mutex;
use zbus::Connection;

/// `Where` over D-Bus.
pub struct Feed {
    bus: Bus,
    timeout: Duration,
    connection: Mutex<Option<Connection>>,
}

impl Feed {
    /// Calls on `bus`, each bounded by `timeout`.
    pub fn new(bus: Bus, timeout: Duration) -> Self {
        Self {
            bus,
            timeout,
            connection: Mutex::new(None),
        }
    }

    async fn connection(&self) -> Result<Connection, SourceError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .bus
            .builder()
            .method_timeout(self.timeout)
            .build()
            .await
            .map_err(|e| SourceError(format!("cannot connect to {}: {e}", self.bus)))?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn forget(&self) {
        *self.connection.lock().await = None;
    }
}

/// Rows as DNS needs them.
pub fn rows(rows: Vec<WhereTuple>) -> Vec<Row> {
    rows.into_iter()
        .map(|(node, _, _, _, address, _, _, _, ports)| Row {
            node,
            address,
            ports,
        })
        .collect()
}

impl Source for Feed {
    async fn lookup(&self, unit: &str) -> Result<Answer, SourceError> {
        let connection = self.connection().await?;
        let proxy = DroverControllerProxy::new(&connection)
            .await
            .map_err(|e| SourceError(e.to_string()))?;
        let mut options = HashMap::new();
        options.insert("healthy", zbus::Variant::from(true));
        match proxy.where_(unit, options).await {
            Ok((found, complete)) => Ok(Answer {
                rows: rows(found),
                complete,
            }),
            Err(e) => {
                // A method error (the manager said no) leaves the connection
                // sound; anything else may not have.
                if !matches!(e, zbus::Error::MethodError(..)) {
                    self.forget().await;
                }
                Err(SourceError(format!("Where({unit}): {e}")))
            }
        }
    }
}
