//! Cross-node dependencies on a real `systemd --user` node (built with the
//! sandbox's node pieces, so both cgroup layouts work), torn down in `Drop`,
//! also when an assertion fails:
//!
//! * the target side: `StartDep` / `StopDep` go through the dispatcher as the
//!   manager's would, and the reply is read from the outbox;
//! * the requesting side: the whole agent below a fake manager on TCP, with a
//!   proxy unit whose `ExecStart`/`ExecStop` call the local API with `busctl`
//!   (standing in for `drover-proxy`), and a unit bound to it.

use drover_agent::deps::unit_status;
use drover_agent::dispatch::{Dispatcher, Shared, pump_events};
use drover_agent::link::LinkConfig;
use drover_agent::outbox::SessionKill;
use drover_agent::systemd::Systemd;
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_bus::Bus;
use drover_protocol::handshake::Accepted;
use drover_protocol::link::manager_read_hello;
use drover_protocol::{
    Event, NodeName, Notice, Reason, RemoteError, Request, Response, TargetChange, ToAgent,
    ToManager, UnitName,
};
use drover_sandbox::cgroups::{Layout, SandboxCgroups};
use drover_sandbox::node;
use futures::{SinkExt, StreamExt};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "bar";

/// The dep template as shipped: its instance is the full target unit name
/// (the contract of `drover_agent::deps`).
const DEP_TEMPLATE: &str = include_str!("../../dist/usr/lib/systemd/system/drover-dep@.service");

struct Node {
    dir: PathBuf,
    cgroups: SandboxCgroups,
    child: Option<Child>,
}

impl Node {
    async fn start() -> Node {
        let layout = Layout::detect().expect("cgroup layout");
        let id = format!(
            "agent-deps-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        let dir = std::env::temp_dir().join(format!("drover-{id}"));
        let mut n = Node {
            dir: dir.clone(),
            cgroups: SandboxCgroups::for_id(&layout, &id),
            child: None,
        };
        n.cgroups.create_group(NODE).expect("node cgroup");
        node::prepare_dirs(&dir, NODE).expect("node dirs");
        let join = n.cgroups.join_spec(NODE).unwrap();
        let log = dir.join("systemd.log");
        let child = node::spawn(&layout, &join, &dir, NODE, log.clone()).expect("spawn node");
        let pid = child.id();
        n.child = Some(child);
        node::wait_ready(&dir, NODE, pid, &log, T)
            .await
            .expect("node ready");
        n
    }

    fn write_unit(&self, name: &str, text: &str) {
        std::fs::write(node::unit_dir(&self.dir, NODE).join(name), text).unwrap();
    }

    async fn systemd(&self) -> ZbusSystemd {
        ZbusSystemd::connect(&Bus::Address(node::bus_address(&self.dir, NODE)))
            .await
            .expect("systemd answers")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.cgroups.kill_all(Duration::from_secs(10)) {
            eprintln!("teardown: {e:#}");
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Err(e) = self.cgroups.remove(Duration::from_secs(5)) {
            eprintln!("teardown: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Rig {
    node: Node,
    systemd: Arc<ZbusSystemd>,
    dispatcher: Dispatcher<ZbusSystemd>,
    rx: mpsc::Receiver<ToManager>,
    next_id: u64,
}

impl Rig {
    async fn start() -> Rig {
        let node = Node::start().await;
        node.write_unit("drover-dep@.service", DEP_TEMPLATE);
        node.write_unit(
            "good.service",
            "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n",
        );
        node.write_unit(
            "bad.service",
            "[Service]\nType=oneshot\nExecStart=/bin/false\n",
        );
        // No ExecStart for a simple service: systemd refuses to load it.
        node.write_unit("typo.service", "[Service]\nType=simple\n");
        let systemd = Arc::new(node.systemd().await);
        systemd.reload().await.expect("daemon-reload");
        let shared = Arc::new(Shared::default());
        shared.deps.set_node(NodeName::new(NODE).unwrap());
        let events = systemd.subscribe().await.unwrap();
        tokio::spawn(pump_events(events, shared.clone(), systemd.clone()));
        let (tx, rx) = mpsc::channel(64);
        shared.outbox.open(1, tx, SessionKill::new());
        let dispatcher = Dispatcher::new(systemd.clone(), shared);
        Rig {
            node,
            systemd,
            dispatcher,
            rx,
            next_id: 0,
        }
    }

    /// Sends `req` as the manager would and returns its one reply.
    async fn ask(&mut self, req: Request) -> Result<Response, RemoteError> {
        self.next_id += 1;
        let id = self.next_id;
        tokio::time::timeout(T, self.dispatcher.handle(1, id, req))
            .await
            .expect("the request finishes in time");
        loop {
            match tokio::time::timeout(T, self.rx.recv()).await {
                Ok(Some(ToManager::Reply { id: got, result })) if got == id => return result,
                Ok(Some(_)) => continue,
                other => panic!("no reply: {other:?}"),
            }
        }
    }

    async fn active_state(&self, unit: &str) -> String {
        unit_status(&*self.systemd, unit)
            .await
            .unwrap()
            .active_state
    }

    async fn wait_state(&self, unit: &str, want: &str) {
        let deadline = Instant::now() + T;
        loop {
            let got = self.active_state(unit).await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{unit} is {got}, expected {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn start_dep(unit: &str) -> Request {
    Request::StartDep {
        unit: UnitName::new(unit).unwrap(),
    }
}

fn stop_dep(unit: &str) -> Request {
    Request::StopDep {
        unit: UnitName::new(unit).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_dep_starts_the_target_and_stop_dep_leaves_it_running() {
    let mut r = Rig::start().await;
    assert_eq!(r.active_state("good.service").await, "inactive");
    assert_eq!(r.ask(start_dep("good.service")).await, Ok(Response::Empty));
    // Replied after the job finished: both are up already.
    assert_eq!(r.active_state("good.service").await, "active");
    assert_eq!(
        r.active_state("drover-dep@good.service.service").await,
        "active"
    );
    // Asking again (a re-added reference) is fine.
    assert_eq!(r.ask(start_dep("good.service")).await, Ok(Response::Empty));

    assert_eq!(r.ask(stop_dep("good.service")).await, Ok(Response::Empty));
    r.wait_state("drover-dep@good.service.service", "inactive")
        .await;
    assert_eq!(
        r.active_state("good.service").await,
        "active",
        "the target itself keeps running"
    );
    // Stopping a dep that is not there is no error.
    assert_eq!(r.ask(stop_dep("other.service")).await, Ok(Response::Empty));

    // The dep goes down with its target (BindsTo=).
    assert_eq!(r.ask(start_dep("good.service")).await, Ok(Response::Empty));
    r.systemd
        .unit_job(drover_protocol::JobKind::Stop, "good.service", "replace")
        .await
        .unwrap();
    r.wait_state("drover-dep@good.service.service", "inactive")
        .await;
    drop(r.node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_dep_of_a_missing_broken_or_failing_unit_is_a_clear_error() {
    let mut r = Rig::start().await;
    let err = r.ask(start_dep("nope.service")).await.unwrap_err();
    assert_eq!(
        err.message, "unit nope.service on node bar cannot be started: not found",
        "{err}"
    );
    assert_eq!(err.name, "org.freedesktop.systemd1.NoSuchUnit");

    let err = r.ask(start_dep("typo.service")).await.unwrap_err();
    assert!(
        err.message.starts_with(
            "unit typo.service on node bar cannot be started: its unit file has a bad setting"
        ),
        "{err}"
    );

    let err = r.ask(start_dep("bad.service")).await.unwrap_err();
    assert_eq!(
        err.message,
        "unit bad.service on node bar cannot be started: it failed to start (failed/failed)",
        "{err}"
    );
    // Other unit types work too.
    r.node.write_unit("ok.target", "[Unit]\nDescription=ok\n");
    r.systemd.reload().await.unwrap();
    assert_eq!(r.ask(start_dep("ok.target")).await, Ok(Response::Empty));
    assert_eq!(r.active_state("ok.target").await, "active");
}

/// A proxy unit calling the local API the way `drover-proxy` does.
const PROXY_UNIT: &str = "[Unit]
StopWhenUnneeded=yes

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/busctl --user --timeout=60 call org.eclipse.bluechi.Agent /org/eclipse/bluechi org.eclipse.bluechi.Agent CreateProxy sss %n bar db.service
ExecStop=/usr/bin/busctl --user call org.eclipse.bluechi.Agent /org/eclipse/bluechi org.eclipse.bluechi.Agent RemoveProxy sss %n bar db.service
";

const NEED_DB: &str = "[Unit]
BindsTo=drover-proxy@bar_db.service
After=drover-proxy@bar_db.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
";

type ManagerEnd = drover_protocol::link::ManagerFramed<tokio::net::TcpStream>;

/// Accepts the agent's next connection as a fake manager.
async fn accept(listener: &tokio::net::TcpListener, session_id: u64) -> ManagerEnd {
    let (sock, _) = tokio::time::timeout(T, listener.accept())
        .await
        .expect("the agent connects")
        .unwrap();
    let (pending, hello) = manager_read_hello(sock, T).await.unwrap();
    assert_eq!(hello.node, "foo");
    let accepted = Accepted {
        session_id,
        heartbeat_interval_ms: 1000,
        heartbeat_threshold_ms: 0,
        manager_version: "fake".into(),
    };
    pending.accept(accepted, T).await.unwrap()
}

/// The next proxy event from the agent (heartbeats and others skipped).
async fn proxy_event(m: &mut ManagerEnd) -> Event {
    loop {
        match tokio::time::timeout(T, m.next()).await {
            Ok(Some(Ok(ToManager::Event(
                e @ (Event::ProxyNew { .. } | Event::ProxyRemoved { .. }),
            )))) => return e,
            Ok(Some(Ok(_))) => continue,
            other => panic!("expected a proxy event, got {other:?}"),
        }
    }
}

async fn tell(m: &mut ManagerEnd, proxy_id: u64, active: &str) {
    m.send(ToAgent::Notice(Notice::ProxyTarget {
        proxy_id,
        change: TargetChange::State {
            active_state: active.into(),
            sub_state: "x".into(),
            reason: Reason::Real,
        },
    }))
    .await
    .unwrap();
}

fn db_new(id: u64) -> Event {
    Event::ProxyNew {
        node: NodeName::new("bar").unwrap(),
        unit: UnitName::new("db.service").unwrap(),
        proxy_id: id,
    }
}

fn db_removed(id: u64) -> Event {
    Event::ProxyRemoved {
        node: NodeName::new("bar").unwrap(),
        unit: UnitName::new("db.service").unwrap(),
        proxy_id: id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_unit_follows_the_target_across_reconnects_and_shutdown() {
    let node = Node::start().await;
    node.write_unit("drover-proxy@.service", PROXY_UNIT);
    node.write_unit("need-db.service", NEED_DB);
    let systemd = Arc::new(node.systemd().await);
    systemd.reload().await.unwrap();
    let state = async |unit: &str| unit_status(&*systemd, unit).await.unwrap().active_state;
    let wait = async |unit: &str, want: &str| {
        let deadline = Instant::now() + T;
        loop {
            let got = state(unit).await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{unit} is {got}, expected {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let start = async |unit: &str| {
        systemd
            .unit_job(drover_protocol::JobKind::Start, unit, "replace")
            .await
            .unwrap();
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut link = LinkConfig::new(NodeName::new("foo").unwrap(), "127.0.0.1", port);
    link.heartbeat_interval = Duration::from_millis(100);
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn({
        let shutdown = shutdown.clone();
        let bus = Bus::Address(node::bus_address(&node.dir, NODE));
        async move { drover_agent::agent::run(&bus, link, shutdown, || {}).await }
    });
    let mut m = accept(&listener, 1).await;

    // 1. The target becomes active: the proxy, then need-db, start.
    start("need-db.service").await;
    let Event::ProxyNew { proxy_id: a, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    assert_eq!(
        state("need-db.service").await,
        "inactive",
        "waits for the proxy"
    );
    tell(&mut m, a, "active").await;
    wait("need-db.service", "active").await;
    assert_eq!(state("drover-proxy@bar_db.service").await, "active");

    // 2. A real failure of the target stops the proxy and its dependents.
    tell(&mut m, a, "failed").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(a));
    wait("drover-proxy@bar_db.service", "inactive").await;
    wait("need-db.service", "inactive").await;

    // 3. Started again; the manager goes away and comes back: the live
    //    proxy is announced again with the same id, and stays up meanwhile.
    start("need-db.service").await;
    let Event::ProxyNew { proxy_id: b, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    assert!(b > a, "ids are never reused");
    tell(&mut m, b, "active").await;
    wait("need-db.service", "active").await;
    drop(m);
    let mut m = accept(&listener, 2).await;
    assert_eq!(proxy_event(&mut m).await, db_new(b));
    assert_eq!(state("need-db.service").await, "active");

    // 4. Clean agent shutdown (`systemctl restart drover-agent`): the active
    //    proxy and need-db keep running, the manager is not told the proxy
    //    is gone, and the next agent adopts it and announces it again.
    shutdown.cancel();
    let ended = tokio::time::timeout(T, agent)
        .await
        .expect("agent stops")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    loop {
        match tokio::time::timeout(T, m.next()).await {
            Ok(Some(Ok(ToManager::Event(
                e @ (Event::ProxyNew { .. } | Event::ProxyRemoved { .. }),
            )))) => {
                panic!("a clean stop told the manager {e:?}")
            }
            Ok(Some(Ok(_))) => continue,
            Ok(None | Some(Err(_))) => break,
            Err(_) => panic!("the stopped agent's session did not end"),
        }
    }
    assert_eq!(state("need-db.service").await, "active");
    assert_eq!(state("drover-proxy@bar_db.service").await, "active");
    let shutdown = CancellationToken::new();
    let mut link = LinkConfig::new(NodeName::new("foo").unwrap(), "127.0.0.1", port);
    link.heartbeat_interval = Duration::from_millis(100);
    let agent = tokio::spawn({
        let shutdown = shutdown.clone();
        let bus = Bus::Address(node::bus_address(&node.dir, NODE));
        async move { drover_agent::agent::run(&bus, link, shutdown, || {}).await }
    });
    let mut m = accept(&listener, 3).await;
    let Event::ProxyNew { proxy_id: c, .. } = proxy_event(&mut m).await else {
        panic!("expected the adopted proxy");
    };
    assert_eq!(proxy_event_or_none(&mut m).await, None);
    // Adopted means followed: a real stop of the target still stops it.
    tell(&mut m, c, "inactive").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(c));
    wait("drover-proxy@bar_db.service", "inactive").await;
    wait("need-db.service", "inactive").await;
    shutdown.cancel();
    let ended = tokio::time::timeout(T, agent).await.expect("agent stops");
    assert!(ended.unwrap().is_ok());
}

/// The next proxy event within a short while, if any.
async fn proxy_event_or_none(m: &mut ManagerEnd) -> Option<Event> {
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    loop {
        match tokio::time::timeout_at(until, m.next()).await {
            Ok(Some(Ok(ToManager::Event(
                e @ (Event::ProxyNew { .. } | Event::ProxyRemoved { .. }),
            )))) => return Some(e),
            Ok(Some(Ok(_))) => continue,
            Ok(other) => panic!("the session broke: {other:?}"),
            Err(_) => return None,
        }
    }
}

/// The agent binary on the node's bus, with a kill -9 for a crash.
struct AgentProcess(Child);

impl AgentProcess {
    fn start(node: &Node, port: u16) -> AgentProcess {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_drover-agent"))
            .args(["--no-default-config", "-n", "foo", "-H", "127.0.0.1"])
            .args(["-p", &port.to_string(), "-i", "200"])
            .args(["--bus", &node::bus_address(&node.dir, NODE)])
            .env("DROVER_LOG_TARGET", "stderr")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("drover-agent starts");
        AgentProcess(child)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_after_a_crash_follows_the_proxy_units_left_active() {
    let node = Node::start().await;
    node.write_unit("drover-proxy@.service", PROXY_UNIT);
    node.write_unit("need-db.service", NEED_DB);
    let systemd = Arc::new(node.systemd().await);
    systemd.reload().await.unwrap();
    let state = async |unit: &str| unit_status(&*systemd, unit).await.unwrap().active_state;
    let wait = async |unit: &str, want: &str| {
        let deadline = Instant::now() + T;
        loop {
            let got = state(unit).await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{unit} is {got}, expected {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();

    let mut first = AgentProcess::start(&node, port);
    let mut m = accept(&listener, 1).await;
    systemd
        .unit_job(
            drover_protocol::JobKind::Start,
            "need-db.service",
            "replace",
        )
        .await
        .unwrap();
    let Event::ProxyNew { proxy_id: a, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    tell(&mut m, a, "active").await;
    wait("need-db.service", "active").await;

    // kill -9: nothing is stopped, the proxy unit stays active.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    drop(m);
    assert_eq!(state("drover-proxy@bar_db.service").await, "active");

    let _second = AgentProcess::start(&node, port);
    let mut m = accept(&listener, 2).await;
    let Event::ProxyNew {
        node: target_node,
        unit,
        proxy_id: b,
    } = proxy_event(&mut m).await
    else {
        panic!("expected ProxyNew");
    };
    assert_eq!((target_node.as_str(), unit.as_str()), ("bar", "db.service"));
    // The adopted proxy still follows the target: a real failure stops it.
    tell(&mut m, b, "failed").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(b));
    wait("drover-proxy@bar_db.service", "inactive").await;
    wait("need-db.service", "inactive").await;
}
