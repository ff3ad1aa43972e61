//! Admission under a flood of unauthenticated connections, on real systemd nodes with
//! mutual TLS (the sandbox's default): what once kept agents out for as long as the
//! flood lasted.
//!
//! * 2,000 half-open TLS handshakes (a whole ClientHello each, then nothing) from 125
//!   loopback addresses, 16 each, reopened as soon as the manager closes them: a
//!   restarted agent registers on its first attempt while they hold the door, the
//!   other sessions are untouched, every agent is back after a manager restart during
//!   the flood, and the manager's memory stays bounded; its metrics endpoint counts
//!   the connections it evicted (`drover_connections_evicted_total`).
//! * 1,000 silent connections from the agents' own address: an agent behind that
//!   address registers on its first attempt (it was refused for its address, again
//!   and again, before).
//!
//! The bound asserted here (`T`) only tells "got in during the flood" from "kept out
//! while it lasts" on a loaded test machine; the figures (about a second) are measured
//! by `drover-bench flood` (`docs/security.md`).

use drover_testkit::flood::{Flood, FloodOptions, Kind};
use drover_testkit::prelude::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// "During the flood", on a loaded 2-core machine.
const T: Duration = Duration::from_secs(15);
/// Growth of the manager's peak RSS the flood may cause (as `manager/tests/flood.rs`).
const RSS_BOUND_KIB: u64 = 40 * 1024;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The agent of `node` registered on its first attempt since its log was `from`
/// bytes long: no attempt failed (timed out in the backlog, closed for its address)
/// before the one that connected. The manager counts the node online as soon as it
/// sends its answer, a moment before the agent reads it and logs, so this waits for
/// the agent's line.
async fn first_attempt(c: &TestCluster, node: &str, from: usize) {
    const CONNECTED: &str = "connected to the manager";
    let since = || {
        read(&c.log_path(node))
            .get(from..)
            .unwrap_or_default()
            .to_owned()
    };
    eventually(T, "the agent logs its connection", || async {
        since().contains(CONNECTED)
    })
    .await
    .unwrap();
    let log = since();
    let before = &log[..log.find(CONNECTED).unwrap_or(log.len())];
    assert!(
        !before.contains("cannot connect to the manager"),
        "the agent of {node} was kept out at least once:\n{log}"
    );
}

fn manager_addr(c: &TestCluster) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], c.manager_port()))
}

fn manager_pid(c: &TestCluster) -> u32 {
    drover_sandbox::Cluster::state(c)
        .manager_pid
        .expect("the manager runs")
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("status field")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_handshakes_from_many_addresses_keep_no_agent_out() {
    let mut c = TestCluster::with(drover_sandbox::ClusterOptions {
        metrics: true,
        ..drover_sandbox::ClusterOptions::with_nodes(3)
    })
    .await;
    let idle_kib = status_kib(manager_pid(&c), "VmRSS:");
    let flood = Flood::start(manager_addr(&c), &FloodOptions::client_hellos(125, 16));
    // More than the manager's 256 places for unauthenticated connections.
    flood.holding(2000, T).await.unwrap();

    // A restarted agent registers while the flood goes on.
    c.stop_agent("node1").await.unwrap();
    c.wait_status("node1", "offline", T).await;
    let closed_before = flood.closed_by_peer();
    let from = read(&c.log_path("node1")).len();
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    first_attempt(&c, "node1", from).await;
    assert!(
        flood.closed_by_peer() > closed_before && flood.open() >= 1900,
        "the flood held on meanwhile ({} open, {} closed by the manager)",
        flood.open(),
        flood.closed_by_peer() - closed_before
    );
    for name in ["node2", "node3"] {
        assert_eq!(
            c.tls_registrations(name),
            (1, false),
            "{name}'s session is untouched by the flood"
        );
    }
    // The operator sees the flood: the half-open handshakes were evicted, not
    // the agents (none was refused).
    let metrics = c.metrics_url().expect("the sandbox serves metrics");
    let text = drover_testkit::http::get(&metrics).await.unwrap().body;
    let evicted = drover_testkit::http::sample(&text, "drover_connections_evicted_total");
    assert!(
        evicted.is_some_and(|n| n >= 1.0),
        "evictions counted: {evicted:?}\n{text}"
    );

    // A manager restart during the flood: every agent comes back.
    c.stop_manager().await.unwrap();
    c.start_manager().await.unwrap();
    let restarted = manager_pid(&c);
    for name in ["node1", "node2", "node3"] {
        c.wait_status(name, "online", T).await;
    }
    assert!(
        flood.open() >= 1900,
        "still flooding: {} open",
        flood.open()
    );
    let peak_kib = status_kib(restarted, "VmHWM:");
    assert!(
        peak_kib < idle_kib + RSS_BOUND_KIB,
        "the manager's peak RSS under the flood: {peak_kib} KiB (idle {idle_kib} KiB)"
    );
    drop(flood);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_the_agents_own_address_keep_no_agent_out() {
    let mut c = TestCluster::start(1).await;
    let opts = FloodOptions {
        first: Ipv4Addr::LOCALHOST,
        addresses: 1,
        per_address: 1000,
        kind: Kind::Silent,
    };
    let flood = Flood::start(manager_addr(&c), &opts);
    // A manager that closes what it will not serve keeps fewer than all open.
    flood.opened_at_least(1000, T).await.unwrap();
    c.stop_agent("node1").await.unwrap();
    c.wait_status("node1", "offline", T).await;
    let from = read(&c.log_path("node1")).len();
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    first_attempt(&c, "node1", from).await;
    assert!(flood.open() >= 256, "still flooding: {} open", flood.open());
    drop(flood);
    c.down().await;
}
