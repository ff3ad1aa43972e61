//! `fleet`: N simulated agents in this process against one real
//! `drover-manager` on a private bus, and what the fleet's size costs it.
//!
//! One [`run`] is one fleet size and one transport (plaintext on loopback,
//! or mutual TLS with certificates from `drover_tls::pki`), against a fresh
//! manager. In order:
//!
//! 1. the manager alone: RSS and RssAnon with no node;
//! 2. **cold**: all N agents start at once; time until every one holds an
//!    accepted session, with the failed attempts (connect refused, closed
//!    before the verdict — the manager's pre-authentication cap —, refused);
//! 3. **idle**: once the manager has made its one-off requests of a new
//!    node (the orphan-dep sweep: a `ListUnits` to every node one grace
//!    period after it registered; the time it took is printed) and 2 s more,
//!    the manager's CPU over [`Options::idle_seconds`] (only heartbeats
//!    flow), RSS and RssAnon; with health checks declared
//!    ([`Options::health_checks`]), then [`Options::health_rounds`] pairs of
//!    windows of the same length, one with the agents flipping verdicts at
//!    [`Options::health_flip_percent`] a minute and one without, the order
//!    turned every round: the manager's CPU in each and the difference;
//! 4. `ListNodes` and `droverctl status` wall time (median of 5);
//! 5. `StartUnit` round trip (call → `JobRemoved`) on one node, against the
//!    same on a second manager with 3 nodes, samples interleaved (medians);
//! 6. `droverctl list-units` over all nodes ([`Options::units`] each), which
//!    asks node by node and streams: wall time, rows printed, droverctl's
//!    peak RSS (its `VmHWM`), the manager's peak RSS meanwhile (VmHWM, reset
//!    before); then `Controller.ListUnits`: wall time and the manager's peak
//!    RSS during the call. It is one D-Bus reply: a fleet whose answer passes
//!    32 MiB is refused (`LimitsExceeded`) once that is certain, so at
//!    10,000 × 100 this is the time and memory of the refusal;
//! 7. a monitor on `*` of every node: how much of the replay of the loaded
//!    units it hears (the manager drops a monitor whose queue overflows);
//!    then a monitor on every node's event unit (`agent::EVENT_UNIT`, not
//!    loaded, so nothing is replayed) while every node sends
//!    [`Options::event_rate`] events a second: delivered/s, lag p50/p99,
//!    losses;
//! 8. **half drop**: agents `0..N/2` close their links at once and
//!    reconnect; time until all are online again;
//! 9. **restart**: SIGKILL, the manager started again at once; time until
//!    all are online again, with the failed attempts.
//!
//! Layout: [`agent`] (one simulated agent), `daemon` (the manager process,
//! descriptor limits), `certs` (the fleet's PKI), `probe` (the API
//! measurements), [`report`] (the CSV row). The command line is [`cli`].
//! [`discovery`] is `drover-bench where`, another run on the same rig;
//! [`resync`] is `drover-bench resync` (digests and snapshot requests).

pub mod agent;
mod certs;
pub mod cli;
pub mod daemon;
pub mod discovery;
pub mod failover;
pub mod follower;
mod probe;
pub mod report;
pub mod resync;
pub mod scrape;

use crate::procfs;
use agent::{AgentConfig, Fleet, HealthDecl, node_name};
use anyhow::{Context, Result, bail};
use daemon::{Manager, ManagerSetup, Transport, free_port};
use drover_sandbox::PrivateBus;
use report::Row;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one run does (see the module docs).
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub transport: Transport,
    /// The agents' `HeartbeatInterval` (ms).
    pub heartbeat_interval_ms: u64,
    /// The manager's `HeartbeatInterval` (ms); `None`: its default.
    pub manager_heartbeat_ms: Option<u64>,
    pub heartbeat_threshold_ms: u64,
    /// The manager's `ProxyGracePeriod` (ms); `None`: its default.
    pub proxy_grace_ms: Option<u64>,
    pub idle_seconds: f64,
    /// Loaded units per node (what `ListUnits` returns).
    pub units: usize,
    /// Unit events a second per node during the monitor phase.
    pub event_rate: u32,
    pub monitor_seconds: f64,
    /// `StartUnit` samples on each manager.
    pub start_samples: usize,
    /// How long the fleet may take to come (back) online before the run fails.
    pub online_timeout: Duration,
    /// Where the fleet's certificates are kept between runs (TLS).
    pub pki_dir: PathBuf,
    /// Phases 8 and 9.
    pub disruptions: bool,
    /// Units with a health check per node (0: none declared).
    pub health_checks: usize,
    /// Percent of the checks whose verdict flips a minute while flips are on.
    pub health_flip_percent: f64,
    /// Pairs of idle windows with flips on and off (with checks declared).
    pub health_rounds: usize,
    /// The manager serves `/metrics` here (`scrape`), with per-node series
    /// or not; `None`: off, as in a default manager.
    pub metrics: Option<(SocketAddr, bool)>,
    /// The manager's `ResyncInterval` (ms); `None`: its default.
    pub resync_interval_ms: Option<u64>,
}

impl Options {
    /// The settings for `nodes` nodes: 2 s heartbeats, 6 s
    /// threshold, 30 s idle window, 100 units, 10 events/s.
    pub fn new(nodes: usize, transport: Transport) -> Self {
        Self {
            nodes,
            transport,
            heartbeat_interval_ms: 2000,
            manager_heartbeat_ms: None,
            heartbeat_threshold_ms: 6000,
            proxy_grace_ms: None,
            idle_seconds: 30.0,
            units: 100,
            event_rate: 10,
            monitor_seconds: 10.0,
            start_samples: 50,
            online_timeout: Duration::from_secs(300),
            pki_dir: std::env::temp_dir().join("drover-fleet-pki"),
            disruptions: true,
            health_checks: 0,
            health_flip_percent: 1.0,
            health_rounds: 3,
            metrics: None,
            resync_interval_ms: None,
        }
    }
}

/// A manager and the fleet of agents connected to it.
pub(crate) struct Rig {
    bus: PrivateBus,
    manager: Manager,
    fleet: Arc<Fleet>,
    agents: Vec<tokio::task::JoinHandle<()>>,
    api: zbus::Connection,
}

impl Rig {
    /// Starts a manager for `nodes` agents of `transport` (agents not started).
    pub(crate) async fn start(
        opts: &Options,
        nodes: usize,
        pki: Option<&certs::FleetPki>,
    ) -> Result<Self> {
        let bus = PrivateBus::start("drover-bench-fleet")?;
        let names: Vec<String> = (0..nodes).map(node_name).collect();
        let setup = ManagerSetup {
            port: free_port()?,
            heartbeat_interval_ms: opts.manager_heartbeat_ms,
            heartbeat_threshold_ms: opts.heartbeat_threshold_ms,
            proxy_grace_ms: opts.proxy_grace_ms,
            nodes: &names,
            tls: pki.map(certs::FleetPki::manager_keys),
            metrics: opts.metrics,
            extra: opts
                .resync_interval_ms
                .map(|ms| format!("ResyncInterval={ms}\n"))
                .unwrap_or_default(),
        };
        let mut manager = Manager::start(&bus, &setup)?;
        let api = zbus::connection::Builder::address(bus.address())
            .build()
            .await?;
        manager.wait_serving(&api, Duration::from_secs(30)).await?;
        Ok(Self {
            bus,
            manager,
            fleet: Fleet::new(),
            agents: Vec::new(),
            api,
        })
    }

    /// Starts agents `0..connectors.len()` (or `0..nodes` in plaintext).
    pub(crate) fn spawn_agents(
        &mut self,
        opts: &Options,
        nodes: usize,
        tls: Vec<drover_tls::Connector>,
    ) {
        let cfg = Arc::new(AgentConfig {
            manager: SocketAddr::from(([127, 0, 0, 1], self.manager.port)),
            heartbeat_interval: Duration::from_millis(opts.heartbeat_interval_ms),
            heartbeat_threshold: Duration::from_millis(opts.heartbeat_threshold_ms),
            connect_timeout: Duration::from_secs(10),
            units: Arc::new(AgentConfig::unit_rows(opts.units)),
            health: HealthDecl::new(opts.health_checks, opts.health_flip_percent),
        });
        let mut tls = tls.into_iter();
        for index in 0..nodes {
            let connector = tls.next();
            self.agents.push(tokio::spawn(agent::run(
                index,
                cfg.clone(),
                self.fleet.clone(),
                connector,
            )));
        }
    }

    /// Waits until `want` agents are online and at least `sessions` sessions
    /// were accepted in all; the time it took from `since`.
    pub(crate) async fn wait_online(
        &self,
        want: usize,
        sessions: u64,
        since: Instant,
        timeout: Duration,
    ) -> Result<Duration> {
        use std::sync::atomic::Ordering;
        loop {
            let s = self.fleet.sessions.load(Ordering::Relaxed);
            if self.fleet.online() >= want && s >= sessions {
                return Ok(since.elapsed());
            }
            if since.elapsed() > timeout {
                bail!(
                    "{} of {want} agents online after {timeout:?} (failed attempts {:?}); manager log:\n{}",
                    self.fleet.online(),
                    self.fleet.failures(),
                    tail(&self.manager.log(), 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until `lists` `ListUnits` requests were answered in all.
    pub(crate) async fn wait_swept(&self, lists: u64, timeout: Duration) -> Result<()> {
        use std::sync::atomic::Ordering;
        let since = Instant::now();
        while self.fleet.lists_answered.load(Ordering::Relaxed) < lists {
            if since.elapsed() > timeout {
                bail!(
                    "{} of {lists} nodes swept after {timeout:?}",
                    self.fleet.lists_answered.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub(crate) async fn stop(self) {
        self.fleet.stop.cancel();
        for a in &self.agents {
            a.abort();
        }
        for a in self.agents {
            let _ = a.await;
        }
        drop(self.manager);
        drop(self.bus);
    }
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn minus(a: (u64, u64, u64), b: (u64, u64, u64)) -> (u64, u64, u64) {
    (a.0 - b.0, a.1 - b.1, a.2 - b.2)
}

fn median_ms(mut v: Vec<Duration>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    Some(v[(v.len() - 1) / 2].as_secs_f64() * 1000.0)
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// The CPU each of `pids` used over `window`, in % of a core, and the
/// window's real length in seconds.
async fn cpu_over<const N: usize>(pids: [u32; N], window: Duration) -> Result<([f64; N], f64)> {
    let mut before = [0u64; N];
    for (b, pid) in before.iter_mut().zip(pids) {
        *b = procfs::cpu_ticks(pid)?;
    }
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t.elapsed().as_secs_f64();
    let hz = procfs::clk_tck();
    let mut pct = [0.0f64; N];
    for ((p, pid), b) in pct.iter_mut().zip(pids).zip(before) {
        *p = (procfs::cpu_ticks(pid)? - b) as f64 / hz / secs * 100.0;
    }
    Ok((pct, secs))
}

/// Phase 3's health windows (see the module docs): the manager's CPU with
/// the agents flipping verdicts and without, in pairs, and what flipping
/// costs it above the same fleet with the same checks declared.
///
/// Returns the units with a check the manager lists, the flips sent and the
/// median difference.
async fn health_windows(rig: &Rig, opts: &Options) -> Result<(usize, u64, Option<f64>)> {
    use std::sync::atomic::Ordering;
    let n = opts.nodes;
    let pid = rig.manager.pid();
    let window = Duration::from_secs_f64(opts.idle_seconds);
    let mut extra = Vec::new();
    let mut flips_sent = 0;
    for round in 0..opts.health_rounds {
        let mut pct = [0.0f64; 2];
        let mut flips = 0;
        for on in [round % 2 == 0, round % 2 == 1] {
            rig.fleet.health_flips.send_replace(on);
            let f0 = rig.fleet.health_flips_sent.load(Ordering::Relaxed);
            let ([manager], _) = cpu_over([pid], window).await?;
            let f1 = rig.fleet.health_flips_sent.load(Ordering::Relaxed);
            pct[usize::from(!on)] = manager;
            if on {
                flips = f1 - f0;
                flips_sent += flips;
            }
        }
        rig.fleet.health_flips.send_replace(false);
        extra.push(pct[0] - pct[1]);
        eprintln!(
            "fleet {n}: health round {}: manager CPU {:.2}% with {flips} verdict flips ({:.1}/s), {:.2}% without; {:+.2}% of a core (load {:.1})",
            round + 1,
            pct[0],
            flips as f64 / window.as_secs_f64(),
            pct[1],
            pct[0] - pct[1],
            load_average()
        );
    }
    let units = agree_on_health(rig, n * opts.health_checks, Duration::from_secs(30)).await?;
    extra.sort_by(f64::total_cmp);
    let mid = extra.get(extra.len().saturating_sub(1) / 2).copied();
    if let Some(mid) = mid {
        eprintln!(
            "fleet {n}: {} checks a node, {}% flipping a minute: {mid:+.2}% of a core (median of {} rounds)",
            opts.health_checks,
            opts.health_flip_percent,
            extra.len()
        );
    }
    Ok((units, flips_sent, mid))
}

/// Waits until the manager's `ListHealth` holds `units` units with a check,
/// as many of them unhealthy as the agents' last verdicts say: the flips
/// reached the manager, not only the socket.
pub(crate) async fn agree_on_health(rig: &Rig, units: usize, timeout: Duration) -> Result<usize> {
    use std::sync::atomic::Ordering;
    let c = drover_bus::client::DroverControllerProxy::new(&rig.api).await?;
    let since = Instant::now();
    loop {
        let want = rig.fleet.unhealthy_now.load(Ordering::Relaxed);
        let rows = c.list_health().await?;
        let bad = rows.iter().filter(|r| r.2 == "unhealthy").count();
        if bad == want && rows.len() == units {
            eprintln!(
                "fleet: the manager lists {} units with a check, {bad} unhealthy, as the agents \
                 last said",
                rows.len()
            );
            return Ok(rows.len());
        }
        if since.elapsed() > timeout {
            bail!(
                "the manager lists {} units with a check, {bad} unhealthy, after {timeout:?}; \
                 the agents declared {units}, {want} unhealthy",
                rows.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One run (see the module docs). Progress goes to stderr.
pub async fn run(opts: &Options) -> Result<Row> {
    let n = opts.nodes;
    let mut row = Row {
        nodes: n,
        transport: opts.transport.name().into(),
        load_at_start: load_average(),
        idle_seconds: opts.idle_seconds,
        ..Row::default()
    };
    let pki = match opts.transport {
        Transport::Plain => None,
        Transport::Tls => Some(certs::FleetPki::prepare(&opts.pki_dir, n.max(3))?),
    };
    let connectors = |count: usize| -> Result<Vec<drover_tls::Connector>> {
        match &pki {
            Some(p) => p.connectors(count),
            None => Ok(Vec::new()),
        }
    };
    let big_tls = connectors(n)?;
    let mut rig = Rig::start(opts, n, pki.as_ref()).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (row.rss_empty_kib, row.anon_empty_kib, _) = rig.manager.memory_kib()?;

    // 2. Cold start.
    let t = Instant::now();
    rig.spawn_agents(opts, n, big_tls);
    let took = rig.wait_online(n, n as u64, t, opts.online_timeout).await?;
    row.online_cold_s = took.as_secs_f64();
    row.cold_failed = rig.fleet.failures();
    eprintln!(
        "fleet {n} {}: all online in {:.3} s (failed attempts: connect {}, handshake {}, refused {})",
        opts.transport.name(),
        row.online_cold_s,
        row.cold_failed.0,
        row.cold_failed.1,
        row.cold_failed.2
    );

    // 3. Idle: the steady state, after the sweep of every new node.
    let t = Instant::now();
    rig.wait_swept(n as u64, opts.online_timeout).await?;
    eprintln!(
        "fleet {n}: every node swept {:.1} s after all were online",
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = rig.manager.pid();
    let me = std::process::id();
    let ([manager, generator], secs) =
        cpu_over([pid, me], Duration::from_secs_f64(opts.idle_seconds)).await?;
    row.idle_cpu_pct = manager;
    row.generator_cpu_pct = generator;
    (row.rss_kib, row.anon_kib, _) = rig.manager.memory_kib()?;
    let (per_rss, per_anon) = row.per_node_kib();
    eprintln!(
        "fleet {n}: idle manager CPU {:.2}% over {secs:.1} s (generator {:.1}%), RSS {} KiB, \
         RssAnon {} KiB; per node {per_rss:.2} KiB RSS, {per_anon:.2} KiB anon",
        row.idle_cpu_pct, row.generator_cpu_pct, row.rss_kib, row.anon_kib
    );
    if opts.health_checks > 0 {
        let (units, flips, extra) = health_windows(&rig, opts).await?;
        row.health_units = Some(units);
        row.health_flips = Some(flips);
        row.health_extra_cpu_pct = extra;
    }

    // 4. ListNodes and droverctl status.
    let mut lists = Vec::new();
    for _ in 0..5 {
        let (took, online) = probe::list_nodes(&rig.api).await?;
        if online != n {
            bail!("ListNodes shows {online} nodes online, expected {n}");
        }
        lists.push(took);
    }
    row.list_nodes_ms = median_ms(lists);
    match drover_sandbox::binaries::locate("droverctl") {
        Ok(ctl) => {
            let mut runs = Vec::new();
            for _ in 0..5 {
                runs.push(probe::droverctl_status(&ctl, rig.bus.address())?);
            }
            row.status_ms = median_ms(runs);
        }
        Err(e) => eprintln!("fleet: droverctl status not measured: {e}"),
    }
    eprintln!(
        "fleet {n}: ListNodes {:.3} ms, droverctl status {} ms",
        row.list_nodes_ms.unwrap_or(0.0),
        row.status_ms
            .map(|v| format!("{v:.3}"))
            .unwrap_or("-".into())
    );

    // 5. StartUnit at N against 3 nodes.
    if opts.start_samples > 0 {
        let mut small = Rig::start(opts, 3, pki.as_ref()).await?;
        small.spawn_agents(opts, 3, connectors(3)?);
        small
            .wait_online(3, 3, Instant::now(), opts.online_timeout)
            .await?;
        let unit = "fleet-0.service";
        let mut at_n = probe::Starter::new(&rig.api, &node_name(n / 2)).await?;
        let mut at_3 = probe::Starter::new(&small.api, &node_name(1)).await?;
        let (mut big, mut three) = (Vec::new(), Vec::new());
        for i in 0..opts.start_samples + 5 {
            let (a, b) = if i % 2 == 0 {
                let a = at_n.round_trip(unit).await?;
                (a, at_3.round_trip(unit).await?)
            } else {
                let b = at_3.round_trip(unit).await?;
                (at_n.round_trip(unit).await?, b)
            };
            if i >= 5 {
                big.push(a);
                three.push(b);
            }
        }
        small.stop().await;
        row.start_ms = median_ms(big);
        row.start_3_ms = median_ms(three);
        eprintln!(
            "fleet {n}: StartUnit round trip median {:.3} ms at {n} nodes, {:.3} ms at 3 nodes",
            row.start_ms.unwrap_or(0.0),
            row.start_3_ms.unwrap_or(0.0)
        );
    }

    // 6. droverctl list-units over all nodes, node by node (first, so the
    // manager's peak is not that of the refused Controller.ListUnits).
    if opts.units > 0 {
        match drover_sandbox::binaries::locate("droverctl") {
            Ok(ctl) => {
                procfs::reset_peak(pid)?;
                let before = rig.manager.memory_kib()?.0;
                let address = rig.bus.address().to_owned();
                let run = tokio::task::spawn_blocking(move || {
                    probe::droverctl_list_units(&ctl, &address)
                })
                .await?;
                match run {
                    Ok(r) => {
                        row.ctl_list_ms = Some(r.took.as_secs_f64() * 1000.0);
                        row.ctl_list_rows = Some(r.rows);
                        row.ctl_list_peak_kib = Some(r.peak_kib);
                        if r.code != 0 || r.rows != n * opts.units {
                            row.ctl_list_error =
                                Some(format!("exit {}, {} rows: {}", r.code, r.rows, r.stderr));
                        }
                    }
                    Err(e) => row.ctl_list_error = Some(format!("{e:#}")),
                }
                row.ctl_list_manager_peak_kib = Some(rig.manager.memory_kib()?.2);
                eprintln!(
                    "fleet {n}: droverctl list-units {} ms, {} rows, droverctl peak RSS {} KiB, \
                     manager peak RSS {} KiB (RSS before {before} KiB){}",
                    row.ctl_list_ms
                        .map(|v| format!("{v:.1}"))
                        .unwrap_or("-".into()),
                    row.ctl_list_rows.unwrap_or(0),
                    row.ctl_list_peak_kib.unwrap_or(0),
                    row.ctl_list_manager_peak_kib.unwrap_or(0),
                    row.ctl_list_error
                        .as_ref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                );
            }
            Err(e) => eprintln!("fleet: droverctl list-units not measured: {e}"),
        }
    }

    // 6b. Controller.ListUnits over all nodes.
    if opts.units > 0 {
        procfs::reset_peak(pid)?;
        let before = rig.manager.memory_kib()?.0;
        let t = Instant::now();
        let answer = probe::list_units(&rig.api).await;
        // The time to the answer or to the refusal.
        row.list_units_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
        match answer {
            Ok((_, nodes, rows)) => {
                row.list_units_rows = Some(rows);
                if nodes != n || rows != n * opts.units {
                    row.list_units_error =
                        Some(format!("{nodes} nodes and {rows} rows in the answer"));
                }
            }
            Err(e) => row.list_units_error = Some(format!("{e:#}")),
        }
        row.list_units_peak_kib = Some(rig.manager.memory_kib()?.2);
        eprintln!(
            "fleet {n}: Controller.ListUnits {} ms, {} rows, manager peak RSS {} KiB (RSS before \
             {before} KiB){}",
            row.list_units_ms
                .map(|v| format!("{v:.1}"))
                .unwrap_or("-".into()),
            row.list_units_rows.unwrap_or(0),
            row.list_units_peak_kib.unwrap_or(0),
            row.list_units_error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    }

    // 7. A monitor on `*`: the replay of every loaded unit at subscription.
    if opts.units > 0 {
        let lost_before = rig.fleet.lost_counts();
        let heard = probe::replay(rig.bus.address(), Duration::from_secs(60)).await?;
        row.star_replay = Some((heard, (n * opts.units) as u64));
        eprintln!(
            "fleet {n}: a monitor on * heard {heard} of the {} loaded units' states replayed{}{}",
            n * opts.units,
            if heard < (n * opts.units) as u64 {
                " (the manager dropped it: its queue overflowed)"
            } else {
                ""
            },
            links_lost(lost_before, rig.fleet.lost_counts()),
        );
    }

    // 7b. A monitor on every node's event unit while every node sends events.
    if opts.event_rate > 0 && opts.monitor_seconds > 0.0 {
        let m = probe::monitor(
            rig.bus.address(),
            agent::EVENT_UNIT,
            &rig.fleet,
            opts.event_rate,
            opts.monitor_seconds,
            Duration::from_secs(5),
        )
        .await
        .context("the monitor phase")?;
        row.monitor_per_s = Some(m.delivered_per_s());
        row.monitor_p50_ms = Some(m.lag_p50_ms);
        row.monitor_p99_ms = Some(m.lag_p99_ms);
        row.monitor_sent = Some(m.sent);
        row.monitor_lost = Some(m.lost());
        eprintln!(
            "fleet {n}: monitor on */{} at {} events/s per node: {:.0} delivered/s, lag p50 \
             {:.2} ms p99 {:.2} ms, {} of {} lost",
            agent::EVENT_UNIT,
            opts.event_rate,
            m.delivered_per_s(),
            m.lag_p50_ms,
            m.lag_p99_ms,
            m.lost(),
            m.sent,
        );
    }

    if opts.disruptions {
        use std::sync::atomic::Ordering;
        // 8. Half the fleet drops at once.
        let half = n / 2;
        let before = (
            rig.fleet.failures(),
            rig.fleet.sessions.load(Ordering::Relaxed),
        );
        let t = Instant::now();
        rig.fleet.drop_first(half);
        let took = rig
            .wait_online(n, before.1 + half as u64, t, opts.online_timeout)
            .await?;
        row.online_half_s = Some(took.as_secs_f64());
        row.half_failed = Some(minus(rig.fleet.failures(), before.0));
        eprintln!(
            "fleet {n}: {half} dropped at once, all online again in {:.3} s (failed attempts {:?})",
            took.as_secs_f64(),
            row.half_failed.unwrap_or_default()
        );

        // 9. SIGKILL and restart.
        let before = (
            rig.fleet.failures(),
            rig.fleet.sessions.load(Ordering::Relaxed),
        );
        let t = Instant::now();
        rig.manager.restart()?;
        let took = rig
            .wait_online(n, before.1 + n as u64, t, opts.online_timeout)
            .await?;
        row.online_restart_s = Some(took.as_secs_f64());
        row.restart_failed = Some(minus(rig.fleet.failures(), before.0));
        eprintln!(
            "fleet {n}: manager killed and restarted, all online again in {:.3} s (failed \
             attempts: connect {}, handshake {}, refused {})",
            took.as_secs_f64(),
            row.restart_failed.unwrap_or_default().0,
            row.restart_failed.unwrap_or_default().1,
            row.restart_failed.unwrap_or_default().2
        );
    }
    rig.stop().await;
    Ok(row)
}

/// `"; links lost meanwhile: …"` naming how, or nothing when none was.
fn links_lost(
    before: [u64; agent::Lost::ALL.len()],
    after: [u64; agent::Lost::ALL.len()],
) -> String {
    let parts: Vec<String> = agent::Lost::ALL
        .iter()
        .zip(before.iter().zip(after))
        .filter(|(_, (b, a))| a > *b)
        .map(|(how, (b, a))| format!("{} {}", a - b, how.describe()))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("; links lost meanwhile: {}", parts.join(", "))
    }
}
