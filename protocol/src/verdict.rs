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
//! That is [`verdict`], for one change. A target that declares a health check
//! (`crate::health`) must also be healthy: [`TargetView`] keeps what one
//! proxy knows of its target (active or not, its last health) and gives the
//! verdict of each change against it:
//!
//! * **up**: the target is active *and* its health passes (`none`: no check,
//!   or `healthy`), whichever of the two came last;
//! * **unhealthy**: the target's health turned `unhealthy` (a waiting proxy
//!   keeps waiting — its start timeout ends it, with the reason
//!   [`TargetView::waiting_reason`] gives; an active one is reported and only
//!   stopped where the operator asked for it);
//! * **real down** and **undecided** as above.
//!
//! A target with no check behaves exactly as [`verdict`] says, because its
//! health is `none` from the start. Whoever relays a target's changes to a
//! proxy sends the target's health *before* its state, so a target with a
//! check is never taken for one without.
//!
//! Pure: no I/O; the only state is the view's.

use crate::health::{Health, HealthState};
use crate::message::TargetChange;

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
    /// The target's health check turned `unhealthy` ([`TargetView`] only).
    Unhealthy,
}

/// Whether an active state is a down one (`failed` or `inactive`).
pub fn is_down(active_state: &str) -> bool {
    matches!(active_state, "failed" | "inactive")
}

/// What one proxy knows of its target: see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetView {
    active: bool,
    health: Health,
}

impl TargetView {
    /// Takes `change` in; the verdict it carries for the proxy.
    pub fn apply(&mut self, change: &TargetChange) -> Verdict {
        match change {
            TargetChange::Health(health) => {
                self.health = health.clone();
                match health.state {
                    HealthState::Unhealthy => Verdict::Unhealthy,
                    state if state.passes() && self.active => Verdict::Up,
                    _ => Verdict::Undecided,
                }
            }
            TargetChange::State { active_state, .. } => {
                self.active = active_state == ACTIVE;
                match verdict(change) {
                    Verdict::Up if !self.health.state.passes() => Verdict::Undecided,
                    v => v,
                }
            }
            TargetChange::Removed { .. } => {
                self.active = false;
                verdict(change)
            }
            TargetChange::New { .. } => verdict(change),
        }
    }

    /// The target was last said to be active.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The target's last health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Whether the target counts as up: active and its health passes.
    pub fn is_up(&self) -> bool {
        self.active && self.health.state.passes()
    }

    /// Why a proxy of `unit` on `node` still waits although its target is
    /// active: its check has not passed. `None` when that is not why.
    ///
    /// ```text
    /// db.service on node bar is active but unhealthy: connection refused
    /// db.service on node bar is active but not healthy yet (starting)
    /// ```
    pub fn waiting_reason(&self, unit: &str, node: &str) -> Option<String> {
        if !self.active {
            return None;
        }
        let reason = crate::health::one_line(&self.health.reason);
        match self.health.state {
            HealthState::Unhealthy if reason.is_empty() => {
                Some(format!("{unit} on node {node} is active but unhealthy"))
            }
            HealthState::Unhealthy => Some(format!(
                "{unit} on node {node} is active but unhealthy: {reason}"
            )),
            HealthState::Starting if reason.is_empty() => Some(format!(
                "{unit} on node {node} is active but not healthy yet (starting)"
            )),
            HealthState::Starting => Some(format!(
                "{unit} on node {node} is active but not healthy yet (starting: {reason})"
            )),
            HealthState::None | HealthState::Healthy => None,
        }
    }
}

/// The verdict of one state change, health aside: see the module docs.
pub fn verdict(change: &TargetChange) -> Verdict {
    match change {
        TargetChange::State { active_state, .. } if active_state == ACTIVE => Verdict::Up,
        TargetChange::State {
            active_state,
            reason,
            ..
        } if reason.is_real() && is_down(active_state) => Verdict::RealDown,
        TargetChange::Removed { reason } if reason.is_real() => Verdict::RealDown,
        _ => Verdict::Undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Reason;

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
            assert_eq!(
                verdict(&state(active, Reason::Resync)),
                Verdict::RealDown,
                "a repaired state is the node's real one"
            );
        }
        let removed = |reason| TargetChange::Removed { reason };
        assert_eq!(verdict(&removed(Reason::Real)), Verdict::RealDown);
        assert_eq!(verdict(&removed(Reason::Virtual)), Verdict::Undecided);
    }

    fn health(state: HealthState, reason: &str) -> TargetChange {
        TargetChange::Health(Health::new(state, reason, 0))
    }

    #[test]
    fn a_view_without_health_news_follows_the_state_rule() {
        let changes = [
            state("activating", Reason::Real),
            state("active", Reason::Virtual),
            state("inactive", Reason::Virtual),
            state("active", Reason::Real),
            state("failed", Reason::Real),
            TargetChange::Removed {
                reason: Reason::Real,
            },
            TargetChange::New {
                reason: Reason::Real,
            },
        ];
        let mut view = TargetView::default();
        for change in &changes {
            assert_eq!(view.apply(change), verdict(change), "{change:?}");
        }
    }

    #[test]
    fn a_target_with_a_check_is_up_once_active_and_healthy_in_either_order() {
        use HealthState::{Healthy, Starting, Unhealthy};
        let mut view = TargetView::default();
        assert_eq!(view.apply(&health(Starting, "")), Verdict::Undecided);
        assert_eq!(
            view.apply(&state("active", Reason::Real)),
            Verdict::Undecided
        );
        assert_eq!(
            view.waiting_reason("db.service", "bar").as_deref(),
            Some("db.service on node bar is active but not healthy yet (starting)")
        );
        assert_eq!(
            view.apply(&health(Unhealthy, "connect: refused\nmore")),
            Verdict::Unhealthy
        );
        assert_eq!(
            view.waiting_reason("db.service", "bar").as_deref(),
            Some("db.service on node bar is active but unhealthy: connect: refused")
        );
        assert_eq!(view.apply(&health(Healthy, "")), Verdict::Up);
        assert!(view.is_up());
        assert_eq!(view.waiting_reason("db.service", "bar"), None);

        let mut view = TargetView::default();
        assert_eq!(view.apply(&health(Healthy, "")), Verdict::Undecided);
        assert_eq!(view.apply(&state("active", Reason::Virtual)), Verdict::Up);
        // A real stop is a real stop, healthy or not.
        assert_eq!(
            view.apply(&state("inactive", Reason::Real)),
            Verdict::RealDown
        );
        assert_eq!(view.waiting_reason("db.service", "bar"), None);
        // A check that goes away (`none`) passes.
        let mut view = TargetView::default();
        view.apply(&health(Unhealthy, "x"));
        view.apply(&state("active", Reason::Real));
        assert_eq!(view.apply(&health(HealthState::None, "")), Verdict::Up);
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
