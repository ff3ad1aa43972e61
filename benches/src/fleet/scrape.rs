//! `drover-bench scrape`: what a Prometheus scrape of the manager's
//! `/metrics` costs at fleet size. N simulated agents (the fleet's, plain
//! TCP) register with one release manager whose endpoint is on; then:
//!
//! 1. `--scrapes` scrapes one after another, each timed end to end (connect,
//!    request, whole body read): median, p90, p99; the body's size and its
//!    series count;
//! 2. the manager's CPU time over those scrapes, per scrape, and what one
//!    scrape every 15 s makes of a core;
//! 3. `StartUnit` round trips on one node, alone and with a scrape started at
//!    the same moment, interleaved (alone, scraped, alone, ...): medians and
//!    p90/p99 of both, so a scrape's effect on a job is measured side by side.
//!
//! `--no-per-node` runs the manager with `MetricsPerNode=false`.

use crate::fleet::agent::node_name;
use crate::fleet::daemon::Transport;
use crate::fleet::{Options, Rig, probe};
use crate::procfs;
use crate::stats::summarize;
use anyhow::{Context, Result, bail};
use clap::Parser;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(
    name = "drover-bench scrape",
    about = "the cost of a /metrics scrape at fleet size (see docs/performance.md)"
)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Scrapes timed one after another.
    #[arg(long, default_value_t = 50)]
    scrapes: usize,
    /// StartUnit samples per side (alone, during a scrape).
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Serve without the per-node series (MetricsPerNode=false).
    #[arg(long)]
    no_per_node: bool,
    /// Seconds the fleet may take to come online.
    #[arg(long, default_value_t = 300)]
    online_timeout: u64,
}

/// `drover-bench scrape ARGS` (`argv[0]` is `scrape`).
pub async fn main(argv: Vec<String>) -> Result<()> {
    let Some(args) = super::cli::parse::<Args>(argv)? else {
        return Ok(());
    };
    crate::fleet::daemon::raise_nofile(2 * args.nodes as u64 + 1024)?;
    let port = drover_sandbox::free_loopback_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut opts = Options::new(args.nodes, Transport::Plain);
    opts.metrics = Some((addr, !args.no_per_node));
    opts.online_timeout = Duration::from_secs(args.online_timeout);
    let n = args.nodes;

    let mut rig = Rig::start(&opts, n, None).await?;
    let t = Instant::now();
    rig.spawn_agents(&opts, n, Vec::new());
    rig.wait_online(n, n as u64, t, opts.online_timeout).await?;
    rig.wait_swept(n as u64, opts.online_timeout).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "scrape {n}: all online and swept after {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 1 and 2: scrapes one after another, and the manager's CPU meanwhile.
    let pid = rig.manager.pid();
    let cpu0 = procfs::try_cpu_time(pid)?;
    let wall = Instant::now();
    let mut times = Vec::new();
    let mut body = String::new();
    for _ in 0..args.scrapes.max(1) {
        let t = Instant::now();
        body = get(addr).await?;
        times.push(t.elapsed());
    }
    let wall = wall.elapsed();
    let cpu = procfs::try_cpu_time(pid)?.saturating_sub(cpu0);
    let series = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let online = body
        .lines()
        .find_map(|l| l.strip_prefix("drover_nodes{status=\"online\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    if online != Some(n as f64) {
        bail!("the scrape shows {online:?} nodes online, expected {n}");
    }
    let per_scrape = cpu.as_secs_f64() / times.len() as f64;
    println!(
        "scrape {n} nodes{}: {} scrapes: {}",
        if args.no_per_node {
            " (MetricsPerNode=false)"
        } else {
            ""
        },
        times.len(),
        summarize(&times).line()
    );
    println!("scrape {n}: body {} bytes, {series} series", body.len());
    println!(
        "scrape {n}: manager CPU {:.2} ms per scrape ({:.1} ms over {:.2} s of scraping); \
         one scrape every 15 s = {:.4}% of a core",
        per_scrape * 1e3,
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64(),
        per_scrape / 15.0 * 100.0
    );

    // 3. StartUnit alone and during a scrape, interleaved.
    let unit = "fleet-0.service";
    let mut starter = probe::Starter::new(&rig.api, &node_name(n / 2)).await?;
    let (mut alone, mut scraped) = (Vec::new(), Vec::new());
    for i in 0..2 * (args.samples + 3) {
        let sample = if i % 2 == 0 {
            starter.round_trip(unit).await?
        } else {
            let scrape = tokio::spawn(get(addr));
            let took = starter.round_trip(unit).await?;
            scrape.await.context("the scrape task")??;
            took
        };
        // The first 3 of each side warm up.
        if i >= 6 {
            if i % 2 == 0 {
                alone.push(sample);
            } else {
                scraped.push(sample);
            }
        }
    }
    println!(
        "scrape {n}: StartUnit alone:          {}",
        summarize(&alone).line()
    );
    println!(
        "scrape {n}: StartUnit during a scrape: {}",
        summarize(&scraped).line()
    );
    rig.stop().await;
    Ok(())
}

/// `GET /metrics` over a fresh connection (as Prometheus after a restart),
/// the whole body read; the body.
pub(crate) async fn get(addr: SocketAddr) -> Result<String> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        let text = String::from_utf8(out).context("the answer is not UTF-8")?;
        match text.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
            _ => bail!("not a 200 answer: {}", text.lines().next().unwrap_or("")),
        }
    })
    .await
    .context("no answer within 30 s")?
}
