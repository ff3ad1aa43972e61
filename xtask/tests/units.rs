//! The shipped daemon units bring their daemon back after a failure.
//!
//! Both daemons exit with a failure status when the bus they live on goes
//! away (the manager: its own bus; the agent: its systemd's bus), because a
//! lost D-Bus connection cannot be resumed (the manager's well-known name is
//! gone with it). That is only safe when the unit restarts them on *failure*:
//! `Restart=on-abnormal` ignores a non-zero exit, and the node or the whole
//! fleet's API stayed down until someone acted (issue 14, items 3 and 5).
//! And the restarts must not reach the start limit while the bus is away.

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
    setting(unit, "[Service]", key)
}

/// The value of `key=` in `section` (`[Unit]`, `[Service]`) of `unit`.
fn setting(unit: &str, section: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dist(unit)).unwrap();
    let mut in_section = false;
    let mut value = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == section;
        } else if in_section && let Some(v) = line.strip_prefix(&format!("{key}=")) {
            value = Some(v.to_owned());
        }
    }
    value
}

/// A time span written as whole or fractional seconds (`2s`, `10s`).
fn seconds(unit: &str, key: &str, value: &str) -> f64 {
    value
        .trim_end_matches('s')
        .parse()
        .unwrap_or_else(|e| panic!("{unit}: {key}={value}: {e}"))
}

const RESTARTED: [&str; 3] = [
    "usr/lib/systemd/system/drover-manager.service",
    "usr/lib/systemd/system/drover-agent.service",
    "usr/lib/systemd/user/drover-agent.service",
];

#[test]
fn daemons_are_restarted_when_they_exit_with_a_failure() {
    for unit in RESTARTED {
        assert_eq!(
            service_setting(unit, "Restart").as_deref(),
            Some("on-failure"),
            "{unit}"
        );
        let pause =
            service_setting(unit, "RestartSec").unwrap_or_else(|| panic!("{unit}: RestartSec"));
        let seconds = seconds(unit, "RestartSec", &pause);
        // Long enough not to spin against a bus that is still coming back,
        // short enough that a node or the API is not down for long.
        assert!(
            (1.0..=10.0).contains(&seconds),
            "{unit}: RestartSec={pause}"
        );
    }
}

/// systemd stops restarting a unit started more than `StartLimitBurst=` times
/// within `StartLimitIntervalSec=`. Automatic restarts are more than
/// `RestartSec=` apart, so with burst × RestartSec ≥ interval they never
/// reach the limit and a daemon whose bus is away is restarted until the bus
/// is back (`tests/tests/systemd_units.rs` keeps a bus away past the limit
/// under a real systemd). Both values are in the units, so a host's
/// `DefaultStartLimit…=` cannot change that.
#[test]
fn restarts_while_a_bus_is_away_never_reach_the_start_limit() {
    for unit in RESTARTED {
        let get = |key: &str| {
            setting(unit, "[Unit]", key).unwrap_or_else(|| panic!("{unit}: [Unit] {key}="))
        };
        let interval = get("StartLimitIntervalSec");
        let interval = seconds(unit, "StartLimitIntervalSec", &interval);
        let burst: f64 = get("StartLimitBurst")
            .parse()
            .unwrap_or_else(|e| panic!("{unit}: StartLimitBurst: {e}"));
        let pause = service_setting(unit, "RestartSec").unwrap();
        let pause = seconds(unit, "RestartSec", &pause);
        assert!(
            interval == 0.0 || burst * pause >= interval,
            "{unit}: {burst} restarts {pause} s apart fit in StartLimitIntervalSec={interval}s: \
             systemd would give up while a bus is away"
        );
    }
}
