//! Compatibility proof: BlueChi's own Python bindings (PyPI `bluechi`, on
//! dasbus, which builds its proxies from our Introspect XML) drive drover.
//!
//! Needs Debian's python3-dasbus and the `bluechi` package in
//! target/pylib (`make pydeps`; `.ci/run` and `make test` do it).

mod common;

use common::*;
use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_python_bindings_drive_drover() {
    let pylib = workspace().join("target/pylib");
    assert!(
        pylib.join("bluechi/api.py").exists(),
        "BlueChi's Python bindings are missing from {}: run `make pydeps`",
        pylib.display()
    );
    let cluster = cluster(2).await;
    cluster
        .install_unit("node1", "compat-ok.service", ONESHOT_OK)
        .await
        .unwrap();
    cluster
        .install_unit("node1", "compat-slow.service", SLOW_START)
        .await
        .unwrap();

    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(workspace().join("tests/python/bluechi_compat.py"))
        .arg(cluster.bus_address())
        .env("PYTHONPATH", &pylib)
        .output()
        .await
        .expect("python3 runs");
    let (so, se) = (stdout(&out), stderr(&out));
    assert!(
        out.status.success(),
        "python bindings check failed:\n{so}\n{se}"
    );
    assert!(so.contains("all checks passed"), "{so}");
    cluster.down().await.unwrap();
}

/// BlueChi's `Monitor` (create_monitor, subscribe, on_unit_state_changed on a
/// dasbus EventLoop) and the Node members (properties, unit files through
/// `bluechi.ext.Unit`, kill, reset-failed, log levels) against the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_python_monitor_and_node_api_drive_drover() {
    let pylib = workspace().join("target/pylib");
    assert!(
        pylib.join("bluechi/api.py").exists(),
        "BlueChi's Python bindings are missing from {}: run `make pydeps`",
        pylib.display()
    );
    let cluster = cluster(2).await;
    cluster
        .install_unit("node1", "pyweb.service", SLEEPER)
        .await
        .unwrap();
    cluster
        .install_unit(
            "node1",
            "pyinst.service",
            "[Service]\nExecStart=/bin/sleep 600\n[Install]\nWantedBy=default.target\n",
        )
        .await
        .unwrap();

    let run = tokio::process::Command::new("/usr/bin/python3")
        .arg(workspace().join("tests/python/bluechi_monitor_node.py"))
        .arg(cluster.bus_address())
        .env("PYTHONPATH", &pylib)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("the python check finishes")
        .expect("python3 runs");
    let (so, se) = (stdout(&out), stderr(&out));
    assert!(
        out.status.success(),
        "python monitor/node check failed:\n{so}\n{se}"
    );
    assert!(so.contains("all checks passed"), "{so}");
    cluster.down().await.unwrap();
}
