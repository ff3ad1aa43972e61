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
//!
//! **systemd's own share.** Part of the overhead is work only systemd does, which no
//! agent or manager can take away: node2's systemd must start the dep and db from a
//! `StartUnit` call, and node1's systemd must turn the helper's exit into "proxy
//! active". A third interleaved sample measures the first alone: the bench itself calls
//! `StartUnit(drover-dep@db.service.service)` on node2, no drover process involved,
//! until a client of node2's bus reads that db is active. With systemd's timestamps of
//! the cross-node and local samples this gives the cross-node time drover would take if
//! its own processes took no time at all (the *floor*), and so drover's own share of the
//! overhead:
//!
//! ```text
//! floor − local = (StartUnit(need-db) → proxy starting) − (StartUnit(need-db-local) → db-local starting)
//!               + node2 alone: StartUnit(dep) → db active
//!               + node2 alone: db active → a client of node2's bus reads it
//!               + helper exits → proxy active
//!               + (proxy active → need-db active) − (db-local active → need-db-local active)
//! ```
//!
//! The second line is systemd announcing the change: the node2-alone sample listens on
//! node2's bus for db's `PropertiesChanged` that says `active` (the rule node2's agent
//! uses for a target) and takes how long after systemd's timestamp it reads it. No
//! process, however fast, learns of db's `active` sooner, so it belongs to the floor;
//! on a node whose CPU is busy with the rest of the start it is most of a millisecond.
//! The report also prints drover's share with that line counted as drover's (what
//! earlier versions of this benchmark reported, leaving it out of the floor). What the
//! floor still leaves to drover although no process could avoid it: systemd's
//! announcement on node1 that the proxy is starting (the bench does not measure it).
//! What it gives systemd that is not: the listening client's own wake-up.
//!
//! **Two helpers side by side** (`--helper-b PATH`, optionally `--helper-a PATH`). node1's
//! proxy template then runs a symlink in the sandbox directory, and before each cross-node
//! sample, while everything is down, the bench points it at helper A or helper B. A round
//! has four samples: cross-node with A and with B (A first in even rounds, B first in odd
//! ones), local, and node2 alone, the kinds taking turns at going first. Both helpers run
//! from the same unit file, the same path and the same systemd state, and are paired with
//! the same round's local and node2-alone samples: only the binary differs. Each helper
//! gets the report above, then B against A: medians, p90 and p99 of the cross-node start,
//! of the overhead and of drover's own share, the ratio of the medians, and the per-round
//! difference B − A with a bootstrap 95% confidence interval of its median. An interval
//! that holds 0 means the run cannot tell the two apart; a run of a helper against a copy
//! of itself (A/A) shows what the noise alone gives.
//!
//! ```text
//! cargo build --release --workspace --bins
//! cp target/release/drover-proxy /tmp/a/      # then build the other helper, copy to /tmp/b/
//! target/release/drover-bench proxy --samples 1000 \
//!     --helper-a /tmp/a/drover-proxy --helper-b /tmp/b/drover-proxy
//! ```

use crate::procfs::cpu_time;
use crate::stats::{Spread, median_ci95, ms, paired_overhead, summarize};
use anyhow::{Context, Result, anyhow, bail};
use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::marshal::PropertyMap;
use drover_bus::systemd::{BUS_NAME, MANAGER_IFACE, MANAGER_PATH, SERVICE_IFACE, UNIT_IFACE};
use drover_bus::timestamp::monotonic_us;
use drover_protocol::error_names::NO_SUCH_UNIT;
use drover_sandbox::{Cluster, files, node};
use futures::StreamExt;
use std::path::{Path, PathBuf};
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

/// Two helper binaries to compare in one run (`--helper-a`, `--helper-b`).
pub struct Helpers {
    a: PathBuf,
    b: PathBuf,
}

impl Helpers {
    /// `a` defaults to the `drover-proxy` the sandbox finds (and would run).
    pub fn new(a: Option<PathBuf>, b: PathBuf) -> Result<Self> {
        let a = match a {
            Some(a) => a,
            None => drover_sandbox::binaries::locate("drover-proxy")?,
        };
        let absolute =
            |p: &Path| std::fs::canonicalize(p).with_context(|| format!("helper {}", p.display()));
        Ok(Self {
            a: absolute(&a)?,
            b: absolute(&b)?,
        })
    }
}

/// node1's proxy template runs `link`, which the bench points at helper A or B.
struct Switch {
    link: PathBuf,
    helpers: Helpers,
}

impl Switch {
    async fn install(cluster: &Cluster, helpers: Helpers) -> Result<Self> {
        let dir = cluster.dir().join("helper-ab");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let switch = Self {
            link: dir.join("drover-proxy"),
            helpers,
        };
        switch.point(false)?;
        let logs = node::unit_log_dir(cluster.dir(), "node1");
        let units = files::proxy_units(&switch.link, &logs, false).map_err(|e| anyhow!(e))?;
        let (name, text) = units
            .into_iter()
            .find(|(name, _)| *name == "drover-proxy@.service")
            .context("the sandbox's proxy template")?;
        let path = node::unit_dir(cluster.dir(), "node1").join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        drover_sandbox::bus::reload_systemd(&cluster.node_bus_address("node1")).await?;
        Ok(switch)
    }

    /// Points the link at A (`false`) or B (`true`); a rename, so it is never missing.
    fn point(&self, b: bool) -> Result<()> {
        let to = if b { &self.helpers.b } else { &self.helpers.a };
        let tmp = self.link.with_extension("next");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(to, &tmp)
            .and_then(|()| std::fs::rename(&tmp, &self.link))
            .with_context(|| format!("pointing {} at {}", self.link.display(), to.display()))
    }
}

/// One node's systemd manager, spoken to directly over its bus.
pub(crate) struct Systemd {
    /// The node's name, for error messages.
    node: &'static str,
    manager: zbus::Proxy<'static>,
    removed: zbus::proxy::SignalStream<'static>,
}

impl Systemd {
    pub(crate) async fn connect(node: &'static str, address: &str) -> Result<Self> {
        let conn = zbus::connection::Builder::address(address)
            .build()
            .await
            .with_context(|| format!("connecting to {address}"))?;
        let manager = zbus::Proxy::new(&conn, BUS_NAME, MANAGER_PATH, MANAGER_IFACE).await?;
        let _: () = manager.call("Subscribe", &()).await?;
        let removed = manager.receive_signal("JobRemoved").await?;
        Ok(Self {
            node,
            manager,
            removed,
        })
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

    /// `StartUnit(unit)` until its job is `done`: how long that took, and when
    /// it was called (CLOCK_MONOTONIC µs, to compare with systemd's timestamps).
    pub(crate) async fn start_done(&mut self, unit: &str) -> Result<(Duration, u64)> {
        let (t, called) = (Instant::now(), monotonic_us());
        let result = self.job("StartUnit", unit).await?;
        let took = t.elapsed();
        if result != "done" {
            bail!("starting {unit} on {} ended with '{result}'", self.node);
        }
        Ok((took, called))
    }

    /// `ActiveState` of `unit`; a unit systemd has not loaded is `inactive`.
    async fn active_state(&self, unit: &str) -> Result<String> {
        let path: OwnedObjectPath = match self.manager.call("GetUnit", &(unit,)).await {
            Ok(p) => p,
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT => {
                return Ok("inactive".into());
            }
            Err(e) => return Err(e.into()),
        };
        let unit_proxy =
            zbus::Proxy::new(self.manager.connection(), BUS_NAME, path, UNIT_IFACE).await?;
        Ok(unit_proxy.get_property::<String>("ActiveState").await?)
    }

    /// A `u64` property of the loaded `unit` (timestamps: CLOCK_MONOTONIC µs, one clock
    /// for every node of a sandbox, so node1's and node2's can be subtracted).
    async fn u64_prop(&self, unit: &str, prop: &str) -> Result<u64> {
        self.u64_prop_of(unit, UNIT_IFACE, prop).await
    }

    async fn u64_prop_of(&self, unit: &str, iface: &'static str, prop: &str) -> Result<u64> {
        let path: OwnedObjectPath = self.manager.call("GetUnit", &(unit,)).await?;
        let unit_proxy = zbus::Proxy::new(self.manager.connection(), BUS_NAME, path, iface).await?;
        unit_proxy
            .get_property::<u64>(prop)
            .await
            .with_context(|| format!("{prop} of {unit}"))
    }

    /// From now on, listens for `unit`'s `ActiveState` turning `active`
    /// (the `PropertiesChanged` of its `Unit` interface that says so); the
    /// task gives when that signal was read (CLOCK_MONOTONIC µs). The match
    /// is on the bus when this returns.
    async fn hear_active(&self, unit: &str) -> Result<tokio::task::JoinHandle<Result<u64>>> {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS_NAME)
            .path(drover_bus::systemd::unit_path(unit))
            .interface(PROPERTIES_IFACE)
            .member("PropertiesChanged")
            .arg0ns(UNIT_IFACE)
            .build()?;
        let mut stream =
            zbus::MessageStream::for_match_rule(rule, self.manager.connection(), None).await?;
        Ok(tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let msg = msg?;
                let read_at = monotonic_us();
                let (_, changed, _): (String, PropertyMap, Vec<String>) =
                    msg.body().deserialize()?;
                let active = changed
                    .get("ActiveState")
                    .and_then(|v| <&str>::try_from(v).ok())
                    == Some("active");
                if active {
                    return Ok(read_at);
                }
            }
            bail!("the signal stream ended")
        }))
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

/// One cross-node sample: the total and systemd's timestamps along the way.
struct Remote {
    total: Duration,
    /// `StartUnit(need-db)` → the proxy starting (its job runs).
    to_start: Duration,
    /// proxy starting → db active on node2, db active → proxy active on node1,
    /// proxy active → need-db active.
    legs: [Duration; 3],
    /// The helper's exit → the proxy active (node1's systemd alone).
    exit_to_active: Duration,
}

/// One local sample.
struct Local {
    total: Duration,
    /// `StartUnit(need-db-local)` → db-local starting.
    to_start: Duration,
    /// db-local active → need-db-local active.
    last_leg: Duration,
}

/// node2's `db.service`, node1's `need-db.service` that needs it through a
/// proxy, and the local pair on node1.
pub(crate) async fn install_units(cluster: &Cluster) -> Result<()> {
    cluster.install_unit("node2", DB, SERVICE).await?;
    let need = |after: &str| format!("[Unit]\nWants={after}\nAfter={after}\n{SERVICE}");
    cluster.install_unit("node1", NEED_DB, &need(PROXY)).await?;
    cluster.install_unit("node1", DB_LOCAL, SERVICE).await?;
    cluster
        .install_unit("node1", NEED_DB_LOCAL, &need(DB_LOCAL))
        .await
}

pub async fn proxy(cluster: &Cluster, samples: usize, helpers: Option<Helpers>) -> Result<()> {
    install_units(cluster).await?;
    let mut node1 = Systemd::connect("node1", &cluster.node_bus_address("node1")).await?;
    let mut node2 = Systemd::connect("node2", &cluster.node_bus_address("node2")).await?;

    let switch = match helpers {
        Some(h) => Some(Switch::install(cluster, h).await?),
        None => None,
    };

    let mut remote = Vec::with_capacity(samples);
    let mut remote_b = Vec::with_capacity(samples);
    let mut local = Vec::with_capacity(samples);
    let mut alone = Vec::with_capacity(samples);
    let agents: Vec<(String, u32)> = cluster
        .node_names()
        .into_iter()
        .filter_map(|n| cluster.agent_pid(&n).map(|pid| (n, pid)))
        .collect();
    let cpu_before: Vec<Duration> = agents.iter().map(|(_, pid)| cpu_time(*pid)).collect();
    for i in 0..(samples + WARMUP) {
        // The three kinds take turns at going first. When comparing helpers, the
        // cross-node turn is one sample with each, A then B in even rounds and B then A in
        // odd ones, so that each helper follows every other kind of sample equally often.
        let sample = async {
            let (mut r, mut rb, mut l, mut a) = (None, None, None, None);
            for k in 0..3 {
                match (i + k) % 3 {
                    0 => match &switch {
                        None => r = Some(time_remote(&mut node1, &mut node2).await?),
                        Some(s) => {
                            for b in [i % 2 == 1, i % 2 == 0] {
                                s.point(b)?;
                                let one = Some(time_remote(&mut node1, &mut node2).await?);
                                if b { rb = one } else { r = one }
                            }
                        }
                    },
                    1 => l = Some(time_local(&mut node1).await?),
                    _ => a = Some(time_dep_alone(&mut node2).await?),
                }
            }
            anyhow::Ok((r, rb, l, a))
        };
        let (Some(r), rb, Some(l), Some(a)) = (match sample.await {
            Ok(v) => v,
            Err(e) => {
                let log = cluster.unit_log("node1", PROXY).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(4).collect();
                bail!("sample {i}: {e:#}; the proxy's last lines: {tail:?}");
            }
        }) else {
            unreachable!("every kind runs once per sample")
        };
        if i >= WARMUP {
            remote.push(r);
            remote_b.extend(rb);
            local.push(l);
            alone.push(a);
        }
    }
    match &switch {
        None => {
            report(samples, &remote, &local, &alone);
        }
        Some(s) => {
            println!("helper A: {}", s.helpers.a.display());
            let fa = report(samples, &remote, &local, &alone);
            println!("helper B: {}", s.helpers.b.display());
            let fb = report(samples, &remote_b, &local, &alone);
            compare(&fa, &fb);
        }
    }
    let rounds = (samples + WARMUP) as u32;
    for ((node, pid), before) in agents.iter().zip(cpu_before) {
        println!(
            "  agent CPU on {node}: {} per round (one sample of each kind)",
            ms(cpu_time(*pid).saturating_sub(before) / rounds)
        );
    }
    Ok(())
}

/// One helper's per-round figures in ms, paired by round (for [`compare`]).
struct Figures {
    /// `StartUnit(need-db)` → need-db active.
    total: Vec<f64>,
    /// `total` minus the same round's local start.
    over: Vec<f64>,
    /// `over` minus systemd's share (the floor).
    own: Vec<f64>,
    /// The helper's exit → the proxy active.
    exit_to_active: Vec<f64>,
}

/// B against A, round by round (see the module docs).
fn compare(a: &Figures, b: &Figures) {
    println!(
        "helper B against helper A, {} rounds (ms; B/A is the ratio of the medians):",
        a.total.len()
    );
    println!(
        "  {:<28} {:>8} {:>8} {:>8}   {:>8} {:>8} {:>8}   {:>6}",
        "", "A med", "A p90", "A p99", "B med", "B p90", "B p99", "B/A"
    );
    for (label, va, vb) in [
        ("cross-node start", &a.total, &b.total),
        ("overhead over local", &a.over, &b.over),
        ("drover's own share", &a.own, &b.own),
        (
            "helper exit -> proxy active",
            &a.exit_to_active,
            &b.exit_to_active,
        ),
    ] {
        let (sa, sb) = (Spread::of(va), Spread::of(vb));
        println!(
            "  {label:<28} {:>8.3} {:>8.3} {:>8.3}   {:>8.3} {:>8.3} {:>8.3}   {:>6.3}",
            sa.median,
            sa.p90,
            sa.p99,
            sb.median,
            sb.p90,
            sb.p99,
            sb.median / sa.median
        );
    }
    for (label, va, vb) in [
        ("cross-node start", &a.total, &b.total),
        ("drover's own share", &a.own, &b.own),
    ] {
        let diff: Vec<f64> = vb.iter().zip(va).map(|(y, x)| y - x).collect();
        let (lo, hi) = median_ci95(&diff, 2000);
        let d = Spread::of(&diff);
        println!(
            "  B - A per round, {label}: median {:.3} ms, 95% CI of the median [{lo:.3}, {hi:.3}] ms, p90 {:.3} ms",
            d.median, d.p90
        );
    }
}

fn report(samples: usize, remote: &[Remote], local: &[Local], alone: &[Alone]) -> Figures {
    let totals = |v: &[Duration]| summarize(v);
    let remote_totals: Vec<_> = remote.iter().map(|r| r.total).collect();
    let local_totals: Vec<_> = local.iter().map(|l| l.total).collect();
    let (sr, sl) = (totals(&remote_totals), totals(&local_totals));
    let over = paired_overhead(&remote_totals, &local_totals);
    println!(
        "proxy: start need-db until active, db not running before; {samples} interleaved samples of each kind"
    );
    for (label, s) in [("both on node1       ", &sl), ("db on node2 (proxy) ", &sr)] {
        println!("  {label}  {}", s.line());
    }
    println!("  where the cross-node time goes (medians, systemd's own timestamps):");
    println!(
        "    StartUnit(need-db) -> proxy starting  {}  (both on node1: -> db-local starting  {})",
        median_of(remote, |r| r.to_start),
        median_of(local, |l| l.to_start)
    );
    println!(
        "    proxy starting -> db active on node2  {}",
        median_of(remote, |r| r.legs[0])
    );
    println!(
        "    db active -> proxy active on node1    {}",
        median_of(remote, |r| r.legs[1])
    );
    println!(
        "      of which helper exits -> proxy active  {}",
        median_of(remote, |r| r.exit_to_active)
    );
    println!(
        "    proxy active -> need-db active        {}",
        median_of(remote, |r| r.legs[2])
    );
    println!(
        "    (both on node1: db active -> need-db active  {})",
        median_of(local, |l| l.last_leg)
    );
    let over_spread = Spread::of(&over);
    println!(
        "  overhead            median of medians {:.3} ms, median of paired differences {:.3} ms, p99 {:.3} ms (target <= 5 ms median)",
        (sr.median.as_secs_f64() - sl.median.as_secs_f64()) * 1000.0,
        over_spread.median,
        over_spread.p99
    );
    // systemd's share: what the overhead would be if drover's processes took no time.
    let f = |d: Duration| d.as_secs_f64() * 1000.0;
    let floor: Vec<f64> = remote
        .iter()
        .zip(local)
        .zip(alone)
        .map(|((r, l), a)| {
            f(r.to_start) - f(l.to_start)
                + f(a.to_up)
                + f(a.heard)
                + f(r.exit_to_active)
                + f(r.legs[2])
                - f(l.last_leg)
        })
        .collect();
    let own: Vec<f64> = over.iter().zip(&floor).map(|(o, fl)| o - fl).collect();
    let own_with_heard: Vec<f64> = own.iter().zip(alone).map(|(o, a)| o + f(a.heard)).collect();
    println!(
        "  node2 alone: StartUnit(dep) -> db active, no drover process involved  {}",
        median_of(alone, |a| a.to_up)
    );
    println!(
        "    db active -> a client of node2's bus reads it (systemd's signal)    {}",
        median_of(alone, |a| a.heard)
    );
    let (floor_spread, own_spread) = (Spread::of(&floor), Spread::of(&own));
    println!(
        "  systemd's share of the overhead (the floor; see proxy.rs)  median {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
        floor_spread.median, floor_spread.p90, floor_spread.p99
    );
    println!(
        "  drover's own share (overhead - floor, paired)              median {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
        own_spread.median, own_spread.p90, own_spread.p99
    );
    let with_heard = Spread::of(&own_with_heard);
    println!(
        "    counting systemd's announcement of db's active as drover's  median {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
        with_heard.median, with_heard.p90, with_heard.p99
    );
    Figures {
        total: remote_totals.iter().map(|d| f(*d)).collect(),
        over,
        own,
        exit_to_active: remote.iter().map(|r| f(r.exit_to_active)).collect(),
    }
}

/// The median of one field of `samples`, in ms.
fn median_of<T>(samples: &[T], field: impl Fn(&T) -> Duration) -> String {
    ms(summarize(&samples.iter().map(field).collect::<Vec<_>>()).median)
}

fn between(from: u64, to: u64) -> Duration {
    Duration::from_micros(to.saturating_sub(from))
}

/// One cross-node sample, from and back to "everything down".
async fn time_remote(node1: &mut Systemd, node2: &mut Systemd) -> Result<Remote> {
    let (total, called) = node1.start_done(NEED_DB).await?;
    let proxy_start = node1
        .u64_prop(PROXY, "InactiveExitTimestampMonotonic")
        .await?;
    let helper_exit = node1
        .u64_prop_of(PROXY, SERVICE_IFACE, "ExecMainExitTimestampMonotonic")
        .await?;
    let proxy_up = node1
        .u64_prop(PROXY, "ActiveEnterTimestampMonotonic")
        .await?;
    let need_up = node1
        .u64_prop(NEED_DB, "ActiveEnterTimestampMonotonic")
        .await?;
    let db_up = node2.u64_prop(DB, "ActiveEnterTimestampMonotonic").await?;
    check_up(node1, node2).await?;
    take_down(node1, node2).await?;
    Ok(Remote {
        total,
        to_start: between(called, proxy_start),
        legs: [
            between(proxy_start, db_up),
            between(db_up, proxy_up),
            between(proxy_up, need_up),
        ],
        exit_to_active: between(helper_exit, proxy_up),
    })
}

/// After need-db started: need-db only runs after the proxy, which only
/// succeeds once db runs on node2; an error unless both are active.
async fn check_up(node1: &Systemd, node2: &Systemd) -> Result<()> {
    let (proxy, db) = (
        node1.active_state(PROXY).await?,
        node2.active_state(DB).await?,
    );
    if proxy != "active" || db != "active" {
        bail!("need-db is up but the proxy is {proxy} and db on node2 is {db}");
    }
    Ok(())
}

/// Stops need-db and waits until the proxy, the dep and db are all down.
async fn take_down(node1: &mut Systemd, node2: &mut Systemd) -> Result<()> {
    node1.job("StopUnit", NEED_DB).await?;
    // StopWhenUnneeded= takes the proxy down; the released reference stops the dep.
    node1.wait_state(PROXY, "inactive").await?;
    node2.wait_state(DEP, "inactive").await?;
    node2.job("StopUnit", DB).await?;
    Ok(())
}

/// One cross-node start that targets node2: need-db on node1 up (so db on
/// node2 through the proxy), checked. [`cross_node_down`] undoes it.
pub(crate) async fn cross_node_up(node1: &mut Systemd, node2: &mut Systemd) -> Result<()> {
    node1.start_done(NEED_DB).await?;
    check_up(node1, node2).await
}

/// Back to "everything down" after [`cross_node_up`].
pub(crate) async fn cross_node_down(node1: &mut Systemd, node2: &mut Systemd) -> Result<()> {
    take_down(node1, node2).await
}

/// One local sample, from and back to "everything down".
async fn time_local(node1: &mut Systemd) -> Result<Local> {
    let (total, called) = node1.start_done(NEED_DB_LOCAL).await?;
    let db_start = node1
        .u64_prop(DB_LOCAL, "InactiveExitTimestampMonotonic")
        .await?;
    let db_up = node1
        .u64_prop(DB_LOCAL, "ActiveEnterTimestampMonotonic")
        .await?;
    let need_up = node1
        .u64_prop(NEED_DB_LOCAL, "ActiveEnterTimestampMonotonic")
        .await?;
    node1.job("StopUnit", NEED_DB_LOCAL).await?;
    node1.job("StopUnit", DB_LOCAL).await?;
    Ok(Local {
        total,
        to_start: between(called, db_start),
        last_leg: between(db_up, need_up),
    })
}

/// One node2-alone sample.
struct Alone {
    /// `StartUnit(dep)` → db active.
    to_up: Duration,
    /// db active (systemd's timestamp) → its `PropertiesChanged` with
    /// `ActiveState` `active` read by a client of node2's bus: the soonest
    /// any process, node2's agent too, can learn it.
    heard: Duration,
}

/// node2's part of a cross-node start without drover: the bench starts the dep
/// itself, as node2's agent would, and reads when db became active and when
/// the bus told it so.
async fn time_dep_alone(node2: &mut Systemd) -> Result<Alone> {
    let mut heard = node2.hear_active(DB).await?;
    let started = node2.start_done(DEP).await;
    let heard_at = match &started {
        Ok(_) => tokio::time::timeout(STEP_TIMEOUT, &mut heard).await.ok(),
        Err(_) => None,
    };
    // The listener ends here whatever happened (a no-op once it returned).
    heard.abort();
    let (_, called) = started?;
    let heard_at = heard_at
        .ok_or_else(|| anyhow!("no signal of {DB} going active within {STEP_TIMEOUT:?}"))?
        .context("listening for db going active")??;
    let db_up = node2.u64_prop(DB, "ActiveEnterTimestampMonotonic").await?;
    node2.job("StopUnit", DEP).await?;
    node2.job("StopUnit", DB).await?;
    Ok(Alone {
        to_up: between(called, db_up),
        heard: between(db_up, heard_at),
    })
}
