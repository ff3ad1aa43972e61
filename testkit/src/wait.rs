//! Bounded waiting: every wait in a test has a deadline and says what it waited for.
//!
//! Polling is for state that has no change signal (a unit's state read with
//! `systemctl show`, a file a daemon writes); where a signal exists, wait on it instead.

use anyhow::{Result, bail};
use std::future::Future;
use std::time::Duration;

/// The default wait for one step of a test against in-process or local daemons.
pub const WAIT: Duration = Duration::from_secs(5);

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `cond` until it holds; an error names `what` once `timeout` has passed.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(timeout, POLL, what, cond).await
}

/// [`eventually`] with a chosen polling period (for conditions that change fast and are
/// cheap to check).
pub async fn poll<F, Fut>(timeout: Duration, every: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Like [`eventually`], but panics with `what` (for tests that need no context).
pub async fn until<F, Fut>(timeout: Duration, what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if let Err(e) = eventually(timeout, what, cond).await {
        panic!("{e:#}");
    }
}
