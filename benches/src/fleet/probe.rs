//! What a client of the manager measures, over its public D-Bus API:
//! `ListNodes`, `droverctl status` (the whole process), `Controller.ListUnits`
//! over every node, a `StartUnit` round trip until its `JobRemoved`, and a
//! monitor on `*` with the lag of every unit event it hears.
//!
//! Each function measures one thing and says nothing of how the fleet was
//! set up; the run in `fleet/mod.rs` decides when to call which.

use crate::fleet::agent::{Fleet, sent_at_us};
use anyhow::{Context, Result, bail};
use drover_bus::bluechi::{BUS_NAME, CONTROLLER_IFACE, CONTROLLER_PATH, MONITOR_IFACE, NODE_IFACE};
use drover_bus::systemd::UnitTuple;
use futures::StreamExt;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

async fn controller(conn: &zbus::Connection) -> Result<zbus::Proxy<'static>> {
    Ok(zbus::Proxy::new(conn, BUS_NAME, CONTROLLER_PATH, CONTROLLER_IFACE).await?)
}

/// One `Controller.ListNodes`: its wall time and how many nodes it lists
/// online.
pub async fn list_nodes(conn: &zbus::Connection) -> Result<(Duration, usize)> {
    let c = controller(conn).await?;
    let t = Instant::now();
    let nodes: Vec<(String, OwnedObjectPath, String, String)> = c.call("ListNodes", &()).await?;
    let took = t.elapsed();
    Ok((took, nodes.iter().filter(|n| n.2 == "online").count()))
}

/// One `droverctl status` run to its end (process start included).
pub fn droverctl_status(droverctl: &Path, address: &str) -> Result<Duration> {
    let t = Instant::now();
    let status = Command::new(droverctl)
        .arg("--bus")
        .arg(address)
        .arg("status")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", droverctl.display()))?;
    let took = t.elapsed();
    if !status.success() {
        bail!("droverctl status: {status}");
    }
    Ok(took)
}

/// What one `droverctl list-units` over every node did.
pub struct CtlList {
    pub took: Duration,
    /// Table lines after the header and the `=` line.
    pub rows: usize,
    /// droverctl's own peak RSS (its `VmHWM`, read every 10 ms while it
    /// runs), KiB. Not `wait4`'s `ru_maxrss`: exec keeps the high-water mark
    /// of the process image it replaces, and a child spawned from this
    /// generator starts as a copy of it (hundreds of MiB).
    pub peak_kib: u64,
    /// Its exit status and the first line of its stderr.
    pub code: i32,
    pub stderr: String,
}

/// One `droverctl list-units` over every node to its end (process start
/// included), its output counted as it comes (never held).
pub fn droverctl_list_units(droverctl: &Path, address: &str) -> Result<CtlList> {
    use std::io::Read;
    let t = Instant::now();
    let mut child = Command::new(droverctl)
        .arg("--bus")
        .arg(address)
        .arg("list-units")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", droverctl.display()))?;
    let mut out = child.stdout.take().context("droverctl's stdout")?;
    let lines = std::thread::spawn(move || -> std::io::Result<usize> {
        let mut buf = vec![0u8; 1 << 16];
        let mut lines = 0;
        loop {
            match out.read(&mut buf)? {
                0 => return Ok(lines),
                n => lines += buf[..n].iter().filter(|b| **b == b'\n').count(),
            }
        }
    });
    let mut err = child.stderr.take().context("droverctl's stderr")?;
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let pid = child.id();
    let peak = std::thread::spawn(move || {
        let mut peak = 0;
        // Ends when the process is gone or a zombie (no VmHWM any more).
        while let Ok(kib) = crate::procfs::status_kib(pid, "VmHWM:") {
            peak = peak.max(kib);
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    });
    let (status, _) = crate::ctl::wait4(i32::try_from(pid)?)?;
    let took = t.elapsed();
    let lines = lines
        .join()
        .map_err(|_| anyhow::anyhow!("the stdout reader panicked"))??;
    let stderr = errors.join().unwrap_or_default();
    Ok(CtlList {
        took,
        rows: lines.saturating_sub(2),
        peak_kib: peak.join().unwrap_or(0),
        code: if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        },
        stderr: stderr.lines().next().unwrap_or("").to_owned(),
    })
}

/// One `Controller.ListUnits`: its wall time (decoding included), the nodes
/// and the rows it returned.
pub async fn list_units(conn: &zbus::Connection) -> Result<(Duration, usize, usize)> {
    let c = controller(conn).await?;
    let t = Instant::now();
    let all: HashMap<String, Vec<UnitTuple>> = c.call("ListUnits", &()).await?;
    let took = t.elapsed();
    Ok((took, all.len(), all.values().map(Vec::len).sum()))
}

/// Starts a unit on one node through the API and waits for its job's
/// `JobRemoved`.
pub struct Starter {
    node: zbus::Proxy<'static>,
    removed: zbus::proxy::SignalStream<'static>,
}

impl Starter {
    pub async fn new(conn: &zbus::Connection, node: &str) -> Result<Self> {
        let c = controller(conn).await?;
        let path: OwnedObjectPath = c.call("GetNode", &(node,)).await?;
        let node = zbus::Proxy::new(conn, BUS_NAME, path, NODE_IFACE).await?;
        let removed = c.receive_signal("JobRemoved").await?;
        Ok(Self { node, removed })
    }

    /// One `StartUnit` until its `JobRemoved` (u o s s s: the job path is
    /// the second field).
    pub async fn round_trip(&mut self, unit: &str) -> Result<Duration> {
        let t = Instant::now();
        let job: OwnedObjectPath = self.node.call("StartUnit", &(unit, "replace")).await?;
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(msg) = self.removed.next().await {
                let body = msg.body();
                let got: (u32, OwnedObjectPath, String, String, String) = body.deserialize()?;
                if got.1 == job {
                    return Ok(t.elapsed());
                }
            }
            bail!("the JobRemoved stream ended")
        })
        .await
        .context("no JobRemoved within 30 s")?
    }
}

/// What one monitor on `*` heard while every node sent unit events.
#[derive(Debug, Clone, Default)]
pub struct MonitorFigures {
    pub sent: u64,
    pub delivered: u64,
    pub seconds: f64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
}

impl MonitorFigures {
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.delivered)
    }

    pub fn delivered_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.delivered as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A monitor subscribed to `unit` (`*`: every unit) on every node, on a
/// connection of its own (its signals are unicast to it).
pub(crate) async fn subscribed(
    address: &str,
    unit: &str,
) -> Result<(zbus::Connection, zbus::MessageStream, zbus::Proxy<'static>)> {
    // Room for every signal of a burst: a full queue would stall the
    // connection's reader, and with it the replies this task waits for.
    let room = std::num::NonZeroUsize::new(1 << 22).context("queue size")?;
    let conn = zbus::connection::Builder::address(address)
        .max_queued(room)
        .build()
        .await?;
    let inbox = zbus::MessageStream::from(conn.clone());
    let c = controller(&conn).await?;
    let path: OwnedObjectPath = c.call("CreateMonitor", &()).await?;
    let monitor = zbus::Proxy::new(&conn, BUS_NAME, path, MONITOR_IFACE).await?;
    let _: u32 = monitor.call("Subscribe", &("*", unit)).await?;
    Ok((conn, inbox, monitor))
}

/// A monitor on `*` on every node: how many `UnitStateChanged` of the
/// replay of the loaded units it hears until none came for a second (at
/// most `timeout`). Fewer than the fleet's loaded units means the manager
/// dropped the monitor (its queue overflowed); a `Subscribe` that fails
/// because the monitor was dropped while it replayed heard nothing.
pub async fn replay(address: &str, timeout: Duration) -> Result<u64> {
    let (_conn, mut inbox, _monitor) = match subscribed(address, "*").await {
        Ok(ok) => ok,
        Err(e) if format!("{e:#}").contains("the monitor was dropped") => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut heard = 0u64;
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.min(Duration::from_secs(1)), inbox.next()).await {
            Ok(Some(Ok(msg))) => {
                if msg.header().member().map(|m| m.as_str()) == Some("UnitStateChanged") {
                    heard += 1;
                }
            }
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) | Err(_) => return Ok(heard),
        }
    }
}

/// Subscribes a monitor to `unit` on every node, then has every agent send
/// `rate` events a second for `seconds`, waits up to `drain` for
/// stragglers, and reports.
pub async fn monitor(
    address: &str,
    unit: &str,
    fleet: &Fleet,
    rate: u32,
    seconds: f64,
    drain: Duration,
) -> Result<MonitorFigures> {
    let (_conn, mut inbox, _monitor) = subscribed(address, unit).await?;

    let delivered = Arc::new(AtomicU64::new(0));
    let lags = Arc::new(Mutex::new(Vec::<u32>::new()));
    let epoch = fleet.epoch;
    let reader = {
        let (delivered, lags) = (delivered.clone(), lags.clone());
        tokio::spawn(async move {
            while let Some(Ok(msg)) = inbox.next().await {
                let header = msg.header();
                if header.member().map(|m| m.as_str()) != Some("UnitStateChanged") {
                    continue;
                }
                let body = msg.body();
                let Ok((_, _, _, sub, _)) = body.deserialize::<(&str, &str, &str, &str, &str)>()
                else {
                    continue;
                };
                // Virtual states (the subscription's replay) carry no time.
                if let Some(sent) = sent_at_us(sub) {
                    let now = epoch.elapsed().as_micros() as u64;
                    let lag = now.saturating_sub(sent).min(u64::from(u32::MAX)) as u32;
                    lags.lock().unwrap_or_else(|p| p.into_inner()).push(lag);
                    delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // The subscription reaches every node before the load starts.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sent0 = fleet.events_sent.load(Ordering::Relaxed);
    let t = Instant::now();
    fleet.event_rate.send_replace(rate);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    fleet.event_rate.send_replace(0);
    let window = t.elapsed().as_secs_f64();
    // Sends in flight finish; then wait for the monitor to hear them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = fleet.events_sent.load(Ordering::Relaxed) - sent0;
    let until = Instant::now() + drain;
    while delivered.load(Ordering::Relaxed) < sent && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reader.abort();
    let mut lags = std::mem::take(&mut *lags.lock().unwrap_or_else(|p| p.into_inner()));
    lags.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lags.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * lags.len() as f64).ceil() as usize;
        f64::from(lags[rank.clamp(1, lags.len()) - 1]) / 1000.0
    };
    Ok(MonitorFigures {
        sent,
        delivered: delivered.load(Ordering::Relaxed),
        seconds: window,
        lag_p50_ms: pct(50.0),
        lag_p99_ms: pct(99.0),
    })
}
