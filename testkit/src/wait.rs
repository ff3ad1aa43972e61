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

/// Why [`Seen::expect`] found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSeen {
    /// The source ended before a match came.
    Ended,
    /// Nothing matched within the time given.
    Timeout,
}

/// Everything a source (a process's output, a signal stream) delivered so far, and how
/// far the test has looked. A test waits for an item that may already have arrived, then
/// checks that some other item never came. Dereferences to the items, in arrival order.
#[derive(Debug)]
pub struct Seen<T> {
    items: Vec<T>,
    /// How many of `items` have been looked at.
    cursor: usize,
}

impl<T> Default for Seen<T> {
    fn default() -> Self {
        Seen {
            items: Vec::new(),
            cursor: 0,
        }
    }
}

impl<T> Seen<T> {
    /// The index of the first item not looked at yet for which `pred` holds, taking more
    /// from `more` until `timeout` (`None` from it: the source ended). Items before the
    /// match count as looked at.
    pub async fn expect(
        &mut self,
        timeout: Duration,
        mut more: impl AsyncFnMut() -> Option<Vec<T>>,
        pred: impl Fn(&T) -> bool,
    ) -> Result<usize, NotSeen> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while self.cursor < self.items.len() {
                self.cursor += 1;
                if pred(&self.items[self.cursor - 1]) {
                    return Ok(self.cursor - 1);
                }
            }
            match tokio::time::timeout_at(deadline, more()).await {
                Ok(Some(items)) => self.items.extend(items),
                Ok(None) => return Err(NotSeen::Ended),
                Err(_) => return Err(NotSeen::Timeout),
            }
        }
    }

    /// Takes whatever `more` delivers during `d`.
    pub async fn settle(&mut self, d: Duration, mut more: impl AsyncFnMut() -> Option<Vec<T>>) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(items)) = tokio::time::timeout_at(deadline, more()).await {
            self.items.extend(items);
        }
    }

    /// How many items have been looked at.
    pub fn looked_at(&self) -> usize {
        self.cursor
    }

    /// Marks everything seen so far as looked at; returns the mark.
    pub fn mark(&mut self) -> usize {
        self.cursor = self.items.len();
        self.cursor
    }

    /// Items received since `mark`.
    pub fn since(&self, mark: usize) -> &[T] {
        &self.items[mark.min(self.items.len())..]
    }
}

impl<T> std::ops::Deref for Seen<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<'a, T> IntoIterator for &'a Seen<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
