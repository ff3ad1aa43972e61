//! What the reference rules show: `ListProxies` rows and the counts tests
//! and the driver read.

use super::*;

impl References {
    /// Every waiting, active or failed proxy, ordered by target, then requester.
    pub fn rows(&self) -> Vec<ProxyRow> {
        let mut rows = Vec::new();
        for ((b, unit), target) in &self.targets {
            let references = u32::try_from(target.live()).unwrap_or(u32::MAX);
            let target_state = match &target.known {
                Known::Unknown => "unknown".to_owned(),
                Known::Loaded { active, .. } => active.clone(),
                // An unloaded unit is inactive as far as systemd is concerned.
                Known::Removed => "inactive".to_owned(),
            };
            for ((a, _), r) in &target.refs {
                let state = match r.state {
                    RefState::Waiting => "waiting",
                    RefState::Active => "active",
                    RefState::Failed(_) => "failed",
                    RefState::Ended(_) => continue,
                };
                rows.push(ProxyRow {
                    requester: a.clone(),
                    node: b.clone(),
                    unit: unit.clone(),
                    state,
                    target_state: target_state.clone(),
                    references,
                });
            }
        }
        rows
    }

    /// Live references on (b, unit) (tests, metrics).
    pub fn live_count(&self, b: &NodeName, unit: &UnitName) -> usize {
        self.targets
            .get(&(b.clone(), unit.clone()))
            .map(Target::live)
            .unwrap_or(0)
    }

    /// True if the dep of (b, unit) is currently wanted running.
    pub fn dep_wanted(&self, b: &NodeName, unit: &UnitName) -> bool {
        self.targets
            .get(&(b.clone(), unit.clone()))
            .is_some_and(|t| t.want.running)
    }
}
