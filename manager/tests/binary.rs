//! The `drover-manager` binary: command line, socket activation, sd_notify,
//! bus name ownership, SIGTERM.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zbus::OwnedObjectPath;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");

/// Kills the child on drop (a failing test leaves nothing running).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "drover-manager did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A file in the temp dir, removed on drop (also when the test fails).
struct TempPath(std::path::PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("drover-manager-bin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Self(path)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_file(name: &str, text: &str) -> TempPath {
    let path = TempPath::new(name);
    std::fs::write(&path.0, text).expect("write temp file");
    path
}

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
    let bus = test_bus();
    let port = free_port();
    let conf = temp_file(
        "activated.conf",
        "[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\nHeartbeatInterval=200\n",
    );
    let notify_path = TempPath::new("notify");
    let notify = UnixDatagram::bind(&notify_path.0).expect("notify socket");
    notify.set_read_timeout(Some(WAIT)).expect("timeout");

    let mut proc = Proc(
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(format!("127.0.0.1:{port}"))
            // systemd-socket-activate passes only the environment it is told to.
            .arg(format!(
                "--setenv=NOTIFY_SOCKET={}",
                notify_path.0.display()
            ))
            .arg("--")
            .arg(BIN)
            .args(["--no-default-config", "--bus", bus.address(), "-c"])
            .arg(&conf.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("systemd-socket-activate (package systemd)"),
    );
    // The listener exists before the manager runs; the first connection starts it.
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut agent = None;
    for _ in 0..100 {
        match FakeAgent::connect(addr, "node1", reply_empty()).await {
            Ok(a) => {
                agent = Some(a);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let _agent = agent.expect("the socket-activated manager accepts node1");

    let notify_msg = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 256];
        let n = notify.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("join");
    assert!(notify_msg.contains("READY=1"), "{notify_msg}");

    let client = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("client");
    let reply = client
        .call_method(
            Some(BUS_NAME),
            CONTROLLER,
            Some("org.eclipse.bluechi.Controller"),
            "ListNodes",
            &(),
        )
        .await
        .expect("ListNodes");
    let nodes: Vec<(String, OwnedObjectPath, String, String)> =
        reply.body().deserialize().expect("a(soss)");
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].0.as_str(), nodes[0].2.as_str()),
        ("node1", "online")
    );

    let pid = i32::try_from(proc.0.id()).expect("pid");
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || proc.wait_exit(WAIT))
        .await
        .expect("join");
    assert!(
        status.success(),
        "SIGTERM ends the manager with 0, got {status}"
    );
}

#[tokio::test]
async fn a_name_owner_that_refuses_replacement_means_exit_1() {
    let bus = test_bus();
    let squatter = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("connect");
    squatter
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
    let bus = test_bus();
    let port = free_port();
    let conf = temp_file(
        "emfile.conf",
        "[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\n",
    );
    let log_path = TempPath::new("emfile.log");
    let log = std::fs::File::create(&log_path.0).expect("log file");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--no-default-config",
        "--bus",
        bus.address(),
        "-p",
        &port.to_string(),
        "-c",
    ])
    .arg(&conf.0)
    .stdout(Stdio::null())
    .stderr(Stdio::from(log));
    // SAFETY: only setrlimit(2), async-signal-safe, between fork and exec.
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
    let _proc = Proc(cmd.spawn().expect("spawn drover-manager"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");

    // Wait until it serves, then flood it with more connections than it has descriptors.
    let client = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("client");
    let mut up = false;
    for _ in 0..100 {
        let r = client
            .call_method(
                Some(BUS_NAME),
                CONTROLLER,
                Some("org.eclipse.bluechi.Controller"),
                "ListNodes",
                &(),
            )
            .await;
        if r.is_ok() && tokio::net::TcpStream::connect(addr).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the manager came up");
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(
            tokio::net::TcpStream::connect(addr)
                .await
                .expect("connect (backlog)"),
        );
    }
    let mut logged = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let text = std::fs::read_to_string(&log_path.0).unwrap_or_default();
        if text.contains("cannot accept agents") {
            logged = true;
            break;
        }
    }
    assert!(logged, "EMFILE is logged");
    // Descriptors free up: the manager accepts again.
    drop(flood);
    let mut agent = None;
    for _ in 0..100 {
        if let Ok(a) = FakeAgent::connect(addr, "node1", reply_empty()).await {
            agent = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        agent.is_some(),
        "a real agent registers once descriptors are free"
    );
}
