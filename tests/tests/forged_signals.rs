//! Only systemd speaks for systemd, only the manager for the manager: forged signals on
//! real systemd nodes whose buses have the system bus's policy (the host's default
//! `system.conf` policy, systemd's and drover's shipped policy files), sent by `nobody`
//! straight to the victim's unique name, as any local user can.
//!
//! Each case sends what once moved units across nodes, then makes a real change that
//! travels the same path behind it (a barrier: [`Forger::sync`] has put the forgeries in
//! the victim's queue first), and asserts what a user would see: no monitor event of
//! the forged kind, units on both nodes where they were, a dependent that became active
//! only after its target really did, `droverctl start` reporting the job's real end, the
//! operator's `droverctl monitor` printing only what the manager said; and each victim's
//! log line saying it dropped (and counted) the forgeries.

use drover_bus::systemd::{MANAGER_IFACE, MANAGER_PATH, UNIT_IFACE, unit_path};
use drover_sandbox::ClusterOptions;
use drover_testkit::forge::{Forger, unique_name_of};
use drover_testkit::monitor::Ev;
use drover_testkit::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use zbus::{OwnedObjectPath, Variant as Value};

/// A step that crosses nodes on a loaded 2-core machine.
const T: Duration = Duration::from_secs(20);

const PROPS_IFACE: &str = "org.freedesktop.DBus.Properties";
const DBUS: &str = "org.freedesktop.DBus";
const DBUS_PATH: &str = "/org/freedesktop/DBus";

/// A command that runs until SIGUSR1, then exits 0: a unit step held open for exactly
/// as long as the test needs it (released by [`release_pre`]).
const HELD: &str = "/bin/sh -c 'trap \"exit 0\" USR1; sleep 600 & wait; exit 0'";

fn options(nodes: usize) -> ClusterOptions {
    ClusterOptions {
        system_bus_policy: true,
        ..ClusterOptions::with_nodes(nodes)
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A `…TimestampMonotonic` property: microseconds on the one clock all sandbox nodes
/// share, so the times of two nodes compare.
async fn timestamp(c: &TestCluster, node: &str, unit: &str, prop: &str) -> u64 {
    let raw = c.prop(node, unit, prop).await;
    raw.parse()
        .unwrap_or_else(|e| panic!("{prop} of {unit} on {node} is {raw:?}: {e}"))
}

/// Waits until `log` says `needle`; returns the log.
async fn wait_log(log: &Path, needle: &str) -> String {
    let what = format!("{} to say {needle:?}", log.display());
    if let Err(e) = eventually(T, &what, || async { read(log).contains(needle) }).await {
        panic!("{e:#}; it says:\n{}", read(log));
    }
    read(log)
}

/// A forger on `node`'s bus and the unique name of that node's agent.
async fn forger_at_agent(c: &TestCluster, node: &str) -> (Forger, String) {
    let address = c.node_bus_address(node);
    let forger = Forger::nobody(&address).await;
    let pid = c.agent_pid(node).expect("the agent runs");
    let agent = unique_name_of(&forger.conn, pid).await;
    (forger, agent)
}

/// systemd's `PropertiesChanged` of a unit's state.
async fn forge_state(f: &Forger, to: &str, unit: &str, active: &str, sub: &str) {
    let mut changed: HashMap<&str, Value<'_>> = HashMap::new();
    changed.insert("ActiveState", Value::from(active));
    changed.insert("SubState", Value::from(sub));
    let none: Vec<&str> = Vec::new();
    f.signal(
        to,
        &unit_path(unit),
        PROPS_IFACE,
        "PropertiesChanged",
        &(UNIT_IFACE, changed, none),
    )
    .await;
}

fn object(path: &str) -> OwnedObjectPath {
    OwnedObjectPath::try_from(path).unwrap()
}

/// Forged unit and job signals to node2's agent (state changes both ways, removal,
/// creation, a daemon-reload that never ends, an owner change naming the forger), a
/// forged "the caller left" to node1's agent while its proxy waits, and forged
/// "answers" to the waiting proxy helper: nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_systemd_signals_move_no_unit_on_any_node() {
    let c = TestCluster::with(options(2)).await;
    let pre = format!("[Service]\nExecStartPre={HELD}\nExecStart=/bin/sleep 600\n");
    c.install("node2", "db.service", SLEEPER).await;
    c.install("node2", "barrier.service", SLEEPER).await;
    c.install("node2", "pre.service", &pre).await;
    let app = requester("BindsTo", "drover-proxy@node2_db.service");
    let dependent = requester("BindsTo", "drover-proxy@node2_pre.service");
    c.install("node1", "app.service", &app).await;
    c.install("node1", "dependent.service", &dependent).await;

    // db on node2 is in use by app on node1.
    c.systemctl_ok("node2", &["start", "db.service"]).await;
    c.systemctl_ok("node1", &["start", "app.service"]).await;
    c.wait_state("node2", "drover-dep@db.service.service", "active", T)
        .await;
    // dependent on node1 waits for pre on node2, which is held in ExecStartPre.
    c.systemctl_ok("node1", &["start", "--no-block", "dependent.service"])
        .await;
    c.wait_state("node2", "pre.service", "activating", T).await;
    c.wait_state("node1", "drover-proxy@node2_pre.service", "activating", T)
        .await;
    let mut monitor = c.monitor().await;
    monitor
        .subscribe_list("node2", &["db.service", "pre.service", "barrier.service"])
        .await
        .expect("SubscribeList");
    monitor
        .expect(
            "pre's state replayed",
            T,
            |e| matches!(e, Ev::State { unit, .. } if unit == "pre.service"),
        )
        .await
        .unwrap();
    let mark = monitor.mark();

    // The proxy helper on node1, waiting in CreateProxy.
    let (f1, agent1) = forger_at_agent(&c, "node1").await;
    let helper_pid: u32 = timestamp(&c, "node1", "drover-proxy@node2_pre.service", "MainPID")
        .await
        .try_into()
        .unwrap();
    let helper = unique_name_of(&f1.conn, helper_pid).await;

    let (f2, agent2) = forger_at_agent(&c, "node2").await;
    let db_path = object(&unit_path("db.service"));
    forge_state(&f2, &agent2, "db.service", "inactive", "dead").await;
    forge_state(&f2, &agent2, "db.service", "failed", "failed").await;
    forge_state(&f2, &agent2, "pre.service", "active", "running").await;
    f2.signal(
        &agent2,
        MANAGER_PATH,
        MANAGER_IFACE,
        "UnitRemoved",
        &("db.service", &db_path),
    )
    .await;
    f2.signal(
        &agent2,
        MANAGER_PATH,
        MANAGER_IFACE,
        "UnitNew",
        &("db.service", &db_path),
    )
    .await;
    f2.signal(&agent2, MANAGER_PATH, MANAGER_IFACE, "Reloading", &(true,))
        .await;
    // The job of pre's start, as systemd's broadcast JobNew told every user.
    let job: u32 = timestamp(&c, "node2", "pre.service", "Job")
        .await
        .try_into()
        .unwrap();
    let job_path = object(&format!("/org/freedesktop/systemd1/job/{job}"));
    f2.signal(
        &agent2,
        MANAGER_PATH,
        MANAGER_IFACE,
        "JobRemoved",
        &(job, &job_path, "pre.service", "done"),
    )
    .await;
    // Claim systemd's name in a forged owner change, then speak as the "new owner".
    let me = f2.unique_name();
    f2.signal(
        &agent2,
        DBUS_PATH,
        DBUS,
        "NameOwnerChanged",
        &("org.freedesktop.systemd1", "", me.as_str()),
    )
    .await;
    forge_state(&f2, &agent2, "db.service", "inactive", "dead").await;
    f2.sync().await;

    // node1's agent: "the CreateProxy caller (the helper in the proxy unit) left".
    f1.signal(
        &agent1,
        DBUS_PATH,
        DBUS,
        "NameOwnerChanged",
        &(helper.as_str(), helper.as_str(), ""),
    )
    .await;
    // The helper itself: "your CreateProxy succeeded", as a signal that names the
    // call's serial (Hello is 1, CreateProxy the next few).
    for serial in 1..=8u32 {
        let answer = zbus::Message::signal(MANAGER_PATH, "org.eclipse.bluechi.Agent", "Done")
            .destination(helper.as_str())
            .reply_serial(std::num::NonZeroU32::new(serial))
            .build(&())
            .unwrap();
        f1.send(&answer).await;
    }
    f1.sync().await;

    // The barrier: a real change on node2 reaches the monitor behind the forgeries.
    c.systemctl_ok("node2", &["start", "barrier.service"]).await;
    monitor
        .expect("barrier's real start", T, |e| {
            matches!(e, Ev::State { unit, active, reason, .. }
                if unit == "barrier.service" && active == "active" && reason == "real")
        })
        .await
        .unwrap();
    let forged: Vec<&Ev> = monitor
        .since(mark)
        .iter()
        .filter(|e| e.unit().is_some_and(|(_, u)| u != "barrier.service"))
        .collect();
    assert!(
        forged.is_empty(),
        "forged signals reached the manager: {forged:?}"
    );

    // Released for real: pre becomes active, and only then dependent.
    c.systemctl_ok(
        "node2",
        &[
            "kill",
            "--kill-whom=control",
            "--signal=SIGUSR1",
            "pre.service",
        ],
    )
    .await;
    c.wait_state("node1", "dependent.service", "active", T)
        .await;
    let target_active =
        timestamp(&c, "node2", "pre.service", "ActiveEnterTimestampMonotonic").await;
    let dependent_active = timestamp(
        &c,
        "node1",
        "dependent.service",
        "ActiveEnterTimestampMonotonic",
    )
    .await;
    assert!(
        dependent_active >= target_active,
        "dependent became active at {dependent_active} µs, before its target at {target_active} µs"
    );
    for (node, unit) in [
        ("node1", "app.service"),
        ("node2", "db.service"),
        ("node2", "drover-dep@db.service.service"),
    ] {
        assert_eq!(c.state(node, unit).await, "active", "{unit} on {node}");
    }

    // Dropped, counted, said.
    let log2 = wait_log(&c.log_path("node2"), "dropped a PropertiesChanged signal").await;
    assert!(log2.contains(&format!("from {me}")), "{log2}");
    let log1 = read(&c.log_path("node1"));
    assert!(!log1.contains("the caller left the bus"), "{log1}");
    c.down().await;
}

/// A forged `JobRemoved` "done" for a job that still runs: `droverctl start` waits for
/// the real end and reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_job_removed_does_not_end_droverctl_start() {
    let c = TestCluster::with(options(2)).await;
    c.install("node2", "slow.service", SLOW_START).await;
    let mut start = c.follow(&["start", "node2", "slow.service"]);
    c.wait_state("node2", "slow.service", "activating", T).await;
    let job: u32 = timestamp(&c, "node2", "slow.service", "Job")
        .await
        .try_into()
        .unwrap();
    let job_path = object(&format!("/org/freedesktop/systemd1/job/{job}"));
    let (f, agent) = forger_at_agent(&c, "node2").await;
    f.signal(
        &agent,
        MANAGER_PATH,
        MANAGER_IFACE,
        "JobRemoved",
        &(job, &job_path, "slow.service", "done"),
    )
    .await;
    f.sync().await;
    // The real end: the start job is cancelled by a stop.
    c.systemctl_ok("node2", &["stop", "slow.service"]).await;
    let line = start
        .expect_line("the job's result", T, |l| l.contains("operation result"))
        .await
        .unwrap();
    let out = start.seen[line].clone();
    let status = start.wait_exit(T).await.unwrap();
    assert!(!status.success(), "droverctl start exited 0: {out}");
    assert!(out.contains("result: canceled"), "{out}");
    assert!(!out.contains("result: done"), "{out}");
    wait_log(&c.log_path("node2"), "dropped a JobRemoved signal").await;
    c.down().await;
}

/// On the manager host: forged monitor signals to the operator's `droverctl monitor`,
/// a forged "the manager left" to it, and a forged "this client left" to the manager
/// about another client's monitor. The terminal shows only the manager's events, the
/// monitor command keeps running, the other client's monitor keeps its events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_monitor_signals_reach_neither_droverctl_nor_the_manager() {
    let c = TestCluster::with(options(1)).await;
    c.install("node1", "db.service", SLEEPER).await;
    c.systemctl_ok("node1", &["start", "db.service"]).await;
    let mut ctl = c.follow(&["monitor", "node1", "db.service"]);
    let header = ctl
        .expect_line("the monitor path", T, |l| l.starts_with("Monitor path: "))
        .await
        .unwrap();
    let path = ctl.seen[header]
        .strip_prefix("Monitor path: ")
        .unwrap()
        .to_owned();
    ctl.expect_line("db's replayed state", T, |l| l.contains("Active: active"))
        .await
        .unwrap();
    let mut other = c.monitor().await;
    other.subscribe("node1", "db.service").await.unwrap();
    other
        .expect("db's replayed state", T, |e| matches!(e, Ev::State { .. }))
        .await
        .unwrap();
    ctl.skip_seen();
    let mark = other.mark();

    let f = Forger::nobody(c.bus_address()).await;
    let ctl_name = unique_name_of(&f.conn, ctl.pid().unwrap()).await;
    let manager_pid = drover_sandbox::Cluster::state(&c)
        .manager_pid
        .expect("the manager runs");
    let manager = unique_name_of(&f.conn, manager_pid).await;
    let other_name = other.conn.unique_name().unwrap().to_string();
    f.signal(
        &ctl_name,
        &path,
        "org.eclipse.bluechi.Monitor",
        "UnitStateChanged",
        &("node1", "db.service", "failed", "forged", "real"),
    )
    .await;
    f.signal(
        &ctl_name,
        DBUS_PATH,
        DBUS,
        "NameOwnerChanged",
        &("org.eclipse.bluechi", manager.as_str(), ""),
    )
    .await;
    f.signal(
        &manager,
        DBUS_PATH,
        DBUS,
        "NameOwnerChanged",
        &(other_name.as_str(), other_name.as_str(), ""),
    )
    .await;
    f.sync().await;

    // The barrier: a real change, seen by both.
    c.systemctl_ok("node1", &["restart", "db.service"]).await;
    ctl.expect_line("db's real restart", T, |l| {
        l.trim() == "Active: active (running)"
    })
    .await
    .unwrap();
    other
        .expect("db's real restart", T, |e| {
            matches!(e, Ev::State { active, reason, .. } if active == "active" && reason == "real")
        })
        .await
        .unwrap();
    let printed = ctl.seen.join("\n");
    assert!(!printed.contains("forged"), "{printed}");
    assert!(ctl.pid().is_some(), "droverctl monitor keeps running");
    let stderr = ctl.drain_stderr();
    assert!(
        stderr.contains("dropped a UnitStateChanged signal"),
        "{stderr}"
    );
    assert!(
        !other
            .since(mark)
            .iter()
            .any(|e| matches!(e, Ev::PeerRemoved { .. })),
        "{:?}",
        other.since(mark)
    );
    ctl.interrupt(T).await.unwrap();
    c.down().await;
}

/// systemd changes its unique name when it re-executes (`daemon-reexec`): the agent
/// follows the bus daemon's word and hears the new owner, the old name is no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_follows_systemd_across_a_reexec() {
    let c = TestCluster::with(options(1)).await;
    c.install("node1", "db.service", SLEEPER).await;
    let mut monitor = c.monitor().await;
    monitor.subscribe("node1", "db.service").await.unwrap();
    let (f, agent) = forger_at_agent(&c, "node1").await;
    let dbus = zbus::fdo::DBusProxy::new(&f.conn).await.unwrap();
    let systemd = zbus::names::BusName::try_from("org.freedesktop.systemd1").unwrap();
    let before = dbus.get_name_owner(systemd.clone()).await.unwrap();
    c.systemctl_ok("node1", &["daemon-reexec"]).await;
    let after = dbus.get_name_owner(systemd).await.unwrap();
    assert_ne!(
        before, after,
        "systemd has a new unique name after daemon-reexec"
    );

    c.systemctl_ok("node1", &["start", "db.service"]).await;
    monitor
        .expect("db's real start, from the new owner", T, |e| {
            matches!(e, Ev::State { active, reason, .. } if active == "active" && reason == "real")
        })
        .await
        .unwrap();
    // And a forgery still goes nowhere.
    let mark = monitor.mark();
    forge_state(&f, &agent, "db.service", "failed", "failed").await;
    f.sync().await;
    c.systemctl_ok("node1", &["stop", "db.service"]).await;
    monitor
        .expect("db's real stop", T, |e| {
            matches!(e, Ev::State { active, reason, .. } if active == "inactive" && reason == "real")
        })
        .await
        .unwrap();
    let failed: Vec<&Ev> = monitor
        .since(mark)
        .iter()
        .filter(|e| matches!(e, Ev::State { active, .. } if active == "failed"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    wait_log(
        &c.log_path("node1"),
        "org.freedesktop.systemd1 is now owned by",
    )
    .await;
    c.down().await;
}

/// Another root process asks for the daemons' names with replacement (BlueChi's
/// daemons allow it, and then ran on owning nothing), and `nobody` tells them they
/// lost their names: both keep their names and serve on, a proxy still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_takes_the_daemons_names_over() {
    let c = TestCluster::with(options(2)).await;
    c.install("node2", "db.service", SLEEPER).await;
    let app = requester("Wants", "drover-proxy@node2_db.service");
    c.install("node1", "app.service", &app).await;
    let flags = zbus::fdo::RequestNameFlags::REPLACE_EXISTING
        | zbus::fdo::RequestNameFlags::ALLOW_REPLACEMENT
        | zbus::fdo::RequestNameFlags::DO_NOT_QUEUE;
    for (address, name) in [
        (c.node_bus_address("node1"), "org.eclipse.bluechi.Agent"),
        (c.bus_address().to_owned(), "org.eclipse.bluechi"),
    ] {
        let rival = drover_testkit::api::connect(&address).await;
        let taken = rival.request_name_with_flags(name, flags).await;
        assert!(
            matches!(taken, Err(zbus::Error::NameTaken)),
            "root asking to replace the owner of {name}: {taken:?}"
        );
        drop(rival);
    }
    let (f1, agent1) = forger_at_agent(&c, "node1").await;
    f1.signal(
        &agent1,
        DBUS_PATH,
        DBUS,
        "NameLost",
        &("org.eclipse.bluechi.Agent",),
    )
    .await;
    f1.sync().await;
    let f = Forger::nobody(c.bus_address()).await;
    let manager_pid = drover_sandbox::Cluster::state(&c)
        .manager_pid
        .expect("the manager runs");
    let manager = unique_name_of(&f.conn, manager_pid).await;
    f.signal(
        &manager,
        DBUS_PATH,
        DBUS,
        "NameLost",
        &("org.eclipse.bluechi",),
    )
    .await;
    f.sync().await;

    // Both still serve: a cross-node dependency goes through agent and manager.
    c.systemctl_ok("node1", &["start", "app.service"]).await;
    c.wait_state("node1", "drover-proxy@node2_db.service", "active", T)
        .await;
    assert_eq!(c.state("node2", "db.service").await, "active");
    let status = c.ctl_ok(&["status"]).await;
    assert!(
        status.contains("node1") && status.contains("online"),
        "{status}"
    );
    for log in [c.log_path("manager"), c.log_path("node1")] {
        let text = read(&log);
        assert!(!text.contains("lost the bus name"), "{text}");
    }
    c.down().await;
}
