//! systemd's `SystemState` as the manager keeps and labels it: a node's
//! session holds the agent's last word as an index in [`SYSTEM_STATES`]
//! (`crate::nodes::session`), the metrics label it (`crate::metrics`).
//!
//! Invariant: a fixed set, whatever an agent sends.

/// systemd's `SystemState` values as the metrics label them; any other
/// value an agent sends is `other` (a fixed set, whatever it sends).
pub const SYSTEM_STATES: [&str; 9] = [
    "initializing",
    "starting",
    "running",
    "degraded",
    "maintenance",
    "stopping",
    "offline",
    "unknown",
    "other",
];

/// The index in [`SYSTEM_STATES`] of `state` (`None`: empty, not known).
pub fn system_state_index(state: &str) -> Option<usize> {
    if state.is_empty() {
        return None;
    }
    Some(
        SYSTEM_STATES[..SYSTEM_STATES.len() - 1]
            .iter()
            .position(|s| *s == state)
            .unwrap_or(SYSTEM_STATES.len() - 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_states_are_a_fixed_set() {
        assert_eq!(system_state_index(""), None);
        for (i, state) in SYSTEM_STATES.iter().enumerate() {
            assert_eq!(system_state_index(state), Some(i));
        }
        let other = Some(SYSTEM_STATES.len() - 1);
        for garbage in ["RUNNING", "running\n", "a\"b", &"x".repeat(64)] {
            assert_eq!(system_state_index(garbage), other, "{garbage}");
        }
    }
}
