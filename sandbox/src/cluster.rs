//! [`Cluster`]: nodes + private bus + manager + agents, owned by one value.
//!
//! Start order: nodes (in parallel), the manager's private dbus-daemon, the manager (its
//! TCP listener is bound once here and passed as fd 3 on every start, so the port survives
//! `stop_manager`/`start_manager`), then one agent per node. Every node's unit directory
//! holds the user-mode `drover-proxy@.service` (running the `drover-proxy` found next to
//! the daemons) and `drover-dep@.service` before its systemd starts, so cross-node
//! dependencies work in every sandbox (and, with [`ClusterOptions::bluechi_compat`], BlueChi's
//! `bluechi-proxy@.service` and `bluechi-dep@.service`). `start` returns once every
//! started agent's node is `online` on the manager's public API.
//!
//! Ownership: the value owns every process it started. `down()` stops them in order and
//! reports every failure; dropping the value without `down()` (a panicking test) kills
//! everything through the sandbox cgroups, removes the cgroups and the directory, and, when
//! the thread is panicking, prints the tails of the logs first so the failure is explained.
//! `state.json` in the directory is kept current, so `drover-sandbox down --dir DIR` can
//! clean up after a creator that died without either.

use crate::binaries;
use crate::bus;
use crate::cgroups::{CgroupJoin, Layout, PROCS_GROUP, SandboxCgroups};
use crate::files::{self, DaemonSettings};
use crate::node;
use crate::preflight;
use crate::process::{self, Spawn};
use crate::state::{NodeState, State, TeardownOnDrop};
use anyhow::{Context, Result, anyhow, bail};
use drover_bus::bluechi;
use drover_protocol::{NodeName, UnitName};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// `ha` adds the high-availability group's methods to [`Cluster`]; what
// both sides need is defined here, so this file imports nothing of it.
mod ha;

/// The most managers a sandbox runs.
pub const MAX_MANAGERS: usize = 3;
/// The managers' lease: the manager's minimum, so a failover takes about 2 s.
pub const LEASE_TTL_S: u64 = 2;
/// The etcd key prefix of the sandbox's group.
pub const KEY_PREFIX: &str = "/drover-sandbox";
/// Manager `number`'s address (1-based): 127.0.0.N, a host of its own on loopback.
pub fn manager_host(number: usize) -> String {
    format!("127.0.0.{number}")
}

/// Manager 2..N as the cluster holds it.
struct Standby {
    number: usize,
    /// Its agent port (the sandbox's port on its own address), passed as fd 3.
    listener: TcpListener,
    bus: Option<Child>,
    manager: Option<Child>,
}

impl Standby {
    fn log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("manager-{}.log", self.number))
    }
}

/// Upper bound on nodes per sandbox (each costs a systemd, a dbus-daemon and an agent).
pub const MAX_NODES: usize = 256;
/// Longest unix socket path the kernel accepts (`sun_path` minus the NUL).
const MAX_SOCKET_PATH: usize = 107;
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
const BUS_READY_TIMEOUT: Duration = Duration::from_secs(10);
const MANAGER_READY_TIMEOUT: Duration = Duration::from_secs(20);
const ONLINE_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(5);

static SANDBOX_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A port on 127.0.0.1 for a server that binds it itself (the manager's
/// metrics; a test's Prometheus): below the kernel's ephemeral range
/// (`ip_local_port_range`), so no outgoing connection takes it by chance
/// between this probe and the manager's bind, and free when probed. The
/// manager binds it itself (a metrics listener is not socket-activated);
/// the probe picks among thousands, so two sandboxes starting at once
/// meet on one port about once in that many starts, and then the manager's
/// start fails naming the address.
pub fn free_loopback_port() -> Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = if low > 12_000 {
        (10_000, low)
    } else {
        (low.max(1024), 65_535)
    };
    let span = u32::from(to - from);
    let mut seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(SANDBOX_COUNTER.load(Ordering::Relaxed).wrapping_mul(40_503))
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0),
        );
    for _ in 0..64 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let port = from + u16::try_from((seed >> 8) % span).unwrap_or(0);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {from} and {to}")
}

/// How to build a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Node names (default `node1..node3`).
    pub nodes: Vec<String>,
    /// Sandbox directory (default: a fresh one under /tmp, removed on teardown).
    pub dir: Option<PathBuf>,
    /// `HeartbeatInterval` of the agents, ms (default 500). The manager's is
    /// left at its default (0: it sends none, `drover_protocol::liveness`);
    /// `manager_extra_config` may set it.
    pub heartbeat_interval_ms: u64,
    /// `NodeHeartbeatThreshold` and `ControllerHeartbeatThreshold`, ms (default 2000).
    pub heartbeat_threshold_ms: u64,
    /// `AllowedNodeNames` (default: `nodes`).
    pub allowed_nodes: Option<Vec<String>>,
    /// Appended to the manager config file.
    pub manager_extra_config: String,
    /// Every node may depend on every node (`AllowDependenciesOn` = all nodes; default
    /// true). Without it proxies are denied, as in the product's default, unless
    /// `manager_extra_config` allows some.
    pub allow_all_proxies: bool,
    /// Start one agent per node (default true).
    pub start_agents: bool,
    /// Mutual TLS between agents and manager (default true): the sandbox makes
    /// a CA in `DIR/pki` (`drover_tls::pki`), a manager certificate for
    /// 127.0.0.1, `localhost` and `::1` (the loopback names an agent may be
    /// switched to) and one certificate per node, and writes the TLS keys into
    /// every config. Off: plaintext on loopback, for the tests of plaintext
    /// behaviour.
    pub tls: bool,
    /// Every node also gets drover's optional BlueChi compatibility set
    /// (`bluechi-proxy@.service`, `bluechi-dep@.service`, as `make
    /// install-bluechi-compat` installs them; default false), so units written
    /// for BlueChi (`Wants=bluechi-proxy@node2_db.service`) work.
    pub bluechi_compat: bool,
    /// Where the drover binaries are (default: [`binaries::search_dirs`]).
    pub bin_dir: Option<PathBuf>,
    /// The manager's bus and every node's bus are configured as a system bus
    /// (default false): `<type>system</type>`, the host's default policy of
    /// `system.conf` (every user may connect and send signals, method calls only where
    /// a service's policy allows them), systemd's policy for `org.freedesktop.systemd1`
    /// and drover's shipped policies (`dist/usr/share/dbus-1/system.d/`); and the
    /// nodes' runtime directories are reachable by every user, so a test can act as an
    /// unprivileged local user of a node or of the manager host
    /// (`drover_testkit::api::connect_as`).
    pub system_bus_policy: bool,
    /// The manager serves Prometheus metrics on a free loopback port
    /// ([`Cluster::metrics_url`]; default false, `drover-sandbox up` turns
    /// it on).
    pub metrics: bool,
    /// Extra environment of every agent (default none): the test knobs of
    /// debug builds, such as the resync tests' lost event.
    pub agent_env: Vec<(String, String)>,
    /// `Some(N)` (1..=[`MAX_MANAGERS`]): a high-availability group of N managers
    /// electing their leader on a real local etcd (`drover-sandbox up --managers N`,
    /// `ha` below); `None` (default): one manager, no etcd.
    pub managers: Option<usize>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self::with_nodes(3)
    }
}

impl ClusterOptions {
    /// Nodes `node1..nodeN`, everything else default.
    pub fn with_nodes(n: usize) -> Self {
        ClusterOptions {
            nodes: (1..=n).map(|i| format!("node{i}")).collect(),
            dir: None,
            heartbeat_interval_ms: 500,
            heartbeat_threshold_ms: 2000,
            allowed_nodes: None,
            manager_extra_config: String::new(),
            allow_all_proxies: true,
            start_agents: true,
            tls: true,
            bluechi_compat: false,
            bin_dir: None,
            system_bus_policy: false,
            metrics: false,
            agent_env: Vec::new(),
            managers: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.nodes.is_empty() {
            bail!("a sandbox needs at least one node");
        }
        if self.nodes.len() > MAX_NODES {
            bail!(
                "{} nodes requested; a sandbox has at most {MAX_NODES}",
                self.nodes.len()
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for name in &self.nodes {
            NodeName::new(name.as_str())?;
            if !seen.insert(name) {
                bail!("node '{name}' is listed twice");
            }
        }
        for name in self.allowed_nodes.iter().flatten() {
            NodeName::new(name.as_str()).context("in allowed_nodes")?;
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_threshold_ms == 0 {
            bail!("heartbeat interval and threshold must be > 0 ms");
        }
        if let Some(n) = self.managers
            && !(1..=MAX_MANAGERS).contains(&n)
        {
            bail!("{n} managers requested; a sandbox has 1 to {MAX_MANAGERS}");
        }
        Ok(())
    }
}

/// An agent started by [`Cluster::start_agent_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraAgent {
    pub pid: u32,
    /// Its stderr (the agent logs there in the sandbox).
    pub log: PathBuf,
}

/// A running local cluster. See the module docs for ownership and teardown.
pub struct Cluster {
    state: State,
    layout: Layout,
    cgroups: SandboxCgroups,
    procs_join: CgroupJoin,
    listener: TcpListener,
    settings: DaemonSettings,
    node_children: BTreeMap<String, Child>,
    bus_child: Option<Child>,
    manager: Option<Child>,
    /// `drover-dns`, when [`Cluster::start_dns`] started it.
    dns: Option<Child>,
    agents: BTreeMap<String, Child>,
    extra_agents: Vec<Child>,
    extra_counter: u32,
    /// Where drover binaries are looked up (see [`binaries`]).
    bin_dirs: Vec<PathBuf>,
    /// The `drover-proxy` the nodes' proxy template runs (None: not found, so the nodes
    /// got no proxy templates; [`Cluster::start`] refuses to run without it).
    proxy_bin: Option<PathBuf>,
    /// Nodes get the BlueChi compatibility templates too ([`ClusterOptions::bluechi_compat`]).
    bluechi_compat: bool,
    /// The buses have the system bus's policy ([`ClusterOptions::system_bus_policy`]):
    /// the policy files they include.
    system_policy: Option<SystemPolicy>,
    /// `AllowedNodeNames` as written into manager.conf (kept for [`Cluster::reconfigure_manager`]).
    allowed: Vec<String>,
    /// Extra environment of every agent ([`ClusterOptions::agent_env`]).
    agent_env: Vec<(String, String)>,
    /// `up --managers N`: the local etcd.
    etcd: Option<Child>,
    /// `up --managers N`: managers 2..N.
    standbys: Vec<Standby>,
    /// `up --managers N`: the `[drover-manager]` etcd keys every manager's config ends with.
    ha_keys: String,
    /// Set once torn down or detached: `Drop` then does nothing.
    finished: bool,
}

impl Cluster {
    /// Starts the whole cluster; returns when every agent-started node is `online`.
    pub async fn start(opts: ClusterOptions) -> Result<Cluster> {
        let bin_dirs = opts
            .bin_dir
            .clone()
            .map_or_else(binaries::search_dirs, |dir| vec![dir]);
        // Fail fast, before any node is started, when a binary is missing.
        binaries::locate_in("drover-manager", &bin_dirs)?;
        if opts.start_agents {
            binaries::locate_in("drover-agent", &bin_dirs)?;
            // Every node gets the proxy templates, and they run this helper.
            binaries::locate_in("drover-proxy", &bin_dirs)?;
        }
        let mut cluster = Self::start_base(&opts, bin_dirs).await?;
        match cluster.start_daemons(&opts).await {
            Ok(()) => Ok(cluster),
            Err(e) => Err(cluster.failed_start(e)),
        }
    }

    /// The manager, then the agents; returns once every agent's node is online.
    async fn start_daemons(&mut self, opts: &ClusterOptions) -> Result<()> {
        self.allowed = opts
            .allowed_nodes
            .clone()
            .unwrap_or_else(|| opts.nodes.clone());
        if let Some(managers) = opts.managers {
            self.start_etcd().await?;
            self.write_manager_config(opts.allow_all_proxies, &opts.manager_extra_config)?;
            self.start_manager().await?;
            // The first manager leads before the others campaign: `DROVER_BUS` is the leader's.
            self.wait_leading(1).await?;
            for number in 2..=managers {
                self.start_standby(number, opts).await?;
            }
        } else {
            self.write_manager_config(opts.allow_all_proxies, &opts.manager_extra_config)?;
            self.start_manager().await?;
        }

        if opts.start_agents {
            for name in &opts.nodes {
                self.start_agent(name).await?;
            }
            self.wait_all_online(&opts.nodes).await?;
        }
        Ok(())
    }

    /// Tears down a sandbox whose start failed, keeping its logs and configs in a
    /// directory of their own (teardown removes the sandbox's), and returns `error` with
    /// where they are.
    fn failed_start(self, error: anyhow::Error) -> anyhow::Error {
        let kept = std::env::temp_dir().join(format!("drover-sandbox-failed-{}", self.state.id));
        let note = match self.keep_logs(&kept) {
            Ok(0) => "the failed start left no logs".to_string(),
            Ok(n) => format!(
                "the failed start's logs ({n} files) are kept in {}",
                kept.display()
            ),
            Err(e) => format!("keeping the failed start's logs failed: {e:#}"),
        };
        // Dropping tears everything down (cgroups, mounts, the sandbox directory).
        drop(self);
        anyhow!("{error:#}\n{note}")
    }

    /// Copies the logs and configs of the sandbox (daemons, nodes' systemd, proxy units)
    /// into `to`; returns how many files it copied.
    fn keep_logs(&self, to: &Path) -> Result<usize> {
        let dir = &self.state.dir;
        let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
        let keep = |name: &str| name.ends_with(".log") || name.ends_with(".conf");
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type()?.is_file() && (keep(&name) || name == crate::state::STATE_FILE) {
                files.push((entry.path(), to.join(&name)));
            }
        }
        for n in &self.state.nodes {
            let conf = node::home(dir, &n.name).join("agent.conf");
            if conf.is_file() {
                files.push((conf, to.join(format!("{}-agent.conf", n.name))));
            }
            let unit_logs = node::unit_log_dir(dir, &n.name);
            for entry in std::fs::read_dir(&unit_logs)
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                files.push((entry.path(), to.join(format!("{}-{name}", n.name))));
            }
        }
        if files.is_empty() {
            return Ok(0);
        }
        std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
        for (from, into) in &files {
            std::fs::copy(from, into)
                .with_context(|| format!("copying {} to {}", from.display(), into.display()))?;
        }
        Ok(files.len())
    }

    /// Directory, cgroups, nodes and the private bus: everything but drover's daemons.
    pub(crate) async fn start_base(
        opts: &ClusterOptions,
        bin_dirs: Vec<PathBuf>,
    ) -> Result<Cluster> {
        opts.validate()?;
        let layout = preflight::check(opts.nodes.len())?;

        let listener =
            TcpListener::bind("127.0.0.1:0").context("binding the manager's TCP port")?;
        // The backlog the manager's own listener and the shipped drover-manager.socket
        // have (std binds with 128): a listening socket takes a new backlog from a
        // second listen().
        socket2::SockRef::from(&listener)
            .listen(4096)
            .context("setting the manager's listen backlog")?;
        let port = listener
            .local_addr()
            .context("reading the manager's port")?
            .port();
        let id = new_id();
        let (dir, created_dir) = prepare_dir(opts.dir.as_deref(), &id, &opts.nodes)?;

        let cgroups = SandboxCgroups::for_id(&layout, &id);
        let mut state = State::new(id, dir.clone(), created_dir, &cgroups, port);
        state.metrics_port = if opts.metrics {
            Some(free_loopback_port()?)
        } else {
            None
        };
        state.nodes = opts
            .nodes
            .iter()
            .map(|n| NodeState {
                name: n.clone(),
                systemd_pid: None,
            })
            .collect();
        // The directory exists: until the cluster value owns it, a failure removes it.
        let held = TeardownOnDrop::new(state.clone());
        // Written before the first cgroup exists: from here on `down --dir` can clean up.
        state.save()?;

        let procs_join = cgroups.join_spec(PROCS_GROUP)?;
        let pki = if opts.tls {
            let mut names: Vec<String> = opts.nodes.clone();
            names.extend(opts.allowed_nodes.iter().flatten().cloned());
            Some(make_pki(
                &dir.join("pki"),
                &names,
                &manager_hosts(opts.managers),
            )?)
        } else {
            None
        };
        let proxy_bin = binaries::locate_in("drover-proxy", &bin_dirs).ok();
        let metrics_port = state.metrics_port;
        // The manager's own state directory: a new sandbox starts with
        // nothing drained, even in a directory an older one used.
        let state_dir = dir.join(crate::state::MANAGER_STATE_DIR);
        if state_dir.exists() {
            std::fs::remove_dir_all(&state_dir)
                .with_context(|| format!("removing stale {}", state_dir.display()))?;
        }
        let mut cluster = Cluster {
            state,
            layout,
            cgroups,
            procs_join,
            listener,
            settings: DaemonSettings {
                port,
                heartbeat_interval_ms: opts.heartbeat_interval_ms,
                heartbeat_threshold_ms: opts.heartbeat_threshold_ms,
                pki,
                metrics_port,
                state_dir: Some(state_dir),
                controller_hosts: manager_hosts(opts.managers),
            },
            node_children: BTreeMap::new(),
            bus_child: None,
            manager: None,
            dns: None,
            agents: BTreeMap::new(),
            extra_agents: Vec::new(),
            extra_counter: 0,
            bin_dirs,
            proxy_bin,
            bluechi_compat: opts.bluechi_compat,
            system_policy: None,
            allowed: opts.nodes.clone(),
            agent_env: opts.agent_env.clone(),
            etcd: None,
            standbys: Vec::new(),
            ha_keys: String::new(),
            finished: false,
        };
        // Owned by `cluster` now: its `Drop` tears down.
        held.release();
        if opts.system_bus_policy {
            match SystemPolicy::write(&dir) {
                Ok(policy) => cluster.system_policy = Some(policy),
                Err(e) => return Err(cluster.failed_start(e)),
            }
        }
        // From here on a failure tears down what was started, keeping the logs.
        match cluster.start_nodes_and_bus(&opts.nodes).await {
            Ok(()) => Ok(cluster),
            Err(e) => Err(cluster.failed_start(e)),
        }
    }

    async fn start_nodes_and_bus(&mut self, nodes: &[String]) -> Result<()> {
        self.cgroups.create_group(PROCS_GROUP)?;
        for name in nodes {
            self.spawn_node(name)?;
        }
        for name in nodes {
            let pid = self.node_pid(name)?;
            node::wait_ready(
                &self.state.dir,
                name,
                pid,
                &self.log_path(&format!("systemd@{name}")),
                NODE_READY_TIMEOUT,
            )
            .await?;
        }
        self.start_bus().await?;
        self.state.save()
    }

    /// The sandbox directory.
    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// The manager's private bus (`DROVER_BUS` for droverctl).
    pub fn bus_address(&self) -> &str {
        &self.state.bus_address
    }

    /// The manager's TCP port (stable across manager restarts).
    pub fn manager_port(&self) -> u16 {
        self.state.manager_port
    }

    /// `http://127.0.0.1:PORT/metrics`, when the manager serves metrics
    /// ([`ClusterOptions::metrics`]; stable across manager restarts).
    pub fn metrics_url(&self) -> Option<String> {
        self.state
            .metrics_port
            .map(|p| format!("http://127.0.0.1:{p}/metrics"))
    }

    pub fn node_names(&self) -> Vec<String> {
        self.state.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// `unix:path=<node>/rt/bus`: that node's systemd as `org.freedesktop.systemd1`.
    pub fn node_bus_address(&self, node: &str) -> String {
        node::bus_address(&self.state.dir, node)
    }

    /// Runs `argv` inside the node (its namespaces and env; `systemctl --user` works).
    pub async fn exec(&self, node: &str, argv: &[&str]) -> Result<Output> {
        if argv.is_empty() {
            bail!("exec needs a command");
        }
        let pid = self.node_pid(node)?;
        let cmd = node::exec_command(&self.state.dir, node, pid, argv);
        tokio::process::Command::from(cmd)
            .output()
            .await
            .with_context(|| format!("running {argv:?} in node {node}"))
    }

    /// `systemctl --user ARGS` inside the node.
    pub async fn systemctl(&self, node: &str, args: &[&str]) -> Result<Output> {
        let mut argv = vec!["systemctl", "--user"];
        argv.extend_from_slice(args);
        self.exec(node, &argv).await
    }

    /// Writes a unit file into the node's user unit directory and reloads its systemd.
    pub async fn install_unit(&self, node: &str, name: &str, contents: &str) -> Result<()> {
        self.node_pid(node)?;
        let unit = UnitName::new(name)?;
        let path = node::unit_dir(&self.state.dir, node).join(unit.as_str());
        write_file(&path, contents)?;
        bus::reload_systemd(&self.node_bus_address(node)).await
    }

    /// What the node's proxy units printed (`drover-proxy@…` only: nodes have no journal,
    /// so the sandbox's proxy template appends the helper's output to a file per unit).
    /// Empty when the unit printed nothing yet.
    pub fn unit_log(&self, node: &str, unit: &str) -> Result<String> {
        self.node_pid(node)?;
        let unit = UnitName::new(unit)?;
        let path = node::unit_log_dir(&self.state.dir, node).join(format!("{unit}.log"));
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The pid of the node's agent, while the cluster holds one.
    pub fn agent_pid(&self, node: &str) -> Option<u32> {
        self.agents.get(node).map(Child::id)
    }

    /// Sends `sig` to the node's agent.
    pub fn signal_agent(&self, node: &str, sig: Signal) -> Result<()> {
        let pid = self
            .agent_pid(node)
            .with_context(|| format!("node {node} has no agent"))?;
        process::signal(pid, sig)
    }

    /// SIGTERM the node's agent, wait for it (SIGKILL after a grace period) and reap it.
    pub async fn stop_agent(&mut self, node: &str) -> Result<()> {
        let mut child = self
            .agents
            .remove(node)
            .with_context(|| format!("node {node} has no agent"))?;
        self.state.agent_pids.remove(node);
        self.state.save()?;
        process::terminate(&mut child, STOP_GRACE).await?;
        Ok(())
    }

    /// (Re)starts the node's agent; does not wait for the node to be online.
    pub async fn start_agent(&mut self, node: &str) -> Result<()> {
        self.node_pid(node)?;
        // An old agent that died (e.g. SIGKILLed by a test) is reaped here and replaced;
        // one that is exiting (its link already closed) is waited for.
        if let Some(child) = self.agents.get_mut(node)
            && process::settle(child)
                .await
                .context("checking the old agent")?
                .is_none()
        {
            bail!(
                "the agent of node {node} (pid {}) is still running; stop it first",
                child.id()
            );
        }
        let conf = self.state.dir.join(node).join("agent.conf");
        write_file(&conf, &files::agent_config(&self.settings, node))?;
        let child = self.spawn_agent(node, &conf, self.log_path(node))?;
        self.state.agent_pids.insert(node.to_string(), child.id());
        self.agents.insert(node.to_string(), child);
        self.state.save()
    }

    /// Starts an extra agent on `node` that registers as `claimed_name` (for refusal
    /// tests). Returns its pid; it lives until the cluster is torn down.
    ///
    /// A bus has one agent (it owns `org.eclipse.bluechi.Agent` and never lets
    /// it go, `drover_bus::name`): `node`'s own agent must be stopped first
    /// ([`Cluster::stop_agent`]), and an earlier extra agent on `node` must have
    /// ended, or the new one exits because the name is taken.
    pub async fn start_agent_named(&mut self, node: &str, claimed_name: &str) -> Result<u32> {
        Ok(self.start_agent_with(node, claimed_name, "").await?.pid)
    }

    /// [`Cluster::start_agent_named`] with `extra` appended to the agent's config file
    /// (for trust tests: keys set again override, `TLSCertificate=` with the other TLS
    /// keys empty turns TLS off). With TLS, `claimed_name` gets a certificate from the
    /// cluster's CA first unless it has one, so without `extra` what is tested is the
    /// manager's admission, not a TLS failure. It lives until the cluster is torn down.
    pub async fn start_agent_with(
        &mut self,
        node: &str,
        claimed_name: &str,
        extra: &str,
    ) -> Result<ExtraAgent> {
        self.node_pid(node)?;
        if let Some(pid) = self.agent_pid(node) {
            bail!(
                "node {node}'s own agent (pid {pid}) owns the agent's bus name there; \
                 stop it before starting another agent on that bus"
            );
        }
        if claimed_name.is_empty() || claimed_name.contains(['\n', '\r']) {
            bail!("claimed name {claimed_name:?} cannot be written into a config file");
        }
        if self.settings.pki.is_some() {
            self.issue_node(claimed_name)?;
        }
        self.extra_counter += 1;
        let n = self.extra_counter;
        let conf = self.state.dir.join(format!("extra-agent-{n}.conf"));
        let mut text = files::agent_config(&self.settings, claimed_name);
        if !extra.is_empty() {
            text.push_str(extra);
            if !extra.ends_with('\n') {
                text.push('\n');
            }
        }
        write_file(&conf, &text)?;
        let log = self.state.dir.join(format!("agent@{node}+extra-{n}.log"));
        let child = self.spawn_agent(node, &conf, log.clone())?;
        let pid = child.id();
        self.state.extra_agent_pids.push(pid);
        self.extra_agents.push(child);
        self.state.save()?;
        Ok(ExtraAgent { pid, log })
    }

    /// How the extra agent `pid` ended: `None` while it runs (reaps it once ended).
    pub fn extra_agent_exit(&mut self, pid: u32) -> Result<Option<std::process::ExitStatus>> {
        let child = self
            .extra_agents
            .iter_mut()
            .find(|c| c.id() == pid)
            .with_context(|| format!("no extra agent with pid {pid}"))?;
        child.try_wait().context("checking an extra agent")
    }

    /// The cluster's PKI (`None` without TLS): its CA can issue, rotate and
    /// revoke certificates for tests (`drover_tls::pki::Pki`).
    pub fn pki(&self) -> Option<drover_tls::pki::Pki> {
        self.settings.pki.as_ref().map(drover_tls::pki::Pki::new)
    }

    /// Issues a certificate for `node` from the cluster's CA unless it has one.
    pub fn issue_node(&self, node: &str) -> Result<()> {
        let Some(pki) = self.pki() else {
            bail!("the sandbox runs without TLS");
        };
        let name = NodeName::new(node)?;
        if !pki.node_key(&name).exists() {
            pki.issue_node(&name, &pki_options()?)?;
        }
        Ok(())
    }

    /// Rewrites manager.conf as [`Cluster::start`] does, with `allow_all_proxies` and
    /// `extra` in place of the options' values, and sends the manager SIGHUP (config
    /// reload). Returns once the signal is sent; the reload itself is the manager's.
    pub fn reconfigure_manager(&self, allow_all_proxies: bool, extra: &str) -> Result<()> {
        self.write_manager_config(allow_all_proxies, extra)?;
        self.signal_manager(Signal::SIGHUP)
    }

    /// Sends `sig` to the manager.
    pub fn signal_manager(&self, sig: Signal) -> Result<()> {
        let pid = self
            .state
            .manager_pid
            .context("the manager is not running")?;
        process::signal(pid, sig)
    }

    fn write_manager_config(&self, allow_all_proxies: bool, extra: &str) -> Result<()> {
        let text = files::manager_config(
            &self.settings,
            &self.node_names(),
            &self.allowed,
            allow_all_proxies,
            &format!("{extra}{}", self.ha_keys),
        );
        write_file(&self.dir().join("manager.conf"), &text)
    }

    /// SIGTERM the manager, wait (SIGKILL after a grace period) and reap. The TCP port
    /// stays bound by the sandbox.
    pub async fn stop_manager(&mut self) -> Result<()> {
        if let Some(mut child) = self.manager.take() {
            self.state.manager_pid = None;
            self.state.save()?;
            process::terminate(&mut child, STOP_GRACE).await?;
        }
        Ok(())
    }

    /// Waits (at most `timeout`) for the manager to exit by itself, reaps it and returns
    /// its exit status; the cluster then holds no manager ([`Cluster::start_manager`]
    /// starts one again).
    pub async fn wait_manager_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let child = self
            .manager
            .as_mut()
            .context("the manager is not running")?;
        let status = process::wait_timeout_async(child, timeout)
            .await?
            .with_context(|| format!("the manager did not exit within {timeout:?}"))?;
        self.manager = None;
        self.state.manager_pid = None;
        self.state.save()?;
        Ok(status)
    }

    /// Waits (at most `timeout`) for the agent of `node` to exit by itself, reaps it and
    /// returns its exit status ([`Cluster::start_agent`] starts one again).
    pub async fn wait_agent_exit(&mut self, node: &str, timeout: Duration) -> Result<ExitStatus> {
        let child = self
            .agents
            .get_mut(node)
            .with_context(|| format!("node {node} has no agent"))?;
        let status = process::wait_timeout_async(child, timeout)
            .await?
            .with_context(|| format!("the agent of node {node} did not exit within {timeout:?}"))?;
        self.agents.remove(node);
        self.state.agent_pids.remove(node);
        self.state.save()?;
        Ok(status)
    }

    /// SIGKILLs the manager's bus daemon and reaps it: a crashed bus, for tests of what
    /// the daemons do without it. [`Cluster::restart_bus`] brings it back.
    pub async fn kill_bus(&mut self) -> Result<()> {
        let mut child = self.bus_child.take().context("the bus is not running")?;
        self.state.bus_pid = None;
        self.state.save()?;
        let _ = process::signal(child.id(), Signal::SIGKILL);
        process::terminate(&mut child, STOP_GRACE).await?;
        Ok(())
    }

    /// Starts the manager's bus daemon again, on the same address.
    pub async fn restart_bus(&mut self) -> Result<()> {
        if self.bus_child.is_some() {
            bail!("the bus is running; kill it first");
        }
        self.start_bus().await
    }

    /// Starts the manager again on the same port and bus; returns once it owns its name.
    pub async fn start_manager(&mut self) -> Result<()> {
        let bin = binaries::locate_in("drover-manager", &self.bin_dirs)?;
        self.spawn_manager(&bin).await
    }

    /// Starts `drover-dns` beside the manager (`drover-sandbox up --dns`): on
    /// a free loopback port, asking this sandbox's manager on its bus, with
    /// `DIR/dns.conf` holding the sandbox's `[drover-dns]` settings and
    /// `extra_config` after them (keys of that section, one per line). It
    /// lives in the sandbox's process cgroup, so teardown ends it with the
    /// rest. Returns when it answers (its log says it serves).
    pub async fn start_dns(&mut self, extra_config: &str) -> Result<SocketAddr> {
        if let Some(pid) = self.state.dns_pid {
            bail!("drover-dns (pid {pid}) already runs in this sandbox");
        }
        let bin = binaries::locate_in("drover-dns", &self.bin_dirs)?;
        let port = free_loopback_port()?;
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let conf = self.state.dir.join("dns.conf");
        write_file(
            &conf,
            &format!(
                "[drover-dns]\nListenAddress={address}\nLogTarget=stderr\nLogLevel=DEBUG\n{extra_config}\n"
            ),
        )?;
        let bus_address = self.state.bus_address.clone();
        let log = self.log_path("dns");
        let child = process::spawn(Spawn {
            program: &bin,
            args: vec![
                "--no-default-config".into(),
                "-c".into(),
                conf.display().to_string(),
                "--bus".into(),
                bus_address,
            ],
            env: Vec::new(),
            clear_env: false,
            log: log.clone(),
            cgroup: &self.procs_join,
            listen_fd: None,
            stdout_pipe: false,
        })?;
        self.state.dns_pid = Some(child.id());
        self.state.dns_port = Some(port);
        self.state.save()?;
        let mut child = child;
        let deadline = Instant::now() + MANAGER_READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().context("checking drover-dns")? {
                self.state.dns_pid = None;
                self.state.dns_port = None;
                self.state.save()?;
                bail!(
                    "drover-dns exited during startup ({status})\n{}",
                    process::log_tail(&log, 30)
                );
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("serving zone ") {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "drover-dns did not start within {MANAGER_READY_TIMEOUT:?}\n{}",
                    process::log_tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.dns = Some(child);
        Ok(address)
    }

    /// Where `drover-dns` answers, when [`Cluster::start_dns`] started it.
    pub fn dns_address(&self) -> Option<SocketAddr> {
        self.state
            .dns_port
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Polls `Node.Status` of `node` on the manager's bus until it equals `status`.
    pub async fn wait_node_status(
        &self,
        node: &str,
        status: &str,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut conn = None;
        let mut last = String::new();
        loop {
            if conn.is_none() {
                match bus::connect(self.bus_address()).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if let Some(c) = &conn {
                match bus::node_status(c, node).await {
                    Ok(s) if s == status => return Ok(()),
                    Ok(s) => last = format!("Status={s}"),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {node} did not become {status} within {timeout:?} (last: {last})\n{}\n{}",
                    process::log_tail(&self.log_path("manager"), 20),
                    process::log_tail(&self.log_path(node), 20),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every node in `nodes` is online; fails fast (with its log) when an
    /// agent or the manager exits meanwhile.
    async fn wait_all_online(&mut self, nodes: &[String]) -> Result<()> {
        let deadline = Instant::now() + ONLINE_TIMEOUT;
        let conn = bus::connect(self.bus_address()).await?;
        loop {
            let mut exited = None;
            for (name, child) in &mut self.agents {
                if let Some(status) = child.try_wait().context("checking an agent")? {
                    exited = Some((name.clone(), status));
                    break;
                }
            }
            if let Some((name, status)) = exited {
                bail!(
                    "the agent of node {name} exited during startup ({status})\n{}",
                    process::log_tail(&self.log_path(&name), 30)
                );
            }
            if let Some(child) = &mut self.manager
                && let Some(status) = child.try_wait().context("checking the manager")?
            {
                bail!(
                    "drover-manager exited during startup ({status})\n{}",
                    process::log_tail(&self.log_path("manager"), 30)
                );
            }
            let mut pending = Vec::new();
            for name in nodes {
                match bus::node_status(&conn, name).await {
                    Ok(s) if s == "online" => {}
                    Ok(s) => pending.push(format!("{name}: {s}")),
                    Err(e) => pending.push(format!("{name}: {e:#}")),
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut msg = format!(
                    "not every node came online within {ONLINE_TIMEOUT:?} ({})\n{}",
                    pending.join("; "),
                    process::log_tail(&self.log_path("manager"), 20)
                );
                for name in nodes {
                    msg.push('\n');
                    msg.push_str(&process::log_tail(&self.log_path(name), 10));
                }
                bail!(msg);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Log file of `what`: `"manager"`, `"bus"`, `"dns"`, `"etcd"`, a node name (its
    /// agent), or `"systemd@NODE"` (that node's systemd). Managers 2..N of
    /// `up --managers N` log to `manager-K.log`.
    pub fn log_path(&self, what: &str) -> PathBuf {
        match what {
            "manager" => self.state.dir.join("manager.log"),
            "bus" => self.state.dir.join("bus.log"),
            "dns" => self.state.dir.join("dns.log"),
            "etcd" => self.state.dir.join("etcd.log"),
            other if other.starts_with("systemd@") => self.state.dir.join(format!("{other}.log")),
            node => self.state.dir.join(format!("agent@{node}.log")),
        }
    }

    /// Orderly teardown: SIGTERM agents and manager (SIGKILL after a grace period), kill
    /// everything left in the sandbox cgroups, unmount leftovers, remove cgroups and the
    /// directory. Keeps going after a failure and reports all of them.
    pub async fn down(mut self) -> Result<()> {
        let mut errors = Vec::new();
        let mut daemons: Vec<Child> = self.extra_agents.drain(..).collect();
        daemons.extend(std::mem::take(&mut self.agents).into_values());
        daemons.extend(self.manager.take());
        daemons.extend(self.standbys.iter_mut().filter_map(|m| m.manager.take()));
        daemons.extend(self.dns.take());
        // Signal all first so the grace periods overlap.
        for child in &mut daemons {
            if let Ok(None) = child.try_wait() {
                let _ = process::signal(child.id(), Signal::SIGTERM);
                let _ = process::signal(child.id(), Signal::SIGCONT);
            }
        }
        for child in &mut daemons {
            if let Err(e) = process::terminate(child, STOP_GRACE).await {
                errors.push(format!("{e:#}"));
            }
        }
        errors.extend(self.kill_and_clean());
        self.finished = true;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(
                "sandbox teardown failed:\n  {}",
                errors.join("\n  ")
            ))
        }
    }

    /// Leaves every process running and forgets them (for `drover-sandbox up`); the
    /// state file describes the sandbox for later `exec`/`install`/`down`.
    pub fn detach(mut self) -> Result<PathBuf> {
        self.state.save()?;
        self.finished = true;
        Ok(self.state.dir.clone())
    }

    /// The sandbox's persisted description.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Kills everything through the cgroups, reaps our children, removes the rest.
    fn kill_and_clean(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = self.state.kill_all() {
            errors.push(format!("{e:#}"));
        }
        let children = self
            .node_children
            .values_mut()
            .chain(self.agents.values_mut())
            .chain(self.extra_agents.iter_mut())
            .chain(self.manager.iter_mut())
            .chain(self.bus_child.iter_mut())
            .chain(self.etcd.iter_mut())
            .chain(
                self.standbys
                    .iter_mut()
                    .flat_map(|m| m.manager.iter_mut().chain(m.bus.iter_mut())),
            );
        for child in children {
            process::kill_and_reap(child);
        }
        errors.extend(self.state.cleanup());
        errors
    }

    fn node_pid(&self, node: &str) -> Result<u32> {
        self.state
            .node(node)?
            .systemd_pid
            .with_context(|| format!("node {node} is not running"))
    }

    fn spawn_node(&mut self, name: &str) -> Result<()> {
        node::prepare_dirs(&self.state.dir, name)?;
        if let Some(policy) = &self.system_policy {
            policy.apply_to_node(&self.state.dir, name)?;
        }
        // Written before the node's systemd starts, so no reload is needed.
        if let Some(bin) = &self.proxy_bin {
            let logs = node::unit_log_dir(&self.state.dir, name);
            std::fs::create_dir_all(&logs)
                .with_context(|| format!("creating {}", logs.display()))?;
            let units =
                files::proxy_units(bin, &logs, self.bluechi_compat).map_err(|e| anyhow!(e))?;
            for (file, text) in units {
                write_file(&node::unit_dir(&self.state.dir, name).join(file), &text)?;
            }
        }
        self.cgroups.create_group(name)?;
        let join = self.cgroups.join_spec(name)?;
        let child = node::spawn(
            &self.layout,
            &join,
            &self.state.dir,
            name,
            self.log_path(&format!("systemd@{name}")),
        )?;
        let pid = child.id();
        self.node_children.insert(name.to_string(), child);
        if let Some(n) = self.state.nodes.iter_mut().find(|n| n.name == name) {
            n.systemd_pid = Some(pid);
        }
        self.state.save()
    }

    async fn start_bus(&mut self) -> Result<()> {
        let dir = self.state.dir.clone();
        let mut child = self.spawn_bus(
            &dir.join("bus"),
            &dir.join("bus.conf"),
            self.log_path("bus"),
        )?;
        let stdout = child.stdout.take().context("dbus-daemon stdout")?;
        self.state.bus_pid = Some(child.id());
        self.bus_child = Some(child);
        self.state.save()?;
        wait_bus_ready(stdout, &self.log_path("bus")).await
    }

    /// Starts a dbus-daemon listening on `socket` (its config written to `conf`), with
    /// the sandbox's policy; its stdout is piped ([`wait_bus_ready`] reads it).
    fn spawn_bus(&self, socket: &Path, conf: &Path, log: PathBuf) -> Result<Child> {
        let text = match &self.system_policy {
            Some(policy) => policy.config(Some(socket)),
            None => files::bus_config(socket),
        };
        write_file(conf, &text)?;
        process::spawn(Spawn {
            program: Path::new("/usr/bin/dbus-daemon"),
            args: vec![
                "--nofork".into(),
                "--print-address".into(),
                format!("--config-file={}", conf.display()),
            ],
            env: Vec::new(),
            clear_env: false,
            log,
            cgroup: &self.procs_join,
            listen_fd: None,
            stdout_pipe: true,
        })
    }

    async fn spawn_manager(&mut self, bin: &Path) -> Result<()> {
        if let Some(child) = &mut self.manager
            && process::settle(child)
                .await
                .context("checking the manager")?
                .is_none()
        {
            bail!("the manager (pid {}) is already running", child.id());
        }
        let dir = self.state.dir.clone();
        let bus_address = self.state.bus_address.clone();
        let child = process::spawn(Spawn {
            program: bin,
            args: vec![
                "--no-default-config".into(),
                "-c".into(),
                dir.join("manager.conf").display().to_string(),
                "--bus".into(),
                bus_address.clone(),
            ],
            env: vec![("DBUS_SESSION_BUS_ADDRESS".into(), bus_address.clone())],
            clear_env: false,
            log: self.log_path("manager"),
            cgroup: &self.procs_join,
            listen_fd: Some(process::raw_fd(&self.listener)),
            stdout_pipe: false,
        })?;
        let pid = child.id();
        self.manager = Some(child);
        self.state.manager_pid = Some(pid);
        self.state.save()?;
        let log = self.log_path("manager");
        match &mut self.manager {
            Some(child) => wait_manager_ready(child, &bus_address, &log).await,
            None => bail!("the manager is gone"),
        }
    }

    fn spawn_agent(&self, node: &str, conf: &Path, log: PathBuf) -> Result<Child> {
        let bin = binaries::locate_in("drover-agent", &self.bin_dirs)?;
        let bus_address = self.node_bus_address(node);
        process::spawn(Spawn {
            program: &bin,
            args: vec![
                "--no-default-config".into(),
                "-c".into(),
                conf.display().to_string(),
                // `--bus` names the node's bus, where its *user* systemd answers; the
                // agent's `--user` (session bus) is an alternative to it, not an addition.
                "--bus".into(),
                bus_address,
            ],
            env: node::env(&self.state.dir, node)
                .into_iter()
                .chain(self.agent_env.iter().cloned())
                .collect(),
            clear_env: false,
            log,
            cgroup: &self.procs_join,
            listen_fd: None,
            stdout_pipe: false,
        })
        .with_context(|| format!("starting the agent of node {node}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if std::thread::panicking() {
            let mut logs = vec![
                self.log_path("manager"),
                self.log_path("dns"),
                self.log_path("etcd"),
            ];
            logs.extend(self.standbys.iter().map(|m| m.log(&self.state.dir)));
            logs.extend(self.state.nodes.iter().map(|n| self.log_path(&n.name)));
            for log in logs.iter().filter(|l| l.exists()) {
                eprintln!("{}", process::log_tail(log, 40));
            }
        }
        for error in self.kill_and_clean() {
            eprintln!("drover-sandbox: teardown: {error}");
        }
        self.finished = true;
    }
}

/// Waits until the dbus-daemon whose stdout is `stdout` prints its address (it
/// listens then); EOF means it died.
async fn wait_bus_ready(stdout: std::process::ChildStdout, log: &Path) -> Result<()> {
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    });
    let line = tokio::time::timeout(BUS_READY_TIMEOUT, line).await;
    match line {
        Ok(Ok(Ok(l))) if l.starts_with("unix:") => Ok(()),
        _ => bail!(
            "the sandbox's dbus-daemon did not come up within {BUS_READY_TIMEOUT:?}\n{}",
            process::log_tail(log, 20)
        ),
    }
}

/// Waits until the manager `child` owns its name on `bus_address`; fails with the tail
/// of its `log` when it exits first or takes longer than [`MANAGER_READY_TIMEOUT`].
async fn wait_manager_ready(child: &mut Child, bus_address: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + MANAGER_READY_TIMEOUT;
    let mut last;
    loop {
        if let Some(status) = child.try_wait().context("checking the manager")? {
            bail!(
                "drover-manager exited during startup ({status})\n{}",
                process::log_tail(log, 30)
            );
        }
        match bus::connect(bus_address).await {
            Ok(conn) => match bus::name_has_owner(&conn, bluechi::BUS_NAME).await {
                Ok(true) => return Ok(()),
                Ok(false) => last = format!("{} has no owner yet", bluechi::BUS_NAME),
                Err(e) => last = format!("{e:#}"),
            },
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!(
                "drover-manager did not take {} within {MANAGER_READY_TIMEOUT:?} ({last})\n{}",
                bluechi::BUS_NAME,
                process::log_tail(log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A year: longer than any test or demo.
fn pki_options() -> Result<drover_tls::pki::Options> {
    Ok(drover_tls::pki::Options {
        validity: drover_tls::pki::Validity::days(365)?,
        force: false,
    })
}

/// A fresh CA in `dir`, a manager certificate for 127.0.0.1 (what agents
/// dial), `localhost` and `::1` (so `SwitchController` to the manager by any
/// loopback name passes the agent's name check) and the other `managers`'
/// addresses (every manager of `up --managers N` uses it), and a certificate
/// for each of `nodes`. Returns `dir`.
fn make_pki(dir: &Path, nodes: &[String], managers: &[String]) -> Result<PathBuf> {
    let pki = drover_tls::pki::Pki::new(dir);
    let options = pki_options()?;
    pki.create_ca(&options).context("making the sandbox CA")?;
    let mut names: Vec<&str> = vec!["127.0.0.1", "localhost", "::1"];
    names.extend(
        managers
            .iter()
            .map(String::as_str)
            .filter(|h| *h != "127.0.0.1"),
    );
    pki.issue_manager(&names, &options)
        .context("issuing the manager's certificate")?;
    let mut names: Vec<NodeName> = Vec::new();
    for n in nodes {
        let name = NodeName::new(n.as_str())?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    pki.issue_nodes(&names, &options)
        .context("issuing the nodes' certificates")?;
    Ok(dir.to_path_buf())
}

/// The addresses the agents list in `ControllerHost=`: each manager's own
/// ([`manager_host`]), or 127.0.0.1 for a sandbox of one manager.
fn manager_hosts(managers: Option<usize>) -> Vec<String> {
    (1..=managers.unwrap_or(1)).map(manager_host).collect()
}

fn new_id() -> String {
    let n = SANDBOX_COUNTER.fetch_add(1, Ordering::Relaxed);
    // The clock part keeps ids unique across runs that reuse a pid.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{:x}", std::process::id(), nanos & 0xfffff)
}

/// Makes the sandbox directory; cleans a dead sandbox out of it, refuses a live one.
/// The policy files of a sandbox whose buses are system buses
/// ([`ClusterOptions::system_bus_policy`]), written into `DIR/policy/`.
#[derive(Debug, Clone)]
struct SystemPolicy {
    default_policy: String,
    includes: Vec<PathBuf>,
}

impl SystemPolicy {
    fn write(dir: &Path) -> Result<SystemPolicy> {
        let system_conf = std::fs::read_to_string(files::SYSTEM_CONF)
            .with_context(|| format!("reading {} (package dbus)", files::SYSTEM_CONF))?;
        let default_policy = files::system_default_policy(&system_conf).map_err(|e| anyhow!(e))?;
        let policy_dir = dir.join("policy");
        std::fs::create_dir_all(&policy_dir)
            .with_context(|| format!("creating {}", policy_dir.display()))?;
        let systemd = PathBuf::from(files::SYSTEMD_POLICY);
        if !systemd.is_file() {
            bail!("{} is missing (package systemd)", systemd.display());
        }
        let mut includes = vec![systemd];
        for (name, text) in files::SHIPPED_POLICIES {
            let path = policy_dir.join(name);
            write_file(&path, text)?;
            includes.push(path);
        }
        Ok(SystemPolicy {
            default_policy,
            includes,
        })
    }

    fn config(&self, listen: Option<&Path>) -> String {
        files::system_bus_config(listen, &self.default_policy, &self.includes)
    }

    /// The node's own bus (its `systemd --user`'s socket-activated `dbus.service`)
    /// runs with this policy instead of the session bus's, and every user may reach
    /// its socket.
    fn apply_to_node(&self, dir: &Path, node: &str) -> Result<()> {
        let home = node::home(dir, node);
        let conf = home.join("system-bus.conf");
        write_file(&conf, &self.config(None))?;
        let dropin = node::unit_dir(dir, node).join("dbus.service.d");
        std::fs::create_dir_all(&dropin)
            .with_context(|| format!("creating {}", dropin.display()))?;
        write_file(
            &dropin.join("50-system-policy.conf"),
            &format!(
                "# Written by drover-sandbox: this node's bus has the system bus's policy.\n\
                 [Service]\nExecStart=\nExecStart=/usr/bin/dbus-daemon --config-file={} \
                 --nofork --nopidfile\n",
                conf.display()
            ),
        )?;
        use std::os::unix::fs::PermissionsExt;
        for path in [dir.to_path_buf(), home, node::runtime_dir(dir, node)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o711))
                .with_context(|| format!("chmod 711 {}", path.display()))?;
        }
        Ok(())
    }
}

fn prepare_dir(requested: Option<&Path>, id: &str, nodes: &[String]) -> Result<(PathBuf, bool)> {
    let dir = match requested {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        Some(d) => std::env::current_dir()
            .context("current directory")?
            .join(d),
        None => PathBuf::from(format!("/tmp/drover-sb-{id}")),
    };
    let text = dir
        .to_str()
        .context("the sandbox directory must be valid UTF-8")?;
    // The path ends up in D-Bus addresses, config files and shell snippets: keep it plain.
    if let Some(bad) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/._-+".contains(*c)))
    {
        bail!("sandbox directory {text:?} contains {bad:?}; use letters, digits and / . _ - +");
    }
    check_socket_paths(&dir, nodes)?;
    if let Some(old) = State::load(&dir)? {
        if old.is_live() {
            bail!(
                "a sandbox is already running in {} (manager pid {:?}); run `drover-sandbox down --dir {}` first",
                dir.display(),
                old.manager_pid,
                dir.display()
            );
        }
        let errors = old.teardown();
        if !errors.is_empty() {
            bail!(
                "cleaning up the dead sandbox in {} failed: {}",
                dir.display(),
                errors.join("; ")
            );
        }
    }
    let created = !dir.exists();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok((dir, created))
}

fn check_socket_paths(dir: &Path, nodes: &[String]) -> Result<()> {
    let longest = nodes.iter().map(|n| n.len()).max().unwrap_or(0);
    // systemd's own socket is the deepest: <dir>/<node>/rt/systemd/private
    let len = dir.as_os_str().len() + 1 + longest + "/rt/systemd/private".len();
    if len > MAX_SOCKET_PATH {
        bail!(
            "sandbox directory {} is too long: node sockets would be {len} bytes, the limit is {MAX_SOCKET_PATH}",
            dir.display()
        );
    }
    Ok(())
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    //! These tests run real `systemd --user` nodes (root, hybrid or v2 cgroups). They use
    //! `start_base` (nodes + private bus) so they do not depend on the drover daemons.
    use super::*;

    const ONESHOT: &str = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n";
    const SLEEPER: &str = "[Service]\nExecStart=/bin/sleep 600\n";

    async fn base(nodes: usize) -> Cluster {
        Cluster::start_base(&ClusterOptions::with_nodes(nodes), binaries::search_dirs())
            .await
            .expect("nodes and bus start")
    }

    /// Everything a torn-down sandbox must not leave behind.
    pub(crate) fn leftovers(state: &State) -> Vec<String> {
        let mut left = Vec::new();
        let pids = state.cgroups().pids();
        if !pids.is_empty() {
            left.push(format!("processes {pids:?}"));
        }
        for n in &state.nodes {
            if let Some(pid) = n.systemd_pid.filter(|p| process::alive(*p)) {
                left.push(format!("systemd of {} (pid {pid})", n.name));
            }
        }
        for p in state.cgroup_parents.iter().filter(|p| p.exists()) {
            left.push(format!("cgroup {}", p.display()));
        }
        if state.dir.exists() {
            left.push(format!("directory {}", state.dir.display()));
        }
        let mounts = crate::state::mounts_below(&state.dir).unwrap();
        if !mounts.is_empty() {
            left.push(format!("mounts {mounts:?}"));
        }
        left
    }

    async fn stdout_of(cluster: &Cluster, node: &str, argv: &[&str]) -> String {
        let out = cluster.exec(node, argv).await.unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nodes_are_real_isolated_systemd_managers_and_down_leaves_nothing() {
        let cluster = base(2).await;
        let state = cluster.state().clone();

        assert_eq!(
            stdout_of(
                &cluster,
                "node1",
                &["systemctl", "--user", "is-system-running"]
            )
            .await,
            "running"
        );
        let state_on_bus = bus::systemd_state(&cluster.node_bus_address("node2"))
            .await
            .unwrap();
        assert_eq!(state_on_bus, "running");

        // A unit installed on node1 exists only there.
        cluster
            .install_unit("node1", "only-here.service", ONESHOT)
            .await
            .unwrap();
        let out = cluster
            .systemctl("node1", &["start", "only-here.service"])
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            stdout_of(
                &cluster,
                "node1",
                &["systemctl", "--user", "is-active", "only-here.service"]
            )
            .await,
            "active"
        );
        let out = cluster
            .systemctl("node2", &["cat", "only-here.service"])
            .await
            .unwrap();
        assert!(!out.status.success(), "node2 must not see node1's unit");

        // Same unit name on both nodes: stopping it on one leaves the other's process alone
        // (each node has its own cgroup root).
        for n in ["node1", "node2"] {
            cluster
                .install_unit(n, "web.service", SLEEPER)
                .await
                .unwrap();
            assert!(
                cluster
                    .systemctl(n, &["start", "web.service"])
                    .await
                    .unwrap()
                    .status
                    .success()
            );
        }
        assert!(
            cluster
                .systemctl("node1", &["stop", "web.service"])
                .await
                .unwrap()
                .status
                .success()
        );
        assert_eq!(
            stdout_of(
                &cluster,
                "node2",
                &["systemctl", "--user", "is-active", "web.service"]
            )
            .await,
            "active"
        );
        assert_eq!(
            stdout_of(
                &cluster,
                "node1",
                &["systemctl", "--user", "is-active", "web.service"]
            )
            .await,
            "inactive"
        );

        // exec passes exit codes through and runs in the node's environment.
        let out = cluster
            .exec("node2", &["/bin/sh", "-c", "exit 7"])
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(7));
        let rt = stdout_of(
            &cluster,
            "node2",
            &["/bin/sh", "-c", "echo $XDG_RUNTIME_DIR"],
        )
        .await;
        assert_eq!(Path::new(&rt), node::runtime_dir(cluster.dir(), "node2"));

        // Bad input is refused with a clear error.
        let err = cluster
            .exec("node9", &["true"])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("no node 'node9'"), "{err}");
        let err = cluster
            .install_unit("node1", "../evil.service", ONESHOT)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid unit name"), "{err}");

        assert!(
            !state.cgroups().pids().is_empty(),
            "the sandbox is running before down"
        );
        cluster.down().await.unwrap();
        assert_eq!(leftovers(&state), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn private_bus_answers_and_daemons_join_the_sandbox_cgroup() {
        let cluster = base(1).await;
        let conn = bus::connect(cluster.bus_address()).await.unwrap();
        assert!(
            bus::name_has_owner(&conn, "org.freedesktop.DBus")
                .await
                .unwrap()
        );
        let bus_pid = cluster.state().bus_pid.unwrap();
        let cgroup = std::fs::read_to_string(format!("/proc/{bus_pid}/cgroup")).unwrap();
        let expected = format!("drover-sandbox-{}/{PROCS_GROUP}", cluster.state().id);
        assert!(cgroup.contains(&expected), "{cgroup}");
        let state = cluster.state().clone();
        drop(conn);
        cluster.down().await.unwrap();
        assert_eq!(leftovers(&state), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn socket_activated_child_gets_the_listener_as_fd3_with_its_own_pid() {
        let cluster = base(1).await;
        let log = cluster.dir().join("fd3.log");
        // The child prints what sd_listen_fds() would check, and what fd 3 is.
        let script = "echo \"$LISTEN_FDS $LISTEN_PID $$ $(readlink /proc/$$/fd/3)\"";
        let mut child = process::spawn(Spawn {
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            clear_env: false,
            log: log.clone(),
            cgroup: &cluster.procs_join,
            listen_fd: Some(process::raw_fd(&cluster.listener)),
            stdout_pipe: false,
        })
        .unwrap();
        let status = process::wait_timeout(&mut child, Duration::from_secs(10)).unwrap();
        assert!(status.is_some_and(|s| s.success()));
        let text = std::fs::read_to_string(&log).unwrap();
        let fields: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(fields.len(), 4, "{text}");
        assert_eq!(fields[0], "1");
        assert_eq!(
            fields[1],
            child.id().to_string(),
            "LISTEN_PID is the pid that runs the daemon"
        );
        assert_eq!(fields[1], fields[2]);
        let inode = std::fs::metadata(format!(
            "/proc/self/fd/{}",
            process::raw_fd(&cluster.listener)
        ))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
        assert_eq!(
            fields[3],
            format!("socket:[{inode}]"),
            "fd 3 is the sandbox's listener"
        );
        cluster.down().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_manager_binary_is_a_clear_error() {
        let mut cluster = base(1).await;
        let empty = cluster.dir().join("no-binaries-here");
        std::fs::create_dir_all(&empty).unwrap();
        cluster.bin_dirs = vec![empty];
        let err = cluster.start_manager().await.unwrap_err().to_string();
        assert!(err.contains("'drover-manager' not found"), "{err}");
        assert!(err.contains("cargo build --workspace"), "{err}");
        let err = cluster.start_agent("node1").await.unwrap_err().to_string();
        assert!(err.contains("'drover-agent' not found"), "{err}");
        cluster.down().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_start_keeps_its_logs_and_says_where() {
        let mut cluster = base(1).await;
        let state = cluster.state().clone();
        // A drover-manager that fails at once, as a broken build or config would.
        let bins = cluster.dir().join("broken-bins");
        std::fs::create_dir_all(&bins).unwrap();
        let manager = bins.join("drover-manager");
        std::fs::write(
            &manager,
            "#!/bin/sh\necho 'manager says: boom' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(
            &manager,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        cluster.bin_dirs = vec![bins];
        let opts = ClusterOptions {
            start_agents: false,
            ..ClusterOptions::with_nodes(1)
        };
        let err = cluster.start_daemons(&opts).await.unwrap_err();
        let err = cluster.failed_start(err).to_string();
        assert!(
            err.contains("drover-manager exited during startup"),
            "{err}"
        );
        let kept = std::env::temp_dir().join(format!("drover-sandbox-failed-{}", state.id));
        assert!(
            err.contains(&format!("are kept in {}", kept.display())),
            "{err}"
        );
        let log = std::fs::read_to_string(kept.join("manager.log")).unwrap();
        assert!(log.contains("manager says: boom"), "{log}");
        assert!(kept.join("manager.conf").is_file());
        assert!(kept.join("systemd@node1.log").is_file());
        // The sandbox itself is gone.
        assert_eq!(leftovers(&state), Vec::<String>::new());
        std::fs::remove_dir_all(&kept).unwrap();
    }

    #[test]
    fn dropping_a_cluster_in_a_panicking_test_tears_it_down() {
        let (tx, rx) = std::sync::mpsc::channel();
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let cluster = rt.block_on(base(2));
            tx.send(cluster.state().clone()).unwrap();
            panic!("a test failing while it owns a cluster");
        })
        .join();
        assert!(joined.is_err(), "the thread panicked");
        let state = rx.recv().unwrap();
        assert_eq!(leftovers(&state), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn detached_sandbox_is_found_by_its_dir_refused_twice_and_torn_down_from_state() {
        let dir = PathBuf::from(format!("/tmp/drover-sb-test-{}", new_id()));
        let opts = ClusterOptions {
            dir: Some(dir.clone()),
            ..ClusterOptions::with_nodes(1)
        };
        let cluster = Cluster::start_base(&opts, Vec::new()).await.unwrap();
        let pid = cluster.state().nodes[0].systemd_pid.unwrap();
        cluster.detach().unwrap();
        // The creator is gone (detached): everything still runs, described by state.json.
        assert!(process::alive(pid));
        let state = State::load(&dir).unwrap().expect("state.json");
        // Nobody owns it now: this tears it down if an assert below fails.
        let held = TeardownOnDrop::new(state.clone());
        assert!(state.created_dir);
        assert!(state.is_live());

        let err = Cluster::start_base(&opts, Vec::new())
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("already running"), "{err}");

        assert_eq!(held.teardown(), Vec::<String>::new());
        assert_eq!(leftovers(&state), Vec::<String>::new());
    }

    #[test]
    fn a_detached_sandbox_held_by_a_failing_test_is_torn_down() {
        let dir = PathBuf::from(format!("/tmp/drover-sb-held-{}", new_id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let opts = ClusterOptions {
                dir: Some(dir.clone()),
                ..ClusterOptions::with_nodes(2)
            };
            let cluster = rt.block_on(Cluster::start_base(&opts, Vec::new())).unwrap();
            cluster.detach().unwrap();
            let held = TeardownOnDrop::new(State::load(&dir).unwrap().unwrap());
            tx.send(held.state().clone()).unwrap();
            assert!(held.state().is_live());
            panic!("a test failing while it holds a detached sandbox");
        })
        .join();
        assert!(joined.is_err(), "the thread panicked");
        let state = rx.recv().unwrap();
        assert_eq!(leftovers(&state), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_that_fails_before_the_nodes_removes_what_it_made() {
        // A file where the sandbox's PKI directory goes: the start fails after the
        // directory and state.json exist, before any cgroup or process.
        let dir = PathBuf::from(format!("/tmp/drover-sb-early-{}", new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pki"), "in the way").unwrap();
        let opts = ClusterOptions {
            dir: Some(dir.clone()),
            ..ClusterOptions::with_nodes(1)
        };
        let err = Cluster::start_base(&opts, Vec::new())
            .await
            .err()
            .expect("the start fails")
            .to_string();
        assert!(err.contains("CA"), "{err}");
        assert!(
            !dir.join(crate::state::STATE_FILE).exists(),
            "state.json removed"
        );
        assert!(!node::home(&dir, "node1").exists());
        // The caller's own file is the caller's.
        assert!(dir.join("pki").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_options_are_refused_before_anything_starts() {
        let mut opts = ClusterOptions::with_nodes(2);
        opts.nodes[1] = "node1".into();
        let err = Cluster::start(opts).await.err().unwrap().to_string();
        assert!(err.contains("listed twice"), "{err}");
        let opts = ClusterOptions {
            nodes: vec!["bad_name".into()],
            ..Default::default()
        };
        assert!(Cluster::start_base(&opts, Vec::new()).await.is_err());
        let opts = ClusterOptions {
            nodes: Vec::new(),
            ..Default::default()
        };
        assert!(Cluster::start_base(&opts, Vec::new()).await.is_err());
        let opts = ClusterOptions {
            dir: Some("/tmp/has space".into()),
            ..ClusterOptions::with_nodes(1)
        };
        let err = Cluster::start_base(&opts, Vec::new())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("contains ' '"), "{err}");
        let long = format!("/tmp/{}", "d".repeat(100));
        let opts = ClusterOptions {
            dir: Some(long.clone().into()),
            ..ClusterOptions::with_nodes(1)
        };
        let err = Cluster::start_base(&opts, Vec::new())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("too long"), "{err}");
        assert!(
            !Path::new(&long).exists(),
            "nothing is created for refused options"
        );
        assert!(!Path::new("/tmp/has space").exists());
    }
}
