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
use std::time::Duration;

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

/// Stopped mid-run (SIGTERM, as `timeout` or systemd stops it), `drover-bench`
/// tears down what it started, as on any failure: no temporary directory of
/// its own left, no process still naming one, and a run that fails saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_sigterm_leaves_nothing_behind() {
    use tokio::io::{AsyncBufReadExt, BufReader};
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
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    // The 600 s idle window starts after the sweep: the run is mid-way then.
    let swept = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("every node swept") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(swept, Ok(true), "{seen}");
    let prefix = format!("drover-bench-fleet-{pid}-");
    let ours = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    };
    assert_eq!(ours().len(), 1, "the run's own bus directory");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("drover-bench did not stop on SIGTERM")
        .unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        seen.push_str(&line);
        seen.push('\n');
    }
    assert_eq!(status.code(), Some(1), "{seen}");
    assert!(seen.contains("stopped by SIGTERM"), "{seen}");
    assert_eq!(ours(), Vec::<String>::new(), "left behind");
    let named: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&prefix))
        .collect();
    assert_eq!(named, Vec::<String>::new(), "processes of the run still up");
    let _ = std::fs::remove_file(&csv);
}
