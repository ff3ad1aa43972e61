//! `io.drover.Node` at `/org/eclipse/bluechi/node/<name>`: drover's
//! additions to a node object (health), on an interface of their own so
//! BlueChi's `org.eclipse.bluechi.Node` stays exactly as BlueChi defines it.
//!
//! * `GetUnitHealth(s unit) → (s state, s reason, t since_usec)`: the unit's
//!   health as the node's agent last reported it (`none`, `starting`,
//!   `healthy`, `unhealthy`; `since_usec` realtime µs on the manager's
//!   clock, 0 for `none`). `none` for a unit that declares no check.
//! * `GetHealth() → (s state, s reason, t since_usec, s system_state,
//!   a(ssst) checks)`: the node's own health (systemd's `SystemState`, the
//!   node checks of its `agent.conf` as (name, state, reason, since_usec)).
//!
//! * `Health` (property, `s`): the node's own health state, as `GetHealth`
//!   says it (`starting` while online and not said yet), empty while the
//!   node is offline or unknown. A change is signalled
//!   (`PropertiesChanged`), which is what `droverctl status -w` refreshes on.
//!
//! The calls answer from what the manager holds (no request to the agent), and
//! fail with `org.eclipse.bluechi.Offline` while the node is offline: a
//! verdict nobody checks any more is not reported as current. A unit name
//! that is not one is `InvalidArgs`.

use crate::api::handles::Handles;
use crate::error::ApiError;
use crate::units::health::{HealthUnknown, usec};
use crate::units::hub::Subscriptions;
use drover_protocol::health::HealthState;
use drover_protocol::{NodeName, UnitName};
use std::sync::Arc;
use zbus::interface;

/// One node check in `GetHealth`: name, state, reason, since (µs).
pub type NodeCheckRow = (String, String, String, u64);

pub struct DroverNodeObject {
    subscriptions: Arc<Subscriptions>,
    name: NodeName,
}

impl DroverNodeObject {
    pub fn new(handles: &Handles, name: NodeName) -> Self {
        Self {
            subscriptions: handles.subscriptions.clone(),
            name,
        }
    }

    fn offline(&self) -> ApiError {
        ApiError::new(
            drover_protocol::error_names::OFFLINE,
            format!("node {} is offline", self.name),
        )
    }
}

#[interface(name = "io.drover.Node", introspection_docs = false)]
impl DroverNodeObject {
    /// See the module docs.
    #[zbus(property)]
    async fn health(&self) -> String {
        match self.subscriptions.node_health(&self.name) {
            Some(entry) => entry.state.as_str().to_owned(),
            None if self.subscriptions.is_online(&self.name) => {
                HealthState::Starting.as_str().to_owned()
            }
            None => String::new(),
        }
    }

    /// See the module docs.
    #[zbus(out_args("state", "reason", "since_usec"))]
    async fn get_unit_health(&self, unit: String) -> Result<(String, String, u64), ApiError> {
        let unit = UnitName::new(&unit).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        match self.subscriptions.unit_health(&self.name, &unit) {
            Ok((state, reason, since)) => Ok((state.as_str().to_owned(), reason, since)),
            Err(HealthUnknown::Offline | HealthUnknown::NeverConnected) => Err(self.offline()),
        }
    }

    /// See the module docs.
    #[zbus(out_args("state", "reason", "since_usec", "system_state", "checks"))]
    #[allow(clippy::type_complexity)]
    async fn get_health(
        &self,
    ) -> Result<(String, String, u64, String, Vec<NodeCheckRow>), ApiError> {
        let Some(entry) = self.subscriptions.node_health(&self.name) else {
            // Online but its agent has not said yet: unknown is reported as
            // `starting`, never as healthy.
            return if self.subscriptions.is_online(&self.name) {
                Ok((
                    HealthState::Starting.as_str().to_owned(),
                    String::new(),
                    0,
                    String::new(),
                    Vec::new(),
                ))
            } else {
                Err(self.offline())
            };
        };
        Ok((
            entry.state.as_str().to_owned(),
            entry.reason,
            usec(entry.since),
            entry.system_state,
            entry
                .checks
                .into_iter()
                .map(|(name, state, reason, since)| {
                    (name, state.as_str().to_owned(), reason, usec(since))
                })
                .collect(),
        ))
    }
}
