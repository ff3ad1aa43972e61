//! `AdvertiseAddress=` on real nodes: an agent that sets it tells the manager
//! at registration (protocol 8), and the manager records it for the node (its
//! log says so); an agent that does not set it advertises nothing, and the
//! manager uses the address it sees. Garbage values are start errors of the
//! agent (`tests/tests/config.rs`).

use drover_testkit::prelude::*;
use std::time::Duration;

const ONLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advertised_address_reaches_the_manager() {
    let mut c = TestCluster::start(2).await;
    c.stop_agent("node2").await.unwrap();
    c.wait_status("node2", "offline", ONLINE).await;
    let _agent = c
        .start_agent_with("node2", "node2", "AdvertiseAddress=2001:db8::7\n")
        .await
        .unwrap();
    c.wait_status("node2", "online", ONLINE).await;
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    let registered = |node: &str| -> Vec<&str> {
        log.lines()
            // Plaintext: "node N registered from"; TLS: "node N (certificate …) registered over TLS from".
            .filter(|l| l.contains(&format!(" node {node} ")) && l.contains(" registered "))
            .collect()
    };
    let node2 = registered("node2");
    assert!(
        node2
            .last()
            .is_some_and(|l| l.contains(", advertising 2001:db8::7")),
        "{node2:?} in:\n{}",
        log.lines()
            .filter(|l| l.contains("registered"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let node1 = registered("node1");
    assert!(
        !node1.is_empty() && node1.iter().all(|l| !l.contains("advertising")),
        "{node1:?}"
    );
    c.down().await;
}
