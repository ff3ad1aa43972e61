//! Issue 14: what one large node or one large call must not break, on real
//! systemd nodes. A node with 2,500 loaded units (a `ListUnits` reply well
//! over the 1 MiB frame cap) lists in full, alone and fleet-wide.

use drover_testkit::prelude::*;

const UNITS: usize = 2500;

/// Writes `UNITS` oneshot units with long descriptions on `node`, and a
/// target ordered after all of them: starting the target loads every one
/// (inactive), so systemd's `ListUnits` carries them all.
async fn load_many_units(c: &TestCluster, node: &str) {
    let script = format!(
        "d=\"$XDG_CONFIG_HOME/systemd/user\"; mkdir -p \"$d\"; desc=$(printf 'x%.0s' $(seq 400)); \
         after=''; for i in $(seq -w 1 {UNITS}); do \
           printf '[Unit]\\nDescription=many %s %s\\n[Service]\\nType=oneshot\\nExecStart=/bin/true\\n' \"$i\" \"$desc\" > \"$d/many-$i.service\"; \
           after=\"$after many-$i.service\"; \
         done; printf '[Unit]\\nAfter=%s\\n' \"$after\" > \"$d/many.target\""
    );
    let run = c.exec(node, &["sh", "-c", &script]).await;
    assert_eq!(run.code, 0, "{run:?}");
    c.systemctl_ok(node, &["daemon-reload"]).await;
    c.systemctl_ok(node, &["start", "many.target"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_thousands_of_units_lists_in_full() {
    let c = TestCluster::start(2).await;
    load_many_units(&c, "node2").await;

    let (code, out, err) = c.run(&["list-units", "node2"]).await.parts();
    assert_eq!(code, 0, "{err}");
    let many = out.lines().filter(|l| l.contains("many-")).count();
    assert_eq!(many, UNITS, "every unit of node2 is listed");

    // Fleet-wide: both nodes, nothing left out, exit 0.
    let (code, out, err) = c.run(&["list-units"]).await.parts();
    assert_eq!(code, 0, "{err}");
    assert!(err.trim().is_empty(), "{err}");
    let many = out
        .lines()
        .filter(|l| l.trim_start().starts_with("node2") && l.contains("many-"))
        .count();
    assert_eq!(many, UNITS);
    assert!(out.lines().any(|l| l.trim_start().starts_with("node1")));
    c.down().await;
}
