//! `health`: what health checks cost the agent, per check run.
//!
//! One sandbox node with [`UNITS`] long-running units and a listener (a
//! Python `http.server`). For each check kind (`HealthTCP=` and
//! `HealthHTTP=` against the listener, `HealthCmd=/bin/true`), windows with
//! the checks declared (a drop-in on every unit, then a daemon-reload) and
//! windows without them alternate, the order flipping every round; each
//! window lasts [`WINDOW`] after a settle of [`SETTLE`]. The agent's CPU time
//! (utime + stime of its process) over a window with checks, minus the
//! neighbouring window without them, divided by the runs the window held,
//! is the cost of one run. TCP and HTTP runs are counted as scheduled
//! (units × window ÷ `HealthInterval=`, [`INTERVAL`]): each takes well under
//! a millisecond, so none is late. An exec run is a transient service the
//! node's systemd starts (`agent::health::exec`), which may take longer than
//! its interval; so the command counts itself (it appends one byte to a file
//! in the node's home: `/bin/sh -c 'printf . >> FILE'`, the shell's own CPU
//! being the service's, not the agent's nor systemd's), and the bytes the
//! window added are its runs. Its interval is [`EXEC_INTERVAL`]. The node's
//! systemd's CPU time per exec run is reported the same way, next to the
//! agent's.
//!
//! Beside the CPU, each window reads the bytes the agent's connection to
//! the manager sent (`bytes_sent` of `ss -ti`): with checks that keep
//! passing, a window must carry what one without them carries (the
//! heartbeats), since an unchanged result sends the manager nothing.
//!
//! Targets (issue 27): agent CPU per TCP/HTTP check ≤ 0.2 ms, per exec check
//! ≤ 3 ms; no frame to the manager while results are unchanged. The checks pass all along, so after the first verdicts the agent
//! sends the manager nothing; what health costs the manager at fleet size is
//! not measured by this benchmark (nor yet by any other).

use crate::procfs::{clk_tck, cpu_ticks};
use crate::stats;
use anyhow::{Context, Result, bail};
use drover_sandbox::{Cluster, ClusterOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Units with a check, per window.
pub const UNITS: usize = 20;
/// `HealthInterval=` of every check (the startup interval is the same).
pub const INTERVAL: Duration = Duration::from_millis(200);
/// `HealthInterval=` of the exec checks: 20 transient services a second.
pub const EXEC_INTERVAL: Duration = Duration::from_secs(1);
/// How long each window is measured.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Time after a daemon-reload before a window starts (declarations read,
/// first verdicts sent).
pub const SETTLE: Duration = Duration::from_secs(2);

/// One check kind measured.
struct Kind {
    name: &'static str,
    /// The `[X-Drover]` check line.
    check: String,
    interval: Duration,
    /// Where the command counts its runs (exec only).
    counter: Option<PathBuf>,
}

/// The check kinds measured, given the listener's port and a file in the
/// node's home for the exec check to count its runs in.
fn kinds(port: u16, counter: &Path) -> Vec<Kind> {
    vec![
        Kind {
            name: "tcp",
            check: format!("HealthTCP=127.0.0.1:{port}"),
            interval: INTERVAL,
            counter: None,
        },
        Kind {
            name: "http",
            check: format!("HealthHTTP=http://127.0.0.1:{port}/"),
            interval: INTERVAL,
            counter: None,
        },
        Kind {
            name: "exec",
            check: format!("HealthCmd=/bin/sh -c 'printf . >> {}'", counter.display()),
            interval: EXEC_INTERVAL,
            counter: Some(counter.to_owned()),
        },
    ]
}

/// Runs counted so far: the counter file's size (0 before the first run).
fn counted(counter: &Path) -> Result<u64> {
    match std::fs::metadata(counter) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("reading {}", counter.display())),
    }
}

/// Runs the benchmark: `rounds` pairs of windows per kind.
pub async fn main(rounds: usize) -> Result<()> {
    let mut opts = ClusterOptions::with_nodes(1);
    opts.heartbeat_interval_ms = 2000;
    opts.heartbeat_threshold_ms = 6000;
    let cluster = Cluster::start(opts).await?;
    let res = run(&cluster, rounds.max(2)).await;
    cluster.down().await?;
    res
}

fn unit(i: usize) -> String {
    format!("bench-health-{i:02}.service")
}

async fn run(cluster: &Cluster, rounds: usize) -> Result<()> {
    let node = cluster.node_names().into_iter().next().context("a node")?;
    let agent = cluster.agent_pid(&node).context("the agent's pid")?;
    let systemd = cluster
        .state()
        .nodes
        .iter()
        .find(|n| n.name == node)
        .and_then(|n| n.systemd_pid)
        .context("the node's systemd pid")?;
    let port = free_port()?;
    cluster
        .install_unit(
            &node,
            "bench-listener.service",
            &format!(
                "[Service]\nExecStart=/usr/bin/python3 -m http.server {port} --bind 127.0.0.1 --directory /\n"
            ),
        )
        .await?;
    for i in 0..UNITS {
        cluster
            .install_unit(
                &node,
                &unit(i),
                "[Service]\nExecStart=/bin/sleep infinity\n",
            )
            .await?;
    }
    let mut start = vec!["start", "bench-listener.service"];
    let names: Vec<String> = (0..UNITS).map(unit).collect();
    start.extend(names.iter().map(String::as_str));
    ok(cluster.systemctl(&node, &start).await?, "start the units")?;
    let tck = clk_tck();
    let counter = cluster.dir().join(&node).join("bench-health-runs");
    println!(
        "health: {UNITS} checks on one node (TCP, HTTP every {} ms; exec every {} ms), windows of {} s with and without them, {rounds} rounds per kind",
        INTERVAL.as_millis(),
        EXEC_INTERVAL.as_millis(),
        WINDOW.as_secs()
    );
    for kind in kinds(port, &counter) {
        let scheduled = UNITS as f64 * WINDOW.as_secs_f64() / kind.interval.as_secs_f64();
        let mut agent_ms = Vec::new();
        let mut systemd_ms = Vec::new();
        let mut runs_seen = Vec::new();
        let mut sent = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut with = (0.0, 0.0);
            let mut without = (0.0, 0.0);
            let mut runs = scheduled;
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for checks in order {
                declare(cluster, &node, checks.then_some(&kind)).await?;
                tokio::time::sleep(SETTLE).await;
                let before = kind.counter.as_deref().map(counted).transpose()?;
                let b0 = bytes_to_manager(agent, cluster.manager_port())?;
                let (a0, s0) = (cpu_ticks(agent)?, cpu_ticks(systemd)?);
                tokio::time::sleep(WINDOW).await;
                let (a1, s1) = (cpu_ticks(agent)?, cpu_ticks(systemd)?);
                let b1 = bytes_to_manager(agent, cluster.manager_port())?;
                let bytes = b1.saturating_sub(b0) as f64;
                if checks {
                    sent.0.push(bytes);
                } else {
                    sent.1.push(bytes);
                }
                let after = kind.counter.as_deref().map(counted).transpose()?;
                let spent = (
                    (a1 - a0) as f64 * 1000.0 / tck,
                    (s1 - s0) as f64 * 1000.0 / tck,
                );
                if checks {
                    with = spent;
                    if let (Some(b), Some(a)) = (before, after) {
                        runs = a.saturating_sub(b) as f64;
                    }
                } else {
                    without = spent;
                }
            }
            if runs < 1.0 {
                bail!(
                    "the {} checks made no run in a {} s window",
                    kind.name,
                    WINDOW.as_secs()
                );
            }
            runs_seen.push(runs);
            agent_ms.push((with.0 - without.0) / runs);
            systemd_ms.push((with.1 - without.1) / runs);
        }
        let a = stats::Spread::of(&agent_ms);
        let s = stats::Spread::of(&systemd_ms);
        let r = stats::Spread::of(&runs_seen);
        println!(
            "  {:<4} agent CPU per check: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms (target {} ms); runs per window: median {:.0} of {:.0} scheduled{}",
            kind.name,
            a.median,
            a.p90,
            a.p99,
            if kind.counter.is_some() { "3" } else { "0.2" },
            r.median,
            scheduled,
            if kind.counter.is_some() {
                " (counted)"
            } else {
                " (as scheduled)"
            },
        );
        println!(
            "       bytes the agent sent the manager per window: with checks median {:.0} (max {:.0}), without {:.0} (max {:.0})",
            stats::Spread::of(&sent.0).median,
            sent.0.iter().copied().fold(0.0, f64::max),
            stats::Spread::of(&sent.1).median,
            sent.1.iter().copied().fold(0.0, f64::max),
        );
        if kind.counter.is_some() {
            println!(
                "       the node's systemd per check: median {:.3} ms, p90 {:.3} ms (starting the transient service)",
                s.median, s.p90
            );
        }
    }
    declare(cluster, &node, None).await?;
    Ok(())
}

/// Declares `kind`'s check on every unit (a drop-in), or removes it;
/// daemon-reload.
async fn declare(cluster: &Cluster, node: &str, kind: Option<&Kind>) -> Result<()> {
    let script = match kind {
        Some(kind) => format!(
            "d=\"$XDG_CONFIG_HOME/systemd/user\"; for i in $(seq -w 0 {last}); do mkdir -p \"$d/bench-health-$i.service.d\"; printf '[X-Drover]\\n%s\\nHealthInterval={ms}ms\\nHealthStartupInterval={ms}ms\\n' \"$0\" > \"$d/bench-health-$i.service.d/health.conf\"; done",
            last = UNITS - 1,
            ms = kind.interval.as_millis(),
        ),
        None => "rm -rf \"$XDG_CONFIG_HOME\"/systemd/user/bench-health-*.service.d".to_owned(),
    };
    // The check line goes in as `$0`, so its quotes need no escaping.
    let check = kind.map_or("", |k| k.check.as_str());
    let run = cluster.exec(node, &["sh", "-c", &script, check]).await?;
    if !run.status.success() {
        bail!("writing the drop-ins: {run:?}");
    }
    ok(
        cluster.systemctl(node, &["daemon-reload"]).await?,
        "daemon-reload",
    )
}

fn ok(out: std::process::Output, what: &str) -> Result<()> {
    if out.status.success() {
        Ok(())
    } else {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr))
    }
}

/// Bytes sent so far on `pid`'s established TCP connections to `port`
/// (`bytes_sent` of `ss -tip`).
fn bytes_to_manager(pid: u32, port: u16) -> Result<u64> {
    let out = std::process::Command::new("ss")
        .args([
            "-tinpH",
            "state",
            "established",
            "dport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .context("running ss")?;
    if !out.status.success() {
        bail!("ss: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let ours = format!("pid={pid},");
    let mut total = 0;
    let mut found = false;
    let mut mine = false;
    for line in text.lines() {
        if line.contains("users:(") {
            mine = line.contains(&ours);
            continue;
        }
        if !mine {
            continue;
        }
        if let Some(n) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("bytes_sent:"))
        {
            total += n.parse::<u64>().context("bytes_sent of ss")?;
            found = true;
        }
    }
    if !found {
        bail!("no connection of the agent (pid {pid}) to port {port} in ss's list");
    }
    Ok(total)
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
