//! Resync: the periodic check that the manager's picture of a node still is
//! the node's, and the repair when it is not (docs/discovery.md, "Resync").
//!
//! Every resync interval (the manager says how long in
//! `crate::handshake::Accepted::resync_interval_ms`; 0 = never) the agent
//! sends a [`Digest`] of what the manager should hold for it: the units it
//! was asked to report (the watch set, [`watch_hash`]), the loaded ones among
//! them with their active and sub state ([`unit_entry`]), and the units
//! with a health verdict other than `none` ([`health_entry`]). Each part is a
//! [`Sum`]: a count and the wrapping sum of one 64-bit hash per entry, so
//! neither side sorts anything and the digest is the same whatever order the
//! entries are walked in.
//!
//! **The tag invariant.** A digest is taken under the agent's unit send
//! order, after every event tagged up to [`Digest::tag`] was queued on the
//! link, and before any later one; the link is one ordered stream and the
//! manager applies a node's events one at a time in arrival order. So when
//! the manager reads the digest it has applied exactly the events up to
//! that tag, and compares its records at that same tag: events in flight
//! on a busy node are either before the digest (applied) or after it (not
//! counted by the agent either), never a false mismatch. A digest whose
//! watch set differs from the manager's (a `Subscribe` or `Unsubscribe`
//! under way) is not comparable and is skipped, not counted as a mismatch.
//!
//! Only on a mismatch the manager sends `crate::Request::Resync`; the agent
//! answers with its state as [`SnapshotPart`]s (`crate::Event::ResyncSnapshot`,
//! all parts with one tag, on the same ordered stream, so the snapshot too is
//! exactly the state at its tag), then its health snapshot. The snapshot's
//! tag `T` reserves two indices, `T` and `T + 1`: the manager's repair
//! events use `T` for a unit it did not know and `T + 1` for every other
//! change, so each repaired unit's events succeed its record and the agent's
//! next event succeeds them.
//!
//! Bounds, checked when a frame is decoded: a digest is a fixed set of
//! integers (at most [`DIGEST_MAX_LEN`] bytes encoded); a snapshot part holds
//! at most [`PART_MAX`] rows, each state at most [`STATE_MAX`] bytes; the
//! manager gathers at most [`UNITS_MAX`] rows per snapshot, and reads only
//! snapshots it asked for.

use crate::health::HealthState;
use crate::names::UnitName;
use crate::tag::ModTag;
use serde::{Deserialize, Serialize};

/// Most rows in one [`SnapshotPart`]: 1024 × (255-byte name + 2 × 64-byte
/// states) is below 400 KiB, well inside a frame.
pub const PART_MAX: usize = 1024;
/// Longest active or sub state in a snapshot row, in bytes (systemd's are
/// below 32).
pub const STATE_MAX: usize = 64;
/// Most rows the manager gathers for one snapshot (the agent's own cap on
/// the units it follows).
pub const UNITS_MAX: usize = 65_536;
/// Largest encoded [`Digest`]: two tag varints, a hash, two counts and two
/// hashes (varints of at most 10 bytes a `u64`, 5 a `u32`).
pub const DIGEST_MAX_LEN: usize = 10 + 10 + 10 + 2 * (5 + 10);

/// The default resync interval, ms.
pub const DEFAULT_INTERVAL_MS: u64 = 60_000;
/// Nodes per step of the interval's growth: see [`interval_for`].
pub const NODES_PER_STEP: u64 = 10_000;

/// The interval the manager tells a node that registers while `online`
/// nodes are online: `base` plus `base` for every [`NODES_PER_STEP`] nodes,
/// in proportion. Digests then arrive at no more than about
/// `NODES_PER_STEP / base` a second whatever the fleet's size (10,000 nodes
/// at the default: one every 120 s each, 83 a second in all). 0 stays 0
/// (resync off).
pub fn interval_for(base_ms: u64, online: u64) -> u64 {
    let extra = u128::from(base_ms) * u128::from(online) / u128::from(NODES_PER_STEP);
    u64::try_from(u128::from(base_ms) + extra).unwrap_or(u64::MAX)
}

/// The wait before an agent's next digest: uniform in [3/4, 1] of
/// `interval` (`random` picks where), so the digests of a fleet spread out
/// and a repair never waits longer than one interval. Every agent, the
/// real one and a simulated one, waits this long.
pub fn jittered(interval: std::time::Duration, random: u64) -> std::time::Duration {
    let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let quarter = ms / 4;
    std::time::Duration::from_millis(ms - quarter + random % quarter.saturating_add(1))
}

/// [`Digest::units`] of the loaded units `rows` (unit, active state, sub
/// state), in any order: what an agent sends and the manager compares.
pub fn units_sum<'a>(rows: impl IntoIterator<Item = (&'a UnitName, &'a str, &'a str)>) -> Sum {
    let mut sum = Sum::default();
    for (unit, active_state, sub_state) in rows {
        sum.add(unit_entry(unit, active_state, sub_state));
    }
    sum
}

/// [`Digest::health`] of the verdicts `states` (every unit whose health is
/// not `none`), in any order.
pub fn health_sum<'a>(states: impl IntoIterator<Item = (&'a UnitName, HealthState)>) -> Sum {
    let mut sum = Sum::default();
    for (unit, state) in states {
        sum.add(health_entry(unit, state));
    }
    sum
}

/// A count and the wrapping sum of one hash per entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sum {
    pub count: u32,
    pub hash: u64,
}

impl Sum {
    /// Adds one entry's hash.
    pub fn add(&mut self, entry: u64) {
        self.count = self.count.saturating_add(1);
        self.hash = self.hash.wrapping_add(entry);
    }
}

/// What the agent holds for the manager at [`Digest::tag`] (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// The last tag the agent issued in this session (index 0: none yet).
    pub tag: ModTag,
    /// [`watch_hash`] of the units the agent was asked to report.
    pub watch: u64,
    /// [`unit_entry`] of every loaded unit among them.
    pub units: Sum,
    /// [`health_entry`] of every unit whose health is not `none`.
    pub health: Sum,
}

/// One loaded unit in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRow")]
pub struct UnitRow {
    pub unit: UnitName,
    pub active_state: String,
    pub sub_state: String,
}

#[derive(Deserialize)]
struct RawRow {
    unit: UnitName,
    active_state: String,
    sub_state: String,
}

impl TryFrom<RawRow> for UnitRow {
    type Error = String;

    fn try_from(raw: RawRow) -> Result<Self, String> {
        if raw.active_state.len() > STATE_MAX || raw.sub_state.len() > STATE_MAX {
            return Err(format!("a unit state longer than {STATE_MAX} bytes"));
        }
        Ok(Self {
            unit: raw.unit,
            active_state: raw.active_state,
            sub_state: raw.sub_state,
        })
    }
}

/// One part of a snapshot: the watch set it answers for, up to
/// [`PART_MAX`] rows, and whether it is the last part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawPart")]
pub struct SnapshotPart {
    pub watch: u64,
    pub units: Vec<UnitRow>,
    pub last: bool,
}

#[derive(Deserialize)]
struct RawPart {
    watch: u64,
    units: Vec<UnitRow>,
    last: bool,
}

impl TryFrom<RawPart> for SnapshotPart {
    type Error = String;

    fn try_from(raw: RawPart) -> Result<Self, String> {
        if raw.units.len() > PART_MAX {
            return Err(format!(
                "a resync snapshot part of {} rows, at most {PART_MAX} allowed",
                raw.units.len()
            ));
        }
        Ok(Self {
            watch: raw.watch,
            units: raw.units,
            last: raw.last,
        })
    }
}

impl SnapshotPart {
    /// `rows` as parts of at most [`PART_MAX`] rows (one empty part for
    /// none), the last one marked.
    pub fn parts(watch: u64, rows: Vec<UnitRow>) -> Vec<SnapshotPart> {
        let mut parts: Vec<SnapshotPart> = Vec::with_capacity(rows.len() / PART_MAX + 1);
        let mut rows = rows.into_iter().peekable();
        loop {
            let units: Vec<UnitRow> = rows.by_ref().take(PART_MAX).collect();
            let last = rows.peek().is_none();
            parts.push(SnapshotPart { watch, units, last });
            if last {
                return parts;
            }
        }
    }
}

/// FNV-1a over `parts`, each followed by a 0xff byte (never inside UTF-8),
/// then mixed (splitmix64's finaliser) so that sums of entries spread.
/// Fixed here, so every version of both ends computes the same value.
fn entry_hash(kind: u8, parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for byte in std::iter::once(&kind).chain(
        parts
            .iter()
            .flat_map(|p| p.iter().chain(std::iter::once(&0xff))),
    ) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The hash of the watch set: `*` or not, and the single units watched.
pub fn watch_hash<'a>(all: bool, units: impl IntoIterator<Item = &'a UnitName>) -> u64 {
    let mut sum = Sum::default();
    if all {
        sum.add(entry_hash(b'*', &[]));
    }
    for u in units {
        sum.add(entry_hash(b'w', &[u.as_str().as_bytes()]));
    }
    sum.hash ^ u64::from(sum.count)
}

/// The hash of one loaded unit and its state.
pub fn unit_entry(unit: &UnitName, active_state: &str, sub_state: &str) -> u64 {
    entry_hash(
        b'u',
        &[
            unit.as_str().as_bytes(),
            active_state.as_bytes(),
            sub_state.as_bytes(),
        ],
    )
}

/// The hash of one unit's health state.
pub fn health_entry(unit: &UnitName, state: HealthState) -> u64 {
    entry_hash(b'h', &[unit.as_str().as_bytes(), state.as_str().as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_body, encode_body};
    use crate::message::{Event, ToManager};
    use proptest::prelude::*;

    fn unit(s: &str) -> UnitName {
        UnitName::new(s).unwrap()
    }

    fn row(u: &str, a: &str, s: &str) -> UnitRow {
        UnitRow {
            unit: unit(u),
            active_state: a.into(),
            sub_state: s.into(),
        }
    }

    #[test]
    fn sums_do_not_depend_on_order_and_see_every_field() {
        let a = unit_entry(&unit("a.service"), "active", "running");
        let b = unit_entry(&unit("b.service"), "failed", "failed");
        let (mut x, mut y) = (Sum::default(), Sum::default());
        x.add(a);
        x.add(b);
        y.add(b);
        y.add(a);
        assert_eq!(x, y);
        assert_ne!(a, unit_entry(&unit("a.service"), "active", "exited"));
        assert_ne!(a, unit_entry(&unit("a.service"), "activ", "erunning"));
        assert_ne!(
            health_entry(&unit("a.service"), HealthState::Healthy),
            health_entry(&unit("a.service"), HealthState::Unhealthy)
        );
        let (w1, w2) = (unit("w1.service"), unit("w2.service"));
        assert_ne!(watch_hash(true, [&w1]), watch_hash(false, [&w1]));
        assert_eq!(watch_hash(false, [&w1, &w2]), watch_hash(false, [&w2, &w1]));
        assert_ne!(watch_hash(false, [&w1]), watch_hash(false, [&w1, &w2]));
        assert_ne!(watch_hash(false, []), watch_hash(true, []));
    }

    /// The values are part of the protocol: a change here must bump it.
    #[test]
    fn the_hashes_are_pinned() {
        assert_eq!(
            unit_entry(&unit("web.service"), "active", "running"),
            0x6e61_40dc_12e7_ac3c
        );
        assert_eq!(watch_hash(true, []), 0x74f1_91b6_94d3_2787);
    }

    #[test]
    fn the_wait_stays_within_the_last_quarter_of_the_interval() {
        use std::time::Duration;
        let i = Duration::from_secs(60);
        for r in [0, 1, 7, 14_999, 15_000, 15_001, u64::MAX] {
            let w = jittered(i, r);
            assert!(w >= Duration::from_secs(45) && w <= i, "{r}: {w:?}");
        }
        assert_eq!(jittered(Duration::ZERO, 5), Duration::ZERO);
        assert_eq!(
            jittered(Duration::from_millis(3), 5),
            Duration::from_millis(3)
        );
    }

    #[test]
    fn sums_of_rows_and_verdicts_are_the_entries_added() {
        let (a, b) = (unit("a.service"), unit("b.service"));
        let mut want = Sum::default();
        want.add(unit_entry(&a, "active", "running"));
        want.add(unit_entry(&b, "failed", "failed"));
        assert_eq!(
            units_sum([(&b, "failed", "failed"), (&a, "active", "running")]),
            want
        );
        assert_eq!(units_sum([]), Sum::default());
        let mut want = Sum::default();
        want.add(health_entry(&a, HealthState::Unhealthy));
        assert_eq!(health_sum([(&a, HealthState::Unhealthy)]), want);
    }

    #[test]
    fn the_interval_grows_gently_with_the_fleet() {
        assert_eq!(interval_for(60_000, 0), 60_000);
        assert_eq!(interval_for(60_000, 1_000), 66_000);
        assert_eq!(interval_for(60_000, 10_000), 120_000);
        assert_eq!(interval_for(0, 10_000), 0);
        assert_eq!(interval_for(u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn the_largest_digest_fits_its_bound() {
        let d = Digest {
            tag: ModTag::new(u64::MAX, u64::MAX),
            watch: u64::MAX,
            units: Sum {
                count: u32::MAX,
                hash: u64::MAX,
            },
            health: Sum {
                count: u32::MAX,
                hash: u64::MAX,
            },
        };
        assert_eq!(encode_body(&d).unwrap().len(), DIGEST_MAX_LEN);
    }

    /// What the traffic figures in docs/performance.md are computed from:
    /// a digest frame (length prefix, `ToManager::Event`, the variant, the
    /// digest) of a node with no health checks, and the largest one.
    #[test]
    fn a_digest_frame_is_small() {
        let frame = |d: Digest| {
            crate::codec::HEADER_LEN
                + encode_body(&ToManager::Event(Event::ResyncDigest(d)))
                    .unwrap()
                    .len()
        };
        let typical = Digest {
            tag: ModTag::new(12_345, 1_000_000),
            watch: watch_hash(true, []),
            units: Sum {
                count: 200,
                hash: unit_entry(&unit("web.service"), "active", "running"),
            },
            health: Sum::default(),
        };
        assert!(frame(typical) <= 45, "{}", frame(typical));
        assert_eq!(
            frame(Digest {
                tag: ModTag::new(u64::MAX, u64::MAX),
                watch: u64::MAX,
                units: Sum {
                    count: u32::MAX,
                    hash: u64::MAX
                },
                health: Sum {
                    count: u32::MAX,
                    hash: u64::MAX
                },
            }),
            crate::codec::HEADER_LEN + 2 + DIGEST_MAX_LEN
        );
    }

    #[test]
    fn parts_split_and_mark_the_last() {
        assert_eq!(
            SnapshotPart::parts(7, vec![]),
            vec![SnapshotPart {
                watch: 7,
                units: vec![],
                last: true
            }]
        );
        let rows: Vec<UnitRow> = (0..PART_MAX + 1)
            .map(|i| row(&format!("u{i}.service"), "active", "running"))
            .collect();
        let parts = SnapshotPart::parts(7, rows);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].units.len(), PART_MAX);
        assert!(!parts[0].last && parts[1].last);
        for p in &parts {
            let body = encode_body(p).unwrap();
            assert!(body.len() < crate::MAX_FRAME_LEN / 2);
            assert_eq!(&decode_body::<SnapshotPart>(&body).unwrap(), p);
        }
    }

    /// A hostile peer's parts: too many rows, too long states. Each fails
    /// to decode as a whole.
    #[test]
    fn oversized_parts_and_rows_do_not_decode() {
        let too_many = RawPartOut {
            watch: 1,
            units: (0..=PART_MAX)
                .map(|i| row(&format!("u{i}.service"), "a", "b"))
                .collect(),
            last: true,
        };
        assert!(decode_body::<SnapshotPart>(&encode_body(&too_many).unwrap()).is_err());
        let fits = RawPartOut {
            units: too_many.units[..PART_MAX].to_vec(),
            ..too_many
        };
        assert!(decode_body::<SnapshotPart>(&encode_body(&fits).unwrap()).is_ok());
        let long = RawPartOut {
            watch: 1,
            units: vec![row("a.service", &"x".repeat(STATE_MAX + 1), "b")],
            last: true,
        };
        assert!(decode_body::<SnapshotPart>(&encode_body(&long).unwrap()).is_err());
        // A bad unit name in a row fails the frame too.
        let mut body = encode_body(&SnapshotPart {
            watch: 1,
            units: vec![row("a.service", "a", "b")],
            last: true,
        })
        .unwrap();
        let at = body.windows(9).position(|w| w == b"a.service").unwrap();
        body[at] = b'/';
        assert!(decode_body::<SnapshotPart>(&body).is_err());
    }

    /// The same shape without the checks, to build what a hostile peer sends.
    #[derive(Serialize)]
    struct RawPartOut {
        watch: u64,
        units: Vec<UnitRow>,
        last: bool,
    }

    proptest! {
        /// Garbage where a digest is expected: an error or a digest, never
        /// a panic; a digest with trailing bytes is refused.
        #[test]
        fn garbage_digests_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(d) = decode_body::<Digest>(&junk) {
                prop_assert!(encode_body(&d).unwrap().len() <= DIGEST_MAX_LEN);
            }
            let _ = decode_body::<SnapshotPart>(&junk);
            let _ = decode_body::<ToManager>(&junk);
        }

        #[test]
        fn digests_round_trip_and_refuse_trailing_garbage(
            g in any::<u64>(), i in any::<u64>(), w in any::<u64>(),
            c in any::<u32>(), h in any::<u64>(), extra in 1usize..8,
        ) {
            let d = Digest { tag: ModTag::new(g, i), watch: w, units: Sum { count: c, hash: h }, health: Sum::default() };
            let msg = ToManager::Event(Event::ResyncDigest(d));
            let mut body = encode_body(&msg).unwrap();
            prop_assert_eq!(decode_body::<ToManager>(&body).unwrap(), msg.clone());
            // Zero bytes are padding (protocol 10); anything else is refused.
            let mut padded = body.clone();
            padded.extend(std::iter::repeat_n(0u8, extra));
            prop_assert_eq!(decode_body::<ToManager>(&padded).unwrap(), msg);
            body.extend(std::iter::repeat_n(0xa5u8, extra));
            prop_assert!(decode_body::<ToManager>(&body).is_err());
        }
    }
}
