//! Unit events and the last known state of each unit on a node, with the
//! modification-tag rules that decide which event wins.
//!
//! Pure data, no tasks, no locks: [`Records::apply`] is order-independent by
//! construction (the outcome is the event with the largest tag, by the rules
//! of `drover_protocol::tag`), which the tests check with reordered,
//! duplicated and interleaved streams. The fan-out of these events to
//! watchers is [`crate::units::hub`]'s job (docs/dev/architecture.md "Unit
//! subscriptions and modification tags").

use drover_protocol::health::HealthState;
use drover_protocol::{Marshalled, ModTag, NodeName, Reason, UnitName};
use std::collections::BTreeMap;
use std::ops::Bound;

/// The pseudo unit name BlueChi uses for "every unit".
pub const WILDCARD: &str = "*";

/// What happened to a unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    New {
        reason: Reason,
    },
    State {
        active_state: String,
        sub_state: String,
        reason: Reason,
    },
    /// systemd's PropertiesChanged (`a{sv}` as [`Marshalled`]); always real.
    Properties {
        interface: String,
        properties: Marshalled,
    },
    Removed {
        reason: Reason,
    },
    /// The unit's health verdict changed (`crate::units::health`); not a
    /// record's business: [`Records::apply`] leaves the record as it is.
    /// `since_usec` is realtime µs (0 for `none`); `origin` is `Virtual`
    /// for the replay to a new watch.
    Health {
        state: HealthState,
        reason: String,
        since_usec: u64,
        origin: Reason,
    },
}

/// An event as watchers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitEvent {
    pub node: NodeName,
    /// `None`: the pseudo unit `*` (virtual events for wildcard watchers).
    pub unit: Option<UnitName>,
    pub tag: ModTag,
    pub change: Change,
}

impl UnitEvent {
    /// The unit name as BlueChi's signals carry it (`*` for the pseudo unit).
    pub fn unit_str(&self) -> &str {
        self.unit.as_ref().map(UnitName::as_str).unwrap_or(WILDCARD)
    }
}

/// The last known state of one unit on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Tag of the last `New`, `State` or `Removed` applied.
    pub tag: ModTag,
    pub loaded: bool,
    /// Empty while unknown (never for a loaded unit after a `New`).
    pub active_state: String,
    pub sub_state: String,
    /// Tag of the last forwarded `Properties` (duplicates are not forwarded).
    pub props_tag: ModTag,
}

/// What applying an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The record changed (or the event is forwarded for another reason).
    Changed,
    /// Only the tag moved: the content was already known.
    Same,
    /// Older than (or a duplicate of) what the record holds: dropped.
    Stale,
}

/// The records of one node, and the tag rules that change them. Pure data:
/// order-independent by construction (the outcome is the event with the
/// largest tag), which the tests check with reordered, duplicated and
/// interleaved streams.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Records {
    /// Sorted by unit name, so a replay can resume after the last unit it
    /// told a watcher of ([`Records::next_loaded_after`]).
    map: BTreeMap<UnitName, Record>,
}

impl Records {
    pub fn get(&self, unit: &UnitName) -> Option<&Record> {
        self.map.get(unit)
    }

    /// The record of `unit` with the name as the map holds it.
    pub fn get_key_value(&self, unit: &UnitName) -> Option<(&UnitName, &Record)> {
        self.map.get_key_value(unit)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&UnitName, &Record)> {
        self.map.iter()
    }

    /// The first loaded record after `after` (from the start when `None`),
    /// in unit-name order.
    pub fn next_loaded_after(&self, after: Option<&UnitName>) -> Option<(&UnitName, &Record)> {
        let from = match after {
            Some(u) => Bound::Excluded(u),
            None => Bound::Unbounded,
        };
        self.map
            .range::<UnitName, _>((from, Bound::Unbounded))
            .find(|(_, r)| r.loaded)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn remove(&mut self, unit: &UnitName) {
        self.map.remove(unit);
    }

    pub fn retain(&mut self, f: impl FnMut(&UnitName, &mut Record) -> bool) {
        self.map.retain(f)
    }

    /// Applies `change` tagged `tag` to `unit`:
    ///
    /// * `New` (state becomes `inactive`/`dead`, as the agent's cache does on
    ///   load) and `State` are updates: applied if `tag` succeeds the record's.
    ///   A virtual `New` of a unit the record holds as loaded only takes the
    ///   tag (a replay, `Same`): the state it knows stays.
    /// * `Removed` is applied if `tag` succeeds or equals it; an equal tag on
    ///   an already removed unit changes nothing.
    /// * `Properties` does not change the record; it passes if `tag`
    ///   succeeds both the record's tag and the last passed properties.
    pub fn apply(&mut self, unit: &UnitName, tag: ModTag, change: &Change) -> Applied {
        let existing = self.map.get_mut(unit);
        match change {
            Change::New { .. } | Change::State { .. } => {
                let (active, sub) = match change {
                    Change::State {
                        active_state,
                        sub_state,
                        ..
                    } => (active_state.as_str(), sub_state.as_str()),
                    _ => ("inactive", "dead"),
                };
                match existing {
                    Some(rec) if !tag.succeeds(&rec.tag) => Applied::Stale,
                    // A replay (virtual `UnitNew`) of a unit already loaded
                    // here: no news, and its known state stays (it is not a
                    // fresh load that starts inactive).
                    Some(rec)
                        if rec.loaded
                            && matches!(
                                change,
                                Change::New {
                                    reason: Reason::Virtual
                                }
                            ) =>
                    {
                        rec.tag = tag;
                        Applied::Same
                    }
                    Some(rec) => {
                        let same = rec.loaded && rec.active_state == active && rec.sub_state == sub;
                        rec.tag = tag;
                        rec.loaded = true;
                        if !same {
                            active.clone_into(&mut rec.active_state);
                            sub.clone_into(&mut rec.sub_state);
                        }
                        if same {
                            Applied::Same
                        } else {
                            Applied::Changed
                        }
                    }
                    None => {
                        self.map.insert(
                            unit.clone(),
                            Record {
                                tag,
                                loaded: true,
                                active_state: active.to_owned(),
                                sub_state: sub.to_owned(),
                                props_tag: ModTag::ZERO,
                            },
                        );
                        Applied::Changed
                    }
                }
            }
            Change::Removed { .. } => match existing {
                Some(rec) if !tag.may_remove(&rec.tag) => Applied::Stale,
                Some(rec) if tag == rec.tag && !rec.loaded => Applied::Stale,
                Some(rec) => {
                    let was_loaded = rec.loaded;
                    rec.tag = tag;
                    rec.loaded = false;
                    rec.active_state.clear();
                    rec.sub_state.clear();
                    if was_loaded {
                        Applied::Changed
                    } else {
                        Applied::Same
                    }
                }
                None => {
                    // A tombstone, so a late update cannot resurrect the unit.
                    self.map.insert(
                        unit.clone(),
                        Record {
                            tag,
                            loaded: false,
                            active_state: String::new(),
                            sub_state: String::new(),
                            props_tag: ModTag::ZERO,
                        },
                    );
                    Applied::Same
                }
            },
            Change::Properties { .. } => match existing {
                Some(rec) if !tag.succeeds(&rec.tag) || !tag.succeeds(&rec.props_tag) => {
                    Applied::Stale
                }
                Some(rec) => {
                    rec.props_tag = tag;
                    Applied::Changed
                }
                None => Applied::Changed,
            },
            // Kept in the health book, not here.
            Change::Health { .. } => Applied::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    fn state(a: &str, s: &str, reason: Reason) -> Change {
        Change::State {
            active_state: a.into(),
            sub_state: s.into(),
            reason,
        }
    }

    const REAL: Reason = Reason::Real;

    #[test]
    fn tag_rules_on_one_record() {
        let mut r = Records::default();
        let u = unit("a.service");
        assert_eq!(
            r.apply(&u, ModTag::new(1, 1), &Change::New { reason: REAL }),
            Applied::Changed
        );
        assert_eq!(r.get(&u).unwrap().active_state, "inactive");
        assert_eq!(
            r.apply(&u, ModTag::new(1, 3), &state("active", "running", REAL)),
            Applied::Changed
        );
        // Late and duplicate updates are stale.
        assert_eq!(
            r.apply(&u, ModTag::new(1, 2), &state("activating", "start", REAL)),
            Applied::Stale
        );
        assert_eq!(
            r.apply(&u, ModTag::new(1, 3), &state("active", "running", REAL)),
            Applied::Stale
        );
        // Properties pass once, only when newer than the state.
        let props = Change::Properties {
            interface: "i".into(),
            properties: Marshalled::default(),
        };
        assert_eq!(r.apply(&u, ModTag::new(1, 2), &props), Applied::Stale);
        assert_eq!(r.apply(&u, ModTag::new(1, 4), &props), Applied::Changed);
        assert_eq!(r.apply(&u, ModTag::new(1, 4), &props), Applied::Stale);
        // A removal with an equal tag applies; a second one does nothing.
        let removed = Change::Removed { reason: REAL };
        assert_eq!(r.apply(&u, ModTag::new(1, 3), &removed), Applied::Changed);
        assert!(!r.get(&u).unwrap().loaded);
        assert_eq!(r.apply(&u, ModTag::new(1, 3), &removed), Applied::Stale);
        // The tombstone stops a late update from resurrecting the unit.
        assert_eq!(
            r.apply(&u, ModTag::new(1, 2), &Change::New { reason: REAL }),
            Applied::Stale
        );
        // A newer session wins over anything of the old one.
        assert_eq!(
            r.apply(&u, ModTag::new(2, 1), &state("failed", "failed", REAL)),
            Applied::Changed
        );
        assert_eq!(
            r.apply(&u, ModTag::new(1, 99), &state("active", "running", REAL)),
            Applied::Stale
        );
        // A virtual replay of the known state only moves the tag.
        assert_eq!(
            r.apply(
                &u,
                ModTag::new(2, 2),
                &state("failed", "failed", Reason::Virtual)
            ),
            Applied::Same
        );
        assert_eq!(r.get(&u).unwrap().tag, ModTag::new(2, 2));
    }

    /// One event of a stream: (unit index, tag, change).
    type Ev = (usize, ModTag, Change);

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            Just(Change::New { reason: REAL }),
            Just(Change::Removed { reason: REAL }),
            (
                prop_oneof![Just("active"), Just("inactive"), Just("failed")],
                prop_oneof![Just("running"), Just("dead"), Just("exited")]
            )
                .prop_map(|(a, s)| state(a, s, REAL)),
        ]
    }

    /// A session's stream: indices rise by one per event, as an agent does.
    fn session_stream(guid: u64) -> impl Strategy<Value = Vec<Ev>> {
        proptest::collection::vec((0..3usize, change()), 0..12).prop_map(move |v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (u, c))| (u, ModTag::new(guid, i as u64 + 1), c))
                .collect()
        })
    }

    fn units() -> [UnitName; 3] {
        [unit("a.service"), unit("b.service"), unit("c.socket")]
    }

    fn apply_all(events: &[Ev]) -> Records {
        let units = units();
        let mut r = Records::default();
        for (u, tag, c) in events {
            r.apply(&units[*u], *tag, c);
        }
        r
    }

    proptest! {
        /// Reordered, duplicated and interleaved streams of two sessions
        /// converge to what applying both in tag order gives, which for
        /// every unit the newer session touched is that session's last word.
        #[test]
        fn streams_converge_to_the_newest_session(
            old in session_stream(1),
            new in session_stream(2),
            dups in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
            seed in any::<u64>(),
        ) {
            let mut ordered: Vec<Ev> = old.iter().chain(new.iter()).cloned().collect();
            let expected = apply_all(&ordered);

            let mut shuffled = ordered.clone();
            for d in &dups {
                if !ordered.is_empty() {
                    shuffled.push(ordered[d.index(ordered.len())].clone());
                }
            }
            // Deterministic shuffle from the seed.
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let got = apply_all(&shuffled);
            prop_assert_eq!(&got, &expected);

            // The newer session's last event decides each unit it touched.
            ordered.retain(|(_, t, _)| t.guid == 2);
            let units = units();
            for (i, u) in units.iter().enumerate() {
                if let Some((_, tag, c)) = ordered.iter().rev().find(|(x, _, _)| *x == i) {
                    let rec = got.get(u).expect("a record for a touched unit");
                    prop_assert_eq!(rec.tag, *tag);
                    match c {
                        Change::Removed { .. } => prop_assert!(!rec.loaded),
                        Change::New { .. } => prop_assert_eq!((rec.loaded, rec.active_state.as_str()), (true, "inactive")),
                        Change::State { active_state, sub_state, .. } => {
                            prop_assert!(rec.loaded);
                            prop_assert_eq!(&rec.active_state, active_state);
                            prop_assert_eq!(&rec.sub_state, sub_state);
                        }
                        Change::Properties { .. } | Change::Health { .. } => {}
                    }
                }
            }
        }
    }
}
