//! `drover-sandbox up --managers 2` (docs/ha.md): a real local etcd, two managers each
//! on its own bus and loopback address, agents that list both. What a user does with it:
//! read `sandbox.env`, kill the leader (SIGKILL), see the other lead with every node
//! online, and `down` leaving no process, cgroup or etcd data.

mod common;

use common::{DownOnDrop, sandbox, stderr};
use drover_sandbox::bus;
use drover_sandbox::process::{alive, signal};
use drover_sandbox::state::State;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const NODES: [&str; 2] = ["node1", "node2"];
/// The lease is 2 s: a takeover is due within about 2.5 s; this bounds a loaded machine.
const TAKEOVER: Duration = Duration::from_secs(10);

/// The `export NAME='VALUE'` lines of `sandbox.env`.
fn exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect()
}

/// `Leading` of the manager on `address`; `None` while it does not answer.
async fn leading(address: &str) -> Option<bool> {
    let conn = bus::connect(address).await.ok()?;
    bus::leading(&conn).await.ok()
}

/// `io.drover.Controller.Leader` of the manager at `address`: who it says
/// leads; `None` while it does not answer.
async fn leader(address: &str) -> Option<String> {
    let conn = bus::connect(address).await.ok()?;
    let controller = zbus::Proxy::new(
        &conn,
        "org.eclipse.bluechi",
        "/org/eclipse/bluechi",
        "io.drover.Controller",
    )
    .await
    .ok()?;
    controller.get_property::<String>("Leader").await.ok()
}

/// Whether every node is online on the manager at `address`.
async fn all_online(address: &str) -> bool {
    let Ok(conn) = bus::connect(address).await else {
        return false;
    };
    for node in NODES {
        if !matches!(bus::node_status(&conn, node).await, Ok(s) if s == "online") {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_two_managers_survives_the_leaders_death_and_down_leaves_nothing() {
    let dir = format!("/tmp/drover-sb-ha-{}", std::process::id());
    let _down = DownOnDrop(dir.clone());
    let out = sandbox(&["up", "--nodes", "2", "--managers", "2", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        std::fs::read_to_string(format!("{dir}/sandbox.env")).expect("sandbox.env"),
        printed
    );
    let env = exports(&printed);
    let var = |k: &str| {
        env.get(k)
            .unwrap_or_else(|| panic!("no {k} in:\n{printed}"))
            .clone()
    };
    let (bus1, bus2) = (var("DROVER_BUS_1"), var("DROVER_BUS_2"));
    assert_eq!(
        var("DROVER_BUS"),
        bus1,
        "DROVER_BUS stays the first manager's"
    );
    assert_ne!(bus1, bus2);
    let pid1: u32 = var("DROVER_MANAGER_PID_1").parse().expect("a pid");
    let pid2: u32 = var("DROVER_MANAGER_PID_2").parse().expect("a pid");
    assert!(alive(pid1) && alive(pid2));
    assert!(
        var("DROVER_ETCD").starts_with("http://127.0.0.1:"),
        "{printed}"
    );
    assert!(!env.contains_key("DROVER_BUS_3"), "{printed}");
    let state = State::load(Path::new(&dir))
        .expect("state.json")
        .expect("a sandbox");
    let etcd_pid = state.etcd.as_ref().and_then(|e| e.pid).expect("etcd's pid");
    assert!(alive(etcd_pid));
    assert!(Path::new(&dir).join("etcd").is_dir(), "etcd's data in DIR");

    // The first leads with every node; the second stands by.
    assert_eq!(leading(&bus1).await, Some(true));
    assert_eq!(leading(&bus2).await, Some(false));
    assert!(all_online(&bus1).await);
    for node in NODES {
        let conf = std::fs::read_to_string(format!("{dir}/{node}/agent.conf")).expect("conf");
        assert!(
            conf.lines()
                .any(|l| l == "ControllerHost=127.0.0.1,127.0.0.2"),
            "{conf}"
        );
    }

    // Each manager is named by its own address, so who leads is plain.
    let port = |name: &str| name.rsplit_once(':').map(|(_, p)| p.to_string());
    let first = leader(&bus1).await.expect("the leader's Leader");
    assert!(first.starts_with("127.0.0.1:"), "{first}");
    assert_eq!(leader(&bus2).await.as_deref(), Some(first.as_str()));

    // The leader dies: the other leads, every node online with it.
    signal(pid1, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL the leader");
    let killed = Instant::now();
    loop {
        if leading(&bus2).await == Some(true) && all_online(&bus2).await {
            break;
        }
        assert!(
            killed.elapsed() < TAKEOVER,
            "manager 2 did not take over with every node within {TAKEOVER:?}:\n{}\n{}",
            std::fs::read_to_string(format!("{dir}/manager-2.log")).unwrap_or_default(),
            std::fs::read_to_string(format!("{dir}/agent@node1.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = leader(&bus2).await.expect("the new leader's Leader");
    assert!(second.starts_with("127.0.0.2:"), "{second}");
    assert_eq!(port(&second), port(&first), "one agent port, two addresses");
    eprintln!(
        "manager 2 leads with every node online {:?} after the SIGKILL",
        killed.elapsed()
    );

    let out = sandbox(&["down", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(state.cgroups().pids().is_empty(), "processes left");
    assert!(!state.cgroups().any_exists(), "cgroups left");
    for pid in [pid1, pid2, etcd_pid] {
        assert!(!alive(pid), "pid {pid} outlived down");
    }
    assert!(!Path::new(&dir).exists(), "{dir} (etcd's data) left");
}
