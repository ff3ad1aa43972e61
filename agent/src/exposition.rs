//! The agent's own `/metrics` (`MetricsListenAddress=` in `[drover-agent]`,
//! off by default): served by `drover_metrics::http` with the manager's
//! bounds, every name prefixed `drover_agent_` so a Prometheus scraping
//! the manager and its agents never adds one to the other.
//!
//! Kept as things happen ([`crate::stats`]): health check runs and their
//! durations, jobs by result, the link's sessions and failures. Read at
//! scrape time, each in O(1): the link (connected, the manager's address,
//! the leadership epoch), jobs in flight (the job tracker's length, under
//! its lock for that read), the process (`drover_metrics::process`), build
//! info.
//!
//! What a node's own exporters serve (per-unit states: node_exporter's
//! systemd collector, systemd_exporter) is not repeated here
//! (docs/monitoring.md).

use crate::state::Shared;
use drover_metrics::text::{build_info, clamp, counter, gauge};
use drover_metrics::{Exposition, process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Weak};

/// `version` and `commit` of `drover_agent_build_info`.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("DROVER_GIT_COMMIT");

/// The figures read at scrape time. Weak: the endpoint never keeps a
/// stopping agent's state alive.
#[derive(Debug)]
struct Live {
    shared: Weak<Shared>,
}

/// The agent's registry (see the module docs).
pub fn exposition(shared: &Arc<Shared>) -> Exposition {
    let mut registry = Registry::default();
    shared.stats.register(&mut registry);
    registry.register_collector(Box::new(Live {
        shared: Arc::downgrade(shared),
    }));
    Exposition::new(registry)
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(shared) = self.shared.upgrade() {
            let link = shared.stats.link();
            gauge(
                &mut encoder,
                "drover_agent_connected",
                "1 while the agent has a session with a manager, else 0",
                i64::from(link.manager.is_some()),
            )?;
            if let Some(manager) = &link.manager {
                let mut info = encoder.encode_descriptor(
                    "drover_agent_manager",
                    "1, labelled with the address (HOST:PORT) of the manager of the session in progress; absent between sessions",
                    None,
                    MetricType::Gauge,
                )?;
                ConstGauge::new(1)
                    .encode(info.encode_family(&vec![("manager", manager.as_str())])?)?;
            }
            gauge(
                &mut encoder,
                "drover_agent_leader_epoch",
                "The highest leadership epoch a manager welcomed this agent with (0 without high availability)",
                i64::try_from(link.leader_epoch).unwrap_or(i64::MAX),
            )?;
            counter(
                &mut encoder,
                "drover_agent_reconnects",
                "Sessions with a manager begun after the first (after a lost link, a manager restart, a new leader, SwitchController)",
                link.sessions.saturating_sub(1),
            )?;
            counter(
                &mut encoder,
                "drover_agent_connect_failures",
                "Connection attempts to a manager that failed (connect, TLS, handshake, refusal)",
                link.connect_failures,
            )?;
            let in_flight = shared.tracker().len();
            gauge(
                &mut encoder,
                "drover_agent_jobs_in_flight",
                "systemd jobs of the manager's requests not yet ended",
                clamp(in_flight),
            )?;
        }
        build_info(
            &mut encoder,
            "drover_agent_build_info",
            "The running agent's version and commit (value 1)",
            VERSION,
            COMMIT,
        )?;
        process::encode(
            &mut encoder,
            "drover_agent_process",
            "agent",
            &process::read(),
        )
    }
}
