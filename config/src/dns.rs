//! drover-dns settings: section `[drover-dns]` of `/etc/drover/dns.conf`
//! (drover-dns(8) lists every key; drover.conf(5) points there).
//!
//! Files, in order: `/usr/share/drover/dns.conf` (vendor defaults),
//! `/etc/drover/dns.conf`, `/etc/drover/dns.conf.d/*.conf`, the
//! `DROVER_LOG_*` variables, `-c FILE` (`Sources::for_flags("dns", ..)`;
//! BlueChi has no DNS server, so no BlueChi file is read). Same syntax and strictness as the
//! daemons' files: an unknown section or key, or a bad value, is an error
//! naming file, line and key.
//!
//! Keys: `ListenAddress` (`PORT` on loopback, `IPv4:PORT`, `[IPv6]:PORT`;
//! UDP and TCP), `Zone` (a DNS name), `TTL`, `StaleTTL`, `ServeStale` (time
//! spans, systemd syntax, whole seconds), `CacheSize`, `WhereRate` (calls per
//! second), and the logging keys `LogLevel`, `LogTarget`, `LogIsQuiet`.

use crate::ConfigError;
use crate::ini::Document;
use crate::layers::{Layered, LoadReport, Sources, apply_sources};
use crate::logging::LoggingConfig;
use crate::value::{At, apply_logging};
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// The section.
pub const SECTION: &str = "drover-dns";

/// Every key, in the order drover-dns(8) lists them.
pub const KEYS: &[&str] = &[
    "ListenAddress",
    "Zone",
    "TTL",
    "StaleTTL",
    "ServeStale",
    "CacheSize",
    "WhereRate",
    "LogLevel",
    "LogTarget",
    "LogIsQuiet",
];

/// Longest zone name accepted (room is left below it for unit and node).
pub const ZONE_MAX: usize = 100;
/// Longest TTL accepted.
pub const TTL_MAX: Duration = Duration::from_secs(3600);

/// drover-dns's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// `ListenAddress` (default `127.0.0.1:5353`).
    pub listen: SocketAddr,
    /// `Zone` (default `drover`), lower case, without the final dot.
    pub zone: String,
    /// `TTL` (default 5 s): how long an answer is fresh.
    pub ttl: Duration,
    /// `StaleTTL` (default 30 s, RFC 8767's value): the TTL of a stale answer.
    pub stale_ttl: Duration,
    /// `ServeStale` (default 1 h): how long after it arrived a last good
    /// answer may be served while the manager is unreachable; 0 = never.
    pub serve_stale: Duration,
    /// `CacheSize` (default 10000): units kept.
    pub cache_size: usize,
    /// `WhereRate` (default 200): `Where` calls per second, at most.
    pub where_rate: u32,
    pub logging: LoggingConfig,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5353),
            zone: "drover".into(),
            ttl: Duration::from_secs(5),
            stale_ttl: Duration::from_secs(30),
            serve_stale: Duration::from_secs(3600),
            cache_size: 10_000,
            where_rate: 200,
            logging: LoggingConfig::default(),
        }
    }
}

/// A `Zone` value: lower-case letters, digits and `-` in dot-separated
/// labels of 1..=63 bytes, at most [`ZONE_MAX`] bytes; one final dot allowed.
pub fn parse_zone(value: &str) -> Result<String, String> {
    let zone = value.strip_suffix('.').unwrap_or(value);
    if zone.is_empty() {
        return Err("the zone is empty (the root zone is not served)".into());
    }
    if zone.len() > ZONE_MAX {
        return Err(format!("longer than {ZONE_MAX} bytes"));
    }
    for label in zone.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("'{value}': every label must be 1..=63 bytes"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(format!(
                "'{value}': use lower-case letters, digits and '-' (not first or last) in each label"
            ));
        }
    }
    Ok(zone.to_string())
}

fn span(at: At<'_>, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
    let d = crate::timespan::parse(at.value()).map_err(|m| at.err(m))?;
    if d.subsec_nanos() != 0 {
        return Err(at.err(format!("'{}' is not a whole number of seconds", at.value())));
    }
    if d < min || d > max {
        return Err(at.err(format!(
            "'{}' is out of range {}..={}",
            at.value(),
            crate::timespan::format(min),
            crate::timespan::format(max)
        )));
    }
    Ok(d)
}

impl DnsConfig {
    /// Loads every layer of `sources` over the defaults.
    pub fn load_report(sources: &Sources) -> Result<(Self, LoadReport), ConfigError> {
        Self::load_with_env(sources, &|var| std::env::var_os(var))
    }

    pub(crate) fn load_with_env(
        sources: &Sources,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Self, LoadReport), ConfigError> {
        let mut cfg = Self::default();
        let files = apply_sources(&mut cfg, sources, env)?;
        Ok((
            cfg,
            LoadReport {
                files,
                warnings: Vec::new(),
            },
        ))
    }

    /// One file's text over the defaults (tests).
    pub fn parse_str(text: &str) -> Result<Self, ConfigError> {
        let doc = crate::ini::parse(Path::new("<string>"), text)?;
        let mut cfg = Self::default();
        cfg.apply(&doc)?;
        Ok(cfg)
    }

    fn apply_key(&mut self, at: At<'_>) -> Result<(), ConfigError> {
        if apply_logging(at, &mut self.logging)? {
            return Ok(());
        }
        let second = Duration::from_secs(1);
        match at.entry.key.as_str() {
            "ListenAddress" => {
                self.listen = crate::metrics::parse_listen(at.value())
                    .map_err(|m| at.err(m))?
                    .ok_or_else(|| at.err("empty: drover-dns needs an address to listen on"))?
            }
            "Zone" => self.zone = parse_zone(at.value()).map_err(|m| at.err(m))?,
            "TTL" => self.ttl = span(at, second, TTL_MAX)?,
            "StaleTTL" => self.stale_ttl = span(at, second, TTL_MAX)?,
            "ServeStale" => {
                self.serve_stale = span(at, Duration::ZERO, Duration::from_secs(7 * 86400))?
            }
            "CacheSize" => {
                self.cache_size = usize::try_from(at.number(1, 1_000_000)?).unwrap_or(1_000_000)
            }
            "WhereRate" => self.where_rate = at.u32_in(1, 100_000)?,
            other => {
                return Err(at.err(format!(
                    "unknown key '{other}' in [{SECTION}] (known: {})",
                    KEYS.join(", ")
                )));
            }
        }
        Ok(())
    }
}

impl Layered for DnsConfig {
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError> {
        for section in &doc.sections {
            if section.name != SECTION {
                return Err(ConfigError::Syntax {
                    path: doc.path.clone(),
                    line: section.line,
                    message: format!("unknown section [{}]: expected [{SECTION}]", section.name),
                });
            }
            for entry in &section.entries {
                self.apply_key(At {
                    path: &doc.path,
                    entry,
                })?;
            }
        }
        Ok(())
    }

    fn logging_mut(&mut self) -> &mut LoggingConfig {
        &mut self.logging
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::ROOT_ENV;

    #[test]
    fn defaults_and_every_key() {
        assert_eq!(DnsConfig::parse_str("").unwrap(), DnsConfig::default());
        let c = DnsConfig::parse_str(
            "[drover-dns]\nListenAddress=[::1]:53\nZone=Fleet.example.\nTTL=2s\nStaleTTL=1min\n\
             ServeStale=0\nCacheSize=5\nWhereRate=7\nLogLevel=DEBUG\n",
        );
        // Upper case is refused: the zone is written as it is served.
        assert!(c.is_err());
        let c = DnsConfig::parse_str(
            "[drover-dns]\nListenAddress=[::1]:53\nZone=fleet.example.\nTTL=2s\nStaleTTL=1min\n\
             ServeStale=0\nCacheSize=5\nWhereRate=7\nLogLevel=DEBUG\n",
        )
        .unwrap();
        assert_eq!(c.listen, "[::1]:53".parse().unwrap());
        assert_eq!(c.zone, "fleet.example");
        assert_eq!(c.ttl, Duration::from_secs(2));
        assert_eq!(c.stale_ttl, Duration::from_secs(60));
        assert_eq!(c.serve_stale, Duration::ZERO);
        assert_eq!((c.cache_size, c.where_rate), (5, 7));
        assert_eq!(
            DnsConfig::parse_str("[drover-dns]\nListenAddress=5354\n")
                .unwrap()
                .listen,
            "127.0.0.1:5354".parse().unwrap()
        );
    }

    /// The shipped vendor file parses, and every default it shows in a
    /// comment is the real default; the /etc example parses too.
    #[test]
    fn shipped_dns_conf() {
        let text = include_str!("../../dist/usr/share/drover/dns.conf");
        assert_eq!(DnsConfig::parse_str(text).unwrap(), DnsConfig::default());
        let (uncommented, shown) = crate::test_util::uncomment_defaults(text, KEYS);
        assert_eq!(
            DnsConfig::parse_str(&uncommented).unwrap(),
            DnsConfig::default()
        );
        assert_eq!(shown, KEYS.len(), "every key is documented");
        let etc = include_str!("../../dist/etc/drover/dns.conf");
        assert_eq!(DnsConfig::parse_str(etc).unwrap(), DnsConfig::default());
    }

    #[test]
    fn garbage_is_refused_with_file_line_and_key() {
        for (text, says) in [
            (
                "[drover-manager]\nTTL=1s\n",
                "unknown section [drover-manager]",
            ),
            ("[drover-dns]\nTtl=1s\n", "unknown key 'Ttl'"),
            ("[drover-dns]\nTTL=0\n", "out of range"),
            ("[drover-dns]\nTTL=1.5s\n", "whole number of seconds"),
            ("[drover-dns]\nTTL=2h\n", "out of range"),
            ("[drover-dns]\nTTL=soon\n", "TTL"),
            ("[drover-dns]\nZone=\n", "empty"),
            ("[drover-dns]\nZone=.\n", "empty"),
            ("[drover-dns]\nZone=a..b\n", "1..=63"),
            ("[drover-dns]\nZone=a_b\n", "lower-case"),
            ("[drover-dns]\nZone=-a\n", "lower-case"),
            ("[drover-dns]\nListenAddress=\n", "needs an address"),
            ("[drover-dns]\nListenAddress=localhost:53\n", "not PORT"),
            ("[drover-dns]\nListenAddress=0\n", "port"),
            ("[drover-dns]\nCacheSize=0\n", "out of range"),
            ("[drover-dns]\nWhereRate=-1\n", "not a number"),
            (
                "[drover-dns]\nWhereRate=5 # per second\n",
                "comments must be on their own line",
            ),
            ("TTL=1s\n", "outside"),
        ] {
            let err = DnsConfig::parse_str(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
            if text.starts_with("[drover-dns]") {
                assert!(err.contains("<string>:2:"), "{text:?}: {err}");
            }
        }
        let long = format!("[drover-dns]\nZone={}\n", "a.".repeat(60));
        assert!(DnsConfig::parse_str(&long).is_err());
    }

    #[test]
    fn files_are_read_in_layers_under_the_config_root() {
        let root = std::env::temp_dir().join(format!("drover-dns-conf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("etc/drover/dns.conf.d")).unwrap();
        std::fs::write(
            root.join("etc/drover/dns.conf"),
            "[drover-dns]\nTTL=3s\nZone=a\n",
        )
        .unwrap();
        std::fs::write(
            root.join("etc/drover/dns.conf.d/10-zone.conf"),
            "[drover-dns]\nZone=b\n",
        )
        .unwrap();
        let env = |k: &str| (k == ROOT_ENV).then(|| root.clone().into_os_string());
        let sources = Sources::from_env("dns", None, &env).unwrap();
        assert!(sources.bluechi_etc.is_none() && sources.bluechi_dropins.is_none());
        let (c, report) = DnsConfig::load_with_env(&sources, &env).unwrap();
        assert_eq!((c.ttl, c.zone.as_str()), (Duration::from_secs(3), "b"));
        assert_eq!(report.files.len(), 2);
        std::fs::write(
            root.join("etc/drover/dns.conf.d/20-bad.conf"),
            "[drover-dns]\nTTL=x\n",
        )
        .unwrap();
        let err = DnsConfig::load_with_env(&sources, &env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("20-bad.conf:2: key 'TTL'"), "{err}");
        let relative = |k: &str| (k == ROOT_ENV).then(|| OsString::from("rel"));
        assert!(Sources::from_env("dns", None, &relative).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
