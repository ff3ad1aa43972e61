//! The reference rules' input from a config reload: permissions revoked
//! drop references at once, new nodes become targets.

use super::*;

impl References {
    /// A reloaded config: references it no longer permits are dropped at once
    /// (their requesters get `ProxyError`); `known` gains new nodes.
    pub fn reload(&mut self, policy: Policy) -> Vec<Action> {
        self.policy = policy;
        let mut out = Vec::new();
        let mut touched = Vec::new();
        for ((b, unit), target) in self.targets.iter_mut() {
            let mut revoked = Vec::new();
            for (rk, r) in &target.refs {
                let a = &rk.0;
                if let Err(why) = self.policy.check(a, b) {
                    revoked.push(rk.clone());
                    if r.state.is_live() {
                        self.stats.error(ErrorReason::NotAllowed);
                        out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                            Notice::ProxyError {
                                proxy_id,
                                message: format!("permission revoked by a config reload: {why}"),
                            }
                        }));
                    }
                }
            }
            if !revoked.is_empty() {
                for rk in revoked {
                    target.refs.remove(&rk);
                }
                touched.push((b.clone(), unit.clone()));
            }
        }
        for (b, unit) in touched {
            self.settle(&b, &unit, &mut out);
        }
        out
    }
}
