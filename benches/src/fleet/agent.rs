//! One simulated agent: a task that connects, registers, beats and answers
//! the manager as `drover-agent` does, and reconnects when the link ends.
//!
//! The wire is `drover_protocol`'s (hello, frames, messages); the heartbeat
//! period and the silence threshold come from the agent's own
//! `drover_agent::link::heartbeat::negotiate`, the pause between attempts
//! from its `Backoff` (first retry after 100–250 ms, doubling, capped at the
//! heartbeat interval). Each agent binds its own source address in
//! 127.0.0.0/8 (see [`source_ip`]), as every node of a real fleet has its own
//! address: the manager's per-address caps and the ephemeral port range then
//! apply per node, not to the whole fleet at once.
//!
//! Invariants:
//! * One task per agent and no thread of its own; a session is one `select!`
//!   over the socket, the heartbeat timer, the event timer and the fleet's
//!   controls ([`Fleet`]).
//! * Every request gets exactly one reply ([`answer`]): `UnitJob` and
//!   `StartTransientUnit` are followed by `JobStateChanged(running)` and
//!   `JobDone(done)`; `Subscribe` of a loaded unit or of every unit replays the
//!   loaded units as virtual `UnitNew` + `UnitStateChanged` before the reply;
//!   `ListUnits` returns [`AgentConfig::units`] rows, in `ReplyPart`s of at
//!   most [`ROWS_PER_PART`] rows.
//! * [`Fleet::online`] counts agents holding an accepted session, raised when
//!   `Accepted` arrives (the manager has put the node online before it sends
//!   it) and lowered when the session ends.
//! * Unit events (on the event timer, or one when [`Fleet::nudge`]d) are
//!   `UnitStateChanged` of [`EVENT_UNIT`] and carry their send time in the sub state (`t<µs since the
//!   fleet's epoch>`), so a monitor in the same process measures lag without
//!   any side channel ([`sent_at_us`]).
//! * Health ([`HealthDecl`]): an agent whose units declare checks sends the
//!   health snapshot first in every session (every checked unit healthy) and
//!   then nothing about health until [`Fleet::health_flips`] is on; while it
//!   is, each agent flips one unit's verdict (healthy ↔ unhealthy, a
//!   `UnitHealth` event) every [`HealthDecl::flip_every`], the agents'
//!   phases spread evenly over that period, as a real agent sends a verdict
//!   only when it changes.
//! * Resync, as the real agent: a session keeps what it told the manager
//!   ([`Reported`]: the watch set from `Subscribe`/`Unsubscribe`, the
//!   loaded units' states, the health verdicts) and, when the manager's
//!   `Accepted::resync_interval_ms` is not 0, sends a digest of it every
//!   `drover_protocol::resync::jittered` interval, computed by the
//!   protocol's `units_sum`/`health_sum` as the agent's is. `Request::Resync`
//!   is answered with the snapshot parts (one tag, reserving two), the
//!   health snapshot, then the reply. [`Fleet::diverge`] makes an agent
//!   change a watched unit's state without telling the manager (a lost
//!   event), which its next digest shows.

use drover_agent::connection::Backoff;
use drover_agent::link::heartbeat::{Negotiated, negotiate, timer};
use drover_protocol::handshake::Accepted;
use drover_protocol::link::{HandshakeError, agent_handshake};
use drover_protocol::resync::{Digest, SnapshotPart, UnitRow, health_sum, units_sum, watch_hash};
use drover_protocol::{
    Event, Health, HealthSnapshot, HealthState, Hello, ModTag, NodeHealth, NodeName, Reason,
    Request, Response, ToAgent, ToManager, UnitHealth, UnitInfo, UnitName,
};
use futures::{SinkExt, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Rows of a `ListUnits` reply per frame (a row is ~150 bytes encoded, so
/// a part stays far below the 1 MiB frame cap).
pub const ROWS_PER_PART: usize = 2000;

/// The unit every simulated agent sends its unit events about. It is not
/// among the loaded units, so subscribing to it replays nothing.
pub const EVENT_UNIT: &str = "fleet-events.service";

/// The agent version every simulated agent announces.
pub const VERSION: &str = "fleet-bench";

/// What every simulated agent of one fleet shares.
pub struct AgentConfig {
    pub manager: SocketAddr,
    /// The agent's configured `HeartbeatInterval` and
    /// `ControllerHeartbeatThreshold` (negotiated with the manager's).
    pub heartbeat_interval: Duration,
    pub heartbeat_threshold: Duration,
    /// TCP connect, TLS and hello together.
    pub connect_timeout: Duration,
    /// The node's loaded units (what `ListUnits` returns).
    pub units: Arc<Vec<UnitInfo>>,
    /// The units' health checks (none: the agents say nothing of health).
    pub health: HealthDecl,
}

/// The health checks every simulated node declares (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct HealthDecl {
    /// The units with a check: `fleet-0.service` … (loaded units when there
    /// are at least as many).
    pub units: Vec<UnitName>,
    /// While flips are on, one agent flips one verdict this often; `None`:
    /// never.
    pub flip_every: Option<Duration>,
}

impl HealthDecl {
    /// `checks` units with a check each, `percent_per_minute` of them
    /// flipping a minute (so one flip every `60 s / (checks × percent / 100)`
    /// per agent).
    pub fn new(checks: usize, percent_per_minute: f64) -> Self {
        let units = (0..checks)
            .filter_map(|k| UnitName::new(format!("fleet-{k}.service")).ok())
            .collect();
        let per_minute = checks as f64 * percent_per_minute / 100.0;
        let flip_every = (per_minute > 0.0 && per_minute.is_finite())
            .then(|| Duration::from_secs_f64(60.0 / per_minute));
        Self { units, flip_every }
    }

    /// The snapshot a session starts with: every checked unit healthy.
    fn snapshot(&self) -> Vec<HealthSnapshot> {
        let healthy: BTreeMap<UnitName, HealthState> = self
            .units
            .iter()
            .map(|u| (u.clone(), HealthState::Healthy))
            .collect();
        health_parts(&healthy)
    }
}

/// A health snapshot of the verdicts `units` (the node itself healthy).
fn health_parts(units: &BTreeMap<UnitName, HealthState>) -> Vec<HealthSnapshot> {
    let units = units
        .iter()
        .map(|(unit, state)| UnitHealth {
            unit: unit.clone(),
            health: Health::new(*state, "", 0),
        })
        .collect();
    let node = NodeHealth {
        health: Health::new(HealthState::Healthy, "", 0),
        system_state: "running".into(),
        checks: Vec::new(),
    };
    HealthSnapshot::parts(units, node)
}

impl AgentConfig {
    /// `count` loaded units `fleet-K.service`, active and running.
    pub fn unit_rows(count: usize) -> Vec<UnitInfo> {
        (0..count)
            .map(|k| UnitInfo {
                object_path: format!("/org/freedesktop/systemd1/unit/fleet_2d{k}_2eservice"),
                description: "simulated unit".into(),
                ..UnitInfo::loaded(&format!("fleet-{k}.service"), "active", "running")
            })
            .collect()
    }
}

/// The fleet's counters and controls, shared by every agent task.
pub struct Fleet {
    /// Agents holding an accepted session now.
    pub online: AtomicUsize,
    /// Sessions accepted since the start.
    pub sessions: AtomicU64,
    /// TCP connects that failed (refused while the manager is down, reset).
    pub connect_failed: AtomicU64,
    /// Connections closed or timed out before the manager's verdict (the
    /// manager's pre-authentication caps close them at once), TLS failures.
    pub handshake_failed: AtomicU64,
    /// Hellos the manager refused (`Welcome::Refused`).
    pub refused: AtomicU64,
    /// Sessions that ended on a failed link, by [`Lost`] (index `Lost as usize`).
    pub lost: [AtomicU64; Lost::ALL.len()],
    /// Unit events sent.
    pub events_sent: AtomicU64,
    /// `ListUnits` requests answered (the manager sends each node one, its
    /// orphan-dep sweep, one grace period after the node registered).
    pub lists_answered: AtomicU64,
    /// Health verdicts flipped (`UnitHealth` events sent).
    pub health_flips_sent: AtomicU64,
    /// Units whose last verdict sent in a session still open is unhealthy.
    pub unhealthy_now: AtomicUsize,
    /// Resync digests sent, and their frames' bytes (length prefix included).
    pub digests_sent: AtomicU64,
    pub digest_bytes: AtomicU64,
    /// `Request::Resync` answered (snapshots sent).
    pub snapshots_sent: AtomicU64,
    /// Unit states changed without telling the manager ([`Fleet::diverge`]).
    pub diverged: AtomicU64,
    /// Whether the agents flip their units' verdicts now ([`HealthDecl`]).
    pub health_flips: watch::Sender<bool>,
    /// Unit events per second each agent sends (0 = none).
    pub event_rate: watch::Sender<u32>,
    /// Bumped to make the agents with an index below the value's `.1` drop
    /// their link at once (and reconnect after their backoff).
    pub drop_below: watch::Sender<(u64, usize)>,
    /// Per agent index: notified to make that agent send one unit event now
    /// (as from the event timer: [`EVENT_UNIT`], its send time in the sub
    /// state). One `Notify` each, so a nudge wakes one task, not the fleet.
    nudges: std::sync::Mutex<std::collections::HashMap<usize, Arc<tokio::sync::Notify>>>,
    /// Per agent index: notified to make that agent diverge ([`Fleet::diverge`]).
    diverges: std::sync::Mutex<std::collections::HashMap<usize, Arc<tokio::sync::Notify>>>,
    pub stop: CancellationToken,
    /// The origin of the send times in unit events.
    pub epoch: Instant,
}

impl Fleet {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            online: AtomicUsize::new(0),
            sessions: AtomicU64::new(0),
            connect_failed: AtomicU64::new(0),
            handshake_failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            lost: Default::default(),
            events_sent: AtomicU64::new(0),
            lists_answered: AtomicU64::new(0),
            health_flips_sent: AtomicU64::new(0),
            unhealthy_now: AtomicUsize::new(0),
            digests_sent: AtomicU64::new(0),
            digest_bytes: AtomicU64::new(0),
            snapshots_sent: AtomicU64::new(0),
            diverged: AtomicU64::new(0),
            health_flips: watch::Sender::new(false),
            event_rate: watch::Sender::new(0),
            drop_below: watch::Sender::new((0, 0)),
            nudges: Default::default(),
            diverges: Default::default(),
            stop: CancellationToken::new(),
            epoch: Instant::now(),
        })
    }

    pub fn online(&self) -> usize {
        self.online.load(Ordering::Relaxed)
    }

    /// Failed attempts of every kind so far.
    pub fn failures(&self) -> (u64, u64, u64) {
        (
            self.connect_failed.load(Ordering::Relaxed),
            self.handshake_failed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }

    /// Sessions ended on a failed link so far, by [`Lost`].
    pub fn lost_counts(&self) -> [u64; Lost::ALL.len()] {
        Lost::ALL.map(|how| self.lost[how as usize].load(Ordering::Relaxed))
    }

    /// Makes agents `0..count` drop their links now.
    pub fn drop_first(&self, count: usize) {
        self.drop_below.send_modify(|(generation, below)| {
            *generation += 1;
            *below = count;
        });
    }

    /// Makes agent `index` send one unit event now (see [`Fleet::nudge`]).
    pub fn nudge(&self, index: usize) {
        self.nudge_of(index).notify_one();
    }

    fn nudge_of(&self, index: usize) -> Arc<tokio::sync::Notify> {
        let mut map = self.nudges.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(index).or_default().clone()
    }

    /// Makes agent `index` change the state of the first unit the manager
    /// watches on it (`failed`/`failed`, or back to `active`/`running`)
    /// without sending the event: a lost event, for resync to find
    /// ([`Fleet::diverged`] counts the changes made).
    pub fn diverge(&self, index: usize) {
        self.diverge_of(index).notify_one();
    }

    fn diverge_of(&self, index: usize) -> Arc<tokio::sync::Notify> {
        let mut map = self.diverges.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(index).or_default().clone()
    }

    /// µs since [`Fleet::epoch`] (the clock of the events' send times).
    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

/// The send time a simulated unit event carries in its sub state.
pub fn sent_at_us(sub_state: &str) -> Option<u64> {
    sub_state.strip_prefix('t')?.parse().ok()
}

/// The node name of agent `index`.
pub fn node_name(index: usize) -> String {
    format!("fleet{index}")
}

/// The source address of agent `index`: 127.1.0.0 + index (one loopback
/// address per node, 127.0.0.1 left to the manager).
pub fn source_ip(index: usize) -> IpAddr {
    let host = (0x0001_0000u32).wrapping_add(index as u32) & 0x00ff_ffff;
    IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | host))
}

/// How a connection attempt ended.
#[derive(Debug)]
enum Attempt {
    Connect,
    Handshake,
    Refused,
}

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Stop,
    Dropped,
    Lost(Lost),
}

/// How an agent saw its link fail ([`Fleet::lost`] counts each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The manager closed the connection.
    ReadEnd,
    /// Reading failed (reset, or a frame the agent could not decode).
    ReadError,
    /// Writing failed (reset, or the kernel's `TCP_USER_TIMEOUT`).
    WriteError,
    /// Nothing heard from the manager within the agent's threshold.
    Silence,
}

impl Lost {
    pub const ALL: [Lost; 4] = [
        Lost::ReadEnd,
        Lost::ReadError,
        Lost::WriteError,
        Lost::Silence,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Lost::ReadEnd => "closed by the manager",
            Lost::ReadError => "read error",
            Lost::WriteError => "write error",
            Lost::Silence => "manager silent",
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Runs agent `index` until the fleet stops.
pub async fn run(
    index: usize,
    cfg: Arc<AgentConfig>,
    fleet: Arc<Fleet>,
    tls: Option<drover_tls::Connector>,
) {
    let name = node_name(index);
    let mut backoff = Backoff::new(cfg.heartbeat_interval.max(Duration::from_secs(1)));
    let mut drops = fleet.drop_below.subscribe();
    drops.mark_unchanged();
    let nudge = fleet.nudge_of(index);
    let diverge = fleet.diverge_of(index);
    loop {
        if fleet.stop.is_cancelled() {
            return;
        }
        let attempt = tokio::time::timeout(
            cfg.connect_timeout,
            connect(index, &name, &cfg, tls.as_ref()),
        )
        .await;
        match attempt {
            Ok(Ok((framed, accepted))) => {
                backoff.reset();
                fleet.sessions.fetch_add(1, Ordering::Relaxed);
                fleet.online.fetch_add(1, Ordering::Relaxed);
                let controls = Controls {
                    drops: &mut drops,
                    nudge: &nudge,
                    diverge: &diverge,
                };
                let end = session(index, &cfg, &fleet, framed, &accepted, controls).await;
                fleet.online.fetch_sub(1, Ordering::Relaxed);
                if let End::Lost(how) = end {
                    fleet.lost[how as usize].fetch_add(1, Ordering::Relaxed);
                }
                if end == End::Stop {
                    return;
                }
            }
            Ok(Err(Attempt::Connect)) => {
                fleet.connect_failed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(Attempt::Handshake)) | Err(_) => {
                fleet.handshake_failed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(Attempt::Refused)) => {
                fleet.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::select! {
            _ = fleet.stop.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

type Framed = drover_protocol::link::AgentFramed<Box<dyn Io>>;

async fn connect(
    index: usize,
    name: &str,
    cfg: &AgentConfig,
    tls: Option<&drover_tls::Connector>,
) -> Result<(Framed, Accepted), Attempt> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|_| Attempt::Connect)?;
    socket
        .bind(SocketAddr::new(source_ip(index), 0))
        .map_err(|_| Attempt::Connect)?;
    let stream = socket
        .connect(cfg.manager)
        .await
        .map_err(|_| Attempt::Connect)?;
    let _ = stream.set_nodelay(true);
    // As the agent does (`drover_protocol::liveness`); it costs the manager nothing.
    let sends_every = (!cfg.heartbeat_interval.is_zero()).then_some(cfg.heartbeat_interval);
    if let Some(timeout) =
        drover_protocol::liveness::user_timeout(cfg.heartbeat_threshold, sends_every)
    {
        let _ = drover_protocol::link::set_user_timeout(&stream, timeout);
    }
    let io: Box<dyn Io> = match tls {
        None => Box::new(stream),
        Some(connector) => Box::new(
            connector
                .connect(stream)
                .await
                .map_err(|_| Attempt::Handshake)?,
        ),
    };
    let hello = Hello::new(name, VERSION);
    match agent_handshake(io, &hello, cfg.connect_timeout).await {
        Ok(ok) => Ok(ok),
        Err(HandshakeError::Refused { .. }) => Err(Attempt::Refused),
        Err(_) => Err(Attempt::Handshake),
    }
}

async fn session(
    index: usize,
    cfg: &AgentConfig,
    fleet: &Fleet,
    mut framed: Framed,
    accepted: &Accepted,
    controls: Controls<'_>,
) -> End {
    let Controls {
        drops,
        nudge,
        diverge,
    } = controls;
    let (beats, mut beat) = heartbeats(cfg.heartbeat_interval, cfg.heartbeat_threshold, accepted);
    let mut last_heard = tokio::time::Instant::now();
    let mut state = SessionState::new(accepted.session_id, &cfg.units, &cfg.health.units);
    let resync = Duration::from_millis(accepted.resync_interval_ms);
    let mut digests = digest_timer(resync, index);
    let mut rates = fleet.event_rate.subscribe();
    let mut events = event_timer(*rates.borrow_and_update());
    let unit = UnitName::new(EVENT_UNIT).ok();
    let mut out = Vec::new();
    if !cfg.health.units.is_empty() {
        let tag = state.tag();
        for part in cfg.health.snapshot() {
            if framed
                .feed(ToManager::Event(Event::HealthSnapshot { tag, part }))
                .await
                .is_err()
            {
                return End::Lost(Lost::WriteError);
            }
        }
        if framed.flush().await.is_err() {
            return End::Lost(Lost::WriteError);
        }
    }
    let mut flip_switch = fleet.health_flips.subscribe();
    let mut flips = flip_timer(
        *flip_switch.borrow_and_update(),
        &cfg.health,
        index,
        fleet.epoch,
    );
    let mut unhealthy = Unhealthy {
        units: vec![false; cfg.health.units.len()],
        fleet,
    };
    let mut flipped = 0usize;
    loop {
        tokio::select! {
            frame = framed.next() => {
                last_heard = tokio::time::Instant::now();
                match frame {
                    Some(Ok(ToAgent::Request { id, body })) => {
                        answer(id, &body, &cfg.units, &mut state, &mut out);
                        if body == Request::ListUnits {
                            fleet.lists_answered.fetch_add(1, Ordering::Relaxed);
                        }
                        if body == Request::Resync {
                            fleet.snapshots_sent.fetch_add(1, Ordering::Relaxed);
                        }
                        for msg in out.drain(..) {
                            if framed.feed(msg).await.is_err() {
                                return End::Lost(Lost::WriteError);
                            }
                        }
                        if framed.flush().await.is_err() {
                            return End::Lost(Lost::WriteError);
                        }
                    }
                    Some(Ok(ToAgent::Heartbeat | ToAgent::Notice(_))) => {}
                    Some(Err(_)) => return End::Lost(Lost::ReadError),
                    None => return End::Lost(Lost::ReadEnd),
                }
            }
            _ = beat.tick() => {
                if beats.silence.is_some_and(|s| last_heard.elapsed() > s) {
                    return End::Lost(Lost::Silence);
                }
                if beats.send_every.is_some() && framed.send(ToManager::Heartbeat).await.is_err() {
                    return End::Lost(Lost::WriteError);
                }
            }
            _ = tick(&mut digests) => {
                let msg = ToManager::Event(Event::ResyncDigest(state.digest()));
                let bytes = drover_protocol::codec::HEADER_LEN
                    + drover_protocol::codec::encode_body(&msg).map_or(0, |b| b.len());
                if framed.send(msg).await.is_err() {
                    return End::Lost(Lost::WriteError);
                }
                fleet.digests_sent.fetch_add(1, Ordering::Relaxed);
                fleet.digest_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                digests = digest_timer(resync, index);
            }
            _ = diverge.notified() => {
                if state.reported.diverge().is_some() {
                    fleet.diverged.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ = events_due(&mut events, nudge) => {
                let Some(unit) = &unit else { continue };
                state.index += 1;
                let active = if state.index.is_multiple_of(2) { "active" } else { "activating" };
                let sub = format!("t{}", fleet.now_us());
                state.reported.set_state(unit, active, &sub);
                let msg = ToManager::Event(Event::UnitStateChanged {
                    tag: ModTag::new(state.guid, state.index),
                    unit: unit.clone(),
                    active_state: active.into(),
                    sub_state: sub,
                    reason: Reason::Real,
                });
                if framed.send(msg).await.is_err() {
                    return End::Lost(Lost::WriteError);
                }
                fleet.events_sent.fetch_add(1, Ordering::Relaxed);
            }
            _ = tick(&mut flips) => {
                let k = flipped % unhealthy.units.len().max(1);
                flipped += 1;
                let Some(unit) = cfg.health.units.get(k) else {
                    continue;
                };
                let health = if unhealthy.flip(k) {
                    Health::new(HealthState::Unhealthy, "connection refused", 0)
                } else {
                    Health::new(HealthState::Healthy, "", 0)
                };
                state.reported.set_health(unit, health.state);
                let msg = ToManager::Event(Event::UnitHealth {
                    tag: state.tag(),
                    unit: unit.clone(),
                    health,
                });
                if framed.send(msg).await.is_err() {
                    return End::Lost(Lost::WriteError);
                }
                fleet.health_flips_sent.fetch_add(1, Ordering::Relaxed);
            }
            changed = flip_switch.changed() => {
                if changed.is_err() {
                    return End::Stop;
                }
                flips = flip_timer(*flip_switch.borrow_and_update(), &cfg.health, index, fleet.epoch);
            }
            changed = rates.changed() => {
                if changed.is_err() {
                    return End::Stop;
                }
                events = event_timer(*rates.borrow_and_update());
            }
            changed = drops.changed() => {
                if changed.is_err() {
                    return End::Stop;
                }
                let (_, below) = *drops.borrow_and_update();
                if index < below {
                    return End::Dropped;
                }
            }
            _ = fleet.stop.cancelled() => return End::Stop,
        }
    }
}

/// One session's unhealthy units, counted in [`Fleet::unhealthy_now`] while
/// the session lasts (its next session starts with every unit healthy).
struct Unhealthy<'a> {
    units: Vec<bool>,
    fleet: &'a Fleet,
}

impl Unhealthy<'_> {
    /// Flips unit `k`; whether it is unhealthy now.
    fn flip(&mut self, k: usize) -> bool {
        let Some(bad) = self.units.get_mut(k) else {
            return false;
        };
        *bad = !*bad;
        if *bad {
            self.fleet.unhealthy_now.fetch_add(1, Ordering::Relaxed);
        } else {
            self.fleet.unhealthy_now.fetch_sub(1, Ordering::Relaxed);
        }
        *bad
    }
}

impl Drop for Unhealthy<'_> {
    fn drop(&mut self) {
        let bad = self.units.iter().filter(|b| **b).count();
        self.fleet.unhealthy_now.fetch_sub(bad, Ordering::Relaxed);
    }
}

/// The fleet's controls one agent follows across its sessions.
struct Controls<'a> {
    drops: &'a mut watch::Receiver<(u64, usize)>,
    nudge: &'a tokio::sync::Notify,
    diverge: &'a tokio::sync::Notify,
}

/// Returns when the event timer ticks or the agent is nudged.
async fn events_due(timer: &mut Option<tokio::time::Interval>, nudge: &tokio::sync::Notify) {
    tokio::select! {
        _ = tick(timer) => {}
        _ = nudge.notified() => {}
    }
}

/// A timer for `rate` events a second, its first tick at a random phase so
/// the fleet's events spread over the second; `None` for rate 0.
fn event_timer(rate: u32) -> Option<tokio::time::Interval> {
    if rate == 0 {
        return None;
    }
    let period = Duration::from_secs(1) / rate;
    let phase = Backoff::new(period).next_delay().min(period);
    let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + phase, period);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    Some(timer)
}

/// The wait before agent `index`'s next digest, jittered as the real
/// agent's (`drover_protocol::resync::jittered`); `None` when the manager
/// asked for none (interval 0).
fn digest_timer(interval: Duration, index: usize) -> Option<tokio::time::Interval> {
    if interval.is_zero() {
        return None;
    }
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one((index, Instant::now()));
    let wait = drover_protocol::resync::jittered(interval, random);
    Some(tokio::time::interval_at(
        tokio::time::Instant::now() + wait,
        wait,
    ))
}

/// The flip timer of agent `index` ([`HealthDecl`]): `None` while flips are
/// off or never happen. The agents' ticks are spread evenly over the period
/// (agent `index` at the fraction `index × φ mod 1` of it, counted from
/// `epoch`), so a fleet flips at a steady rate whenever flips are turned on.
fn flip_timer(
    on: bool,
    decl: &HealthDecl,
    index: usize,
    epoch: Instant,
) -> Option<tokio::time::Interval> {
    let period = decl.flip_every.filter(|_| on && !decl.units.is_empty())?;
    let first = first_flip(period, index, epoch, Instant::now());
    let mut timer = tokio::time::interval_at(first.into(), period);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    Some(timer)
}

/// Agent `index`'s first flip at or after `now`: the next moment
/// `epoch + offset + k × period`, its offset [`spread`] over the period.
fn first_flip(period: Duration, index: usize, epoch: Instant, now: Instant) -> Instant {
    let offset = period.mul_f64(spread(index));
    let since = now.saturating_duration_since(epoch);
    let ticks = if since > offset {
        ((since - offset).as_secs_f64() / period.as_secs_f64()).ceil()
    } else {
        0.0
    };
    epoch + offset + period.mul_f64(ticks)
}

/// Where agent `index` falls in a period, in [0, 1): the golden-ratio
/// sequence, which spreads any number of agents evenly.
fn spread(index: usize) -> f64 {
    (index as f64 * 0.618_033_988_749_894_8).fract()
}

async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// A session's heartbeats as the agent negotiates them with the manager's
/// welcome, and the timer that sends them (first tick at the session's
/// slot, within a period of the welcome; hourly, unused, when none are to
/// be sent).
pub fn heartbeats(
    interval: Duration,
    threshold: Duration,
    accepted: &Accepted,
) -> (Negotiated, tokio::time::Interval) {
    let beats = negotiate(
        interval,
        threshold,
        accepted.heartbeat_interval_ms,
        accepted.heartbeat_threshold_ms,
    );
    let every = beats.send_every.unwrap_or(Duration::from_secs(3600));
    // In a slot drawn at random, by the real agent's timer.
    (beats, timer(every))
}

/// The tags of one session, and what it told the manager.
pub struct SessionState {
    pub guid: u64,
    /// The last tag index used (counted from 1 in each session).
    pub index: u64,
    pub reported: Reported,
}

impl SessionState {
    /// A session `guid` of a node with the loaded `units`, whose `checked`
    /// units start healthy (the health snapshot it sends first).
    pub fn new(guid: u64, units: &[UnitInfo], checked: &[UnitName]) -> Self {
        Self {
            guid,
            index: 0,
            reported: Reported::new(units, checked),
        }
    }

    fn tag(&mut self) -> ModTag {
        self.index += 1;
        ModTag::new(self.guid, self.index)
    }

    /// The digest of what the manager should hold now, at the last tag.
    pub fn digest(&self) -> Digest {
        self.reported.digest(ModTag::new(self.guid, self.index))
    }
}

/// What a session told the manager, as the real agent's unit cache, watch
/// set and health table hold it: what a digest and a snapshot are made of.
#[derive(Debug, Clone, Default)]
pub struct Reported {
    /// `Subscribe` of every unit (`*`).
    all: bool,
    /// The single units subscribed.
    watched: BTreeSet<UnitName>,
    /// The loaded units and their (active, sub) state.
    loaded: BTreeMap<UnitName, (String, String)>,
    /// Every verdict other than `none`.
    health: BTreeMap<UnitName, HealthState>,
}

impl Reported {
    fn new(units: &[UnitInfo], checked: &[UnitName]) -> Self {
        Self {
            loaded: units
                .iter()
                .filter_map(|u| {
                    let name = UnitName::new(u.name.as_str()).ok()?;
                    Some((name, (u.active_state.clone(), u.sub_state.clone())))
                })
                .collect(),
            health: checked
                .iter()
                .map(|u| (u.clone(), HealthState::Healthy))
                .collect(),
            ..Self::default()
        }
    }

    fn watches(&self, unit: &UnitName) -> bool {
        self.all || self.watched.contains(unit)
    }

    fn watch_hash(&self) -> u64 {
        watch_hash(self.all, &self.watched)
    }

    /// The loaded units the manager watches, in name order.
    fn rows(&self) -> impl Iterator<Item = (&UnitName, &str, &str)> {
        self.loaded
            .iter()
            .filter(|(u, _)| self.watches(u))
            .map(|(u, (a, s))| (u, a.as_str(), s.as_str()))
    }

    /// The digest at `tag`, by the protocol's sums (as the agent's).
    pub fn digest(&self, tag: ModTag) -> Digest {
        Digest {
            tag,
            watch: self.watch_hash(),
            units: units_sum(self.rows()),
            health: health_sum(self.health.iter().map(|(u, s)| (u, *s))),
        }
    }

    fn set_state(&mut self, unit: &UnitName, active: &str, sub: &str) {
        self.loaded
            .insert(unit.clone(), (active.to_owned(), sub.to_owned()));
    }

    fn set_health(&mut self, unit: &UnitName, state: HealthState) {
        if state == HealthState::None {
            self.health.remove(unit);
        } else {
            self.health.insert(unit.clone(), state);
        }
    }

    /// Changes the first watched loaded unit's state without an event
    /// (see [`Fleet::diverge`]); the unit, `None` when none is watched.
    pub fn diverge(&mut self) -> Option<UnitName> {
        let (unit, _, _) = self.rows().next()?;
        let unit = unit.clone();
        let (active, sub) = self.loaded.get_mut(&unit)?;
        let (a, s) = if active == "failed" {
            ("active", "running")
        } else {
            ("failed", "failed")
        };
        *active = a.into();
        *sub = s.into();
        Some(unit)
    }

    /// The snapshot parts of the watched loaded units.
    fn snapshot(&self) -> Vec<SnapshotPart> {
        let rows = self
            .rows()
            .map(|(unit, a, s)| UnitRow {
                unit: unit.clone(),
                active_state: a.into(),
                sub_state: s.into(),
            })
            .collect();
        SnapshotPart::parts(self.watch_hash(), rows)
    }
}

/// What the agent sends for request `id` (see the module docs), appended to
/// `out` in order.
pub fn answer(
    id: u64,
    body: &Request,
    units: &[UnitInfo],
    state: &mut SessionState,
    out: &mut Vec<ToManager>,
) {
    let ok = |out: &mut Vec<ToManager>| {
        out.push(ToManager::Reply {
            id,
            result: Ok(Response::Empty),
        })
    };
    match body {
        Request::ListUnits => {
            let mut chunks = units.chunks(ROWS_PER_PART).peekable();
            let mut last = Vec::new();
            while let Some(chunk) = chunks.next() {
                if chunks.peek().is_some() {
                    out.push(ToManager::ReplyPart {
                        id,
                        part: Response::Units(chunk.to_vec()),
                    });
                } else {
                    last = chunk.to_vec();
                }
            }
            out.push(ToManager::Reply {
                id,
                result: Ok(Response::Units(last)),
            });
        }
        Request::UnitJob { job_id, .. } | Request::StartTransientUnit { job_id, .. } => {
            ok(out);
            out.push(ToManager::Event(Event::JobStateChanged {
                job_id: *job_id,
                state: "running".into(),
            }));
            out.push(ToManager::Event(Event::JobDone {
                job_id: *job_id,
                result: "done".into(),
            }));
        }
        Request::Subscribe { .. } | Request::SubscribeState { .. } => {
            let unit = match body {
                Request::SubscribeState { unit } => Some(unit),
                Request::Subscribe { unit } => unit.as_ref(),
                _ => None,
            };
            // As the agent: a new subscription is replayed, a new scope of
            // one is not (the simulated units have no properties to tell).
            let fresh = match unit {
                None => !std::mem::replace(&mut state.reported.all, true),
                Some(u) => state.reported.watched.insert(u.clone()),
            };
            let loaded: Vec<(UnitName, String, String)> = state
                .reported
                .loaded
                .iter()
                .filter(|_| fresh)
                .filter(|(u, _)| unit.is_none_or(|want| want == *u))
                .map(|(u, (a, s))| (u.clone(), a.clone(), s.clone()))
                .collect();
            for (name, active_state, sub_state) in loaded {
                out.push(ToManager::Event(Event::UnitNew {
                    tag: state.tag(),
                    unit: name.clone(),
                    reason: Reason::Virtual,
                }));
                out.push(ToManager::Event(Event::UnitStateChanged {
                    tag: state.tag(),
                    unit: name,
                    active_state,
                    sub_state,
                    reason: Reason::Virtual,
                }));
            }
            ok(out);
        }
        Request::Unsubscribe { unit } => {
            match unit {
                None => state.reported.all = false,
                Some(u) => {
                    state.reported.watched.remove(u);
                }
            }
            ok(out);
        }
        Request::Resync => {
            // As the agent (`drover_protocol::resync`): the parts at one
            // tag T reserving T + 1, the health snapshot, then the reply.
            let tag = state.tag();
            state.index += 1;
            for part in state.reported.snapshot() {
                out.push(ToManager::Event(Event::ResyncSnapshot { tag, part }));
            }
            if !state.reported.health.is_empty() {
                let tag = state.tag();
                for part in health_parts(&state.reported.health) {
                    out.push(ToManager::Event(Event::HealthSnapshot { tag, part }));
                }
            }
            ok(out);
        }
        Request::GetDefaultTarget => out.push(ToManager::Reply {
            id,
            result: Ok(Response::Text("multi-user.target".into())),
        }),
        _ => ok(out),
    }
}

/// The node names of agents `0..count`, validated.
pub fn node_names(count: usize) -> Vec<NodeName> {
    (0..count)
        .filter_map(|i| NodeName::new(node_name(i)).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn health_declarations_flip_at_the_asked_rate() {
        let decl = super::HealthDecl::new(20, 1.0);
        assert_eq!(decl.units.len(), 20);
        assert_eq!(decl.units[19].as_str(), "fleet-19.service");
        // 20 checks, 1% a minute: 0.2 flips a minute, one every 300 s.
        assert_eq!(decl.flip_every, Some(std::time::Duration::from_secs(300)));
        let parts = decl.snapshot();
        assert_eq!(parts.iter().map(|p| p.units.len()).sum::<usize>(), 20);
        assert!(parts.last().is_some_and(|p| p.is_last()));
        assert!(parts.iter().rev().skip(1).all(|p| !p.is_last()));
        assert!(
            parts
                .iter()
                .flat_map(|p| &p.units)
                .all(|u| u.health.state == drover_protocol::HealthState::Healthy)
        );
        assert_eq!(super::HealthDecl::new(20, 0.0).flip_every, None);
        assert!(super::HealthDecl::new(0, 1.0).units.is_empty());
    }

    #[tokio::test]
    async fn flips_are_off_until_turned_on_and_spread_over_the_period() {
        let decl = super::HealthDecl::new(20, 1.0);
        let epoch = std::time::Instant::now();
        assert!(super::flip_timer(false, &decl, 0, epoch).is_none());
        assert!(super::flip_timer(true, &super::HealthDecl::default(), 0, epoch).is_none());
        // Over 1,000 agents, every tenth of the period holds about a tenth of them.
        let mut buckets = [0usize; 10];
        for index in 0..1000 {
            let f = super::spread(index);
            assert!((0.0..1.0).contains(&f));
            buckets[(f * 10.0) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (90..=110).contains(&b)),
            "{buckets:?}"
        );
        assert!(super::flip_timer(true, &decl, 1, epoch).is_some());
        // The first flip keeps the agent's place in the period, whenever flips are turned on.
        let period = std::time::Duration::from_secs(300);
        let offset = period.mul_f64(super::spread(1));
        assert_eq!(super::first_flip(period, 1, epoch, epoch), epoch + offset);
        let later = epoch + offset + period * 2 + std::time::Duration::from_secs(1);
        assert_eq!(
            super::first_flip(period, 1, epoch, later),
            epoch + offset + period * 3
        );
    }

    use super::*;

    #[test]
    fn source_addresses_are_distinct_loopback_addresses() {
        assert_eq!(source_ip(0), IpAddr::V4(Ipv4Addr::new(127, 1, 0, 0)));
        assert_eq!(source_ip(257), IpAddr::V4(Ipv4Addr::new(127, 1, 1, 1)));
        assert_eq!(
            source_ip(100_000),
            IpAddr::V4(Ipv4Addr::new(127, 2, 134, 160))
        );
        assert!((0..200_000).all(|i| match source_ip(i) {
            IpAddr::V4(v4) => v4.is_loopback() && v4 != Ipv4Addr::LOCALHOST,
            IpAddr::V6(_) => false,
        }));
    }

    #[test]
    fn a_job_is_replied_then_runs_then_is_done() {
        let mut s = SessionState::new(7, &[], &[]);
        let mut out = Vec::new();
        let req = Request::UnitJob {
            kind: drover_protocol::JobKind::Start,
            unit: UnitName::new("a.service").unwrap(),
            mode: "replace".into(),
            job_id: 3,
        };
        answer(9, &req, &[], &mut s, &mut out);
        assert_eq!(
            out,
            [
                ToManager::Reply {
                    id: 9,
                    result: Ok(Response::Empty)
                },
                ToManager::Event(Event::JobStateChanged {
                    job_id: 3,
                    state: "running".into()
                }),
                ToManager::Event(Event::JobDone {
                    job_id: 3,
                    result: "done".into()
                }),
            ]
        );
    }

    #[test]
    fn list_units_comes_in_parts_and_every_row_once() {
        let rows = AgentConfig::unit_rows(ROWS_PER_PART * 2 + 5);
        let mut s = SessionState::new(1, &rows, &[]);
        let mut out = Vec::new();
        answer(4, &Request::ListUnits, &rows, &mut s, &mut out);
        assert_eq!(out.len(), 3);
        let mut got = Vec::new();
        for (i, msg) in out.into_iter().enumerate() {
            match msg {
                ToManager::ReplyPart {
                    id: 4,
                    part: Response::Units(r),
                } if i < 2 => got.extend(r),
                ToManager::Reply {
                    id: 4,
                    result: Ok(Response::Units(r)),
                } if i == 2 => got.extend(r),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(got, rows);
        let mut out = Vec::new();
        answer(5, &Request::ListUnits, &[], &mut s, &mut out);
        assert_eq!(
            out,
            [ToManager::Reply {
                id: 5,
                result: Ok(Response::Units(vec![]))
            }]
        );
    }

    #[test]
    fn subscribing_replays_loaded_units_virtually_before_the_reply() {
        let rows = AgentConfig::unit_rows(2);
        let mut s = SessionState::new(1, &rows, &[]);
        let mut out = Vec::new();
        answer(
            1,
            &Request::Subscribe { unit: None },
            &rows,
            &mut s,
            &mut out,
        );
        assert_eq!(out.len(), 5, "{out:?}");
        assert!(matches!(out[4], ToManager::Reply { id: 1, .. }));
        assert_eq!(s.index, 4, "tags 1..=4 used");
        out.clear();
        let one = Request::Subscribe {
            unit: Some(UnitName::new("fleet-1.service").unwrap()),
        };
        answer(2, &one, &rows, &mut s, &mut out);
        assert_eq!(out.len(), 3);
        out.clear();
        let unknown = Request::Subscribe {
            unit: Some(UnitName::new("other.service").unwrap()),
        };
        answer(3, &unknown, &rows, &mut s, &mut out);
        assert_eq!(out.len(), 1, "an unknown unit is not replayed");
        out.clear();
        let narrowed = Request::SubscribeState {
            unit: UnitName::new("fleet-1.service").unwrap(),
        };
        answer(4, &narrowed, &rows, &mut s, &mut out);
        assert_eq!(out.len(), 1, "a new scope is not replayed: {out:?}");
        out.clear();
        let state_only = Request::SubscribeState {
            unit: UnitName::new("fleet-0.service").unwrap(),
        };
        answer(5, &state_only, &rows, &mut s, &mut out);
        assert_eq!(out.len(), 3, "a new subscription for the state is: {out:?}");
    }

    #[test]
    fn send_times_round_trip_through_the_sub_state() {
        assert_eq!(sent_at_us("t12345"), Some(12345));
        assert_eq!(sent_at_us("running"), None);
        assert_eq!(sent_at_us("t"), None);
    }
}
