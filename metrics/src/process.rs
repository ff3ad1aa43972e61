//! A daemon process's own figures, read from `/proc/self` at scrape time:
//! CPU time, resident memory, open descriptors and their limit. A file that
//! cannot be read leaves its figure out of the scrape, never fails it.
//! [`encode`] writes them as `PREFIX_cpu_seconds_total`,
//! `PREFIX_resident_memory_bytes`, `PREFIX_open_fds` and `PREFIX_max_fds`.
//!
//! CPU times in `/proc/self/stat` are in clock ticks of `USER_HZ`, which the
//! kernel fixes at 100 for user space on every architecture Linux runs
//! drover on (it is what `sysconf(_SC_CLK_TCK)` answers).

use crate::text::gauge;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use std::path::Path;

/// `USER_HZ`: clock ticks per second in `/proc/*/stat`.
const TICKS_PER_SECOND: f64 = 100.0;

/// One reading; `None` where `/proc` did not say.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reading {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

pub fn read() -> Reading {
    let proc = Path::new("/proc/self");
    Reading {
        cpu_seconds: std::fs::read_to_string(proc.join("stat"))
            .ok()
            .and_then(|s| cpu_seconds(&s)),
        resident_bytes: std::fs::read_to_string(proc.join("status"))
            .ok()
            .and_then(|s| resident_bytes(&s)),
        open_fds: open_fds(&proc.join("fd")),
        max_fds: std::fs::read_to_string(proc.join("limits"))
            .ok()
            .and_then(|s| max_fds(&s)),
    }
}

/// Writes `r` as the series of the module docs: `prefix` is the series'
/// name up to `_cpu_seconds` & co (`drover_process`), `who` what the help
/// texts call the process (`manager`).
pub fn encode(
    encoder: &mut DescriptorEncoder<'_>,
    prefix: &str,
    who: &str,
    r: &Reading,
) -> Result<(), std::fmt::Error> {
    if let Some(cpu) = r.cpu_seconds {
        let c = ConstCounter::new(cpu);
        c.encode(encoder.encode_descriptor(
            &format!("{prefix}_cpu_seconds"),
            &format!("User and system CPU time the {who} process spent"),
            None,
            c.metric_type(),
        )?)?;
    }
    let gauges = [
        (
            "resident_memory_bytes",
            format!("Resident memory of the {who} process"),
            r.resident_bytes,
        ),
        (
            "open_fds",
            format!("Open file descriptors of the {who} process"),
            r.open_fds,
        ),
        (
            "max_fds",
            format!("The {who} process's limit of open file descriptors (soft)"),
            r.max_fds,
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(v) = value {
            gauge(
                encoder,
                &format!("{prefix}_{name}"),
                &help,
                i64::try_from(v).unwrap_or(i64::MAX),
            )?;
        }
    }
    Ok(())
}

/// utime + stime of a `stat` line, in seconds. The command name in
/// parentheses may hold spaces and parentheses: fields count from the last
/// `)`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After ")": state is field 3; utime 14 and stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

/// The number of open descriptors. Linux 6.2 and later give it as the size
/// of the `fd` directory (one count of the descriptor table's bits); on
/// earlier kernels that size is 0 and the directory is read, which costs the
/// kernel a lookup per descriptor (a fifth of a scrape's CPU at 10,000
/// nodes, one descriptor each). A process always has a descriptor open while
/// it reads, so a size of 0 never means "none".
fn open_fds(dir: &Path) -> Option<u64> {
    match std::fs::metadata(dir).ok()?.len() {
        0 => std::fs::read_dir(dir).ok().map(|d| d.count() as u64),
        n => Some(n),
    }
}

/// `VmRSS:` of `/proc/self/status`, in bytes.
fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_ascii_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(kib * 1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat =
            "4242 (drover (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 50 0 0 20 0 1 0 9 1 2";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("4242 (x"), None);
        assert_eq!(cpu_seconds("4242 (x) S 1"), None);
        assert_eq!(
            resident_bytes("Name:\tx\nVmRSS:\t   2048 kB\nThreads: 3\n"),
            Some(2 * 1024 * 1024)
        );
        assert_eq!(resident_bytes("VmRSS: lots"), None);
        assert_eq!(
            max_fds(
                "Limit  Soft Limit Hard Limit Units\nMax open files            1024                 524288               files\n"
            ),
            Some(1024)
        );
        assert_eq!(max_fds("Max open files unlimited unlimited files"), None);
    }

    #[test]
    fn reads_this_process() {
        let r = read();
        assert!(r.cpu_seconds.is_some() && r.resident_bytes.unwrap_or(0) > 0);
        assert!(r.open_fds.unwrap_or(0) >= 3, "{r:?}");
        assert!(r.max_fds.unwrap_or(0) >= r.open_fds.unwrap_or(0));
    }

    #[test]
    fn counts_descriptors_as_the_directory_lists_them() {
        // A child that sleeps: nothing opens or closes a descriptor of it
        // meanwhile (it holds stdin, stdout, stderr and whatever the test
        // harness lets it inherit, such as cargo's jobserver pipe).
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let dir = std::path::PathBuf::from(format!("/proc/{}/fd", child.id()));
        let walked = std::fs::read_dir(&dir).map(|d| d.count() as u64).ok();
        let counted = open_fds(&dir);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(counted, walked);
        assert!(counted.unwrap_or(0) >= 3, "{counted:?}");
    }
}
