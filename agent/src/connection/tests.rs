//! Link tests against an in-process fake manager on a real TCP loopback
//! socket, built from the protocol crate's manager-side handshake.

use super::report::notify_failure;
use super::session::write_loop;
use super::*;
use crate::fanout::pump_events;
use crate::link::outbox::SessionKill;
use crate::notify;
use crate::state::Shared;
use crate::systemd::api::Systemd;
use crate::systemd::fake::{FakeSystemd, Script};
use drover_protocol::handshake::Accepted;
use drover_protocol::link::{ManagerFramed, manager_read_hello};
use drover_protocol::{Hello, NodeName, RefuseReason, ToAgent, ToManager};
use drover_protocol::{JobKind, Request, Response};
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(5);

struct FakeManager {
    listener: TcpListener,
}

impl FakeManager {
    async fn bind() -> Self {
        Self {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    async fn hello(&self) -> (drover_protocol::link::PendingAgent<TcpStream>, Hello) {
        let (sock, _) = tokio::time::timeout(T, self.listener.accept())
            .await
            .expect("agent connects")
            .unwrap();
        manager_read_hello(sock, T).await.unwrap()
    }

    async fn accept(&self, session_id: u64) -> ManagerFramed<TcpStream> {
        self.accept_announcing(session_id, 1000, 0).await
    }

    /// Accepts announcing the manager's heartbeat interval and threshold.
    async fn accept_announcing(
        &self,
        session_id: u64,
        heartbeat_interval_ms: u64,
        heartbeat_threshold_ms: u64,
    ) -> ManagerFramed<TcpStream> {
        let (pending, hello) = self.hello().await;
        assert_eq!(hello.node, "node-a");
        let accepted = Accepted {
            session_id,
            heartbeat_interval_ms,
            heartbeat_threshold_ms,
            manager_version: "fake".into(),
            resync_interval_ms: 0,
            epoch: 0,
        };
        pending.accept(accepted, T).await.unwrap()
    }
}

struct Agent {
    fake: FakeSystemd,
    state: watch::Receiver<LinkState>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Agent {
    async fn start(port: u16, tweak: impl FnOnce(&mut LinkConfig)) -> Self {
        let mut cfg = LinkConfig::new(NodeName::new("node-a").unwrap(), "localhost", port);
        cfg.heartbeat_interval = Duration::from_millis(50);
        cfg.heartbeat_threshold = Duration::ZERO;
        cfg.connect_timeout = Duration::from_secs(2);
        tweak(&mut cfg);
        let fake = FakeSystemd::new();
        let shared = Arc::new(Shared::default());
        let events = fake.subscribe().await.unwrap();
        tokio::spawn(pump_events(events, shared.clone(), Arc::new(fake.clone())));
        let link = Arc::new(Link::new(cfg, Arc::new(fake.clone()), shared));
        let state = link.watch();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move { link.run(token).await });
        Self {
            fake,
            state,
            shutdown,
            task,
        }
    }

    async fn wait_for(&mut self, want: impl Fn(&LinkState) -> bool) -> LinkState {
        tokio::time::timeout(T, self.state.wait_for(|s| want(s)))
            .await
            .expect("link reaches the state in time")
            .unwrap()
            .clone()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(T, self.task)
            .await
            .expect("link stops in time")
            .unwrap();
        assert_eq!(*self.state.borrow(), LinkState::Stopped);
    }
}

/// The next non-heartbeat message from the agent.
async fn next_msg(m: &mut ManagerFramed<TcpStream>) -> ToManager {
    loop {
        let msg = tokio::time::timeout(T, m.next())
            .await
            .expect("agent sends")
            .expect("open")
            .unwrap();
        if msg != ToManager::Heartbeat {
            return msg;
        }
    }
}

/// Reads until the agent closes the connection; panics if it does not in time.
async fn wait_closed(m: &mut ManagerFramed<TcpStream>) {
    let deadline = Instant::now() + T;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, m.next()).await {
            Err(_) => panic!("the agent did not close the link"),
            Ok(None) | Ok(Some(Err(_))) => return,
            Ok(Some(Ok(_))) => {}
        }
    }
}

fn is_connected(s: &LinkState) -> bool {
    matches!(s, LinkState::Connected { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_requests_and_sends_heartbeats() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    agent
        .fake
        .add_unit("a.service", Script::Finish("done".into()));
    let mut m = mgr.accept(7).await;
    assert_eq!(
        agent.wait_for(is_connected).await,
        LinkState::Connected {
            epoch: 1,
            session_id: 7
        }
    );

    // Heartbeats come on their own.
    let hb = tokio::time::timeout(T, m.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(hb, ToManager::Heartbeat);

    let unit = drover_protocol::UnitName::new("a.service").unwrap();
    let start = Request::UnitJob {
        kind: JobKind::Start,
        unit,
        mode: "replace".into(),
        job_id: 1,
    };
    m.send(ToAgent::Request { id: 1, body: start })
        .await
        .unwrap();
    assert_eq!(
        next_msg(&mut m).await,
        ToManager::Reply {
            id: 1,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(
        next_msg(&mut m).await,
        ToManager::Event(drover_protocol::Event::JobStateChanged {
            job_id: 1,
            state: "running".into()
        })
    );
    assert_eq!(
        next_msg(&mut m).await,
        ToManager::Event(drover_protocol::Event::JobDone {
            job_id: 1,
            result: "done".into()
        })
    );
    agent.stop().await;
    // Polite close: the manager reads EOF, not a reset.
    match tokio::time::timeout(T, async {
        loop {
            match m.next().await {
                Some(Ok(ToManager::Heartbeat)) => continue,
                other => return other,
            }
        }
    })
    .await
    {
        Ok(None) => {}
        other => panic!("expected a clean EOF, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_systemd_call_blocks_neither_heartbeats_nor_other_requests() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    let mut m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    agent.fake.set_call_delay(Duration::from_millis(1500));
    m.send(ToAgent::Request {
        id: 1,
        body: Request::ListUnits,
    })
    .await
    .unwrap();
    // Answered without asking systemd (the level is checked first).
    let quick = Request::SetLogLevel {
        level: "bogus".into(),
    };
    m.send(ToAgent::Request { id: 2, body: quick })
        .await
        .unwrap();
    let sent = Instant::now();
    let mut heartbeats = 0;
    let mut order = Vec::new();
    while order.len() < 2 {
        match tokio::time::timeout(T, m.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            ToManager::Heartbeat => heartbeats += 1,
            ToManager::Reply { id, .. } => order.push((id, sent.elapsed())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(order[0].0, 2, "the quick request is answered first");
    assert!(
        order[0].1 < Duration::from_millis(1000),
        "quick reply took {:?}",
        order[0].1
    );
    assert_eq!(order[1].0, 1);
    assert!(
        heartbeats >= 3,
        "heartbeats kept flowing during the slow call: {heartbeats}"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_request_id_gets_one_reply() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    let mut m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    agent.fake.set_call_delay(Duration::from_millis(300));
    m.send(ToAgent::Request {
        id: 5,
        body: Request::Reload,
    })
    .await
    .unwrap();
    m.send(ToAgent::Request {
        id: 5,
        body: Request::Reload,
    })
    .await
    .unwrap();
    assert!(matches!(
        next_msg(&mut m).await,
        ToManager::Reply {
            id: 5,
            result: Ok(Response::Empty)
        }
    ));
    // Nothing but heartbeats for a while: no second reply.
    let quiet = tokio::time::timeout(Duration::from_millis(700), next_msg(&mut m)).await;
    assert!(quiet.is_err(), "a second reply arrived: {quiet:?}");
    assert_eq!(
        agent.fake.calls().iter().filter(|c| *c == "Reload").count(),
        1
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusal_is_retried_until_accepted() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    let (pending, hello) = mgr.hello().await;
    assert_eq!(hello.node, "node-a");
    assert_eq!(hello.agent_version, AGENT_VERSION);
    pending
        .refuse(
            RefuseReason::UnknownNode,
            "node-a is not in AllowedNodeNames",
            T,
        )
        .await;
    agent
        .wait_for(|s| matches!(s, LinkState::Connecting { failures: 1 }))
        .await;
    let _m = mgr.accept(2).await;
    assert_eq!(
        agent.wait_for(is_connected).await,
        LinkState::Connected {
            epoch: 1,
            session_id: 2
        }
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_manager_drops_the_link() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    let m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    drop(m);
    let before = Instant::now();
    let _m2 = mgr.accept(2).await;
    let took = before.elapsed();
    assert_eq!(
        agent
            .wait_for(|s| s
                == &LinkState::Connected {
                    epoch: 2,
                    session_id: 2
                })
            .await
            .clone(),
        LinkState::Connected {
            epoch: 2,
            session_id: 2
        }
    );
    assert!(
        took < Duration::from_secs(2),
        "first retry is quick, took {took:?}"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_manager_is_dropped_after_the_threshold() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| {
        c.heartbeat_threshold = Duration::from_millis(300)
    })
    .await;
    let mut m = mgr.accept(1).await;
    let connected_at = Instant::now();
    agent.wait_for(is_connected).await;
    // The fake manager never sends anything: the agent must give up on it.
    wait_closed(&mut m).await;
    let after = connected_at.elapsed();
    assert!(
        after >= Duration::from_millis(250),
        "dropped too early: {after:?}"
    );
    let _m2 = mgr.accept(2).await;
    agent
        .wait_for(|s| matches!(s, LinkState::Connected { epoch: 2, .. }))
        .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_heartbeats_keep_the_link_up() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| {
        c.heartbeat_threshold = Duration::from_millis(300)
    })
    .await;
    let mut m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    for _ in 0..10 {
        m.send(ToAgent::Heartbeat).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        *agent.state.borrow(),
        LinkState::Connected {
            epoch: 1,
            session_id: 1
        }
    );
    agent.stop().await;
}

/// Counts the agent's heartbeats for `span` of the fake manager's time;
/// panics if the agent closes the link meanwhile.
async fn heartbeats_during(m: &mut ManagerFramed<TcpStream>, span: Duration) -> usize {
    let until = tokio::time::Instant::now() + span;
    let mut beats = 0;
    loop {
        match tokio::time::timeout_at(until, m.next()).await {
            Err(_) => return beats,
            Ok(None) | Ok(Some(Err(_))) => panic!("the agent dropped the link"),
            Ok(Some(Ok(ToManager::Heartbeat))) => beats += 1,
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// Issue 14.1: a manager with `HeartbeatInterval=0` sends nothing; the
/// agent's own threshold must not drop it for that silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_announces_no_heartbeats_is_not_dropped_for_silence() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| {
        c.heartbeat_threshold = Duration::from_millis(200)
    })
    .await;
    let mut m = mgr.accept_announcing(1, 0, 0).await;
    agent.wait_for(is_connected).await;
    // Five thresholds of silence from the manager; the link stays.
    let beats = heartbeats_during(&mut m, Duration::from_millis(1000)).await;
    assert!(beats >= 5, "the agent keeps sending its own: {beats}");
    assert_eq!(
        *agent.state.borrow(),
        LinkState::Connected {
            epoch: 1,
            session_id: 1
        }
    );
    agent.stop().await;
}

/// Issue 14.1: a manager heartbeating every 300 ms keeps an agent whose
/// configured threshold (150 ms) is shorter than that interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_silence_threshold_follows_the_announced_interval() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| {
        c.heartbeat_threshold = Duration::from_millis(150)
    })
    .await;
    let mut m = mgr.accept_announcing(1, 300, 0).await;
    agent.wait_for(is_connected).await;
    for _ in 0..5 {
        heartbeats_during(&mut m, Duration::from_millis(300)).await;
        m.send(ToAgent::Heartbeat).await.unwrap();
    }
    assert_eq!(
        *agent.state.borrow(),
        LinkState::Connected {
            epoch: 1,
            session_id: 1
        }
    );
    // And a manager silent for longer than three of its intervals is dropped.
    wait_closed(&mut m).await;
    agent.stop().await;
}

/// Issue 14.1: an agent with `HeartbeatInterval=0` still feeds a manager
/// that drops silent nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_an_interval_feeds_a_watching_manager() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| c.heartbeat_interval = Duration::ZERO).await;
    let mut m = mgr.accept_announcing(1, 0, 300).await;
    agent.wait_for(is_connected).await;
    let beats = heartbeats_during(&mut m, Duration::from_millis(600)).await;
    assert!(beats >= 3, "heartbeats every 100 ms expected, got {beats}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_the_manager_drops_the_link_and_reconnects() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |_| {}).await;
    let m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    // A well-framed body that is not a message, then a frame header far over the cap.
    let mut raw = m.into_inner();
    raw.write_all(&[0, 0, 0, 3, 0xff, 0xfe, 0xfd])
        .await
        .unwrap();
    let _m2 = mgr.accept(2).await;
    agent
        .wait_for(|s| matches!(s, LinkState::Connected { epoch: 2, .. }))
        .await;
    let mut raw2 = _m2.into_inner();
    raw2.write_all(&[0xff, 0xff, 0xff, 0xff]).await.unwrap();
    let _m3 = mgr.accept(3).await;
    agent
        .wait_for(|s| matches!(s, LinkState::Connected { epoch: 3, .. }))
        .await;
    agent.stop().await;
}

/// The first connection's peer answers the hello with `answer` and keeps the
/// connection open: the agent counts a failed attempt (within [`T`]), then
/// registers with the real fake manager on its retry.
async fn a_failed_attempt_then_registered(answer: &[u8], connect_timeout: Duration) {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| c.connect_timeout = connect_timeout).await;
    let (mut sock, _) = tokio::time::timeout(T, mgr.listener.accept())
        .await
        .unwrap()
        .unwrap();
    sock.write_all(answer).await.unwrap();
    agent
        .wait_for(|s| matches!(s, LinkState::Connecting { failures: 1 }))
        .await;
    drop(sock);
    let _m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_a_welcome_is_a_failed_attempt() {
    a_failed_attempt_then_registered(b"HTTP/1.1 400 Bad Request\r\n\r\n", Duration::from_secs(2))
        .await;
}

/// A peer posing as the manager announces a 1 MiB answer (a frame the
/// session's codec would take) and sends nothing more: the agent refuses it
/// from the header at once — it does not wait for, or make room for, the
/// body — and retries as after any failed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_welcome_is_a_failed_attempt_at_once() {
    let announced = u32::try_from(drover_protocol::MAX_FRAME_LEN).unwrap();
    // A handshake timeout far beyond the helper's wait: only the header can end it.
    a_failed_attempt_then_registered(&announced.to_be_bytes(), 10 * T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_stops_reading_is_dropped_not_buffered() {
    let mgr = FakeManager::bind().await;
    // Few requests in flight: the ones running when the session dies still
    // build their replies (dropped), and 64 of them (the default) are seconds
    // of CPU in a debug build, which delayed the reconnection under load.
    let mut agent = Agent::start(mgr.port(), |c| {
        c.outbox_capacity = 4;
        c.max_in_flight = 4;
    })
    .await;
    // Big replies fill the socket buffers quickly.
    for n in 0..3000 {
        agent.fake.add_unit(
            &format!("unit-with-a-rather-long-name-{n:05}.service"),
            Script::Hang,
        );
    }
    let mut m = mgr.accept(1).await;
    agent.wait_for(is_connected).await;
    for id in 0..200 {
        m.send(ToAgent::Request {
            id,
            body: Request::ListUnits,
        })
        .await
        .unwrap();
    }
    // The manager never reads; the agent must give up on this link and come back.
    let _m2 = mgr.accept(2).await;
    agent
        .wait_for(|s| matches!(s, LinkState::Connected { epoch: 2, .. }))
        .await;
    agent.stop().await;
}

/// A TLS "manager" whose certificate the agent must refuse: it only counts
/// what its handshakes ended with.
async fn rogue_manager(settings: drover_tls::ServerSettings) -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = drover_tls::Acceptor::new(settings);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let outcome = match acceptor.accept(sock).await {
                Ok(_) => "handshake completed".to_string(),
                Err(e) => e.to_string(),
            };
            let _ = tx.send(outcome).await;
        }
    });
    (port, rx)
}

#[tokio::test]
async fn refuses_a_manager_certified_for_another_name_or_by_another_ca() {
    use drover_tls::pki::{Options, Pki, Validity};
    let tmp = drover_testkit::process::TempDir::new("drover-agent-tls");
    let opts = Options {
        validity: Validity::days(1).unwrap(),
        force: false,
    };
    let fleet = Pki::new(tmp.join("fleet"));
    fleet.create_ca(&opts).unwrap();
    fleet.issue_manager(&["manager.example"], &opts).unwrap();
    let me = NodeName::new("node-a").unwrap();
    fleet.issue_node(&me, &opts).unwrap();
    let rogue = Pki::new(tmp.join("rogue"));
    rogue.create_ca(&opts).unwrap();
    rogue.issue_manager(&["127.0.0.1"], &opts).unwrap();

    let cases = [
        (
            "a fleet certificate for another name",
            drover_tls::ServerSettings::load(&fleet.manager_files()).unwrap(),
        ),
        (
            "a certificate for 127.0.0.1 from another CA",
            drover_tls::ServerSettings::load(&rogue.manager_files()).unwrap(),
        ),
    ];
    for (case, settings) in cases {
        let (port, mut outcomes) = rogue_manager(settings).await;
        let client = drover_tls::ClientSettings::load(&fleet.node_files(&me)).unwrap();
        let connector = drover_tls::Connector::new(client, "127.0.0.1").unwrap();
        let mut agent = Agent::start(port, |c| {
            c.host = "127.0.0.1".into();
            c.tls = Some(connector);
        })
        .await;
        // Two attempts, both refused by the agent (the manager sees the
        // agent's alert), never connected.
        for _ in 0..2 {
            let seen = tokio::time::timeout(T, outcomes.recv())
                .await
                .expect("the agent dials")
                .unwrap();
            assert!(seen.contains("alert"), "{case}: {seen}");
        }
        let state = agent
            .wait_for(|s| matches!(s, LinkState::Connecting { failures } if *failures >= 2))
            .await;
        assert!(matches!(state, LinkState::Connecting { .. }), "{case}");
        agent.stop().await;
    }
}

/// Issue 14.2, agent side: one message over the frame cap is dropped by the
/// writer, and the messages after it still reach the manager on the same link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_dropped_not_the_link() {
    use drover_protocol::link::AgentFramed;
    use tokio_util::codec::Framed;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let agent_end: AgentFramed<LinkStream> =
        Framed::new(Box::new(client), drover_protocol::FrameCodec::default());
    let mut manager_end: ManagerFramed<TcpStream> =
        Framed::new(server, drover_protocol::FrameCodec::default());
    let (sink, _stream) = agent_end.split();
    let (tx, rx) = mpsc::channel(4);
    let kill = SessionKill::new();
    let writer = tokio::spawn(write_loop(sink, rx, kill.clone()));
    let huge = ToManager::Reply {
        id: 1,
        result: Err(drover_protocol::RemoteError::failed("x".repeat(2 << 20))),
    };
    tx.send(huge).await.unwrap();
    tx.send(ToManager::Heartbeat).await.unwrap();
    let next = tokio::time::timeout(T, manager_end.next())
        .await
        .expect("the next message arrives")
        .expect("open")
        .unwrap();
    assert_eq!(next, ToManager::Heartbeat);
    assert_eq!(kill.reason(), None, "the session was not killed");
    drop(tx);
    tokio::time::timeout(T, writer).await.unwrap().unwrap();
}

/// `TCP_USER_TIMEOUT` (ms) of this process's TCP socket whose local
/// address is `local` (the agent's end of a link to the fake manager).
#[allow(unsafe_code)]
fn user_timeout_of(local: SocketAddr) -> Option<u32> {
    use nix::sys::socket::{SockaddrIn, getsockname, getsockopt, sockopt};
    let SocketAddr::V4(local) = local else {
        panic!("the fake manager listens on IPv4")
    };
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(addr) = getsockname::<SockaddrIn>(fd) else {
            continue;
        };
        if std::net::SocketAddrV4::from(addr) != local {
            continue;
        }
        // SAFETY: `fd` is this process's descriptor found just above; it is
        // only borrowed for one getsockopt, which fails harmlessly (EBADF,
        // ENOTSOCK) should the number have been closed or reused meanwhile.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        return getsockopt(&borrowed, sockopt::TcpUserTimeout).ok();
    }
    None
}

/// The agent's heartbeats are its probes of the manager (protocol 5): its
/// socket gives up on data the manager's host does not acknowledge within
/// the threshold less one send interval, so a vanished manager host is
/// found within the threshold even when the manager sends no heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_socket_gives_up_on_unacknowledged_heartbeats_within_the_threshold() {
    let mgr = FakeManager::bind().await;
    let mut agent = Agent::start(mgr.port(), |c| {
        c.heartbeat_interval = Duration::from_millis(2000);
        c.heartbeat_threshold = Duration::from_millis(6000);
    })
    .await;
    let m = mgr.accept_announcing(1, 0, 6000).await;
    agent.wait_for(is_connected).await;
    let local = m.get_ref().peer_addr().unwrap();
    assert_eq!(user_timeout_of(local), Some(4000));
    agent.stop().await;

    // A threshold of 0 turns the check off: the kernel's default stays.
    let mut agent = Agent::start(mgr.port(), |c| c.heartbeat_threshold = Duration::ZERO).await;
    let m = mgr.accept_announcing(1, 0, 6000).await;
    agent.wait_for(is_connected).await;
    let local = m.get_ref().peer_addr().unwrap();
    assert_eq!(user_timeout_of(local), Some(0));
    agent.stop().await;
}

/// A refused certificate is a refusal in `systemctl status`, not an
/// unreachable manager; a truncated TLS stream is a closed connection.
#[test]
fn status_and_session_end_name_what_happened() {
    let refused = ConnectError::CertificateRefused {
        addr: SocketAddr::from(([192, 0, 2, 10], 842)),
        why: "the manager refused this node's certificate: it is revoked".into(),
    };
    let (kind, why) = notify_failure(&refused);
    assert_eq!(
        notify::retry_line("m:842", &kind.with(&why), Duration::from_secs(2)),
        "refused by the manager at m:842 (the manager refused this node's certificate: it is \
         revoked), retrying in 2.0s"
    );
    let eof = std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "peer closed connection without sending TLS close_notify",
    );
    assert_eq!(
        SessionEnd::from_read_error(drover_protocol::FrameError::Io(eof)),
        SessionEnd::Closed
    );
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert!(matches!(
        SessionEnd::from_read_error(drover_protocol::FrameError::Io(reset)),
        SessionEnd::Broken(_)
    ));
    assert!(matches!(
        SessionEnd::from_read_error(drover_protocol::FrameError::Truncated),
        SessionEnd::Malformed(_)
    ));
}
