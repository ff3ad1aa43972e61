//! What the benchmarks read of a process from `/proc`: CPU time, memory
//! figures of `status`, and the reset of its peak memory.

use anyhow::{Context, Result};
use std::process::Command;
use std::time::Duration;

/// CPU time (user + system) of every live thread of `pid` so far, from
/// `/proc/PID/task/*/schedstat` (nanoseconds, unlike the ticks of `stat`): a
/// cost that does not depend on how busy the machine is.
pub fn try_cpu_time(pid: u32) -> Result<Duration> {
    let mut ns = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .context("schedstat")?;
    }
    Ok(Duration::from_nanos(ns))
}

/// [`try_cpu_time`], zero when it cannot be read (a process that is gone).
pub fn cpu_time(pid: u32) -> Duration {
    try_cpu_time(pid).unwrap_or_default()
}

/// utime + stime of `pid` in clock ticks ([`clk_tck`] a second).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).context("utime")?.parse()?;
    let stime: u64 = f.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

/// A `kB` figure of `/proc/PID/status` (`key` with its colon: `VmRSS:`).
pub fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{key} in /proc/{pid}/status"))
}

/// Resets `VmHWM` of `pid` to its current RSS (`clear_refs` 5), so a later
/// `VmHWM` is the peak of what ran in between.
pub fn reset_peak(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid}"))
}

/// Clock ticks a second (`getconf CLK_TCK`, 100 when that fails).
pub fn clk_tck() -> f64 {
    // `getconf CLK_TCK` avoids unsafe FFI for one constant.
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reading grows with the work the process does. (A process younger
    /// than a clock tick of CPU reads zero: the kernel counts in ticks, so
    /// the test works until its own reading moves, for at most 5 s.)
    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let before = cpu_time(me);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut work = 0u64;
        while cpu_time(me) == before && std::time::Instant::now() < deadline {
            work = (0..10_000u64).fold(work, |a, x| a.wrapping_mul(31).wrapping_add(x));
            std::hint::black_box(work);
        }
        assert!(cpu_time(me) > before, "5 s of work read as no CPU time");
        cpu_ticks(me).unwrap();
        assert!(status_kib(me, "VmRSS:").unwrap() > 0);
        assert!(status_kib(me, "NoSuchKey:").is_err());
        assert!(clk_tck() > 0.0);
    }
}
