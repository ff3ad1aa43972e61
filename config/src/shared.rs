//! The keys both daemons read with one meaning, written once: the agent
//! link's TCP keys ([`LinkSettings`]: `TCPKeepAliveTime`,
//! `TCPKeepAliveInterval`, `TCPKeepAliveCount`, `IPReceiveErrors`), the TLS
//! file keys ([`crate::tls`]) and the logging keys (`LogLevel`, `LogTarget`,
//! `LogIsQuiet`).
//!
//! Each daemon's key list is its own keys followed by [`KEYS`]
//! ([`key_list`]); its loader hands every key of its main section to
//! `shared::apply` before its own, and a key neither knows is an error
//! naming the section. Values and limits are the same on both ends: a
//! keepalive of 0 leaves the kernel's default, otherwise Linux's own limits
//! apply (`TCP_KEEPIDLE`/`TCP_KEEPINTVL` ≤ 32767 s, `TCP_KEEPCNT` ≤ 127), so
//! a bad value is caught at load and not by a `setsockopt` failure on every
//! connection.

use crate::tls::{self, TlsKeys};
use crate::value::{At, apply_logging};
use crate::{ConfigError, LoggingConfig};

/// The link keys, in the order drover.conf(5) lists them.
pub const LINK_KEYS: &[&str] = &[
    "TCPKeepAliveTime",
    "TCPKeepAliveInterval",
    "TCPKeepAliveCount",
    "IPReceiveErrors",
];

/// The logging keys.
pub const LOG_KEYS: &[&str] = &["LogLevel", "LogTarget", "LogIsQuiet"];

/// Every shared key: the link keys, the TLS file keys, the logging keys.
pub const KEYS: &[&str] = &key_list::<{ LINK_KEYS.len() + tls::KEYS.len() + LOG_KEYS.len() }>(&[
    LINK_KEYS,
    tls::KEYS,
    LOG_KEYS,
]);

/// The concatenation of `lists` (`N` keys in all), for a daemon's key list:
/// `key_list::<N>(&[OWN, shared::KEYS])`.
pub const fn key_list<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut n = 0;
    let mut l = 0;
    while l < lists.len() {
        let mut i = 0;
        while i < lists[l].len() {
            out[n] = lists[l][i];
            n += 1;
            i += 1;
        }
        l += 1;
    }
    assert!(n == N, "the key lists do not add up to N");
    out
}

/// Largest `TCPKeepAliveTime`/`TCPKeepAliveInterval` (s).
const KEEPALIVE_SECS_MAX: u32 = 32767;
/// Largest `TCPKeepAliveCount`.
const KEEPALIVE_COUNT_MAX: u32 = 127;

/// The TCP settings of the agent link, the same keys on both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSettings {
    /// `TCPKeepAliveTime` (s; default 1, 0: the kernel's default).
    pub keepalive_time_s: u32,
    /// `TCPKeepAliveInterval` (s; default 1, 0: the kernel's default).
    pub keepalive_interval_s: u32,
    /// `TCPKeepAliveCount` (default 6, 0: the kernel's default).
    pub keepalive_count: u32,
    /// `IPReceiveErrors` (default true).
    pub ip_receive_errors: bool,
}

impl Default for LinkSettings {
    fn default() -> Self {
        Self {
            keepalive_time_s: 1,
            keepalive_interval_s: 1,
            keepalive_count: 6,
            ip_receive_errors: true,
        }
    }
}

/// Applies `at` if it is a shared key: a link key to `link`, a TLS file
/// key to `tls`, a logging key to `log`; returns false for any other key.
pub(crate) fn apply(
    at: At<'_>,
    link: &mut LinkSettings,
    tls: &mut TlsKeys,
    log: &mut LoggingConfig,
) -> Result<bool, ConfigError> {
    if tls.apply(at)? || apply_logging(at, log)? {
        return Ok(true);
    }
    match at.entry.key.as_str() {
        "TCPKeepAliveTime" => link.keepalive_time_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?,
        "TCPKeepAliveInterval" => link.keepalive_interval_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?,
        "TCPKeepAliveCount" => link.keepalive_count = at.u32_in(0, KEEPALIVE_COUNT_MAX)?,
        "IPReceiveErrors" => link.ip_receive_errors = at.boolean()?,
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_list_is_the_three_lists() {
        assert_eq!(KEYS.len(), 11);
        assert_eq!(&KEYS[..4], LINK_KEYS);
        assert_eq!(&KEYS[4..8], tls::KEYS);
        assert_eq!(&KEYS[8..], LOG_KEYS);
        let joined: [&str; 3] = key_list(&[&["A"], &[], &["B", "C"]]);
        assert_eq!(joined, ["A", "B", "C"]);
    }
}
