//! [`FakeAgent`]: an agent that speaks drover's wire protocol to a real manager, with
//! scripted answers. It is what the manager's tests stand in for a node with, and the base
//! of a load generator that simulates many agents in one process (one task each).
//!
//! What it does, in the order of a session:
//! 1. **Handshake**: connects over TCP and sends its `Hello` with the node name; the
//!    manager's refusal is returned as the error ([`HandshakeError::Refused`]).
//! 2. **Heartbeats**: one every [`AgentOptions::heartbeat`] until [`FakeAgent::silence`]
//!    (a hung agent) or until it is dropped.
//! 3. **Requests**: each one is recorded, then answered with what its [`Behavior`] returns
//!    for it: zero or more messages, sent in order (a reply, job events, nothing at all).
//! 4. **Notices** from the manager (proxy news) are recorded.
//! 5. **Events** and anything else a test sends go out with [`FakeAgent::send`]; raw bytes
//!    that break the framing on purpose with [`FakeAgent::send_raw`].
//!
//! Dropping it closes the connection (the manager sees a disconnect). Waiting for what
//! arrived is event-driven ([`FakeAgent::wait_for`]): every request and notice wakes the
//! waiters, so no test polls on a timer.

use drover_protocol::handshake::Accepted;
use drover_protocol::link::{HandshakeError, agent_handshake};
use drover_protocol::{
    Event, Hello, ModTag, NodeName, Notice, Reason, RemoteError, Request, Response, ToAgent,
    ToManager, UnitName,
};
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::wait::WAIT;

/// What a fake agent answers to a request (given its correlation id): the messages to
/// send back, in order.
pub type Behavior = Arc<dyn Fn(u64, &Request) -> Vec<ToManager> + Send + Sync>;

/// Answers every request with an empty success.
pub fn reply_empty() -> Behavior {
    reply_with(|_| Ok(Response::Empty))
}

/// Answers nothing (a hung node).
pub fn never_reply() -> Behavior {
    Arc::new(|_, _| Vec::new())
}

/// Answers every request with exactly one reply: what `answer` says for it.
pub fn reply_with(
    answer: impl Fn(&Request) -> Result<Response, RemoteError> + Send + Sync + 'static,
) -> Behavior {
    Arc::new(move |id, req| {
        vec![ToManager::Reply {
            id,
            result: answer(req),
        }]
    })
}

/// Answers every request with an empty success, followed by the events `after` gives
/// for it (a job's progress and end, say).
pub fn reply_then(after: impl Fn(&Request) -> Vec<ToManager> + Send + Sync + 'static) -> Behavior {
    Arc::new(move |id, req| {
        let mut out = vec![reply_ok(id)];
        out.extend(after(req));
        out
    })
}

/// An empty success reply to request `id`.
pub fn reply_ok(id: u64) -> ToManager {
    ToManager::Reply {
        id,
        result: Ok(Response::Empty),
    }
}

/// `JobStateChanged` of manager job `job_id`.
pub fn job_state(job_id: u32, state: &str) -> ToManager {
    ToManager::Event(Event::JobStateChanged {
        job_id,
        state: state.into(),
    })
}

/// `JobDone` of manager job `job_id` with systemd's `result` word.
pub fn job_done(job_id: u32, result: &str) -> ToManager {
    ToManager::Event(Event::JobDone {
        job_id,
        result: result.into(),
    })
}

/// A real `UnitStateChanged` of `unit` tagged `(guid, index)`.
pub fn unit_state(guid: u64, index: u64, unit: &str, active: &str, sub: &str) -> ToManager {
    ToManager::Event(Event::UnitStateChanged {
        tag: ModTag::new(guid, index),
        unit: unit_name(unit),
        active_state: active.into(),
        sub_state: sub.into(),
        reason: Reason::Real,
    })
}

/// A valid node name (panics on a typo in the test).
pub fn node_name(s: &str) -> NodeName {
    NodeName::new(s).unwrap_or_else(|e| panic!("node name {s:?}: {e}"))
}

/// A valid unit name (panics on a typo in the test).
pub fn unit_name(s: &str) -> UnitName {
    UnitName::new(s).unwrap_or_else(|e| panic!("unit name {s:?}: {e}"))
}

/// What a fake agent's connection runs over: TCP, or TLS on TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// How a [`FakeAgent`] presents itself and how often it beats.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The agent version in the `Hello`.
    pub version: String,
    pub heartbeat: Duration,
    /// How long the handshake may take.
    pub handshake_timeout: Duration,
    /// Speak mutual TLS with this connector (its certificate is the agent's).
    pub tls: Option<drover_tls::Connector>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            version: "fake".into(),
            heartbeat: Duration::from_millis(100),
            handshake_timeout: WAIT,
            tls: None,
        }
    }
}

/// What a fake agent received from the manager, in arrival order.
#[derive(Debug, Default, Clone)]
pub struct Received {
    pub requests: Vec<Request>,
    /// One-way notices (proxies).
    pub notices: Vec<Notice>,
}

impl Received {
    /// How many requests equal `want`.
    pub fn count(&self, want: &Request) -> usize {
        self.requests.iter().filter(|r| *r == want).count()
    }
}

enum Injected {
    Message(ToManager),
    /// Raw bytes straight onto the socket.
    Raw(Vec<u8>),
}

/// See the module docs.
pub struct FakeAgent {
    task: JoinHandle<()>,
    received: Arc<Mutex<Received>>,
    /// Bumped on every request and notice; waiters watch it.
    changes: watch::Receiver<u64>,
    /// The manager's acceptance: session id (the guid of this session's tags), heartbeats.
    pub accepted: Accepted,
    inject: mpsc::Sender<Injected>,
    silent: Arc<AtomicBool>,
}

impl FakeAgent {
    /// Connects to the manager at `addr` as node `name` with the default options.
    pub async fn connect(
        addr: SocketAddr,
        name: &str,
        behavior: Behavior,
    ) -> Result<FakeAgent, HandshakeError> {
        Self::connect_with(addr, name, behavior, AgentOptions::default()).await
    }

    pub async fn connect_with(
        addr: SocketAddr,
        name: &str,
        behavior: Behavior,
        opts: AgentOptions,
    ) -> Result<FakeAgent, HandshakeError> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| HandshakeError::Frame(e.into()))?;
        let stream: Box<dyn Io> = match &opts.tls {
            None => Box::new(stream),
            Some(connector) => Box::new(
                tokio::time::timeout(opts.handshake_timeout, connector.connect(stream))
                    .await
                    .map_err(|_| HandshakeError::Timeout(opts.handshake_timeout))?
                    .map_err(|e| HandshakeError::Frame(e.into()))?,
            ),
        };
        let hello = Hello::new(name, opts.version.as_str());
        let (framed, accepted) = agent_handshake(stream, &hello, opts.handshake_timeout).await?;
        let received = Arc::new(Mutex::new(Received::default()));
        let silent = Arc::new(AtomicBool::new(false));
        let (changed, changes) = watch::channel(0u64);
        let (inject, mut injected) = mpsc::channel::<Injected>(64);
        let task = {
            let received = received.clone();
            let silent = silent.clone();
            let record = move |f: &dyn Fn(&mut Received)| {
                f(&mut received.lock().expect("received"));
                changed.send_modify(|n| *n += 1);
            };
            tokio::spawn(async move {
                let mut framed = framed;
                let mut beat = tokio::time::interval(opts.heartbeat);
                loop {
                    tokio::select! {
                        frame = framed.next() => match frame {
                            Some(Ok(ToAgent::Request { id, body })) => {
                                let answers = behavior(id, &body);
                                record(&|r| r.requests.push(body.clone()));
                                for answer in answers {
                                    if framed.send(answer).await.is_err() { return; }
                                }
                            }
                            Some(Ok(ToAgent::Heartbeat)) => {}
                            Some(Ok(ToAgent::Notice(n))) => record(&|r| r.notices.push(n.clone())),
                            _ => return,
                        },
                        msg = injected.recv() => match msg {
                            Some(Injected::Message(m)) => {
                                if framed.send(m).await.is_err() { return; }
                            }
                            Some(Injected::Raw(bytes)) => {
                                use tokio::io::AsyncWriteExt;
                                if framed.get_mut().write_all(&bytes).await.is_err() { return; }
                            }
                            None => return,
                        },
                        _ = beat.tick() => {
                            if !silent.load(Ordering::Relaxed)
                                && framed.send(ToManager::Heartbeat).await.is_err()
                            {
                                return;
                            }
                        }
                    }
                }
            })
        };
        Ok(FakeAgent {
            task,
            received,
            changes,
            accepted,
            inject,
            silent,
        })
    }

    /// [`Self::connect`], tried again every 50 ms while it fails (a manager still
    /// starting, or out of descriptors) until `timeout`; the last error otherwise.
    pub async fn connect_when_up(
        addr: SocketAddr,
        name: &str,
        behavior: Behavior,
        timeout: Duration,
    ) -> Result<FakeAgent, HandshakeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match Self::connect(addr, name, behavior.clone()).await {
                Ok(agent) => return Ok(agent),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The session id the manager gave (the guid of this session's modification tags).
    pub fn session_id(&self) -> u64 {
        self.accepted.session_id
    }

    /// Sends `msg` to the manager, after whatever was sent before.
    pub async fn send(&self, msg: ToManager) {
        self.inject
            .send(Injected::Message(msg))
            .await
            .expect("fake agent's connection alive");
    }

    /// Sends event `e`.
    pub async fn event(&self, e: Event) {
        self.send(ToManager::Event(e)).await;
    }

    /// A real `UnitStateChanged` of `unit`, tagged `(this session, index)`.
    pub async fn unit_state(&self, index: u64, unit: &str, active: &str, sub: &str) {
        let guid = self.session_id();
        self.send(unit_state(guid, index, unit, active, sub)).await;
    }

    /// A `UnitNew` of `unit`, tagged `(this session, index)`.
    pub async fn unit_new(&self, index: u64, unit: &str, reason: Reason) {
        let tag = ModTag::new(self.session_id(), index);
        let unit = unit_name(unit);
        self.event(Event::UnitNew { tag, unit, reason }).await;
    }

    /// Writes `bytes` straight onto the socket (to break the framing on purpose).
    pub async fn send_raw(&self, bytes: Vec<u8>) {
        self.inject
            .send(Injected::Raw(bytes))
            .await
            .expect("fake agent's connection alive");
    }

    /// Stops the heartbeats for good: a hung agent, as the manager sees it.
    pub fn silence(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }

    /// A copy of everything received so far.
    pub fn received(&self) -> Received {
        self.received.lock().expect("received").clone()
    }

    pub fn requests(&self) -> Vec<Request> {
        self.received().requests
    }

    pub fn request_count(&self) -> usize {
        self.received.lock().expect("received").requests.len()
    }

    /// How many requests equal `want`.
    pub fn count(&self, want: &Request) -> usize {
        self.received.lock().expect("received").count(want)
    }

    /// The latest request; panics if none came.
    pub fn last_request(&self) -> Request {
        self.requests()
            .pop()
            .expect("a request reached the fake agent")
    }

    pub fn notices(&self) -> Vec<Notice> {
        self.received().notices
    }

    /// Waits (up to [`WAIT`]) until what was received satisfies `cond`; checked at once
    /// and after every request and notice. Panics naming `what`, with what was received.
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&Received) -> bool) {
        let mut changes = self.changes.clone();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            changes.borrow_and_update();
            if cond(&self.received.lock().expect("received")) {
                return;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    // The session ended: nothing more will arrive.
                    if cond(&self.received.lock().expect("received")) {
                        return;
                    }
                    panic!(
                        "the fake agent's session ended before: {what}; received {:?}",
                        self.received()
                    );
                }
                Err(_) => panic!(
                    "timed out waiting for: {what}; received {:?}",
                    self.received()
                ),
            }
        }
    }

    /// Waits until request `want` has arrived.
    pub async fn wait_for_request(&self, want: &Request) {
        self.wait_for(&format!("request {want:?}"), |r| r.requests.contains(want))
            .await;
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}
