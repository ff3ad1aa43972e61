//! Monitors (`org.eclipse.bluechi.Monitor`, `io.drover.Monitor`) against fake
//! agents: subscriptions reach the agent, events come back as unicast
//! signals, virtual events on subscribe and disconnect, peers, closing, and
//! the snapshot + tagged stream; who may call a monitor (its owner, root) and
//! how many monitors one client may hold.

mod common;

use common::*;
use drover_manager::units::monitor::MAX_MONITORS_PER_CLIENT;
use drover_protocol::{Reason, Request, UnitName};
use drover_testkit::agent::unit_state as state_event;
use drover_testkit::api::{NOBODY, assert_mentions, connect_as, error_of};
use drover_testkit::wait::{WAIT, eventually};
use std::time::Duration;
use zbus::OwnedObjectPath;
use zbus::message::Message;

const MON_IFACE: &str = MONITOR_IFACE;
const DROVER_MON: &str = DROVER_MONITOR_IFACE;

fn unit(s: &str) -> UnitName {
    unit_name(s)
}

async fn create_monitor(api: &Api) -> OwnedObjectPath {
    api.call(CONTROLLER, CONTROLLER_IFACE, "CreateMonitor", &())
        .await
        .expect("CreateMonitor")
}

/// Calls a monitor method (`Follow` is drover's, the rest BlueChi's).
async fn mcall<B, R>(api: &Api, path: &str, method: &str, body: &B) -> zbus::Result<R>
where
    B: serde::Serialize + zbus::DynamicType,
    R: for<'d> serde::Deserialize<'d> + zbus::Type,
{
    let iface = if method == "Follow" {
        DROVER_MON
    } else {
        MON_IFACE
    };
    api.call(path, iface, method, body).await
}

/// Subscribes the monitor at `p` (owned by `owner`) to `unit` on node1, and waits
/// until `agent` is asked to follow it (`*`: every unit); returns the subscription id.
async fn subscribed(owner: &Api, p: &str, agent: &FakeAgent, u: &str) -> u32 {
    let id = mcall(owner, p, "Subscribe", &("node1", u)).await.unwrap();
    let unit = (u != "*").then(|| unit(u));
    agent.wait_for_request(&Request::Subscribe { unit }).await;
    id
}

/// The monitor at `p` (owned by `owner`) adds client `peer`; returns the peer id.
async fn add_peer(owner: &Api, p: &str, peer: &Api) -> u32 {
    let name = peer.unique_name();
    mcall(owner, p, "AddPeer", &(name.as_str(),)).await.unwrap()
}

fn strings<const N: usize>(msg: &Message) -> [String; N]
where
    [String; N]: for<'d> serde::Deserialize<'d> + zbus::Type,
{
    msg.body().deserialize().expect("string arguments")
}

/// node1 served by a fake agent, and a monitor owned by a client of its own: (the
/// fixture, the agent, the owner, the monitor's path).
async fn monitored() -> (Fixture, FakeAgent, Api, OwnedObjectPath) {
    let f = Fixture::start(config(&["node1"])).await;
    let agent = f.agent("node1", reply_empty()).await;
    let owner = f.client().await;
    let path = create_monitor(&owner).await;
    (f, agent, owner, path)
}

#[tokio::test]
async fn subscribe_forwards_events_unicast_to_the_owner_only() {
    let f = Fixture::start(config(&["node1", "node2"])).await;
    let agent = f.agent("node1", reply_empty()).await;
    let owner = f.client().await;
    let other = f.client().await;
    let mut owner_in = owner.inbox();
    let mut other_in = other.inbox();
    // A bystander listening broadly sees nothing: signals are unicast.
    other
        .conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "AddMatch",
            &("type='signal',interface='org.eclipse.bluechi.Monitor'",),
        )
        .await
        .unwrap();

    let path = create_monitor(&owner).await;
    assert_eq!(path.as_str(), "/org/eclipse/bluechi/monitor/1");
    let id = subscribed(&owner, path.as_str(), &agent, "a.service").await;
    assert_eq!(id, 2, "BlueChi's subscription ids start at 2");

    agent.unit_new(1, "a.service", Reason::Real).await;
    agent.unit_state(2, "a.service", "active", "running").await;
    // Not subscribed: never forwarded.
    agent.unit_state(3, "b.service", "active", "running").await;

    let (member, msg) = owner_in.next(MON_IFACE).await;
    assert_eq!(member, "UnitNew");
    assert_eq!(
        msg.header().destination().map(|d| d.to_string()),
        owner.conn.unique_name().map(|n| n.to_string()),
        "sent to the owner by name"
    );
    assert_eq!(
        strings::<3>(&msg),
        ["node1".to_owned(), "a.service".into(), "real".into()]
    );
    let (member, msg) = owner_in.next(MON_IFACE).await;
    assert_eq!(member, "UnitStateChanged");
    assert_eq!(
        strings::<5>(&msg),
        [
            "node1".to_owned(),
            "a.service".into(),
            "active".into(),
            "running".into(),
            "real".into()
        ]
    );
    assert!(
        owner_in.quiet(MON_IFACE, 300).await,
        "b.service is not watched"
    );
    assert!(other_in.quiet(MON_IFACE, 100).await, "no broadcast");

    // A second monitor subscribing later gets the virtual replay.
    let path2 = create_monitor(&other).await;
    let _: u32 = mcall(&other, path2.as_str(), "Subscribe", &("*", "a.service"))
        .await
        .unwrap();
    let (member, msg) = other_in.next(MON_IFACE).await;
    assert_eq!(member, "UnitNew");
    assert_eq!(strings::<3>(&msg)[2], "virtual");
    let (member, msg) = other_in.next(MON_IFACE).await;
    assert_eq!(member, "UnitStateChanged");
    assert_eq!(strings::<5>(&msg)[2..], ["active", "running", "virtual"]);
    assert_eq!(
        agent
            .requests()
            .iter()
            .filter(|r| matches!(r, Request::Subscribe { .. }))
            .count(),
        1,
        "watchers are merged per unit"
    );

    // Unsubscribe: the last watcher of the unit makes the agent unsubscribe.
    let () = mcall(&owner, path.as_str(), "Unsubscribe", &(id,))
        .await
        .unwrap();
    let () = mcall(&other, path2.as_str(), "Close", &()).await.unwrap();
    agent
        .wait_for_request(&Request::Unsubscribe {
            unit: Some(unit("a.service")),
        })
        .await;
}

#[tokio::test]
async fn bad_arguments_get_the_documented_errors_and_change_nothing() {
    let (f, agent, owner, path) = monitored().await;
    let p = path.as_str();

    let err = mcall::<_, ()>(&owner, p, "Unsubscribe", &(77u32,))
        .await
        .unwrap_err();
    assert_eq!(error_of(&err).0, "org.freedesktop.DBus.Error.Failed");
    assert!(error_of(&err).1.contains("77"));

    for (node, u) in [
        ("node1", "no suffix"),
        ("node1", ""),
        ("bad node!", "a.service"),
        ("", "a.service"),
    ] {
        let res = mcall::<_, u32>(&owner, p, "Subscribe", &(node, u)).await;
        assert_eq!(
            error_name(res),
            "org.freedesktop.DBus.Error.InvalidArgs",
            "{node:?} {u:?}"
        );
    }
    // One bad unit in a list refuses the whole list.
    let res = mcall::<_, u32>(
        &owner,
        p,
        "SubscribeList",
        &("node1", vec!["a.service", "bad unit"]),
    )
    .await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.InvalidArgs");
    // A name without a type suffix is accepted, as BlueChi does, and never
    // matches a unit: the agent is not asked about it.
    for u in ["no-suffix", "web.notatype"] {
        let id: u32 = mcall(&owner, p, "Subscribe", &("node1", u))
            .await
            .unwrap_or_else(|e| panic!("{u}: {e}"));
        let () = mcall(&owner, p, "Unsubscribe", &(id,)).await.unwrap();
    }
    let id: u32 = mcall(&owner, p, "SubscribeList", &("*", vec!["web", "db"]))
        .await
        .unwrap();
    let () = mcall(&owner, p, "Unsubscribe", &(id,)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(agent.request_count(), 0, "nothing reached the agent");

    // A valid but unknown node is accepted (BlueChi logs it).
    let id: u32 = mcall(&owner, p, "Subscribe", &("elsewhere", "a.service"))
        .await
        .unwrap();
    let () = mcall(&owner, p, "Unsubscribe", &(id,)).await.unwrap();
    let res = mcall::<_, ()>(&owner, p, "Unsubscribe", &(id,)).await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.Failed");

    // Peers: invalid, the owner, duplicates.
    let own = owner.unique_name();
    for name in ["not-unique", "", &own] {
        let res = mcall::<_, u32>(&owner, p, "AddPeer", &(name,)).await;
        assert_eq!(
            error_name(res),
            "org.freedesktop.DBus.Error.InvalidArgs",
            "{name}"
        );
    }
    let listener = f.client().await;
    let lname = listener.unique_name();
    let _: u32 = mcall(&owner, p, "AddPeer", &(lname.as_str(),))
        .await
        .unwrap();
    let res = mcall::<_, u32>(&owner, p, "AddPeer", &(lname.as_str(),)).await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.InvalidArgs");
    let res = mcall::<_, ()>(&owner, p, "RemovePeer", &(999u32, "x")).await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.Failed");
}

#[tokio::test]
async fn peers_receive_events_and_peer_removed() {
    let (f, agent, owner, path) = monitored().await;
    let listener = f.client().await;
    let bystander = f.client().await;
    let mut listener_in = listener.inbox();
    let mut bystander_in = bystander.inbox();
    let p = path.as_str();
    let peer = add_peer(&owner, p, &listener).await;
    subscribed(&owner, p, &agent, "*").await;
    let (member, msg) = listener_in.next(MON_IFACE).await;
    assert_eq!(
        (member.as_str(), strings::<3>(&msg)),
        (
            "UnitNew",
            ["node1".to_owned(), "*".into(), "virtual".into()]
        ),
        "a wildcard subscription starts with the pseudo unit"
    );
    agent.unit_state(1, "x.service", "failed", "failed").await;
    let (member, msg) = listener_in.next(MON_IFACE).await;
    assert_eq!(member, "UnitStateChanged");
    assert_eq!(strings::<5>(&msg)[1], "x.service");
    assert!(bystander_in.quiet(MON_IFACE, 200).await);

    let () = mcall(&owner, p, "RemovePeer", &(peer, "bye"))
        .await
        .unwrap();
    let (member, msg) = listener_in.next(MON_IFACE).await;
    assert_eq!(member, "PeerRemoved");
    assert_eq!(strings::<1>(&msg), ["bye".to_owned()]);
    agent.unit_state(2, "x.service", "active", "running").await;
    assert!(
        listener_in.quiet(MON_IFACE, 300).await,
        "removed peers get nothing"
    );

    // Close: remaining peers get PeerRemoved("monitor closed"), the agent unsubscribes.
    add_peer(&owner, p, &bystander).await;
    let () = mcall(&owner, p, "Close", &()).await.unwrap();
    let (member, msg) = bystander_in.next(MON_IFACE).await;
    assert_eq!(member, "PeerRemoved");
    assert_eq!(strings::<1>(&msg), ["monitor closed".to_owned()]);
    agent
        .wait_for_request(&Request::Unsubscribe { unit: None })
        .await;
    let res = mcall::<_, u32>(&owner, p, "Subscribe", &("node1", "*")).await;
    assert_eq!(
        error_name(res),
        "org.freedesktop.DBus.Error.UnknownObject",
        "the monitor is unexported"
    );
}

const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";

/// The error of a call that must fail: (name, message).
fn refused<T: std::fmt::Debug>(res: zbus::Result<T>) -> (String, String) {
    match res {
        Ok(v) => panic!("the call must fail, it returned {v:?}"),
        Err(e) => error_of(&e),
    }
}

#[tokio::test]
async fn a_monitor_answers_its_owner_and_root_and_refuses_everyone_else() {
    let (f, agent, owner, path) = monitored().await;
    let p = path.as_str();
    let sub = subscribed(&owner, p, &agent, "a.service").await;
    let peer = f.client().await;
    let peer_id = add_peer(&owner, p, &peer).await;
    let id: u32 = p.rsplit('/').next().unwrap().parse().unwrap();
    let monitor = f.manager().monitors().get(id).unwrap();

    // Another client, not root (and a peer is not the owner either).
    let stranger = Api {
        conn: connect_as(f.bus.address(), NOBODY).await,
    };
    let name = stranger.unique_name();
    let calls: Vec<(&str, zbus::Result<()>)> = vec![
        ("Close", mcall(&stranger, p, "Close", &()).await),
        (
            "Subscribe",
            mcall::<_, u32>(&stranger, p, "Subscribe", &("node1", "b.service"))
                .await
                .map(drop),
        ),
        (
            "SubscribeList",
            mcall::<_, u32>(&stranger, p, "SubscribeList", &("node1", vec!["b.service"]))
                .await
                .map(drop),
        ),
        (
            "Unsubscribe",
            mcall(&stranger, p, "Unsubscribe", &(sub,)).await,
        ),
        (
            "AddPeer",
            mcall::<_, u32>(&stranger, p, "AddPeer", &(name.as_str(),))
                .await
                .map(drop),
        ),
        (
            "RemovePeer",
            mcall(&stranger, p, "RemovePeer", &(peer_id, "taken over")).await,
        ),
        (
            "Follow",
            mcall::<_, Vec<(String, String, String, String, u64, u64)>>(
                &stranger,
                p,
                "Follow",
                &(),
            )
            .await
            .map(drop),
        ),
    ];
    for (method, res) in calls {
        let (err, msg) = refused(res);
        assert_eq!(err, ACCESS_DENIED, "{method}: {msg}");
        assert!(
            msg.contains(&format!("belongs to {}", owner.unique_name()))
                && msg.contains("uid 65534"),
            "{method}: {msg}"
        );
    }
    // Nothing changed: the subscription, the peer, the monitor itself.
    assert!(!monitor.is_closed());
    assert_eq!(monitor.subscription_count(), 1);
    mcall::<_, ()>(&owner, p, "RemovePeer", &(peer_id, "done"))
        .await
        .expect("the peer was still there");

    // Root that is not the owner keeps BlueChi's reach (its policy: root only).
    let root = f.client().await;
    let sub2: u32 = mcall(&root, p, "Subscribe", &("node1", "*")).await.unwrap();
    mcall::<_, ()>(&root, p, "Unsubscribe", &(sub2,))
        .await
        .unwrap();
    mcall::<_, ()>(&root, p, "Close", &()).await.unwrap();
    assert!(monitor.is_closed());
    assert!(f.manager().monitors().is_empty());
}

#[tokio::test]
async fn each_client_has_its_own_monitor_cap_and_leaving_the_bus_frees_it() {
    let f = Fixture::start(config(&["node1"])).await;
    let greedy = f.client().await;
    let mut paths = Vec::new();
    for _ in 0..MAX_MONITORS_PER_CLIENT {
        paths.push(create_monitor(&greedy).await);
    }
    let (err, msg) = refused(
        greedy
            .call::<_, OwnedObjectPath>(CONTROLLER, CONTROLLER_IFACE, "CreateMonitor", &())
            .await,
    );
    assert_eq!(err, "org.freedesktop.DBus.Error.LimitsExceeded", "{msg}");
    assert!(
        msg.contains(&format!(
            "holds {MAX_MONITORS_PER_CLIENT} monitors, the most one client may hold"
        )),
        "{msg}"
    );
    let monitors = f.manager().monitors();
    assert_eq!(
        monitors.len(),
        MAX_MONITORS_PER_CLIENT,
        "the refusal made none"
    );

    // Another client is not held back by it.
    let other = f.client().await;
    create_monitor(&other).await;
    // Closing one gives the greedy client room for one more.
    mcall::<_, ()>(&greedy, paths[0].as_str(), "Close", &())
        .await
        .unwrap();
    create_monitor(&greedy).await;
    assert_eq!(
        monitors.owned_by(&greedy.unique_name()),
        MAX_MONITORS_PER_CLIENT
    );

    // Leaving the bus frees all of them.
    drop(greedy);
    let monitors2 = monitors.clone();
    eventually(WAIT, "the greedy client's monitors to close", || {
        let n = monitors2.len();
        async move { n == 1 }
    })
    .await
    .unwrap();
    assert_eq!(monitors.owned_by(&other.unique_name()), 1);
}

#[tokio::test]
async fn monitor_closes_when_its_owner_leaves_the_bus() {
    let (f, agent, owner, path) = monitored().await;
    subscribed(&owner, path.as_str(), &agent, "a.service").await;
    drop(owner);
    agent
        .wait_for_request(&Request::Unsubscribe {
            unit: Some(unit("a.service")),
        })
        .await;
    let res = f
        .call::<_, String>(
            path.as_str(),
            "org.freedesktop.DBus.Properties",
            "Get",
            &(MON_IFACE, "X"),
        )
        .await;
    assert_eq!(error_name(res), "org.freedesktop.DBus.Error.UnknownObject");
    assert!(f.manager().monitors().is_empty());
}

#[tokio::test]
async fn node_disconnect_sends_virtual_events_and_reconnect_replays() {
    let (f, agent, owner, path) = monitored().await;
    let mut inbox_ = owner.inbox();
    let p = path.as_str();
    let _: u32 = mcall(
        &owner,
        p,
        "SubscribeList",
        &("node1", vec!["a.service", "*"]),
    )
    .await
    .unwrap();
    assert_eq!(inbox_.next(MON_IFACE).await.0, "UnitNew"); // "*"
    agent.unit_state(1, "a.service", "active", "running").await;
    let (member, msg) = inbox_.next(MON_IFACE).await;
    assert_eq!(member, "UnitStateChanged");
    assert_eq!(
        strings::<5>(&msg)[1],
        "a.service",
        "deduplicated: once per monitor"
    );
    assert!(inbox_.quiet(MON_IFACE, 200).await);

    drop(agent);
    let mut got = Vec::new();
    for _ in 0..4 {
        let (member, msg) = inbox_.next(MON_IFACE).await;
        let args: Vec<String> = match member.as_str() {
            "UnitStateChanged" => strings::<5>(&msg).to_vec(),
            _ => strings::<3>(&msg).to_vec(),
        };
        got.push((member, args));
    }
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        vec![
            (
                "UnitStateChanged".to_owned(),
                v(&["node1", "a.service", "inactive", "agent-offline", "virtual"])
            ),
            (
                "UnitRemoved".to_owned(),
                v(&["node1", "a.service", "virtual"])
            ),
            (
                "UnitStateChanged".to_owned(),
                v(&["node1", "*", "inactive", "agent-offline", "virtual"])
            ),
            ("UnitRemoved".to_owned(), v(&["node1", "*", "virtual"])),
        ]
    );
    // Reconnect: the manager replays both subscriptions, `*` watchers hear of it.
    let agent2 = f.agent("node1", reply_empty()).await;
    let (member, msg) = inbox_.next(MON_IFACE).await;
    assert_eq!(
        (member.as_str(), strings::<3>(&msg)),
        (
            "UnitNew",
            ["node1".to_owned(), "*".into(), "virtual".into()]
        )
    );
    agent2
        .wait_for_request(&Request::Subscribe { unit: None })
        .await;
    agent2
        .wait_for_request(&Request::Subscribe {
            unit: Some(unit("a.service")),
        })
        .await;
}

type Row = (String, String, String, String, u64, u64);
type Changed = (String, String, String, String, String, String, u64, u64);

/// The next `n` entries of the batched tagged stream (`UnitsChanged`), in
/// order, and the number of signals they came in. Fails on any BlueChi
/// per-event signal: a followed monitor gets only the batched stream.
async fn next_tagged(stream: &mut Inbox, pending: &mut Vec<Changed>, n: usize) -> Vec<Changed> {
    while pending.len() < n {
        let msg = stream.next_message().await;
        let h = msg.header();
        if h.message_type() != zbus::message::Type::Signal {
            continue;
        }
        let iface = h.interface().map(|i| i.to_string()).unwrap_or_default();
        let member = h.member().map(|m| m.to_string()).unwrap_or_default();
        if iface == DROVER_MON {
            assert_eq!(member, "UnitsChanged");
            let (rows,): (Vec<Changed>,) = msg.body().deserialize().unwrap();
            assert!(!rows.is_empty(), "an empty UnitsChanged");
            pending.extend(rows);
        } else if iface == MON_IFACE {
            panic!("BlueChi signal {member} to a followed monitor");
        }
    }
    pending.drain(..n).collect()
}

#[tokio::test]
async fn follow_returns_a_snapshot_then_tagged_events_across_reconnects() {
    let (f, agent, owner, path) = monitored().await;
    let g1 = agent.accepted.session_id;
    let mut inbox_ = owner.inbox();
    let p = path.as_str();
    subscribed(&owner, p, &agent, "*").await;
    agent.unit_state(1, "a.service", "active", "running").await;
    agent.unit_state(2, "b.service", "failed", "failed").await;
    // Wait until both went through.
    let mut seen = 0;
    while seen < 2 {
        if inbox_.next(MON_IFACE).await.0 == "UnitStateChanged" {
            seen += 1;
        }
    }
    let snap: Vec<Row> = mcall(&owner, p, "Follow", &()).await.unwrap();
    assert_eq!(
        snap,
        vec![
            (
                "node1".into(),
                "a.service".into(),
                "active".into(),
                "running".into(),
                g1,
                1
            ),
            (
                "node1".into(),
                "b.service".into(),
                "failed".into(),
                "failed".into(),
                g1,
                2
            ),
        ]
    );
    agent
        .unit_state(3, "a.service", "deactivating", "stop")
        .await;
    let mut pending = Vec::new();
    let c = next_tagged(&mut inbox_, &mut pending, 1).await.remove(0);
    assert_eq!(
        c,
        (
            "node1".into(),
            "a.service".into(),
            "state".into(),
            "deactivating".into(),
            "stop".into(),
            "real".into(),
            g1,
            3
        )
    );
    // Disconnect: tagged virtual events continue the index.
    drop(agent);
    let mut tags = Vec::new();
    for c in next_tagged(&mut inbox_, &mut pending, 4).await {
        tags.push((c.1, c.2, c.5, c.6, c.7));
    }
    assert_eq!(
        tags,
        vec![
            ("a.service".into(), "state".into(), "virtual".into(), g1, 4),
            (
                "a.service".into(),
                "removed".into(),
                "virtual".into(),
                g1,
                5
            ),
            // b was failed, not inactive: it also gets the virtual inactive.
            ("b.service".into(), "state".into(), "virtual".into(), g1, 6),
            (
                "b.service".into(),
                "removed".into(),
                "virtual".into(),
                g1,
                7
            ),
        ]
    );
    // A new session's events carry its guid and succeed everything before.
    let agent2 = f.agent("node1", reply_empty()).await;
    let g2 = agent2.accepted.session_id;
    assert!(g2 > g1);
    agent2
        .wait_for_request(&Request::Subscribe { unit: None })
        .await;
    agent2.unit_new(1, "a.service", Reason::Virtual).await;
    // A stale event from the old guid on the new session is dropped.
    agent2
        .send(state_event(g1, 99, "a.service", "active", "running"))
        .await;
    // The pseudo unit `*`'s virtual New of the new session has no tagged
    // entry; the unit's New is the next one.
    let c = next_tagged(&mut inbox_, &mut pending, 1).await.remove(0);
    assert_eq!((c.2.as_str(), c.6, c.7), ("new", g2, 1));
    assert!(pending.is_empty(), "{pending:?}");
    assert!(inbox_.quiet(DROVER_MON, 300).await);
    assert!(inbox_.quiet(MON_IFACE, 300).await);
    let snap: Vec<Row> = mcall(&owner, p, "Follow", &()).await.unwrap();
    assert_eq!(
        snap,
        vec![(
            "node1".into(),
            "a.service".into(),
            "inactive".into(),
            "dead".into(),
            g2,
            1
        )]
    );
}

#[tokio::test]
async fn a_followed_monitor_sends_every_event_in_batches_to_its_owner_and_peers_only() {
    let (f, agent, owner, path) = monitored().await;
    let g = agent.accepted.session_id;
    let peer = f.client().await;
    let bystander = f.client().await;
    let mut owner_in = owner.inbox();
    let mut peer_in = peer.inbox();
    let mut bystander_in = bystander.inbox();
    let p = path.as_str();
    add_peer(&owner, p, &peer).await;
    subscribed(&owner, p, &agent, "x.service").await;
    let snap: Vec<Row> = mcall(&owner, p, "Follow", &()).await.unwrap();
    assert!(snap.is_empty(), "{snap:?}");
    const N: u64 = 3000;
    for i in 1..=N {
        let (a, s) = if i % 2 == 0 {
            ("active", "running")
        } else {
            ("activating", "start")
        };
        agent.unit_state(i, "x.service", a, s).await;
    }
    for (who, stream) in [("owner", &mut owner_in), ("peer", &mut peer_in)] {
        let mut pending = Vec::new();
        let rows = next_tagged(stream, &mut pending, N as usize).await;
        let indexes: Vec<u64> = rows.iter().map(|r| r.7).collect();
        assert_eq!(
            indexes,
            (1..=N).collect::<Vec<_>>(),
            "{who}: every event once, in order"
        );
        assert!(
            rows.iter()
                .all(|r| r.1 == "x.service" && r.2 == "state" && r.6 == g)
        );
        assert_eq!(rows[1].3, "active");
        assert!(pending.is_empty(), "{who}: {pending:?}");
        assert!(
            stream.quiet(MON_IFACE, 200).await,
            "{who}: no BlueChi signal"
        );
    }
    assert!(bystander_in.quiet(DROVER_MON, 200).await);
}

#[tokio::test]
async fn introspection_describes_monitor_members() {
    let f = Fixture::start(config(&["node1"])).await;
    let owner = f.client().await;
    let path = create_monitor(&owner).await;
    assert_mentions(
        &f.introspect(path.as_str()).await,
        "monitor XML",
        &[
            r#"<interface name="org.eclipse.bluechi.Monitor">"#,
            r#"<method name="Subscribe">"#,
            r#"<method name="SubscribeList">"#,
            r#"<arg name="units" type="as" direction="in"/>"#,
            r#"<method name="Unsubscribe">"#,
            r#"<method name="AddPeer">"#,
            r#"<method name="RemovePeer">"#,
            r#"<method name="Close">"#,
            r#"<signal name="UnitNew">"#,
            r#"<signal name="UnitRemoved">"#,
            r#"<signal name="UnitStateChanged">"#,
            r#"<signal name="UnitPropertiesChanged">"#,
            r#"<arg name="props" type="a{sv}"/>"#,
            r#"<signal name="PeerRemoved">"#,
            r#"<interface name="io.drover.Monitor">"#,
            r#"<method name="Follow">"#,
            r#"<arg name="units" type="a(sssstt)" direction="out"/>"#,
            r#"<signal name="UnitsChanged">"#,
            r#"<arg name="units" type="a(sssssstt)"/>"#,
        ],
    );
}

/// A `*` monitor on a fleet whose replay (one `UnitNew` + `UnitStateChanged`
/// per loaded unit, and `UnitNew("*")` per node) is larger than a monitor's
/// queue of 8,192 events: `Subscribe` succeeds, the monitor hears of every
/// unit once, new before state, and stays open (issue 17: `bluechictl
/// monitor` on 200 nodes × 100 units used to be dropped at subscription).
#[tokio::test]
async fn a_wildcard_monitor_on_a_fleet_larger_than_its_queue_gets_the_whole_replay() {
    const NODES: usize = 20;
    const UNITS: usize = 250;
    let names: Vec<String> = (1..=NODES).map(|i| format!("node{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = Fixture::start(config(&refs)).await;
    let mut agents = Vec::new();
    for n in &names {
        agents.push(f.agent(n, reply_empty()).await);
    }
    // A first monitor makes the manager know every unit of the fleet.
    let seeder = f.client().await;
    let seed = create_monitor(&seeder).await;
    let _: u32 = mcall(&seeder, seed.as_str(), "Subscribe", &("*", "*"))
        .await
        .unwrap();
    for a in &agents {
        a.wait_for_request(&Request::Subscribe { unit: None }).await;
        for u in 0..UNITS {
            a.unit_state(
                u as u64 + 1,
                &format!("u{u:03}.service"),
                "active",
                "running",
            )
            .await;
        }
    }
    eventually(WAIT, "the manager knows every unit", || async {
        let rows: Vec<Row> = mcall(&seeder, seed.as_str(), "Follow", &()).await.unwrap();
        rows.len() == NODES * UNITS
    })
    .await
    .unwrap();

    let owner = f.client().await;
    let mut inbox_ = owner.inbox();
    let path = create_monitor(&owner).await;
    let p = path.as_str();
    let want = NODES + 2 * NODES * UNITS;
    assert!(want > 8192, "the replay must exceed the queue");
    // Read while subscribing: the replay may come before the reply.
    let last = agents.last().unwrap();
    let last_name = names[NODES - 1].clone();
    // The unit of the last node that changes while the replay runs: told
    // before the change (then the real event follows, one more signal) or
    // after it (its replay carries the new state).
    let told_before = |got: &[(String, Vec<String>)]| {
        got.iter().any(|(m, a)| {
            m == "UnitStateChanged" && a[..3] == [last_name.as_str(), "u007.service", "active"]
        })
    };
    let collect = async {
        let mut got: Vec<(String, Vec<String>)> = Vec::with_capacity(want + 1);
        let mut changed = false;
        while got.len() < want || (got.len() == want && told_before(&got)) {
            let (member, msg) = inbox_.next(MON_IFACE).await;
            let args: Vec<String> = match member.as_str() {
                "UnitStateChanged" => strings::<5>(&msg).to_vec(),
                "UnitNew" => strings::<3>(&msg).to_vec(),
                other => panic!("unexpected {other} during the replay"),
            };
            if got.len() == 100 && !changed {
                // A real event during the replay, for a unit of the last node.
                last.unit_state(UNITS as u64 + 1, "u007.service", "failed", "failed")
                    .await;
                changed = true;
            }
            got.push((member, args));
        }
        got
    };
    let (sub, got) = tokio::join!(
        mcall::<_, u32>(&owner, p, "Subscribe", &("*", "*")),
        collect
    );
    let sub = sub.expect("Subscribe(*, *) succeeds however large the replay");
    // Every unit once: virtual new, then its state; `*` once per node.
    /// (member, arguments after node and unit) per (node, unit).
    type Told = Vec<(String, Vec<String>)>;
    let mut seen: std::collections::HashMap<(String, String), Told> = Default::default();
    for (member, args) in got {
        seen.entry((args[0].clone(), args[1].clone()))
            .or_default()
            .push((member, args[2..].to_vec()));
    }
    assert_eq!(seen.len(), NODES * (UNITS + 1));
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    for n in &names {
        assert_eq!(
            seen[&(n.clone(), "*".to_owned())],
            vec![("UnitNew".to_owned(), v(&["virtual"]))]
        );
        for u in 0..UNITS {
            let unit = format!("u{u:03}.service");
            let events = &seen[&(n.clone(), unit.clone())];
            assert_eq!(
                events[0],
                ("UnitNew".to_owned(), v(&["virtual"])),
                "{n} {unit}"
            );
            if *n == names[NODES - 1] && u == 7 {
                // Told either as replayed (folded in) or as replayed then real.
                let last = events.last().unwrap();
                assert_eq!(last.1[..2], v(&["failed", "failed"]), "{events:?}");
                assert!(events.len() <= 3, "{events:?}");
            } else {
                assert_eq!(
                    events[1..],
                    [(
                        "UnitStateChanged".to_owned(),
                        v(&["active", "running", "virtual"])
                    )],
                    "{n} {unit}"
                );
            }
        }
    }
    // Still open, nothing more queued for it.
    assert!(inbox_.quiet(MON_IFACE, 200).await);
    let () = mcall(&owner, p, "Unsubscribe", &(sub,)).await.unwrap();
}
