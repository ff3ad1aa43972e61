//! The `drover-bench` command: which benchmark, how many samples, which proxy
//! helpers; starts the sandbox cluster, runs `start-unit`, `proxy` and `rss` on it
//! (`events` needs no cluster, `tls` starts two), tears it down. [`main`] is the whole program.

use crate::procfs::cpu_time;
use crate::start::{StartPaths, rss_kib};
use crate::stats::{self, paired_overhead, summarize};
use crate::{agent_cpu, ctl, events, health, proxy, tls};
use anyhow::{Context, Result};
use clap::Parser;
use drover_sandbox::{Cluster, ClusterOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "drover benchmarks (run on an otherwise idle machine)")]
struct Args {
    /// Which benchmark: start-unit, proxy, rss, events, tls, ctl, agent-cpu, health, flood, dns,
    /// fleet (`fleet --help`), scrape (`scrape --help`), where (`where --help`), resync
    /// (`resync --help`), failover
    /// (`failover --help`) or all (events, tls, ctl,
    /// agent-cpu, health, flood and fleet run alone: they start their own daemons).
    #[arg(default_value = "all")]
    which: String,
    /// Samples per side (`flood`: rounds).
    #[arg(long, default_value_t = 300)]
    samples: usize,
    /// `proxy`: a second helper binary, measured against the first in the same run.
    #[arg(long, value_name = "PATH")]
    helper_b: Option<PathBuf>,
    /// `proxy`: the first helper binary (default: the `drover-proxy` the sandbox found).
    #[arg(long, value_name = "PATH", requires = "helper_b")]
    helper_a: Option<PathBuf>,
    /// `proxy`: each node on a CPU of its own, as if nodes were machines (`pinning.rs`).
    #[arg(long)]
    pin_nodes: bool,
    /// `ctl`: a droverctl binary to measure (repeat to compare several in one run).
    #[arg(long, value_name = "PATH")]
    ctl: Vec<PathBuf>,
    /// `ctl`: also write every sample to this CSV file.
    #[arg(long, value_name = "PATH")]
    ctl_csv: Option<PathBuf>,
}

/// The whole program: what `main.rs` calls. A failure is printed as `Error: ...`
/// with its causes, exit status 1 (what a `main` returning `anyhow::Result` did).
pub fn main() -> ExitCode {
    // `fleet` has options of its own (`fleet/cli.rs`).
    let argv: Vec<String> = std::env::args().collect();
    let fleet = argv.get(1).is_some_and(|w| {
        w == "fleet"
            || w == "scrape"
            || w == "where"
            || w == "resync"
            || w == "failover"
            || w == "failover-agents"
    });
    let args = if fleet { None } else { Some(Args::parse()) };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args {
        Some(args) => runtime.block_on(until_signalled(bench(args))),
        None if argv[1] == "scrape" => runtime.block_on(until_signalled(
            crate::fleet::scrape::main(argv[1..].to_vec()),
        )),
        None if argv[1] == "failover-agents" => runtime.block_on(until_signalled(
            crate::fleet::follower::agents_main(argv[1..].to_vec()),
        )),
        None if argv[1] == "failover" => runtime.block_on(until_signalled(
            crate::fleet::failover::main(argv[1..].to_vec()),
        )),
        None if argv[1] == "resync" => runtime.block_on(until_signalled(
            crate::fleet::resync::main(argv[1..].to_vec()),
        )),
        None if argv[1] == "where" => runtime.block_on(until_signalled(
            crate::fleet::discovery::main(argv[1..].to_vec()),
        )),
        None => runtime.block_on(until_signalled(crate::fleet::cli::main(argv[1..].to_vec()))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `work` until it ends or SIGINT or SIGTERM comes. On a signal the work
/// is dropped, so its daemons, sandboxes and temporary directories are torn
/// down by their `Drop`, as on any failure, and the run fails saying why.
async fn until_signalled(work: impl Future<Output = Result<()>>) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        result = work => result,
        _ = term.recv() => anyhow::bail!("stopped by SIGTERM; everything it started is torn down"),
        _ = int.recv() => anyhow::bail!("stopped by SIGINT; everything it started is torn down"),
    }
}

/// Runs the benchmark(s) `args` names.
async fn bench(args: Args) -> Result<()> {
    anyhow::ensure!(
        !args.pin_nodes || args.which == "proxy",
        "--pin-nodes is an option of the proxy benchmark (drover-bench proxy --pin-nodes)"
    );
    if args.which == "events" {
        // Fake agents and a real manager; no systemd nodes needed.
        return events::main().await;
    }
    if args.which == "agent-cpu" {
        // Three nodes of its own.
        return agent_cpu::main(args.samples).await;
    }
    if args.which == "tls" {
        // Two clusters of its own: TLS and plaintext side by side.
        return tls::main(args.samples).await;
    }
    if args.which == "health" {
        // `--samples` is the number of rounds (pairs of 10 s windows) per kind.
        return health::main(args.samples.min(50)).await;
    }
    if args.which == "dns" {
        // A cluster of its own with drover-dns; `--samples` is the rounds per kind.
        return crate::dns::main(args.samples.min(20)).await;
    }
    if args.which == "flood" {
        // A cluster of its own, restarted many times; `--samples` is the rounds.
        return crate::flood::main(args.samples).await;
    }
    let mut opts = ClusterOptions::with_nodes(2);
    opts.heartbeat_interval_ms = 2000;
    opts.heartbeat_threshold_ms = 6000;
    let cluster = Cluster::start(opts).await?;
    let res = run(&cluster, &args).await;
    cluster.down().await?;
    res
}

async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    if matches!(args.which.as_str(), "start-unit" | "all") {
        start_unit(cluster, args.samples).await?;
    }
    if matches!(args.which.as_str(), "proxy" | "all") {
        let helpers = match &args.helper_b {
            None => None,
            Some(b) => Some(proxy::Helpers::new(args.helper_a.clone(), b.clone())?),
        };
        if args.pin_nodes {
            let pinned = crate::pinning::pin_nodes(cluster)?;
            let list: Vec<String> = pinned
                .iter()
                .map(|(node, cpu)| format!("{node} on CPU {cpu}"))
                .collect();
            println!(
                "nodes pinned: {} (the manager and the benchmark on any CPU)",
                list.join(", ")
            );
        }
        proxy::proxy(cluster, args.samples, helpers).await?;
    }
    if args.which == "ctl" {
        ctl::ctl(cluster, args.samples, &args.ctl, args.ctl_csv.as_deref()).await?;
    }
    if matches!(args.which.as_str(), "rss" | "all") {
        rss(cluster)?;
    }
    Ok(())
}

/// The kinds of sample `start-unit` takes in every round, in the order of
/// its report: the start both ways, and its legs (see [`StartPaths`]).
const START_KINDS: [&str; 5] = [
    "start, direct systemd ",
    "start, via drover     ",
    "read, direct systemd  ",
    "read, via drover      ",
    "Peer.Ping to manager  ",
];

async fn start_unit(cluster: &Cluster, samples: usize) -> Result<()> {
    let mut paths = StartPaths::new(cluster).await?;
    let manager = cluster.state().manager_pid.context("no manager running")?;
    let agent = cluster.agent_pid("node2").context("no agent on node2")?;
    let mut taken: Vec<Vec<Duration>> = vec![Vec::with_capacity(samples); START_KINDS.len()];
    // CPU time of manager and node2's agent while each kind ran, summed.
    let mut cpu = vec![(Duration::ZERO, Duration::ZERO); START_KINDS.len()];
    // Warm-up, then every kind once a round, the order turned every round so
    // that none always follows the same one.
    for round in 0..(samples + 20) {
        for k in 0..START_KINDS.len() {
            let kind = (round + k) % START_KINDS.len();
            let before = (cpu_time(manager), cpu_time(agent));
            let t = match kind {
                0 => paths.direct().await?,
                1 => paths.via_drover().await?,
                2 => paths.read_direct().await?,
                3 => paths.read_via_drover().await?,
                _ => paths.ping_manager().await?,
            };
            if round >= 20 {
                taken[kind].push(t);
                cpu[kind].0 += cpu_time(manager).saturating_sub(before.0);
                cpu[kind].1 += cpu_time(agent).saturating_sub(before.1);
            }
        }
    }
    println!("start-unit: trivial oneshot on node2, {samples} interleaved rounds");
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / samples as f64;
    for ((label, s), (m, a)) in START_KINDS.iter().zip(&taken).zip(&cpu) {
        println!(
            "  {label}  {}  (CPU a sample: manager {:.3} ms, agent {:.3} ms)",
            summarize(s).line(),
            per(*m),
            per(*a)
        );
    }
    let (sd, sr) = (summarize(&taken[0]), summarize(&taken[1]));
    let over = paired_overhead(&taken[1], &taken[0]);
    let read_over = paired_overhead(&taken[3], &taken[2]);
    println!(
        "  overhead        median of medians {:.3} ms, median of paired differences {:.3} ms (target <= 1 ms)",
        (sr.median.as_secs_f64() - sd.median.as_secs_f64()) * 1000.0,
        stats::median_f64(&over)
    );
    // The legs: the request's way there and back without a job (a read),
    // of which the bus round trip to the manager (a ping); what the start
    // adds over the read is its job: drover's job object, systemd's
    // `JobRemoved` relayed by agent and manager.
    let ping = stats::median_f64(&ms_of(&taken[4]));
    let read = stats::median_f64(&read_over);
    let start = stats::median_f64(&over);
    println!("  legs (medians, ms):");
    println!("    bus round trip to the manager (Peer.Ping)                  {ping:.3}");
    println!(
        "    manager <-> agent and drover's code (read overhead - ping) {:.3}",
        read - ping
    );
    println!("    a read through drover over the same read on systemd        {read:.3}");
    println!(
        "    the job: drover's job object, JobRemoved relayed (start overhead - read overhead) {:.3}",
        start - read
    );
    println!(
        "  drover's CPU a start (manager + agent): {:.3} ms; a read: {:.3} ms",
        per(cpu[1].0 + cpu[1].1),
        per(cpu[3].0 + cpu[3].1)
    );
    Ok(())
}

fn ms_of(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

fn rss(cluster: &Cluster) -> Result<()> {
    std::thread::sleep(Duration::from_secs(3));
    if let Some(pid) = cluster.state().manager_pid {
        println!("rss: manager {} KiB (2 nodes, idle)", rss_kib(pid)?);
    }
    for n in cluster.node_names() {
        if let Some(pid) = cluster.agent_pid(&n) {
            println!("rss: agent {n} {} KiB (idle)", rss_kib(pid)?);
        }
    }
    Ok(())
}
