//! Cross-node dependencies on real systemd nodes: `drover-proxy@NODE_UNIT` on the
//! requesting node, `drover-dep@UNIT` on the target node, references in the manager.
//!
//! Every case of BlueChi's proxy test list, every disconnect case of `docs/proxies.md`
//! ("Disconnects and restarts"), and malformed instance names. The assertions are what a user
//! checks: unit states on both nodes (`systemctl --user`), what the failing proxy unit
//! printed (the sandbox appends proxy units' output to a file per unit, as nodes have
//! no journal), and `droverctl --json proxies`.
//!
//! Names: node1 requests, node2 is the target (node3 requests too where two
//! requesting nodes are needed).

use drover_sandbox::ClusterOptions;
use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant, SystemTime};

const DB: &str = "db.service";
const PROXY: &str = "drover-proxy@node2_db.service";
const DEP: &str = "drover-dep@db.service.service";
const NEED_DB: &str = "need-db.service";
/// Long enough for a cross-node start on a loaded 2-core CI machine.
const T: Duration = Duration::from_secs(20);

/// A cluster whose manager drops references `grace_ms` after a disconnect.
fn with_grace(nodes: usize, grace_ms: u64) -> ClusterOptions {
    ClusterOptions {
        manager_extra_config: format!("[drover-manager]\nProxyGracePeriod={grace_ms}\n"),
        ..ClusterOptions::with_nodes(nodes)
    }
}

/// A `…TimestampMonotonic` property: microseconds on the one clock all
/// sandbox nodes share, so the times of two nodes compare.
async fn timestamp(c: &TestCluster, node: &str, unit: &str, prop: &str) -> u64 {
    let raw = c.prop(node, unit, prop).await;
    raw.parse()
        .unwrap_or_else(|e| panic!("{prop} of {unit} on {node} is {raw:?}: {e}"))
}

/// A command that runs until [`release`] sends it SIGUSR1, then exits 0: a unit
/// step held open for exactly as long as a test needs it.
const HELD: &str = "/bin/sh -c 'trap \"exit 0\" USR1; sleep 600 & wait; exit 0'";

/// Ends a [`HELD`] command of `unit` on node1 (`whom`: `all`, or `control` for
/// an `ExecStop=`).
async fn release(c: &TestCluster, unit: &str, whom: &str) {
    let whom = format!("--kill-whom={whom}");
    c.systemctl_ok("node1", &["kill", &whom, "--signal=SIGUSR1", unit])
        .await;
}

/// Waits until `unit` on `node` is `want`; the error names the last state seen.
async fn wait_state(c: &TestCluster, node: &str, unit: &str, want: &str) {
    if let Err(e) = c.try_wait_state(node, unit, want, T).await {
        panic!(
            "{e:#} (proxy log on node1: {:?})\n{}",
            c.unit_log("node1", PROXY).unwrap_or_default(),
            proxy_table(c).await
        );
    }
}

/// The manager's proxy table, for a failed wait's message (the cluster prints
/// the manager's and agents' logs itself when a test panics).
async fn proxy_table(c: &TestCluster) -> String {
    let table = c.run(&["proxies"]).await;
    format!("droverctl proxies:\n{}{}", table.stdout, table.stderr)
}

async fn start_ok(c: &TestCluster, node: &str, unit: &str) {
    let out = c.systemctl(node, &["start", unit]).await;
    assert!(
        out.success(),
        "systemctl start {unit} on {node} failed: {}\nproxy log: {:?}",
        out.stderr,
        c.unit_log("node1", PROXY).unwrap_or_default()
    );
}

async fn stop_ok(c: &TestCluster, node: &str, unit: &str) {
    c.systemctl_ok(node, &["stop", unit]).await;
}

/// One row of `droverctl --json proxies`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    requester: String,
    target_node: String,
    unit: String,
    state: String,
    target_state: String,
    refs: u64,
}

async fn proxies(c: &TestCluster) -> Vec<Row> {
    let text = c.ctl_ok(&["--json", "proxies"]).await;
    let value: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("droverctl --json proxies is not JSON ({e}): {text}"));
    let rows = value.as_array().expect("a JSON array");
    rows.iter()
        .map(|r| {
            let s = |k: &str| {
                r[k].as_str()
                    .unwrap_or_else(|| panic!("{k} missing in {r}"))
                    .to_string()
            };
            Row {
                requester: s("requester"),
                target_node: s("target_node"),
                unit: s("unit"),
                state: s("state"),
                target_state: s("target_state"),
                refs: r["refs"].as_u64().expect("refs"),
            }
        })
        .collect()
}

/// The rows whose proxy is live (`waiting` or `active`), as (requester, target, unit,
/// state, refs).
async fn live(c: &TestCluster) -> Vec<(String, String, String, String, u64)> {
    proxies(c)
        .await
        .into_iter()
        .filter(|r| r.state == "waiting" || r.state == "active")
        .map(|r| (r.requester, r.target_node, r.unit, r.state, r.refs))
        .collect()
}

fn row(
    req: &str,
    target: &str,
    unit: &str,
    state: &str,
    refs: u64,
) -> (String, String, String, String, u64) {
    (req.into(), target.into(), unit.into(), state.into(), refs)
}

async fn wait_live(c: &TestCluster, want: Vec<(String, String, String, String, u64)>) {
    let what = format!("droverctl proxies to show {want:?}");
    let res = poll(T, Duration::from_millis(100), &what, || async {
        live(c).await == want
    });
    if let Err(e) = res.await {
        panic!("{e:#}: still {:?}", live(c).await);
    }
}

/// The proxy unit's output (its journal in a real installation).
fn proxy_log(c: &TestCluster, node: &str, proxy: &str) -> String {
    c.unit_log(node, proxy).expect("proxy log readable")
}

/// need-db on node1 `Requires=` `proxy`: starting it fails, and so does the proxy.
/// Returns what the proxy printed.
async fn requirer_fails(c: &TestCluster, proxy: &str) -> String {
    c.install("node1", NEED_DB, &requester("Requires", proxy))
        .await;
    let out = c.systemctl("node1", &["start", NEED_DB]).await;
    assert!(!out.success(), "need-db must not start: {out:?}");
    wait_state(c, "node1", proxy, "failed").await;
    proxy_log(c, "node1", proxy)
}

/// Sets up node2's db and node1's need-db (`kind`), starts need-db and checks the
/// whole chain is up.
async fn chain_up(c: &TestCluster, kind: &str, db: &str) {
    c.install("node2", DB, db).await;
    c.install("node1", NEED_DB, &requester(kind, PROXY)).await;
    assert_eq!(c.state("node2", DB).await, "inactive");
    start_ok(c, "node1", NEED_DB).await;
    wait_state(c, "node1", NEED_DB, "active").await;
    wait_state(c, "node1", PROXY, "active").await;
    wait_state(c, "node2", DB, "active").await;
    wait_state(c, "node2", DEP, "active").await;
}

// ---------------------------------------------------------------------------------
// The templates themselves (no drover involved): what systemd makes of them.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dep_template_starts_its_target_and_goes_down_with_it() {
    let c = TestCluster::with_units(1, &[("node1", DB, SLEEPER)]).await;
    start_ok(&c, "node1", DEP).await;
    assert_eq!(c.state("node1", DB).await, "active");
    assert_eq!(c.state("node1", DEP).await, "active");
    stop_ok(&c, "node1", DB).await;
    wait_state(&c, "node1", DEP, "inactive").await;
    // Stopping the dep alone leaves the target running.
    start_ok(&c, "node1", DEP).await;
    stop_ok(&c, "node1", DEP).await;
    assert_eq!(c.state("node1", DB).await, "active");
    // The proxy template is installed with this build's helper.
    let text = c.systemctl("node1", &["cat", PROXY]).await.stdout;
    let helper = bin("drover-proxy");
    assert!(
        text.contains(&format!("ExecStart={} create --user %i", helper.display())),
        "{text}"
    );
    c.down().await;
}

// ---------------------------------------------------------------------------------
// BlueChi's proxy-service tests.
// ---------------------------------------------------------------------------------

/// proxy-service-start
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_start_brings_up_the_remote_target_first() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    // After=: need-db started only once the target was active, i.e. after the proxy.
    let proxy_up = timestamp(&c, "node1", PROXY, "ActiveEnterTimestampMonotonic").await;
    let need_db_up = timestamp(&c, "node1", NEED_DB, "ActiveEnterTimestampMonotonic").await;
    assert!(proxy_up > 0 && proxy_up <= need_db_up);
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    let rows = proxies(&c).await;
    assert_eq!(rows[0].target_state, "active");
    // The table form names the same dependency.
    let table = c.ctl_ok(&["proxies", "node2"]).await;
    assert!(table.contains("REQUESTER"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("node1") && l.contains("node2") && l.contains(DB)),
        "{table}"
    );
    assert!(proxy_log(&c, "node1", PROXY).contains("db.service on node node2 is active"));
    c.down().await;
}

/// proxy-service-denied-by-default
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_denied_by_default() {
    let c = TestCluster::with(ClusterOptions {
        allow_all_proxies: false,
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    c.install("node2", DB, SLEEPER).await;
    c.install("node1", NEED_DB, &requester("Wants", PROXY))
        .await;
    // Wants=: need-db runs anyway; the proxy fails and says why.
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "failed").await;
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    let log = proxy_log(&c, "node1", PROXY);
    assert!(
        log.contains("cannot start db.service on node node2")
            && log.contains("AllowDependenciesOn"),
        "{log}"
    );
    assert_eq!(c.state("node2", DB).await, "inactive");
    assert_eq!(c.state("node2", DEP).await, "inactive");
    assert!(live(&c).await.is_empty());
    c.down().await;
}

/// proxy-service-fails-on-execstart
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fails_when_the_target_fails_to_start() {
    let c = TestCluster::with_units(2, &[("node2", DB, FAILING)]).await;
    let log = requirer_fails(&c, PROXY).await;
    assert_ne!(c.state("node1", NEED_DB).await, "active");
    assert_eq!(c.state("node2", DB).await, "failed");
    wait_state(&c, "node2", DEP, "inactive").await;
    assert!(
        log.contains("cannot start db.service on node node2") && log.contains("failed"),
        "{log}"
    );
    assert!(live(&c).await.is_empty());
    c.down().await;
}

/// proxy-service-fails-on-non-existent-node
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fails_on_a_node_that_does_not_exist() {
    let c = TestCluster::start(2).await;
    let log = requirer_fails(&c, "drover-proxy@node9_db.service").await;
    assert!(
        log.contains("cannot start db.service on node node9") && log.contains("no such node"),
        "{log}"
    );
    assert!(live(&c).await.is_empty());
    c.down().await;
}

/// proxy-service-fails-on-non-existent-service
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fails_on_a_unit_that_does_not_exist() {
    let c = TestCluster::start(2).await;
    let log = requirer_fails(&c, "drover-proxy@node2_nope.service").await;
    assert!(
        log.contains("cannot start nope.service on node node2")
            && log.to_lowercase().contains("not found"),
        "the reason says the unit does not exist: {log}"
    );
    assert_eq!(
        c.state("node2", "drover-dep@nope.service.service").await,
        "inactive"
    );
    assert!(live(&c).await.is_empty());
    c.down().await;
}

/// proxy-service-fails-on-typo-in-file
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_fails_on_a_target_unit_file_with_a_typo() {
    let c = TestCluster::start(2).await;
    // "ExecStrat": the unit has no ExecStart= and cannot be loaded.
    c.install("node2", DB, "[Service]\nExecStrat=/bin/sleep 600\n")
        .await;
    assert_eq!(c.prop("node2", DB, "LoadState").await, "bad-setting");
    let log = requirer_fails(&c, PROXY).await;
    assert!(
        log.contains("cannot start db.service on node node2")
            && log.to_lowercase().contains("setting"),
        "the reason says the unit file is bad: {log}"
    );
    assert_eq!(c.state("node2", DEP).await, "inactive");
    assert!(live(&c).await.is_empty());
    c.down().await;
}

/// proxy-service-propagate-target-service-failure
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_failure_propagates_through_binds_to() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "BindsTo", SLEEPER).await;
    c.systemctl_ok("node2", &["kill", "--signal=SIGKILL", DB])
        .await;
    wait_state(&c, "node2", DB, "failed").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    // The proxy goes down, failed as its target, and with it the BindsTo= requester.
    wait_state(&c, "node1", PROXY, "failed").await;
    wait_state(&c, "node1", NEED_DB, "inactive").await;
    let log = proxy_log(&c, "node1", PROXY);
    assert!(
        log.contains("db.service on node node2 ended: db.service on node node2 is failed"),
        "{log}"
    );
    wait_live(&c, vec![]).await;
    c.down().await;
}

/// proxy-service-stop-target
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_target_stops_dep_and_proxy_requester_keeps_running() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    stop_ok(&c, "node2", DB).await;
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    c.stays("node1", NEED_DB, "active", Duration::from_millis(500))
        .await;
    wait_live(&c, vec![]).await;
    c.down().await;
}

/// The manager watches a proxy's target for its state alone; a monitor of
/// the same unit still hears everything of it (here the `Service`
/// interface's property changes of its stop), and when the monitor is gone
/// the proxy still follows the target's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_of_a_proxy_target_hears_everything_and_the_proxy_its_state() {
    const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    let mut m = c.monitor().await;
    m.subscribe("node2", DB).await.unwrap();
    stop_ok(&c, "node2", DB).await;
    m.expect("the Service interface's changes of db's stop", T, |e| {
        matches!(e, Ev::Props { node, unit, interface, .. }
            if node == "node2" && unit == DB && interface == SERVICE_IFACE)
    })
    .await
    .unwrap();
    wait_state(&c, "node1", PROXY, "inactive").await;
    drop(m);

    // Watched for its state again: the proxy still follows the target.
    stop_ok(&c, "node1", NEED_DB).await;
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "active").await;
    wait_state(&c, "node2", DB, "active").await;
    stop_ok(&c, "node2", DB).await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    c.down().await;
}

/// proxy-service-stop-requesting
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_requester_releases_proxy_and_dep_target_keeps_running() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    stop_ok(&c, "node1", NEED_DB).await;
    // StopWhenUnneeded= on the proxy, then the last reference goes, then the dep.
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    c.stays("node2", DB, "active", Duration::from_millis(500))
        .await;
    wait_live(&c, vec![]).await;
    assert!(
        proxy_log(&c, "node1", PROXY).contains("released the proxy for db.service on node node2")
    );
    c.down().await;
}

/// proxy-service-stop-requesting-with-unneeded
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_requester_stops_a_stop_when_unneeded_target() {
    let c = TestCluster::start(2).await;
    let db = format!("[Unit]\nStopWhenUnneeded=yes\n{SLEEPER}");
    chain_up(&c, "Wants", &db).await;
    stop_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_state(&c, "node2", DB, "inactive").await;
    c.down().await;
}

/// proxy-service-stop-bluechi-dep: the operator stops the dep unit on the target
/// node. As in BlueChi's test, the dep stays down and both real services and the
/// proxy keep running (the proxy follows the target, not the dep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_dep_unit_leaves_both_services_running() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    stop_ok(&c, "node2", DEP).await;
    let settle = Duration::from_secs(1);
    c.stays("node2", DEP, "inactive", settle).await;
    assert_eq!(c.state("node2", DB).await, "active");
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    assert_eq!(c.state("node1", PROXY).await, "active");
    c.down().await;
}

/// proxy-service-multiple-services-one-node
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_on_one_node_share_one_proxy() {
    let c = TestCluster::with_units(2, &[("node2", DB, SLEEPER)]).await;
    for unit in ["need-db-a.service", "need-db-b.service"] {
        c.install("node1", unit, &requester("Wants", PROXY)).await;
        start_ok(&c, "node1", unit).await;
    }
    wait_state(&c, "node2", DEP, "active").await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    // The proxy lives as long as one of them needs it.
    stop_ok(&c, "node1", "need-db-a.service").await;
    c.stays("node1", PROXY, "active", Duration::from_millis(500))
        .await;
    assert_eq!(c.state("node2", DEP).await, "active");
    stop_ok(&c, "node1", "need-db-b.service").await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// proxy-service-multiple-nodes
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_target_hold_it_together() {
    let c = TestCluster::with_units(3, &[("node2", DB, SLEEPER)]).await;
    for node in ["node1", "node3"] {
        c.install(node, NEED_DB, &requester("Wants", PROXY)).await;
        start_ok(&c, node, NEED_DB).await;
        wait_state(&c, node, PROXY, "active").await;
    }
    wait_live(
        &c,
        vec![
            row("node1", "node2", DB, "active", 2),
            row("node3", "node2", DB, "active", 2),
        ],
    )
    .await;
    stop_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_live(&c, vec![row("node3", "node2", DB, "active", 1)]).await;
    assert_eq!(c.state("node2", DEP).await, "active");
    assert_eq!(c.state("node3", PROXY).await, "active");
    stop_ok(&c, "node3", NEED_DB).await;
    wait_state(&c, "node2", DEP, "inactive").await;
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// Start and stop the chain back to back, the target stopped between rounds: every
/// start must find the target running behind an active proxy. News of the previous
/// round (db stopped, db unloaded by systemd) must never fail the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_rounds_never_fail_on_news_of_the_previous_round() {
    let c = TestCluster::start(2).await;
    chain_up(&c, "Wants", SLEEPER).await;
    for round in 0..40 {
        stop_ok(&c, "node1", NEED_DB).await;
        wait_state(&c, "node1", PROXY, "inactive").await;
        wait_state(&c, "node2", DEP, "inactive").await;
        stop_ok(&c, "node2", DB).await;
        start_ok(&c, "node1", NEED_DB).await;
        let (proxy, db) = (c.state("node1", PROXY).await, c.state("node2", DB).await);
        assert!(
            proxy == "active" && db == "active",
            "round {round}: need-db started but the proxy is {proxy} and db is {db}; proxy log: {}",
            proxy_log(&c, "node1", PROXY)
        );
    }
    c.down().await;
}

// ---------------------------------------------------------------------------------
// Started ahead of the helper: the agent announces a proxy as soon as systemd runs
// its start job (agent/src/ahead.rs). That must never start a target a user did
// not ask for, nor earlier than the proxy unit's own ordering allows.
// ---------------------------------------------------------------------------------

/// `systemctl stop` (or `try-restart`) of an inactive proxy unit queues a job on it,
/// but not a start: nothing may start on the target node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_other_than_start_on_an_idle_proxy_start_nothing_remote() {
    let c = TestCluster::with_units(2, &[("node2", DB, SLEEPER)]).await;
    for verb in ["stop", "try-restart", "stop", "try-restart"] {
        let out = c.systemctl("node1", &[verb, PROXY]).await;
        assert!(out.success(), "{verb}: {}", out.stderr);
    }
    c.stays("node2", DB, "inactive", Duration::from_secs(1))
        .await;
    assert_eq!(c.state("node2", DEP).await, "inactive");
    assert_eq!(live(&c).await, vec![]);
    assert_eq!(c.state("node1", PROXY).await, "inactive");
    c.down().await;
}

/// A proxy ordered after a slow local unit: its target starts only once the proxy's
/// start job runs, and everything comes up in order after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_waiting_for_its_turn_does_not_start_the_target_early() {
    let c = TestCluster::with_units(2, &[("node2", DB, SLEEPER)]).await;
    // The gate runs until the test releases it: the window below cannot close early.
    let gate = format!("[Unit]\nBefore={PROXY}\n[Service]\nType=oneshot\nExecStart={HELD}\n");
    c.install("node1", "gate.service", &gate).await;
    let need = format!(
        "[Unit]\nWants=gate.service {PROXY}\nAfter={PROXY}\n[Service]\nExecStart=/bin/sleep 600\n"
    );
    c.install("node1", NEED_DB, &need).await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    wait_state(&c, "node1", "gate.service", "activating").await;
    // The proxy's job is queued behind gate: no announcement, no remote start.
    c.stays("node2", DB, "inactive", Duration::from_millis(1500))
        .await;
    assert_eq!(c.state("node1", PROXY).await, "inactive");
    assert_eq!(live(&c).await, vec![]);
    release(&c, "gate.service", "all").await;
    wait_state(&c, "node1", NEED_DB, "active").await;
    assert_eq!(c.state("node2", DB).await, "active");
    let gate_done = timestamp(
        &c,
        "node1",
        "gate.service",
        "InactiveEnterTimestampMonotonic",
    )
    .await;
    let proxy_start = timestamp(&c, "node1", PROXY, "InactiveExitTimestampMonotonic").await;
    assert!(
        gate_done <= proxy_start,
        "the proxy started before gate finished"
    );
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    c.down().await;
}

/// The agent starts the target before the proxy's helper runs only when
/// systemd's ordering lets the proxy's start job run: a stop of a unit
/// ordered after the proxy goes first, so the target waits for it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_start_waits_for_the_stop_of_a_unit_ordered_after_it() {
    let c = TestCluster::with_units(2, &[("node2", DB, SLEEPER)]).await;
    let later =
        format!("[Unit]\nAfter={PROXY}\n[Service]\nExecStart=/bin/sleep 600\nExecStop={HELD}\n");
    c.install("node1", "later.service", &later).await;
    start_ok(&c, "node1", "later.service").await;
    c.systemctl_ok("node1", &["stop", "--no-block", "later.service"])
        .await;
    wait_state(&c, "node1", "later.service", "deactivating").await;
    c.install("node1", NEED_DB, &requester("Wants", PROXY))
        .await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    // The proxy's start job waits behind the stop: nothing starts on node2.
    c.stays("node2", DB, "inactive", Duration::from_millis(1200))
        .await;
    assert_eq!(live(&c).await, vec![]);
    release(&c, "later.service", "control").await;
    wait_state(&c, "node1", NEED_DB, "active").await;
    assert_eq!(c.state("node1", PROXY).await, "active");
    assert_eq!(c.state("node2", DB).await, "active");
    let stopped = timestamp(
        &c,
        "node1",
        "later.service",
        "InactiveEnterTimestampMonotonic",
    )
    .await;
    let db_started = timestamp(&c, "node2", DB, "InactiveExitTimestampMonotonic").await;
    assert!(
        stopped <= db_started,
        "db started on node2 before later.service had stopped on node1"
    );
    c.down().await;
}

/// Not in BlueChi (services only): any unit type can be a target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_unit_types_are_targets_too() {
    let c = TestCluster::start(2).await;
    let proxy = "drover-proxy@node2_data.target.service";
    c.install(
        "node2",
        "data.target",
        "[Unit]\nDescription=data is there\n",
    )
    .await;
    c.install("node1", NEED_DB, &requester("Requires", proxy))
        .await;
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", proxy, "active").await;
    assert_eq!(c.state("node2", "data.target").await, "active");
    // StartDep answers once the target is active; the dep's own job may still
    // wait in systemd's queue.
    wait_state(&c, "node2", "drover-dep@data.target.service", "active").await;
    wait_live(&c, vec![row("node1", "node2", "data.target", "active", 1)]).await;
    stop_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node2", "drover-dep@data.target.service", "inactive").await;
    // An instance of a template is a unit like any other.
    let proxy = "drover-proxy@node2_worker@1.service";
    c.install("node2", "worker@.service", SLEEPER).await;
    // (Through a requester: a proxy nothing needs is stopped at once, StopWhenUnneeded=.)
    c.install(
        "node1",
        "need-worker.service",
        &requester("Requires", proxy),
    )
    .await;
    start_ok(&c, "node1", "need-worker.service").await;
    assert_eq!(c.state("node1", proxy).await, "active");
    assert_eq!(c.state("node2", "worker@1.service").await, "active");
    wait_state(&c, "node2", "drover-dep@worker@1.service.service", "active").await;
    c.down().await;
}

/// Restarting the target is a real stop: the proxy ends. A requester that says
/// `Upholds=` gets its proxy (and so the dependency) back by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_restart_ends_the_proxy_and_upholds_brings_it_back() {
    let c = TestCluster::with_units(2, &[("node2", DB, SLEEPER)]).await;
    let upholder =
        format!("[Unit]\nUpholds={PROXY}\nAfter={PROXY}\n[Service]\nExecStart=/bin/sleep 600\n");
    c.install("node1", NEED_DB, &upholder).await;
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "active").await;
    wait_state(&c, "node2", DB, "active").await;
    let first = invocation(&c, "node1", PROXY).await;
    c.systemctl_ok("node2", &["restart", DB]).await;
    let res = eventually(T, "a new, active run of the proxy", || async {
        c.state("node1", PROXY).await == "active"
            && c.prop("node1", PROXY, "InvocationID").await != first
    })
    .await;
    assert!(
        res.is_ok(),
        "{res:?}: proxy is {}",
        c.state("node1", PROXY).await
    );
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    wait_state(&c, "node2", DEP, "active").await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    c.down().await;
}

// ---------------------------------------------------------------------------------
// Disconnects and restarts (issue 3 part 6). A SIGSTOPped agent keeps its state but
// answers nothing: the manager sees its node go offline after the heartbeat
// threshold (2 s in the sandbox), and SIGCONT brings it back.
// ---------------------------------------------------------------------------------

/// Pauses `node`'s agent until the manager reports the node offline.
async fn pause_agent(c: &TestCluster, node: &str) {
    c.signal_agent(node, Signal::SIGSTOP).unwrap();
    c.wait_status(node, "offline", T).await;
}

async fn resume_agent(c: &TestCluster, node: &str) {
    c.signal_agent(node, Signal::SIGCONT).unwrap();
    c.wait_status(node, "online", T).await;
}

async fn invocation(c: &TestCluster, node: &str, unit: &str) -> String {
    let id = c.prop(node, unit, "InvocationID").await;
    assert!(!id.is_empty(), "{unit} on {node} has no invocation");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requesting_node_back_within_grace_changes_nothing_on_the_target() {
    let c = TestCluster::with(with_grace(2, 15_000)).await;
    chain_up(&c, "Wants", SLEEPER).await;
    let dep_run = invocation(&c, "node2", DEP).await;
    let db_run = invocation(&c, "node2", DB).await;
    pause_agent(&c, "node1").await;
    c.stays("node2", DEP, "active", Duration::from_secs(1))
        .await;
    resume_agent(&c, "node1").await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    // Same runs of dep and target: never stopped, never restarted.
    assert_eq!(invocation(&c, "node2", DEP).await, dep_run);
    assert_eq!(invocation(&c, "node2", DB).await, db_run);
    assert_eq!(c.state("node1", PROXY).await, "active");
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requesting_node_away_past_grace_loses_its_references_and_regains_them() {
    let c = TestCluster::with(with_grace(2, 1_500)).await;
    chain_up(&c, "Wants", SLEEPER).await;
    pause_agent(&c, "node1").await;
    // Past the grace period the reference is stale: the dep (the last want) stops;
    // the target itself has no StopWhenUnneeded= and keeps running.
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_live(&c, vec![]).await;
    assert_eq!(c.state("node2", DB).await, "active");
    // The requesting node comes back with its proxy still active: it re-announces
    // it and the reference (and the dep) is back.
    resume_agent(&c, "node1").await;
    wait_state(&c, "node2", DEP, "active").await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    assert_eq!(c.state("node1", PROXY).await, "active");
    c.down().await;
}

/// `systemctl restart drover-agent` on the requesting node: a clean stop leaves the
/// active proxy and what is bound to it running, the target is kept through the
/// grace period, and the new agent takes the proxy over, so that a later real stop
/// of the target still reaches the dependents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_requesting_agent_leaves_dependents_running() {
    let mut c = TestCluster::with(with_grace(2, 15_000)).await;
    chain_up(&c, "BindsTo", SLEEPER).await;
    let (need_run, dep_run) = (
        invocation(&c, "node1", NEED_DB).await,
        invocation(&c, "node2", DEP).await,
    );
    c.stop_agent("node1").await.unwrap();
    c.stays("node1", PROXY, "active", Duration::from_secs(1))
        .await;
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    assert_eq!(c.state("node2", DEP).await, "active");
    c.start_agent("node1").await.unwrap();
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    assert_eq!(invocation(&c, "node1", NEED_DB).await, need_run);
    assert_eq!(invocation(&c, "node2", DEP).await, dep_run);
    stop_ok(&c, "node2", DB).await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_state(&c, "node1", NEED_DB, "inactive").await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_node_back_within_grace_keeps_running_proxies() {
    let c = TestCluster::with(with_grace(2, 15_000)).await;
    chain_up(&c, "BindsTo", SLEEPER).await;
    let dep_run = invocation(&c, "node2", DEP).await;
    pause_agent(&c, "node2").await;
    // The target may well still run: nothing on node1 goes down.
    c.stays("node1", PROXY, "active", Duration::from_secs(2))
        .await;
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    resume_agent(&c, "node2").await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    c.stays("node1", PROXY, "active", Duration::from_millis(500))
        .await;
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    assert_eq!(invocation(&c, "node2", DEP).await, dep_run);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_node_away_past_grace_stops_proxies_and_leaks_no_dep() {
    let c = TestCluster::with(with_grace(2, 1_500)).await;
    chain_up(&c, "BindsTo", SLEEPER).await;
    pause_agent(&c, "node2").await;
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_state(&c, "node1", NEED_DB, "inactive").await;
    wait_live(&c, vec![]).await;
    // Back: nobody needs db on node2 any more, so its dep goes (no leak).
    resume_agent(&c, "node2").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    assert_eq!(c.state("node1", PROXY).await, "inactive");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_proxy_waits_for_an_offline_target_node() {
    let c = TestCluster::with(with_grace(2, 1_500)).await;
    c.install("node2", DB, SLEEPER).await;
    c.install("node1", NEED_DB, &requester("Requires", PROXY))
        .await;
    pause_agent(&c, "node2").await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    // Waiting proxies keep waiting past the grace period (their start timeout bounds
    // them), and complete once the target node is back.
    wait_state(&c, "node1", PROXY, "activating").await;
    c.stays("node1", PROXY, "activating", Duration::from_secs(3))
        .await;
    resume_agent(&c, "node2").await;
    wait_state(&c, "node1", PROXY, "active").await;
    wait_state(&c, "node1", NEED_DB, "active").await;
    assert_eq!(c.state("node2", DB).await, "active");
    wait_state(&c, "node2", DEP, "active").await;
    c.down().await;
}

/// Stopping a proxy that still waits (here: its target node is away) releases its
/// reference: systemd runs no ExecStop= for a unit stopped while starting, so the
/// helper does it on SIGTERM, and the unit ends inactive, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_waiting_proxy_releases_its_reference() {
    let c = TestCluster::with(with_grace(2, 15_000)).await;
    c.install("node2", DB, SLEEPER).await;
    c.install("node1", NEED_DB, &requester("Requires", PROXY))
        .await;
    pause_agent(&c, "node2").await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    wait_state(&c, "node1", PROXY, "activating").await;
    wait_live(&c, vec![row("node1", "node2", DB, "waiting", 1)]).await;
    stop_ok(&c, "node1", PROXY).await;
    assert_eq!(c.state("node1", PROXY).await, "inactive");
    assert_ne!(c.state("node1", NEED_DB).await, "active");
    wait_live(&c, vec![]).await;
    // node2 back: nothing is started there for the released reference.
    resume_agent(&c, "node2").await;
    c.stays("node2", DEP, "inactive", Duration::from_secs(2))
        .await;
    assert_eq!(c.state("node2", DB).await, "inactive");
    c.down().await;
}

/// Issue 14 item 9: a proxy whose start timeout runs out while its target node is
/// offline says that the node is offline and since when, in the proxy unit's log
/// (its journal in a real installation), not only that it timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_timing_out_on_an_offline_node_says_so_and_since_when() {
    let mut c = TestCluster::with(with_grace(2, 60_000)).await;
    c.install("node2", DB, SLEEPER).await;
    // A short start timeout for this proxy, as an operator would set it: a drop-in.
    let dropin = drover_sandbox::node::unit_dir(c.dir(), "node1").join(format!("{PROXY}.d"));
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(
        dropin.join("timeout.conf"),
        "[Service]\nTimeoutStartSec=3\n",
    )
    .unwrap();
    c.systemctl_ok("node1", &["daemon-reload"]).await;

    let before = SystemTime::now();
    c.stop_agent("node2").await.unwrap();
    c.wait_status("node2", "offline", T).await;
    let after = SystemTime::now();
    c.systemctl_ok("node1", &["start", "--no-block", PROXY])
        .await;
    wait_state(&c, "node1", PROXY, "failed").await;
    assert_eq!(c.prop("node1", PROXY, "Result").await, "timeout");

    let log = proxy_log(&c, "node1", PROXY);
    let line = log
        .lines()
        .find(|l| l.contains("stopped while waiting"))
        .unwrap_or_else(|| panic!("no reason in the proxy's log: {log}"));
    assert!(
        line.starts_with(
            "drover-proxy: stopped while waiting for db.service on node node2: \
             node node2 is offline (since "
        ),
        "{line}"
    );
    // Since when: the moment node2 went offline, to the second, and how long ago.
    let secs = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let went = (secs(before)..=secs(after))
        .map(|s| drover_protocol::offline::utc(std::time::UNIX_EPOCH + Duration::from_secs(s)))
        .find(|date| line.contains(&format!("(since {date}, ")));
    assert!(
        went.is_some(),
        "the date is when node2 went offline: {line}"
    );
    assert!(line.ends_with(" s ago)"), "{line}");
    // The proxy released its reference.
    wait_live(&c, vec![]).await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_restart_rebuilds_references_exactly() {
    let mut c = TestCluster::with(with_grace(3, 3_000)).await;
    c.install("node2", DB, SLEEPER).await;
    for node in ["node1", "node3"] {
        c.install(node, NEED_DB, &requester("Wants", PROXY)).await;
        start_ok(&c, node, NEED_DB).await;
    }
    wait_state(&c, "node2", DEP, "active").await;
    let dep_run = invocation(&c, "node2", DEP).await;
    let db_run = invocation(&c, "node2", DB).await;

    c.stop_manager().await.unwrap();
    // While the manager is away, node3 no longer needs db.
    stop_ok(&c, "node3", NEED_DB).await;
    wait_state(&c, "node3", PROXY, "inactive").await;
    c.start_manager().await.unwrap();
    for node in ["node1", "node2", "node3"] {
        c.wait_status(node, "online", T).await;
    }
    // Exactly node1's reference is rebuilt; the in-use target was never stopped.
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    // Past the grace period nothing else is swept away either.
    c.stays("node2", DEP, "active", Duration::from_secs(4))
        .await;
    assert_eq!(invocation(&c, "node2", DEP).await, dep_run);
    assert_eq!(invocation(&c, "node2", DB).await, db_run);
    assert_eq!(c.state("node1", PROXY).await, "active");
    // And the rebuilt reference is a real one: releasing it releases the dep.
    stop_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node2", DEP, "inactive").await;
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// A grace period of `grace_ms` and a warm-up of `warm_up_s` after a
/// manager start.
fn with_grace_and_warm_up(nodes: usize, grace_ms: u64, warm_up_s: u64) -> ClusterOptions {
    ClusterOptions {
        manager_extra_config: format!(
            "[drover-manager]\nProxyGracePeriod={grace_ms}\nWarmUpTimeout={warm_up_s}s\n"
        ),
        ..ClusterOptions::with_nodes(nodes)
    }
}

/// A manager restart while the only requester is gone for good: the dep it left
/// behind is stopped (no leak), once the warm-up gave up waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_restart_stops_deps_nobody_reclaims() {
    // Long enough that a slow manager start plus the 4 s check below end
    // inside it.
    let warm_up = Duration::from_secs(15);
    let mut c = TestCluster::with(with_grace_and_warm_up(2, 2_000, warm_up.as_secs())).await;
    chain_up(&c, "Wants", SLEEPER).await;
    c.stop_manager().await.unwrap();
    // node1's agent dies with the manager away: nobody will re-announce the proxy.
    c.signal_agent("node1", Signal::SIGKILL).unwrap();
    // Taken before the start: the warm-up begins inside it, so it ends
    // later than `asked + warm_up`.
    let asked = Instant::now();
    c.start_manager().await.unwrap();
    c.wait_status("node2", "online", T).await;
    // Past node2's grace period the dep still runs: node1 may depend on
    // node2 and has not been back since the start.
    c.stays("node2", DEP, "active", Duration::from_secs(4))
        .await;
    assert!(
        asked.elapsed() < warm_up,
        "the check above ended inside the warm-up ({:?} after the start was asked)",
        asked.elapsed()
    );
    wait_state(&c, "node2", DEP, "inactive").await;
    assert!(
        asked.elapsed() >= warm_up,
        "stopped only once the warm-up ended ({:?} after the start was asked)",
        asked.elapsed()
    );
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// A manager restart while a requester's agent is away longer than the
/// target's grace period: the dep it needs is not swept meanwhile, and the
/// requester's proxy finds it running when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_restart_keeps_the_deps_of_a_requester_that_comes_back_late() {
    let mut c = TestCluster::with(with_grace_and_warm_up(2, 2_000, 60)).await;
    chain_up(&c, "Wants", SLEEPER).await;
    let dep_run = invocation(&c, "node2", DEP).await;
    let db_run = invocation(&c, "node2", DB).await;
    c.stop_manager().await.unwrap();
    c.stop_agent("node1").await.unwrap();
    c.start_manager().await.unwrap();
    c.wait_status("node2", "online", T).await;
    // Twice node2's grace period: a sweep would have stopped the dep.
    c.stays("node2", DEP, "active", Duration::from_secs(4))
        .await;
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    wait_live(&c, vec![row("node1", "node2", DB, "active", 1)]).await;
    // node1's reference is rebuilt: the sweep now due keeps the dep.
    c.stays("node2", DEP, "active", Duration::from_secs(3))
        .await;
    assert_eq!(invocation(&c, "node2", DEP).await, dep_run);
    assert_eq!(invocation(&c, "node2", DB).await, db_run);
    assert_eq!(c.state("node1", PROXY).await, "active");
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_revoking_permission_drops_references_at_once() {
    let allow = "[node node1]\nAllowDependenciesOn=node2\n";
    let c = TestCluster::with(ClusterOptions {
        allow_all_proxies: false,
        manager_extra_config: allow.into(),
        ..ClusterOptions::with_nodes(2)
    })
    .await;
    chain_up(&c, "Wants", SLEEPER).await;
    c.reconfigure_manager(false, "").unwrap();
    // "At once": well inside a heartbeat threshold, no grace period.
    let quick = Duration::from_secs(3);
    let res = eventually(quick, "the dep on node2 to stop", || async {
        c.state("node2", DEP).await == "inactive"
    })
    .await;
    assert!(
        res.is_ok(),
        "{res:?}; dep is {}",
        c.state("node2", DEP).await
    );
    // The requester's proxy no longer stands for anything: it is not active either.
    wait_state(&c, "node1", PROXY, "inactive").await;
    wait_live(&c, vec![]).await;
    assert_eq!(c.state("node2", DB).await, "active");
    // A new attempt is refused, saying why.
    stop_ok(&c, "node1", NEED_DB).await;
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", PROXY, "failed").await;
    assert!(proxy_log(&c, "node1", PROXY).contains("AllowDependenciesOn"));
    c.down().await;
}

// ---------------------------------------------------------------------------------
// Malformed instance names: refused by the helper before anything is sent.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_instance_names_are_refused_before_anything_is_sent() {
    let c = TestCluster::start(2).await;
    let helper = bin("drover-proxy");
    let helper = helper.to_str().unwrap();
    for (instance, why) in [
        ("bad", "no '_' between node and unit"),
        ("_x", "bad target node: node name is empty"),
        ("node_", "bad target unit: unit name is empty"),
        ("a b_c", "bad target node: invalid node name 'a b'"),
    ] {
        // By hand, inside the node, as systemd would run it.
        let out = c
            .exec("node1", &[helper, "create", "--user", instance])
            .await;
        assert_eq!(out.code, 2, "create {instance:?}: {out:?}");
        let err = out.stderr;
        assert!(err.contains(why), "{instance:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    }
    // Through systemd: the unit fails and its output says why. ("a b_c" as a unit
    // name is escaped by systemd-escape to "a\x20b_c"; the helper sees that.)
    for (unit, why) in [
        ("drover-proxy@bad.service", "no '_' between node and unit"),
        ("drover-proxy@_x.service", "node name is empty"),
        ("drover-proxy@node_.service", "unit name is empty"),
        (r"drover-proxy@a\x20b_c.service", "bad target node"),
    ] {
        let out = c.systemctl("node1", &["start", unit]).await;
        assert!(!out.success(), "{unit} must fail");
        assert_eq!(c.state("node1", unit).await, "failed");
        let log = proxy_log(&c, "node1", unit);
        assert!(log.contains(why), "{unit}: {log:?}");
    }
    assert!(proxies(&c).await.is_empty(), "nothing reached the manager");
    c.down().await;
}

/// A target stopped on its own node while it is still starting (here: in its
/// `ExecStartPre=`) never becomes active: the proxy fails at once with the
/// reason, instead of waiting for its start timeout, and the requester does
/// not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_stopped_during_its_own_start_fails_the_proxy_at_once() {
    let c = TestCluster::start(2).await;
    let slow = "[Service]\nExecStartPre=/bin/sleep 30\nExecStart=/bin/sleep 600\n";
    c.install("node2", DB, slow).await;
    c.install("node1", NEED_DB, &requester("Requires", PROXY))
        .await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    wait_state(&c, "node2", DB, "activating").await;
    let stopped = Instant::now();
    stop_ok(&c, "node2", DB).await;
    wait_state(&c, "node1", PROXY, "failed").await;
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "the proxy failed only after {:?}",
        stopped.elapsed()
    );
    assert_ne!(c.state("node1", NEED_DB).await, "active");
    wait_state(&c, "node2", DEP, "inactive").await;
    let log = proxy_log(&c, "node1", PROXY);
    assert!(
        log.contains("cannot start db.service on node node2"),
        "{log}"
    );
    wait_live(&c, vec![]).await;
    c.down().await;
}

/// Issue 14 item 6: a target that fails a few milliseconds after it starts.
/// Its failure could reach the manager before the confirmation of the dep
/// start (held back as news from before the start), and the confirmation
/// then replayed it to the waiting proxy as *virtual* — which decides
/// nothing — so the proxy hung `activating` for its whole start timeout
/// (90 s). Each round here must settle within a few seconds, never left
/// waiting, and end `failed` with the target's reason, whatever the type: a
/// oneshot target that fails never runs, so its proxy fails while it waits;
/// a simple or exec one that exits right away ran for a moment, so its proxy
/// may complete first, and is then stopped with a failing `ExecStop=` (the
/// agent answers its `RemoveProxy` with the reason). Either way the proxy
/// is `failed` within 1 s of its target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_failing_right_after_its_start_never_leaves_the_proxy_waiting() {
    const ROUNDS: usize = 40;
    /// Far below the proxy's start timeout (90 s), far above a healthy round.
    const SETTLE: Duration = Duration::from_secs(8);
    let c = TestCluster::start(2).await;
    c.install("node1", NEED_DB, &requester("Wants", PROXY))
        .await;
    for (kind, unit) in [
        (
            "oneshot",
            "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'exit 1'\n",
        ),
        (
            "simple",
            "[Service]\nType=simple\nExecStart=/bin/sh -c 'exit 1'\n",
        ),
        (
            "exec",
            "[Service]\nType=exec\nExecStart=/bin/sh -c 'exit 1'\n",
        ),
    ] {
        c.install("node2", DB, unit).await;
        for round in 0..ROUNDS {
            let began = Instant::now();
            // Wants= + After=: the start returns once the proxy's job ends.
            let started =
                tokio::time::timeout(SETTLE, c.systemctl("node1", &["start", NEED_DB])).await;
            let settled = poll(
                SETTLE,
                Duration::from_millis(20),
                "proxy settled",
                || async {
                    matches!(
                        c.state("node1", PROXY).await.as_str(),
                        "failed" | "inactive"
                    )
                },
            )
            .await;
            match started {
                Ok(out) if out.success() => {}
                other => panic!(
                    "{kind} round {round}: need-db's start did not end well in {SETTLE:?} \
                     ({other:?}; proxy {}):\n{}",
                    c.state("node1", PROXY).await,
                    proxy_table(&c).await
                ),
            }
            if settled.is_err() {
                panic!(
                    "{kind} round {round}: the proxy is still {} after {:?}\n{}",
                    c.state("node1", PROXY).await,
                    began.elapsed(),
                    proxy_table(&c).await
                );
            }
            let state = c.state("node1", PROXY).await;
            let log = proxy_log(&c, "node1", PROXY);
            assert_eq!(state, "failed", "{kind} round {round}: {log}");
            assert!(
                // The target's reason: it failed (while the proxy waited, or
                // after it completed), in the last line the proxy printed.
                log.lines().last().is_some_and(
                    |l| l.contains("db.service on node node2") && l.contains("failed")
                ),
                "{kind} round {round}: {log}"
            );
            // Within 1 s of the target (both nodes share one monotonic clock).
            let db_failed = timestamp(&c, "node2", DB, "InactiveEnterTimestampMonotonic").await;
            let proxy_failed =
                timestamp(&c, "node1", PROXY, "InactiveEnterTimestampMonotonic").await;
            assert!(
                proxy_failed.saturating_sub(db_failed) < 1_000_000,
                "{kind} round {round}: the proxy failed {} µs after its target",
                proxy_failed.saturating_sub(db_failed)
            );
            // Next round from scratch: nothing running, nothing failed, no reference.
            stop_ok(&c, "node1", NEED_DB).await;
            c.systemctl("node1", &["reset-failed", PROXY]).await;
            c.systemctl("node2", &["reset-failed", DB]).await;
            wait_live(&c, vec![]).await;
        }
    }
    c.down().await;
}
