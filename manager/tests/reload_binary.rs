//! `drover-manager` and SIGHUP: the config is read again from the same
//! sources; a good one applies (new nodes appear on the bus), a bad one is
//! logged and the running config kept.

mod common;

use common::*;
use drover_testkit::process::{ChildGuard, Signal};
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
    let setup = BinarySetup::new("[drover-manager]\nAllowedNodeNames=a\nLogTarget=stderr\n");
    let mut run = ChildGuard::new(
        Command::new(BIN)
            .args(["--no-default-config", "--bus", setup.bus.address(), "-p"])
            .arg(setup.port.to_string())
            .arg("-c")
            .arg(&setup.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::from(setup.log()))
            .spawn()
            .expect("spawn drover-manager"),
    );
    let client = Api::connect(setup.bus.address()).await;
    let up = poll(STEP, EVERY, "the manager serves node a", || {
        node_known(&client, "a")
    });
    up.await.unwrap();
    assert!(!node_known(&client, "b").await);

    setup.tmp.file(
        "manager.conf",
        "[drover-manager]\nAllowedNodeNames=a,b\nLogTarget=stderr\nLogLevel=DEBUG\n\
         [node a]\nAllowDependenciesOn=b\n",
    );
    run.signal(Signal::SIGHUP);
    let added = poll(STEP, EVERY, "node b appears after SIGHUP", || {
        node_known(&client, "b")
    });
    added.await.unwrap();
    // The reload exports node b before it applies the log level: wait for both.
    let debug = poll(STEP, EVERY, "LogLevel is DEBUG after SIGHUP", || async {
        let level: String = client
            .get_property(CONTROLLER, CONTROLLER_IFACE, "LogLevel")
            .await;
        level == "DEBUG"
    });
    debug.await.unwrap();

    // A broken file: logged, the running config kept, the manager alive.
    setup.tmp.file(
        "manager.conf",
        "[drover-manager]\nAllowedNodeNames=a,b\nBogus=1\n",
    );
    run.signal(Signal::SIGHUP);
    let failed = poll(STEP, EVERY, "the failed reload is logged", || async {
        setup.logged().contains("config reload failed")
    });
    let _ = failed.await;
    let logged = setup.logged();
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

/// SIGHUP with a pattern added to `AllowedNodeNames`: a name it matches,
/// refused before, registers after, and gets its object on the bus.
#[tokio::test]
async fn sighup_adding_a_pattern_admits_new_names() {
    let conf = "[drover-manager]\nListenAddress=127.0.0.1\nAllowedNodeNames=a\nLogTarget=stderr\n";
    let setup = BinarySetup::new(conf);
    let mut run = ChildGuard::new(
        Command::new(BIN)
            .args(["--no-default-config", "--bus", setup.bus.address(), "-p"])
            .arg(setup.port.to_string())
            .arg("-c")
            .arg(&setup.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::from(setup.log()))
            .spawn()
            .expect("spawn drover-manager"),
    );
    let addr = format!("127.0.0.1:{}", setup.port).parse().expect("addr");
    let _a = FakeAgent::connect_when_up(addr, "a", reply_empty(), STEP)
        .await
        .expect("node a registers");
    assert!(
        FakeAgent::connect(addr, "edge-1", reply_empty())
            .await
            .is_err(),
        "edge-1 is not allowed yet"
    );

    setup.tmp.file(
        "manager.conf",
        &format!("{conf}AllowedNodeNames=a,edge-*\n"),
    );
    run.signal(Signal::SIGHUP);
    let reloaded = poll(STEP, EVERY, "the reload is logged", || async {
        setup.logged().contains("configuration reloaded")
    });
    reloaded.await.unwrap();
    let _edge = FakeAgent::connect(addr, "edge-1", reply_empty())
        .await
        .expect("edge-1 registers after the reload");
    let client = Api::connect(setup.bus.address()).await;
    assert!(node_known(&client, "edge-1").await);
    assert!(
        !node_known(&client, "edge-2").await,
        "only registered nodes"
    );

    run.signal(Signal::SIGTERM);
    let status = run.exited(STEP).await;
    assert!(status.success(), "{status:?}");
}
