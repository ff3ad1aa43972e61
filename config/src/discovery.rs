//! The discovery keys of the manager (docs/discovery.md): `StaleRetention`
//! and `WarmUpTimeout`, both in systemd's time span syntax
//! ([`crate::timespan`]: `5min`, `90s`, a bare number is seconds).
//!
//! * `StaleRetention` (default 5 min): how long the last-good unit records
//!   of an offline node stay in drover's own views (`Where` with `stale`),
//!   marked stale. `0` forgets them at once. At most one day.
//! * `WarmUpTimeout` (default 60 s): after a manager start, how long
//!   `Where` says its answer may be incomplete while nodes known from the
//!   configuration have not registered yet. `0` = no warm-up. At most one day.

use crate::ConfigError;
use crate::value::At;
use std::time::Duration;

/// The discovery keys, in the order drover.conf(5) lists them.
pub const KEYS: &[&str] = &["StaleRetention", "WarmUpTimeout"];

/// The largest value either key takes.
pub const MAX: Duration = Duration::from_secs(86_400);

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoverySettings {
    pub stale_retention: Duration,
    pub warm_up_timeout: Duration,
}

impl Default for DiscoverySettings {
    fn default() -> Self {
        Self {
            stale_retention: Duration::from_secs(300),
            warm_up_timeout: Duration::from_secs(60),
        }
    }
}

/// A time span of at most [`MAX`].
fn span(value: &str) -> Result<Duration, String> {
    let d = crate::timespan::parse(value.trim())?;
    if d > MAX {
        return Err(format!(
            "{} is longer than the most accepted, {}",
            crate::timespan::format(d),
            crate::timespan::format(MAX)
        ));
    }
    Ok(d)
}

/// Applies `at` if it is a discovery key; `Ok(false)` when it is not one.
pub(crate) fn apply(at: At<'_>, settings: &mut DiscoverySettings) -> Result<bool, ConfigError> {
    match at.entry.key.as_str() {
        "StaleRetention" => settings.stale_retention = span(at.value()).map_err(|m| at.err(m))?,
        "WarmUpTimeout" => settings.warm_up_timeout = span(at.value()).map_err(|m| at.err(m))?,
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManagerConfig;

    fn load(text: &str) -> Result<DiscoverySettings, String> {
        ManagerConfig::parse_str(&format!("[drover-manager]\n{text}\n"))
            .map(|c| c.discovery)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_systemd_time_spans() {
        assert_eq!(load("").unwrap(), DiscoverySettings::default());
        let s = load("StaleRetention=1min 30s\nWarmUpTimeout=0").unwrap();
        assert_eq!(s.stale_retention, Duration::from_secs(90));
        assert_eq!(s.warm_up_timeout, Duration::ZERO);
        assert_eq!(
            load("StaleRetention=500ms").unwrap().stale_retention,
            Duration::from_millis(500)
        );
        assert_eq!(
            load("StaleRetention=2").unwrap().stale_retention,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn garbage_is_an_error_naming_the_key() {
        for bad in [
            "StaleRetention=",
            "StaleRetention=-1",
            "StaleRetention=5 parsecs",
            "StaleRetention=infinity",
            "StaleRetention=2d",
            "WarmUpTimeout=abc",
            "WarmUpTimeout=\u{1}",
        ] {
            let err = load(bad).expect_err(bad);
            let key = bad.split('=').next().unwrap_or_default();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }
}
