//! Compatibility proof: BlueChi's own Python bindings (PyPI `bluechi`, on
//! dasbus, which builds its proxies from our Introspect XML) drive drover.
//!
//! Needs Debian's python3-dasbus and the `bluechi` package in
//! target/pylib (`make pydeps`; `.ci/run` and `make test` do it).

use drover_testkit::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Installs `units` on node1 of a two-node cluster, then runs `tests/python/SCRIPT`
/// with BlueChi's bindings against the cluster's bus and checks that it passed.
async fn python_check(units: &[(&str, &str)], script: &str) {
    let pylib = workspace().join("target/pylib");
    assert!(
        pylib.join("bluechi/api.py").exists(),
        "BlueChi's Python bindings are missing from {}: run `make pydeps`",
        pylib.display()
    );
    let c = TestCluster::start(2).await;
    for (name, text) in units {
        c.install("node1", name, text).await;
    }
    let run = tokio::process::Command::new("/usr/bin/python3")
        .arg(workspace().join("tests/python").join(script))
        .arg(c.bus_address())
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
