//! droverctl end to end against a stand-in manager on a private dbus-daemon.
//!
//! The stand-in serves the BlueChi API members droverctl uses (same names,
//! signatures and error names as the real manager must), so these tests pin the
//! D-Bus side: paths, the subscribe-before-call order for jobs, error mapping, exit
//! codes, and not hanging when the manager goes away. Tests against the real manager
//! and real systemd nodes live in the workspace `tests/` crate.
//!
//! Every test starts its own dbus-daemon in its own temp dir; [`Bus`]'s `Drop`
//! kills it and removes the dir, also when a test fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use drover_sandbox::PrivateBus;
use drover_testkit::api::{BUS_NAME, UnitTuple};
use drover_testkit::ctl::{Ctl, CtlFollower};
use drover_testkit::process::Run;
use drover_testkit::standin::NamedError;
use tokio::sync::{Mutex, Notify};
use tokio::time::error::Elapsed;
use zbus::message::Header;
use zbus::{Connection, ObjectPath, OwnedObjectPath, interface};

// ---------------------------------------------------------------------------------
// A private bus

/// This test's own dbus-daemon.
type Bus = PrivateBus;

fn private_bus() -> Bus {
    PrivateBus::start("droverctl-test").expect("private dbus-daemon")
}

// ---------------------------------------------------------------------------------
// The stand-in manager

fn unit(name: &str, active: &str, sub: &str) -> UnitTuple {
    let root = OwnedObjectPath::try_from("/").expect("path");
    (
        name.into(),
        format!("{name} description"),
        "loaded".into(),
        active.into(),
        sub.into(),
        String::new(),
        root.clone(),
        0,
        String::new(),
        root,
    )
}

/// What the stand-in saw, for assertions.
#[derive(Default)]
struct Shared {
    next_job: AtomicU32,
    calls: Mutex<Vec<String>>,
    slow_job_started: Notify,
    /// `hang.service`: the call arrived and is never answered.
    hang_started: Notify,
    monitor_subscribed: Notify,
    /// `9node` cannot be listed: the controller's list leaves it out and its own
    /// `ListUnits` fails (a node the manager timed out on).
    unlistable_9node: std::sync::atomic::AtomicBool,
}

#[derive(Clone)]
struct NodeSpec {
    name: &'static str,
    /// Hard-coded, not computed with droverctl's escaping: the test checks it.
    path: &'static str,
    online: bool,
    ip: &'static str,
    last_seen: u64,
    units: Vec<UnitTuple>,
}

fn fleet() -> Vec<NodeSpec> {
    vec![
        NodeSpec {
            name: "node-a",
            path: "/org/eclipse/bluechi/node/node_2da",
            online: true,
            ip: "127.0.0.1",
            last_seen: 1_700_000_000_000_000,
            units: vec![
                unit("web.service", "active", "running"),
                unit("db.service", "inactive", "dead"),
                unit("drover-dep@db.service.service", "active", "exited"),
            ],
        },
        NodeSpec {
            name: "9node",
            path: "/org/eclipse/bluechi/node/_39node",
            online: true,
            ip: "10.0.0.9",
            last_seen: 1_700_000_000_000_000,
            units: vec![unit("worker.service", "failed", "failed")],
        },
        NodeSpec {
            name: "node-b",
            path: "/org/eclipse/bluechi/node/node_2db",
            online: false,
            ip: "",
            last_seen: 0,
            units: vec![],
        },
        NodeSpec {
            name: "node-c",
            path: "/org/eclipse/bluechi/node/node_2dc",
            online: false,
            ip: "",
            last_seen: 1_600_000_000_000_000,
            units: vec![],
        },
    ]
}

struct FakeController {
    nodes: Vec<NodeSpec>,
    shared: Arc<Shared>,
}

/// Events a subscription replays before its reply: more than zbus queues by
/// default, so droverctl must print them while the call is still in flight.
const REPLAYED_STATES: usize = 200;

/// A monitor: records calls, and answers `SubscribeList` with a burst of events
/// unicast to its owner (BlueChi sends monitor signals only to owner and peers).
struct FakeMonitor {
    path: String,
    shared: Arc<Shared>,
}

#[interface(name = "org.eclipse.bluechi.Monitor")]
impl FakeMonitor {
    async fn subscribe_list(
        &self,
        node: &str,
        units: Vec<String>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<u32, NamedError> {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("SubscribeList {node} {}", units.join(",")));
        let owner = hdr.sender().expect("caller").to_owned();
        let iface = "org.eclipse.bluechi.Monitor";
        let path = self.path.as_str();
        for unit in &units {
            conn.emit_signal(
                Some(&owner),
                path,
                iface,
                "UnitNew",
                &(node, unit.as_str(), "virtual"),
            )
            .await
            .expect("emit");
            for i in 0..REPLAYED_STATES {
                conn.emit_signal(
                    Some(&owner),
                    path,
                    iface,
                    "UnitStateChanged",
                    &(node, unit.as_str(), "active", format!("s{i}"), "virtual"),
                )
                .await
                .expect("emit");
            }
            let mut props: HashMap<&str, zbus::Variant<'_>> = HashMap::new();
            props.insert("SubState", zbus::Variant::from("running"));
            props.insert("NRestarts", zbus::Variant::from(3u32));
            conn.emit_signal(
                Some(&owner),
                path,
                iface,
                "UnitPropertiesChanged",
                &(node, unit.as_str(), "org.freedesktop.systemd1.Unit", props),
            )
            .await
            .expect("emit");
            conn.emit_signal(
                Some(&owner),
                path,
                iface,
                "UnitRemoved",
                &(node, unit.as_str(), "real"),
            )
            .await
            .expect("emit");
        }
        self.shared.monitor_subscribed.notify_one();
        Ok(2)
    }

    async fn close(&self) {
        self.shared.calls.lock().await.push("Close".to_owned());
    }
}

#[interface(name = "org.eclipse.bluechi.Controller")]
impl FakeController {
    fn list_nodes(&self) -> Vec<(String, OwnedObjectPath, String, String)> {
        self.nodes
            .iter()
            .map(|n| {
                (
                    n.name.to_owned(),
                    OwnedObjectPath::try_from(n.path).expect("path"),
                    if n.online { "online" } else { "offline" }.to_owned(),
                    n.ip.to_owned(),
                )
            })
            .collect()
    }

    async fn create_monitor(
        &self,
        #[zbus(object_server)] server: &zbus::ObjectServer,
    ) -> OwnedObjectPath {
        let path = "/org/eclipse/bluechi/monitor/1";
        let monitor = FakeMonitor {
            path: path.to_owned(),
            shared: self.shared.clone(),
        };
        server.at(path, monitor).await.expect("export monitor");
        self.shared
            .calls
            .lock()
            .await
            .push("CreateMonitor".to_owned());
        OwnedObjectPath::try_from(path).expect("path")
    }

    async fn set_log_level(&self, level: &str) {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("SetLogLevel {level}"));
    }

    /// Refused as the real manager refuses a fleet too large for one D-Bus reply:
    /// droverctl lists node by node and never needs this call.
    fn list_units(&self) -> Result<HashMap<String, Vec<UnitTuple>>, NamedError> {
        Err(NamedError::new(
            "org.freedesktop.DBus.Error.LimitsExceeded",
            "the answer of Controller.ListUnits would be too large",
        ))
    }
}

struct FakeNode {
    spec: NodeSpec,
    shared: Arc<Shared>,
}

impl FakeNode {
    fn check_online(&self) -> Result<(), NamedError> {
        if self.spec.online {
            Ok(())
        } else {
            Err(NamedError::new(
                "org.eclipse.bluechi.Offline",
                "Node is offline",
            ))
        }
    }

    async fn job(
        &self,
        conn: &Connection,
        method: &str,
        unit: &str,
        mode: &str,
    ) -> Result<OwnedObjectPath, NamedError> {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("{} {method} {unit} {mode}", self.spec.name));
        self.check_online()?;
        if unit == "missing.service" {
            return Err(NamedError::new(
                "org.freedesktop.systemd1.NoSuchUnit",
                "Unit missing.service not found.",
            ));
        }
        let id = self.shared.next_job.fetch_add(1, Ordering::SeqCst) + 1;
        let path = format!("/org/eclipse/bluechi/job/{id}");
        let emit = |job_id: u32, job: String, result: &'static str| {
            let node = self.spec.name;
            let unit = unit.to_owned();
            async move {
                let job = ObjectPath::try_from(job.as_str()).expect("job path");
                conn.emit_signal(
                    None::<zbus::names::BusName<'_>>,
                    "/org/eclipse/bluechi",
                    "org.eclipse.bluechi.Controller",
                    "JobRemoved",
                    &(job_id, job, node, unit.as_str(), result),
                )
                .await
                .expect("emit JobRemoved");
            }
        };
        match unit {
            "slow.service" => self.shared.slow_job_started.notify_one(),
            "hang.service" => {
                self.shared.hang_started.notify_one();
                std::future::pending::<()>().await;
            }
            // Finish before the reply goes out, as a fast oneshot unit does, and let
            // someone else's job end first: droverctl must pick its own.
            "web.service" | "fail.service" => {
                emit(
                    id + 1000,
                    format!("/org/eclipse/bluechi/job/{}", id + 1000),
                    "failed",
                )
                .await;
                let result = if unit == "web.service" {
                    "done"
                } else {
                    "failed"
                };
                emit(id, path.clone(), result).await;
            }
            // Far more signals than a zbus queue holds before the reply goes out:
            // droverctl must keep reading them while it waits for the reply.
            "flood.service" => {
                for other in 0..300 {
                    let other_id = id + 10_000 + other;
                    emit(
                        other_id,
                        format!("/org/eclipse/bluechi/job/{other_id}"),
                        "canceled",
                    )
                    .await;
                }
                emit(id, path.clone(), "done").await;
            }
            _ => emit(id, path.clone(), "done").await,
        }
        Ok(OwnedObjectPath::try_from(path).expect("job path"))
    }
}

#[interface(name = "org.eclipse.bluechi.Node")]
impl FakeNode {
    async fn start_unit(
        &self,
        name: &str,
        mode: &str,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, NamedError> {
        self.job(conn, "StartUnit", name, mode).await
    }

    async fn stop_unit(
        &self,
        name: &str,
        mode: &str,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, NamedError> {
        self.job(conn, "StopUnit", name, mode).await
    }

    async fn restart_unit(
        &self,
        name: &str,
        mode: &str,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, NamedError> {
        self.job(conn, "RestartUnit", name, mode).await
    }

    async fn reload_unit(
        &self,
        name: &str,
        mode: &str,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, NamedError> {
        self.job(conn, "ReloadUnit", name, mode).await
    }

    fn list_units(&self) -> Result<Vec<UnitTuple>, NamedError> {
        self.check_online()?;
        if self.spec.name == "9node" && self.shared.unlistable_9node.load(Ordering::SeqCst) {
            return Err(NamedError::new(
                "org.eclipse.bluechi.Timeout",
                "node 9node did not answer in time",
            ));
        }
        Ok(self.spec.units.clone())
    }

    async fn kill_unit(&self, name: &str, who: &str, signal: i32) -> Result<(), NamedError> {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("{} KillUnit {name} {who} {signal}", self.spec.name));
        self.check_online()
    }

    async fn set_log_level(&self, level: &str) -> Result<(), NamedError> {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("{} SetLogLevel {level}", self.spec.name));
        self.check_online()
    }

    fn get_unit_file_state(&self, file: &str) -> Result<String, NamedError> {
        self.check_online()?;
        match file {
            "web.service" => Ok("enabled".to_owned()),
            "db.service" => Ok("disabled".to_owned()),
            "static.service" => Ok("static".to_owned()),
            _ => Err(NamedError::new(
                "org.freedesktop.DBus.Error.FileNotFound",
                "No such file or directory",
            )),
        }
    }

    async fn reload(&self) -> Result<(), NamedError> {
        self.shared
            .calls
            .lock()
            .await
            .push(format!("{} Reload", self.spec.name));
        self.check_online()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp(&self) -> u64 {
        self.spec.last_seen
    }
}

/// Start the stand-in manager on `bus`, owning `org.eclipse.bluechi`.
async fn serve(bus: &Bus) -> (Connection, Arc<Shared>) {
    let shared = Arc::new(Shared::default());
    let nodes = fleet();
    let mut builder = zbus::connection::Builder::address(bus.address()).serve_at(
        "/org/eclipse/bluechi",
        FakeController {
            nodes: nodes.clone(),
            shared: shared.clone(),
        },
    );
    for spec in nodes {
        builder = builder.serve_at(
            spec.path,
            FakeNode {
                spec: spec.clone(),
                shared: shared.clone(),
            },
        );
    }
    let conn = builder
        .name(BUS_NAME)
        .build()
        .await
        .expect("stand-in manager on the test bus");
    (conn, shared)
}

// ---------------------------------------------------------------------------------
// Driving the binary

/// This build's droverctl, told the bus with `--bus`.
fn ctl(bus: &Bus) -> Ctl {
    Ctl::flag(env!("CARGO_BIN_EXE_droverctl"), bus.address())
}

async fn droverctl(bus: &Bus, args: &[&str]) -> Run {
    ctl(bus).run(args).await
}

/// A droverctl run left in flight while the test acts on the stand-in: spawned, and
/// handed back once `arrived` says its call reached the stand-in.
struct InFlight(tokio::task::JoinHandle<Result<std::io::Result<std::process::Output>, Elapsed>>);

async fn droverctl_in_flight(bus: &Bus, args: &[&str], arrived: &Notify) -> InFlight {
    let mut cmd = ctl(bus).command(args);
    let run =
        tokio::spawn(
            async move { tokio::time::timeout(Duration::from_secs(30), cmd.output()).await },
        );
    tokio::time::timeout(Duration::from_secs(10), arrived.notified())
        .await
        .expect("droverctl never called StartUnit");
    InFlight(run)
}

impl InFlight {
    /// The run's end; `hung` says what the test expected to end it.
    async fn finish(self, hung: &str) -> Run {
        let out = self
            .0
            .await
            .expect("join")
            .expect(hung)
            .expect("run droverctl");
        Run::from(out)
    }
}

fn fields(line: &str) -> Vec<&str> {
    line.split('|').map(str::trim).collect()
}

// ---------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_every_node_like_bluechictl() {
    let bus = private_bus();
    let (_mgr, _) = serve(&bus).await;

    let r = droverctl(&bus, &["status"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    // This manager serves no io.drover.Controller: HEALTH is unknown.
    assert_eq!(
        fields(lines[0]),
        ["NODE", "STATE", "IP", "LAST SEEN", "HEALTH"]
    );
    assert!(lines[1].chars().all(|c| c == '='));
    assert_eq!(
        fields(lines[2]),
        ["node-a", "online", "127.0.0.1", "now", "-"]
    );
    assert_eq!(
        fields(lines[3]),
        ["9node", "online", "10.0.0.9", "now", "-"]
    );
    assert_eq!(fields(lines[4]), ["node-b", "offline", "", "never", "-"]);
    let c = fields(lines[5]);
    assert_eq!(c[..2], ["node-c", "offline"]);
    assert!(c[3].starts_with("2020-09-1"), "{}", c[3]);
    assert_eq!(lines.len(), 6);

    let r = droverctl(&bus, &["status", "node-c", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(1));
    assert_eq!(v[0]["node"], "node-c");
    assert_eq!(v[0]["last_seen_usec"], 1_600_000_000_000_000u64);

    let r = droverctl(&bus, &["status", "node-z"]).await;
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr, "droverctl: node 'node-z' not found\n");
    assert!(r.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_all_nodes_one_node_and_filter() {
    let bus = private_bus();
    let (_mgr, _) = serve(&bus).await;

    let r = droverctl(&bus, &["list-units"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let rows: Vec<Vec<&str>> = r.stdout.lines().skip(2).map(fields).collect();
    assert_eq!(
        rows,
        [
            vec!["9node", "worker.service", "failed", "failed"],
            vec!["node-a", "db.service", "inactive", "dead"],
            vec![
                "node-a",
                "drover-dep@db.service.service",
                "active",
                "exited"
            ],
            vec!["node-a", "web.service", "active", "running"],
        ]
    );

    let r = droverctl(&bus, &["list-units", "node-a", "--filter", "d*"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let units: Vec<&str> = r.stdout.lines().skip(2).map(|l| fields(l)[1]).collect();
    assert_eq!(units, ["db.service", "drover-dep@db.service.service"]);

    // The node path with a leading digit is escaped (_39node).
    let r = droverctl(&bus, &["--json", "list-units", "9node"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v[0]["unit"], "worker.service");
    assert_eq!(v[0]["node"], "9node");

    let r = droverctl(&bus, &["list-units", "node-b"]).await;
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr, "droverctl: node node-b is offline\n");

    let r = droverctl(&bus, &["list-units", "node-z"]).await;
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr, "droverctl: node 'node-z' not found\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_over_all_nodes_names_a_node_it_could_not_list_and_fails() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;
    shared.unlistable_9node.store(true, Ordering::SeqCst);

    let r = droverctl(&bus, &["list-units"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    // The nodes that could be listed are printed in full.
    let nodes: Vec<&str> = r.stdout.lines().skip(2).map(|l| fields(l)[0]).collect();
    assert_eq!(nodes, ["node-a", "node-a", "node-a"], "{}", r.stdout);
    let err: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(err.len(), 2, "{}", r.stderr);
    assert!(
        err[0].starts_with("droverctl: cannot list units of node 9node: ")
            && err[0].contains("did not answer in time"),
        "{}",
        r.stderr
    );
    assert_eq!(err[1], "droverctl: 1 node(s) left out of the list: 9node");
}

/// With `--json`, the nodes that could be listed make one JSON document on
/// stdout, exactly the rows of those nodes; the node that could not be listed
/// goes to stderr and the exit status is 1 (issue 14 item 4, streamed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_units_json_over_all_nodes_names_a_node_it_could_not_list_and_fails() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;
    let r = droverctl(&bus, &["--json", "list-units"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let all: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let nodes: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["9node", "node-a", "node-a", "node-a"]);

    shared.unlistable_9node.store(true, Ordering::SeqCst);
    let r = droverctl(&bus, &["--json", "list-units"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(
        v,
        serde_json::Value::Array(all.as_array().unwrap()[1..].to_vec()),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .starts_with("droverctl: cannot list units of node 9node: "),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_waits_for_its_own_job_and_exit_code_follows_the_result() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;

    // The job ends before the reply, after another job's JobRemoved.
    let r = droverctl(&bus, &["start", "node-a", "web"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "Unit web.service StartUnit operation result: done\n"
    );
    assert!(r.stderr.is_empty(), "{}", r.stderr);

    let r = droverctl(&bus, &["restart", "node-a", "fail.service"]).await;
    assert_eq!(r.code, 1);
    assert_eq!(
        r.stdout,
        "Unit fail.service RestartUnit operation result: failed\n"
    );
    assert!(
        r.stderr.contains("finished with result 'failed'"),
        "{}",
        r.stderr
    );

    let r = droverctl(&bus, &["--json", "stop", "node-a", "db.service"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v[0]["operation"], "StopUnit");
    assert_eq!(v[0]["result"], "done");
    assert!(
        v[0]["job"]
            .as_str()
            .unwrap_or("")
            .starts_with("/org/eclipse/bluechi/job/")
    );

    let r = droverctl(&bus, &["reload", "node-a", "db"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);

    let r = droverctl(&bus, &["start", "node-a", "flood"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "Unit flood.service StartUnit operation result: done\n"
    );

    assert_eq!(
        *shared.calls.lock().await,
        [
            "node-a StartUnit web.service replace",
            "node-a RestartUnit fail.service replace",
            "node-a StopUnit db.service replace",
            "node-a ReloadUnit db.service replace",
            "node-a StartUnit flood.service replace",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_friendly_and_exit_1() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;

    let r = droverctl(&bus, &["start", "node-b", "web"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "droverctl: node node-b is offline\n")
    );
    let r = droverctl(&bus, &["start", "node-z", "web"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "droverctl: node 'node-z' not found\n")
    );
    let r = droverctl(&bus, &["start", "node-a", "missing"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            1,
            "droverctl: unit missing.service not found on node node-a\n"
        )
    );
    let r = droverctl(&bus, &["daemon-reload", "node-b"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "droverctl: node node-b is offline\n")
    );

    // Usage errors send nothing.
    let before = shared.calls.lock().await.len();
    for bad in [
        &["start", "node_a", "web"][..],
        &["start", "node-a", "we b"],
        &["start", "node-a"],
        &["frobnicate"],
        &["status", "--bogus"],
    ] {
        let r = droverctl(&bus, bad).await;
        assert_eq!(r.code, 2, "{bad:?}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
    assert_eq!(shared.calls.lock().await.len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reload() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;
    let r = droverctl(&bus, &["daemon-reload", "node-a"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert_eq!(*shared.calls.lock().await, ["node-a Reload"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_gives_up_with_exit_1() {
    let bus = private_bus();
    let (_mgr, _) = serve(&bus).await;
    let started = std::time::Instant::now();
    let r = droverctl(&bus, &["start", "node-a", "slow", "--timeout", "0.5"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("droverctl: timed out after 0.5 s"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("/org/eclipse/bluechi/job/"),
        "{}",
        r.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_leaving_while_waiting_is_reported_not_a_hang() {
    let bus = private_bus();
    let (mgr, shared) = serve(&bus).await;
    // droverctl subscribes before it calls, so once the call arrived it is listening.
    let run =
        droverctl_in_flight(&bus, &["start", "node-a", "slow"], &shared.slow_job_started).await;
    mgr.release_name(BUS_NAME).await.expect("release name");
    let r = run.finish("droverctl hung after the manager left").await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("drover-manager left"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("StartUnit of unit slow.service on node node-a"),
        "{}",
        r.stderr
    );
}

/// The manager leaving the bus while a call is in flight: the bus daemon answers
/// the call with `NoReply` ("recipient disconnected"); droverctl says the manager
/// is gone (exit 1), as when it was never there, not a raw D-Bus error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_leaving_during_a_call_is_reported_as_gone() {
    let bus = private_bus();
    let (mgr, shared) = serve(&bus).await;
    let run = droverctl_in_flight(&bus, &["start", "node-a", "hang"], &shared.hang_started).await;
    mgr.close().await.expect("close the manager's connection");
    let r = run.finish("droverctl hung after the manager left").await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!(
            "droverctl: cannot reach drover-manager on bus {}: is it running?\n",
            bus.address()
        )
    );
}

/// Anyone on the bus can send a signal, also straight to droverctl's unique name: a
/// `JobRemoved` for our job that does not come from the manager that took the call must
/// not end the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_removed_from_another_peer_is_not_our_jobs_end() {
    let bus = private_bus();
    let (mgr, shared) = serve(&bus).await;
    let run = droverctl_in_flight(
        &bus,
        &["start", "node-a", "slow", "--timeout", "3"],
        &shared.slow_job_started,
    )
    .await;
    let id = shared.next_job.load(Ordering::SeqCst);
    let job = format!("/org/eclipse/bluechi/job/{id}");
    let job = ObjectPath::try_from(job.as_str()).expect("job path");

    let impostor = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("impostor connection");
    let dbus = zbus::fdo::DBusProxy::new(&impostor)
        .await
        .expect("dbus proxy");
    let mine = [
        impostor.unique_name().expect("name").to_string(),
        mgr.unique_name().expect("name").to_string(),
    ];
    let body = (id, job, "node-a", "slow.service", "done");
    for name in dbus.list_names().await.expect("ListNames") {
        if !name.starts_with(':') || mine.contains(&name.to_string()) {
            continue;
        }
        impostor
            .emit_signal(
                Some(name.as_str()),
                "/org/eclipse/bluechi",
                "org.eclipse.bluechi.Controller",
                "JobRemoved",
                &body,
            )
            .await
            .expect("unicast JobRemoved");
    }
    impostor
        .emit_signal(
            None::<zbus::names::BusName<'_>>,
            "/org/eclipse/bluechi",
            "org.eclipse.bluechi.Controller",
            "JobRemoved",
            &body,
        )
        .await
        .expect("broadcast JobRemoved");

    let r = run.finish("droverctl did not give up at --timeout").await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(
        r.stderr.starts_with("droverctl: timed out after 3 s"),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_manager_on_the_bus() {
    let bus = private_bus();
    for args in [
        &["status"][..],
        &["list-units"],
        &["start", "node-a", "web"],
    ] {
        let r = droverctl(&bus, args).await;
        assert_eq!(r.code, 1, "{args:?}");
        assert_eq!(
            r.stderr,
            format!(
                "droverctl: cannot reach drover-manager on bus {}: is it running?\n",
                bus.address()
            ),
            "{args:?}"
        );
    }
}

/// `droverctl status | head -0`: the reader is gone before droverctl writes. The
/// binary's own `main` ignores SIGPIPE (the spawn here restores its default, as a
/// shell does), so the write fails, droverctl stops quietly and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_closed_pipe_ends_quietly_with_exit_0() {
    let bus = private_bus();
    let (_mgr, _) = serve(&bus).await;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut cmd = ctl(&bus).command(&["status"]);
    // `spawn`, not `output`: `output` would give stdout a pipe of its own.
    cmd.stdout(writer).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("run droverctl");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("droverctl hung")
        .expect("wait for droverctl");
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_needs_no_bus() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_droverctl"))
        .args(["--bus", "unix:path=/nonexistent/bus", "version"])
        .output()
        .await
        .expect("run droverctl");
    assert_eq!(out.status.code(), Some(0));
    // Which commit: xtask/tests/version.rs checks it against the checkout for every
    // binary. Here, only that the line has its shape without a bus: this test binary
    // and droverctl may be built at different commits when HEAD moves mid-run.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("droverctl version {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = stdout
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("'{stdout}' is not '{prefix}C)'"));
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{stdout}"
    );
}

/// A droverctl that runs until interrupted, its stdout read line by line.
struct Following(CtlFollower);

impl Following {
    fn spawn(bus: &Bus, args: &[&str]) -> Following {
        Following(ctl(bus).follow(args))
    }

    /// The next `n` lines (a missing line is a failure, not a hang).
    async fn read(&mut self, n: usize) -> Vec<String> {
        self.0.next_lines(n, Duration::from_secs(10)).await
    }

    /// Waits for the exit; returns (code, stderr).
    async fn exit(mut self) -> (Option<i32>, String) {
        let limit = Duration::from_secs(10);
        let status = self.0.wait_exit(limit).await.expect("droverctl exits");
        (status.code(), self.0.drain_stderr())
    }

    fn interrupt(&self) {
        self.0.sigint().expect("SIGINT to droverctl");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_prints_bluechictl_lines_in_bus_order_and_ctrl_c_closes_it() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;
    let mut m = Following::spawn(&bus, &["monitor", "node-a", "web,db.socket"]);
    assert_eq!(
        m.read(3).await,
        [
            "Monitor path: /org/eclipse/bluechi/monitor/1",
            "Subscribing to node 'node-a' and unit 'web.service'",
            "Subscribing to node 'node-a' and unit 'db.socket'",
        ]
    );
    for unit in ["web.service", "db.socket"] {
        assert_eq!(
            m.read(2).await,
            [
                format!("[node-a] {unit}"),
                "\tUnit created (reason: virtual)".to_owned()
            ]
        );
        // Every state in the order it was sent, though all came before the reply.
        for i in 0..REPLAYED_STATES {
            assert_eq!(
                m.read(3).await,
                [
                    format!("[node-a] {unit}"),
                    "\tUnit state changed (reason: virtual)".to_owned(),
                    format!("\tActive: active (s{i})"),
                ]
            );
        }
        // Only string-valued properties get a line.
        assert_eq!(
            m.read(3).await,
            [
                format!("[node-a] {unit}"),
                "\tUnit properties changed (Interface: org.freedesktop.systemd1.Unit)".to_owned(),
                "\tSubState: running".to_owned(),
            ]
        );
        assert_eq!(
            m.read(2).await,
            [
                format!("[node-a] {unit}"),
                "\tUnit removed (reason: real)".to_owned()
            ]
        );
    }
    m.interrupt();
    let (code, err) = m.exit().await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        *shared.calls.lock().await,
        [
            "CreateMonitor",
            "SubscribeList node-a web.service,db.socket",
            "Close"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_json_lines_and_exit_1_when_the_manager_leaves() {
    let bus = private_bus();
    let (mgr, shared) = serve(&bus).await;
    let mut m = Following::spawn(&bus, &["--json", "monitor"]);
    let head: serde_json::Value = serde_json::from_str(&m.read(1).await[0]).expect("json");
    assert_eq!(
        head,
        serde_json::json!({"event": "Subscribed", "monitor": "/org/eclipse/bluechi/monitor/1",
                           "node": "*", "units": ["*"]})
    );
    let new: serde_json::Value = serde_json::from_str(&m.read(1).await[0]).expect("json");
    assert_eq!(
        new,
        serde_json::json!({"event": "UnitNew", "node": "*", "unit": "*", "reason": "virtual"})
    );
    let state: serde_json::Value = serde_json::from_str(&m.read(1).await[0]).expect("json");
    assert_eq!(state["event"], "UnitStateChanged");
    assert_eq!(state["sub_state"], "s0");
    tokio::time::timeout(
        Duration::from_secs(10),
        shared.monitor_subscribed.notified(),
    )
    .await
    .expect("subscribed");
    mgr.release_name(BUS_NAME).await.expect("release name");
    let (code, err) = m.exit().await;
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "droverctl: drover-manager left bus {}; stopped monitoring\n",
            bus.address()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_is_enabled_and_set_loglevel_send_what_was_asked_or_nothing() {
    let bus = private_bus();
    let (_mgr, shared) = serve(&bus).await;

    let r = droverctl(
        &bus,
        &[
            "kill",
            "node-a",
            "web",
            "--kill-whom=main",
            "--signal=SIGKILL",
        ],
    )
    .await;
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    let r = droverctl(&bus, &["kill", "node-a", "web"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = droverctl(&bus, &["set-loglevel", "warn"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = droverctl(&bus, &["set-loglevel", "node-a", "DEBUG"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);

    for (unit, code, state) in [
        ("web", 0, "enabled"),
        ("static", 0, "static"),
        ("db", 1, "disabled"),
    ] {
        let r = droverctl(&bus, &["is-enabled", "node-a", unit]).await;
        assert_eq!(
            (r.code, r.stdout.trim(), r.stderr.as_str()),
            (code, state, ""),
            "{unit}"
        );
    }
    let r = droverctl(&bus, &["is-enabled", "node-a", "nosuch"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            1,
            "droverctl: unit nosuch.service not found on node node-a\n"
        )
    );
    let r = droverctl(&bus, &["set-loglevel", "node-b", "INFO"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "droverctl: node node-b is offline\n")
    );

    let before = shared.calls.lock().await.clone();
    for bad in [
        &["kill", "node-a", "web", "--signal=0"][..],
        &["kill", "node-a", "web", "--signal=SIGNOPE"],
        &["kill", "node-a", "web", "--kill-whom=nobody"],
        &["set-loglevel", "LOUD"],
        &["set-loglevel", "node-a", "TRACE"],
        &["set-loglevel", "node_a", "INFO"],
    ] {
        let r = droverctl(&bus, bad).await;
        assert_eq!(r.code, 2, "{bad:?}: {}", r.stderr);
    }
    let after = shared.calls.lock().await.clone();
    assert_eq!(after, before, "nothing was sent for bad arguments");
    assert_eq!(
        after,
        [
            "node-a KillUnit web.service main 9",
            "node-a KillUnit web.service all 15",
            "SetLogLevel WARN",
            "node-a SetLogLevel DEBUG",
            "node-b SetLogLevel INFO",
        ]
    );
}
