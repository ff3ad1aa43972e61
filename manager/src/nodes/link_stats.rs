//! What the agents' links count for the metrics endpoint: TLS handshakes by
//! result, and how late agents' heartbeats come.
//!
//! Invariants: atomics only (prometheus-client's histogram is one too):
//! counting takes no lock and a scrape reads them as they are. The result
//! label is `ok`, `timeout` or one of [`drover_tls::REFUSAL_CLASSES`]:
//! a fixed set, whatever a peer sends.

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

/// See the module docs.
#[derive(Debug)]
pub struct LinkStats {
    handshakes: [AtomicU64; HANDSHAKE_RESULTS.len()],
    lateness: Histogram,
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            handshakes: Default::default(),
            // Fractions of NodeHeartbeatThreshold: 1 is the node dropped.
            lateness: Histogram::new([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.5]),
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

    /// A heartbeat was read after `silent_us` of silence from its agent,
    /// whose silence is not watched beyond `threshold_ms` (0: not watched,
    /// nothing counted).
    pub fn heartbeat(&self, silent_us: u64, threshold_ms: u64) {
        if threshold_ms > 0 {
            self.lateness
                .observe(silent_us as f64 / (threshold_ms as f64 * 1000.0));
        }
    }

    /// Heartbeats' lateness, as fractions of the threshold.
    pub fn lateness(&self) -> &Histogram {
        &self.lateness
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
}
