//! The reference rules' input from the node lifecycle: a node registers
//! (its waiting targets hear it is back, its orphan-dep sweep is due one
//! grace period later; back for the first time since the start, it gives
//! the sweeps of the nodes it may depend on one grace period too) or its session ends (its references get their grace
//! period, its targets' known states become `agent-offline`, waiting proxies
//! on it are told).

use super::*;

impl References {
    /// `node` registered with `session`. Proxies waiting on its units hear
    /// that it is back (they were told it was offline).
    ///
    /// A node that comes online exists from then on, also for the permission
    /// check: a node admitted by its certificate alone (`AllowCertifiedNodes`,
    /// not listed) gets its registry entry at its first registration, after
    /// the policy was built.
    pub fn node_online(&mut self, node: &NodeName, session: u64, now: Instant) -> Vec<Action> {
        self.policy.known.insert(node.clone());
        if self.warm_up.awaits(node) {
            // Back after the start: its proxies re-announce what they need
            // now, so the sweeps of the nodes it may depend on give them one
            // grace period, as to every node at the start.
            let later = now + self.policy.grace;
            for b in self.policy.allow.get(node).into_iter().flatten() {
                if let Some((_, at)) = self.sweeps.get_mut(b) {
                    *at = (*at).max(later);
                }
            }
            self.warm_up.arrived(node);
        }
        self.online.insert(node.clone(), session);
        self.offline_until.remove(node);
        self.offline_since.remove(node);
        self.sweeps
            .insert(node.clone(), (session, now + self.policy.grace));
        // Its unacknowledged wants go out through `dep_commands`.
        let mut out = Vec::new();
        for ((b, _), target) in &self.targets {
            if b != node {
                continue;
            }
            for ((a, _), r) in target
                .refs
                .iter()
                .filter(|(_, r)| r.state == RefState::Waiting)
            {
                out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                    Notice::TargetNodeOnline { proxy_id }
                }));
            }
        }
        out
    }

    /// `node`'s session ended.
    pub fn node_offline(&mut self, node: &NodeName, now: Instant) -> Vec<Action> {
        if self.online.remove(node).is_none() {
            return Vec::new();
        }
        self.sweeps.remove(node);
        let until = now + self.policy.grace;
        self.offline_until.insert(node.clone(), until);
        self.offline_since.insert(node.clone(), now);
        let mut out = Vec::new();
        for ((b, _), target) in self.targets.iter_mut() {
            if b == node {
                // B may have done anything meanwhile; and its last news is stale.
                target.acked = None;
                if target.watched {
                    target.known = Known::Loaded {
                        active: "inactive".into(),
                        sub: AGENT_OFFLINE.into(),
                        reason: Reason::Virtual,
                    };
                }
            }
            for ((a, _), r) in target.refs.iter_mut() {
                if a == node && r.grace_until.is_none() {
                    r.grace_until = Some(until);
                }
                // Waiting proxies keep waiting; this is what they say if
                // they are stopped meanwhile.
                if b == node && r.state == RefState::Waiting {
                    out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                        Notice::TargetNodeOffline {
                            proxy_id,
                            offline_for_ms: Some(0),
                        }
                    }));
                }
            }
        }
        out
    }
}
