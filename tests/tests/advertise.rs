//! `AdvertiseAddress=` on real nodes: an agent that sets it tells the manager
//! at registration (protocol 8), and the manager records it for the node (its
//! log says so) and answers it in `droverctl where` rows, also in the node's
//! stale rows once it is offline; an agent that does not set it advertises
//! nothing, and its rows carry the address the manager sees its connection
//! come from (the peer of its log line). Garbage values are start errors of
//! the agent (`tests/tests/config.rs`).

use drover_testkit::prelude::*;
use std::time::Duration;

const ONLINE: Duration = Duration::from_secs(30);
const WEB: &str = "web.service";

/// `droverctl --json where web.service ARGS`: node -> address.
async fn addresses(c: &TestCluster, args: &[&str]) -> Vec<(String, String)> {
    let mut argv = vec!["--json", "where", WEB];
    argv.extend_from_slice(args);
    let v: serde_json::Value = serde_json::from_str(&c.ctl_ok(&argv).await).unwrap();
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().to_owned(),
                r["address"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advertised_address_reaches_the_manager() {
    let mut c = TestCluster::start(2).await;
    c.stop_agent("node2").await.unwrap();
    c.wait_status("node2", "offline", ONLINE).await;
    let agent = c
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
    // The peer node1 registered from, as the manager logged it.
    let peer: std::net::SocketAddr = node1
        .last()
        .and_then(|l| l.split(" from ").nth(1))
        .and_then(|rest| rest.split([' ', ',']).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no peer in {node1:?}"));

    // Discovery rows carry the addresses.
    for n in ["node1", "node2"] {
        c.install(n, WEB, SLEEPER).await;
        c.systemctl_ok(n, &["start", WEB]).await;
    }
    let want = vec![
        ("node1".to_owned(), peer.ip().to_string()),
        ("node2".to_owned(), "2001:db8::7".to_owned()),
    ];
    assert_eq!(addresses(&c, &[]).await, want);
    // Offline: the stale row keeps the address the node had.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.pid).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    c.wait_status("node2", "offline", ONLINE).await;
    assert_eq!(addresses(&c, &["--stale"]).await, want);
    c.down().await;
}
