//! The scrape: every figure the manager shows Prometheus, rendered in the
//! OpenMetrics text format by prometheus-client.
//!
//! Kept as things happen ([`Counters`]): jobs, registrations, refusals.
//! Read at scrape time, each in O(1) or one short lock:
//! nodes by status (the counts the lifecycle already announces, from a
//! watch channel: no lock), jobs in flight (the job table's length),
//! monitors (the monitor table's length) and their drops (its atomics),
//! TLS handshakes, heartbeat lateness and disconnects by reason (the link's
//! atomics), connections evicted before
//! authentication (the gate's count), resync's digests, mismatches,
//! snapshots and repairs (the hub's atomics), cross-node references by
//! state, their targets, errors, stale collections and activation times
//! (the reference rules' atomics, [`ProxyStats`]), the process
//! (`drover_metrics::process`), build info. One pass over the node table under its lock:
//! online nodes by `SystemState` (an atomic read per node's session) and,
//! with `MetricsPerNode=true`, a copy of each node's name, status, last
//! seen and `SystemState`; rendered outside the lock.

use crate::metrics::counters::Counters;
use crate::nodes::gate::Gate;
use crate::nodes::lifecycle::Lifecycle;
use crate::nodes::link_stats::{Disconnect, HANDSHAKE_RESULTS, LinkStats};
use crate::nodes::system_state::SYSTEM_STATES;
use crate::proxies::stats::{ErrorReason, ProxyStats, Slot};
use crate::units::health::HealthCounts;
use crate::units::hub::Subscriptions;
use crate::units::monitor::Monitors;
use drover_metrics::text::{clamp, gauge};
use drover_metrics::{Exposition, process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The figures read at scrape time (see the module docs).
pub struct Live {
    pub lifecycle: Arc<Lifecycle>,
    /// The job table's length (a closure: the job runner itself feeds
    /// [`Counters`], and imports run one way).
    pub jobs_in_flight: Box<dyn Fn() -> usize + Send + Sync>,
    pub monitors: Arc<Monitors>,
    /// The agents' gate: connections evicted before authentication.
    pub gate: Arc<Gate>,
    /// The unit hub: what resync has done (`drover_resync_*`).
    pub subscriptions: Arc<Subscriptions>,
    /// Cross-node references (`drover_proxies`, `drover_proxy_*`).
    pub proxies: Arc<ProxyStats>,
    pub per_node: bool,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("per_node", &self.per_node)
            .finish()
    }
}

/// `version` and `commit` of `drover_build_info`.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("DROVER_GIT_COMMIT");

/// The manager's registry: the counters kept as things happen and `live`,
/// read at scrape time; served by `drover_metrics::http::serve`.
pub fn exposition(counters: &Counters, live: Live) -> Exposition {
    let mut registry = Registry::default();
    counters.register(&mut registry);
    registry.register_collector(Box::new(live));
    Exposition::new(registry)
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts = *self.lifecycle.node_counts().borrow();
        let mut nodes = encoder.encode_descriptor(
            "drover_nodes",
            "Known nodes by status (online, offline)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (status, n) in [
            ("online", counts.online),
            ("offline", counts.known.saturating_sub(counts.online)),
        ] {
            ConstGauge::new(clamp(n)).encode(nodes.encode_family(&vec![("status", status)])?)?;
        }
        self.encode_nodes(&mut encoder)?;
        let in_flight = (self.jobs_in_flight)();
        gauge(
            &mut encoder,
            "drover_jobs_in_flight",
            "Jobs created and not yet ended",
            clamp(in_flight),
        )?;
        // The drops before the open monitors: a drop seen is never still
        // counted open (`Monitors::drops`).
        let (slow, gone) = self.monitors.drops();
        gauge(
            &mut encoder,
            "drover_monitors",
            "Open monitors (Controller.CreateMonitor)",
            clamp(self.monitors.len()),
        )?;
        if let Some(fence) = self.lifecycle.nodes().fence() {
            gauge(
                &mut encoder,
                "drover_leader",
                "1 while this manager leads its HA group (etcd), else 0",
                i64::from(fence.leading()),
            )?;
            gauge(
                &mut encoder,
                "drover_leader_epoch",
                "The leadership epoch this manager last won or saw",
                i64::try_from(fence.epoch()).unwrap_or(i64::MAX),
            )?;
            let c = ConstCounter::new(fence.transitions());
            c.encode(encoder.encode_descriptor(
                "drover_leader_transitions",
                "Times this manager started or stopped leading",
                None,
                c.metric_type(),
            )?)?;
        }
        let mut drops = encoder.encode_descriptor(
            "drover_monitor_drops",
            "Monitors the manager closed, by reason: too_slow (their receivers did not keep up), owner_gone (their owner left the bus)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, n) in [("too_slow", slow), ("owner_gone", gone)] {
            ConstCounter::new(n).encode(drops.encode_family(&vec![("reason", reason)])?)?;
        }
        let evicted = ConstCounter::new(self.gate.evictions());
        evicted.encode(encoder.encode_descriptor(
            "drover_connections_evicted",
            "Unauthenticated agent-port connections closed to let a newcomer in (they waited on their peer while the gate was full)",
            None,
            evicted.metric_type(),
        )?)?;
        encode_link(&mut encoder, self.lifecycle.link_stats())?;
        let mut health = encoder.encode_descriptor(
            "drover_units_health",
            "Units with a health check on online nodes, by health state (starting, healthy, unhealthy)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let counts = self.subscriptions.health_counts().get();
        for (state, n) in HealthCounts::STATES.iter().zip(counts) {
            ConstGauge::new(n.max(0))
                .encode(health.encode_family(&vec![("state", state.as_str())])?)?;
        }
        let resync = self.subscriptions.resync_stats();
        for (name, help, value) in [
            (
                "drover_resync_digests",
                "Resync digests of agents compared with the manager's records",
                resync.digests(),
            ),
            (
                "drover_resync_mismatches",
                "Resync digests that did not match the manager's records",
                resync.mismatches(),
            ),
            (
                "drover_resync_snapshots",
                "Resync snapshots the manager asked of agents (one per mismatch, at most one per node and interval)",
                resync.snapshots(),
            ),
            (
                "drover_resync_repairs",
                "Unit records a resync snapshot corrected",
                resync.repairs(),
            ),
        ] {
            let c = ConstCounter::new(value);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        encode_proxies(&mut encoder, &self.proxies)?;
        drover_metrics::text::build_info(
            &mut encoder,
            "drover_build_info",
            "The running manager's version and commit (value 1)",
            VERSION,
            COMMIT,
        )?;
        process::encode(&mut encoder, "drover_process", "manager", &process::read())
    }
}

impl Live {
    /// Online nodes by `SystemState` and, with `MetricsPerNode=true`, the
    /// per-node series: one pass over the node table under its lock (an
    /// atomic load per node; the per-node copy only when asked), the text
    /// outside it.
    fn encode_nodes(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut by_state = [0usize; SYSTEM_STATES.len()];
        let rows: Vec<(String, bool, u64, Option<usize>)> = {
            let registry = self.lifecycle.nodes().registry();
            let mut rows = Vec::new();
            if self.per_node {
                rows.reserve(registry.nodes().len());
            }
            for n in registry.nodes() {
                let state = n.session.as_ref().and_then(|s| s.system_state());
                if let Some(c) = state.and_then(|i| by_state.get_mut(i)) {
                    *c += 1;
                }
                if self.per_node {
                    rows.push((
                        n.name.as_str().to_owned(),
                        n.session.is_some(),
                        n.last_seen().0,
                        state,
                    ));
                }
            }
            rows
        };
        let mut states = encoder.encode_descriptor(
            "drover_nodes_by_system_state",
            "Online nodes by systemd's SystemState as their agents said it (running, degraded, starting, ...)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, n) in SYSTEM_STATES.iter().zip(by_state) {
            ConstGauge::new(clamp(n)).encode(states.encode_family(&vec![("state", *state)])?)?;
        }
        if !self.per_node {
            return Ok(());
        }
        let mut up = encoder.encode_descriptor(
            "drover_node_up",
            "1 while the node's agent is registered, else 0",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, online, _, _) in &rows {
            ConstGauge::new(i64::from(*online))
                .encode(up.encode_family(&vec![("node", name.as_str())])?)?;
        }
        let mut seen = encoder.encode_descriptor(
            "drover_node_last_seen_timestamp_seconds",
            "When the manager last heard from the node (Unix time; absent if never)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, _, real_us, _) in rows.iter().filter(|r| r.2 > 0) {
            ConstGauge::new(*real_us as f64 / 1e6)
                .encode(seen.encode_family(&vec![("node", name.as_str())])?)?;
        }
        let mut system = encoder.encode_descriptor(
            "drover_node_system_state",
            "1 for the node's systemd SystemState as its agent last said it (online nodes that said one)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, _, _, state) in &rows {
            if let Some(state) = state.and_then(|i| SYSTEM_STATES.get(i)) {
                ConstGauge::new(1).encode(
                    system.encode_family(&vec![("node", name.as_str()), ("state", *state)])?,
                )?;
            }
        }
        Ok(())
    }
}

fn encode_link(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &LinkStats,
) -> Result<(), std::fmt::Error> {
    let mut handshakes = encoder.encode_descriptor(
        "drover_tls_handshakes",
        "TLS handshakes on the agents' port, by result: ok, timeout, or the class of refusal",
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (result, n) in HANDSHAKE_RESULTS.iter().zip(stats.handshakes()) {
        ConstCounter::new(n).encode(handshakes.encode_family(&vec![("result", *result)])?)?;
    }
    let mut disconnects = encoder.encode_descriptor(
        "drover_node_disconnects",
        "Sessions of online nodes that ended, by reason: heartbeat_timeout, agent_closed, connection_lost, write_blocked, protocol_error, replaced, reload, shutdown, standby",
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (reason, n) in Disconnect::LABELS.iter().zip(stats.disconnects()) {
        ConstCounter::new(n).encode(disconnects.encode_family(&vec![("reason", *reason)])?)?;
    }
    let lateness = stats.lateness();
    lateness.encode(encoder.encode_descriptor(
        "drover_heartbeat_lateness_ratio",
        "Gap before each agent heartbeat read (the mean of the heartbeats read together), as a fraction of NodeHeartbeatThreshold (1: the node is dropped)",
        None,
        lateness.metric_type(),
    )?)
}

fn encode_proxies(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &ProxyStats,
) -> Result<(), std::fmt::Error> {
    let mut states = encoder.encode_descriptor(
        "drover_proxies",
        "Cross-node references (one per proxy) by state: waiting, active, failed and ended (failed and ended ones are kept a while for reporting)",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (state, n) in Slot::LABELS.iter().zip(stats.states()) {
        ConstGauge::new(n.max(0)).encode(states.encode_family(&vec![("state", *state)])?)?;
    }
    gauge(
        encoder,
        "drover_proxy_targets",
        "Target units (node, unit) with live references: their drover-dep@ units are wanted",
        stats.targets().max(0),
    )?;
    let mut errors = encoder.encode_descriptor(
        "drover_proxy_errors",
        "Proxies failed, by reason: unknown_node, not_allowed, start_failed, target_down",
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (reason, n) in ErrorReason::LABELS.iter().zip(stats.errors()) {
        ConstCounter::new(n).encode(errors.encode_family(&vec![("reason", *reason)])?)?;
    }
    let stale = ConstCounter::new(stats.stale());
    stale.encode(encoder.encode_descriptor(
        "drover_proxy_references_stale",
        "Live references dropped because their requesting node stayed offline past ProxyGracePeriod",
        None,
        stale.metric_type(),
    )?)?;
    let activation = stats.activation();
    activation.encode(encoder.encode_descriptor(
        "drover_proxy_activation_seconds",
        "From a proxy's announcement to its target being up (the proxy active)",
        None,
        activation.metric_type(),
    )?)
}
