//! The fleet generator keeps working: a small fleet (500 plaintext agents,
//! 40 with TLS) against the debug `drover-manager` and `droverctl` of this
//! build, every phase of `drover_bench::fleet::run` on, a few seconds each.
//! What is asserted is what a person reading the CSV would check: every
//! agent came online in each phase, the API saw them all, every row and
//! event was accounted for, and the CSV line has a field for each column.
//! (Timings are not asserted: the machine is shared.)

use drover_bench::fleet::daemon::{Transport, raise_nofile};
use drover_bench::fleet::report::{HEADER, Row, csv_line};
use drover_bench::fleet::{Options, run};
use drover_testkit::process::{GroupGuard, live_in_group};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStderr;

fn small(nodes: usize, transport: Transport, pki_dir: &std::path::Path) -> Options {
    let mut opts = Options::new(nodes, transport);
    opts.idle_seconds = 1.0;
    opts.units = 10;
    opts.event_rate = 2;
    opts.monitor_seconds = 1.0;
    opts.start_samples = 5;
    opts.online_timeout = Duration::from_secs(60);
    // The idle phase waits for the manager's sweep of every new node.
    opts.proxy_grace_ms = Some(1000);
    opts.pki_dir = pki_dir.to_path_buf();
    // Five checks a node, each flipping once a minute: about one agent in
    // twelve flips in a one-second window.
    opts.health_checks = 5;
    opts.health_flip_percent = 100.0;
    opts.health_rounds = 1;
    opts
}

fn check(row: &Row, nodes: usize) {
    assert_eq!(row.nodes, nodes);
    assert!(row.online_cold_s > 0.0, "{row:?}");
    assert!(row.rss_kib > row.rss_empty_kib, "{row:?}");
    assert!(row.anon_kib > row.anon_empty_kib, "{row:?}");
    assert!(row.idle_cpu_pct >= 0.0);
    assert!(row.list_nodes_ms.is_some_and(|t| t > 0.0), "{row:?}");
    assert!(
        row.status_ms.is_some_and(|t| t > 0.0),
        "droverctl status: {row:?}"
    );
    assert!(
        row.start_ms.is_some() && row.start_3_ms.is_some(),
        "{row:?}"
    );
    assert_eq!(row.list_units_error, None);
    assert_eq!(row.list_units_rows, Some(nodes * 10));
    assert!(
        row.list_units_peak_kib
            .is_some_and(|p| p >= row.rss_empty_kib)
    );
    // droverctl list-units over all nodes, node by node: every row printed.
    assert_eq!(row.ctl_list_error, None, "{row:?}");
    assert_eq!(row.ctl_list_rows, Some(nodes * 10));
    assert!(row.ctl_list_peak_kib.is_some_and(|p| p > 0), "{row:?}");
    assert!(row.ctl_list_manager_peak_kib.is_some(), "{row:?}");
    let (heard, units) = row.star_replay.expect("the replay was measured");
    assert_eq!(units, (nodes * 10) as u64);
    assert!(heard <= units, "{row:?}");
    let sent = row.monitor_sent.expect("events were sent");
    assert!(sent > 0, "the agents sent unit events: {row:?}");
    assert_eq!(row.monitor_lost, Some(0), "{row:?}");
    assert!(row.monitor_p99_ms.is_some_and(|p| p > 0.0), "{row:?}");
    assert!(row.online_half_s.is_some_and(|t| t > 0.0), "{row:?}");
    assert!(row.online_restart_s.is_some_and(|t| t > 0.0), "{row:?}");
    // Every declared check reached the manager, and the flips with it (the
    // run itself fails when the manager's unhealthy units differ from the
    // agents' last verdicts).
    assert_eq!(row.health_units, Some(nodes * 5), "{row:?}");
    assert!(row.health_flips.is_some_and(|f| f > 0), "{row:?}");
    assert!(row.health_extra_cpu_pct.is_some(), "{row:?}");
    let line = csv_line(row);
    assert_eq!(line.split(',').count(), HEADER.split(',').count(), "{line}");
}

/// A PKI directory of this test, removed at the end (also on failure).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fleet_comes_online_in_every_phase_and_is_measured() {
    raise_nofile(8192).unwrap();
    let dir =
        TempDir(std::env::temp_dir().join(format!("drover-fleet-test-{}", std::process::id())));

    let row = run(&small(500, Transport::Plain, &dir.0)).await.unwrap();
    check(&row, 500);
    assert_eq!(row.transport, "plain");

    let row = run(&small(40, Transport::Tls, &dir.0)).await.unwrap();
    check(&row, 40);
    assert_eq!(row.transport, "tls");
    assert!(
        dir.0.join("nodes/fleet39.pem").exists(),
        "the node certificates come from drover_tls::pki"
    );
}

/// `drover-bench fleet` (20 agents) stopped mid-way: in its 600 s idle window,
/// after every node was swept, its manager and dbus-daemon up. It runs in a
/// process group of its own, and dropping this (as a failing test does) kills
/// the whole group: the bench and what it started, which a kill of the bench
/// alone would orphan. What a killed bench could not remove (its bus
/// directory, the CSV) goes too.
struct MidRun {
    group: GroupGuard,
    child: tokio::process::Child,
    lines: Lines<BufReader<ChildStderr>>,
    /// Its stderr so far.
    seen: String,
    csv: std::path::PathBuf,
}

impl MidRun {
    async fn start() -> MidRun {
        let csv = std::env::temp_dir().join(format!("drover-fleet-sig-{}.csv", std::process::id()));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover-bench"))
            .args([
                "fleet",
                "--nodes",
                "20",
                "--transport",
                "plain",
                "--units",
                "0",
            ])
            .args([
                "--event-rate",
                "0",
                "--idle-seconds",
                "600",
                "--start-samples",
                "0",
            ])
            .args(["--no-disruptions", "--proxy-grace-ms", "1000", "--csv"])
            .arg(&csv)
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let group = GroupGuard::new(child.id().unwrap());
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut run = MidRun {
            group,
            child,
            lines,
            seen: String::new(),
            csv,
        };
        // The 600 s idle window starts after the sweep: the run is mid-way then.
        let swept = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = run.lines.next_line().await.unwrap() {
                run.seen.push_str(&line);
                run.seen.push('\n');
                if line.contains("every node swept") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(swept, Ok(true), "{}", run.seen);
        run
    }

    fn pid(&self) -> u32 {
        self.group.id()
    }

    /// What the run's temporary directories and processes are named after.
    fn prefix(&self) -> String {
        format!("drover-bench-fleet-{}-", self.pid())
    }

    /// The run's own temporary directories.
    fn dirs(&self) -> Vec<String> {
        let prefix = self.prefix();
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    }
}

impl Drop for MidRun {
    fn drop(&mut self) {
        // `group` is dropped after this: its SIGKILL reaches every process of
        // the run. The files a killed bench leaves are removed here.
        for dir in self.dirs() {
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(dir));
        }
        let _ = std::fs::remove_file(&self.csv);
    }
}

/// Live processes whose command line names `prefix` (the run's manager and
/// dbus-daemon name its bus directory).
fn named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(prefix))
        .collect()
}

/// Stopped mid-run (SIGTERM, as `timeout` or systemd stops it), `drover-bench`
/// tears down what it started, as on any failure: no temporary directory of
/// its own left, no process still naming one, and a run that fails saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_sigterm_leaves_nothing_behind() {
    let mut run = MidRun::start().await;
    assert_eq!(run.dirs().len(), 1, "the run's own bus directory");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(run.pid()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), run.child.wait())
        .await
        .expect("drover-bench did not stop on SIGTERM")
        .unwrap();
    while let Some(line) = run.lines.next_line().await.unwrap() {
        run.seen.push_str(&line);
        run.seen.push('\n');
    }
    assert_eq!(status.code(), Some(1), "{}", run.seen);
    assert!(run.seen.contains("stopped by SIGTERM"), "{}", run.seen);
    assert_eq!(run.dirs(), Vec::<String>::new(), "left behind");
    assert_eq!(
        named(&run.prefix()),
        Vec::<String>::new(),
        "processes of the run still up"
    );
}

/// The teardown of a test that fails while `drover-bench` runs (here: the
/// guard dropped mid-run, as a panic drops it) kills the bench and everything
/// it started: its manager and dbus-daemon, which SIGKILL to the bench alone
/// leaves running, orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_leaves_no_process_behind() {
    let run = MidRun::start().await;
    let prefix = run.prefix();
    let group = run.group.id();
    let started = named(&prefix);
    assert!(
        started.iter().any(|c| c.contains("drover-manager"))
            && started.iter().any(|c| c.contains("dbus-daemon")),
        "the run's manager and bus are up: {started:?}"
    );
    assert!(
        live_in_group(group).len() >= 3,
        "the bench, its manager and its bus"
    );
    drop(run);
    drover_testkit::wait::eventually(Duration::from_secs(10), "nothing of the run left", || {
        let prefix = prefix.clone();
        async move { named(&prefix).is_empty() && live_in_group(group).is_empty() }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?} {:?}", named(&prefix), live_in_group(group)));
}
