//! The Prometheus endpoint's keys, written once for any daemon that serves
//! one: `MetricsListenAddress` (off when unset or empty) and
//! `MetricsPerNode` (default true).
//!
//! `MetricsListenAddress` takes `PORT` (served on loopback, `127.0.0.1`),
//! `IPv4:PORT` or `[IPv6]:PORT`; a host name, a port out of `1..=65535` or
//! anything else is an error naming file, line and key, so `--check` and a
//! start refuse it before anything listens. An empty value turns the
//! endpoint off again (a drop-in can switch off what the main file
//! switched on). No port 0: an operator's scrape config names the port, so
//! a port the kernel picks would be one nobody scrapes.

use crate::ConfigError;
use crate::value::At;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The metrics keys, in the order drover.conf(5) lists them.
pub const KEYS: &[&str] = &["MetricsListenAddress", "MetricsPerNode"];

/// Where and what the endpoint serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// `MetricsListenAddress`: `None` = no endpoint, no listener.
    pub listen: Option<SocketAddr>,
    /// `MetricsPerNode` (default true): series labelled by node (up, last
    /// seen, systemd's `SystemState`). Off for very large fleets, where one series per node is more
    /// than a scrape should carry.
    pub per_node: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            listen: None,
            per_node: true,
        }
    }
}

/// Parses a `MetricsListenAddress` value (`PORT`, `IPv4:PORT`,
/// `[IPv6]:PORT`; empty = off).
pub fn parse_listen(value: &str) -> Result<Option<SocketAddr>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let addr = if value.bytes().all(|b| b.is_ascii_digit()) {
        let port = value
            .parse::<u16>()
            .map_err(|_| format!("port {value} is out of range 1..=65535"))?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        value.parse::<SocketAddr>().map_err(|_| {
            format!(
                "'{value}' is not PORT, IPv4:PORT or [IPv6]:PORT \
                 (e.g. 9842, 127.0.0.1:9842, [::1]:9842)"
            )
        })?
    };
    if addr.port() == 0 {
        return Err(format!("'{value}': port 0 is not a port (use 1..=65535)"));
    }
    Ok(Some(addr))
}

/// Applies `at` if it is a metrics key; `Ok(false)` when it is not one.
pub(crate) fn apply(at: At<'_>, settings: &mut MetricsSettings) -> Result<bool, ConfigError> {
    match at.entry.key.as_str() {
        "MetricsListenAddress" => {
            settings.listen = parse_listen(at.value()).map_err(|m| at.err(m))?
        }
        "MetricsPerNode" => settings.per_node = at.boolean()?,
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_values() {
        assert_eq!(parse_listen(""), Ok(None));
        assert_eq!(
            parse_listen("9842"),
            Ok(Some("127.0.0.1:9842".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("0.0.0.0:1"),
            Ok(Some("0.0.0.0:1".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("[::1]:9842"),
            Ok(Some("[::1]:9842".parse().unwrap()))
        );
        for bad in [
            "0",
            "65536",
            "99999999999999999999",
            "localhost:9842",
            "127.0.0.1",
            "::1",
            "[::1]",
            "127.0.0.1:0",
            "127.0.0.1:x",
            "-1",
            "+9842",
            "9842 # metrics",
            "http://127.0.0.1:9842",
            "1.2.3.4:5:6",
            "\u{0}",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad:?} accepted");
        }
    }
}
