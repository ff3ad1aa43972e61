//! A simulated agent that knows every manager of a high-availability group
//! (`ControllerHost=` with a list, docs/ha.md), for `drover-bench failover`.
//!
//! It follows the real agent's handshake and rules:
//!
//! * one dialer per manager, each on a connection of its own from the
//!   agent's own source address ([`agent::source_ip`]); a standby's answer
//!   `parked: …` keeps the link open and the dialer waits on it, without a
//!   deadline, for the manager's next welcome (`ParkedLink::verdict`);
//! * every welcome is judged by the agent's own [`Follow`]: a lower epoch
//!   than the highest seen is refused, a higher one than the session's
//!   replaces the session (the old one ends), the first one is taken;
//! * a session answers the manager's requests with [`agent::answer`] and
//!   beats as `drover_agent::link::heartbeat::negotiate` says; when it ends,
//!   its dialer dials again after the agent's own [`Backoff`].
//!
//! What it records ([`Followers`]): per agent, the epoch of its session and
//! when it took it, and which managers hold it parked now. The agents run
//! in processes of their own ([`agents_main`], at most [`PER_PROCESS`]
//! each: two links an agent, and a process may hold 20,000 descriptors on
//! the machine of docs/performance.md), which tell the bench every
//! [`Event`] on their stdout, one line each, times on [`now_us`].

use super::agent::{self, SessionState, node_name, source_ip};
use drover_agent::connection::Backoff;
use drover_agent::link::follow::{Follow, Verdict};
use drover_protocol::handshake::Accepted;
use drover_protocol::link::{AgentFramed, Answer, agent_hello};
use drover_protocol::{Hello, ToAgent, ToManager, UnitInfo};
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// What every follower of one run shares.
pub struct FollowConfig {
    /// The managers, in the order of the agents' list.
    pub managers: Vec<SocketAddr>,
    pub heartbeat_interval: Duration,
    pub heartbeat_threshold: Duration,
    /// TCP connect and hello (a parked link then waits without one).
    pub connect_timeout: Duration,
    /// The node's loaded units (what `ListUnits` returns).
    pub units: Arc<Vec<UnitInfo>>,
}

/// Microseconds since the Unix epoch (`CLOCK_REALTIME`): the one clock the
/// bench and its agent processes share. A run's intervals last seconds, in
/// which the clock is only slewed, never stepped, on a host kept by NTP.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What an agent did, as its process tells the bench (one line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Agent `index` took a session of `epoch` at `at_us` ([`now_us`]).
    Took {
        index: usize,
        epoch: u64,
        at_us: u64,
    },
    /// Agent `index`'s session ended.
    Ended { index: usize },
    /// A link was parked on manager `which` (`true`) or left it (`false`).
    Parked { which: usize, on: bool },
    /// A welcome refused for a lower epoch than the highest seen.
    RefusedLower,
}

impl Event {
    /// The line that carries it.
    pub fn line(&self) -> String {
        match self {
            Event::Took {
                index,
                epoch,
                at_us,
            } => format!("T {index} {epoch} {at_us}"),
            Event::Ended { index } => format!("E {index}"),
            Event::Parked { which, on } => format!("P {which} {}", u8::from(*on)),
            Event::RefusedLower => "R".into(),
        }
    }

    /// The event of a line; `None` for anything else.
    pub fn parse(line: &str) -> Option<Event> {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        let mut num = || words.next()?.parse::<u64>().ok();
        let ev = match kind {
            "T" => Event::Took {
                index: usize::try_from(num()?).ok()?,
                epoch: num()?,
                at_us: num()?,
            },
            "E" => Event::Ended {
                index: usize::try_from(num()?).ok()?,
            },
            "P" => Event::Parked {
                which: usize::try_from(num()?).ok()?,
                on: num()? == 1,
            },
            "R" => Event::RefusedLower,
            _ => return None,
        };
        Some(ev)
    }
}

/// Per agent: its session's epoch (0: none) and when it took it; links
/// parked on each manager. Fed by the agents of this process (which also
/// send every [`Event`] to `sink`), or by [`Followers::apply`] with the
/// events of agent processes.
pub struct Followers {
    session_epoch: Vec<AtomicU64>,
    taken_at_us: Vec<AtomicU64>,
    parked: Vec<AtomicUsize>,
    /// Welcomes refused for a lower epoch than the highest seen.
    pub refused_lower: AtomicU64,
    sink: Option<mpsc::UnboundedSender<Event>>,
    pub stop: CancellationToken,
}

impl Followers {
    pub fn new(
        agents: usize,
        managers: usize,
        sink: Option<mpsc::UnboundedSender<Event>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            session_epoch: (0..agents).map(|_| AtomicU64::new(0)).collect(),
            taken_at_us: (0..agents).map(|_| AtomicU64::new(0)).collect(),
            parked: (0..managers).map(|_| AtomicUsize::new(0)).collect(),
            refused_lower: AtomicU64::new(0),
            sink,
            stop: CancellationToken::new(),
        })
    }

    /// Counts `ev` (an index or manager out of range is ignored).
    pub fn apply(&self, ev: &Event) {
        match *ev {
            Event::Took {
                index,
                epoch,
                at_us,
            } => {
                if let (Some(e), Some(t)) =
                    (self.session_epoch.get(index), self.taken_at_us.get(index))
                {
                    t.store(at_us, Ordering::Relaxed);
                    e.store(epoch, Ordering::Relaxed);
                }
            }
            Event::Ended { index } => {
                if let Some(e) = self.session_epoch.get(index) {
                    e.store(0, Ordering::Relaxed);
                }
            }
            Event::Parked { which, on } => {
                if let Some(p) = self.parked.get(which) {
                    if on {
                        p.fetch_add(1, Ordering::Relaxed);
                    } else {
                        p.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            Event::RefusedLower => {
                self.refused_lower.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn record(&self, ev: Event) {
        self.apply(&ev);
        if let Some(sink) = &self.sink {
            let _ = sink.send(ev);
        }
    }

    /// How many agents hold a session of epoch `epoch`.
    pub fn with_epoch(&self, epoch: u64) -> usize {
        self.session_epoch
            .iter()
            .filter(|e| e.load(Ordering::Relaxed) == epoch)
            .count()
    }

    /// Links parked on manager `which` now.
    pub fn parked_on(&self, which: usize) -> usize {
        self.parked
            .get(which)
            .map_or(0, |p| p.load(Ordering::Relaxed))
    }

    /// For every agent whose session has epoch `epoch`: when it took it,
    /// measured from `since_us` ([`now_us`]; zero if it took it before).
    pub fn taken_since(&self, epoch: u64, since_us: u64) -> Vec<Duration> {
        self.session_epoch
            .iter()
            .zip(&self.taken_at_us)
            .filter(|(e, _)| e.load(Ordering::Relaxed) == epoch)
            .map(|(_, t)| Duration::from_micros(t.load(Ordering::Relaxed).saturating_sub(since_us)))
            .collect()
    }
}

/// A welcome, from a dialer to its agent's loop.
struct Offer {
    framed: AgentFramed<TcpStream>,
    accepted: Accepted,
    /// Dropped when the agent is done with this link: the dialer dials again.
    _done: oneshot::Sender<()>,
}

/// Runs agent `index` (its dialers and its sessions) until the run stops.
pub async fn run(index: usize, cfg: Arc<FollowConfig>, all: Arc<Followers>) {
    let name = node_name(index);
    let (tx, mut offers) = mpsc::channel::<Offer>(cfg.managers.len());
    let mut dialers = Vec::new();
    for which in 0..cfg.managers.len() {
        dialers.push(tokio::spawn(dial(
            index,
            which,
            name.clone(),
            cfg.clone(),
            all.clone(),
            tx.clone(),
        )));
    }
    drop(tx);
    let mut follow = Follow::default();
    let mut current: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
    loop {
        tokio::select! {
            _ = all.stop.cancelled() => break,
            offer = offers.recv() => {
                let Some(offer) = offer else { break };
                let epoch = offer.accepted.epoch;
                match follow.offer(epoch) {
                    Verdict::Take => {}
                    Verdict::Keep { .. } => continue,
                    Verdict::Refuse { .. } => {
                        all.record(Event::RefusedLower);
                        continue;
                    }
                }
                // The newer leader: the old session ends first.
                if let Some((preempt, task)) = current.take() {
                    preempt.cancel();
                    let _ = task.await;
                }
                all.record(Event::Took { index, epoch, at_us: now_us() });
                let preempt = CancellationToken::new();
                let task = tokio::spawn(session(index, cfg.clone(), all.clone(), offer, preempt.clone()));
                current = Some((preempt, task));
            }
            _ = async {
                match current.as_mut() {
                    Some((_, task)) => { let _ = task.await; }
                    None => std::future::pending().await,
                }
            } => {
                current = None;
                follow.ended();
            }
        }
    }
    if let Some((preempt, task)) = current.take() {
        preempt.cancel();
        let _ = task.await;
    }
    for d in dialers {
        d.abort();
    }
}

/// One manager's dialer (see the module docs).
async fn dial(
    index: usize,
    which: usize,
    name: String,
    cfg: Arc<FollowConfig>,
    all: Arc<Followers>,
    offers: mpsc::Sender<Offer>,
) {
    let mut backoff = Backoff::new(cfg.heartbeat_interval.max(Duration::from_secs(1)));
    let hello = Hello::new(name.as_str(), agent::VERSION);
    while !all.stop.is_cancelled() {
        let attempt = tokio::time::timeout(cfg.connect_timeout, async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source_ip(index), 0))?;
            let stream = socket.connect(cfg.managers[which]).await?;
            let _ = stream.set_nodelay(true);
            agent_hello(stream, &hello, cfg.connect_timeout)
                .await
                .map_err(std::io::Error::other)
        })
        .await;
        let mut answer = match attempt {
            Ok(Ok(a)) => Ok(a),
            _ => Err(()),
        };
        // A parked link waits for its verdict.
        let welcomed = loop {
            match answer {
                Ok(Answer::Accepted(framed, accepted)) => break Some((framed, accepted)),
                Ok(Answer::Parked(link, _)) => {
                    backoff.reset();
                    all.record(Event::Parked { which, on: true });
                    let verdict = tokio::select! {
                        v = link.verdict() => Some(v),
                        _ = all.stop.cancelled() => None,
                    };
                    all.record(Event::Parked { which, on: false });
                    let Some(v) = verdict else { return };
                    answer = v.map_err(|_| ());
                }
                Err(()) => break None,
            }
        };
        if let Some((framed, accepted)) = welcomed {
            backoff.reset();
            let (done, finished) = oneshot::channel();
            let offer = Offer {
                framed,
                accepted,
                _done: done,
            };
            if offers.send(offer).await.is_err() {
                return;
            }
            let _ = finished.await;
        }
        tokio::select! {
            _ = all.stop.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// One session: answers requests, beats, until the link ends, a newer
/// leader preempts it or the run stops.
async fn session(
    index: usize,
    cfg: Arc<FollowConfig>,
    all: Arc<Followers>,
    offer: Offer,
    preempt: CancellationToken,
) {
    let Offer {
        mut framed,
        accepted,
        _done,
    } = offer;
    let (beats, mut beat) =
        agent::heartbeats(cfg.heartbeat_interval, cfg.heartbeat_threshold, &accepted);
    let mut last_heard = tokio::time::Instant::now();
    let mut state = SessionState::new(accepted.session_id, &cfg.units, &[]);
    let mut out: Vec<ToManager> = Vec::new();
    loop {
        tokio::select! {
            frame = framed.next() => {
                last_heard = tokio::time::Instant::now();
                match frame {
                    Some(Ok(ToAgent::Request { id, body })) => {
                        agent::answer(id, &body, &cfg.units, &mut state, &mut out);
                        for msg in out.drain(..) {
                            if framed.feed(msg).await.is_err() {
                                break;
                            }
                        }
                        if framed.flush().await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
            _ = beat.tick() => {
                if beats.silence.is_some_and(|s| last_heard.elapsed() > s) {
                    break;
                }
                if beats.send_every.is_some() && framed.send(ToManager::Heartbeat).await.is_err() {
                    break;
                }
            }
            _ = preempt.cancelled() => break,
            _ = all.stop.cancelled() => break,
        }
    }
    all.record(Event::Ended { index });
}

/// Agents a process runs at most (see the module docs).
pub const PER_PROCESS: usize = 5000;

/// `drover-bench failover-agents`: what the bench starts for each slice of
/// the fleet.
#[derive(clap::Parser, Debug)]
#[command(name = "drover-bench failover-agents", hide = true)]
struct AgentArgs {
    /// The first agent's index.
    #[arg(long)]
    first: usize,
    /// How many agents, from `--first`.
    #[arg(long)]
    count: usize,
    /// The managers' addresses, comma-separated, in the agents' order.
    #[arg(long, value_delimiter = ',')]
    managers: Vec<SocketAddr>,
    #[arg(long)]
    units: usize,
    #[arg(long)]
    heartbeat_ms: u64,
    #[arg(long)]
    threshold_ms: u64,
}

impl AgentArgs {
    /// The command line of the process that runs agents `first..first +
    /// count` of `cfg` (the word `failover-agents` first).
    fn argv(first: usize, count: usize, cfg: &FollowConfig) -> Vec<String> {
        let managers: Vec<String> = cfg.managers.iter().map(ToString::to_string).collect();
        vec![
            "failover-agents".into(),
            format!("--first={first}"),
            format!("--count={count}"),
            format!("--managers={}", managers.join(",")),
            format!("--units={}", cfg.units.len()),
            format!("--heartbeat-ms={}", cfg.heartbeat_interval.as_millis()),
            format!("--threshold-ms={}", cfg.heartbeat_threshold.as_millis()),
        ]
    }
}

/// The command line of the process that runs agents `first..first + count`
/// of `cfg` (without the program).
pub fn agents_argv(first: usize, count: usize, cfg: &FollowConfig) -> Vec<String> {
    AgentArgs::argv(first, count, cfg)
}

/// `failover-agents`: runs its agents until its stdin closes (the bench
/// ended or died), writing every [`Event`] to stdout.
pub async fn agents_main(argv: Vec<String>) -> anyhow::Result<()> {
    let Some(args) = super::cli::parse::<AgentArgs>(argv)? else {
        return Ok(());
    };
    super::daemon::raise_nofile(args.count as u64 * 2 + 1024)?;
    let cfg = Arc::new(FollowConfig {
        managers: args.managers,
        heartbeat_interval: Duration::from_millis(args.heartbeat_ms),
        heartbeat_threshold: Duration::from_millis(args.threshold_ms),
        connect_timeout: Duration::from_secs(10),
        units: Arc::new(super::AgentConfig::unit_rows(args.units)),
    });
    let (tx, mut events) = mpsc::unbounded_channel();
    let end = args.first + args.count;
    let all = Followers::new(end, cfg.managers.len(), Some(tx));
    let mut tasks = Vec::with_capacity(args.count);
    for index in args.first..end {
        tasks.push(tokio::spawn(run(index, cfg.clone(), all.clone())));
    }
    // Plain threads: stdout gets the events, stdin's end stops the run.
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        while let Some(ev) = events.blocking_recv() {
            writeln!(out, "{}", ev.line())?;
            while let Ok(ev) = events.try_recv() {
                writeln!(out, "{}", ev.line())?;
            }
            out.flush()?;
        }
        Ok(())
    });
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    tokio::select! {
        _ = closed => {}
        _ = tokio::task::spawn_blocking(move || writer.join()) => {}
    }
    all.stop.cancel();
    for t in tasks {
        t.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cross_the_pipe_and_garbage_is_no_event() {
        let all = [
            Event::Took {
                index: 7,
                epoch: 12,
                at_us: 1_700_000_000_000_000,
            },
            Event::Ended { index: 9_999 },
            Event::Parked { which: 1, on: true },
            Event::Parked {
                which: 0,
                on: false,
            },
            Event::RefusedLower,
        ];
        for ev in all {
            assert_eq!(Event::parse(&ev.line()), Some(ev));
        }
        for junk in [
            "",
            "T",
            "T 1 2",
            "T x 2 3",
            "E -1",
            "P 1",
            "Q 1",
            "T 1 2 99999999999999999999999",
        ] {
            assert_eq!(Event::parse(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn the_view_counts_sessions_parked_links_and_times() {
        let view = Followers::new(3, 2, None);
        view.apply(&Event::Took {
            index: 0,
            epoch: 5,
            at_us: 1_000,
        });
        view.apply(&Event::Took {
            index: 1,
            epoch: 5,
            at_us: 3_000,
        });
        view.apply(&Event::Took {
            index: 2,
            epoch: 4,
            at_us: 500,
        });
        view.apply(&Event::Parked { which: 1, on: true });
        view.apply(&Event::Parked { which: 1, on: true });
        view.apply(&Event::Parked {
            which: 1,
            on: false,
        });
        // Out of range: ignored, not a panic.
        view.apply(&Event::Took {
            index: 3,
            epoch: 5,
            at_us: 0,
        });
        view.apply(&Event::Parked { which: 2, on: true });
        assert_eq!(view.with_epoch(5), 2);
        assert_eq!(view.parked_on(1), 1);
        assert_eq!(view.parked_on(2), 0);
        let mut t = view.taken_since(5, 2_000);
        t.sort();
        assert_eq!(t, [Duration::ZERO, Duration::from_millis(1)]);
        view.apply(&Event::Ended { index: 0 });
        assert_eq!(view.with_epoch(5), 1);
    }
}
