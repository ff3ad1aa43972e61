//! `agent-cpu`: what a `StartUnit` costs the target node's agent, before,
//! while and after a cross-node start that targets that node.
//!
//! A cross-node start makes the manager watch the target unit on the target
//! node (it subscribes to it for the proxy's verdicts). Watching one unit must
//! cost the agent nothing for the starts of other units, and once nobody
//! watches any more, the agent must be back where it was: its CPU per start
//! the same as before the first cross-node start.
//!
//! Three sandbox nodes: node1 requests `db.service` of node2 through
//! `drover-proxy@node2_db.service` (as in `proxy`), node2 is the target, node3
//! is never involved (the control: it shows what the machine's drift alone
//! does between the phases). Four phases of rounds, in this order:
//!
//! 1. **before** any cross-node start;
//! 2. **while** need-db runs on node1, so the manager watches `db.service`
//!    on node2;
//! 3. **after** need-db, the proxy, the dep and db are all down again;
//! 4. **with a health check**: a unit of node2 that declares one
//!    (`HealthPush=yes`, so no check runs) is running, so the agent's health
//!    follows the state of every unit of node2 from then on (last, since
//!    that lasts for the agent's life).
//!
//! A round starts the trivial oneshot once on node2 and once on node3
//! through drover (the order alternates), until its `JobRemoved`. Before each
//! round the CPU time of both agents is read (the process's CPU-time clock,
//! every thread, those that ended too; nanoseconds: `crate::procfs`), so a round's difference holds
//! one start on that node plus whatever the agent still did after its
//! `JobRemoved` went out (late signals). The first rounds of each phase are
//! not counted. Reported per node and phase: the agent's CPU per start and
//! the start's wall time (median, p90, p99, and a 95% bootstrap interval of
//! the CPU median), then the ratio of each phase's CPU median to the
//! first's, for node2 and for the control, and node2's CPU median over the
//! control's in each phase (the ratio the machine's drift between phases
//! does not move).
//!
//! ```text
//! cargo build --release --workspace --bins
//! target/release/drover-bench agent-cpu --samples 500
//! ```

use crate::procfs::cpu_time;
use crate::proxy::{Systemd, cross_node_down, cross_node_up, install_units};
use crate::start::DroverStarts;
use crate::stats::{Spread, median_ci95};
use anyhow::{Context, Result, bail};
use drover_sandbox::{Cluster, ClusterOptions};
use std::time::{Duration, Instant};

/// Rounds of each phase not counted.
const WARMUP: usize = 20;

const TARGET: &str = "node2";
const CONTROL: &str = "node3";

/// One node's figures in one phase: CPU per start and wall time, ms.
#[derive(Default)]
struct Series {
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

/// The phases in the order they run.
const PHASES: [&str; 4] = [
    "before",
    "while db on node2 is wanted",
    "after it is released",
    "with a health check on node2",
];

/// The unit of node2 that declares a health check in the last phase.
const CHECKED: &str = "checked.service";
const CHECKED_TEXT: &str = "[Service]\nExecStart=/bin/sleep infinity\n[X-Drover]\nHealthPush=yes\n";

/// The cluster, the four phases, the report; the cluster is torn down, also
/// after a failure.
pub async fn main(samples: usize) -> Result<()> {
    let mut opts = ClusterOptions::with_nodes(3);
    opts.heartbeat_interval_ms = 2000;
    opts.heartbeat_threshold_ms = 6000;
    let cluster = Cluster::start(opts).await?;
    let res = run(&cluster, samples).await;
    cluster.down().await?;
    res
}

async fn run(cluster: &Cluster, samples: usize) -> Result<()> {
    install_units(cluster).await?;
    let mut starts = [
        DroverStarts::new(cluster, TARGET).await?,
        DroverStarts::new(cluster, CONTROL).await?,
    ];
    let pids = [
        cluster.agent_pid(TARGET).context("node2 has no agent")?,
        cluster.agent_pid(CONTROL).context("node3 has no agent")?,
    ];
    // [phase][node]
    let mut series: Vec<[Series; 2]> = Vec::new();
    for (phase, name) in PHASES.iter().enumerate() {
        if phase > 0 {
            // Fresh connections each time: one that nobody reads during the
            // rounds (every start on node2 sends its `JobRemoved`) would fill
            // up, and its answers would never be read.
            let mut node1 = Systemd::connect("node1", &cluster.node_bus_address("node1")).await?;
            let mut node2 = Systemd::connect("node2", &cluster.node_bus_address("node2")).await?;
            match phase {
                1 => cross_node_up(&mut node1, &mut node2).await?,
                2 => cross_node_down(&mut node1, &mut node2).await?,
                _ => {
                    cluster.install_unit(TARGET, CHECKED, CHECKED_TEXT).await?;
                    node2.start_done(CHECKED).await?;
                    health_declared(cluster).await?;
                }
            }
        }
        eprintln!("agent-cpu: phase '{name}'");
        series.push(rounds(&mut starts, pids, samples).await?);
    }
    report(samples, &series);
    Ok(())
}

/// `samples` counted rounds (after [`WARMUP`]) of one start on each node.
async fn rounds(
    starts: &mut [DroverStarts; 2],
    pids: [u32; 2],
    samples: usize,
) -> Result<[Series; 2]> {
    let mut out: [Series; 2] = Default::default();
    let mut cpu = pids.map(cpu_time);
    for i in 0..(samples + WARMUP) {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut wall = [Duration::ZERO; 2];
        for n in order {
            wall[n] = starts[n].once().await?;
        }
        let now = pids.map(cpu_time);
        if i >= WARMUP {
            for n in 0..2 {
                out[n]
                    .cpu
                    .push(now[n].saturating_sub(cpu[n]).as_secs_f64() * 1000.0);
                out[n].wall.push(wall[n].as_secs_f64() * 1000.0);
            }
        }
        cpu = now;
    }
    Ok(out)
}

fn report(samples: usize, series: &[[Series; 2]]) {
    println!(
        "agent-cpu: StartUnit of a trivial oneshot through drover, {samples} rounds per phase \
         (one start on node2 and one on node3 each)"
    );
    println!("  node2 is the target of the cross-node start, node3 the control (never involved)");
    println!(
        "  {:<34} {:>9} {:>9} {:>9} {:>21}   {:>9} {:>9} {:>9}",
        "agent CPU per start (ms)",
        "median",
        "p90",
        "p99",
        "95% CI of median",
        "wall med",
        "p90",
        "p99"
    );
    for (n, node) in [TARGET, CONTROL].iter().enumerate() {
        for (phase, s) in PHASES.iter().zip(series) {
            let s = &s[n];
            let (c, w) = (Spread::of(&s.cpu), Spread::of(&s.wall));
            let (lo, hi) = median_ci95(&s.cpu, 2000);
            println!(
                "  {:<34} {:>9.3} {:>9.3} {:>9.3}   [{lo:>7.3}, {hi:>7.3}]   {:>9.3} {:>9.3} {:>9.3}",
                format!("{node} {phase}"),
                c.median,
                c.p90,
                c.p99,
                w.median,
                w.p90,
                w.p99
            );
        }
    }
    let median = |phase: usize, n: usize| Spread::of(&series[phase][n].cpu).median;
    for (n, node) in [TARGET, CONTROL].iter().enumerate() {
        println!(
            "  {node}: CPU median while/before {:.3}, after/before {:.3}, health/before {:.3}",
            median(1, n) / median(0, n),
            median(2, n) / median(0, n),
            median(3, n) / median(0, n)
        );
    }
    let within: Vec<String> = PHASES
        .iter()
        .enumerate()
        .map(|(phase, name)| format!("{name} {:.3}", median(phase, 0) / median(phase, 1)))
        .collect();
    println!(
        "  node2/node3 CPU median within each phase: {}",
        within.join(", ")
    );
    println!("  target: node2's ratios as close to 1 as the control's");
}

/// Waits until the manager lists node2's [`CHECKED`] among the units with a
/// check: the agent has read its declaration, and health follows every
/// unit.
async fn health_declared(cluster: &Cluster) -> Result<()> {
    let api = zbus::connection::Builder::address(cluster.bus_address())
        .build()
        .await?;
    let c = drover_bus::client::DroverControllerProxy::new(&api).await?;
    let since = Instant::now();
    loop {
        let rows = c.list_health().await?;
        if rows.iter().any(|r| r.0 == TARGET && r.1 == CHECKED) {
            return Ok(());
        }
        if since.elapsed() > HEALTH_PATIENCE {
            bail!("the manager does not list {CHECKED} on {TARGET} after {HEALTH_PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const HEALTH_PATIENCE: Duration = Duration::from_secs(20);
