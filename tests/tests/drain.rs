//! Drain and undrain on real systemd nodes: `droverctl drain` takes a node,
//! or a unit on it, out of service while the units keep running (asked of
//! each node's systemd), `droverctl drained` and `ListDrained` show it, and
//! it survives a restart of the manager process (kept in the state file of
//! the sandbox manager's own `StateDirectory=`); `undrain` puts it back, also
//! across a restart. Garbage: bad and unknown node names, bad unit names,
//! lists over the caps, and a garbage state file (one log line, an empty
//! start, the file kept aside, the manager working).

use drover_bus::bluechi::DROVER_CONTROLLER_IFACE;
use drover_protocol::error_names::{INVALID_ARGS, LIMITS_EXCEEDED};
use drover_testkit::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

const WEB: &str = "web.service";
const ONLINE: Duration = Duration::from_secs(30);

fn state_file(c: &TestCluster) -> PathBuf {
    c.dir().join("manager-state").join("drained.json")
}

async fn list_drained(api: &Api) -> Vec<(String, String)> {
    api.call(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "ListDrained", &())
        .await
        .expect("ListDrained")
}

async fn drain(api: &Api, method: &str, node: &str, units: &[&str]) -> zbus::Result<()> {
    api.call(
        CONTROLLER_PATH,
        DROVER_CONTROLLER_IFACE,
        method,
        &(node, units.to_vec()),
    )
    .await
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, u)| ((*n).to_owned(), (*u).to_owned()))
        .collect()
}

/// Stops and starts the manager process; returns once every node is back.
async fn restart_manager(c: &mut TestCluster) {
    c.stop_manager().await.expect("manager stops");
    c.start_manager().await.expect("manager starts");
    for n in ["node1", "node2"] {
        c.wait_status(n, "online", ONLINE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_units_keep_running_and_the_state_survives_restarts() {
    let mut c =
        TestCluster::with_units(2, &[("node1", WEB, SLEEPER), ("node2", WEB, SLEEPER)]).await;
    for n in ["node1", "node2"] {
        c.systemctl_ok(n, &["start", WEB]).await;
    }

    assert_eq!(c.ctl_ok(&["drain", "node1"]).await, "");
    assert_eq!(c.ctl_ok(&["drain", "node2", "web"]).await, "");
    // Again: not an error, nothing new.
    c.ctl_ok(&["drain", "node2", "web"]).await;
    let json: serde_json::Value =
        serde_json::from_str(&c.ctl_ok(&["--json", "drained"]).await).unwrap();
    assert_eq!(
        json,
        serde_json::json!([{"node": "node1", "unit": ""}, {"node": "node2", "unit": WEB}])
    );
    let table = c.ctl_ok(&["drained"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.split('|').map(str::trim).eq(["node1", "*"])),
        "{table}"
    );
    // Nothing was stopped.
    for n in ["node1", "node2"] {
        assert_eq!(c.state(n, WEB).await, "active", "{WEB} on {n}");
    }
    assert!(state_file(&c).exists(), "kept in the state directory");

    restart_manager(&mut c).await;
    let api = c.api().await;
    assert_eq!(
        list_drained(&api).await,
        pairs(&[("node1", ""), ("node2", WEB)]),
        "after a restart"
    );

    // A unit of a node drained as a whole stays drained; the node's undrain
    // takes its units too.
    c.ctl_ok(&["drain", "node1", WEB]).await;
    c.ctl_ok(&["undrain", "node1", WEB]).await;
    assert_eq!(
        list_drained(&api).await,
        pairs(&[("node1", ""), ("node2", WEB)])
    );
    c.ctl_ok(&["drain", "node1", "other.socket"]).await;
    assert_eq!(c.ctl_ok(&["undrain", "node1"]).await, "");
    assert_eq!(c.ctl_ok(&["undrain", "node2", WEB]).await, "");
    assert!(list_drained(&api).await.is_empty());
    assert_eq!(c.ctl_ok(&["--json", "drained"]).await.trim(), "[]");

    restart_manager(&mut c).await;
    assert!(
        list_drained(&c.api().await).await.is_empty(),
        "undrain survives a restart too"
    );
    for n in ["node1", "node2"] {
        assert_eq!(c.state(n, WEB).await, "active", "{WEB} on {n}");
    }
    c.down().await;
}

/// `droverctl --json where web ARGS`: (exit code, (node, drained) rows).
async fn where_web(c: &TestCluster, args: &[&str]) -> (i32, Vec<(String, bool)>) {
    let mut argv = vec!["--json", "where", "web"];
    argv.extend_from_slice(args);
    let out = c.run(&argv).await;
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().to_owned(),
                r["drained"].as_bool().unwrap(),
            )
        })
        .collect();
    (out.code, rows)
}

fn rows(list: &[(&str, bool)]) -> Vec<(String, bool)> {
    list.iter().map(|(n, d)| ((*n).to_owned(), *d)).collect()
}

/// Drained rows leave `where` (and so DNS) while the units run; with
/// `--drained` they are listed, marked; a drain of another unit or of
/// nothing leaves them alone; undrain puts them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_rows_leave_where_and_come_back() {
    let c = TestCluster::with_units(
        3,
        &[
            ("node1", WEB, SLEEPER),
            ("node2", WEB, SLEEPER),
            ("node3", WEB, SLEEPER),
        ],
    )
    .await;
    for n in ["node1", "node2", "node3"] {
        c.systemctl_ok(n, &["start", WEB]).await;
    }
    let all_in = rows(&[("node1", false), ("node2", false), ("node3", false)]);
    assert_eq!(where_web(&c, &[]).await, (0, all_in.clone()));

    c.ctl_ok(&["drain", "node1"]).await;
    c.ctl_ok(&["drain", "node2", "web"]).await;
    c.ctl_ok(&["drain", "node3", "other.service"]).await;
    assert_eq!(where_web(&c, &[]).await, (0, rows(&[("node3", false)])));
    assert_eq!(
        where_web(&c, &["--healthy"]).await,
        (0, rows(&[("node3", false)]))
    );
    assert_eq!(
        where_web(&c, &["--drained"]).await,
        (
            0,
            rows(&[("node1", true), ("node2", true), ("node3", false)])
        )
    );
    let table = c.ctl_ok(&["where", "web", "--drained"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("node2") && l.contains("drained")),
        "{table}"
    );
    // Every instance drained: nowhere in service, exit 1.
    c.ctl_ok(&["drain", "node3", "web"]).await;
    assert_eq!(where_web(&c, &[]).await, (1, vec![]));
    for n in ["node1", "node2", "node3"] {
        assert_eq!(c.state(n, WEB).await, "active", "{WEB} on {n}");
        c.ctl_ok(&["undrain", n]).await;
    }
    assert_eq!(where_web(&c, &[]).await, (0, all_in));
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_arguments_change_nothing() {
    let c = TestCluster::start(2).await;
    let api = c.api().await;
    drain(&api, "Drain", "node2", &[WEB]).await.unwrap();
    let before = list_drained(&api).await;

    let long_node = "n".repeat(65);
    let long_unit = format!("{}.service", "u".repeat(300));
    for (method, node, units) in [
        ("Drain", "bad_name", vec![]),
        ("Drain", "", vec![]),
        ("Drain", long_node.as_str(), vec![]),
        ("Drain", "node9", vec![]),
        ("Undrain", "node9", vec![]),
        ("Drain", "node1", vec!["web"]),
        ("Drain", "node1", vec![WEB, "a b.service"]),
        ("Drain", "node1", vec![long_unit.as_str()]),
        ("Undrain", "node2", vec!["web.nope"]),
        ("Drain", "node1", vec!["../x.service"]),
    ] {
        let e = drain(&api, method, node, &units).await.unwrap_err();
        let (name, msg) = error_of(&e);
        assert_eq!(name, INVALID_ARGS, "{method}({node:?}, {units:?}): {msg}");
        assert!(!msg.is_empty());
    }
    // Wrong argument types.
    let e = api
        .call::<_, ()>(
            CONTROLLER_PATH,
            DROVER_CONTROLLER_IFACE,
            "Drain",
            &("node1", 5u32),
        )
        .await
        .unwrap_err();
    assert_eq!(error_of(&e).0, INVALID_ARGS);

    // Over the per-call cap: refused as a whole.
    let many: Vec<String> = (0..1025).map(|i| format!("u{i}.service")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let e = drain(&api, "Drain", "node1", &many).await.unwrap_err();
    assert_eq!(error_of(&e).0, LIMITS_EXCEEDED, "{e}");
    assert_eq!(list_drained(&api).await, before, "nothing changed");

    // Up to the total cap (16384 entries), then one more is refused.
    let full: Vec<String> = (0..1024).map(|i| format!("u{i}.service")).collect();
    let full: Vec<&str> = full.iter().map(String::as_str).collect();
    for (node, slice) in [("node1", &full[..]), ("node2", &full[..1023])] {
        drain(&api, "Drain", node, slice).await.unwrap();
    }
    // 1 + 1024 + 1023 = 2048 entries; the rest of the cap is filled with
    // other units of the two nodes.
    let mut total = list_drained(&api).await.len();
    let mut round = 0;
    while total < 16_384 {
        let names: Vec<String> = (0..1024.min(16_384 - total))
            .map(|i| format!("r{round}-{i}.service"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let node = if round % 2 == 0 { "node1" } else { "node2" };
        drain(&api, "Drain", node, &names).await.unwrap();
        total += names.len();
        round += 1;
    }
    assert_eq!(list_drained(&api).await.len(), 16_384);
    let e = drain(&api, "Drain", "node1", &["one-more.service"])
        .await
        .unwrap_err();
    let (name, msg) = error_of(&e);
    assert_eq!(name, LIMITS_EXCEEDED, "{msg}");
    assert!(msg.contains("16384"), "{msg}");
    assert_eq!(list_drained(&api).await.len(), 16_384, "nothing changed");
    // Undraining still works at the cap.
    drain(&api, "Undrain", "node1", &[]).await.unwrap();
    assert!(list_drained(&api).await.iter().all(|(n, _)| n == "node2"));
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_state_file_is_an_empty_start() {
    let mut c = TestCluster::start(2).await;
    c.ctl_ok(&["drain", "node1"]).await;
    let file = state_file(&c);
    for (round, garbage) in [
        &b"{\"format\":1,\"drained\":[[\"node_1\",\"\"]]}"[..],
        b"\x00\xff garbage",
    ]
    .into_iter()
    .enumerate()
    {
        c.stop_manager().await.unwrap();
        std::fs::write(&file, garbage).unwrap();
        c.start_manager().await.unwrap();
        for n in ["node1", "node2"] {
            c.wait_status(n, "online", ONLINE).await;
        }
        let api = c.api().await;
        assert!(list_drained(&api).await.is_empty());
        let log = std::fs::read_to_string(c.log_path("manager")).unwrap();
        // The log is appended across restarts: one line per garbage start.
        assert_eq!(
            log.matches("is not a drained-state file").count(),
            round + 1,
            "the manager says why it starts empty"
        );
        assert_eq!(
            std::fs::read(file.with_extension("json.bad")).unwrap(),
            garbage,
            "the garbage is kept aside"
        );
        // The manager works, and saves a good file again.
        c.ctl_ok(&["drain", "node2", WEB]).await;
        assert_eq!(list_drained(&api).await, pairs(&[("node2", WEB)]));
    }
    c.down().await;
}
