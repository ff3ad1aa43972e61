//! The zbus systemd client and the whole agent against a real
//! `systemd --user`, started per test in its own mount + cgroup namespace
//! (as a sandbox node is, `docs/sandbox.md`). Needs root and the hybrid cgroup layout
//! of the CI machines; the full multi-node sandbox is `drover-sandbox`.

mod common;

use common::*;
use drover_agent::dispatch::Dispatcher;
use drover_agent::link::outbox::SessionKill;
use drover_agent::systemd::api::{JobInfo, Systemd};
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_protocol::JobKind;
use drover_protocol::{Event, Request, Response, ToAgent, ToManager, UnitName};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(20);

/// A `systemd --user` node of its own for one test (torn down on drop).
async fn user_systemd(tag: &str) -> SystemdNode {
    SystemdNode::start(&format!("agent-test-{tag}"), "node").await
}

fn unit(s: &str) -> UnitName {
    UnitName::new(s).unwrap()
}

fn start(u: &str, job_id: u32) -> Request {
    Request::UnitJob {
        kind: JobKind::Start,
        unit: unit(u),
        mode: "replace".into(),
        job_id,
    }
}

/// A dispatcher on the real systemd with an outbox the test reads.
async fn dispatcher(
    node: &SystemdNode,
) -> (Arc<Dispatcher<ZbusSystemd>>, mpsc::Receiver<ToManager>) {
    common::dispatcher(node, |_| {}).await
}

async fn next(rx: &mut mpsc::Receiver<ToManager>) -> ToManager {
    next_within(rx, T).await
}

/// Messages until the `JobDone` of `job_id`; returns (everything, result).
async fn until_done(rx: &mut mpsc::Receiver<ToManager>, job_id: u32) -> (Vec<ToManager>, String) {
    let mut seen = Vec::new();
    loop {
        let msg = next(rx).await;
        if let ToManager::Event(Event::JobDone { job_id: j, result }) = &msg
            && *j == job_id
        {
            let result = result.clone();
            seen.push(msg);
            return (seen, result);
        }
        seen.push(msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oneshot_is_done_failing_unit_is_failed_missing_unit_is_no_such_unit() {
    let node = user_systemd("jobs").await;
    node.write_unit(
        "ok.service",
        "[Service]\nType=oneshot\nExecStart=/bin/true\n",
    );
    node.write_unit(
        "bad.service",
        "[Service]\nType=oneshot\nExecStart=/bin/false\n",
    );
    let (d, mut rx) = dispatcher(&node).await;
    d.handle(1, 1, Request::Reload).await;
    assert_eq!(
        next(&mut rx).await,
        ToManager::Reply {
            id: 1,
            result: Ok(Response::Empty)
        }
    );

    // Many fast oneshots in a row: each has its reply first and exactly one JobDone.
    for round in 0..20u32 {
        let job_id = 100 + round;
        d.handle(1, 10 + u64::from(round), start("ok.service", job_id))
            .await;
        let (seen, result) = until_done(&mut rx, job_id).await;
        assert_eq!(
            seen[0],
            ToManager::Reply {
                id: 10 + u64::from(round),
                result: Ok(Response::Empty)
            }
        );
        assert_eq!(result, "done", "round {round}: {seen:?}");
    }

    d.handle(1, 2, start("bad.service", 2)).await;
    let (seen, result) = until_done(&mut rx, 2).await;
    assert_eq!(
        seen[0],
        ToManager::Reply {
            id: 2,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(result, "failed");

    d.handle(1, 3, start("missing.service", 3)).await;
    match next(&mut rx).await {
        ToManager::Reply {
            id: 3,
            result: Err(e),
        } => {
            assert_eq!(e.name, "org.freedesktop.systemd1.NoSuchUnit", "{e}");
            assert!(e.message.contains("missing.service"), "{e}");
        }
        other => panic!("unexpected {other:?}"),
    }

    // No stray JobDone of a finished job shows up later.
    let extra = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
    assert!(extra.is_err(), "unexpected extra message: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_and_cancel_a_running_job() {
    let node = user_systemd("cancel").await;
    node.write_unit(
        "slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n",
    );
    let (d, mut rx) = dispatcher(&node).await;
    d.handle(1, 1, Request::Reload).await;
    next(&mut rx).await;

    d.handle(1, 2, start("slow.service", 7)).await;
    assert_eq!(
        next(&mut rx).await,
        ToManager::Reply {
            id: 2,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(
        next(&mut rx).await,
        ToManager::Event(Event::JobStateChanged {
            job_id: 7,
            state: "running".into()
        })
    );

    d.handle(1, 3, Request::ListUnits).await;
    match next(&mut rx).await {
        ToManager::Reply {
            id: 3,
            result: Ok(Response::Units(units)),
        } => {
            let slow = units
                .iter()
                .find(|u| u.name == "slow.service")
                .expect("slow.service is listed");
            assert_eq!(slow.active_state, "activating");
            assert_eq!(slow.job_type, "start");
        }
        other => panic!("unexpected {other:?}"),
    }

    d.handle(1, 4, Request::JobCancel { job_id: 7 }).await;
    let mut got = [next(&mut rx).await, next(&mut rx).await];
    got.sort_by_key(|m| matches!(m, ToManager::Event(_)));
    assert_eq!(
        got[0],
        ToManager::Reply {
            id: 4,
            result: Ok(Response::Empty)
        }
    );
    assert_eq!(
        got[1],
        ToManager::Event(Event::JobDone {
            job_id: 7,
            result: "canceled".into()
        })
    );
}

/// `job_info` reads type and state from systemd's own job objects: what the
/// agent's start-ahead of proxies (agent/src/ahead.rs) decides on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_info_reads_type_and_state_of_real_jobs() {
    let node = user_systemd("jobinfo").await;
    node.write_unit(
        "slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n",
    );
    node.write_unit(
        "later.service",
        "[Unit]\nAfter=slow.service\n[Service]\nExecStart=/bin/sleep 30\n",
    );
    let systemd = systemd(&node).await;
    systemd.reload().await.unwrap();
    let slow = systemd
        .unit_job(JobKind::Start, "slow.service", "replace")
        .await
        .unwrap();
    let later = systemd
        .unit_job(JobKind::Start, "later.service", "replace")
        .await
        .unwrap();
    let info = |kind: &str, state: &str| JobInfo {
        kind: kind.into(),
        state: state.into(),
    };
    // slow runs its ExecStart for 30 s; later waits for it (After=).
    let deadline = Instant::now() + T;
    while systemd.job_info(&slow).await.unwrap() != info("start", "running") {
        assert!(Instant::now() < deadline, "slow.service's job never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        systemd.job_info(&later).await.unwrap(),
        info("start", "waiting")
    );
    let stop = systemd
        .unit_job(JobKind::Stop, "later.service", "replace")
        .await
        .unwrap();
    // A stop replaces the waiting start: the old job is gone, an error.
    assert!(systemd.job_info(&later).await.is_err());
    let deadline = Instant::now() + T;
    while systemd.job_info(&stop).await.is_ok() {
        assert!(Instant::now() < deadline, "the stop job never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    systemd.cancel_job(&slow).await.unwrap();
}

/// The whole agent: real systemd below, a fake manager on TCP above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_a_remote_start_end_to_end() {
    let node = user_systemd("e2e").await;
    node.write_unit(
        "ok.service",
        "[Service]\nType=oneshot\nExecStart=/bin/true\n",
    );
    let manager = FakeManager::bind().await;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let agent = InProcessAgent::start(&node, "e2e", manager.port(), move || {
        let _ = ready_tx.send(());
    });
    tokio::time::timeout(T, ready_rx)
        .await
        .expect("ready in time")
        .unwrap();
    let mut m = manager.accept("e2e", 1, T).await;

    m.send(ToAgent::Request {
        id: 1,
        body: Request::Reload,
    })
    .await;
    m.send(ToAgent::Request {
        id: 2,
        body: start("ok.service", 42),
    })
    .await;
    // The two requests run side by side: the start's reply comes before its
    // JobDone, the Reload's whenever systemd is done reloading.
    let mut replies = Vec::new();
    let mut done = None;
    while done.is_none() || replies.len() < 2 {
        match m.recv(T).await.unwrap().unwrap() {
            ToManager::Heartbeat => {}
            ToManager::Reply { id, result } => replies.push((id, result)),
            ToManager::Event(Event::JobDone { job_id: 42, result }) => {
                assert!(
                    replies.iter().any(|(id, _)| *id == 2),
                    "JobDone before the start's reply: {replies:?}"
                );
                done = Some(result);
            }
            ToManager::Event(_) => {}
            other @ ToManager::ReplyPart { .. } => panic!("no list was asked for: {other:?}"),
        }
    }
    assert_eq!(done.as_deref(), Some("done"));
    replies.sort_by_key(|(id, _)| *id);
    assert_eq!(
        replies,
        vec![(1, Ok(Response::Empty)), (2, Ok(Response::Empty))]
    );

    agent.stop(T).await;
}

/// Node API pass-throughs and unit subscriptions.
#[path = "real_systemd/node_api.rs"]
mod node_api;

/// Issue 14 item 5: an agent whose systemd bus goes away exits with status 1
/// and says why, so its unit (`Restart=on-failure`, checked by xtask's
/// shipped-units test) starts it again on the bus as it is then. Killing the
/// node's dbus-daemon is what a crashed or restarted bus looks like.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_exits_1_when_its_systemd_bus_dies() {
    use drover_testkit::process::{ChildGuard, free_port};
    use std::process::{Command, Stdio};
    let node = user_systemd("bus-dies").await;
    let tmp = drover_testkit::process::TempDir::new("drover-agent-bus-dies");
    let log = tmp.join("agent.log");
    let mut agent = ChildGuard::new(
        Command::new(env!("CARGO_BIN_EXE_drover-agent"))
            .args(["--no-default-config", "--bus", &node.bus_address()])
            // Nobody listens there: the agent keeps retrying, which is fine.
            .args([
                "-n",
                "node1",
                "-H",
                "127.0.0.1",
                "-p",
                &free_port().to_string(),
            ])
            .env("DROVER_LOG_TARGET", "stderr")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
            .spawn()
            .expect("spawn drover-agent"),
    );
    let client = zbus::connection::Builder::address(node.bus_address().as_str())
        .build()
        .await
        .expect("connect to the node's bus");
    let dbus = zbus::fdo::DBusProxy::new(&client).await.expect("bus proxy");
    let agent_api = zbus::names::BusName::try_from("org.eclipse.bluechi.Agent").unwrap();
    let deadline = Instant::now() + T;
    while !dbus
        .name_has_owner(agent_api.clone())
        .await
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "the agent never served its API");
        assert!(agent.try_wait().is_none(), "{}", tmp.read("agent.log"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bus_pid = dbus
        .get_connection_unix_process_id(
            zbus::names::BusName::try_from("org.freedesktop.DBus").unwrap(),
        )
        .await
        .expect("the bus daemon's pid");
    let bus_pid = i32::try_from(bus_pid).expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bus_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL to the node's bus daemon");

    let status = agent.exited(Duration::from_secs(5)).await;
    let logged = tmp.read("agent.log");
    assert_eq!(status.code(), Some(1), "{status}: {logged}");
    assert!(
        logged.contains("lost the connection to systemd"),
        "{logged}"
    );
}
