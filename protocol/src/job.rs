//! The unit operations that queue a systemd job, in the three vocabularies
//! that name them: drover's wire ([`JobKind`] inside
//! [`crate::Request::UnitJob`]), systemd's manager methods
//! ([`JobKind::method`], what the agent calls) and BlueChi's `Job.JobType`
//! property ([`JobKind::job_type`], what the manager shows).
//!
//! Invariant: the three spellings of one kind never disagree, because they
//! are written here once; a new kind is one more variant with its two words.
//!
//! The job *modes* (`mode` of BlueChi's `StartUnit` & co, systemd's
//! `--job-mode`) are here too: [`JOB_MODES`] is what the manager accepts
//! ([`check_mode`]), [`DEFAULT_JOB_MODE`] what droverctl sends.

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

/// systemd's job modes (`systemctl --job-mode`); anything else is refused
/// before it reaches a node.
pub const JOB_MODES: &[&str] = &[
    "replace",
    "fail",
    "isolate",
    "ignore-dependencies",
    "ignore-requirements",
    "flush",
    "triggering",
    "restart-dependencies",
    "replace-irreversibly",
];

/// The mode droverctl sends, as bluechictl does.
pub const DEFAULT_JOB_MODE: &str = "replace";

/// `mode` if it is one of [`JOB_MODES`]; else the one-line reason, which
/// names the modes accepted.
pub fn check_mode(mode: &str) -> Result<&str, String> {
    if JOB_MODES.contains(&mode) {
        Ok(mode)
    } else {
        Err(format!(
            "invalid job mode '{}': expected one of {}",
            mode.escape_default(),
            JOB_MODES.join(", ")
        ))
    }
}

impl JobKind {
    /// The kind whose [`JobKind::method`] is `method` (`StartUnit` → start).
    pub fn from_method(method: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.method() == method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_checked_and_the_default_is_one_of_them() {
        assert_eq!(check_mode(DEFAULT_JOB_MODE), Ok("replace"));
        for mode in JOB_MODES {
            assert_eq!(check_mode(mode), Ok(*mode));
        }
        let err = check_mode("bogus\0").unwrap_err();
        assert!(err.starts_with("invalid job mode 'bogus\\u{0}'"), "{err}");
        assert!(err.contains("replace, fail, isolate"), "{err}");
        assert!(check_mode("").is_err() && check_mode("Replace").is_err());
    }

    #[test]
    fn kinds_are_found_by_their_method() {
        for kind in JobKind::ALL {
            assert_eq!(JobKind::from_method(kind.method()), Some(kind));
        }
        assert_eq!(JobKind::from_method("KillUnit"), None);
    }

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
