//! Admission by pattern (`AllowedNodeNames=edge-*`) against fake agents: a
//! matching name registers without being listed, its D-Bus object appears at
//! its first registration and stays (offline) after it leaves; other names
//! are refused as unlisted ones are; `Allowed=false` narrows a pattern; a
//! reload adding or removing a pattern admits or drops names.

mod common;

use common::*;
use drover_config::{ManagerConfig, NodePattern, NodeSection};
use drover_protocol::RefuseReason;
use drover_protocol::link::HandshakeError;
use zbus::OwnedObjectPath;

const EDGE1: &str = "/org/eclipse/bluechi/node/edge_2d1";

fn with_patterns(names: &[&str], patterns: &[&str]) -> ManagerConfig {
    ManagerConfig {
        allowed_patterns: patterns
            .iter()
            .map(|p| NodePattern::new(p).unwrap())
            .collect(),
        ..config(names)
    }
}

/// Asserts a registration as `name` is refused as an unlisted node, and
/// returns the message the agent got.
async fn refused_unknown(f: &Fixture, name: &str) -> String {
    match FakeAgent::connect(f.addr, name, reply_empty()).await {
        Err(HandshakeError::Refused {
            reason: RefuseReason::UnknownNode,
            message,
        }) => message,
        other => panic!(
            "{name} must be refused as unknown, got {:?}",
            other.map(|a| a.accepted.clone())
        ),
    }
}

async fn get_node(f: &Fixture, name: &str) -> zbus::Result<OwnedObjectPath> {
    f.call(CONTROLLER, CONTROLLER_IFACE, "GetNode", &(name,))
        .await
}

#[tokio::test]
async fn a_pattern_admits_matching_names_and_their_objects_stay_after_they_leave() {
    let mut config = with_patterns(&["db1"], &["edge-*", "lab-??"]);
    config.nodes = vec![NodeSection {
        name: node_name("edge-9"),
        allowed: Some(false),
        allow_dependencies_on: Vec::new(),
    }];
    let f = Fixture::start(config).await;
    // Only the configured name has an object at start, offline.
    assert_eq!(
        f.list_nodes().await,
        [("db1".into(), "offline".into(), String::new())]
    );
    assert_eq!(
        error_name(get_node(&f, "edge-1").await),
        "org.freedesktop.DBus.Error.ServiceUnknown"
    );

    // Names no pattern matches, and a matching name with Allowed=false.
    for name in ["lab-1", "edge", "xedge-1", "edge-9"] {
        let message = refused_unknown(&f, name).await;
        assert!(
            message.contains(name) && message.contains("AllowedNodeNames"),
            "{message}"
        );
    }
    assert_eq!(f.list_nodes().await.len(), 1, "refused names never appear");

    let mut edge_signals = f.signals(EDGE1, PROPERTIES_IFACE).await;
    let edge = f.agent("edge-1", reply_empty()).await;
    let _lab = f.agent("lab-42", reply_empty()).await;
    assert_eq!(
        get_node(&f, "edge-1").await.expect("edge-1 has its object"),
        OwnedObjectPath::try_from(EDGE1).unwrap()
    );
    let status: String = f.get_property(EDGE1, NODE_IFACE, "Status").await;
    assert_eq!(status, "online");
    let nodes = f.list_nodes().await;
    let names: Vec<&str> = nodes.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(names, ["db1", "edge-1", "lab-42"]);

    // It leaves: offline, but still there for BlueChi clients.
    drop(edge);
    wait_changed(&mut edge_signals, "Status", "offline").await;
    let status: String = f.get_property(EDGE1, NODE_IFACE, "Status").await;
    assert_eq!(status, "offline");
    assert!(
        f.list_nodes()
            .await
            .contains(&("edge-1".into(), "offline".into(), String::new()))
    );
    // And comes back to the same object.
    let _edge = f.agent("edge-1", reply_empty()).await;
    wait_changed(&mut edge_signals, "Status", "online").await;
    assert_eq!(f.list_nodes().await.len(), 3);
}

#[tokio::test]
async fn a_reload_adding_a_pattern_admits_new_names_and_removing_it_drops_them() {
    let f = Fixture::start(config(&["db1"])).await;
    refused_unknown(&f, "edge-1").await;
    let reloader = f.manager().reloader().clone();

    let report =
        drover_manager::reload::reload(&reloader, Ok(with_patterns(&["db1"], &["edge-*"])))
            .await
            .expect("reload");
    assert!(report.added.is_empty(), "a pattern configures no node");
    let mut edge_signals = f.signals(EDGE1, PROPERTIES_IFACE).await;
    let _edge = f.agent("edge-1", reply_empty()).await;
    get_node(&f, "edge-1").await.expect("edge-1 has its object");

    // The pattern goes: the session is dropped, the object stays offline.
    let report = drover_manager::reload::reload(&reloader, Ok(config(&["db1"])))
        .await
        .expect("reload");
    assert_eq!(
        report
            .dropped
            .iter()
            .map(|d| d.0.as_str())
            .collect::<Vec<_>>(),
        ["edge-1"]
    );
    assert_eq!(
        report.kept.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        ["edge-1"]
    );
    wait_changed(&mut edge_signals, "Status", "offline").await;
    refused_unknown(&f, "edge-1").await;
    assert!(
        f.list_nodes()
            .await
            .contains(&("edge-1".into(), "offline".into(), String::new()))
    );
}
