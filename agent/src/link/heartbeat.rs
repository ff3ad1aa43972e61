//! Heartbeats negotiated with the manager: how often the agent sends, and
//! how long it waits in silence before it drops the link.
//!
//! The manager announces its own pair in `Accepted` (`heartbeat_interval_ms`:
//! how often it sends, 0 = never; `heartbeat_threshold_ms`: how long it
//! waits for the agent, 0 = forever). The agent's configured pair is what it
//! would like; the announced pair is what the link can bear. Rules, chosen so
//! that no pair of settings both sides accept makes a healthy node flap:
//!
//! * **Send**: the configured interval, unless the manager watches the agent
//!   (`threshold > 0`) and the interval is 0 or more than a third of that
//!   threshold; then a third of the threshold
//!   (`drover_protocol::liveness::SENDS_PER_THRESHOLD`: the manager counts
//!   a heartbeat when it arrives, read or not, and three sends per
//!   threshold leave room for a late one). A manager that drops silent
//!   nodes always hears from the agent in time.
//! * **Silence**: none when the agent's `ControllerHeartbeatThreshold` is 0
//!   (the operator turned the check off) or when the manager announces
//!   interval 0 (it sends no heartbeats, so silence means nothing; the
//!   manager's default since protocol 5). A dead manager host is then found
//!   by the kernel: the link's socket has `TCP_USER_TIMEOUT`
//!   (`drover_protocol::liveness`, set in [`crate::connection`]), so the
//!   agent's own heartbeats going unacknowledged end the link. Otherwise the
//!   configured threshold, raised to three announced intervals when it is
//!   shorter (a threshold below the manager's interval drops the link
//!   between two heartbeats).
//!
//! Pure but for [`timer`] (which reads the realtime clock and draws a
//! slot): the link logs the [`Negotiated::notes`] and applies the values.

use drover_bus::timestamp;
use drover_protocol::liveness::{SENDS_PER_THRESHOLD as SENDS, until_heartbeat_slot};
use std::time::Duration;

/// The timer a session sends its heartbeats by, every `every`: its first
/// tick at the start of a slot of the period by the realtime clock
/// (`drover_protocol::liveness`, "Heartbeats keep to slots"), drawn at
/// random for each timer (each session), then every period on that grid,
/// skipping ticks missed (it stays in its slot). The benchmark's simulated
/// agents take theirs here too.
pub fn timer(every: Duration) -> tokio::time::Interval {
    let pick = super::random_u64();
    let realtime = Duration::from_micros(timestamp::realtime_us());
    let first = tokio::time::Instant::now() + until_heartbeat_slot(every, pick, realtime);
    let mut tick = tokio::time::interval_at(first, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick
}

/// The link's heartbeat settings for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Send a heartbeat this often; `None`: never.
    pub send_every: Option<Duration>,
    /// Drop the link after this long with nothing from the manager; `None`: never.
    pub silence: Option<Duration>,
    /// What was changed from the configuration, and why (logged once per session).
    pub notes: Vec<String>,
}

/// Heartbeats missed in a row before the link counts as dead, when the
/// agent has to pick a threshold itself (matches the defaults 2000 / 6000).
const MISSED: u32 = 3;

/// See the module docs.
pub fn negotiate(
    interval: Duration,
    threshold: Duration,
    announced_interval_ms: u64,
    announced_threshold_ms: u64,
) -> Negotiated {
    let mut notes = Vec::new();
    let manager_interval = Duration::from_millis(announced_interval_ms);
    let manager_threshold = Duration::from_millis(announced_threshold_ms);

    let send_every = if manager_threshold.is_zero() {
        (!interval.is_zero()).then_some(interval)
    } else if interval.is_zero() || interval.saturating_mul(SENDS) > manager_threshold {
        let every = (manager_threshold / SENDS).max(Duration::from_micros(1));
        notes.push(format!(
            "HeartbeatInterval {interval:?} does not fit the manager's threshold \
             {manager_threshold:?}; sending heartbeats every {every:?}"
        ));
        Some(every)
    } else {
        Some(interval)
    };

    let silence = if threshold.is_zero() {
        None
    } else if manager_interval.is_zero() {
        // The default: the kernel's timeout on what the agent sends is the
        // check (module docs), nothing to tell the operator.
        None
    } else {
        let floor = manager_interval.saturating_mul(MISSED);
        if threshold < floor {
            notes.push(format!(
                "ControllerHeartbeatThreshold {threshold:?} is too short for the manager's \
                 heartbeat interval {manager_interval:?}; using {floor:?}"
            ));
            Some(floor)
        } else {
            Some(threshold)
        }
    };
    Negotiated {
        send_every,
        silence,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn defaults_are_kept() {
        let n = negotiate(ms(2000), ms(6000), 2000, 6000);
        assert_eq!(n.send_every, Some(ms(2000)));
        assert_eq!(n.silence, Some(ms(6000)));
        assert!(n.notes.is_empty(), "{:?}", n.notes);
    }

    #[test]
    fn a_manager_without_heartbeats_is_not_dropped_for_silence() {
        let n = negotiate(ms(2000), ms(6000), 0, 6000);
        assert_eq!(n.silence, None);
        assert_eq!(n.send_every, Some(ms(2000)));
        assert!(
            n.notes.is_empty(),
            "the default says nothing: {:?}",
            n.notes
        );
    }

    #[test]
    fn the_threshold_follows_a_longer_manager_interval() {
        let n = negotiate(ms(2000), ms(6000), 8000, 0);
        assert_eq!(n.silence, Some(ms(24000)));
        assert_eq!(n.send_every, Some(ms(2000)));
        assert_eq!(n.notes.len(), 1);
    }

    #[test]
    fn an_agent_without_heartbeats_still_feeds_a_watching_manager() {
        let n = negotiate(Duration::ZERO, ms(6000), 2000, 6000);
        assert_eq!(n.send_every, Some(ms(2000)));
        let n = negotiate(Duration::ZERO, Duration::ZERO, 0, 0);
        assert_eq!((n.send_every, n.silence), (None, None));
    }

    /// Every combination of settings both configs accept: the agent sends
    /// at least three times per manager threshold, and waits at least three
    /// manager intervals (or not at all).
    #[test]
    fn no_accepted_pair_of_settings_flaps() {
        let values = [
            0u64, 1, 10, 100, 500, 1000, 2000, 2001, 6000, 8000, 86_400_000,
        ];
        for &mi in &values {
            for &mt in &values {
                if mi > 0 && mt > 0 && mt <= mi {
                    continue; // the manager refuses this pair
                }
                for &ai in &values {
                    for &at in &values {
                        if ai > 0 && at > 0 && at <= ai {
                            continue; // the agent refuses this pair
                        }
                        let n = negotiate(ms(ai), ms(at), mi, mt);
                        if mt > 0 {
                            let every = n.send_every.expect("a watching manager is fed");
                            assert!(
                                every.saturating_mul(SENDS) <= ms(mt),
                                "agent {ai}/{at}, manager {mi}/{mt}: sends every {every:?}"
                            );
                        }
                        if let Some(silence) = n.silence {
                            assert!(mi > 0, "no silence check without manager heartbeats");
                            assert!(
                                silence >= ms(mi).saturating_mul(MISSED),
                                "agent {ai}/{at}, manager {mi}/{mt}: waits only {silence:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
