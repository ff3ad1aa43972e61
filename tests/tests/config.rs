//! The daemons refuse bad configuration and bad flags with a message that
//! names the file, the line and the key, exit non-zero, and start nothing.

use drover_testkit::process::{TempDir, bin};
use std::process::Output;
use std::time::Duration;

/// Runs a daemon that must refuse to start; a daemon that starts anyway is
/// killed after a few seconds and the test fails.
async fn refused(binary: &str, args: &[&str]) -> Output {
    let child = tokio::process::Command::new(bin(binary))
        .args(args)
        // A bus nobody serves: if the daemon got past its config, it would fail
        // later for another reason, and the message check below catches that.
        .env("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(10), child)
        .await
        .unwrap_or_else(|_| panic!("{binary} {args:?} did not exit"))
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Config files each daemon must refuse: (daemon, text, the key the message names, the
/// line it names).
const BAD_CONFIGS: &[(&str, &str, &str, u32)] = &[
    (
        "drover-manager",
        "[drover-manager]\nControllerPort=0\n",
        "ControllerPort",
        2,
    ),
    (
        "drover-manager",
        "[drover-manager]\nControllerPort=eight\n",
        "ControllerPort",
        2,
    ),
    (
        "drover-manager",
        "[drover-manager]\nAllowedNodeNames=ok,bad_name\n",
        "AllowedNodeNames",
        2,
    ),
    (
        "drover-manager",
        "[drover-manager]\nNodeHeartbeatThresold=5\n",
        "NodeHeartbeatThresold",
        2,
    ),
    (
        "drover-manager",
        "[drover-manager]\n\nUseTCP=maybe\n",
        "UseTCP",
        3,
    ),
    (
        "drover-manager",
        "[drover-manager]\nLogLevel=loud\n",
        "LogLevel",
        2,
    ),
    ("drover-manager", "ControllerPort=842\n", "", 1),
    ("drover-manager", "[node a_b]\nAllowed=true\n", "", 1),
    ("drover-manager", "[drover-manager\n", "", 1),
    (
        "drover-agent",
        "[drover-agent]\nNodeName=has space\n",
        "NodeName",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nControllerAddress=unix:path=/x\n",
        "ControllerAddress",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nHeartbeatInterval=-1\n",
        "HeartbeatInterval",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nControllerPort=70000\n",
        "ControllerPort",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nAdvertiseAddress=node1.example\n",
        "AdvertiseAddress",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nAdvertiseAddress=0.0.0.0\n",
        "AdvertiseAddress",
        2,
    ),
    (
        "drover-agent",
        "[drover-agent]\nAdvertiseAddress=[2001:db8::1]\n",
        "AdvertiseAddress",
        2,
    ),
    (
        "drover-manager",
        "[drover-manager]\nStateDirectory=var/lib/drover\n",
        "StateDirectory",
        2,
    ),
    // BlueChi's agent section is accepted (tests/tests/bluechi_dropin.rs); the
    // manager's is not.
    (
        "drover-agent",
        "[bluechi-controller]\nNodeName=x\n",
        "drover-agent",
        1,
    ),
];

/// Starts `binary` with each of its [`BAD_CONFIGS`]: each must be refused with exit 1
/// and a message naming `file:line` and the key; `one_line` also checks that the
/// message is a single line.
async fn refuses_bad_configs(binary: &str, one_line: bool) {
    let dir = TempDir::new(&format!("drover-config-test-{binary}"));
    let cases = BAD_CONFIGS.iter().filter(|(b, ..)| *b == binary);
    for (i, (_, text, key, line)) in cases.enumerate() {
        let file = dir.file(&format!("bad{i}.conf"), text);
        let file_s = file.to_str().unwrap();
        let args = [
            "--no-default-config",
            "-c",
            file_s,
            "--bus",
            "unix:path=/nonexistent",
        ];
        let out = refused(binary, &args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{text:?}: {err}");
        assert!(
            err.contains(&format!("{file_s}:{line}")),
            "{text:?} names file:line: {err}"
        );
        assert!(err.contains(key), "{text:?} names the key: {err}");
        if one_line {
            assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
        }
    }
}

#[tokio::test]
async fn manager_refuses_bad_config_files_naming_file_line_and_key() {
    refuses_bad_configs("drover-manager", true).await;
    // A -c file that does not exist is an error too, not an empty config.
    let out = refused(
        "drover-manager",
        &["--no-default-config", "-c", "/nonexistent/manager.conf"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/nonexistent/manager.conf"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn agent_refuses_bad_config_files_naming_file_line_and_key() {
    refuses_bad_configs("drover-agent", false).await;
}

#[tokio::test]
async fn daemons_reject_bad_flags_with_usage() {
    for (binary, args) in [
        ("drover-manager", vec!["--frobnicate"]),
        ("drover-manager", vec!["-p", "0"]),
        ("drover-manager", vec!["-p", "port"]),
        ("drover-manager", vec!["--user", "--bus", "unix:path=/x"]),
        ("drover-agent", vec!["--frobnicate"]),
        ("drover-agent", vec!["-i", "often"]),
        ("drover-agent", vec!["--user", "--bus", "unix:path=/x"]),
    ] {
        let out = refused(binary, &args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{binary} {args:?}: {}",
            stderr(&out)
        );
        let err = stderr(&out);
        assert!(
            err.contains("Usage") || err.contains("--help"),
            "{binary} {args:?}: {err}"
        );
        assert!(
            err.contains(args[0].trim_start_matches('-')),
            "names the flag: {err}"
        );
    }
    let out = refused(
        "drover-agent",
        &[
            "--no-default-config",
            "-n",
            "bad_name",
            "--bus",
            "unix:path=/x",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("bad_name") && stderr(&out).contains("-n"),
        "{}",
        stderr(&out)
    );
}
