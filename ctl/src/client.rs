//! Which bus droverctl talks to, the connection to it, and the one place where
//! D-Bus errors become [`CtlError`]s.
//!
//! Bus choice, strongest first: `--bus ADDRESS`, `--user` (session bus),
//! `$DROVER_BUS`, the system bus. An explicit flag beats the environment so that
//! `droverctl --user` does what it says even with `DROVER_BUS` exported.
//!
//! Invariant: a [`Client`] exists only for a bus that accepted our connection; whether
//! drover-manager is on it is found out lazily, when a call fails (a healthy command
//! pays no extra round trip).

use std::str::FromStr;
use std::time::Duration;

use drover_protocol::{NodeName, UnitName};
use futures::StreamExt;
use zbus::{Connection, DBusError as _, proxy::CacheProperties};

use crate::error::CtlError;
use drover_bus::Bus;
use drover_bus::bluechi::{BUS_NAME, node_path};
use drover_bus::client::{
    ControllerProxy, DroverControllerProxy, DroverNodeProxy, MetricsProxy, MonitorProxy, NodeProxy,
};
use drover_protocol::error_names::{
    DISCONNECTED, FILE_NOT_FOUND, NAME_HAS_NO_OWNER, NO_REPLY, NO_SUCH_UNIT, NOT_LEADER, OFFLINE,
    SERVICE_UNKNOWN, UNKNOWN_OBJECT,
};

/// Method calls give up after this long. The manager answers node calls within its
/// own 30 s node timeout, so this only fires for a manager that hangs; it keeps a
/// script from waiting forever. (Waiting for a job's end is separate: `--timeout`.)
pub const METHOD_TIMEOUT: Duration = Duration::from_secs(60);

/// Nodes listed at the same time by [`Client::each_node`].
pub const IN_FLIGHT: usize = 16;

/// Pick the bus from the flags and the value of `$DROVER_BUS` (passed in so tests
/// need not touch the process environment). An empty `$DROVER_BUS` counts as unset.
/// An address is checked to parse.
pub fn resolve_bus(bus: Option<&str>, user: bool, env_bus: Option<&str>) -> Result<Bus, CtlError> {
    if let Some(addr) = bus {
        return checked_address(addr, "--bus");
    }
    if user {
        return Ok(Bus::Session);
    }
    match env_bus {
        Some(addr) if !addr.is_empty() => checked_address(addr, "$DROVER_BUS"),
        _ => Ok(Bus::System),
    }
}

fn checked_address(addr: &str, origin: &str) -> Result<Bus, CtlError> {
    zbus::Address::from_str(addr)
        .map(|_| Bus::Address(addr.to_owned()))
        .map_err(|e| CtlError::Usage(format!("invalid D-Bus address in {origin} '{addr}': {e}")))
}

/// Open a connection to `bus`, with droverctl's method timeout.
async fn connect(bus: &Bus) -> Result<Connection, CtlError> {
    bus.builder()
        .method_timeout(METHOD_TIMEOUT)
        .build()
        .await
        .map_err(|e| CtlError::Connect {
            bus: bus.to_string(),
            reason: connect_reason(&e),
        })
}

fn connect_reason(e: &zbus::Error) -> String {
    match e {
        zbus::Error::Connection(io, _) | zbus::Error::InputOutput(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// What a failed call was about, so its error can be worded for the user.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallContext<'a> {
    /// What was attempted, e.g. `ListUnits on node a`; used for errors passed through.
    pub what: &'a str,
    pub node: Option<&'a NodeName>,
    pub unit: Option<&'a UnitName>,
}

impl<'a> CallContext<'a> {
    /// A call on `node`, about `unit` when it concerns one.
    pub fn on(what: &'a str, node: &'a NodeName, unit: Option<&'a UnitName>) -> Self {
        CallContext {
            what,
            node: Some(node),
            unit,
        }
    }
}

/// A connection to one bus plus the proxies droverctl needs on it. Cloning is cheap
/// (the connection is shared).
#[derive(Clone)]
pub struct Client {
    conn: Connection,
    target: Bus,
}

impl Client {
    pub async fn connect(target: Bus) -> Result<Client, CtlError> {
        let conn = connect(&target).await?;
        Ok(Client { conn, target })
    }

    pub fn target(&self) -> &Bus {
        &self.target
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The controller object. Property caching is off: droverctl reads each value once.
    pub async fn controller(&self) -> Result<ControllerProxy<'static>, CtlError> {
        ControllerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the controller proxy", e))
    }

    /// The object of node `name` (path computed locally, see [`drover_bus::client`]).
    pub async fn node(&self, name: &NodeName) -> Result<NodeProxy<'static>, CtlError> {
        self.node_at(node_path(name.as_str())).await
    }

    /// The node object at `path` (e.g. a path `ListNodes` returned).
    pub async fn node_at(&self, path: String) -> Result<NodeProxy<'static>, CtlError> {
        NodeProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the node proxy", e))
    }

    /// drover's extension interface on the object of node `name`.
    pub async fn drover_node(&self, name: &NodeName) -> Result<DroverNodeProxy<'static>, CtlError> {
        DroverNodeProxy::builder(&self.conn)
            .path(node_path(name.as_str()))
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the io.drover.Node proxy", e))
    }

    /// drover's extension interface on the controller object.
    pub async fn drover_controller(&self) -> Result<DroverControllerProxy<'static>, CtlError> {
        DroverControllerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the io.drover.Controller proxy", e))
    }

    /// The monitor at `path` (as `CreateMonitor` returned it).
    pub async fn monitor(&self, path: &str) -> Result<MonitorProxy<'static>, CtlError> {
        MonitorProxy::builder(&self.conn)
            .path(path.to_owned())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the monitor proxy", e))
    }

    /// The metrics object (its signals can be matched while it is not exported).
    pub async fn metrics(&self) -> Result<MetricsProxy<'static>, CtlError> {
        MetricsProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| self.local_error("creating the metrics proxy", e))
    }

    /// The result of a call, with a failure turned into the user-facing error.
    pub async fn check<T>(&self, r: zbus::Result<T>, ctx: CallContext<'_>) -> Result<T, CtlError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.classify(e, ctx).await),
        }
    }

    /// The listing of one node: `one` (`Node.<method>`) on `node`, each entry made
    /// a row by `row(node, entry)`.
    pub async fn one_node<T, R>(
        &self,
        node: &NodeName,
        method: &str,
        one: impl AsyncFnOnce(&NodeProxy<'static>) -> zbus::Result<Vec<T>>,
        row: impl Fn(&str, T) -> R,
    ) -> Result<Listing<R>, CtlError> {
        let proxy = self.node(node).await?;
        let what = format!("{method} on node {node}");
        let listed = one(&proxy).await;
        let listed = self
            .check(listed, CallContext::on(&what, node, None))
            .await?;
        Ok(Listing {
            rows: listed.into_iter().map(|t| row(node.as_str(), t)).collect(),
            left_out: Vec::new(),
        })
    }

    /// The listing of every online node, node by node: `ListNodes`, then `one`
    /// (`Node.<method>`) on each online node in name order, at most [`IN_FLIGHT`]
    /// calls at a time. `rows(node, entries)` gets each node's entries as soon as
    /// they and those of the nodes before it are in, so droverctl (and the manager,
    /// which answers one node per call) holds a few nodes' rows at a time, never the
    /// fleet's: `Controller.<method>` is one D-Bus reply, which a large fleet does not
    /// fit. Returns the online nodes that could not be listed, each with its reason
    /// (sorted by node): never dropped silently.
    pub async fn each_node<T>(
        &self,
        one: impl AsyncFn(&NodeProxy<'static>) -> zbus::Result<Vec<T>>,
        mut rows: impl FnMut(&str, Vec<T>) -> Result<(), CtlError>,
    ) -> Result<Vec<(String, String)>, CtlError> {
        let controller = self.controller().await?;
        let nodes = controller.list_nodes().await;
        let cc = CallContext {
            what: "ListNodes",
            ..Default::default()
        };
        let mut online: Vec<(String, String)> = self
            .check(nodes, cc)
            .await?
            .into_iter()
            .filter(|(_, _, status, _)| status == "online")
            .map(|(node, path, _, _)| (node, path.to_string()))
            .collect();
        online.sort();
        let one = &one;
        let mut listed = futures::stream::iter(online)
            .map(|(node, path)| async move {
                let entries = match self.node_at(path).await {
                    Ok(proxy) => one(&proxy).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                (node, entries)
            })
            .buffered(IN_FLIGHT);
        let mut left_out = Vec::new();
        while let Some((node, entries)) = listed.next().await {
            match entries {
                Ok(entries) => rows(&node, entries)?,
                Err(reason) => left_out.push((node, reason)),
            }
        }
        Ok(left_out)
    }

    fn local_error(&self, what: &str, e: zbus::Error) -> CtlError {
        CtlError::Other(format!("{what} on {}: {e}", self.target))
    }

    /// Whether drover-manager currently owns its name. `None` when the bus cannot say
    /// (e.g. a peer-to-peer address without a bus daemon).
    pub async fn manager_present(&self) -> Option<bool> {
        let dbus = zbus::fdo::DBusProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .ok()?;
        let name = zbus::names::BusName::try_from(BUS_NAME).ok()?;
        dbus.name_has_owner(name).await.ok()
    }

    /// Turn a failed call into the user-facing error. This is the only place that
    /// knows D-Bus error names.
    pub async fn classify(&self, err: zbus::Error, ctx: CallContext<'_>) -> CtlError {
        let Some((name, message)) = error_name(&err) else {
            return match err {
                zbus::Error::InputOutput(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                    CtlError::Other(format!(
                        "{} timed out after {} s: drover-manager on {} does not answer",
                        ctx.what,
                        METHOD_TIMEOUT.as_secs(),
                        self.target
                    ))
                }
                zbus::Error::InputOutput(_) => CtlError::BusClosed {
                    bus: self.target.to_string(),
                },
                other => CtlError::Other(format!("{} failed: {other}", ctx.what)),
            };
        };
        let node = || ctx.node.map(|n| n.to_string()).unwrap_or_default();
        match name.as_str() {
            OFFLINE => CtlError::NodeOffline(node()),
            NO_SUCH_UNIT => CtlError::UnitNotFound {
                unit: ctx.unit.map(|u| u.to_string()).unwrap_or_default(),
                node: node(),
            },
            // systemd's answer for a unit *file* that does not exist (GetUnitFileState,
            // EnableUnitFiles, ...).
            FILE_NOT_FOUND if ctx.unit.is_some() => CtlError::UnitNotFound {
                unit: ctx.unit.map(|u| u.to_string()).unwrap_or_default(),
                node: node(),
            },
            // The bus daemon says this when nobody owns our destination; the manager
            // says it from GetNode for an unknown node. Ask the bus which one it was.
            SERVICE_UNKNOWN | NAME_HAS_NO_OWNER => match (self.manager_present().await, ctx.node) {
                (Some(true), Some(n)) => CtlError::NodeNotFound(n.to_string()),
                (Some(true), None) => passthrough(ctx, name, message),
                _ => CtlError::ManagerUnreachable {
                    bus: self.target.to_string(),
                },
            },
            // The bus daemon's answer to a call in flight when the manager left the
            // bus (it handles the departure before our question, so the name has no
            // owner by then); a manager that is still there timed out instead.
            NO_REPLY => match self.manager_present().await {
                Some(false) => CtlError::ManagerUnreachable {
                    bus: self.target.to_string(),
                },
                _ => passthrough(ctx, name, message),
            },
            // A node path the manager does not serve: the node is not configured.
            UNKNOWN_OBJECT if ctx.node.is_some() => CtlError::NodeNotFound(node()),
            DISCONNECTED => CtlError::BusClosed {
                bus: self.target.to_string(),
            },
            NOT_LEADER => CtlError::NotLeader {
                bus: self.target.to_string(),
                message,
            },
            _ => passthrough(ctx, name, message),
        }
    }
}

fn passthrough(ctx: CallContext<'_>, name: String, message: String) -> CtlError {
    CtlError::DBus {
        what: ctx.what.to_owned(),
        name,
        message,
    }
}

/// The D-Bus error name and message of an error reply, if `err` is one.
pub fn error_name(err: &zbus::Error) -> Option<(String, String)> {
    match err {
        zbus::Error::MethodError(name, message, _) => Some((
            name.as_str().to_owned(),
            message.clone().unwrap_or_default(),
        )),
        zbus::Error::FDO(fdo) => Some((
            fdo.name().as_str().to_owned(),
            fdo.description().unwrap_or_default().to_owned(),
        )),
        _ => None,
    }
}

/// What [`Client::one_node`] found: the rows, and the online nodes that could not be
/// listed, each with its reason (sorted by node).
pub struct Listing<R> {
    pub rows: Vec<R>,
    pub left_out: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_precedence() {
        let addr = "unix:path=/tmp/x";
        assert_eq!(
            resolve_bus(Some(addr), false, Some("unix:path=/y")).unwrap(),
            Bus::Address(addr.into())
        );
        assert_eq!(resolve_bus(None, true, Some(addr)).unwrap(), Bus::Session);
        assert_eq!(
            resolve_bus(None, false, Some(addr)).unwrap(),
            Bus::Address(addr.into())
        );
        assert_eq!(resolve_bus(None, false, Some("")).unwrap(), Bus::System);
        assert_eq!(resolve_bus(None, false, None).unwrap(), Bus::System);
    }

    #[test]
    fn bad_addresses_are_usage_errors() {
        for bad in ["nonsense", "unix:", "bogus:path=/x"] {
            let e = resolve_bus(Some(bad), false, None).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE, "{bad}: {e}");
            assert!(e.to_string().contains("--bus"), "{e}");
        }
        let e = resolve_bus(None, false, Some("nonsense")).unwrap_err();
        assert!(e.to_string().contains("$DROVER_BUS"), "{e}");
    }
}
