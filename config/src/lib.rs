//! drover-config: configuration of the manager and the agent, and logging.
//!
//! * [`ini`] — the file format: systemd-style INI, `#`/`;` comments, a value
//!   continues on following indented lines, lines of at most 500 characters.
//! * [`manager`] / [`agent`] — typed settings with BlueChi's key names and
//!   drover's defaults, loaded in layers (vendor file, `/etc` file, `conf.d`
//!   drop-ins in alphabetical order, environment, `-c FILE`; command-line flags
//!   are applied by the binaries on top).
//! * [`pattern`] — node-name patterns (`edge-*`) in `AllowedNodeNames`.
//! * [`shared`] — the keys both daemons read with one meaning, written once:
//!   the agent link's TCP keys, the TLS file keys ([`tls`]: all-or-nothing,
//!   absolute paths; the transport rules built on them are in [`manager`]),
//!   the logging keys.
//! * [`metrics`] — the Prometheus endpoint's keys (`MetricsListenAddress`,
//!   `MetricsPerNode`).
//! * [`dns`] — drover-dns's own file (`/etc/drover/dns.conf`, `[drover-dns]`).
//! * [`ha`] — leader election on etcd (`EtcdEndpoints`, `EtcdKeyPrefix`,
//!   `EtcdLeaseTTL`).
//! * [`logging`] — `LogLevel`/`LogTarget` and the tracing setup they select.
//! * [`exit`] — how a daemon's process ends: one line on stderr and status 1.
//! * [`notify`] — what both daemons tell their service manager (`READY=1`,
//!   `STATUS=`, `RELOADING=1`, `WATCHDOG=1`, `STOPPING=1`).
//! * [`health`] — health check declarations: a unit's `[X-Drover]` keys and
//!   the node checks of `agent.conf` (`[health NAME]`); [`unit_file`] reads
//!   `[X-Drover]` from unit files by systemd's syntax; [`timespan`] is
//!   systemd's time span syntax.
//! * [`ports`] — the discovery keys of `[X-Drover]` (`Port=`, `Ports=`).
//!
//! * BlueChi's files and section names (`[bluechi-controller]`,
//!   `[bluechi-agent]`) are read too, under drover's ([`layers`], `sections`).
//!
//! Errors name the file, the line and the key, so a typo is found at once:
//! unknown sections and keys are errors, never ignored. A BlueChi setting that
//! drover accepts but cannot honour as written is a warning in
//! [`LoadReport::warnings`], naming the file, line and key; the daemons log it.
//!
//! The shipped vendor files `dist/usr/share/drover/{manager,agent}.conf` list
//! every key with its default; tests keep them in step with the code.

pub mod agent;
pub mod discovery;
pub mod dns;
pub mod error;
pub mod exit;
pub mod ha;
pub mod health;
pub mod host;
pub mod ini;
pub mod layers;
pub mod logging;
pub mod manager;
pub mod metrics;
pub mod notify;
pub mod pattern;
pub mod ports;
mod sections;
pub mod shared;
pub mod timespan;
pub mod tls;
pub mod unit_file;
mod value;

#[cfg(test)]
pub(crate) mod test_util;

pub use agent::AgentConfig;
pub use discovery::DiscoverySettings;
pub use dns::DnsConfig;
pub use error::ConfigError;
pub use layers::{LoadReport, Sources};
pub use logging::{LogHandle, LogLevel, LogTarget, LoggingConfig};
pub use manager::{ManagerConfig, NodeSection};
pub use metrics::MetricsSettings;
pub use pattern::NodePattern;
pub use shared::LinkSettings;
pub use tls::TlsFiles;
