//! The `drover-proxy` binary against a fake agent on a private dbus-daemon:
//! exit codes, the one-line reasons, what is (and is not) sent, and the release
//! on SIGTERM while waiting. The real agent and systemd are exercised in
//! tests/tests/proxies.rs; this pins the helper's own contract.

use drover_sandbox::PrivateBus;
use drover_testkit::process::{ChildGuard, Run, Signal};
use drover_testkit::standin::NamedError;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A private dbus-daemon of this test's own.
fn private_bus(tag: &str) -> PrivateBus {
    PrivateBus::start(&format!("drover-proxy-test-{tag}")).expect("private dbus-daemon")
}

/// The agent's refusal of a proxy.
fn refusal(message: String) -> NamedError {
    NamedError::new("org.eclipse.bluechi.ActivationFailed", message)
}

type Calls = Arc<Mutex<Vec<(String, String, String, String)>>>;

/// Behaves by target node: `ok` succeeds, `slow` never answers, anything else
/// is refused with "no such node".
struct FakeAgent {
    calls: Calls,
}

#[zbus::interface(name = "org.eclipse.bluechi.Agent")]
impl FakeAgent {
    async fn create_proxy(
        &self,
        service: String,
        node: String,
        unit: String,
    ) -> Result<(), NamedError> {
        self.calls
            .lock()
            .unwrap()
            .push(("create".into(), service, node.clone(), unit));
        match node.as_str() {
            "ok" => Ok(()),
            "slow" => std::future::pending().await,
            other => Err(refusal(format!("no such node '{other}'"))),
        }
    }

    async fn remove_proxy(&self, service: String, node: String, unit: String) {
        self.calls
            .lock()
            .unwrap()
            .push(("remove".into(), service, node, unit));
    }
}

async fn serve_agent(bus: &PrivateBus) -> (zbus::Connection, Calls) {
    let calls = Calls::default();
    let build = zbus::connection::Builder::address(bus.address())
        .name("org.eclipse.bluechi.Agent")
        .serve_at(
            "/org/eclipse/bluechi",
            FakeAgent {
                calls: calls.clone(),
            },
        )
        .build();
    let conn = tokio::time::timeout(Duration::from_secs(10), build)
        .await
        .expect("the fake agent gets on the bus in time")
        .unwrap();
    (conn, calls)
}

fn helper(bus: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drover-proxy"));
    cmd.arg("--bus").arg(bus).args(args);
    cmd
}

async fn run(bus: &str, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::from(helper(bus, args));
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("helper finishes")
        .expect("helper runs");
    Run::from(out)
}

/// `create slow_db`, once its `CreateProxy` reached the fake agent (which
/// never answers it).
async fn waiting_helper(bus: &PrivateBus, calls: &Calls) -> ChildGuard {
    let child = helper(bus.address(), &["create", "slow_db"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = ChildGuard::new(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "CreateProxy never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn one_line(text: &str) -> &str {
    let t = text.trim_end();
    assert!(!t.contains('\n'), "more than one line: {text:?}");
    t
}

fn tuple(verb: &str, service: &str, node: &str, unit: &str) -> (String, String, String, String) {
    (verb.into(), service.into(), node.into(), unit.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_remove_talk_to_the_agent_and_report_in_one_line() {
    let bus = private_bus("calls");
    let (_conn, calls) = serve_agent(&bus).await;

    let out = run(bus.address(), &["create", "ok_db"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        "drover-proxy: db.service on node ok is active"
    );

    let out = run(bus.address(), &["create", "ok_data.mount"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    let out = run(bus.address(), &["create", "node9_db"]).await;
    assert_eq!(out.code, 1);
    assert_eq!(
        one_line(&out.stderr),
        "drover-proxy: cannot start db.service on node node9: no such node 'node9'"
    );

    let out = run(bus.address(), &["remove", "ok_db"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    assert_eq!(
        *calls.lock().unwrap(),
        vec![
            tuple("create", "drover-proxy@ok_db.service", "ok", "db.service"),
            tuple(
                "create",
                "drover-proxy@ok_data.mount.service",
                "ok",
                "data.mount"
            ),
            tuple(
                "create",
                "drover-proxy@node9_db.service",
                "node9",
                "db.service"
            ),
            tuple("remove", "drover-proxy@ok_db.service", "ok", "db.service"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_instances_and_arguments_exit_2_and_send_nothing() {
    let bus = private_bus("garbage");
    let (_conn, calls) = serve_agent(&bus).await;
    for (instance, why) in [
        ("bad", "no '_' between node and unit"),
        ("_x", "bad target node: node name is empty"),
        ("node_", "bad target unit: unit name is empty"),
        ("a b_c", "bad target node: invalid node name 'a b'"),
        ("ok_tpl@", "is a template"),
        ("", "the proxy instance is empty"),
    ] {
        for verb in ["create", "remove"] {
            let out = run(bus.address(), &[verb, instance]).await;
            assert_eq!(out.code, 2, "{verb} {instance:?}");
            let err = out.stderr;
            let line = one_line(&err);
            assert!(line.starts_with("drover-proxy: "), "{line}");
            assert!(line.contains(why), "{verb} {instance:?}: {line}");
        }
    }
    // Bad arguments are usage errors too (exit 2), and so are refused
    // before anything is sent.
    for (args, why) in [
        (
            &["--frobnicate", "create", "ok_db"][..],
            "unknown option '--frobnicate'",
        ),
        (&["create", "ok_db", "extra"], "unexpected argument 'extra'"),
        (&["start", "ok_db"], "unknown command 'start'"),
        (&["--user", "create", "ok_db"], "exclude each other"),
    ] {
        let out = run(bus.address(), args).await;
        assert_eq!(out.code, 2, "{args:?}");
        let err = out.stderr;
        assert!(one_line(&err).contains(why), "{args:?}: {err}");
    }
    // A bus address the helper cannot use is a one-line connect failure.
    let out = run("tcp:host=localhost,port=1", &["create", "ok_db"]).await;
    assert_eq!(out.code, 1);
    let err = out.stderr;
    assert!(
        one_line(&err).contains("no unix:path= or unix:abstract= entry"),
        "{err}"
    );
    assert!(
        calls.lock().unwrap().is_empty(),
        "{:?}",
        calls.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_agent_on_the_bus_is_named_create_fails_remove_has_nothing_to_do() {
    let bus = private_bus("noagent");
    let out = run(bus.address(), &["create", "ok_db"]).await;
    assert_eq!(out.code, 1);
    let err = out.stderr;
    assert_eq!(
        one_line(&err),
        format!(
            "drover-proxy: cannot start db.service on node ok: the drover agent is not running on this node \
             (nobody owns org.eclipse.bluechi.Agent on bus {})",
            bus.address()
        )
    );
    let out = run(bus.address(), &["remove", "ok_db"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("nothing to release"));

    let gone = format!("unix:path={}/no-such-socket", bus.dir().display());
    let out = run(&gone, &["create", "ok_db"]).await;
    assert_eq!(out.code, 1);
    let err = out.stderr;
    assert!(
        one_line(&err).starts_with(&format!(
            "drover-proxy: cannot start db.service on node ok: cannot connect to bus {gone}:"
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_waiting_releases_the_proxy_and_ends_by_sigterm() {
    let bus = private_bus("sigterm");
    let (_conn, calls) = serve_agent(&bus).await;
    let child = waiting_helper(&bus, &calls).await;
    child.signal(Signal::SIGTERM);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc_sigterm()),
        "the helper ends by SIGTERM so SuccessExitStatus=SIGTERM applies: {:?}",
        out.status
    );
    assert!(
        stderr(&out).contains("releasing the proxy"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        *calls.lock().unwrap(),
        vec![
            tuple(
                "create",
                "drover-proxy@slow_db.service",
                "slow",
                "db.service"
            ),
            tuple(
                "remove",
                "drover-proxy@slow_db.service",
                "slow",
                "db.service"
            ),
        ]
    );
}

fn libc_sigterm() -> i32 {
    nix::sys::signal::Signal::SIGTERM as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_goes_away_while_the_helper_waits_fails_the_start_in_one_line() {
    let bus = private_bus("vanish");
    let (conn, calls) = serve_agent(&bus).await;
    let child = waiting_helper(&bus, &calls).await;
    conn.close().await.unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        one_line(&err).starts_with(
            "drover-proxy: cannot start db.service on node slow: the drover agent went away"
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_goes_away_while_the_helper_waits_fails_the_start_in_one_line() {
    let bus = private_bus("busgone");
    let (_conn, calls) = serve_agent(&bus).await;
    let child = waiting_helper(&bus, &calls).await;
    // The daemon is this test's own (PrivateBus); its Drop reaps it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bus.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(
        one_line(&err),
        format!(
            "drover-proxy: cannot start db.service on node slow: the drover agent went away \
             before answering (bus {} closed the connection)",
            bus.address()
        )
    );
}

/// The helper run as BlueChi's template runs `/usr/libexec/bluechi-proxy`
/// (the compat set's link to this binary): `argv[0]` is that name.
fn as_bluechi_proxy(bus: &str, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = helper(bus, args);
    cmd.arg0("/usr/libexec/bluechi-proxy");
    cmd
}

async fn run_cmd(cmd: Command) -> Run {
    let mut cmd = tokio::process::Command::from(cmd);
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("helper finishes")
        .expect("helper runs");
    Run::from(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_bluechi_proxy_it_makes_exactly_bluechis_calls() {
    let bus = private_bus("bluechi");
    let (_conn, calls) = serve_agent(&bus).await;

    // `ExecStart=/usr/libexec/bluechi-proxy create %i.service` of
    // bluechi-proxy@ok_db.service.
    let out = run_cmd(as_bluechi_proxy(
        bus.address(),
        &["create", "ok_db.service"],
    ))
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        "bluechi-proxy: db.service on node ok is active"
    );
    let out = run_cmd(as_bluechi_proxy(
        bus.address(),
        &["remove", "ok_db.service"],
    ))
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    // BlueChi's argument convention, refused with the reason before anything
    // is sent: no `.service` (drover's convention), no '_', no node.
    for (arg, why) in [
        ("ok_db", "does not end in .service"),
        ("nounderscore.service", "no '_' between node and unit"),
        ("_db.service", "bad target node"),
    ] {
        let out = run_cmd(as_bluechi_proxy(bus.address(), &["create", arg])).await;
        assert_eq!(out.code, 2, "{arg}");
        let err = out.stderr;
        let line = one_line(&err);
        assert!(line.starts_with("bluechi-proxy: "), "{line}");
        assert!(line.contains(why), "{arg}: {line}");
    }
    assert_eq!(
        *calls.lock().unwrap(),
        vec![
            tuple("create", "bluechi-proxy@ok_db.service", "ok", "db.service"),
            tuple("remove", "bluechi-proxy@ok_db.service", "ok", "db.service"),
        ]
    );
}
