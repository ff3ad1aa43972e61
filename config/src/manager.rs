//! Manager settings: section `[drover-manager]` plus one `[node NAME]` per node.
//!
//! Layering: every layer overrides the keys it names and nothing else.
//! `AllowedNodeNames` and `AllowDependenciesOn` are replaced as a whole; a
//! `[node NAME]` that appears in several layers (or twice in one file) is one
//! node whose keys merge, and it keeps the position of its first appearance.
//! An empty value (`Key=`) resets list and optional keys (`AllowedNodeNames`,
//! `AllowDependenciesOn`, `Allowed`, `ListenAddress`) to their default; for
//! numbers, booleans and log words it is an error.
//!
//! Decisions (checked after the last layer, reported as [`ConfigError::Invalid`]):
//! * `NodeHeartbeatThreshold` must exceed `HeartbeatInterval` when both are
//!   non-zero: the manager tells agents its interval at registration, so a
//!   threshold at or below it would drop healthy nodes between two beats.
//!
//! Other choices:
//! * an explicit `Allowed=false` in `[node NAME]` wins over `AllowedNodeNames`
//!   (the per-node section is the more specific statement, and it is how a
//!   drop-in takes one node out of a shared list);
//! * `UseUDS=false` is accepted for BlueChi configs; `UseUDS=true` and
//!   `RequiredSelinuxContext` are errors, since drover has no Unix-socket
//!   listener and must not pretend to enforce a security setting;
//! * millisecond values are capped at one day so timer arithmetic can never overflow.

use crate::ini::Document;
use crate::layers::{Layered, apply_sources};
use crate::value::{self, At, KEEPALIVE_COUNT_MAX, KEEPALIVE_SECS_MAX};
use crate::{ConfigError, LoggingConfig, Sources};
use drover_protocol::NodeName;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::Path;

pub const DEFAULT_PORT: u16 = 842;

/// Section of the manager's own keys.
pub const SECTION: &str = "drover-manager";

/// Largest accepted millisecond value (one day): heartbeat intervals and
/// thresholds beyond that are mistakes, and the cap keeps `Instant + Duration`
/// from overflowing in the daemons.
pub const MAX_MS: u64 = 86_400_000;

const KEYS: &[&str] = &[
    "ControllerPort",
    "ListenAddress",
    "UseTCP",
    "UseUDS",
    "AllowedNodeNames",
    "HeartbeatInterval",
    "NodeHeartbeatThreshold",
    "TCPKeepAliveTime",
    "TCPKeepAliveInterval",
    "TCPKeepAliveCount",
    "IPReceiveErrors",
    "LogLevel",
    "LogTarget",
    "LogIsQuiet",
];
const NODE_KEYS: &[&str] = &["Allowed", "AllowDependenciesOn", "RequiredSelinuxContext"];

#[derive(Debug, Clone, PartialEq)]
pub struct ManagerConfig {
    /// `ControllerPort` (default 842).
    pub port: u16,
    /// `ListenAddress` (drover): address to bind; default `::` with a fallback
    /// to `0.0.0.0` when IPv6 is off.
    pub listen_address: Option<IpAddr>,
    /// `UseTCP` (default true).
    pub use_tcp: bool,
    /// `AllowedNodeNames` plus every `[node NAME]` with `Allowed=true`, in config order, no duplicates.
    /// A node whose section says `Allowed=false` is left out even when `AllowedNodeNames` lists it.
    pub allowed_nodes: Vec<NodeName>,
    /// Per-node sections, in config order.
    pub nodes: Vec<NodeSection>,
    /// `HeartbeatInterval` ms. drover default 2000 (BlueChi: 0 = off). 0 disables.
    pub heartbeat_interval_ms: u64,
    /// `NodeHeartbeatThreshold` ms, default 6000; unlike BlueChi it is honoured
    /// whenever it is > 0, whatever `HeartbeatInterval` says. 0 disables.
    pub node_heartbeat_threshold_ms: u64,
    /// `TCPKeepAliveTime` / `TCPKeepAliveInterval` (s), `TCPKeepAliveCount`: 1, 1, 6.
    pub tcp_keepalive_time_s: u32,
    pub tcp_keepalive_interval_s: u32,
    pub tcp_keepalive_count: u32,
    /// `IPReceiveErrors` (default true).
    pub ip_receive_errors: bool,
    /// `LogLevel`, `LogTarget`, `LogIsQuiet`.
    pub logging: LoggingConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSection {
    pub name: NodeName,
    /// `Allowed=` (None when the section does not say).
    pub allowed: Option<bool>,
    /// `AllowDependenciesOn=`: target nodes this node may create proxies to.
    pub allow_dependencies_on: Vec<NodeName>,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            listen_address: None,
            use_tcp: true,
            allowed_nodes: Vec::new(),
            nodes: Vec::new(),
            heartbeat_interval_ms: 2000,
            node_heartbeat_threshold_ms: 6000,
            tcp_keepalive_time_s: 1,
            tcp_keepalive_interval_s: 1,
            tcp_keepalive_count: 6,
            ip_receive_errors: true,
            logging: LoggingConfig::default(),
        }
    }
}

impl ManagerConfig {
    /// Loads every layer of `sources` over the defaults.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        Self::load_with_env(sources, &|var| std::env::var_os(var))
    }

    /// [`ManagerConfig::load`] with the environment read through `env`.
    pub(crate) fn load_with_env(
        sources: &Sources,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let mut b = Builder::default();
        apply_sources(&mut b, sources, env)?;
        b.finish()
    }

    /// Parses one file's text over the defaults (tests, `-c` checks); errors
    /// name the file `<string>`.
    pub fn parse_str(text: &str) -> Result<Self, ConfigError> {
        let doc = crate::ini::parse(Path::new("<string>"), text)?;
        let mut b = Builder::default();
        b.apply(&doc)?;
        b.finish()
    }

    /// The `[node NAME]` section of `name`, if any.
    pub fn node(&self, name: &NodeName) -> Option<&NodeSection> {
        self.nodes.iter().find(|n| &n.name == name)
    }
}

/// The config under construction: `AllowedNodeNames` is kept apart until the
/// end because `allowed_nodes` also depends on the node sections.
#[derive(Default)]
struct Builder {
    cfg: ManagerConfig,
    allowed_names: Vec<NodeName>,
}

impl Layered for Builder {
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError> {
        for section in &doc.sections {
            if section.name == SECTION {
                for entry in &section.entries {
                    self.apply_key(At {
                        path: &doc.path,
                        entry,
                    })?;
                }
            } else if let Some(node) = node_section_name(&section.name) {
                let name = NodeName::new(node).map_err(|e| ConfigError::Syntax {
                    path: doc.path.clone(),
                    line: section.line,
                    message: format!("section [{}]: {e}", section.name),
                })?;
                let idx = match self.cfg.nodes.iter().position(|n| n.name == name) {
                    Some(i) => i,
                    None => {
                        self.cfg.nodes.push(NodeSection {
                            name,
                            allowed: None,
                            allow_dependencies_on: Vec::new(),
                        });
                        self.cfg.nodes.len() - 1
                    }
                };
                for entry in &section.entries {
                    apply_node_key(
                        At {
                            path: &doc.path,
                            entry,
                        },
                        &mut self.cfg.nodes[idx],
                    )?;
                }
            } else {
                let hint = if section.name.starts_with("bluechi") {
                    " (drover's manager section is [drover-manager])"
                } else {
                    ""
                };
                return Err(ConfigError::Syntax {
                    path: doc.path.clone(),
                    line: section.line,
                    message: format!(
                        "unknown section [{}]: expected [{SECTION}] or [node NAME]{hint}",
                        section.name
                    ),
                });
            }
        }
        Ok(())
    }

    fn logging_mut(&mut self) -> &mut LoggingConfig {
        &mut self.cfg.logging
    }
}

/// `NAME` of a `node NAME` section header; `Some("")` for a bare `node`, so
/// that it is reported as a bad node name rather than an unknown section.
fn node_section_name(section: &str) -> Option<&str> {
    let rest = section.strip_prefix("node")?;
    if rest.is_empty() {
        return Some("");
    }
    rest.starts_with(char::is_whitespace).then(|| rest.trim())
}

impl Builder {
    fn apply_key(&mut self, at: At<'_>) -> Result<(), ConfigError> {
        let c = &mut self.cfg;
        match at.entry.key.as_str() {
            "ControllerPort" => c.port = at.port()?,
            "ListenAddress" => {
                c.listen_address = if at.value().is_empty() {
                    None
                } else {
                    Some(at.value().parse::<IpAddr>().map_err(|_| {
                        at.err(format!(
                            "'{}' is not an IP address (e.g. ::, 0.0.0.0, 192.0.2.1)",
                            at.value()
                        ))
                    })?)
                }
            }
            "UseTCP" => c.use_tcp = at.boolean()?,
            "UseUDS" => {
                if at.boolean()? {
                    return Err(at.err(
                        "drover has no Unix-socket listener; remove UseUDS or set it to false",
                    ));
                }
            }
            "AllowedNodeNames" => self.allowed_names = at.node_list()?,
            "HeartbeatInterval" => c.heartbeat_interval_ms = at.number(0, MAX_MS)?,
            "NodeHeartbeatThreshold" => c.node_heartbeat_threshold_ms = at.number(0, MAX_MS)?,
            "TCPKeepAliveTime" => c.tcp_keepalive_time_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?,
            "TCPKeepAliveInterval" => {
                c.tcp_keepalive_interval_s = at.u32_in(0, KEEPALIVE_SECS_MAX)?
            }
            "TCPKeepAliveCount" => c.tcp_keepalive_count = at.u32_in(0, KEEPALIVE_COUNT_MAX)?,
            "IPReceiveErrors" => c.ip_receive_errors = at.boolean()?,
            _ => {
                if !value::apply_logging(at, &mut c.logging)? {
                    return Err(value::unknown_key(at, SECTION, KEYS));
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<ManagerConfig, ConfigError> {
        let mut cfg = self.cfg;
        let denied = |name: &NodeName| {
            cfg.nodes
                .iter()
                .any(|n| &n.name == name && n.allowed == Some(false))
        };
        let mut allowed: Vec<NodeName> = Vec::new();
        let from_sections = cfg
            .nodes
            .iter()
            .filter(|n| n.allowed == Some(true))
            .map(|n| &n.name);
        for name in self.allowed_names.iter().chain(from_sections) {
            if !denied(name) && !allowed.contains(name) {
                allowed.push(name.clone());
            }
        }
        cfg.allowed_nodes = allowed;

        if cfg.heartbeat_interval_ms > 0
            && cfg.node_heartbeat_threshold_ms > 0
            && cfg.node_heartbeat_threshold_ms <= cfg.heartbeat_interval_ms
        {
            return Err(ConfigError::Invalid(format!(
                "NodeHeartbeatThreshold ({} ms) must be greater than HeartbeatInterval ({} ms), \
                 or 0 to disable it: otherwise healthy nodes are dropped between two heartbeats",
                cfg.node_heartbeat_threshold_ms, cfg.heartbeat_interval_ms
            )));
        }
        Ok(cfg)
    }
}

fn apply_node_key(at: At<'_>, node: &mut NodeSection) -> Result<(), ConfigError> {
    match at.entry.key.as_str() {
        "Allowed" => {
            node.allowed = if at.value().is_empty() {
                None
            } else {
                Some(at.boolean()?)
            }
        }
        "AllowDependenciesOn" => node.allow_dependencies_on = at.node_list()?,
        "RequiredSelinuxContext" => {
            return Err(at.err(
                "not supported by drover (agents connect over TCP; SELinux peer contexts \
                 apply to Unix sockets only)",
            ));
        }
        _ => {
            return Err(value::unknown_key(
                at,
                &format!("node {}", node.name),
                NODE_KEYS,
            ));
        }
    }
    Ok(())
}
