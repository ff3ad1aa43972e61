//! `health`: what health checks cost the agent, per check run.
//!
//! One sandbox node with [`UNITS`] long-running units and a listener (a
//! Python `http.server`). For each check kind (`HealthTCP=` and
//! `HealthHTTP=` against the listener, `HealthCmd=/bin/true`), windows with
//! the checks declared (a drop-in on every unit, then a daemon-reload) and
//! windows without them alternate, the order flipping every round; each
//! window lasts [`WINDOW`] after a settle of [`SETTLE`]. The agent's CPU time
//! (utime + stime of its process) over a window with checks, minus the
//! neighbouring window without them, divided by the runs the window held
//! (units × window ÷ `HealthInterval=`, [`INTERVAL`]), is the cost of one
//! run. For `HealthCmd=` the node's systemd does the starting (a transient
//! service per run, `agent::health::exec`), so its CPU time is reported
//! the same way, next to the agent's.
//!
//! Targets (issue 27): agent CPU per TCP/HTTP check ≤ 0.2 ms, per exec check
//! ≤ 3 ms. The checks pass all along, so after the first verdicts the agent
//! sends the manager nothing; what health costs the manager at fleet size is
//! not measured by this benchmark (nor yet by any other).

use crate::procfs::{clk_tck, cpu_ticks};
use crate::stats;
use anyhow::{Context, Result, bail};
use drover_sandbox::{Cluster, ClusterOptions};
use std::time::Duration;

/// Units with a check, per window.
pub const UNITS: usize = 20;
/// `HealthInterval=` of every check (the startup interval is the same).
pub const INTERVAL: Duration = Duration::from_millis(200);
/// How long each window is measured.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Time after a daemon-reload before a window starts (declarations read,
/// first verdicts sent).
pub const SETTLE: Duration = Duration::from_secs(2);

/// The check kinds measured: (name, `[X-Drover]` body given the port).
fn kinds(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("tcp", format!("HealthTCP=127.0.0.1:{port}")),
        ("http", format!("HealthHTTP=http://127.0.0.1:{port}/")),
        ("exec", "HealthCmd=/bin/true".to_owned()),
    ]
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
    let runs = UNITS as f64 * WINDOW.as_secs_f64() / INTERVAL.as_secs_f64();
    println!(
        "health: {UNITS} checks every {} ms on one node, windows of {} s with and without them, {rounds} rounds per kind",
        INTERVAL.as_millis(),
        WINDOW.as_secs()
    );
    for (kind, body) in kinds(port) {
        let mut agent_ms = Vec::new();
        let mut systemd_ms = Vec::new();
        for round in 0..rounds {
            let mut with = (0.0, 0.0);
            let mut without = (0.0, 0.0);
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for checks in order {
                declare(cluster, &node, checks.then_some(body.as_str())).await?;
                tokio::time::sleep(SETTLE).await;
                let (a0, s0) = (cpu_ticks(agent)?, cpu_ticks(systemd)?);
                tokio::time::sleep(WINDOW).await;
                let (a1, s1) = (cpu_ticks(agent)?, cpu_ticks(systemd)?);
                let spent = (
                    (a1 - a0) as f64 * 1000.0 / tck,
                    (s1 - s0) as f64 * 1000.0 / tck,
                );
                if checks {
                    with = spent;
                } else {
                    without = spent;
                }
            }
            agent_ms.push((with.0 - without.0) / runs);
            systemd_ms.push((with.1 - without.1) / runs);
        }
        let a = stats::Spread::of(&agent_ms);
        let s = stats::Spread::of(&systemd_ms);
        println!(
            "  {kind:<4} agent CPU per check: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms (target {} ms)",
            a.median,
            a.p90,
            a.p99,
            if kind == "exec" { "3" } else { "0.2" }
        );
        if kind == "exec" {
            println!(
                "       the node's systemd per check: median {:.3} ms, p90 {:.3} ms (starting the transient service)",
                s.median, s.p90
            );
        }
    }
    declare(cluster, &node, None).await?;
    Ok(())
}

/// Declares `body` on every unit (a drop-in), or removes it; daemon-reload.
async fn declare(cluster: &Cluster, node: &str, body: Option<&str>) -> Result<()> {
    let script = match body {
        Some(body) => format!(
            "d=\"$XDG_CONFIG_HOME/systemd/user\"; for i in $(seq -w 0 {last}); do mkdir -p \"$d/bench-health-$i.service.d\"; printf '[X-Drover]\\n%s\\nHealthInterval={ms}ms\\nHealthStartupInterval={ms}ms\\n' '{body}' > \"$d/bench-health-$i.service.d/health.conf\"; done",
            last = UNITS - 1,
            ms = INTERVAL.as_millis(),
        ),
        None => "rm -rf \"$XDG_CONFIG_HOME\"/systemd/user/bench-health-*.service.d".to_owned(),
    };
    let run = cluster.exec(node, &["sh", "-c", &script]).await?;
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

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
