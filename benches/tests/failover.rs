//! `drover-bench failover` keeps working: 100 simulated agents in agent
//! processes of their own, two debug managers of this build on a real etcd,
//! one round (a SIGKILL and a SIGTERM of the leader). What is asserted is
//! what a person reading its output would check: both handovers were
//! measured for every agent, no welcome was refused for a lower epoch (the
//! managers' epochs only rose), and the run left no process behind.
//! (Timings are not asserted: the machine is shared.)

mod common;

use common::run_bench;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fleet_follows_a_killed_and_a_stopped_leader() {
    let (stdout, stderr) = run_bench(
        &[
            "failover",
            "--nodes",
            "100",
            "--rounds",
            "1",
            "--online-timeout",
            "60",
        ],
        Duration::from_secs(120),
    )
    .await;
    for needle in [
        "failover 100: every agent registered with A and parked on B after ",
        "failover 100: SIGKILL of the leader: new leader after ",
        "failover 100: SIGTERM of the leader: new leader after ",
        "failover 100: welcomes refused for a lower epoch: 0;",
    ] {
        assert!(
            stdout.contains(needle),
            "no {needle:?} in:\n{stdout}\n{stderr}"
        );
    }
    // Every agent was measured: a percentage of all 100 within the target or not.
    assert_eq!(stdout.matches("% within 5 s").count(), 2, "{stdout}");
}
