//! A test knob, for the resync tests only: drop one unit event on its way
//! to the manager, as a lost systemd signal would, so that a test can see
//! resync repair it (`drover_protocol::resync`).
//!
//! `DROVER_TEST_DROP_UNIT_EVENT=UNIT/ACTIVE_STATE` in the agent's
//! environment drops the first real `UnitStateChanged` of `UNIT` that
//! reaches `ACTIVE_STATE`, once per agent process; the event still takes
//! its tag, exactly like an event lost on the way. Honoured only in debug
//! builds (what the integration tests run): a release build reads no such
//! variable, so nothing an operator sets can make an agent lie.

use drover_protocol::{Event, Reason};

/// The environment variable of the knob.
pub const VARIABLE: &str = "DROVER_TEST_DROP_UNIT_EVENT";

/// `UNIT/ACTIVE_STATE` → (unit, active state); `None` for anything else.
pub fn parse(spec: &str) -> Option<(String, String)> {
    let (unit, state) = spec.split_once('/')?;
    (!unit.is_empty() && !state.is_empty() && !state.contains('/'))
        .then(|| (unit.to_owned(), state.to_owned()))
}

/// Whether `event` matches the knob `(unit, active state)`.
pub fn matches(knob: &(String, String), event: &Event) -> bool {
    matches!(event, Event::UnitStateChanged { unit, active_state, reason: Reason::Real, .. }
        if unit.as_str() == knob.0 && *active_state == knob.1)
}

/// True for the one event the knob drops (see the module docs).
#[cfg(debug_assertions)]
pub fn drops(event: &Event) -> bool {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    static KNOB: OnceLock<Option<(String, String)>> = OnceLock::new();
    static FIRED: AtomicBool = AtomicBool::new(false);
    let Some(knob) = KNOB.get_or_init(|| {
        let knob = std::env::var(VARIABLE).ok().and_then(|v| parse(&v));
        if let Some((unit, state)) = &knob {
            tracing::warn!("test knob {VARIABLE}: the first real {state} of {unit} is dropped");
        }
        knob
    }) else {
        return false;
    };
    if !matches(knob, event) || FIRED.swap(true, Ordering::Relaxed) {
        return false;
    }
    tracing::warn!("test knob {VARIABLE}: dropped {event:?}");
    true
}

/// Release builds honour no knob.
#[cfg(not(debug_assertions))]
pub fn drops(_event: &Event) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{ModTag, UnitName};

    fn state(unit: &str, active: &str, reason: Reason) -> Event {
        Event::UnitStateChanged {
            tag: ModTag::new(1, 1),
            unit: UnitName::new(unit).unwrap(),
            active_state: active.into(),
            sub_state: "x".into(),
            reason,
        }
    }

    #[test]
    fn the_knob_names_one_unit_and_state() {
        let knob = parse("web.service/inactive").unwrap();
        assert!(matches(
            &knob,
            &state("web.service", "inactive", Reason::Real)
        ));
        assert!(!matches(
            &knob,
            &state("web.service", "inactive", Reason::Virtual)
        ));
        assert!(!matches(
            &knob,
            &state("web.service", "active", Reason::Real)
        ));
        assert!(!matches(
            &knob,
            &state("db.service", "inactive", Reason::Real)
        ));
        for bad in ["", "web.service", "/inactive", "web.service/", "a/b/c"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
