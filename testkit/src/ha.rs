//! [`HaManager`]: one real `drover-manager` of a high-availability group
//! (docs/ha.md), on its own private bus like another host, with its own
//! agent port, temp dir and log. The HA tests start two (or more) of these
//! against one [`crate::etcd::Etcd`] and read what a user reads: the
//! `io.drover.Controller` properties `Leading` and `Epoch` on each bus,
//! and the manager's log.
//!
//! Drop order is the field order: the process, its API client, its bus,
//! then its files; a failing test leaves nothing behind.

use crate::api::{Api, CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, PROPERTIES_IFACE};
use crate::process::{ChildGuard, Signal, TempDir, free_port};
use crate::wait::poll;
use drover_sandbox::PrivateBus;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often [`HaManager::until_leading`] looks at `Leading`.
pub const LOOK: Duration = Duration::from_millis(20);
/// How long a manager may take to serve its API after it starts (a loaded
/// test machine).
pub const UP: Duration = Duration::from_secs(20);
/// The pause between two passes of etcd's lease expiry loop (etcd 3.4): a
/// key outlives its expired lease by up to this.
pub const ETCD_EXPIRY_PASS: Duration = Duration::from_millis(500);

/// How long after it sent its last successful renewal a leader with a
/// lease of `ttl` may still act (docs/ha.md, "Fencing"): the lease less a
/// tenth of it, at least 200 ms. Stated here apart from the manager's
/// code, as the guarantee the tests hold it to.
pub fn fence(ttl: Duration) -> Duration {
    ttl.saturating_sub((ttl / 10).max(Duration::from_millis(200)))
}

/// The longest a standby may take to lead after the leader's last
/// renewal, by design: etcd expires the lease (`ttl`, plus up to
/// [`ETCD_EXPIRY_PASS`]); the standby sees the key go (its watch says so
/// at once, and even a watch gone deaf is looked past within a `ttl`);
/// then it asks etcd about the old lease, for a lease and for the key
/// (three calls, each cut at a third of `ttl`). How fast those round
/// trips are is the machine's load, not the design: the tests print
/// the time taken (docs/dev/ha.md) and bound it by this only.
pub fn takeover(ttl: Duration) -> Duration {
    ttl + ETCD_EXPIRY_PASS + ttl + ttl
}

/// See the module docs.
pub struct HaManager {
    proc: Option<ChildGuard>,
    pub api: Api,
    bus: PrivateBus,
    /// Its agent port on 127.0.0.1 (`-p`).
    pub port: u16,
    /// The binary, for [`HaManager::start_again`].
    bin: std::path::PathBuf,
    dir: TempDir,
}

impl HaManager {
    /// A second manager beside a sandbox's: the sandbox manager's
    /// configuration `sandbox_conf` (its etcd keys included) with a state
    /// directory of its own, on its own bus and port, like another host.
    pub async fn beside(sandbox_conf: &str) -> HaManager {
        HaManager::start(&crate::process::bin("drover-manager"), |dir| {
            sandbox_conf
                .lines()
                .map(|l| {
                    if l.starts_with("StateDirectory=") {
                        format!("StateDirectory={}\n", dir.join("state").display())
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect()
        })
        .await
    }

    /// Starts `bin` (a `drover-manager`) with the configuration `conf`
    /// makes, given the manager's own directory (for a `StateDirectory=`
    /// of its own); it should log to stderr (`LogTarget=stderr`), which
    /// goes to `manager.log` there. Returns once it serves its API (the
    /// `Leading` property answers); panics with its log otherwise.
    pub async fn start(bin: &Path, conf: impl FnOnce(&Path) -> String) -> HaManager {
        // Tags apart: the bus's directory and ours are counted by two
        // counters, and one tag would give two of them one directory.
        let bus = PrivateBus::start_open("drover-ha-bus").expect("private dbus-daemon");
        let port = free_port();
        let dir = TempDir::new("drover-ha");
        let text = conf(dir.path());
        dir.file("manager.conf", &text);
        let api = Api::connect(bus.address()).await;
        let mut m = HaManager {
            proc: None,
            api,
            bus,
            port,
            bin: bin.to_owned(),
            dir,
        };
        m.spawn().await;
        m
    }

    /// Starts the manager again, on the same bus, port, configuration and
    /// state directory, after it exited or was killed (and reaped): a
    /// restarted manager host. Its log goes on in `manager.log`. Returns once
    /// it serves its API; panics if the previous process still runs.
    pub async fn start_again(&mut self) {
        assert!(
            self.try_wait().is_some(),
            "the manager still runs; kill it or wait for it first"
        );
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("manager.log"))
            .expect("log file");
        let proc = Command::new(&self.bin)
            .args(["--no-default-config", "--bus", self.bus.address()])
            .args(["-p", &self.port.to_string(), "-c"])
            .arg(self.dir.join("manager.conf"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.bin.display()));
        self.proc = Some(ChildGuard::new(proc));
        poll(UP, LOOK, "the manager serves its API", || async {
            self.leading_now().await.is_ok()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.logged()));
    }

    /// The address of its bus (`DROVER_BUS` / `droverctl --bus`).
    pub fn bus_address(&self) -> &str {
        self.bus.address()
    }

    /// Its directory (config, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What it logged so far.
    pub fn logged(&self) -> String {
        self.dir.read("manager.log")
    }

    fn proc(&mut self) -> &mut ChildGuard {
        self.proc.as_mut().expect("the manager was started")
    }

    /// Sends `sig` (SIGTERM, SIGSTOP, SIGCONT...).
    pub fn signal(&self, sig: Signal) {
        self.proc
            .as_ref()
            .expect("the manager was started")
            .signal(sig);
    }

    /// SIGKILL and reap: a crash (no resign).
    pub fn kill(&mut self) {
        self.proc().kill();
    }

    /// Its exit status once it exited by itself; `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.proc().try_wait()
    }

    /// Waits up to `limit` for it to exit; panics if it does not.
    pub async fn exited(&mut self, limit: Duration) -> ExitStatus {
        self.proc().exited(limit).await
    }

    /// `io.drover.Controller.Leading` now, or the error of the call.
    pub async fn leading_now(&self) -> zbus::Result<bool> {
        leading(&self.api).await
    }

    /// `Leading`; panics with the log when it cannot be read.
    pub async fn leading(&self) -> bool {
        self.leading_now()
            .await
            .unwrap_or_else(|e| panic!("Leading: {e}\n{}", self.logged()))
    }

    /// `io.drover.Controller.Epoch`; panics with the log when it cannot be read.
    pub async fn epoch(&self) -> u64 {
        let v: zbus::Result<zbus::OwnedVariant> = self
            .api
            .call(
                CONTROLLER_PATH,
                PROPERTIES_IFACE,
                "Get",
                &(DROVER_CONTROLLER_IFACE, "Epoch"),
            )
            .await;
        v.ok()
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or_else(|| panic!("Epoch is not a u64\n{}", self.logged()))
    }

    /// Waits until `Leading` says false, judging the fence from outside: a
    /// read *sent* `fence` or more after `since` that still says true is a
    /// leader acting past its fence, and panics at once with the log. When
    /// an answer comes back depends on the machine's load (the bus, this
    /// process, the manager's runtime), not on the fence, so that is not
    /// judged. `since` must not be earlier than the send time of the last
    /// lease renewal that could have succeeded (a cut path to etcd, etcd
    /// killed), and `fence` is the lease less the fence's margin
    /// ([`fence`]). Panics with the log when no false answer came within
    /// `fence + limit`.
    pub async fn until_stopped(&self, since: Instant, fence: Duration, limit: Duration) -> Stopped {
        let stopped = async {
            let mut last_leading_sent = None;
            loop {
                let sent = since.elapsed();
                if !self.leading().await {
                    return Stopped {
                        answered: since.elapsed(),
                        last_leading_sent,
                    };
                }
                assert!(
                    sent < fence,
                    "Leading said true in a read sent {sent:?} after the last renewal that \
                     could succeed, past the fence ({fence:?})\n{}",
                    self.logged()
                );
                last_leading_sent = Some(sent);
                tokio::time::sleep(LOOK).await;
            }
        };
        tokio::time::timeout(fence + limit, stopped)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "Leading never said false within {:?}\n{}",
                    fence + limit,
                    self.logged()
                )
            })
    }

    /// Waits until `Leading` is `want`; returns how long that took; panics
    /// with the log after `limit`.
    pub async fn until_leading(&self, want: bool, limit: Duration) -> Duration {
        let start = Instant::now();
        poll(limit, LOOK, &format!("Leading = {want}"), || async move {
            self.leading_now().await.ok() == Some(want)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.logged()));
        start.elapsed()
    }
}

/// What [`HaManager::until_stopped`] saw, after its `since`.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// When the first answer saying false came back (what a user polling
    /// sees; the load's business).
    pub answered: Duration,
    /// When the last read that said true was sent (the fence's business:
    /// before `fence`); `None` when the first read said false.
    pub last_leading_sent: Option<Duration>,
}

/// `io.drover.Controller.Leading` of the manager `api` talks to.
pub async fn leading(api: &Api) -> zbus::Result<bool> {
    let v: zbus::OwnedVariant = api
        .call(
            CONTROLLER_PATH,
            PROPERTIES_IFACE,
            "Get",
            &(DROVER_CONTROLLER_IFACE, "Leading"),
        )
        .await?;
    bool::try_from(v)
}

/// How long [`two_managers`] waits for each step (an election, a standby
/// learning the epoch) on a loaded machine.
const SETUP: Duration = Duration::from_secs(20);

/// A sandbox of two real systemd nodes whose own manager (A) and a second
/// one [`HaManager::beside`] it (B) elect on one etcd: A leads, B stands
/// by knowing A's epoch, and each node's agent lists both (A first), in
/// plaintext.
pub struct TwoManagers {
    pub c: crate::TestCluster,
    pub b: HaManager,
    /// The agents' logs, node1's first.
    pub agent_logs: Vec<std::path::PathBuf>,
}

/// Starts [`TwoManagers`] on `etcd` under `prefix` with a `ttl_s` lease;
/// panics with the managers' logs when a step does not happen.
pub async fn two_managers(etcd: &crate::etcd::Etcd, prefix: &str, ttl_s: u64) -> TwoManagers {
    let ha = format!(
        "[drover-manager]\nEtcdEndpoints={}\nEtcdKeyPrefix={prefix}\nEtcdLeaseTTL={ttl_s}\n",
        etcd.url()
    );
    let mut c = crate::TestCluster::with(drover_sandbox::ClusterOptions {
        start_agents: false,
        tls: false,
        manager_extra_config: ha,
        ..drover_sandbox::ClusterOptions::with_nodes(2)
    })
    .await;
    let a = c.api().await;
    poll(SETUP, LOOK, "manager A leads", || async {
        leading(&a).await.ok() == Some(true)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let a_epoch: u64 = a
        .get_property(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Epoch")
        .await;
    let conf = std::fs::read_to_string(c.dir().join("manager.conf")).expect("manager.conf");
    let b = HaManager::beside(&conf).await;
    poll(SETUP, LOOK, "B stands by, knowing A's epoch", || async {
        leading(&b.api).await.ok() == Some(false) && b.epoch().await == a_epoch
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", b.logged()));
    let list = format!(
        "ControllerAddress=tcp:host=127.0.0.1,port={} tcp:host=127.0.0.1,port={}\n",
        c.manager_port(),
        b.port
    );
    let mut agent_logs = Vec::new();
    for node in ["node1", "node2"] {
        agent_logs.push(
            c.start_agent_with(node, node, &list)
                .await
                .expect("agent")
                .log,
        );
    }
    TwoManagers { c, b, agent_logs }
}

/// Whether every one of `nodes` is online in the `ListNodes` of the manager
/// `api` talks to (false on an error: a standby refuses the call).
pub async fn all_online(api: &Api, nodes: &[&str]) -> bool {
    let listed: zbus::Result<Vec<(String, zbus::OwnedObjectPath, String, String)>> = api
        .call(
            CONTROLLER_PATH,
            crate::api::CONTROLLER_IFACE,
            "ListNodes",
            &(),
        )
        .await;
    listed.is_ok_and(|listed| {
        nodes.iter().all(|n| {
            listed
                .iter()
                .any(|(name, _, status, _)| name == n && status == "online")
        })
    })
}
