//! `drover-manager` and SIGHUP: the config is read again from the same
//! sources; a good one applies (new nodes appear on the bus), a bad one is
//! logged and the running config kept.

mod common;

use common::*;
use drover_testkit::process::{ChildGuard, Signal, TempDir, free_port};
use drover_testkit::wait::poll;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");
/// How long each step may take, looked at every 25 ms.
const STEP: Duration = Duration::from_secs(5);
const EVERY: Duration = Duration::from_millis(25);

async fn node_known(client: &Api, name: &str) -> bool {
    let r: zbus::Result<zbus::OwnedObjectPath> = client
        .call(CONTROLLER, CONTROLLER_IFACE, "GetNode", &(name,))
        .await;
    r.is_ok()
}

#[tokio::test]
async fn sighup_reloads_good_config_and_keeps_running_on_a_bad_one() {
    let bus = test_bus();
    let tmp = TempDir::new("drover-reload");
    let conf = tmp.file(
        "manager.conf",
        "[drover-manager]\nAllowedNodeNames=a\nLogTarget=stderr\n",
    );
    let log = std::fs::File::create(tmp.join("manager.log")).expect("log");
    let mut run = ChildGuard::new(
        Command::new(BIN)
            .args(["--no-default-config", "--bus", bus.address(), "-p"])
            .arg(free_port().to_string())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn drover-manager"),
    );
    let client = Api::connect(bus.address()).await;
    let up = poll(STEP, EVERY, "the manager serves node a", || {
        node_known(&client, "a")
    });
    up.await.unwrap();
    assert!(!node_known(&client, "b").await);

    tmp.file(
        "manager.conf",
        "[drover-manager]\nAllowedNodeNames=a,b\nLogTarget=stderr\nLogLevel=DEBUG\n\
         [node a]\nAllowDependenciesOn=b\n",
    );
    run.signal(Signal::SIGHUP);
    let added = poll(STEP, EVERY, "node b appears after SIGHUP", || {
        node_known(&client, "b")
    });
    added.await.unwrap();
    let level: String = client
        .get_property(CONTROLLER, CONTROLLER_IFACE, "LogLevel")
        .await;
    assert_eq!(level, "DEBUG");

    // A broken file: logged, the running config kept, the manager alive.
    tmp.file(
        "manager.conf",
        "[drover-manager]\nAllowedNodeNames=a,b\nBogus=1\n",
    );
    run.signal(Signal::SIGHUP);
    let failed = poll(STEP, EVERY, "the failed reload is logged", || async {
        tmp.read("manager.log").contains("config reload failed")
    });
    let _ = failed.await;
    let logged = tmp.read("manager.log");
    assert!(
        logged.contains("config reload failed") && logged.contains("Bogus"),
        "{logged}"
    );
    assert!(run.try_wait().is_none(), "still running");
    assert!(node_known(&client, "a").await && node_known(&client, "b").await);

    run.signal(Signal::SIGTERM);
    let status = run.exited(STEP).await;
    assert!(status.success(), "{status:?}");
}
