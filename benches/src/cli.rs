//! The `drover-bench` command: which benchmark, how many samples, which proxy
//! helpers; starts the sandbox cluster, runs `start-unit`, `proxy` and `rss` on it
//! (`events` needs no cluster, `tls` starts two), tears it down. [`main`] is the whole program.

use crate::start::{StartPaths, rss_kib};
use crate::stats::{self, paired_overhead, summarize};
use crate::{agent_cpu, ctl, events, health, proxy, tls};
use anyhow::Result;
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

async fn start_unit(cluster: &Cluster, samples: usize) -> Result<()> {
    let mut paths = StartPaths::new(cluster).await?;
    let mut d = Vec::with_capacity(samples);
    let mut r = Vec::with_capacity(samples);
    // Warm-up, then interleave, alternating which side goes first.
    for i in 0..(samples + 20) {
        let (a, b) = if i % 2 == 0 {
            let a = paths.direct().await?;
            let b = paths.via_drover().await?;
            (a, b)
        } else {
            let b = paths.via_drover().await?;
            let a = paths.direct().await?;
            (a, b)
        };
        if i >= 20 {
            d.push(a);
            r.push(b);
        }
    }
    let (sd, sr) = (summarize(&d), summarize(&r));
    let over = paired_overhead(&r, &d);
    println!("start-unit: trivial oneshot on node2, {samples} interleaved pairs");
    for (label, s) in [("direct systemd", &sd), ("via drover    ", &sr)] {
        println!("  {label}  {}", s.line());
    }
    println!(
        "  overhead        median of medians {:.3} ms, median of paired differences {:.3} ms (target <= 1 ms)",
        (sr.median.as_secs_f64() - sd.median.as_secs_f64()) * 1000.0,
        stats::median_f64(&over)
    );
    Ok(())
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
