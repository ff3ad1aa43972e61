//! `flood`: admission under a flood of unauthenticated connections, against the
//! same cluster without one, interleaved.
//!
//! One sandbox cluster: three real `systemd --user` nodes, mutual TLS, the drover
//! binaries next to this one (`cargo run --release` runs the release build). Each round
//! measures, in an order that alternates between rounds:
//!
//! 1. **Agent restart**: node1's agent stopped, then started; the time from its start to
//!    node1 `online` on the manager's API (`Node.Status`, polled every 5 ms). Without a
//!    flood; under 2,000 half-open TLS handshakes (a ClientHello each, then nothing) from
//!    125 loopback addresses, 16 each, reopened as the manager closes them
//!    (`drover_testkit::flood`); and under 1,000 silent connections from 127.0.0.1, the
//!    agents' own address. Target: ≤ 2 s under either flood.
//! 2. **Manager restart**: the manager stopped, then started (its listener is kept by
//!    the sandbox, as `drover-manager.socket` keeps it); the time from its start to all
//!    three nodes `online`. Without a flood and under the 2,000 handshakes. Target:
//!    ≤ 5 s under the flood.
//!
//! Also reported: how hard the flood held (connections open, closed by the manager per
//! second) and the manager's peak RSS under it over its idle RSS.

use crate::procfs;
use crate::stats::{ms, summarize};
use anyhow::{Context, Result, bail};
use drover_bus::bluechi::{BUS_NAME, NODE_IFACE, node_path};
use drover_sandbox::{Cluster, ClusterOptions};
use drover_testkit::flood::{Flood, FloodOptions, Kind};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// A sample that takes longer failed: the run stops and says so.
const GIVE_UP: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    None,
    Hellos,
    SilentSameAddress,
}

impl Load {
    fn label(self) -> &'static str {
        match self {
            Load::None => "no flood",
            Load::Hellos => "2,000 half-open handshakes, 125 addresses",
            Load::SilentSameAddress => "1,000 silent connections from the agents' address",
        }
    }

    fn start(self, port: u16) -> Option<Flood> {
        let target = SocketAddr::from(([127, 0, 0, 1], port));
        match self {
            Load::None => None,
            Load::Hellos => Some(Flood::start(target, &FloodOptions::client_hellos(125, 16))),
            Load::SilentSameAddress => Some(Flood::start(
                target,
                &FloodOptions {
                    first: Ipv4Addr::LOCALHOST,
                    addresses: 1,
                    per_address: 1000,
                    kind: Kind::Silent,
                },
            )),
        }
    }
}

/// The whole benchmark: `rounds` rounds; the cluster is torn down, also after a failure.
pub async fn main(rounds: usize) -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::with_nodes(NODES.len())).await?;
    let mut cluster = cluster;
    let res = run(&mut cluster, rounds.max(1)).await;
    cluster.down().await?;
    res
}

#[derive(Default)]
struct Samples {
    agent: [Vec<Duration>; 3],
    manager: [Vec<Duration>; 2],
    /// (open, closed by the manager per second) while a flood ran.
    held: Vec<(usize, f64)>,
    peak_over_idle_kib: Vec<i64>,
}

async fn run(c: &mut Cluster, rounds: usize) -> Result<()> {
    let manager = drover_sandbox::binaries::locate("drover-manager")?;
    println!(
        "flood: {rounds} rounds, manager {}, 3 nodes, mutual TLS",
        manager.display()
    );
    let bus = drover_sandbox::bus::connect(c.bus_address()).await?;
    let mut s = Samples::default();
    let agent_loads = [Load::None, Load::Hellos, Load::SilentSameAddress];
    let manager_loads = [Load::None, Load::Hellos];
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..agent_loads.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let load = agent_loads[i];
            let took = agent_restart(c, &bus, load, &mut s).await?;
            s.agent[i].push(took);
        }
        let mut order: Vec<usize> = (0..manager_loads.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let load = manager_loads[i];
            let took = manager_restart(c, &bus, load, &mut s).await?;
            s.manager[i].push(took);
        }
    }
    println!("  agent restart -> node online");
    for (load, samples) in agent_loads.iter().zip(&s.agent) {
        println!("    {:<52} {}", load.label(), line(samples));
    }
    println!("  manager restart -> all 3 nodes online");
    for (load, samples) in manager_loads.iter().zip(&s.manager) {
        println!("    {:<52} {}", load.label(), line(samples));
    }
    if let (Some(min), Some(max)) = (
        s.held.iter().map(|h| h.0).min(),
        s.held.iter().map(|h| h.0).max(),
    ) {
        let mut rates: Vec<f64> = s.held.iter().map(|h| h.1).collect();
        rates.sort_by(f64::total_cmp);
        println!(
            "  the floods held {min}..{max} connections open; the manager closed a median {:.0} a second",
            rates[rates.len() / 2]
        );
    }
    if let Some(max) = s.peak_over_idle_kib.iter().max() {
        println!("  manager peak RSS under a flood over its idle RSS: at most {max} KiB");
    }
    Ok(())
}

fn line(samples: &[Duration]) -> String {
    let sum = summarize(samples);
    let max = samples.iter().max().copied().unwrap_or_default();
    format!(
        "median {}  p90 {}  max {}  (n={})",
        ms(sum.median),
        ms(sum.p90),
        ms(max),
        sum.n
    )
}

/// Starts `load`'s flood and waits until it holds the door: every connection open
/// (the manager takes them all in, and lets them in turn by turn).
async fn flood(c: &Cluster, load: Load) -> Result<Option<Flood>> {
    let Some(flood) = load.start(c.manager_port()) else {
        return Ok(None);
    };
    let want = match load {
        Load::Hellos => 2000,
        _ => 1000,
    };
    flood
        .holding(want, Duration::from_secs(30))
        .await
        .with_context(|| format!("the flood ({})", load.label()))?;
    Ok(Some(flood))
}

fn note_flood(flood: &Flood, closed_before: u64, since: Instant, s: &mut Samples) {
    let rate = (flood.closed_by_peer() - closed_before) as f64 / since.elapsed().as_secs_f64();
    s.held.push((flood.open(), rate));
}

async fn agent_restart(
    c: &mut Cluster,
    bus: &zbus::Connection,
    load: Load,
    s: &mut Samples,
) -> Result<Duration> {
    let idle = manager_kib(c, "VmRSS:")?;
    let flood = flood(c, load).await?;
    let closed_before = flood.as_ref().map_or(0, Flood::closed_by_peer);
    let since = Instant::now();
    c.stop_agent("node1").await?;
    wait_status(bus, "node1", "offline").await?;
    let t0 = Instant::now();
    c.start_agent("node1").await?;
    wait_status(bus, "node1", "online").await?;
    let took = t0.elapsed();
    if let Some(flood) = &flood {
        note_flood(flood, closed_before, since, s);
        s.peak_over_idle_kib
            .push(manager_kib(c, "VmHWM:")? as i64 - idle as i64);
    }
    Ok(took)
}

async fn manager_restart(
    c: &mut Cluster,
    bus: &zbus::Connection,
    load: Load,
    s: &mut Samples,
) -> Result<Duration> {
    let flood = flood(c, load).await?;
    let closed_before = flood.as_ref().map_or(0, Flood::closed_by_peer);
    let since = Instant::now();
    c.stop_manager().await?;
    let t0 = Instant::now();
    c.start_manager().await?;
    for node in NODES {
        wait_status(bus, node, "online").await?;
    }
    let took = t0.elapsed();
    if let Some(flood) = &flood {
        note_flood(flood, closed_before, since, s);
    }
    Ok(took)
}

fn manager_kib(c: &Cluster, key: &str) -> Result<u64> {
    let pid = c.state().manager_pid.context("the manager runs")?;
    procfs::status_kib(pid, key)
}

/// Polls `Node.Status` of `node` every 5 ms until it is `want` (a manager that is not
/// on the bus yet counts as not yet).
async fn wait_status(bus: &zbus::Connection, node: &str, want: &str) -> Result<()> {
    let end = Instant::now() + GIVE_UP;
    loop {
        let proxy = zbus::proxy::Builder::<zbus::Proxy<'_>>::new(bus)
            .destination(BUS_NAME)
            .path(node_path(node))
            .interface(NODE_IFACE)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        if proxy
            .get_property::<String>("Status")
            .await
            .is_ok_and(|s| s == want)
        {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("{node} not {want} within {GIVE_UP:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
