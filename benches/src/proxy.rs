//! `proxy`: what a cross-node dependency costs.
//!
//! Cross-node side: node1's `need-db.service` has `Wants=`+`After=`
//! `drover-proxy@node2_db.service`; `db.service` lives on node2. One sample = from
//! `StartUnit(need-db)` on node1's systemd (what `systemctl start need-db` sends) until
//! that job's `JobRemoved`, i.e. until need-db is active — which systemd only lets
//! happen after the proxy is active, i.e. after db runs on node2.
//!
//! Local side, the baseline: node1's `need-db-local.service` with `Wants=`+`After=`
//! `db-local.service`, both on node1, started the same way.
//!
//! Before every sample both sides are fully down (need-db stopped, the proxy released,
//! the dep and db stopped on node2; locally both stopped), so every cross-node sample
//! includes the remote start of db. Samples are interleaved, alternating which side
//! goes first; medians, p90/p99 and the median of paired differences are reported.
//! Target: overhead ≤ 5 ms median.

use crate::stats::{ms, paired_overhead, summarize};
use anyhow::{Context, Result, bail};
use drover_sandbox::Cluster;
use futures::StreamExt;
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

const DB: &str = "db.service";
const NEED_DB: &str = "need-db.service";
const PROXY: &str = "drover-proxy@node2_db.service";
const DEP: &str = "drover-dep@db.service.service";
const DB_LOCAL: &str = "db-local.service";
const NEED_DB_LOCAL: &str = "need-db-local.service";
/// Both "services" become active at once (Type=simple): the figures are drover's and
/// systemd's own costs, not a program's start-up.
const SERVICE: &str = "[Service]\nExecStart=/bin/sleep 3600\n";
const WARMUP: usize = 5;
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// One node's systemd manager, spoken to directly over its bus.
struct Systemd {
    manager: zbus::Proxy<'static>,
    removed: zbus::proxy::SignalStream<'static>,
}

impl Systemd {
    async fn connect(address: &str) -> Result<Self> {
        let conn = zbus::connection::Builder::address(address)
            .build()
            .await
            .with_context(|| format!("connecting to {address}"))?;
        let manager = zbus::Proxy::new(
            &conn,
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
        )
        .await?;
        let _: () = manager.call("Subscribe", &()).await?;
        let removed = manager.receive_signal("JobRemoved").await?;
        Ok(Self { manager, removed })
    }

    /// `method(unit, "replace")` and wait for the job's `JobRemoved`; returns its result.
    async fn job(&mut self, method: &str, unit: &str) -> Result<String> {
        let job: OwnedObjectPath = self
            .manager
            .call(method, &(unit, "replace"))
            .await
            .with_context(|| format!("{method} {unit}"))?;
        tokio::time::timeout(STEP_TIMEOUT, async {
            while let Some(msg) = self.removed.next().await {
                let (_, path, _, result): (u32, OwnedObjectPath, String, String) =
                    msg.body().deserialize()?;
                if path == job {
                    return Ok(result);
                }
            }
            bail!("systemd's signal stream ended")
        })
        .await
        .with_context(|| format!("{method} {unit} did not finish within {STEP_TIMEOUT:?}"))?
    }

    /// `ActiveState` of `unit`; a unit systemd has not loaded is `inactive`.
    async fn active_state(&self, unit: &str) -> Result<String> {
        let path: OwnedObjectPath = match self.manager.call("GetUnit", &(unit,)).await {
            Ok(p) => p,
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                return Ok("inactive".into());
            }
            Err(e) => return Err(e.into()),
        };
        let unit_proxy = zbus::Proxy::new(
            self.manager.connection(),
            "org.freedesktop.systemd1",
            path,
            "org.freedesktop.systemd1.Unit",
        )
        .await?;
        Ok(unit_proxy.get_property::<String>("ActiveState").await?)
    }

    /// A `u64` property of the loaded `unit` (timestamps: CLOCK_MONOTONIC µs, one clock
    /// for every node of a sandbox, so node1's and node2's can be subtracted).
    async fn u64_prop(&self, unit: &str, prop: &str) -> Result<u64> {
        let path: OwnedObjectPath = self.manager.call("GetUnit", &(unit,)).await?;
        let unit_proxy = zbus::Proxy::new(
            self.manager.connection(),
            "org.freedesktop.systemd1",
            path,
            "org.freedesktop.systemd1.Unit",
        )
        .await?;
        Ok(unit_proxy.get_property::<u64>(prop).await?)
    }

    async fn wait_state(&self, unit: &str, want: &str) -> Result<()> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let now = self.active_state(unit).await?;
            if now == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{unit} is {now}, not {want}, after {STEP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub async fn proxy(cluster: &Cluster, samples: usize) -> Result<()> {
    cluster.install_unit("node2", DB, SERVICE).await?;
    let need = |after: &str| format!("[Unit]\nWants={after}\nAfter={after}\n{SERVICE}");
    cluster.install_unit("node1", NEED_DB, &need(PROXY)).await?;
    cluster.install_unit("node1", DB_LOCAL, SERVICE).await?;
    cluster
        .install_unit("node1", NEED_DB_LOCAL, &need(DB_LOCAL))
        .await?;
    let mut node1 = Systemd::connect(&cluster.node_bus_address("node1")).await?;
    let mut node2 = Systemd::connect(&cluster.node_bus_address("node2")).await?;

    let mut remote = Vec::with_capacity(samples);
    let mut legs: [Vec<Duration>; 3] = Default::default();
    let mut local = Vec::with_capacity(samples);
    let mut local_legs = Vec::with_capacity(samples);
    for i in 0..(samples + WARMUP) {
        let sample = async {
            if i % 2 == 0 {
                let r = time_remote(&mut node1, &mut node2).await?;
                anyhow::Ok((r, time_local(&mut node1).await?))
            } else {
                let l = time_local(&mut node1).await?;
                anyhow::Ok((time_remote(&mut node1, &mut node2).await?, l))
            }
        };
        let ((r, leg), (l, local_leg)) = match sample.await {
            Ok(v) => v,
            Err(e) => {
                let log = cluster.unit_log("node1", PROXY).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(4).collect();
                bail!("sample {i}: {e:#}; the proxy's last lines: {tail:?}");
            }
        };
        if i >= WARMUP {
            remote.push(r);
            local.push(l);
            local_legs.push(local_leg);
            for (all, one) in legs.iter_mut().zip(leg) {
                all.push(one);
            }
        }
    }
    let (sr, sl) = (summarize(&remote), summarize(&local));
    let over = paired_overhead(&remote, &local);
    println!(
        "proxy: start need-db until active, db not running before; {samples} interleaved pairs"
    );
    for (label, s) in [("both on node1       ", &sl), ("db on node2 (proxy) ", &sr)] {
        println!(
            "  {label}  n={}  min {}  median {}  p90 {}  p99 {}",
            s.n,
            ms(s.min),
            ms(s.median),
            ms(s.p90),
            ms(s.p99)
        );
    }
    println!("  where the cross-node time goes (medians, systemd's own timestamps):");
    for (label, leg) in [
        ("proxy starting -> db active on node2", &legs[0]),
        ("db active -> proxy active on node1  ", &legs[1]),
        ("proxy active -> need-db active      ", &legs[2]),
    ] {
        println!("    {label}  {}", ms(summarize(leg).median));
    }
    println!(
        "    (both on node1: db active -> need-db active  {})",
        ms(summarize(&local_legs).median)
    );
    let mut sorted = over.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p99 = sorted[((sorted.len() * 99).div_ceil(100)).clamp(1, sorted.len()) - 1];
    println!(
        "  overhead            median of medians {:.3} ms, median of paired differences {:.3} ms, p99 {:.3} ms (target <= 5 ms median)",
        (sr.median.as_secs_f64() - sl.median.as_secs_f64()) * 1000.0,
        crate::stats::median_f64(&over),
        p99
    );
    Ok(())
}

/// One cross-node sample, from and back to "everything down": the total, and its
/// legs (proxy starting → db active, db active → proxy active, proxy → need-db active).
async fn time_remote(
    node1: &mut Systemd,
    node2: &mut Systemd,
) -> Result<(Duration, [Duration; 3])> {
    let t = Instant::now();
    let result = node1.job("StartUnit", NEED_DB).await?;
    let took = t.elapsed();
    if result != "done" {
        bail!("starting {NEED_DB} on node1 ended with '{result}'");
    }
    let proxy_start = node1
        .u64_prop(PROXY, "InactiveExitTimestampMonotonic")
        .await?;
    let proxy_up = node1
        .u64_prop(PROXY, "ActiveEnterTimestampMonotonic")
        .await?;
    let need_up = node1
        .u64_prop(NEED_DB, "ActiveEnterTimestampMonotonic")
        .await?;
    let db_up = node2.u64_prop(DB, "ActiveEnterTimestampMonotonic").await?;
    let leg = |from: u64, to: u64| Duration::from_micros(to.saturating_sub(from));
    let legs = [
        leg(proxy_start, db_up),
        leg(db_up, proxy_up),
        leg(proxy_up, need_up),
    ];
    // need-db only runs after the proxy, which only succeeds once db runs on node2.
    let (proxy, db) = (
        node1.active_state(PROXY).await?,
        node2.active_state(DB).await?,
    );
    if proxy != "active" || db != "active" {
        bail!("need-db is up but the proxy is {proxy} and db on node2 is {db}");
    }
    node1.job("StopUnit", NEED_DB).await?;
    // StopWhenUnneeded= takes the proxy down; the released reference stops the dep.
    node1.wait_state(PROXY, "inactive").await?;
    node2.wait_state(DEP, "inactive").await?;
    node2.job("StopUnit", DB).await?;
    Ok((took, legs))
}

/// One local sample, from and back to "everything down": the total, and the
/// leg db-local active → need-db-local active (what the cross-node legs after
/// "db active" compare with).
async fn time_local(node1: &mut Systemd) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    let result = node1.job("StartUnit", NEED_DB_LOCAL).await?;
    let took = t.elapsed();
    if result != "done" {
        bail!("starting {NEED_DB_LOCAL} on node1 ended with '{result}'");
    }
    let db_up = node1
        .u64_prop(DB_LOCAL, "ActiveEnterTimestampMonotonic")
        .await?;
    let need_up = node1
        .u64_prop(NEED_DB_LOCAL, "ActiveEnterTimestampMonotonic")
        .await?;
    node1.job("StopUnit", NEED_DB_LOCAL).await?;
    node1.job("StopUnit", DB_LOCAL).await?;
    Ok((took, Duration::from_micros(need_up.saturating_sub(db_up))))
}
