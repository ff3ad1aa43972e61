//! Starting a proxy's target ahead of its helper.
//!
//! `systemctl start need-db` on this node makes systemd run the start job of
//! `drover-proxy@bar_db.service`: it forks, execs `drover-proxy create`, and
//! the helper connects to the bus and calls `CreateProxy`. That takes a few
//! milliseconds in which nothing would happen on node `bar`. So the agent
//! watches systemd's job signals as well: once a proxy unit's **start** job
//! runs, the proxy is announced to the manager at once
//! ([`Proxies::start_ahead`]) and the target starts while the helper process
//! starts; the helper's call then claims that proxy and is answered as soon
//! as the target is active (at once if it already is).
//!
//! * Only once the job runs, i.e. after the job's `running` state signal:
//!   before that, systemd's ordering may still hold it back (a proxy ordered
//!   `After=` other local units must not start its target before them), and
//!   systemd alone knows when it lets go.
//! * Only start jobs: a stop job of an inactive proxy unit must never start
//!   anything anywhere. `JobNew` names the unit but not the job's type, so
//!   each proxy job costs one [`Systemd::job_info`](crate::systemd::api::Systemd::job_info)
//!   query. A `restart` job counts once it runs (it stops first, so ordering
//!   treats it as a stop until then).
//! * A job that ends without a helper having claimed its proxy (cancelled,
//!   or the unit failed before its helper ran) releases it
//!   ([`Proxies::job_ended`]), so a target is never left wanted by nobody.
//!
//! Why not earlier: systemd sends `JobNew` and runs its job queue in the same
//! turn of its loop, so any question asked on `JobNew` is answered after the
//! helper was forked, and after the `running` signal (measured on the 2-core
//! test VM: the signal 0.4–0.6 ms after the fork, the answer 0.2–0.4 ms after
//! the signal). Deciding from the ordering before the job runs therefore
//! never gained anything; this module only waits for the two facts it needs.
//!
//! Signals keep arriving while the query runs: a `running` state or a
//! removal that overtakes the answer is recorded here, and the pending
//! table's lock is held while a proxy is started or released, so the
//! outcome is the same in every order.

use crate::link::outbox::Outbox;
use crate::proxies::registry::{Proxies, ProxyKey};
use crate::systemd::api::{JobInfo, JobPath, SystemdEvent};
use drover_protocol::RemoteError;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Proxy jobs awaiting their `job_info` answer at most; beyond that, proxies
/// simply start when their helper calls.
pub const PENDING_CAP: usize = 1024;

#[derive(Debug)]
struct Pending {
    key: ProxyKey,
    /// systemd runs the job (its `running` signal or the answer said so).
    runs: bool,
    /// `Some(true)` for a start job, once known.
    start: Option<bool>,
}

/// See the module docs.
#[derive(Default)]
pub struct EarlyStart {
    pending: Mutex<HashMap<JobPath, Pending>>,
}

impl EarlyStart {
    fn lock(&self) -> MutexGuard<'_, HashMap<JobPath, Pending>> {
        // Short sections that do not panic; a poisoned map is still consistent.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One systemd event, in systemd's order. Returns the job to ask
    /// `job_info` about when a proxy unit nobody follows got a job; the
    /// answer goes to [`EarlyStart::classified`].
    pub fn on_event(
        &self,
        event: &SystemdEvent,
        proxies: &Proxies,
        outbox: &Outbox,
    ) -> Option<JobPath> {
        match event {
            SystemdEvent::JobNew { job, unit, .. } => {
                let key = ProxyKey::from_unit_name(unit)?;

                if proxies.knows(&key) {
                    return None;
                }
                let mut pending = self.lock();
                if pending.len() >= PENDING_CAP {
                    return None;
                }
                pending.insert(
                    job.clone(),
                    Pending {
                        key,
                        runs: false,
                        start: None,
                    },
                );
                Some(job.clone())
            }
            SystemdEvent::JobState { job, state } if state == "running" => {
                self.update(job, proxies, outbox, |p| p.runs = true);
                None
            }
            SystemdEvent::JobState { .. } => None,
            SystemdEvent::JobRemoved { job, .. } => {
                let mut pending = self.lock();
                pending.remove(job);
                proxies.job_ended(job, outbox);
                None
            }
        }
    }

    /// The answer to `job_info(job)`, or an error when the job is already
    /// gone.
    pub fn classified(
        &self,
        job: &str,
        info: Result<JobInfo, RemoteError>,
        proxies: &Proxies,
        outbox: &Outbox,
    ) {
        match info {
            Ok(info) => self.update(job, proxies, outbox, |p| {
                p.start = Some(info.kind == "start" || info.kind == "restart");
                p.runs |= info.state == "running";
            }),
            Err(e) => {
                tracing::debug!("no start ahead for {job}: {}", e.message);
                self.lock().remove(job);
            }
        }
    }

    /// Proxy jobs still being classified (tests).
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn update(&self, job: &str, proxies: &Proxies, outbox: &Outbox, f: impl FnOnce(&mut Pending)) {
        let mut pending = self.lock();
        let Some(p) = pending.get_mut(job) else {
            return;
        };
        f(p);
        match (p.start, p.runs) {
            (Some(false), _) => {
                pending.remove(job);
            }
            (Some(true), true) => {
                if let Some(p) = pending.remove(job) {
                    // Under the lock: a removal of this job waits for us, so
                    // it sees the proxy and releases it if nobody claims it.
                    proxies.start_ahead(p.key, job.to_string(), outbox);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::outbox::SessionKill;
    use drover_protocol::{Event, ToManager};
    use tokio::sync::mpsc;

    const JOB: &str = "/org/freedesktop/systemd1/job/7";
    const UNIT: &str = "drover-proxy@bar_db.service";

    fn rig() -> (EarlyStart, Proxies, Outbox, mpsc::Receiver<ToManager>) {
        let outbox = Outbox::default();
        let (tx, rx) = mpsc::channel(64);
        outbox.open(1, tx, SessionKill::new());
        (EarlyStart::default(), Proxies::default(), outbox, rx)
    }

    fn new_job() -> SystemdEvent {
        SystemdEvent::JobNew {
            id: 7,
            job: JOB.into(),
            unit: UNIT.into(),
        }
    }

    fn running() -> SystemdEvent {
        SystemdEvent::JobState {
            job: JOB.into(),
            state: "running".into(),
        }
    }

    fn removed(result: &str) -> SystemdEvent {
        SystemdEvent::JobRemoved {
            id: 7,
            job: JOB.into(),
            unit: UNIT.into(),
            result: result.into(),
        }
    }

    fn events(rx: &mut mpsc::Receiver<ToManager>) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(msg) = rx.try_recv() {
            if let ToManager::Event(e) = msg {
                out.push(e);
            }
        }
        out
    }

    fn info(kind: &str, state: &str) -> Result<JobInfo, RemoteError> {
        Ok(JobInfo {
            kind: kind.into(),
            state: state.into(),
        })
    }

    fn announced(rx: &mut mpsc::Receiver<ToManager>) -> bool {
        let sent = events(rx);
        match sent.as_slice() {
            [] => false,
            [Event::ProxyNew { node, unit, .. }]
                if node.as_str() == "bar" && unit.as_str() == "db.service" =>
            {
                true
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_waiting_start_job_is_announced_once_it_runs_not_before() {
        let (ahead, proxies, outbox, mut rx) = rig();
        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.classified(JOB, info("start", "waiting"), &proxies, &outbox);
        assert!(!announced(&mut rx), "ordering may still hold it back");
        assert_eq!(ahead.pending(), 1);
        ahead.on_event(&running(), &proxies, &outbox);
        assert!(announced(&mut rx));
        assert_eq!(ahead.pending(), 0);
        // A repeated running signal changes nothing.
        ahead.on_event(&running(), &proxies, &outbox);
        assert!(events(&mut rx).is_empty());
    }

    #[test]
    fn a_start_job_the_answer_finds_running_is_announced_at_once() {
        let (ahead, proxies, outbox, mut rx) = rig();
        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.classified(JOB, info("start", "running"), &proxies, &outbox);
        assert!(announced(&mut rx));
        assert_eq!(ahead.pending(), 0);
    }

    #[test]
    fn only_start_jobs_are_announced_before_they_run() {
        for kind in ["restart", "stop", "verify-active", "reload", "nop"] {
            let (ahead, proxies, outbox, mut rx) = rig();
            ahead.on_event(&new_job(), &proxies, &outbox);
            ahead.classified(JOB, info(kind, "waiting"), &proxies, &outbox);
            assert!(!announced(&mut rx), "{kind}");
            ahead.on_event(&running(), &proxies, &outbox);
            assert_eq!(announced(&mut rx), kind == "restart", "{kind}");
            assert_eq!(ahead.pending(), 0, "{kind}");
        }
    }

    #[test]
    fn a_running_start_job_announces_the_proxy_in_either_order() {
        for state_first in [false, true] {
            let (ahead, proxies, outbox, mut rx) = rig();
            assert_eq!(
                ahead.on_event(&new_job(), &proxies, &outbox),
                Some(JOB.to_string())
            );
            if state_first {
                ahead.on_event(&running(), &proxies, &outbox);
                assert!(events(&mut rx).is_empty(), "type not known yet");
                ahead.classified(JOB, info("start", "waiting"), &proxies, &outbox);
            } else {
                ahead.classified(JOB, info("start", "waiting"), &proxies, &outbox);
                assert!(events(&mut rx).is_empty(), "queued, not running");
                ahead.on_event(&running(), &proxies, &outbox);
            }
            let sent = events(&mut rx);
            assert!(
                matches!(sent.as_slice(), [Event::ProxyNew { node, unit, .. }]
                    if node.as_str() == "bar" && unit.as_str() == "db.service"),
                "{sent:?}"
            );
            assert_eq!(ahead.pending(), 0);
        }
    }

    #[test]
    fn stop_jobs_and_vanished_jobs_start_nothing() {
        let (ahead, proxies, outbox, mut rx) = rig();
        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.classified(JOB, info("stop", "running"), &proxies, &outbox);
        ahead.on_event(&running(), &proxies, &outbox);
        assert!(events(&mut rx).is_empty());
        assert_eq!(ahead.pending(), 0);

        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.classified(
            JOB,
            Err(RemoteError::new(
                "org.freedesktop.systemd1.NoSuchJob",
                "gone",
            )),
            &proxies,
            &outbox,
        );
        assert!(events(&mut rx).is_empty());
        assert_eq!(ahead.pending(), 0);
    }

    #[test]
    fn a_removal_before_the_answer_starts_nothing() {
        let (ahead, proxies, outbox, mut rx) = rig();
        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.on_event(&removed("canceled"), &proxies, &outbox);
        ahead.classified(JOB, info("start", "running"), &proxies, &outbox);
        assert!(events(&mut rx).is_empty());
        assert!(proxies.list().is_empty());
    }

    #[test]
    fn an_unclaimed_proxy_is_released_when_its_job_ends() {
        let (ahead, proxies, outbox, mut rx) = rig();
        ahead.on_event(&new_job(), &proxies, &outbox);
        ahead.classified(JOB, info("start", "running"), &proxies, &outbox);
        assert_eq!(proxies.list().len(), 1);
        ahead.on_event(&removed("canceled"), &proxies, &outbox);
        let sent = events(&mut rx);
        assert!(
            matches!(
                sent.as_slice(),
                [Event::ProxyNew { proxy_id: a, .. }, Event::ProxyRemoved { proxy_id: b, .. }] if a == b
            ),
            "{sent:?}"
        );
        assert!(proxies.list().is_empty());
    }

    #[test]
    fn a_bluechi_named_proxy_unit_is_started_ahead_too() {
        let (ahead, proxies, outbox, mut rx) = rig();
        let unit = "bluechi-proxy@bar_db.service";
        let job = SystemdEvent::JobNew {
            id: 7,
            job: JOB.into(),
            unit: unit.into(),
        };
        assert_eq!(ahead.on_event(&job, &proxies, &outbox), Some(JOB.into()));
        ahead.classified(JOB, info("start", "running"), &proxies, &outbox);
        assert!(announced(&mut rx));
        assert_eq!(proxies.list()[0].key.local.as_str(), unit);
        // Not a proxy unit of any family: nothing to follow.
        let other = SystemdEvent::JobNew {
            id: 8,
            job: "/org/freedesktop/systemd1/job/8".into(),
            unit: "bluechi-dep@db.service".into(),
        };
        assert_eq!(ahead.on_event(&other, &proxies, &outbox), None);
    }

    #[test]
    fn a_known_proxy_is_left_alone() {
        let (ahead, proxies, outbox, _rx) = rig();
        let key = ProxyKey::from_unit_name(UNIT).unwrap();
        let _call = proxies.create(key, &outbox).unwrap();
        assert_eq!(ahead.on_event(&new_job(), &proxies, &outbox), None);
        assert_eq!(ahead.pending(), 0);
    }
}
