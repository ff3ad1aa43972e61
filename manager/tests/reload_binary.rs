//! `drover-manager` and SIGHUP: the config is read again from the same
//! sources; a good one applies (new nodes appear on the bus), a bad one is
//! logged and the running config kept.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");

/// Kills the child and removes the files on drop (also when a test fails).
struct Run {
    child: Child,
    files: Vec<std::path::PathBuf>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

async fn node_known(client: &zbus::Connection, name: &str) -> bool {
    client
        .call_method(
            Some(BUS_NAME),
            CONTROLLER,
            Some("org.eclipse.bluechi.Controller"),
            "GetNode",
            &(name,),
        )
        .await
        .is_ok()
}

#[tokio::test]
async fn sighup_reloads_good_config_and_keeps_running_on_a_bad_one() {
    let bus = test_bus();
    let dir = std::env::temp_dir();
    let conf = dir.join(format!("drover-reload-{}.conf", std::process::id()));
    let log = dir.join(format!("drover-reload-{}.log", std::process::id()));
    std::fs::write(
        &conf,
        "[drover-manager]\nAllowedNodeNames=a\nLogTarget=stderr\n",
    )
    .expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let child = Command::new(BIN)
        .args(["--no-default-config", "--bus", bus.address(), "-p"])
        .arg(port.to_string())
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .spawn()
        .expect("spawn drover-manager");
    let mut run = Run {
        child,
        files: vec![conf.clone(), log.clone()],
    };
    let client = zbus::connection::Builder::address(bus.address())
        .build()
        .await
        .expect("client");
    let mut up = false;
    for _ in 0..200 {
        if node_known(&client, "a").await {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "the manager serves node a");
    assert!(!node_known(&client, "b").await);

    std::fs::write(
        &conf,
        "[drover-manager]\nAllowedNodeNames=a,b\nLogTarget=stderr\nLogLevel=DEBUG\n\
         [node a]\nAllowDependenciesOn=b\n",
    )
    .expect("config");
    signal(&run.child, libc::SIGHUP);
    let mut added = false;
    for _ in 0..200 {
        if node_known(&client, "b").await {
            added = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(added, "node b appears after SIGHUP");
    let level: zbus::OwnedVariant = client
        .call_method(
            Some(BUS_NAME),
            CONTROLLER,
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &("org.eclipse.bluechi.Controller", "LogLevel"),
        )
        .await
        .expect("LogLevel")
        .body()
        .deserialize()
        .expect("variant");
    assert_eq!(String::try_from(level).expect("string"), "DEBUG");

    // A broken file: logged, the running config kept, the manager alive.
    std::fs::write(&conf, "[drover-manager]\nAllowedNodeNames=a,b\nBogus=1\n").expect("config");
    signal(&run.child, libc::SIGHUP);
    let mut logged = String::new();
    for _ in 0..200 {
        logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged.contains("config reload failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        logged.contains("config reload failed") && logged.contains("Bogus"),
        "{logged}"
    );
    assert!(
        run.child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    assert!(node_known(&client, "a").await && node_known(&client, "b").await);

    signal(&run.child, libc::SIGTERM);
    let mut status = None;
    for _ in 0..200 {
        status = run.child.try_wait().expect("try_wait");
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
