//! The rest of the Node API (issue 4 part 3) on real systemd nodes: through
//! droverctl where it has a command, over D-Bus otherwise, each result checked
//! against what the node's own systemd says. Bad arguments get a clear error and
//! change nothing.

use drover_testkit::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use zbus::{OwnedObjectPath, OwnedVariant, Variant};

const T: Duration = Duration::from_secs(10);

/// The D-Bus error name of a failed call ("" if it was not an error reply).
fn dbus_error_name(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, _, _) => name.as_str().to_string(),
        _ => String::new(),
    }
}

async fn is_enabled_in_node(c: &TestCluster, node: &str, unit: &str) -> String {
    let out = c.systemctl(node, &["is-enabled", unit]).await;
    out.stdout.trim().to_string()
}

/// `NODE | PATH | IS-ENABLED` rows of list-unit-files.
fn parse_unit_files(out: &str) -> BTreeSet<(String, String, String)> {
    out.lines()
        .skip(2)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            (f.len() == 3).then(|| (f[0].to_string(), f[1].to_string(), f[2].to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_disable_is_enabled_and_unit_files_match_systemd() {
    let c = TestCluster::with_units(
        2,
        &[
            ("node1", "svc-a.service", INSTALLABLE),
            ("node1", "svc-static.service", STATIC),
        ],
    )
    .await;

    // Disabled at first: printed, exit 1, nothing on stderr (like systemctl).
    let (code, out, err) = c.run(&["is-enabled", "node1", "svc-a"]).await.parts();
    assert_eq!((code, out.trim(), err.trim()), (1, "disabled", ""));
    let (code, out, _) = c.run(&["is-enabled", "node1", "svc-static"]).await.parts();
    assert_eq!((code, out.trim()), (0, "static"));

    // enable: reported on stderr like bluechictl, real on the node.
    let (code, _, err) = c.run(&["enable", "node1", "svc-a"]).await.parts();
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("The unit files included enablement information"),
        "{err}"
    );
    assert!(
        err.contains("Created symlink ") && err.contains("default.target.wants/svc-a.service -> "),
        "{err}"
    );
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "enabled"
    );
    assert_eq!(
        is_enabled_in_node(&c, "node2", "svc-a.service").await,
        "",
        "node2 has no such unit"
    );
    let (code, out, _) = c
        .run(&["is-enabled", "node1", "svc-a.service"])
        .await
        .parts();
    assert_eq!((code, out.trim()), (0, "enabled"));

    // list-unit-files of a node is exactly its systemd's ListUnitFiles.
    let direct: Vec<(String, String)> = c
        .systemd("node1")
        .await
        .call("ListUnitFiles", &())
        .await
        .unwrap();
    let direct: BTreeSet<(String, String, String)> = direct
        .into_iter()
        .map(|(p, s)| ("node1".to_string(), p, s))
        .collect();
    let listed = parse_unit_files(&c.ctl_ok(&["list-unit-files", "node1"]).await);
    assert_eq!(listed, direct);
    assert!(
        listed
            .iter()
            .any(|(_, p, s)| p.ends_with("/svc-a.service") && s == "enabled"),
        "{listed:?}"
    );
    // All nodes, filtered by unit name.
    let all = parse_unit_files(&c.ctl_ok(&["list-unit-files", "--filter", "svc-*"]).await);
    let names: BTreeSet<(String, String)> = all
        .iter()
        .map(|(n, p, s)| (n.clone(), format!("{} {s}", p.rsplit('/').next().unwrap())))
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            ("node1".to_string(), "svc-a.service enabled".to_string()),
            ("node1".to_string(), "svc-static.service static".to_string()),
        ])
    );
    let api = c.api().await;
    let per_node: BTreeMap<String, Vec<(String, String)>> = api
        .controller()
        .await
        .call("ListUnitFiles", &())
        .await
        .unwrap();
    assert_eq!(per_node.keys().collect::<Vec<_>>(), ["node1", "node2"]);

    // disable: the symlink goes.
    let (code, _, err) = c.run(&["disable", "node1", "svc-a"]).await.parts();
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Removed \"") && err.contains("default.target.wants/svc-a.service\"."),
        "{err}"
    );
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "disabled"
    );

    // --runtime both ways (bluechictl ignores --runtime for disable).
    let (code, _, err) = c
        .run(&["enable", "node1", "svc-a", "--runtime"])
        .await
        .parts();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "enabled-runtime"
    );
    let (code, out, _) = c.run(&["is-enabled", "node1", "svc-a"]).await.parts();
    assert_eq!((code, out.trim()), (0, "enabled-runtime"));
    let (code, _, err) = c
        .run(&["disable", "node1", "svc-a", "--runtime"])
        .await
        .parts();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "disabled"
    );

    // --json: one document on stdout.
    let out = c
        .ctl_ok(&["--json", "enable", "node1", "svc-a", "--no-reload"])
        .await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["node"], "node1");
    assert_eq!(v[0]["operation"], "EnableUnitFiles");
    assert_eq!(v[0]["carries_install_info"], true);
    assert_eq!(v[0]["reloaded"], false);
    assert_eq!(v[0]["changes"][0]["type"], "symlink");
    let out = c.run(&["--json", "is-enabled", "node1", "svc-a"]).await;
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v[0]["state"], "enabled");
    assert_eq!(v[0]["enabled"], true);
    assert!(out.success());

    // Bad input: nothing sent, nothing changed.
    let (code, _, err) = c.run(&["disable", "node1", "svc a"]).await.parts();
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "enabled"
    );
    let (code, _, err) = c.run(&["disable", "nodeX", "svc-a"]).await.parts();
    assert_eq!(code, 1);
    assert!(err.contains("node 'nodeX' not found"), "{err}");
    assert_eq!(
        is_enabled_in_node(&c, "node1", "svc-a.service").await,
        "enabled"
    );
    // A unit file that does not exist: an error, exit 1.
    let (code, out, err) = c.run(&["is-enabled", "node1", "nosuch"]).await.parts();
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        "droverctl: unit nosuch.service not found on node node1\n"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_thaw_kill_and_reset_failed() {
    let c = TestCluster::start(2).await;
    for node in ["node1", "node2"] {
        c.install(node, "victim.service", SLEEPER).await;
        c.install(node, "bad.service", FAILING).await;
    }
    c.ctl_ok(&["start", "node1", "victim"]).await;
    c.systemctl("node2", &["start", "victim.service"]).await;

    // freeze/thaw do what the node's systemd does when asked directly (on a host
    // whose cgroup layout lacks the freezer, both fail the same way).
    let direct: zbus::Result<()> = c
        .systemd("node2")
        .await
        .call("FreezeUnit", &("victim.service",))
        .await;
    let (code, out, err) = c.run(&["freeze", "node1", "victim"]).await.parts();
    match direct {
        Ok(()) => {
            assert_eq!(code, 0, "{err}");
            assert_eq!(out, "Unit victim.service freeze operation done\n");
            assert_eq!(
                c.prop("node1", "victim.service", "FreezerState").await,
                "frozen"
            );
            let (code, out, err) = c.run(&["thaw", "node1", "victim"]).await.parts();
            assert_eq!(code, 0, "{err}");
            assert_eq!(out, "Unit victim.service thaw operation done\n");
            assert_eq!(
                c.prop("node1", "victim.service", "FreezerState").await,
                "running"
            );
        }
        Err(e) => {
            let name = dbus_error_name(&e);
            assert_eq!(code, 1, "freeze must fail like systemd: {e}");
            assert!(
                err.contains(&name),
                "systemd's error {name} is passed on: {err}"
            );
            assert_eq!(c.state("node1", "victim.service").await, "active");
        }
    }

    // kill: bad signal or whom is refused before anything is sent.
    for bad in [
        &["kill", "node1", "victim", "--signal=0"][..],
        &["kill", "node1", "victim", "--signal=65"],
        &["kill", "node1", "victim", "--signal=NOPE"],
        &["kill", "node1", "victim", "--kill-whom=everyone"],
    ] {
        let (code, _, err) = c.run(bad).await.parts();
        assert_eq!(code, 2, "{bad:?}: {err}");
    }
    assert_eq!(c.state("node1", "victim.service").await, "active");
    // Over D-Bus a bad signal gets systemd's InvalidArgs and kills nothing.
    let api = c.api().await;
    let n1 = api.node("node1").await;
    let e = n1
        .call::<_, _, ()>("KillUnit", &("victim.service", "all", 0i32))
        .await;
    assert!(e.is_err(), "signal 0 is refused");
    let e = n1
        .call::<_, _, ()>("KillUnit", &("victim.service", "all", 1000i32))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    assert_eq!(c.state("node1", "victim.service").await, "active");
    // No control process: systemd's error, passed on.
    let (code, _, err) = c
        .run(&["kill", "node1", "victim", "--kill-whom=control"])
        .await
        .parts();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("org.freedesktop.systemd1"), "{err}");

    // SIGKILL of the main process: the unit fails; reset-failed clears it.
    let (code, out, err) = c
        .run(&["kill", "node1", "victim", "--signal=KILL"])
        .await
        .parts();
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    c.wait_state("node1", "victim.service", "failed", T).await;
    assert_eq!(c.state("node2", "victim.service").await, "active");
    let (code, _, err) = c.run(&["reset-failed", "node1", "victim"]).await.parts();
    assert_eq!(code, 0, "{err}");
    assert_eq!(c.state("node1", "victim.service").await, "inactive");

    // SIGTERM to main only is a clean end for a service.
    c.ctl_ok(&["start", "node1", "victim"]).await;
    let out = c
        .ctl_ok(&[
            "--json",
            "kill",
            "node1",
            "victim",
            "--kill-whom=main",
            "--signal=SIGTERM",
        ])
        .await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v[0]["whom"].as_str(), v[0]["signal"].as_i64()),
        (Some("main"), Some(15))
    );
    c.wait_state("node1", "victim.service", "inactive", T).await;

    // reset-failed without arguments: every online node.
    for node in ["node1", "node2"] {
        let (code, out, _) = c.run(&["start", node, "bad"]).await.parts();
        assert_eq!(code, 1, "{out}");
        assert_eq!(c.state(node, "bad.service").await, "failed");
    }
    let (code, _, err) = c.run(&["reset-failed"]).await.parts();
    assert_eq!(code, 0, "{err}");
    for node in ["node1", "node2"] {
        assert_eq!(c.state(node, "bad.service").await, "inactive");
    }
    // One node only.
    for node in ["node1", "node2"] {
        c.run(&["start", node, "bad"]).await;
    }
    c.ctl_ok(&["reset-failed", "node2"]).await;
    assert_eq!(c.state("node2", "bad.service").await, "inactive");
    assert_eq!(c.state("node1", "bad.service").await, "failed");
    // Over D-Bus: Node.ResetFailed and ResetFailedUnit.
    let _: () = n1.call("ResetFailedUnit", &("bad.service",)).await.unwrap();
    assert_eq!(c.state("node1", "bad.service").await, "inactive");
    c.run(&["start", "node1", "bad"]).await;
    let _: () = n1.call("ResetFailed", &()).await.unwrap();
    assert_eq!(c.state("node1", "bad.service").await, "inactive");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_target_get_and_set() {
    let c = TestCluster::start(2).await;
    let direct: String = c
        .systemd("node1")
        .await
        .call("GetDefaultTarget", &())
        .await
        .unwrap();
    let out = c.ctl_ok(&["get-default", "node1"]).await;
    assert_eq!(out.trim(), direct);

    c.install("node1", "custom.target", "[Unit]\nDescription=custom\n")
        .await;
    let (code, _, err) = c
        .run(&["set-default", "node1", "custom.target"])
        .await
        .parts();
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Created symlink ") && err.contains("custom.target"),
        "{err}"
    );
    let out = c.ctl_ok(&["get-default", "node1"]).await;
    assert_eq!(out.trim(), "custom.target");
    let now: String = c
        .systemd("node1")
        .await
        .call("GetDefaultTarget", &())
        .await
        .unwrap();
    assert_eq!(now, "custom.target");
    let other = c.ctl_ok(&["get-default", "node2"]).await;
    assert_eq!(other.trim(), direct, "node2 keeps its default");
    let v: serde_json::Value =
        serde_json::from_str(&c.ctl_ok(&["--json", "get-default", "node1"]).await).unwrap();
    assert_eq!(v[0]["default_target"], "custom.target");

    // Not a target: refused locally; a missing target: systemd's error.
    let (code, _, _) = c
        .run(&["set-default", "node1", "web.service"])
        .await
        .parts();
    assert_eq!(code, 2);
    let (code, _, err) = c
        .run(&["set-default", "node1", "nosuch.target"])
        .await
        .parts();
    assert_eq!(code, 1, "{err}");
    let out = c.ctl_ok(&["get-default", "node1"]).await;
    assert_eq!(
        out.trim(),
        "custom.target",
        "a failed set-default changes nothing"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_properties_get_and_set_over_dbus() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    c.ctl_ok(&["start", "node1", "web"]).await;
    let api = c.api().await;
    let n1 = api.node("node1").await;

    // GetUnitProperties of one interface, and of all ("").
    let props: BTreeMap<String, OwnedVariant> = n1
        .call(
            "GetUnitProperties",
            &("web.service", "org.freedesktop.systemd1.Unit"),
        )
        .await
        .unwrap();
    let s = |k: &str| match props.get(k).map(|v| &**v) {
        Some(Variant::Str(s)) => s.as_str().to_string(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(s("Id"), "web.service");
    assert_eq!(s("ActiveState"), "active");
    assert_eq!(s("SubState"), "running");
    assert!(!props.contains_key("MainPID"), "only the Unit interface");
    let all: BTreeMap<String, OwnedVariant> = n1
        .call("GetUnitProperties", &("web.service", ""))
        .await
        .unwrap();
    assert!(all.contains_key("MainPID") && all.contains_key("ActiveState"));

    // GetUnitProperty equals what systemd says.
    let pid: OwnedVariant = n1
        .call(
            "GetUnitProperty",
            &("web.service", "org.freedesktop.systemd1.Service", "MainPID"),
        )
        .await
        .unwrap();
    let pid = match &*pid {
        Variant::U32(p) => *p,
        other => panic!("MainPID: {other:?}"),
    };
    assert_eq!(
        pid.to_string(),
        c.prop("node1", "web.service", "MainPID").await
    );
    assert!(pid > 0);

    // SetUnitProperties (runtime) changes the unit on the node.
    let set: Vec<(&str, Variant<'_>)> = vec![("Description", Variant::from("set by drover"))];
    let _: () = n1
        .call("SetUnitProperties", &("web.service", true, set))
        .await
        .unwrap();
    assert_eq!(
        c.prop("node1", "web.service", "Description").await,
        "set by drover"
    );
    let d: OwnedVariant = n1
        .call(
            "GetUnitProperty",
            &(
                "web.service",
                "org.freedesktop.systemd1.Unit",
                "Description",
            ),
        )
        .await
        .unwrap();
    assert_eq!(&*d, &Variant::from("set by drover"));

    // Errors: an unknown property, a unit that does not exist, a bad unit name.
    let e = n1
        .call::<_, _, OwnedVariant>(
            "GetUnitProperty",
            &(
                "web.service",
                "org.freedesktop.systemd1.Unit",
                "NoSuchProperty",
            ),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("UnknownProperty") || e.to_string().contains("InvalidArgs"),
        "{e}"
    );
    let bad: Vec<(&str, Variant<'_>)> = vec![("NoSuchSetting", Variant::from(1u32))];
    assert!(
        n1.call::<_, _, ()>("SetUnitProperties", &("web.service", true, bad))
            .await
            .is_err()
    );
    let e = n1
        .call::<_, _, BTreeMap<String, OwnedVariant>>("GetUnitProperties", &("a b", ""))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    assert_eq!(c.state("node1", "web.service").await, "active");
    c.down().await;
}

type Aux<'a> = Vec<(&'a str, Vec<(&'a str, Variant<'a>)>)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_transient_unit_is_a_tracked_job() {
    let c = TestCluster::start(1).await;
    let (_api, n1, mut jobs) = c.jobs_on("node1").await;

    let exec = vec![(
        "/bin/sleep".to_string(),
        vec!["/bin/sleep".to_string(), "600".to_string()],
        false,
    )];
    let props: Vec<(&str, Variant<'_>)> = vec![
        ("Description", Variant::from("transient via drover")),
        ("ExecStart", Variant::from(exec.clone())),
    ];
    let aux: Aux<'_> = Vec::new();
    let path: OwnedObjectPath = n1
        .call(
            "StartTransientUnit",
            &("transient-x.service", "replace", props, aux),
        )
        .await
        .unwrap();
    let path = path.to_string();
    assert!(
        path.starts_with("/org/eclipse/bluechi/job/"),
        "a drover job, not systemd's: {path}"
    );
    let transient = ("node1", "transient-x.service", "done");
    let quiet = Duration::from_millis(300);
    jobs.ends_once(&path, transient, T, quiet).await;
    assert_eq!(c.state("node1", "transient-x.service").await, "active");
    assert_eq!(
        c.prop("node1", "transient-x.service", "Description").await,
        "transient via drover"
    );

    // The same name again: systemd's UnitExists, no job.
    let props: Vec<(&str, Variant<'_>)> = vec![("ExecStart", Variant::from(exec))];
    let aux: Aux<'_> = Vec::new();
    let e = n1
        .call::<_, _, OwnedObjectPath>(
            "StartTransientUnit",
            &("transient-x.service", "replace", props, aux),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("UnitExists"), "{e}");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_units_and_missing_ones() {
    let c = TestCluster::with_units(
        2,
        &[
            ("node1", "web.service", INSTALLABLE),
            ("node1", "db.service", SLEEPER),
        ],
    )
    .await;
    c.ctl_ok(&["enable", "node1", "web"]).await;
    c.ctl_ok(&["start", "node1", "web"]).await;

    let out = c.ctl_ok(&["status", "node1", "web", "db.service"]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let fields = |l: &str| {
        l.split('|')
            .map(str::trim)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fields(lines[0]),
        [
            "UNIT",
            "LOADED",
            "ACTIVE",
            "SUBSTATE",
            "FREEZERSTATE",
            "ENABLED",
            "HEALTH",
            ""
        ]
    );
    assert!(lines[1].chars().all(|c| c == '-'), "{out}");
    let web = fields(lines[2]);
    assert_eq!(web[..4], ["web.service", "loaded", "active", "running"]);
    assert_eq!(web[4], c.prop("node1", "web.service", "FreezerState").await);
    assert_eq!(web[5], "enabled");
    assert_eq!(web[6], "none", "no check declared");
    let db = fields(lines[3]);
    assert_eq!(db[..4], ["db.service", "loaded", "inactive", "dead"]);
    assert!(lines[2].contains('\t'), "tab-aligned like bluechictl");

    // A unit that does not exist: bluechictl's line on stderr, exit 1, the rest shown.
    let (code, out, err) = c.run(&["status", "node1", "web", "ghost"]).await.parts();
    assert_eq!(code, 1);
    assert_eq!(err, "Unit ghost.service could not be found.\n");
    assert!(out.contains("web.service"), "{out}");
    assert!(!out.contains("ghost"), "{out}");

    // JSON.
    let out = c.ctl_ok(&["--json", "status", "node1", "web"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["unit"], "web.service");
    assert_eq!(v[0]["active"], "active");
    assert_eq!(v[0]["enabled"], "enabled");

    // Unknown and offline nodes.
    let (code, _, err) = c.run(&["status", "nodeX", "web"]).await.parts();
    assert_eq!(code, 1);
    assert!(err.contains("node 'nodeX' not found"), "{err}");
    let mut c = c;
    c.stop_agent("node2").await.unwrap();
    c.wait_status("node2", "offline", T).await;
    let (code, _, err) = c.run(&["status", "node2", "web"]).await.parts();
    assert_eq!(code, 1);
    assert!(err.contains("node node2 is offline"), "{err}");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_levels_are_checked_and_applied() {
    let c = TestCluster::start(2).await;
    let api = c.api().await;
    let ctl = api.controller().await;
    // Read through Properties.Get each time: LogLevel emits no change signal, so a
    // caching proxy would keep the first value.
    let props = zbus::fdo::PropertiesProxy::builder(&api.conn)
        .destination(BUS_NAME)
        .path(CONTROLLER_PATH)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap();
    let level = || async {
        let iface = zbus::names::InterfaceName::try_from(CONTROLLER_IFACE).unwrap();
        let v = props.get(iface, "LogLevel").await.unwrap();
        String::try_from(v).unwrap()
    };
    let target: String = ctl.get_property("LogTarget").await.unwrap();
    assert!(
        ["journald", "stderr", "stderr-full"].contains(&target.as_str()),
        "{target}"
    );

    c.ctl_ok(&["set-loglevel", "DEBUG"]).await;
    assert_eq!(level().await, "DEBUG");
    c.ctl_ok(&["set-loglevel", "warn"]).await;
    assert_eq!(level().await, "WARN");
    c.ctl_ok(&["set-loglevel", "node1", "DEBUG"]).await;

    // Bad levels: refused locally (exit 2) and by the API (InvalidArgs); nothing
    // changes and the node stays online.
    for bad in [
        &["set-loglevel", "LOUD"][..],
        &["set-loglevel", "node1", "TRACE"],
    ] {
        let (code, _, err) = c.run(bad).await.parts();
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(err.contains("invalid log level"), "{err}");
    }
    let e = ctl
        .call::<_, _, ()>("SetLogLevel", &("LOUD",))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    assert_eq!(level().await, "WARN");
    let n1 = api.node("node1").await;
    let e = n1
        .call::<_, _, ()>("SetLogLevel", &("LOUD",))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        n1.get_property::<String>("Status").await.unwrap(),
        "online",
        "a bad level does not disconnect the node"
    );
    let (code, _, err) = c.run(&["set-loglevel", "nodeX", "INFO"]).await.parts();
    assert_eq!(code, 1);
    assert!(err.contains("not found"), "{err}");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_enable_listen_disable() {
    let c = TestCluster::with_units(1, &[("node1", "quick.service", ONESHOT_OK)]).await;
    let out = c.ctl_ok(&["metrics", "enable"]).await;
    assert_eq!(out, "Done\n");
    let (code, _, err) = c.run(&["metrics", "enable"]).await.parts();
    assert_eq!(code, 1, "enabling twice is an error: {err}");

    let mut listen = c.follow(&["metrics", "listen"]);
    listen
        .expect_line("the waiting line", T, |l| {
            l == "Waiting for metrics signals..."
        })
        .await
        .unwrap();
    c.ctl_ok(&["start", "node1", "quick"]).await;
    listen
        .expect_line("StartUnitJobMetrics", T, |l| {
            l.starts_with("[node1] Job /org/eclipse/bluechi/job/")
                && l.ends_with(" to start unit quick.service:")
        })
        .await
        .unwrap();
    listen
        .expect_line("gross time", T, |l| {
            l.starts_with("\tBlueChi job gross measured time: ") && l.ends_with("ms")
        })
        .await
        .unwrap();
    listen.skip_seen();
    listen.settle(Duration::from_millis(300)).await;
    assert!(
        listen.seen.iter().any(|l| l.starts_with(
            "[node1] Agent systemd StartUnit job on quick.service net measured time: "
        )),
        "{:?}",
        listen.seen
    );
    let status = listen.interrupt(T).await.unwrap();
    assert!(status.success(), "Ctrl-C ends listen with 0: {status:?}");

    let out = c.ctl_ok(&["metrics", "disable"]).await;
    assert_eq!(out, "Done\n");
    let (code, _, _) = c.run(&["metrics", "disable"]).await.parts();
    assert_eq!(code, 1, "disabling twice is an error");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_nodes_and_bad_names_change_nothing() {
    let c = TestCluster::with_units(1, &[("node1", "web.service", SLEEPER)]).await;
    c.ctl_ok(&["start", "node1", "web"]).await;
    for args in [
        &["freeze", "nodeX", "web"][..],
        &["thaw", "nodeX", "web"],
        &["kill", "nodeX", "web"],
        &["reset-failed", "nodeX"],
        &["get-default", "nodeX"],
        &["set-default", "nodeX", "default.target"],
        &["enable", "nodeX", "web"],
        &["is-enabled", "nodeX", "web"],
        &["list-unit-files", "nodeX"],
        &["proxies", "nodeX"],
    ] {
        let (code, _, err) = c.run(args).await.parts();
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("node 'nodeX' not found"), "{args:?}: {err}");
    }
    for args in [
        &["kill", "node1", "we b"][..],
        &["freeze", "node1", "../x"],
        &["kill", "no_de", "web"],
        &["status", "node1", "web", "x/y"],
    ] {
        let (code, _, err) = c.run(args).await.parts();
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    // Over D-Bus, bad unit names are InvalidArgs.
    let api = c.api().await;
    let n1 = api.node("node1").await;
    for (method, res) in [
        (
            "FreezeUnit",
            n1.call::<_, _, ()>("FreezeUnit", &("a/b",)).await,
        ),
        ("ThawUnit", n1.call::<_, _, ()>("ThawUnit", &("",)).await),
        (
            "ResetFailedUnit",
            n1.call::<_, _, ()>("ResetFailedUnit", &("x y",)).await,
        ),
        (
            "KillUnit",
            n1.call::<_, _, ()>("KillUnit", &("../web.service", "all", 15i32))
                .await,
        ),
    ] {
        let e = res.unwrap_err();
        assert!(e.to_string().contains("InvalidArgs"), "{method}: {e}");
    }
    let e = n1
        .call::<_, _, ()>("KillUnit", &("web.service", "nobody", 15i32))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InvalidArgs"), "{e}");
    assert_eq!(c.state("node1", "web.service").await, "active");
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn droverctl_proxies_lists_cross_node_dependencies() {
    let c = TestCluster::with_units(3, &[("node2", "db.service", SLEEPER), ("node1", "need-db.service", "[Unit]\nWants=drover-proxy@node2_db.service\nAfter=drover-proxy@node2_db.service\n[Service]\nExecStart=/bin/sleep 600\n")]).await;
    let empty = c.ctl_ok(&["proxies"]).await;
    assert_eq!(
        empty.lines().count(),
        2,
        "header and separator only: {empty}"
    );
    c.ctl_ok(&["start", "node1", "need-db"]).await;
    assert_eq!(c.state("node2", "db.service").await, "active");

    let out = c.ctl_ok(&["proxies"]).await;
    let lines: Vec<&str> = out.lines().collect();
    let fields = |l: &str| {
        l.split('|')
            .map(str::trim)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fields(lines[0]),
        [
            "REQUESTER",
            "TARGET NODE",
            "UNIT",
            "STATE",
            "TARGET STATE",
            "REFS"
        ]
    );
    assert!(lines[1].chars().all(|c| c == '='), "{out}");
    assert_eq!(
        fields(lines[2]),
        ["node1", "node2", "db.service", "active", "active", "1"]
    );
    assert_eq!(lines.len(), 3, "{out}");
    // NODE filters on requester or target.
    for n in ["node1", "node2"] {
        let v: serde_json::Value =
            serde_json::from_str(&c.ctl_ok(&["--json", "proxies", n]).await).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"requester": "node1", "target_node": "node2", "unit": "db.service",
                "state": "active", "target_state": "active", "refs": 1}]),
            "{n}"
        );
    }
    let node3 = c.ctl_ok(&["proxies", "node3"]).await;
    assert_eq!(node3.lines().count(), 2, "node3 is not involved: {node3}");
    let (code, _, err) = c.run(&["proxies", "nodeX"]).await.parts();
    assert_eq!(code, 1);
    assert!(err.contains("node 'nodeX' not found"), "{err}");
    c.down().await;
}
