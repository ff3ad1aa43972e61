//! BlueChi jobs: the table and its ordering rules (docs/dev/architecture.md "Jobs").
//! The async side that applies them is [`crate::job_runner`].
//!
//! A job is born *pending* when a client calls `StartUnit` & co: its id is
//! taken and the request is on its way to the agent. When the agent accepts
//! (`Empty` reply), the API exports the job object, emits `JobNew`, and only
//! then marks the job *exported* here. The agent's `JobDone` can arrive
//! before that (fast oneshot units): it is held on the pending job and handed
//! back by [`Jobs::exported`], so the API emits `JobRemoved` right after
//! `JobNew`. Invariants:
//!
//! * every job that was announced with `JobNew` ends with exactly one
//!   `JobRemoved`: a job leaves the table exactly once, and whoever removes it
//!   emits the signal;
//! * a job whose request fails is forgotten without any signal (the caller
//!   got an error, not a path);
//! * the end of a session ends its jobs with `disconnected`, a shutdown ends
//!   all with `cancelled due to shutdown`; for a pending job that result is
//!   held like an early `JobDone`;
//! * events only touch jobs of the session that sends them.
//!
//! The table is plain data; it never awaits and never talks to D-Bus.

use drover_protocol::{JobKind, NodeName, UnitName};
use std::collections::HashMap;

pub const RESULT_DISCONNECTED: &str = "disconnected";
pub const RESULT_SHUTDOWN: &str = "cancelled due to shutdown";

/// `Job.State` values (systemd's job states).
pub fn valid_state(s: &str) -> bool {
    matches!(s, "waiting" | "running")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    pub id: u32,
    pub node: NodeName,
    pub unit: UnitName,
    pub job_type: JobKind,
    pub session_id: u64,
    /// When the job was created (its duration is measured from here).
    pub started: std::time::Instant,
}

#[derive(Debug)]
enum Phase {
    Pending { result: Option<String> },
    Exported,
}

#[derive(Debug)]
struct Entry {
    info: JobInfo,
    state: String,
    phase: Phase,
}

/// What a `JobDone` led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    /// The job was exported: emit `JobRemoved` now and unexport.
    Remove(JobInfo),
    /// The job is still pending: the result is held for [`Jobs::exported`].
    Held,
    /// No such job for this session.
    Unknown,
}

#[derive(Debug, Default)]
pub struct Jobs {
    last_id: u32,
    table: HashMap<u32, Entry>,
}

impl Jobs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next id (from 1; 0 and ids still in use are skipped on wrap).
    pub fn allocate(
        &mut self,
        node: NodeName,
        unit: UnitName,
        job_type: JobKind,
        session_id: u64,
    ) -> u32 {
        let mut id = self.last_id;
        loop {
            id = id.wrapping_add(1);
            if id != 0 && !self.table.contains_key(&id) {
                break;
            }
        }
        self.last_id = id;
        let info = JobInfo {
            id,
            node,
            unit,
            job_type,
            session_id,
            started: std::time::Instant::now(),
        };
        self.table.insert(
            id,
            Entry {
                info,
                state: "waiting".to_owned(),
                phase: Phase::Pending { result: None },
            },
        );
        id
    }

    pub fn info(&self, id: u32) -> Option<&JobInfo> {
        self.table.get(&id).map(|e| &e.info)
    }

    pub fn state(&self, id: u32) -> Option<&str> {
        self.table.get(&id).map(|e| e.state.as_str())
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The request for a pending job failed: drop it silently.
    pub fn forget(&mut self, id: u32) {
        if matches!(
            self.table.get(&id).map(|e| &e.phase),
            Some(Phase::Pending { .. })
        ) {
            self.table.remove(&id);
        }
    }

    /// `JobNew` was emitted. Returns the held result if the job already
    /// ended: the caller emits `JobRemoved` with it (the job is gone then).
    pub fn exported(&mut self, id: u32) -> Option<(JobInfo, String)> {
        let entry = self.table.get_mut(&id)?;
        match &mut entry.phase {
            Phase::Pending {
                result: Some(result),
            } => {
                let result = std::mem::take(result);
                let entry = self.table.remove(&id)?;
                Some((entry.info, result))
            }
            Phase::Pending { result: None } => {
                entry.phase = Phase::Exported;
                None
            }
            Phase::Exported => None,
        }
    }

    pub fn job_done(&mut self, session_id: u64, id: u32, result: &str) -> Done {
        let Some(entry) = self
            .table
            .get_mut(&id)
            .filter(|e| e.info.session_id == session_id)
        else {
            return Done::Unknown;
        };
        match &mut entry.phase {
            Phase::Pending { result: held } => {
                if held.is_none() {
                    *held = Some(result.to_owned());
                }
                Done::Held
            }
            Phase::Exported => match self.table.remove(&id) {
                Some(entry) => Done::Remove(entry.info),
                None => Done::Unknown,
            },
        }
    }

    /// Records a state change; returns the job if it is exported and the
    /// state really changed (so a `PropertiesChanged` is due).
    pub fn state_changed(&mut self, session_id: u64, id: u32, state: &str) -> Option<JobInfo> {
        let entry = self
            .table
            .get_mut(&id)
            .filter(|e| e.info.session_id == session_id)?;
        if entry.state == state {
            return None;
        }
        entry.state = state.to_owned();
        matches!(entry.phase, Phase::Exported).then(|| entry.info.clone())
    }

    /// Ends the jobs of a session with `result`: exported ones are removed and
    /// returned (emit `JobRemoved` for each); pending ones hold the result.
    pub fn end_session(&mut self, session_id: u64, result: &str) -> Vec<JobInfo> {
        self.end_where(|info| info.session_id == session_id, result)
    }

    /// Ends every job (shutdown).
    pub fn end_all(&mut self, result: &str) -> Vec<JobInfo> {
        self.end_where(|_| true, result)
    }

    fn end_where(&mut self, pick: impl Fn(&JobInfo) -> bool, result: &str) -> Vec<JobInfo> {
        let mut removed = Vec::new();
        let ids: Vec<u32> = self
            .table
            .iter()
            .filter(|(_, e)| pick(&e.info))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let Some(entry) = self.table.get_mut(&id) else {
                continue;
            };
            match &mut entry.phase {
                Phase::Pending { result: held } => {
                    if held.is_none() {
                        *held = Some(result.to_owned());
                    }
                }
                Phase::Exported => {
                    if let Some(entry) = self.table.remove(&id) {
                        removed.push(entry.info);
                    }
                }
            }
        }
        removed.sort_by_key(|info| info.id);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(jobs: &mut Jobs, session: u64) -> u32 {
        jobs.allocate(
            NodeName::new("n1").unwrap(),
            UnitName::new("a.service").unwrap(),
            JobKind::Start,
            session,
        )
    }

    #[test]
    fn ids_count_from_one() {
        let mut jobs = Jobs::new();
        assert_eq!(alloc(&mut jobs, 1), 1);
        assert_eq!(alloc(&mut jobs, 1), 2);
        jobs.forget(1);
        assert_eq!(alloc(&mut jobs, 1), 3, "ids are not reused");
    }

    #[test]
    fn done_after_export_removes_once() {
        let mut jobs = Jobs::new();
        let id = alloc(&mut jobs, 7);
        assert_eq!(jobs.exported(id), None);
        assert!(matches!(jobs.job_done(7, id, "done"), Done::Remove(info) if info.id == id));
        assert_eq!(
            jobs.job_done(7, id, "done"),
            Done::Unknown,
            "a second JobDone finds nothing"
        );
        assert!(jobs.is_empty());
    }

    #[test]
    fn done_before_export_is_held_until_job_new() {
        let mut jobs = Jobs::new();
        let id = alloc(&mut jobs, 7);
        assert_eq!(jobs.job_done(7, id, "done"), Done::Held);
        assert_eq!(
            jobs.job_done(7, id, "failed"),
            Done::Held,
            "the first result wins"
        );
        let (info, result) = jobs.exported(id).expect("held result comes back at export");
        assert_eq!((info.id, result.as_str()), (id, "done"));
        assert!(jobs.is_empty());
    }

    #[test]
    fn events_from_another_session_are_ignored() {
        let mut jobs = Jobs::new();
        let id = alloc(&mut jobs, 7);
        jobs.exported(id);
        assert_eq!(jobs.job_done(8, id, "done"), Done::Unknown);
        assert_eq!(jobs.state_changed(8, id, "running"), None);
        assert_eq!(jobs.state(id), Some("waiting"));
    }

    #[test]
    fn state_changes_signal_only_when_exported_and_different() {
        let mut jobs = Jobs::new();
        let id = alloc(&mut jobs, 1);
        assert_eq!(
            jobs.state_changed(1, id, "running"),
            None,
            "pending: recorded, not signalled"
        );
        assert_eq!(jobs.state(id), Some("running"));
        jobs.exported(id);
        assert_eq!(jobs.state_changed(1, id, "running"), None, "no change");
        assert!(jobs.state_changed(1, id, "waiting").is_some());
    }

    #[test]
    fn disconnect_ends_exported_and_marks_pending() {
        let mut jobs = Jobs::new();
        let exported = alloc(&mut jobs, 1);
        jobs.exported(exported);
        let pending = alloc(&mut jobs, 1);
        let other = alloc(&mut jobs, 2);
        jobs.exported(other);
        let ended = jobs.end_session(1, RESULT_DISCONNECTED);
        assert_eq!(ended.iter().map(|i| i.id).collect::<Vec<_>>(), [exported]);
        // The pending one ends when its JobNew is out.
        let (_, result) = jobs.exported(pending).unwrap();
        assert_eq!(result, RESULT_DISCONNECTED);
        // The other session's job is untouched.
        assert_eq!(jobs.len(), 1);
        let ended = jobs.end_all(RESULT_SHUTDOWN);
        assert_eq!(ended.iter().map(|i| i.id).collect::<Vec<_>>(), [other]);
    }

    #[test]
    fn failed_request_forgets_without_signal() {
        let mut jobs = Jobs::new();
        let id = alloc(&mut jobs, 1);
        jobs.end_session(1, RESULT_DISCONNECTED);
        jobs.forget(id);
        assert!(jobs.is_empty());
        assert_eq!(jobs.exported(id), None);
    }
}
