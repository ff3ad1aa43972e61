//! The reference rules' input from target units: their state changes as
//! the target node's agent reports them, relayed to waiting and active
//! references by the verdict rule both sides apply.

use super::*;

impl References {
    /// A state change of a watched target (or the replay of its known state
    /// right after [`Action::Watch`]).
    pub fn target_event(
        &mut self,
        b: &NodeName,
        unit: &UnitName,
        change: &TargetChange,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let key = (b.clone(), unit.clone());
        let Some(target) = self.targets.get_mut(&key) else {
            return out;
        };
        if !target.watched {
            return out;
        }
        // The target came up while a start of its dep was not yet confirmed:
        // remembered for the references of BlueChi's family.
        if let TargetChange::State {
            active_state,
            reason: Reason::Real,
            ..
        } = change
            && active_state == ACTIVE
            && target.want.running
            && target.acked != Some(target.want)
        {
            target.ran = Some((target.want.generation, change.clone()));
        }
        match change {
            TargetChange::New { .. } => {
                if target.known == Known::Removed {
                    target.known = Known::Unknown;
                }
            }
            TargetChange::State {
                active_state,
                sub_state,
                reason,
            } => {
                target.known = Known::Loaded {
                    active: active_state.clone(),
                    sub: sub_state.clone(),
                    reason: *reason,
                }
            }
            TargetChange::Removed { .. } => target.known = Known::Removed,
            TargetChange::Health(health) => target.health = health.clone(),
        }
        // The verdict of this change against what is known of the target.
        let mut view = TargetView::default();
        view.apply(&TargetChange::Health(target.health.clone()));
        if let Known::Loaded {
            active,
            sub,
            reason,
        } = &target.known
        {
            view.apply(&TargetChange::State {
                active_state: active.clone(),
                sub_state: sub.clone(),
                reason: *reason,
            });
        }
        let v = match change {
            // Health: up when it passes on an active target.
            TargetChange::Health(_) => view.apply(change),
            // State: the state's own verdict, held back while the health
            // does not pass.
            _ => match drover_protocol::verdict::verdict(change) {
                Verdict::Up if !target.health.state.passes() => Verdict::Undecided,
                v => v,
            },
        };
        let acked = target.acked;
        let ran = target.ran.clone();
        let health = target.health.clone();
        for ((a, _), r) in target.refs.iter_mut() {
            if !r.state.is_live() {
                continue;
            }
            // Until B confirms the dep start that covers a waiting reference,
            // news of the target may be from before that start and says
            // nothing about it: an "inactive" of a stop just before (or of a
            // unit loaded and garbage-collected by a probe) would fail a
            // healthy proxy, and an "active" that B's agent replays from a
            // cache that has not yet seen that stop would complete a proxy
            // whose target is going down. So a waiting reference hears nothing
            // until the confirmation; B's agent sends that only after the
            // target's news up to the end of the dep's start job (agent
            // `news.rs`), and then the reference gets the state as known
            // ([`References::dep_result`]), or the start's error.
            if r.state == RefState::Waiting && !covers(acked, r.added_gen) {
                continue;
            }
            let online = self.online.get(a).copied();
            if r.state == RefState::Waiting
                && let Some(message) = down_after_start(unit, b, change)
            {
                let real = real_down(change);
                let ran = ran.as_ref();
                if !ran_then_down(r, ran, &health, (a, online), (b, unit), &real, &mut out) {
                    fail_waiting(r, a, online, message, &mut out);
                }
                continue;
            }
            if r.state == RefState::Waiting
                && verdict(change) == Verdict::RealDown
                && ran_then_down(
                    r,
                    ran.as_ref(),
                    &health,
                    (a, online),
                    (b, unit),
                    change,
                    &mut out,
                )
            {
                continue;
            }
            out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                Notice::ProxyTarget {
                    proxy_id,
                    change: change.clone(),
                }
            }));
            apply_rule(r, b, unit, change, v);
        }
        self.settle(b, unit, &mut out);
        out
    }
}
