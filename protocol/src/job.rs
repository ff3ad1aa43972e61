//! The unit operations that queue a systemd job, in the three vocabularies
//! that name them: drover's wire ([`JobKind`] inside
//! [`crate::Request::UnitJob`]), systemd's manager methods
//! ([`JobKind::method`], what the agent calls) and BlueChi's `Job.JobType`
//! property ([`JobKind::job_type`], what the manager shows).
//!
//! Invariant: the three spellings of one kind never disagree, because they
//! are written here once; a new kind is one more variant with its two words.

use serde::{Deserialize, Serialize};

/// Start, stop, restart or reload a unit: each queues one systemd job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobKind {
    Start,
    Stop,
    Restart,
    Reload,
}

impl JobKind {
    /// Every kind, in wire order.
    pub const ALL: [JobKind; 4] = [
        JobKind::Start,
        JobKind::Stop,
        JobKind::Restart,
        JobKind::Reload,
    ];

    /// systemd's `org.freedesktop.systemd1.Manager` method (also BlueChi's
    /// `Node` method of the same name).
    pub fn method(self) -> &'static str {
        match self {
            JobKind::Start => "StartUnit",
            JobKind::Stop => "StopUnit",
            JobKind::Restart => "RestartUnit",
            JobKind::Reload => "ReloadUnit",
        }
    }

    /// BlueChi's `org.eclipse.bluechi.Job.JobType` word.
    pub fn job_type(self) -> &'static str {
        match self {
            JobKind::Start => "start",
            JobKind::Stop => "stop",
            JobKind::Restart => "restart",
            JobKind::Reload => "reload",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_match_systemd_and_bluechi() {
        let words: Vec<_> = JobKind::ALL
            .iter()
            .map(|k| (k.method(), k.job_type()))
            .collect();
        assert_eq!(
            words,
            [
                ("StartUnit", "start"),
                ("StopUnit", "stop"),
                ("RestartUnit", "restart"),
                ("ReloadUnit", "reload"),
            ]
        );
    }
}
