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
//! * `LogLevel` (as `Controller.SetLogLevel` would).
//!
//! What it does not change: a node removed from the list stays known until
//! the manager restarts (its session, jobs and object are not torn down by a
//! config edit; it does lose every dependency permission the new file does
//! not grant); listener, heartbeat, `LogTarget` and `LogIsQuiet` apply at the
//! next start.
//! Both are logged. A config that does not load is logged and the running
//! one is kept, whole.

use crate::api::node::NodeObject;
use crate::core::Core;
use crate::proxies::rules::Policy;
use drover_config::{ConfigError, ManagerConfig};
use drover_protocol::NodeName;
use std::sync::Arc;
use zbus::Connection;

/// What a reload did (logged; returned for tests).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Nodes that became known.
    pub added: Vec<NodeName>,
    /// Nodes the new config no longer lists (kept until restart).
    pub kept: Vec<NodeName>,
    /// Keys that differ but only apply at the next start.
    pub at_restart: Vec<&'static str>,
}

/// Applies `loaded` (the result of loading the config again). `Err` when it
/// did not load: nothing changed.
pub async fn reload(
    core: &Arc<Core>,
    conn: Option<&Connection>,
    loaded: Result<ManagerConfig, ConfigError>,
) -> Result<Report, ConfigError> {
    let new = match loaded {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("config reload failed, keeping the running configuration: {e}");
            return Err(e);
        }
    };
    let mut report = Report {
        at_restart: restart_only(core.config(), &new),
        ..Report::default()
    };
    let (added, known) = {
        let mut registry = core.registry();
        let added = registry.add_nodes(&new.allowed_nodes);
        let known: Vec<NodeName> = registry.nodes().iter().map(|n| n.name.clone()).collect();
        (added, known)
    };
    report.kept = known
        .iter()
        .filter(|n| !new.allowed_nodes.contains(n))
        .cloned()
        .collect();
    if let Some(conn) = conn {
        for (name, path) in &added {
            let object = NodeObject::new(core.clone(), name.clone());
            if let Err(e) = conn.object_server().at(path.as_str(), object).await {
                tracing::error!(node = %name, "cannot export the node object: {e}");
            }
        }
    }
    report.added = added.into_iter().map(|(n, _)| n).collect();
    if !report.added.is_empty() {
        // New nodes start offline: `up` may have become `degraded`.
        core.announce_controller().await;
    }
    core.proxies()
        .reload(Policy::from_config(&new, known))
        .await;
    if core.log_level() != new.logging.level {
        tracing::info!("config reload: log level {}", new.logging.level.as_str());
        core.set_log_level(new.logging.level);
    }

    for node in &report.added {
        tracing::info!(%node, "config reload: node added");
    }
    for node in &report.kept {
        tracing::warn!(%node, "config reload: node no longer listed; it stays known until the manager restarts");
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
            old.tcp_keepalive_time_s,
            old.tcp_keepalive_interval_s,
            old.tcp_keepalive_count,
        ) != (
            new.tcp_keepalive_time_s,
            new.tcp_keepalive_interval_s,
            new.tcp_keepalive_count,
        ),
        "TCPKeepAlive*",
    );
    check(
        old.ip_receive_errors != new.ip_receive_errors,
        "IPReceiveErrors",
    );
    check(old.logging.target != new.logging.target, "LogTarget");
    check(old.logging.quiet != new.logging.quiet, "LogIsQuiet");
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
