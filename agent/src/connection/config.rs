//! What the link runs with: [`LinkConfig`], built from `AgentConfig` plus
//! flags, and its defaults.
//!
//! Invariants: [`LinkConfig::managers`] lists `host:port` first, then the
//! other managers of the group, each once, in the configured order; the
//! reconnect backoff never waits longer than [`LinkConfig::backoff_cap`],
//! max(`HeartbeatInterval`, 1 s), so a manager back up is found within one
//! heartbeat interval or a second.

use crate::link::target::Endpoint;
use drover_protocol::NodeName;
use std::time::Duration;

/// TCP keepalive: idle time before probes, interval between them, probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

/// Everything the link needs; built from `AgentConfig` plus flags.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub node: NodeName,
    /// The first manager.
    pub host: String,
    pub port: u16,
    /// The other managers of a high-availability group (the rest of the
    /// `ControllerHost=` / `ControllerAddress=` list): the link holds a
    /// link to each and follows the leader ([`crate::link::follow`]).
    pub more: Vec<Endpoint>,
    /// Zero: no heartbeats (unless the manager watches for them, see
    /// [`crate::link::heartbeat`]).
    pub heartbeat_interval: Duration,
    /// Drop the link when nothing arrived for this long. Zero: never. Raised
    /// to fit the manager's announced interval; unused when it announces 0.
    pub heartbeat_threshold: Duration,
    pub quiet_after: u32,
    pub keepalive: Option<Keepalive>,
    pub ip_receive_errors: bool,
    /// Bound on resolving, connecting and the handshake, each.
    pub connect_timeout: Duration,
    /// Requests running at once.
    pub max_in_flight: usize,
    /// Messages queued for the manager before the link is dropped.
    pub outbox_capacity: usize,
    /// Mutual TLS to the manager (`None`: plaintext).
    pub tls: Option<drover_tls::Connector>,
    /// Tell the service manager the link's state (`STATUS=`, see
    /// [`crate::notify`]); the binary sets it, library users do not.
    pub notify: bool,
    /// `TLSControllerName` is unset: the certificate must name the host
    /// dialled, so a switch to another host checks that host's name.
    pub tls_name_follows_host: bool,
    /// `AdvertiseAddress=`: sent in every hello (`None`: the manager uses
    /// the address it sees).
    pub advertise_address: Option<std::net::IpAddr>,
}

impl LinkConfig {
    /// Defaults for everything but the endpoint and the name.
    pub fn new(node: NodeName, host: impl Into<String>, port: u16) -> Self {
        Self {
            node,
            host: host.into(),
            port,
            more: Vec::new(),
            heartbeat_interval: Duration::from_millis(2000),
            heartbeat_threshold: Duration::from_millis(6000),
            quiet_after: 10,
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(1),
                interval: Duration::from_secs(1),
                count: 6,
            }),
            ip_receive_errors: true,
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 64,
            outbox_capacity: 1024,
            tls: None,
            notify: false,
            tls_name_follows_host: false,
            advertise_address: None,
        }
    }

    /// Every manager the link dials: `host:port`, then [`LinkConfig::more`].
    pub fn managers(&self) -> Vec<Endpoint> {
        let mut all = vec![Endpoint {
            host: self.host.clone(),
            port: self.port,
        }];
        for more in &self.more {
            if !all.contains(more) {
                all.push(more.clone());
            }
        }
        all
    }

    /// Upper bound of the reconnect backoff.
    pub fn backoff_cap(&self) -> Duration {
        self.heartbeat_interval.max(Duration::from_secs(1))
    }
}
