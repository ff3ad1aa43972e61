//! Issue 14: what one large node or one large call must not break, on real
//! systemd nodes. A node with 2,500 loaded units (a `ListUnits` reply well
//! over the 1 MiB frame cap), and one with 20,000, list in full, alone and
//! fleet-wide.

use drover_testkit::api::job_call;
use drover_testkit::prelude::*;

const UNITS: usize = 2500;

/// Writes `units` oneshot units with descriptions of `desc_len` characters on
/// `node`, and a target ordered after all of them: starting the target loads
/// every one (inactive), so systemd's `ListUnits` carries them all.
async fn load_many_units(c: &TestCluster, node: &str, units: usize, desc_len: usize) {
    let script = format!(
        "d=\"$XDG_CONFIG_HOME/systemd/user\"; mkdir -p \"$d\"; desc=$(printf 'x%.0s' $(seq {desc_len})); \
         echo '[Unit]' > \"$d/many.target\"; \
         for i in $(seq -w 1 {units}); do \
           printf '[Unit]\\nDescription=many %s %s\\n[Service]\\nType=oneshot\\nExecStart=/bin/true\\n' \"$i\" \"$desc\" > \"$d/many-$i.service\"; \
           echo \"After=many-$i.service\"; \
         done >> \"$d/many.target\""
    );
    let run = c.exec(node, &["sh", "-c", &script]).await;
    assert_eq!(run.code, 0, "{run:?}");
    // systemd loads the units inside its answers to Reload and StartUnit; for
    // 20,000 units on a loaded machine that outlasts sd-bus's default 25 s
    // method timeout, and systemctl gave up while systemd went on. libsystemd
    // reads the timeout from SYSTEMD_BUS_TIMEOUT: give it the time the work takes.
    for args in [&["daemon-reload"][..], &["start", "many.target"]] {
        let mut argv = vec!["env", "SYSTEMD_BUS_TIMEOUT=600", "systemctl", "--user"];
        argv.extend_from_slice(args);
        let run = c.exec(node, &argv).await;
        assert_eq!(run.code, 0, "systemctl {args:?}: {run:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_thousands_of_units_lists_in_full() {
    let c = TestCluster::start(2).await;
    load_many_units(&c, "node2", UNITS, 400).await;

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

/// Issue 14 item 4's figure: a node with 20,000 loaded units lists in full,
/// alone and fleet-wide (a `ListUnits` reply of about 6 MB, six times the
/// 1 MiB frame cap, so it crosses the link in parts). Not `ListUnitFiles`:
/// systemd itself (252, `--user`) did not answer that for 20,000 files in one
/// directory within 600 s on the test VM. The phases are timed
/// and printed, so a run shows where the time goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_20000_units_lists_in_full() {
    const MANY: usize = 20_000;
    let began = std::time::Instant::now();
    let c = TestCluster::start(2).await;
    let up = began.elapsed();
    load_many_units(&c, "node2", MANY, 100).await;
    let loaded = began.elapsed();

    let (code, out, err) = c.run(&["list-units", "node2"]).await.parts();
    assert_eq!(code, 0, "{err}");
    let many = out.lines().filter(|l| l.contains("many-")).count();
    assert_eq!(many, MANY, "every unit of node2 is listed");
    let listed = began.elapsed();

    let (code, out, err) = c.run(&["list-units"]).await.parts();
    assert_eq!(code, 0, "{err}");
    assert!(err.trim().is_empty(), "{err}");
    let many = out
        .lines()
        .filter(|l| l.trim_start().starts_with("node2") && l.contains("many-"))
        .count();
    assert_eq!(many, MANY);
    assert!(out.lines().any(|l| l.trim_start().starts_with("node1")));
    let fleet = began.elapsed();

    eprintln!(
        "20,000 units: cluster up {up:.1?}, units written and loaded {:.1?}, \
         list-units node2 {:.1?}, list-units (fleet) {:.1?}, total {fleet:.1?}",
        loaded - up,
        listed - loaded,
        fleet - listed
    );
    c.down().await;
}

/// Issue 14 item 2 on real systemd: calls whose request frame would exceed the
/// 1 MiB cap (the three reproductions) are refused to their caller with
/// `LimitsExceeded`, and nothing else notices: the node stays online, its
/// session is the same one, and a job running meanwhile ends `done`, not
/// `disconnected` (before, each such call dropped the node's session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_calls_are_refused_and_the_node_never_notices() {
    let quick_slow = "[Service]\nType=oneshot\nExecStart=/bin/sleep 3\n";
    let c = TestCluster::with_units(2, &[("node2", "slow.service", quick_slow)]).await;
    let (_api, node, mut jobs) = c.jobs_on("node2").await;
    let path = job_call(&node, "StartUnit", "slow.service").await.unwrap();
    jobs.job_new(&path, std::time::Duration::from_secs(10))
        .await
        .unwrap();

    let four_kb = format!("/etc/systemd/user/{}.service", "p".repeat(4000));
    let paths: Vec<&str> = (0..300).map(|_| four_kb.as_str()).collect();
    let two_mib = "x".repeat(2 << 20);
    let description = || vec![("Description", zbus::Variant::from(two_mib.as_str()))];
    let aux: Vec<(&str, Vec<(&str, zbus::Variant<'_>)>)> = Vec::new();
    let refused = [
        (
            "EnableUnitFiles",
            node.call_method("EnableUnitFiles", &(paths.clone(), false, false))
                .await
                .err(),
        ),
        (
            "SetUnitProperties",
            node.call_method("SetUnitProperties", &("slow.service", true, description()))
                .await
                .err(),
        ),
        (
            "StartTransientUnit",
            node.call_method(
                "StartTransientUnit",
                &("big.service", "replace", description(), aux.clone()),
            )
            .await
            .err(),
        ),
    ];
    for (method, err) in refused {
        let err = err
            .unwrap_or_else(|| panic!("{method} went through"))
            .to_string();
        assert!(
            err.contains("org.freedesktop.DBus.Error.LimitsExceeded") && err.contains("1048576"),
            "{method}: {err}"
        );
    }

    // The running job was never cut off, and the node never left.
    let removed = jobs
        .removed(&path, std::time::Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(removed.result, "done");
    let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
    assert!(!log.contains(" disconnected: "), "{log}");
    c.wait_status("node2", "online", std::time::Duration::from_secs(1))
        .await;
    c.down().await;
}
