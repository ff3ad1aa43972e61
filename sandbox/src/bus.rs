//! The few D-Bus calls the sandbox makes: "is this node's systemd up", "reload it", "does
//! the manager own its name", "what is a node's status", "does this manager lead". Every
//! call is bounded in time.

use anyhow::{Context, Result, anyhow};
use drover_bus::{bluechi, systemd};
use std::time::Duration;
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath, Proxy};

/// One bounded D-Bus round trip (or connection attempt).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// systemd's `Reload` re-reads every unit file; give it more room.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to `address` (bounded).
pub async fn connect(address: &str) -> Result<Connection> {
    connect_with_timeout(address, CALL_TIMEOUT).await
}

/// Connects to `address` (bounded); method calls on it time out after `method_timeout`.
async fn connect_with_timeout(address: &str, method_timeout: Duration) -> Result<Connection> {
    let build = zbus::connection::Builder::address(address)
        .method_timeout(method_timeout)
        .build();
    tokio::time::timeout(CALL_TIMEOUT, build)
        .await
        .map_err(|_| anyhow!("connecting to {address} timed out"))?
        .with_context(|| format!("connecting to {address}"))
}

async fn proxy(
    conn: &Connection,
    dest: &'static str,
    path: OwnedObjectPath,
    iface: &'static str,
) -> Result<Proxy<'static>> {
    zbus::proxy::Builder::<Proxy<'static>>::new(conn)
        .destination(dest)
        .path(path)
        .interface(iface)
        .cache_properties(CacheProperties::No)
        .build()
        .await
        .context("creating a D-Bus proxy")
}

fn path(p: &str) -> Result<OwnedObjectPath> {
    OwnedObjectPath::try_from(p).with_context(|| format!("bad object path {p}"))
}

/// systemd's manager object on `conn`.
async fn systemd_manager(conn: &Connection) -> Result<Proxy<'static>> {
    proxy(
        conn,
        systemd::BUS_NAME,
        path(systemd::MANAGER_PATH)?,
        systemd::MANAGER_IFACE,
    )
    .await
}

/// systemd's `SystemState` on the bus at `address` (`running` once it finished starting).
pub async fn systemd_state(address: &str) -> Result<String> {
    let conn = connect(address).await?;
    let manager = systemd_manager(&conn).await?;
    let state: String = manager
        .get_property("SystemState")
        .await
        .context("reading org.freedesktop.systemd1.Manager.SystemState")?;
    Ok(state)
}

/// `org.freedesktop.systemd1.Manager.Reload` (returns once systemd re-read its units).
pub async fn reload_systemd(address: &str) -> Result<()> {
    let conn = connect_with_timeout(address, RELOAD_TIMEOUT).await?;
    let manager = systemd_manager(&conn).await?;
    manager
        .call::<_, _, ()>("Reload", &())
        .await
        .with_context(|| format!("systemd Reload on {address}"))
}

/// Whether `name` has an owner on the bus of `conn`.
pub async fn name_has_owner(conn: &Connection, name: &str) -> Result<bool> {
    let dbus = zbus::fdo::DBusProxy::new(conn)
        .await
        .context("org.freedesktop.DBus proxy")?;
    let name =
        zbus::names::BusName::try_from(name).with_context(|| format!("bad bus name {name}"))?;
    dbus.name_has_owner(name).await.context("NameHasOwner")
}

/// `Node.Status` of `node` as the manager reports it.
pub async fn node_status(conn: &Connection, node: &str) -> Result<String> {
    let controller = proxy(
        conn,
        bluechi::BUS_NAME,
        path(bluechi::CONTROLLER_PATH)?,
        bluechi::CONTROLLER_IFACE,
    )
    .await?;
    let node_path: OwnedObjectPath = controller
        .call("GetNode", &(node,))
        .await
        .with_context(|| format!("Controller.GetNode({node})"))?;
    let node_proxy = proxy(conn, bluechi::BUS_NAME, node_path, bluechi::NODE_IFACE).await?;
    node_proxy
        .get_property::<String>("Status")
        .await
        .with_context(|| format!("reading Node.Status of {node}"))
}

/// `io.drover.Controller.Leading` of the manager on `conn`: whether it leads
/// (always true for a manager without etcd).
pub async fn leading(conn: &Connection) -> Result<bool> {
    let controller = proxy(
        conn,
        bluechi::BUS_NAME,
        path(bluechi::CONTROLLER_PATH)?,
        bluechi::DROVER_CONTROLLER_IFACE,
    )
    .await?;
    controller
        .get_property::<bool>("Leading")
        .await
        .context("reading io.drover.Controller.Leading")
}
