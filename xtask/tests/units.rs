//! The shipped daemon units bring their daemon back after a failure.
//!
//! Both daemons exit with a failure status when the bus they live on goes
//! away (the manager: its own bus; the agent: its systemd's bus), because a
//! lost D-Bus connection cannot be resumed (the manager's well-known name is
//! gone with it). That is only safe when the unit restarts them on *failure*:
//! `Restart=on-abnormal` ignores a non-zero exit, and the node or the whole
//! fleet's API stayed down until someone acted (issue 14, items 3 and 5).

use std::path::{Path, PathBuf};

fn dist(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("dist")
        .join(path)
}

/// The value of `key=` in the `[Service]` section of `unit` (the last one wins, as in systemd).
fn service_setting(unit: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dist(unit)).unwrap();
    let mut in_service = false;
    let mut value = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && let Some(v) = line.strip_prefix(&format!("{key}=")) {
            value = Some(v.to_owned());
        }
    }
    value
}

#[test]
fn daemons_are_restarted_when_they_exit_with_a_failure() {
    for unit in [
        "usr/lib/systemd/system/drover-manager.service",
        "usr/lib/systemd/system/drover-agent.service",
        "usr/lib/systemd/user/drover-agent.service",
    ] {
        assert_eq!(
            service_setting(unit, "Restart").as_deref(),
            Some("on-failure"),
            "{unit}"
        );
        let pause =
            service_setting(unit, "RestartSec").unwrap_or_else(|| panic!("{unit}: RestartSec"));
        let seconds: f64 = pause
            .trim_end_matches('s')
            .parse()
            .unwrap_or_else(|e| panic!("{unit}: RestartSec={pause}: {e}"));
        // Long enough not to spin against a bus that is still coming back,
        // short enough that a node or the API is not down for long.
        assert!(
            (1.0..=10.0).contains(&seconds),
            "{unit}: RestartSec={pause}"
        );
    }
}
