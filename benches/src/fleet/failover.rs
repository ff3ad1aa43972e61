//! `drover-bench failover`: how fast a fleet of simulated agents follows a
//! new leader (issue 31's targets, docs/ha.md).
//!
//! Two real `drover-manager`s (the fleet's [`Manager`], each on its own
//! private bus and port, `StateDirectory` of its own) elect their leader on
//! a real etcd (Debian's, started as the HA tests start it:
//! `drover_testkit::etcd`) with a lease of `--ttl` seconds. N simulated
//! agents ([`follower`], in processes of their own, at most
//! [`follower::PER_PROCESS`] each) list both managers and follow the real
//! handshake: a session with the leader, a link parked on the standby, every
//! welcome judged by the agent's own epoch rules. Manager A is started first
//! and leads. Then, each round:
//!
//! 1. **SIGKILL of the leader**: the time until the standby says it leads
//!    (`io.drover.Controller.Leading`, polled every 2 ms), and for every agent
//!    the time from the kill until it took a session with the new leader's
//!    epoch: p50, p99, max, and the share within 5 s; the killed manager is
//!    started again and stands by, and the run waits until every agent is
//!    parked on it;
//! 2. **SIGTERM of the (new) leader**, a clean stop that resigns: the same
//!    figures; the stopped manager is started again and stands by.
//!
//! So every round ends with A leading, as it began. Targets (issue 31): new
//! leader within TTL + 0.5 s of the kill, ≥ 99 % of the agents registered
//! with it within 5 s, a clean stop handed over within 1 s.

use super::agent::node_name;
use super::daemon::{Manager, ManagerSetup, free_port, raise_nofile};
use super::follower::{self, Event, FollowConfig, Followers, PER_PROCESS, now_us};
use super::{AgentConfig, load_average};
use anyhow::{Context, Result, bail};
use clap::Parser;
use drover_bus::bluechi::{CONTROLLER_PATH, DROVER_CONTROLLER_IFACE};
use drover_bus::bus::PROPERTIES_IFACE;
use drover_sandbox::PrivateBus;
use nix::sys::signal::Signal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "drover-bench failover",
    about = "N simulated agents following the leader of two drover-managers on etcd (see \
             docs/performance.md)"
)]
struct Args {
    /// Fleet sizes, comma-separated; each runs against fresh managers and etcd.
    #[arg(long, default_value = "2000", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// The managers' EtcdLeaseTTL (s); at least 2.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// Rounds (a SIGKILL and a SIGTERM each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Loaded units per node (what ListUnits returns).
    #[arg(long, default_value_t = 10)]
    units: usize,
    /// The agents' HeartbeatInterval (ms).
    #[arg(long, default_value_t = 2000)]
    heartbeat_ms: u64,
    /// The managers' NodeHeartbeatThreshold and the agents' threshold (ms).
    #[arg(long, default_value_t = 6000)]
    threshold_ms: u64,
    /// Seconds the fleet may take to come online or follow before the run fails.
    #[arg(long, default_value_t = 300)]
    online_timeout: u64,
}

/// How often the standby's `Leading` is read during a failover.
const LOOK: Duration = Duration::from_millis(2);
/// The target for the agents.
const FOLLOW_TARGET: Duration = Duration::from_secs(5);

/// One manager of the pair: its bus, its process, a client connection.
struct Member {
    name: &'static str,
    manager: Manager,
    api: zbus::Connection,
    // Last: the bus goes after the process.
    _bus: PrivateBus,
}

impl Member {
    async fn start(name: &'static str, nodes: &[String], etcd: &str, args: &Args) -> Result<Self> {
        let ttl = args.ttl;
        let bus = PrivateBus::start(&format!("drover-bench-failover-{name}"))?;
        let extra = format!(
            "EtcdEndpoints={etcd}\nEtcdKeyPrefix=/drover-bench/failover\nEtcdLeaseTTL={ttl}\n\
             StateDirectory={}\n",
            bus.dir().join("state").display()
        );
        let setup = ManagerSetup {
            port: free_port()?,
            heartbeat_interval_ms: None,
            heartbeat_threshold_ms: args.threshold_ms,
            proxy_grace_ms: None,
            nodes,
            tls: None,
            metrics: None,
            extra,
        };
        let mut manager = Manager::start(&bus, &setup)?;
        let api = zbus::connection::Builder::address(bus.address())
            .build()
            .await?;
        manager.wait_serving(&api, Duration::from_secs(30)).await?;
        Ok(Self {
            name,
            manager,
            api,
            _bus: bus,
        })
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.manager.port))
    }

    async fn property(&self, name: &str) -> zbus::Result<zbus::OwnedVariant> {
        self.api
            .call_method(
                Some(drover_bus::bluechi::BUS_NAME),
                CONTROLLER_PATH,
                Some(PROPERTIES_IFACE),
                "Get",
                &(DROVER_CONTROLLER_IFACE, name),
            )
            .await?
            .body()
            .deserialize()
    }

    async fn leading(&self) -> Option<bool> {
        let v = self.property("Leading").await.ok()?;
        bool::try_from(v).ok()
    }

    async fn epoch(&self) -> Result<u64> {
        let v = self.property("Epoch").await?;
        u64::try_from(v).context("Epoch is not a u64")
    }

    /// Waits until `Leading` is `want`; how long that took.
    async fn until_leading(&self, want: bool, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.leading().await == Some(want) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "manager {} did not say Leading = {want} within {timeout:?}; its log:\n{}",
                    self.name,
                    self.manager.log()
                );
            }
            tokio::time::sleep(LOOK).await;
        }
    }

    /// Starts it again after it was killed or stopped; waits until it serves
    /// and stands by.
    async fn start_again(&mut self) -> Result<()> {
        self.manager.restart()?;
        self.manager
            .wait_serving(&self.api, Duration::from_secs(30))
            .await?;
        self.until_leading(false, Duration::from_secs(30)).await?;
        Ok(())
    }
}

/// One handover's figures.
struct Handover {
    /// Until the new leader said it leads.
    led: Duration,
    /// Each agent, until it took a session with the new leader.
    agents: Vec<Duration>,
    /// The other manager led already when the leader was ended.
    lapsed: bool,
}

impl Handover {
    fn line(&self, what: &str, n: usize) -> String {
        let mut v = self.agents.clone();
        v.sort();
        let pct = |p: f64| {
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v.get(rank.clamp(1, v.len().max(1)) - 1)
                .copied()
                .unwrap_or_default()
        };
        let within = v.iter().filter(|d| **d <= FOLLOW_TARGET).count();
        format!(
            "failover {n}: {what}: new leader after {:.3} s{}; agents registered with it: p50 {:.3} \
             s, p99 {:.3} s, max {:.3} s, {:.2}% within {} s (load {:.1})",
            self.led.as_secs_f64(),
            if self.lapsed {
                " (it led before: the old leader's lease had lapsed)"
            } else {
                ""
            },
            pct(50.0).as_secs_f64(),
            pct(99.0).as_secs_f64(),
            v.last().copied().unwrap_or_default().as_secs_f64(),
            within as f64 * 100.0 / n.max(1) as f64,
            FOLLOW_TARGET.as_secs(),
            load_average()
        )
    }
}

/// Waits until `want` agents hold a session of `epoch`.
async fn until_followed(
    agents: &Followers,
    epoch: u64,
    want: usize,
    timeout: Duration,
    since: Instant,
) -> Result<()> {
    loop {
        let n = agents.with_epoch(epoch);
        if n >= want {
            return Ok(());
        }
        if since.elapsed() > timeout {
            bail!("{n} of {want} agents followed the leader of epoch {epoch} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until `want` links are parked on manager `which`.
async fn until_parked(
    agents: &Followers,
    which: usize,
    want: usize,
    timeout: Duration,
) -> Result<()> {
    let since = Instant::now();
    loop {
        let n = agents.parked_on(which);
        if n >= want {
            return Ok(());
        }
        if since.elapsed() > timeout {
            bail!("{n} of {want} agents parked on manager {which} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ends the leader `members[from]` (SIGKILL or SIGTERM) and measures how
/// `members[to]` takes over (see the module docs).
async fn handover(
    members: &mut [Member; 2],
    (from, to): (usize, usize),
    kill: bool,
    agents: &Followers,
    n: usize,
    timeout: Duration,
) -> Result<Handover> {
    let old = members[from].epoch().await?;
    // A leader that could not renew its lease in time (a loaded machine)
    // has handed over already: said in the report, not hidden.
    let lapsed = members[to].leading().await == Some(true);
    let t0 = Instant::now();
    let t0_us = now_us();
    if kill {
        members[from].manager.kill();
    } else {
        members[from].manager.signal(Signal::SIGTERM)?;
    }
    // From the signal: a SIGKILLed manager is reaped before `kill` returns,
    // and the kernel's teardown of its 10,000 sockets takes a while.
    members[to]
        .until_leading(true, Duration::from_secs(30))
        .await?;
    let led = t0.elapsed();
    let epoch = members[to].epoch().await?;
    if epoch <= old {
        bail!("the new leader's epoch {epoch} is not above {old}");
    }
    until_followed(agents, epoch, n, timeout, t0).await?;
    let agents_times = agents.taken_since(epoch, t0_us);
    if !kill {
        let status = members[from]
            .manager
            .exited(Duration::from_secs(30))
            .await?;
        if !status.success() {
            bail!(
                "manager {} ended with {status} after SIGTERM",
                members[from].name
            );
        }
    }
    Ok(Handover {
        led,
        agents: agents_times,
        lapsed,
    })
}

/// Starts the agent processes for `n` agents of `cfg` (see
/// `follower`); the bench's view of them follows their events.
fn spawn_agents(
    n: usize,
    cfg: &FollowConfig,
) -> Result<(Arc<Followers>, Vec<tokio::process::Child>)> {
    use tokio::io::AsyncBufReadExt;
    let view = Followers::new(n, cfg.managers.len(), None);
    let exe = std::env::current_exe().context("this program's path")?;
    let mut procs = Vec::new();
    for first in (0..n).step_by(PER_PROCESS) {
        let count = PER_PROCESS.min(n - first);
        let mut child = tokio::process::Command::new(&exe)
            .args(follower::agents_argv(first, count, cfg))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("the agents' stdout")?;
        let view = view.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(ev) = Event::parse(&line) {
                    view.apply(&ev);
                }
            }
        });
        procs.push(child);
    }
    Ok((view, procs))
}

/// One fleet size (see the module docs).
async fn run(n: usize, args: &Args) -> Result<()> {
    let timeout = Duration::from_secs(args.online_timeout);
    let etcd = drover_testkit::etcd::Etcd::start().await;
    let names: Vec<String> = (0..n).map(node_name).collect();
    let a = Member::start("A", &names, &etcd.url(), args).await?;
    a.until_leading(true, Duration::from_secs(30)).await?;
    let b = Member::start("B", &names, &etcd.url(), args).await?;
    b.until_leading(false, Duration::from_secs(30)).await?;
    let mut members = [a, b];
    let cfg = Arc::new(FollowConfig {
        managers: members.iter().map(Member::addr).collect(),
        heartbeat_interval: Duration::from_millis(args.heartbeat_ms),
        heartbeat_threshold: Duration::from_millis(args.threshold_ms),
        connect_timeout: Duration::from_secs(10),
        units: Arc::new(AgentConfig::unit_rows(args.units)),
    });
    let cold = Instant::now();
    let (agents, mut procs) = spawn_agents(n, &cfg)?;
    let first = members[0].epoch().await?;
    until_followed(&agents, first, n, timeout, cold).await?;
    until_parked(&agents, 1, n, timeout).await?;
    println!(
        "failover {n}: every agent registered with A and parked on B after {:.3} s (load {:.1})",
        cold.elapsed().as_secs_f64(),
        load_average()
    );
    let mut kills = Vec::new();
    let mut terms = Vec::new();
    for round in 1..=args.rounds {
        let k = handover(&mut members, (0, 1), true, &agents, n, timeout).await?;
        println!("{} [round {round}]", k.line("SIGKILL of the leader", n));
        members[0].start_again().await?;
        until_parked(&agents, 0, n, timeout).await?;
        let t = handover(&mut members, (1, 0), false, &agents, n, timeout).await?;
        println!("{} [round {round}]", t.line("SIGTERM of the leader", n));
        members[1].start_again().await?;
        until_parked(&agents, 1, n, timeout).await?;
        kills.push(k);
        terms.push(t);
    }
    let refused = agents
        .refused_lower
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "failover {n}: welcomes refused for a lower epoch: {refused}; new leader after SIGKILL \
         (TTL {} s): {}; after SIGTERM: {}",
        args.ttl,
        kills
            .iter()
            .map(|k| format!("{:.3} s", k.led.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        terms
            .iter()
            .map(|t| format!("{:.1} ms", t.led.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for m in &members {
        let log = m.manager.log();
        let lost: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("no longer leading") || l.contains("lease renewal took"))
            .collect();
        if !lost.is_empty() {
            println!(
                "failover {n}: manager {} logged {} lease troubles, the last: {}",
                m.name,
                lost.len(),
                lost.last().copied().unwrap_or_default().trim()
            );
        }
    }
    for p in &mut procs {
        let _ = p.kill().await;
    }
    drop(members);
    drop(etcd);
    Ok(())
}

/// The `failover` command; `argv` starts with the word `failover`.
pub async fn main(argv: Vec<String>) -> Result<()> {
    let Some(args) = super::cli::parse::<Args>(argv)? else {
        return Ok(());
    };
    if args.ttl < 2 {
        bail!("--ttl: the lease is at least 2 s");
    }
    let largest = args.nodes.iter().copied().max().unwrap_or(0) as u64;
    // Two links per agent here, one in each manager.
    let (soft, hard) = raise_nofile(largest * 3 + 4096)?;
    println!(
        "failover: RLIMIT_NOFILE raised to {soft} (hard {hard}); load {:.1}",
        load_average()
    );
    for &n in &args.nodes {
        run(n, &args).await?;
    }
    Ok(())
}
