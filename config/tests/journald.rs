//! Log lines reach journald with the priorities systemd's own daemons use:
//! ERROR → 3 (err), WARN → 4 (warning), INFO → 6 (info), DEBUG → 7 (debug).
//!
//! End to end, through journald's real wire: the test runs itself again in a
//! private mount namespace with a tmpfs on /run, where the child binds
//! `/run/systemd/journal/socket` (the fixed path every journald client writes
//! to), sets up logging exactly as the daemons do (`LogTarget=journald`), logs
//! one line per level and reports the `PRIORITY=` of each datagram it got.
//! Needs root and `unshare` (util-linux), like the rest of the test suite.

use drover_config::{LogLevel, LogTarget, LoggingConfig};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

const CHILD_ENV: &str = "DROVER_JOURNALD_TEST_CHILD";
const SOCKET: &str = "/run/systemd/journal/socket";

#[test]
fn levels_reach_journald_with_systemd_priorities() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c"])
        .arg("mount -t tmpfs tmpfs /run && exec \"$0\" --exact journald_child --ignored --nocapture --test-threads=1")
        .arg(&exe)
        .env(CHILD_ENV, "1")
        .output()
        .expect("running unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut got: Vec<(String, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("JOURNALD "))
        .filter_map(|l| l.split_once(' '))
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    got.sort();
    let want: Vec<(String, String)> = [
        ("debug-line", "7"),
        ("error-line", "3"),
        ("info-line", "6"),
        ("warn-line", "4"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    assert_eq!(got, want, "child output:\n{stdout}");
}

/// Runs only inside the namespace made by the test above.
#[test]
#[ignore = "run by levels_reach_journald_with_systemd_priorities in its own mount namespace"]
fn journald_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "only meaningful as the child of levels_reach_journald_with_systemd_priorities"
    );
    std::fs::create_dir_all("/run/systemd/journal").unwrap();
    let journal = UnixDatagram::bind(SOCKET).unwrap();
    journal
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    drover_config::logging::init(&LoggingConfig {
        level: LogLevel::Debug,
        target: LogTarget::Journald,
        quiet: false,
    });
    tracing::error!("error-line");
    tracing::warn!("warn-line");
    tracing::info!("info-line");
    tracing::debug!("debug-line");
    let mut seen = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while seen < 4 {
        let n = journal.recv(&mut buf).expect("a datagram within 5 s");
        let text = String::from_utf8_lossy(&buf[..n]);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                .map(str::to_string)
        };
        // tracing-journald probes the socket with an empty datagram first.
        if let (Some(message), Some(priority)) = (field("MESSAGE"), field("PRIORITY")) {
            println!("JOURNALD {message} {priority}");
            seen += 1;
        }
    }
}
