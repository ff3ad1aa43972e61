//! `dns`: queries per second `drover-dns` answers on loopback, and their
//! latency, beside a sandbox manager of two nodes running `web.service`.
//!
//! The load generator is here, in-process: [`CLIENTS`] threads, each with its
//! own UDP socket and [`WINDOW`] queries in flight (a new one goes out as
//! each answer comes back; a query unanswered for 200 ms counts as lost and
//! is replaced). Rounds of [`ROUND`] alternate, the order flipping every
//! round, between the baseline, the zone's SOA (hickory-server's path alone:
//! no cache, no `Where`), and `web.service.drover A` (the answer cache,
//! refreshed from the manager once per `TTL`). Reported per kind: the median
//! and worst round's queries/s, the answer codes, latency median, p90 and
//! p99 over every answer, drover-dns's CPU time per query, and the machine's
//! load average (the benchmark shares its 2 cores with the generator).
//! Target (issue 28): ≥ 20,000 queries/s. Run it with release builds
//! (`cargo build --release -p drover-dns`, then
//! `cargo run --release -p drover-bench -- dns`).

use crate::procfs::cpu_time;
use crate::stats;
use anyhow::{Context, Result, bail};
use drover_sandbox::{Cluster, ClusterOptions};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Sender threads (and sockets).
pub const CLIENTS: usize = 2;
/// Queries in flight per socket.
pub const WINDOW: usize = 32;
/// One measured round.
pub const ROUND: Duration = Duration::from_secs(3);

const WEB: &str = "[Service]\nExecStart=/bin/sleep infinity\n";

/// A query for `name` (dotted, absolute) of type `qtype`, id `id`.
fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

#[derive(Debug, Default)]
struct Tally {
    answered: u64,
    lost: u64,
    codes: BTreeMap<u8, u64>,
    latencies: Vec<Duration>,
}

/// One client for `until`: keeps `WINDOW` queries in flight.
fn client(server: SocketAddr, name: &str, qtype: u16, until: Instant) -> Result<Tally> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(server)?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut sent: Vec<Option<Instant>> = vec![None; 65536];
    let mut next: u16 = 0;
    let mut tally = Tally::default();
    let send = |sent: &mut Vec<Option<Instant>>, next: &mut u16| -> Result<()> {
        let id = *next;
        *next = next.wrapping_add(1);
        sent[usize::from(id)] = Some(Instant::now());
        sock.send(&query(id, name, qtype))?;
        Ok(())
    };
    for _ in 0..WINDOW {
        send(&mut sent, &mut next)?;
    }
    let mut buf = [0u8; 1500];
    while Instant::now() < until {
        match sock.recv(&mut buf) {
            Ok(n) if n >= 12 => {
                let id = u16::from_be_bytes([buf[0], buf[1]]);
                if let Some(at) = sent[usize::from(id)].take() {
                    tally.latencies.push(at.elapsed());
                    tally.answered += 1;
                    *tally.codes.entry(buf[3] & 0x0f).or_default() += 1;
                    send(&mut sent, &mut next)?;
                }
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                // Every query in flight is lost: start the window again.
                let lost = sent.iter_mut().filter_map(Option::take).count();
                tally.lost += lost as u64;
                for _ in 0..WINDOW {
                    send(&mut sent, &mut next)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(tally)
}

fn round(server: SocketAddr, name: &str, qtype: u16) -> Result<(Tally, Duration)> {
    let start = Instant::now();
    let until = start + ROUND;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let name = name.to_string();
            std::thread::spawn(move || client(server, &name, qtype, until))
        })
        .collect();
    let mut total = Tally::default();
    for t in threads {
        let tally = t
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        total.answered += tally.answered;
        total.lost += tally.lost;
        for (code, n) in tally.codes {
            *total.codes.entry(code).or_default() += n;
        }
        total.latencies.extend(tally.latencies);
    }
    Ok((total, start.elapsed()))
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn code_name(code: u8) -> &'static str {
    match code {
        0 => "NOERROR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        5 => "REFUSED",
        _ => "other",
    }
}

/// Runs the benchmark: `rounds` rounds of each kind.
pub async fn main(rounds: usize) -> Result<()> {
    let mut opts = ClusterOptions::with_nodes(2);
    opts.heartbeat_interval_ms = 2000;
    opts.heartbeat_threshold_ms = 6000;
    let mut cluster = Cluster::start(opts).await?;
    let res = run(&mut cluster, rounds.max(2)).await;
    cluster.down().await?;
    res
}

async fn run(cluster: &mut Cluster, rounds: usize) -> Result<()> {
    for node in ["node1", "node2"] {
        cluster.install_unit(node, "web.service", WEB).await?;
        let out = cluster.systemctl(node, &["start", "web.service"]).await?;
        if !out.status.success() {
            bail!("starting web.service on {node} failed");
        }
    }
    let server = cluster.start_dns("").await?;
    let pid = cluster.state().dns_pid.context("drover-dns pid")?;
    let bin = drover_sandbox::binaries::locate_in(
        "drover-dns",
        &drover_sandbox::binaries::search_dirs(),
    )?;
    println!(
        "dns: {} rounds of {ROUND:?} per kind, {CLIENTS} clients x {WINDOW} in flight, drover-dns {} at {server}; load before: {}",
        rounds,
        bin.display(),
        load()
    );
    let kinds = [
        ("soa (baseline)", "drover.", 6u16),
        ("web.service A", "web.service.drover.", 1),
    ];
    let mut results: Vec<(Vec<f64>, Tally, Duration)> = kinds
        .iter()
        .map(|_| (Vec::new(), Tally::default(), Duration::ZERO))
        .collect();
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for k in order {
            let (_, name, qtype) = kinds[k];
            let cpu0 = cpu_time(pid);
            let (tally, took) =
                tokio::task::spawn_blocking(move || round(server, name, qtype)).await??;
            let cpu = cpu_time(pid).saturating_sub(cpu0);
            let entry = &mut results[k];
            entry.0.push(tally.answered as f64 / took.as_secs_f64());
            entry.1.answered += tally.answered;
            entry.1.lost += tally.lost;
            for (code, n) in tally.codes {
                *entry.1.codes.entry(code).or_default() += n;
            }
            entry.1.latencies.extend(tally.latencies);
            entry.2 += cpu;
        }
    }
    for (k, (rates, tally, cpu)) in results.iter().enumerate() {
        let mut sorted = rates.clone();
        sorted.sort_by(f64::total_cmp);
        let codes: Vec<String> = tally
            .codes
            .iter()
            .map(|(c, n)| format!("{} {n}", code_name(*c)))
            .collect();
        println!(
            "  {:<16} queries/s median {:.0}, worst round {:.0}, best {:.0}; answers {} ({}), lost {}",
            kinds[k].0,
            stats::median_f64(rates),
            sorted[0],
            sorted[sorted.len() - 1],
            tally.answered,
            codes.join(", "),
            tally.lost,
        );
        println!(
            "  {:<16} latency {}; drover-dns CPU {:.1} µs per answer",
            "",
            stats::summarize(&tally.latencies).line(),
            cpu.as_secs_f64() * 1e6 / tally.answered.max(1) as f64
        );
    }
    println!("dns: load after: {}", load());
    Ok(())
}
