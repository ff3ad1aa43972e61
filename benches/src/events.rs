//! `events`: unit events per second from agents through a real (release)
//! drover-manager to monitors, with the manager's CPU and memory.
//!
//! Setup: a private dbus-daemon, the `drover-manager` binary next to this
//! one (build both with `cargo build --release -p drover-manager -p
//! drover-bench`), N fake agents in this process speaking drover's agent
//! protocol over loopback TCP, and M monitors (one zbus connection each)
//! subscribed to `*` on every node. Agents push `UnitStateChanged` events as
//! fast as the monitors take them: the producers keep at most [`WINDOW`]
//! events ahead of the slowest monitor, below the manager's per-monitor queue
//! (a monitor that falls further behind is dropped by design, which would end
//! the measurement, not speed it up).
//!
//! Two delivery modes are measured for each monitor count: `bluechi` (the
//! monitors get BlueChi's one signal per event) and `follow` (each monitor
//! calls `io.drover.Monitor.Follow()` and gets the batched
//! `UnitsChanged(a(sssssstt))` stream instead).
//!
//! Knobs (environment): `DROVER_BENCH_AGENTS` (default 10),
//! `DROVER_BENCH_SECONDS` (default 10), `DROVER_BENCH_MONITORS` (default
//! "1,10"), `DROVER_BENCH_MODES` (default "bluechi,follow"). Output: one line
//! per mode and monitor count.

use crate::procfs::{clk_tck, cpu_ticks, status_kib};
use anyhow::{Context, Result, bail};
use drover_bus::bluechi::{
    BUS_NAME, CONTROLLER_IFACE, CONTROLLER_PATH, DROVER_MONITOR_IFACE, MONITOR_IFACE,
};
use drover_protocol::link::agent_handshake;
use drover_protocol::{Event, Hello, ModTag, Reason, Response, ToAgent, ToManager, UnitName};
use drover_sandbox::PrivateBus;
use futures::{SinkExt, StreamExt};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Events in flight at most (sent by agents, not yet seen by every monitor).
const WINDOW: u64 = 6144;
/// Events per socket flush on an agent.
const BURST: u64 = 128;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The manager, then (dropped after it) its bus.
struct Daemons {
    manager: Child,
    bus: PrivateBus,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        let _ = self.manager.kill();
        let _ = self.manager.wait();
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn start_daemons(nodes: &[String], port: u16) -> Result<(Daemons, String)> {
    let bus = PrivateBus::start("drover-bench-events")?;
    let address = bus.address().to_string();
    let dir = bus.dir();
    let manager_conf = dir.join("manager.conf");
    std::fs::write(
        &manager_conf,
        format!(
            "[drover-manager]\nControllerPort={port}\nAllowedNodeNames={}\nLogLevel=WARN\nLogTarget=stderr\n",
            nodes.join(",")
        ),
    )?;
    let exe = std::env::current_exe()?;
    let manager_bin = exe
        .parent()
        .context("bench binary directory")?
        .join("drover-manager");
    if !manager_bin.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p drover-manager -p drover-bench`",
            manager_bin.display()
        );
    }
    let manager = Command::new(&manager_bin)
        .arg("--no-default-config")
        .arg("-c")
        .arg(&manager_conf)
        .arg("--bus")
        .arg(&address)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", manager_bin.display()))?;
    Ok((Daemons { manager, bus }, address))
}

struct Flow {
    sent: AtomicU64,
    received: Vec<AtomicU64>,
    room: Notify,
    stop: AtomicBool,
}

impl Flow {
    fn slowest(&self) -> u64 {
        self.received
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }
}

async fn fake_agent(addr: std::net::SocketAddr, name: String, flow: Arc<Flow>) -> Result<()> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut framed, accepted) = agent_handshake(
        stream,
        &Hello::new(name.clone(), "bench"),
        Duration::from_secs(5),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let guid = accepted.session_id;
    let unit = UnitName::new(format!("{name}-load.service"))?;
    let mut index = 0u64;
    let mut beat = tokio::time::interval(Duration::from_millis(500));
    loop {
        if flow.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Registered before the check, so a wakeup between the two is kept.
        let room = flow.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        let allowed = flow.slowest() + WINDOW;
        let sent = flow.sent.load(Ordering::Relaxed);
        let can_send = sent + BURST <= allowed;
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
            _ = &mut room, if !can_send => {}
            _ = std::future::ready(()), if can_send => {
                flow.sent.fetch_add(BURST, Ordering::Relaxed);
                for _ in 0..BURST {
                    index += 1;
                    let (a, s) = if index.is_multiple_of(2) { ("active", "running") } else { ("activating", "start") };
                    framed
                        .feed(ToManager::Event(Event::UnitStateChanged {
                            tag: ModTag::new(guid, index),
                            unit: unit.clone(),
                            active_state: a.into(),
                            sub_state: s.into(),
                            reason: Reason::Real,
                        }))
                        .await?;
                }
                framed.flush().await?;
            }
        }
    }
}

/// How the monitors receive events.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// BlueChi's `UnitStateChanged`, one signal per event.
    Bluechi,
    /// `Follow()`, then `UnitsChanged` batches.
    Follow,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bluechi => "bluechi",
            Mode::Follow => "follow",
        }
    }
}

/// One `UnitsChanged` entry, borrowed from the message.
type TaggedRow<'a> = drover_bus::bluechi::UnitsChangedRow<'a>;

async fn monitor(address: String, slot: usize, flow: Arc<Flow>, mode: Mode) -> Result<()> {
    let conn = zbus::connection::Builder::address(address.as_str())
        .build()
        .await?;
    let mut inbox = zbus::MessageStream::from(conn.clone());
    let reply = conn
        .call_method(
            Some(BUS_NAME),
            CONTROLLER_PATH,
            Some(CONTROLLER_IFACE),
            "CreateMonitor",
            &(),
        )
        .await?;
    let path: zbus::OwnedObjectPath = reply.body().deserialize()?;
    conn.call_method(
        Some(BUS_NAME),
        path.as_str(),
        Some(MONITOR_IFACE),
        "Subscribe",
        &("*", "*"),
    )
    .await?;
    if mode == Mode::Follow {
        conn.call_method(
            Some(BUS_NAME),
            path.as_str(),
            Some(DROVER_MONITOR_IFACE),
            "Follow",
            &(),
        )
        .await?;
    }
    let mut n = 0u64;
    let mut reported = 0u64;
    while let Some(msg) = inbox.next().await {
        let msg = msg?;
        let h = msg.header();
        match (mode, h.member().as_ref().map(|m| m.as_str())) {
            (Mode::Bluechi, Some("UnitStateChanged")) => n += 1,
            (Mode::Follow, Some("UnitsChanged")) => {
                // Decoded as a client would, so its cost is part of the run.
                let body = msg.body();
                let (rows,): (Vec<TaggedRow<'_>>,) = body.deserialize()?;
                n += rows.iter().filter(|r| r.2 == "state").count() as u64;
            }
            (Mode::Follow, Some("UnitStateChanged")) => {
                bail!("a followed monitor got a BlueChi per-event signal")
            }
            _ => {}
        }
        if n - reported >= 256 {
            reported = n;
            flow.received[slot].store(n, Ordering::Relaxed);
            flow.room.notify_waiters();
        }
        if flow.stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(())
}

async fn run_once(n_agents: usize, n_monitors: usize, seconds: u64, mode: Mode) -> Result<()> {
    let nodes: Vec<String> = (1..=n_agents).map(|i| format!("bench{i}")).collect();
    let port = free_port()?;
    let (daemons, address) = start_daemons(&nodes, port)?;
    let pid = daemons.manager.id();
    let bus_pid = daemons.bus.pid();
    let me = std::process::id();
    // Wait for the manager's API.
    let probe = zbus::connection::Builder::address(address.as_str())
        .build()
        .await?;
    let dbus = zbus::fdo::DBusProxy::new(&probe).await?;
    let started = Instant::now();
    while !dbus.name_has_owner(BUS_NAME.try_into()?).await? {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("drover-manager did not come up");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let flow = Arc::new(Flow {
        sent: AtomicU64::new(0),
        received: (0..n_monitors).map(|_| AtomicU64::new(0)).collect(),
        room: Notify::new(),
        stop: AtomicBool::new(false),
    });
    let mut monitors = Vec::new();
    for slot in 0..n_monitors {
        monitors.push(tokio::spawn(monitor(
            address.clone(),
            slot,
            flow.clone(),
            mode,
        )));
    }
    // Let the subscriptions settle before the load starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut agents = Vec::new();
    for name in &nodes {
        agents.push(tokio::spawn(fake_agent(addr, name.clone(), flow.clone())));
    }
    // Warm up, then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let r0: Vec<u64> = flow
        .received
        .iter()
        .map(|r| r.load(Ordering::Relaxed))
        .collect();
    let c0 = cpu_ticks(pid)?;
    let (b0, s0) = (cpu_ticks(bus_pid)?, cpu_ticks(me)?);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let c1 = cpu_ticks(pid)?;
    let (b1, s1) = (cpu_ticks(bus_pid)?, cpu_ticks(me)?);
    let r1: Vec<u64> = flow
        .received
        .iter()
        .map(|r| r.load(Ordering::Relaxed))
        .collect();
    let rss = status_kib(pid, "VmRSS:")?;
    let hwm = status_kib(pid, "VmHWM:")?;
    flow.stop.store(true, Ordering::Relaxed);
    flow.room.notify_waiters();
    for a in agents {
        a.abort();
    }
    for m in monitors {
        m.abort();
    }
    let ticks_per_s = clk_tck();
    let rates: Vec<f64> = r0
        .iter()
        .zip(&r1)
        .map(|(a, b)| (b - a) as f64 / elapsed)
        .collect();
    let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    let pct = |a: u64, b: u64| (b - a) as f64 / ticks_per_s / elapsed * 100.0;
    let cpu = pct(c0, c1);
    println!(
        "events [{}]: {n_agents} agents -> {n_monitors} monitor(s): {mean:.0} events/s per monitor (slowest {min:.0}), \
         {:.0} events/s delivered in all; manager CPU {cpu:.0}% of one core, RSS {rss} KiB (peak {hwm} KiB); \
         dbus-daemon CPU {:.0}%, load generator + monitors CPU {:.0}%; {elapsed:.1} s measured",
        mode.name(),
        mean * n_monitors as f64,
        pct(b0, b1),
        pct(s0, s1),
    );
    if rates.contains(&0.0) {
        bail!("a monitor received nothing: it was dropped or never subscribed");
    }
    drop(daemons);
    Ok(())
}

pub async fn main() -> Result<()> {
    let agents = env_num("DROVER_BENCH_AGENTS", 10) as usize;
    let seconds = env_num("DROVER_BENCH_SECONDS", 10);
    let monitors = std::env::var("DROVER_BENCH_MONITORS").unwrap_or_else(|_| "1,10".into());
    let modes = std::env::var("DROVER_BENCH_MODES").unwrap_or_else(|_| "bluechi,follow".into());
    let mut runs = Vec::new();
    for mode in modes.split(',') {
        let mode = match mode.trim() {
            "bluechi" => Mode::Bluechi,
            "follow" => Mode::Follow,
            other => bail!("DROVER_BENCH_MODES: unknown mode '{other}' (bluechi, follow)"),
        };
        for m in monitors.split(',') {
            let m: usize = m.trim().parse().context("DROVER_BENCH_MONITORS")?;
            runs.push((mode, m.max(1)));
        }
    }
    for (mode, m) in runs {
        run_once(agents.max(1), m, seconds.max(1), mode).await?;
    }
    Ok(())
}
