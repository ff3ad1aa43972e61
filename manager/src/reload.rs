//! `SIGHUP`: reload the configuration from the same sources as at start.
//!
//! What a reload changes at once:
//!
//! * nodes added to `AllowedNodeNames` (or by `[node NAME]` `Allowed=true`)
//!   get their `org.eclipse.bluechi.Node` object and may register;
//! * `AllowDependenciesOn` of every node: references the new lists no longer
//!   permit are dropped at once (their dep is stopped if they were the last,
//!   the requesting agent gets `ProxyError` so its proxy unit stops), new
//!   permissions apply to the next `ProxyNew`;
//! * `ProxyGracePeriod`: for disconnects from then on (running grace periods
//!   keep their deadline);
//! * `LogLevel` (as `Controller.SetLogLevel` would), before anything else,
//!   so whoever sees another change take effect sees the new level too;
//! * who may register (`AllowedNodeNames`, `Allowed=`, `AllowCertifiedNodes`):
//!   a node no longer allowed is refused at its next hello, and its online
//!   session is dropped now;
//! * with TLS, the files of `TLSCertificate`, `TLSPrivateKey`,
//!   `TLSCertificateAuthority` and `TLSRevocationList` are read again and put
//!   in force for the next handshakes (healthy sessions stay up: rotating the
//!   manager's or a node's certificate drops nothing); every online session
//!   whose certificate the new CRL revokes is dropped. Files that fail to
//!   load, or a CRL older (lower CRL number) than the one in force for the
//!   same CA, keep the TLS settings in force (logged), the rest of the reload
//!   still applies.
//!
//! New nodes get their object through the node lifecycle
//! ([`Lifecycle::reconfigure`]), the one way node objects reach the bus, so
//! `Introspect` lists them as `GetNode` finds them.
//!
//! What it does not change: a node removed from the list keeps its object
//! (and its place in `Introspect`) until the manager restarts; listener, heartbeat, TLS on/off (or other
//! paths), `LogTarget` and `LogIsQuiet` apply at the next start.
//! Both are logged. A config that does not load is logged and the running
//! one is kept, whole.
//!
//! [`reload_from_source`] is the reload the binary runs on `SIGHUP` and on
//! `io.drover.Controller.Reload` (what the unit's `ExecReload=` calls): one
//! at a time, between `RELOADING=1` and `READY=1` to the service manager
//! ([`crate::notify`]), so `systemctl reload` returns once it is applied.

use crate::logs::LogControl;
use crate::nodes::lifecycle::Lifecycle;
use crate::nodes::link_stats::Disconnect;
use crate::nodes::registry::Policy as AdmitPolicy;
use crate::notify;
use crate::proxies::driver::Proxies;
use crate::proxies::rules::Policy;
use drover_config::{ConfigError, ManagerConfig};
use drover_protocol::NodeName;
use drover_tls::Acceptor;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// What a reload did (logged; returned for tests).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Nodes that became known.
    pub added: Vec<NodeName>,
    /// Nodes the new config no longer lists (kept until restart).
    pub kept: Vec<NodeName>,
    /// Keys that differ but only apply at the next start.
    pub at_restart: Vec<&'static str>,
    /// Whether new TLS settings were put in force.
    pub tls_reloaded: bool,
    /// Online sessions dropped: (node, why).
    pub dropped: Vec<(NodeName, String)>,
}

/// Why [`reload_from_source`] changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this manager was started without a configuration source; nothing to reload from")]
    NoSource,
    #[error("the configuration does not load, the running one is kept: {0}")]
    Config(ConfigError),
}

/// Loads the configuration again, from the sources and flags of the start.
pub type ConfigSource =
    Box<dyn Fn() -> Result<ManagerConfig, drover_config::ConfigError> + Send + Sync>;

/// What a reload changes, and where the configuration comes from.
pub struct Reloader {
    /// The configuration the manager started with: what only a restart
    /// changes is compared with it.
    config: Arc<ManagerConfig>,
    /// The TLS acceptor in force (a reload swaps its settings).
    tls: Option<Acceptor>,
    log: Arc<LogControl>,
    nodes: Arc<Lifecycle>,
    proxies: Proxies,
    /// Set by the binary; unset in library use, where only [`reload`] with a
    /// config is possible.
    source: OnceLock<ConfigSource>,
    /// Held for the whole of a reload, so two never interleave.
    lock: tokio::sync::Mutex<()>,
}

impl Reloader {
    pub fn new(
        config: Arc<ManagerConfig>,
        tls: Option<Acceptor>,
        log: Arc<LogControl>,
        nodes: Arc<Lifecycle>,
        proxies: Proxies,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            tls,
            log,
            nodes,
            proxies,
            source: OnceLock::new(),
            lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Where reloads read the configuration (once; later calls are ignored).
    pub fn set_source(&self, source: ConfigSource) {
        let _ = self.source.set(source);
    }
}

/// Loads the configuration from the start's sources and flags and applies
/// it, told to the service manager as `RELOADING=1` … `READY=1`. Reloads
/// run one at a time.
pub async fn reload_from_source(reloader: &Reloader) -> Result<Report, ReloadError> {
    let _one_at_a_time = reloader.lock.lock().await;
    notify::reloading();
    let result = match reloader.source.get().map(|load| load()) {
        Some(loaded) => apply(reloader, loaded).await.map_err(ReloadError::Config),
        None => Err(ReloadError::NoSource),
    };
    notify::reloaded(*reloader.nodes.node_counts().borrow());
    result
}

/// Applies `loaded` (the result of loading the config again), one reload at
/// a time. `Err` when it did not load: nothing changed.
pub async fn reload(
    reloader: &Reloader,
    loaded: Result<ManagerConfig, ConfigError>,
) -> Result<Report, ConfigError> {
    let _one_at_a_time = reloader.lock.lock().await;
    apply(reloader, loaded).await
}

async fn apply(
    reloader: &Reloader,
    loaded: Result<ManagerConfig, ConfigError>,
) -> Result<Report, ConfigError> {
    let new = match loaded {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("config reload failed, keeping the running configuration: {e}");
            return Err(e);
        }
    };
    let old = &reloader.config;
    let mut report = Report {
        at_restart: restart_only(old, &new),
        ..Report::default()
    };
    // The log level first: the reload's own messages follow it, and whoever
    // sees a later step take effect (a new node's object on the bus) sees the
    // new level too.
    if reloader.log.get() != new.logging.level {
        tracing::info!("config reload: log level {}", new.logging.level.as_str());
        reloader.log.set(new.logging.level);
    }
    // TLS files first: what the new CRL revokes decides which sessions go.
    let tls = match (&reloader.tls, &new.tls) {
        (Some(acceptor), Some(files)) if old.tls.as_ref() == Some(files) => {
            let loaded = drover_tls::ServerSettings::load(files);
            match loaded.map(|s| (s.crl_rollback_from(&acceptor.settings()), s)) {
                Ok((Some(older), _)) => {
                    // An older CRL un-revokes: the one in force stays.
                    let crl = files.crl.as_deref().unwrap_or(Path::new("?"));
                    tracing::error!(
                        "config reload: refusing {}: {older}; keeping the TLS settings in force",
                        crl.display()
                    );
                    Some(acceptor.settings())
                }
                Ok((None, settings)) => {
                    tracing::info!(
                        "config reload: TLS files read again (manager certificate serial {}, \
                         {} revoked certificate(s))",
                        settings.serial(),
                        settings.revoked_count()
                    );
                    acceptor.reload(settings);
                    report.tls_reloaded = true;
                    Some(acceptor.settings())
                }
                Err(e) => {
                    tracing::error!(
                        "config reload: cannot load the TLS files, keeping the TLS settings in force: {e}"
                    );
                    Some(acceptor.settings())
                }
            }
        }
        (acceptor, _) => acceptor.as_ref().map(Acceptor::settings),
    };
    let policy = AdmitPolicy::from_config(&new);
    let changed = reloader
        .nodes
        .reconfigure(
            policy.clone(),
            |identity| tls.as_ref().is_some_and(|t| t.is_revoked(identity)),
            &new.allowed_nodes,
        )
        .await;
    report.dropped = changed
        .drop
        .iter()
        .map(|(session, why)| (session.node().clone(), why.clone()))
        .collect();
    report.kept = changed
        .known
        .iter()
        .filter(|n| !policy.allows(n, true))
        .cloned()
        .collect();
    report.added = changed.added;
    reloader
        .proxies
        .reload(Policy::from_config(&new, changed.known))
        .await;

    for (session, why) in changed.drop {
        tracing::warn!(
            node = %session.node(),
            session = session.id(),
            "config reload: dropping the session of node {}: {why}",
            session.node()
        );
        reloader
            .nodes
            .end_session(
                &session,
                Disconnect::Reload,
                &format!("config reload: {why}"),
            )
            .await;
    }
    for node in &report.added {
        tracing::info!(%node, "config reload: node added");
    }
    for node in &report.kept {
        tracing::warn!(%node, "config reload: node no longer listed; it is refused from now on, its object stays until the manager restarts");
    }
    if !report.at_restart.is_empty() {
        tracing::warn!(
            "config reload: {} changed; that takes effect when the manager restarts",
            report.at_restart.join(", ")
        );
    }
    tracing::info!("configuration reloaded");
    Ok(report)
}

/// Keys that differ between `old` and `new` and apply only at start.
fn restart_only(old: &ManagerConfig, new: &ManagerConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut check = |differs: bool, key: &'static str| {
        if differs {
            keys.push(key);
        }
    };
    check(old.port != new.port, "ControllerPort");
    check(old.listen_address != new.listen_address, "ListenAddress");
    check(old.use_tcp != new.use_tcp, "UseTCP");
    check(
        old.heartbeat_interval_ms != new.heartbeat_interval_ms,
        "HeartbeatInterval",
    );
    check(
        old.node_heartbeat_threshold_ms != new.node_heartbeat_threshold_ms,
        "NodeHeartbeatThreshold",
    );
    check(
        (
            old.link.keepalive_time_s,
            old.link.keepalive_interval_s,
            old.link.keepalive_count,
        ) != (
            new.link.keepalive_time_s,
            new.link.keepalive_interval_s,
            new.link.keepalive_count,
        ),
        "TCPKeepAlive*",
    );
    check(
        old.link.ip_receive_errors != new.link.ip_receive_errors,
        "IPReceiveErrors",
    );
    check(old.logging.target != new.logging.target, "LogTarget");
    check(old.logging.quiet != new.logging.quiet, "LogIsQuiet");
    check(old.tls != new.tls, "TLS* (files or on/off)");
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_keys_are_named() {
        let old = ManagerConfig::default();
        assert!(restart_only(&old, &old).is_empty());
        let new = ManagerConfig::parse_str(
            "[drover-manager]\nControllerPort=900\nHeartbeatInterval=1000\n\
             ProxyGracePeriod=5\nLogLevel=DEBUG\n[node a]\nAllowDependenciesOn=b\n",
        )
        .unwrap();
        assert_eq!(
            restart_only(&old, &new),
            ["ControllerPort", "HeartbeatInterval"],
            "grace, log level and permissions apply at once"
        );
    }
}
