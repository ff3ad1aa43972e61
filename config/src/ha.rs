//! The high-availability keys of `[drover-manager]`: `EtcdEndpoints`,
//! `EtcdKeyPrefix`, `EtcdLeaseTTL`, and etcd's mutual TLS,
//! `EtcdTLSCertificate`, `EtcdTLSPrivateKey`, `EtcdTLSCertificateAuthority`
//! (docs/ha.md).
//!
//! Without `EtcdEndpoints` (unset or empty) the manager is alone, as it has
//! always been: nothing of etcd is touched. With it, every manager that
//! names the same endpoints and prefix campaigns for `PREFIX/leader`.
//!
//! * `EtcdEndpoints`: `http://HOST:PORT` or `https://HOST:PORT` items,
//!   separated by commas or spaces, at most [`MAX_ENDPOINTS`], all of one
//!   scheme; HOST is an IP address (`[v6]` in brackets) or a DNS name. No
//!   path, no user.
//! * `EtcdTLSCertificate`, `EtcdTLSPrivateKey`, `EtcdTLSCertificateAuthority`
//!   ([`TLS_KEYS`]): the manager's client certificate and key for etcd, and
//!   the CA bundle etcd's certificate must chain to; the rules of the
//!   manager's own TLS keys ([`crate::tls`]: absolute paths, all three or
//!   none, an empty value unsets). `https://` endpoints need them (etcd's
//!   mutual TLS), and they need `https://` endpoints: TLS is never
//!   half-configured, and never silently plaintext.
//! * `EtcdKeyPrefix` (default `/drover`): starts with `/`, does not end with
//!   one, printable ASCII without spaces, at most [`MAX_PREFIX`] bytes. Two
//!   fleets on one etcd differ by prefix.
//! * `EtcdLeaseTTL` (seconds, default [`DEFAULT_TTL_S`], from
//!   [`MIN_TTL_S`] to [`MAX_TTL_S`]): how long a leader that stopped renewing
//!   keeps the key; a leader steps down on its own clock before that.

use crate::ConfigError;
use crate::tls::{Origin, TlsFiles, TlsKeys};
use crate::value::At;

/// The HA keys, in the order drover.conf(5) lists them.
pub const KEYS: &[&str] = &[
    "EtcdEndpoints",
    "EtcdKeyPrefix",
    "EtcdLeaseTTL",
    "EtcdTLSCertificate",
    "EtcdTLSPrivateKey",
    "EtcdTLSCertificateAuthority",
];

/// The keys of etcd's mutual TLS: certificate, private key, CA bundle.
pub const TLS_KEYS: &[&str] = &[
    "EtcdTLSCertificate",
    "EtcdTLSPrivateKey",
    "EtcdTLSCertificateAuthority",
];

pub const DEFAULT_PREFIX: &str = "/drover";
pub const DEFAULT_TTL_S: u64 = 5;
/// Below two seconds a leader would have to renew more often than a loaded
/// etcd answers reliably.
pub const MIN_TTL_S: u64 = 2;
pub const MAX_TTL_S: u64 = 3600;
pub const MAX_ENDPOINTS: usize = 16;
pub const MAX_PREFIX: usize = 200;

/// One etcd client URL (`http://HOST:PORT` or `https://HOST:PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdEndpoint {
    /// As written, without brackets for IPv6 (what a socket address wants
    /// is [`EtcdEndpoint::authority`]; what etcd's certificate must name).
    pub host: String,
    pub port: u16,
    /// `https://`: TLS with [`HaSettings::tls`].
    pub tls: bool,
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
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.authority())
    }
}

/// The HA settings; [`HaSettings::enabled`] is false without endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    pub endpoints: Vec<EtcdEndpoint>,
    pub key_prefix: String,
    pub lease_ttl_s: u64,
    /// etcd's mutual TLS (`EtcdTLS…`): set exactly when the endpoints are
    /// `https://`.
    pub tls: Option<TlsFiles>,
}

impl Default for HaSettings {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            key_prefix: DEFAULT_PREFIX.to_string(),
            lease_ttl_s: DEFAULT_TTL_S,
            tls: None,
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
        if out.first().is_some_and(|first| first.tls != endpoint.tls) {
            return Err(
                "mixes http:// and https:// endpoints; one etcd cluster speaks one of them".into(),
            );
        }
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
    let example = "(e.g. https://192.0.2.10:2379, http://etcd1.example:2379)";
    let (tls, rest) = if let Some(rest) = item.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = item.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!("'{shown}' is not http(s)://HOST:PORT {example}"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, port) = v6
            .split_once("]:")
            .ok_or_else(|| format!("'{shown}' is not http(s)://HOST:PORT {example}"))?;
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
        tls,
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

/// The HA keys as the layers set them, for the rules [`finish`] applies
/// after the last layer.
#[derive(Debug, Clone)]
pub(crate) struct HaKeys {
    tls: TlsKeys,
    endpoints_at: Option<Origin>,
}

impl Default for HaKeys {
    fn default() -> Self {
        Self {
            tls: TlsKeys::named(TLS_KEYS),
            endpoints_at: None,
        }
    }
}

/// Applies `at` if it is an HA key; `Ok(false)` when it is not one.
pub(crate) fn apply(
    at: At<'_>,
    settings: &mut HaSettings,
    keys: &mut HaKeys,
) -> Result<bool, ConfigError> {
    if keys.tls.apply(at)? {
        return Ok(true);
    }
    match at.entry.key.as_str() {
        "EtcdEndpoints" => {
            settings.endpoints = parse_endpoints(at.value()).map_err(|m| at.err(m))?;
            keys.endpoints_at = Some(Origin::of(at));
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

/// After the last layer: the TLS keys all or none, and set exactly when
/// the endpoints are `https://`. Each error names the key, file and line
/// that contradicts the others.
pub(crate) fn finish(settings: &mut HaSettings, keys: &HaKeys) -> Result<(), ConfigError> {
    settings.tls = keys.tls.finish()?;
    let https = settings.endpoints.iter().any(|e| e.tls);
    match (&settings.tls, https, &keys.endpoints_at) {
        (None, true, Some(at)) => Err(at.err(format!(
            "https:// endpoints need etcd's mutual TLS: set {}, {} and {} (docs/ha.md)",
            TLS_KEYS[0], TLS_KEYS[1], TLS_KEYS[2]
        ))),
        (Some(_), false, _) => {
            let why = if settings.endpoints.is_empty() {
                "EtcdEndpoints is not set"
            } else {
                "EtcdEndpoints lists http:// endpoints (use https://)"
            };
            Err(keys
                .tls
                .first_origin()
                .map(|o| o.err(format!("etcd's TLS keys are for https:// endpoints; {why}")))
                .unwrap_or_else(|| ConfigError::Invalid(why.into())))
        }
        _ => Ok(()),
    }
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
            "https://h:1/x",
            "https://user@h:1",
            "http://a:1,https://b:1",
            "unix:///run/etcd.sock",
            "http://\u{0}:1",
            "http://ä:1",
        ] {
            assert!(parse_endpoints(bad).is_err(), "{bad:?} accepted");
        }
        let many: Vec<String> = (1..=17).map(|p| format!("http://h:{p}")).collect();
        assert!(parse_endpoints(&many.join(",")).is_err());
        assert!(parse_endpoints(&many[..16].join(",")).is_ok());
        let e = parse_endpoints("https://e:2379, https://[::1]:2379").unwrap();
        assert!(e.iter().all(|e| e.tls));
        assert_eq!(e[0].to_string(), "https://e:2379");
        assert_eq!(e[1].to_string(), "https://[::1]:2379");
        let err = parse_endpoints("https://e:2379 http://f:2379").unwrap_err();
        assert!(err.contains("mixes"), "{err}");
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
