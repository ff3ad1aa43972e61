//! `tls`: what mutual TLS on the agent link costs, against plaintext in the
//! same run.
//!
//! Two sandbox clusters run side by side, identical but for TLS (the
//! sandbox's default) and plaintext (`ClusterOptions::tls = false`), each
//! with real agents on two real `systemd --user` nodes.
//!
//! 1. **StartUnit.** Each round times four calls of a trivial oneshot on
//!    node2, until its `JobRemoved`: straight to the node's systemd and
//!    through drover, on each cluster; the order of the four turns every
//!    round. Reported: each path's figures, the median of the paired
//!    differences drover-TLS − drover-plaintext, and the same for drover's
//!    overhead over its own node's systemd (which cancels the difference
//!    between the two clusters' nodes), each with a 95% bootstrap interval.
//!    Target: TLS adds ≤ 0.1 ms median. Also the CPU time the manager and
//!    node2's agent of each cluster spent per call over the counted rounds
//!    (the process's CPU-time clock: `crate::procfs`), which a busy machine
//!    does not inflate as it does latency.
//! 2. **Manager memory per session.** `DROVER_BENCH_SESSIONS` (default 200)
//!    fake agents in this process, allowed by `[node NAME]` sections,
//!    register on each manager (over TLS with certificates of the cluster's
//!    CA, or plaintext), heartbeat and answer
//!    requests; the manager's RSS once they are all online, minus its RSS
//!    before, divided by their number.

use crate::start::{StartPaths, rss_kib};
use crate::stats::{median_ci95, median_f64, paired_overhead, summarize};
use anyhow::{Context, Result, anyhow, bail};
use drover_protocol::link::agent_handshake;
use drover_protocol::{Hello, Response, ToAgent, ToManager};
use drover_sandbox::{Cluster, ClusterOptions};
use futures::{SinkExt, StreamExt};
use std::time::{Duration, Instant};

/// Rounds not counted (caches, first connections).
const WARMUP: usize = 20;

fn sessions() -> usize {
    std::env::var("DROVER_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn fake_name(i: usize) -> String {
    format!("bench{i}")
}

/// Both clusters, then the measurements; every cluster is torn down, also
/// after a failure.
pub async fn main(samples: usize) -> Result<()> {
    let n = sessions();
    // The fake agents' names, one section each (a config line holds at most
    // 500 characters, too few for an `AllowedNodeNames` of hundreds).
    let sections: String = (1..=n)
        .map(|i| format!("[node {}]\nAllowed=true\n", fake_name(i)))
        .collect();
    let opts = |tls: bool| ClusterOptions {
        heartbeat_interval_ms: 2000,
        heartbeat_threshold_ms: 6000,
        manager_extra_config: sections.clone(),
        tls,
        ..ClusterOptions::with_nodes(2)
    };
    let tls = Cluster::start(opts(true)).await?;
    let plain = match Cluster::start(opts(false)).await {
        Ok(c) => c,
        Err(e) => {
            tls.down().await?;
            return Err(e);
        }
    };
    let res = run(&tls, &plain, samples, n).await;
    let downs = [tls.down().await, plain.down().await];
    res?;
    for d in downs {
        d?;
    }
    Ok(())
}

async fn run(tls: &Cluster, plain: &Cluster, samples: usize, sessions: usize) -> Result<()> {
    start_unit(tls, plain, samples).await?;
    let per_plain = memory_per_session(plain, sessions).await?;
    let per_tls = memory_per_session(tls, sessions).await?;
    println!(
        "  TLS − plaintext: {:+.1} KiB per session",
        per_tls - per_plain
    );
    Ok(())
}

/// Samples of one round, in a fixed slot order whatever order they ran in.
#[derive(Default)]
struct Series {
    direct_tls: Vec<Duration>,
    drover_tls: Vec<Duration>,
    direct_plain: Vec<Duration>,
    drover_plain: Vec<Duration>,
}

/// The manager and node2's agent of `cluster`.
fn daemons(cluster: &Cluster) -> Result<[u32; 2]> {
    Ok([
        cluster
            .state()
            .manager_pid
            .context("the manager is not running")?,
        cluster.agent_pid("node2").context("node2 has no agent")?,
    ])
}

fn cpu_of(pids: [u32; 2]) -> Result<[u64; 2]> {
    let ns = |pid| crate::procfs::try_cpu_time(pid).map(|d| d.as_nanos() as u64);
    Ok([ns(pids[0])?, ns(pids[1])?])
}

async fn start_unit(tls: &Cluster, plain: &Cluster, samples: usize) -> Result<()> {
    let mut t = StartPaths::new(tls).await?;
    let mut p = StartPaths::new(plain).await?;
    let mut s = Series::default();
    let (tls_pids, plain_pids) = (daemons(tls)?, daemons(plain)?);
    let mut cpu_start = None;
    for i in 0..(samples + WARMUP) {
        // slot: 0 direct TLS, 1 drover TLS, 2 direct plain, 3 drover plain;
        // the starting slot turns every round.
        if i == WARMUP {
            cpu_start = Some((cpu_of(tls_pids)?, cpu_of(plain_pids)?));
        }
        let mut round = [Duration::ZERO; 4];
        for k in 0..4 {
            let slot = (i + k) % 4;
            round[slot] = match slot {
                0 => t.direct().await?,
                1 => t.via_drover().await?,
                2 => p.direct().await?,
                _ => p.via_drover().await?,
            };
        }
        if i >= WARMUP {
            s.direct_tls.push(round[0]);
            s.drover_tls.push(round[1]);
            s.direct_plain.push(round[2]);
            s.drover_plain.push(round[3]);
        }
    }
    println!(
        "tls start-unit: trivial oneshot on node2 of a TLS and a plaintext cluster, {samples} interleaved rounds"
    );
    for (label, v) in [
        ("direct systemd (TLS cluster)      ", &s.direct_tls),
        ("via drover over TLS               ", &s.drover_tls),
        ("direct systemd (plaintext cluster)", &s.direct_plain),
        ("via drover over plaintext         ", &s.drover_plain),
    ] {
        println!("  {label}  {}", summarize(v).line());
    }
    // The counted rounds' CPU, per StartUnit through drover (the direct calls
    // cost these daemons nothing).
    let (t0, p0) = cpu_start.context("no counted round")?;
    let (t1, p1) = (cpu_of(tls_pids)?, cpu_of(plain_pids)?);
    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / samples.max(1) as f64 / 1000.0;
    println!(
        "  CPU per StartUnit via drover: manager {:.1} µs TLS, {:.1} µs plaintext; node2's agent \
         {:.1} µs TLS, {:.1} µs plaintext",
        per(t0[0], t1[0]),
        per(p0[0], p1[0]),
        per(t0[1], t1[1]),
        per(p0[1], p1[1]),
    );
    let drover_diff = paired_overhead(&s.drover_tls, &s.drover_plain);
    let over_tls = paired_overhead(&s.drover_tls, &s.direct_tls);
    let over_plain = paired_overhead(&s.drover_plain, &s.direct_plain);
    let over_diff: Vec<f64> = over_tls
        .iter()
        .zip(&over_plain)
        .map(|(a, b)| a - b)
        .collect();
    let (dl, dh) = median_ci95(&drover_diff, 2000);
    let (ol, oh) = median_ci95(&over_diff, 2000);
    println!(
        "  TLS − plaintext  via drover: median of paired differences {:+.3} ms (95% CI {dl:+.3} \
         to {dh:+.3})",
        median_f64(&drover_diff),
    );
    println!(
        "  drover's overhead over its node's systemd: {:.3} ms TLS, {:.3} ms plaintext; \
         TLS − plaintext, paired: {:+.3} ms (95% CI {ol:+.3} to {oh:+.3}) (target <= 0.1 ms)",
        median_f64(&over_tls),
        median_f64(&over_plain),
        median_f64(&over_diff),
    );
    Ok(())
}

/// The manager's RSS growth per registered fake agent, KiB.
async fn memory_per_session(cluster: &Cluster, n: usize) -> Result<f64> {
    let pid = cluster
        .state()
        .manager_pid
        .context("the manager is not running")?;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], cluster.manager_port()).into();
    let pki = cluster.pki();
    for i in 1..=n {
        if pki.is_some() {
            cluster.issue_node(&fake_name(i))?;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(pid)?;
    let started = Instant::now();
    let mut agents = Vec::with_capacity(n);
    let handshakes = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
    for i in 1..=n {
        let name = fake_name(i);
        let tls = match &pki {
            None => None,
            Some(pki) => {
                let node = drover_protocol::NodeName::new(name.as_str())?;
                let settings = drover_tls::ClientSettings::load(&pki.node_files(&node))?;
                Some(drover_tls::Connector::new(settings, "127.0.0.1")?)
            }
        };
        // Eight handshakes at a time: what is measured is the sessions, not admission.
        let permit = handshakes.clone().acquire_owned().await?;
        agents.push(tokio::spawn(fake_agent(addr, name, tls, permit)));
    }
    // Registered = online on the manager's API, for all of them.
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 1..=n {
        let name = fake_name(i);
        let left = deadline.saturating_duration_since(Instant::now());
        cluster.wait_node_status(&name, "online", left).await?;
    }
    let registered_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid)?;
    for a in &agents {
        a.abort();
    }
    for a in agents {
        if let Ok(Err(e)) = a.await {
            bail!("a fake agent failed: {e:#}");
        }
    }
    let per = (after as f64 - before as f64) / n as f64;
    let label = if pki.is_some() { "TLS" } else { "plaintext" };
    println!(
        "tls memory ({label}): manager RSS {before} KiB idle, {after} KiB with {n} sessions \
         (registered in {:.2} s): {per:+.1} KiB per session",
        registered_in.as_secs_f64()
    );
    Ok(per)
}

/// A fake agent: registers as `name` (holding `permit` until then), then
/// heartbeats every second and answers every request with an empty reply,
/// until aborted.
async fn fake_agent(
    addr: std::net::SocketAddr,
    name: String,
    tls: Option<drover_tls::Connector>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let hello = Hello::new(name.clone(), "bench");
    let wait = Duration::from_secs(10);
    match tls {
        None => {
            let (framed, _) = agent_handshake(tcp, &hello, wait)
                .await
                .map_err(|e| anyhow!("{name}: {e}"))?;
            drop(permit);
            serve(framed, &name).await
        }
        Some(connector) => {
            let stream = tokio::time::timeout(wait, connector.connect(tcp))
                .await
                .map_err(|_| anyhow!("{name}: TLS handshake timed out"))??;
            let (framed, _) = agent_handshake(stream, &hello, wait)
                .await
                .map_err(|e| anyhow!("{name}: {e}"))?;
            drop(permit);
            serve(framed, &name).await
        }
    }
}

async fn serve<IO>(mut framed: drover_protocol::link::AgentFramed<IO>, name: &str) -> Result<()>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            frame = framed.next() => match frame {
                Some(Ok(ToAgent::Request { id, .. })) => {
                    framed.send(ToManager::Reply { id, result: Ok(Response::Empty) }).await?;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => bail!("{name}: {e}"),
                None => bail!("{name}: the manager closed the link"),
            },
            _ = beat.tick() => framed.send(ToManager::Heartbeat).await?,
        }
    }
}
