//! What the benchmarks read of a process from `/proc`: CPU time, memory
//! figures of `status`, and the reset of its peak memory.

use anyhow::{Context, Result};
use nix::time::ClockId;
use nix::unistd::Pid;
use std::process::Command;
use std::time::Duration;

/// CPU time (user + system) of the whole process `pid` so far, its threads
/// that ended included, in nanoseconds (its CPU-time clock,
/// `clock_getcpuclockid`), unlike the ticks of `stat`: a cost that does not
/// depend on how busy the machine is. (A sum over `/proc/PID/task/*` would
/// lose a thread's time when it ends, and fail when one ends between the
/// listing and the read.)
pub fn try_cpu_time(pid: u32) -> Result<Duration> {
    // The clock's id encodes the pid in its upper bits: 0 and numbers past
    // the kernel's largest pid would name this process's own clock.
    anyhow::ensure!(
        (1..=PID_MAX_LIMIT).contains(&pid),
        "no process has pid {pid}"
    );
    let pid = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
    let clock = ClockId::pid_cpu_clock_id(pid).with_context(|| format!("CPU clock of {pid}"))?;
    let now = clock.now().with_context(|| format!("CPU time of {pid}"))?;
    Ok(Duration::from(now))
}

/// The largest pid Linux gives (`PID_MAX_LIMIT` on 64-bit machines).
const PID_MAX_LIMIT: u32 = 1 << 22;

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

    /// The reading grows with the work the process does, whatever its other
    /// threads do (the test harness runs other tests beside this one).
    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let before = cpu_time(me);
        let mut work = 0u64;
        let started = std::time::Instant::now();
        loop {
            work = (0..10_000u64).fold(work, |a, x| a.wrapping_mul(31).wrapping_add(x));
            std::hint::black_box(work);
            if started.elapsed() > Duration::from_millis(20) {
                break;
            }
        }
        assert!(cpu_time(me) > before, "20 ms of work read as no CPU time");
        cpu_ticks(me).unwrap();
        assert!(status_kib(me, "VmRSS:").unwrap() > 0);
        assert!(status_kib(me, "NoSuchKey:").is_err());
        assert!(clk_tck() > 0.0);
    }

    /// A thread that ended keeps its CPU time in the reading: the sum never
    /// goes back (it did when it counted live threads only).
    #[test]
    fn a_thread_that_ended_still_counts() {
        let me = std::process::id();
        let before = cpu_time(me);
        let spent = std::thread::spawn(|| {
            let me = std::time::Instant::now();
            let mut work = 0u64;
            while me.elapsed() < Duration::from_millis(50) {
                work = (0..10_000u64).fold(work, |a, x| a.wrapping_mul(31).wrapping_add(x));
                std::hint::black_box(work);
            }
            // This thread's own CPU time, read before it ends.
            nix::time::clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from)
        })
        .join()
        .unwrap()
        .unwrap();
        let after = cpu_time(me);
        assert!(
            after >= before + spent,
            "the ended thread's {spent:?} is missing: {before:?} then {after:?}"
        );
    }

    #[test]
    fn a_process_that_is_gone_or_cannot_be_reads_as_an_error() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(try_cpu_time(pid).is_err(), "pid {pid} was reaped");
        assert_eq!(cpu_time(pid), Duration::ZERO);
        // Numbers no process can have, which the clock's id would read as
        // this process's own clock.
        for pid in [0, PID_MAX_LIMIT + 1, 1 << 29, i32::MAX as u32, u32::MAX] {
            assert!(try_cpu_time(pid).is_err(), "pid {pid}");
        }
    }
}
