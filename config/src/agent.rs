//! Agent settings: section `[drover-agent]`.
//!
//! Layering: every layer overrides the keys it names and nothing else. An
//! empty value resets `NodeName` (to the host name) and `ControllerAddress`
//! (to unset); for every other key it is an error.
//!
//! Invariants after loading: `node_name` is a valid
//! [`drover_protocol::NodeName`] (the host name, read from
//! `/proc/sys/kernel/hostname`, when no layer sets it; an unusable host name
//! is an error that says to set `NodeName=`); `controller_host` is an IP
//! literal or a syntactically valid host name; `controller_address`, when
//! set, is a valid `tcp:host=H,port=P`. Millisecond values are capped at one
//! day ([`crate::manager::MAX_MS`]) so timer arithmetic can never overflow.
//!
//! No cross-key rule is enforced: the agent's `ControllerHeartbeatThreshold`
//! is measured against the *manager's* heartbeats, which this file cannot see.

use crate::ini::Document;
use crate::layers::{Layered, apply_sources};
use crate::manager::MAX_MS;
use crate::value::{self, At, KEEPALIVE_COUNT_MAX, KEEPALIVE_SECS_MAX};
use crate::{ConfigError, LoggingConfig, Sources};
use drover_protocol::NodeName;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::Path;

/// Section of the agent's keys.
pub const SECTION: &str = "drover-agent";

/// Where the host name comes from when `NodeName` is not set.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

const KEYS: &[&str] = &[
    "NodeName",
    "ControllerHost",
    "ControllerPort",
    "ControllerAddress",
    "HeartbeatInterval",
    "ControllerHeartbeatThreshold",
    "ConnectionRetryCountUntilQuiet",
    "TCPKeepAliveTime",
    "TCPKeepAliveInterval",
    "TCPKeepAliveCount",
    "IPReceiveErrors",
    "LogLevel",
    "LogTarget",
    "LogIsQuiet",
];

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// `NodeName` (default: the host name).
    pub node_name: String,
    /// `ControllerHost` (default `127.0.0.1`): IP literal or host name,
    /// re-resolved on every connection attempt.
    pub controller_host: String,
    /// `ControllerPort` (default 842).
    pub controller_port: u16,
    /// `ControllerAddress`: `tcp:host=H,port=P` overrides host and port.
    pub controller_address: Option<String>,
    /// `HeartbeatInterval` ms (default 2000); also the base of the reconnect backoff. 0 disables heartbeats.
    pub heartbeat_interval_ms: u64,
    /// `ControllerHeartbeatThreshold` ms: drop the link when nothing came from
    /// the manager for this long. drover default 6000 (BlueChi: 0 = off). 0 disables.
    pub controller_heartbeat_threshold_ms: u64,
    /// `ConnectionRetryCountUntilQuiet` (default 10).
    pub connection_retry_count_until_quiet: u32,
    /// `TCPKeepAliveTime` / `TCPKeepAliveInterval` (s), `TCPKeepAliveCount`:
    /// 1, 1, 6; 0 leaves the kernel default.
    pub tcp_keepalive_time_s: u32,
    pub tcp_keepalive_interval_s: u32,
    pub tcp_keepalive_count: u32,
    /// `IPReceiveErrors` (default true).
    pub ip_receive_errors: bool,
    /// `LogLevel`, `LogTarget`, `LogIsQuiet`.
    pub logging: LoggingConfig,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            controller_host: "127.0.0.1".into(),
            controller_port: crate::manager::DEFAULT_PORT,
            controller_address: None,
            heartbeat_interval_ms: 2000,
            controller_heartbeat_threshold_ms: 6000,
            connection_retry_count_until_quiet: 10,
            tcp_keepalive_time_s: 1,
            tcp_keepalive_interval_s: 1,
            tcp_keepalive_count: 6,
            ip_receive_errors: true,
            logging: LoggingConfig::default(),
        }
    }
}

impl AgentConfig {
    /// Loads every layer of `sources` over the defaults; `NodeName` falls
    /// back to the host name.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        Self::load_with(sources, &|var| std::env::var_os(var), &read_hostname)
    }

    /// [`AgentConfig::load`] with the environment and the host name injected.
    pub(crate) fn load_with(
        sources: &Sources,
        env: &dyn Fn(&str) -> Option<OsString>,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let mut cfg = Self::default();
        apply_sources(&mut cfg, sources, env)?;
        cfg.finish(hostname)
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
        let mut cfg = Self::default();
        cfg.apply(&doc)?;
        cfg.finish(hostname)
    }

    /// The manager's host and port after `ControllerAddress` is applied.
    pub fn controller_endpoint(&self) -> Result<(String, u16), ConfigError> {
        match &self.controller_address {
            Some(addr) => parse_controller_address(addr)
                .map_err(|m| ConfigError::Invalid(format!("ControllerAddress '{addr}': {m}"))),
            None => Ok((self.controller_host.clone(), self.controller_port)),
        }
    }

    fn finish(
        mut self,
        hostname: &dyn Fn() -> Result<String, ConfigError>,
    ) -> Result<Self, ConfigError> {
        if self.node_name.is_empty() {
            let host = hostname()?;
            NodeName::new(host.as_str()).map_err(|e| {
                ConfigError::Invalid(format!(
                    "no NodeName is configured and the host name cannot be used: {e}; \
                     set NodeName= in [{SECTION}]"
                ))
            })?;
            self.node_name = host;
        }
        Ok(self)
    }

    fn apply_key(&mut self, at: At<'_>) -> Result<(), ConfigError> {
        match at.entry.key.as_str() {
            "NodeName" => {
                self.node_name = if at.value().is_empty() {
                    String::new()
                } else {
                    NodeName::new(at.value())
                        .map_err(|e| at.err(e.to_string()))?
                        .to_string()
                }
            }
            "ControllerHost" => {
                check_host(at.value()).map_err(|m| at.err(m))?;
                self.controller_host = at.value().to_string();
            }
            "ControllerPort" => self.controller_port = at.port()?,
            "ControllerAddress" => {
                self.controller_address = if at.value().is_empty() {
                    None
                } else {
                    parse_controller_address(at.value()).map_err(|m| at.err(m))?;
                    Some(at.value().to_string())
                }
            }
            "HeartbeatInterval" => self.heartbeat_interval_ms = at.number(0, MAX_MS)?,
            "ControllerHeartbeatThreshold" => {
                self.controller_heartbeat_threshold_ms = at.number(0, MAX_MS)?
            }
            "ConnectionRetryCountUntilQuiet" => {
                self.connection_retry_count_until_quiet = at.u32_in(0, u32::MAX)?
            }
            "TCPKeepAliveTime" => self.tcp_keepalive_time_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?,
            "TCPKeepAliveInterval" => {
                self.tcp_keepalive_interval_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?
            }
            "TCPKeepAliveCount" => self.tcp_keepalive_count = at.u32_in(0, KEEPALIVE_COUNT_MAX)?,
            "IPReceiveErrors" => self.ip_receive_errors = at.boolean()?,
            _ => {
                if !value::apply_logging(at, &mut self.logging)? {
                    return Err(value::unknown_key(at, SECTION, KEYS));
                }
            }
        }
        Ok(())
    }
}

impl Layered for AgentConfig {
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError> {
        for section in &doc.sections {
            if section.name != SECTION {
                let hint = if section.name.starts_with("bluechi") {
                    " (drover's agent section is [drover-agent])"
                } else {
                    ""
                };
                return Err(ConfigError::Syntax {
                    path: doc.path.clone(),
                    line: section.line,
                    message: format!(
                        "unknown section [{}]: expected [{SECTION}]{hint}",
                        section.name
                    ),
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

fn read_hostname() -> Result<String, ConfigError> {
    std::fs::read_to_string(HOSTNAME_FILE)
        .map(|s| s.trim().to_string())
        .map_err(|source| ConfigError::Read {
            path: HOSTNAME_FILE.into(),
            source,
        })
}

/// Accepts an IP literal or a DNS host name (labels of ASCII letters, digits,
/// `-` and `_`, at most 63 bytes each, 253 in all, an optional final dot).
/// The name is only checked here; it is resolved on every connection attempt.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let bad = || format!("'{host}' is neither an IP address nor a valid host name");
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return Err(bad());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(bad())
    }
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
