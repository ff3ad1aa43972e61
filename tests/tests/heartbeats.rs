//! Issue 14 item 1 on real systemd nodes with real agents: heartbeat settings
//! that both sides accept never make a node flap. The agent takes the interval
//! the manager announces (`agent/src/link/heartbeat.rs`); before, it kept its
//! own threshold, and a manager that sends no heartbeats (`HeartbeatInterval=0`,
//! BlueChi's default) or sends them more slowly than that threshold made every
//! node drop and register again every few seconds. Every pair the configs
//! accept is checked on the pure rule (`no_accepted_pair_of_settings_flaps`);
//! here the two the issue reproduced run for real.
//!
//! The sandbox's agents send every 500 ms and watch for 2 s of silence; its
//! manager sends heartbeats as shipped: none (protocol 5,
//! `protocol/src/liveness.rs`). The agents' own heartbeats keep their nodes
//! online and, through `TCP_USER_TIMEOUT`, probe the manager.

use drover_sandbox::ClusterOptions;
use drover_testkit::prelude::*;
use std::time::Duration;

/// Several agent thresholds (2 s): a flapping node registers again at least
/// twice in this time.
const WATCH: Duration = Duration::from_secs(7);

/// Starts two nodes with `manager` appended to the manager's config, waits
/// `WATCH`, and checks that each node registered exactly once and is online.
async fn stays_registered(manager: &str) {
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: manager.into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    tokio::time::sleep(WATCH).await;
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    let registered = log
        .lines()
        .filter(|l| l.contains(" registered over TLS from ") || l.contains(" registered from "))
        .count();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" disconnected: "))
        .collect();
    assert_eq!(
        (registered, dropped.len()),
        (2, 0),
        "with {manager:?} every node registers once and stays: {dropped:#?}"
    );
    for node in ["node1", "node2"] {
        let agent = std::fs::read_to_string(c.log_path(node)).unwrap();
        assert!(
            !agent.contains("lost the link to the manager"),
            "the agent of {node} lost its link:\n{agent}"
        );
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}

/// A manager that sends no heartbeats (its threshold still watches the agents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_without_heartbeats_keeps_every_node() {
    stays_registered("[drover-manager]\nHeartbeatInterval=0\n").await;
}

/// A manager whose heartbeats are further apart (3 s) than the agents' own
/// threshold (2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_slower_than_the_agents_threshold_keeps_every_node() {
    stays_registered("[drover-manager]\nHeartbeatInterval=3000\nNodeHeartbeatThreshold=9000\n")
        .await;
}

/// A manager threshold (1 s) that the agents' interval (500 ms) fills only
/// twice, while the manager reads their heartbeats in batches (protocol 10,
/// `manager/src/nodes/frames.rs`; the sandbox's links are TLS, where it does
/// so too) and judges silence by what arrived: the agents speed up to a
/// third of it, and their nodes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_send_three_times_per_threshold_while_the_manager_reads_in_batches() {
    stays_registered("[drover-manager]\nNodeHeartbeatThreshold=1000\n").await;
}

/// `ss` figures of the agent ends of the links to the manager on `port`:
/// per connection, milliseconds since it last received data (`lastrcv`)
/// and since it last received an acknowledgement (`lastack`).
fn agent_sockets(port: u16) -> Vec<(u64, u64)> {
    let out = std::process::Command::new("ss")
        .args([
            "-tni",
            "state",
            "established",
            "dport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    text.lines()
        .filter_map(|l| Some((field(l, "lastrcv:")?, field(l, "lastack:")?)))
        .collect()
}

/// The shipped default: the manager writes nothing to an idle node (its
/// heartbeats were half of its idle CPU at fleet size), while the node's
/// own heartbeats are acknowledged and keep it online. Before protocol 5
/// the manager sent one every interval, so no agent went 1.5 s without
/// data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_manager_writes_nothing_to_idle_nodes() {
    // No orphan-dependency sweep (a `ListUnits` one grace period after a
    // node registers) in the window.
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=60000\n".into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    // Once registration is over the links go quiet from the manager's side:
    // every agent goes 1.5 s (three of the manager's old intervals) without
    // hearing from it, while its own heartbeats are acknowledged. With
    // manager heartbeats no agent ever does.
    let port = c.manager_port();
    let quiet = || {
        let sockets = agent_sockets(port);
        sockets.len() == 2
            && sockets
                .iter()
                .all(|&(lastrcv, lastack)| lastrcv >= 1500 && lastack < 3000)
    };
    let waited = drover_testkit::wait::poll(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "every agent 1.5 s without data from the manager, its heartbeats acknowledged",
        || std::future::ready(quiet()),
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e:#}; last seen: {:?}", agent_sockets(port)));
    for node in ["node1", "node2"] {
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}

/// `ss` figures of the manager's ends of the agents' links on `port`: per
/// agent address, the bytes waiting unread in the manager's socket.
fn manager_sockets(port: u16) -> Vec<(String, u64)> {
    let out = std::process::Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            "sport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.get(3)?.to_string(), cols.first()?.parse().ok()?))
        })
        .collect()
}

/// On TLS links the manager reads heartbeats in batches as on plaintext
/// ones: before a batch is read, `HEARTBEATS_PER_READ - 1` heartbeat records
/// (27 bytes each on TLS 1.3: `drover_tls::records::sealed_len` of the
/// 5-byte frame) wait unread in the manager's socket, as `ss` shows, for
/// longer than the manager's threshold (2 s in the sandbox, agents sending
/// every 500 ms) — and the nodes stay online: what waits unread counts as
/// heard when it arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_manager_leaves_a_batch_of_heartbeats_unread() {
    let c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=60000\n".into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    use drover_protocol::liveness::{AGENT_HEARTBEAT_FRAME_LEN, HEARTBEATS_PER_READ};
    let record = drover_tls::records::sealed_len(AGENT_HEARTBEAT_FRAME_LEN) as u64;
    assert_eq!(record, 27);
    let batch = (HEARTBEATS_PER_READ as u64 - 1) * record;
    let port = c.manager_port();
    let mut seen = std::collections::BTreeSet::new();
    let waited = drover_testkit::wait::poll(
        Duration::from_secs(40),
        Duration::from_millis(50),
        "each agent's link with a batch but one of heartbeat records waiting in the manager's socket",
        || {
            for (peer, queued) in manager_sockets(port) {
                if queued == batch {
                    seen.insert(peer);
                }
            }
            std::future::ready(seen.len() == 2)
        },
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e:#}; seen: {seen:?}, now: {:?}", manager_sockets(port)));
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" disconnected: "))
        .collect();
    assert!(dropped.is_empty(), "no node was dropped: {dropped:#?}");
    for node in ["node1", "node2"] {
        c.wait_status(node, "online", Duration::from_secs(1)).await;
    }
    c.down().await;
}
