//! When the agent tells its service manager what (the messages themselves:
//! `drover_config::notify`). Only the binary turns this on
//! ([`crate::connection::LinkConfig::notify`]); an agent run as a
//! library (tests, benches) says nothing.
//!
//! `STATUS=` follows the link, one line per change a user should see in
//! `systemctl status drover-agent`:
//!
//! * `connecting to HOST:PORT as NODE` — at start ([`ready`], with
//!   `READY=1`: the node's own units never wait for the manager);
//! * `connected to HOST:PORT as NODE` — registered ([`connected`]);
//! * `manager HOST:PORT unreachable (WHY), retrying in 0.8s` — a failed
//!   attempt ([`retrying`]), or `refused by the manager at HOST:PORT (…)`
//!   and `TLS with the manager at HOST:PORT failed (…)` for those failures;
//! * `lost the manager at HOST:PORT (WHY), reconnecting in 0.2s` — a session
//!   that ended ([`retrying`] with [`Failure::Lost`]);
//! * `shutting down` with `STOPPING=1` ([`stopping`]).
//!
//! A reload (`SIGHUP`) is bracketed by [`reloading`] and [`reloaded`]
//! (`RELOADING=1` … `READY=1`). `WATCHDOG=1` is sent by [`watchdog`], a task
//! on the agent's single-threaded runtime: it runs only while that one
//! event loop does.

use drover_config::notify;
use std::sync::Mutex;
use std::time::Duration;

/// The last `STATUS=` line, sent again when a reload ends (the service
/// manager shows "reloading" until then). One per process, as the service
/// manager's socket is.
static LAST: Mutex<String> = Mutex::new(String::new());

fn status(line: String) {
    notify::status(&line);
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = line;
}

/// The link is up.
pub fn connected(endpoint: &str, node: &str) {
    status(format!("connected to {endpoint} as {node}"));
}

/// What the last attempt or session ended with.
pub enum Failure<'a> {
    /// Could not connect (resolve, TCP, timeout).
    Unreachable(&'a str),
    /// The manager answered and refused the node.
    Refused(&'a str),
    /// The TLS handshake failed (certificate, name, CA).
    Tls(&'a str),
    /// A session ended.
    Lost(&'a str),
}

/// The status line for a failure and the delay before the next attempt.
pub fn retry_line(endpoint: &str, failure: &Failure<'_>, delay: Duration) -> String {
    let secs = delay.as_secs_f64();
    match failure {
        Failure::Unreachable(why) => {
            format!("manager {endpoint} unreachable ({why}), retrying in {secs:.1}s")
        }
        Failure::Refused(why) => {
            format!("refused by the manager at {endpoint} ({why}), retrying in {secs:.1}s")
        }
        Failure::Tls(why) => {
            format!("TLS with the manager at {endpoint} failed ({why}), retrying in {secs:.1}s")
        }
        Failure::Lost(why) => {
            format!("lost the manager at {endpoint} ({why}), reconnecting in {secs:.1}s")
        }
    }
}

/// The link is down and will be tried again after `delay`.
pub fn retrying(endpoint: &str, failure: &Failure<'_>, delay: Duration) {
    status(retry_line(endpoint, failure, delay));
}

/// `READY=1`: systemd answers; the link starts connecting.
pub fn ready(endpoint: &str, node: &str) {
    let line = format!("connecting to {endpoint} as {node}");
    notify::ready(&line);
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = line;
}

/// A reload begins (`SIGHUP`): `RELOADING=1`. Call [`reloaded`] when it is
/// applied or refused.
pub fn reloading() {
    notify::reloading("reloading");
}

/// The reload is done: `READY=1` and the link's status line again.
pub fn reloaded() {
    let line = LAST.lock().unwrap_or_else(|p| p.into_inner()).clone();
    notify::ready(&line);
}

/// The agent begins to shut down.
pub fn stopping() {
    notify::stopping("shutting down");
}

/// Pings the watchdog at half of `WATCHDOG_USEC` for as long as the
/// runtime runs; returns at once when the unit sets no `WatchdogSec=`.
pub async fn watchdog() {
    let Some(every) = notify::watchdog_every() else {
        return;
    };
    tracing::info!("watchdog: pinging the service manager every {every:?}");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        notify::watchdog();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_lines_say_what_failed_and_when_the_next_try_is() {
        let ms = Duration::from_millis;
        assert_eq!(
            retry_line(
                "m:842",
                &Failure::Unreachable("connection refused"),
                ms(800)
            ),
            "manager m:842 unreachable (connection refused), retrying in 0.8s"
        );
        assert_eq!(
            retry_line(
                "m:842",
                &Failure::Refused("UnknownNode: not allowed"),
                ms(2000)
            ),
            "refused by the manager at m:842 (UnknownNode: not allowed), retrying in 2.0s"
        );
        assert!(retry_line("m:842", &Failure::Tls("bad CA"), ms(100)).starts_with("TLS with"));
        assert_eq!(
            retry_line(
                "m:842",
                &Failure::Lost("the manager closed the connection"),
                ms(300)
            ),
            "lost the manager at m:842 (the manager closed the connection), reconnecting in 0.3s"
        );
    }
}
