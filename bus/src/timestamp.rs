//! The clocks behind BlueChi's timestamp properties: microseconds of the
//! realtime clock (`LastSeenTimestamp`, `*Timestamp`) and of
//! `CLOCK_MONOTONIC` (`*TimestampMonotonic`, comparable with systemd's own
//! `*Monotonic` values, and what every liveness comparison uses — the
//! realtime clock may jump, the monotonic one does not).
//!
//! Both read the clock without failing: a clock that cannot be read gives 0,
//! which BlueChi's API means as "never".

use nix::time::{ClockId, clock_gettime};
use std::time::{SystemTime, UNIX_EPOCH};

/// Realtime clock, µs since the Unix epoch (0 if the clock is before 1970).
pub fn realtime_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in µs, comparable with systemd's `*Monotonic` values.
pub fn monotonic_us() -> u64 {
    let Ok(ts) = clock_gettime(ClockId::CLOCK_MONOTONIC) else {
        return 0;
    };
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

#[cfg(test)]
mod tests {
    #[test]
    fn clocks_move_forward() {
        let (m1, r1) = (super::monotonic_us(), super::realtime_us());
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(super::monotonic_us() >= m1 + 1_000);
        assert!(super::realtime_us() > r1);
        assert!(
            r1 > 1_600_000_000_000_000,
            "realtime is in µs since the epoch"
        );
    }
}
