//! Node lifecycle on real systemd nodes: registration, refusal of unknown and
//! duplicate names, dead agents noticed within the threshold, and convergence
//! after agent and manager restarts; admission by an `AllowedNodeNames` pattern.

use drover_sandbox::ClusterOptions;
use drover_testkit::api::job_call;
use drover_testkit::prelude::*;
use nix::sys::signal::Signal;
use std::time::Duration;

/// Heartbeat threshold of the sandbox defaults (2 s) plus scheduling slack.
const DETECT: Duration = Duration::from_secs(5);
/// How long an agent (re)start may take to register.
const ONLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_register_and_show_online() {
    let c = TestCluster::start(3).await;
    let api = c.api().await;

    let nodes = api.list_nodes().await;
    let names: Vec<_> = nodes.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["node1", "node2", "node3"], "config order");
    for (name, status, ip) in &nodes {
        assert_eq!(status, "online", "{name}");
        assert_eq!(ip, "127.0.0.1", "{name} connects over loopback");
    }

    let status: String = api.controller().await.get_property("Status").await.unwrap();
    assert_eq!(status, "up");

    let out = c.ctl_ok(&["status"]).await;
    for n in ["node1", "node2", "node3"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{n} in:\n{out}"));
        assert!(line.contains("online") && line.contains("now"), "{line}");
    }
    // A reader that stops early (`droverctl status | head -0`): no complaint, exit 0.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = c.ctl().command(&["status"]).stdout(writer).output();
    let closed = closed.await.unwrap();
    assert!(closed.status.success(), "{:?}", closed.status);
    assert_eq!(String::from_utf8_lossy(&closed.stderr), "");

    let node2 = api.node("node2").await;
    assert_eq!(node2.path().as_str(), "/org/eclipse/bluechi/node/node2");
    let name: String = node2.get_property("Name").await.unwrap();
    assert_eq!(name, "node2");
    let seen: u64 = node2.get_property("LastSeenTimestamp").await.unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        seen > 0 && seen <= now_us && now_us - seen < 10_000_000,
        "last seen {seen} vs now {now_us}"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_node_name_is_refused_and_never_appears() {
    let mut c = TestCluster::start(2).await;
    // The intruder runs on node2's bus (a bus has one agent).
    c.stop_agent("node2").await.unwrap();
    let pid = c.start_agent_named("node2", "intruder").await.unwrap();
    let api = c.api().await;

    // The refused agent keeps retrying; whatever it does, it never shows up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nodes = api.list_nodes().await;
    assert!(nodes.iter().all(|(n, _, _)| n != "intruder"), "{nodes:?}");
    assert_eq!(nodes.len(), 2);
    let err = api.get_node("intruder").await.unwrap_err();
    assert!(err.to_string().contains("ServiceUnknown"), "{err}");
    let out = c.run(&["status", "intruder"]).await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("not found"), "{}", out.stderr);

    // The manager says whom it refused, so an operator can find the typo.
    assert!(pid > 0);
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    assert!(
        log.contains("intruder"),
        "manager log names the refused node:\n{log}"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_name_of_a_live_node_is_refused_and_the_first_stays_online() {
    let mut c = TestCluster::start(3).await;
    let api = c.api().await;
    let first_pid = c.agent_pid("node2").unwrap();
    // The claimant runs on node3's bus (a bus has one agent), and keeps
    // running, refused and retrying, for the whole test.
    c.stop_agent("node3").await.unwrap();
    let claimant = c.start_agent_named("node3", "node2").await.unwrap();
    let from = std::fs::metadata(c.log_path("manager")).unwrap().len() as usize;

    // The manager refuses the claimant, which keeps running and retrying.
    let manager_log = c.log_path("manager");
    eventually(ONLINE, "the manager to refuse the second node2", || async {
        std::fs::read_to_string(&manager_log)
            .unwrap_or_default()
            .get(from..)
            .is_some_and(|t| t.contains("already connected and alive"))
    })
    .await
    .unwrap();
    assert!(
        c.extra_agent_exit(claimant).unwrap().is_none(),
        "it retries"
    );
    let node2 = api.node("node2").await;
    let status: String = node2.get_property("Status").await.unwrap();
    assert_eq!(status, "online");
    // The original agent still serves node2: a job there runs on node2's systemd.
    c.install("node2", "only-on-2.service", ONESHOT_OK).await;
    let mut jobs = api.jobs().await;
    let path = job_call(&node2, "StartUnit", "only-on-2.service")
        .await
        .unwrap();
    assert_eq!(jobs.removed(&path, DETECT).await.unwrap().result, "done");
    assert_eq!(c.agent_pid("node2"), Some(first_pid));
    c.down().await;
}

/// A cluster of `n` nodes with a pending start job on `node`: (cluster, client, the job's
/// watch, its path).
async fn pending_job(n: usize, node: &str) -> (TestCluster, Api, JobWatch, String) {
    let c = TestCluster::with_units(n, &[(node, "slow.service", SLOW_START)]).await;
    let (api, node, mut jobs) = c.jobs_on(node).await;
    let path = job_call(&node, "StartUnit", "slow.service").await.unwrap();
    jobs.job_new(&path, DETECT).await.unwrap();
    (c, api, jobs, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_goes_offline_and_its_pending_job_ends() {
    let (c, api, mut jobs, path) = pending_job(2, "node2").await;

    let started = std::time::Instant::now();
    c.signal_agent("node2", Signal::SIGKILL).unwrap();
    let removed = jobs.removed(&path, DETECT).await.unwrap();
    assert_eq!(removed.result, "disconnected");
    assert_eq!(
        (removed.node.as_str(), removed.unit.as_str()),
        ("node2", "slow.service")
    );
    c.wait_status("node2", "offline", DETECT).await;
    assert!(started.elapsed() < DETECT);
    jobs.no_more_removed(&path, Duration::from_millis(500))
        .await
        .unwrap();

    let status: String = api.controller().await.get_property("Status").await.unwrap();
    assert_eq!(status, "degraded");
    // Calls on the offline node get BlueChi's Offline error.
    let n = api.node("node2").await;
    let err = job_call(&n, "StartUnit", "slow.service").await.unwrap_err();
    assert!(
        err.to_string().contains("org.eclipse.bluechi.Offline"),
        "{err}"
    );
    let ip: String = n.get_property("PeerIp").await.unwrap();
    assert_eq!(ip, "");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_agent_goes_offline_within_the_threshold_and_comes_back() {
    let (c, _api, mut jobs, path) = pending_job(2, "node1").await;

    let started = std::time::Instant::now();
    c.signal_agent("node1", Signal::SIGSTOP).unwrap();
    c.wait_status("node1", "offline", DETECT).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1500),
        "not before the threshold: {elapsed:?}"
    );
    assert_eq!(
        jobs.removed(&path, DETECT).await.unwrap().result,
        "disconnected"
    );

    // Thawed, the agent finds its link dead and registers again by itself.
    c.signal_agent("node1", Signal::SIGCONT).unwrap();
    c.wait_status("node1", "online", ONLINE).await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_and_restarted_manager_converge_to_all_online() {
    let mut c = TestCluster::start(3).await;

    c.stop_agent("node3").await.unwrap();
    c.wait_status("node3", "offline", DETECT).await;
    c.start_agent("node3").await.unwrap();
    c.wait_status("node3", "online", ONLINE).await;

    c.stop_manager().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_manager().await.unwrap();
    for n in ["node1", "node2", "node3"] {
        c.wait_status(n, "online", ONLINE).await;
    }
    let api = c.api().await;
    let status: String = api.controller().await.get_property("Status").await.unwrap();
    assert_eq!(status, "up");
    // And the fleet is usable again.
    let out = c.ctl_ok(&["list-units", "node1"]).await;
    assert!(
        out.lines()
            .any(|l| l.contains("init.scope") || l.contains(".service")),
        "{out}"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_changes_are_signalled() {
    let c = TestCluster::start(2).await;
    let n = c.api().await.node("node2").await;
    let mut changes = n.receive_property_changed::<String>("Status").await;
    c.signal_agent("node2", Signal::SIGKILL).unwrap();
    let got = tokio::time::timeout(DETECT, async {
        use futures::StreamExt;
        while let Some(change) = changes.next().await {
            if change.get().await.ok().as_deref() == Some("offline") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        got.ok(),
        Some(true),
        "PropertiesChanged(Status=offline) arrives"
    );
    c.down().await;
}

/// `AllowedNodeNames=db1,edge-*` on real agents with TLS: the edge nodes
/// register without being listed, appear at registration, and an edge node
/// whose agent dies stays listed, offline, as BlueChi clients expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_admits_a_fleet_and_its_nodes_stay_listed_offline() {
    let c = TestCluster::with(ClusterOptions {
        nodes: vec!["db1".into(), "edge-1".into(), "edge-2".into()],
        allowed_nodes: Some(vec!["db1".into()]),
        // No [node NAME] sections: they would configure the edge nodes.
        allow_all_proxies: false,
        manager_extra_config: "[drover-manager]\nAllowedNodeNames=db1,edge-*\n".into(),
        ..ClusterOptions::with_nodes(0)
    })
    .await;
    let api = c.api().await;
    let mut nodes = api.list_nodes().await;
    nodes.sort();
    let rows: Vec<(&str, &str)> = nodes
        .iter()
        .map(|(n, s, _)| (n.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("db1", "online"),
            ("edge-1", "online"),
            ("edge-2", "online")
        ]
    );

    c.signal_agent("edge-2", Signal::SIGKILL).unwrap();
    c.wait_status("edge-2", "offline", DETECT).await;
    let nodes = api.list_nodes().await;
    assert!(
        nodes
            .iter()
            .any(|(n, s, _)| n == "edge-2" && s == "offline"),
        "{nodes:?}"
    );
    let out = c.ctl_ok(&["status"]).await;
    let line = out
        .lines()
        .find(|l| l.starts_with("edge-2"))
        .unwrap_or_else(|| panic!("edge-2 in:\n{out}"));
    assert!(line.contains("offline"), "{line}");
    c.down().await;
}
