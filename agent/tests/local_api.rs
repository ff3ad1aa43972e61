//! The local `org.eclipse.bluechi.Agent` API on a private dbus-daemon, as the
//! proxy helper and `bluechi-is-online`-style watchers see it. The manager
//! link is a fake: an outbox session whose messages the test reads.
//!
//! Who may call `CreateProxy` / `RemoveProxy` is checked with real bus
//! credentials: clients connect as root or as `nobody`
//! ([`drover_testkit::api::connect_as`]); the one question the agent asks
//! systemd (`GetUnitByPID`) is answered by a stand-in that owns systemd's
//! name on the private bus.

use drover_agent::api;
use drover_agent::link::outbox::SessionKill;
use drover_agent::proxies::registry::Phase;
use drover_agent::state::Shared;
use drover_bus::bluechi::{AGENT_BUS_NAME, AGENT_IFACE, AGENT_PATH};
use drover_bus::bus::PROPERTIES_IFACE;
use drover_protocol::{Event, NodeName, Notice, Reason, TargetChange, ToManager, UnitName};
use drover_sandbox::PrivateBus;
use drover_testkit::api::{NOBODY, assert_mentions, connect_as};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

const WAIT: Duration = Duration::from_secs(5);

/// Connects a new client to the test's private bus.
async fn connect(bus: &PrivateBus) -> Connection {
    drover_testkit::api::connect(bus.address()).await
}

/// The agent's side (API served, a fake manager session open) and a client.
struct Rig {
    bus: PrivateBus,
    shared: Arc<Shared>,
    manager: mpsc::Receiver<ToManager>,
    client: Connection,
    _agent_conn: Connection,
    _served: api::Served,
}

async fn rig() -> Rig {
    // Open to every user: some tests call as `nobody`.
    let bus = PrivateBus::start_open("drover-agent-api-test").unwrap();
    let shared = Arc::new(Shared::default());
    shared.status.set_controller("10.0.0.1", 842);
    shared
        .controller
        .init(vec![drover_agent::link::target::Endpoint {
            host: "10.0.0.1".into(),
            port: 842,
        }]);
    shared.status.set_log_target("stderr");
    let (tx, manager) = mpsc::channel(64);
    shared.outbox.open(1, tx, SessionKill::new());
    let agent_conn = connect(&bus).await;
    let served = api::serve(&agent_conn, shared.clone()).await.unwrap();
    let client = connect(&bus).await;
    Rig {
        bus,
        shared,
        manager,
        client,
        _agent_conn: agent_conn,
        _served: served,
    }
}

impl Rig {
    /// `CreateProxy` of node bar's db.service for [`LOCAL`], waiting in a task of its
    /// own (the call returns once the target is up or refused).
    fn create_db_proxy(&self) -> tokio::task::JoinHandle<Result<(), (String, String)>> {
        let client = self.client.clone();
        tokio::spawn(
            async move { call(&client, "CreateProxy", (LOCAL, "bar", "db.service")).await },
        )
    }
}

async fn call(
    conn: &Connection,
    method: &str,
    args: (&str, &str, &str),
) -> Result<(), (String, String)> {
    match conn
        .call_method(
            Some(AGENT_BUS_NAME),
            AGENT_PATH,
            Some(AGENT_IFACE),
            method,
            &args,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(zbus::Error::MethodError(name, msg, _)) => {
            Err((name.to_string(), msg.unwrap_or_default()))
        }
        Err(zbus::Error::FDO(e)) => Err((
            zbus::DBusError::name(&*e).to_string(),
            zbus::DBusError::description(&*e)
                .unwrap_or_default()
                .to_owned(),
        )),
        Err(e) => panic!("{method}: {e}"),
    }
}

async fn get<T>(conn: &Connection, name: &str) -> T
where
    T: TryFrom<OwnedVariant>,
    T::Error: std::fmt::Debug,
{
    let reply = conn
        .call_method(
            Some(AGENT_BUS_NAME),
            AGENT_PATH,
            Some(PROPERTIES_IFACE),
            "Get",
            &(AGENT_IFACE, name),
        )
        .await
        .unwrap();
    let v: OwnedVariant = reply.body().deserialize().unwrap();
    T::try_from(v).unwrap()
}

async fn next_event(rx: &mut mpsc::Receiver<ToManager>) -> Event {
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Some(ToManager::Event(e))) => e,
        other => panic!("expected an event for the manager, got {other:?}"),
    }
}

/// Waits until the proxy list has `n` entries (the call is in flight).
async fn wait_proxies(shared: &Shared, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while shared.proxies.list().len() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {n} proxies, have {:?}",
            shared.proxies.list()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const LOCAL: &str = "drover-proxy@bar_db.service";

fn target(active: &str, reason: Reason, id: u64) -> Notice {
    Notice::ProxyTarget {
        proxy_id: id,
        change: TargetChange::State {
            active_state: active.into(),
            sub_state: "x".into(),
            reason,
        },
    }
}

#[tokio::test]
async fn garbage_arguments_are_invalid_args_and_change_nothing() {
    let mut r = rig().await;
    for (args, says) in [
        (("bogus.service", "bar", "db.service"), "local_service_name"),
        ((LOCAL, "bar_baz", "db.service"), "node"),
        ((LOCAL, "bar", "db"), "unit"),
        ((LOCAL, "bar", "../x.service"), "unit"),
        ((LOCAL, "", "db.service"), "node"),
        ((LOCAL, "bar", "t@.service"), "template"),
    ] {
        for method in ["CreateProxy", "RemoveProxy"] {
            let (name, msg) = call(&r.client, method, args).await.unwrap_err();
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs", "{args:?}");
            assert!(msg.contains(says), "{method} {args:?}: {msg}");
        }
    }
    // Wrong signature: zbus refuses before our code runs.
    let err = r
        .client
        .call_method(
            Some(AGENT_BUS_NAME),
            AGENT_PATH,
            Some(AGENT_IFACE),
            "CreateProxy",
            &(1u32,),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("InvalidArgs"), "{err}");
    assert!(r.shared.proxies.list().is_empty());
    assert!(r.manager.try_recv().is_err(), "nothing told to the manager");
}

#[tokio::test]
async fn a_proxy_unit_paired_with_another_target_is_invalid_args_and_changes_nothing() {
    let mut r = rig().await;
    for (args, says) in [
        // The bug this closes: bar_db's proxy unit bound to web.service, or to
        // db.service on another node; the agent would later stop the wrong unit.
        (
            (LOCAL, "bar", "web.service"),
            "is the proxy of db.service on node bar, not of web.service on node bar",
        ),
        (
            (LOCAL, "foo", "db.service"),
            "is the proxy of db.service on node bar, not of db.service on node foo",
        ),
        ((LOCAL, "bar", "db.socket"), "not of db.socket on node bar"),
        (
            ("drover-proxy@bar_my_db.service", "bar", "db.service"),
            "is the proxy of my_db.service on node bar",
        ),
        // Proxy template, but no NODE_UNIT instance in it.
        (
            ("drover-proxy@bar.service", "bar", "db.service"),
            "is not a proxy unit",
        ),
        (
            ("drover-proxy@bar_db.socket", "bar", "db.service"),
            "is not a proxy unit",
        ),
        (
            ("drover-proxy@-x_db.service", "bar", "db.service"),
            "is not a proxy unit",
        ),
    ] {
        for method in ["CreateProxy", "RemoveProxy"] {
            let (name, msg) = call(&r.client, method, args).await.unwrap_err();
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs", "{args:?}");
            assert!(msg.contains(says), "{method} {args:?}: {msg}");
        }
    }
    assert!(r.shared.proxies.list().is_empty());
    assert!(r.manager.try_recv().is_err(), "nothing told to the manager");
    // The explicit-suffix spelling of the instance is the same target's proxy.
    let client = r.client.clone();
    let pending = tokio::spawn(async move {
        call(
            &client,
            "CreateProxy",
            ("drover-proxy@bar_db.service.service", "bar", "db.service"),
        )
        .await
    });
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyNew { .. }
    ));
    pending.abort();
}

/// Stands in for systemd's `Manager.GetUnitByPID` on the private bus: `pid`
/// is in the unit at [`UNIT_OBJECT`] ([`UnitId`]), every other PID in no unit.
struct UnitByPid {
    pid: u32,
}

const UNIT_OBJECT: &str = "/org/freedesktop/systemd1/unit/the_5fcaller";

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl UnitByPid {
    #[zbus(name = "GetUnitByPID")]
    fn get_unit_by_pid(&self, pid: u32) -> zbus::fdo::Result<OwnedObjectPath> {
        if pid == self.pid {
            Ok(OwnedObjectPath::try_from(UNIT_OBJECT).unwrap())
        } else {
            Err(zbus::fdo::Error::Failed(format!(
                "PID {pid} does not belong to any loaded unit."
            )))
        }
    }
}

struct UnitId(String);

#[zbus::interface(name = "org.freedesktop.systemd1.Unit")]
impl UnitId {
    #[zbus(property)]
    fn id(&self) -> String {
        self.0.clone()
    }
}

/// Serves [`UnitByPid`] for this test process as a process of `unit`.
async fn systemd_says_we_run_in(bus: &PrivateBus, unit: &str) -> Connection {
    zbus::connection::Builder::address(bus.address())
        .name("org.freedesktop.systemd1")
        .serve_at(
            "/org/freedesktop/systemd1",
            UnitByPid {
                pid: std::process::id(),
            },
        )
        .serve_at(UNIT_OBJECT, UnitId(unit.into()))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_caller_neither_root_nor_the_proxy_unit_is_denied_and_changes_nothing() {
    let mut r = rig().await;
    let nobody = connect_as(r.bus.address(), NOBODY).await;
    // No systemd answers: the caller is in no unit anyone can name.
    for method in ["CreateProxy", "RemoveProxy"] {
        let (name, msg) = call(&nobody, method, (LOCAL, "bar", "db.service"))
            .await
            .unwrap_err();
        assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied", "{method}");
        assert!(
            msg.contains("only root or the proxy unit drover-proxy@bar_db.service itself"),
            "{msg}"
        );
        assert!(msg.contains("uid 65534"), "{msg}");
    }
    // systemd answers, but the caller runs in another unit (another proxy's, even).
    let _systemd = systemd_says_we_run_in(&r.bus, "drover-proxy@bar_web.service").await;
    let (name, msg) = call(&nobody, "CreateProxy", (LOCAL, "bar", "db.service"))
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied");
    assert!(
        msg.contains("runs in drover-proxy@bar_web.service"),
        "{msg}"
    );
    assert!(r.shared.proxies.list().is_empty());
    assert!(r.manager.try_recv().is_err(), "nothing told to the manager");
    // Arguments are checked before the caller: garbage is still InvalidArgs.
    let (name, _) = call(&nobody, "CreateProxy", (LOCAL, "foo", "db.service"))
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs");
}

#[tokio::test]
async fn the_proxy_units_own_process_may_create_and_remove_its_proxy() {
    let mut r = rig().await;
    let _systemd = systemd_says_we_run_in(&r.bus, LOCAL).await;
    let helper = connect_as(r.bus.address(), NOBODY).await;
    let caller = helper.clone();
    let pending =
        tokio::spawn(
            async move { call(&caller, "CreateProxy", (LOCAL, "bar", "db.service")).await },
        );
    let Event::ProxyNew { proxy_id, .. } = next_event(&mut r.manager).await else {
        panic!("expected ProxyNew");
    };
    // Its own proxy only: web.service's proxy unit is not where it runs.
    let (name, _) = call(
        &helper,
        "CreateProxy",
        ("drover-proxy@bar_web.service", "bar", "web.service"),
    )
    .await
    .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied");
    r.shared
        .proxies
        .on_notice(target("active", Reason::Real, proxy_id), &r.shared.outbox);
    assert_eq!(pending.await.unwrap(), Ok(()));
    call(&helper, "RemoveProxy", (LOCAL, "bar", "db.service"))
        .await
        .unwrap();
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyRemoved { .. }
    ));
    assert!(r.shared.proxies.list().is_empty());
}

#[tokio::test]
async fn create_waits_for_the_target_duplicate_is_refused_remove_unknown_succeeds() {
    let mut r = rig().await;
    let pending = r.create_db_proxy();
    let id = match next_event(&mut r.manager).await {
        Event::ProxyNew {
            node,
            unit,
            proxy_id,
            ..
        } => {
            assert_eq!((node.as_str(), unit.as_str()), ("bar", "db.service"));
            proxy_id
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(r.shared.proxies.list()[0].phase, Phase::Waiting);

    let (name, msg) = call(&r.client, "CreateProxy", (LOCAL, "bar", "db.service"))
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.Failed");
    assert!(msg.starts_with("proxy already exists"), "{msg}");
    assert_eq!(r.shared.proxies.list().len(), 1);

    // Unknown proxies: success, nothing told.
    call(
        &r.client,
        "RemoveProxy",
        ("drover-proxy@baz_db.service", "baz", "db.service"),
    )
    .await
    .unwrap();
    assert!(r.manager.try_recv().is_err());

    r.shared
        .proxies
        .on_notice(target("inactive", Reason::Virtual, id), &r.shared.outbox);
    assert!(
        !pending.is_finished(),
        "a virtual stop does not end the wait"
    );
    r.shared
        .proxies
        .on_notice(target("active", Reason::Real, id), &r.shared.outbox);
    assert_eq!(pending.await.unwrap(), Ok(()));
    assert_eq!(r.shared.proxies.list()[0].phase, Phase::Active);

    // ExecStop: RemoveProxy → ProxyRemoved.
    call(&r.client, "RemoveProxy", (LOCAL, "bar", "db.service"))
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut r.manager).await,
        Event::ProxyRemoved {
            node: NodeName::new("bar").unwrap(),
            unit: UnitName::new("db.service").unwrap(),
            proxy_id: id
        }
    );
    assert!(r.shared.proxies.list().is_empty());
}

#[tokio::test]
async fn a_refused_proxy_fails_with_activation_failed_and_its_reason() {
    let mut r = rig().await;
    let pending = r.create_db_proxy();
    let Event::ProxyNew { proxy_id, .. } = next_event(&mut r.manager).await else {
        panic!("expected ProxyNew");
    };
    r.shared.proxies.on_notice(
        Notice::ProxyError {
            proxy_id,
            message: "unit db.service on node bar cannot be started: not found".into(),
        },
        &r.shared.outbox,
    );
    assert_eq!(
        pending.await.unwrap(),
        Err((
            "org.eclipse.bluechi.ActivationFailed".into(),
            "unit db.service on node bar cannot be started: not found".into()
        ))
    );
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyRemoved { .. }
    ));
    assert!(r.shared.proxies.list().is_empty());
}

#[tokio::test]
async fn a_caller_that_leaves_the_bus_drops_its_waiting_proxy() {
    let mut r = rig().await;
    let helper = connect(&r.bus).await;
    let call_helper = helper.clone();
    let pending = tokio::spawn(async move {
        let _ = call(&call_helper, "CreateProxy", (LOCAL, "bar", "db.service")).await;
    });
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyNew { .. }
    ));
    // The helper is killed (stop or start timeout of the proxy unit).
    pending.abort();
    let _ = pending.await;
    drop(helper);
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyRemoved { .. }
    ));
    wait_proxies(&r.shared, 0).await;
    // The triple is free again.
    let again = r.create_db_proxy();
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyNew { .. }
    ));
    again.abort();
}

#[tokio::test]
async fn properties_follow_the_link_and_status_changes_are_signalled() {
    let r = rig().await;
    assert_eq!(get::<String>(&r.client, "Status").await, "offline");
    assert_eq!(get::<String>(&r.client, "LogLevel").await, "INFO");
    assert_eq!(get::<String>(&r.client, "LogTarget").await, "stderr");
    assert_eq!(
        get::<String>(&r.client, "ControllerAddress").await,
        "tcp:host=10.0.0.1,port=842"
    );
    assert_eq!(get::<u64>(&r.client, "LastSeenTimestamp").await, 0);

    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .path(AGENT_PATH)
        .interface(PROPERTIES_IFACE)
        .member("PropertiesChanged")
        .build()
        .unwrap();
    let mut signals = MessageStream::for_match_rule(rule, &r.client, None)
        .await
        .unwrap();
    let mut next_status = async || -> String {
        let msg = tokio::time::timeout(WAIT, signals.next())
            .await
            .expect("PropertiesChanged in time")
            .unwrap()
            .unwrap();
        let (iface, changed, _): (
            String,
            std::collections::HashMap<String, OwnedVariant>,
            Vec<String>,
        ) = msg.body().deserialize().unwrap();
        assert_eq!(iface, AGENT_IFACE);
        String::try_from(
            changed
                .get("Status")
                .expect("Status changed")
                .try_clone()
                .unwrap(),
        )
        .unwrap()
    };

    r.shared.status.connected();
    assert_eq!(next_status().await, "online");
    assert_eq!(get::<String>(&r.client, "Status").await, "online");
    let seen: u64 = get(&r.client, "LastSeenTimestamp").await;
    let seen_mono: u64 = get(&r.client, "LastSeenTimestampMonotonic").await;
    assert!(
        seen > 1_600_000_000_000_000 && seen_mono > 0,
        "{seen} {seen_mono}"
    );
    assert_eq!(get::<u64>(&r.client, "DisconnectTimestamp").await, 0);

    r.shared.status.disconnected();
    assert_eq!(next_status().await, "offline");
    let gone: u64 = get(&r.client, "DisconnectTimestamp").await;
    let gone_mono: u64 = get(&r.client, "DisconnectTimestampMonotonic").await;
    assert!(gone >= seen && gone_mono >= seen_mono, "{gone} {gone_mono}");
    // Last seen is kept while offline.
    assert_eq!(get::<u64>(&r.client, "LastSeenTimestamp").await, seen);
}

#[tokio::test]
async fn introspection_describes_exactly_what_is_served() {
    let r = rig().await;
    let reply = r
        .client
        .call_method(
            Some(AGENT_BUS_NAME),
            AGENT_PATH,
            Some("org.freedesktop.DBus.Introspectable"),
            "Introspect",
            &(),
        )
        .await
        .unwrap();
    let xml: String = reply.body().deserialize().unwrap();
    assert_mentions(
        &xml,
        "XML",
        &[
            r#"<interface name="org.eclipse.bluechi.Agent">"#,
            r#"value="const""#,
            r#"value="false""#,
            r#"<method name="CreateProxy">"#,
            r#"<arg name="local_service_name" type="s" direction="in"/>"#,
            r#"<arg name="node" type="s" direction="in"/>"#,
            r#"<arg name="unit" type="s" direction="in"/>"#,
            r#"<method name="RemoveProxy">"#,
            r#"<method name="SwitchController">"#,
            r#"<arg name="dbus_address" type="s" direction="in"/>"#,
            r#"<method name="JobCancel">"#,
            r#"<arg name="id" type="u" direction="in"/>"#,
            r#"<property name="Status" type="s" access="read"/>"#,
            r#"<property name="ControllerAddress" type="s" access="read"/>"#,
            r#"<property name="LogLevel" type="s" access="read">"#,
            r#"<property name="LogTarget" type="s" access="read">"#,
            r#"<property name="DisconnectTimestamp" type="t" access="read">"#,
            r#"<property name="DisconnectTimestampMonotonic" type="t" access="read">"#,
            r#"<property name="LastSeenTimestamp" type="t" access="read">"#,
            r#"<property name="LastSeenTimestampMonotonic" type="t" access="read">"#,
        ],
    );
    for absent in ["header", "connection"] {
        assert!(!xml.contains(absent), "XML must not show {absent}:\n{xml}");
    }
}

/// `SwitchController` / `JobCancel` with one argument; the error's name and text.
async fn call_one<B>(conn: &Connection, method: &str, arg: B) -> Result<(), (String, String)>
where
    B: serde::Serialize + zbus::zvariant::Type,
{
    conn.call_method(
        Some(AGENT_BUS_NAME),
        AGENT_PATH,
        Some(AGENT_IFACE),
        method,
        &(arg,),
    )
    .await
    .map(|_| ())
    .map_err(|e| match e {
        zbus::Error::MethodError(name, msg, _) => (name.to_string(), msg.unwrap_or_default()),
        zbus::Error::FDO(e) => (
            zbus::DBusError::name(&*e).to_string(),
            zbus::DBusError::description(&*e)
                .unwrap_or_default()
                .to_owned(),
        ),
        other => panic!("{method}: {other}"),
    })
}

#[tokio::test]
async fn switch_controller_and_job_cancel_refuse_strangers_and_garbage() {
    let mut r = rig().await;
    let nobody = connect_as(r.bus.address(), NOBODY).await;
    let (name, msg) = call_one(&nobody, "SwitchController", "tcp:host=10.0.0.2,port=842")
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied");
    assert!(
        msg.contains("only root or the agent's own user may call SwitchController"),
        "{msg}"
    );
    let (name, _) = call_one(&nobody, "JobCancel", 1u32).await.unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied");
    let switched = r.shared.controller.watch();
    for bad in [
        "",
        "tcp:",
        "tcp:host=10.0.0.1,port=842",
        "unix:path=/x",
        "tcp:host=,port=1",
    ] {
        let (name, msg) = call_one(&r.client, "SwitchController", bad)
            .await
            .unwrap_err();
        assert_eq!(
            name, "org.freedesktop.DBus.Error.InvalidArgs",
            "{bad:?}: {msg}"
        );
    }
    assert!(!switched.has_changed().unwrap(), "nothing switched");
    assert_eq!(
        get::<String>(&r.client, "ControllerAddress").await,
        "tcp:host=10.0.0.1,port=842"
    );
    // An id no session of this agent started: systemd's NoSuchJob.
    let (name, msg) = call_one(&r.client, "JobCancel", 7u32).await.unwrap_err();
    assert_eq!(name, "org.freedesktop.systemd1.NoSuchJob");
    assert_eq!(msg, "no job 7 of the manager is running on this node");
    // Root switches: the address changes and the link is woken.
    call_one(&r.client, "SwitchController", "tcp:host=10.0.0.2,port=9000")
        .await
        .unwrap();
    assert!(switched.has_changed().unwrap());
    assert_eq!(
        get::<String>(&r.client, "ControllerAddress").await,
        "tcp:host=10.0.0.2,port=9000"
    );
    assert!(r.manager.try_recv().is_err(), "nothing told to the manager");
}

/// One owner of the agent's name: a second agent, or any process asking to
/// replace the owner, gets nothing, and the first keeps serving. (BlueChi allows
/// replacement; an agent whose name was taken would run on with no proxy helper
/// able to reach it.)
#[tokio::test]
async fn the_name_is_never_given_up_nor_taken_over() {
    // Open to every user: some tests call as `nobody`.
    let bus = PrivateBus::start_open("drover-agent-api-test").unwrap();
    let squatter = connect(&bus).await;
    squatter
        .request_name_with_flags(AGENT_BUS_NAME, zbus::fdo::RequestNameFlags::DO_NOT_QUEUE)
        .await
        .unwrap();
    let conn = connect(&bus).await;
    let err = api::serve(&conn, Arc::new(Shared::default()))
        .await
        .err()
        .expect("the name is taken");
    let text = err.to_string();
    assert!(
        text.contains(AGENT_BUS_NAME) && text.contains("still owns it"),
        "{text}"
    );
    drop(squatter);

    let bus = PrivateBus::start_open("drover-agent-api-test").unwrap();
    let first = connect(&bus).await;
    let _a = api::serve(&first, Arc::new(Shared::default()))
        .await
        .unwrap();
    let second = connect(&bus).await;
    let err = api::serve(&second, Arc::new(Shared::default()))
        .await
        .err()
        .expect("a second agent does not take the name");
    assert!(err.to_string().contains("still owns it"), "{err}");
    let rival = connect(&bus).await;
    let flags = zbus::fdo::RequestNameFlags::REPLACE_EXISTING
        | zbus::fdo::RequestNameFlags::ALLOW_REPLACEMENT
        | zbus::fdo::RequestNameFlags::DO_NOT_QUEUE;
    let taken = rival.request_name_with_flags(AGENT_BUS_NAME, flags).await;
    assert!(
        matches!(taken, Err(zbus::Error::NameTaken)),
        "a rival asking to replace the agent: {taken:?}"
    );
    let dbus = zbus::fdo::DBusProxy::new(&rival).await.unwrap();
    let owner = dbus
        .get_name_owner(AGENT_BUS_NAME.try_into().unwrap())
        .await
        .unwrap();
    assert_eq!(
        Some(owner.as_str()),
        first.unique_name().map(|n| n.as_str())
    );
}

/// A restart: the new agent asks for the name while the old one is still on
/// its way out. It waits behind it and owns the name as soon as the old one's
/// connection is gone, instead of failing on a bus that has not caught up.
#[tokio::test]
async fn a_restarted_agent_owns_the_name_its_predecessor_leaves() {
    let bus = PrivateBus::start_open("drover-agent-api-test").unwrap();
    let old = connect(&bus).await;
    let served = api::serve(&old, Arc::new(Shared::default())).await.unwrap();
    let new = connect(&bus).await;
    let waiting = tokio::spawn(async move {
        let r = api::serve(&new, Arc::new(Shared::default())).await;
        (r.map(|_| ()).map_err(|e| e.to_string()), new)
    });
    // The new agent is queued behind the old one before the old one leaves.
    let dbus = zbus::fdo::DBusProxy::new(&old).await.unwrap();
    let name = zbus::names::BusName::try_from(AGENT_BUS_NAME).unwrap();
    drover_testkit::wait::eventually(WAIT, "the new agent to queue for the name", || async {
        dbus.list_queued_owners(zbus::names::WellKnownName::try_from(AGENT_BUS_NAME).unwrap())
            .await
            .is_ok_and(|q| q.len() == 2)
    })
    .await
    .unwrap();
    drop(served);
    drop(dbus);
    old.close().await.unwrap();
    let (served, new) = waiting.await.unwrap();
    served.unwrap();
    let dbus = zbus::fdo::DBusProxy::new(&new).await.unwrap();
    let owner = dbus.get_name_owner(name).await.unwrap();
    assert_eq!(Some(owner.as_str()), new.unique_name().map(|n| n.as_str()));
}

/// BlueChi's helper, run by `bluechi-proxy@bar_db.service`, calls exactly
/// `CreateProxy("bluechi-proxy@bar_db.service", "bar", "db.service")` from the
/// proxy unit's own process (and `RemoveProxy` alike on stop). That call is
/// served as drover's helper's is; BlueChi-named garbage is refused with the
/// reason and changes nothing.
#[tokio::test]
async fn bluechis_helper_call_is_served_and_its_garbage_is_refused() {
    const BLUECHI_LOCAL: &str = "bluechi-proxy@bar_db.service";
    let mut r = rig().await;
    for (args, says) in [
        (
            (
                "bluechi-proxy@nounderscore.service",
                "nounderscore",
                "db.service",
            ),
            "is not a proxy unit",
        ),
        (
            (BLUECHI_LOCAL, "foo", "db.service"),
            "is the proxy of db.service on node bar, not of db.service on node foo",
        ),
        (
            (BLUECHI_LOCAL, "bar", "web.service"),
            "not of web.service on node bar",
        ),
        // BlueChi's helper for a non-service target asks for "X.mount.service".
        (
            (
                "bluechi-proxy@bar_data.mount.service",
                "bar",
                "data.mount.service",
            ),
            "is the proxy of data.mount on node bar",
        ),
        (
            ("bluechi-proxy@.service", "bar", "db.service"),
            "is not an instance of drover-proxy@.service or bluechi-proxy@.service",
        ),
        (
            ("bluechi-dep@db.service", "bar", "db.service"),
            "is not an instance of drover-proxy@.service or bluechi-proxy@.service",
        ),
    ] {
        for method in ["CreateProxy", "RemoveProxy"] {
            let (name, msg) = call(&r.client, method, args).await.unwrap_err();
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs", "{args:?}");
            assert!(msg.contains(says), "{method} {args:?}: {msg}");
        }
    }
    assert!(r.shared.proxies.list().is_empty());
    assert!(r.manager.try_recv().is_err(), "nothing told to the manager");

    // The real call, from the BlueChi proxy unit's own (non-root) process.
    let _systemd = systemd_says_we_run_in(&r.bus, BLUECHI_LOCAL).await;
    let helper = connect_as(r.bus.address(), NOBODY).await;
    let caller = helper.clone();
    let pending = tokio::spawn(async move {
        call(&caller, "CreateProxy", (BLUECHI_LOCAL, "bar", "db.service")).await
    });
    let Event::ProxyNew {
        proxy_id,
        node,
        unit,
        template,
    } = next_event(&mut r.manager).await
    else {
        panic!("expected ProxyNew");
    };
    assert_eq!((node.as_str(), unit.as_str()), ("bar", "db.service"));
    // Announced with its family: it ends as BlueChi's proxy does.
    assert_eq!(template, drover_protocol::ProxyTemplate::Bluechi);
    // It may not speak for drover's proxy unit of the same target.
    let (name, _) = call(&helper, "CreateProxy", (LOCAL, "bar", "db.service"))
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.AccessDenied");
    r.shared
        .proxies
        .on_notice(target("active", Reason::Real, proxy_id), &r.shared.outbox);
    assert_eq!(pending.await.unwrap(), Ok(()));
    assert_eq!(r.shared.proxies.list()[0].key.local.as_str(), BLUECHI_LOCAL);
    call(&helper, "RemoveProxy", (BLUECHI_LOCAL, "bar", "db.service"))
        .await
        .unwrap();
    assert!(matches!(
        next_event(&mut r.manager).await,
        Event::ProxyRemoved { .. }
    ));
    assert!(r.shared.proxies.list().is_empty());
}
