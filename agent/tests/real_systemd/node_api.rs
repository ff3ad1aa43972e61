//! The node API pass-throughs and unit subscriptions against a real
//! `systemd --user` (the parent module's helper starts and tears it down).

use super::*;
use drover_bus::marshal::{self, AuxUnits, PropertyList, PropertyMap};
use drover_protocol::{ModTag, Reason, RemoteError};
use zbus::OwnedVariant;

const INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";

/// The dispatcher on a node's systemd and what it sends the manager in session 1:
/// a request's reply is returned, events that arrive before it are kept in `events`.
struct Session {
    d: Arc<Dispatcher<ZbusSystemd>>,
    rx: mpsc::Receiver<ToManager>,
    events: Vec<Event>,
}

impl Session {
    /// Session 1 (its tags' guid `guid`) on `node`, after a first `Reload`.
    async fn open(node: &SystemdNode, guid: u64) -> Session {
        let (d, rx) = dispatcher(node).await;
        d.shared().session_started(1, guid);
        let mut s = Session {
            d,
            rx,
            events: Vec::new(),
        };
        s.call(1, Request::Reload).await.unwrap();
        s
    }

    /// Sends request `id` and returns its reply.
    async fn call(&mut self, id: u64, req: Request) -> Result<Response, RemoteError> {
        self.d.handle(1, id, req).await;
        loop {
            match next(&mut self.rx).await {
                ToManager::Reply { id: got, result } if got == id => return result,
                ToManager::Event(e) => self.events.push(e),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// A unit property, read with `GetUnitProperty` (request 900).
    async fn get(&mut self, u: &str, iface: &str, prop: &str) -> OwnedVariant {
        let req = Request::GetUnitProperty {
            unit: unit(u),
            interface: iface.into(),
            property: prop.into(),
        };
        let events = self.events.len();
        let r = self.call(900, req).await.unwrap();
        // What arrived meanwhile is not the caller's business.
        self.events.truncate(events);
        value(&r)
    }
}

fn text(v: &OwnedVariant) -> String {
    String::try_from(v.try_clone().unwrap()).unwrap()
}

fn props(m: &Response) -> PropertyMap {
    match m {
        Response::Value(m) => marshal::decode(m).unwrap(),
        other => panic!("expected a value, got {other:?}"),
    }
}

fn value(m: &Response) -> OwnedVariant {
    match m {
        Response::Value(m) => marshal::decode(m).unwrap(),
        other => panic!("expected a value, got {other:?}"),
    }
}

const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pass_through_on_real_systemd() {
    let node = user_systemd("node-api").await;
    node.write_unit(
        "a.service",
        "[Unit]\nDescription=drover a\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n[Install]\nWantedBy=default.target\n",
    );
    node.write_unit("long.service", "[Service]\nExecStart=/bin/sleep infinity\n");
    let mut s = Session::open(&node, 1).await;

    // Properties of a unit nobody loaded yet (GetUnit fails, LoadUnit works).
    let r = s
        .call(
            2,
            Request::GetUnitProperties {
                unit: unit("a.service"),
                interface: UNIT_IFACE.into(),
            },
        )
        .await
        .unwrap();
    let p = props(&r);
    assert_eq!(text(&p["Id"]), "a.service");
    assert_eq!(text(&p["Description"]), "drover a");
    assert_eq!(text(&p["ActiveState"]), "inactive");
    assert!(!p.contains_key("ExecMainPID"), "Unit interface only");
    // Empty interface: every interface merged.
    let r = s
        .call(
            3,
            Request::GetUnitProperties {
                unit: unit("a.service"),
                interface: String::new(),
            },
        )
        .await
        .unwrap();
    let p = props(&r);
    assert_eq!(text(&p["Id"]), "a.service");
    assert_eq!(text(&p["Type"]), "oneshot", "Service properties too");
    assert_eq!(
        text(&s.get("a.service", SERVICE_IFACE, "Type").await),
        "oneshot"
    );
    let e = s
        .call(
            4,
            Request::GetUnitProperty {
                unit: unit("a.service"),
                interface: UNIT_IFACE.into(),
                property: "NoSuchProperty".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        e.name.starts_with("org.freedesktop.DBus.Error."),
        "systemd's error name is kept: {e}"
    );
    let e = s
        .call(
            5,
            Request::GetUnitProperties {
                unit: unit("a.service"),
                interface: "not an interface".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.name, INVALID_ARGS);

    // SetUnitProperties (runtime), read back.
    let list: PropertyList = vec![("CPUWeight".into(), OwnedVariant::from(50u64))];
    s.call(
        6,
        Request::SetUnitProperties {
            unit: unit("a.service"),
            runtime: true,
            properties: marshal::encode(&list).unwrap(),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        u64::try_from(s.get("a.service", SERVICE_IFACE, "CPUWeight").await).unwrap(),
        50
    );

    // Unit files.
    let r = s
        .call(
            7,
            Request::EnableUnitFiles {
                files: vec!["a.service".into()],
                runtime: false,
                force: false,
            },
        )
        .await
        .unwrap();
    match &r {
        Response::Changes {
            carries_install_info,
            changes,
        } => {
            assert!(*carries_install_info);
            assert_eq!(changes.len(), 1, "{changes:?}");
            assert_eq!(changes[0].0, "symlink");
            assert!(
                changes[0].1.ends_with("default.target.wants/a.service"),
                "{changes:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    let r = s
        .call(
            8,
            Request::GetUnitFileState {
                file: "a.service".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(r, Response::Text("enabled".into()));
    match s.call(9, Request::ListUnitFiles).await.unwrap() {
        Response::UnitFiles(files) => assert!(
            files
                .iter()
                .any(|(p, s)| p.ends_with("/a.service") && s == "enabled"),
            "{files:?}"
        ),
        other => panic!("unexpected {other:?}"),
    }
    match s
        .call(
            10,
            Request::DisableUnitFiles {
                files: vec!["a.service".into()],
                runtime: false,
            },
        )
        .await
        .unwrap()
    {
        Response::Changes { changes, .. } => assert_eq!(changes[0].0, "unlink", "{changes:?}"),
        other => panic!("unexpected {other:?}"),
    }
    let r = s
        .call(
            11,
            Request::GetUnitFileState {
                file: "a.service".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(r, Response::Text("disabled".into()));
    let e = s
        .call(
            12,
            Request::GetUnitFileState {
                file: "nope.service".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(e.name.starts_with("org.freedesktop."), "{e}");

    // Default target.
    let r = s.call(13, Request::GetDefaultTarget).await.unwrap();
    assert!(
        matches!(&r, Response::Text(t) if t.ends_with(".target")),
        "{r:?}"
    );
    match s
        .call(
            14,
            Request::SetDefaultTarget {
                target: unit("basic.target"),
                force: true,
            },
        )
        .await
        .unwrap()
    {
        Response::Changes {
            carries_install_info,
            changes,
        } => {
            assert!(!carries_install_info);
            assert!(changes.iter().any(|c| c.0 == "symlink"), "{changes:?}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let r = s.call(15, Request::GetDefaultTarget).await.unwrap();
    assert_eq!(r, Response::Text("basic.target".into()));

    // Kill: bad arguments never reach systemd; a real kill fails the service.
    s.call(16, start("long.service", 1)).await.unwrap();
    let (_, result) = until_done(&mut s.rx, 1).await;
    assert_eq!(result, "done");
    for (whom, signal) in [("main", 0), ("main", 65), ("nobody", 9)] {
        let e = s
            .call(
                17,
                Request::KillUnit {
                    unit: unit("long.service"),
                    whom: whom.into(),
                    signal,
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.name, INVALID_ARGS, "{whom} {signal}");
    }
    assert_eq!(
        text(&s.get("long.service", UNIT_IFACE, "ActiveState").await),
        "active",
        "still running after the refused kills"
    );

    // Freeze / thaw: works where the freezer does (cgroup v2); elsewhere
    // systemd's own error comes back with its name.
    match s
        .call(
            18,
            Request::FreezeUnit {
                unit: unit("long.service"),
            },
        )
        .await
    {
        Ok(_) => {
            assert_eq!(
                text(&s.get("long.service", UNIT_IFACE, "FreezerState").await),
                "frozen"
            );
            s.call(
                19,
                Request::ThawUnit {
                    unit: unit("long.service"),
                },
            )
            .await
            .unwrap();
        }
        Err(e) => {
            assert_ne!(e.name, "org.freedesktop.DBus.Error.Failed", "{e}");
            assert!(e.name.starts_with("org.freedesktop."), "{e}");
            let e2 = s
                .call(
                    19,
                    Request::ThawUnit {
                        unit: unit("long.service"),
                    },
                )
                .await
                .unwrap_err();
            assert!(e2.name.starts_with("org.freedesktop."), "{e2}");
        }
    }

    s.call(
        20,
        Request::KillUnit {
            unit: unit("long.service"),
            whom: "main".into(),
            signal: 9,
        },
    )
    .await
    .unwrap();
    let deadline = Instant::now() + T;
    while text(&s.get("long.service", UNIT_IFACE, "ActiveState").await) != "failed" {
        assert!(Instant::now() < deadline, "SIGKILL fails the service");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.call(
        21,
        Request::ResetFailedUnit {
            unit: unit("long.service"),
        },
    )
    .await
    .unwrap();
    // After reset-failed the unit may be inactive or already unloaded.
    let r = s
        .call(
            22,
            Request::GetUnitProperty {
                unit: unit("long.service"),
                interface: UNIT_IFACE.into(),
                property: "ActiveState".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(text(&value(&r)), "inactive");
    s.call(23, Request::ResetFailed).await.unwrap();

    // Log level words.
    s.call(
        24,
        Request::SetLogLevel {
            level: "DEBUG".into(),
        },
    )
    .await
    .unwrap();
    let e = s
        .call(
            25,
            Request::SetLogLevel {
                level: "LOUD".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.name, INVALID_ARGS);

    // A transient unit is a tracked job; with metrics on, it is measured.
    s.call(26, Request::EnableMetrics).await.unwrap();
    let exec: Vec<(String, Vec<String>, bool)> =
        vec![("/bin/true".into(), vec!["/bin/true".into()], false)];
    let props: PropertyList = vec![
        (
            "Type".into(),
            OwnedVariant::from(zbus::Str::from("oneshot")),
        ),
        (
            "ExecStart".into(),
            OwnedVariant::try_from(zbus::Variant::from(exec)).unwrap(),
        ),
    ];
    let aux: AuxUnits = vec![];
    s.call(
        27,
        Request::StartTransientUnit {
            unit: unit("transient-drover.service"),
            mode: "replace".into(),
            properties: marshal::encode(&props).unwrap(),
            aux: marshal::encode(&aux).unwrap(),
            job_id: 2,
        },
    )
    .await
    .unwrap();
    let (_, result) = until_done(&mut s.rx, 2).await;
    assert_eq!(result, "done");
    match next(&mut s.rx).await {
        ToManager::Event(Event::JobMetrics {
            unit: u,
            method,
            micros,
        }) => {
            assert_eq!(u.as_str(), "transient-drover.service");
            assert_eq!(method, "StartTransientUnit");
            assert!(micros > 0 && micros < 20_000_000, "{micros}");
        }
        other => panic!("expected JobMetrics, got {other:?}"),
    }
    // A transient unit that systemd refuses (no ExecStart for a service).
    let bad: PropertyList = vec![(
        "Type".into(),
        OwnedVariant::from(zbus::Str::from("oneshot")),
    )];
    let e = s
        .call(
            28,
            Request::StartTransientUnit {
                unit: unit("transient-bad.service"),
                mode: "replace".into(),
                properties: marshal::encode(&bad).unwrap(),
                aux: marshal::encode(&aux).unwrap(),
                job_id: 3,
            },
        )
        .await
        .unwrap_err();
    assert!(e.name.starts_with("org.freedesktop."), "{e}");
    s.call(29, Request::DisableMetrics).await.unwrap();
    s.call(30, start("a.service", 4)).await.unwrap();
    until_done(&mut s.rx, 4).await;
    let extra = tokio::time::timeout(Duration::from_millis(300), s.rx.recv()).await;
    assert!(extra.is_err(), "no metrics once disabled: {extra:?}");
    assert!(
        s.events.iter().all(|e| !matches!(e, Event::UnitNew { .. })),
        "nothing subscribed, no unit events: {:?}",
        summaries(&s.events)
    );
}

fn unit_event(e: &Event) -> Option<(ModTag, &str)> {
    match e {
        Event::UnitNew { tag, unit, .. }
        | Event::UnitRemoved { tag, unit, .. }
        | Event::UnitStateChanged { tag, unit, .. }
        | Event::UnitPropertiesChanged { tag, unit, .. } => Some((*tag, unit.as_str())),
        _ => None,
    }
}

/// Unit events (tags checked: guid, consecutive indexes from `first`) until
/// one matches `stop`.
async fn unit_events_until(
    rx: &mut mpsc::Receiver<ToManager>,
    guid: u64,
    next_index: &mut u64,
    stop: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let mut seen = Vec::new();
    loop {
        let ToManager::Event(e) = next(rx).await else {
            continue;
        };
        let Some((tag, _)) = unit_event(&e) else {
            continue;
        };
        assert_eq!(
            tag,
            ModTag::new(guid, *next_index),
            "{} after {:?}",
            summary(&e),
            seen.iter().map(summary).collect::<Vec<_>>()
        );
        *next_index += 1;
        let done = stop(&e);
        seen.push(e);
        if done {
            return seen;
        }
    }
}

/// One line per event, without the marshalled properties.
/// The events sent before the empty, successful reply to request `id`.
async fn events_until_reply(rx: &mut mpsc::Receiver<ToManager>, id: u64) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        match next(rx).await {
            ToManager::Reply { id: got, result } if got == id => {
                assert_eq!(result, Ok(Response::Empty));
                return events;
            }
            ToManager::Event(e) => events.push(e),
            _ => {}
        }
    }
}

fn summary(e: &Event) -> String {
    match e {
        Event::UnitNew { unit, reason, .. } => format!("new {unit} {}", reason.as_str()),
        Event::UnitRemoved { unit, reason, .. } => format!("removed {unit} {}", reason.as_str()),
        Event::UnitStateChanged {
            unit,
            active_state,
            sub_state,
            ..
        } => format!("state {unit} {active_state}/{sub_state}"),
        Event::UnitPropertiesChanged {
            unit, interface, ..
        } => format!("props {unit} {interface}"),
        other => format!("{other:?}"),
    }
}

fn summaries(events: &[Event]) -> Vec<String> {
    events.iter().map(summary).collect()
}

fn is_state(e: &Event, u: &str, active: &str, sub: &str) -> bool {
    matches!(e, Event::UnitStateChanged { unit, active_state, sub_state, .. }
        if unit.as_str() == u && active_state == active && sub_state == sub)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_follows_a_unit_through_start_stop_and_removal() {
    let node = user_systemd("subs").await;
    node.write_unit("w.service", "[Service]\nExecStart=/bin/sleep infinity\n");
    node.write_unit(
        "other.service",
        "[Service]\nExecStart=/bin/sleep infinity\n",
    );
    let mut s = Session::open(&node, 42).await;
    let shared = s.d.shared().clone();
    s.call(
        2,
        Request::Subscribe {
            unit: Some(unit("w.service")),
        },
    )
    .await
    .unwrap();
    assert!(
        s.events.is_empty(),
        "w.service is not loaded: no replay, {:?}",
        summaries(&s.events)
    );
    let e = s
        .call(
            3,
            Request::Subscribe {
                unit: Some(unit("w.service")),
            },
        )
        .await
        .unwrap_err();
    assert!(e.message.contains("already subscribed"), "{e}");

    // Start: real UnitNew, then states up to active/running.
    s.call(4, start("w.service", 1)).await.unwrap();
    s.call(5, start("other.service", 2)).await.unwrap();
    let mut index = 1;
    let mut seen = s.events.clone();
    seen.retain(|e| unit_event(e).is_some());
    for e in &seen {
        assert_eq!(unit_event(e).map(|t| t.0), Some(ModTag::new(42, index)));
        index += 1;
    }
    if !seen
        .iter()
        .any(|e| is_state(e, "w.service", "active", "running"))
    {
        seen.extend(
            unit_events_until(&mut s.rx, 42, &mut index, |e| {
                is_state(e, "w.service", "active", "running")
            })
            .await,
        );
    }
    assert!(
        matches!(&seen[0], Event::UnitNew { unit, reason: Reason::Real, .. } if unit.as_str() == "w.service"),
        "{:?}",
        summaries(&seen)
    );
    assert!(
        seen.iter()
            .any(|e| matches!(e, Event::UnitPropertiesChanged { interface, .. } if interface == "org.freedesktop.systemd1.Service")),
        "{:?}",
        summaries(&seen)
    );
    assert!(
        seen.iter()
            .all(|e| unit_event(e).is_some_and(|(_, u)| u == "w.service")),
        "other.service is not watched: {:?}",
        summaries(&seen)
    );
    let states: Vec<(&str, &str)> = seen
        .iter()
        .filter_map(|e| match e {
            Event::UnitStateChanged {
                active_state,
                sub_state,
                ..
            } => Some((active_state.as_str(), sub_state.as_str())),
            _ => None,
        })
        .collect();
    assert!(
        states.windows(2).all(|w| w[0] != w[1]),
        "only changes: {states:?}"
    );

    // A new session (a reconnect): the manager re-subscribes and gets the
    // running unit replayed virtually, tagged with the new guid from 1.
    shared.outbox.close(1);
    shared.session_ended(1);
    let (tx, mut rx2) = mpsc::channel(256);
    shared.outbox.open(2, tx, SessionKill::new());
    shared.session_started(2, 43);
    s.d.handle(
        2,
        1,
        Request::Subscribe {
            unit: Some(unit("w.service")),
        },
    )
    .await;
    assert_eq!(
        next(&mut rx2).await,
        ToManager::Event(Event::UnitNew {
            tag: ModTag::new(43, 1),
            unit: unit("w.service"),
            reason: Reason::Virtual
        })
    );
    assert_eq!(
        next(&mut rx2).await,
        ToManager::Event(Event::UnitStateChanged {
            tag: ModTag::new(43, 2),
            unit: unit("w.service"),
            active_state: "active".into(),
            sub_state: "running".into(),
            reason: Reason::Virtual
        })
    );
    // The replay holds the send order; the reply does not. A signal of the
    // start that systemd sent late (the Service interface's MainPID and
    // timestamps follow the state) may go out between the two, as a real
    // event tagged after the replay.
    let late = events_until_reply(&mut rx2, 1).await;
    for (e, index) in late.iter().zip(3..) {
        assert_eq!(
            unit_event(e),
            Some((ModTag::new(43, index), "w.service")),
            "{:?}",
            summaries(&late)
        );
        assert!(
            matches!(e, Event::UnitPropertiesChanged { .. }),
            "only a late property change: {:?}",
            summaries(&late)
        );
    }

    // A daemon-reload unloads and re-creates every unit: no news for the
    // manager (the next event for w.service is its stop, not a removal).
    s.d.handle(2, 6, Request::Reload).await;
    let around_reload = events_until_reply(&mut rx2, 6).await;

    // Stop: down to inactive/dead.
    s.d.handle(
        2,
        2,
        Request::UnitJob {
            kind: JobKind::Stop,
            unit: unit("w.service"),
            mode: "replace".into(),
            job_id: 3,
        },
    )
    .await;
    let mut index = 3 + late.len() as u64;
    for e in &around_reload {
        assert_eq!(unit_event(e).map(|t| t.0), Some(ModTag::new(43, index)));
        index += 1;
    }
    let stopping = unit_events_until(&mut rx2, 43, &mut index, |e| {
        is_state(e, "w.service", "inactive", "dead")
    })
    .await;
    let kinds: Vec<String> = around_reload.iter().chain(&stopping).map(summary).collect();
    assert!(
        around_reload
            .iter()
            .chain(&stopping)
            .all(|e| !matches!(e, Event::UnitRemoved { .. } | Event::UnitNew { .. })),
        "the reload was not reported as removal and re-creation: {kinds:?}"
    );
    let states: Vec<&String> = kinds.iter().filter(|k| k.starts_with("state")).collect();
    assert_eq!(
        states.first().map(|s| s.as_str()),
        Some("state w.service deactivating/stop-sigterm"),
        "the reload changed no state: {kinds:?}"
    );

    // Delete the file and daemon-reload: systemd unloads it.
    std::fs::remove_file(node_unit_path(&node, "w.service")).unwrap();
    s.d.handle(2, 3, Request::Reload).await;
    let removed = unit_events_until(
        &mut rx2,
        43,
        &mut index,
        |e| matches!(e, Event::UnitRemoved { unit, .. } if unit.as_str() == "w.service"),
    )
    .await;
    assert!(
        matches!(
            removed.last(),
            Some(Event::UnitRemoved {
                reason: Reason::Real,
                ..
            })
        ),
        "{:?}",
        summaries(&removed)
    );

    // Unsubscribe: no more events for it; `*` then replays every loaded unit.
    s.d.handle(
        2,
        4,
        Request::Unsubscribe {
            unit: Some(unit("w.service")),
        },
    )
    .await;
    loop {
        if let ToManager::Reply { id: 4, result } = next(&mut rx2).await {
            assert_eq!(result, Ok(Response::Empty));
            break;
        }
    }
    s.d.handle(2, 5, Request::Subscribe { unit: None }).await;
    let mut replayed = Vec::new();
    loop {
        match next(&mut rx2).await {
            ToManager::Reply { id: 5, result } => {
                assert_eq!(result, Ok(Response::Empty));
                break;
            }
            ToManager::Event(Event::UnitNew {
                unit,
                reason: Reason::Virtual,
                ..
            }) => replayed.push(unit.as_str().to_string()),
            _ => {}
        }
    }
    assert!(
        replayed.iter().any(|u| u == "other.service"),
        "{replayed:?}"
    );
    assert!(
        replayed.iter().any(|u| u == "default.target"),
        "{replayed:?}"
    );
    assert!(!replayed.iter().any(|u| u == "w.service"), "{replayed:?}");
}

fn node_unit_path(node: &SystemdNode, name: &str) -> PathBuf {
    node.unit_dir().join(name)
}

/// A frame whose unit name is not a valid `UnitName` does not decode, so it
/// can never reach systemd (the link drops such a manager as malformed).
#[test]
fn bad_unit_names_do_not_even_decode() {
    use drover_protocol::codec::{decode_body, encode_body};
    let good = ToAgent::Request {
        id: 1,
        body: Request::KillUnit {
            unit: unit("abcdefgh.service"),
            whom: "main".into(),
            signal: 9,
        },
    };
    let body = encode_body(&good).unwrap();
    assert!(decode_body::<ToAgent>(&body).is_ok());
    for bad in [
        "abc/efgh.service",
        "abcdefgh.nothing",
        "abc efgh.service",
        "../../x.service\0\0",
    ] {
        let mut bytes = body.to_vec();
        let at = bytes
            .windows(16)
            .position(|w| w == b"abcdefgh.service")
            .unwrap();
        let bad = &bad.as_bytes()[..16.min(bad.len())];
        bytes[at..at + bad.len()].copy_from_slice(bad);
        assert!(
            decode_body::<ToAgent>(&bytes).is_err(),
            "{:?} decoded",
            String::from_utf8_lossy(bad)
        );
    }
}
