//! The Prometheus figures the manager keeps as things happen: jobs by type
//! and result and their durations, registrations, refusals by reason
//! (disconnects by reason are the link's: `crate::nodes::link_stats`). Each is an atomic (prometheus-client's types): counting
//! never takes a lock shared with the rest of the manager.
//!
//! Labels are bounded: a job's type is one of systemd's verbs, its result
//! one of `drover_metrics::jobs::JOB_RESULTS` (anything else counts as `other`), a refusal's
//! reason one of [`RefuseReason`]'s, plus `no_hello`. No label names a
//! unit or a node.

use crate::metrics::dbus_calls::DbusCalls;
use drover_protocol::{JobKind, RefuseReason};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub job_type: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Every figure counted as it happens (see the module docs).
#[derive(Debug)]
pub struct Counters {
    jobs: Family<JobLabels, Counter>,
    job_duration: Histogram,
    registrations: Counter,
    refusals: Family<ReasonLabel, Counter>,
    dbus_calls: DbusCalls,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            jobs: Family::default(),
            // 5 ms .. 82 s.
            job_duration: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
            registrations: Counter::default(),
            refusals: Family::default(),
            dbus_calls: DbusCalls::default(),
        }
    }
}

/// The label of a job result: drover's `shutdown`, else
/// `drover_metrics::jobs::result_label` (systemd's results and
/// `disconnected` as they are, anything else `other`).
pub fn result_label(result: &str) -> &'static str {
    if result == crate::jobs::RESULT_SHUTDOWN {
        return "shutdown";
    }
    drover_metrics::jobs::result_label(result)
}

/// The label of a refusal.
pub fn refusal_label(reason: RefuseReason) -> &'static str {
    match reason {
        RefuseReason::VersionMismatch => "version_mismatch",
        RefuseReason::InvalidName => "invalid_name",
        RefuseReason::UnknownNode => "unknown_node",
        RefuseReason::AlreadyConnected => "already_connected",
        RefuseReason::BadHandshake => "bad_handshake",
        RefuseReason::ShuttingDown => "shutting_down",
        RefuseReason::IdentityMismatch => "identity_mismatch",
    }
}

impl Counters {
    pub fn job_done(&self, kind: JobKind, result: &str, took: Duration) {
        self.jobs
            .get_or_create(&JobLabels {
                job_type: kind.job_type(),
                result: result_label(result),
            })
            .inc();
        self.job_duration.observe(took.as_secs_f64());
    }

    /// D-Bus API calls, counted by `crate::api::counted`.
    pub fn dbus_calls(&self) -> &DbusCalls {
        &self.dbus_calls
    }

    pub fn registered(&self) {
        self.registrations.inc();
    }

    /// A peer was refused registration (`None`: it sent no valid hello).
    pub fn refused(&self, reason: Option<RefuseReason>) {
        let reason = reason.map_or("no_hello", refusal_label);
        self.refusals.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Registers every figure in `registry` (clones share the atomics).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "drover_jobs",
            "Jobs ended, by type (start, stop, ...) and result (systemd's job results; shutdown, disconnected, other)",
            self.jobs.clone(),
        );
        registry.register(
            "drover_job_duration_seconds",
            "Time from a job's creation to its end, as the manager saw it",
            self.job_duration.clone(),
        );
        registry.register(
            "drover_registrations",
            "Agents admitted (each new session of a node counts)",
            self.registrations.clone(),
        );
        registry.register(
            "drover_registration_refusals",
            "Agents refused registration, by reason (no_hello: no valid hello before the deadline)",
            self.refusals.clone(),
        );
        registry.register_collector(Box::new(self.dbus_calls.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_bounded() {
        assert_eq!(result_label("done"), "done");
        assert_eq!(result_label(crate::jobs::RESULT_SHUTDOWN), "shutdown");
        assert_eq!(
            result_label(crate::jobs::RESULT_DISCONNECTED),
            "disconnected"
        );
        for other in ["", "DONE", "x".repeat(4096).as_str(), "done\n"] {
            assert_eq!(result_label(other), "other");
        }
    }
}
