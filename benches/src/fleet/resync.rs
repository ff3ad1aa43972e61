//! `drover-bench resync`: what resync costs and whether a clean fleet ever
//! asks for a snapshot. N simulated agents (the fleet's, plain TCP; each
//! sends the digest a real agent sends, at the interval the manager named
//! at registration: `agent`'s module docs) against one release manager
//! with its Prometheus endpoint on, which counts what resync did
//! (`drover_resync_*`, docs/monitoring.md).
//!
//! 1. The fleet registers; `Where` of `--watch` units (`fleet-0.service`
//!    …) makes the manager watch them on every node, so its records, and the
//!    digests, hold them; with health checks declared, the health book too.
//! 2. **Clean run** for `--duration` seconds: only what a quiet fleet does
//!    (heartbeats, the health verdict flips of `--health-flip-percent`,
//!    `--event-rate` unit events of the watched [`agent::EVENT_UNIT`]).
//!    Reported: the manager's snapshot requests (target 0), mismatches,
//!    digests it compared, the digests the agents sent and their bytes/s,
//!    the manager's CPU, load average.
//! 3. With `--diverge K`: agents `0..K` each change one watched unit's state
//!    without telling the manager (a lost event); reported: the snapshot
//!    requests and repaired records once the manager has caught up (want K
//!    each), and `Where` showing every changed unit as the agent holds it;
//!    then one more interval: still K (nothing asked twice).

use crate::fleet::agent::{self, node_name};
use crate::fleet::daemon::Transport;
use crate::fleet::{Options, Rig, load_average};
use crate::procfs;
use anyhow::{Context, Result, bail};
use clap::Parser;
use drover_bus::client::DroverControllerProxy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zbus::Variant as Value;

#[derive(Parser, Debug)]
#[command(
    name = "drover-bench resync",
    about = "resync digests of N simulated agents against a release drover-manager: snapshot \
             requests on a clean run, digest traffic (see docs/performance.md)"
)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 2000)]
    nodes: usize,
    /// Seconds of the clean run.
    #[arg(long, default_value_t = 3600)]
    duration: u64,
    /// The manager's ResyncInterval (ms).
    #[arg(long, default_value_t = drover_protocol::resync::DEFAULT_INTERVAL_MS)]
    resync_ms: u64,
    /// Loaded units per node.
    #[arg(long, default_value_t = 20)]
    units: usize,
    /// Units the manager watches on every node (`Where` of fleet-0.service …).
    #[arg(long, default_value_t = 4)]
    watch: usize,
    /// Units with a health check per node.
    #[arg(long, default_value_t = 2)]
    health_checks: usize,
    /// Percent of the checks whose verdict flips a minute during the run.
    #[arg(long, default_value_t = 5.0)]
    health_flip_percent: f64,
    /// Unit events a second per node (of the watched fleet-events.service).
    #[arg(long, default_value_t = 0)]
    event_rate: u32,
    /// After the clean run, agents 0..K change a watched unit unreported.
    #[arg(long, default_value_t = 0)]
    diverge: usize,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 300)]
    progress: u64,
    /// Seconds the fleet may take to come online.
    #[arg(long, default_value_t = 300)]
    online_timeout: u64,
}

/// The manager's resync counters (`drover_resync_*_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    digests: u64,
    mismatches: u64,
    snapshots: u64,
    repairs: u64,
}

impl Counters {
    /// The counters in a `/metrics` body; an error when one is missing.
    fn parse(body: &str) -> Result<Self> {
        let value = |name: &str| -> Result<u64> {
            body.lines()
                .find_map(|l| {
                    let (key, v) = l.split_once(' ')?;
                    (key == name).then(|| v.trim().parse::<u64>().ok())?
                })
                .with_context(|| format!("no {name} in the manager's /metrics"))
        };
        Ok(Self {
            digests: value("drover_resync_digests_total")?,
            mismatches: value("drover_resync_mismatches_total")?,
            snapshots: value("drover_resync_snapshots_total")?,
            repairs: value("drover_resync_repairs_total")?,
        })
    }
}

async fn counters(addr: SocketAddr) -> Result<Counters> {
    Counters::parse(&crate::fleet::scrape::get(addr).await?)
}

/// `drover-bench resync ARGS` (`argv[0]` is `resync`).
pub async fn main(argv: Vec<String>) -> Result<()> {
    let Some(args) = crate::fleet::cli::parse::<Args>(argv)? else {
        return Ok(());
    };
    if args.resync_ms == 0 {
        bail!("--resync-ms: 0 turns resync off; nothing to measure");
    }
    if args.watch == 0 || args.watch > args.units {
        bail!("--watch: 1 to --units ({}) units", args.units);
    }
    if !(0.0..=100.0).contains(&args.health_flip_percent) {
        bail!("--health-flip-percent: 0 to 100");
    }
    crate::fleet::daemon::raise_nofile(2 * args.nodes as u64 + 1024)?;
    let port = drover_sandbox::free_loopback_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let n = args.nodes;
    let mut opts = Options::new(n, Transport::Plain);
    opts.metrics = Some((addr, false));
    opts.online_timeout = Duration::from_secs(args.online_timeout);
    opts.units = args.units;
    opts.health_checks = args.health_checks;
    opts.health_flip_percent = args.health_flip_percent;
    opts.resync_interval_ms = Some(args.resync_ms);

    let mut rig = Rig::start(&opts, n, None).await?;
    let result = run(&mut rig, &opts, &args, addr).await;
    if result.is_err() {
        eprintln!(
            "resync {n}: manager log (tail):\n{}",
            crate::fleet::tail(&rig.manager.log(), 20)
        );
    }
    rig.stop().await;
    result
}

async fn run(rig: &mut Rig, opts: &Options, args: &Args, addr: SocketAddr) -> Result<()> {
    let n = args.nodes;
    let t = Instant::now();
    rig.spawn_agents(opts, n, Vec::new());
    rig.wait_online(n, n as u64, t, opts.online_timeout).await?;
    println!(
        "resync {n}: all online after {:.1} s; ResyncInterval {} ms, told {}–{} ms as the \
         fleet grew",
        t.elapsed().as_secs_f64(),
        args.resync_ms,
        drover_protocol::resync::interval_for(args.resync_ms, 0),
        drover_protocol::resync::interval_for(args.resync_ms, n as u64 - 1),
    );

    // 1: the manager watches the units on every node.
    let c = DroverControllerProxy::new(&rig.api).await?;
    let mut watched: Vec<String> = (0..args.watch)
        .map(|k| format!("fleet-{k}.service"))
        .collect();
    if args.event_rate > 0 {
        watched.push(agent::EVENT_UNIT.to_owned());
    }
    for unit in &watched {
        let since = Instant::now();
        loop {
            let (rows, complete) = c
                .where_(unit, HashMap::<&str, Value<'_>>::new())
                .await
                .with_context(|| format!("Where({unit})"))?;
            let loaded = unit != agent::EVENT_UNIT;
            if complete && (!loaded || rows.len() == n) {
                break;
            }
            if since.elapsed() > Duration::from_secs(120) {
                bail!("Where({unit}): {} rows, complete {complete}", rows.len());
            }
        }
    }
    if args.health_checks > 0 {
        crate::fleet::agree_on_health(rig, n * args.health_checks, Duration::from_secs(60)).await?;
    }
    println!(
        "resync {n}: the manager watches {} on every node, {} health checks a node",
        watched.join(" "),
        args.health_checks
    );

    // 2: the clean run.
    let before = counters(addr).await?;
    let sent0 = rig.fleet.digests_sent.load(Ordering::Relaxed);
    let bytes0 = rig.fleet.digest_bytes.load(Ordering::Relaxed);
    let flips0 = rig.fleet.health_flips_sent.load(Ordering::Relaxed);
    let events0 = rig.fleet.events_sent.load(Ordering::Relaxed);
    let pid = rig.manager.pid();
    let cpu0 = procfs::cpu_ticks(pid)?;
    let sessions0 = rig.fleet.sessions.load(Ordering::Relaxed);
    rig.fleet.health_flips.send_replace(true);
    rig.fleet.event_rate.send_replace(args.event_rate);
    let start = Instant::now();
    let duration = Duration::from_secs(args.duration);
    let mut loads = Vec::new();
    while start.elapsed() < duration {
        let left = duration.saturating_sub(start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(args.progress.max(1)))).await;
        let now = counters(addr).await?;
        loads.push(load_average());
        let secs = start.elapsed().as_secs_f64();
        let bytes = rig.fleet.digest_bytes.load(Ordering::Relaxed) - bytes0;
        eprintln!(
            "resync {n}: {secs:.0} s: snapshot requests {}, mismatches {}, digests compared {}, \
             sent {} ({:.1} bytes/s); {} agents online; load {:.1}",
            now.snapshots - before.snapshots,
            now.mismatches - before.mismatches,
            now.digests - before.digests,
            rig.fleet.digests_sent.load(Ordering::Relaxed) - sent0,
            bytes as f64 / secs,
            rig.fleet.online(),
            load_average()
        );
    }
    rig.fleet.health_flips.send_replace(false);
    rig.fleet.event_rate.send_replace(0);
    let secs = start.elapsed().as_secs_f64();
    let after = counters(addr).await?;
    let cpu = (procfs::cpu_ticks(pid)? - cpu0) as f64 / procfs::clk_tck() / secs * 100.0;
    let sent = rig.fleet.digests_sent.load(Ordering::Relaxed) - sent0;
    let bytes = rig.fleet.digest_bytes.load(Ordering::Relaxed) - bytes0;
    let reconnects = rig.fleet.sessions.load(Ordering::Relaxed) - sessions0;
    loads.sort_by(f64::total_cmp);
    println!(
        "resync {n}: clean run of {secs:.0} s: snapshot requests {}, mismatches {}, repairs {}",
        after.snapshots - before.snapshots,
        after.mismatches - before.mismatches,
        after.repairs - before.repairs,
    );
    println!(
        "resync {n}: digests sent {sent} ({:.1}/s), compared by the manager {}; {} bytes of \
         digest frames, {:.1} bytes/s; {} verdict flips and {} unit events meanwhile; \
         {reconnects} sessions started",
        sent as f64 / secs,
        after.digests - before.digests,
        bytes,
        bytes as f64 / secs,
        rig.fleet.health_flips_sent.load(Ordering::Relaxed) - flips0,
        rig.fleet.events_sent.load(Ordering::Relaxed) - events0,
    );
    println!(
        "resync {n}: manager CPU {cpu:.2}% of a core; load average {} (median of the progress \
         lines {})",
        load_average(),
        loads
            .get(loads.len().saturating_sub(1) / 2)
            .map_or("-".into(), |l| format!("{l:.1}")),
    );

    // 3: injected divergence.
    if args.diverge > 0 {
        diverge(rig, &c, args, addr, after).await?;
    }
    Ok(())
}

/// Phase 3 (module docs).
async fn diverge(
    rig: &Rig,
    c: &DroverControllerProxy<'_>,
    args: &Args,
    addr: SocketAddr,
    before: Counters,
) -> Result<()> {
    let n = args.nodes;
    let k = args.diverge.min(n);
    let changed0 = rig.fleet.diverged.load(Ordering::Relaxed);
    for index in 0..k {
        rig.fleet.diverge(index);
    }
    let since = Instant::now();
    while rig.fleet.diverged.load(Ordering::Relaxed) - changed0 < k as u64 {
        if since.elapsed() > Duration::from_secs(10) {
            bail!("the agents did not diverge");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A digest comes within one interval (the largest one told), the
    // snapshot right after; twice that is the deadline.
    let interval = Duration::from_millis(drover_protocol::resync::interval_for(
        args.resync_ms,
        n as u64,
    ));
    let deadline = 2 * interval + Duration::from_secs(5);
    let unit = "fleet-0.service";
    let mut want_sorted: Vec<String> = (0..k).map(node_name).collect();
    want_sorted.sort();
    let repaired_after = loop {
        let now = counters(addr).await?;
        // `all`: rows in every state, not only the active ones.
        let all: HashMap<&str, Value<'_>> = [("all", Value::from(true))].into_iter().collect();
        let (rows, _) = c
            .where_(unit, all)
            .await
            .with_context(|| format!("Where({unit})"))?;
        let mut failed: Vec<String> = rows
            .iter()
            .filter(|r| r.1 == "failed")
            .map(|r| r.0.clone())
            .collect();
        failed.sort();
        if now.repairs - before.repairs >= k as u64 && failed == want_sorted {
            break since.elapsed();
        }
        if since.elapsed() > deadline {
            bail!(
                "after {deadline:?}: snapshot requests {}, repairs {}, Where({unit}) failed on {:?}; \
                 want {k} on {want_sorted:?}",
                now.snapshots - before.snapshots,
                now.repairs - before.repairs,
                failed
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // One more interval: the repaired nodes match again, nothing is asked twice.
    tokio::time::sleep(interval).await;
    let now = counters(addr).await?;
    println!(
        "resync {n}: {k} agents changed {unit} unreported: repaired after {:.1} s; snapshot \
         requests {}, repairs {}, mismatches {} (one interval later)",
        repaired_after.as_secs_f64(),
        now.snapshots - before.snapshots,
        now.repairs - before.repairs,
        now.mismatches - before.mismatches,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_the_exposition() {
        let body = "# HELP drover_resync_digests Resync digests\n\
                    # TYPE drover_resync_digests counter\n\
                    drover_resync_digests_total 12\n\
                    drover_resync_mismatches_total 1\n\
                    drover_resync_snapshots_total 1\n\
                    drover_resync_repairs_total 3\n";
        assert_eq!(
            Counters::parse(body).unwrap(),
            Counters {
                digests: 12,
                mismatches: 1,
                snapshots: 1,
                repairs: 3
            }
        );
        let err = Counters::parse("drover_resync_digests_total 12\n").unwrap_err();
        assert!(
            err.to_string().contains("drover_resync_mismatches_total"),
            "{err}"
        );
    }
}
