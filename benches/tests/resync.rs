//! `drover-bench resync` keeps measuring what it says: 6 simulated agents
//! sending the real agent's resync digests every second or so to the debug
//! `drover-manager` of this build, with verdict flips (5 checks a node)
//! and unit events flowing, for a clean run of 8 s; then 2 of them change
//! a watched unit without telling the manager. What is asserted is what a person reading
//! its output would check: the clean run asked for no snapshot while the
//! manager compared digests, and the lost events were found and repaired,
//! exactly one snapshot request and one repair per diverged agent, nothing
//! asked twice an interval later. (Timings are not asserted: the machine
//! is shared.)

mod common;

use common::{number_after, run_bench};
use std::time::Duration;

/// The count after `label` in `line`.
fn after(line: &str, label: &str) -> u64 {
    number_after(line, label)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_fleet_asks_no_snapshot_and_a_lost_event_is_repaired() {
    let (stdout, stderr) = run_bench(
        &[
            "resync",
            "--nodes",
            "6",
            "--duration",
            "8",
            "--progress",
            "4",
            "--resync-ms",
            "1000",
            "--units",
            "5",
            "--watch",
            "2",
            "--health-checks",
            "5",
            "--health-flip-percent",
            "100",
            "--event-rate",
            "2",
            "--diverge",
            "2",
            "--online-timeout",
            "60",
        ],
        Duration::from_secs(180),
    )
    .await;
    let line = |needle: &str| -> String {
        stdout
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{stdout}\n{stderr}"))
            .to_owned()
    };

    let clean = line("resync 6: clean run of ");
    assert_eq!(after(&clean, "snapshot requests"), 0, "{stdout}\n{stderr}");
    assert_eq!(after(&clean, "mismatches"), 0, "{stdout}\n{stderr}");
    let traffic = line("resync 6: digests sent ");
    // About 6 agents × 8 s / (0.75–1 s): the digests flowed and the manager
    // compared them (it reads at most one per half interval and node).
    let sent = after(&traffic, "digests sent");
    let compared = after(&traffic, "compared by the manager");
    assert!(sent >= 30, "{traffic}");
    // (A digest in flight when the counters were read may be on one side
    // only: at most one per agent.)
    assert!(compared >= 30 && compared <= sent + 6, "{traffic}");
    // ... while verdicts flipped and unit events of a watched unit flowed.
    assert!(after(&traffic, "bytes/s;") > 0, "{traffic}");
    assert!(after(&traffic, "verdict flips and") > 0, "{traffic}");

    let repaired = line("resync 6: 2 agents changed fleet-0.service unreported");
    assert_eq!(
        after(&repaired, "snapshot requests"),
        2,
        "{stdout}\n{stderr}"
    );
    assert_eq!(after(&repaired, "repairs"), 2, "{stdout}\n{stderr}");
    assert_eq!(after(&repaired, "mismatches"), 2, "{stdout}\n{stderr}");
}
