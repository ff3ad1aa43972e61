//! systemd's job results as label values. A result outside the list counts
//! as `other`, so a peer (or a systemd) that says anything else cannot grow
//! the number of series.

/// The job results shown as they are: systemd's, then drover's
/// `disconnected` (the manager ends a node's jobs so when its link drops).
pub const JOB_RESULTS: &[&str] = &[
    "done",
    "canceled",
    "timeout",
    "failed",
    "dependency",
    "skipped",
    "invalid",
    "once",
    "collected",
    "disconnected",
];

/// The label of a job result: itself when listed in [`JOB_RESULTS`], else
/// `other`.
pub fn result_label(result: &str) -> &'static str {
    JOB_RESULTS
        .iter()
        .find(|r| **r == result)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_bounded() {
        assert_eq!(result_label("done"), "done");
        assert_eq!(result_label("disconnected"), "disconnected");
        for other in ["", "DONE", "x".repeat(4096).as_str(), "done\n"] {
            assert_eq!(result_label(other), "other");
        }
    }
}
