//! The `drover-sandbox` binary's argument handling: usage errors are clap's (exit 2),
//! and commands that find no sandbox say so without touching anything.

use std::process::{Command, Output};

fn sandbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drover-sandbox"))
        .args(args)
        .env_remove("DROVER_SANDBOX_DIR")
        .output()
        .expect("drover-sandbox runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_arguments_are_usage_errors_with_exit_2() {
    for args in [
        &["up", "--nodes", "0"][..],
        &["up", "--nodes", "300"],
        &["up", "--nodes", "2", "--node", "a"],
        &["up", "--node", "bad_name"],
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
