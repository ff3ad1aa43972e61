//! The high-availability keys of `[drover-manager]`: `EtcdEndpoints`,
//! `EtcdKeyPrefix`, `EtcdLeaseTTL` (docs/ha.md).
//!
//! Without `EtcdEndpoints` (unset or empty) the manager is alone, as it has
//! always been: nothing of etcd is touched. With it, every manager that
//! names the same endpoints and prefix campaigns for `PREFIX/leader`.
//!
//! * `EtcdEndpoints`: `http://HOST:PORT` items, separated by commas or
//!   spaces, at most [`MAX_ENDPOINTS`]; HOST is an IP address (`[v6]` in
//!   brackets) or a DNS name. No path, no user, no `https` yet (TLS to etcd
//!   is not built: an `https` endpoint is an error, not a silent plaintext).
//! * `EtcdKeyPrefix` (default `/drover`): starts with `/`, does not end with
//!   one, printable ASCII without spaces, at most [`MAX_PREFIX`] bytes. Two
//!   fleets on one etcd differ by prefix.
//! * `EtcdLeaseTTL` (seconds, default [`DEFAULT_TTL_S`], from
//!   [`MIN_TTL_S`] to [`MAX_TTL_S`]): how long a leader that stopped renewing
//!   keeps the key; a leader steps down on its own clock before that.

use crate::ConfigError;
use crate::value::At;

/// The HA keys, in the order drover.conf(5) lists them.
pub const KEYS: &[&str] = &["EtcdEndpoints", "EtcdKeyPrefix", "EtcdLeaseTTL"];

pub const DEFAULT_PREFIX: &str = "/drover";
pub const DEFAULT_TTL_S: u64 = 5;
/// Below two seconds a leader would have to renew more often than a loaded
/// etcd answers reliably.
pub const MIN_TTL_S: u64 = 2;
pub const MAX_TTL_S: u64 = 3600;
pub const MAX_ENDPOINTS: usize = 16;
pub const MAX_PREFIX: usize = 200;

/// One etcd client URL (`http://HOST:PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdEndpoint {
    /// As written, without brackets for IPv6 (what a socket address wants
    /// is [`EtcdEndpoint::authority`]).
    pub host: String,
    pub port: u16,
}

impl EtcdEndpoint {
    /// `HOST:PORT`, `[v6]:PORT`: what is dialled and sent as `Host:`.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for EtcdEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}", self.authority())
    }
}

/// The HA settings; [`HaSettings::enabled`] is false without endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    pub endpoints: Vec<EtcdEndpoint>,
    pub key_prefix: String,
    pub lease_ttl_s: u64,
}

impl Default for HaSettings {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            key_prefix: DEFAULT_PREFIX.to_string(),
            lease_ttl_s: DEFAULT_TTL_S,
        }
    }
}

impl HaSettings {
    /// Whether this manager campaigns on etcd at all.
    pub fn enabled(&self) -> bool {
        !self.endpoints.is_empty()
    }

    /// The key the leader holds: `PREFIX/leader`.
    pub fn leader_key(&self) -> String {
        format!("{}/leader", self.key_prefix)
    }
}

/// Parses an `EtcdEndpoints` value (empty = none).
pub fn parse_endpoints(value: &str) -> Result<Vec<EtcdEndpoint>, String> {
    let mut out: Vec<EtcdEndpoint> = Vec::new();
    for item in value.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
        let endpoint = parse_endpoint(item)?;
        if !out.contains(&endpoint) {
            out.push(endpoint);
        }
        if out.len() > MAX_ENDPOINTS {
            return Err(format!("more than {MAX_ENDPOINTS} endpoints"));
        }
    }
    Ok(out)
}

fn parse_endpoint(item: &str) -> Result<EtcdEndpoint, String> {
    let shown: String = item
        .chars()
        .take(80)
        .flat_map(char::escape_default)
        .collect();
    let example = "(e.g. http://192.0.2.10:2379, http://etcd1.example:2379)";
    if item.starts_with("https://") {
        return Err(format!(
            "'{shown}': TLS to etcd is not supported yet; use http:// on a trusted network \
             (docs/ha.md)"
        ));
    }
    let Some(rest) = item.strip_prefix("http://") else {
        return Err(format!("'{shown}' is not http://HOST:PORT {example}"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, port) = v6
            .split_once("]:")
            .ok_or_else(|| format!("'{shown}' is not http://HOST:PORT {example}"))?;
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("'{shown}': '{host}' is not an IPv6 address"))?;
        (host, port)
    } else {
        rest.rsplit_once(':')
            .ok_or_else(|| format!("'{shown}' has no port {example}"))?
    };
    if !valid_host(host) {
        return Err(format!(
            "'{shown}': the host must be an IP address or a DNS name {example}"
        ));
    }
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(format!("'{shown}': the port must be 1..=65535 {example}")),
    };
    Ok(EtcdEndpoint {
        host: host.to_string(),
        port,
    })
}

/// An IPv6 literal (already checked by the caller) or letters, digits,
/// `-` and `.` with no empty label: nothing that could smuggle a path, a
/// user or a second header into a request.
fn valid_host(host: &str) -> bool {
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Parses an `EtcdKeyPrefix` value.
pub fn parse_prefix(value: &str) -> Result<String, String> {
    let shown: String = value
        .chars()
        .take(80)
        .flat_map(char::escape_default)
        .collect();
    if !value.starts_with('/') || value.len() < 2 {
        return Err(format!(
            "'{shown}' must start with '/' and name something (e.g. /drover, /fleet-a)"
        ));
    }
    if value.ends_with('/') {
        return Err(format!(
            "'{shown}' must not end with '/' (the key is PREFIX/leader)"
        ));
    }
    if value.len() > MAX_PREFIX {
        return Err(format!("longer than {MAX_PREFIX} bytes"));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("'{shown}' must be printable ASCII without spaces"));
    }
    Ok(value.to_string())
}

/// Applies `at` if it is an HA key; `Ok(false)` when it is not one.
pub(crate) fn apply(at: At<'_>, settings: &mut HaSettings) -> Result<bool, ConfigError> {
    match at.entry.key.as_str() {
        "EtcdEndpoints" => {
            settings.endpoints = parse_endpoints(at.value()).map_err(|m| at.err(m))?
        }
        "EtcdKeyPrefix" => {
            settings.key_prefix = if at.value().is_empty() {
                DEFAULT_PREFIX.to_string()
            } else {
                parse_prefix(at.value()).map_err(|m| at.err(m))?
            }
        }
        "EtcdLeaseTTL" => settings.lease_ttl_s = at.number(MIN_TTL_S, MAX_TTL_S)?,
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoints(""), Ok(vec![]));
        assert_eq!(parse_endpoints("  "), Ok(vec![]));
        let e =
            parse_endpoints("http://127.0.0.1:2379, http://etcd-2.example:2379 http://[::1]:23/")
                .unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].authority(), "127.0.0.1:2379");
        assert_eq!(e[1].to_string(), "http://etcd-2.example:2379");
        assert_eq!(e[2].authority(), "[::1]:23");
        // Duplicates collapse.
        assert_eq!(parse_endpoints("http://a:1,http://a:1").unwrap().len(), 1);
        for bad in [
            "127.0.0.1:2379",
            "http://127.0.0.1",
            "http://127.0.0.1:0",
            "http://127.0.0.1:65536",
            "http://127.0.0.1:+1",
            "http://127.0.0.1:2379/v3",
            "http://user@h:1",
            "http://h:1?x",
            "http://a..b:1",
            "http://:1",
            "http://[::1:1",
            "http://[zz]:1",
            "http://h\r\nX-Evil: 1:1",
            "https://127.0.0.1:2379",
            "unix:///run/etcd.sock",
            "http://\u{0}:1",
            "http://ä:1",
        ] {
            assert!(parse_endpoints(bad).is_err(), "{bad:?} accepted");
        }
        let many: Vec<String> = (1..=17).map(|p| format!("http://h:{p}")).collect();
        assert!(parse_endpoints(&many.join(",")).is_err());
        assert!(parse_endpoints(&many[..16].join(",")).is_ok());
        let err = parse_endpoints("https://e:2379").unwrap_err();
        assert!(err.contains("not supported yet"), "{err}");
    }

    #[test]
    fn prefixes() {
        assert_eq!(parse_prefix("/drover"), Ok("/drover".into()));
        assert_eq!(parse_prefix("/a/b-c_d"), Ok("/a/b-c_d".into()));
        for bad in [
            "", "/", "drover", "/drover/", "/a b", "/a\u{7}", "/ä", "/a\n",
        ] {
            assert!(parse_prefix(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_prefix(&format!("/{}", "x".repeat(MAX_PREFIX))).is_err());
        assert_eq!(HaSettings::default().leader_key(), "/drover/leader");
    }
}
