//! Manager settings: section `[drover-manager]` plus one `[node NAME]` per node.
//!
//! Layering: every layer overrides the keys it names and nothing else.
//! `AllowedNodeNames` and `AllowDependenciesOn` are replaced as a whole; a
//! `[node NAME]` that appears in several layers (or twice in one file) is one
//! node whose keys merge, and it keeps the position of its first appearance.
//! An empty value (`Key=`) resets list and optional keys (`AllowedNodeNames`,
//! `AllowDependenciesOn`, `Allowed`, `ListenAddress`, `ProxyGracePeriod`) to
//! their default; for other numbers, booleans and log words it is an error.
//!
//! Decisions (checked after the last layer):
//! * `NodeHeartbeatThreshold` must exceed `HeartbeatInterval` when both are
//!   non-zero: the manager tells agents its interval at registration, so a
//!   threshold at or below it would drop healthy nodes between two beats
//!   ([`ConfigError::Invalid`]).
//! * Transport (errors name the file, line and key that contradict):
//!   - the TLS keys are all-or-nothing (see [`crate::tls`]);
//!   - with TLS configured, plaintext is refused: `AllowPlaintext=true` is an
//!     error, not a fallback;
//!   - without TLS, plaintext is served on loopback only unless
//!     `AllowPlaintext=true`: an explicit non-loopback `ListenAddress` is an
//!     error, and an unset one means loopback ([`ManagerConfig::bind_address`]);
//!   - `AllowCertifiedNodes=true` needs TLS (without certificates it would
//!     admit nobody, and the operator surely meant TLS to be on).
//!
//! Other choices:
//! * an explicit `Allowed=false` in `[node NAME]` wins over `AllowedNodeNames`
//!   (the per-node section is the more specific statement, and it is how a
//!   drop-in takes one node out of a shared list), patterns included;
//! * `AllowedNodeNames` holds names and patterns ([`crate::pattern`]): a name
//!   is a configured node (in [`ManagerConfig::allowed_nodes`]), a pattern
//!   admits any matching name without configuring it
//!   ([`ManagerConfig::allowed_patterns`]). A `[node NAME]` section (not
//!   `Allowed=false`) whose name a pattern matches makes that node configured
//!   too. Section names and `AllowDependenciesOn=` take names only: a grant to
//!   depend on another node's units names the node it trusts;
//! * a lone `*` is accepted (with TLS it is what `AllowCertifiedNodes=true`
//!   says for the CA's nodes) but warned about without TLS, where it admits
//!   any peer that reaches the port under any name;
//! * `[bluechi-controller]` takes the same keys as `[drover-manager]`
//!   (`crate::sections`); BlueChi's files are read under drover's
//!   ([`crate::layers`]);
//! * `UseUDS=false` is accepted for BlueChi configs; `UseUDS=true` is a
//!   warning in `[bluechi-controller]` (it is BlueChi's default, so a BlueChi
//!   file may well say it) and an error in `[drover-manager]`;
//!   `RequiredSelinuxContext` is an error everywhere, since drover has no Unix-socket
//!   listener and must not pretend to enforce a security setting;
//! * millisecond values are capped at one day so timer arithmetic can never overflow.

use crate::discovery::{self, DiscoverySettings};
use crate::ha::{self, HaSettings};
use crate::ini::Document;
use crate::layers::{Layered, LoadReport, apply_sources};
use crate::metrics::{self, MetricsSettings};
use crate::pattern::{NodePattern, is_pattern};
use crate::sections::{self, Daemon, Dialect, Kind};
use crate::shared::{self, LinkSettings};
use crate::tls::{Origin, TlsFiles, TlsKeys};
use crate::value::{self, At};
use crate::{ConfigError, LoggingConfig, Sources};
use drover_protocol::NodeName;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

pub const DEFAULT_PORT: u16 = 842;

/// Section of the manager's own keys.
pub const SECTION: &str = sections::MANAGER;

/// BlueChi's name of the same section.
pub const BLUECHI_SECTION: &str = sections::MANAGER_BLUECHI;

/// Largest accepted millisecond value (one day): heartbeat intervals and
/// thresholds beyond that are mistakes, and the cap keeps `Instant + Duration`
/// from overflowing in the daemons.
pub const MAX_MS: u64 = 86_400_000;

/// The keys of `[drover-manager]` only the manager reads (besides the
/// metrics keys, [`crate::metrics`], the HA keys, [`crate::ha`], and the
/// discovery keys, [`crate::discovery`]).
const OWN_KEYS: &[&str] = &[
    "ControllerPort",
    "ListenAddress",
    "UseTCP",
    "UseUDS",
    "AllowedNodeNames",
    "HeartbeatInterval",
    "NodeHeartbeatThreshold",
    "ProxyGracePeriod",
    "ResyncInterval",
    "AllowCertifiedNodes",
    "AllowPlaintext",
    "StateDirectory",
];

/// Every key of `[drover-manager]`: its own, then those both daemons read
/// ([`shared::KEYS`]). drover.conf(5) documents each; a test keeps the list
/// equal to the keys the loader matches.
pub const KEYS: &[&str] = &shared::key_list::<
    {
        OWN_KEYS.len()
            + metrics::KEYS.len()
            + ha::KEYS.len()
            + discovery::KEYS.len()
            + shared::KEYS.len()
    },
>(&[
    OWN_KEYS,
    metrics::KEYS,
    ha::KEYS,
    discovery::KEYS,
    shared::KEYS,
]);
/// Every key of `[node NAME]`.
pub const NODE_KEYS: &[&str] = &["Allowed", "AllowDependenciesOn", "RequiredSelinuxContext"];

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
    /// Also every `[node NAME]` (not `Allowed=false`) whose name a pattern matches.
    pub allowed_nodes: Vec<NodeName>,
    /// The patterns of `AllowedNodeNames` (`edge-*`), in config order, no
    /// duplicates: a matching name may register unless its section says
    /// `Allowed=false`.
    pub allowed_patterns: Vec<NodePattern>,
    /// Per-node sections, in config order.
    pub nodes: Vec<NodeSection>,
    /// `HeartbeatInterval` ms: how often the manager sends heartbeats to its
    /// agents. Default 0 = never, as BlueChi: the agents' heartbeats probe the
    /// manager through `TCP_USER_TIMEOUT` instead (`drover_protocol::liveness`).
    pub heartbeat_interval_ms: u64,
    /// `NodeHeartbeatThreshold` ms, default 6000; unlike BlueChi it is honoured
    /// whenever it is > 0, whatever `HeartbeatInterval` says. 0 disables.
    pub node_heartbeat_threshold_ms: u64,
    /// `ProxyGracePeriod` ms (drover): how long the references of an offline
    /// requesting node survive, and how long proxies of an offline target node
    /// stay active. `None` (unset, or `ProxyGracePeriod=`): see
    /// [`ManagerConfig::proxy_grace_ms`].
    pub proxy_grace_period_ms: Option<u64>,
    /// `ResyncInterval` ms (drover, default 60000; 0 = off): how often each
    /// agent sends the digest of what the manager holds for it, before the
    /// growth with the fleet's size (`drover_protocol::resync`).
    pub resync_interval_ms: u64,
    /// `TCPKeepAliveTime`, `TCPKeepAliveInterval`, `TCPKeepAliveCount`,
    /// `IPReceiveErrors`: the agent link's TCP settings (the same keys on
    /// both ends, [`crate::shared`]).
    pub link: LinkSettings,
    /// `TLSCertificate`, `TLSPrivateKey`, `TLSCertificateAuthority`,
    /// `TLSRevocationList`: mutual TLS on the agent port when set.
    pub tls: Option<TlsFiles>,
    /// `AllowCertifiedNodes` (default false): with TLS, a node whose
    /// certificate the CA signed may register without being allowed by name.
    pub allow_certified_nodes: bool,
    /// `AllowPlaintext` (default false): serve plaintext on a non-loopback
    /// address. Never true together with `tls`.
    pub allow_plaintext: bool,
    /// `LogLevel`, `LogTarget`, `LogIsQuiet`.
    pub logging: LoggingConfig,
    /// `MetricsListenAddress`, `MetricsPerNode`: the Prometheus endpoint.
    pub metrics: MetricsSettings,
    /// `EtcdEndpoints`, `EtcdKeyPrefix`, `EtcdLeaseTTL`: leader election on
    /// etcd ([`crate::ha`]); off without endpoints.
    pub ha: HaSettings,
    /// `StateDirectory` (drover): where the manager keeps what must outlive
    /// it (the drained nodes and units). `None` (unset or empty): systemd's
    /// `$STATE_DIRECTORY`, see [`ManagerConfig::state_directory`]. Always an
    /// absolute path.
    pub state_directory: Option<PathBuf>,
    /// `StaleRetention`, `WarmUpTimeout`: the unit index's last-good records
    /// and warm-up after a start ([`crate::discovery`]).
    pub discovery: DiscoverySettings,
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
            allowed_patterns: Vec::new(),
            nodes: Vec::new(),
            heartbeat_interval_ms: 0,
            node_heartbeat_threshold_ms: 6000,
            proxy_grace_period_ms: None,
            resync_interval_ms: drover_protocol::resync::DEFAULT_INTERVAL_MS,
            link: LinkSettings::default(),
            tls: None,
            allow_certified_nodes: false,
            allow_plaintext: false,
            logging: LoggingConfig::default(),
            metrics: MetricsSettings::default(),
            ha: HaSettings::default(),
            state_directory: None,
            discovery: DiscoverySettings::default(),
        }
    }
}

impl ManagerConfig {
    /// Loads every layer of `sources` over the defaults.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        Self::load_report(sources).map(|(c, _)| c)
    }

    /// [`ManagerConfig::load`], with which files were read and the warnings.
    pub fn load_report(sources: &Sources) -> Result<(Self, LoadReport), ConfigError> {
        Self::load_with_env(sources, &|var| std::env::var_os(var))
    }

    /// [`ManagerConfig::load_report`] with the environment read through `env`.
    pub(crate) fn load_with_env(
        sources: &Sources,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Self, LoadReport), ConfigError> {
        let mut b = Builder::default();
        let files = apply_sources(&mut b, sources, env)?;
        let (cfg, warnings) = b.finish_with_warnings()?;
        Ok((cfg, LoadReport { files, warnings }))
    }

    /// Parses one file's text over the defaults (tests, `-c` checks); errors
    /// name the file `<string>`.
    pub fn parse_str(text: &str) -> Result<Self, ConfigError> {
        let doc = crate::ini::parse(Path::new("<string>"), text)?;
        let mut b = Builder::default();
        b.apply(&doc)?;
        b.finish()
    }

    /// The effective `ProxyGracePeriod` in ms: the configured value, else
    /// three heartbeat thresholds (a node that misses that many is really
    /// gone, not blinking). With the threshold disabled (0) the default
    /// threshold is used for the computation, so an unset key never means
    /// "drop at once".
    pub fn proxy_grace_ms(&self) -> u64 {
        self.proxy_grace_period_ms.unwrap_or_else(|| {
            let threshold = match self.node_heartbeat_threshold_ms {
                0 => Self::default().node_heartbeat_threshold_ms,
                ms => ms,
            };
            threshold.saturating_mul(3).min(MAX_MS)
        })
    }

    /// The directory the manager keeps its state in: `StateDirectory=`, else
    /// the first path of `state_directory_env` (systemd's `$STATE_DIRECTORY`,
    /// set by the shipped unit's `StateDirectory=drover`: `/var/lib/drover`)
    /// when it is absolute, else `None`: nothing is kept across restarts.
    pub fn state_directory(
        &self,
        state_directory_env: Option<&std::ffi::OsStr>,
    ) -> Option<PathBuf> {
        if let Some(dir) = &self.state_directory {
            return Some(dir.clone());
        }
        let env = state_directory_env?.to_str()?;
        let first = PathBuf::from(env.split(':').next()?);
        first.is_absolute().then_some(first)
    }

    /// Whether a pattern of `AllowedNodeNames` matches `name` (whatever its
    /// `[node NAME]` section says).
    pub fn pattern_matches(&self, name: &NodeName) -> bool {
        self.allowed_patterns.iter().any(|p| p.matches(name))
    }

    /// The `[node NAME]` section of `name`, if any.
    pub fn node(&self, name: &NodeName) -> Option<&NodeSection> {
        self.nodes.iter().find(|n| &n.name == name)
    }

    /// Whether the agent port may speak plaintext to a peer reached through
    /// the local address `local`: never with TLS; otherwise on loopback, or
    /// anywhere with `AllowPlaintext=true`.
    pub fn plaintext_allowed_on(&self, local: IpAddr) -> bool {
        self.tls.is_none() && (self.allow_plaintext || local.to_canonical().is_loopback())
    }

    /// The address to bind (socket activation aside): `ListenAddress`, else
    /// `None` — all addresses, `::` falling back to `0.0.0.0` — with TLS or
    /// `AllowPlaintext=true`; without them, loopback only (`::1`, or
    /// `127.0.0.1` when `ipv6` is false because IPv6 is off).
    pub fn bind_address(&self, ipv6: bool) -> Option<IpAddr> {
        match self.listen_address {
            Some(addr) => Some(addr),
            None if self.tls.is_some() || self.allow_plaintext => None,
            None if ipv6 => Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            None => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        }
    }
}

/// The config under construction: `AllowedNodeNames` is kept apart until the
/// end because `allowed_nodes` also depends on the node sections.
#[derive(Default)]
struct Builder {
    cfg: ManagerConfig,
    allowed_names: Vec<NodeName>,
    /// Where `AllowedNodeNames` was last set, for the warning about `*`.
    allowed_at: Option<Origin>,
    tls: TlsKeys,
    /// The HA keys' builder state (etcd's TLS keys, where the endpoints were set).
    ha: ha::HaKeys,
    /// Where the transport keys were last set, for errors after the last layer.
    listen_at: Option<Origin>,
    allow_plaintext_at: Option<Origin>,
    allow_certified_at: Option<Origin>,
    /// A `[bluechi-controller]` section was applied.
    bluechi_read: bool,
    warnings: Vec<String>,
}

impl Layered for Builder {
    fn apply(&mut self, doc: &Document) -> Result<(), ConfigError> {
        for section in &doc.sections {
            match sections::classify(doc, section, Daemon::Manager)? {
                Kind::Main(dialect) => {
                    self.bluechi_read |= dialect == Dialect::BlueChi;
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
                // `classify` gives `[health NAME]` to the agent only.
                Kind::Health(_) => {}
                Kind::Node(node) => {
                    let name = NodeName::new(node).map_err(|e| ConfigError::Syntax {
                        path: doc.path.clone(),
                        line: section.line,
                        message: if is_pattern(node) {
                            format!(
                                "section [{}]: a node section names one node, not a pattern \
                                 (patterns are accepted in AllowedNodeNames)",
                                section.name
                            )
                        } else {
                            format!("section [{}]: {e}", section.name)
                        },
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
                }
            }
        }
        Ok(())
    }

    fn logging_mut(&mut self) -> &mut LoggingConfig {
        &mut self.cfg.logging
    }
}

impl Builder {
    fn apply_key(&mut self, at: At<'_>, dialect: Dialect) -> Result<(), ConfigError> {
        let cfg = &mut self.cfg;
        if shared::apply(at, &mut cfg.link, &mut self.tls, &mut cfg.logging)? {
            return Ok(());
        }
        if metrics::apply(at, &mut cfg.metrics)? {
            return Ok(());
        }
        if ha::apply(at, &mut cfg.ha, &mut self.ha)? {
            return Ok(());
        }
        if discovery::apply(at, &mut cfg.discovery)? {
            return Ok(());
        }
        let c = &mut self.cfg;
        match at.entry.key.as_str() {
            "ControllerPort" => c.port = at.port()?,
            "ListenAddress" => {
                self.listen_at = Some(Origin::of(at));
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
                    match dialect {
                        Dialect::Drover => {
                            return Err(at.err(
                                "drover has no Unix-socket listener; remove UseUDS or set it to false",
                            ));
                        }
                        Dialect::BlueChi => self.warnings.push(at.warning(
                            "drover has no Unix-socket listener; ignored (agents connect over TCP)",
                        )),
                    }
                }
            }
            "AllowedNodeNames" => {
                (self.allowed_names, c.allowed_patterns) = names_and_patterns(at)?;
                self.allowed_at = Some(Origin::of(at));
            }
            "HeartbeatInterval" => c.heartbeat_interval_ms = at.number(0, MAX_MS)?,
            "NodeHeartbeatThreshold" => c.node_heartbeat_threshold_ms = at.number(0, MAX_MS)?,
            "ProxyGracePeriod" => {
                c.proxy_grace_period_ms = if at.value().is_empty() {
                    None
                } else {
                    Some(at.number(0, MAX_MS)?)
                }
            }
            "ResyncInterval" => c.resync_interval_ms = at.number(0, MAX_MS)?,
            "AllowCertifiedNodes" => {
                c.allow_certified_nodes = at.boolean()?;
                self.allow_certified_at = Some(Origin::of(at));
            }
            "AllowPlaintext" => {
                c.allow_plaintext = at.boolean()?;
                self.allow_plaintext_at = Some(Origin::of(at));
            }
            "StateDirectory" => {
                c.state_directory = match at.value() {
                    "" => None,
                    v if Path::new(v).is_absolute() && !v.contains('\0') => Some(PathBuf::from(v)),
                    v => {
                        return Err(at.err(format!(
                            "'{}' is not an absolute path (e.g. /var/lib/drover)",
                            v.escape_default()
                        )));
                    }
                }
            }
            _ => {
                return Err(value::unknown_key(
                    at,
                    Daemon::Manager.section(dialect),
                    KEYS,
                ));
            }
        }
        Ok(())
    }

    /// [`Builder::finish`], and the warnings: those of the keys, and one when
    /// BlueChi's section was read and the listener falls back to loopback
    /// (BlueChi listens on every address; drover serves plaintext on loopback
    /// only unless told otherwise).
    fn finish_with_warnings(mut self) -> Result<(ManagerConfig, Vec<String>), ConfigError> {
        let mut warnings = std::mem::take(&mut self.warnings);
        let bluechi_read = self.bluechi_read;
        let allowed_at = self.allowed_at.clone();
        let cfg = self.finish()?;
        if cfg.tls.is_none() && cfg.allowed_patterns.iter().any(NodePattern::matches_all) {
            let at = allowed_at
                .map(|o| format!("{}:{}: ", o.path.display(), o.line))
                .unwrap_or_default();
            warnings.push(format!(
                "{at}key 'AllowedNodeNames': '*' without TLS admits any peer that reaches the \
                 agent port, under any name; configure TLS (docs/security.md) or list the \
                 names or narrower patterns"
            ));
        }
        if bluechi_read
            && cfg.use_tcp
            && cfg.listen_address.is_none()
            && cfg.tls.is_none()
            && !cfg.allow_plaintext
        {
            warnings.push(format!(
                "[{BLUECHI_SECTION}] read: BlueChi's controller accepts agents on every address, \
                 drover without TLS only on loopback; agents on other machines cannot connect \
                 until TLS is configured (docs/security.md) or AllowPlaintext=true is set in \
                 [{SECTION}] (docs/migrating-from-bluechi.md)"
            ));
        }
        Ok((cfg, warnings))
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
        let by_pattern = cfg
            .nodes
            .iter()
            .filter(|n| n.allowed.is_none() && cfg.pattern_matches(&n.name))
            .map(|n| &n.name);
        for name in self
            .allowed_names
            .iter()
            .chain(from_sections)
            .chain(by_pattern)
        {
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
        cfg.tls = self.tls.finish()?;
        ha::finish(&mut cfg.ha, &self.ha)?;
        check_transport(
            &cfg,
            &self.tls,
            self.listen_at.as_ref(),
            self.allow_plaintext_at.as_ref(),
            self.allow_certified_at.as_ref(),
        )?;
        Ok(cfg)
    }
}

/// The transport rules of the module doc, after the last layer. Each error
/// names the key (and its file and line) that contradicts the others.
fn check_transport(
    cfg: &ManagerConfig,
    tls: &TlsKeys,
    listen_at: Option<&Origin>,
    allow_plaintext_at: Option<&Origin>,
    allow_certified_at: Option<&Origin>,
) -> Result<(), ConfigError> {
    // An origin is recorded whenever the key was set, so these never fall
    // back; the fallback only keeps the function total.
    let at = |o: Option<&Origin>, key: &str| {
        o.cloned().unwrap_or_else(|| Origin {
            path: "<config>".into(),
            line: 0,
            key: key.into(),
        })
    };
    if cfg.tls.is_some() {
        if cfg.allow_plaintext {
            let tls_at = tls
                .first_origin()
                .map(|o| format!(" ({} in {}:{})", o.key, o.path.display(), o.line))
                .unwrap_or_default();
            return Err(at(allow_plaintext_at, "AllowPlaintext").err(format!(
                "TLS is configured{tls_at}, and with TLS plaintext is refused; \
                 remove AllowPlaintext or set it to false"
            )));
        }
        return Ok(());
    }
    if cfg.allow_certified_nodes {
        return Err(at(allow_certified_at, "AllowCertifiedNodes").err(
            "needs TLS: set TLSCertificate, TLSPrivateKey and TLSCertificateAuthority \
             (without certificates it would admit nobody)",
        ));
    }
    if let Some(addr) = cfg.listen_address
        && !cfg.plaintext_allowed_on(addr)
    {
        return Err(at(listen_at, "ListenAddress").err(format!(
            "{addr} is not a loopback address and TLS is not configured: set \
             TLSCertificate, TLSPrivateKey and TLSCertificateAuthority, or accept \
             unauthenticated agents with AllowPlaintext=true"
        )));
    }
    Ok(())
}

/// `AllowedNodeNames`: names, and patterns (an item with `*`, `?` or `[`),
/// each list without duplicates. Each error names the item.
fn names_and_patterns(at: At<'_>) -> Result<(Vec<NodeName>, Vec<NodePattern>), ConfigError> {
    let mut names = Vec::new();
    let mut patterns: Vec<NodePattern> = Vec::new();
    for item in at.value().split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        if is_pattern(item) {
            let pattern = NodePattern::new(item).map_err(|e| at.err(e))?;
            if !patterns.contains(&pattern) {
                patterns.push(pattern);
            }
        } else {
            let name = NodeName::new(item).map_err(|e| at.err(e.to_string()))?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Ok((names, patterns))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{TempDir, config_root_env};
    use crate::{LogLevel, LogTarget};
    use std::collections::HashMap;
    use std::path::PathBuf;

    fn names(list: &[NodeName]) -> Vec<&str> {
        list.iter().map(|n| n.as_str()).collect()
    }

    fn nn(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    /// Asserts `err` is a value error at `<string>:line` for `key`, and
    /// returns its message.
    fn value_err(err: ConfigError, line: usize, key: &str) -> String {
        match err {
            ConfigError::Value {
                path,
                line: l,
                key: k,
                message,
            } if path == Path::new("<string>") && l == line && k == key => message,
            other => panic!("expected <string>:{line} key {key}, got {other:?} ({other})"),
        }
    }

    fn syntax_err(err: ConfigError, line: usize) -> String {
        match err {
            ConfigError::Syntax {
                line: l, message, ..
            } if l == line => message,
            other => panic!("expected a syntax error at line {line}, got {other:?}"),
        }
    }

    #[test]
    fn state_directory_key_then_systemd_then_none() {
        use std::ffi::OsStr;
        let set =
            ManagerConfig::parse_str("[drover-manager]\nStateDirectory=/srv/drover\n").unwrap();
        assert_eq!(set.state_directory, Some(PathBuf::from("/srv/drover")));
        // The key wins over systemd's directory.
        assert_eq!(
            set.state_directory(Some(OsStr::new("/var/lib/drover"))),
            Some(PathBuf::from("/srv/drover"))
        );
        let unset = ManagerConfig::parse_str("[drover-manager]\nStateDirectory=\n").unwrap();
        assert_eq!(unset.state_directory, None);
        assert_eq!(
            unset.state_directory(Some(OsStr::new("/var/lib/drover:/var/lib/other"))),
            Some(PathBuf::from("/var/lib/drover"))
        );
        assert_eq!(unset.state_directory(Some(OsStr::new("relative"))), None);
        assert_eq!(unset.state_directory(Some(OsStr::new(""))), None);
        assert_eq!(unset.state_directory(None), None);
    }

    #[test]
    fn empty_text_gives_defaults() {
        assert_eq!(
            ManagerConfig::parse_str("").unwrap(),
            ManagerConfig::default()
        );
        assert_eq!(
            ManagerConfig::parse_str("[drover-manager]\n").unwrap(),
            ManagerConfig::default()
        );
    }

    #[test]
    fn every_key() {
        let c = ManagerConfig::parse_str(
            "[drover-manager]\n\
             ControllerPort=2020\n\
             ListenAddress=::1\n\
             UseTCP=no\n\
             UseUDS=false\n\
             AllowedNodeNames=a, b ,c\n\
             HeartbeatInterval=500\n\
             NodeHeartbeatThreshold=0\n\
             TCPKeepAliveTime=0\n\
             TCPKeepAliveInterval=5\n\
             TCPKeepAliveCount=127\n\
             IPReceiveErrors=off\n\
             LogLevel=DEBUG\n\
             LogTarget=stderr-full\n\
             LogIsQuiet=Y\n\
             [node b]\n\
             AllowDependenciesOn=a,c\n",
        )
        .unwrap();
        assert_eq!(c.port, 2020);
        assert_eq!(c.listen_address, Some("::1".parse().unwrap()));
        assert!(!c.use_tcp);
        assert_eq!(names(&c.allowed_nodes), ["a", "b", "c"]);
        assert_eq!(c.heartbeat_interval_ms, 500);
        assert_eq!(c.node_heartbeat_threshold_ms, 0);
        assert_eq!(
            (
                c.link.keepalive_time_s,
                c.link.keepalive_interval_s,
                c.link.keepalive_count
            ),
            (0, 5, 127)
        );
        assert!(!c.link.ip_receive_errors);
        assert_eq!(
            c.logging,
            LoggingConfig {
                level: LogLevel::Debug,
                target: LogTarget::StderrFull,
                quiet: true
            }
        );
        let b = c.node(&nn("b")).unwrap();
        assert_eq!(b.allowed, None);
        assert_eq!(names(&b.allow_dependencies_on), ["a", "c"]);
        assert!(c.node(&nn("a")).is_none());
    }

    const TLS: &str = "TLSCertificate=/etc/drover/tls/manager.pem\n\
                       TLSPrivateKey=/etc/drover/tls/manager.key\n\
                       TLSCertificateAuthority=/etc/drover/tls/ca.pem\n";

    #[test]
    fn tls_keys_and_their_rules() {
        let c = ManagerConfig::parse_str(&format!(
            "[drover-manager]\n{TLS}TLSRevocationList=/etc/drover/tls/crl.pem\n\
             AllowCertifiedNodes=yes\nListenAddress=192.0.2.1\n"
        ))
        .unwrap();
        let tls = c.tls.clone().unwrap();
        assert_eq!(tls.certificate, Path::new("/etc/drover/tls/manager.pem"));
        assert_eq!(tls.private_key, Path::new("/etc/drover/tls/manager.key"));
        assert_eq!(tls.ca_bundle, Path::new("/etc/drover/tls/ca.pem"));
        assert_eq!(
            tls.crl.as_deref(),
            Some(Path::new("/etc/drover/tls/crl.pem"))
        );
        assert!(c.allow_certified_nodes);
        assert!(!c.allow_plaintext);
        // With TLS: all addresses by default, plaintext nowhere.
        assert_eq!(c.bind_address(true), Some("192.0.2.1".parse().unwrap()));
        assert!(!c.plaintext_allowed_on("127.0.0.1".parse().unwrap()));
        let c = ManagerConfig::parse_str(&format!("[drover-manager]\n{TLS}")).unwrap();
        assert_eq!(c.bind_address(true), None);
        assert_eq!(c.tls.unwrap().crl, None);

        // A missing piece names the first TLS key set, its line, and what is missing.
        let msg = value_err(
            ManagerConfig::parse_str(
                "[drover-manager]\nControllerPort=1\nTLSCertificate=/c.pem\nTLSPrivateKey=/k.key\n",
            )
            .unwrap_err(),
            3,
            "TLSCertificate",
        );
        assert!(msg.ends_with("TLSCertificateAuthority is not set"), "{msg}");
        value_err(
            ManagerConfig::parse_str("[drover-manager]\nTLSRevocationList=/crl.pem\n").unwrap_err(),
            2,
            "TLSRevocationList",
        );
        // TLS and plaintext contradict each other.
        let msg = value_err(
            ManagerConfig::parse_str(&format!("[drover-manager]\nAllowPlaintext=true\n{TLS}"))
                .unwrap_err(),
            2,
            "AllowPlaintext",
        );
        assert!(msg.contains("plaintext is refused"), "{msg}");
        assert!(msg.contains("TLSCertificate in <string>:3"), "{msg}");
        // AllowPlaintext=false with TLS is fine.
        ManagerConfig::parse_str(&format!("[drover-manager]\nAllowPlaintext=no\n{TLS}")).unwrap();
        // AllowCertifiedNodes means nothing without TLS.
        let msg = value_err(
            ManagerConfig::parse_str("[drover-manager]\nAllowCertifiedNodes=true\n").unwrap_err(),
            2,
            "AllowCertifiedNodes",
        );
        assert!(msg.starts_with("needs TLS"), "{msg}");
        ManagerConfig::parse_str("[drover-manager]\nAllowCertifiedNodes=false\n").unwrap();
    }

    #[test]
    fn plaintext_is_for_loopback_unless_allowed() {
        // Unset ListenAddress without TLS: loopback.
        let c = ManagerConfig::default();
        assert_eq!(c.bind_address(true), Some("::1".parse().unwrap()));
        assert_eq!(c.bind_address(false), Some("127.0.0.1".parse().unwrap()));
        assert!(c.plaintext_allowed_on("127.0.0.1".parse().unwrap()));
        assert!(c.plaintext_allowed_on("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!c.plaintext_allowed_on("192.0.2.1".parse().unwrap()));
        // Loopback addresses are fine without anything else.
        for addr in ["127.0.0.1", "127.1.2.3", "::1"] {
            let c = ManagerConfig::parse_str(&format!("[drover-manager]\nListenAddress={addr}\n"))
                .unwrap();
            assert_eq!(c.bind_address(true), Some(addr.parse().unwrap()));
        }
        // Anything else needs TLS or AllowPlaintext.
        for addr in ["0.0.0.0", "::", "192.0.2.1"] {
            let msg = value_err(
                ManagerConfig::parse_str(&format!(
                    "[drover-manager]\nUseTCP=yes\nListenAddress={addr}\n"
                ))
                .unwrap_err(),
                3,
                "ListenAddress",
            );
            assert!(msg.contains("AllowPlaintext=true"), "{msg}");
            let c = ManagerConfig::parse_str(&format!(
                "[drover-manager]\nListenAddress={addr}\nAllowPlaintext=true\n"
            ))
            .unwrap();
            assert!(c.allow_plaintext);
            assert!(c.plaintext_allowed_on(addr.parse().unwrap()));
        }
        let c = ManagerConfig::parse_str("[drover-manager]\nAllowPlaintext=true\n").unwrap();
        assert_eq!(c.bind_address(true), None, "all addresses, as BlueChi");
    }

    #[test]
    fn tls_keys_layer_and_unset() {
        let l = layout();
        l.dir.write(
            "etc.conf",
            "[drover-manager]\nTLSCertificate=/m.pem\nTLSPrivateKey=/m.key\n",
        );
        let ca = l.dir.write(
            "conf.d/10-ca.conf",
            "[drover-manager]\nTLSCertificateAuthority=/ca.pem\n",
        );
        let c = load(&l.sources, &[]).unwrap();
        assert_eq!(c.tls.unwrap().ca_bundle, Path::new("/ca.pem"));
        // A later drop-in that unsets one key leaves an incomplete set: the
        // error is at the first key still set, in its own file.
        std::fs::write(&ca, "[drover-manager]\nTLSCertificateAuthority=\n").unwrap();
        let err = load(&l.sources, &[]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Value { path, line: 2, key, .. }
                if *path == l.dir.path().join("etc.conf") && key == "TLSCertificate"),
            "{err}"
        );
    }

    #[test]
    fn garbage_in_tls_keys_names_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("TLSCertificate", "manager.pem", "not an absolute path"),
            ("TLSPrivateKey", "~/manager.key", "not an absolute path"),
            (
                "TLSCertificateAuthority",
                "/etc/drover/tls/",
                "names a directory",
            ),
            ("TLSRevocationList", "crl.pem", "not an absolute path"),
            ("AllowCertifiedNodes", "sometimes", "not a boolean"),
            ("AllowPlaintext", "", "not a boolean"),
        ];
        for (key, value, want) in cases {
            let text = format!("[drover-manager]\n{key}={value}\n");
            let msg = value_err(ManagerConfig::parse_str(&text).unwrap_err(), 2, key);
            assert!(msg.contains(want), "{key}={value}: {msg}");
        }
    }

    #[test]
    fn unknown_keys_and_sections_are_errors() {
        let err =
            ManagerConfig::parse_str("[drover-manager]\nControllerPort=1\nPrt=2\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "<string>:3: key 'Prt': unknown key in [drover-manager]"
        );
        let msg = value_err(
            ManagerConfig::parse_str("[drover-manager]\ncontrollerport=1\n").unwrap_err(),
            2,
            "controllerport",
        );
        assert!(msg.contains("did you mean 'ControllerPort'"), "{msg}");
        let msg = value_err(
            ManagerConfig::parse_str("[node a]\nAllowed=yes\nAlowed=yes\n").unwrap_err(),
            3,
            "Alowed",
        );
        assert!(msg.contains("[node a]"), "{msg}");
        // A key the agent knows is still unknown to the manager.
        value_err(
            ManagerConfig::parse_str("[drover-manager]\nNodeName=x\n").unwrap_err(),
            2,
            "NodeName",
        );

        let msg = syntax_err(
            ManagerConfig::parse_str("[drover-manager]\n[drover-managr]\n").unwrap_err(),
            2,
        );
        assert!(msg.contains("unknown section [drover-managr]"), "{msg}");
        let msg = syntax_err(
            ManagerConfig::parse_str("\n[bluechi-agent]\n").unwrap_err(),
            2,
        );
        assert!(msg.contains("[drover-manager]"), "{msg}");
        // BlueChi's section name is the same section; unknown keys are
        // errors there too, named with that section.
        let c = ManagerConfig::parse_str("[bluechi-controller]\nControllerPort=8420\n").unwrap();
        assert_eq!(c.port, 8420);
        let err = ManagerConfig::parse_str("[bluechi-controller]\nControllerPrt=1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "<string>:2: key 'ControllerPrt': unknown key in [bluechi-controller]"
        );
        // "nodes x" is not a node section.
        syntax_err(ManagerConfig::parse_str("[nodes x]\n").unwrap_err(), 1);
    }

    #[test]
    fn bad_values_name_line_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("ControllerPort", "0", "out of range"),
            ("ControllerPort", "65536", "out of range"),
            ("ControllerPort", "84x", "not a number"),
            ("ControllerPort", "", "not a number"),
            ("ListenAddress", "localhost", "not an IP address"),
            ("StateDirectory", "var/lib/drover", "not an absolute path"),
            ("StateDirectory", "./state", "not an absolute path"),
            ("UseTCP", "maybe", "not a boolean"),
            ("UseTCP", "", "not a boolean"),
            ("UseUDS", "true", "no Unix-socket listener"),
            ("AllowedNodeNames", "good,bad_one", "bad_one"),
            ("AllowedNodeNames", "a,-b", "-b"),
            ("HeartbeatInterval", "-1", "not a number"),
            ("HeartbeatInterval", "86400001", "out of range"),
            ("NodeHeartbeatThreshold", "1e3", "not a number"),
            ("ProxyGracePeriod", "-5", "not a number"),
            ("ProxyGracePeriod", "86400001", "out of range"),
            ("ProxyGracePeriod", "10s", "not a number"),
            ("ResyncInterval", "-1", "not a number"),
            ("ResyncInterval", "60s", "not a number"),
            ("ResyncInterval", "86400001", "out of range"),
            ("TCPKeepAliveTime", "32768", "out of range"),
            ("TCPKeepAliveCount", "128", "out of range"),
            ("IPReceiveErrors", "2", "not a boolean"),
            ("LogLevel", "debug", "not a log level"),
            ("LogTarget", "syslog", "not a log target"),
            ("LogIsQuiet", "quiet", "not a boolean"),
            ("MetricsListenAddress", "localhost:9842", "is not PORT"),
            ("MetricsListenAddress", "0", "port 0"),
            ("MetricsListenAddress", "65536", "out of range"),
            ("MetricsListenAddress", "[::1]:0", "port 0"),
            (
                "MetricsListenAddress",
                "9842 # port",
                "comments must be on their own line",
            ),
            ("MetricsPerNode", "sometimes", "not a boolean"),
            ("EtcdEndpoints", "127.0.0.1:2379", "not http(s)://HOST:PORT"),
            ("EtcdEndpoints", "https://e:2379", "need etcd's mutual TLS"),
            ("EtcdEndpoints", "http://e:0", "port must be"),
            ("EtcdKeyPrefix", "drover", "must start with '/'"),
            ("EtcdKeyPrefix", "/drover/", "must not end with '/'"),
            ("EtcdLeaseTTL", "1", "out of range"),
            ("EtcdLeaseTTL", "3601", "out of range"),
            ("EtcdLeaseTTL", "5s", "not a number"),
            ("EtcdLeaseTTL", "", "not a number"),
        ];
        for (key, value, want) in cases {
            let text = format!("# comment\n[drover-manager]\nUseTCP=true\n{key}={value}\n");
            let err = ManagerConfig::parse_str(&text).unwrap_err();
            let msg = value_err(err, 4, key);
            assert!(msg.contains(want), "{key}={value}: {msg}");
        }
    }

    #[test]
    fn ha_keys() {
        // Off by default: nothing of etcd is touched.
        let c = ManagerConfig::parse_str("[drover-manager]\n").unwrap();
        assert!(!c.ha.enabled());
        let c = ManagerConfig::parse_str(
            "[drover-manager]\nEtcdEndpoints=http://127.0.0.1:2379,http://[::1]:2379\n\
             EtcdKeyPrefix=/fleet-a\nEtcdLeaseTTL=2\n",
        )
        .unwrap();
        assert!(c.ha.enabled());
        assert_eq!(c.ha.endpoints.len(), 2);
        assert_eq!(c.ha.leader_key(), "/fleet-a/leader");
        assert_eq!(c.ha.lease_ttl_s, 2);
        // An empty value switches HA off again (a drop-in over a main file).
        let c = ManagerConfig::parse_str(
            "[drover-manager]\nEtcdEndpoints=http://127.0.0.1:2379\nEtcdEndpoints=\n",
        )
        .unwrap();
        assert!(!c.ha.enabled());
    }

    #[test]
    fn etcd_tls_keys_and_their_rules() {
        const KEYS: &str = "EtcdTLSCertificate=/etc/drover/etcd/client.pem\n\
                            EtcdTLSPrivateKey=/etc/drover/etcd/client.key\n\
                            EtcdTLSCertificateAuthority=/etc/drover/etcd/ca.pem\n";
        let c = ManagerConfig::parse_str(&format!(
            "[drover-manager]\nEtcdEndpoints=https://10.0.0.1:2379\n{KEYS}"
        ))
        .unwrap();
        let tls = c.ha.tls.clone().unwrap();
        assert_eq!(tls.certificate, Path::new("/etc/drover/etcd/client.pem"));
        assert_eq!(tls.private_key, Path::new("/etc/drover/etcd/client.key"));
        assert_eq!(tls.ca_bundle, Path::new("/etc/drover/etcd/ca.pem"));
        assert!(c.ha.endpoints[0].tls);
        // The agents' TLS is another thing: none here.
        assert_eq!(c.tls, None);
        // https:// without the keys, named at EtcdEndpoints.
        let msg = value_err(
            ManagerConfig::parse_str("[drover-manager]\nEtcdEndpoints=https://e:2379\n")
                .unwrap_err(),
            2,
            "EtcdEndpoints",
        );
        assert!(msg.contains("need etcd's mutual TLS"), "{msg}");
        // The keys without https://, named at the first key.
        let msg = value_err(
            ManagerConfig::parse_str(&format!(
                "[drover-manager]\nEtcdEndpoints=http://e:2379\n{KEYS}"
            ))
            .unwrap_err(),
            3,
            "EtcdTLSCertificate",
        );
        assert!(msg.contains("for https:// endpoints"), "{msg}");
        let msg = value_err(
            ManagerConfig::parse_str(&format!("[drover-manager]\n{KEYS}")).unwrap_err(),
            2,
            "EtcdTLSCertificate",
        );
        assert!(msg.contains("EtcdEndpoints is not set"), "{msg}");
        // All or nothing.
        let msg = value_err(
            ManagerConfig::parse_str(
                "[drover-manager]\nEtcdEndpoints=https://e:2379\n\
                 EtcdTLSPrivateKey=/k.key\n",
            )
            .unwrap_err(),
            3,
            "EtcdTLSPrivateKey",
        );
        assert!(
            msg.ends_with("EtcdTLSCertificate and EtcdTLSCertificateAuthority are not set"),
            "{msg}"
        );
        // Garbage in a key: file, line, key.
        for (key, value, want) in [
            ("EtcdTLSCertificate", "client.pem", "not an absolute path"),
            ("EtcdTLSPrivateKey", "/etc/drover/", "names a directory"),
            (
                "EtcdTLSCertificateAuthority",
                "/ca\u{7}.pem",
                "control characters",
            ),
        ] {
            let msg = value_err(
                ManagerConfig::parse_str(&format!("[drover-manager]\n{key}={value}\n"))
                    .unwrap_err(),
                2,
                key,
            );
            assert!(msg.contains(want), "{key}={value}: {msg}");
        }
        // An empty value unsets a key (a drop-in turning etcd's TLS off).
        let c = ManagerConfig::parse_str(&format!(
            "[drover-manager]\nEtcdEndpoints=https://e:2379\n{KEYS}\
             EtcdEndpoints=http://e:2379\nEtcdTLSCertificate=\nEtcdTLSPrivateKey=\n\
             EtcdTLSCertificateAuthority=\n"
        ))
        .unwrap();
        assert_eq!(c.ha.tls, None);
    }

    #[test]
    fn allowed_node_names_takes_patterns() {
        let c = ManagerConfig::parse_str(
            "[drover-manager]\n\
             AllowedNodeNames=db1, edge-*, lab-??,edge-*,rack[0-9]-*\n\
             [node edge-7]\nAllowDependenciesOn=db1\n\
             [node edge-8]\nAllowed=false\n\
             [node other]\nAllowDependenciesOn=db1\n",
        )
        .unwrap();
        let patterns: Vec<&str> = c.allowed_patterns.iter().map(|p| p.as_str()).collect();
        assert_eq!(patterns, ["edge-*", "lab-??", "rack[0-9]-*"]);
        // db1 by name; edge-7 because a pattern admits its section's node;
        // not edge-8 (Allowed=false), not other (no name, no pattern).
        assert_eq!(names(&c.allowed_nodes), ["db1", "edge-7"]);
        assert!(c.pattern_matches(&nn("edge-123")) && c.pattern_matches(&nn("lab-01")));
        assert!(!c.pattern_matches(&nn("lab-1")) && !c.pattern_matches(&nn("db2")));
        // An empty value resets the patterns with the names.
        let c =
            ManagerConfig::parse_str("[drover-manager]\nAllowedNodeNames=a*\nAllowedNodeNames=\n")
                .unwrap();
        assert!(c.allowed_patterns.is_empty() && c.allowed_nodes.is_empty());
    }

    #[test]
    fn garbage_patterns_name_key_and_value() {
        let cases: &[(&str, &str)] = &[
            ("edge_*", "edge_*"),
            ("edge-**", "'**'"),
            ("rack[0-9", "without its ']'"),
            ("-*", "starts with a letter or digit"),
            ("a,edge *", "edge *"),
            ("[]", "empty set"),
        ];
        for (value, want) in cases {
            let text = format!("[drover-manager]\nAllowedNodeNames={value}\n");
            let msg = value_err(
                ManagerConfig::parse_str(&text).unwrap_err(),
                2,
                "AllowedNodeNames",
            );
            assert!(msg.contains(want), "{value}: {msg}");
        }
        // Patterns are for AllowedNodeNames only.
        let msg = value_err(
            ManagerConfig::parse_str("[node a]\nAllowDependenciesOn=b,edge-*\n").unwrap_err(),
            2,
            "AllowDependenciesOn",
        );
        assert!(msg.contains("'edge-*' is a pattern"), "{msg}");
        let msg = syntax_err(
            ManagerConfig::parse_str("[drover-manager]\n[node edge-*]\n").unwrap_err(),
            2,
        );
        assert!(msg.contains("not a pattern"), "{msg}");
    }

    #[test]
    fn lone_star_is_warned_about_without_tls() {
        let dir = TempDir::new("mgr-star");
        let file = dir.path().join("m.conf");
        std::fs::write(&file, "[drover-manager]\nAllowedNodeNames=db1,*\n").unwrap();
        let sources = Sources::only(Some(file.clone()));
        let (c, report) = ManagerConfig::load_with_env(&sources, &|_| None).unwrap();
        assert!(c.pattern_matches(&nn("anything")));
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("m.conf:2: key 'AllowedNodeNames'") && w.contains("any peer")),
            "{:?}",
            report.warnings
        );
        std::fs::write(&file, "[drover-manager]\nAllowedNodeNames=db1,edge-*\n").unwrap();
        let (_, report) = ManagerConfig::load_with_env(&sources, &|_| None).unwrap();
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    }

    #[test]
    fn node_section_errors() {
        let msg = syntax_err(
            ManagerConfig::parse_str("[drover-manager]\n[node bad_name]\n").unwrap_err(),
            2,
        );
        assert!(msg.contains("bad_name"), "{msg}");
        syntax_err(ManagerConfig::parse_str("[node]\n").unwrap_err(), 1);
        value_err(
            ManagerConfig::parse_str("[node a]\nAllowed=perhaps\n").unwrap_err(),
            2,
            "Allowed",
        );
        let msg = value_err(
            ManagerConfig::parse_str("[node a]\nAllowDependenciesOn=b,c d\n").unwrap_err(),
            2,
            "AllowDependenciesOn",
        );
        assert!(msg.contains("c d"), "{msg}");
        let msg = value_err(
            ManagerConfig::parse_str("[node a]\nRequiredSelinuxContext=x_t\n").unwrap_err(),
            2,
            "RequiredSelinuxContext",
        );
        assert!(msg.contains("not supported"), "{msg}");
    }

    #[test]
    fn allowed_nodes_order_and_denial() {
        let c = ManagerConfig::parse_str(
            "[node z]\nAllowed=true\n\
             [drover-manager]\nAllowedNodeNames=b,a,b\n\
             [node a]\nAllowed=true\n\
             [node y]\nAllowed=true\n\
             [node b]\nAllowed=false\n\
             [node x]\nAllowDependenciesOn=z\n",
        )
        .unwrap();
        // List items first, then sections in order; b is denied explicitly;
        // x has a section but never said Allowed.
        assert_eq!(names(&c.allowed_nodes), ["a", "z", "y"]);
        let order: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(order, ["z", "a", "y", "b", "x"]);
        // A repeated section merges into the first; Allowed= resets.
        let c = ManagerConfig::parse_str(
            "[node a]\nAllowed=true\nAllowDependenciesOn=b\n[node a]\nAllowed=\n",
        )
        .unwrap();
        assert!(c.allowed_nodes.is_empty());
        assert_eq!(c.nodes.len(), 1);
        assert_eq!(names(&c.nodes[0].allow_dependencies_on), ["b"]);
    }

    #[test]
    fn long_multiline_allowed_node_names() {
        // BlueChi's bluechi-long-multiline-config-setting: a list spread over
        // many indented lines, well past one line's limit in total.
        let all: Vec<String> = (0..150).map(|i| format!("node-{i:03}")).collect();
        let mut text = String::from("[drover-manager]\nAllowedNodeNames=");
        for chunk in all.chunks(10) {
            text.push_str(&chunk.join(","));
            text.push_str(",\n    ");
        }
        text.push_str("\nControllerPort=900\n");
        assert!(text.len() > crate::ini::MAX_LINE * 2);
        let c = ManagerConfig::parse_str(&text).unwrap();
        assert_eq!(names(&c.allowed_nodes), all);
        assert_eq!(c.port, 900);
    }

    #[test]
    fn heartbeat_threshold_must_exceed_interval() {
        let err = ManagerConfig::parse_str(
            "[drover-manager]\nHeartbeatInterval=3000\nNodeHeartbeatThreshold=3000\n",
        )
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid(m) if m.contains("NodeHeartbeatThreshold")),
            "{err}"
        );
        // Either being 0 disables the rule.
        for text in [
            "[drover-manager]\nHeartbeatInterval=0\nNodeHeartbeatThreshold=100\n",
            "[drover-manager]\nHeartbeatInterval=9000\nNodeHeartbeatThreshold=0\n",
        ] {
            assert!(ManagerConfig::parse_str(text).is_ok(), "{text}");
        }
    }

    #[test]
    fn proxy_grace_period() {
        // Unset: three heartbeat thresholds, following the threshold.
        let c = ManagerConfig::default();
        assert_eq!(c.proxy_grace_period_ms, None);
        assert_eq!(c.proxy_grace_ms(), 18_000);
        let c =
            ManagerConfig::parse_str("[drover-manager]\nNodeHeartbeatThreshold=2500\n").unwrap();
        assert_eq!(c.proxy_grace_ms(), 7_500);
        // A disabled threshold does not make the grace zero.
        let c = ManagerConfig::parse_str("[drover-manager]\nNodeHeartbeatThreshold=0\n").unwrap();
        assert_eq!(c.proxy_grace_ms(), 18_000);
        // Set explicitly, including 0 (drop at once) and the cap.
        for (value, want) in [("0", 0), ("1500", 1500), ("86400000", 86_400_000)] {
            let c = ManagerConfig::parse_str(&format!(
                "[drover-manager]\nNodeHeartbeatThreshold=3000\nProxyGracePeriod={value}\n"
            ))
            .unwrap();
            assert_eq!(c.proxy_grace_period_ms, Some(want));
            assert_eq!(c.proxy_grace_ms(), want);
        }
        // A huge threshold never yields more than the one-day cap.
        let c = ManagerConfig::parse_str(
            "[drover-manager]\nHeartbeatInterval=0\nNodeHeartbeatThreshold=86400000\n",
        )
        .unwrap();
        assert_eq!(c.proxy_grace_ms(), MAX_MS);
        // An empty value in a later layer resets an earlier one.
        let c = ManagerConfig::parse_str(
            "[drover-manager]\nProxyGracePeriod=10\n[drover-manager]\nProxyGracePeriod=\n",
        )
        .unwrap();
        assert_eq!(c.proxy_grace_period_ms, None);
    }

    #[test]
    fn resync_interval_defaults_to_a_minute_and_zero_turns_it_off() {
        let c = ManagerConfig::parse_str("[drover-manager]\n").unwrap();
        assert_eq!(c.resync_interval_ms, 60_000);
        for (value, want) in [("0", 0), ("2000", 2000), ("86400000", MAX_MS)] {
            let c =
                ManagerConfig::parse_str(&format!("[drover-manager]\nResyncInterval={value}\n"))
                    .unwrap();
            assert_eq!(c.resync_interval_ms, want);
        }
    }

    /// Loads `sources` with the given environment.
    fn load(sources: &Sources, env: &[(&str, &str)]) -> Result<ManagerConfig, ConfigError> {
        let env: HashMap<String, OsString> = env
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        ManagerConfig::load_with_env(sources, &|k| env.get(k).cloned()).map(|(c, _)| c)
    }

    struct Layout {
        dir: TempDir,
        sources: Sources,
    }

    fn layout() -> Layout {
        let dir = TempDir::new("mgr-layers");
        let d = dir.path();
        std::fs::create_dir(d.join("conf.d")).unwrap();
        let sources = Sources {
            vendor: Some(d.join("vendor.conf")),
            etc: Some(d.join("etc.conf")),
            dropins: Some(d.join("conf.d")),
            env: true,
            ..Sources::default()
        };
        Layout { dir, sources }
    }

    #[test]
    fn layers_override_in_order() {
        let l = layout();
        l.dir.write(
            "vendor.conf",
            "[drover-manager]\nControllerPort=1001\nUseTCP=false\nLogLevel=ERROR\n\
             AllowedNodeNames=v1,v2\n[node v1]\nAllowDependenciesOn=v2\n",
        );
        l.dir.write(
            "etc.conf",
            "[drover-manager]\nControllerPort=1002\nAllowedNodeNames=e1\n",
        );
        // Written out of order: they must apply alphabetically.
        l.dir.write(
            "conf.d/20-second.conf",
            "[drover-manager]\nControllerPort=1004\n[node e1]\nAllowed=false\n",
        );
        l.dir.write(
            "conf.d/10-first.conf",
            "[drover-manager]\nControllerPort=1003\nHeartbeatInterval=100\n\
             [node d1]\nAllowed=true\n[node v1]\nAllowDependenciesOn=d1\n",
        );
        let c = load(&l.sources, &[]).unwrap();
        assert_eq!(c.port, 1004, "last drop-in wins");
        assert!(!c.use_tcp, "vendor key kept when nobody overrides it");
        assert_eq!(c.heartbeat_interval_ms, 100);
        assert_eq!(c.logging.level, LogLevel::Error);
        // AllowedNodeNames replaced as a whole by etc; e1 then denied by a drop-in.
        assert_eq!(names(&c.allowed_nodes), ["d1"]);
        assert_eq!(
            names(&c.node(&nn("v1")).unwrap().allow_dependencies_on),
            ["d1"]
        );

        // Environment over the files, `-c FILE` over the environment.
        let extra = l
            .dir
            .write("extra.conf", "[drover-manager]\nLogTarget=journald\n");
        let c = load(
            &Sources {
                extra: Some(extra.clone()),
                ..l.sources.clone()
            },
            &[
                ("DROVER_LOG_LEVEL", "WARN"),
                ("DROVER_LOG_TARGET", "stderr"),
                ("DROVER_LOG_IS_QUIET", "on"),
            ],
        )
        .unwrap();
        assert_eq!(c.logging.level, LogLevel::Warn);
        assert_eq!(c.logging.target, LogTarget::Journald);
        assert!(c.logging.quiet);
        assert_eq!(c.port, 1004);

        // env: false ignores the environment.
        let c = load(
            &Sources {
                env: false,
                ..l.sources.clone()
            },
            &[("DROVER_LOG_LEVEL", "WARN")],
        )
        .unwrap();
        assert_eq!(c.logging.level, LogLevel::Error);

        // A later layer's Allowed=false removes a node an earlier layer allowed.
        l.dir
            .write("conf.d/30-third.conf", "[node d1]\nAllowed=no\n");
        assert!(load(&l.sources, &[]).unwrap().allowed_nodes.is_empty());
    }

    #[test]
    fn missing_files() {
        let l = layout();
        // Nothing exists: defaults.
        assert_eq!(load(&l.sources, &[]).unwrap(), ManagerConfig::default());
        let none = Sources {
            dropins: Some(l.dir.path().join("absent.d")),
            ..l.sources.clone()
        };
        assert_eq!(load(&none, &[]).unwrap(), ManagerConfig::default());
        // But -c FILE must exist.
        let gone = l.dir.path().join("gone.conf");
        let err = load(&Sources::only(Some(gone.clone())), &[]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Read { path, .. } if *path == gone),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_file_they_are_in() {
        let l = layout();
        l.dir
            .write("etc.conf", "[drover-manager]\nControllerPort=5\n");
        let bad = l.dir.write(
            "conf.d/50-typo.conf",
            "\n[drover-manager]\nControllerPrt=6\n",
        );
        let err = load(&l.sources, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3: key 'ControllerPrt': unknown key in [drover-manager]",
                bad.display()
            )
        );
        std::fs::write(&bad, b"[drover-manager]\nLogLevel=\xc3INFO\n").unwrap();
        let err = load(&l.sources, &[]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Syntax { path, line: 2, .. } if *path == bad),
            "{err}"
        );
        std::fs::remove_file(&bad).unwrap();
        let err = load(&l.sources, &[("DROVER_LOG_TARGET", "file")]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Env { var, .. } if var == "DROVER_LOG_TARGET"),
            "{err}"
        );
    }

    /// BlueChi's files alone (under a config root), then drover's over them.
    #[test]
    fn bluechi_files_under_a_config_root() {
        let dir = TempDir::new("mgr-bluechi");
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc/bluechi/controller.conf.d")).unwrap();
        let main = dir.write(
            "etc/bluechi/controller.conf",
            "[bluechi-controller]\nControllerPort=8420\nAllowedNodeNames=n1,\n  n2\n\
             UseUDS=true\nHeartbeatInterval=0\n",
        );
        dir.write(
            "etc/bluechi/controller.conf.d/50-deps.conf",
            "[node n1]\nAllowDependenciesOn=n2\n[bluechi-controller]\nLogLevel=DEBUG\n",
        );
        let env = config_root_env(root);
        let sources = Sources::from_env("manager", None, &env).unwrap();
        let (c, report) = ManagerConfig::load_with_env(&sources, &env).unwrap();
        assert_eq!(c.port, 8420);
        assert_eq!(names(&c.allowed_nodes), ["n1", "n2"]);
        assert_eq!(
            names(&c.node(&nn("n1")).unwrap().allow_dependencies_on),
            ["n2"]
        );
        assert_eq!(c.heartbeat_interval_ms, 0);
        assert_eq!(c.logging.level, LogLevel::Debug);
        assert_eq!(
            report.files,
            [
                main.clone(),
                root.join("etc/bluechi/controller.conf.d/50-deps.conf")
            ]
        );
        assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
        assert_eq!(
            report.warnings[0],
            format!(
                "{}:5: key 'UseUDS': drover has no Unix-socket listener; ignored (agents \
                 connect over TCP)",
                main.display()
            )
        );
        assert!(
            report.warnings[1].contains("loopback"),
            "{}",
            report.warnings[1]
        );

        // drover's files win; with AllowPlaintext the loopback warning goes.
        std::fs::create_dir_all(root.join("etc/drover/manager.conf.d")).unwrap();
        dir.write(
            "etc/drover/manager.conf.d/plain.conf",
            "[drover-manager]\nAllowPlaintext=true\nControllerPort=9000\n",
        );
        let (c, report) = ManagerConfig::load_with_env(&sources, &env).unwrap();
        assert_eq!(c.port, 9000);
        assert_eq!(names(&c.allowed_nodes), ["n1", "n2"]);
        assert_eq!(report.files.len(), 3);
        assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);

        // Security settings drover cannot enforce stay errors in BlueChi's files.
        dir.write(
            "etc/bluechi/controller.conf.d/60-selinux.conf",
            "[node n1]\nRequiredSelinuxContext=haproxy_t\n",
        );
        let err = ManagerConfig::load_with_env(&sources, &env).unwrap_err();
        assert!(err.to_string().contains("RequiredSelinuxContext"), "{err}");
    }

    #[test]
    fn real_file_through_public_load() {
        let dir = TempDir::new("mgr-file");
        let path: PathBuf = dir.write(
            "manager.conf",
            "# written by a test\n[drover-manager]\nControllerPort = 4242\n\
             AllowedNodeNames = alpha,\n   beta\n",
        );
        let c = ManagerConfig::load(&Sources {
            extra: Some(path),
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(c.port, 4242);
        assert_eq!(names(&c.allowed_nodes), ["alpha", "beta"]);
    }

    /// The shipped vendor file parses, and every default it shows in a
    /// comment is the real default: uncommenting them all changes nothing.
    #[test]
    fn shipped_manager_conf() {
        let text = include_str!("../../dist/usr/share/drover/manager.conf");
        assert_eq!(
            ManagerConfig::parse_str(text).unwrap(),
            ManagerConfig::default()
        );
        let (uncommented, shown) = crate::test_util::uncomment_defaults(text, KEYS);
        assert_eq!(
            ManagerConfig::parse_str(&uncommented).unwrap(),
            ManagerConfig::default()
        );
        // Every key except UseUDS (BlueChi compatibility only) is documented.
        assert!(shown >= KEYS.len() - 1, "{shown} keys shown");
        for node_key in ["Allowed", "AllowDependenciesOn"] {
            assert!(text.contains(&format!("#{node_key}=")), "{node_key}");
        }
    }
}
