//! Units the agent itself makes and keeps to itself: the transient services
//! that run `HealthCmd=` checks (`crate::health::exec`). They come and go
//! with every check run; the manager never hears of them (the unit hub
//! skips them), so a monitor on every unit of a node sees what it saw
//! before health existed, and a check run costs the manager nothing.

/// The name every check unit starts with.
pub const CHECK_UNIT_PREFIX: &str = "drover-health-check-";

/// Whether `unit` is one of the agent's own units.
pub fn is_own(unit: &str) -> bool {
    unit.starts_with(CHECK_UNIT_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_units_are_own_and_others_are_not() {
        assert!(is_own("drover-health-check-42-7.service"));
        assert!(!is_own("drover-health.service"));
        assert!(!is_own("db.service"));
    }
}
