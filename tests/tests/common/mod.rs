//! Helpers shared by the integration tests: run droverctl against a sandbox
//! cluster, talk to the manager's public D-Bus API, follow job signals.
#![allow(dead_code)]

pub mod follow;

use anyhow::{Context, Result, bail};
use drover_sandbox::{Cluster, ClusterOptions};
use futures::StreamExt;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;
use zbus::OwnedObjectPath;

pub const BUS_NAME: &str = "org.eclipse.bluechi";
pub const CONTROLLER_PATH: &str = "/org/eclipse/bluechi";
pub const CONTROLLER_IFACE: &str = "org.eclipse.bluechi.Controller";
pub const NODE_IFACE: &str = "org.eclipse.bluechi.Node";

/// A cluster of `n` nodes named node1..nodeN with the sandbox defaults
/// (heartbeat 500 ms, threshold 2000 ms).
pub async fn cluster(n: usize) -> Cluster {
    Cluster::start(ClusterOptions::with_nodes(n))
        .await
        .expect("sandbox cluster starts")
}

/// Where cargo put the workspace binaries (target/<profile>), found from
/// this test binary (target/<profile>/deps/<test>).
pub fn bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("DROVER_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    profile_dir.join(name)
}

/// Runs droverctl against the cluster's manager bus.
pub async fn droverctl(cluster: &Cluster, args: &[&str]) -> Output {
    tokio::process::Command::new(bin("droverctl"))
        .args(args)
        .env("DROVER_BUS", cluster.bus_address())
        .output()
        .await
        .expect("droverctl runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "droverctl failed ({:?})\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

pub async fn bus(cluster: &Cluster) -> zbus::Connection {
    zbus::connection::Builder::address(cluster.bus_address())
        .build()
        .await
        .expect("connects to the manager's bus")
}

pub async fn controller(conn: &zbus::Connection) -> zbus::Proxy<'static> {
    zbus::Proxy::new(conn, BUS_NAME, CONTROLLER_PATH, CONTROLLER_IFACE)
        .await
        .expect("controller proxy")
}

pub async fn node(conn: &zbus::Connection, name: &str) -> zbus::Proxy<'static> {
    let path: OwnedObjectPath = controller(conn)
        .await
        .call("GetNode", &(name,))
        .await
        .expect("GetNode");
    zbus::Proxy::new(conn, BUS_NAME, path, NODE_IFACE)
        .await
        .expect("node proxy")
}

/// `ListNodes` as (name, status, peer ip).
pub async fn list_nodes(conn: &zbus::Connection) -> Vec<(String, String, String)> {
    let nodes: Vec<(String, OwnedObjectPath, String, String)> = controller(conn)
        .await
        .call("ListNodes", &())
        .await
        .expect("ListNodes");
    nodes
        .into_iter()
        .map(|(name, _, status, ip)| (name, status, ip))
        .collect()
}

/// One `JobRemoved` signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRemoved {
    pub id: u32,
    pub path: String,
    pub node: String,
    pub unit: String,
    pub result: String,
}

/// Subscribes to JobNew/JobRemoved *before* the caller starts jobs.
pub struct JobWatch {
    removed: zbus::proxy::SignalStream<'static>,
    new: zbus::proxy::SignalStream<'static>,
}

impl JobWatch {
    pub async fn new(conn: &zbus::Connection) -> Self {
        let ctl = controller(conn).await;
        let removed = ctl
            .receive_signal("JobRemoved")
            .await
            .expect("match JobRemoved");
        let new = ctl.receive_signal("JobNew").await.expect("match JobNew");
        Self { removed, new }
    }

    /// Waits for the JobNew of `path`.
    pub async fn job_new(&mut self, path: &str, timeout: Duration) -> Result<u32> {
        tokio::time::timeout(timeout, async {
            while let Some(msg) = self.new.next().await {
                let (id, p): (u32, OwnedObjectPath) = msg.body().deserialize()?;
                if p.as_str() == path {
                    return Ok(id);
                }
            }
            bail!("signal stream ended")
        })
        .await
        .with_context(|| format!("no JobNew for {path} within {timeout:?}"))?
    }

    /// Waits for the JobRemoved of `path`; fails on a second one for the same path
    /// arriving in `grace` afterwards (every job ends exactly once).
    pub async fn removed(&mut self, path: &str, timeout: Duration) -> Result<JobRemoved> {
        tokio::time::timeout(timeout, async {
            while let Some(msg) = self.removed.next().await {
                let (id, p, node, unit, result): (u32, OwnedObjectPath, String, String, String) =
                    msg.body().deserialize()?;
                if p.as_str() == path {
                    return Ok(JobRemoved {
                        id,
                        path: p.to_string(),
                        node,
                        unit,
                        result,
                    });
                }
            }
            bail!("signal stream ended")
        })
        .await
        .with_context(|| format!("no JobRemoved for {path} within {timeout:?}"))?
    }

    /// No further JobRemoved for `path` within `quiet`.
    pub async fn no_more_removed(&mut self, path: &str, quiet: Duration) -> Result<()> {
        let res = tokio::time::timeout(quiet, async {
            while let Some(msg) = self.removed.next().await {
                let (_, p, _, _, _): (u32, OwnedObjectPath, String, String, String) =
                    msg.body().deserialize().ok()?;
                if p.as_str() == path {
                    return Some(());
                }
            }
            None
        })
        .await;
        match res {
            Ok(Some(())) => bail!("a second JobRemoved arrived for {path}"),
            _ => Ok(()),
        }
    }
}

/// Calls `Node.<method>(unit, "replace")` and returns the job path.
pub async fn job_call(node: &zbus::Proxy<'_>, method: &str, unit: &str) -> zbus::Result<String> {
    let path: OwnedObjectPath = node.call(method, &(unit, "replace")).await?;
    Ok(path.to_string())
}

/// `systemctl --user show -p P --value UNIT` inside the node.
pub async fn unit_prop(cluster: &Cluster, node: &str, unit: &str, prop: &str) -> String {
    let out = cluster
        .systemctl(node, &["show", "-p", prop, "--value", unit])
        .await
        .expect("systemctl runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Polls until `cond` holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A oneshot unit that succeeds at once.
pub const ONESHOT_OK: &str = "[Service]\nType=oneshot\nExecStart=/bin/true\n";
/// A long-running service.
pub const SLEEPER: &str = "[Service]\nExecStart=/bin/sleep 600\nExecReload=/bin/true\n";
/// A unit whose ExecStart fails.
pub const FAILING: &str = "[Service]\nType=oneshot\nExecStart=/bin/false\n";
/// A oneshot whose start job stays pending for a while.
pub const SLOW_START: &str = "[Service]\nType=oneshot\nExecStart=/bin/sleep 60\n";
