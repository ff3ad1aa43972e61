//! `drover-bench start-unit` keeps working and keeps reporting its legs: a
//! sandbox of this build's debug daemons on real systemd managers, five
//! rounds. Asserted is what a person reading its output checks: every kind
//! of sample was taken five times, the legs and the daemons' CPU are
//! reported as numbers, a start and a read through drover cost the manager
//! and the agent CPU, and the run left no process behind. (Timings are not
//! asserted: the machine is shared.)

mod common;

use common::{number_after, run_bench};
use std::time::Duration;

/// The number after `label` on the first line of `out` that holds it.
fn number_in(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{out}"));
    number_after(line, label)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_is_timed_both_ways_with_its_legs_and_the_daemons_cpu() {
    let (stdout, stderr) =
        run_bench(&["start-unit", "--samples", "5"], Duration::from_secs(180)).await;
    let out = format!("{stdout}\n{stderr}");
    for kind in [
        "start, direct systemd",
        "start, via drover",
        "read, direct systemd",
        "read, via drover",
        "Peer.Ping to manager",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(kind))
            .unwrap_or_else(|| panic!("no {kind:?} in:\n{out}"));
        assert!(line.contains("n=5 "), "five samples of {kind:?}: {line}");
    }
    for leg in [
        "bus round trip to the manager (Peer.Ping)",
        "manager <-> agent and drover's code (read overhead - ping)",
        "a read through drover over the same read on systemd",
        "the job: drover's job object, JobRemoved relayed (start overhead - read overhead)",
    ] {
        number_in(&stdout, leg);
    }
    let ping = number_in(&stdout, "bus round trip to the manager (Peer.Ping)");
    assert!(ping > 0.0, "a bus round trip takes time: {ping}");
    // A start and a read through drover are work of both daemons.
    let start_cpu = number_in(&stdout, "drover's CPU a start (manager + agent):");
    let read_cpu = number_in(&stdout, "; a read:");
    assert!(start_cpu > 0.0 && read_cpu > 0.0, "{stdout}");
    let via = stdout
        .lines()
        .find(|l| l.contains("start, via drover"))
        .expect("the line");
    assert!(number_after::<f64>(via, "manager") > 0.0, "{via}");
    assert!(number_after::<f64>(via, "agent") > 0.0, "{via}");
}
