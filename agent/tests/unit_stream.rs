//! The unit stream over zbus against a real `systemd --user` (started per test
//! in its own namespaces, torn down on drop): it carries the signals of what it
//! follows and nothing else, each change of what it follows is marked by a
//! snapshot in the connection's order, and the match rules it no longer needs
//! leave the bus (as the bus daemon counts them).

mod common;

use common::*;
use drover_agent::systemd::api::{EventStream, Followed, Systemd, UnitSignal, UnitSignalStream};
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_protocol::{JobKind, Scope, UnitName};
use std::collections::BTreeSet;
use std::time::Duration;
use zbus::OwnedVariant;
use zbus::message::Sequence;

const T: Duration = Duration::from_secs(20);
const ONESHOT: &str = "[Service]\nType=oneshot\nExecStart=/bin/true\n";
const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";

/// A node (`name`) with the oneshots `units`, and the agent's systemd on
/// it: its job stream (kept: the unit stream shares its job rules) and its
/// unit stream, following nothing yet.
async fn started(
    name: &str,
    units: &[&str],
) -> (
    SystemdNode,
    ZbusSystemd,
    EventStream,
    UnitSignalStream<Sequence>,
) {
    let node = SystemdNode::start(name, "node").await;
    for unit in units {
        node.write_unit(unit, ONESHOT);
    }
    node.reload().await;
    let systemd = systemd(&node).await;
    let jobs = systemd.subscribe().await.unwrap();
    let stream = systemd.unit_stream().await.unwrap();
    (node, systemd, jobs, stream)
}

/// Every interface of each of `names`.
fn units(names: &[&str]) -> Followed {
    scoped(names, Scope::Everything)
}

fn scoped(names: &[&str], scope: Scope) -> Followed {
    Followed::units(names.iter().map(|n| (UnitName::new(*n).unwrap(), scope)))
}

/// The match rules the bus holds for the agent's connection.
async fn match_rules(systemd: &ZbusSystemd) -> u32 {
    let conn = systemd.connection();
    let me = conn
        .unique_name()
        .expect("a bus connection has a name")
        .to_string();
    let stats: std::collections::HashMap<String, OwnedVariant> = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus.Debug.Stats"),
            "GetConnectionStats",
            &(me,),
        )
        .await
        .expect("the bus daemon keeps statistics")
        .body()
        .deserialize()
        .unwrap();
    u32::try_from(&stats["MatchRules"]).unwrap()
}

async fn next(stream: &mut UnitSignalStream<Sequence>) -> UnitSignal {
    tokio::time::timeout(T, stream.recv())
        .await
        .expect("a unit signal in time")
        .expect("the stream runs")
        .1
}

/// Runs `unit` (a oneshot) to its end; returns what the stream carried until
/// the job's `JobRemoved`, which it always carries.
async fn run(
    systemd: &ZbusSystemd,
    stream: &mut UnitSignalStream<Sequence>,
    unit: &str,
) -> Vec<UnitSignal> {
    let job = systemd
        .unit_job(JobKind::Start, unit, "replace")
        .await
        .unwrap();
    let mut seen = Vec::new();
    loop {
        let signal = next(stream).await;
        let end = matches!(&signal, UnitSignal::JobRemoved { job: j } if *j == job);
        seen.push(signal);
        if end {
            return seen;
        }
    }
}

/// Follows `followed` as change `id`; returns what the stream carried
/// before the change's snapshot (of what it followed until then), and what
/// the snapshot lists.
async fn switch(
    systemd: &ZbusSystemd,
    stream: &mut UnitSignalStream<Sequence>,
    followed: &Followed,
    id: u64,
) -> (Vec<UnitSignal>, Vec<drover_protocol::UnitInfo>) {
    systemd.follow(followed, id).await.unwrap();
    let mut before = Vec::new();
    loop {
        match next(stream).await {
            UnitSignal::Snapshot {
                id: got,
                followed: f,
                units,
            } => {
                assert_eq!((got, &f), (id, followed));
                return (before, units);
            }
            other => before.push(other),
        }
    }
}

/// Units the signals speak of (job signals aside).
fn spoken_of(signals: &[UnitSignal]) -> BTreeSet<String> {
    signals
        .iter()
        .filter_map(|s| match s {
            UnitSignal::New { unit }
            | UnitSignal::Removed { unit }
            | UnitSignal::Changed { unit, .. } => Some(unit.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unit_stream_carries_what_is_followed_and_drops_the_rest_from_the_bus() {
    let (_node, systemd, _jobs, mut stream) =
        started("agent-test-follow", &["a.service", "b.service"]).await;
    let idle = match_rules(&systemd).await;

    // One unit: its signals, not the other's; both jobs' ends.
    let (before, _) = switch(&systemd, &mut stream, &units(&["a.service"]), 1).await;
    assert!(spoken_of(&before).is_empty(), "{before:?}");
    let seen = run(&systemd, &mut stream, "b.service").await;
    assert!(spoken_of(&seen).is_empty(), "nothing of b: {seen:?}");
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert_eq!(
        spoken_of(&seen),
        ["a.service".to_string()].into(),
        "{seen:?}"
    );
    assert!(
        match_rules(&systemd).await > idle,
        "following a unit puts rules on the bus"
    );

    // Every unit: both. (What came before the switch is still of a only.)
    let (before, listed) = switch(
        &systemd,
        &mut stream,
        &Followed::Every(Scope::Everything),
        2,
    )
    .await;
    assert!(
        spoken_of(&before).iter().all(|u| u == "a.service"),
        "{before:?}"
    );
    assert!(
        listed.iter().any(|u| u.name == "init.scope"),
        "the snapshot of every unit lists what systemd has loaded"
    );
    let seen = run(&systemd, &mut stream, "b.service").await;
    assert!(spoken_of(&seen).contains("b.service"), "{seen:?}");

    // Nothing: only the jobs, and the bus holds no more rules than at first.
    let (_, listed) = switch(&systemd, &mut stream, &Followed::nothing(), 3).await;
    assert!(listed.is_empty());
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert!(spoken_of(&seen).is_empty(), "{seen:?}");
    assert!(
        seen.iter()
            .any(|s| matches!(s, UnitSignal::JobNew { unit, .. } if unit == "a.service")),
        "job news still comes: {seen:?}"
    );
    // The old rules leave the bus as their streams are dropped (a call each).
    let every = Duration::from_millis(20);
    drover_testkit::wait::poll(T, every, "the rules to leave the bus", || async {
        match_rules(&systemd).await == idle
    })
    .await
    .unwrap();
}

/// The interfaces of `unit`'s property changes among `signals`.
fn interfaces_of(signals: &[UnitSignal], unit: &str) -> BTreeSet<String> {
    signals
        .iter()
        .filter_map(|s| match s {
            UnitSignal::Changed {
                unit: u, interface, ..
            } if u == unit => Some(interface.clone()),
            _ => None,
        })
        .collect()
}

/// A unit followed for its state: the bus sends its `Unit` interface's
/// property changes (which carry `ActiveState` and `SubState`) and not the
/// `Service` interface's, which systemd announces as often; followed for
/// everything again, both come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_followed_for_its_state_hears_its_unit_interface_alone() {
    let (_node, systemd, _jobs, mut stream) = started("agent-test-scope", &["a.service"]).await;

    switch(&systemd, &mut stream, &units(&["a.service"]), 1).await;
    let rules = match_rules(&systemd).await;
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert_eq!(
        interfaces_of(&seen, "a.service"),
        [SERVICE_IFACE.to_string(), UNIT_IFACE.to_string()].into(),
        "followed for everything: {seen:?}"
    );

    let state = scoped(&["a.service"], Scope::State);
    switch(&systemd, &mut stream, &state, 2).await;
    // As many rules, one narrower: the wider rule leaves the bus as its
    // stream is dropped (a call of its own, after the switch returned).
    let every = Duration::from_millis(20);
    drover_testkit::wait::poll(T, every, "as many rules, one narrower", || async {
        match_rules(&systemd).await == rules
    })
    .await
    .unwrap();
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert_eq!(
        interfaces_of(&seen, "a.service"),
        [UNIT_IFACE.to_string()].into(),
        "followed for its state: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| matches!(s,
            UnitSignal::Changed { active_state: Some(a), .. } if a == "active" || a == "activating")),
        "its state changes come: {seen:?}"
    );

    switch(&systemd, &mut stream, &units(&["a.service"]), 3).await;
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert!(
        interfaces_of(&seen, "a.service").contains(SERVICE_IFACE),
        "widened again: {seen:?}"
    );
}

/// Every unit followed for its state (health's hold): each unit's `Unit`
/// interface changes and systemd's news of units come, never a `Service`
/// interface change; every unit followed for everything, they come again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unit_followed_for_its_state_hears_no_service_interface() {
    let (node, systemd, _jobs, mut stream) =
        started("agent-test-every-state", &["a.service"]).await;

    let (_, listed) = switch(&systemd, &mut stream, &Followed::Every(Scope::State), 1).await;
    assert!(
        listed.iter().any(|u| u.name == "init.scope"),
        "the snapshot lists every unit systemd has loaded"
    );
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert_eq!(
        interfaces_of(&seen, "a.service"),
        [UNIT_IFACE.to_string()].into(),
        "followed for its state: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| matches!(s,
            UnitSignal::Changed { unit, active_state: Some(_), .. } if unit == "a.service")),
        "its state changes come: {seen:?}"
    );
    // A unit systemd loads on its start is told of as it comes.
    node.write_unit("c.service", ONESHOT);
    node.reload().await;
    let seen = run(&systemd, &mut stream, "c.service").await;
    assert!(
        seen.iter()
            .any(|s| matches!(s, UnitSignal::New { unit } if unit == "c.service")),
        "a new unit is told of: {seen:?}"
    );
    assert_eq!(
        interfaces_of(&seen, "c.service"),
        [UNIT_IFACE.to_string()].into(),
        "{seen:?}"
    );

    switch(
        &systemd,
        &mut stream,
        &Followed::Every(Scope::Everything),
        2,
    )
    .await;
    let seen = run(&systemd, &mut stream, "a.service").await;
    assert_eq!(
        interfaces_of(&seen, "a.service"),
        [SERVICE_IFACE.to_string(), UNIT_IFACE.to_string()].into(),
        "every unit, everything: {seen:?}"
    );
}
