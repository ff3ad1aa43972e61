//! The check state machine of one unit (or node check): what a sequence of
//! check results means. Pure — no clock of its own, no I/O — so a property
//! test can hold it against the documented rules over any result sequence.
//!
//! The rules (docs/health.md):
//!
//! * While the unit is not active its state is `starting` ("no verdict"), and
//!   results are ignored. Each activation starts afresh: no counted failure,
//!   no success, the start period begins.
//! * A **success** makes the state `healthy` at once (one success after
//!   failures is a recovery: "healthy again within one interval of the first
//!   success") and resets the failure counter to zero.
//! * A **failure** counts unless it falls inside the start period
//!   (`HealthStartPeriod=`, from the activation) *and* no success has been
//!   seen since the activation (a success ends the start period early, as in
//!   Docker and Podman). The state turns `unhealthy` when the failures counted
//!   *since the last success* reach `HealthRetries=`; it stays so until the
//!   next success.
//! * Counters are consecutive and reset by the opposite result: a success
//!   clears the failure count, so "3 failures" means three in a row, never
//!   three in total (Joyent Registrar's bug was the other reading).
//! * Only a change of the state is news ([`Machine::result`] returns
//!   `Some` then): the reason of a verdict is the one of the result that made
//!   it, and a run that confirms the state sends nothing, whatever its output.
//!
//! How often the check runs is [`Machine::pace`]: the startup interval while
//! `starting`, the interval otherwise.

use drover_protocol::HealthState;
use std::time::{Duration, Instant};

/// The result of one check run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed; the output, if any (the reason of a `healthy` verdict).
    Pass(String),
    /// Failed; the output or error.
    Fail(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Pass(_))
    }

    fn text(&self) -> &str {
        match self {
            Outcome::Pass(t) | Outcome::Fail(t) => t,
        }
    }
}

/// What the machine needs of a check's declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    pub retries: u32,
    pub start_period: Duration,
    pub interval: Duration,
    pub startup_interval: Duration,
}

/// Reason of `starting` while the unit is not active.
pub const NOT_ACTIVE: &str = "the unit is not active";

/// One check's state: see the module docs.
#[derive(Debug, Clone)]
pub struct Machine {
    rules: Rules,
    state: HealthState,
    reason: String,
    /// `Some(activation)` while the unit is active.
    active_since: Option<Instant>,
    /// A success was seen since the activation.
    passed: bool,
    /// Failures counted since the last success (or the activation).
    failures: u32,
}

impl Machine {
    /// A machine for a unit that is not active (yet).
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            state: HealthState::Starting,
            reason: NOT_ACTIVE.into(),
            active_since: None,
            passed: false,
            failures: 0,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    pub fn rules(&self) -> Rules {
        self.rules
    }

    pub fn is_active(&self) -> bool {
        self.active_since.is_some()
    }

    /// Failures counted since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The unit became active at `now`: a fresh start. `Some(state)` if the
    /// state changed (it is `starting` now).
    pub fn activate(&mut self, now: Instant) -> Option<HealthState> {
        self.active_since = Some(now);
        self.passed = false;
        self.failures = 0;
        self.set(HealthState::Starting, "")
    }

    /// The unit is no longer active: `starting` (no verdict), results ignored
    /// until the next activation.
    pub fn deactivate(&mut self) -> Option<HealthState> {
        self.active_since = None;
        self.passed = false;
        self.failures = 0;
        self.set(HealthState::Starting, NOT_ACTIVE)
    }

    /// One check result at `now`; `Some(state)` if the state changed.
    pub fn result(&mut self, now: Instant, outcome: &Outcome) -> Option<HealthState> {
        let since = self.active_since?;
        if outcome.passed() {
            self.passed = true;
            self.failures = 0;
            return self.set(HealthState::Healthy, outcome.text());
        }
        let in_start_period =
            !self.passed && now.saturating_duration_since(since) < self.rules.start_period;
        if in_start_period {
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.rules.retries {
            self.set(HealthState::Unhealthy, outcome.text())
        } else {
            None
        }
    }

    /// The time until the next run after one that started now.
    pub fn pace(&self) -> Duration {
        match self.state {
            HealthState::Starting => self.rules.startup_interval,
            _ => self.rules.interval,
        }
    }

    fn set(&mut self, state: HealthState, reason: &str) -> Option<HealthState> {
        if self.state == state {
            return None;
        }
        self.state = state;
        drover_protocol::health::cut_reason(reason).clone_into(&mut self.reason);
        Some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthState::{Healthy, Starting, Unhealthy};
    use proptest::prelude::*;

    fn rules(retries: u32, start_period_ms: u64) -> Rules {
        Rules {
            retries,
            start_period: Duration::from_millis(start_period_ms),
            interval: Duration::from_secs(10),
            startup_interval: Duration::from_secs(1),
        }
    }

    fn pass() -> Outcome {
        Outcome::Pass(String::new())
    }

    fn fail(why: &str) -> Outcome {
        Outcome::Fail(why.into())
    }

    #[test]
    fn three_in_a_row_not_three_in_total() {
        let t0 = Instant::now();
        let mut m = Machine::new(rules(3, 0));
        assert_eq!((m.state(), m.reason()), (Starting, NOT_ACTIVE));
        assert_eq!(m.activate(t0), None, "starting → starting is no news");
        assert_eq!(m.reason(), NOT_ACTIVE, "the reason goes with a change only");
        assert_eq!(m.result(t0, &pass()), Some(Healthy));
        // F F P F F P F F: never three in a row.
        for o in [
            fail("a"),
            fail("b"),
            pass(),
            fail("c"),
            fail("d"),
            pass(),
            fail("e"),
            fail("f"),
        ] {
            assert_eq!(m.result(t0, &o), None, "{o:?}");
        }
        assert_eq!(m.result(t0, &fail("g")), Some(Unhealthy));
        assert_eq!(m.reason(), "g");
        assert_eq!(
            m.result(t0, &fail("h")),
            None,
            "confirming runs send nothing"
        );
        assert_eq!(m.reason(), "g");
        assert_eq!(m.result(t0, &pass()), Some(Healthy), "one success recovers");
    }

    #[test]
    fn down_up_down_many_times() {
        let t0 = Instant::now();
        let mut m = Machine::new(rules(2, 0));
        m.activate(t0);
        for cycle in 0..100 {
            assert_eq!(m.result(t0, &pass()), Some(Healthy), "cycle {cycle}");
            assert_eq!(
                m.result(t0, &fail("x")),
                None,
                "cycle {cycle}: one failure is not two"
            );
            assert_eq!(m.result(t0, &fail("y")), Some(Unhealthy), "cycle {cycle}");
        }
    }

    #[test]
    fn the_start_period_forgives_until_the_first_success() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Machine::new(rules(1, 1000));
        m.activate(t0);
        assert_eq!(m.result(t0 + ms(100), &fail("booting")), None);
        assert_eq!(m.result(t0 + ms(999), &fail("booting")), None);
        assert_eq!(m.state(), Starting);
        assert_eq!(m.result(t0 + ms(1000), &fail("late")), Some(Unhealthy));
        // A success inside the period ends it: the next failure counts.
        let mut m = Machine::new(rules(1, 1000));
        m.activate(t0);
        assert_eq!(m.result(t0 + ms(10), &pass()), Some(Healthy));
        assert_eq!(m.result(t0 + ms(20), &fail("x")), Some(Unhealthy));
    }

    #[test]
    fn inactive_units_have_no_verdict_and_ignore_results() {
        let t0 = Instant::now();
        let mut m = Machine::new(rules(1, 0));
        assert_eq!(m.result(t0, &fail("x")), None);
        m.activate(t0);
        assert_eq!(m.result(t0, &fail("x")), Some(Unhealthy));
        assert_eq!(m.deactivate(), Some(Starting));
        assert_eq!(m.reason(), NOT_ACTIVE);
        assert_eq!(m.result(t0, &pass()), None);
        assert_eq!(m.activate(t0), None, "starting → starting is no news");
        assert_eq!(m.result(t0, &pass()), Some(Healthy));
    }

    #[test]
    fn pace_is_the_startup_interval_until_a_verdict() {
        let t0 = Instant::now();
        let mut m = Machine::new(rules(1, 0));
        m.activate(t0);
        assert_eq!(m.pace(), Duration::from_secs(1));
        m.result(t0, &pass());
        assert_eq!(m.pace(), Duration::from_secs(10));
        m.result(t0, &fail("x"));
        assert_eq!(m.pace(), Duration::from_secs(10));
    }

    /// One step of a random history.
    #[derive(Debug, Clone)]
    enum Step {
        /// A result, `ms` after the previous step.
        Result {
            ok: bool,
            ms: u64,
        },
        Deactivate,
        Activate,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            10 => (any::<bool>(), 0u64..400).prop_map(|(ok, ms)| Step::Result { ok, ms }),
            1 => Just(Step::Deactivate),
            1 => Just(Step::Activate),
        ]
    }

    /// The documented rules, stated over the whole history since the last
    /// activation instead of step by step.
    fn expected(rules: Rules, since_activation: &[(bool, Duration)], active: bool) -> HealthState {
        if !active {
            return Starting;
        }
        let first_pass = since_activation.iter().position(|(ok, _)| *ok);
        let counted = |i: usize, at: Duration| match first_pass {
            Some(p) if p < i => true,
            _ => at >= rules.start_period,
        };
        let trailing = since_activation
            .iter()
            .enumerate()
            .rev()
            .take_while(|(_, (ok, _))| !ok)
            .filter(|(i, (_, at))| counted(*i, *at))
            .count();
        if trailing >= rules.retries as usize {
            Unhealthy
        } else if first_pass.is_some() {
            Healthy
        } else {
            Starting
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The machine agrees with the rules after every step, and reports a
        /// change exactly when the state changed.
        #[test]
        fn agrees_with_the_documented_rules(
            retries in 1u32..5,
            start_period_ms in prop_oneof![Just(0u64), 1u64..1500],
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            let rules = rules(retries, start_period_ms);
            let t0 = Instant::now();
            let mut now = t0;
            let mut m = Machine::new(rules);
            let mut active = false;
            let mut activated_at = t0;
            let mut history: Vec<(bool, Duration)> = Vec::new();
            for s in steps {
                let before = m.state();
                let change = match s {
                    Step::Activate => {
                        active = true;
                        activated_at = now;
                        history.clear();
                        m.activate(now)
                    }
                    Step::Deactivate => {
                        active = false;
                        history.clear();
                        m.deactivate()
                    }
                    Step::Result { ok, ms } => {
                        now += Duration::from_millis(ms);
                        if active {
                            history.push((ok, now - activated_at));
                        }
                        let outcome = if ok { pass() } else { fail("x") };
                        m.result(now, &outcome)
                    }
                };
                let want = expected(rules, &history, active);
                prop_assert_eq!(m.state(), want, "history {:?}", history);
                prop_assert_eq!(change, (before != want).then_some(want));
            }
        }
    }
}
