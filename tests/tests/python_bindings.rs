//! Compatibility proof: BlueChi's own Python bindings (PyPI `bluechi`, on
//! dasbus, which builds its proxies from our Introspect XML) drive drover.
//!
//! The same bindings against the leader of two managers on etcd, and a
//! standby refusing them with the leader's name.
//!
//! Needs Debian's python3-dasbus and the `bluechi` package in
//! target/pylib (`make pydeps`; `.ci/run` and `make test` do it).

use drover_testkit::api::DROVER_CONTROLLER_IFACE;
use drover_testkit::etcd::Etcd;
use drover_testkit::ha::{LOOK, TwoManagers, two_managers};
use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use std::path::PathBuf;
use std::time::Duration;

/// Long enough for an election and two agents on a loaded 2-core machine.
const T: Duration = Duration::from_secs(20);

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `tests/python/SCRIPT BUS ARGS...` with BlueChi's bindings and checks
/// that it passed.
async fn run_python(bus: &str, script: &str, args: &[&str]) {
    let pylib = workspace().join("target/pylib");
    assert!(
        pylib.join("bluechi/api.py").exists(),
        "BlueChi's Python bindings are missing from {}: run `make pydeps`",
        pylib.display()
    );
    let run = tokio::process::Command::new("/usr/bin/python3")
        .arg(workspace().join("tests/python").join(script))
        .arg(bus)
        .args(args)
        .env("PYTHONPATH", &pylib)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the python check finishes")
        .expect("python3 runs");
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{so}\n{se}");
    assert!(so.contains("all checks passed"), "{so}");
}

/// Installs `units` on node1 of a two-node cluster, then runs `tests/python/SCRIPT`
/// with BlueChi's bindings against the cluster's bus and checks that it passed.
async fn python_check(units: &[(&str, &str)], script: &str) {
    let c = TestCluster::start(2).await;
    for (name, text) in units {
        c.install("node1", name, text).await;
    }
    run_python(c.bus_address(), script, &[]).await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_python_bindings_drive_drover() {
    let units = [
        ("compat-ok.service", ONESHOT_OK),
        ("compat-slow.service", SLOW_START),
    ];
    python_check(&units, "bluechi_compat.py").await;
}

/// BlueChi's `Monitor` (create_monitor, subscribe, on_unit_state_changed on a
/// dasbus EventLoop) and the Node members (properties, unit files through
/// `bluechi.ext.Unit`, kill, reset-failed, log levels) against the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_python_monitor_and_node_api_drive_drover() {
    let units = [("pyweb.service", SLEEPER), ("pyinst.service", INSTALLABLE)];
    python_check(&units, "bluechi_monitor_node.py").await;
}

/// The same script against the leader of two managers on a real etcd, whose
/// agents list both managers: a BlueChi client sees what it sees with one
/// manager. The standby refuses each of the bindings' calls with an error
/// naming the leader (docs/ha.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_python_bindings_drive_the_leader_of_two_and_a_standby_names_it() {
    let etcd = Etcd::start().await;
    let TwoManagers { c, b, .. } = two_managers(&etcd, "/drover-test/python", 2).await;
    let a = c.api().await;
    poll(T, LOOK, "both nodes online on A", || {
        drover_testkit::ha::all_online(&a, &["node1", "node2"])
    })
    .await
    .expect("both nodes online on the leader");
    c.install("node1", "compat-ok.service", ONESHOT_OK).await;
    c.install("node1", "compat-slow.service", SLOW_START).await;

    run_python(c.bus_address(), "bluechi_compat.py", &[]).await;
    let leader: String = a
        .get_property(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Leader")
        .await;
    run_python(b.bus_address(), "bluechi_standby.py", &[&leader]).await;
    c.down().await;
}
