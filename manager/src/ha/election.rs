//! The election: every manager of an HA group runs [`Election::run`],
//! campaigns for `PREFIX/leader` and either leads or stands by.
//!
//! ```text
//!  ┌─► grant a lease (TTL) ─► txn: create PREFIX/leader with it if absent
//!  │        │ won: epoch = the key's create revision                │ held
//!  │        ▼                                                       ▼
//!  │   lead: keepalive every TTL/3;          stand by: watch the key until it is
//!  │   stop at the fence's deadline          deleted (or one TTL passes: look
//!  │   (send time of the last renewal        again), then campaign
//!  │   + its TTL − margin)                                          │
//!  └──────────────── lost: stand by, revoke the old lease ◄─────────┘
//! ```
//!
//! Fencing: the deadline is on the local monotonic clock and earlier than
//! etcd can expire the lease (etcd counts from when it *receives* a
//! renewal; we count from when we sent it, minus [`margin`]). The
//! [`Fence`] is asked by every use, so a paused process that resumes past
//! its deadline does not act even before this task runs again. A clean
//! stop revokes the lease: the key goes at once and a standby's watch
//! fires (the handover takes a round trip, not a TTL).
//!
//! It runs on a thread of its own ([`crate::ha::thread`]). What leading
//! means for the manager (phase, sessions, the bus) is the seat's business
//! ([`crate::ha::seat`]), told through its relay: this module imports
//! nothing of the manager beyond `ha`.

use crate::ha::etcd::Etcd;
use crate::ha::fence::Fence;
use crate::ha::seat::Relay;
use crate::ha::wire::{Campaign, Watched};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

/// How much earlier than etcd can expire the lease the leader stops: a
/// tenth of the TTL, at least 200 ms.
pub fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(200))
}

/// See the module docs.
pub struct Election {
    pub etcd: Etcd,
    pub key: Vec<u8>,
    /// What this manager writes as the leader key's value (its host and
    /// agent port): what standbys name as the leader.
    pub me: String,
    pub ttl_s: u64,
    pub fence: Arc<Fence>,
}

/// Why leading ended.
enum Ended {
    Stop,
    Lost(String),
}

impl Election {
    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_s)
    }

    /// Each call's deadline: a third of the TTL, at most 2 s.
    fn call_limit(&self) -> Duration {
        (self.ttl() / 3).min(Duration::from_secs(2))
    }

    /// The pause after a failed call: a tenth of the TTL, at most 500 ms.
    fn retry(&self) -> Duration {
        (self.ttl() / 10).min(Duration::from_millis(500))
    }

    /// Runs until `stop`; a leader then resigns (revokes its lease). Tells
    /// the manager through `seat`; waits for it only when standing down
    /// (see [`crate::ha::seat`]).
    pub async fn run(self, seat: &Relay, stop: CancellationToken) {
        let limit = self.call_limit();
        // A lease given up while etcd did not answer: revoked as soon as
        // etcd does, so its key goes without waiting for the TTL.
        let mut abandoned: Option<i64> = None;
        // The lease of the leader key's holder, once its key was seen
        // deleted: that holder may still lead until the lease ends.
        let mut deleted_holder: Option<i64> = None;
        while !stop.is_cancelled() {
            if let Some(id) = abandoned
                && self.etcd.revoke(id, limit).await.is_ok()
            {
                abandoned = None;
            }
            if let Some(lease) = deleted_holder.take() {
                self.depose(lease, &stop).await;
                continue;
            }
            let sent = Instant::now();
            let lease = match self.etcd.grant(self.ttl_s, limit).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("etcd: cannot get a lease: {e}");
                    self.pause(&stop).await;
                    continue;
                }
            };
            let lease_ttl = Duration::from_secs(lease.ttl.unsigned_abs());
            match self
                .etcd
                .campaign(&self.key, self.me.as_bytes(), lease.id, limit)
                .await
            {
                Ok(Campaign::Won { epoch }) => {
                    let until = sent + lease_ttl - margin(lease_ttl);
                    if Instant::now() >= until {
                        abandoned = Some(lease.id);
                        continue;
                    }
                    self.fence.lead(epoch.unsigned_abs(), until, &self.me);
                    tracing::info!(
                        "leading (epoch {epoch}, {} in etcd, lease {}s)",
                        String::from_utf8_lossy(&self.key),
                        lease.ttl
                    );
                    seat.lead();
                    let ended = self.keep(lease.id, epoch, &stop).await;
                    self.fence.stand_down();
                    match ended {
                        Ended::Stop => {
                            // Resign: the key goes with the lease.
                            match self.etcd.revoke(lease.id, limit).await {
                                Ok(()) => tracing::info!("resigned leadership"),
                                Err(e) => tracing::warn!(
                                    "cannot resign in etcd ({e}); a standby leads once the \
                                     lease ends"
                                ),
                            }
                            return;
                        }
                        Ended::Lost(why) => {
                            tracing::warn!("no longer leading: {why}");
                            seat.stand_by(&why).await;
                            abandoned = Some(lease.id);
                        }
                    }
                }
                Ok(Campaign::Held { holder, revision }) => {
                    // Not needed for watching; etcd drops it after its TTL anyway.
                    let _ = self.etcd.revoke(lease.id, limit).await;
                    // The key may be our own from before etcd went away (its
                    // lease restarts with etcd): take it down and campaign
                    // again rather than wait a TTL for it.
                    if let Some(id) = abandoned
                        && holder.as_ref().is_some_and(|kv| kv.lease == id)
                    {
                        if self.etcd.revoke(id, limit).await.is_ok() {
                            abandoned = None;
                        } else {
                            self.pause(&stop).await;
                        }
                        continue;
                    }
                    if let Some(kv) = holder {
                        let leader = shown_leader(&kv.value);
                        tracing::info!(
                            "standing by: {leader} leads (epoch {})",
                            kv.create_revision
                        );
                        if self
                            .fence
                            .saw_leader(Some(leader), kv.create_revision.unsigned_abs())
                        {
                            seat.saw_leader();
                        }
                        if self.watch(revision + 1, &stop).await && kv.lease != 0 {
                            deleted_holder = Some(kv.lease);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("etcd: campaign failed: {e}");
                    abandoned = Some(lease.id);
                    self.pause(&stop).await;
                }
            }
        }
    }

    /// Keeps the lease alive while leading, and watches the leader key
    /// (deleted by hand, it is no longer ours: [`Election::guard`]);
    /// returns why leading ended, at the fence's deadline at the latest.
    async fn keep(&self, id: i64, epoch: i64, stop: &CancellationToken) -> Ended {
        let every = self.ttl() / 3;
        let mut next = Instant::now() + every;
        let guard = self.guard(epoch);
        tokio::pin!(guard);
        loop {
            let Some(deadline) = self.fence.deadline() else {
                return Ended::Lost("stood down".into());
            };
            tokio::select! {
                _ = stop.cancelled() => return Ended::Stop,
                why = &mut guard => return Ended::Lost(why),
                _ = sleep_until(next.min(deadline)) => {}
            }
            if !self.fence.leading() {
                return Ended::Lost("the lease was not renewed before its deadline".into());
            }
            let sent = Instant::now();
            // Never wait past the point where the fence expires anyway.
            let limit = self
                .call_limit()
                .min(deadline.saturating_duration_since(sent));
            let answer = tokio::select! {
                _ = stop.cancelled() => return Ended::Stop,
                why = &mut guard => return Ended::Lost(why),
                a = timeout(limit, self.etcd.keepalive(id, limit)) => a,
            };
            match answer {
                Ok(Ok(ttl)) if ttl > 0 => {
                    let ttl = Duration::from_secs(ttl.unsigned_abs());
                    if !self.fence.extend(sent + ttl - margin(ttl)) {
                        return Ended::Lost("the lease was renewed too late".into());
                    }
                    next = Instant::now() + every;
                }
                Ok(Ok(_)) => return Ended::Lost("etcd no longer knows the lease".into()),
                Ok(Err(e)) => {
                    tracing::warn!("etcd: cannot renew the lease: {e}");
                    next = Instant::now() + self.retry();
                }
                Err(_) => {
                    tracing::warn!("etcd: the lease renewal took over {limit:?}");
                    next = Instant::now() + self.retry();
                }
            }
        }
    }

    /// Stands by until the leader key is deleted (returns true), etcd ends
    /// the watch, one TTL passes (then the caller looks again, in case a
    /// watch went silently deaf), or `stop`.
    async fn watch(&self, from: i64, stop: &CancellationToken) -> bool {
        let watched = tokio::select! {
            _ = stop.cancelled() => return false,
            _ = sleep(self.ttl()) => return false,
            w = self.etcd.watch(&self.key, from, self.call_limit()) => w,
        };
        match watched {
            Ok(Watched::Deleted) => return true,
            Ok(Watched::Ended(why)) => tracing::debug!("etcd ended the watch: {why}"),
            Ok(Watched::Nothing) => {}
            Err(e) => {
                tracing::warn!("etcd: watching the leader failed: {e}");
                self.pause(stop).await;
            }
        }
        false
    }

    /// While leading: returns once the leader key is no longer the one
    /// this manager created at `epoch` (deleted by hand, `etcdctl del`),
    /// which its lease alone would never tell. A watch from the next
    /// revision, and when a watch ends or fails, a look at the key itself
    /// before watching again. Pending forever while etcd cannot be asked:
    /// the lease renewal decides then.
    async fn guard(&self, epoch: i64) -> String {
        let limit = self.call_limit();
        let mut from = epoch + 1;
        loop {
            match self.etcd.watch(&self.key, from, limit).await {
                Ok(Watched::Deleted) => return "the leader key was deleted in etcd".into(),
                Ok(Watched::Ended(why)) => tracing::debug!("etcd ended the leader's watch: {why}"),
                Ok(Watched::Nothing) => {}
                Err(e) => tracing::debug!("etcd: watching the leader key failed: {e}"),
            }
            sleep(self.retry()).await;
            match self.etcd.get(&self.key, limit).await {
                Ok((None, _)) => return "the leader key is gone from etcd".into(),
                Ok((Some(kv), _)) if kv.create_revision != epoch => {
                    return format!("the leader key is another's (epoch {})", kv.create_revision);
                }
                Ok((Some(_), revision)) => from = revision + 1,
                Err(e) => tracing::debug!("etcd: reading the leader key failed: {e}"),
            }
        }
    }

    /// The leader key was deleted while its holder may still lead: its
    /// lease lives on (deleted by hand, not expired nor revoked). That
    /// holder stops at its fence's deadline, at most the lease's TTL after
    /// its last renewal, and it renews no more once the lease is revoked.
    /// So: revoke it, then wait its granted TTL before campaigning. A lease
    /// already gone (the holder died, resigned or noticed the deletion and
    /// stood down) costs one round trip. Until etcd answers, nothing is
    /// campaigned for.
    async fn depose(&self, lease: i64, stop: &CancellationToken) {
        let limit = self.call_limit();
        while !stop.is_cancelled() {
            match self.etcd.time_to_live(lease, limit).await {
                Ok(None) => {
                    tracing::info!("the leader key is gone: campaigning");
                    return;
                }
                Ok(Some(granted)) => {
                    if let Err(e) = self.etcd.revoke(lease, limit).await {
                        tracing::warn!("etcd: cannot revoke the old leader's lease: {e}");
                        self.pause(stop).await;
                        continue;
                    }
                    tracing::warn!(
                        "the leader key was deleted while its leader's lease lives: revoked \
                         the lease; campaigning in {granted} s, when that leader has stopped"
                    );
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = sleep(Duration::from_secs(granted)) => {}
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!("etcd: cannot ask about the old leader's lease: {e}");
                    self.pause(stop).await;
                }
            }
        }
    }

    async fn pause(&self, stop: &CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = sleep(self.retry()) => {}
        }
    }
}

/// The most characters of the leader key's value this manager repeats
/// (refusals, parked agents, the `Leader` property).
pub const MAX_LEADER_SHOWN: usize = 256;

/// The leader key's value as this manager shows it: whatever another
/// writer put there, as text, at most [`MAX_LEADER_SHOWN`] characters,
/// control characters escaped (it goes into logs, D-Bus errors and
/// strings, and the agents' wire).
pub fn shown_leader(value: &[u8]) -> String {
    let mut shown = String::new();
    for c in String::from_utf8_lossy(value)
        .chars()
        .take(MAX_LEADER_SHOWN)
    {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_leader_value_is_shown_bounded_and_escaped() {
        assert_eq!(shown_leader(b"mgr-a:842"), "mgr-a:842");
        assert_eq!(shown_leader(b"a\0b\nc\xff"), "a\\u{0}b\\nc\u{fffd}");
        let long = shown_leader(&[b'x'; 100_000]);
        assert_eq!(long.len(), MAX_LEADER_SHOWN);
    }

    #[test]
    fn margins() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(30)), Duration::from_secs(3));
    }
}
