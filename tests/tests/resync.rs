//! Resync on real systemd nodes (`drover_protocol::resync`): a unit event
//! lost on its way from an agent (the agent's debug-build test knob drops
//! it, as a dropped systemd signal would be lost) is repaired within one
//! `ResyncInterval` + 1 s, a monitor hears the repair with the reason
//! `resync`, and the manager counts it; a clean, busy cluster compares
//! digests and never asks for a snapshot.

use drover_sandbox::ClusterOptions;
use drover_testkit::http::{self, sample};
use drover_testkit::monitor::Change;
use drover_testkit::prelude::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// A service restarted in a loop (no start limit).
const BUSY: &str = "[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sleep 600\n";

/// Two nodes whose manager serves metrics and resyncs every `interval_ms`;
/// `knob`: the agents' lost-event test knob (`UNIT/ACTIVE_STATE`).
fn options(interval_ms: u64, knob: Option<&str>) -> ClusterOptions {
    ClusterOptions {
        metrics: true,
        manager_extra_config: format!("[drover-manager]\nResyncInterval={interval_ms}\n"),
        agent_env: knob
            .map(|k| vec![("DROVER_TEST_DROP_UNIT_EVENT".to_owned(), k.to_owned())])
            .unwrap_or_default(),
        ..ClusterOptions::with_nodes(2)
    }
}

/// A counter's value in one scrape of the manager's metrics.
async fn counter(c: &TestCluster, name: &str) -> f64 {
    let url = c.metrics_url().expect("the cluster serves metrics");
    let a = http::get(&url).await.unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    sample(&a.body, name).unwrap_or_else(|| panic!("no {name} in:\n{}", a.body))
}

fn victim(e: &Ev) -> Option<&Change> {
    match e {
        Ev::Changed(ch) if ch.node == "node2" && ch.unit == "victim.service" => Some(ch),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_event_is_repaired_within_one_interval_and_told_as_resync() {
    const INTERVAL: Duration = Duration::from_millis(2000);
    let c = TestCluster::with(options(2000, Some("victim.service/failed"))).await;
    c.install("node2", "victim.service", SLEEPER).await;
    c.systemctl_ok("node2", &["start", "victim.service"]).await;

    let mut m = c.monitor().await;
    m.subscribe("node2", "victim.service").await.unwrap();
    let rows = m.follow().await.unwrap();
    assert!(
        rows.iter()
            .any(|r| r.1 == "victim.service" && r.2 == "active"),
        "the manager knows the victim runs: {rows:?}"
    );

    // Killed: systemd says `failed`, and the knob drops that one event.
    c.systemctl_ok("node2", &["kill", "--signal=SIGKILL", "victim.service"])
        .await;
    c.wait_state("node2", "victim.service", "failed", T).await;
    let killed = Instant::now();

    let repaired = m
        .expect(
            "the failure, repaired by resync",
            INTERVAL + Duration::from_secs(1),
            |e| victim(e).is_some_and(|ch| ch.kind == "state" && ch.active == "failed"),
        )
        .await
        .unwrap();
    let took = killed.elapsed();
    let Some(ch) = victim(&repaired) else {
        unreachable!()
    };
    assert_eq!(ch.reason, "resync", "{ch:?}");
    assert_eq!(ch.sub, "failed", "{ch:?}");
    assert!(took <= INTERVAL + Duration::from_secs(1), "{took:?}");
    assert!(
        !m.since(0)
            .iter()
            .filter_map(victim)
            .any(|ch| ch.reason == "real" && ch.active == "failed"),
        "the knob dropped the real event: {:?}",
        m.since(0)
    );

    // What a new client reads from the manager is right again.
    let m2 = c.monitor().await;
    m2.subscribe("node2", "victim.service").await.unwrap();
    let rows = m2.follow().await.unwrap();
    assert!(
        rows.iter()
            .any(|r| r.1 == "victim.service" && r.2 == "failed" && r.3 == "failed"),
        "{rows:?}"
    );
    assert_eq!(counter(&c, "drover_resync_snapshots_total").await, 1.0);
    assert_eq!(counter(&c, "drover_resync_repairs_total").await, 1.0);
    assert!(counter(&c, "drover_resync_digests_total").await >= 1.0);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_busy_cluster_compares_digests_and_asks_for_no_snapshot() {
    let c = TestCluster::with(options(300, None)).await;
    for n in ["node1", "node2"] {
        c.install(n, "busy.service", BUSY).await;
    }
    let m = c.monitor().await;
    m.subscribe("node1", "*").await.unwrap();
    m.subscribe("node2", "busy.service").await.unwrap();
    m.follow().await.unwrap();

    // Units change all the time while digests go out: events in flight
    // must never look like a mismatch.
    let started = Instant::now();
    let mut rounds = 0;
    while counter(&c, "drover_resync_digests_total").await < 16.0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "too few digests"
        );
        for n in ["node1", "node2"] {
            c.systemctl_ok(n, &["restart", "busy.service"]).await;
        }
        rounds += 1;
    }
    assert!(rounds > 1, "the units changed while digests came");
    assert_eq!(counter(&c, "drover_resync_mismatches_total").await, 0.0);
    assert_eq!(counter(&c, "drover_resync_snapshots_total").await, 0.0);
    assert_eq!(counter(&c, "drover_resync_repairs_total").await, 0.0);
    c.down().await;
}
