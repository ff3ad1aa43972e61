//! The reference rules' input from the clock: grace periods that end and
//! orphan-dep sweeps that are due (a sweep of B is due one grace period
//! after B registered, or at the end of the warm-up if a node that may
//! depend on B has not registered since the manager started).

use super::*;

impl References {
    /// The next instant [`References::tick`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        let refs = self
            .targets
            .values()
            .flat_map(|t| t.refs.values())
            .filter_map(|r| r.grace_until);
        let nodes = self.offline_until.values().copied();
        let sweeps = self
            .sweeps
            .iter()
            .map(|(b, (_, at))| self.sweep_due_at(b, *at));
        refs.chain(nodes).chain(sweeps).min()
    }

    /// Applies every grace period and sweep that is due at `now`.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        // Requesting nodes away too long: their references go.
        let mut touched = Vec::new();
        for (key, target) in self.targets.iter_mut() {
            let before = target.refs.len();
            target.refs.retain(|_, r| {
                let keep = r.grace_until.is_none_or(|until| until > now);
                if !keep && r.state.is_live() {
                    self.stats.collected_stale();
                }
                keep
            });
            if target.refs.len() != before {
                touched.push(key.clone());
            }
        }
        // Target nodes away too long: their active proxies end.
        let gone: Vec<NodeName> = self
            .offline_until
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(n, _)| n.clone())
            .collect();
        let change = TargetChange::State {
            active_state: "inactive".into(),
            sub_state: AGENT_OFFLINE.into(),
            reason: Reason::Real,
        };
        for b in &gone {
            self.offline_until.remove(b);
            for (key, target) in self.targets.iter_mut() {
                if &key.0 != b {
                    continue;
                }
                for ((a, _), r) in target.refs.iter_mut() {
                    if r.state != RefState::Active {
                        continue;
                    }
                    out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                        Notice::ProxyTarget {
                            proxy_id,
                            change: change.clone(),
                        }
                    }));
                    r.end(change.clone());
                }
                touched.push(key.clone());
            }
        }
        for (b, unit) in touched {
            self.settle(&b, &unit, &mut out);
        }
        let due: Vec<(NodeName, u64)> = self
            .sweeps
            .iter()
            .filter(|(b, (_, at))| self.sweep_due_at(b, *at) <= now)
            .map(|(n, (s, _))| (n.clone(), *s))
            .collect();
        for (node, session) in due {
            self.sweeps.remove(&node);
            out.push(Action::Sweep { node, session });
        }
        out
    }

    /// When the sweep of `b` planned for `at` may run: not before the
    /// warm-up ends while a node that may depend on `b` is awaited.
    fn sweep_due_at(&self, b: &NodeName, at: Instant) -> Instant {
        let held = self
            .policy
            .allow
            .iter()
            .any(|(a, targets)| targets.contains(b) && self.warm_up.awaits(a));
        if held {
            at.max(self.warm_up.deadline())
        } else {
            at
        }
    }
}
