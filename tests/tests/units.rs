//! Driving units on real systemd nodes through the manager: list, start,
//! stop, restart, reload, failures, missing units, daemon-reload.

mod common;

use common::*;
use drover_bus::systemd::UnitTuple;
use std::collections::BTreeMap;
use std::time::Duration;

const JOB: Duration = Duration::from_secs(10);

/// name → (active, sub) straight from a node's systemd.
async fn systemd_units(bus_address: &str) -> BTreeMap<String, (String, String)> {
    let conn = zbus::connection::Builder::address(bus_address)
        .build()
        .await
        .unwrap();
    let mgr = zbus::Proxy::new(
        &conn,
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await
    .unwrap();
    let units: Vec<UnitTuple> = mgr.call("ListUnits", &()).await.unwrap();
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
    let cluster = cluster(2).await;
    cluster
        .install_unit("node2", "web.service", SLEEPER)
        .await
        .unwrap();
    cluster
        .systemctl("node2", &["start", "web.service"])
        .await
        .unwrap();

    let direct = systemd_units(&cluster.node_bus_address("node2")).await;
    let conn = bus(&cluster).await;
    let via_api: Vec<UnitTuple> = node(&conn, "node2")
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

    let table = parse_table(&ok(&droverctl(&cluster, &["list-units", "node2"]).await));
    let from_ctl: BTreeMap<_, _> = table
        .into_iter()
        .map(|((n, u), s)| {
            assert_eq!(n, "node2");
            (u, s)
        })
        .collect();
    assert_eq!(from_ctl, direct);

    // The glob filters on the unit name.
    let filtered = parse_table(&ok(&droverctl(
        &cluster,
        &["list-units", "node2", "--filter", "web*"],
    )
    .await));
    assert_eq!(
        filtered.keys().map(|(_, u)| u.as_str()).collect::<Vec<_>>(),
        ["web.service"]
    );

    // Without a node: every online node, keyed by node name.
    let all: BTreeMap<String, Vec<UnitTuple>> = controller(&conn)
        .await
        .call("ListUnits", &())
        .await
        .unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["node1", "node2"]);
    assert!(all["node2"].iter().any(|u| u.0 == "web.service"));
    assert!(
        !all["node1"].iter().any(|u| u.0 == "web.service"),
        "nodes do not share units"
    );
    cluster.down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_stop_restart_reload_end_with_done() {
    let cluster = cluster(2).await;
    cluster
        .install_unit("node2", "web.service", SLEEPER)
        .await
        .unwrap();

    let out = ok(&droverctl(&cluster, &["start", "node2", "web.service"]).await);
    assert!(
        out.contains("Unit web.service StartUnit operation result: done"),
        "{out}"
    );
    assert_eq!(
        unit_prop(&cluster, "node2", "web.service", "ActiveState").await,
        "active"
    );
    assert_eq!(
        unit_prop(&cluster, "node1", "web.service", "ActiveState").await,
        "inactive",
        "only node2 runs it"
    );

    let pid_before = unit_prop(&cluster, "node2", "web.service", "MainPID").await;
    let out = ok(&droverctl(&cluster, &["restart", "node2", "web"]).await);
    assert!(out.contains("RestartUnit operation result: done"), "{out}");
    let pid_after = unit_prop(&cluster, "node2", "web.service", "MainPID").await;
    assert_ne!(pid_before, pid_after, "restart gives a new main process");

    let out = ok(&droverctl(&cluster, &["reload", "node2", "web.service"]).await);
    assert!(out.contains("ReloadUnit operation result: done"), "{out}");

    let out = ok(&droverctl(&cluster, &["stop", "node2", "web.service"]).await);
    assert!(out.contains("StopUnit operation result: done"), "{out}");
    assert_eq!(
        unit_prop(&cluster, "node2", "web.service", "ActiveState").await,
        "inactive"
    );
    cluster.down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_announced_then_removed_exactly_once_with_properties() {
    let cluster = cluster(1).await;
    cluster
        .install_unit("node1", "quick.service", ONESHOT_OK)
        .await
        .unwrap();
    let conn = bus(&cluster).await;
    let mut jobs = JobWatch::new(&conn).await;
    let n = node(&conn, "node1").await;
    let path = job_call(&n, "StartUnit", "quick.service").await.unwrap();
    let id = jobs.job_new(&path, JOB).await.unwrap();
    assert_eq!(path, format!("/org/eclipse/bluechi/job/{id}"));
    let removed = jobs.removed(&path, JOB).await.unwrap();
    assert_eq!(
        removed,
        JobRemoved {
            id,
            path: path.clone(),
            node: "node1".into(),
            unit: "quick.service".into(),
            result: "done".into(),
        }
    );
    jobs.no_more_removed(&path, Duration::from_millis(500))
        .await
        .unwrap();

    // A pending job can be inspected and cancelled.
    cluster
        .install_unit("node1", "slow.service", SLOW_START)
        .await
        .unwrap();
    let path = job_call(&n, "StartUnit", "slow.service").await.unwrap();
    jobs.job_new(&path, JOB).await.unwrap();
    let job = zbus::Proxy::new(&conn, BUS_NAME, path.as_str(), "org.eclipse.bluechi.Job")
        .await
        .unwrap();
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
    cluster.down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_unit_gives_failed_and_a_missing_unit_a_clear_error() {
    let cluster = cluster(1).await;
    cluster
        .install_unit("node1", "broken.service", FAILING)
        .await
        .unwrap();

    let out = droverctl(&cluster, &["start", "node1", "broken.service"]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed job is a failed command"
    );
    assert!(
        stdout(&out).contains("Unit broken.service StartUnit operation result: failed"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        unit_prop(&cluster, "node1", "broken.service", "ActiveState").await,
        "failed"
    );

    let out = droverctl(&cluster, &["start", "node1", "nope.service"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("nope.service") && err.lines().count() == 1,
        "one clear line: {err}"
    );

    // Over D-Bus the node's systemd error comes back unchanged.
    let conn = bus(&cluster).await;
    let e = job_call(&node(&conn, "node1").await, "StartUnit", "nope.service")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("org.freedesktop.systemd1.NoSuchUnit"),
        "{e}"
    );
    cluster.down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reload_picks_up_a_changed_unit() {
    let cluster = cluster(1).await;
    cluster
        .install_unit("node1", "web.service", SLEEPER)
        .await
        .unwrap();
    let unit_file = cluster.dir().join("node1/config/systemd/user/web.service");
    assert!(unit_file.exists(), "units live at {}", unit_file.display());
    // Loaded (running) before the file changes, so systemd holds the old version.
    ok(&droverctl(&cluster, &["start", "node1", "web.service"]).await);
    std::fs::write(
        &unit_file,
        "[Unit]\nDescription=changed by test\n[Service]\nExecStart=/bin/sleep 600\n",
    )
    .unwrap();
    assert_eq!(
        unit_prop(&cluster, "node1", "web.service", "NeedDaemonReload").await,
        "yes"
    );

    ok(&droverctl(&cluster, &["daemon-reload", "node1"]).await);
    assert_eq!(
        unit_prop(&cluster, "node1", "web.service", "NeedDaemonReload").await,
        "no"
    );
    assert_eq!(
        unit_prop(&cluster, "node1", "web.service", "Description").await,
        "changed by test"
    );
    cluster.down().await.unwrap();
}
