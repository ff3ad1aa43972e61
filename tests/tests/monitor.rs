//! Monitoring on real systemd nodes: every case of BlueChi's "Monitoring" test list
//! through droverctl and over D-Bus, the peer rules, and
//! drover's snapshot + tagged stream (`io.drover.Monitor.Follow`) across an agent
//! restart.

use drover_protocol::ModTag;
use drover_testkit::monitor::Change;
use drover_testkit::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(1500);

fn is_state(ev: &Ev, node: &str, unit: &str, active: &str, reason: &str) -> bool {
    matches!(ev, Ev::State { node: n, unit: u, active: a, reason: r, .. }
        if n == node && u == unit && a == active && r == reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn droverctl_monitor_sees_a_service_restart_and_ctrl_c_ends_it() {
    let c = TestCluster::with_units(2, &[("node1", "web.service", SLEEPER)]).await;
    c.systemctl_ok("node1", &["start", "web.service"]).await;

    let mut mon = c.follow(&["monitor", "node1", "web"]);
    let first = mon
        .expect_line("monitor path", T, |l| l.starts_with("Monitor path: "))
        .await
        .unwrap();
    assert!(mon.seen[first].starts_with("Monitor path: /org/eclipse/bluechi/monitor/"));
    mon.expect_line("subscription line", T, |l| {
        l == "Subscribing to node 'node1' and unit 'web.service'"
    })
    .await
    .unwrap();
    // The already running unit is announced virtually.
    mon.expect_line("virtual new", T, |l| {
        l == "\tUnit created (reason: virtual)"
    })
    .await
    .unwrap();
    mon.expect_line("virtual state", T, |l| l == "\tActive: active (running)")
        .await
        .unwrap();

    c.ctl_ok(&["restart", "node1", "web"]).await;
    let i = mon
        .expect_line("real state change", T, |l| {
            l == "\tUnit state changed (reason: real)"
        })
        .await
        .unwrap();
    assert_eq!(mon.seen[i - 1], "[node1] web.service");
    mon.expect_line("stopped", T, |l| l == "\tActive: inactive (dead)")
        .await
        .unwrap();
    mon.expect_line("running again", T, |l| l == "\tActive: active (running)")
        .await
        .unwrap();
    mon.settle(Duration::from_millis(300)).await;
    assert!(
        mon.seen
            .iter()
            .any(|l| l == "\tUnit properties changed (Interface: org.freedesktop.systemd1.Unit)"),
        "{:?}",
        mon.seen
    );
    // Only node1's web.service is shown.
    assert!(
        mon.seen
            .iter()
            .filter(|l| l.starts_with('['))
            .all(|l| l == "[node1] web.service"),
        "{:?}",
        mon.seen
    );
    let status = mon.interrupt(T).await.unwrap();
    assert!(status.success(), "Ctrl-C ends monitor with 0: {status:?}");

    // An unknown node is an error, not a silent empty watch (bounded: a monitor
    // that wrongly starts would run forever).
    let mut typo = c.follow(&["monitor", "nodeX"]);
    let status = typo.wait_exit(T).await.unwrap();
    assert_eq!(status.code(), Some(1));
    let err = typo.drain_stderr();
    assert!(err.contains("node 'nodeX' not found"), "{err}");
    let mut typo = c.follow(&["monitor", "node1", "a,,b"]);
    assert_eq!(typo.wait_exit(T).await.unwrap().code(), Some(2));
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn droverctl_monitor_shows_units_created_and_removed() {
    let c = TestCluster::with_units(1, &[("node1", "created.service", ONESHOT_OK)]).await;
    let mut all = c.follow(&["monitor", "node1"]);
    all.expect_line("subscribed", T, |l| {
        l == "Subscribing to node 'node1' and unit '*'"
    })
    .await
    .unwrap();
    let mut json = c.follow(&["--json", "monitor", "node1", "created"]);
    let head = json
        .expect_line("json header", T, |l| l.contains("\"Subscribed\""))
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json.seen[head]).unwrap();
    assert_eq!(v["node"], "node1");
    assert_eq!(v["units"], serde_json::json!(["created.service"]));
    // Let both subscriptions settle before the unit appears.
    all.settle(Duration::from_millis(500)).await;
    all.skip_seen();

    // Starting the unloaded oneshot loads it; once it is done systemd unloads it.
    c.ctl_ok(&["start", "node1", "created"]).await;
    let i = all
        .expect_line("created", T, |l| l == "\tUnit created (reason: real)")
        .await
        .unwrap();
    assert_eq!(all.seen[i - 1], "[node1] created.service");
    let i = all
        .expect_line("removed", T, |l| l == "\tUnit removed (reason: real)")
        .await
        .unwrap();
    assert_eq!(all.seen[i - 1], "[node1] created.service");

    let mut kinds = Vec::new();
    for _ in 0..2 {
        let i = json
            .expect_line("json event", T, |l| {
                l.contains("\"UnitNew\"") || l.contains("\"UnitRemoved\"")
            })
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json.seen[i]).unwrap();
        assert_eq!(
            (v["node"].as_str(), v["unit"].as_str()),
            (Some("node1"), Some("created.service"))
        );
        kinds.push((
            v["event"].as_str().unwrap().to_string(),
            v["reason"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(
        kinds,
        [
            ("UnitNew".to_string(), "real".to_string()),
            ("UnitRemoved".to_string(), "real".to_string())
        ]
    );
    assert!(all.interrupt(T).await.unwrap().success());
    assert!(json.interrupt(T).await.unwrap().success());
    c.down().await;
}

/// The rows of a node status table, as (node, state).
fn node_rows(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            (f.len() == 5 && f[0] != "NODE").then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_reprints_nodes_and_units_on_changes() {
    let mut c = TestCluster::with_units(2, &[("node1", "web.service", SLEEPER)]).await;

    let mut nodes = c.follow(&["status", "-w"]);
    nodes
        .expect_line("node2 online", T, |l| {
            l.starts_with("node2 ") && l.contains("| online")
        })
        .await
        .unwrap();
    let mut units = c.follow(&["status", "node1", "web", "-w"]);
    units
        .expect_line("web inactive", T, |l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            f.first() == Some(&"web.service") && f.get(2) == Some(&"inactive")
        })
        .await
        .unwrap();

    c.stop_agent("node2").await.unwrap();
    nodes
        .expect_line("node2 offline", T, |l| {
            l.starts_with("node2 ") && l.contains("| offline")
        })
        .await
        .unwrap();
    // Every reprint is a whole table: header, separator, both nodes.
    let rows = node_rows(&nodes.seen);
    assert!(rows.len() >= 4 && rows.len().is_multiple_of(2), "{rows:?}");
    c.start_agent("node2").await.unwrap();
    nodes
        .expect_line("node2 back online", T, |l| {
            l.starts_with("node2 ") && l.contains("| online")
        })
        .await
        .unwrap();

    c.ctl_ok(&["start", "node1", "web"]).await;
    units
        .expect_line("web active", T, |l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            f.first() == Some(&"web.service")
                && f.get(2) == Some(&"active")
                && f.get(3) == Some(&"running")
        })
        .await
        .unwrap();
    assert!(nodes.interrupt(T).await.unwrap().success());
    assert!(units.interrupt(T).await.unwrap().success());

    // The manager leaving ends a watch with exit 1 and says why.
    let mut watch = c.follow(&["status", "-w"]);
    watch
        .expect_line("first table", T, |l| l.starts_with("node1 "))
        .await
        .unwrap();
    c.stop_manager().await.unwrap();
    let status = watch.wait_exit(T).await.unwrap();
    assert_eq!(status.code(), Some(1));
    let err = watch.drain_stderr();
    assert!(err.contains("drover-manager left"), "{err}");
    c.start_manager().await.unwrap();
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_open_close_and_unsubscribe() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    let mut m = c.monitor().await;
    assert!(
        m.path.starts_with("/org/eclipse/bluechi/monitor/"),
        "{}",
        m.path
    );
    let xml: String = zbus::Proxy::new(
        &m.conn,
        BUS_NAME,
        m.path.clone(),
        "org.freedesktop.DBus.Introspectable",
    )
    .await
    .unwrap()
    .call("Introspect", &())
    .await
    .unwrap();
    assert!(xml.contains("org.eclipse.bluechi.Monitor") && xml.contains("io.drover.Monitor"));

    let id = m.subscribe("node1", "web.service").await.unwrap();
    c.ctl_ok(&["start", "node1", "web"]).await;
    m.expect("web active", T, |e| {
        is_state(e, "node1", "web.service", "active", "real")
    })
    .await
    .unwrap();

    // Unsubscribed: nothing more; the id is gone.
    let _: () = m.proxy.call("Unsubscribe", &(id,)).await.unwrap();
    // Events of the start that were already on their way may still arrive:
    // a subscription to another unit of the node is a barrier, its replay
    // comes behind them on the same link and through the same queue.
    m.subscribe("node1", "default.target").await.unwrap();
    m.expect("default.target replayed", T, |e| {
        is_state(e, "node1", "default.target", "active", "virtual")
    })
    .await
    .unwrap();
    let mark = m.mark();
    c.ctl_ok(&["restart", "node1", "web"]).await;
    m.settle(QUIET).await;
    assert!(m.since(mark).is_empty(), "{:?}", m.since(mark));
    for bad in [id, 4242] {
        let e = m
            .proxy
            .call::<_, _, ()>("Unsubscribe", &(bad,))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("org.freedesktop.DBus.Error.Failed"),
            "{e}"
        );
    }
    // Bad subscriptions: refused, nothing subscribed.
    for (node, unit) in [("node1", "a b"), ("no_de", "web.service"), ("node1", "")] {
        let e = m.subscribe(node, unit).await.unwrap_err();
        assert!(e.to_string().contains("InvalidArgs"), "{node} {unit}: {e}");
    }
    let e = m.subscribe_list("node1", &[]).await.unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");

    // Close: the object goes; a second Close or a Subscribe fails.
    let _: () = m.proxy.call("Close", &()).await.unwrap();
    assert!(m.proxy.call::<_, _, ()>("Close", &()).await.is_err());
    assert!(m.subscribe("node1", "web.service").await.is_err());

    // A monitor whose owner leaves the bus is closed: its peer is told.
    let owner = c.monitor().await;
    owner.subscribe("node1", "*").await.unwrap();
    let peer_conn = c.api().await.conn;
    let peer_name = peer_conn.unique_name().unwrap().to_string();
    let mut peer = MonitorWatch::listen(peer_conn, &owner.path).await;
    let _: u32 = owner
        .proxy
        .call("AddPeer", &(peer_name.as_str(),))
        .await
        .unwrap();
    let path = owner.path.clone();
    drop(owner);
    peer.expect("PeerRemoved", T, |e| matches!(e, Ev::PeerRemoved { .. }))
        .await
        .unwrap();
    let probe = zbus::Proxy::new(&peer.conn, BUS_NAME, path, "org.eclipse.bluechi.Monitor")
        .await
        .unwrap();
    eventually(T, "the monitor object is gone", || async {
        probe
            .call::<_, _, u32>("Subscribe", &("node1", "web.service"))
            .await
            .is_err()
    })
    .await
    .unwrap();
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_specific_node_and_unit_gets_every_signal_and_nothing_else() {
    let c = TestCluster::start(2).await;
    for n in ["node1", "node2"] {
        c.install(n, "web.service", SLEEPER).await;
        c.install(n, "other.service", SLEEPER).await;
    }
    let mut m = c.monitor().await;
    m.subscribe("node1", "web.service").await.unwrap();
    m.settle(Duration::from_millis(300)).await;

    for n in ["node1", "node2"] {
        for u in ["web.service", "other.service"] {
            c.systemctl_ok(n, &["start", u]).await;
        }
    }
    m.expect("new", T, |e| matches!(e, Ev::New { node, unit, reason } if node == "node1" && unit == "web.service" && reason == "real"))
        .await
        .unwrap();
    m.expect("active", T, |e| {
        is_state(e, "node1", "web.service", "active", "real")
    })
    .await
    .unwrap();
    c.systemctl_ok("node1", &["stop", "web.service"]).await;
    m.expect("inactive", T, |e| {
        is_state(e, "node1", "web.service", "inactive", "real")
    })
    .await
    .unwrap();
    m.settle(QUIET).await;
    assert!(
        m.seen.iter().any(|e| matches!(e, Ev::Props { node, unit, .. } if node == "node1" && unit == "web.service")),
        "properties changes are forwarded: {:?}",
        m.seen
    );
    for e in &m.seen {
        assert_eq!(e.unit(), Some(("node1", "web.service")), "{e:?}");
    }
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_multiple_nodes_and_units_stay_separate() {
    let c = TestCluster::start(2).await;
    for n in ["node1", "node2"] {
        for u in ["a.service", "b.service", "c.service"] {
            c.install(n, u, SLEEPER).await;
        }
    }
    let mut m = c.monitor().await;
    m.subscribe_list("node1", &["a.service", "b.service"])
        .await
        .unwrap();
    m.subscribe_list("node2", &["c.service"]).await.unwrap();
    for n in ["node1", "node2"] {
        for u in ["a.service", "b.service", "c.service"] {
            c.systemctl_ok(n, &["start", u]).await;
        }
    }
    let wanted = [
        ("node1", "a.service"),
        ("node1", "b.service"),
        ("node2", "c.service"),
    ];
    for (n, u) in wanted {
        m.expect(&format!("{u} on {n} active"), T, |e| {
            is_state(e, n, u, "active", "real")
        })
        .await
        .unwrap();
    }
    m.settle(QUIET).await;
    let got: BTreeSet<(String, String)> = m
        .seen
        .iter()
        .filter_map(|e| e.unit().map(|(n, u)| (n.to_string(), u.to_string())))
        .collect();
    let want: BTreeSet<(String, String)> = wanted
        .iter()
        .map(|(n, u)| (n.to_string(), u.to_string()))
        .collect();
    assert_eq!(got, want);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_wildcard_unit_sees_every_unit_of_its_node() {
    let c = TestCluster::start(2).await;
    for n in ["node1", "node2"] {
        c.install(n, "x.service", SLEEPER).await;
    }
    let mut m = c.monitor().await;
    m.subscribe("node1", "*").await.unwrap();
    // The pseudo unit `*` and every loaded unit are announced virtually.
    m.expect("virtual *", T, |e| matches!(e, Ev::New { node, unit, reason } if node == "node1" && unit == "*" && reason == "virtual"))
        .await
        .unwrap();
    m.expect("init.scope replayed", T, |e| matches!(e, Ev::New { node, unit, reason } if node == "node1" && unit == "init.scope" && reason == "virtual"))
        .await
        .unwrap();
    m.settle(Duration::from_millis(300)).await;
    c.systemctl_ok("node2", &["start", "x.service"]).await;
    c.systemctl_ok("node1", &["start", "x.service"]).await;
    m.expect("x new", T, |e| matches!(e, Ev::New { node, unit, reason } if node == "node1" && unit == "x.service" && reason == "real"))
        .await
        .unwrap();
    m.expect("x active", T, |e| {
        is_state(e, "node1", "x.service", "active", "real")
    })
    .await
    .unwrap();
    m.settle(Duration::from_millis(500)).await;
    assert!(
        m.seen
            .iter()
            .all(|e| e.unit().is_none_or(|(n, _)| n == "node1")),
        "{:?}",
        m.seen
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_wildcard_node_sees_virtual_events_on_disconnect_and_reconnect() {
    let mut c = TestCluster::with_units(2, &[("node1", "web.service", SLEEPER)]).await;
    c.systemctl_ok("node1", &["start", "web.service"]).await;
    let mut m = c.monitor().await;
    m.subscribe("*", "*").await.unwrap();
    for n in ["node1", "node2"] {
        m.expect(&format!("virtual * of {n}"), T, |e| matches!(e, Ev::New { node, unit, reason } if node == n && unit == "*" && reason == "virtual"))
            .await
            .unwrap();
    }
    m.expect("web replayed", T, |e| {
        is_state(e, "node1", "web.service", "active", "virtual")
    })
    .await
    .unwrap();
    m.settle(Duration::from_millis(500)).await;
    let mark = m.mark();

    c.stop_agent("node1").await.unwrap();
    m.expect("web offline", T, |e| matches!(e, Ev::State { node, unit, active, sub, reason } if node == "node1" && unit == "web.service" && active == "inactive" && sub == "agent-offline" && reason == "virtual"))
        .await
        .unwrap();
    m.expect("web removed", T, |e| matches!(e, Ev::Removed { node, unit, reason } if node == "node1" && unit == "web.service" && reason == "virtual"))
        .await
        .unwrap();
    m.settle(Duration::from_millis(500)).await;
    assert!(
        m.since(mark).iter().any(|e| matches!(e, Ev::Removed { node, unit, reason } if node == "node1" && unit == "*" && reason == "virtual")),
        "the pseudo unit * goes too: {:?}",
        m.since(mark)
    );
    // node2's units may change on their own (timers), and the tail of its
    // replay may still come; what must not happen is what node1 going away
    // would cause on node2: a virtual removal or offline state.
    assert!(
        !m.since(mark).iter().any(|e| matches!(e,
            Ev::Removed { node, reason, .. } if node == "node2" && reason == "virtual")
            || matches!(e, Ev::State { node, sub, .. } if node == "node2" && sub == "agent-offline")),
        "node2 is untouched: {:?}",
        m.since(mark)
    );

    c.start_agent("node1").await.unwrap();
    m.expect("* back", T, |e| matches!(e, Ev::New { node, unit, reason } if node == "node1" && unit == "*" && reason == "virtual"))
        .await
        .unwrap();
    m.expect("web back", T, |e| {
        is_state(e, "node1", "web.service", "active", "virtual")
    })
    .await
    .unwrap();
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_peers_receive_exactly_while_added() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    let mut owner = c.monitor().await;
    owner.subscribe("node1", "web.service").await.unwrap();
    let owner_name = owner.conn.unique_name().unwrap().to_string();

    let peer_conn = c.api().await.conn;
    let peer_name = peer_conn.unique_name().unwrap().to_string();
    let mut peer = MonitorWatch::listen(peer_conn, &owner.path).await;
    let stranger_conn = c.api().await.conn;
    let mut stranger = MonitorWatch::listen(stranger_conn, &owner.path).await;

    // Owner as peer, duplicates, garbage: refused.
    let e = owner
        .proxy
        .call::<_, _, u32>("AddPeer", &(owner_name.as_str(),))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "owner as peer: {e}");
    let id: u32 = owner
        .proxy
        .call("AddPeer", &(peer_name.as_str(),))
        .await
        .unwrap();
    let e = owner
        .proxy
        .call::<_, _, u32>("AddPeer", &(peer_name.as_str(),))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "added twice: {e}");
    let e = owner
        .proxy
        .call::<_, _, u32>("AddPeer", &("not a bus name",))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    let e = owner
        .proxy
        .call::<_, _, ()>("RemovePeer", &(9999u32, "x"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Failed"), "{e}");

    c.systemctl_ok("node1", &["start", "web.service"]).await;
    owner
        .expect("owner sees it", T, |e| {
            is_state(e, "node1", "web.service", "active", "real")
        })
        .await
        .unwrap();
    peer.expect("peer sees it", T, |e| {
        is_state(e, "node1", "web.service", "active", "real")
    })
    .await
    .unwrap();
    stranger.settle(QUIET).await;
    assert!(
        stranger.seen.is_empty(),
        "not a peer, nothing: {:?}",
        stranger.seen
    );

    // Removed: told why, then nothing more.
    let _: () = owner.proxy.call("RemovePeer", &(id, "bye")).await.unwrap();
    peer.expect("PeerRemoved", T, |e| {
        *e == Ev::PeerRemoved {
            reason: "bye".into(),
        }
    })
    .await
    .unwrap();
    let mark = peer.mark();
    c.systemctl_ok("node1", &["stop", "web.service"]).await;
    owner
        .expect("owner still sees", T, |e| {
            is_state(e, "node1", "web.service", "inactive", "real")
        })
        .await
        .unwrap();
    peer.settle(QUIET).await;
    assert!(peer.since(mark).is_empty(), "{:?}", peer.since(mark));
    assert!(
        owner
            .seen
            .iter()
            .all(|e| !matches!(e, Ev::PeerRemoved { .. })),
        "PeerRemoved goes only to the peer"
    );
    c.down().await;
}

/// Starts (even rounds) or stops (odd rounds) f2 and f3 on node1.
async fn toggle(c: &TestCluster, round: usize) {
    for u in ["f2.service", "f3.service"] {
        let verb = if round.is_multiple_of(2) {
            "start"
        } else {
            "stop"
        };
        c.systemctl_ok("node1", &[verb, u]).await;
    }
}

/// A unit's record as a client following a monitor holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    active: String,
    sub: String,
    tag: ModTag,
}

type Snapshot = BTreeMap<String, Record>;

fn snapshot_map(rows: Vec<(String, String, String, String, u64, u64)>) -> Snapshot {
    rows.into_iter()
        .map(|(node, unit, active, sub, guid, index)| {
            assert_eq!(node, "node1");
            (
                unit,
                Record {
                    active,
                    sub,
                    tag: ModTag::new(guid, index),
                },
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_gives_a_snapshot_then_a_stream_without_gap_or_duplicate_across_an_agent_restart() {
    let mut c = TestCluster::start(1).await;
    let units = ["f1.service", "f2.service", "f3.service"];
    for u in units {
        c.install("node1", u, SLEEPER).await;
    }
    c.systemctl_ok("node1", &["start", "f1.service"]).await;
    let mut m = c.monitor().await;
    m.subscribe_list("node1", &units).await.unwrap();
    // The agent's replay of f1 has reached the manager (the snapshot is built
    // from what the manager knows, so before that it could not hold f1).
    m.expect("f1's replayed state", T, |e| {
        matches!(e, Ev::State { unit, active, .. } if unit == "f1.service" && active == "active")
    })
    .await
    .unwrap();
    // Activity right around the snapshot, so events race it.
    c.systemctl_ok("node1", &["start", "--no-block", "f2.service"])
        .await;
    let snapshot = snapshot_map(m.follow().await.unwrap());
    assert!(
        snapshot
            .get("f1.service")
            .is_some_and(|r| r.active == "active"),
        "{snapshot:?}"
    );

    for round in 0..4 {
        toggle(&c, round).await;
    }
    c.stop_agent("node1").await.unwrap();
    c.wait_status("node1", "offline", T).await;
    // Changes while the agent is away are caught up by the replay.
    c.systemctl_ok("node1", &["start", "f3.service"]).await;
    c.systemctl_ok("node1", &["stop", "f1.service"]).await;
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    for round in 0..3 {
        toggle(&c, round).await;
    }
    // The rounds' last change is f3's real start in round 2 (round 0 found it
    // running); the stream is in order, so once it is here all is.
    let first_guid = snapshot["f1.service"].tag.guid;
    m.expect("f3's last start", T, |e| {
        matches!(e, Ev::Changed(ch) if ch.unit == "f3.service" && ch.kind == "state"
            && ch.active == "active" && ch.reason == "real" && ch.tag.guid != first_guid)
    })
    .await
    .unwrap();

    // Apply the stream on top of the snapshot by the tag rules.
    let mut held = snapshot.clone();
    let mut last_index: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut seen_tags = BTreeSet::new();
    let changes: Vec<&Change> = m
        .seen
        .iter()
        .filter_map(|e| match e {
            Ev::Changed(change) => Some(change),
            _ => None,
        })
        .collect();
    assert!(
        !changes.is_empty(),
        "Follow() turns on UnitsChanged: {:?}",
        m.seen
    );
    // Once the batched stream has begun, the monitor gets nothing else: no
    // BlueChi per-event signal follows the first tagged entry.
    let first = m
        .seen
        .iter()
        .position(|e| matches!(e, Ev::Changed { .. }))
        .unwrap_or(m.seen.len());
    let after: Vec<_> = m.seen[first..]
        .iter()
        .filter(|e| !matches!(e, Ev::Changed { .. }))
        .collect();
    assert!(
        after.is_empty(),
        "BlueChi signals after Follow(): {after:?}"
    );
    let mut guids = BTreeSet::new();
    for Change {
        node,
        unit,
        kind,
        active,
        sub,
        tag,
        ..
    } in changes
    {
        assert_eq!(node.as_str(), "node1");
        assert!(
            units.contains(&unit.as_str()),
            "only subscribed units: {unit}"
        );
        guids.insert(tag.guid);
        if kind.as_str() != "removed" {
            // No duplicate: nothing the snapshot already holds, nothing twice, and
            // within one session a unit's tags only rise.
            if let Some(s) = snapshot.get(unit.as_str())
                && s.tag.guid == tag.guid
            {
                assert!(
                    tag.index > s.tag.index,
                    "{unit}: {tag:?} is already in the snapshot {s:?}"
                );
            }
            assert!(
                seen_tags.insert((unit.to_string(), *tag)),
                "{unit}: {tag:?} twice"
            );
            if let Some(prev) = last_index.insert((unit.to_string(), tag.guid), tag.index) {
                assert!(tag.index > prev, "{unit}: {tag:?} after index {prev}");
            }
        }
        match kind.as_str() {
            "removed" => {
                if held
                    .get(unit.as_str())
                    .is_some_and(|r| tag.may_remove(&r.tag))
                {
                    held.remove(unit.as_str());
                }
            }
            "new" | "state" => {
                let newer = held.get(unit.as_str()).is_none_or(|r| tag.succeeds(&r.tag));
                if newer {
                    held.insert(
                        unit.to_string(),
                        Record {
                            active: active.to_string(),
                            sub: sub.to_string(),
                            tag: *tag,
                        },
                    );
                }
            }
            other => panic!("unknown kind {other}"),
        }
    }
    assert!(
        guids.len() >= 2,
        "the restart made a new session: {guids:?}"
    );

    // No gap: what the follower holds is exactly what a fresh snapshot says, and
    // what systemd says.
    let mut fresh = c.monitor().await;
    fresh.subscribe_list("node1", &units).await.unwrap();
    fresh.settle(Duration::from_millis(300)).await;
    let now = snapshot_map(fresh.follow().await.unwrap());
    assert_eq!(held, now, "snapshot + stream == a fresh snapshot");
    for u in units {
        let real = c.state("node1", u).await;
        let held_state = held.get(u).map(|r| r.active.as_str()).unwrap_or("inactive");
        assert_eq!(held_state, real, "{u}");
    }
    c.down().await;
}

/// The real state and property events of a monitor, as lines to compare.
fn forwarded(events: &[Ev]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Ev::State {
                active,
                sub,
                reason,
                ..
            } if reason == "real" => Some(format!("state {active} {sub}")),
            Ev::Props {
                interface, keys, ..
            } => Some(format!("props {interface} {}", keys.join(","))),
            _ => None,
        })
        .collect()
}

/// What systemd itself said about `web.service` on `node`: each
/// `PropertiesChanged` of its unit object as (interface, property names in
/// order, ActiveState, SubState), read straight from the node's bus.
struct SystemdSignals(tokio::sync::mpsc::UnboundedReceiver<SystemdSignal>);

/// (interface, property names in order, ActiveState, SubState).
type SystemdSignal = (String, Vec<String>, Option<String>, Option<String>);

impl SystemdSignals {
    async fn of_web(c: &TestCluster, node: &str) -> SystemdSignals {
        use drover_bus::marshal::OrderedProperties;
        use futures::StreamExt;
        let conn = drover_testkit::api::connect(&c.node_bus_address(node)).await;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path("/org/freedesktop/systemd1/unit/web_2eservice")
            .build()
            .expect("match rule");
        let mut stream = zbus::MessageStream::for_match_rule(rule, &conn, None)
            .await
            .expect("match systemd's signals");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let _conn = conn;
            while let Some(Ok(msg)) = stream.next().await {
                let Ok((iface, props, _)) = msg
                    .body()
                    .deserialize::<(String, OrderedProperties, Vec<String>)>()
                else {
                    continue;
                };
                let text = |key: &str| {
                    props
                        .0
                        .iter()
                        .find(|(k, _)| k == key)
                        .and_then(|(_, v)| String::try_from(v.try_clone().ok()?).ok())
                };
                let (active, sub) = (text("ActiveState"), text("SubState"));
                let keys = props.keys().map(str::to_owned).collect();
                if tx.send((iface, keys, active, sub)).is_err() {
                    return;
                }
            }
        });
        SystemdSignals(rx)
    }
}

/// Issue 14 item 7, BlueChi's order: `UnitPropertiesChanged` carries the
/// properties in the order systemd sent them (drover used a hash map: a
/// different order in every run), and the `UnitStateChanged` of a change
/// comes before the property event that carried it (drover sent it after).
/// The expected stream is derived from systemd's own signals of the same
/// restart, read from the node's bus next to the monitor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_keeps_systemds_property_order_and_sends_the_state_first() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    c.systemctl_ok("node1", &["start", "web.service"]).await;
    let mut m = c.monitor().await;
    m.subscribe("node1", "web.service").await.unwrap();
    m.expect("web replayed", T, |e| {
        is_state(e, "node1", "web.service", "active", "virtual")
    })
    .await
    .unwrap();
    let mark = m.mark();
    let mut systemd = SystemdSignals::of_web(&c, "node1").await;
    c.systemctl_ok("node1", &["restart", "web.service"]).await;

    // What a BlueChi agent forwards for systemd's signals, in order, until
    // the unit is active again.
    let mut expected = Vec::new();
    let mut state = ("active".to_owned(), "running".to_owned());
    let mut restarted = false;
    let mut went_down = false;
    while !restarted {
        let (iface, keys, active, sub) = tokio::time::timeout(T, systemd.0.recv())
            .await
            .expect("systemd's signals of the restart")
            .expect("signal stream");
        if iface == "org.freedesktop.systemd1.Unit" && (active.is_some() || sub.is_some()) {
            let now = (
                active.unwrap_or_else(|| state.0.clone()),
                sub.unwrap_or_else(|| state.1.clone()),
            );
            if now != state {
                expected.push(format!("state {} {}", now.0, now.1));
                went_down |= now.0 != "active";
                restarted = went_down && now.0 == "active";
                state = now;
            }
        }
        expected.push(format!("props {iface} {}", keys.join(",")));
    }
    // A property change of the earlier start that systemd sent before the
    // recorder above subscribed may still reach the monitor first (systemd
    // sends some of the Service interface's after the state): only such
    // property events may come before the restart's own.
    let in_order = |seen: &[String]| {
        (0..=seen.len().saturating_sub(expected.len())).any(|k| {
            seen[..k].iter().all(|l| l.starts_with("props ")) && seen[k..].starts_with(&expected)
        })
    };
    while !in_order(&forwarded(m.since(mark))) {
        if let Err(e) = m.expect("more events of web", T, |_| true).await {
            panic!(
                "{e:#}\nthe monitor's events:\n{}\nsystemd's, in BlueChi's order:\n{}",
                forwarded(m.since(mark)).join("\n"),
                expected.join("\n")
            );
        }
    }
    c.down().await;
}

/// Issue 14 item 7: a client that subscribes to a whole node (`node1/*`)
/// gets the virtual events of the units already loaded there; a monitor that
/// already watched one of them does not hear "created" and "state" again
/// (it did, every time: the agent's replay of `*` went to every watcher).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_node_subscription_replays_to_its_own_monitor_only() {
    let c = TestCluster::with_units(
        1,
        &[
            ("node1", "web.service", SLEEPER),
            ("node1", "zz-last.service", SLEEPER),
        ],
    )
    .await;
    for u in ["web.service", "zz-last.service"] {
        c.systemctl_ok("node1", &["start", u]).await;
    }
    let mut a = c.monitor().await;
    a.subscribe("node1", "web.service").await.unwrap();
    a.expect("web replayed to a", T, |e| {
        is_state(e, "node1", "web.service", "active", "virtual")
    })
    .await
    .unwrap();
    let mark = a.mark();

    let mut b = c.monitor().await;
    b.subscribe("node1", "*").await.unwrap();
    b.expect("web replayed to b", T, |e| {
        is_state(e, "node1", "web.service", "active", "virtual")
    })
    .await
    .unwrap();
    // zz-last only the agent's replay of `*` announces (nobody watched it),
    // and the replay goes in name order: once b has it, the agent's whole
    // answer to `*`, web's part included, has been through the manager.
    b.expect("the end of the agent's replay of *", T, |e| {
        matches!(e, Ev::New { unit, reason, .. } if unit == "zz-last.service" && reason == "virtual")
    })
    .await
    .unwrap();
    // A real change of web after that replay: once `a` has it, everything
    // the replay could have sent `a` has arrived (one ordered stream).
    c.systemctl_ok("node1", &["stop", "web.service"]).await;
    a.expect("web stops", T, |e| {
        is_state(e, "node1", "web.service", "inactive", "real")
    })
    .await
    .unwrap();
    let again: Vec<&Ev> = a
        .since(mark)
        .iter()
        .filter(|e| {
            matches!(e, Ev::New { reason, .. } | Ev::State { reason, .. } if reason == "virtual")
        })
        .collect();
    assert!(
        again.is_empty(),
        "b's subscription replayed to a: {again:?}"
    );
    // b saw web's stop too, and no unit twice as created.
    b.expect("web stops for b", T, |e| {
        is_state(e, "node1", "web.service", "inactive", "real")
    })
    .await
    .unwrap();
    let mut created = BTreeMap::new();
    for e in b.since(0) {
        if let Ev::New { unit, reason, .. } = e
            && reason == "virtual"
        {
            *created.entry(unit.clone()).or_insert(0) += 1;
        }
    }
    assert!(
        created.values().all(|n| *n == 1),
        "one virtual UnitNew per unit: {created:?}"
    );
    c.down().await;
}
