//! Health: whether a unit (or a node) works, not only whether it runs.
//!
//! The agent runs the checks a unit declares in its `[X-Drover]` section and
//! sends the manager a unit's [`Health`] only when its verdict changes
//! ([`crate::Event::UnitHealth`]), plus everything it knows at registration
//! ([`crate::Event::HealthSnapshot`], in parts of at most
//! [`SNAPSHOT_PART_MAX`] units, the last one marked). The node's own health
//! ([`NodeHealth`]: systemd's `SystemState` and the node checks of
//! `agent.conf`) travels the same way ([`crate::Event::NodeHealth`]).
//!
//! States ([`HealthState`]):
//! * `none` — the unit declares no check (never sent as a change of a unit
//!   the manager has not heard of; sent when a check goes away);
//! * `starting` — the unit has a check but no verdict yet: it is not active,
//!   or active and inside its start period, or its first check has not passed;
//! * `healthy` / `unhealthy` — the verdict of the check, with the reason
//!   (the check's output or error; for a bad `[X-Drover]` section the file,
//!   line and key).
//!
//! Times cross the wire as "how long ago", as [`crate::offline`] does: the
//! receiver turns them into moments on its own clock, so the hosts' clocks
//! need not agree.
//!
//! Bounds, checked when a frame is decoded (a frame that breaks one fails to
//! decode as a whole): a reason is at most [`REASON_MAX`] bytes, a snapshot
//! part holds at most [`SNAPSHOT_PART_MAX`] units and [`NODE_CHECKS_MAX`]
//! node checks, so the largest part stays far below [`crate::MAX_FRAME_LEN`].

use crate::names::UnitName;
use serde::{Deserialize, Serialize};

/// Longest reason, in bytes: the first 4 KiB of a check's output.
pub const REASON_MAX: usize = 4096;
/// Most units in one [`HealthSnapshot`] part: 64 × (4 KiB + a unit name) is
/// about 280 KiB, a quarter of a frame.
pub const SNAPSHOT_PART_MAX: usize = 64;
/// Most node checks `agent.conf` may declare (and a [`NodeHealth`] carry).
pub const NODE_CHECKS_MAX: usize = 16;
/// Most units with a check on one node: an agent checks no more, and the
/// manager keeps no more of one node (what an agent reports beyond it is
/// ignored).
pub const UNITS_MAX: usize = 16_384;

/// The four health states. The wire carries the variant index; these are
/// appended to, never reordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum HealthState {
    /// No check is declared.
    #[default]
    None,
    /// A check is declared; no verdict yet.
    Starting,
    Healthy,
    Unhealthy,
}

impl HealthState {
    pub const ALL: [HealthState; 4] = [
        HealthState::None,
        HealthState::Starting,
        HealthState::Healthy,
        HealthState::Unhealthy,
    ];

    /// The word every interface uses (D-Bus, droverctl, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::None => "none",
            HealthState::Starting => "starting",
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
        }
    }

    /// The state named by [`HealthState::as_str`]'s word.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == word)
    }

    /// Whether a proxy may count on its target in this state: no check, or a
    /// passing one (`crate::verdict`).
    pub fn passes(self) -> bool {
        matches!(self, HealthState::None | HealthState::Healthy)
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cuts `text` to at most [`REASON_MAX`] bytes at a character boundary.
pub fn cut_reason(text: &str) -> &str {
    cut_to(text, REASON_MAX)
}

/// Cuts `text` to at most `max` bytes at a character boundary.
pub fn cut_to(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One health verdict: state, why, and how long ago it began.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "RawHealth")]
pub struct Health {
    pub state: HealthState,
    /// The check's output or error (empty when there is nothing to say); at
    /// most [`REASON_MAX`] bytes.
    pub reason: String,
    /// How long before sending the state began, in ms.
    pub changed_ms_ago: u64,
}

impl Health {
    /// A verdict; `reason` is cut to [`REASON_MAX`] bytes.
    pub fn new(state: HealthState, reason: &str, changed_ms_ago: u64) -> Self {
        Self {
            state,
            reason: cut_reason(reason).to_owned(),
            changed_ms_ago,
        }
    }
}

#[derive(Deserialize)]
struct RawHealth {
    state: HealthState,
    reason: String,
    changed_ms_ago: u64,
}

impl TryFrom<RawHealth> for Health {
    type Error = String;

    fn try_from(raw: RawHealth) -> Result<Self, String> {
        if raw.reason.len() > REASON_MAX {
            return Err(format!(
                "health reason of {} bytes, at most {REASON_MAX} allowed",
                raw.reason.len()
            ));
        }
        Ok(Self {
            state: raw.state,
            reason: raw.reason,
            changed_ms_ago: raw.changed_ms_ago,
        })
    }
}

/// One unit's health, as a snapshot lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitHealth {
    pub unit: UnitName,
    pub health: Health,
}

/// One node check of `agent.conf` and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCheck {
    /// The check's name (`[health NAME]` in `agent.conf`), at most 64 bytes.
    pub name: String,
    pub health: Health,
}

/// The node's own health: systemd's `SystemState` and the node checks.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "RawNodeHealth")]
pub struct NodeHealth {
    /// The verdict over all of it (see [`NodeHealth::summarize`]).
    pub health: Health,
    /// systemd's `SystemState` (`running`, `degraded`, `starting`, ...); empty
    /// when unknown.
    pub system_state: String,
    pub checks: Vec<NodeCheck>,
}

/// Longest node check name and `SystemState`, in bytes.
pub const NODE_CHECK_NAME_MAX: usize = 64;

#[derive(Deserialize)]
struct RawNodeHealth {
    health: Health,
    system_state: String,
    checks: Vec<NodeCheck>,
}

impl TryFrom<RawNodeHealth> for NodeHealth {
    type Error = String;

    fn try_from(raw: RawNodeHealth) -> Result<Self, String> {
        if raw.checks.len() > NODE_CHECKS_MAX {
            return Err(format!(
                "{} node checks, at most {NODE_CHECKS_MAX} allowed",
                raw.checks.len()
            ));
        }
        if raw.system_state.len() > NODE_CHECK_NAME_MAX
            || raw
                .checks
                .iter()
                .any(|c| c.name.len() > NODE_CHECK_NAME_MAX)
        {
            return Err(format!(
                "a node check name or system state longer than {NODE_CHECK_NAME_MAX} bytes"
            ));
        }
        Ok(Self {
            health: raw.health,
            system_state: raw.system_state,
            checks: raw.checks,
        })
    }
}

impl NodeHealth {
    /// The node's verdict from systemd's `SystemState` and its checks:
    /// * `unhealthy` when systemd is `degraded` (a unit failed) or
    ///   `maintenance`, or a node check is unhealthy — the reason names each;
    /// * else `starting` while systemd is not `running` yet (`initializing`,
    ///   `starting`) or a check has no verdict yet;
    /// * else `healthy` (`running`, every check healthy).
    ///
    /// `stopping` or an unknown state is `unhealthy` too (the node is not
    /// doing its work). The time of the verdict is the caller's.
    pub fn summarize(system_state: &str, checks: &[NodeCheck]) -> (HealthState, String) {
        let mut bad: Vec<String> = Vec::new();
        let mut waiting = false;
        match system_state {
            "running" => {}
            "initializing" | "starting" => waiting = true,
            "" => {
                waiting = true;
            }
            other => bad.push(format!("systemd is {other}")),
        }
        for check in checks {
            match check.health.state {
                HealthState::Unhealthy => bad.push(if check.health.reason.is_empty() {
                    format!("check {} is unhealthy", check.name)
                } else {
                    format!("check {}: {}", check.name, one_line(&check.health.reason))
                }),
                HealthState::Starting => waiting = true,
                HealthState::Healthy | HealthState::None => {}
            }
        }
        if !bad.is_empty() {
            (
                HealthState::Unhealthy,
                cut_reason(&bad.join("; ")).to_owned(),
            )
        } else if waiting {
            (HealthState::Starting, String::new())
        } else {
            (HealthState::Healthy, String::new())
        }
    }
}

/// The first line of `text`, trimmed (a reason inside another one).
pub fn one_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// One part of the snapshot an agent sends at registration: the health of
/// every unit that declares a check (`none` units are left out), in parts of
/// at most [`SNAPSHOT_PART_MAX`] units; `last` marks the final part, which
/// also carries the node's health. The receiver replaces what it knew of the
/// node's units with the parts once the last one arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawSnapshot")]
pub struct HealthSnapshot {
    pub units: Vec<UnitHealth>,
    /// `Some` in the last part only.
    pub node: Option<NodeHealth>,
}

impl HealthSnapshot {
    /// Whether this is the last part.
    pub fn is_last(&self) -> bool {
        self.node.is_some()
    }

    /// The parts of a snapshot of `units` and `node`, in order.
    pub fn parts(units: Vec<UnitHealth>, node: NodeHealth) -> Vec<HealthSnapshot> {
        let mut parts: Vec<HealthSnapshot> = Vec::new();
        let mut rest = units.into_iter().peekable();
        loop {
            let chunk: Vec<UnitHealth> = rest.by_ref().take(SNAPSHOT_PART_MAX).collect();
            let last = rest.peek().is_none();
            parts.push(HealthSnapshot {
                units: chunk,
                node: last.then(|| node.clone()),
            });
            if last {
                return parts;
            }
        }
    }
}

#[derive(Deserialize)]
struct RawSnapshot {
    units: Vec<UnitHealth>,
    node: Option<NodeHealth>,
}

impl TryFrom<RawSnapshot> for HealthSnapshot {
    type Error = String;

    fn try_from(raw: RawSnapshot) -> Result<Self, String> {
        if raw.units.len() > SNAPSHOT_PART_MAX {
            return Err(format!(
                "a health snapshot part of {} units, at most {SNAPSHOT_PART_MAX} allowed",
                raw.units.len()
            ));
        }
        Ok(Self {
            units: raw.units,
            node: raw.node,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_body, encode_body};

    fn unit(name: &str) -> UnitName {
        UnitName::new(name).unwrap()
    }

    #[test]
    fn words_round_trip_and_only_none_and_healthy_pass() {
        for s in HealthState::ALL {
            assert_eq!(HealthState::parse(s.as_str()), Some(s));
        }
        assert_eq!(HealthState::parse("Healthy"), None);
        assert!(HealthState::None.passes() && HealthState::Healthy.passes());
        assert!(!HealthState::Starting.passes() && !HealthState::Unhealthy.passes());
    }

    #[test]
    fn reasons_are_cut_at_a_character_boundary() {
        let long = "é".repeat(REASON_MAX);
        let cut = cut_reason(&long);
        assert!(cut.len() <= REASON_MAX && cut.len() > REASON_MAX - 2);
        assert_eq!(Health::new(HealthState::Unhealthy, &long, 0).reason, cut);
    }

    #[test]
    fn an_oversized_reason_or_part_fails_to_decode() {
        let mut h = Health::new(HealthState::Healthy, "ok", 1);
        h.reason = "x".repeat(REASON_MAX + 1);
        assert!(decode_body::<Health>(&encode_body(&h).unwrap()).is_err());
        let units: Vec<UnitHealth> = (0..=SNAPSHOT_PART_MAX)
            .map(|i| UnitHealth {
                unit: unit(&format!("u{i}.service")),
                health: Health::default(),
            })
            .collect();
        let part = HealthSnapshot { units, node: None };
        assert!(decode_body::<HealthSnapshot>(&encode_body(&part).unwrap()).is_err());
        let node = NodeHealth {
            health: Health::default(),
            system_state: "running".into(),
            checks: (0..=NODE_CHECKS_MAX)
                .map(|i| NodeCheck {
                    name: format!("c{i}"),
                    health: Health::default(),
                })
                .collect(),
        };
        assert!(decode_body::<NodeHealth>(&encode_body(&node).unwrap()).is_err());
    }

    #[test]
    fn the_largest_part_fits_a_frame() {
        let units: Vec<UnitHealth> = (0..SNAPSHOT_PART_MAX)
            .map(|i| UnitHealth {
                unit: unit(&format!("{}{i}.service", "u".repeat(240))),
                health: Health::new(HealthState::Unhealthy, &"x".repeat(REASON_MAX), u64::MAX),
            })
            .collect();
        let node = NodeHealth {
            health: Health::new(HealthState::Unhealthy, &"y".repeat(REASON_MAX), u64::MAX),
            system_state: "d".repeat(NODE_CHECK_NAME_MAX),
            checks: (0..NODE_CHECKS_MAX)
                .map(|_| NodeCheck {
                    name: "n".repeat(NODE_CHECK_NAME_MAX),
                    health: Health::new(HealthState::Unhealthy, &"z".repeat(REASON_MAX), 0),
                })
                .collect(),
        };
        let part = HealthSnapshot {
            units,
            node: Some(node),
        };
        let len = encode_body(&part).unwrap().len();
        assert!(len < crate::MAX_FRAME_LEN / 2, "{len}");
    }

    #[test]
    fn parts_split_at_the_cap_and_the_last_carries_the_node() {
        let node = NodeHealth::default();
        let empty = HealthSnapshot::parts(Vec::new(), node.clone());
        assert_eq!(empty.len(), 1);
        assert!(empty[0].is_last() && empty[0].units.is_empty());
        let units: Vec<UnitHealth> = (0..SNAPSHOT_PART_MAX * 2 + 1)
            .map(|i| UnitHealth {
                unit: unit(&format!("u{i}.service")),
                health: Health::default(),
            })
            .collect();
        let parts = HealthSnapshot::parts(units, node);
        let sizes: Vec<usize> = parts.iter().map(|p| p.units.len()).collect();
        assert_eq!(sizes, [SNAPSHOT_PART_MAX, SNAPSHOT_PART_MAX, 1]);
        let lasts: Vec<bool> = parts.iter().map(HealthSnapshot::is_last).collect();
        assert_eq!(lasts, [false, false, true]);
        let exact: Vec<UnitHealth> = (0..SNAPSHOT_PART_MAX)
            .map(|i| UnitHealth {
                unit: unit(&format!("u{i}.service")),
                health: Health::default(),
            })
            .collect();
        assert_eq!(HealthSnapshot::parts(exact, NodeHealth::default()).len(), 1);
    }

    fn check(name: &str, state: HealthState, reason: &str) -> NodeCheck {
        NodeCheck {
            name: name.into(),
            health: Health::new(state, reason, 0),
        }
    }

    #[test]
    fn node_health_from_system_state_and_checks() {
        use HealthState::{Healthy, Starting, Unhealthy};
        assert_eq!(
            NodeHealth::summarize("running", &[]),
            (Healthy, String::new())
        );
        assert_eq!(
            NodeHealth::summarize("degraded", &[]),
            (Unhealthy, "systemd is degraded".into())
        );
        assert_eq!(NodeHealth::summarize("starting", &[]).0, Starting);
        assert_eq!(
            NodeHealth::summarize("running", &[check("disk", Starting, "")]).0,
            Starting
        );
        assert_eq!(
            NodeHealth::summarize(
                "degraded",
                &[
                    check("disk", Unhealthy, "\n  /var is 97% full\nmore"),
                    check("net", Healthy, "")
                ]
            ),
            (
                Unhealthy,
                "systemd is degraded; check disk: /var is 97% full".into()
            )
        );
        assert_eq!(NodeHealth::summarize("stopping", &[]).0, Unhealthy);
    }
}
