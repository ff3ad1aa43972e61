//! Resync, the agent's side (`drover_protocol::resync`): every interval the
//! manager named at registration (`drover_protocol::resync::jittered`; the
//! link's session runs the timer), a digest of what the manager should
//! hold for this node; on the manager's `Request::Resync` (the
//! dispatcher), the snapshot that lets it repair its records, followed by
//! the health snapshot.
//!
//! Invariant (the protocol's tag invariant): a digest or a snapshot is
//! taken and queued while holding the unit hub's send order
//! (`crate::units::hub::UnitHub::send_order`), so every event tagged before
//! it is already on the link ahead of it and none tagged after it is. When
//! the units cannot be compared (a daemon-reload settling, a subscription
//! whose unit the stream does not follow yet), no digest is sent and a
//! snapshot is refused: the next interval tries again.

use crate::link::outbox::{Outbox, Sent};
use crate::units::hub::{SEND_PATIENCE, UnitHub};
use drover_protocol::health::HealthState;
use drover_protocol::resync::{Digest, SnapshotPart, health_sum, units_sum};
use drover_protocol::{Event, RemoteError, ToManager, UnitName};

/// Sends one digest on session `epoch`; false when none went out.
/// `health`: every unit's health state but `none`, read once the send
/// order is held.
pub async fn send_digest(
    hub: &UnitHub,
    outbox: &Outbox,
    epoch: u64,
    health: impl FnOnce() -> Vec<(UnitName, HealthState)>,
) -> bool {
    let _order = hub.send_order().await;
    let Some(rows) = hub.resync_rows().filter(|r| r.epoch == epoch) else {
        return false;
    };
    let units = units_sum(
        rows.rows
            .iter()
            .map(|r| (&r.unit, r.active_state.as_str(), r.sub_state.as_str())),
    );
    let health = health();
    let digest = Digest {
        tag: rows.tag,
        watch: rows.watch,
        units,
        health: health_sum(health.iter().map(|(u, s)| (u, *s))),
    };
    let msg = ToManager::Event(Event::ResyncDigest(digest));
    outbox.send_paced(epoch, msg, SEND_PATIENCE).await == Sent::Queued
}

/// `Request::Resync` of session `epoch`, the units' part: the snapshot
/// parts (one tag, reserving two) once queued. The caller sends the health
/// snapshot after it, then the reply.
pub async fn send_snapshot(hub: &UnitHub, outbox: &Outbox, epoch: u64) -> Result<(), RemoteError> {
    let _order = hub.send_order().await;
    let Some(rows) = hub.resync_rows().filter(|r| r.epoch == epoch) else {
        return Err(RemoteError::failed(
            "the units cannot be compared now (a daemon-reload or a subscription is \
             under way); the next digest tries again",
        ));
    };
    let Some(tag) = hub.snapshot_tag(epoch) else {
        return Err(RemoteError::failed("the session of this request has ended"));
    };
    let count = rows.rows.len();
    for part in SnapshotPart::parts(rows.watch, rows.rows) {
        let msg = ToManager::Event(Event::ResyncSnapshot { tag, part });
        if outbox.send_paced(epoch, msg, SEND_PATIENCE).await != Sent::Queued {
            return Err(RemoteError::failed("the session of this request has ended"));
        }
    }
    tracing::info!(units = count, "the manager asked for a resync snapshot");
    Ok(())
}
