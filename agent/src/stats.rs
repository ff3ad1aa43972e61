//! The agent's Prometheus figures kept as things happen; `crate::exposition`
//! shows them (with what it reads at scrape time) when
//! `MetricsListenAddress=` is set.
//!
//! * health check runs by kind (`cmd`, `tcp`, `http`; `push` for reports a
//!   service pushed) and result (`pass`, `fail`), and how long the runs took;
//! * the link: sessions begun, failed connection attempts, the manager of
//!   the session in progress and its leadership epoch;
//! * jobs ended, by result (`drover_metrics::jobs`).
//!
//! Kept whether or not the endpoint is on: an atomic add or two per check
//! run, job and session, and a short mutex for the manager's address when a
//! session begins or ends. Labels are bounded: fixed words, and one
//! manager address at a time (the session's).

use drover_config::health::Probe;
use drover_protocol::HealthState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A check's kind as a label: its `Health*` key.
pub const CHECK_KINDS: &[&str] = &["cmd", "tcp", "http", "push"];
/// A check run's result as a label.
pub const CHECK_RESULTS: &[&str] = &["pass", "fail"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

type Durations = Family<KindLabel, Histogram, fn() -> Histogram>;

fn check_histogram() -> Histogram {
    // 1 ms .. 16 s (HealthTimeout= defaults to 2 s).
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The kind label of `probe` (see [`CHECK_KINDS`]).
pub fn kind_label(probe: &Probe) -> &'static str {
    match probe {
        Probe::Cmd(_) => "cmd",
        Probe::Tcp { .. } => "tcp",
        Probe::Http(_) => "http",
        Probe::Push => "push",
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Stats {
    checks: Family<CheckLabels, Counter>,
    check_duration: Durations,
    jobs: Family<ResultLabel, Counter>,
    sessions: AtomicU64,
    connect_failures: AtomicU64,
    /// `HOST:PORT` of the session's manager, `None` between sessions.
    manager: Mutex<Option<String>>,
    leader_epoch: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        let stats = Self {
            checks: Family::default(),
            check_duration: Family::new_with_constructor(check_histogram),
            jobs: Family::default(),
            sessions: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            manager: Mutex::new(None),
            leader_epoch: AtomicU64::new(0),
        };
        // Every series from the start, at 0, so a rate is defined before
        // the first run of a kind.
        for kind in CHECK_KINDS {
            for result in CHECK_RESULTS {
                drop(stats.checks.get_or_create(&CheckLabels { kind, result }));
            }
            if *kind != "push" {
                drop(stats.check_duration.get_or_create(&KindLabel { kind }));
            }
        }
        stats
    }
}

/// What the link shows at scrape time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFigures {
    pub sessions: u64,
    pub connect_failures: u64,
    pub manager: Option<String>,
    pub leader_epoch: u64,
}

impl Stats {
    /// A check of `kind` ran for `took`.
    pub fn check_ran(&self, kind: &'static str, passed: bool, took: Duration) {
        self.count_check(kind, passed);
        self.check_duration
            .get_or_create(&KindLabel { kind })
            .observe(took.as_secs_f64());
    }

    /// A service pushed a verdict (`ReportHealth`) that was taken.
    pub fn check_pushed(&self, state: HealthState) {
        self.count_check("push", state == HealthState::Healthy);
    }

    fn count_check(&self, kind: &'static str, passed: bool) {
        let result = if passed { "pass" } else { "fail" };
        self.checks
            .get_or_create(&CheckLabels { kind, result })
            .inc();
    }

    /// A job ended with systemd's `result`.
    pub fn job_done(&self, result: &str) {
        let result = drover_metrics::jobs::result_label(result);
        self.jobs.get_or_create(&ResultLabel { result }).inc();
    }

    /// A session with the manager at `manager` (`HOST:PORT`) began; it
    /// welcomed this agent with leadership epoch `epoch`.
    pub fn session_started(&self, manager: String, epoch: u64) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.leader_epoch.fetch_max(epoch, Ordering::Relaxed);
        *self.manager.lock().unwrap_or_else(|p| p.into_inner()) = Some(manager);
    }

    /// The session in progress ended.
    pub fn session_ended(&self) {
        *self.manager.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A connection attempt failed (connect, TLS, handshake, refusal).
    pub fn connect_failed(&self) {
        self.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn link(&self) -> LinkFigures {
        LinkFigures {
            sessions: self.sessions.load(Ordering::Relaxed),
            connect_failures: self.connect_failures.load(Ordering::Relaxed),
            manager: self
                .manager
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            leader_epoch: self.leader_epoch.load(Ordering::Relaxed),
        }
    }

    /// Registers the figures counted as they happen (clones share the
    /// atomics); the link's are read by `crate::exposition`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "drover_agent_health_checks",
            "Health check runs, by kind (cmd, tcp, http; push: verdicts services reported) and result (pass, fail)",
            self.checks.clone(),
        );
        registry.register(
            "drover_agent_health_check_duration_seconds",
            "How long health check runs took, by kind",
            self.check_duration.clone(),
        );
        registry.register(
            "drover_agent_jobs",
            "systemd jobs of the manager's requests that ended, by result (systemd's job results; other)",
            self.jobs.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_the_link() {
        let s = Stats::default();
        s.check_ran("tcp", true, Duration::from_millis(3));
        s.check_pushed(HealthState::Unhealthy);
        s.job_done("done");
        s.job_done("no such result");
        assert_eq!(
            s.checks
                .get_or_create(&CheckLabels {
                    kind: "tcp",
                    result: "pass"
                })
                .get(),
            1
        );
        assert_eq!(
            s.checks
                .get_or_create(&CheckLabels {
                    kind: "push",
                    result: "fail"
                })
                .get(),
            1
        );
        assert_eq!(
            s.jobs.get_or_create(&ResultLabel { result: "other" }).get(),
            1
        );
        s.session_started("m1:842".into(), 7);
        s.session_started("m2:842".into(), 3);
        assert_eq!(
            s.link(),
            LinkFigures {
                sessions: 2,
                connect_failures: 0,
                manager: Some("m2:842".into()),
                leader_epoch: 7
            }
        );
        s.session_ended();
        s.connect_failed();
        assert_eq!(s.link().manager, None);
        assert_eq!(s.link().connect_failures, 1);
    }
}
