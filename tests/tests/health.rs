//! Health through the whole fleet, on real systemd nodes: a unit's check
//! declared in its `[X-Drover]` section is run by its node's agent, and the
//! verdict reaches the manager, `droverctl health`/`is-healthy`/`status`, a
//! BlueChi monitor (a property change of `io.drover.Health`) and drover's
//! tagged stream (`UnitsChanged` rows of kind `health`), over many down → up
//! cycles; a cross-node dependency waits until its target is healthy, and a
//! target that never gets healthy fails the proxy at its timeout with the
//! reason; `droverctl monitor` and `status -w` follow health without being
//! asked again. What is asserted is what a user checks: `droverctl` output,
//! unit states on both nodes, what the proxy unit printed.

use drover_testkit::prelude::*;
use drover_testkit::process::TempDir;
use drover_testkit::wait::poll;
use std::path::Path;
use std::time::Duration;

const DB: &str = "db.service";
const PROXY: &str = "drover-proxy@node2_db.service";
const NEED_DB: &str = "need-db.service";
/// Long enough for a cross-node start on a loaded 2-core machine.
const T: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_millis(50);
const CYCLES: usize = 5;

/// db.service: runs, and is healthy while `flag` exists (checked every
/// 100 ms, unhealthy after `retries` failures in a row).
fn db_unit(flag: &Path, retries: u32) -> String {
    format!(
        "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n\
         HealthCmd=/bin/sh -c 'test -e {} || {{ echo no flag; exit 1; }}'\n\
         HealthInterval=100ms\nHealthStartupInterval=100ms\nHealthRetries={retries}\n",
        flag.display()
    )
}

fn need_db(kind: &str) -> String {
    format!("[Unit]\n{kind}={PROXY}\nAfter={PROXY}\n[Service]\nExecStart=/bin/sleep 600\n")
}

/// `droverctl --json health node2 db`: (state, reason).
async fn health_of(c: &TestCluster, node: &str, unit: &str) -> (String, String) {
    let out = c.ctl_ok(&["--json", "health", node, unit]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (
        v[0]["state"].as_str().unwrap_or_default().to_owned(),
        v[0]["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn wait_health(c: &TestCluster, node: &str, unit: &str, want: &str) {
    let what = format!("{unit} on {node} is {want}");
    if let Err(e) = poll(T, EVERY, &what, || async {
        health_of(c, node, unit).await.0 == want
    })
    .await
    {
        panic!("{e:#} (last: {:?})", health_of(c, node, unit).await);
    }
}

fn set_flag(flag: &Path, on: bool) {
    if on {
        std::fs::write(flag, "").unwrap();
    } else {
        std::fs::remove_file(flag).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reaches_droverctl_and_monitors_over_many_down_up_cycles() {
    let tmp = TempDir::new("drover-health-fleet");
    let flag = tmp.join("ok");
    let c = TestCluster::start(2).await;
    c.install("node2", DB, &db_unit(&flag, 3)).await;
    // A BlueChi monitor, and one that follows drover's tagged stream.
    let mut bluechi = c.monitor().await;
    bluechi.subscribe("node2", DB).await.unwrap();
    let mut tagged = c.monitor().await;
    tagged.subscribe("node2", DB).await.unwrap();
    tagged.follow().await.unwrap();

    // A unit without a check is `none`; db before it runs has no verdict.
    let out = c.run(&["is-healthy", "node2", "nothing"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (1, "none\n"), "{out:?}");

    set_flag(&flag, true);
    c.systemctl_ok("node2", &["start", DB]).await;
    wait_health(&c, "node2", DB, "healthy").await;
    assert_eq!(c.run(&["is-healthy", "node2", "db"]).await.code, 0);

    for cycle in 0..CYCLES {
        set_flag(&flag, false);
        wait_health(&c, "node2", DB, "unhealthy").await;
        let (_, reason) = health_of(&c, "node2", DB).await;
        assert_eq!(reason, "exit status 1: no flag", "cycle {cycle}");
        let out = c.run(&["is-healthy", "node2", "db"]).await;
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (1, "unhealthy\n"),
            "cycle {cycle}"
        );
        set_flag(&flag, true);
        wait_health(&c, "node2", DB, "healthy").await;
        assert_eq!(
            c.run(&["is-healthy", "node2", "db"]).await.code,
            0,
            "cycle {cycle}"
        );
    }

    // The fleet-wide list, the table and the HEALTH columns.
    let all = c.ctl_ok(&["--json", "health"]).await;
    let v: serde_json::Value = serde_json::from_str(&all).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 1, "only db declares a check: {all}");
    assert_eq!(
        (rows[0]["node"].as_str(), rows[0]["unit"].as_str()),
        (Some("node2"), Some(DB))
    );
    assert!(rows[0]["since_usec"].as_u64().unwrap() > 0);
    let table = c.ctl_ok(&["health"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.contains("node2") && l.contains(DB) && l.contains("healthy")),
        "{table}"
    );
    let status = c.ctl_ok(&["status", "node2", "db"]).await;
    let row: Vec<&str> = status
        .lines()
        .nth(2)
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect();
    assert_eq!(row[0], DB);
    assert_eq!(row[6], "healthy", "{status}");
    let nodes = c.ctl_ok(&["--json", "status"]).await;
    let v: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    for node in v.as_array().unwrap() {
        let h = node["health"].as_str().unwrap();
        assert!(["healthy", "starting", "unhealthy"].contains(&h), "{nodes}");
    }

    // The tagged stream: one row per change, alternating, in tag order.
    let want = 1 + 2 * CYCLES;
    let health_rows = |evs: &[Ev]| -> Vec<(String, drover_protocol::ModTag)> {
        evs.iter()
            .filter_map(|e| match e {
                Ev::Changed(ch) if ch.kind == "health" => Some((ch.active.clone(), ch.tag)),
                _ => None,
            })
            .collect()
    };
    let is_health = |e: &Ev| matches!(e, Ev::Changed(ch) if ch.kind == "health");
    let verdicts_in = |evs: &[Ev]| {
        health_rows(evs)
            .into_iter()
            .filter(|(s, _)| s != "starting")
            .count()
    };
    while verdicts_in(tagged.since(0)) < want {
        tagged.expect("a health row", T, is_health).await.unwrap();
    }
    // Nothing more: unchanged results send nothing.
    tagged.settle(Duration::from_millis(500)).await;
    let rows = health_rows(tagged.since(0));
    let states: Vec<&str> = rows.iter().map(|(s, _)| s.as_str()).collect();
    // `starting` may come first (the unit's activation), then the verdicts.
    let verdicts: Vec<&str> = states
        .iter()
        .copied()
        .filter(|s| *s != "starting")
        .collect();
    assert_eq!(verdicts.len(), want, "{states:?}");
    for (i, s) in verdicts.iter().enumerate() {
        assert_eq!(
            *s,
            if i % 2 == 0 { "healthy" } else { "unhealthy" },
            "{states:?}"
        );
    }
    assert!(
        rows.windows(2).all(|w| w[1].1.succeeds(&w[0].1)),
        "tags rise: {rows:?}"
    );
    // The BlueChi monitor saw each change as a property change of io.drover.Health.
    bluechi
        .expect("a health property change", T, |e| {
            matches!(e, Ev::Props { unit, interface, keys, .. }
                if unit == DB && interface == "io.drover.Health"
                    && keys.iter().any(|k| k == "State"))
        })
        .await
        .unwrap();
    bluechi.settle(Duration::from_millis(300)).await;
    let props = bluechi
        .since(0)
        .iter()
        .filter(|e| matches!(e, Ev::Props { interface, .. } if interface == "io.drover.Health"))
        .count();
    assert!(
        props >= want,
        "{props} health changes seen by the BlueChi monitor"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_waits_until_its_target_is_healthy() {
    let tmp = TempDir::new("drover-health-proxy");
    let flag = tmp.join("ok");
    let c = TestCluster::start(2).await;
    c.install("node2", DB, &db_unit(&flag, 1)).await;
    c.install("node1", NEED_DB, &need_db("Wants")).await;
    c.systemctl_ok("node1", &["start", "--no-block", NEED_DB])
        .await;
    c.wait_state("node2", DB, "active", T).await;
    // Active, and its check failed: the manager knows it is unhealthy...
    wait_health(&c, "node2", DB, "unhealthy").await;
    // ...so the proxy still waits, and need-db with it.
    assert_eq!(c.state("node1", PROXY).await, "activating");
    assert_eq!(c.state("node1", NEED_DB).await, "inactive");
    set_flag(&flag, true);
    c.wait_state("node1", PROXY, "active", T).await;
    c.wait_state("node1", NEED_DB, "active", T).await;
    assert!(
        c.unit_log("node1", PROXY)
            .unwrap()
            .contains("db.service on node node2")
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_never_gets_healthy_fails_the_proxy_with_the_reason() {
    let tmp = TempDir::new("drover-health-never");
    let flag = tmp.join("never");
    let c = TestCluster::start(2).await;
    c.install("node2", DB, &db_unit(&flag, 1)).await;
    c.install("node1", NEED_DB, &need_db("Requires")).await;
    // A short start timeout for this proxy.
    let script = format!(
        "d=\"$XDG_CONFIG_HOME/systemd/user/{PROXY}.d\"; mkdir -p \"$d\"; \
         printf '[Service]\\nTimeoutStartSec=4\\n' > \"$d/timeout.conf\""
    );
    let run = c.exec("node1", &["sh", "-c", &script]).await;
    assert_eq!(run.code, 0, "{run:?}");
    c.systemctl_ok("node1", &["daemon-reload"]).await;
    let out = c.systemctl("node1", &["start", NEED_DB]).await;
    assert!(!out.success(), "need-db must not start: {out:?}");
    c.wait_state("node1", PROXY, "failed", T).await;
    assert_eq!(c.state("node2", DB).await, "active");
    let log = c.unit_log("node1", PROXY).unwrap();
    assert!(
        log.contains("db.service on node node2 is active but unhealthy: exit status 1: no flag"),
        "{log}"
    );
    c.down().await;
}

/// What a user watching the fleet sees without asking again: `droverctl
/// monitor` on `*` is told the current health of a unit it never saw change
/// (the replay, as for unit states), `status NODE UNIT -w` reprints when the
/// unit's health changes, and `status -w` when the node's own health does
/// (a failed unit makes systemd `degraded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_and_status_watches_follow_health() {
    let tmp = TempDir::new("drover-health-watch");
    let flag = tmp.join("ok");
    let c = TestCluster::start(2).await;
    c.install("node2", DB, &db_unit(&flag, 1)).await;
    c.install(
        "node2",
        "broken.service",
        "[Service]\nType=oneshot\nExecStart=/bin/false\n",
    )
    .await;
    set_flag(&flag, true);
    c.systemctl_ok("node2", &["start", DB]).await;
    wait_health(&c, "node2", DB, "healthy").await;

    // Nothing changes from here until the monitor has printed db's health:
    // what it prints is the replay of `*`.
    let mut mon = c.follow(&["monitor"]);
    let i = mon
        .expect_line("db's health in the replay", T, |l| {
            l == "\tUnit properties changed (Interface: io.drover.Health)"
        })
        .await
        .unwrap();
    assert_eq!(mon.seen[i - 1], "[node2] db.service", "{:?}", mon.seen);
    mon.expect_line("its state", T, |l| l == "\tState: healthy")
        .await
        .unwrap();
    assert!(mon.interrupt(T).await.unwrap().success());

    let health_column = |l: &str, unit: &str, want: &str| {
        let f: Vec<&str> = l.split('|').map(str::trim).collect();
        f.first() == Some(&unit) && f.get(6) == Some(&want)
    };
    let mut units = c.follow(&["status", "node2", "db", "-w"]);
    units
        .expect_line("db healthy", T, |l| health_column(l, DB, "healthy"))
        .await
        .unwrap();
    let node_row = |l: &str, want: &str| {
        let f: Vec<&str> = l.split('|').map(str::trim).collect();
        f.first() == Some(&"node2") && f.get(4) == Some(&want)
    };
    let mut nodes = c.follow(&["status", "-w"]);
    nodes
        .expect_line("node2 healthy", T, |l| node_row(l, "healthy"))
        .await
        .unwrap();

    set_flag(&flag, false);
    units
        .expect_line("db unhealthy, reprinted", T, |l| {
            health_column(l, DB, "unhealthy")
        })
        .await
        .unwrap();
    // The node's own health, from systemd's SystemState.
    let out = c.systemctl("node2", &["start", "broken.service"]).await;
    assert!(!out.success(), "{out:?}");
    nodes
        .expect_line("node2 degraded: unhealthy", T, |l| node_row(l, "unhealthy"))
        .await
        .unwrap();
    c.systemctl_ok("node2", &["reset-failed", "broken.service"])
        .await;
    nodes
        .expect_line("node2 healthy again", T, |l| node_row(l, "healthy"))
        .await
        .unwrap();
    assert!(units.interrupt(T).await.unwrap().success());
    assert!(nodes.interrupt(T).await.unwrap().success());
    c.down().await;
}
