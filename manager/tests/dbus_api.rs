//! The public D-Bus API against fake agents: what a BlueChi client sees.

mod common;

use common::*;
use drover_manager::Timeouts;
use drover_protocol::link::HandshakeError;
use drover_protocol::{JobKind, RefuseReason, RemoteError, Request, Response, UnitInfo};
use drover_testkit::agent::{job_done, job_state, reply_ok, reply_then};
use drover_testkit::api::assert_mentions;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use zbus::OwnedObjectPath;

const NODE1: &str = "/org/eclipse/bluechi/node/node1";
const NODE_BAR: &str = "/org/eclipse/bluechi/node/node_2dbar";
const CTRL_IFACE: &str = CONTROLLER_IFACE;
const PROPS: &str = PROPERTIES_IFACE;

type NodeRow = (String, OwnedObjectPath, String, String);

async fn list_nodes(f: &Fixture) -> Vec<NodeRow> {
    f.call(CONTROLLER, CTRL_IFACE, "ListNodes", &())
        .await
        .expect("ListNodes")
}

#[tokio::test]
async fn list_nodes_and_status_changes() {
    let f = Fixture::start(config(&["node1", "node-bar"])).await;
    let nodes = list_nodes(&f).await;
    assert_eq!(
        nodes,
        vec![
            (
                "node1".into(),
                OwnedObjectPath::try_from(NODE1).unwrap(),
                "offline".into(),
                String::new()
            ),
            (
                "node-bar".into(),
                OwnedObjectPath::try_from(NODE_BAR).unwrap(),
                "offline".into(),
                String::new()
            ),
        ]
    );
    assert_eq!(
        f.get_property::<String>(CONTROLLER, CTRL_IFACE, "Status")
            .await,
        "down"
    );
    let path: OwnedObjectPath = f
        .call(CONTROLLER, CTRL_IFACE, "GetNode", &("node-bar",))
        .await
        .unwrap();
    assert_eq!(path.as_str(), NODE_BAR);

    let mut node_signals = f.signals(NODE1, PROPS).await;
    let mut ctrl_signals = f.signals(CONTROLLER, PROPS).await;
    let agent = f.agent("node1", reply_empty()).await;
    wait_changed(&mut node_signals, "Status", "online").await;
    wait_changed(&mut ctrl_signals, "Status", "degraded").await;

    let nodes = list_nodes(&f).await;
    assert_eq!(
        (nodes[0].2.as_str(), nodes[0].3.as_str()),
        ("online", "127.0.0.1")
    );
    assert_eq!(nodes[1].2, "offline");
    assert_eq!(
        f.get_property::<String>(NODE1, NODE_IFACE, "Status").await,
        "online"
    );
    assert_eq!(
        f.get_property::<String>(NODE1, NODE_IFACE, "PeerIp").await,
        "127.0.0.1"
    );
    assert_eq!(
        f.get_property::<String>(NODE1, NODE_IFACE, "Name").await,
        "node1"
    );
    let seen: u64 = f.get_property(NODE1, NODE_IFACE, "LastSeenTimestamp").await;
    let seen_mono: u64 = f
        .get_property(NODE1, NODE_IFACE, "LastSeenTimestampMonotonic")
        .await;
    assert!(
        seen > 1_600_000_000_000_000 && seen_mono > 0,
        "{seen} {seen_mono}"
    );

    let bar = f.agent("node-bar", reply_empty()).await;
    wait_changed(&mut ctrl_signals, "Status", "up").await;
    assert!(
        bar.accepted.session_id > agent.accepted.session_id,
        "session ids rise"
    );

    drop(agent);
    wait_changed(&mut node_signals, "Status", "offline").await;
    wait_changed(&mut ctrl_signals, "Status", "degraded").await;
    let nodes = list_nodes(&f).await;
    assert_eq!((nodes[0].2.as_str(), nodes[0].3.as_str()), ("offline", ""));
    // Last seen is kept while offline.
    let after: u64 = f.get_property(NODE1, NODE_IFACE, "LastSeenTimestamp").await;
    assert!(after >= seen);
}

#[tokio::test]
async fn unknown_node_and_offline_calls() {
    let f = Fixture::start(config(&["node1"])).await;
    let res = f
        .call::<_, OwnedObjectPath>(CONTROLLER, CTRL_IFACE, "GetNode", &("nope",))
        .await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.ServiceUnknown");

    let err = f
        .call::<_, OwnedObjectPath>(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
        .await
        .unwrap_err();
    assert_eq!(
        error_of(&err),
        (
            "org.eclipse.bluechi.Offline".into(),
            "Node is offline".into()
        )
    );
    let res = f.call::<_, ()>(NODE1, NODE_IFACE, "Reload", &()).await;
    assert_eq!(error_name(res), "org.eclipse.bluechi.Offline");
}

#[tokio::test]
async fn registration_refusals() {
    let f = Fixture::start(config(&["node1"])).await;
    match FakeAgent::connect(f.addr, "stranger", reply_empty()).await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::UnknownNode,
            message,
        }) => {
            assert!(message.contains("stranger"), "{message}")
        }
        other => panic!(
            "unknown node must be refused, got {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
    match FakeAgent::connect(f.addr, "bad name", reply_empty()).await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::InvalidName,
            ..
        }) => {}
        other => panic!(
            "invalid name must be refused, got {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
    let _first = f.agent("node1", reply_empty()).await;
    match FakeAgent::connect(f.addr, "node1", reply_empty()).await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::AlreadyConnected,
            message,
        }) => {
            assert!(message.contains("already connected"), "{message}")
        }
        other => panic!(
            "a live duplicate must be refused, got {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
    let nodes = list_nodes(&f).await;
    assert_eq!(nodes.len(), 1, "refused names never appear: {nodes:?}");
    assert_eq!(nodes[0].2, "online", "the first session is untouched");
    let res = f
        .call::<_, OwnedObjectPath>(CONTROLLER, CTRL_IFACE, "GetNode", &("stranger",))
        .await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.ServiceUnknown");
}

#[tokio::test]
async fn silent_session_is_dropped_and_can_be_replaced() {
    let f = Fixture::start(config(&["node1"])).await;
    let mut node_signals = f.signals(NODE1, PROPS).await;
    let hung = f.agent("node1", reply_empty()).await;
    wait_changed(&mut node_signals, "Status", "online").await;
    hung.silence();
    // Threshold is 1000 ms: the manager drops it on its own.
    wait_changed(&mut node_signals, "Status", "offline").await;
    let fresh = f.agent("node1", reply_empty()).await;
    wait_changed(&mut node_signals, "Status", "online").await;
    assert!(fresh.accepted.session_id > hung.accepted.session_id);
}

#[tokio::test]
async fn start_unit_emits_job_new_then_job_removed() {
    let f = Fixture::start(config(&["node1"])).await;
    // The agent accepts, reports progress, and finishes with "done".
    let behavior = reply_then(|req| match req {
        Request::UnitJob {
            kind: JobKind::Start,
            job_id,
            ..
        } => {
            vec![job_state(*job_id, "running"), job_done(*job_id, "done")]
        }
        _ => vec![],
    });
    let agent = f.agent("node1", behavior).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("web.service", "replace"))
        .await
        .expect("StartUnit");
    assert_eq!(path.as_str(), "/org/eclipse/bluechi/job/1");
    let (member, msg) = next_signal(&mut jobs).await;
    assert_eq!(member, "JobNew");
    let (id, job): (u32, OwnedObjectPath) = msg.body().deserialize().unwrap();
    assert_eq!((id, job.as_str()), (1, path.as_str()));
    let (member, msg) = next_signal(&mut jobs).await;
    assert_eq!(member, "JobRemoved");
    let removed: (u32, OwnedObjectPath, String, String, String) = msg.body().deserialize().unwrap();
    assert_eq!(
        removed,
        (
            1,
            path.clone(),
            "node1".into(),
            "web.service".into(),
            "done".into()
        )
    );
    match &agent.requests()[0] {
        Request::UnitJob {
            kind: JobKind::Start,
            unit,
            mode,
            job_id,
        } => {
            assert_eq!(
                (unit.as_str(), mode.as_str(), *job_id),
                ("web.service", "replace", 1)
            )
        }
        other => panic!("unexpected request {other:?}"),
    }
    // The job object is gone after JobRemoved.
    let err = f.introspect_job_gone(path.as_str()).await;
    assert!(err, "job object unexported after JobRemoved");

    // Next job gets the next id.
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StopUnit", &("web.service", "fail"))
        .await
        .unwrap();
    assert_eq!(path.as_str(), "/org/eclipse/bluechi/job/2");
}

#[tokio::test]
async fn job_done_before_the_reply_still_orders_job_new_first() {
    let f = Fixture::start(config(&["node1"])).await;
    // A fast oneshot: the agent reports JobDone even before its reply.
    let behavior: Behavior = Arc::new(|id, req| match req {
        Request::UnitJob {
            kind: JobKind::Restart,
            job_id,
            ..
        } => vec![job_done(*job_id, "done"), reply_ok(id)],
        _ => vec![reply_ok(id)],
    });
    let _agent = f.agent("node1", behavior).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "RestartUnit", &("x.service", "replace"))
        .await
        .unwrap();
    let (first, _) = next_signal(&mut jobs).await;
    let (second, msg) = next_signal(&mut jobs).await;
    assert_eq!((first.as_str(), second.as_str()), ("JobNew", "JobRemoved"));
    let (_, job, _, _, result): (u32, OwnedObjectPath, String, String, String) =
        msg.body().deserialize().unwrap();
    assert_eq!((job, result.as_str()), (path, "done"));
    // Exactly once: nothing else follows.
    let more = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut jobs),
    )
    .await;
    assert!(more.is_err(), "no second JobRemoved");
}

#[tokio::test]
async fn agent_drop_ends_pending_job_with_disconnected() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", reply_empty()).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let mut node_signals = f.signals(NODE1, PROPS).await;
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("slow.service", "replace"))
        .await
        .unwrap();
    assert_eq!(next_signal(&mut jobs).await.0, "JobNew");
    // While it runs, the Job object answers.
    assert_eq!(
        f.get_property::<String>(path.as_str(), JOB_IFACE, "Unit")
            .await,
        "slow.service"
    );
    assert_eq!(
        f.get_property::<String>(path.as_str(), JOB_IFACE, "JobType")
            .await,
        "start"
    );
    assert_eq!(
        f.get_property::<String>(path.as_str(), JOB_IFACE, "Node")
            .await,
        "node1"
    );
    assert_eq!(
        f.get_property::<u32>(path.as_str(), JOB_IFACE, "Id").await,
        1
    );

    drop(agent);
    wait_changed(&mut node_signals, "Status", "offline").await;
    let (member, msg) = next_signal(&mut jobs).await;
    assert_eq!(member, "JobRemoved");
    let removed: (u32, OwnedObjectPath, String, String, String) = msg.body().deserialize().unwrap();
    assert_eq!(
        removed,
        (
            1,
            path,
            "node1".into(),
            "slow.service".into(),
            "disconnected".into()
        )
    );
}

#[tokio::test]
async fn job_state_and_cancel() {
    let f = Fixture::start(config(&["node1"])).await;
    let behavior = reply_then(|req| match req {
        Request::JobCancel { job_id } => vec![job_done(*job_id, "canceled")],
        _ => vec![],
    });
    let agent = f.agent("node1", behavior).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
        .await
        .unwrap();
    assert_eq!(next_signal(&mut jobs).await.0, "JobNew");
    assert_eq!(
        f.get_property::<String>(path.as_str(), JOB_IFACE, "State")
            .await,
        "waiting"
    );
    let mut job_props = f.signals(path.as_str(), PROPS).await;
    agent.send(job_state(1, "running")).await;
    wait_changed(&mut job_props, "State", "running").await;
    let () = f
        .call(path.as_str(), JOB_IFACE, "Cancel", &())
        .await
        .expect("Cancel");
    let (member, msg) = next_signal(&mut jobs).await;
    assert_eq!(member, "JobRemoved");
    let (_, _, _, _, result): (u32, OwnedObjectPath, String, String, String) =
        msg.body().deserialize().unwrap();
    assert_eq!(result, "canceled");
    assert!(agent.requests().contains(&Request::JobCancel { job_id: 1 }));
}

#[tokio::test]
async fn bad_arguments_are_invalid_args_and_reach_no_agent() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", reply_empty()).await;
    for (unit, mode) in [
        ("no suffix", "replace"),
        ("a/b.service", "replace"),
        ("", "replace"),
        ("a.service", "sideways"),
    ] {
        let err = f
            .call::<_, OwnedObjectPath>(NODE1, NODE_IFACE, "StartUnit", &(unit, mode))
            .await
            .unwrap_err();
        let (name, message) = error_of(&err);
        assert_eq!(
            name, "org.freedesktop.DBus.Error.InvalidArgs",
            "{unit:?} {mode:?}"
        );
        assert!(!message.is_empty());
    }
    // Wrong D-Bus types are refused by the bus layer the same way.
    let res = f
        .call::<_, OwnedObjectPath>(NODE1, NODE_IFACE, "StartUnit", &(7u32,))
        .await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.InvalidArgs");
    assert_eq!(agent.request_count(), 0, "nothing was sent to the agent");
}

#[tokio::test]
async fn systemd_errors_come_back_with_their_names() {
    let f = Fixture::start(config(&["node1"])).await;
    let behavior = reply_with(|_| {
        Err(RemoteError::new(
            "org.freedesktop.systemd1.NoSuchUnit",
            "Unit nope.service not found.",
        ))
    });
    let _agent = f.agent("node1", behavior).await;
    let err = f
        .call::<_, OwnedObjectPath>(NODE1, NODE_IFACE, "StartUnit", &("nope.service", "replace"))
        .await
        .unwrap_err();
    assert_eq!(
        error_of(&err),
        (
            "org.freedesktop.systemd1.NoSuchUnit".into(),
            "Unit nope.service not found.".into()
        )
    );
    assert!(
        f.manager().jobs().table().is_empty(),
        "a refused job leaves nothing behind"
    );
}

fn unit(name: &str) -> UnitInfo {
    UnitInfo {
        description: format!("{name} desc"),
        object_path: "/org/freedesktop/systemd1/unit/x".into(),
        ..UnitInfo::loaded(name, "active", "running")
    }
}

#[tokio::test]
async fn list_units_per_node_and_fleet_wide() {
    let f = Fixture::start(config(&["node1", "node-bar", "node3"])).await;
    let units: Behavior = Arc::new(|id, req| match req {
        Request::ListUnits => vec![drover_protocol::ToManager::Reply {
            id,
            result: Ok(Response::Units(vec![unit("a.service")])),
        }],
        _ => vec![],
    });
    let _a = f.agent("node1", units).await;
    // node-bar never answers: it is left out of the fleet-wide answer.
    let _b = f.agent("node-bar", never_reply()).await;
    let rows: Vec<UnitTuple> = f.call(NODE1, NODE_IFACE, "ListUnits", &()).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].3.as_str()),
        ("a.service", "active")
    );

    let all: HashMap<String, Vec<UnitTuple>> = f
        .call(CONTROLLER, CTRL_IFACE, "ListUnits", &())
        .await
        .unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), vec!["node1"]);
    assert_eq!(all["node1"][0].1, "a.service desc");
}

/// An agent that answers `ListUnits` with `rows`, `ListUnitFiles` with one
/// file per row, and everything else with an empty reply.
fn lists(rows: Vec<UnitInfo>) -> Behavior {
    Arc::new(move |id, req| {
        let result = match req {
            Request::ListUnits => Response::Units(rows.clone()),
            Request::ListUnitFiles => Response::UnitFiles(
                rows.iter()
                    .map(|r| (format!("/etc/systemd/user/{}", r.name), "enabled".into()))
                    .collect(),
            ),
            _ => Response::Empty,
        };
        vec![drover_protocol::ToManager::Reply {
            id,
            result: Ok(result),
        }]
    })
}

/// Issue 17: `Controller.ListUnits` is one D-Bus reply. A fleet whose answer
/// fits the limit gets all of it, exactly; one byte less and the call is
/// refused with `LimitsExceeded`, the size, the limit and the way out — and
/// nothing else notices: the nodes stay online and list on their own.
#[tokio::test]
async fn a_fleet_wide_list_fits_one_reply_or_is_refused_with_the_way_out() {
    use zbus::wire::{LE, serialized::Context, serialized_size};
    let nodes = ["node1", "node2", "node3"];
    let rows = |k: usize| -> Vec<UnitInfo> {
        (0..10 * (k + 1))
            .map(|i| unit(&format!("u{i:04}.service")))
            .collect()
    };
    let expected: BTreeMap<String, Vec<UnitTuple>> = nodes
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let tuples = rows(k).into_iter().map(drover_bus::systemd::unit_tuple);
            (n.to_string(), tuples.collect())
        })
        .collect();
    let exact = *serialized_size(Context::new(LE, 0), &expected).unwrap();
    for (limit, fits) in [(exact, true), (exact - 1, false)] {
        let timeouts = Timeouts {
            fleet_answer: limit,
            ..fast_timeouts()
        };
        let f = Fixture::start_with(config(&nodes), timeouts).await;
        let mut agents = Vec::new();
        for (k, n) in nodes.iter().enumerate() {
            agents.push(f.agent(n, lists(rows(k))).await);
        }
        let answer: zbus::Result<BTreeMap<String, Vec<UnitTuple>>> =
            f.call(CONTROLLER, CTRL_IFACE, "ListUnits", &()).await;
        if fits {
            assert_eq!(answer.unwrap(), expected, "limit {limit}");
        } else {
            let (name, message) = error_of(&answer.unwrap_err());
            assert_eq!(name, "org.freedesktop.DBus.Error.LimitsExceeded");
            assert_mentions(
                &message,
                "the refusal",
                &[&limit.to_string(), "Node.ListUnits", "droverctl list-units"],
            );
            let one: Vec<UnitTuple> = f.call(NODE1, NODE_IFACE, "ListUnits", &()).await.unwrap();
            assert_eq!(one.len(), 10);
            for n in nodes {
                let path = format!("/org/eclipse/bluechi/node/{n}");
                let status: String = f.get_property(&path, NODE_IFACE, "Status").await;
                assert_eq!(status, "online", "{n}");
            }
        }
    }
}

/// Gathering stops as soon as the answer is certain not to fit: with a limit
/// below one node's rows, the refusal names the size reached after one node.
#[tokio::test]
async fn a_fleet_wide_list_stops_at_the_first_answer_past_the_limit() {
    let nodes = ["node1", "node2", "node3", "node4"];
    let timeouts = Timeouts {
        fleet_answer: 1000,
        ..fast_timeouts()
    };
    let f = Fixture::start_with(config(&nodes), timeouts).await;
    let mut agents = Vec::new();
    for n in nodes {
        let rows: Vec<UnitInfo> = (0..50).map(|i| unit(&format!("u{i:04}.service"))).collect();
        agents.push(f.agent(n, lists(rows)).await);
    }
    let answer: zbus::Result<BTreeMap<String, Vec<UnitTuple>>> =
        f.call(CONTROLLER, CTRL_IFACE, "ListUnits", &()).await;
    let (name, message) = error_of(&answer.unwrap_err());
    assert_eq!(name, "org.freedesktop.DBus.Error.LimitsExceeded");
    assert_mentions(
        &message,
        "the refusal",
        &["after 1 of 4 online nodes", "1000 bytes"],
    );
    // ListUnitFiles the same way, with its own advice.
    let answer: zbus::Result<BTreeMap<String, Vec<(String, String)>>> =
        f.call(CONTROLLER, CTRL_IFACE, "ListUnitFiles", &()).await;
    let (name, message) = error_of(&answer.unwrap_err());
    assert_eq!(name, "org.freedesktop.DBus.Error.LimitsExceeded");
    assert_mentions(
        &message,
        "the refusal",
        &[
            "Node.ListUnitFiles",
            "droverctl list-unit-files",
            "1000 bytes",
        ],
    );
}

#[tokio::test]
async fn garbage_on_the_agent_port_leaves_the_manager_serving() {
    let f = Fixture::start(config(&["node1"])).await;
    let inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        (0u8..=255).rev().cycle().take(4096).collect(),
        vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        vec![0, 0, 0, 50, 1, 2, 3], // half a frame, then silence
        vec![0, 0, 0, 0],
    ];
    let mut conns = Vec::new();
    for input in inputs {
        let mut s = tokio::net::TcpStream::connect(f.addr).await.unwrap();
        s.write_all(&input).await.unwrap();
        conns.push(s);
    }
    // Each of them is closed by the manager (at the latest after the handshake timeout).
    for mut s in conns {
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(WAIT, async {
            loop {
                match tokio::io::AsyncReadExt::read(&mut s, &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue, // a refusal frame, then EOF
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the manager closes a garbage connection");
    }
    // A real agent still registers.
    let _agent = f.agent("node1", reply_empty()).await;
    assert_eq!(list_nodes(&f).await[0].2, "online");
}

#[tokio::test]
async fn undecodable_frame_mid_session_drops_the_session() {
    let f = Fixture::start(config(&["node1"])).await;
    let mut node_signals = f.signals(NODE1, PROPS).await;
    let agent = f.agent("node1", reply_empty()).await;
    wait_changed(&mut node_signals, "Status", "online").await;
    agent
        .send_raw(vec![0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff])
        .await;
    wait_changed(&mut node_signals, "Status", "offline").await;
    // And the name is free again at once.
    let _again = f.agent("node1", reply_empty()).await;
}

#[tokio::test]
async fn shutdown_cancels_jobs_before_leaving_the_bus() {
    let mut f = Fixture::start(config(&["node1"])).await;
    let _agent = f.agent("node1", reply_empty()).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
        .await
        .unwrap();
    assert_eq!(next_signal(&mut jobs).await.0, "JobNew");
    f.manager.take().expect("running").shutdown().await;
    let (member, msg) = next_signal(&mut jobs).await;
    assert_eq!(member, "JobRemoved");
    let (_, job, _, _, result): (u32, OwnedObjectPath, String, String, String) =
        msg.body().deserialize().unwrap();
    assert_eq!((job, result.as_str()), (path, "cancelled due to shutdown"));
}

/// After `shutdown` returns, the agents' port and the metrics port are free:
/// a manager started again at once (in the same process) binds them.
#[tokio::test]
async fn shutdown_lets_go_of_its_ports_before_it_returns() {
    let mut cfg = config(&["node1"]);
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let mut f = Fixture::start(cfg).await;
    let manager = f.manager.take().expect("running");
    let metrics = manager.metrics_addr().expect("metrics served");
    let agents = manager.local_addr();
    manager.shutdown().await;
    for addr in [agents, metrics] {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            panic!("{addr} is still taken after shutdown: {e}");
        }
    }
}

/// On shutdown the controller's `Status` goes from `up` straight to `down`,
/// as BlueChi signals it (no `degraded` while the nodes are let go one by one).
#[tokio::test]
async fn shutdown_announces_down_once_and_no_degraded() {
    let mut f = Fixture::start(config(&["node1", "node-bar"])).await;
    let mut ctrl_signals = f.signals(CONTROLLER, PROPS).await;
    let _a = f.agent("node1", reply_empty()).await;
    let _b = f.agent("node-bar", reply_empty()).await;
    wait_changed(&mut ctrl_signals, "Status", "up").await;
    f.manager.take().expect("running").shutdown().await;
    let (member, msg) = next_signal(&mut ctrl_signals).await;
    assert_eq!(member, "PropertiesChanged");
    assert_eq!(
        drover_testkit::api::changed_value(&msg, "Status").as_deref(),
        Some("down")
    );
}

#[tokio::test]
async fn introspection_describes_exactly_what_is_served() {
    let f = Fixture::start(config(&["node1"])).await;
    let _agent = f.agent("node1", reply_empty()).await;

    let xml = f.introspect(CONTROLLER).await;
    assert_mentions(
        &xml,
        "controller XML",
        &[
            r#"<interface name="org.eclipse.bluechi.Controller">"#,
            r#"<method name="ListNodes">"#,
            r#"<arg name="nodes" type="a(soss)" direction="out"/>"#,
            r#"<method name="GetNode">"#,
            r#"<arg name="name" type="s" direction="in"/>"#,
            r#"<arg name="path" type="o" direction="out"/>"#,
            r#"<arg name="units" type="a{sa(ssssssouso)}" direction="out"/>"#,
            r#"<signal name="JobNew">"#,
            r#"<arg name="id" type="u"/>"#,
            r#"<arg name="job" type="o"/>"#,
            r#"<signal name="JobRemoved">"#,
            r#"<arg name="result" type="s"/>"#,
            // EmitsChangedSignal=true is the default, so zbus writes no annotation.
            r#"<property name="Status" type="s" access="read"/>"#,
            r#"<property name="LogLevel" type="s" access="read">"#,
            r#"<property name="LogTarget" type="s" access="read">"#,
            r#"<node name="node"/>"#,
        ],
    );
    assert_mentions(
        &xml,
        "controller XML",
        &[
            r#"<method name="CreateMonitor">"#,
            r#"<arg name="monitor" type="o" direction="out"/>"#,
            r#"<method name="EnableMetrics">"#,
            r#"<method name="DisableMetrics">"#,
            r#"<method name="SetLogLevel">"#,
            r#"<arg name="loglevel" type="s" direction="in"/>"#,
            r#"<method name="ListUnitFiles">"#,
            r#"<arg name="unitfiles" type="a{sa(ss)}" direction="out"/>"#,
        ],
    );

    let xml = f.introspect(NODE1).await;
    assert_mentions(
        &xml,
        "node XML",
        &[
            r#"<method name="StartUnit">"#,
            r#"<method name="StopUnit">"#,
            r#"<method name="RestartUnit">"#,
            r#"<method name="ReloadUnit">"#,
            r#"<arg name="mode" type="s" direction="in"/>"#,
            r#"<arg name="job" type="o" direction="out"/>"#,
            r#"<arg name="units" type="a(ssssssouso)" direction="out"/>"#,
            r#"<method name="Reload">"#,
            r#"<property name="Name" type="s" access="read">"#,
            r#"<property name="PeerIp" type="s" access="read">"#,
            r#"<property name="LastSeenTimestamp" type="t" access="read">"#,
            r#"<property name="LastSeenTimestampMonotonic" type="t" access="read">"#,
            r#"value="const""#,
            r#"value="false""#,
        ],
    );
    assert_mentions(
        &xml,
        "node XML",
        &[
            r#"<method name="GetUnitProperties">"#,
            r#"<arg name="props" type="a{sv}" direction="out"/>"#,
            r#"<method name="GetUnitProperty">"#,
            r#"<arg name="value" type="v" direction="out"/>"#,
            r#"<method name="SetUnitProperties">"#,
            r#"<arg name="keyvalues" type="a(sv)" direction="in"/>"#,
            r#"<method name="EnableUnitFiles">"#,
            r#"<arg name="carries_install_info" type="b" direction="out"/>"#,
            r#"<arg name="changes" type="a(sss)" direction="out"/>"#,
            r#"<method name="DisableUnitFiles">"#,
            r#"<method name="GetUnitFileState">"#,
            r#"<method name="ListUnitFiles">"#,
            r#"<arg name="unitfiles" type="a(ss)" direction="out"/>"#,
            r#"<method name="FreezeUnit">"#,
            r#"<method name="ThawUnit">"#,
            r#"<method name="KillUnit">"#,
            r#"<arg name="signal" type="i" direction="in"/>"#,
            r#"<method name="ResetFailed">"#,
            r#"<method name="ResetFailedUnit">"#,
            r#"<method name="GetDefaultTarget">"#,
            r#"<method name="SetDefaultTarget">"#,
            r#"<method name="StartTransientUnit">"#,
            r#"<arg name="aux" type="a(sa(sv))" direction="in"/>"#,
            r#"<method name="SetLogLevel">"#,
        ],
    );

    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
        .await
        .unwrap();
    let xml = f.introspect(path.as_str()).await;
    assert_mentions(
        &xml,
        "job XML",
        &[
            r#"<interface name="org.eclipse.bluechi.Job">"#,
            r#"<method name="Cancel">"#,
            r#"<property name="Id" type="u" access="read">"#,
            r#"<property name="Node" type="s" access="read">"#,
            r#"<property name="Unit" type="s" access="read">"#,
            r#"<property name="JobType" type="s" access="read">"#,
            r#"<property name="State" type="s" access="read"/>"#,
        ],
    );
}

/// The children an `Introspect` answer names, each as `<node name="x"/>`
/// (never inlined).
fn children(xml: &str) -> Vec<String> {
    xml.match_indices("<node name=\"")
        .map(|(i, _)| {
            let rest = &xml[i + 12..];
            let end = rest.find('"').unwrap();
            assert!(rest[end..].starts_with("\"/>"), "inlined child: {xml}");
            rest[..end].to_owned()
        })
        .collect()
}

/// The paths leading to objects name their children and do not inline them
/// (sd-bus's form), so `busctl tree` walks the tree without a warning; the
/// `job` level comes and goes with the jobs.
#[tokio::test]
async fn introspection_names_children_without_inlining_them() {
    let f = Fixture::start(config(&["node1", "node-bar"])).await;
    let behavior = reply_then(|req| match req {
        Request::JobCancel { job_id } => vec![job_done(*job_id, "canceled")],
        _ => vec![],
    });
    let _agent = f.agent("node1", behavior).await;
    assert_eq!(children(&f.introspect("/").await), ["org"]);
    assert_eq!(children(&f.introspect("/org").await), ["eclipse"]);
    assert_eq!(children(&f.introspect("/org/eclipse").await), ["bluechi"]);
    let xml = f.introspect(CONTROLLER).await;
    assert_eq!(children(&xml), ["node"]);
    assert!(!xml.contains("org.eclipse.bluechi.Node"), "{xml}");
    assert_mentions(
        &xml,
        "controller XML",
        &[
            r#"<interface name="org.eclipse.bluechi.Controller">"#,
            r#"<interface name="io.drover.Controller">"#,
            r#"<interface name="org.freedesktop.DBus.Properties">"#,
        ],
    );
    assert_eq!(
        children(&f.introspect("/org/eclipse/bluechi/node").await),
        ["node1", "node_2dbar"]
    );

    for round in 0..2 {
        let path: OwnedObjectPath = f
            .call(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
            .await
            .unwrap();
        let id = path.as_str().rsplit('/').next().unwrap().to_owned();
        assert_eq!(
            children(&f.introspect(CONTROLLER).await),
            ["job", "node"],
            "round {round}"
        );
        assert_eq!(
            children(&f.introspect("/org/eclipse/bluechi/job").await),
            [id],
            "round {round}"
        );
        // Async: the manager runs on this test's runtime and must answer busctl.
        let out = tokio::process::Command::new("busctl")
            .args(["--address", f.bus.address(), "tree", "org.eclipse.bluechi"])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "busctl tree: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(path.as_str()), "{stdout}");
        // The job ends: its level goes with it.
        let () = f
            .call(path.as_str(), JOB_IFACE, "Cancel", &())
            .await
            .expect("Cancel");
        assert!(f.introspect_job_gone(path.as_str()).await);
        assert_eq!(
            children(&f.introspect(CONTROLLER).await),
            ["node"],
            "round {round}"
        );
    }
}

/// A reload that lists a new node gives it its object the one way every node
/// object goes on the bus, so `Introspect` of the node level names it and
/// `busctl tree` shows it (dasbus and every client that builds its proxies
/// from introspection see it); before, `GetNode` answered for it while
/// `Introspect` listed only the nodes of the start. A node the new config no
/// longer lists keeps its object until the manager restarts, and stays
/// named, as `GetNode` keeps answering for it.
#[tokio::test]
async fn introspection_follows_the_nodes_a_reload_adds_and_removes() {
    const NODES: &str = "/org/eclipse/bluechi/node";
    let f = Fixture::start(config(&["node1", "node2"])).await;
    assert_eq!(children(&f.introspect(NODES).await), ["node1", "node2"]);
    let reloader = f.manager().reloader().clone();

    // node2 goes, node-bar comes.
    let report = drover_manager::reload::reload(&reloader, Ok(config(&["node1", "node-bar"])))
        .await
        .expect("reload");
    let names = |v: &[drover_protocol::NodeName]| {
        v.iter().map(|n| n.as_str().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(names(&report.added), ["node-bar"]);
    assert_eq!(names(&report.kept), ["node2"]);
    assert_eq!(
        children(&f.introspect(NODES).await),
        ["node1", "node2", "node_2dbar"]
    );
    for (name, path) in [
        ("node2", "/org/eclipse/bluechi/node/node2"),
        ("node-bar", NODE_BAR),
    ] {
        let got: OwnedObjectPath = f
            .call(CONTROLLER, CTRL_IFACE, "GetNode", &(name,))
            .await
            .expect("GetNode");
        assert_eq!(got.as_str(), path);
        let xml = f.introspect(path).await;
        assert_mentions(
            &xml,
            "node XML",
            &[r#"<interface name="org.eclipse.bluechi.Node">"#],
        );
    }
    let out = tokio::process::Command::new("busctl")
        .args(["--address", f.bus.address(), "tree", "org.eclipse.bluechi"])
        .output()
        .await
        .unwrap();
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tree.contains(NODE_BAR) && tree.contains("/node/node2"),
        "busctl tree: {tree}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // node-bar goes again, node3 comes: one added, both removed ones kept.
    let report = drover_manager::reload::reload(&reloader, Ok(config(&["node1", "node3"])))
        .await
        .expect("reload");
    assert_eq!(names(&report.added), ["node3"]);
    assert_eq!(names(&report.kept), ["node2", "node-bar"]);
    assert_eq!(
        children(&f.introspect(NODES).await),
        ["node1", "node2", "node3", "node_2dbar"]
    );
    // The added node registers: its object is the one announced.
    let mut signals = f.signals("/org/eclipse/bluechi/node/node3", PROPS).await;
    let _agent = f.agent("node3", reply_empty()).await;
    wait_changed(&mut signals, "Status", "online").await;
}

/// A reload that adds a node (offline until it registers) turns `up` into
/// `degraded`, and says so with `PropertiesChanged`, as a node going away would.
#[tokio::test]
async fn a_reload_adding_nodes_announces_the_controller_status() {
    let f = Fixture::start(config(&["node1"])).await;
    let mut ctrl_signals = f.signals(CONTROLLER, PROPS).await;
    let _agent = f.agent("node1", reply_empty()).await;
    wait_changed(&mut ctrl_signals, "Status", "up").await;
    let reloader = f.manager().reloader().clone();
    let report = drover_manager::reload::reload(&reloader, Ok(config(&["node1", "node-bar"])))
        .await
        .expect("reload");
    assert_eq!(report.added.len(), 1);
    wait_changed(&mut ctrl_signals, "Status", "degraded").await;
    let status: String = f.get_property(CONTROLLER, CTRL_IFACE, "Status").await;
    assert_eq!(status, "degraded");
}

/// `io.drover.Controller.Reload` on a manager started as a library (no
/// configuration source, as in these tests): a clear failure, nothing changed.
#[tokio::test]
async fn reload_without_a_configuration_source_fails_clearly() {
    let f = Fixture::start(config(&["node1"])).await;
    let res: zbus::Result<()> = f
        .call(CONTROLLER, DROVER_CONTROLLER_IFACE, "Reload", &())
        .await;
    let err = format!("{res:?}");
    assert!(
        err.contains("Failed") && err.contains("without a configuration source"),
        "{err}"
    );
    assert_eq!(f.list_nodes().await.len(), 1);
}
