//! Cross-node dependencies on a real `systemd --user` node (built with the
//! sandbox's node pieces, so both cgroup layouts work), torn down in `Drop`,
//! also when an assertion fails:
//!
//! * the target side: `StartDep` / `StopDep` go through the dispatcher as the
//!   manager's would, and the reply is read from the outbox;
//! * the requesting side: the whole agent below a fake manager on TCP, with a
//!   proxy unit whose `ExecStart`/`ExecStop` call the local API with `busctl`
//!   (standing in for `drover-proxy`), and a unit bound to it.

mod common;

use common::*;
use drover_agent::systemd::api::Systemd;
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_protocol::{
    Event, JobKind, Notice, Reason, Request, Response, TargetChange, ToAgent, ToManager,
};
use drover_testkit::process::ChildGuard;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "bar";

/// The dep template as shipped: its instance is the full target unit name
/// (the contract of `drover_agent::deps::dep_unit`).
const DEP_TEMPLATE: &str = include_str!("../../dist/usr/lib/systemd/system/drover-dep@.service");

/// The target side: node `bar` with the dep template and a few targets, and the
/// dispatcher on it that the test asks as the manager would.
async fn target_rig() -> (SystemdNode, Rig) {
    let node = SystemdNode::start("agent-deps", NODE).await;
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
    node.reload().await;
    let rig = Rig::start(&node, T, |s| s.deps.set_node(node_name(NODE))).await;
    (node, rig)
}

fn start_dep(unit: &str) -> Request {
    Request::StartDep {
        unit: unit_name(unit),
    }
}

fn stop_dep(unit: &str) -> Request {
    Request::StopDep {
        unit: unit_name(unit),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_dep_starts_the_target_and_stop_dep_leaves_it_running() {
    let (node, mut r) = target_rig().await;
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
        .unit_job(JobKind::Stop, "good.service", "replace")
        .await
        .unwrap();
    r.wait_state("drover-dep@good.service.service", "inactive")
        .await;
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_dep_of_a_missing_broken_or_failing_unit_is_a_clear_error() {
    let (node, mut r) = target_rig().await;
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
    node.write_unit("ok.target", "[Unit]\nDescription=ok\n");
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

/// The requesting side: node `bar` with the proxy template and need-db, the
/// agent's systemd client on it, and a fake manager for the agent ("foo").
struct Requesting {
    node: SystemdNode,
    systemd: Arc<ZbusSystemd>,
    manager: FakeManager,
}

impl Requesting {
    async fn start() -> Requesting {
        let node = SystemdNode::start("agent-deps", NODE).await;
        node.write_unit("drover-proxy@.service", PROXY_UNIT);
        node.write_unit("need-db.service", NEED_DB);
        let systemd = Arc::new(systemd(&node).await);
        systemd.reload().await.unwrap();
        let manager = FakeManager::bind().await;
        Requesting {
            node,
            systemd,
            manager,
        }
    }

    async fn state(&self, unit: &str) -> String {
        active_state(&self.systemd, unit).await
    }

    async fn wait(&self, unit: &str, want: &str) {
        wait_state(&self.systemd, unit, want, T).await;
    }

    async fn start_unit(&self, unit: &str) {
        self.systemd
            .unit_job(JobKind::Start, unit, "replace")
            .await
            .unwrap();
    }

    /// The agent's next connection, accepted with `session_id`.
    async fn accept(&self, session_id: u64) -> ManagerSession {
        self.manager.accept("foo", session_id, T).await
    }

    /// The agent in-process, linked to the fake manager.
    fn agent(&self) -> InProcessAgent {
        InProcessAgent::start(&self.node, "foo", self.manager.port(), || {})
    }

    /// The agent binary on the node's bus (for a kill -9).
    fn agent_process(&self) -> ChildGuard {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_drover-agent"))
            .args(["--no-default-config", "-n", "foo", "-H", "127.0.0.1"])
            .args(["-p", &self.manager.port().to_string(), "-i", "200"])
            .args(["--bus", &self.node.bus_address()])
            .env("DROVER_LOG_TARGET", "stderr")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("drover-agent starts");
        ChildGuard::new(child)
    }
}

fn is_proxy_event(m: &ToManager) -> bool {
    matches!(
        m,
        ToManager::Event(Event::ProxyNew { .. } | Event::ProxyRemoved { .. })
    )
}

/// The next proxy event from the agent (heartbeats and others skipped).
async fn proxy_event(m: &mut ManagerSession) -> Event {
    match m.expect("a proxy event", T, is_proxy_event).await {
        ToManager::Event(e) => e,
        other => unreachable!("{other:?}"),
    }
}

/// The next proxy event within a short while, if any.
async fn proxy_event_or_none(m: &mut ManagerSession) -> Option<Event> {
    match m.maybe(Duration::from_millis(500), is_proxy_event).await {
        Some(ToManager::Event(e)) => Some(e),
        other => other.map(|o| unreachable!("{o:?}")),
    }
}

async fn tell(m: &mut ManagerSession, proxy_id: u64, active: &str) {
    m.send(ToAgent::Notice(Notice::ProxyTarget {
        proxy_id,
        change: TargetChange::State {
            active_state: active.into(),
            sub_state: "x".into(),
            reason: Reason::Real,
        },
    }))
    .await;
}

fn db_new(proxy_id: u64) -> Event {
    let (node, unit) = (node_name("bar"), unit_name("db.service"));
    Event::ProxyNew {
        node,
        unit,
        proxy_id,
        template: drover_protocol::ProxyTemplate::Drover,
    }
}

/// The end of [`db_new`]'s proxy.
fn db_removed(proxy_id: u64) -> Event {
    let Event::ProxyNew { node, unit, .. } = db_new(proxy_id) else {
        unreachable!("db_new makes a ProxyNew")
    };
    Event::ProxyRemoved {
        node,
        unit,
        proxy_id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_unit_follows_the_target_across_reconnects_and_shutdown() {
    let r = Requesting::start().await;
    let agent = r.agent();
    let mut m = r.accept(1).await;

    // 1. The target becomes active: the proxy, then need-db, start.
    r.start_unit("need-db.service").await;
    let Event::ProxyNew { proxy_id: a, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    assert_eq!(
        r.state("need-db.service").await,
        "inactive",
        "waits for the proxy"
    );
    tell(&mut m, a, "active").await;
    r.wait("need-db.service", "active").await;
    assert_eq!(r.state("drover-proxy@bar_db.service").await, "active");

    // 2. A real failure of the target stops the proxy and its dependents; the
    //    stop's RemoveProxy answers the failure, so the proxy ends failed.
    tell(&mut m, a, "failed").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(a));
    r.wait("drover-proxy@bar_db.service", "failed").await;
    r.wait("need-db.service", "inactive").await;

    // 3. Started again; the manager goes away and comes back: the live
    //    proxy is announced again with the same id, and stays up meanwhile.
    r.start_unit("need-db.service").await;
    let Event::ProxyNew { proxy_id: b, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    assert!(b > a, "ids are never reused");
    tell(&mut m, b, "active").await;
    r.wait("need-db.service", "active").await;
    drop(m);
    let mut m = r.accept(2).await;
    assert_eq!(proxy_event(&mut m).await, db_new(b));
    assert_eq!(r.state("need-db.service").await, "active");

    // 4. Clean agent shutdown (`systemctl restart drover-agent`): the active
    //    proxy and need-db keep running, the manager is not told the proxy
    //    is gone, and the next agent adopts it and announces it again.
    agent.stop(T).await;
    m.until_closed(T, is_proxy_event).await;
    assert_eq!(r.state("need-db.service").await, "active");
    assert_eq!(r.state("drover-proxy@bar_db.service").await, "active");
    let agent = r.agent();
    let mut m = r.accept(3).await;
    let Event::ProxyNew { proxy_id: c, .. } = proxy_event(&mut m).await else {
        panic!("expected the adopted proxy");
    };
    assert_eq!(proxy_event_or_none(&mut m).await, None);
    // Adopted means followed: a real stop of the target still stops it.
    tell(&mut m, c, "inactive").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(c));
    r.wait("drover-proxy@bar_db.service", "inactive").await;
    r.wait("need-db.service", "inactive").await;
    agent.stop(T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_after_a_crash_follows_the_proxy_units_left_active() {
    let r = Requesting::start().await;
    let mut first = r.agent_process();
    let mut m = r.accept(1).await;
    r.start_unit("need-db.service").await;
    let Event::ProxyNew { proxy_id: a, .. } = proxy_event(&mut m).await else {
        panic!("expected ProxyNew");
    };
    tell(&mut m, a, "active").await;
    r.wait("need-db.service", "active").await;

    // kill -9: nothing is stopped, the proxy unit stays active.
    first.kill();
    drop(m);
    assert_eq!(r.state("drover-proxy@bar_db.service").await, "active");

    let _second = r.agent_process();
    let mut m = r.accept(2).await;
    let Event::ProxyNew {
        node: target_node,
        unit,
        proxy_id: b,
        ..
    } = proxy_event(&mut m).await
    else {
        panic!("expected ProxyNew");
    };
    assert_eq!((target_node.as_str(), unit.as_str()), ("bar", "db.service"));
    // The adopted proxy still follows the target: a real failure stops it,
    // failed.
    tell(&mut m, b, "failed").await;
    assert_eq!(proxy_event(&mut m).await, db_removed(b));
    r.wait("drover-proxy@bar_db.service", "failed").await;
    r.wait("need-db.service", "inactive").await;
}
