//! What a change of a proxy's target unit means for the proxy.
//!
//! Target state flows one way — target agent → manager → requesting agent —
//! and both the manager (its reference table) and the requesting agent (its
//! proxy table) decide a proxy's fate from the same [`TargetChange`]s without
//! telling each other. They agree because both call [`verdict`]:
//!
//! * **up**: the target is `active`, whatever the reason — a waiting proxy
//!   becomes active (a replayed, virtual `active` counts: the target runs);
//! * **real down**: systemd itself said the target is `failed` or `inactive`,
//!   or unloaded it (reason `real`) — a waiting proxy fails, an active one ends
//!   (its unit is stopped so that `BindsTo=` dependents stop);
//! * anything else — `activating`, `deactivating`, a `New`, and every
//!   *virtual* down (target node offline, replays) — decides nothing: the
//!   target may well still run.
//!
//! Pure: no state, no I/O.

use crate::message::{Reason, TargetChange};

/// The target's active state that makes a proxy active.
pub const ACTIVE: &str = "active";

/// The verdict one target change carries for a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The target is active.
    Up,
    /// The target really stopped, failed or was unloaded.
    RealDown,
    /// Nothing to decide on this change.
    Undecided,
}

/// Whether an active state is a down one (`failed` or `inactive`).
pub fn is_down(active_state: &str) -> bool {
    matches!(active_state, "failed" | "inactive")
}

/// See the module docs.
pub fn verdict(change: &TargetChange) -> Verdict {
    match change {
        TargetChange::State { active_state, .. } if active_state == ACTIVE => Verdict::Up,
        TargetChange::State {
            active_state,
            reason: Reason::Real,
            ..
        } if is_down(active_state) => Verdict::RealDown,
        TargetChange::Removed {
            reason: Reason::Real,
        } => Verdict::RealDown,
        _ => Verdict::Undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(active: &str, reason: Reason) -> TargetChange {
        TargetChange::State {
            active_state: active.into(),
            sub_state: "x".into(),
            reason,
        }
    }

    #[test]
    fn active_is_up_whatever_the_reason() {
        assert_eq!(verdict(&state("active", Reason::Real)), Verdict::Up);
        assert_eq!(verdict(&state("active", Reason::Virtual)), Verdict::Up);
    }

    #[test]
    fn only_real_downs_are_down() {
        for active in ["failed", "inactive"] {
            assert_eq!(verdict(&state(active, Reason::Real)), Verdict::RealDown);
            assert_eq!(verdict(&state(active, Reason::Virtual)), Verdict::Undecided);
        }
        let removed = |reason| TargetChange::Removed { reason };
        assert_eq!(verdict(&removed(Reason::Real)), Verdict::RealDown);
        assert_eq!(verdict(&removed(Reason::Virtual)), Verdict::Undecided);
    }

    #[test]
    fn transitions_and_news_decide_nothing() {
        for active in ["activating", "deactivating", "reloading"] {
            assert_eq!(verdict(&state(active, Reason::Real)), Verdict::Undecided);
        }
        for reason in [Reason::Real, Reason::Virtual] {
            assert_eq!(verdict(&TargetChange::New { reason }), Verdict::Undecided);
        }
    }
}
