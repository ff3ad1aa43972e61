//! The shipped units under a real systemd: `drover-manager.socket`, the
//! hardened `drover-manager.service` and the hardened `drover-agent.service`
//! from `dist/usr/lib/systemd/system/`, run by a node's `systemd --user`,
//! with mutual TLS between them. What a user checks is what this checks:
//!
//! * socket activation: only the socket is started; the agent's first
//!   connection starts the manager, which takes the listener from systemd;
//! * `systemctl show -p StatusText`: the manager says "1 of 1 node online",
//!   the agent "connected to 127.0.0.1:PORT as n1";
//! * `systemctl reload` returns after the reload is applied (the agent's too:
//!   its TLS files read again, its session kept): a node added to
//!   `AllowedNodeNames` is counted in the status and listed by the API the
//!   moment it returns; a configuration that does not load fails the reload
//!   and changes nothing;
//! * the watchdog: pings arrive (`WatchdogTimestamp` moves), the unit outlives
//!   several watchdog periods; a manager stopped with SIGSTOP is killed by
//!   the watchdog and restarted, and the socket keeps the port meanwhile, so
//!   the agent comes back on its own;
//! * without a manager, the agent's status says it is unreachable and when
//!   it tries again.
//!
//! The unit files are the shipped ones with these substitutions, each named
//! in [`install`]: the binaries' path (and, on the command line, the config
//! file and the node's bus instead of the system bus), the socket's port
//! (a free one on 127.0.0.1 instead of 842), and `WatchdogSec=` (4 s instead
//! of 30 s, so the test waits seconds, not minutes). Everything else,
//! hardening included, is applied by systemd as shipped: the user manager
//! here runs as root (the test machine's nodes do), so it sets up the
//! namespaces, seccomp filters and capability bounds of a system service.
//! Every file the units read (the node's directory with its bus socket, the
//! configs, certificates and copies of the two binaries) lives in a directory
//! of its own under `/var/lib`, removed at teardown: the units say
//! `PrivateTmp=yes` (so not `/tmp`) and `ProtectHome=yes` (so not the cargo
//! target directory of a checkout under `/root` or `/home`, as on a fresh
//! machine that cloned the repository into root's home), and the node mounts
//! its own `/run`.

use drover_protocol::NodeName;
use drover_testkit::api::Api;
use drover_testkit::node::SystemdNode;
use drover_testkit::process::{bin, free_port};
use drover_testkit::wait::eventually;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SHIPPED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../dist/usr/lib/systemd/system"
);
const WATCHDOG_SEC: u64 = 4;
/// A daemon start under systemd on a loaded 2-core machine.
const START: Duration = Duration::from_secs(30);

/// Copies a shipped unit into the node, replacing each `(from, to)`; every
/// `from` must occur (a renamed line in the shipped file fails here, not
/// silently later).
fn install(node: &SystemdNode, name: &str, substitutions: &[(&str, String)]) {
    let mut text = std::fs::read_to_string(Path::new(SHIPPED).join(name)).unwrap();
    for (from, to) in substitutions {
        assert!(text.contains(from), "{name} has no '{from}'");
        text = text.replace(from, to);
    }
    node.write_unit(name, &text);
}

fn show(node: &SystemdNode, unit: &str, property: &str) -> String {
    let out = node.systemctl(&["show", "-p", property, "--value", unit]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The manager's and the agent's output (the node has no journal: services
/// inherit its systemd's stderr), for failure messages.
fn logs(node: &SystemdNode) -> String {
    let log = std::fs::read_to_string(node.dir().join("systemd.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    let status = node.systemctl(&[
        "status",
        "--no-pager",
        "drover-manager.socket",
        "drover-manager.service",
        "drover-agent.service",
    ]);
    format!(
        "{}\n--- systemctl status ---\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&status.stdout)
    )
}

fn run_ok(node: &SystemdNode, args: &[&str]) {
    let out = node.systemctl(args);
    assert!(
        out.status.success(),
        "systemctl {args:?}: {}\n{}\n--- log ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        logs(node)
    );
}

async fn wait_show(node: &SystemdNode, unit: &str, property: &str, want: &str, within: Duration) {
    let what = format!("{unit} {property}={want}");
    if let Err(e) = eventually(within, &what, || async {
        show(node, unit, property) == want
    })
    .await
    {
        panic!(
            "{e}; it is '{}'\n--- log ---\n{}",
            show(node, unit, property),
            logs(node)
        );
    }
}

struct Setup {
    node: SystemdNode,
    port: u16,
    manager_conf: PathBuf,
    tls: String,
}

impl Setup {
    fn write_manager_conf(&self, allowed: &str) {
        std::fs::write(
            &self.manager_conf,
            format!(
                "[drover-manager]\nAllowedNodeNames={allowed}\nLogTarget=stderr\n{}",
                self.tls
            ),
        )
        .unwrap();
    }
}

async fn setup() -> Setup {
    let node = SystemdNode::start_in(Path::new("/var/lib"), "units", "host").await;
    let dir = node.dir().to_path_buf();
    // Copies the hardened units can run wherever the checkout is.
    let copy = |name: &str| {
        let to = dir.join(name);
        std::fs::copy(bin(name), &to).unwrap();
        to
    };
    let (manager, agent) = (copy("drover-manager"), copy("drover-agent"));
    let pki = drover_tls::pki::Pki::new(dir.join("pki"));
    let options = drover_tls::pki::Options {
        validity: drover_tls::pki::Validity::days(1).unwrap(),
        force: false,
    };
    pki.create_ca(&options).unwrap();
    pki.issue_manager(&["127.0.0.1"], &options).unwrap();
    let n1 = NodeName::new("n1").unwrap();
    pki.issue_nodes(std::slice::from_ref(&n1), &options)
        .unwrap();
    let keys = |cert: PathBuf, key: PathBuf| {
        format!(
            "TLSCertificate={}\nTLSPrivateKey={}\nTLSCertificateAuthority={}\n",
            cert.display(),
            key.display(),
            pki.ca_certificate().display()
        )
    };
    let port = free_port();
    let setup = Setup {
        port,
        manager_conf: dir.join("manager.conf"),
        tls: keys(pki.manager_certificate(), pki.manager_key()),
        node,
    };
    setup.write_manager_conf("n1");
    let agent_conf = dir.join("agent.conf");
    std::fs::write(
        &agent_conf,
        format!(
            "[drover-agent]\nNodeName=n1\nControllerHost=127.0.0.1\nControllerPort={port}\n\
             LogTarget=stderr\n{}",
            keys(pki.node_certificate(&n1), pki.node_key(&n1))
        ),
    )
    .unwrap();

    let bus = setup.node.bus_address();
    let watchdog = ("WatchdogSec=30s", format!("WatchdogSec={WATCHDOG_SEC}s"));
    install(
        &setup.node,
        "drover-manager.socket",
        &[("ListenStream=842", format!("ListenStream=127.0.0.1:{port}"))],
    );
    install(
        &setup.node,
        "drover-manager.service",
        &[
            (
                "ExecStart=/usr/libexec/drover-manager",
                format!(
                    "ExecStart={} --no-default-config -c {} --bus {bus}",
                    manager.display(),
                    setup.manager_conf.display()
                ),
            ),
            (
                "ExecReload=/usr/libexec/drover-manager --reload",
                format!("ExecReload={} --bus {bus} --reload", manager.display()),
            ),
            watchdog.clone(),
        ],
    );
    install(
        &setup.node,
        "drover-agent.service",
        &[
            (
                "ExecStart=/usr/libexec/drover-agent",
                format!(
                    "ExecStart={} --no-default-config -c {} --bus {bus}",
                    agent.display(),
                    agent_conf.display()
                ),
            ),
            watchdog,
        ],
    );
    setup.node.reload().await;
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_units_run_under_systemd_with_status_reload_watchdog_and_socket() {
    let s = setup().await;
    let node = &s.node;
    let _stop = StopUnits(node);
    let (manager, agent, socket) = (
        "drover-manager.service",
        "drover-agent.service",
        "drover-manager.socket",
    );

    // Socket activation: nothing but the socket runs until the agent dials.
    run_ok(node, &["start", socket]);
    assert_eq!(show(node, manager, "ActiveState"), "inactive");
    run_ok(node, &["start", agent]);
    wait_show(node, manager, "ActiveState", "active", START).await;
    wait_show(node, manager, "StatusText", "1 of 1 node online", START).await;
    let endpoint = format!("127.0.0.1:{}", s.port);
    wait_show(
        node,
        agent,
        "StatusText",
        &format!("connected to {endpoint} as n1"),
        START,
    )
    .await;
    assert_eq!(show(node, manager, "TriggeredBy"), socket);
    assert_eq!(show(node, manager, "NRestarts"), "0");

    // Reload: returns once the new node is known.
    s.write_manager_conf("n1,n2");
    run_ok(node, &["reload", manager]);
    assert_eq!(
        show(node, manager, "StatusText"),
        "1 of 2 nodes online",
        "systemctl reload returned before the reload was applied"
    );
    let api = Api::connect(&node.bus_address()).await;
    let names: Vec<String> = api.list_nodes().await.into_iter().map(|n| n.0).collect();
    assert!(names.contains(&"n2".to_owned()), "{names:?}");
    assert_eq!(show(node, manager, "ActiveState"), "active");

    // The agent's reload reads its TLS files again and keeps its session.
    let agent_before = show(node, agent, "MainPID");
    run_ok(node, &["reload", agent]);
    assert_eq!(show(node, agent, "ActiveState"), "active");
    assert_eq!(show(node, agent, "MainPID"), agent_before);
    assert_eq!(
        show(node, agent, "StatusText"),
        format!("connected to {endpoint} as n1"),
        "the agent's status after its reload"
    );
    assert!(
        logs(node).contains("TLS files read again"),
        "the agent's reload is applied before systemctl returns: {}",
        logs(node)
    );
    assert_eq!(show(node, manager, "StatusText"), "1 of 2 nodes online");

    // A configuration that does not load fails the reload and changes nothing.
    std::fs::write(
        &s.manager_conf,
        "[drover-manager]\nAllowedNodeNames=n1\nBogus=1\n",
    )
    .unwrap();
    let out = node.systemctl(&["reload", manager]);
    assert!(
        !out.status.success(),
        "a broken config must fail the reload"
    );
    assert_eq!(show(node, manager, "ActiveState"), "active");
    assert_eq!(show(node, manager, "StatusText"), "1 of 2 nodes online");
    s.write_manager_conf("n1,n2");

    // Watchdog: pings keep the unit alive across several periods.
    let first = show(node, manager, "WatchdogTimestampMonotonic");
    assert_ne!(first, "0", "no watchdog ping at all");
    let pid = show(node, manager, "MainPID");
    let agent_pid = show(node, agent, "MainPID");
    wait_show_changed(node, manager, "WatchdogTimestampMonotonic", &first).await;
    wait_show_changed(node, agent, "WatchdogTimestampMonotonic", "0").await;
    tokio::time::sleep(Duration::from_secs(2 * WATCHDOG_SEC)).await;
    assert_eq!(show(node, manager, "MainPID"), pid, "{}", logs(node));
    assert_eq!(show(node, manager, "NRestarts"), "0");
    assert_eq!(show(node, agent, "MainPID"), agent_pid);

    // A manager that stops answering is killed by the watchdog and restarted;
    // the socket held the port, the agent reconnects by itself.
    let stopped = pid.parse::<i32>().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stopped),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    wait_show(node, manager, "NRestarts", "1", START).await;
    wait_show(node, manager, "ActiveState", "active", START).await;
    wait_show(node, manager, "StatusText", "1 of 2 nodes online", START).await;
    assert_ne!(show(node, manager, "MainPID"), pid);
    assert_eq!(
        show(node, agent, "MainPID"),
        agent_pid,
        "the agent kept running"
    );

    // Without a manager the agent says so, and when it tries again.
    run_ok(node, &["stop", socket, manager]);
    let unreachable = format!("manager {endpoint} unreachable (");
    eventually(
        START,
        "the agent's status says the manager is unreachable",
        || async {
            let text = show(node, agent, "StatusText");
            text.starts_with(&unreachable) && text.contains("), retrying in ")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: '{}'", show(node, agent, "StatusText")));
    assert_eq!(show(node, agent, "ActiveState"), "active");

    run_ok(node, &["stop", agent]);
}

/// Stops the three units when the test ends, also when it fails: units
/// killed with their node's cgroups would leave their `PrivateTmp=`
/// directories (`/tmp/systemd-private-…`, `/var/tmp/systemd-private-…`) behind;
/// a stop lets systemd remove them. Declared after the node, so it runs first.
struct StopUnits<'a>(&'a SystemdNode);

impl Drop for StopUnits<'_> {
    fn drop(&mut self) {
        let _ = self.0.systemctl(&[
            "stop",
            "drover-agent.service",
            "drover-manager.service",
            "drover-manager.socket",
        ]);
    }
}

async fn wait_show_changed(node: &SystemdNode, unit: &str, property: &str, from: &str) {
    let what = format!("{unit} {property} to change from {from}");
    eventually(Duration::from_secs(3 * WATCHDOG_SEC), &what, || async {
        show(node, unit, property) != from
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- log ---\n{}", logs(node)));
}
