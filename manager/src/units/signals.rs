//! A monitor's events as D-Bus messages: BlueChi's per-event signals
//! (`UnitNew`, `UnitStateChanged`, `UnitPropertiesChanged`, `UnitRemoved`)
//! for deliveries queued before `Follow()`, and `io.drover.Monitor`'s
//! `UnitsChanged` batches after it, one unicast message per destination.
//!
//! Pure: [`messages_for_batch`] builds messages and sends nothing (the
//! monitor's task in [`crate::units::monitor`] sends them). Invariants: the
//! queue order is kept for every destination; a `UnitsChanged` signal holds
//! at most [`MAX_ROWS_PER_SIGNAL`] rows and about [`MAX_SIGNAL_BYTES`];
//! events the tagged stream has no entry for (property changes, the pseudo
//! unit `*`) are left out of it. A health change is BlueChi's
//! `UnitPropertiesChanged` on the interface name `io.drover.Health` (so an
//! unchanged BlueChi client sees it as a property change), and a `health`
//! row of `UnitsChanged`.

use crate::units::hub::Delivery;
use crate::units::records::{Change, UnitEvent};
use drover_bus::bluechi::{DROVER_MONITOR_IFACE, HEALTH_IFACE, MONITOR_IFACE};
use drover_bus::marshal::{self, OrderedProperties};
use drover_protocol::health::{HealthState, one_line};
use zbus::names::OwnedUniqueName;
use zbus::{Message, OwnedObjectPath, OwnedVariant, Variant};

/// Rows per `UnitsChanged` signal at most.
pub const MAX_ROWS_PER_SIGNAL: usize = 4096;
/// Marshalled rows per `UnitsChanged` signal at most (about; see
/// `row_bytes`), far below D-Bus's message size limit.
pub const MAX_SIGNAL_BYTES: usize = 512 * 1024;

fn reason_str(change: &Change) -> &'static str {
    match change {
        Change::New { reason } | Change::State { reason, .. } | Change::Removed { reason } => {
            reason.as_str()
        }
        Change::Properties { .. } => "real",
        Change::Health { origin, .. } => origin.as_str(),
    }
}

/// `UnitPropertiesChanged`'s properties of a health change (see
/// [`HEALTH_IFACE`]); `None` if a value cannot be made (never for these
/// types).
fn health_properties(
    state: HealthState,
    reason: &str,
    since_usec: u64,
) -> Option<OrderedProperties> {
    let s = |v: &str| OwnedVariant::try_from(Variant::from(v.to_owned())).ok();
    Some(OrderedProperties(vec![
        ("State".to_owned(), s(state.as_str())?),
        ("Reason".to_owned(), s(reason)?),
        ("Since".to_owned(), OwnedVariant::from(since_usec)),
    ]))
}

/// BlueChi's signal for one event, prepared once and then built for each
/// destination (so property dictionaries are decoded once per event, not
/// once per owner and peer). Only for deliveries queued before `Follow()`.
enum BluechiSignal<'a> {
    /// `UnitNew` / `UnitRemoved`: (node, unit, reason).
    Short(&'static str, (&'a str, &'a str, &'static str)),
    /// `UnitStateChanged`: (node, unit, active, sub, reason).
    State((&'a str, &'a str, &'a str, &'a str, &'static str)),
    /// `UnitPropertiesChanged`: (node, unit, interface, props).
    Properties((&'a str, &'a str, &'a str, OrderedProperties)),
}

impl<'a> BluechiSignal<'a> {
    /// `None` for properties the agent sent undecodable (dropped, logged).
    fn of(event: &'a UnitEvent) -> Option<Self> {
        let node = event.node.as_str();
        let unit = event.unit_str();
        let reason = reason_str(&event.change);
        Some(match &event.change {
            Change::New { .. } => Self::Short("UnitNew", (node, unit, reason)),
            Change::Removed { .. } => Self::Short("UnitRemoved", (node, unit, reason)),
            Change::State {
                active_state,
                sub_state,
                ..
            } => Self::State((node, unit, active_state, sub_state, reason)),
            Change::Health {
                state,
                reason,
                since_usec,
                ..
            } => Self::Properties((
                node,
                unit,
                HEALTH_IFACE,
                health_properties(*state, reason, *since_usec)?,
            )),
            Change::Properties {
                interface,
                properties,
            } => match marshal::decode::<OrderedProperties>(properties) {
                Ok(props) => Self::Properties((node, unit, interface, props)),
                Err(e) => {
                    tracing::debug!(
                        node,
                        unit,
                        "undecodable properties from the agent dropped: {e}"
                    );
                    return None;
                }
            },
        })
    }

    fn build(&self, path: &OwnedObjectPath, dest: &OwnedUniqueName) -> zbus::Result<Message> {
        let signal = |member: &'static str| {
            Message::signal(path.as_ref(), MONITOR_IFACE, member).destination(dest.as_ref())
        };
        match self {
            Self::Short(member, body) => signal(member).build(body),
            Self::State(body) => signal("UnitStateChanged").build(body),
            Self::Properties(body) => signal("UnitPropertiesChanged").build(body),
        }
    }
}

/// One entry of `io.drover.Monitor.UnitsChanged`, borrowed from the queued
/// events, so building a batch copies no string.
type TaggedRow<'a> = drover_bus::bluechi::UnitsChangedRow<'a>;

/// The tagged entry of an event, or `None` for what the tagged stream does
/// not carry (property changes, the pseudo unit `*`).
fn tagged_row(event: &UnitEvent) -> Option<TaggedRow<'_>> {
    event.unit.as_ref()?;
    let (kind, active, sub) = match &event.change {
        Change::New { .. } => ("new", "inactive", "dead"),
        Change::State {
            active_state,
            sub_state,
            ..
        } => ("state", active_state.as_str(), sub_state.as_str()),
        Change::Removed { .. } => ("removed", "", ""),
        Change::Health { state, reason, .. } => ("health", state.as_str(), one_line(reason)),
        Change::Properties { .. } => return None,
    };
    Some((
        event.node.as_str(),
        event.unit_str(),
        kind,
        active,
        sub,
        reason_str(&event.change),
        event.tag.guid,
        event.tag.index,
    ))
}

/// Upper bound of a row's marshalled size: struct alignment (8), each
/// string's length word, NUL and padding (at most 8 over its length), the
/// two u64 with their alignment.
fn row_bytes(row: &TaggedRow<'_>) -> usize {
    let strings = [row.0, row.1, row.2, row.3, row.4, row.5];
    8 + strings.iter().map(|s| s.len() + 8).sum::<usize>() + 24
}

/// Tagged rows waiting to go out as `UnitsChanged`, cut into signals of at
/// most [`MAX_ROWS_PER_SIGNAL`] rows and about [`MAX_SIGNAL_BYTES`].
struct TaggedBatch<'a> {
    /// Finished chunks (each one signal per destination), in order.
    chunks: Vec<Vec<TaggedRow<'a>>>,
    bytes: usize,
}

impl<'a> TaggedBatch<'a> {
    fn new() -> Self {
        Self {
            chunks: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, row: TaggedRow<'a>) {
        let size = row_bytes(&row);
        let full = self
            .chunks
            .last()
            .is_none_or(|c| c.len() >= MAX_ROWS_PER_SIGNAL || self.bytes + size > MAX_SIGNAL_BYTES);
        if full {
            self.chunks.push(Vec::new());
            self.bytes = 0;
        }
        self.bytes += size;
        if let Some(c) = self.chunks.last_mut() {
            c.push(row);
        }
    }

    /// Appends one `UnitsChanged` per chunk per destination (chunk-major,
    /// so each destination sees the rows in order) and empties the batch.
    fn flush(
        &mut self,
        path: &OwnedObjectPath,
        dests: &[OwnedUniqueName],
        out: &mut Vec<Message>,
    ) -> zbus::Result<()> {
        for chunk in self.chunks.drain(..) {
            for dest in dests {
                out.push(
                    Message::signal(path.as_ref(), DROVER_MONITOR_IFACE, "UnitsChanged")
                        .destination(dest.as_ref())
                        .build(&(&chunk,))?,
                );
            }
        }
        self.bytes = 0;
        Ok(())
    }
}

/// Turns one drained batch of deliveries into the messages for every
/// destination, in queue order: deliveries queued before `Follow()` as
/// BlueChi's per-event signals, those after it as `UnitsChanged` batches
/// only.
pub fn messages_for_batch(
    path: &OwnedObjectPath,
    dests: &[OwnedUniqueName],
    batch: &[Delivery],
    out: &mut Vec<Message>,
) -> zbus::Result<()> {
    let mut tagged = TaggedBatch::new();
    for d in batch {
        if d.follow {
            if let Some(row) = tagged_row(&d.event) {
                tagged.push(row);
            }
            continue;
        }
        // A plain delivery after followed ones cannot happen (follow only
        // turns on), but keep the order right regardless.
        tagged.flush(path, dests, out)?;
        if let Some(signal) = BluechiSignal::of(&d.event) {
            for dest in dests {
                out.push(signal.build(path, dest)?);
            }
        }
    }
    tagged.flush(path, dests, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{ModTag, NodeName, Reason, UnitName};
    use std::sync::Arc;
    use zbus::names::UniqueName;

    fn event(unit: Option<&str>, index: u64, change: Change) -> Delivery {
        event_on("node1", unit, index, change)
    }

    fn event_on(node: &str, unit: Option<&str>, index: u64, change: Change) -> Delivery {
        Delivery {
            event: Arc::new(UnitEvent {
                node: NodeName::new(node).unwrap(),
                unit: unit.map(|u| UnitName::new(u).unwrap()),
                tag: ModTag::new(7, index),
                change,
            }),
            follow: true,
        }
    }

    fn state(index: u64) -> Delivery {
        event(
            Some("a.service"),
            index,
            Change::State {
                active_state: "active".into(),
                sub_state: "running".into(),
                reason: Reason::Real,
            },
        )
    }

    fn path() -> OwnedObjectPath {
        OwnedObjectPath::try_from("/org/eclipse/bluechi/monitor/1").unwrap()
    }

    fn dests(names: &[&str]) -> Vec<OwnedUniqueName> {
        names
            .iter()
            .map(|n| UniqueName::try_from(*n).unwrap().into())
            .collect()
    }

    type Row = (String, String, String, String, String, String, u64, u64);

    /// (destination, member, rows) of each message, in order.
    fn decode(msgs: &[Message]) -> Vec<(String, String, Vec<Row>)> {
        msgs.iter()
            .map(|m| {
                let h = m.header();
                let dest = h.destination().map(|d| d.to_string()).unwrap_or_default();
                let member = h.member().map(|m| m.to_string()).unwrap_or_default();
                let rows = if member == "UnitsChanged" {
                    m.body().deserialize::<(Vec<Row>,)>().unwrap().0
                } else {
                    Vec::new()
                };
                (dest, member, rows)
            })
            .collect()
    }

    #[test]
    fn followed_events_go_out_as_one_batch_per_destination_in_order() {
        let batch: Vec<Delivery> = (1..=100).map(state).collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5", ":1.9"]), &batch, &mut out).unwrap();
        let got = decode(&out);
        assert_eq!(got.len(), 2, "one UnitsChanged per destination");
        for (dest, (d, member, rows)) in [":1.5", ":1.9"].iter().zip(&got) {
            assert_eq!(d, dest);
            assert_eq!(member, "UnitsChanged");
            let indexes: Vec<u64> = rows.iter().map(|r| r.7).collect();
            assert_eq!(indexes, (1..=100).collect::<Vec<_>>());
            assert_eq!(
                rows[0],
                (
                    "node1".into(),
                    "a.service".into(),
                    "state".into(),
                    "active".into(),
                    "running".into(),
                    "real".into(),
                    7,
                    1
                )
            );
        }
    }

    #[test]
    fn batches_stay_within_the_entry_and_size_bounds() {
        // Many small entries: cut by count.
        let batch: Vec<Delivery> = (1..=(MAX_ROWS_PER_SIGNAL as u64 * 2 + 5))
            .map(state)
            .collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        let sizes: Vec<usize> = decode(&out).iter().map(|m| m.2.len()).collect();
        assert_eq!(sizes, vec![MAX_ROWS_PER_SIGNAL, MAX_ROWS_PER_SIGNAL, 5]);
        // Large entries (long unit names): cut by bytes; the estimate must
        // bound the real marshalled size, and nothing is lost or reordered.
        let long = "x".repeat(240);
        let batch: Vec<Delivery> = (1..=3000)
            .map(|i| {
                event(
                    Some(&format!("{long}{i}.service")),
                    i,
                    Change::New {
                        reason: Reason::Virtual,
                    },
                )
            })
            .collect();
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        assert!(out.len() >= 2, "split by size: {} signal(s)", out.len());
        for m in &out {
            assert!(
                m.body().len() <= MAX_SIGNAL_BYTES,
                "{} bytes in one signal",
                m.body().len()
            );
        }
        let indexes: Vec<u64> = decode(&out)
            .into_iter()
            .flat_map(|m| m.2)
            .map(|r| r.7)
            .collect();
        assert_eq!(indexes, (1..=3000).collect::<Vec<_>>());
    }

    #[test]
    fn events_queued_before_follow_go_first_as_bluechi_signals_and_untagged_ones_are_dropped() {
        let mut early = state(1);
        early.follow = false;
        let batch = vec![
            early,
            state(2),
            // The pseudo unit and property changes have no tagged entry.
            event(
                None,
                3,
                Change::New {
                    reason: Reason::Virtual,
                },
            ),
            event(
                Some("a.service"),
                4,
                Change::Properties {
                    interface: "org.freedesktop.systemd1.Unit".into(),
                    properties: drover_protocol::Marshalled::default(),
                },
            ),
            event(
                Some("a.service"),
                5,
                Change::Removed {
                    reason: Reason::Real,
                },
            ),
        ];
        let mut out = Vec::new();
        messages_for_batch(&path(), &dests(&[":1.5"]), &batch, &mut out).unwrap();
        let got = decode(&out);
        let members: Vec<&str> = got.iter().map(|m| m.1.as_str()).collect();
        assert_eq!(members, vec!["UnitStateChanged", "UnitsChanged"]);
        let rows: Vec<(&str, u64)> = got[1].2.iter().map(|r| (r.2.as_str(), r.7)).collect();
        assert_eq!(rows, vec![("state", 2), ("removed", 5)]);
        assert_eq!(
            got[1].2[1],
            (
                "node1".into(),
                "a.service".into(),
                "removed".into(),
                "".into(),
                "".into(),
                "real".into(),
                7,
                5
            )
        );
    }
}
