//! Issue 14 items 3 and 5 on real systemd nodes, with real agents: a lost bus
//! ends the daemon that needed it with status 1 (what makes its unit's
//! `Restart=on-failure` act; the shipped units are checked by xtask's units
//! test), and the daemon started again on the bus as it is then serves the
//! fleet as before.
//!
//! The restart a unit would make is made here by the sandbox (`start_manager`,
//! `start_agent`), as soon as the old process has exited; `systemd_units.rs`
//! leaves it to the shipped units' `Restart=` under a real systemd.

use drover_testkit::prelude::*;
use std::time::Duration;

const EXIT: Duration = Duration::from_secs(10);
const ONLINE: Duration = Duration::from_secs(20);
const STAYS_UP: &str = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n";

/// Item 3: the manager's bus daemon is killed and started again. The manager
/// exits 1 and says why; a new manager owns `org.eclipse.bluechi` again, the
/// agents reconnect to it, and the API answers as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_whose_bus_dies_exits_1_and_a_new_one_serves_again() {
    let mut c = TestCluster::start(2).await;
    c.kill_bus().await.unwrap();
    let status = c.wait_manager_exit(EXIT).await.unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    assert!(log.contains("lost its connection to bus"), "{log}");

    c.restart_bus().await.unwrap();
    // Returns once the new manager owns org.eclipse.bluechi.
    c.start_manager().await.unwrap();
    for node in ["node1", "node2"] {
        c.wait_status(node, "online", ONLINE).await;
    }
    let out = c.ctl_ok(&["list-units", "node2"]).await;
    assert!(out.contains(".service") || out.contains(".scope"), "{out}");
    c.down().await;
}

/// Item 5: a node's own bus (where its systemd is) dies. The agent exits 1
/// and says why; started again, it finds the node's bus back (systemd
/// socket-activates a new bus daemon) and the node is online and usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_systemd_bus_dies_exits_1_and_a_new_one_brings_the_node_back() {
    let mut c = TestCluster::start(2).await;
    let conn = drover_testkit::api::connect(&c.node_bus_address("node2")).await;
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
    let bus_pid = dbus
        .get_connection_unix_process_id(
            zbus::names::BusName::try_from("org.freedesktop.DBus").unwrap(),
        )
        .await
        .unwrap();
    drop(conn);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(bus_pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let status = c.wait_agent_exit("node2", EXIT).await.unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
    let log = std::fs::read_to_string(c.log_path("node2")).unwrap();
    assert!(log.contains("lost the connection to systemd"), "{log}");
    c.wait_status("node2", "offline", ONLINE).await;

    c.start_agent("node2").await.unwrap();
    c.wait_status("node2", "online", ONLINE).await;
    // Usable: a unit starts through the manager on the new bus.
    c.install("node2", "after-bus.service", STAYS_UP).await;
    c.ctl_ok(&["start", "node2", "after-bus.service"]).await;
    c.wait_state("node2", "after-bus.service", "active", ONLINE)
        .await;
    // The other node never noticed.
    c.wait_status("node1", "online", ONLINE).await;
    c.down().await;
}
