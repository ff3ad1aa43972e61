//! One `StartUnit` of the benchmarks' trivial unit, timed until its job is
//! removed (through systemd's manager or drover's node object, which take the
//! same call), the two ways to reach node2 for it ([`StartPaths`]), and a
//! process's resident memory: what several benchmarks measure the same way.

use anyhow::{Context, Result, bail};
use drover_bus::{bluechi, systemd};
use drover_sandbox::Cluster;
use futures::StreamExt;
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

/// The trivial oneshot the `StartUnit` benchmarks start.
const UNIT: &str = "bench-noop.service";
const UNIT_TEXT: &str = "[Service]\nType=oneshot\nExecStart=/bin/true\n";

/// One `StartUnit` of the trivial unit until its job is removed, through
/// `starter` (systemd's manager or drover's node object, which take the same
/// call).
async fn time_start(
    starter: &zbus::Proxy<'_>,
    removed: &mut zbus::proxy::SignalStream<'_>,
) -> Result<Duration> {
    let t = Instant::now();
    let job: OwnedObjectPath = starter.call("StartUnit", &(UNIT, "replace")).await?;
    wait_removed(removed, job.as_str()).await?;
    Ok(t.elapsed())
}

/// The node whose unit the `StartUnit` benchmarks start.
const NODE: &str = "node2";

/// One cluster's two ways to start [`UNIT`] on node2: straight to the node's
/// systemd, and through drover's node object on the cluster's bus; each with
/// its `JobRemoved` stream, subscribed before the first call. The same two
/// ways also read one property of the unit (the legs of a start, see
/// [`StartPaths::read_direct`]), and the manager answers a `Peer.Ping`.
pub(crate) struct StartPaths {
    node_bus: zbus::Connection,
    systemd: zbus::Proxy<'static>,
    systemd_removed: zbus::proxy::SignalStream<'static>,
    drover: zbus::Proxy<'static>,
    drover_removed: zbus::proxy::SignalStream<'static>,
    manager_peer: zbus::fdo::PeerProxy<'static>,
}

impl StartPaths {
    /// Installs the trivial oneshot on node2 and connects both paths.
    pub(crate) async fn new(cluster: &Cluster) -> Result<Self> {
        cluster.install_unit(NODE, UNIT, UNIT_TEXT).await?;
        // Direct path: the node's own systemd.
        let node_bus = zbus::connection::Builder::address(cluster.node_bus_address(NODE).as_str())
            .build()
            .await?;
        let systemd = zbus::Proxy::new(
            &node_bus,
            systemd::BUS_NAME,
            systemd::MANAGER_PATH,
            systemd::MANAGER_IFACE,
        )
        .await?;
        let _: () = systemd.call("Subscribe", &()).await?;
        let systemd_removed = systemd.receive_signal("JobRemoved").await?;
        let (drover, drover_removed) = drover_starter(cluster, NODE).await?;
        let manager_peer = zbus::fdo::PeerProxy::builder(drover.connection())
            .destination(bluechi::BUS_NAME)
            .path(bluechi::CONTROLLER_PATH)
            .build()
            .await?;
        Ok(Self {
            node_bus,
            systemd,
            systemd_removed,
            drover,
            drover_removed,
            manager_peer,
        })
    }

    /// One start straight through node2's systemd.
    pub(crate) async fn direct(&mut self) -> Result<Duration> {
        time_start(&self.systemd, &mut self.systemd_removed).await
    }

    /// One start through drover.
    pub(crate) async fn via_drover(&mut self) -> Result<Duration> {
        time_start(&self.drover, &mut self.drover_removed).await
    }

    /// The unit's `ActiveState` read from node2's systemd the way node2's
    /// agent reads it for drover's `GetUnitProperty`: `GetUnit` (`LoadUnit`
    /// when the unit is not loaded), then `Properties.Get` on the path. Against
    /// [`Self::read_via_drover`] it times the request's hops through drover
    /// (bus daemon, manager, TCP, agent and back) without a job.
    pub(crate) async fn read_direct(&self) -> Result<Duration> {
        let t = Instant::now();
        // A finished oneshot is often unloaded again: as the agent, load it then.
        let path: OwnedObjectPath = match self.systemd.call("GetUnit", &(UNIT,)).await {
            Ok(path) => path,
            Err(_) => self.systemd.call("LoadUnit", &(UNIT,)).await?,
        };
        let props = zbus::fdo::PropertiesProxy::builder(&self.node_bus)
            .destination(systemd::BUS_NAME)
            .path(path)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        let iface = zbus::names::InterfaceName::try_from(systemd::UNIT_IFACE)?;
        let _state = props.get(iface, "ActiveState").await?;
        Ok(t.elapsed())
    }

    /// The same property through drover's node object (`GetUnitProperty`).
    pub(crate) async fn read_via_drover(&self) -> Result<Duration> {
        let t = Instant::now();
        // The answer (a variant) decoded as far as the bus's message.
        let _answer = self
            .drover
            .call_method(
                "GetUnitProperty",
                &(UNIT, systemd::UNIT_IFACE, "ActiveState"),
            )
            .await?;
        Ok(t.elapsed())
    }

    /// `org.freedesktop.DBus.Peer.Ping` to the manager: one round trip
    /// through the bus daemon to the manager's process, no work of drover's.
    pub(crate) async fn ping_manager(&self) -> Result<Duration> {
        let t = Instant::now();
        self.manager_peer.ping().await?;
        Ok(t.elapsed())
    }
}

/// `node`'s object on the manager's public API, and the controller's
/// `JobRemoved` stream (subscribed before the first call).
async fn drover_starter(
    cluster: &Cluster,
    node: &str,
) -> Result<(zbus::Proxy<'static>, zbus::proxy::SignalStream<'static>)> {
    let api = zbus::connection::Builder::address(cluster.bus_address())
        .build()
        .await?;
    let controller = zbus::Proxy::new(
        &api,
        bluechi::BUS_NAME,
        bluechi::CONTROLLER_PATH,
        bluechi::CONTROLLER_IFACE,
    )
    .await?;
    let node_path: OwnedObjectPath = controller.call("GetNode", &(node,)).await?;
    let node = zbus::Proxy::new(&api, bluechi::BUS_NAME, node_path, bluechi::NODE_IFACE).await?;
    let removed = controller.receive_signal("JobRemoved").await?;
    Ok((node, removed))
}

/// Starts of the trivial oneshot on one node through drover only.
pub(crate) struct DroverStarts {
    node: zbus::Proxy<'static>,
    removed: zbus::proxy::SignalStream<'static>,
}

impl DroverStarts {
    /// Installs the trivial oneshot on `node` and connects to its object.
    pub(crate) async fn new(cluster: &Cluster, node: &str) -> Result<Self> {
        cluster.install_unit(node, UNIT, UNIT_TEXT).await?;
        let (node, removed) = drover_starter(cluster, node).await?;
        Ok(Self { node, removed })
    }

    /// One start through drover, until its `JobRemoved`.
    pub(crate) async fn once(&mut self) -> Result<Duration> {
        time_start(&self.node, &mut self.removed).await
    }
}

/// Waits for the JobRemoved of `path`: systemd's is (u o s s), drover's
/// (u o s s s); the job path is the second field in both.
async fn wait_removed(stream: &mut zbus::proxy::SignalStream<'_>, path: &str) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(msg) = stream.next().await {
            let body = msg.body();
            let p: Option<OwnedObjectPath> = body
                .deserialize::<(u32, OwnedObjectPath, String, String)>()
                .map(|t| t.1)
                .or_else(|_| {
                    body.deserialize::<(u32, OwnedObjectPath, String, String, String)>()
                        .map(|t| t.1)
                })
                .ok();
            if p.as_ref().map(|p| p.as_str()) == Some(path) {
                return Ok(());
            }
        }
        bail!("signal stream ended")
    })
    .await
    .context("job did not finish within 10 s")?
}

/// `VmRSS` of `pid`, KiB.
pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")
}
