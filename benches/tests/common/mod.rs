//! Running `drover-bench` as a user would, for the benchmarks' own tests.

use drover_testkit::process::{GroupGuard, live_in_group};
use std::time::Duration;

/// Runs this build's `drover-bench` with `args` in a process group of its
/// own, within `limit`; asserts that it succeeded and left no process of
/// its group behind (the group is killed if the test fails first), and
/// returns its stdout and stderr.
pub async fn run_bench(args: &[&str], limit: Duration) -> (String, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover-bench"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("run drover-bench");
    let pgid = child.id().expect("a pid");
    let group = GroupGuard::new(pgid);
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the run ends within {limit:?}"))
        .expect("its output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    drover_testkit::wait::eventually(
        Duration::from_secs(10),
        "nothing of the run left",
        || async { live_in_group(pgid).is_empty() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", live_in_group(pgid)));
    drop(group);
    (stdout, stderr)
}

/// The number right after the first `label` in `line` (`label 12`,
/// `label 12,`, `label 0.31)`); panics naming both when there is none.
#[allow(dead_code)] // not every test of this directory reads numbers
pub fn number_after<T: std::str::FromStr>(line: &str, label: &str) -> T {
    let rest = line
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"))
        .1;
    rest.split_whitespace()
        .next()
        .map(|w| w.trim_end_matches([',', ';', ')']))
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {line:?}"))
}
