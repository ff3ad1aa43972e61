//! The rest of `org.eclipse.bluechi.Node` and the Controller's
//! ListUnitFiles / SetLogLevel / metrics against fake agents: what reaches
//! the agent, how its replies come back, and that bad arguments get the
//! documented error with nothing sent.

mod common;

use common::*;
use drover_bus::marshal;
use drover_bus::systemd::UnitTuple;
use drover_protocol::{Event, Request, Response, ToManager, UnitName};
use drover_testkit::agent::job_done;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use zbus::{OwnedObjectPath, OwnedVariant};

const NODE1: &str = "/org/eclipse/bluechi/node/node1";
const CTRL_IFACE: &str = CONTROLLER_IFACE;

type Change = (String, String, String);

fn unit(s: &str) -> UnitName {
    unit_name(s)
}

/// An agent that answers each request like a node's systemd would.
fn systemd_like() -> Behavior {
    Arc::new(|id, req| {
        let result = match req {
            Request::GetUnitProperties { .. } => {
                let mut props: HashMap<String, OwnedVariant> = HashMap::new();
                props.insert(
                    "ActiveState".into(),
                    zbus::Variant::from("active").try_into_owned().unwrap(),
                );
                props.insert("MainPID".into(), OwnedVariant::from(42u32));
                Ok(Response::Value(marshal::encode(&props).unwrap()))
            }
            Request::GetUnitProperty { .. } => Ok(Response::Value(
                marshal::encode(&zbus::Variant::from(1234u64)).unwrap(),
            )),
            Request::EnableUnitFiles { .. } => Ok(Response::Changes {
                carries_install_info: true,
                changes: vec![(
                    "symlink".into(),
                    "/etc/systemd/system/multi-user.target.wants/a.service".into(),
                    "/usr/lib/systemd/system/a.service".into(),
                )],
            }),
            Request::DisableUnitFiles { .. } | Request::SetDefaultTarget { .. } => {
                Ok(Response::Changes {
                    carries_install_info: false,
                    changes: vec![("unlink".into(), "/etc/x".into(), String::new())],
                })
            }
            Request::ListUnitFiles => Ok(Response::UnitFiles(vec![(
                "/usr/lib/systemd/system/a.service".into(),
                "enabled".into(),
            )])),
            Request::GetUnitFileState { .. } => Ok(Response::Text("enabled".into())),
            Request::GetDefaultTarget => Ok(Response::Text("multi-user.target".into())),
            _ => Ok(Response::Empty),
        };
        let mut out = vec![ToManager::Reply { id, result }];
        if let Request::StartTransientUnit { job_id, .. } = req {
            out.push(job_done(*job_id, "done"));
        }
        out
    })
}

/// Controller `method` succeeds once, and fails with `Failed` when repeated.
async fn once_only(f: &Fixture, method: &str) {
    let () = f.call(CONTROLLER, CTRL_IFACE, method, &()).await.unwrap();
    let res = f.call::<_, ()>(CONTROLLER, CTRL_IFACE, method, &()).await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.Failed");
}

#[tokio::test]
async fn every_node_member_is_forwarded_and_answered() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", systemd_like()).await;

    let props: HashMap<String, OwnedVariant> = f
        .call(
            NODE1,
            NODE_IFACE,
            "GetUnitProperties",
            &("a.service", "org.freedesktop.systemd1.Unit"),
        )
        .await
        .unwrap();
    assert_eq!(
        String::try_from(props["ActiveState"].clone()).unwrap(),
        "active"
    );
    assert_eq!(u32::try_from(props["MainPID"].clone()).unwrap(), 42);
    assert_eq!(
        agent.last_request(),
        Request::GetUnitProperties {
            unit: unit("a.service"),
            interface: "org.freedesktop.systemd1.Unit".into()
        }
    );

    let v: OwnedVariant = f
        .call(
            NODE1,
            NODE_IFACE,
            "GetUnitProperty",
            &("a.service", "", "ActiveEnterTimestamp"),
        )
        .await
        .unwrap();
    assert_eq!(u64::try_from(v).unwrap(), 1234);

    let keyvalues = vec![("CPUWeight".to_owned(), zbus::Variant::from(200u64))];
    let () = f
        .call(
            NODE1,
            NODE_IFACE,
            "SetUnitProperties",
            &("a.service", true, keyvalues),
        )
        .await
        .unwrap();
    match agent.last_request() {
        Request::SetUnitProperties {
            unit: u,
            runtime,
            properties,
        } => {
            assert_eq!((u.as_str(), runtime), ("a.service", true));
            assert_eq!(properties.signature, "a(sv)");
        }
        other => panic!("{other:?}"),
    }

    let (info, changes): (bool, Vec<Change>) = f
        .call(
            NODE1,
            NODE_IFACE,
            "EnableUnitFiles",
            &(vec!["a.service"], false, true),
        )
        .await
        .unwrap();
    assert!(info);
    assert_eq!(changes[0].0, "symlink");
    assert_eq!(
        agent.last_request(),
        Request::EnableUnitFiles {
            files: vec!["a.service".into()],
            runtime: false,
            force: true
        }
    );
    let changes: Vec<Change> = f
        .call(
            NODE1,
            NODE_IFACE,
            "DisableUnitFiles",
            &(vec!["/etc/systemd/system/a.service"], true),
        )
        .await
        .unwrap();
    assert_eq!(changes[0].0, "unlink");

    let files: Vec<(String, String)> = f
        .call(NODE1, NODE_IFACE, "ListUnitFiles", &())
        .await
        .unwrap();
    assert_eq!(files[0].1, "enabled");
    let state: String = f
        .call(NODE1, NODE_IFACE, "GetUnitFileState", &("a.service",))
        .await
        .unwrap();
    assert_eq!(state, "enabled");

    for (method, want) in [
        (
            "FreezeUnit",
            Request::FreezeUnit {
                unit: unit("a.service"),
            },
        ),
        (
            "ThawUnit",
            Request::ThawUnit {
                unit: unit("a.service"),
            },
        ),
        (
            "ResetFailedUnit",
            Request::ResetFailedUnit {
                unit: unit("a.service"),
            },
        ),
    ] {
        let () = f
            .call(NODE1, NODE_IFACE, method, &("a.service",))
            .await
            .unwrap();
        assert_eq!(agent.last_request(), want, "{method}");
    }
    let () = f.call(NODE1, NODE_IFACE, "ResetFailed", &()).await.unwrap();
    assert_eq!(agent.last_request(), Request::ResetFailed);
    let () = f
        .call(NODE1, NODE_IFACE, "KillUnit", &("a.service", "main", 15i32))
        .await
        .unwrap();
    assert_eq!(
        agent.last_request(),
        Request::KillUnit {
            unit: unit("a.service"),
            whom: "main".into(),
            signal: 15
        }
    );
    let target: String = f
        .call(NODE1, NODE_IFACE, "GetDefaultTarget", &())
        .await
        .unwrap();
    assert_eq!(target, "multi-user.target");
    let _: Vec<Change> = f
        .call(
            NODE1,
            NODE_IFACE,
            "SetDefaultTarget",
            &("graphical.target", false),
        )
        .await
        .unwrap();
    assert_eq!(
        agent.last_request(),
        Request::SetDefaultTarget {
            target: unit("graphical.target"),
            force: false
        }
    );
    let () = f
        .call(NODE1, NODE_IFACE, "SetLogLevel", &("DEBUG",))
        .await
        .unwrap();
    assert_eq!(
        agent.last_request(),
        Request::SetLogLevel {
            level: "DEBUG".into()
        }
    );
}

#[tokio::test]
async fn transient_units_are_real_jobs() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", systemd_like()).await;
    let mut jobs = f.signals(CONTROLLER, CTRL_IFACE).await;
    let props = vec![(
        "ExecStart".to_owned(),
        zbus::Variant::from(vec![(
            "/bin/true".to_owned(),
            vec!["/bin/true".to_owned()],
            false,
        )]),
    )];
    let aux: Vec<(String, Vec<(String, zbus::Variant<'_>)>)> = Vec::new();
    let path: OwnedObjectPath = f
        .call(
            NODE1,
            NODE_IFACE,
            "StartTransientUnit",
            &("run-x.service", "replace", props, aux),
        )
        .await
        .unwrap();
    assert!(path.as_str().starts_with("/org/eclipse/bluechi/job/"));
    let (first, _) = next_signal(&mut jobs).await;
    let (second, msg) = next_signal(&mut jobs).await;
    assert_eq!((first.as_str(), second.as_str()), ("JobNew", "JobRemoved"));
    let (_, job, node, u, result): (u32, OwnedObjectPath, String, String, String) =
        msg.body().deserialize().unwrap();
    assert_eq!(
        (job, node.as_str(), u.as_str(), result.as_str()),
        (path, "node1", "run-x.service", "done")
    );
    match agent.last_request() {
        Request::StartTransientUnit {
            unit: u,
            mode,
            properties,
            aux,
            ..
        } => {
            assert_eq!((u.as_str(), mode.as_str()), ("run-x.service", "replace"));
            assert_eq!(
                (properties.signature.as_str(), aux.signature.as_str()),
                ("a(sv)", "a(sa(sv))")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn bad_node_arguments_are_invalid_args_and_reach_no_agent() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", systemd_like()).await;
    async fn invalid<B>(f: &Fixture, method: &str, body: &B)
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        let err = f
            .conn
            .call_method(Some(BUS_NAME), NODE1, Some(NODE_IFACE), method, body)
            .await
            .err()
            .unwrap_or_else(|| panic!("{method} must fail"));
        assert_eq!(error_of(&err).0, INVALID_ARGS, "{method}: {err}");
    }
    invalid(&f, "KillUnit", &("a.service", "main", 0i32)).await;
    invalid(&f, "KillUnit", &("a.service", "main", 65i32)).await;
    invalid(&f, "KillUnit", &("a.service", "main", -9i32)).await;
    invalid(&f, "KillUnit", &("a.service", "everyone", 15i32)).await;
    invalid(&f, "KillUnit", &("bad name", "main", 15i32)).await;
    invalid(&f, "FreezeUnit", &("no-suffix",)).await;
    invalid(&f, "ThawUnit", &("",)).await;
    invalid(&f, "ResetFailedUnit", &("a b.service",)).await;
    invalid(&f, "GetUnitProperties", &("a.service", "not an interface")).await;
    invalid(&f, "GetUnitProperty", &("a.service", "", "bad property!")).await;
    invalid(&f, "SetLogLevel", &("LOUD",)).await;
    invalid(&f, "SetLogLevel", &("debug",)).await;
    invalid(&f, "SetDefaultTarget", &("a.service", false)).await;
    invalid(&f, "GetUnitFileState", &("relative/path",)).await;
    invalid(
        &f,
        "EnableUnitFiles",
        &(vec!["ok.service", "bad"], false, false),
    )
    .await;
    invalid(
        &f,
        "StartTransientUnit",
        &(
            "x.service",
            "sometimes",
            Vec::<(String, zbus::Variant<'_>)>::new(),
            Vec::<(String, Vec<(String, zbus::Variant<'_>)>)>::new(),
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(agent.request_count(), 0, "nothing reached the agent");
}

#[tokio::test]
async fn offline_node_members_answer_offline() {
    let f = Fixture::start(config(&["node1"])).await;
    let res = f
        .call::<_, ()>(NODE1, NODE_IFACE, "FreezeUnit", &("a.service",))
        .await;
    assert_eq!(error_name(res), "org.eclipse.bluechi.Offline");
}

#[tokio::test]
async fn controller_log_level_unit_files_and_metrics() {
    let f = Fixture::start(config(&["node1", "node2"])).await;
    let agent = f.agent("node1", systemd_like()).await;
    let _agent2 = f.agent("node2", systemd_like()).await;

    // Log level: valid words only; a refused one changes nothing.
    let () = f
        .call(CONTROLLER, CTRL_IFACE, "SetLogLevel", &("DEBUG",))
        .await
        .unwrap();
    assert_eq!(
        f.get_property::<String>(CONTROLLER, CTRL_IFACE, "LogLevel")
            .await,
        "DEBUG"
    );
    let res = f
        .call::<_, ()>(CONTROLLER, CTRL_IFACE, "SetLogLevel", &("VERBOSE",))
        .await;
    assert_eq!(error_name(res), INVALID_ARGS);
    assert_eq!(
        f.get_property::<String>(CONTROLLER, CTRL_IFACE, "LogLevel")
            .await,
        "DEBUG"
    );

    // Unit files of every online node.
    let all: HashMap<String, Vec<(String, String)>> = f
        .call(CONTROLLER, CTRL_IFACE, "ListUnitFiles", &())
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all["node1"][0].1, "enabled");

    // Metrics: enable twice fails, the object appears, agents are told,
    // the agent's job metrics come back as a signal.
    let mut metrics = f.signals(METRICS_PATH, METRICS_IFACE).await;
    once_only(&f, "EnableMetrics").await;
    let xml = f.introspect(METRICS_PATH).await;
    assert!(
        xml.contains(r#"<signal name="StartUnitJobMetrics">"#),
        "{xml}"
    );
    assert!(xml.contains(r#"<signal name="AgentJobMetrics">"#), "{xml}");
    agent.wait_for_request(&Request::EnableMetrics).await;
    let metrics_event = Event::JobMetrics {
        unit: unit("a.service"),
        method: "StartUnit".into(),
        micros: 777,
    };
    agent.event(metrics_event).await;
    let (member, msg) = next_signal(&mut metrics).await;
    assert_eq!(member, "AgentJobMetrics");
    let body: (String, String, String, u64) = msg.body().deserialize().unwrap();
    assert_eq!(
        body,
        ("node1".into(), "a.service".into(), "StartUnit".into(), 777)
    );
    // A start job reports gross and net time after it ends.
    let path: OwnedObjectPath = f
        .call(NODE1, NODE_IFACE, "StartUnit", &("a.service", "replace"))
        .await
        .unwrap();
    agent.send(job_done(1, "done")).await;
    let (member, msg) = next_signal(&mut metrics).await;
    assert_eq!(member, "StartUnitJobMetrics");
    let (node, job, u, _gross, net): (String, String, String, u64, u64) =
        msg.body().deserialize().unwrap();
    assert_eq!(
        (node.as_str(), job.as_str(), u.as_str(), net),
        ("node1", path.as_str(), "a.service", 0),
        "both timestamps are 1234 in this fake, so the net time is 0"
    );

    once_only(&f, "DisableMetrics").await;
    let err = f
        .call::<_, String>(METRICS_PATH, INTROSPECTABLE_IFACE, "Introspect", &())
        .await;
    // The object is gone: zbus answers an empty node or UnknownObject.
    if let Ok(xml) = err {
        assert!(!xml.contains("org.eclipse.bluechi.Metrics"), "{xml}");
    }
}

/// Issue 14.2: a request whose frame would exceed the cap is refused to its
/// caller with `LimitsExceeded` and the sizes; nothing is sent, and the node's
/// session (and its other calls) go on as if it never happened.
#[tokio::test]
async fn an_oversized_request_is_refused_and_the_node_stays_connected() {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", systemd_like()).await;
    let big = "x".repeat(2 << 20);
    let set: Vec<(&str, zbus::Variant<'_>)> =
        vec![("Description", zbus::Variant::from(big.as_str()))];
    let res = f
        .call::<_, ()>(
            NODE1,
            NODE_IFACE,
            "SetUnitProperties",
            &("a.service", true, set),
        )
        .await;
    let (name, message) = error_of(&res.unwrap_err());
    assert_eq!(
        name, "org.freedesktop.DBus.Error.LimitsExceeded",
        "{message}"
    );
    assert!(
        message.contains("1048576") && message.contains("node1"),
        "the sizes and the node are said: {message}"
    );
    assert_eq!(agent.request_count(), 0, "nothing reached the agent");

    // The session lives on: the next call is answered by the same agent.
    let state: String = f
        .call(NODE1, NODE_IFACE, "GetUnitFileState", &("a.service",))
        .await
        .unwrap();
    assert_eq!(state, "enabled");
    let status: String = f
        .client()
        .await
        .get_property(NODE1, NODE_IFACE, "Status")
        .await;
    assert_eq!(status, "online");
}

/// Issue 14.3: a list reply that comes in parts reaches the caller as one
/// list, rows in the agent's order.
#[tokio::test]
async fn a_list_reply_in_parts_is_joined() {
    use drover_protocol::UnitInfo;
    let row = |i: usize| UnitInfo {
        name: format!("u{i:04}.service"),
        description: format!("unit {i}"),
        load_state: "loaded".into(),
        active_state: "inactive".into(),
        sub_state: "dead".into(),
        followed: String::new(),
        object_path: format!("/org/freedesktop/systemd1/unit/u{i:04}_2eservice"),
        job_id: 0,
        job_type: String::new(),
        job_path: "/".into(),
    };
    let f = Fixture::start(config(&["node1"])).await;
    let _agent = f
        .agent(
            "node1",
            Arc::new(move |id, req| match req {
                Request::ListUnits => vec![
                    ToManager::ReplyPart {
                        id,
                        part: Response::Units((0..3).map(row).collect()),
                    },
                    ToManager::ReplyPart {
                        id,
                        part: Response::Units((3..5).map(row).collect()),
                    },
                    ToManager::Reply {
                        id,
                        result: Ok(Response::Units(vec![row(5)])),
                    },
                ],
                _ => vec![ToManager::Reply {
                    id,
                    result: Ok(Response::Empty),
                }],
            }),
        )
        .await;
    let units: Vec<UnitTuple> = f.call(NODE1, NODE_IFACE, "ListUnits", &()).await.unwrap();
    let names: Vec<&str> = units.iter().map(|u| u.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "u0000.service",
            "u0001.service",
            "u0002.service",
            "u0003.service",
            "u0004.service",
            "u0005.service"
        ]
    );
    let all: HashMap<String, Vec<UnitTuple>> = f
        .call(CONTROLLER, CTRL_IFACE, "ListUnits", &())
        .await
        .unwrap();
    assert_eq!(all["node1"].len(), 6);
}
