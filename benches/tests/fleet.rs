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
