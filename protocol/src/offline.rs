//! How a proxy that waits for a target on an offline node says so.
//!
//! The manager tells a waiting proxy's agent that the target's node is offline and how
//! long ago it last heard from it ([`crate::Notice::TargetNodeOffline`]: a duration, so
//! the two hosts' clocks need not agree); the agent turns that into the moment it began,
//! on its own clock, and when the proxy is stopped while it waits (its start timeout ran
//! out), this line is the reason the proxy gives:
//!
//! ```text
//! node bar is offline (since 2026-11-24 22:41:07 UTC, 93 s ago)
//! node bar is offline (not connected since the manager started)
//! ```
//!
//! Pure: the caller passes the times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The reason for a proxy waiting on `node`, offline since `since` (`None`: it has not
/// connected since the manager started), as of `now`.
pub fn offline_reason(node: &str, since: Option<SystemTime>, now: SystemTime) -> String {
    match since {
        Some(since) => {
            let ago = now.duration_since(since).unwrap_or_default();
            format!(
                "node {node} is offline (since {}, {} ago)",
                utc(since),
                span(ago)
            )
        }
        None => format!("node {node} is offline (not connected since the manager started)"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC`, or seconds since the epoch if the date is out of range.
pub fn utc(at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .min(i64::MAX as u64) as i64;
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("@{secs}"),
    }
}

/// A short span: seconds up to two minutes, then minutes up to two hours, then hours.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn says_since_when_in_utc_and_how_long_ago() {
        // 2026-11-24 22:41:07 UTC
        let since = at(1_795_560_067);
        assert_eq!(
            offline_reason("bar", Some(since), since + Duration::from_secs(93)),
            "node bar is offline (since 2026-11-24 22:41:07 UTC, 93 s ago)"
        );
        assert_eq!(
            offline_reason("bar", Some(since), since + Duration::from_secs(600)),
            "node bar is offline (since 2026-11-24 22:41:07 UTC, 10 min ago)"
        );
        assert_eq!(
            offline_reason("bar", Some(since), since + Duration::from_secs(3 * 86400)),
            "node bar is offline (since 2026-11-24 22:41:07 UTC, 72 h ago)"
        );
    }

    #[test]
    fn a_node_never_seen_and_odd_clocks_still_read_well() {
        assert_eq!(
            offline_reason("bar", None, at(5)),
            "node bar is offline (not connected since the manager started)"
        );
        // A "since" after "now" (a clock stepped back) is 0 s ago, not a panic.
        assert_eq!(
            offline_reason("n", Some(at(100)), at(50)),
            "node n is offline (since 1970-01-01 00:01:40 UTC, 0 s ago)"
        );
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        // Past year 9999 the date is the seconds.
        assert_eq!(utc(at(1 << 40)), "@1099511627776");
    }
}
