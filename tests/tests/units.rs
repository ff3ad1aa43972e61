//! Driving units on real systemd nodes through the manager: list, start,
//! stop, restart, reload, failures, missing units, daemon-reload.

use drover_testkit::api::job_call;
use drover_testkit::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

const JOB: Duration = Duration::from_secs(10);

/// name → (active, sub) straight from a node's systemd.
async fn systemd_units(c: &TestCluster, node: &str) -> BTreeMap<String, (String, String)> {
    let units: Vec<UnitTuple> = c.systemd(node).await.call("ListUnits", &()).await.unwrap();
    units.into_iter().map(|u| (u.0, (u.3, u.4))).collect()
}

/// Parses droverctl's `NODE | ID | ACTIVE | SUB` table.
fn parse_table(out: &str) -> BTreeMap<(String, String), (String, String)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            (f.len() == 4 && f[0] != "NODE" && !f[0].is_empty() && !f[0].starts_with('=')).then(
                || {
                    (
                        (f[0].to_string(), f[1].to_string()),
                        (f[2].to_string(), f[3].to_string()),
                    )
                },
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_of_a_node_equals_what_its_systemd_reports() {
    let c = TestCluster::with_units(2, &[("node2", "web.service", SLEEPER)]).await;
    c.systemctl("node2", &["start", "web.service"]).await;

    let direct = systemd_units(&c, "node2").await;
    let api = c.api().await;
    let via_api: Vec<UnitTuple> = api
        .node("node2")
        .await
        .call("ListUnits", &())
        .await
        .unwrap();
    let via_api: BTreeMap<_, _> = via_api.into_iter().map(|u| (u.0, (u.3, u.4))).collect();
    assert_eq!(
        via_api, direct,
        "Node.ListUnits is the node's own ListUnits"
    );
    assert_eq!(
        via_api.get("web.service"),
        Some(&("active".into(), "running".into()))
    );

    let table = parse_table(&c.ctl_ok(&["list-units", "node2"]).await);
    let from_ctl: BTreeMap<_, _> = table
        .into_iter()
        .map(|((n, u), s)| {
            assert_eq!(n, "node2");
            (u, s)
        })
        .collect();
    assert_eq!(from_ctl, direct);

    // The glob filters on the unit name.
    let filtered = parse_table(&c.ctl_ok(&["list-units", "node2", "--filter", "web*"]).await);
    assert_eq!(
        filtered.keys().map(|(_, u)| u.as_str()).collect::<Vec<_>>(),
        ["web.service"]
    );

    // Without a node: every online node, keyed by node name.
    let all: BTreeMap<String, Vec<UnitTuple>> =
        api.controller().await.call("ListUnits", &()).await.unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["node1", "node2"]);
    assert!(all["node2"].iter().any(|u| u.0 == "web.service"));
    assert!(
        !all["node1"].iter().any(|u| u.0 == "web.service"),
        "nodes do not share units"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_stop_restart_reload_end_with_done() {
    let c = TestCluster::with_units(2, &[("node2", "web.service", SLEEPER)]).await;

    let out = c.ctl_ok(&["start", "node2", "web.service"]).await;
    assert!(
        out.contains("Unit web.service StartUnit operation result: done"),
        "{out}"
    );
    assert_eq!(c.state("node2", "web.service").await, "active");
    assert_eq!(
        c.state("node1", "web.service").await,
        "inactive",
        "only node2 runs it"
    );

    let pid_before = c.prop("node2", "web.service", "MainPID").await;
    let out = c.ctl_ok(&["restart", "node2", "web"]).await;
    assert!(out.contains("RestartUnit operation result: done"), "{out}");
    let pid_after = c.prop("node2", "web.service", "MainPID").await;
    assert_ne!(pid_before, pid_after, "restart gives a new main process");

    let out = c.ctl_ok(&["reload", "node2", "web.service"]).await;
    assert!(out.contains("ReloadUnit operation result: done"), "{out}");

    let out = c.ctl_ok(&["stop", "node2", "web.service"]).await;
    assert!(out.contains("StopUnit operation result: done"), "{out}");
    assert_eq!(c.state("node2", "web.service").await, "inactive");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_announced_then_removed_exactly_once_with_properties() {
    let c = TestCluster::with_units(1, &[("node1", "quick.service", ONESHOT_OK)]).await;
    let (api, n, mut jobs) = c.jobs_on("node1").await;
    let path = job_call(&n, "StartUnit", "quick.service").await.unwrap();
    let quick = ("node1", "quick.service", "done");
    let quiet = Duration::from_millis(500);
    let id = jobs.ends_once(&path, quick, JOB, quiet).await;
    assert_eq!(path, format!("/org/eclipse/bluechi/job/{id}"));

    // A pending job can be inspected and cancelled.
    c.install("node1", "slow.service", SLOW_START).await;
    let path = job_call(&n, "StartUnit", "slow.service").await.unwrap();
    jobs.job_new(&path, JOB).await.unwrap();
    let job = api.proxy(&path, drover_testkit::api::JOB_IFACE).await;
    let (unit, jt, node_name): (String, String, String) = (
        job.get_property("Unit").await.unwrap(),
        job.get_property("JobType").await.unwrap(),
        job.get_property("Node").await.unwrap(),
    );
    assert_eq!(
        (unit.as_str(), jt.as_str(), node_name.as_str()),
        ("slow.service", "start", "node1")
    );
    eventually(JOB, "job state running", || async {
        job.get_property::<String>("State").await.ok().as_deref() == Some("running")
    })
    .await
    .unwrap();
    let _: () = job.call("Cancel", &()).await.unwrap();
    assert_eq!(jobs.removed(&path, JOB).await.unwrap().result, "canceled");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_unit_gives_failed_and_a_missing_unit_a_clear_error() {
    let c = TestCluster::with_units(1, &[("node1", "broken.service", FAILING)]).await;

    let out = c.run(&["start", "node1", "broken.service"]).await;
    assert_eq!(out.code, 1, "a failed job is a failed command");
    assert!(
        out.stdout
            .contains("Unit broken.service StartUnit operation result: failed"),
        "{}",
        out.stdout
    );
    assert_eq!(c.state("node1", "broken.service").await, "failed");

    let out = c.run(&["start", "node1", "nope.service"]).await;
    assert_eq!(out.code, 1);
    let err = out.stderr;
    assert!(
        err.contains("nope.service") && err.lines().count() == 1,
        "one clear line: {err}"
    );

    // Over D-Bus the node's systemd error comes back unchanged.
    let n = c.api().await.node("node1").await;
    let e = job_call(&n, "StartUnit", "nope.service").await.unwrap_err();
    assert!(
        e.to_string()
            .contains("org.freedesktop.systemd1.NoSuchUnit"),
        "{e}"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reload_picks_up_a_changed_unit() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    let unit_file = c.dir().join("node1/config/systemd/user/web.service");
    assert!(unit_file.exists(), "units live at {}", unit_file.display());
    // Loaded (running) before the file changes, so systemd holds the old version.
    c.ctl_ok(&["start", "node1", "web.service"]).await;
    std::fs::write(
        &unit_file,
        "[Unit]\nDescription=changed by test\n[Service]\nExecStart=/bin/sleep 600\n",
    )
    .unwrap();
    assert_eq!(
        c.prop("node1", "web.service", "NeedDaemonReload").await,
        "yes"
    );

    c.ctl_ok(&["daemon-reload", "node1"]).await;
    assert_eq!(
        c.prop("node1", "web.service", "NeedDaemonReload").await,
        "no"
    );
    assert_eq!(
        c.prop("node1", "web.service", "Description").await,
        "changed by test"
    );
    c.down().await;
}
