//! What an unauthenticated connection may cost, and how loudly its refusal
//! is logged.
//!
//! Before a peer has proven anything (TLS handshake, then the hello), it holds
//! a [`Ticket`] from the [`Gate`]: at most [`Limits::handshakes`] connections
//! are in that state at once, and at most [`Limits::per_ip`] from one IP
//! address. A connection over either cap is closed at once, before any byte
//! is read. The ticket is dropped when the connection is admitted or refused,
//! so a registered agent never counts against the cap. Together with the
//! handshake deadline (TLS + hello, `Timeouts::handshake`) and the 512-byte
//! hello cap this bounds pre-authentication memory at roughly `handshakes` ×
//! (one TLS handshake message, under 64 KiB, plus the socket buffers).
//!
//! Refusals of peers are logged through a [`LogLimiter`]: a token bucket per
//! reason (a burst of [`LOG_BURST`], then [`LOG_PER_SEC`] a second), so a
//! flood of junk costs log lines at a fixed rate, and the number suppressed
//! is said in the next line that gets through.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Refusal log lines allowed in a burst, per reason.
pub const LOG_BURST: f64 = 10.0;
/// Refusal log lines allowed per second in the long run, per reason.
pub const LOG_PER_SEC: f64 = 1.0;

/// The pre-authentication caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in the TLS handshake or before their hello's verdict.
    pub handshakes: usize,
    /// Of those, from one IP address.
    pub per_ip: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshakes: 256,
            per_ip: 16,
        }
    }
}

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Total,
    PerIp,
}

/// Hands out [`Ticket`]s within the [`Limits`].
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    total: Arc<Semaphore>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One unauthenticated connection's place; freed on drop.
#[derive(Debug)]
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
    ip: IpAddr,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            total: Arc::new(Semaphore::new(limits.handshakes.max(1))),
            per_ip: Arc::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A ticket for a connection from `ip`, or which cap it is over. Never waits.
    pub fn enter(&self, ip: IpAddr) -> Result<Ticket, Over> {
        let ip = ip.to_canonical();
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Over::Total)?;
        let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= self.limits.per_ip.max(1) {
            return Err(Over::PerIp);
        }
        *n += 1;
        drop(map);
        Ok(Ticket {
            _permit: permit,
            ip,
            per_ip: self.per_ip.clone(),
        })
    }

    /// Connections holding a ticket now.
    pub fn in_flight(&self) -> usize {
        self.limits.handshakes.max(1) - self.total.available_permits()
    }
}

/// Token buckets keyed by a reason.
#[derive(Debug, Default)]
pub struct LogLimiter {
    buckets: Mutex<HashMap<&'static str, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(n)` when a line for `reason` may be logged now, `n` being how
    /// many were suppressed since the last one; `None` to stay quiet.
    pub fn allow(&self, reason: &'static str) -> Option<u64> {
        self.allow_at(reason, Instant::now())
    }

    fn allow_at(&self, reason: &'static str, now: Instant) -> Option<u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(reason).or_insert(Bucket {
            tokens: LOG_BURST,
            at: now,
            suppressed: 0,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * LOG_PER_SEC).min(LOG_BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Some(std::mem::take(&mut b.suppressed))
        } else {
            b.suppressed += 1;
            None
        }
    }

    /// Logs `line()` at warn level if the bucket of `reason` allows it (the
    /// line is only built then).
    pub fn warn(&self, reason: &'static str, line: impl FnOnce() -> String) {
        match self.allow(reason) {
            None => {}
            Some(0) => tracing::warn!("{}", line()),
            Some(n) => tracing::warn!("{} ({n} similar lines suppressed)", line()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn caps_total_and_per_ip_and_frees_on_drop() {
        let gate = Gate::new(Limits {
            handshakes: 3,
            per_ip: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = gate.enter(a).unwrap();
        let _t2 = gate.enter(a).unwrap();
        assert_eq!(gate.enter(a).unwrap_err(), Over::PerIp);
        let _t3 = gate.enter(b).unwrap();
        assert_eq!(gate.enter(b).unwrap_err(), Over::Total);
        assert_eq!(gate.in_flight(), 3);
        drop(t1);
        assert_eq!(gate.in_flight(), 2);
        let _t4 = gate.enter(a).unwrap();
        // An IPv4-mapped IPv6 address is the same peer.
        assert_eq!(
            gate.enter("::ffff:10.0.0.1".parse().unwrap()).unwrap_err(),
            Over::Total
        );
    }

    #[test]
    fn log_limiter_bursts_then_trickles_and_counts() {
        let l = LogLimiter::default();
        let t0 = Instant::now();
        for _ in 0..LOG_BURST as usize {
            assert_eq!(l.allow_at("x", t0), Some(0));
        }
        assert_eq!(l.allow_at("x", t0), None);
        assert_eq!(l.allow_at("x", t0), None);
        assert_eq!(l.allow_at("other", t0), Some(0), "buckets are per reason");
        assert_eq!(l.allow_at("x", t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(l.allow_at("x", t0 + Duration::from_secs(1)), None);
    }
}
