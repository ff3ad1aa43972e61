//! Unit files written for Eclipse BlueChi on real systemd nodes: BlueChi's proxy names
//! (`bluechi-proxy@NODE_UNIT.service`) from drover's optional compatibility set
//! (`make install-bluechi-compat`; the sandbox's `bluechi_compat` option installs the same
//! templates), next to drover's own names.
//!
//! What a BlueChi user checks: their `Wants=`/`Requires=`/`BindsTo=` units start and stop
//! with the remote target, the proxy survives an agent restart, a unit written for BlueChi
//! and one written for drover hold the same target together (two references, `droverctl
//! proxies`), garbage names fail with the reason in the proxy unit's output, and the exact
//! `CreateProxy` call BlueChi's own helper makes is served (BlueChi's helper binary is not
//! available here, so it is exercised through that call's shape), and BlueChi's own
//! template text, running drover's helper under the name `bluechi-proxy`, works.
//!
//! Names: node1 requests, node2 is the target; the target always runs drover's
//! `drover-dep@UNIT` (BlueChi's `bluechi-dep@` is shipped only for unit files naming it).

use drover_bus::bluechi::{AGENT_BUS_NAME, AGENT_IFACE, AGENT_PATH};
use drover_sandbox::ClusterOptions;
use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use std::time::Duration;

const DB: &str = "db.service";
const BC_PROXY: &str = "bluechi-proxy@node2_db.service";
const DR_PROXY: &str = "drover-proxy@node2_db.service";
const DEP: &str = "drover-dep@db.service.service";
const BC_DEP: &str = "bluechi-dep@db.service";
const NEED_DB: &str = "need-db.service";
const NEED_DB_DROVER: &str = "need-db-drover.service";
/// Long enough for a cross-node start on a loaded 2-core CI machine.
const T: Duration = Duration::from_secs(20);

fn compat(nodes: usize) -> ClusterOptions {
    ClusterOptions {
        bluechi_compat: true,
        ..ClusterOptions::with_nodes(nodes)
    }
}

/// Waits until `unit` on `node` is `want`; the error shows both proxies' output and
/// the manager's proxy table.
async fn wait_state(c: &TestCluster, node: &str, unit: &str, want: &str) {
    if let Err(e) = c.try_wait_state(node, unit, want, T).await {
        let table = c.run(&["proxies"]).await;
        panic!(
            "{e:#}\n{BC_PROXY} printed: {:?}\n{DR_PROXY} printed: {:?}\ndroverctl proxies:\n{}{}",
            c.unit_log("node1", BC_PROXY).unwrap_or_default(),
            c.unit_log("node1", DR_PROXY).unwrap_or_default(),
            table.stdout,
            table.stderr
        );
    }
}

async fn start_ok(c: &TestCluster, node: &str, unit: &str) {
    let out = c.systemctl(node, &["start", unit]).await;
    assert!(
        out.success(),
        "systemctl start {unit} on {node} failed: {}\n{BC_PROXY} printed: {:?}",
        out.stderr,
        c.unit_log("node1", BC_PROXY).unwrap_or_default()
    );
}

/// `droverctl --json proxies` rows whose proxy is live, as (requester, target node,
/// unit, state, references).
async fn live(c: &TestCluster) -> Vec<(String, String, String, String, u64)> {
    let text = c.ctl_ok(&["--json", "proxies"]).await;
    let value: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("droverctl --json proxies is not JSON ({e}): {text}"));
    value
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (
                s("requester"),
                s("target_node"),
                s("unit"),
                s("state"),
                r["refs"].as_u64().unwrap_or_default(),
            )
        })
        .filter(|(_, _, _, state, _)| state == "waiting" || state == "active")
        .collect()
}

async fn wait_live(c: &TestCluster, want: &[(&str, u64)]) {
    let want: Vec<_> = want
        .iter()
        .map(|(state, refs)| {
            (
                "node1".to_string(),
                "node2".to_string(),
                DB.to_string(),
                state.to_string(),
                *refs,
            )
        })
        .collect();
    let what = format!("droverctl proxies to show {want:?}");
    let res = poll(T, Duration::from_millis(100), &what, || async {
        live(c).await == want
    });
    if let Err(e) = res.await {
        panic!("{e:#}: still {:?}", live(c).await);
    }
}

/// node2's db and node1's need-db (`kind` on BlueChi's proxy name); need-db started and
/// the whole chain checked up, with drover's dep on the target.
async fn bluechi_chain_up(c: &TestCluster, kind: &str) {
    c.install("node2", DB, SLEEPER).await;
    c.install("node1", NEED_DB, &requester(kind, BC_PROXY))
        .await;
    start_ok(c, "node1", NEED_DB).await;
    wait_state(c, "node1", NEED_DB, "active").await;
    wait_state(c, "node1", BC_PROXY, "active").await;
    wait_state(c, "node2", DB, "active").await;
    wait_state(c, "node2", DEP, "active").await;
    assert_eq!(c.state("node2", BC_DEP).await, "inactive");
}

/// A call on `node`'s bus to the agent's local API (as root, as systemd runs the helper
/// of a system unit): `Ok` or the D-Bus error's (name, message).
async fn agent_call(
    c: &TestCluster,
    node: &str,
    method: &str,
    args: (&str, &str, &str),
) -> Result<(), (String, String)> {
    let conn = drover_testkit::api::connect(&c.node_bus_address(node)).await;
    let call = conn.call_method(
        Some(AGENT_BUS_NAME),
        AGENT_PATH,
        Some(AGENT_IFACE),
        method,
        &args,
    );
    match tokio::time::timeout(T, call).await {
        Err(_) => panic!("{method}{args:?} got no answer in {T:?}"),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(zbus::Error::MethodError(name, msg, _))) => {
            Err((name.to_string(), msg.unwrap_or_default()))
        }
        Ok(Err(zbus::Error::FDO(e))) => Err((
            zbus::DBusError::name(&*e).to_string(),
            zbus::DBusError::description(&*e)
                .unwrap_or_default()
                .to_owned(),
        )),
        Ok(Err(e)) => panic!("{method}{args:?}: {e}"),
    }
}

// ---------------------------------------------------------------------------------

/// `Wants=bluechi-proxy@node2_db.service`: the remote target starts first, the target
/// node runs drover's dep, and stopping the requester releases proxy and dep while the
/// target keeps running (BlueChi's proxy-service-start and -stop-requesting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bluechi_named_proxy_starts_and_releases_the_remote_target() {
    let c = TestCluster::with(compat(2)).await;
    // The compat templates are installed and run this build's helper as bluechi-proxy.
    let text = c.systemctl("node1", &["cat", BC_PROXY]).await.stdout;
    let helper = bin("drover-proxy");
    assert!(
        text.contains(&format!(
            "ExecStart=@{} bluechi-proxy create --user %i.service",
            helper.display()
        )),
        "{text}"
    );
    bluechi_chain_up(&c, "Wants").await;
    wait_live(&c, &[("active", 1)]).await;
    let log = c.unit_log("node1", BC_PROXY).unwrap();
    assert!(
        log.contains("bluechi-proxy: db.service on node node2 is active"),
        "{log}"
    );

    c.systemctl_ok("node1", &["stop", NEED_DB]).await;
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    c.stays("node2", DB, "active", Duration::from_millis(500))
        .await;
    wait_live(&c, &[]).await;
    assert!(
        c.unit_log("node1", BC_PROXY)
            .unwrap()
            .contains("released the proxy for db.service on node node2"),
    );
    c.down().await;
}

/// `Requires=` on a BlueChi-named proxy of a node that does not exist: the requester
/// does not start and the proxy says why. `BindsTo=`: a killed target takes proxy and
/// requester down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requires_and_binds_to_on_bluechi_names_behave_as_on_drovers() {
    let c = TestCluster::with(compat(2)).await;
    let missing = "bluechi-proxy@node9_db.service";
    c.install(
        "node1",
        "need-missing.service",
        &requester("Requires", missing),
    )
    .await;
    let out = c
        .systemctl("node1", &["start", "need-missing.service"])
        .await;
    assert!(!out.success(), "need-missing must not start: {out:?}");
    wait_state(&c, "node1", missing, "failed").await;
    let log = c.unit_log("node1", missing).unwrap();
    assert!(
        log.contains("cannot start db.service on node node9") && log.contains("no such node"),
        "{log}"
    );
    assert_ne!(c.state("node1", "need-missing.service").await, "active");

    bluechi_chain_up(&c, "BindsTo").await;
    c.systemctl_ok("node2", &["kill", "--signal=SIGKILL", DB])
        .await;
    wait_state(&c, "node2", DB, "failed").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    // A target that fails after the proxy was active stops a BlueChi-named
    // proxy as BlueChi's ends: inactive, not failed (docs/proxies.md, "How each
    // family ends"); the BindsTo= requester stops with it.
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    // Ended cleanly: its stop succeeded (systemd's Result), nothing in --failed.
    let result = c
        .systemctl("node1", &["show", "-p", "Result", "--value", BC_PROXY])
        .await;
    assert_eq!(result.stdout.trim(), "success");
    wait_state(&c, "node1", NEED_DB, "inactive").await;
    wait_live(&c, &[]).await;
    c.down().await;
}

/// `systemctl restart drover-agent` on the requesting node: the new agent adopts the
/// active BlueChi-named proxy unit, so a later real stop of the target still takes the
/// `BindsTo=` requester down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_a_bluechi_named_proxy() {
    let mut c = TestCluster::with(ClusterOptions {
        manager_extra_config: "[drover-manager]\nProxyGracePeriod=15000\n".into(),
        ..compat(2)
    })
    .await;
    bluechi_chain_up(&c, "BindsTo").await;
    c.stop_agent("node1").await.unwrap();
    c.stays("node1", BC_PROXY, "active", Duration::from_secs(1))
        .await;
    c.start_agent("node1").await.unwrap();
    wait_live(&c, &[("active", 1)]).await;
    assert_eq!(c.state("node1", NEED_DB).await, "active");
    assert_eq!(c.state("node2", DEP).await, "active");
    c.systemctl_ok("node2", &["stop", DB]).await;
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    wait_state(&c, "node1", NEED_DB, "inactive").await;
    c.down().await;
}

/// A unit written for BlueChi and one written for drover on the same node depend on
/// the same target: two proxies, two references; stopping one keeps the target's dep,
/// stopping both releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechi_and_drover_names_on_one_target_both_count() {
    let c = TestCluster::with(compat(2)).await;
    bluechi_chain_up(&c, "Wants").await;
    c.install("node1", NEED_DB_DROVER, &requester("Wants", DR_PROXY))
        .await;
    start_ok(&c, "node1", NEED_DB_DROVER).await;
    wait_state(&c, "node1", DR_PROXY, "active").await;
    wait_live(&c, &[("active", 2), ("active", 2)]).await;

    // The BlueChi-written unit goes: the drover one still holds the target.
    c.systemctl_ok("node1", &["stop", NEED_DB]).await;
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    wait_live(&c, &[("active", 1)]).await;
    c.stays("node2", DEP, "active", Duration::from_secs(1))
        .await;
    assert_eq!(c.state("node1", DR_PROXY).await, "active");

    // And back, then the drover one goes first: the same, the other way round.
    start_ok(&c, "node1", NEED_DB).await;
    wait_state(&c, "node1", BC_PROXY, "active").await;
    wait_live(&c, &[("active", 2), ("active", 2)]).await;
    c.systemctl_ok("node1", &["stop", NEED_DB_DROVER]).await;
    wait_state(&c, "node1", DR_PROXY, "inactive").await;
    wait_live(&c, &[("active", 1)]).await;
    c.stays("node2", DEP, "active", Duration::from_secs(1))
        .await;

    // Both gone: the dep stops, the target keeps running.
    c.systemctl_ok("node1", &["stop", NEED_DB]).await;
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_live(&c, &[]).await;
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// Garbage BlueChi names fail with the reason (the helper refuses them before
/// anything is sent), and `CreateProxy` calls whose proxy unit does not name the
/// (node, unit) asked for are `InvalidArgs` with the reason; nothing reaches the
/// manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bluechi_names_and_mismatched_calls_are_refused_with_the_reason() {
    let c = TestCluster::with(compat(3)).await;
    for (unit, why) in [
        (
            "bluechi-proxy@nounderscore.service",
            "no '_' between node and unit",
        ),
        ("bluechi-proxy@_db.service", "node name is empty"),
        ("bluechi-proxy@node2_.service", "unit name is empty"),
    ] {
        let out = c.systemctl("node1", &["start", unit]).await;
        assert!(!out.success(), "{unit} must fail");
        assert_eq!(c.state("node1", unit).await, "failed");
        let log = c.unit_log("node1", unit).unwrap();
        assert!(log.contains(why), "{unit}: {log:?}");
        assert!(log.starts_with("bluechi-proxy: "), "{unit}: {log:?}");
    }
    for (args, why) in [
        // The proxy unit of node2's db, asked for node3's.
        (
            (BC_PROXY, "node3", "db.service"),
            "is the proxy of db.service on node node2, not of db.service on node node3",
        ),
        (
            (BC_PROXY, "node2", "web.service"),
            "not of web.service on node node2",
        ),
        (
            (
                "bluechi-proxy@nounderscore.service",
                "nounderscore",
                "db.service",
            ),
            "is not a proxy unit",
        ),
        (
            ("bluechi-dep@db.service", "node2", "db.service"),
            "is not an instance of drover-proxy@.service or bluechi-proxy@.service",
        ),
    ] {
        for method in ["CreateProxy", "RemoveProxy"] {
            let (name, msg) = agent_call(&c, "node1", method, args).await.unwrap_err();
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs", "{args:?}");
            assert!(msg.contains(why), "{method}{args:?}: {msg}");
        }
    }
    assert!(live(&c).await.is_empty(), "nothing reached the manager");
    assert!(c.ctl_ok(&["--json", "proxies"]).await.trim() == "[]");
    c.down().await;
}

/// Exactly the call BlueChi's `bluechi-proxy create node2_db.service` makes, and its
/// `remove`: the target starts, the call returns once it is active, and the removal
/// releases the dep. (BlueChi's helper binary is not available here; this is its D-Bus
/// call shape: `CreateProxy(proxy unit, node, unit)` on the agent, then `RemoveProxy`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_bluechis_helper_makes_is_served() {
    let c = TestCluster::with(compat(2)).await;
    c.install("node2", DB, SLEEPER).await;
    let args = (BC_PROXY, "node2", "db.service");
    agent_call(&c, "node1", "CreateProxy", args).await.unwrap();
    assert_eq!(c.state("node2", DB).await, "active");
    wait_state(&c, "node2", DEP, "active").await;
    wait_live(&c, &[("active", 1)]).await;
    agent_call(&c, "node1", "RemoveProxy", args).await.unwrap();
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_live(&c, &[]).await;
    assert_eq!(c.state("node2", DB).await, "active");
    c.down().await;
}

/// BlueChi's own user-mode template, word for word but for the helper's path, whose
/// `bluechi-proxy` is drover's helper under that name (as a link
/// `/usr/libexec/bluechi-proxy` → `drover-proxy` would give it): BlueChi's unit file
/// invoking drover's helper works, on a node without drover's compat set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bluechis_own_template_runs_drovers_helper_as_bluechi_proxy() {
    let c = TestCluster::start(2).await;
    let link = c.dir().join("bluechi-proxy");
    std::os::unix::fs::symlink(bin("drover-proxy"), &link).unwrap();
    let link = link.display().to_string().replace('%', "%%");
    let bluechi_template = format!(
        "[Unit]\nDescription=BlueChi Proxy service\nStopWhenUnneeded=yes\n\n\
         [Service]\nType=oneshot\nRemainAfterExit=yes\nKillMode=mixed\n\
         ExecStart={link} create --user %i.service\n\
         ExecStop={link} remove --user %i.service\n"
    );
    c.install("node1", "bluechi-proxy@.service", &bluechi_template)
        .await;
    bluechi_chain_up(&c, "Requires").await;
    wait_live(&c, &[("active", 1)]).await;
    c.systemctl_ok("node1", &["stop", NEED_DB]).await;
    wait_state(&c, "node1", BC_PROXY, "inactive").await;
    wait_state(&c, "node2", DEP, "inactive").await;
    wait_live(&c, &[]).await;
    c.down().await;
}

/// BlueChi's `proxy-service-fails-on-execstart`, on both families side by side: the
/// target (`Type=simple`, `RemainAfterExit=yes`) fails at its exec start, right after it
/// went active. Through `bluechi-proxy@` the proxy ends as BlueChi's does, `inactive`
/// (it saw the target active, completed, and was stopped when the target failed): its
/// `Wants=` requester runs, the target is `failed`, the dep `inactive`. Through
/// `drover-proxy@` the proxy ends `failed` with the target's reason in its journal.
/// Several rounds: the target's failure races the dep start's confirmation, and each
/// order must end the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_failing_at_exec_start_ends_each_family_as_its_own() {
    const ROUNDS: usize = 6;
    let c = TestCluster::with(compat(2)).await;
    c.install(
        "node2",
        DB,
        "[Service]\nType=simple\nRemainAfterExit=yes\nExecStart=/bin/false\n",
    )
    .await;
    c.install("node1", NEED_DB, &requester("Wants", BC_PROXY))
        .await;
    c.install("node1", NEED_DB_DROVER, &requester("Wants", DR_PROXY))
        .await;
    for round in 0..ROUNDS {
        for (requester, proxy, ends) in [
            (NEED_DB, BC_PROXY, "inactive"),
            (NEED_DB_DROVER, DR_PROXY, "failed"),
        ] {
            let entered = c
                .prop("node1", proxy, "ActiveEnterTimestampMonotonic")
                .await;
            // Wants= + After=: the start returns once the proxy's start job ended.
            start_ok(&c, "node1", requester).await;
            wait_state(&c, "node2", DB, "failed").await;
            wait_state(&c, "node2", DEP, "inactive").await;
            wait_state(&c, "node1", proxy, ends).await;
            assert_eq!(c.state("node1", requester).await, "active", "round {round}");
            let log = c.unit_log("node1", proxy).unwrap_or_default();
            if ends == "inactive" {
                // It did run in this round: active first, then stopped, not a
                // start that failed.
                assert_ne!(
                    c.prop("node1", proxy, "ActiveEnterTimestampMonotonic")
                        .await,
                    entered,
                    "round {round}: {log}"
                );
                assert_eq!(c.prop("node1", proxy, "Result").await, "success");
            } else {
                assert!(
                    log.lines().last().is_some_and(
                        |l| l.contains("db.service on node node2") && l.contains("failed")
                    ),
                    "round {round}: {log}"
                );
            }
            wait_live(&c, &[]).await;
            // Next round from scratch.
            c.systemctl_ok("node1", &["stop", requester]).await;
            c.systemctl("node1", &["reset-failed", proxy]).await;
            c.systemctl("node2", &["reset-failed", DB]).await;
        }
    }
    // A target that never came up (a oneshot failing in its start) fails BlueChi's
    // proxy too, with the reason: as BlueChi's.
    c.install("node2", DB, FAILING).await;
    let out = c.systemctl("node1", &["start", NEED_DB]).await;
    assert!(out.success(), "Wants=: {}", out.stderr);
    wait_state(&c, "node1", BC_PROXY, "failed").await;
    let log = c.unit_log("node1", BC_PROXY).unwrap_or_default();
    assert!(log.contains("db.service on node node2"), "{log}");
    c.down().await;
}
