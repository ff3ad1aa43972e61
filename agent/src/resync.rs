//! Resync, the agent's side (`drover_protocol::resync`): every interval the
//! manager named at registration (jittered), a digest of what the manager
//! should hold for this node; on the manager's `Request::Resync`, the
//! snapshot that lets it repair its records.
//!
//! Invariant (the protocol's tag invariant): a digest or a snapshot is
//! taken and queued while holding the unit hub's send order
//! (`crate::units::hub::UnitHub::send_order`), so every event tagged before
//! it is already on the link ahead of it and none tagged after it is. When
//! the units cannot be compared (a daemon-reload settling, a subscription
//! whose unit the stream does not follow yet), no digest is sent and a
//! snapshot is refused: the next interval tries again.

use crate::link::outbox::Sent;
use crate::state::Shared;
use crate::units::hub::SEND_PATIENCE;
use drover_protocol::resync::{Digest, SnapshotPart, Sum, health_entry, unit_entry};
use drover_protocol::{Event, RemoteError, Response, ToManager};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The wait before the next digest: uniform in [3/4, 1] of `interval`, so
/// the digests of a fleet spread out and a repair never waits longer than
/// one interval.
pub fn jittered(interval: Duration, random: u64) -> Duration {
    let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let quarter = ms / 4;
    Duration::from_millis(ms - quarter + random % quarter.saturating_add(1))
}

/// Sends a digest every (jittered) `interval` on session `epoch` until
/// `stop`.
pub async fn run(
    shared: Arc<Shared>,
    epoch: u64,
    interval: Duration,
    random: impl Fn() -> u64 + Send,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jittered(interval, random())) => {}
        }
        if !send_digest(&shared, epoch).await {
            tracing::debug!("no resync digest this time (units not comparable now)");
        }
    }
}

/// Sends one digest on session `epoch`; false when none went out.
pub async fn send_digest(shared: &Arc<Shared>, epoch: u64) -> bool {
    let _order = shared.units.send_order().await;
    let Some(rows) = shared.units.resync_rows().filter(|r| r.epoch == epoch) else {
        return false;
    };
    let mut units = Sum::default();
    for r in &rows.rows {
        units.add(unit_entry(&r.unit, &r.active_state, &r.sub_state));
    }
    let mut health = Sum::default();
    for (unit, state) in shared.health.states() {
        health.add(health_entry(&unit, state));
    }
    let digest = Digest {
        tag: rows.tag,
        watch: rows.watch,
        units,
        health,
    };
    let msg = ToManager::Event(Event::ResyncDigest(digest));
    shared.outbox.send_paced(epoch, msg, SEND_PATIENCE).await == Sent::Queued
}

/// `Request::Resync` of session `epoch`: the units as snapshot parts (one
/// tag, reserving two), then the health snapshot; `Empty` once both are
/// queued.
pub async fn snapshot(shared: &Arc<Shared>, epoch: u64) -> Result<Response, RemoteError> {
    {
        let _order = shared.units.send_order().await;
        let Some(rows) = shared.units.resync_rows().filter(|r| r.epoch == epoch) else {
            return Err(RemoteError::failed(
                "the units cannot be compared now (a daemon-reload or a subscription is \
                 under way); the next digest tries again",
            ));
        };
        let Some(tag) = shared.units.snapshot_tag(epoch) else {
            return Err(RemoteError::failed("the session of this request has ended"));
        };
        let count = rows.rows.len();
        for part in SnapshotPart::parts(rows.watch, rows.rows) {
            let msg = ToManager::Event(Event::ResyncSnapshot { tag, part });
            if shared.outbox.send_paced(epoch, msg, SEND_PATIENCE).await != Sent::Queued {
                return Err(RemoteError::failed("the session of this request has ended"));
            }
        }
        tracing::info!(units = count, "the manager asked for a resync snapshot");
    }
    crate::health::driver::session_started(shared, epoch).await;
    Ok(Response::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_stays_within_the_last_quarter_of_the_interval() {
        let i = Duration::from_secs(60);
        for r in [0, 1, 7, 14_999, 15_000, 15_001, u64::MAX] {
            let w = jittered(i, r);
            assert!(w >= Duration::from_secs(45) && w <= i, "{r}: {w:?}");
        }
        assert_eq!(jittered(Duration::ZERO, 5), Duration::ZERO);
        assert_eq!(
            jittered(Duration::from_millis(3), 5),
            Duration::from_millis(3)
        );
    }
}
