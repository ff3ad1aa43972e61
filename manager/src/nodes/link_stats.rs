//! What the agents' links count for the metrics endpoint: TLS handshakes by
//! result, how late agents' heartbeats come ([`HeartbeatGaps`]), and why
//! sessions of online nodes ended ([`Disconnect`]).
//!
//! Invariants: atomics only (prometheus-client's histogram is one too):
//! counting takes no lock and a scrape reads them as they are. The result
//! label is `ok`, `timeout` or one of [`drover_tls::REFUSAL_CLASSES`]:
//! a fixed set, whatever a peer sends; a disconnect's reason is one of
//! [`Disconnect::LABELS`].

use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every handshake result, in the order [`LinkStats::handshakes`] gives them.
pub const HANDSHAKE_RESULTS: [&str; 10] = [
    "ok",
    "timeout",
    "no_certificate",
    "revoked",
    "expired",
    "identity",
    "certificate",
    "incompatible",
    "protocol",
    "io",
];

/// Why a session ended, as the manager tells causes apart. The first cause
/// recorded on a session is its cause ([`crate::nodes::session::Session::set_end_cause`]):
/// a heartbeat timeout that wakes the reader is a timeout, not a closed link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Disconnect {
    /// Nothing received for `NodeHeartbeatThreshold`.
    HeartbeatTimeout = 1,
    /// The agent closed the connection between frames (it stopped, or
    /// restarted).
    AgentClosed,
    /// A read or write failed (reset, a TLS error, the end of the stream in
    /// the middle of a frame), or the welcome could not be sent.
    ConnectionLost,
    /// The agent did not read what the manager wrote for the write deadline.
    WriteBlocked,
    /// The agent sent a frame that is not the protocol (undecodable, too
    /// large).
    ProtocolError,
    /// A new connection of the node replaced its silent session.
    Replaced,
    /// A configuration reload dropped the session (the node was removed, or
    /// its certificate no longer fits).
    Reload,
    /// The manager is shutting down.
    Shutdown,
    /// The manager stopped leading its HA group (it becomes a standby).
    Standby,
}

impl Disconnect {
    /// Every cause, in the order of [`Disconnect::LABELS`].
    pub const ALL: [Disconnect; 9] = [
        Disconnect::HeartbeatTimeout,
        Disconnect::AgentClosed,
        Disconnect::ConnectionLost,
        Disconnect::WriteBlocked,
        Disconnect::ProtocolError,
        Disconnect::Replaced,
        Disconnect::Reload,
        Disconnect::Shutdown,
        Disconnect::Standby,
    ];
    /// The `reason` label of each cause.
    pub const LABELS: [&'static str; 9] = [
        "heartbeat_timeout",
        "agent_closed",
        "connection_lost",
        "write_blocked",
        "protocol_error",
        "replaced",
        "reload",
        "shutdown",
        "standby",
    ];

    pub fn label(self) -> &'static str {
        Self::LABELS[self.index()]
    }

    fn index(self) -> usize {
        usize::from(self as u8 - 1)
    }

    /// The cause stored as `v` (0 or unknown: none).
    pub fn from_u8(v: u8) -> Option<Disconnect> {
        Self::ALL.into_iter().find(|d| *d as u8 == v)
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct LinkStats {
    handshakes: [AtomicU64; HANDSHAKE_RESULTS.len()],
    lateness: Histogram,
    disconnects: [AtomicU64; Disconnect::ALL.len()],
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            handshakes: Default::default(),
            // Fractions of NodeHeartbeatThreshold: 1 is the node dropped.
            lateness: Histogram::new([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.5]),
            disconnects: Default::default(),
        }
    }
}

impl LinkStats {
    /// A TLS handshake ended with `result` (an unknown one counts as `protocol`).
    pub fn handshake(&self, result: &str) {
        let i = HANDSHAKE_RESULTS
            .iter()
            .position(|r| *r == result)
            .unwrap_or(8);
        self.handshakes[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Handshakes per result, in [`HANDSHAKE_RESULTS`] order.
    pub fn handshakes(&self) -> [u64; HANDSHAKE_RESULTS.len()] {
        self.handshakes
            .each_ref()
            .map(|a| a.load(Ordering::Relaxed))
    }

    /// A heartbeat was read `gap_us` after the one before it
    /// ([`HeartbeatGaps`]) from an agent whose silence is not watched beyond
    /// `threshold_ms` (0: not watched, nothing counted).
    pub fn heartbeat(&self, gap_us: u64, threshold_ms: u64) {
        if threshold_ms > 0 {
            self.lateness
                .observe(gap_us as f64 / (threshold_ms as f64 * 1000.0));
        }
    }

    /// Heartbeats' lateness, as fractions of the threshold.
    pub fn lateness(&self) -> &Histogram {
        &self.lateness
    }

    /// A session of an online node ended for `cause`.
    pub fn disconnected(&self, cause: Disconnect) {
        self.disconnects[cause.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Disconnects per cause, in [`Disconnect::LABELS`] order.
    pub fn disconnects(&self) -> [u64; Disconnect::ALL.len()] {
        self.disconnects
            .each_ref()
            .map(|a| a.load(Ordering::Relaxed))
    }
}

/// Frames read within this of each other were read together (one wake-up
/// of the reader decodes them in microseconds; an agent's sends come
/// milliseconds apart at the least).
const TOGETHER_US: u64 = 1_000;

/// The gaps between one agent's heartbeats, as its reader sees them.
///
/// The manager reads an idle agent's heartbeats in batches
/// (`drover_protocol::liveness::HEARTBEATS_PER_READ`), and the kernel does
/// not say when each of a batch arrived; so each heartbeat of a batch counts
/// the batch's mean gap: the time from the last frame read before the batch
/// to the batch, divided by the heartbeats in it. Frames read within
/// a millisecond (`TOGETHER_US`) of each other are one batch; a batch is counted when the
/// next one begins (its size is known then). One long gap in a batch of
/// regular ones shows diluted by the batch's size.
#[derive(Debug)]
pub struct HeartbeatGaps {
    /// When the last frame was read (µs, monotonic).
    last_us: u64,
    /// When the frame before the current batch was read.
    before_us: u64,
    /// When the current batch's first frame was read.
    first_us: u64,
    /// Heartbeats in the current batch.
    heartbeats: u32,
}

impl HeartbeatGaps {
    /// For a session that began at `start_us` (its registration counts as
    /// the first frame read).
    pub fn new(start_us: u64) -> Self {
        Self {
            last_us: start_us,
            before_us: start_us,
            first_us: start_us,
            heartbeats: 0,
        }
    }

    /// A frame (a heartbeat or not) was read at `now_us`; `observe` gets the
    /// gap (µs) of each heartbeat of a batch that ended before it.
    pub fn read(&mut self, now_us: u64, heartbeat: bool, mut observe: impl FnMut(u64)) {
        if now_us.saturating_sub(self.last_us) > TOGETHER_US {
            self.count(&mut observe);
            self.before_us = self.last_us;
            self.first_us = now_us;
        }
        if heartbeat {
            self.heartbeats = self.heartbeats.saturating_add(1);
        }
        self.last_us = self.last_us.max(now_us);
    }

    fn count(&mut self, observe: &mut impl FnMut(u64)) {
        if self.heartbeats == 0 {
            return;
        }
        let gap = self.first_us.saturating_sub(self.before_us) / u64::from(self.heartbeats);
        for _ in 0..self.heartbeats {
            observe(gap);
        }
        self.heartbeats = 0;
    }
}

/// (count, sum) of `h`, read from its text (prometheus-client shows them
/// only so): for unit tests.
#[cfg(test)]
pub(crate) fn totals(h: &Histogram) -> (u64, f64) {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("h", "", h.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (value("h_count") as u64, value("h_sum"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(reads: &[(u64, bool)]) -> Vec<u64> {
        let mut g = HeartbeatGaps::new(0);
        let mut seen = Vec::new();
        for &(at_ms, heartbeat) in reads {
            g.read(at_ms * 1000, heartbeat, |gap| seen.push(gap / 1000));
        }
        seen
    }

    /// Eight heartbeats read at once, 16 s after the last read: 2 s each,
    /// counted when the next batch comes.
    #[test]
    fn a_batch_counts_its_mean_gap_for_each_heartbeat() {
        let batch = |at: u64| std::iter::repeat_n((at, true), 8);
        let reads: Vec<_> = batch(16_000).chain(batch(32_000)).collect();
        assert_eq!(gaps(&reads), vec![2000; 8], "the second batch not yet");
        let mut reads = reads;
        reads.push((33_000, false));
        assert_eq!(gaps(&reads), vec![2000; 16]);
    }

    /// Heartbeats read one by one count the silence before each, as when
    /// every heartbeat woke the reader; frames that are not heartbeats end
    /// silences but are not counted.
    #[test]
    fn heartbeats_read_alone_count_the_silence_before_each() {
        let reads = [
            (2_000, true),
            (3_000, false),
            (5_000, true),
            (5_000, false),
            (9_000, true),
            (9_500, false),
        ];
        assert_eq!(gaps(&reads), vec![2000, 2000, 4000]);
        assert_eq!(gaps(&[(1_000, false), (2_000, false)]), Vec::<u64>::new());
    }

    #[test]
    fn results_are_bounded_and_cover_the_tls_classes() {
        for class in drover_tls::REFUSAL_CLASSES {
            assert!(HANDSHAKE_RESULTS.contains(&class), "{class}");
        }
        let s = LinkStats::default();
        s.handshake("ok");
        s.handshake("revoked");
        s.handshake("no such class");
        assert_eq!(s.handshakes(), [1, 0, 0, 1, 0, 0, 0, 0, 1, 0]);
        s.heartbeat(2_000_000, 0);
        assert_eq!(totals(s.lateness()).0, 0, "not watched, not counted");
        s.heartbeat(4_000_000, 6000);
        let (count, sum) = totals(s.lateness());
        assert_eq!(count, 1);
        assert!((sum - 4.0 / 6.0).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn disconnect_causes_round_trip_and_count_under_their_label() {
        for (d, label) in Disconnect::ALL.iter().zip(Disconnect::LABELS) {
            assert_eq!(Disconnect::from_u8(*d as u8), Some(*d));
            assert_eq!(d.label(), label);
        }
        for v in [0, 10, 200, u8::MAX] {
            assert_eq!(Disconnect::from_u8(v), None, "{v}");
        }
        let s = LinkStats::default();
        s.disconnected(Disconnect::Replaced);
        s.disconnected(Disconnect::Replaced);
        s.disconnected(Disconnect::HeartbeatTimeout);
        assert_eq!(s.disconnects(), [1, 0, 0, 0, 0, 2, 0, 0, 0]);
    }
}
