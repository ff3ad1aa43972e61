//! Discovery on real systemd nodes: `droverctl where` lists exactly the
//! nodes where a unit is active, with its health; a node whose agent is
//! killed is absent by default, shown stale with `--stale`, fresh again
//! once it registers, and gone from `--stale` once `StaleRetention` ran out
//! (the manager's log line says when); `io.drover.Controller.Where` refuses
//! garbage with `InvalidArgs` and keeps answering. Rows carry the ports a
//! unit declares (`[X-Drover]` `Port=`/`Ports=`), changed by a drop-in and
//! a daemon-reload, told again after the agent restarts.

use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use nix::sys::signal::Signal;
use std::collections::HashMap;
use std::time::Duration;

const WEB: &str = "web.service";
/// Long enough for a registration on a loaded 2-core machine.
const T: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_millis(50);

/// web with a check that passes (node1) and without one (the others).
const WEB_CHECKED: &str = "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n\
                           HealthCmd=/bin/true\nHealthInterval=100ms\nHealthStartupInterval=100ms\n";
const WEB_PLAIN: &str = "[Service]\nExecStart=/bin/sleep 600\n";
/// web that fails at once (a failed unit stays loaded: `--all` lists it).
const WEB_FAILING: &str = "[Service]\nExecStart=/bin/false\n";

/// `droverctl --json where ARGS`: (exit code, complete, rows by node).
async fn where_(c: &TestCluster, args: &[&str]) -> (i32, bool, Vec<serde_json::Value>) {
    let mut argv = vec!["--json", "where"];
    argv.extend_from_slice(args);
    let out = c.run(&argv).await;
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    (out.code, v["complete"].as_bool().unwrap_or(false), rows)
}

fn nodes_of(rows: &[serde_json::Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_rows(
    c: &TestCluster,
    args: &[&str],
    what: &str,
    ok: impl Fn(&[serde_json::Value]) -> bool,
) {
    if let Err(e) = poll(T, EVERY, what, || async { ok(&where_(c, args).await.2) }).await {
        panic!("{e:#} (last: {:?})", where_(c, args).await);
    }
}

/// Waits for a line of the manager's log that holds every one of `parts`.
async fn manager_logged(c: &TestCluster, parts: &[&str]) {
    let path = c.log_path("manager");
    let what = format!("manager log line with {parts:?}");
    poll(T, EVERY, &what, || async {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .any(|l| parts.iter().all(|p| l.contains(p)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_lists_active_nodes_keeps_stale_ones_and_forgets_them_after_the_retention() {
    let mut opts = drover_sandbox::ClusterOptions::with_nodes(3);
    opts.manager_extra_config = "[drover-manager]\nStaleRetention=4s\n".into();
    let mut c = TestCluster::with(opts).await;
    c.install("node1", WEB, WEB_CHECKED).await;
    c.install("node2", WEB, WEB_FAILING).await;
    c.install("node3", WEB, WEB_PLAIN).await;
    c.systemctl("node2", &["start", WEB]).await;
    c.wait_state("node2", WEB, "failed", T).await;
    c.systemctl_ok("node1", &["start", WEB]).await;
    c.systemctl_ok("node3", &["start", WEB]).await;

    // The first question indexes web and answers from the agents' replays.
    let (code, complete, rows) = where_(&c, &["web"]).await;
    assert_eq!(nodes_of(&rows), ["node1", "node3"], "{rows:?}");
    assert_eq!(code, 0);
    assert!(complete, "every configured node registered");
    for r in &rows {
        assert_eq!(
            (r["active_state"].as_str(), r["sub_state"].as_str()),
            (Some("active"), Some("running"))
        );
        assert_eq!(r["stale"].as_bool(), Some(false));
        assert!(r["since_usec"].as_u64().unwrap() > 0);
        assert!(!r["address"].as_str().unwrap().is_empty(), "{r}");
    }
    assert_eq!(rows[1]["health"].as_str(), Some("none"));
    wait_rows(&c, &["web", "--healthy"], "node1 healthy", |r| {
        nodes_of(r) == ["node1", "node3"] && r[0]["health"] == "healthy"
    })
    .await;
    // --all shows node2's failed web; a unit nowhere exits 1.
    let (_, _, all) = where_(&c, &["web", "--all"]).await;
    assert_eq!(nodes_of(&all), ["node1", "node2", "node3"]);
    assert_eq!(all[1]["active_state"].as_str(), Some("failed"));
    let out = c.run(&["where", "nothing"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (1, ""), "{out:?}");
    let (_, _, one) = where_(&c, &["web", "--node", "node[3-9]"]).await;
    assert_eq!(nodes_of(&one), ["node3"]);

    // A change after indexing is seen without asking the nodes.
    c.install("node2", WEB, WEB_PLAIN).await;
    c.systemctl_ok("node2", &["start", WEB]).await;
    wait_rows(&c, &["web"], "node2 listed", |r| nodes_of(r).len() == 3).await;
    c.systemctl_ok("node2", &["stop", WEB]).await;
    wait_rows(&c, &["web"], "node2 gone", |r| {
        nodes_of(r) == ["node1", "node3"]
    })
    .await;

    // node3's agent killed: absent by default, stale with --stale.
    c.signal_agent("node3", Signal::SIGKILL).unwrap();
    c.wait_status("node3", "offline", T).await;
    let (_, _, rows) = where_(&c, &["web"]).await;
    assert_eq!(nodes_of(&rows), ["node1"]);
    let (code, _, rows) = where_(&c, &["web", "--stale"]).await;
    assert_eq!(
        (code, nodes_of(&rows)),
        (0, vec!["node1".to_owned(), "node3".to_owned()])
    );
    assert_eq!(rows[1]["stale"].as_bool(), Some(true));
    assert_eq!(
        rows[1]["active_state"].as_str(),
        Some("active"),
        "last good state"
    );
    let table = c.ctl_ok(&["where", "web", "--stale"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.contains("node3") && l.contains("stale")),
        "{table}"
    );

    // Back: fresh again.
    c.start_agent("node3").await.unwrap();
    c.wait_status("node3", "online", T).await;
    wait_rows(&c, &["web"], "node3 fresh", |r| {
        nodes_of(r) == ["node1", "node3"]
    })
    .await;
    let (_, _, rows) = where_(&c, &["web", "--stale"]).await;
    assert_eq!(rows[1]["stale"].as_bool(), Some(false));

    // Killed again: stale until the retention runs out, then gone.
    c.signal_agent("node3", Signal::SIGKILL).unwrap();
    c.wait_status("node3", "offline", T).await;
    let (_, _, rows) = where_(&c, &["web", "--stale"]).await;
    assert_eq!(nodes_of(&rows), ["node1", "node3"]);
    manager_logged(&c, &["node node3: 1 stale unit record(s) expired"]).await;
    let (_, _, rows) = where_(&c, &["web", "--stale"]).await;
    assert_eq!(nodes_of(&rows), ["node1"]);
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_refuses_garbage_and_keeps_answering() {
    let c = TestCluster::with_units(1, &[("node1", WEB, WEB_PLAIN)]).await;
    c.systemctl_ok("node1", &["start", WEB]).await;
    let api = c.api().await;
    let proxy = api.proxy(CONTROLLER_PATH, "io.drover.Controller").await;
    let call = |unit: String, opts: HashMap<String, zbus::Variant<'static>>| {
        let proxy = proxy.clone();
        async move {
            proxy
                .call::<_, _, (Vec<drover_bus::client::WhereTuple>, bool)>("Where", &(unit, opts))
                .await
        }
    };
    let opt = |k: &str, v: zbus::Variant<'static>| HashMap::from([(k.to_owned(), v)]);
    let huge_glob = format!("node*{}", "[a-z]".repeat(10_000));
    let cases: Vec<(String, HashMap<String, zbus::Variant<'static>>)> = vec![
        ("".into(), HashMap::new()),
        ("*".into(), HashMap::new()),
        ("web".into(), HashMap::new()),
        ("../x.service".into(), HashMap::new()),
        (format!("{}.service", "a".repeat(300)), HashMap::new()),
        ("web\u{1}.service".into(), HashMap::new()),
        (WEB.into(), opt("colour", zbus::Variant::Bool(true))),
        (WEB.into(), opt("healthy", zbus::Variant::from("yes"))),
        (WEB.into(), opt("stale", zbus::Variant::U32(1))),
        (WEB.into(), opt("nodes", zbus::Variant::Bool(true))),
        (WEB.into(), opt("nodes", zbus::Variant::from("a**"))),
        (WEB.into(), opt("nodes", zbus::Variant::from(huge_glob))),
    ];
    for (unit, opts) in cases {
        let shown = format!("{:.40} {opts:?}", unit.escape_default());
        let err = call(unit, opts).await.expect_err(&shown);
        assert_eq!(
            error_of(&err).0,
            "org.freedesktop.DBus.Error.InvalidArgs",
            "{shown}: {err}"
        );
    }
    // Nothing changed: the same question still gets the right answer.
    let (rows, complete) = call(WEB.into(), opt("nodes", zbus::Variant::from("node*")))
        .await
        .unwrap();
    assert!(complete);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("node1", "active")
    );
    // droverctl refuses a bad unit name as a usage error before any call.
    let out = c.run(&["where", "bad/unit"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    c.down().await;
}

/// The ports of `node`'s row of `where web`, as (name, port).
async fn row_ports(c: &TestCluster, node: &str) -> Vec<(String, u64)> {
    let (_, _, rows) = where_(c, &["web"]).await;
    rows.iter()
        .filter(|r| r["node"] == node)
        .flat_map(|r| r["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["port"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

async fn wait_ports(c: &TestCluster, node: &str, want: &[(&str, u64)]) {
    let want: Vec<(String, u64)> = want.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect();
    let what = format!("ports {want:?} on {node}");
    if let Err(e) = poll(T, EVERY, &what, || async {
        row_ports(c, node).await == want
    })
    .await
    {
        panic!("{e:#} (last: {:?})", row_ports(c, node).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_carry_the_declared_ports_through_reloads_and_reconnects() {
    let mut c = TestCluster::start(1).await;
    c.install(
        "node1",
        WEB,
        "[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\nPort=8080\nPorts=admin:9090\n",
    )
    .await;
    c.systemctl_ok("node1", &["start", WEB]).await;
    wait_ports(&c, "node1", &[("", 8080), ("admin", 9090)]).await;
    // Changed in the file (a daemon-reload); garbage takes them away and
    // leaves health alone.
    let web = |keys: &str| format!("[Service]\nExecStart=/bin/sleep 600\n[X-Drover]\n{keys}");
    c.install("node1", WEB, &web("Port=8080\nPorts=http:80\n"))
        .await;
    wait_ports(&c, "node1", &[("", 8080), ("http", 80)]).await;
    c.install("node1", WEB, &web("Port=eighty\n")).await;
    wait_ports(&c, "node1", &[]).await;
    let (_, _, rows) = where_(&c, &["web"]).await;
    assert_eq!(rows[0]["health"], "none", "{rows:?}");
    c.install("node1", WEB, &web("Port=8081\nPorts=admin:9090\n"))
        .await;
    wait_ports(&c, "node1", &[("", 8081), ("admin", 9090)]).await;
    // A new session of the agent tells them again.
    c.stop_agent("node1").await.unwrap();
    c.wait_status("node1", "offline", T).await;
    c.start_agent("node1").await.unwrap();
    c.wait_status("node1", "online", T).await;
    wait_ports(&c, "node1", &[("", 8081), ("admin", 9090)]).await;
    c.down().await;
}
