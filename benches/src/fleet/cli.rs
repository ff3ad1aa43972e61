//! `drover-bench fleet [OPTIONS]`: the fleet sizes and transports to run,
//! the knobs of [`Options`], and the CSV file the rows are appended to.
//!
//! Before anything runs, this process's `RLIMIT_NOFILE` is raised to fit
//! the largest fleet (an agent's socket here, its session's in the manager,
//! which inherits the limit), and the new limit is printed.

use crate::fleet::daemon::{Transport, raise_nofile};
use crate::fleet::report::{HEADER, csv_line};
use crate::fleet::{Options, run};
use anyhow::{Context, Result, bail};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "drover-bench fleet",
    about = "N simulated agents against a release drover-manager (see docs/performance.md)"
)]
struct Args {
    /// Fleet sizes, comma-separated; each runs against a fresh manager.
    #[arg(long, default_value = "2000", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Transports, comma-separated: plain, tls.
    #[arg(long, default_value = "plain,tls", value_delimiter = ',')]
    transport: Vec<String>,
    /// Seconds over which the idle manager's CPU is measured.
    #[arg(long, default_value_t = 30.0)]
    idle_seconds: f64,
    /// Loaded units per node (the rows of ListUnits).
    #[arg(long, default_value_t = 100)]
    units: usize,
    /// Unit events a second per node while the monitor listens (0: no monitor phase).
    #[arg(long, default_value_t = 10)]
    event_rate: u32,
    /// Seconds of the monitor phase.
    #[arg(long, default_value_t = 10.0)]
    monitor_seconds: f64,
    /// StartUnit samples at N and at 3 nodes (0: none).
    #[arg(long, default_value_t = 50)]
    start_samples: usize,
    /// The agents' HeartbeatInterval (ms).
    #[arg(long, default_value_t = 2000)]
    heartbeat_ms: u64,
    /// The manager's HeartbeatInterval (ms); unset: the manager's default
    /// (0 since protocol 5: the manager sends none).
    #[arg(long)]
    manager_heartbeat_ms: Option<u64>,
    /// The manager's ProxyGracePeriod (ms), which is also when it sweeps a
    /// new node for orphan deps; unset: its default (3 × the threshold).
    #[arg(long)]
    proxy_grace_ms: Option<u64>,
    /// The manager's NodeHeartbeatThreshold (ms).
    #[arg(long, default_value_t = 6000)]
    threshold_ms: u64,
    /// Seconds the fleet may take to come (back) online.
    #[arg(long, default_value_t = 300)]
    online_timeout: u64,
    /// Skip the half-drop and restart phases.
    #[arg(long)]
    no_disruptions: bool,
    /// The CSV file rows are appended to (header written when it is new).
    #[arg(long, default_value = "fleet.csv")]
    csv: PathBuf,
    /// Units with a health check per node (0: none declared); adds the
    /// health windows to the idle phase.
    #[arg(long, default_value_t = 0)]
    health_checks: usize,
    /// Percent of the checks whose verdict flips a minute in a flip window.
    #[arg(long, default_value_t = 1.0)]
    health_flip_percent: f64,
    /// Pairs of idle windows, flips on and off.
    #[arg(long, default_value_t = 3)]
    health_rounds: usize,
    /// Where the fleet's certificates are kept between runs.
    #[arg(long)]
    pki_dir: Option<PathBuf>,
    /// The manager serves `/metrics` (per-node series on) at a free
    /// loopback port that nobody scrapes: what the endpoint costs an idle
    /// manager, against a run without it.
    #[arg(long)]
    metrics: bool,
}

/// A subcommand's arguments; `None` after printing `--help` (or
/// `--version`), which is not an error.
pub(crate) fn parse<A: Parser>(argv: Vec<String>) -> Result<Option<A>> {
    match A::try_parse_from(argv) {
        Ok(args) => Ok(Some(args)),
        Err(e) if !e.use_stderr() => {
            print!("{e}");
            Ok(None)
        }
        Err(e) => bail!("{e}"),
    }
}

fn transport(word: &str) -> Result<Transport> {
    match word.trim() {
        "plain" => Ok(Transport::Plain),
        "tls" => Ok(Transport::Tls),
        other => bail!("--transport: unknown '{other}' (plain, tls)"),
    }
}

/// The `fleet` command; `argv` starts with the word `fleet`.
pub async fn main(argv: Vec<String>) -> Result<()> {
    let Some(args) = parse::<Args>(argv)? else {
        return Ok(());
    };
    let transports = args
        .transport
        .iter()
        .map(|t| transport(t))
        .collect::<Result<Vec<_>>>()?;
    if !(0.0..=100.0).contains(&args.health_flip_percent) {
        bail!(
            "--health-flip-percent: {} is not a percentage (0 to 100)",
            args.health_flip_percent
        );
    }
    if args.health_checks > drover_protocol::health::UNITS_MAX {
        bail!(
            "--health-checks: at most {} units a node have a check",
            drover_protocol::health::UNITS_MAX
        );
    }
    let largest = args.nodes.iter().copied().max().unwrap_or(0) as u64;
    let (soft, hard) = raise_nofile(largest * 2 + 4096)?;
    println!(
        "fleet: RLIMIT_NOFILE of drover-bench and the manager it starts raised to {soft} \
         (hard {hard})"
    );
    if soft < largest + 1024 {
        println!("fleet: warning: {soft} descriptors may not hold {largest} agents");
    }
    for &nodes in &args.nodes {
        for &t in &transports {
            let mut opts = Options::new(nodes, t);
            opts.idle_seconds = args.idle_seconds;
            opts.units = args.units;
            opts.event_rate = args.event_rate;
            opts.monitor_seconds = args.monitor_seconds;
            opts.start_samples = args.start_samples;
            opts.heartbeat_interval_ms = args.heartbeat_ms;
            opts.manager_heartbeat_ms = args.manager_heartbeat_ms;
            opts.heartbeat_threshold_ms = args.threshold_ms;
            opts.proxy_grace_ms = args.proxy_grace_ms;
            opts.online_timeout = Duration::from_secs(args.online_timeout);
            opts.disruptions = !args.no_disruptions;
            opts.health_checks = args.health_checks;
            opts.health_flip_percent = args.health_flip_percent;
            opts.health_rounds = args.health_rounds;
            if let Some(dir) = &args.pki_dir {
                opts.pki_dir = dir.clone();
            }
            if args.metrics {
                let port = drover_sandbox::free_loopback_port()?;
                opts.metrics = Some((std::net::SocketAddr::from(([127, 0, 0, 1], port)), true));
                println!("fleet: the manager serves /metrics at 127.0.0.1:{port}, unscraped");
            }
            let row = run(&opts).await?;
            append(&args.csv, &csv_line(&row))?;
            println!("{}", csv_line(&row));
        }
    }
    println!("fleet: rows appended to {}", args.csv.display());
    Ok(())
}

fn append(path: &PathBuf, line: &str) -> Result<()> {
    let fresh = std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if fresh {
        writeln!(f, "{HEADER}")?;
    }
    writeln!(f, "{line}")?;
    Ok(())
}
