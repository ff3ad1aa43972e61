//! Log lines reach journald with the priorities systemd's own daemons use:
//! ERROR → 3 (err), WARN → 4 (warning), INFO → 6 (info), DEBUG → 7 (debug).
//!
//! End to end, through journald's real wire: the test runs itself again in a
//! private mount namespace with a tmpfs on /run, where the child binds
//! `/run/systemd/journal/socket` (the fixed path every journald client writes
//! to), sets up logging exactly as the daemons do (`LogTarget=journald`), logs
//! one line per level and reports the `PRIORITY=` of each datagram it got.
//! Needs root and `unshare` (util-linux), like the rest of the test suite.
//!
//! A plain program (`harness = false` in Cargo.toml): the same binary is the
//! test and, with `DROVER_JOURNALD_TEST_CHILD` set, the child in the namespace.

use drover_config::{LogLevel, LogTarget, LoggingConfig};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

const CHILD_ENV: &str = "DROVER_JOURNALD_TEST_CHILD";
const SOCKET: &str = "/run/systemd/journal/socket";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        journald_child();
        return;
    }
    native_protocol_fields_are_read_in_both_forms();
    println!("test native_protocol_fields_are_read_in_both_forms ... ok");
    levels_reach_journald_with_systemd_priorities();
    println!("test levels_reach_journald_with_systemd_priorities ... ok");
    // The summary line cargo's harness prints, so tallies of a run count these two.
    println!("\ntest result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}

fn levels_reach_journald_with_systemd_priorities() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c"])
        .arg("mount -t tmpfs tmpfs /run && exec \"$0\"")
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
        .filter_map(|l| l.split_once("JOURNALD ").map(|(_, rest)| rest))
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
fn journald_child() {
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
        let fields = native_fields(&buf[..n]);
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        // tracing-journald probes the socket with an empty datagram first.
        if let (Some(message), Some(priority)) = (field("MESSAGE"), field("PRIORITY")) {
            println!("JOURNALD {message} {priority}");
            seen += 1;
        }
    }
}

/// The fields of one datagram of journald's native protocol: each is
/// `KEY=value\n`, or `KEY\n` + the value's length (u64, little endian) + the
/// value + `\n` (the form for any value, tracing-journald's choice).
fn native_fields(mut data: &[u8]) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    while !data.is_empty() {
        let Some(end) = data.iter().position(|&b| b == b'=' || b == b'\n') else {
            panic!("truncated field: {data:?}");
        };
        let key = String::from_utf8_lossy(&data[..end]).into_owned();
        if data[end] == b'=' {
            let rest = &data[end + 1..];
            let stop = rest
                .iter()
                .position(|&b| b == b'\n')
                .expect("newline after value");
            fields.push((key, String::from_utf8_lossy(&rest[..stop]).into_owned()));
            data = &rest[stop + 1..];
        } else {
            let rest = &data[end + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            let value = &rest[8..8 + len];
            assert_eq!(rest[8 + len], b'\n', "newline after a sized value");
            fields.push((key, String::from_utf8_lossy(value).into_owned()));
            data = &rest[8 + len + 1..];
        }
    }
    fields
}

fn native_protocol_fields_are_read_in_both_forms() {
    let mut datagram = b"CODE_LINE=72\nMESSAGE\n".to_vec();
    datagram.extend_from_slice(&4u64.to_le_bytes());
    datagram.extend_from_slice(b"a=b\n\n");
    assert_eq!(
        native_fields(&datagram),
        [
            ("CODE_LINE".to_string(), "72".to_string()),
            ("MESSAGE".to_string(), "a=b\n".to_string())
        ]
    );
}
