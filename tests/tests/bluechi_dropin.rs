//! drover as a drop-in for BlueChi, on real systemd: the daemons start from a
//! tree holding only BlueChi's config files (`/etc/bluechi/…`, found through
//! `DROVER_CONFIG_ROOT`), and the agent's local API serves BlueChi's
//! `SwitchController` (the node moves to a second manager started by the test)
//! and `JobCancel` (a job of the manager is cancelled from the node).

use drover_sandbox::PrivateBus;
use drover_testkit::api::{Api, connect, error_of, wait_changed};
use drover_testkit::cluster::TestCluster;
use drover_testkit::node::SystemdNode;
use drover_testkit::process::{ChildGuard, TempDir, bin, free_port};
use drover_testkit::wait::eventually;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

const AGENT_NAME: &str = "org.eclipse.bluechi.Agent";
const AGENT_PATH: &str = "/org/eclipse/bluechi";
const ONLINE: Duration = Duration::from_secs(30);

/// Starts `binary` with `args` and `env`, its stderr going to `log`.
fn spawn(binary: &str, args: &[&str], env: &[(&str, &Path)], log: &Path) -> ChildGuard {
    let err = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(bin(binary));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    for (k, v) in env {
        cmd.env(k, v);
    }
    ChildGuard::new(cmd.spawn().unwrap_or_else(|e| panic!("{binary}: {e}")))
}

/// `node`'s status as the manager on `api` lists it ("" when not listed).
async fn status_on(api: &Api, node: &str) -> String {
    api.list_nodes()
        .await
        .into_iter()
        .find(|(n, _, _)| n == node)
        .map(|(_, s, _)| s)
        .unwrap_or_default()
}

async fn wait_status(api: &Api, node: &str, want: &str, what: &str) {
    eventually(ONLINE, what, || async {
        status_on(api, node).await == want
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A manager client, once `org.eclipse.bluechi` is served on `bus`.
async fn manager_api(bus: &PrivateBus, log: &Path) -> Api {
    let api = Api::connect(bus.address()).await;
    let dbus = zbus::fdo::DBusProxy::new(&api.conn).await.unwrap();
    eventually(ONLINE, "the manager owns org.eclipse.bluechi", || async {
        dbus.name_has_owner("org.eclipse.bluechi".try_into().unwrap())
            .await
            .unwrap_or(false)
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    });
    api
}

/// One argument of a call on the agent's local API.
enum Arg<'a> {
    S(&'a str),
    U(u32),
}

async fn agent_call(conn: &Connection, method: &str, arg: Arg<'_>) -> Result<(), (String, String)> {
    let (name, path, iface) = (Some(AGENT_NAME), AGENT_PATH, Some(AGENT_NAME));
    let reply = match arg {
        Arg::S(s) => conn.call_method(name, path, iface, method, &(s,)).await,
        Arg::U(u) => conn.call_method(name, path, iface, method, &(u,)).await,
    };
    reply.map(|_| ()).map_err(|e| error_of(&e))
}

async fn agent_prop(conn: &Connection, name: &str) -> String {
    let reply = conn
        .call_method(
            Some(AGENT_NAME),
            AGENT_PATH,
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &(AGENT_NAME, name),
        )
        .await
        .unwrap();
    let v: OwnedVariant = reply.body().deserialize().unwrap();
    String::try_from(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_start_from_bluechi_config_files_only() {
    let node = SystemdNode::start("bc-config", "bcnode").await;
    let bus = PrivateBus::start("bc-config").unwrap();
    let root = TempDir::new("drover-bc-config-root");
    let port = free_port();
    std::fs::create_dir_all(root.join("etc/bluechi/controller.conf.d")).unwrap();
    std::fs::create_dir_all(root.join("etc/bluechi/agent.conf.d")).unwrap();
    // As a BlueChi node has them: UseUDS=true is BlueChi's default (drover warns),
    // the port in the main file, the node allowed in a drop-in.
    let controller = root.file(
        "etc/bluechi/controller.conf",
        &format!(
            "[bluechi-controller]\nControllerPort={port}\nUseUDS=true\nLogTarget=stderr\n\
             LogLevel=DEBUG\n"
        ),
    );
    let controller_dropin = root.file(
        "etc/bluechi/controller.conf.d/10-nodes.conf",
        "[bluechi-controller]\nAllowedNodeNames=bcnode\n",
    );
    let agent = root.file(
        "etc/bluechi/agent.conf",
        "[bluechi-agent]\nNodeName=bcnode\nControllerHost=127.0.0.1\nLogTarget=stderr\n",
    );
    let agent_dropin = root.file(
        "etc/bluechi/agent.conf.d/10-address.conf",
        &format!("[bluechi-agent]\nControllerAddress=tcp:host=127.0.0.1,port={port}\n"),
    );
    let logs = TempDir::new("drover-bc-config-logs");
    let env = [("DROVER_CONFIG_ROOT", root.path())];
    let _manager = spawn(
        "drover-manager",
        &["--bus", bus.address()],
        &env,
        &logs.join("manager.log"),
    );
    let api = manager_api(&bus, &logs.join("manager.log")).await;
    // The node is allowed (exported, offline) before its agent runs.
    assert_eq!(status_on(&api, "bcnode").await, "offline");
    let node_bus = node.bus_address();
    let _agent = spawn(
        "drover-agent",
        &["--bus", &node_bus],
        &env,
        &logs.join("agent.log"),
    );
    wait_status(&api, "bcnode", "online", "bcnode comes online").await;

    let mlog = logs.read("manager.log");
    let read = format!(
        "configuration read from {}, {}",
        controller.display(),
        controller_dropin.display()
    );
    assert!(mlog.contains(&read), "{read}\nnot in:\n{mlog}");
    let uds = format!(
        "{}:3: key 'UseUDS': drover has no Unix-socket listener",
        controller.display()
    );
    assert!(mlog.contains(&uds), "{uds}\nnot in:\n{mlog}");
    assert!(mlog.contains("AllowPlaintext=true"), "{mlog}");
    let alog = logs.read("agent.log");
    let read = format!(
        "configuration read from {}, {}",
        agent.display(),
        agent_dropin.display()
    );
    assert!(alog.contains(&read), "{read}\nnot in:\n{alog}");
    // The agent shows the address it dials, in BlueChi's syntax.
    let local = connect(&node_bus).await;
    assert_eq!(
        agent_prop(&local, "ControllerAddress").await,
        format!("tcp:host=127.0.0.1,port={port}")
    );
    assert_eq!(agent_prop(&local, "Status").await, "online");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_controller_moves_the_node_and_job_cancel_cancels_its_job() {
    let cluster = TestCluster::start(1).await;
    let node = "node1";
    cluster
        .install(
            node,
            "slow.service",
            "[Service]\nType=oneshot\nExecStart=/bin/sleep 600\n",
        )
        .await;
    let a = cluster.api().await;
    wait_status(&a, node, "online", "node1 online on the sandbox manager").await;

    // A second manager, on a bus of its own, allowing the same node, with a
    // certificate of the sandbox's CA (the agent dials TLS; the name it checks
    // is the host dialled, 127.0.0.1 for both managers).
    let bus_b = PrivateBus::start("bc-switch").unwrap();
    let dir = TempDir::new("drover-bc-switch");
    let port_b = free_port();
    let pki = cluster.dir().join("pki");
    let conf = dir.file(
        "b.conf",
        &format!(
            "[drover-manager]\nControllerPort={port_b}\nAllowedNodeNames={node}\n\
             HeartbeatInterval=500\nNodeHeartbeatThreshold=2000\nLogTarget=stderr\n\
             TLSCertificate={}\nTLSPrivateKey={}\nTLSCertificateAuthority={}\n\
             ListenAddress=127.0.0.1\n",
            pki.join("manager.pem").display(),
            pki.join("manager.key").display(),
            pki.join("ca.pem").display(),
        ),
    );
    let log_b = dir.join("b.log");
    let _manager_b = spawn(
        "drover-manager",
        &[
            "--no-default-config",
            "-c",
            conf.to_str().unwrap(),
            "--bus",
            bus_b.address(),
        ],
        &[],
        &log_b,
    );
    let b = manager_api(&bus_b, &log_b).await;
    assert_eq!(status_on(&b, node).await, "offline");

    let local = connect(&cluster.node_bus_address(node)).await;
    let before = agent_prop(&local, "ControllerAddress").await;
    assert_eq!(
        before,
        format!("tcp:host=127.0.0.1,port={}", cluster.manager_port())
    );
    // Garbage, transports drover does not speak, and the address already
    // dialled are refused and change nothing.
    for bad in [
        "",
        "garbage",
        "tcp:host=127.0.0.1",
        "tcp:host=127.0.0.1,port=0",
        "unix:path=/run/bluechi/bluechi.sock",
        before.as_str(),
    ] {
        let (name, msg) = agent_call(&local, "SwitchController", Arg::S(bad))
            .await
            .unwrap_err();
        assert_eq!(
            name, "org.freedesktop.DBus.Error.InvalidArgs",
            "{bad:?}: {msg}"
        );
        assert!(msg.starts_with("dbus_address: "), "{bad:?}: {msg}");
    }
    let (name, _) = agent_call(&local, "SwitchController", Arg::U(42))
        .await
        .unwrap_err();
    assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs");
    assert_eq!(agent_prop(&local, "ControllerAddress").await, before);
    assert_eq!(status_on(&a, node).await, "online");

    // The switch: ControllerAddress changes (signalled), the node leaves A and
    // comes online on B; the agent says online again (what bluechi-is-online
    // --switch-timeout waits for).
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .path(AGENT_PATH)
        .interface("org.freedesktop.DBus.Properties")
        .build()
        .unwrap()
        .to_owned();
    let mut changes = MessageStream::for_match_rule(rule, &local, None)
        .await
        .unwrap();
    let target = format!("tcp:host=127.0.0.1,port={port_b}");
    agent_call(&local, "SwitchController", Arg::S(&target))
        .await
        .unwrap();
    wait_changed(&mut changes, "ControllerAddress", &target).await;
    wait_status(&b, node, "online", "node1 online on manager B").await;
    wait_status(&a, node, "offline", "node1 offline on the sandbox manager").await;
    // The manager marks the node online as it sends its welcome; the agent's own
    // Status follows when the welcome arrives: wait for its signal.
    wait_changed(&mut changes, "Status", "online").await;
    assert_eq!(agent_prop(&local, "Status").await, "online");
    assert_eq!(agent_prop(&local, "ControllerAddress").await, target);

    // JobCancel from the node: a job of manager B ends `canceled`.
    let mut jobs = b.jobs().await;
    let node_b = b.node(node).await;
    let job: OwnedObjectPath = node_b
        .call("StartUnit", &("slow.service", "replace"))
        .await
        .unwrap();
    let id = jobs.job_new(job.as_str(), ONLINE).await.unwrap();
    cluster
        .wait_state(node, "slow.service", "activating", ONLINE)
        .await;
    agent_call(&local, "JobCancel", Arg::U(id)).await.unwrap();
    let removed = jobs.removed(job.as_str(), ONLINE).await.unwrap();
    // systemd's word; cancelling a running start job leaves the unit's
    // process to the unit (systemd's semantics, as with BlueChi).
    assert_eq!(removed.result, "canceled");
    // Ended, and never a job of this node: NoSuchJob, nothing changes.
    for gone in [id, 999_999] {
        let (name, msg) = agent_call(&local, "JobCancel", Arg::U(gone))
            .await
            .unwrap_err();
        assert_eq!(name, "org.freedesktop.systemd1.NoSuchJob", "{gone}: {msg}");
    }
    assert_eq!(status_on(&b, node).await, "online");
    cluster.down().await;
}

/// The sandbox's manager certificate names `localhost` and the loopback addresses, not
/// only the 127.0.0.1 agents dial (TLS is on, the sandbox default): `SwitchController`
/// to the same manager by `localhost` passes the agent's name check, and the node
/// registers again over TLS with a new session. (With a certificate for 127.0.0.1 only,
/// the agent refuses the manager and the node stays offline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_controller_to_localhost_works_with_tls() {
    let cluster = TestCluster::start(1).await;
    let node = "node1";
    let a = cluster.api().await;
    wait_status(&a, node, "online", "node1 online").await;
    let manager_log = || std::fs::read_to_string(cluster.log_path("manager")).unwrap();
    let registrations = |log: &str| log.matches(" registered over TLS from ").count();
    let before = registrations(&manager_log());
    assert_eq!(before, 1, "{}", manager_log());

    let local = connect(&cluster.node_bus_address(node)).await;
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .path(AGENT_PATH)
        .interface("org.freedesktop.DBus.Properties")
        .build()
        .unwrap()
        .to_owned();
    let mut changes = MessageStream::for_match_rule(rule, &local, None)
        .await
        .unwrap();
    let target = format!("tcp:host=localhost,port={}", cluster.manager_port());
    agent_call(&local, "SwitchController", Arg::S(&target))
        .await
        .unwrap();
    wait_changed(&mut changes, "ControllerAddress", &target).await;
    // The agent left its session for the new address and is back.
    wait_changed(&mut changes, "Status", "online").await;
    assert_eq!(agent_prop(&local, "ControllerAddress").await, target);
    assert_eq!(status_on(&a, node).await, "online");
    eventually(ONLINE, "the second registration is logged", || async {
        registrations(&manager_log()) == before + 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", manager_log()));
    cluster.down().await;
}
