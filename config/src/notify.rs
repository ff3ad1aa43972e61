//! What both daemons tell their service manager (`sd_notify(3)`): the
//! messages and the rules for them, in one place; each daemon's own
//! `notify` module decides when.
//!
//! * [`ready`] — `READY=1` with a `STATUS=` line.
//! * [`status`] — `STATUS=` alone, for every change of state a user should
//!   see in `systemctl status`.
//! * [`reloading`] — `RELOADING=1` with `MONOTONIC_USEC=` (systemd ≥ 253
//!   needs the timestamp to match the reload to its request; older ones
//!   ignore it); [`ready`] ends the reload.
//! * [`watchdog_every`] — half of `WATCHDOG_USEC` (sd_watchdog_enabled(3)
//!   advises pinging at half the timeout), `None` when the unit sets no
//!   `WatchdogSec=` or the variable is for another process; [`watchdog`]
//!   sends `WATCHDOG=1`.
//! * [`stopping`] — `STOPPING=1`.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset: tests, the sandbox, a shell)
//! every call is a no-op. A failed send is logged at debug level and never
//! stops a daemon: the service manager only misses one line.

use sd_notify::NotifyState;
use std::time::Duration;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sd_notify: {e}");
    }
}

/// `READY=1` and `STATUS=line`: at start, and at the end of a reload.
pub fn ready(line: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(line)]);
}

/// `STATUS=line`.
pub fn status(line: &str) {
    send(&[NotifyState::Status(line)]);
}

/// A reload begins: `RELOADING=1`, `MONOTONIC_USEC=now`, `STATUS=line`.
pub fn reloading(line: &str) {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status(line)]),
        Err(e) => {
            tracing::debug!("CLOCK_MONOTONIC: {e}");
            send(&[NotifyState::Reloading, NotifyState::Status(line)]);
        }
    }
}

/// `STOPPING=1` and `STATUS=line`.
pub fn stopping(line: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(line)]);
}

/// How often to send [`watchdog`]: half the service manager's timeout, or
/// `None` when it set none.
pub fn watchdog_every() -> Option<Duration> {
    half(sd_notify::watchdog_enabled())
}

fn half(timeout: Option<Duration>) -> Option<Duration> {
    timeout.filter(|t| !t.is_zero()).map(|t| t / 2)
}

/// `WATCHDOG=1`.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_pings_at_half_the_timeout_and_never_without_one() {
        assert_eq!(
            half(Some(Duration::from_secs(20))),
            Some(Duration::from_secs(10))
        );
        assert_eq!(half(None), None);
        assert_eq!(half(Some(Duration::ZERO)), None);
    }
}
