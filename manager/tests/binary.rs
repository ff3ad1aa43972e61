//! The `drover-manager` binary: command line, socket activation, sd_notify
//! (`READY=1`, `STATUS=`), `--reload`, bus name ownership, SIGTERM.

mod common;

use common::*;
use drover_testkit::process::{ChildGuard, Signal, free_port};
use drover_testkit::wait::eventually;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;
use zbus::OwnedObjectPath;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");
/// How long a manager started here may take to accept an agent.
const UP: Duration = Duration::from_secs(5);

#[test]
fn version_and_usage() {
    for flag in ["-v", "--version"] {
        let out = Command::new(BIN).arg(flag).output().expect("run");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(
                "drover-manager version {}",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }
    let out = Command::new(BIN).arg("--bogus").output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

#[tokio::test]
async fn socket_activated_manager_serves_notifies_and_stops_on_sigterm() {
    let setup = BinarySetup::new(
        "[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\nHeartbeatInterval=200\n",
    );
    let (bus, port, conf) = (&setup.bus, setup.port, &setup.conf);
    let notify_path = conf.with_file_name("notify");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify.set_read_timeout(Some(WAIT)).expect("timeout");

    let mut proc = ChildGuard::new(
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(format!("127.0.0.1:{port}"))
            // systemd-socket-activate passes only the environment it is told to.
            .arg(format!("--setenv=NOTIFY_SOCKET={}", notify_path.display()))
            .arg("--")
            .arg(BIN)
            .args(["--no-default-config", "--bus", bus.address(), "-c"])
            .arg(conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("systemd-socket-activate (package systemd)"),
    );
    // The listener exists before the manager runs; the first connection starts it.
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let _agent = FakeAgent::connect_when_up(addr, "node1", reply_empty(), UP)
        .await
        .expect("the socket-activated manager accepts node1");

    // READY=1 first, then STATUS= follows the node count.
    let notify_msgs = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !seen
            .iter()
            .any(|m: &String| m.contains("STATUS=1 of 1 node online"))
        {
            let n = notify.recv(&mut buf).expect("a notification");
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        seen
    })
    .await
    .expect("join");
    assert!(notify_msgs[0].contains("READY=1"), "{notify_msgs:?}");

    let client = Api::connect(bus.address()).await;
    let nodes: Vec<(String, OwnedObjectPath, String, String)> = client
        .call(CONTROLLER, CONTROLLER_IFACE, "ListNodes", &())
        .await
        .expect("ListNodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].0.as_str(), nodes[0].2.as_str()),
        ("node1", "online")
    );

    proc.signal(Signal::SIGTERM);
    let status = proc.exited(WAIT).await;
    assert!(
        status.success(),
        "SIGTERM ends the manager with 0, got {status}"
    );
}

#[tokio::test]
async fn a_name_owner_that_refuses_replacement_means_exit_1() {
    let bus = test_bus();
    let squatter = Api::connect(bus.address()).await;
    squatter
        .conn
        .request_name_with_flags(BUS_NAME, zbus::fdo::RequestNameFlags::DO_NOT_QUEUE)
        .await
        .expect("take the name");
    let port = free_port().to_string();
    let out = tokio::task::spawn_blocking({
        let address = bus.address().to_string();
        move || {
            Command::new(BIN)
                .args(["--no-default-config", "--bus", &address, "-p", &port])
                .env("DROVER_LOG_TARGET", "stderr")
                .output()
                .expect("run")
        }
    })
    .await
    .expect("join");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("org.eclipse.bluechi"), "{stderr}");
}

#[tokio::test]
async fn running_out_of_descriptors_is_survived() {
    use std::os::unix::process::CommandExt;
    let setup = BinarySetup::new("[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\n");
    let (bus, port) = (&setup.bus, setup.port);
    let mut cmd = Command::new(BIN);
    cmd.args(["--no-default-config", "--bus", bus.address()])
        .args(["-p", &port.to_string(), "-c"])
        .arg(&setup.conf)
        .stdout(Stdio::null())
        .stderr(Stdio::from(setup.log()));
    // SAFETY: only setrlimit(2), async-signal-safe, between fork and exec.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let _proc = ChildGuard::new(cmd.spawn().expect("spawn drover-manager"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");

    // Wait until it serves, then flood it with more connections than it has descriptors.
    let client = Api::connect(bus.address()).await;
    let up = eventually(UP, "the manager came up", || async {
        let r: zbus::Result<Vec<(String, OwnedObjectPath, String, String)>> = client
            .call(CONTROLLER, CONTROLLER_IFACE, "ListNodes", &())
            .await;
        r.is_ok() && tokio::net::TcpStream::connect(addr).await.is_ok()
    });
    up.await.unwrap();
    // From several loopback addresses: one address may only hold 16
    // unauthenticated connections (the rest are closed at once, which frees
    // their descriptors), so one address alone never runs the manager out.
    let mut flood = Vec::new();
    for i in 0..100u8 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        let from = std::net::SocketAddr::from(([127, 0, 0, 2 + i % 8], 0));
        socket.bind(from).expect("bind a loopback source address");
        flood.push(socket.connect(addr).await.expect("connect (backlog)"));
    }
    let logged = eventually(Duration::from_millis(2500), "EMFILE is logged", || async {
        setup.logged().contains("cannot accept agents")
    });
    logged.await.unwrap();
    // Descriptors free up: the manager accepts again.
    drop(flood);
    let agent = FakeAgent::connect_when_up(addr, "node1", reply_empty(), UP).await;
    assert!(
        agent.is_ok(),
        "a real agent registers once descriptors are free"
    );
}

/// Issue 14 item 3: a manager whose bus dies used to keep running headless,
/// silent, holding its agents and port. It must notice, say why, and exit
/// non-zero so its unit (`Restart=on-failure`) brings it back on the new bus.
#[tokio::test]
async fn losing_the_bus_ends_the_manager_with_a_failure_and_a_reason() {
    let setup = BinarySetup::new(
        "[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\nHeartbeatInterval=200\n",
    );
    let (bus, port) = (&setup.bus, setup.port);
    let mut proc = ChildGuard::new(
        Command::new(BIN)
            .args(["--no-default-config", "--bus", bus.address()])
            .args(["-p", &port.to_string(), "-c"])
            .arg(&setup.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::from(setup.log()))
            .spawn()
            .expect("spawn drover-manager"),
    );
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let _agent = FakeAgent::connect_when_up(addr, "node1", reply_empty(), UP)
        .await
        .expect("the manager accepts node1");

    // The bus daemon dies under the running manager.
    let pid = libc::pid_t::try_from(bus.pid()).expect("pid");
    // SAFETY: kill(2) on the pid of a child this test owns (its bus).
    #[allow(unsafe_code)]
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill the dbus-daemon");

    let status = proc.exited(WAIT).await;
    assert_eq!(
        status.code(),
        Some(1),
        "a manager without its bus exits 1, got {status}"
    );
    let log = setup.logged();
    assert!(
        log.contains("lost its connection to bus unix:"),
        "the reason is logged: {log}"
    );
}

/// `drover-manager --reload` (the unit's `ExecReload=`): returns after the
/// reload is applied, fails with the reason when the configuration does not
/// load (nothing changes), fails clearly when no manager answers; the
/// `Reload()` it calls refuses other users.
#[tokio::test]
async fn reload_flag_applies_the_reload_before_it_returns_and_fails_with_a_reason() {
    let setup = BinarySetup::new("[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\n");
    let (bus, port) = (setup.bus.address().to_owned(), setup.port.to_string());
    let mut proc = ChildGuard::new(
        Command::new(BIN)
            .args(["--no-default-config", "--bus", &bus, "-p", &port, "-c"])
            .arg(&setup.conf)
            .stdout(Stdio::null())
            .stderr(setup.log())
            .spawn()
            .expect("run"),
    );
    let client = Api::connect(&bus).await;
    eventually(UP, "the manager serves ListNodes", || async {
        client
            .call::<_, Vec<(String, OwnedObjectPath, String, String)>>(
                CONTROLLER,
                CONTROLLER_IFACE,
                "ListNodes",
                &(),
            )
            .await
            .is_ok()
    })
    .await
    .unwrap();
    let reload = |bus: String| {
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .args(["--bus", &bus, "--reload"])
                .output()
                .expect("run --reload")
        })
    };
    let names = || async {
        let nodes: Vec<(String, OwnedObjectPath, String, String)> = client
            .call(CONTROLLER, CONTROLLER_IFACE, "ListNodes", &())
            .await
            .expect("ListNodes");
        nodes.into_iter().map(|n| n.0).collect::<Vec<_>>()
    };

    std::fs::write(
        &setup.conf,
        "[drover-manager]\nAllowedNodeNames=node1,node2\nLogTarget=stderr\n",
    )
    .unwrap();
    let out = reload(bus.clone()).await.unwrap();
    assert!(out.status.success(), "{out:?}\n{}", setup.logged());
    assert_eq!(
        names().await,
        ["node1", "node2"],
        "applied when --reload returned"
    );

    std::fs::write(
        &setup.conf,
        "[drover-manager]\nAllowedNodeNames=node1,node3\nBogus=1\n",
    )
    .unwrap();
    let out = reload(bus.clone()).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Bogus") && stderr.contains("running one is kept"),
        "{stderr}"
    );
    assert_eq!(
        names().await,
        ["node1", "node2"],
        "a failed reload changes nothing"
    );

    // Only root (or the manager's own user) may reload it.
    let stranger = drover_testkit::api::connect_as(&bus, 65534).await;
    let denied = stranger
        .call_method(
            Some(BUS_NAME),
            CONTROLLER,
            Some("io.drover.Controller"),
            "Reload",
            &(),
        )
        .await;
    assert!(
        matches!(&denied, Err(zbus::Error::FDO(e)) if matches!(**e, zbus::fdo::Error::AccessDenied(_))),
        "{denied:?}"
    );

    proc.signal(Signal::SIGTERM);
    assert!(proc.exited(WAIT).await.success());

    // No manager on the bus: exit 1 and say so.
    let out = reload(bus.clone()).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("drover-manager --reload:"),
        "{out:?}"
    );
    // No bus at all, and flags that mean nothing to --reload.
    let out = reload("unix:path=/nonexistent/bus".into()).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{out:?}"
    );
    let out = Command::new(BIN)
        .args(["--reload", "-c", "/etc/x.conf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `drover-manager --check ARGS`: exit status, stdout, stderr.
fn check(args: &[&str]) -> (bool, String, String) {
    let run = drover_testkit::process::Run::from(
        Command::new(BIN)
            .arg("--check")
            .args(args)
            .env_remove("DROVER_CONFIG_ROOT")
            .output()
            .expect("run"),
    );
    (run.success(), run.stdout, run.stderr)
}

#[test]
fn check_flag_validates_the_configuration_and_starts_nothing() {
    let dir = drover_testkit::process::TempDir::new("manager-check");
    let plain = dir.file(
        "plain.conf",
        "[drover-manager]\nAllowedNodeNames=web1,edge-*\n",
    );
    let path = plain.to_str().unwrap();
    let (ok, out, err) = check(&["--no-default-config", "-c", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("configuration read from {path}")),
        "{out}"
    );
    assert!(
        out.contains("plaintext on 127.0.0.1 port 842, loopback only")
            && out.contains("nodes allowed: web1, edge-*"),
        "a plaintext manager says agents on other hosts cannot connect: {out}"
    );
    assert!(
        out.contains("metrics: off (MetricsListenAddress unset)\n"),
        "{out}"
    );
    assert!(out.ends_with("the configuration is valid\n"), "{out}");
    let metrics = dir.file(
        "metrics.conf",
        "[drover-manager]\nMetricsListenAddress=9842\nMetricsPerNode=no\n",
    );
    let (ok, out, err) = check(&["--no-default-config", "-c", metrics.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(
            "metrics: Prometheus endpoint http://127.0.0.1:9842/metrics (no per-node series)\n"
        ),
        "{out}"
    );

    // Started nothing: the port stays free for a check with -p.
    let port = free_port();
    let (ok, out, _) = check(&["--no-default-config", "-c", path, "-p", &port.to_string()]);
    assert!(ok && out.contains(&format!("port {port}")), "{out}");
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is still free");

    // Garbage: file, line and key named, exit 1, nothing on stdout.
    for (text, expect) in [
        ("[drover-manager]\nBogus=1\n", ":2: key 'Bogus'"),
        (
            "[drover-manager]\nAllowedNodeNames=a_b\n",
            "AllowedNodeNames",
        ),
        ("[drover-manager]\nControllerPort=99999\n", "ControllerPort"),
        (
            "[drover-manager]\nMetricsListenAddress=metrics.example:9842\n",
            ":2: key 'MetricsListenAddress': 'metrics.example:9842' is not PORT",
        ),
        ("\u{0}\u{ff}garbage", "bad.conf"),
        (
            "[drover-manager]\nTLSCertificate=/nonexistent/m.pem\nTLSPrivateKey=/nonexistent/m.key\n\
             TLSCertificateAuthority=/nonexistent/ca.pem\n",
            "/nonexistent/",
        ),
    ] {
        let bad = dir.file("bad.conf", text);
        let (ok, out, err) = check(&["--no-default-config", "-c", bad.to_str().unwrap()]);
        assert!(!ok, "{text:?} passed the check: {out}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with("drover-manager --check: ") && err.contains(expect),
            "{text:?}: {err}"
        );
    }
    let (ok, _, err) = check(&["--no-default-config", "-c", "/nonexistent.conf"]);
    assert!(!ok && err.contains("/nonexistent.conf"), "{err}");
    // --check makes no sense with a bus or --reload.
    let out = Command::new(BIN)
        .args(["--check", "--reload"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_flag_loads_the_tls_files() {
    use drover_tls::pki::{Options, Pki, Validity};
    let dir = drover_testkit::process::TempDir::new("manager-check-tls");
    let pki = Pki::new(dir.join("ca"));
    let options = Options {
        validity: Validity::days(30).unwrap(),
        force: false,
    };
    pki.create_ca(&options).unwrap();
    pki.issue_manager(&["m.example"], &options).unwrap();
    let f = pki.manager_files();
    let conf = |key: &std::path::Path| {
        format!(
            "[drover-manager]\nAllowedNodeNames=web1\nTLSCertificate={}\nTLSPrivateKey={}\n\
             TLSCertificateAuthority={}\nTLSRevocationList={}\n",
            f.certificate.display(),
            key.display(),
            f.ca_bundle.display(),
            pki.crl().display()
        )
    };
    let good = dir.file("tls.conf", &conf(&f.private_key));
    let (ok, out, err) = check(&["--no-default-config", "-c", good.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("agents: mutual TLS on every address port 842")
            && out.contains("0 revoked certificate(s) in the CRL"),
        "{out}"
    );
    // A key that does not belong to the certificate (the CA's) fails the check.
    let wrong = dir.file("wrong.conf", &conf(&pki.ca_key()));
    let (ok, _, err) = check(&["--no-default-config", "-c", wrong.to_str().unwrap()]);
    assert!(!ok && err.contains("TLS"), "{err}");
}
