//! Resync's state in the manager (`drover_protocol::resync`), plain data:
//! what resync has done ([`ResyncStats`], for the metrics) and one node's
//! digests and snapshot in progress ([`NodeResync`]). The rules that use
//! them are the hub's (`crate::units::hub`, file `hub/resync.rs`).

use drover_protocol::ModTag;
use drover_protocol::resync::UnitRow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What resync has done, for the metrics (`drover_resync_*_total`).
#[derive(Debug, Default)]
pub struct ResyncStats {
    pub(crate) digests: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) snapshots: AtomicU64,
    pub(crate) repairs: AtomicU64,
}

impl ResyncStats {
    /// Digests compared with the records.
    pub fn digests(&self) -> u64 {
        self.digests.load(Ordering::Relaxed)
    }

    /// Digests that did not match.
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// Snapshots asked of agents.
    pub fn snapshots(&self) -> u64 {
        self.snapshots.load(Ordering::Relaxed)
    }

    /// Unit records a snapshot corrected (each unit once per snapshot).
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }
}

/// One node's resync state in the hub.
#[derive(Debug, Default)]
pub struct NodeResync {
    /// The interval the current session's agent was told (zero: none).
    pub(crate) interval: Duration,
    /// When a digest of the current session was last compared.
    pub(crate) last_digest: Option<Instant>,
    /// When a snapshot was last asked of the node (any session).
    pub(crate) last_asked: Option<Instant>,
    /// A snapshot is asked of the current session and not answered yet.
    pub(crate) asked: bool,
    /// Parts gathered so far: (tag, rows).
    pub(crate) pending: Option<(ModTag, Vec<UnitRow>)>,
}

impl NodeResync {
    /// A new session, told `interval`.
    pub fn online(&mut self, interval: Duration) {
        self.interval = interval;
        self.last_digest = None;
        self.asked = false;
        self.pending = None;
    }

    /// The session ended.
    pub fn offline(&mut self) {
        self.asked = false;
        self.pending = None;
    }
}
