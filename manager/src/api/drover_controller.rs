//! `io.drover.Controller` at `/org/eclipse/bluechi`: drover's additions to the
//! controller object, on an interface of their own so BlueChi's
//! `org.eclipse.bluechi.Controller` stays exactly as BlueChi defines it.
//!
//! `Reload()` is what the shipped unit's `ExecReload=` calls
//! (`drover-manager --reload`): it returns once the configuration is
//! applied, or fails with the reason and keeps the running one. Root only
//! on the system bus (the D-Bus policy); the method itself also refuses any
//! caller that is neither root nor the manager's own user (a session bus).
//!
//! `ListHealth()` and `ListNodeHealth()` list the health the agents report
//! (`crate::units::health`). `Where(unit, options)` answers from the unit
//! index (`crate::discovery`): bad arguments are `InvalidArgs` and change
//! nothing, an answer too large for one message is `LimitsExceeded`.
//!
//! `Drain(node, units)` and `Undrain(node, units)` take a node, or units on
//! it, out of service and back (`crate::discovery::drain`); like `Reload`
//! they are root-only by the D-Bus policy and refuse any caller that is
//! neither root nor the manager's own user. A node may be drained when the
//! manager knows it or would admit it (`AllowedNodeNames`, its patterns,
//! `AllowCertifiedNodes`), online or not; any other name is `InvalidArgs`.
//! `ListDrained()` is open to the readers' group. All three are refused on
//! a standby (`io.drover.NotLeader`), as BlueChi's calls are.

use crate::api::handles::Handles;
use crate::discovery::drain::{DrainError, Drained};
use crate::discovery::query::{Options, WhereRow};
use crate::discovery::{Discovery, WhereError};
use crate::error::ApiError;
use crate::nodes::lifecycle::{Nodes, Phase};
use crate::proxies::driver::Proxies;
use crate::reload::{ReloadError, Reloader, reload_from_source};
use crate::units::health::{HealthRow, NodeHealthRow};
use crate::units::hub::Subscriptions;
use drover_bus::client::ProxyTuple;
use drover_protocol::error_names::{ACCESS_DENIED, LIMITS_EXCEEDED};
use drover_protocol::{NodeName, UnitName};
use std::collections::HashMap;
use std::sync::Arc;
use zbus::message::Header;
use zbus::names::BusName;
use zbus::{Connection, interface};

pub struct DroverControllerObject {
    proxies: Proxies,
    reloader: Arc<Reloader>,
    subscriptions: Arc<Subscriptions>,
    nodes: Arc<Nodes>,
    drained: Arc<Drained>,
    discovery: Arc<Discovery>,
    /// The most bytes an answer's body may take.
    max_body: usize,
}

impl DroverControllerObject {
    pub fn new(handles: &Handles) -> Self {
        Self {
            proxies: handles.proxies.clone(),
            reloader: handles.reloader.clone(),
            subscriptions: handles.subscriptions.clone(),
            nodes: handles.nodes.clone(),
            drained: handles.drained.clone(),
            discovery: handles.discovery.clone(),
            max_body: handles.fleet_answer,
        }
    }
}

#[interface(name = "io.drover.Controller", introspection_docs = false)]
impl DroverControllerObject {
    /// Every cross-node dependency the manager tracks, ordered by target
    /// (node, unit) then requesting node: (requesting node, target node,
    /// unit, proxy state `waiting`/`active`/`failed`, target active state as
    /// last known or `unknown`, number of live references on the target).
    #[zbus(out_args("proxies"))]
    async fn list_proxies(&self) -> Vec<ProxyTuple> {
        self.proxies.list().await
    }

    /// The health of every unit that declares a check, on every online node,
    /// sorted by (node, unit): (node, unit, state `starting`/`healthy`/
    /// `unhealthy`, reason, since as realtime µs). From what the manager
    /// holds: no request to any agent.
    #[zbus(out_args("units"))]
    async fn list_health(&self) -> Vec<HealthRow> {
        self.subscriptions.list_health()
    }

    /// The health of every online node that reported it, sorted by node:
    /// (node, state, reason, since as realtime µs, systemd's `SystemState`).
    #[zbus(out_args("nodes"))]
    async fn list_node_health(&self) -> Vec<NodeHealthRow> {
        self.subscriptions.list_node_health()
    }

    /// Where `unit` runs: one row per node (node, active state, sub state,
    /// health, address, since as realtime µs, stale, drained, ports) and
    /// whether the answer is complete (false while the manager warms up
    /// after a start). By default the nodes where the unit is active or
    /// reloading, not stale, not drained; options (a{sv}): `healthy` (b),
    /// `stale` (b), `drained` (b), `all` (b), `nodes` (s, a node name or
    /// pattern). See docs/discovery.md.
    #[zbus(name = "Where", out_args("rows", "complete"))]
    async fn where_(
        &self,
        unit: String,
        options: HashMap<String, zbus::OwnedVariant>,
    ) -> Result<(Vec<WhereRow>, bool), ApiError> {
        self.nodes.serving()?;
        let unit =
            UnitName::new(unit.as_str()).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        let options = Options::parse(&options).map_err(ApiError::invalid_args)?;
        self.discovery
            .find(&unit, &options, self.max_body, &self.drained)
            .await
            .map_err(|e| match e {
                WhereError::TooLarge { rows } => ApiError::new(
                    LIMITS_EXCEEDED,
                    format!(
                        "the answer does not fit in one message (more than {rows} rows); \
                         narrow it with the 'nodes' option"
                    ),
                ),
            })
    }

    /// Loads the configuration again, as `SIGHUP` does, and returns once it
    /// is applied (see [`crate::reload`]).
    async fn reload(
        &self,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<(), ApiError> {
        root_or_self(conn, &header, "Reload").await?;
        match reload_from_source(&self.reloader).await {
            Ok(_) => Ok(()),
            Err(e @ (ReloadError::NoSource | ReloadError::Config(_))) => {
                Err(ApiError::failed(e.to_string()))
            }
        }
    }

    /// Takes `node`, or `units` on it (empty: the whole node), out of
    /// service: left out of `Where` and DNS answers, shown as drained;
    /// nothing is stopped. Saved before it returns.
    async fn drain(
        &self,
        node: String,
        units: Vec<String>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<(), ApiError> {
        self.nodes.serving()?;
        root_or_self(conn, &header, "Drain").await?;
        let (node, units) = self.drain_args(&node, &units)?;
        let added = self
            .drained
            .drain(&node, &units)
            .await
            .map_err(drain_error)?;
        tracing::info!("drained {}: {added} new", what(&node, &units));
        Ok(())
    }

    /// Puts `units` on `node` back in service, or everything drained on
    /// the node (itself and its units) when `units` is empty. A unit of a
    /// node drained as a whole stays drained until the node is undrained.
    async fn undrain(
        &self,
        node: String,
        units: Vec<String>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<(), ApiError> {
        self.nodes.serving()?;
        root_or_self(conn, &header, "Undrain").await?;
        let (node, units) = self.drain_args(&node, &units)?;
        let removed = self
            .drained
            .undrain(&node, &units)
            .await
            .map_err(drain_error)?;
        tracing::info!(
            "undrained {}: {removed} entries removed",
            what(&node, &units)
        );
        Ok(())
    }

    /// Everything drained, sorted: (node, unit), unit `""` for a node
    /// drained as a whole.
    #[zbus(out_args("drained"))]
    async fn list_drained(&self) -> Result<Vec<(String, String)>, ApiError> {
        self.nodes.serving()?;
        Ok(self.drained.list())
    }

    /// Whether this manager leads: always true for a manager alone; with
    /// high availability, while its etcd lease is proven (docs/ha.md).
    /// Read on the clock, so a manager paused past its lease says false at
    /// once.
    #[zbus(property)]
    fn leading(&self) -> bool {
        self.nodes.phase() == Phase::Leading
    }

    /// The leadership epoch this manager last won or saw (the etcd leader
    /// key's creation revision); 0 for a manager alone.
    #[zbus(property)]
    fn epoch(&self) -> u64 {
        self.nodes.fence().map_or(0, |f| f.epoch())
    }

    /// Who leads as far as this manager knows: the leader key's value in
    /// etcd (`HOST:PORT`, the leader's host name and agent port; this
    /// manager's own while it leads); `""` for a manager alone or while no
    /// leader is known. Signalled with `Leading` and `Epoch` when any of
    /// them changes.
    #[zbus(property)]
    fn leader(&self) -> String {
        self.nodes
            .fence()
            .and_then(|f| f.leader())
            .unwrap_or_default()
    }
}

impl DroverControllerObject {
    /// The arguments of `Drain`/`Undrain`, checked: a node name the
    /// manager knows or would admit, at most
    /// [`crate::discovery::drain::MAX_UNITS_PER_CALL`] valid unit names.
    fn drain_args(
        &self,
        node: &str,
        units: &[String],
    ) -> Result<(NodeName, Vec<UnitName>), ApiError> {
        let node = NodeName::new(node).map_err(|e| ApiError::invalid_args(e.to_string()))?;
        let admitted = {
            let registry = self.nodes.registry();
            registry.get(node.as_str()).is_some() || registry.policy().allows(&node, true)
        };
        if !admitted {
            return Err(ApiError::invalid_args(format!(
                "node '{node}' is not a node this manager admits (AllowedNodeNames)"
            )));
        }
        if units.len() > crate::discovery::drain::MAX_UNITS_PER_CALL {
            return Err(drain_error(DrainError::Limits(format!(
                "{} units in one call; at most {}",
                units.len(),
                crate::discovery::drain::MAX_UNITS_PER_CALL
            ))));
        }
        let units = units
            .iter()
            .map(|u| UnitName::new(u.as_str()).map_err(|e| ApiError::invalid_args(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((node, units))
    }
}

fn drain_error(e: DrainError) -> ApiError {
    match e {
        DrainError::Limits(m) => ApiError::new(LIMITS_EXCEEDED, m),
        DrainError::Save(m) => ApiError::failed(m),
    }
}

/// `node` or `node: unit, unit` for a log line.
fn what(node: &NodeName, units: &[UnitName]) -> String {
    if units.is_empty() {
        format!("node {node}")
    } else {
        let list: Vec<&str> = units.iter().take(8).map(UnitName::as_str).collect();
        let more = match units.len() {
            0..=8 => String::new(),
            n => format!(" and {} more", n - 8),
        };
        format!("{node}: {}{more}", list.join(", "))
    }
}

/// Lets a call through from root or from the user the manager runs as.
async fn root_or_self(
    conn: &Connection,
    header: &Header<'_>,
    method: &str,
) -> Result<(), ApiError> {
    let denied = |why: String| ApiError::new(ACCESS_DENIED, format!("{method}: {why}"));
    let Some(sender) = header.sender() else {
        return Err(denied("the call carries no sender".into()));
    };
    let bus = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(|e| denied(format!("cannot ask the bus about {sender}: {e}")))?;
    let uid_of = |name: BusName<'static>| {
        let bus = bus.clone();
        async move { bus.get_connection_unix_user(name).await }
    };
    let caller = uid_of(BusName::from(sender.to_owned()))
        .await
        .map_err(|e| denied(format!("the bus does not know the uid of {sender}: {e}")))?;
    if caller == 0 {
        return Ok(());
    }
    let own = match conn.unique_name() {
        Some(me) => uid_of(BusName::from(me.to_owned())).await.ok(),
        None => None,
    };
    if own == Some(caller) {
        Ok(())
    } else {
        tracing::info!("refused {method} from {sender} (uid {caller})");
        Err(denied(format!(
            "only root or the manager's own user may call it; {sender} is uid {caller}"
        )))
    }
}
