//! What an unauthenticated connection may cost, and how loudly its refusal
//! is logged.
//!
//! Before a peer has proven anything (TLS handshake, then the hello), it holds
//! a [`Ticket`] from the [`Gate`]: at most [`Limits::handshakes`] connections
//! are in that state at once, and at most [`Limits::per_ip`] from one IP
//! address. The ticket is dropped when the connection is admitted or refused,
//! so a registered agent never counts against the cap. Together with the
//! handshake deadline (TLS + hello, `Timeouts::handshake`) and the 512-byte
//! hello cap this bounds pre-authentication memory at roughly `handshakes` ×
//! (one TLS handshake message, under 64 KiB, plus the socket buffers).
//!
//! The two caps act differently:
//!
//! * The total cap is back-pressure, not refusal: the accept loop takes a
//!   [`Slot`] *before* it accepts, so while `handshakes` connections are
//!   authenticating no more are accepted; new ones wait in the kernel's
//!   accept queue (the listen backlog, 4096 for a bound listener and in the
//!   shipped `drover-manager.socket`) and are taken as places free up. The
//!   kernel holds them, so the manager's memory stays bounded; past the
//!   backlog the kernel drops SYNs and the client's TCP retransmits them.
//!   Closing them instead turned a cold start of 10,000 TLS agents into a
//!   storm of 80,000+ refused attempts and backed-off retries.
//! * The per-address cap needs the peer's address, so it applies after
//!   accept, with a slot in hand: over it, the connection is closed at once,
//!   before any byte is read, and the slot is free again. A single flooding
//!   source thus never holds more than `per_ip` places, and its surplus
//!   leaves the queue as fast as slots cycle.
//!
//! The trade-off: junk from `handshakes / per_ip` addresses or more can
//! fill every place, and then real agents wait in the backlog until junk
//! handshakes end — at most `Timeouts::handshake` (10 s) per round — instead
//! of being closed and retrying with back-off. They get in as soon as a
//! place frees, with no retry delay added.
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

/// A connection from an address that already has [`Limits::per_ip`] in
/// flight: closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverPerIp;

/// Hands out [`Slot`]s within the total cap and [`Ticket`]s within both.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    total: Arc<Semaphore>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A place under the total cap, taken before accept; not yet tied to a peer.
/// Freed on drop.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// One unauthenticated connection's place; freed on drop.
#[derive(Debug)]
pub struct Ticket {
    _slot: Slot,
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

    /// A place under the total cap if one is free now.
    pub fn try_slot(&self) -> Option<Slot> {
        self.total
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|p| Slot { _permit: p })
    }

    /// Waits for a place under the total cap. `None` only if the gate's
    /// semaphore were closed, which nothing does.
    pub async fn slot(&self) -> Option<Slot> {
        self.total
            .clone()
            .acquire_owned()
            .await
            .ok()
            .map(|p| Slot { _permit: p })
    }

    /// Ties `slot` to a connection from `ip`, or refuses it over the
    /// per-address cap (the slot is then freed). Never waits.
    pub fn enter(&self, slot: Slot, ip: IpAddr) -> Result<Ticket, OverPerIp> {
        let ip = ip.to_canonical();
        let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= self.limits.per_ip.max(1) {
            return Err(OverPerIp);
        }
        *n += 1;
        drop(map);
        Ok(Ticket {
            _slot: slot,
            ip,
            per_ip: self.per_ip.clone(),
        })
    }

    /// Places taken now (slots waiting for accept and tickets).
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
        let t1 = gate.enter(gate.try_slot().unwrap(), a).unwrap();
        let _t2 = gate.enter(gate.try_slot().unwrap(), a).unwrap();
        assert_eq!(
            gate.enter(gate.try_slot().unwrap(), a).unwrap_err(),
            OverPerIp
        );
        assert_eq!(gate.in_flight(), 2, "a refused slot is freed");
        let _t3 = gate.enter(gate.try_slot().unwrap(), b).unwrap();
        assert!(gate.try_slot().is_none(), "the total cap is full");
        assert_eq!(gate.in_flight(), 3);
        drop(t1);
        assert_eq!(gate.in_flight(), 2);
        let _t4 = gate.enter(gate.try_slot().unwrap(), a).unwrap();
        assert!(gate.try_slot().is_none());
    }

    #[test]
    fn per_ip_counts_mapped_addresses_as_one_peer() {
        // An IPv4-mapped IPv6 address is the same peer.
        let gate = Gate::new(Limits {
            handshakes: 10,
            per_ip: 1,
        });
        let _t = gate
            .enter(gate.try_slot().unwrap(), "10.0.0.1".parse().unwrap())
            .unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            gate.enter(gate.try_slot().unwrap(), mapped).unwrap_err(),
            OverPerIp
        );
    }

    #[tokio::test]
    async fn a_full_gate_makes_the_next_wait_until_a_place_frees() {
        let gate = Arc::new(Gate::new(Limits {
            handshakes: 1,
            per_ip: 1,
        }));
        let held = gate.slot().await.unwrap();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.slot().await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no place is free yet");
        drop(held);
        assert_eq!(waiter.await.unwrap(), Some(()));
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
