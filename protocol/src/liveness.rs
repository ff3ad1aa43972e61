//! Who proves to whom that a link is alive (protocols 5, 6 and 10), and the
//! kernel timeout that lets one direction of heartbeats suffice.
//!
//! Each end must notice a dead peer within its own threshold, and every
//! heartbeat costs both ends a wake-up and a system call (at 10,000 nodes
//! with 2 s heartbeats the manager's half of them was most of its idle CPU:
//! `docs/dev/notes/fleet-scale.md`). So the rules are:
//!
//! * **The agent proves it is alive** with application heartbeats, at least
//!   [`SENDS_PER_THRESHOLD`] times per `NodeHeartbeatThreshold` the manager
//!   announces (`Accepted::heartbeat_threshold_ms`; the negotiation is in
//!   `agent/src/link/heartbeat.rs`). Only a message from the agent process
//!   itself shows that it is not frozen, so this direction stays.
//! * **The manager reads the agent's heartbeats in batches** (protocol 10;
//!   every other one since protocol 6): on a plaintext link its reader asks
//!   the kernel to wake it only once more than [`HEARTBEATS_PER_READ`]` - 1`
//!   lone heartbeats wait (`SO_RCVLOWAT`; `manager/src/nodes/frames.rs`), on
//!   a TLS 1.3 link once more than their records wait (the agent's TLS layer
//!   seals each of its writes into one record). So lone heartbeats wait in
//!   the socket for the next frame or the batch's last heartbeat, and an idle
//!   node costs the manager one wake-up per [`HEARTBEATS_PER_READ`]
//!   heartbeats instead of one each (at 10,000 nodes, wake-ups were all of
//!   the idle manager's CPU: `docs/dev/notes/fleet-scale.md`).
//! * **Nothing but a heartbeat waits**: the agent pads every other frame to
//!   [`AGENT_MIN_FRAME_LEN`] bytes (zero bytes after the message,
//!   `crate::codec::MinFrameLen`), longer than the mark on either link, so a
//!   reply or an event wakes the reader on its own.
//! * **Silence is judged by arrival, not by reads**: with heartbeats waiting
//!   unread, the last frame read may be older than the threshold while the
//!   agent is well; before the manager calls a node silent it asks the
//!   kernel when data last arrived on the socket (`TCP_INFO`,
//!   `manager/src/nodes/arrival.rs`), and what waits unread counts as heard
//!   when it arrived. A frozen agent or a vanished host sends nothing and is
//!   dropped within the threshold as before.
//! * **Heartbeats keep to slots of the realtime clock**: an agent sends its
//!   heartbeats at a fixed offset in the period (one of the period's
//!   [`HEARTBEAT_SLOT`]-wide slots, drawn at random per session) counted
//!   from the epoch of the realtime clock ([`until_heartbeat_slot`]), not
//!   from when its session began. On a fleet whose clocks agree (NTP), the
//!   batches that reach the manager's mark arrive together, a slot's worth
//!   at a time, and one wake-up of the manager serves many of them; with
//!   clocks that do not agree, slots are as random as session starts were.
//!   A slot is a twentieth of a 2 s period, so a slot's burst is a
//!   twentieth of the fleet's heartbeats. After the first, the agent keeps
//!   the period on its monotonic clock (which NTP slews like the realtime
//!   one), skipping to the next slot when a send was late, so its
//!   heartbeats are never more than a period apart.
//! * **The manager sends heartbeats only when configured to**
//!   (`HeartbeatInterval` > 0; default 0, as BlueChi), and even then not to
//!   a node it wrote anything else to within the last half interval. It
//!   announces its interval in `Accepted::heartbeat_interval_ms`; 0 means
//!   none come, and the agent does not watch for silence.
//! * **The agent's heartbeats are its probes of the manager**: every agent
//!   sets `TCP_USER_TIMEOUT` on its socket ([`user_timeout`]), so data it
//!   sent that the manager's host does not acknowledge in time fails the
//!   connection in the kernel. A vanished manager host or a partition is
//!   therefore seen within the agent's `ControllerHeartbeatThreshold`
//!   (the kernel's retransmissions are clamped to the user timeout), and a
//!   killed manager process at once (its kernel closes the connection).
//!   The manager sets the same option with its `NodeHeartbeatThreshold`, so
//!   its own writes to a vanished node fail in the kernel too.
//! * **What this gives up**: a manager process that is frozen but whose
//!   kernel still acknowledges (stopped, deadlocked) is not seen by the
//!   agents through the link unless the manager sends heartbeats. Under
//!   systemd the manager's watchdog covers it: the manager pings
//!   `WATCHDOG=1` only while its worker threads run and its node table is
//!   not locked up, and the shipped unit (`WatchdogSec=30s`) kills and
//!   restarts a frozen one, which closes every link.
//!
//! Protocol 4 agents did not set the timeout, so a manager that sends no
//! heartbeats would leave them blind to a vanished manager host: the
//! version was bumped to 5 and they are refused with a version mismatch.
//!
//! Pure (no I/O); `link::set_user_timeout` applies the value to a socket.

use std::time::Duration;

/// Bytes of the agent's heartbeat frame on the wire (length prefix and
/// body); every other frame the agent sends is padded to at least
/// [`AGENT_MIN_FRAME_LEN`] (tested).
pub const AGENT_HEARTBEAT_FRAME_LEN: usize = 5;

/// The manager reads an idle agent's heartbeats this many at a time (module
/// docs): its reader's mark lets `HEARTBEATS_PER_READ - 1` lone heartbeats
/// wait, on either link.
pub const HEARTBEATS_PER_READ: usize = 11;

/// Bytes every frame of the agent but a heartbeat has at least (padded):
/// more than the mark the manager's reader sets on a plaintext link
/// (`(HEARTBEATS_PER_READ - 1) * 5 + 1`) and, sealed as a TLS 1.3 record
/// (22 bytes more), more than the one on a TLS link
/// (`(HEARTBEATS_PER_READ - 1) * 27 + 1`); the manager checks both at
/// compile time. A few hundred bytes more per reply or event is nothing
/// next to a wake-up.
pub const AGENT_MIN_FRAME_LEN: usize = 256;

/// The agent sends at least this many times per `NodeHeartbeatThreshold`
/// the manager announces (module docs).
pub const SENDS_PER_THRESHOLD: u32 = 3;

/// The width of a heartbeat slot (module docs): a period of `every` has
/// `every / HEARTBEAT_SLOT` slots (at least one).
pub const HEARTBEAT_SLOT: Duration = Duration::from_millis(100);

/// How long from `realtime` (time since the epoch of the realtime clock)
/// until the start of slot `pick` (any number; taken modulo the slot count)
/// of the heartbeat period `every`: in `[0, every)`, 0 for a zero period.
pub fn until_heartbeat_slot(every: Duration, pick: u64, realtime: Duration) -> Duration {
    let every_us = u64::try_from(every.as_micros()).unwrap_or(u64::MAX);
    if every_us == 0 {
        return Duration::ZERO;
    }
    let slot_us = u64::try_from(HEARTBEAT_SLOT.as_micros()).unwrap_or(u64::MAX);
    let slots = (every_us / slot_us).max(1);
    let offset_us = (pick % slots).saturating_mul(every_us / slots);
    let phase_us = u64::try_from(realtime.as_micros() % u128::from(every_us)).unwrap_or(0);
    Duration::from_micros((offset_us + every_us - phase_us) % every_us)
}

/// The smallest timeout worth setting: below it ordinary scheduling delays
/// of the peer's acknowledgements would end healthy links.
pub const MIN_USER_TIMEOUT: Duration = Duration::from_millis(100);

/// `TCP_USER_TIMEOUT` for a link end that must see a dead peer within
/// `threshold` and sends something at least every `sends_every` (`None`:
/// it may send nothing; then TCP keepalive probes are what is left
/// unacknowledged, and the kernel applies the same timeout to them).
///
/// The kernel counts from the first unacknowledged send, which comes at
/// most `sends_every` after the peer vanished; so the timeout is
/// `threshold - sends_every` when that leaves at least half the threshold,
/// else half the threshold, never below [`MIN_USER_TIMEOUT`]. `None` when
/// `threshold` is zero (the check is off: the kernel's default applies).
pub fn user_timeout(threshold: Duration, sends_every: Option<Duration>) -> Option<Duration> {
    if threshold.is_zero() {
        return None;
    }
    let half = threshold / 2;
    let budget = match sends_every {
        Some(every) if !every.is_zero() => threshold.saturating_sub(every).max(half),
        _ => threshold,
    };
    Some(budget.max(MIN_USER_TIMEOUT))
}

/// Whether the manager's heartbeat to a node is due: it sends one only when
/// it wrote nothing to the node within the last half of its
/// `interval` (any frame proves the manager alive as well as a heartbeat
/// does). So the agent hears something at least every 1.5 intervals, which
/// its negotiated silence threshold (at least three intervals) tolerates.
pub fn manager_heartbeat_due(since_last_write: Duration, interval: Duration) -> bool {
    since_last_write >= interval / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait lands on the slot's offset in the period, is shorter than
    /// the period, and the slots of a 2 s period are twenty, 100 ms apart.
    #[test]
    fn heartbeats_wait_for_their_slot() {
        let every = Duration::from_secs(2);
        for realtime_ms in [0u64, 1, 99, 100, 1_999, 2_000, 1_764_000_123_457] {
            let realtime = Duration::from_millis(realtime_ms);
            for pick in [0u64, 1, 7, 19, 20, 21, u64::MAX] {
                let wait = until_heartbeat_slot(every, pick, realtime);
                assert!(wait < every, "{realtime_ms} {pick}: {wait:?}");
                let at = (realtime + wait).as_millis() % 2_000;
                assert_eq!(at, u128::from(pick % 20) * 100, "{realtime_ms} {pick}");
            }
        }
        assert_eq!(
            until_heartbeat_slot(every, 3, Duration::from_millis(4_300)),
            Duration::ZERO,
            "already at the slot: send now"
        );
    }

    /// A period shorter than a slot has one slot; a zero period no wait.
    #[test]
    fn short_periods_have_one_slot() {
        let every = Duration::from_millis(40);
        for pick in [0u64, 5] {
            let wait = until_heartbeat_slot(every, pick, Duration::from_millis(1_010));
            assert_eq!(wait, Duration::from_millis(30), "{pick}");
        }
        assert_eq!(
            until_heartbeat_slot(Duration::ZERO, 9, Duration::from_secs(5)),
            Duration::ZERO
        );
        let odd = Duration::from_micros(2_345_678);
        let wait = until_heartbeat_slot(odd, 22, Duration::from_micros(987_654_321));
        assert!(wait < odd);
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn the_defaults_leave_room_for_one_send_interval() {
        assert_eq!(user_timeout(ms(6000), Some(ms(2000))), Some(ms(4000)));
    }

    #[test]
    fn zero_threshold_sets_nothing_and_tiny_ones_are_floored() {
        assert_eq!(user_timeout(Duration::ZERO, Some(ms(2000))), None);
        assert_eq!(user_timeout(ms(10), Some(ms(1))), Some(MIN_USER_TIMEOUT));
    }

    #[test]
    fn without_sends_the_whole_threshold_applies() {
        assert_eq!(user_timeout(ms(6000), None), Some(ms(6000)));
        assert_eq!(user_timeout(ms(6000), Some(Duration::ZERO)), Some(ms(6000)));
    }

    #[test]
    fn slow_senders_keep_half_the_threshold() {
        assert_eq!(user_timeout(ms(6000), Some(ms(5000))), Some(ms(3000)));
        assert_eq!(user_timeout(ms(6000), Some(ms(9000))), Some(ms(3000)));
    }

    /// Whatever the values, the kernel gives up on an unanswered send
    /// within the threshold once the first send after the peer vanished
    /// went out, and never sooner than half of it.
    #[test]
    fn the_timeout_fits_the_threshold() {
        let values = [1u64, 10, 100, 500, 1000, 2000, 5999, 6000, 60_000];
        for &t in &values {
            for &e in &values {
                let got = user_timeout(ms(t), Some(ms(e))).unwrap();
                assert!(got >= MIN_USER_TIMEOUT);
                if t >= 2 * MIN_USER_TIMEOUT.as_millis() as u64 {
                    assert!(got >= ms(t) / 2 && got <= ms(t), "{t}/{e}: {got:?}");
                }
                if e * 2 <= t && t >= 200 {
                    assert!(got + ms(e) <= ms(t), "{t}/{e}: {got:?}");
                }
            }
        }
    }

    #[test]
    fn the_heartbeat_frame_length_is_what_the_encoder_makes() {
        let body = crate::codec::encode_body(&crate::message::ToManager::Heartbeat).unwrap();
        assert_eq!(
            crate::codec::HEADER_LEN + body.len(),
            AGENT_HEARTBEAT_FRAME_LEN
        );
    }

    #[test]
    fn a_heartbeat_is_skipped_after_recent_traffic() {
        assert!(manager_heartbeat_due(ms(2000), ms(2000)));
        assert!(manager_heartbeat_due(ms(1000), ms(2000)));
        assert!(!manager_heartbeat_due(ms(999), ms(2000)));
        assert!(manager_heartbeat_due(Duration::MAX, ms(2000)));
    }
}
