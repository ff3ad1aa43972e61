//! The `drover-sandbox` binary's argument handling: usage errors are clap's (exit 2),
//! and commands that find no sandbox say so without touching anything.

mod common;

use common::{DownOnDrop, sandbox, stderr};
use std::process::Command;

#[test]
fn bad_arguments_are_usage_errors_with_exit_2() {
    for args in [
        &["up", "--nodes", "0"][..],
        &["up", "--nodes", "300"],
        &["up", "--nodes", "2", "--node", "a"],
        &["up", "--node", "bad_name"],
        &["up", "--managers", "0"],
        &["up", "--managers", "4"],
        &["up", "--managers", "two"],
        &["exec", "node1"],
        &["exec", "node1", "true"],
        &["install", "node1"],
        &["frobnicate"],
        &[],
    ] {
        let out = sandbox(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?} explains itself");
    }
    let out = sandbox(&["up", "--node", "bad_name"]);
    assert!(
        stderr(&out).contains("invalid node name"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn commands_without_a_sandbox_are_clear_and_down_is_idempotent() {
    let dir = format!("/tmp/drover-sb-none-{}", std::process::id());
    let out = sandbox(&["down", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to do"));
    assert!(!std::path::Path::new(&dir).exists(), "down creates nothing");

    let out = sandbox(&["exec", "--dir", &dir, "node1", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no sandbox in"), "{}", stderr(&out));
}

#[test]
fn up_exec_install_down_round_trip() {
    let dir = format!("/tmp/drover-sb-cli-up-{}", std::process::id());
    let _down = DownOnDrop(dir.clone());
    let out = sandbox(&["up", "--node", "alpha", "--node", "beta", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        printed.contains(&format!("export DROVER_BUS='unix:path={dir}/bus'")),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("export DROVER_SANDBOX_DIR='{dir}'")),
        "{printed}"
    );
    assert_eq!(
        std::fs::read_to_string(format!("{dir}/sandbox.env")).unwrap(),
        printed
    );
    let state = drover_sandbox::state::State::load(std::path::Path::new(&dir))
        .unwrap()
        .unwrap();
    assert!(state.is_live(), "processes outlive `up`");

    let out = sandbox(&["up", "--nodes", "1", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already running"), "{}", stderr(&out));

    let out = sandbox(&[
        "exec",
        "--dir",
        &dir,
        "beta",
        "--",
        "systemctl",
        "--user",
        "is-system-running",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "running");
    let out = sandbox(&["exec", "--dir", &dir, "alpha", "--", "sh", "-c", "exit 5"]);
    assert_eq!(out.status.code(), Some(5));

    let unit = format!("{dir}/round-trip.service");
    std::fs::write(&unit, "[Service]\nType=oneshot\nExecStart=/bin/true\n").unwrap();
    let out = sandbox(&["install", "--dir", &dir, "alpha", &unit]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = sandbox(&[
        "exec",
        "--dir",
        &dir,
        "alpha",
        "--",
        "systemctl",
        "--user",
        "start",
        "round-trip.service",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = sandbox(&["down", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(state.cgroups().pids().is_empty());
    assert!(!state.cgroups().any_exists());
    assert!(!std::path::Path::new(&dir).exists());
    let out = sandbox(&["down", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "down twice is fine");
}

/// A directory the caller made is theirs: `down` removes what the sandbox made in it (nodes,
/// bus, state, the manager's state directory with what was drained) and keeps the rest, so a
/// next `up` there starts with nothing drained and the caller's files are untouched.
#[test]
fn down_in_a_given_directory_removes_the_manager_state_and_keeps_the_callers_files() {
    let dir = format!("/tmp/drover-sb-cli-given-{}", std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    let _down = DownOnDrop(dir.clone());
    let mine = format!("{dir}/notes.txt");
    std::fs::write(&mine, "the caller's\n").unwrap();
    let out = sandbox(&["up", "--nodes", "1", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // Drain node1 on the manager's bus: the manager writes it into its state directory.
    let out = Command::new("busctl")
        .arg(format!("--address=unix:path={dir}/bus"))
        .args([
            "call",
            "org.eclipse.bluechi",
            "/org/eclipse/bluechi",
            "io.drover.Controller",
            "Drain",
            "sas",
            "node1",
            "0",
        ])
        .output()
        .expect("busctl runs");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let state_dir = std::path::Path::new(&dir).join(drover_sandbox::state::MANAGER_STATE_DIR);
    assert!(
        std::fs::read_dir(&state_dir).is_ok_and(|mut d| d.next().is_some()),
        "the drain is kept in {}",
        state_dir.display()
    );

    let out = sandbox(&["down", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!state_dir.exists(), "{} removed", state_dir.display());
    for made in ["node1", "bus", "state.json", "sandbox.env"] {
        assert!(
            !std::path::Path::new(&dir).join(made).exists(),
            "{made} removed"
        );
    }
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "the caller's\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demo_drives_the_cluster_with_droverctl_and_cleans_up() {
    let out = sandbox(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("$ droverctl status"), "{stdout}");
    assert!(
        stdout.contains("Unit drover-demo.service StartUnit operation result: done"),
        "{stdout}"
    );
    assert!(stdout.contains("node3"), "{stdout}");
    // The cross-node step: need-db on node1 started db on node3 through a proxy.
    assert!(
        stdout.contains("Unit need-db.service StartUnit operation result: done"),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.contains("node1")
            && l.contains("node3")
            && l.contains("db.service")
            && l.contains("active")),
        "droverctl proxies lists the dependency: {stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("drover-dep@db.service.service") && l.contains("active")),
        "{stdout}"
    );
    let dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sandbox up in "))
        .and_then(|l| l.split(' ').next())
        .expect("demo names its directory");
    assert!(!std::path::Path::new(dir).exists(), "demo removed {dir}");
}

#[test]
fn demo_interrupted_with_ctrl_c_still_cleans_up() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover-sandbox"))
        .arg("demo")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let dir = loop {
        let line = lines.next().expect("demo prints its directory").unwrap();
        if let Some(rest) = line.strip_prefix("sandbox up in ") {
            break rest.split(' ').next().unwrap().to_string();
        }
    };
    let state = drover_sandbox::state::State::load(std::path::Path::new(&dir))
        .unwrap()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "exited by itself, with an error: {status}"
    );
    assert!(
        err.contains("interrupted"),
        "stdout: {rest:?}\nstderr: {err}"
    );
    assert!(rest.iter().any(|l| l == "tearing down..."), "{rest:?}");
    assert!(state.cgroups().pids().is_empty());
    assert!(!state.cgroups().any_exists());
    assert!(!std::path::Path::new(&dir).exists());
}
