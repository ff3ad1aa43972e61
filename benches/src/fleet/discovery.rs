//! `where`: what `io.drover.Controller.Where` costs on a large fleet, against
//! a real release `drover-manager` and N simulated agents ([`super::agent`]),
//! each with U loaded units `fleet-K.service` (active), and the unit
//! [`FEW`] loaded on agents `0..FEW_NODES` only. In order:
//!
//! 1. **memory per index row**: the manager's RssAnon and RSS with the
//!    fleet online and idle (once it moves by less than 1% over [`SETTLE`];
//!    the last drift is printed), then after each step of indexing more units
//!    (a first `Where` of `fleet-K.service` each: watched on every node, the
//!    agents' replays applied, N rows), the difference per row added. What
//!    a row costs here is everything indexing costs the manager: the index
//!    row, the hub's record and watch of the (node, unit). The first
//!    query's own time is printed too (median, max).
//! 2. **latency**: `Where` of [`FEW`] (3 rows out of an index of N rows per
//!    unit) and of `fleet-0.service` (N rows), against two baselines on the
//!    same bus, in the same rounds, the order turned every round:
//!    `org.freedesktop.DBus.Peer.Ping` to the manager (the bus round trip
//!    with no work) and `Controller.ListNodes` (an answer of N rows the
//!    manager builds from its node table). The N-row kinds run every
//!    [`BIG_EVERY`]th round. Wall time of the call, decoding included.
//! 3. **visibility**: one agent at a time is nudged to send a unit event of
//!    [`agent::EVENT_UNIT`] (indexed first) with its send time in the sub
//!    state; `Where(unit, {all, nodes: that node})` is called back to back
//!    until its row shows the new sub state, and a monitor subscribed to the
//!    unit on every node notes when the manager's `UnitStateChanged` signal
//!    for it arrives (the baseline: the manager received the event and
//!    forwarded it). Reported: the time from the agent's send to `Where`
//!    showing it (its resolution is one `Where` round trip), to the
//!    monitor's signal, and the paired difference.
//!
//! Target (issue 28): `Where` ≤ 2 ms p99 at 10,000 nodes × 200 units, a
//! change visible to `Where` within 10 ms of the manager receiving it.

use super::agent::{self, AgentConfig, node_name, sent_at_us};
use super::daemon::{Transport, raise_nofile};
use super::{Options, Rig};
use crate::stats::{self, summarize};
use anyhow::{Context, Result, bail};
use clap::Parser;
use drover_bus::bluechi::{BUS_NAME, CONTROLLER_PATH};
use drover_bus::client::{DroverControllerProxy, WhereTuple};
use drover_protocol::UnitInfo;
use futures::StreamExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbus::Variant as Value;

/// The unit loaded on a few nodes only.
pub const FEW: &str = "few.service";
/// On agents `0..FEW_NODES`.
pub const FEW_NODES: usize = 3;
/// The N-row kinds run every this many rounds.
pub const BIG_EVERY: usize = 4;
/// The wait before each memory reading.
pub const SETTLE: Duration = Duration::from_secs(3);

#[derive(Parser, Debug)]
#[command(
    name = "drover-bench where",
    about = "io.drover.Controller.Where on N simulated agents against a release drover-manager"
)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Loaded units per node.
    #[arg(long, default_value_t = 200)]
    units: usize,
    /// Units indexed for the memory figure (at most 120: the index holds 128).
    #[arg(long, default_value_t = 20)]
    indexed: usize,
    /// Steps the indexed units are added in (one memory reading each).
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Latency rounds (the N-row kinds run every 4th).
    #[arg(long, default_value_t = 1200)]
    rounds: usize,
    /// Unit changes timed to `Where`.
    #[arg(long, default_value_t = 300)]
    changes: usize,
    /// Seconds the fleet may take to come online.
    #[arg(long, default_value_t = 300)]
    online_timeout: u64,
}

/// The `where` command; `argv` starts with the word `where`.
pub async fn main(argv: Vec<String>) -> Result<()> {
    let Some(args) = super::cli::parse::<Args>(argv)? else {
        return Ok(());
    };
    if args.indexed > 120 || args.indexed > args.units || args.steps == 0 {
        bail!("--indexed must be at most 120 and --units, --steps at least 1");
    }
    let (soft, _) = raise_nofile(args.nodes as u64 * 2 + 4096)?;
    if soft < args.nodes as u64 + 1024 {
        println!(
            "where: warning: {soft} descriptors may not hold {} agents",
            args.nodes
        );
    }
    let mut opts = Options::new(args.nodes, Transport::Plain);
    opts.units = args.units;
    opts.event_rate = 0;
    opts.online_timeout = Duration::from_secs(args.online_timeout);
    let mut rig = Rig::start(&opts, args.nodes, None).await?;
    let res = run(&mut rig, &opts, &args).await;
    rig.stop().await;
    res
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Starts the agents: every one with `opts.units` units, the first
/// [`FEW_NODES`] with [`FEW`] as well.
fn spawn(rig: &mut Rig, opts: &Options) {
    let config = |units: Vec<UnitInfo>| {
        Arc::new(AgentConfig {
            manager: SocketAddr::from(([127, 0, 0, 1], rig.manager.port)),
            heartbeat_interval: Duration::from_millis(opts.heartbeat_interval_ms),
            heartbeat_threshold: Duration::from_millis(opts.heartbeat_threshold_ms),
            connect_timeout: Duration::from_secs(10),
            units: Arc::new(units),
            health: Default::default(),
        })
    };
    let plain = config(AgentConfig::unit_rows(opts.units));
    let mut rows = AgentConfig::unit_rows(opts.units);
    rows.push(UnitInfo::loaded(FEW, "active", "running"));
    let few = config(rows);
    for index in 0..opts.nodes {
        let cfg = if index < FEW_NODES { &few } else { &plain };
        rig.agents.push(tokio::spawn(agent::run(
            index,
            cfg.clone(),
            rig.fleet.clone(),
            None,
        )));
    }
}

/// One `Where` call: its wall time, rows and `complete`.
async fn where_call(
    c: &DroverControllerProxy<'_>,
    unit: &str,
    options: &[(&'static str, Value<'static>)],
) -> Result<(Duration, Vec<WhereTuple>, bool)> {
    let map: HashMap<&str, Value<'_>> = options.iter().cloned().collect();
    let t = Instant::now();
    let (rows, complete) = c
        .where_(unit, map)
        .await
        .with_context(|| format!("Where({unit})"))?;
    Ok((t.elapsed(), rows, complete))
}

/// `Where` until an answer is complete (every agent confirmed the unit:
/// the calls after a first one wait for the agents it did not), at most 60 s.
async fn until_complete(
    c: &DroverControllerProxy<'_>,
    unit: &str,
    options: &[(&'static str, Value<'static>)],
) -> Result<Vec<WhereTuple>> {
    let t = Instant::now();
    loop {
        let (_, rows, complete) = where_call(c, unit, options).await?;
        if complete {
            return Ok(rows);
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("Where({unit}) still incomplete after 60 s");
        }
    }
}

async fn run(rig: &mut Rig, opts: &Options, args: &Args) -> Result<()> {
    let n = opts.nodes;
    println!(
        "where: {n} simulated nodes x {} units ({FEW} on {FEW_NODES}), release manager {}; \
         load {}",
        opts.units,
        rig.manager.binary().display(),
        load()
    );
    let t = Instant::now();
    spawn(rig, opts);
    let took = rig.wait_online(n, n as u64, t, opts.online_timeout).await?;
    // The manager's one-off sweep of every new node, then quiet.
    rig.wait_swept(n as u64, opts.online_timeout).await?;
    println!(
        "where: all online in {:.1} s, swept; load {}",
        took.as_secs_f64(),
        load()
    );
    let c = DroverControllerProxy::new(&rig.api).await?;

    memory(rig, &c, args, n).await?;
    latency(rig, &c, args, n).await?;
    visibility(rig, &c, args, n).await?;
    println!("where: load after: {}", load());
    Ok(())
}

/// Phase 1 (see the module docs).
async fn memory(rig: &Rig, c: &DroverControllerProxy<'_>, args: &Args, n: usize) -> Result<()> {
    let (rss1, anon1, drift) = settled(rig).await?;
    println!(
        "memory: idle fleet RSS {rss1} KiB, RssAnon {anon1} KiB; drift over the last \
         {SETTLE:?} with nothing indexed: RssAnon {drift:+} KiB"
    );
    let (mut prev_rss, mut prev_anon) = (rss1, anon1);
    let mut firsts = Vec::new();
    let mut incomplete = 0usize;
    let mut next = 0usize;
    for step in 0..args.steps {
        let until = args.indexed * (step + 1) / args.steps;
        let added = until - next;
        while next < until {
            let unit = format!("fleet-{next}.service");
            let (took, rows, complete) = where_call(c, &unit, &[]).await?;
            if rows.len() != n || !complete {
                // Not every agent confirmed within the manager's wait: the
                // next calls wait for the rest.
                incomplete += 1;
                let rows = until_complete(c, &unit, &[]).await?;
                if rows.len() != n {
                    bail!("Where({unit}): {} rows, want {n}", rows.len());
                }
            }
            firsts.push(took);
            next += 1;
        }
        let (rss, anon, _) = settled(rig).await?;
        let rows = (added * n) as f64;
        println!(
            "memory: step {}: {added} more units indexed ({until} x {n} = {} rows): RssAnon \
             {:+} KiB = {:.0} bytes per row, RSS {:+} KiB = {:.0} bytes per row",
            step + 1,
            until * n,
            anon as i64 - prev_anon as i64,
            (anon as f64 - prev_anon as f64) * 1024.0 / rows,
            rss as i64 - prev_rss as i64,
            (rss as f64 - prev_rss as f64) * 1024.0 / rows,
        );
        (prev_rss, prev_anon) = (rss, anon);
    }
    let rows = (args.indexed * n) as f64;
    println!(
        "memory: all {} rows: RssAnon {:+} KiB = {:.0} bytes per row, RSS {:+} KiB = {:.0} \
         bytes per row",
        args.indexed * n,
        prev_anon as i64 - anon1 as i64,
        (prev_anon as f64 - anon1 as f64) * 1024.0 / rows,
        prev_rss as i64 - rss1 as i64,
        (prev_rss as f64 - rss1 as f64) * 1024.0 / rows,
    );
    let s = summarize(&firsts);
    println!(
        "memory: a unit's first Where (watched on {n} nodes, replays applied): median {}, max \
         {}; {incomplete} of {} answered incomplete (not every agent in time)",
        stats::ms(s.median),
        stats::ms(*firsts.iter().max().unwrap_or(&Duration::ZERO)),
        firsts.len()
    );
    Ok(())
}

/// The manager's (RSS, RssAnon) once RssAnon moved by less than 1% (and
/// 4 MiB) over [`SETTLE`] (at most 10 tries: the sweep's and the first
/// queries' buffers are given back to the system a while after), and the
/// last drift in KiB.
async fn settled(rig: &Rig) -> Result<(u64, u64, i64)> {
    let (mut rss, mut anon, _) = rig.manager.memory_kib()?;
    let mut drift = 0;
    for _ in 0..10 {
        tokio::time::sleep(SETTLE).await;
        let (r, a, _) = rig.manager.memory_kib()?;
        drift = a as i64 - anon as i64;
        (rss, anon) = (r, a);
        if drift.unsigned_abs() < (a / 100).min(4096) {
            break;
        }
    }
    Ok((rss, anon, drift))
}

/// Phase 2 (see the module docs).
async fn latency(rig: &Rig, c: &DroverControllerProxy<'_>, args: &Args, n: usize) -> Result<()> {
    let peer = zbus::fdo::PeerProxy::builder(&rig.api)
        .destination(BUS_NAME)
        .path(CONTROLLER_PATH)
        .build()
        .await?;
    // Index FEW (the first query waits for the agents).
    let rows = until_complete(c, FEW, &[]).await?;
    if rows.len() != FEW_NODES {
        bail!("Where({FEW}): {} rows, want {FEW_NODES}", rows.len());
    }
    let big = "fleet-0.service";
    let kinds = [
        "Peer.Ping (baseline)",
        "Where few.service (3 rows)",
        "ListNodes (N rows, baseline)",
        "Where fleet-0.service (N rows)",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    for round in 0..args.rounds + 20 {
        let mut order: Vec<usize> = if round % BIG_EVERY == 0 {
            vec![0, 1, 2, 3]
        } else {
            vec![0, 1]
        };
        let len = order.len();
        order.rotate_left(round / BIG_EVERY % len);
        for k in order {
            let took = match k {
                0 => {
                    let t = Instant::now();
                    peer.ping().await?;
                    t.elapsed()
                }
                1 => {
                    let (took, rows, _) = where_call(c, FEW, &[]).await?;
                    if rows.len() != FEW_NODES {
                        bail!("Where({FEW}): {} rows", rows.len());
                    }
                    took
                }
                2 => {
                    let (took, online) = super::probe::list_nodes(&rig.api).await?;
                    if online != n {
                        bail!("ListNodes: {online} online, want {n}");
                    }
                    took
                }
                _ => {
                    let (took, rows, _) = where_call(c, big, &[]).await?;
                    if rows.len() != n {
                        bail!("Where({big}): {} rows", rows.len());
                    }
                    took
                }
            };
            // The first 20 rounds warm up.
            if round >= 20 {
                samples[k].push(took);
            }
        }
    }
    println!(
        "latency: {} rounds, order turned every round; load {}",
        args.rounds,
        load()
    );
    for (k, name) in kinds.iter().enumerate() {
        println!("  {name:<32} {}", summarize(&samples[k]).line());
    }
    let few_minus_ping = stats::paired_overhead(&samples[1], &samples[0]);
    println!(
        "  Where few.service - Peer.Ping, paired: {}",
        spread(&few_minus_ping)
    );
    Ok(())
}

/// Phase 3 (see the module docs).
async fn visibility(rig: &Rig, c: &DroverControllerProxy<'_>, args: &Args, n: usize) -> Result<()> {
    let unit = agent::EVENT_UNIT;
    until_complete(c, unit, &[("all", Value::from(true))]).await?;
    let (_conn, mut inbox, _monitor) = super::probe::subscribed(rig.bus.address(), unit).await?;
    let heard: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let reader = {
        let heard = heard.clone();
        let fleet = rig.fleet.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = inbox.next().await {
                if msg.header().member().map(|m| m.as_str()) != Some("UnitStateChanged") {
                    continue;
                }
                let at = fleet.now_us();
                let body = msg.body();
                if let Ok((_, _, _, sub, _)) = body.deserialize::<(&str, &str, &str, &str, &str)>()
                {
                    heard
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(sub.to_owned(), at);
                }
            }
        })
    };
    // The monitor's subscription reaches every node first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut to_where = Vec::new();
    let mut to_monitor = Vec::new();
    let mut calls = 0usize;
    let mut last: HashMap<usize, String> = HashMap::new();
    for j in 0..args.changes {
        let k = (j * 7919 + 11) % n;
        let node = node_name(k);
        let before = last.get(&k).cloned().unwrap_or_default();
        rig.fleet.nudge(k);
        let options = [
            ("all", Value::from(true)),
            ("nodes", Value::from(node.clone())),
        ];
        let t = Instant::now();
        let sub = loop {
            let (_, rows, _) = where_call(c, unit, &options).await?;
            calls += 1;
            if let Some(row) = rows.first()
                && row.2 != before
            {
                break row.2.clone();
            }
            if t.elapsed() > Duration::from_secs(5) {
                bail!("{node}'s change not in Where after 5 s");
            }
        };
        let seen = rig.fleet.now_us();
        let sent = sent_at_us(&sub).context("the row's sub state carries no send time")?;
        to_where.push(Duration::from_micros(seen.saturating_sub(sent)));
        let t = Instant::now();
        let monitored = loop {
            if let Some(at) = heard
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&sub)
                .copied()
            {
                break at;
            }
            if t.elapsed() > Duration::from_secs(5) {
                bail!("the monitor did not hear {node}'s change within 5 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        to_monitor.push(Duration::from_micros(monitored.saturating_sub(sent)));
        last.insert(k, sub);
    }
    reader.abort();
    println!(
        "visibility: {} changes, one node at a time, {:.1} Where calls per change; load {}",
        args.changes,
        calls as f64 / args.changes.max(1) as f64,
        load()
    );
    println!(
        "  agent send -> Where shows it      {}",
        summarize(&to_where).line()
    );
    println!(
        "  agent send -> monitor's signal    {}",
        summarize(&to_monitor).line()
    );
    let diff = stats::paired_overhead(&to_where, &to_monitor);
    println!("  Where - monitor, paired:          {}", spread(&diff));
    Ok(())
}

/// `median … p90 … p99 …` of differences in ms.
fn spread(v: &[f64]) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    let s = stats::Spread::of(v);
    format!(
        "median {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
        s.median, s.p90, s.p99
    )
}
