//! [`TestCluster`]: a sandbox [`Cluster`] of real `systemd --user` nodes (`docs/sandbox.md`) with
//! the calls tests make on it, each panicking with a message that says what failed.
//!
//! It dereferences to the [`Cluster`], so everything the sandbox offers (stop and start
//! agents and the manager, signal them, logs) is there too. Dropping it tears the cluster
//! down (the sandbox's `Drop`); [`TestCluster::down`] does the same and fails the test if
//! anything was left behind.

use drover_bus::systemd;
use drover_sandbox::{Cluster, ClusterOptions};
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use crate::api::{Api, JobWatch};
use crate::ctl::{Ctl, CtlFollower};
use crate::monitor::MonitorWatch;
use crate::process::Run;
use crate::wait::eventually;

/// See the module docs.
pub struct TestCluster(Cluster);

impl TestCluster {
    /// How many times the manager registered `name` over TLS, and whether it
    /// ever dropped it (read from the manager's log).
    pub fn tls_registrations(&self, name: &str) -> (usize, bool) {
        let log = std::fs::read_to_string(self.log_path("manager")).unwrap_or_default();
        let registered = log
            .lines()
            .filter(|l| {
                l.contains(&format!("node {name} (certificate serial "))
                    && l.contains(") registered over TLS from ")
            })
            .count();
        let dropped = log
            .lines()
            .any(|l| l.contains(&format!("node {name} disconnected: ")));
        (registered, dropped)
    }

    /// Nodes `node1..nodeN` with the sandbox defaults (heartbeat 500 ms, threshold 2 s).
    pub async fn start(nodes: usize) -> TestCluster {
        Self::with(ClusterOptions::with_nodes(nodes)).await
    }

    /// Nodes `node1..nodeN` (sandbox defaults) with `units` installed: (node, unit name,
    /// unit file text).
    pub async fn with_units(nodes: usize, units: &[(&str, &str, &str)]) -> TestCluster {
        let c = Self::start(nodes).await;
        for (node, name, text) in units {
            c.install(node, name, text).await;
        }
        c
    }

    pub async fn with(opts: ClusterOptions) -> TestCluster {
        TestCluster(
            Cluster::start(opts)
                .await
                .unwrap_or_else(|e| panic!("sandbox cluster starts: {e:#}")),
        )
    }

    /// Orderly teardown; fails the test if it left anything behind.
    pub async fn down(self) {
        self.0
            .down()
            .await
            .unwrap_or_else(|e| panic!("sandbox teardown: {e:#}"));
    }

    // --- units on a node -------------------------------------------------------------

    /// Writes unit file `name` on `node` and reloads its systemd.
    pub async fn install(&self, node: &str, name: &str, text: &str) {
        self.0
            .install_unit(node, name, text)
            .await
            .unwrap_or_else(|e| panic!("installing {name} on {node}: {e:#}"));
    }

    /// `ARGV` inside `node` (its namespaces and environment), whatever its outcome.
    /// (Shadows the sandbox's `exec`, which returns errors instead of panicking.)
    pub async fn exec(&self, node: &str, argv: &[&str]) -> Run {
        let out = self.0.exec(node, argv).await;
        Run::from(out.unwrap_or_else(|e| panic!("{argv:?} on {node}: {e:#}")))
    }

    /// `systemctl --user ARGS` inside `node`, whatever its outcome.
    pub async fn systemctl(&self, node: &str, args: &[&str]) -> Run {
        let out = self.0.systemctl(node, args).await;
        Run::from(out.unwrap_or_else(|e| panic!("systemctl {args:?} on {node}: {e:#}")))
    }

    /// `systemctl --user ARGS` inside `node`, which must succeed.
    pub async fn systemctl_ok(&self, node: &str, args: &[&str]) {
        let out = self.systemctl(node, args).await;
        assert!(
            out.success(),
            "systemctl {args:?} on {node}: {}",
            out.stderr
        );
    }

    /// `systemctl --user show -p PROP --value UNIT` inside `node`.
    pub async fn prop(&self, node: &str, unit: &str, prop: &str) -> String {
        let out = self
            .systemctl(node, &["show", "-p", prop, "--value", unit])
            .await;
        out.stdout.trim().to_string()
    }

    /// The `ActiveState` of `unit` on `node`.
    pub async fn state(&self, node: &str, unit: &str) -> String {
        self.prop(node, unit, "ActiveState").await
    }

    /// Waits until `unit` on `node` is `want`; the error names the last state seen.
    pub async fn try_wait_state(
        &self,
        node: &str,
        unit: &str,
        want: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let what = format!("{unit} on {node} to be {want}");
        let res = eventually(timeout, &what, || async {
            self.state(node, unit).await == want
        });
        if let Err(e) = res.await {
            anyhow::bail!("{e:#} (it is {})", self.state(node, unit).await);
        }
        Ok(())
    }

    /// [`Self::try_wait_state`] that fails the test.
    pub async fn wait_state(&self, node: &str, unit: &str, want: &str, timeout: Duration) {
        if let Err(e) = self.try_wait_state(node, unit, want, timeout).await {
            panic!("{e:#}");
        }
    }

    /// `unit` on `node` stays `want` for `period` (checked every 100 ms).
    pub async fn stays(&self, node: &str, unit: &str, want: &str, period: Duration) {
        let end = tokio::time::Instant::now() + period;
        while tokio::time::Instant::now() < end {
            let now = self.state(node, unit).await;
            assert_eq!(now, want, "{unit} on {node} left {want}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the manager reports `node` as `status` (`online`, `offline`).
    pub async fn wait_status(&self, node: &str, status: &str, timeout: Duration) {
        self.0
            .wait_node_status(node, status, timeout)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// The node's own systemd manager (`org.freedesktop.systemd1.Manager`), straight
    /// over the node's bus: what a test compares the manager's answers with.
    pub async fn systemd(&self, node: &str) -> zbus::Proxy<'static> {
        let conn = crate::api::connect(&self.0.node_bus_address(node)).await;
        zbus::Proxy::new(
            &conn,
            systemd::BUS_NAME,
            systemd::MANAGER_PATH,
            systemd::MANAGER_IFACE,
        )
        .await
        .expect("systemd manager proxy")
    }

    // --- clients ---------------------------------------------------------------------

    /// A new client connection to the manager's API.
    pub async fn api(&self) -> Api {
        Api::connect(self.0.bus_address()).await
    }

    /// A client driving `node`: the connection, the node's object, and a [`JobWatch`]
    /// subscribed before any job starts.
    pub async fn jobs_on(&self, node: &str) -> (Api, zbus::Proxy<'static>, JobWatch) {
        let api = self.api().await;
        let jobs = api.jobs().await;
        let node = api.node(node).await;
        (api, node, jobs)
    }

    /// A monitor on a connection of its own.
    pub async fn monitor(&self) -> MonitorWatch {
        MonitorWatch::create(self.0.bus_address()).await
    }

    /// `droverctl` against this cluster (`DROVER_BUS`).
    pub fn ctl(&self) -> Ctl {
        Ctl::env(self.0.bus_address())
    }

    /// `droverctl ARGS` to its end.
    pub async fn run(&self, args: &[&str]) -> Run {
        self.ctl().run(args).await
    }

    /// `droverctl ARGS`, which must succeed; its stdout.
    pub async fn ctl_ok(&self, args: &[&str]) -> String {
        self.ctl().ok(args).await
    }

    /// `droverctl ARGS` running until interrupted.
    pub fn follow(&self, args: &[&str]) -> CtlFollower {
        self.ctl().follow(args)
    }
}

impl Deref for TestCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.0
    }
}
