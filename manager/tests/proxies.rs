//! Cross-node dependencies against fake agents: what the requesting and the
//! target agents are told, and what `io.drover.Controller.ListProxies` shows.

mod common;

use common::*;
use drover_config::{ManagerConfig, NodeSection};
use drover_protocol::{
    Event, NodeName, Notice, Reason, RemoteError, Request, Response, TargetChange, UnitName,
};
use std::time::Duration;

const DROVER_IFACE: &str = DROVER_CONTROLLER_IFACE;

type Row = (String, String, String, String, String, u32);

fn nn(s: &str) -> NodeName {
    node_name(s)
}

fn un(s: &str) -> UnitName {
    unit_name(s)
}

/// Nodes a, b, c; a may depend on b; c may not depend on anything.
fn proxy_config(grace_ms: u64) -> ManagerConfig {
    let mut c = config(&["a", "b", "c"]);
    c.nodes.push(NodeSection {
        name: nn("a"),
        allowed: None,
        allow_dependencies_on: vec![nn("b")],
    });
    c.proxy_grace_period_ms = Some(grace_ms);
    c
}

async fn list(f: &Fixture) -> Vec<Row> {
    f.call(CONTROLLER, DROVER_IFACE, "ListProxies", &())
        .await
        .expect("ListProxies")
}

fn start_dep(unit: &str) -> Request {
    Request::StartDep { unit: un(unit) }
}

fn stop_dep(unit: &str) -> Request {
    Request::StopDep { unit: un(unit) }
}

/// `agent` announces (`new`) or withdraws its proxy `proxy_id` of `unit` on `node`.
async fn proxy_event(agent: &FakeAgent, new: bool, node: &str, unit: &str, proxy_id: u64) {
    let (node, unit) = (nn(node), un(unit));
    agent
        .event(match new {
            true => Event::ProxyNew {
                node,
                unit,
                proxy_id,
                template: drover_protocol::ProxyTemplate::Drover,
            },
            false => Event::ProxyRemoved {
                node,
                unit,
                proxy_id,
            },
        })
        .await;
}

async fn proxy_new(agent: &FakeAgent, node: &str, unit: &str, proxy_id: u64) {
    proxy_event(agent, true, node, unit, proxy_id).await;
}

async fn proxy_removed(agent: &FakeAgent, node: &str, unit: &str, proxy_id: u64) {
    proxy_event(agent, false, node, unit, proxy_id).await;
}

/// The target agent reports `unit` loaded and in `active` state (real).
async fn target_state(agent: &FakeAgent, unit: &str, index: u64, active: &str) {
    agent.unit_state(index, unit, active, "running").await;
}

/// The manager (nodes a, b, c; grace period `grace_ms`), with b's agent answering as
/// `b_answers` says, then a's agent: (fixture, b, a).
async fn a_and_b(grace_ms: u64, b_answers: Behavior) -> (Fixture, FakeAgent, FakeAgent) {
    let f = Fixture::start(proxy_config(grace_ms)).await;
    let b = f.agent("b", b_answers).await;
    let a = f.agent("a", reply_empty()).await;
    (f, b, a)
}

/// a announces its proxy 1 of db.service on b; returns once b was asked to start the dep.
async fn db_wanted(a: &FakeAgent, b: &FakeAgent) {
    proxy_new(a, "b", "db.service", 1).await;
    b.wait_for("StartDep", |r| r.count(&start_dep("db.service")) == 1)
        .await;
}

#[tokio::test]
async fn proxy_lifecycle_notices_and_list() {
    let (f, b, a) = a_and_b(5_000, reply_empty()).await;
    let c = f.agent("c", reply_empty()).await;
    assert!(list(&f).await.is_empty());

    proxy_new(&a, "b", "db.service", 1).await;
    b.wait_for("StartDep and SubscribeState on b", |r| {
        r.count(&start_dep("db.service")) == 1
            && r.count(&Request::SubscribeState {
                unit: un("db.service"),
            }) == 1
    })
    .await;
    assert_eq!(
        list(&f).await,
        [(
            "a".into(),
            "b".into(),
            "db.service".into(),
            "waiting".into(),
            "unknown".into(),
            1
        )]
    );
    // b's agent reports the target; a hears it, in order. (This fake agent
    // confirms StartDep before it reports the target, so the confirmation
    // may be applied before that news — relayed as it comes — or after it —
    // held back, then replayed as the state known: both end active.)
    b.unit_new(1, "db.service", Reason::Real).await;
    target_state(&b, "db.service", 2, "activating").await;
    target_state(&b, "db.service", 3, "active").await;
    let is_active = |n: &Notice| matches!(n, Notice::ProxyTarget { proxy_id: 1, change: TargetChange::State { active_state, .. } } if active_state == "active");
    a.wait_for("a is told the target is active", |r| {
        r.notices.iter().any(is_active)
    })
    .await;
    let got = a.notices();
    assert!(
        matches!(
            got[0],
            Notice::ProxyTarget {
                proxy_id: 1,
                change: TargetChange::New { .. }
            }
        ),
        "{got:?}"
    );
    assert!(
        got.len() <= 3 && got.last().is_some_and(is_active),
        "{got:?}"
    );
    assert_eq!(
        list(&f).await,
        [(
            "a".into(),
            "b".into(),
            "db.service".into(),
            "active".into(),
            "active".into(),
            1
        )]
    );

    // Not allowed, and an unknown (but valid) node name: ProxyError.
    proxy_new(&c, "b", "db.service", 7).await;
    proxy_new(&a, "nosuch", "db.service", 2).await;
    c.wait_for("c is refused", |r| !r.notices.is_empty()).await;
    assert_eq!(
        c.notices(),
        [Notice::ProxyError {
            proxy_id: 7,
            message:
                "node c may not depend on units of node b: add b to AllowDependenciesOn in [node c]"
                    .into()
        }]
    );
    let told = got.len();
    a.wait_for("a is refused for nosuch", |r| r.notices.len() == told + 1)
        .await;
    assert_eq!(
        a.notices()[told],
        Notice::ProxyError {
            proxy_id: 2,
            message: "no such node nosuch".into()
        }
    );
    let rows = list(&f).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[1],
        (
            "c".into(),
            "b".into(),
            "db.service".into(),
            "failed".into(),
            "active".into(),
            1
        )
    );
    assert_eq!(
        b.count(&start_dep("db.service")),
        1,
        "refusals send nothing"
    );

    // The proxy goes: StopDep, the target is no longer watched.
    proxy_removed(&a, "b", "db.service", 1).await;
    b.wait_for("StopDep on b", |r| r.count(&stop_dep("db.service")) == 1)
        .await;
    b.wait_for("Unsubscribe on b", |r| {
        r.count(&Request::Unsubscribe {
            unit: Some(un("db.service")),
        }) == 1
    })
    .await;
    assert_eq!(
        list(&f)
            .await
            .iter()
            .map(|r| r.3.as_str())
            .collect::<Vec<_>>(),
        ["failed"]
    );
}

#[tokio::test]
async fn failing_start_dep_reaches_the_requester_with_the_agents_message() {
    let b_answers = reply_with(|req| match req {
        Request::StartDep { unit } => Err(RemoteError::new(
            "org.freedesktop.systemd1.NoSuchUnit",
            format!("unit {unit} on node b cannot be started: not found"),
        )),
        _ => Ok(Response::Empty),
    });
    let (f, b, a) = a_and_b(5_000, b_answers).await;
    proxy_new(&a, "b", "nope.service", 3).await;
    a.wait_for("a gets ProxyError", |r| !r.notices.is_empty())
        .await;
    assert_eq!(
        a.notices(),
        [Notice::ProxyError {
            proxy_id: 3,
            message: "unit nope.service on node b cannot be started: not found".into()
        }]
    );
    // The failed want is withdrawn on b.
    b.wait_for("StopDep after the failure", |r| {
        r.count(&stop_dep("nope.service")) == 1
    })
    .await;
    assert_eq!(list(&f).await[0].3, "failed");
}

#[tokio::test]
async fn requester_disconnects_within_and_past_the_grace_period() {
    let (f, b, a) = a_and_b(1_500, reply_empty()).await;
    db_wanted(&a, &b).await;

    // Away (the manager has seen it go: the grace period runs) and back within
    // the grace period, with a new proxy id: nothing happens on b, also once
    // the grace period would have ended.
    let a_path = drover_bus::bluechi::node_path("a");
    let mut a_status = f.signals(&a_path, PROPERTIES_IFACE).await;
    drop(a);
    wait_changed(&mut a_status, "Status", "offline").await;
    let a = f.agent("a", reply_empty()).await;
    proxy_new(&a, "b", "db.service", 100).await;
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert_eq!(b.count(&start_dep("db.service")), 1);
    assert_eq!(b.count(&stop_dep("db.service")), 0);
    assert_eq!(list(&f).await.len(), 1);

    // Away for good: the reference goes after the grace period.
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.count(&stop_dep("db.service")), 0, "still in grace");
    b.wait_for("StopDep after the grace period", |r| {
        r.count(&stop_dep("db.service")) == 1
    })
    .await;
    assert!(list(&f).await.is_empty());
}

#[tokio::test]
async fn target_node_offline_past_grace_stops_active_proxies() {
    let (f, b, a) = a_and_b(500, reply_empty()).await;
    proxy_new(&a, "b", "db.service", 1).await;
    b.wait_for("SubscribeState", |r| {
        r.count(&Request::SubscribeState {
            unit: un("db.service"),
        }) == 1
    })
    .await;
    target_state(&b, "db.service", 1, "active").await;
    a.wait_for("active", |r| !r.notices.is_empty()).await;
    assert_eq!(list(&f).await[0].3, "active");
    drop(b);
    // Virtual offline news first (ignored by agents), then past the grace
    // period the real stop that makes agent a stop its proxy unit.
    a.wait_for("a is told b is gone for real", |r| {
        r.notices.iter().any(|n| {
            matches!(n, Notice::ProxyTarget { proxy_id: 1, change: TargetChange::State { active_state, sub_state, reason: Reason::Real } }
                if active_state == "inactive" && sub_state == "agent-offline")
        })
    })
    .await;
    let virtual_first = a.notices().iter().position(|n| {
        matches!(
            n,
            Notice::ProxyTarget {
                change: TargetChange::State {
                    reason: Reason::Virtual,
                    ..
                },
                ..
            }
        )
    });
    assert!(virtual_first.is_some(), "{:?}", a.notices());
    assert!(list(&f).await.is_empty(), "the proxy ended");
    // b comes back: the dep nobody wants any more is stopped.
    let b = f.agent("b", reply_empty()).await;
    b.wait_for("StopDep on the returning b", |r| {
        r.count(&stop_dep("db.service")) == 1
    })
    .await;
}

#[tokio::test]
async fn reload_revokes_permissions_and_adds_nodes() {
    let (f, b, a) = a_and_b(5_000, reply_empty()).await;
    db_wanted(&a, &b).await;
    let reloader = f.manager().reloader().clone();

    // A config that does not load changes nothing.
    let bad = ManagerConfig::parse_str("[drover-manager]\nNoSuchKey=1\n");
    assert!(
        drover_manager::reload::reload(&reloader, bad)
            .await
            .is_err()
    );
    assert_eq!(list(&f).await.len(), 1);

    // a loses its permission on b; d is a new node.
    let mut new = config(&["a", "b", "c", "d"]);
    new.nodes.push(NodeSection {
        name: nn("c"),
        allowed: None,
        allow_dependencies_on: vec![nn("b")],
    });
    let report = drover_manager::reload::reload(&reloader, Ok(new))
        .await
        .expect("reload");
    assert_eq!(report.added, [nn("d")]);
    a.wait_for("a is told", |r| !r.notices.is_empty()).await;
    assert!(
        matches!(&a.notices()[0], Notice::ProxyError { proxy_id: 1, message } if message.contains("revoked")),
        "{:?}",
        a.notices()
    );
    b.wait_for("StopDep", |r| r.count(&stop_dep("db.service")) == 1)
        .await;
    assert!(list(&f).await.is_empty());
    // d is served and may register; c's new permission works.
    let path: zbus::OwnedObjectPath = f
        .call(
            CONTROLLER,
            "org.eclipse.bluechi.Controller",
            "GetNode",
            &("d",),
        )
        .await
        .expect("d is known after the reload");
    assert_eq!(path.as_str(), "/org/eclipse/bluechi/node/d");
    let _d = f.agent("d", reply_empty()).await;
    let c = f.agent("c", reply_empty()).await;
    proxy_new(&c, "b", "db.service", 5).await;
    b.wait_for("c's StartDep", |r| r.count(&start_dep("db.service")) == 2)
        .await;
}

#[tokio::test]
async fn list_proxies_is_introspectable() {
    let f = Fixture::start(proxy_config(5_000)).await;
    let xml = f.introspect(CONTROLLER).await;
    assert!(
        xml.contains(r#"<interface name="io.drover.Controller">"#),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<method name="ListProxies">"#)
            && xml.contains(r#"<arg name="proxies" type="a(sssssu)" direction="out"/>"#),
        "{xml}"
    );
    // BlueChi's interface is untouched by it.
    assert!(xml.contains(r#"<interface name="org.eclipse.bluechi.Controller">"#));
}

fn dep_unit(name: &str, active: &str) -> drover_protocol::UnitInfo {
    drover_protocol::UnitInfo::loaded(name, active, "")
}

/// A fresh manager (as after a restart) meets a target node that still runs
/// dep units: those a requester re-announces within the grace period stay,
/// the others are stopped.
#[tokio::test]
async fn orphan_deps_are_stopped_one_grace_period_after_the_target_registers() {
    let b_answers = reply_with(|req| match req {
        Request::ListUnits => Ok(Response::Units(vec![
            dep_unit("drover-dep@db.service.service", "active"),
            dep_unit("drover-dep@orphan.service.service", "active"),
            dep_unit("drover-dep@gone.service.service", "inactive"),
            dep_unit("db.service", "active"),
        ])),
        _ => Ok(Response::Empty),
    });
    let (f, b, a) = a_and_b(400, b_answers).await;
    proxy_new(&a, "b", "db.service", 1).await;
    b.wait_for("the sweep lists b's units", |r| {
        r.count(&Request::ListUnits) == 1
    })
    .await;
    b.wait_for("the orphan is stopped", |r| {
        r.count(&stop_dep("orphan.service")) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.count(&stop_dep("db.service")), 0, "db is referenced");
    assert_eq!(b.count(&stop_dep("gone.service")), 0, "not running");
    assert_eq!(list(&f).await.len(), 1);
}
