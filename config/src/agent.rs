//! Agent settings: section `[drover-agent]`.
//!
//! Layering: every layer overrides the keys it names and nothing else. An
//! empty value resets `NodeName` (to the host name) and `ControllerAddress`
//! (to unset); for every other key it is an error.
//!
//! Invariants after loading: `node_name` is a valid
//! [`drover_protocol::NodeName`] when a layer set it; otherwise it is the host
//! name read from `/proc/sys/kernel/hostname`, unvalidated, because the
//! agent's `-n NAME` may still override it (the agent validates the final
//! name and says to set `NodeName=` when the host name cannot serve); `controller_host` is an IP
//! literal or a syntactically valid host name; `controller_address`, when
//! set, is a valid `tcp:host=H,port=P`. Millisecond values are capped at one
//! day ([`crate::manager::MAX_MS`]) so timer arithmetic can never overflow.
//!
//! Cross-key rules, checked after the last layer: the TLS file keys are
//! all-or-nothing (see [`crate::tls`]), and `TLSControllerName` needs them.
//! `ControllerHeartbeatThreshold` must exceed `HeartbeatInterval` when both
//! are > 0 (the manager has the same rule for its own pair; see
//! [`check_heartbeat`]). At run time the threshold is measured against the
//! interval the *manager* announces, which this file cannot see: the link
//! raises it to fit that interval, so no accepted pair of settings makes a
//! node flap (`agent::link::heartbeat`).
//!
//! BlueChi's section `[bluechi-agent]` takes the same keys
//! (`crate::sections`). The one BlueChi value drover cannot serve,
//! `ControllerAddress=unix:path=…` (drover agents dial TCP only), is an error
//! in `[drover-agent]` and, in `[bluechi-agent]`, a warning naming the file,
//! line and key: the key is ignored and `ControllerHost`/`ControllerPort`
//! apply, so a BlueChi file that worked still starts the agent.
//!
//! With TLS the agent dials the manager over TLS only (there is no plaintext
//! fallback to downgrade to) and requires the manager's certificate to name
//! [`AgentConfig::tls_server_name`].

use crate::health::CheckSpec;
use crate::ini::Document;
use crate::layers::{Layered, LoadReport, apply_sources};
use crate::manager::MAX_MS;
use crate::sections::{self, Daemon, Dialect, Kind};
use crate::shared::{self, LinkSettings};
use crate::tls::{Origin, TlsFiles, TlsKeys};
use crate::unit_file::UnitEntry;
use crate::value::{self, At};
use crate::{ConfigError, LoggingConfig, Sources};
use drover_protocol::NodeName;
use std::ffi::OsString;
use std::path::Path;

/// Section of the agent's keys.
pub const SECTION: &str = sections::AGENT;

/// BlueChi's name of the same section.
pub const BLUECHI_SECTION: &str = sections::AGENT_BLUECHI;

/// Where the host name comes from when `NodeName` is not set.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// The keys of `[drover-agent]` only the agent reads.
const OWN_KEYS: &[&str] = &[
    "NodeName",
    "ControllerHost",
    "ControllerPort",
    "ControllerAddress",
    "HeartbeatInterval",
    "ControllerHeartbeatThreshold",
    "ConnectionRetryCountUntilQuiet",
    "TLSControllerName",
    "AdvertiseAddress",
    "MetricsListenAddress",
];

/// Every key of `[drover-agent]`: its own, then those both daemons read
/// ([`shared::KEYS`]). drover.conf(5) documents each; a test keeps the list
/// equal to the keys the loader matches.
pub const KEYS: &[&str] =
    &shared::key_list::<{ OWN_KEYS.len() + shared::KEYS.len() }>(&[OWN_KEYS, shared::KEYS]);

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// `NodeName` (default: the host name).
    pub node_name: String,
    /// `ControllerHost` (default `127.0.0.1`): IP literal or host name,
    /// re-resolved on every connection attempt. The first of the list when
    /// the key names several managers ([`AgentConfig::more_controller_hosts`]).
    pub controller_host: String,
    /// The other hosts of a `ControllerHost=` list (the managers of a
    /// high-availability group, all on `ControllerPort`), in order, without
    /// duplicates; at most [`MAX_CONTROLLERS`] hosts in all.
    pub more_controller_hosts: Vec<String>,
    /// `ControllerPort` (default 842).
    pub controller_port: u16,
    /// `ControllerAddress`: `tcp:host=H,port=P` overrides host and port;
    /// a list of them (separated by spaces, or by commas before `tcp:`)
    /// names the managers of a high-availability group.
    pub controller_address: Option<String>,
    /// `HeartbeatInterval` ms (default 2000); also the base of the reconnect backoff. 0 disables heartbeats.
    pub heartbeat_interval_ms: u64,
    /// `ControllerHeartbeatThreshold` ms: drop the link when nothing came from
    /// the manager for this long. drover default 6000 (BlueChi: 0 = off). 0 disables.
    pub controller_heartbeat_threshold_ms: u64,
    /// `ConnectionRetryCountUntilQuiet` (default 10).
    pub connection_retry_count_until_quiet: u32,
    /// `TCPKeepAliveTime`, `TCPKeepAliveInterval`, `TCPKeepAliveCount`,
    /// `IPReceiveErrors`: the agent link's TCP settings (the same keys on
    /// both ends, [`crate::shared`]).
    pub link: LinkSettings,
    /// `TLSCertificate`, `TLSPrivateKey`, `TLSCertificateAuthority`,
    /// `TLSRevocationList`: dial the manager over mutual TLS when set.
    pub tls: Option<TlsFiles>,
    /// `TLSControllerName`: the name the manager's certificate must carry
    /// (DNS name or IP literal). Unset: see [`AgentConfig::tls_server_name`].
    pub tls_controller_name: Option<String>,
    /// `LogLevel`, `LogTarget`, `LogIsQuiet`.
    pub logging: LoggingConfig,
    /// `AdvertiseAddress` (drover): the address other programs should use
    /// to reach this node's services, told to the manager at registration
    /// (discovery answers carry it). `None`: the manager uses the address it
    /// sees the agent's connection come from. Never unspecified
    /// (`0.0.0.0`, `::`) nor multicast ([`parse_advertise_address`]).
    pub advertise_address: Option<std::net::IpAddr>,
    /// `MetricsListenAddress` (drover): where the agent serves its own
    /// Prometheus figures; the manager's key and rules
    /// ([`crate::metrics::parse_listen`]). `None` (default): no endpoint,
    /// no listener.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `[health NAME]` sections: the node's own checks ([`crate::health`]),
    /// by name, at most [`drover_protocol::health::NODE_CHECKS_MAX`].
    pub node_checks: Vec<(String, CheckSpec)>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            controller_host: "127.0.0.1".into(),
            more_controller_hosts: Vec::new(),
            controller_port: crate::manager::DEFAULT_PORT,
            controller_address: None,
            heartbeat_interval_ms: 2000,
            controller_heartbeat_threshold_ms: 6000,
            connection_retry_count_until_quiet: 10,
            link: LinkSettings::default(),
            tls: None,
            tls_controller_name: None,
            advertise_address: None,
            metrics_listen: None,
            node_checks: Vec::new(),
            logging: LoggingConfig::default(),
        }
    }
}

impl AgentConfig {
    /// Loads every layer of `sources` over the defaults; `NodeName` falls
    /// back to the host name.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        Self::load_report(sources).map(|(c, _)| c)
    }

    /// [`AgentConfig::load`], with which files were read and the warnings.
    pub fn load_report(sources: &Sources) -> Result<(Self, LoadReport), ConfigError> {
        Self::load_with(sources, &|var| std::env::var_os(var), &read_hostname)
    }

    /// [`AgentConfig::load_report`] with the environment and the host name injected.
    pub(crate) fn load_with(
        sources: &Sources,
        env: &dyn Fn(&str) -> Option<OsString>,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<(Self, LoadReport), ConfigError> {
        let mut b = Builder::default();
        let files = apply_sources(&mut b, sources, env)?;
        let warnings = std::mem::take(&mut b.warnings);
        Ok((b.finish(hostname)?, LoadReport { files, warnings }))
    }

    /// Parses one file's text over the defaults (tests, `-c` checks); errors
    /// name the file `<string>`. `NodeName` falls back to the host name.
    pub fn parse_str(text: &str) -> Result<Self, ConfigError> {
        Self::parse_str_with(text, &read_hostname)
    }

    pub(crate) fn parse_str_with(
        text: &str,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let doc = crate::ini::parse(Path::new("<string>"), text)?;
        let mut b = Builder::default();
        b.apply(&doc)?;
        b.finish(hostname)
    }

    /// The (first) manager's host and port after `ControllerAddress` is applied.
    pub fn controller_endpoint(&self) -> Result<(String, u16), ConfigError> {
        let mut all = self.controller_endpoints()?;
        Ok(all.swap_remove(0))
    }

    /// Every manager's host and port after `ControllerAddress` is applied
    /// (never empty): one, or the managers of a high-availability group.
    pub fn controller_endpoints(&self) -> Result<Vec<(String, u16)>, ConfigError> {
        match &self.controller_address {
            Some(addr) => parse_controller_addresses(addr)
                .map_err(|m| ConfigError::Invalid(format!("ControllerAddress: {m}"))),
            None => Ok(std::iter::once(&self.controller_host)
                .chain(&self.more_controller_hosts)
                .map(|h| (h.clone(), self.controller_port))
                .collect()),
        }
    }

    /// The name the manager's TLS certificate must carry: `TLSControllerName`,
    /// else the host the agent dials (`ControllerAddress`'s host, else
    /// `ControllerHost`, as command-line flags left them). An IP literal is
    /// matched against the certificate's IP address SANs.
    pub fn tls_server_name(&self) -> String {
        match &self.tls_controller_name {
            Some(name) => name.clone(),
            None => self
                .controller_endpoint()
                .map(|(host, _)| host)
                .unwrap_or_else(|_| self.controller_host.clone()),
        }
    }
}

/// The config under construction, with where the keys checked after the
/// last layer were set.
#[derive(Default)]
struct Builder {
    cfg: AgentConfig,
    tls: TlsKeys,
    controller_name_at: Option<Origin>,
    warnings: Vec<String>,
    /// `[health NAME]` entries of every layer, in order, by name (first
    /// appearance order).
    node_checks: Vec<(String, Vec<UnitEntry>)>,
}

impl Builder {
    fn finish(
        self,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<AgentConfig, ConfigError> {
        let mut cfg = self.cfg;
        if cfg.node_name.is_empty() {
            // Not validated here: `drover-agent -n NAME` overrides it after
            // loading, and a host name like `my_host` must not stop that. The
            // binary validates the final name (see `agent::cli::settings`).
            cfg.node_name = hostname()?;
        }
        check_heartbeat(
            cfg.heartbeat_interval_ms,
            cfg.controller_heartbeat_threshold_ms,
        )
        .map_err(ConfigError::Invalid)?;
        cfg.tls = self.tls.finish()?;
        if self.node_checks.len() > drover_protocol::health::NODE_CHECKS_MAX {
            return Err(ConfigError::Invalid(format!(
                "{} [health NAME] sections, at most {} allowed",
                self.node_checks.len(),
                drover_protocol::health::NODE_CHECKS_MAX
            )));
        }
        for (name, entries) in &self.node_checks {
            let spec = crate::health::node_check(name, entries).map_err(ConfigError::Invalid)?;
            cfg.node_checks.push((name.clone(), spec));
        }
        if cfg.tls.is_none()
            && cfg.tls_controller_name.is_some()
            && let Some(at) = &self.controller_name_at
        {
            return Err(
                at.err("needs TLS: set TLSCertificate, TLSPrivateKey and TLSCertificateAuthority")
            );
        }
        Ok(cfg)
    }

    fn apply_key(&mut self, at: At<'_>, dialect: Dialect) -> Result<(), ConfigError> {
        let cfg = &mut self.cfg;
        if shared::apply(at, &mut cfg.link, &mut self.tls, &mut cfg.logging)? {
            return Ok(());
        }
        let this = &mut self.cfg;
        match at.entry.key.as_str() {
            "TLSControllerName" => {
                this.tls_controller_name = if at.value().is_empty() {
                    None
                } else {
                    check_host(at.value()).map_err(|m| at.err(m))?;
                    Some(at.value().to_string())
                };
                self.controller_name_at = Some(Origin::of(at));
            }
            "NodeName" => {
                this.node_name = if at.value().is_empty() {
                    String::new()
                } else {
                    NodeName::new(at.value())
                        .map_err(|e| at.err(e.to_string()))?
                        .to_string()
                }
            }
            "ControllerHost" => {
                let mut hosts = parse_controller_hosts(at.value()).map_err(|m| at.err(m))?;
                this.controller_host = hosts.remove(0);
                this.more_controller_hosts = hosts;
            }
            "ControllerPort" => this.controller_port = at.port()?,
            "ControllerAddress" => {
                this.controller_address = if at.value().is_empty() {
                    None
                } else if dialect == Dialect::BlueChi && at.value().starts_with("unix:") {
                    self.warnings.push(at.warning(format!(
                        "'{}': drover agents connect over TCP only; ignored, \
                         ControllerHost and ControllerPort apply (set \
                         ControllerAddress=tcp:host=HOST,port=PORT in [drover-agent] to choose)",
                        at.value()
                    )));
                    None
                } else {
                    parse_controller_addresses(at.value()).map_err(|m| at.err(m))?;
                    Some(at.value().to_string())
                }
            }
            "AdvertiseAddress" => {
                this.advertise_address =
                    parse_advertise_address(at.value()).map_err(|m| at.err(m))?
            }
            "MetricsListenAddress" => {
                this.metrics_listen =
                    crate::metrics::parse_listen(at.value()).map_err(|m| at.err(m))?
            }
            "HeartbeatInterval" => this.heartbeat_interval_ms = at.number(0, MAX_MS)?,
            "ControllerHeartbeatThreshold" => {
                this.controller_heartbeat_threshold_ms = at.number(0, MAX_MS)?
            }
            "ConnectionRetryCountUntilQuiet" => {
                this.connection_retry_count_until_quiet = at.u32_in(0, u32::MAX)?
            }
            _ => return Err(value::unknown_key(at, Daemon::Agent.section(dialect), KEYS)),
        }
        Ok(())
    }
}

/// An `AdvertiseAddress` value: an IPv4 or IPv6 literal (no brackets, no
/// port, no host name) that can reach a host, so neither unspecified nor
/// multicast; empty = unset.
pub fn parse_advertise_address(value: &str) -> Result<Option<std::net::IpAddr>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    let shown: String = value
        .chars()
        .take(80)
        .flat_map(char::escape_default)
        .collect();
    let ip = value.parse::<std::net::IpAddr>().map_err(|_| {
        format!("'{shown}' is not an IPv4 or IPv6 address (e.g. 192.0.2.7, 2001:db8::7)")
    })?;
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(format!(
            "'{shown}' cannot reach a host: give the node's own address (e.g. 192.0.2.7)"
        ));
    }
    Ok(Some(ip))
}

impl Builder {
    /// Gathers a `[health NAME]` section's entries (checked once every layer
    /// is read, so a drop-in may change one key of a check).
    fn node_check(
        &mut self,
        doc: &Document,
        section: &crate::ini::Section,
        name: &str,
    ) -> Result<(), ConfigError> {
        if !crate::health::valid_node_check_name(name) {
            return Err(ConfigError::Syntax {
                path: doc.path.clone(),
                line: section.line,
                message: format!(
                    "section [{}]: a node check's name is 1 to {} of A-Z a-z 0-9 _ . -",
                    section.name,
                    drover_protocol::health::NODE_CHECK_NAME_MAX
                ),
            });
        }
        let entries = section.entries.iter().map(|e| UnitEntry {
            path: doc.path.clone(),
            line: e.line,
            key: e.key.clone(),
            value: e.value.clone(),
        });
        match self.node_checks.iter_mut().find(|(n, _)| n == name) {
            Some((_, known)) => known.extend(entries),
            None => self.node_checks.push((name.to_owned(), entries.collect())),
        }
        Ok(())
    }
}

impl Layered for Builder {
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError> {
        for section in &doc.sections {
            // The agent has no `[node NAME]`; `[health NAME]` is a node check.
            let dialect = match sections::classify(doc, section, Daemon::Agent)? {
                Kind::Main(dialect) => dialect,
                Kind::Health(name) => {
                    self.node_check(doc, section, name)?;
                    continue;
                }
                Kind::Node(_) => continue,
            };
            for entry in &section.entries {
                self.apply_key(
                    At {
                        path: &doc.path,
                        entry,
                    },
                    dialect,
                )?;
            }
        }
        Ok(())
    }

    fn logging_mut(&mut self) -> &mut LoggingConfig {
        &mut self.cfg.logging
    }
}

fn read_hostname() -> Result<String, ConfigError> {
    std::fs::read_to_string(HOSTNAME_FILE)
        .map(|s| s.trim().to_string())
        .map_err(|source| ConfigError::Read {
            path: HOSTNAME_FILE.into(),
            source,
        })
}

/// The agent's heartbeat pair: a `ControllerHeartbeatThreshold` that is not
/// larger than `HeartbeatInterval` (both > 0) is refused, as the manager
/// refuses the same mistake for its own pair; 0 disables either. The binary
/// checks again after `-i` replaced the interval.
pub fn check_heartbeat(interval_ms: u64, threshold_ms: u64) -> Result<(), String> {
    if interval_ms > 0 && threshold_ms > 0 && threshold_ms <= interval_ms {
        return Err(format!(
            "ControllerHeartbeatThreshold ({threshold_ms} ms) must be greater than \
             HeartbeatInterval ({interval_ms} ms), or 0 to disable it: otherwise the agent \
             drops a healthy manager between two heartbeats"
        ));
    }
    Ok(())
}

pub use crate::host::check_host;

/// Managers an agent follows at most (a `ControllerHost=` or
/// `ControllerAddress=` list).
pub const MAX_CONTROLLERS: usize = 16;

/// Parses a `ControllerHost` value: one host, or a list separated by commas
/// and/or spaces (duplicates dropped, at most [`MAX_CONTROLLERS`]).
pub fn parse_controller_hosts(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
        check_host(item)?;
        if !out.iter().any(|h| h == item) {
            out.push(item.to_string());
        }
        if out.len() > MAX_CONTROLLERS {
            return Err(format!("more than {MAX_CONTROLLERS} managers"));
        }
    }
    if out.is_empty() {
        return Err("no host given".into());
    }
    Ok(out)
}

/// Parses a `ControllerAddress` value: one `tcp:host=H,port=P`, or a list
/// of them separated by spaces and/or commas (a new address starts at each
/// `TRANSPORT:`), duplicates dropped, at most [`MAX_CONTROLLERS`].
pub fn parse_controller_addresses(value: &str) -> Result<Vec<(String, u16)>, String> {
    // A piece that starts with `letters:` begins a new address; the others
    // (`host=…`, `port=…`) belong to the one before.
    let starts_address = |piece: &str| {
        piece
            .split_once(':')
            .is_some_and(|(t, _)| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphabetic()))
    };
    let mut addresses: Vec<String> = Vec::new();
    for piece in value.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
        match addresses.last_mut() {
            Some(last) if !starts_address(piece) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => addresses.push(piece.to_string()),
        }
    }
    let mut out: Vec<(String, u16)> = Vec::new();
    for address in &addresses {
        let endpoint = parse_controller_address(address)?;
        if !out.contains(&endpoint) {
            out.push(endpoint);
        }
        if out.len() > MAX_CONTROLLERS {
            return Err(format!("more than {MAX_CONTROLLERS} managers"));
        }
    }
    if out.is_empty() {
        return Err("no address given; expected tcp:host=HOST,port=PORT".into());
    }
    Ok(out)
}

/// Parses a `ControllerAddress`: `tcp:host=H,port=P` (parameters in either
/// order, both required, nothing else), the only transport drover speaks.
/// Returns the host and port, or a message saying what is wrong.
pub fn parse_controller_address(addr: &str) -> Result<(String, u16), String> {
    let usage = "expected tcp:host=HOST,port=PORT";
    let Some((transport, params)) = addr.split_once(':') else {
        return Err(format!("'{addr}': {usage}"));
    };
    if transport == "unix" {
        return Err(format!(
            "'{addr}': unix: addresses are not supported by drover yet; {usage}"
        ));
    }
    if transport != "tcp" {
        return Err(format!(
            "'{addr}': unknown transport '{transport}'; {usage}"
        ));
    }
    let mut host: Option<&str> = None;
    let mut port: Option<u16> = None;
    for param in params.split(',') {
        let Some((k, v)) = param.split_once('=') else {
            return Err(format!(
                "'{addr}': parameter '{param}' is not KEY=VALUE; {usage}"
            ));
        };
        match k {
            "host" if host.is_none() => {
                check_host(v)?;
                host = Some(v);
            }
            "port" if port.is_none() => {
                let p = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                    v.parse::<u16>().ok().filter(|&p| p != 0)
                } else {
                    None
                };
                port = Some(p.ok_or_else(|| format!("'{addr}': port '{v}' is not in 1..=65535"))?);
            }
            "host" | "port" => return Err(format!("'{addr}': '{k}' given twice")),
            _ => return Err(format!("'{addr}': unknown parameter '{k}'; {usage}")),
        }
    }
    match (host, port) {
        (Some(h), Some(p)) => Ok((h.to_string(), p)),
        (None, _) => Err(format!("'{addr}': host= is missing; {usage}")),
        (_, None) => Err(format!("'{addr}': port= is missing; {usage}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{TempDir, config_root_env};
    use crate::{LogLevel, LogTarget};
    use std::collections::HashMap;
    use std::path::PathBuf;

    fn host_ok() -> Result<String, ConfigError> {
        Ok("testhost".into())
    }

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse_str_with(text, &host_ok)
    }

    fn value_err(err: ConfigError, line: usize, key: &str) -> String {
        match err {
            ConfigError::Value {
                line: l,
                key: k,
                message,
                ..
            } if l == line && k == key => message,
            other => panic!("expected line {line} key {key}, got {other:?} ({other})"),
        }
    }

    fn defaults() -> AgentConfig {
        AgentConfig {
            node_name: "testhost".into(),
            ..AgentConfig::default()
        }
    }

    #[test]
    fn controller_lists_name_several_managers_and_one_is_as_before() {
        let ends = |text: &str| parse(text).unwrap().controller_endpoints().unwrap();
        let one = |h: &str, p: u16| (h.to_string(), p);
        // One value: exactly as before.
        let c = parse("[drover-agent]\nControllerHost=mgr.example\n").unwrap();
        assert_eq!(c.controller_host, "mgr.example");
        assert!(c.more_controller_hosts.is_empty());
        assert_eq!(c.controller_endpoint().unwrap(), one("mgr.example", 842));
        assert_eq!(ends(""), [one("127.0.0.1", 842)]);
        // Commas and/or spaces; duplicates dropped; the port applies to all.
        assert_eq!(
            ends(
                "[drover-agent]\nControllerHost=a.example, 10.0.0.2 ,,::1 a.example\nControllerPort=900\n"
            ),
            [one("a.example", 900), one("10.0.0.2", 900), one("::1", 900)]
        );
        // ControllerAddress: spaces, or commas before a new `tcp:`.
        let two = [one("127.0.0.1", 8420), one("::1", 8421)];
        for value in [
            "tcp:host=127.0.0.1,port=8420 tcp:host=::1,port=8421",
            "tcp:host=127.0.0.1,port=8420,tcp:host=::1,port=8421",
            "tcp:host=127.0.0.1,port=8420, tcp:port=8421,host=::1",
            "  tcp:host=127.0.0.1,port=8420\ttcp:host=::1,port=8421 tcp:host=127.0.0.1,port=8420",
        ] {
            assert_eq!(
                ends(&format!("[drover-agent]\nControllerAddress={value}\n")),
                two,
                "{value}"
            );
        }
        assert_eq!(
            ends("[drover-agent]\nControllerAddress=tcp:host=h,port=1\n"),
            [one("h", 1)]
        );
        // The first host is what the TLS name follows without TLSControllerName.
        let c = parse("[drover-agent]\nControllerHost=b.example a.example\n").unwrap();
        assert_eq!(c.tls_server_name(), "b.example");
    }

    #[test]
    fn garbage_controller_lists_are_refused_with_what_is_wrong() {
        for (value, says) in [
            (",", "no host given"),
            (" , ", "no host given"),
            ("a.example,b..example", "'b..example' is neither"),
            ("a.example;b.example", "'a.example;b.example' is neither"),
            ("tcp:host=a,port=1", "'tcp:host=a' is neither"),
        ] {
            let err = parse(&format!("[drover-agent]\nControllerHost={value}\n")).unwrap_err();
            let message = value_err(err, 2, "ControllerHost");
            assert!(message.contains(says), "{value:?}: {message}");
        }
        let many: Vec<String> = (0..=MAX_CONTROLLERS).map(|i| format!("h{i}")).collect();
        let err = parse(&format!(
            "[drover-agent]\nControllerHost={}\n",
            many.join(",")
        ))
        .unwrap_err();
        assert!(value_err(err, 2, "ControllerHost").contains("more than 16 managers"));
        for (value, says) in [
            (",", "no address given"),
            ("tcp:host=a,port=1 port=2", "'port' given twice"),
            ("tcp:host=a,port=1 tcp:host=b", "port= is missing"),
            ("tcp:host=a,port=1 h:842", "unknown transport 'h'"),
            ("port=1 tcp:host=a,port=1", "'port=1'"),
            (
                "tcp:host=a,port=1 unix:path=/run/x",
                "unix: addresses are not supported",
            ),
            (
                "tcp:host=a,port=1 tcp:host=a b,port=1",
                "parameter 'b' is not KEY=VALUE",
            ),
        ] {
            let err = parse(&format!("[drover-agent]\nControllerAddress={value}\n")).unwrap_err();
            let message = value_err(err, 2, "ControllerAddress");
            assert!(message.contains(says), "{value:?}: {message}");
        }
        // A refused value changes nothing: the layer's earlier value stays.
        let c = parse("[drover-agent]\nControllerHost=a.example b.example\n").unwrap();
        assert_eq!(c.more_controller_hosts, ["b.example"]);
    }

    #[test]
    fn node_name_defaults_to_host_name() {
        assert_eq!(parse("").unwrap(), defaults());
        let c = parse("[drover-agent]\nNodeName=web1\n").unwrap();
        assert_eq!(c.node_name, "web1");
        // NodeName= resets to the host name.
        let c = parse("[drover-agent]\nNodeName=web1\nNodeName=\n").unwrap();
        assert_eq!(c.node_name, "testhost");
        // An unusable host name is kept as is: `-n NAME` may still override
        // it, and the agent validates the final name.
        let bad_host = || Ok::<_, ConfigError>("my_host".to_string());
        let c = AgentConfig::parse_str_with("", &bad_host).unwrap();
        assert_eq!(c.node_name, "my_host");
        let c = AgentConfig::parse_str_with("[drover-agent]\nNodeName=ok\n", &bad_host).unwrap();
        assert_eq!(c.node_name, "ok");
        // The real host name is read when needed (this machine's is valid).
        let real = AgentConfig::parse_str("").unwrap();
        let want = std::fs::read_to_string(HOSTNAME_FILE).unwrap();
        assert_eq!(real.node_name, want.trim());
    }

    #[test]
    fn tls_keys_and_the_controller_name() {
        let tls = "[drover-agent]\n\
                   TLSCertificate=/etc/drover/tls/node1.pem\n\
                   TLSPrivateKey=/etc/drover/tls/node1.key\n\
                   TLSCertificateAuthority=/etc/drover/tls/ca.pem\n";
        let c = parse(tls).unwrap();
        let files = c.tls.clone().unwrap();
        assert_eq!(files.certificate, Path::new("/etc/drover/tls/node1.pem"));
        assert_eq!(files.private_key, Path::new("/etc/drover/tls/node1.key"));
        assert_eq!(files.ca_bundle, Path::new("/etc/drover/tls/ca.pem"));
        assert_eq!(files.crl, None);
        // The name defaults to the host dialled, as flags or ControllerAddress leave it.
        assert_eq!(c.tls_server_name(), "127.0.0.1");
        let mut c2 = parse(&format!("{tls}ControllerHost=mgr.example\n")).unwrap();
        assert_eq!(c2.tls_server_name(), "mgr.example");
        c2.controller_host = "from-flag.example".into();
        assert_eq!(c2.tls_server_name(), "from-flag.example");
        let c = parse(&format!(
            "{tls}ControllerHost=a.example\nControllerAddress=tcp:host=10.1.2.3,port=842\n"
        ))
        .unwrap();
        assert_eq!(c.tls_server_name(), "10.1.2.3");
        let c = parse(&format!(
            "{tls}ControllerHost=10.1.2.3\nTLSControllerName=manager.fleet\n\
             TLSRevocationList=/etc/drover/tls/crl.pem\n"
        ))
        .unwrap();
        assert_eq!(c.tls_server_name(), "manager.fleet");
        assert!(c.tls.unwrap().crl.is_some());

        // All or nothing, and the controller name needs TLS.
        let msg = value_err(
            parse("[drover-agent]\nNodeName=n1\nTLSCertificateAuthority=/ca.pem\n").unwrap_err(),
            3,
            "TLSCertificateAuthority",
        );
        assert!(
            msg.ends_with("TLSCertificate and TLSPrivateKey are not set"),
            "{msg}"
        );
        let msg = value_err(
            parse("[drover-agent]\nTLSControllerName=manager.fleet\n").unwrap_err(),
            2,
            "TLSControllerName",
        );
        assert!(msg.starts_with("needs TLS"), "{msg}");
        // Unset again, it is fine.
        parse("[drover-agent]\nTLSControllerName=m\nTLSControllerName=\n").unwrap();
        for (key, value, want) in [
            ("TLSControllerName", "not a name!", "neither an IP address"),
            ("TLSCertificate", "node1.pem", "not an absolute path"),
            ("TLSPrivateKey", "/etc/drover/tls/", "names a directory"),
        ] {
            let msg = value_err(
                parse(&format!("[drover-agent]\n{key}={value}\n")).unwrap_err(),
                2,
                key,
            );
            assert!(msg.contains(want), "{key}={value}: {msg}");
        }
    }

    #[test]
    fn every_key() {
        let c = parse(
            "[drover-agent]\n\
             NodeName=n-1.example\n\
             ControllerHost=manager.example.com\n\
             ControllerPort=9000\n\
             ControllerAddress=tcp:port=7,host=10.0.0.1\n\
             HeartbeatInterval=0\n\
             ControllerHeartbeatThreshold=12000\n\
             ConnectionRetryCountUntilQuiet=4294967295\n\
             TCPKeepAliveTime=30\n\
             TCPKeepAliveInterval=0\n\
             TCPKeepAliveCount=0\n\
             IPReceiveErrors=FALSE\n\
             LogLevel=WARN\n\
             LogTarget=stderr\n\
             LogIsQuiet=0\n",
        )
        .unwrap();
        assert_eq!(c.node_name, "n-1.example");
        assert_eq!(c.controller_host, "manager.example.com");
        assert_eq!(c.controller_port, 9000);
        assert_eq!(
            c.controller_endpoint().unwrap(),
            ("10.0.0.1".to_string(), 7)
        );
        assert_eq!(c.heartbeat_interval_ms, 0);
        assert_eq!(c.controller_heartbeat_threshold_ms, 12000);
        assert_eq!(c.connection_retry_count_until_quiet, u32::MAX);
        assert_eq!(
            (
                c.link.keepalive_time_s,
                c.link.keepalive_interval_s,
                c.link.keepalive_count
            ),
            (30, 0, 0)
        );
        assert!(!c.link.ip_receive_errors);
        assert_eq!(
            c.logging,
            LoggingConfig {
                level: LogLevel::Warn,
                target: LogTarget::Stderr,
                quiet: false
            }
        );
        // Without ControllerAddress the endpoint is host and port.
        let c = parse("[drover-agent]\nControllerHost=::1\nControllerPort=5\n").unwrap();
        assert_eq!(c.controller_endpoint().unwrap(), ("::1".to_string(), 5));
        // ControllerAddress= unsets an earlier one.
        let c = parse("[drover-agent]\nControllerAddress=tcp:host=a,port=1\nControllerAddress=\n")
            .unwrap();
        assert_eq!(c.controller_address, None);
    }

    #[test]
    fn controller_address_forms() {
        assert_eq!(
            parse_controller_address("tcp:host=h.example,port=842"),
            Ok(("h.example".to_string(), 842))
        );
        assert_eq!(
            parse_controller_address("tcp:port=1,host=::1"),
            Ok(("::1".to_string(), 1))
        );
        for (bad, want) in [
            ("unix:path=/run/drover.sock", "not supported"),
            ("tcp:host=h", "port= is missing"),
            ("tcp:port=842", "host= is missing"),
            ("tcp:host=h,port=0", "1..=65535"),
            ("tcp:host=h,port=65536", "1..=65535"),
            ("tcp:host=h,port=+1", "1..=65535"),
            ("tcp:host=h,port=1,port=2", "given twice"),
            ("tcp:host=h,port=1,family=ipv4", "unknown parameter"),
            ("tcp:host=h,port=1,", "not KEY=VALUE"),
            ("tcp:host=bad host,port=1", "valid host name"),
            ("udp:host=h,port=1", "unknown transport"),
            ("h:842", "unknown transport"),
            ("", "expected tcp:"),
        ] {
            let err = parse_controller_address(bad).unwrap_err();
            assert!(err.contains(want), "{bad:?}: {err}");
            let text = format!("[drover-agent]\nControllerAddress={bad}\n");
            // In a file a trailing comma ends a list item: harmless there.
            if !bad.is_empty() && !bad.ends_with(',') {
                value_err(parse(&text).unwrap_err(), 2, "ControllerAddress");
            }
        }
        // A bad address set by code (not by a file) is caught by controller_endpoint.
        let c = AgentConfig {
            controller_address: Some("unix:path=/x".into()),
            ..defaults()
        };
        assert!(matches!(
            c.controller_endpoint(),
            Err(ConfigError::Invalid(m)) if m.contains("ControllerAddress")
        ));
    }

    #[test]
    fn advertise_address() {
        let c = parse("[drover-agent]\nAdvertiseAddress=192.0.2.7\n").unwrap();
        assert_eq!(c.advertise_address, Some("192.0.2.7".parse().unwrap()));
        let c = parse("[drover-agent]\nAdvertiseAddress=2001:db8::7\n").unwrap();
        assert_eq!(c.advertise_address, Some("2001:db8::7".parse().unwrap()));
        let c = parse("[drover-agent]\nAdvertiseAddress=2001:db8::7\nAdvertiseAddress=\n").unwrap();
        assert_eq!(c.advertise_address, None, "empty resets");
    }

    #[test]
    fn metrics_listen_address_follows_the_managers_rules() {
        assert_eq!(defaults().metrics_listen, None, "off by default");
        let c = parse("[drover-agent]\nMetricsListenAddress=9843\n").unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9843".parse().unwrap()));
        let c = parse("[drover-agent]\nMetricsListenAddress=[::]:9843\n").unwrap();
        assert_eq!(c.metrics_listen, Some("[::]:9843".parse().unwrap()));
        let c =
            parse("[drover-agent]\nMetricsListenAddress=9843\nMetricsListenAddress=\n").unwrap();
        assert_eq!(c.metrics_listen, None, "empty switches it off again");
        // The manager's per-node switch is the manager's alone.
        value_err(
            parse("[drover-agent]\nMetricsPerNode=false\n").unwrap_err(),
            2,
            "MetricsPerNode",
        );
    }

    #[test]
    fn bad_values_name_line_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("NodeName", "has_underscore", "has_underscore"),
            ("NodeName", "-lead", "-lead"),
            ("ControllerHost", "", "no host given"),
            ("ControllerHost", "a b$", "neither"),
            ("ControllerHost", "-x.example", "neither"),
            ("ControllerHost", "a..b", "neither"),
            ("ControllerPort", "0", "out of range"),
            ("ControllerPort", "8 42", "not a number"),
            ("AdvertiseAddress", "node1.example", "not an IPv4 or IPv6"),
            ("AdvertiseAddress", "[::1]", "not an IPv4 or IPv6"),
            ("AdvertiseAddress", "192.0.2.7:80", "not an IPv4 or IPv6"),
            ("AdvertiseAddress", "192.0.2.256", "not an IPv4 or IPv6"),
            ("AdvertiseAddress", "0.0.0.0", "cannot reach a host"),
            ("AdvertiseAddress", "::", "cannot reach a host"),
            ("AdvertiseAddress", "224.0.0.1", "cannot reach a host"),
            ("MetricsListenAddress", "localhost:9843", "is not PORT"),
            ("MetricsListenAddress", "0", "port 0"),
            ("MetricsListenAddress", "65536", "out of range"),
            ("MetricsListenAddress", "[::1]:0", "port 0"),
            ("MetricsListenAddress", "9843 # on", "is not PORT"),
            ("MetricsListenAddress", "\u{1}", "is not PORT"),
            ("HeartbeatInterval", "2s", "not a number"),
            (
                "ControllerHeartbeatThreshold",
                "99999999999",
                "out of range",
            ),
            (
                "ConnectionRetryCountUntilQuiet",
                "4294967296",
                "out of range",
            ),
            ("TCPKeepAliveInterval", "40000", "out of range"),
            ("IPReceiveErrors", "yesno", "not a boolean"),
            ("LogLevel", "Info", "not a log level"),
            ("LogTarget", "stderr_full", "not a log target"),
        ];
        for (key, value, want) in cases {
            let text = format!("[drover-agent]\n\n{key}={value}\n");
            let msg = value_err(parse(&text).unwrap_err(), 3, key);
            assert!(msg.contains(want), "{key}={value}: {msg}");
        }
    }

    #[test]
    fn unknown_keys_and_sections() {
        let err = parse("[drover-agent]\nNodeName=a\nControllerHots=b\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "<string>:3: key 'ControllerHots': unknown key in [drover-agent]"
        );
        // Manager-only keys are unknown here.
        value_err(
            parse("[drover-agent]\nAllowedNodeNames=a\n").unwrap_err(),
            2,
            "AllowedNodeNames",
        );
        // BlueChi's section name is the same section.
        assert_eq!(
            parse("[bluechi-agent]\nNodeName=a\n").unwrap().node_name,
            "a"
        );
        let err = parse("[bluechi-agent]\nControllerHots=b\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "<string>:2: key 'ControllerHots': unknown key in [bluechi-agent]"
        );
        for (text, line) in [
            ("[drover-agent]\n[drover-manager]\n", 2),
            ("[node a]\nAllowed=true\n", 1),
            ("[bluechi-controller]\nNodeName=a\n", 1),
        ] {
            match parse(text).unwrap_err() {
                ConfigError::Syntax {
                    line: l, message, ..
                } => {
                    assert_eq!(l, line, "{text}");
                    assert!(message.contains("[drover-agent]"), "{message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn layered_files_env_and_extra() {
        let dir = TempDir::new("agent-layers");
        let d = dir.path();
        std::fs::create_dir(d.join("agent.conf.d")).unwrap();
        dir.write(
            "vendor.conf",
            "[drover-agent]\nControllerPort=100\nLogLevel=DEBUG\nHeartbeatInterval=1000\n",
        );
        dir.write(
            "etc.conf",
            "[drover-agent]\nNodeName=from-etc\nControllerPort=200\n",
        );
        dir.write(
            "agent.conf.d/b.conf",
            "[drover-agent]\nControllerPort=400\n",
        );
        dir.write(
            "agent.conf.d/a.conf",
            "[drover-agent]\nControllerPort=300\nLogTarget=stderr\n",
        );
        let extra = dir.write(
            "extra.conf",
            "[drover-agent]\nLogLevel=ERROR\nControllerHost=192.0.2.7\n",
        );
        let sources = Sources {
            vendor: Some(d.join("vendor.conf")),
            etc: Some(d.join("etc.conf")),
            dropins: Some(d.join("agent.conf.d")),
            env: true,
            extra: Some(extra),
            ..Sources::default()
        };
        let env: HashMap<&str, OsString> = [
            ("DROVER_LOG_LEVEL", OsString::from("WARN")),
            ("DROVER_LOG_TARGET", OsString::from("stderr-full")),
        ]
        .into_iter()
        .collect();
        let (c, report) =
            AgentConfig::load_with(&sources, &|k| env.get(k).cloned(), &host_ok).unwrap();
        assert_eq!(report.files.len(), 5, "{report:?}");
        assert_eq!(c.node_name, "from-etc");
        assert_eq!(c.controller_port, 400);
        assert_eq!(c.heartbeat_interval_ms, 1000);
        assert_eq!(c.logging.target, LogTarget::StderrFull, "env over drop-ins");
        assert_eq!(c.logging.level, LogLevel::Error, "-c over env");
        assert_eq!(c.controller_host, "192.0.2.7");
    }

    /// A tree holding only BlueChi's files, found under DROVER_CONFIG_ROOT:
    /// BlueChi's file, then its drop-ins, then drover's files over them.
    #[test]
    fn bluechi_files_under_a_config_root() {
        let dir = TempDir::new("agent-bluechi");
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc/bluechi/agent.conf.d")).unwrap();
        dir.write(
            "etc/bluechi/agent.conf",
            "[bluechi-agent]\nNodeName=bc-node\nControllerHost=192.0.2.1\n\
             ControllerAddress=unix:path=/run/bluechi/bluechi.sock\nControllerPort=8420\n",
        );
        dir.write(
            "etc/bluechi/agent.conf.d/10-port.conf",
            "[bluechi-agent]\nControllerPort=8421\nHeartbeatInterval=1000\n",
        );
        let env = config_root_env(root);
        let sources = Sources::from_env("agent", None, &env).unwrap();
        let (c, report) = AgentConfig::load_with(&sources, &env, &host_ok).unwrap();
        assert_eq!(c.node_name, "bc-node");
        assert_eq!(
            c.controller_endpoint().unwrap(),
            ("192.0.2.1".to_string(), 8421),
            "the unix: address is ignored, host and port apply"
        );
        assert_eq!(c.heartbeat_interval_ms, 1000);
        assert_eq!(
            report.files,
            [
                root.join("etc/bluechi/agent.conf"),
                root.join("etc/bluechi/agent.conf.d/10-port.conf")
            ]
        );
        assert!(report.files_line().contains("etc/bluechi/agent.conf,"));
        assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
        let w = &report.warnings[0];
        assert!(
            w.starts_with(&format!(
                "{}:4: key 'ControllerAddress': 'unix:path=/run/bluechi/bluechi.sock'",
                root.join("etc/bluechi/agent.conf").display()
            )) && w.contains("TCP only"),
            "{w}"
        );
        // drover's own file wins over BlueChi's, key by key.
        std::fs::create_dir_all(root.join("etc/drover")).unwrap();
        dir.write(
            "etc/drover/agent.conf",
            "[drover-agent]\nControllerPort=9000\n",
        );
        let (c, report) = AgentConfig::load_with(&sources, &env, &host_ok).unwrap();
        assert_eq!(c.node_name, "bc-node");
        assert_eq!(c.controller_port, 9000);
        assert_eq!(report.files.len(), 3);
        // In drover's own section a unix: address stays an error.
        let msg = value_err(
            parse("[drover-agent]\nControllerAddress=unix:path=/x\n").unwrap_err(),
            2,
            "ControllerAddress",
        );
        assert!(msg.contains("not supported"), "{msg}");
        // A relative root is refused.
        let rel = config_root_env(Path::new("etc"));
        let err = Sources::from_env("agent", None, &rel).unwrap_err();
        assert!(err.to_string().contains("DROVER_CONFIG_ROOT"), "{err}");
        // Unset or empty: the installed locations.
        let none = |_: &str| None;
        assert_eq!(
            Sources::from_env("agent", None, &none).unwrap().bluechi_etc,
            Some(PathBuf::from("/etc/bluechi/agent.conf"))
        );
    }

    #[test]
    fn real_file_through_public_load() {
        let dir = TempDir::new("agent-file");
        let path = dir.write(
            "agent.conf",
            "[drover-agent]\r\nNodeName = laptop\r\nControllerAddress = tcp:host=127.0.0.1,port=8420\r\n",
        );
        let c = AgentConfig::load(&Sources {
            extra: Some(path.clone()),
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(c.node_name, "laptop");
        assert_eq!(
            c.controller_endpoint().unwrap(),
            ("127.0.0.1".to_string(), 8420)
        );
        std::fs::write(&path, "[drover-agent]\nNodeName=laptop\nControllerPort=0\n").unwrap();
        let err = AgentConfig::load(&Sources::only(Some(path.clone()))).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3: key 'ControllerPort': 0 is out of range 1..=65535",
                path.display()
            )
        );
    }

    /// The shipped vendor file parses, and every default it shows in a
    /// comment is the real default.
    #[test]
    fn shipped_agent_conf() {
        let text = include_str!("../../dist/usr/share/drover/agent.conf");
        assert_eq!(parse(text).unwrap(), defaults());
        let (uncommented, shown) = crate::test_util::uncomment_defaults(text, KEYS);
        assert_eq!(parse(&uncommented).unwrap(), defaults());
        assert_eq!(shown, KEYS.len(), "every key is documented");
    }

    #[test]
    fn heartbeat_threshold_must_exceed_interval() {
        for text in [
            "[drover-agent]\nControllerHeartbeatThreshold=10\n",
            "[drover-agent]\nHeartbeatInterval=3000\nControllerHeartbeatThreshold=3000\n",
        ] {
            let err = parse(text).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Invalid(m) if m.contains("ControllerHeartbeatThreshold")
                    && m.contains("HeartbeatInterval")),
                "{text}: {err}"
            );
        }
        // Either being 0 disables the rule.
        for text in [
            "[drover-agent]\nHeartbeatInterval=0\nControllerHeartbeatThreshold=10\n",
            "[drover-agent]\nHeartbeatInterval=9000\nControllerHeartbeatThreshold=0\n",
            "[drover-agent]\nHeartbeatInterval=2000\nControllerHeartbeatThreshold=2001\n",
        ] {
            assert!(parse(text).is_ok(), "{text}");
        }
    }
}
