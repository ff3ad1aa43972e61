//! Messages after the handshake.
//!
//! Manager → agent: [`ToAgent`] — requests with a correlation id, heartbeats.
//! Agent → manager: [`ToManager`] — exactly one reply per request id, events
//! (job progress, unit changes, proxies), heartbeats.
//!
//! Names inside messages are validated types ([`UnitName`], [`NodeName`]): a
//! frame carrying an invalid name fails to decode as a whole and is treated as
//! malformed input, never half-applied.
//!
//! systemd values whose D-Bus type is only known at run time (unit properties)
//! travel as [`Marshalled`]: the D-Bus signature plus the value in D-Bus wire
//! format (little endian), so postcard needs no knowledge of D-Bus types.

use crate::codec::MinFrameLen;
use crate::error_names;
use crate::health::{Health, HealthSnapshot, NodeHealth};
use crate::job::JobKind;
use crate::names::{NodeName, UnitName};
use crate::proxy_instance::ProxyTemplate;
use crate::resync::{Digest, SnapshotPart};
use crate::tag::ModTag;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    Request {
        id: u64,
        body: Request,
    },
    Heartbeat,
    /// One-way news for the agent (no reply): the fate of its proxies.
    Notice(Notice),
}

/// Manager → agent news about a proxy the agent announced with
/// [`Event::ProxyNew`]. Target state flows one way: target agent → manager →
/// requesting agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Notice {
    /// The proxy cannot be served (unknown node, not allowed, the target unit
    /// cannot be started, ...); `message` is one line for the journal.
    ProxyError { proxy_id: u64, message: String },
    /// The target unit of the proxy changed (or its state is replayed:
    /// `reason` virtual).
    ProxyTarget { proxy_id: u64, change: TargetChange },
    /// The proxy waits and its target's node is offline: sent when the node
    /// goes offline, or when the proxy is announced while it is. `offline_for_ms`:
    /// how long ago the manager last heard from the node, as of sending (a
    /// duration, not a date, so the two hosts' clocks need not agree); `None`
    /// when the node has not connected since the manager started. It decides
    /// nothing (the proxy keeps waiting); it is what the proxy says if it is
    /// stopped while waiting ([`crate::offline`]). Appended after the older
    /// variants so they keep their wire tags.
    TargetNodeOffline {
        proxy_id: u64,
        offline_for_ms: Option<u64>,
    },
    /// The waiting proxy's target node is online again (ends a
    /// `TargetNodeOffline`).
    TargetNodeOnline { proxy_id: u64 },
}

/// Every frame of the agent but a heartbeat is padded to
/// [`AGENT_MIN_FRAME_LEN`](crate::liveness::AGENT_MIN_FRAME_LEN), so that
/// only lone heartbeats wait in the manager's socket (`crate::liveness`).
impl MinFrameLen for ToManager {
    fn min_frame_len(&self) -> usize {
        match self {
            ToManager::Heartbeat => 0,
            _ => crate::liveness::AGENT_MIN_FRAME_LEN,
        }
    }
}

/// The manager's frames are read as they come: never padded.
impl MinFrameLen for ToAgent {
    fn min_frame_len(&self) -> usize {
        0
    }
}

impl Notice {
    /// The proxy the notice is about.
    pub fn proxy_id(&self) -> u64 {
        match self {
            Notice::ProxyError { proxy_id, .. }
            | Notice::ProxyTarget { proxy_id, .. }
            | Notice::TargetNodeOffline { proxy_id, .. }
            | Notice::TargetNodeOnline { proxy_id } => *proxy_id,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TargetChange {
    New {
        reason: Reason,
    },
    State {
        active_state: String,
        sub_state: String,
        reason: Reason,
    },
    Removed {
        reason: Reason,
    },
    /// The target's health verdict changed (or is replayed, before any
    /// state of the target: `crate::verdict`). Appended last so the other
    /// variants keep their wire tags.
    Health(Health),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToManager {
    Reply {
        id: u64,
        result: Result<Response, RemoteError>,
    },
    Event(Event),
    Heartbeat,
    /// Rows of a list reply (`Units`, `UnitFiles`) too large for one frame:
    /// zero or more parts, in order, then the `Reply` with the last rows;
    /// the receiver concatenates them (within a bound of its own). Appended
    /// last so the other variants keep their wire tags.
    ReplyPart {
        id: u64,
        part: Response,
    },
}

/// What the manager asks an agent to do. Job operations carry the manager's
/// job id so the agent can report progress of the systemd job it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    ListUnits,
    ListUnitFiles,
    /// Start, stop, restart or reload `unit` (systemd's `StartUnit` & co
    /// with `mode`); `job_id` is the manager's id for the job.
    UnitJob {
        kind: JobKind,
        unit: UnitName,
        mode: String,
        job_id: u32,
    },
    /// Cancel the systemd job behind this manager job id.
    JobCancel {
        job_id: u32,
    },
    /// systemd daemon-reload.
    Reload,
    GetUnitProperties {
        unit: UnitName,
        interface: String,
    },
    GetUnitProperty {
        unit: UnitName,
        interface: String,
        property: String,
    },
    SetUnitProperties {
        unit: UnitName,
        runtime: bool,
        properties: Marshalled,
    },
    FreezeUnit {
        unit: UnitName,
    },
    ThawUnit {
        unit: UnitName,
    },
    KillUnit {
        unit: UnitName,
        whom: String,
        signal: i32,
    },
    EnableUnitFiles {
        files: Vec<String>,
        runtime: bool,
        force: bool,
    },
    DisableUnitFiles {
        files: Vec<String>,
        runtime: bool,
    },
    GetUnitFileState {
        file: String,
    },
    ResetFailed,
    ResetFailedUnit {
        unit: UnitName,
    },
    GetDefaultTarget,
    SetDefaultTarget {
        target: UnitName,
        force: bool,
    },
    StartTransientUnit {
        unit: UnitName,
        mode: String,
        properties: Marshalled,
        aux: Marshalled,
        job_id: u32,
    },
    SetLogLevel {
        level: String,
    },
    /// Forward everything of this unit (`None` = every unit): its state
    /// changes and every property change ([`Scope::Everything`]). A unit
    /// subscribed with [`Request::SubscribeState`] is widened to it.
    Subscribe {
        unit: Option<UnitName>,
    },
    Unsubscribe {
        unit: Option<UnitName>,
    },
    /// Start / stop `drover-dep@UNIT.service` on the target node.
    StartDep {
        unit: UnitName,
    },
    StopDep {
        unit: UnitName,
    },
    EnableMetrics,
    DisableMetrics,
    /// The manager's records of this node do not match the agent's last
    /// `Event::ResyncDigest`: send the state as `Event::ResyncSnapshot`
    /// parts, then the health snapshot, and reply `Empty` (`crate::resync`).
    /// Appended last so the other variants keep their wire tags.
    Resync,
    /// Forward this unit's state only ([`Scope::State`]): `UnitNew`,
    /// `UnitStateChanged`, `UnitRemoved`, no `UnitPropertiesChanged`. A unit
    /// subscribed with [`Request::Subscribe`] is narrowed to it.
    SubscribeState {
        unit: UnitName,
    },
}

impl Request {
    /// The variant name of a request, for logs and errors (a unit job: its
    /// systemd method).
    pub fn name(&self) -> &'static str {
        match self {
            Request::ListUnits => "ListUnits",
            Request::ListUnitFiles => "ListUnitFiles",
            Request::UnitJob { kind, .. } => kind.method(),
            Request::JobCancel { .. } => "JobCancel",
            Request::Reload => "Reload",
            Request::GetUnitProperties { .. } => "GetUnitProperties",
            Request::GetUnitProperty { .. } => "GetUnitProperty",
            Request::SetUnitProperties { .. } => "SetUnitProperties",
            Request::FreezeUnit { .. } => "FreezeUnit",
            Request::ThawUnit { .. } => "ThawUnit",
            Request::KillUnit { .. } => "KillUnit",
            Request::EnableUnitFiles { .. } => "EnableUnitFiles",
            Request::DisableUnitFiles { .. } => "DisableUnitFiles",
            Request::GetUnitFileState { .. } => "GetUnitFileState",
            Request::ResetFailed => "ResetFailed",
            Request::ResetFailedUnit { .. } => "ResetFailedUnit",
            Request::GetDefaultTarget => "GetDefaultTarget",
            Request::SetDefaultTarget { .. } => "SetDefaultTarget",
            Request::StartTransientUnit { .. } => "StartTransientUnit",
            Request::SetLogLevel { .. } => "SetLogLevel",
            Request::Subscribe { .. } => "Subscribe",
            Request::SubscribeState { .. } => "SubscribeState",
            Request::Unsubscribe { .. } => "Unsubscribe",
            Request::StartDep { .. } => "StartDep",
            Request::StopDep { .. } => "StopDep",
            Request::EnableMetrics => "EnableMetrics",
            Request::DisableMetrics => "DisableMetrics",
            Request::Resync => "Resync",
        }
    }
}

/// What a subscription of one unit forwards (protocol 11). The manager asks
/// for the most any watcher of the unit needs: a monitor (a D-Bus client)
/// needs [`Scope::Everything`], the manager's own users (proxies,
/// discovery) the state alone. The agent follows a unit of [`Scope::State`]
/// with a narrower match rule (the `Unit` interface's `PropertiesChanged`
/// only), so systemd's other interfaces of the unit cost it nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// `UnitNew`, `UnitStateChanged`, `UnitRemoved`.
    State,
    /// Those and every `UnitPropertiesChanged`.
    Everything,
}

impl Scope {
    /// The request that subscribes `unit` at this scope.
    pub fn subscribe(self, unit: UnitName) -> Request {
        match self {
            Self::State => Request::SubscribeState { unit },
            Self::Everything => Request::Subscribe { unit: Some(unit) },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Empty,
    Units(Vec<UnitInfo>),
    /// (path, enablement state)
    UnitFiles(Vec<(String, String)>),
    Value(Marshalled),
    Text(String),
    /// `EnableUnitFiles` & co: (carries install info, [(type, file, destination)])
    Changes {
        carries_install_info: bool,
        changes: Vec<(String, String, String)>,
    },
}

/// An error from the agent or its systemd, forwarded with its D-Bus error
/// name so the manager can hand it to the D-Bus caller unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{name}: {message}")]
pub struct RemoteError {
    pub name: String,
    pub message: String,
}

impl RemoteError {
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(error_names::FAILED, message)
    }
}

/// systemd's `ListUnits` tuple `(ssssssouso)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitInfo {
    pub name: String,
    pub description: String,
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub followed: String,
    pub object_path: String,
    pub job_id: u32,
    pub job_type: String,
    pub job_path: String,
}

impl UnitInfo {
    /// A loaded unit in `active_state`/`sub_state` and nothing more: no
    /// description, no job, `/` for both object paths (override fields
    /// with struct update syntax). The row simulated agents and tests build.
    pub fn loaded(name: &str, active_state: &str, sub_state: &str) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            load_state: "loaded".into(),
            active_state: active_state.into(),
            sub_state: sub_state.into(),
            followed: String::new(),
            object_path: "/".into(),
            job_id: 0,
            job_type: String::new(),
            job_path: "/".into(),
        }
    }
}

/// A D-Bus value in D-Bus wire format (little endian) with its signature.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Marshalled {
    pub signature: String,
    pub data: Vec<u8>,
}

/// `real`: systemd said so. `virtual`: drover inferred it (e.g. node offline,
/// or replay of a known state for a new subscriber). `resync`: the manager
/// found its record wrong when it compared it with the agent's
/// (`crate::resync`) and corrects it: the state is the node's real one, the
/// event that said so was lost; it counts as `real` for proxies
/// (`crate::verdict`). Only the manager makes `resync` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    Real,
    Virtual,
    Resync,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Real => "real",
            Reason::Virtual => "virtual",
            Reason::Resync => "resync",
        }
    }

    /// Whether the state is the node's real one (`real` or `resync`).
    pub fn is_real(self) -> bool {
        matches!(self, Reason::Real | Reason::Resync)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// The systemd job behind a manager job changed state (`waiting`/`running`).
    JobStateChanged { job_id: u32, state: String },
    /// The systemd job behind a manager job finished; `result` is systemd's word.
    JobDone { job_id: u32, result: String },
    /// Systemd job duration, reported when metrics are enabled.
    JobMetrics {
        unit: UnitName,
        method: String,
        micros: u64,
    },
    UnitNew {
        tag: ModTag,
        unit: UnitName,
        reason: Reason,
    },
    UnitStateChanged {
        tag: ModTag,
        unit: UnitName,
        active_state: String,
        sub_state: String,
        reason: Reason,
    },
    UnitPropertiesChanged {
        tag: ModTag,
        unit: UnitName,
        interface: String,
        properties: Marshalled,
    },
    UnitRemoved {
        tag: ModTag,
        unit: UnitName,
        reason: Reason,
    },
    /// A local proxy on this (requesting) node wants `unit` on `node`.
    /// `template`: the family of its proxy unit, whose end follows that
    /// family's behaviour (BlueChi's `bluechi-proxy@` ends as BlueChi's does,
    /// see `crate::verdict`).
    ProxyNew {
        node: NodeName,
        unit: UnitName,
        proxy_id: u64,
        template: ProxyTemplate,
    },
    ProxyRemoved {
        node: NodeName,
        unit: UnitName,
        proxy_id: u64,
    },
    /// The health verdict of `unit` changed (`crate::health`). Tagged from
    /// the same counter as the unit events, so it is ordered among them;
    /// sent for every unit that declares a check, watched or not.
    UnitHealth {
        tag: ModTag,
        unit: UnitName,
        health: Health,
    },
    /// One part of the health snapshot sent first in every session
    /// (`crate::health::HealthSnapshot`); every part of one snapshot carries
    /// the same tag.
    HealthSnapshot { tag: ModTag, part: HealthSnapshot },
    /// The node's own health changed.
    NodeHealth(NodeHealth),
    /// What the agent holds for the manager, at the digest's tag
    /// (`crate::resync`). Appended after the older variants.
    ResyncDigest(Digest),
    /// One part of the answer to `Request::Resync`; every part of one
    /// snapshot carries the same tag, which reserves `tag` and `tag + 1`.
    ResyncSnapshot { tag: ModTag, part: SnapshotPart },
    /// The ports `unit` declares (`crate::ports`) changed; empty: none any
    /// more. Sent for every unit with ports at the start of a session.
    UnitPorts {
        unit: UnitName,
        ports: crate::ports::Ports,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_body, encode_body};
    use proptest::prelude::*;

    fn unit() -> impl Strategy<Value = UnitName> {
        "[a-z][a-z0-9-]{0,12}(@[a-z0-9]{0,4})?\\.(service|socket|timer)"
            .prop_map(|s| UnitName::new(s).unwrap())
    }

    fn node() -> impl Strategy<Value = NodeName> {
        "[a-z][a-z0-9.-]{0,20}".prop_map(|s| NodeName::new(s).unwrap())
    }

    fn marshalled() -> impl Strategy<Value = Marshalled> {
        (".{0,8}", proptest::collection::vec(any::<u8>(), 0..32))
            .prop_map(|(signature, data)| Marshalled { signature, data })
    }

    fn tag() -> impl Strategy<Value = ModTag> {
        (any::<u64>(), any::<u64>()).prop_map(|(g, i)| ModTag::new(g, i))
    }

    fn job_kind() -> impl Strategy<Value = JobKind> {
        proptest::sample::select(JobKind::ALL.to_vec())
    }

    fn reason() -> impl Strategy<Value = Reason> {
        prop_oneof![
            Just(Reason::Real),
            Just(Reason::Virtual),
            Just(Reason::Resync)
        ]
    }

    fn health() -> impl Strategy<Value = Health> {
        (
            proptest::sample::select(crate::health::HealthState::ALL.to_vec()),
            ".{0,40}",
            any::<u64>(),
        )
            .prop_map(|(state, reason, ago)| Health::new(state, &reason, ago))
    }

    fn node_health() -> impl Strategy<Value = NodeHealth> {
        (
            health(),
            "[a-z]{0,12}",
            proptest::collection::vec(("[a-z]{1,10}", health()), 0..3),
        )
            .prop_map(|(health, system_state, checks)| NodeHealth {
                health,
                system_state,
                checks: checks
                    .into_iter()
                    .map(|(name, health)| crate::health::NodeCheck { name, health })
                    .collect(),
            })
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::ListUnits),
            Just(Request::Reload),
            (job_kind(), unit(), ".{0,10}", any::<u32>()).prop_map(|(kind, unit, mode, job_id)| {
                Request::UnitJob {
                    kind,
                    unit,
                    mode,
                    job_id,
                }
            }),
            any::<u32>().prop_map(|job_id| Request::JobCancel { job_id }),
            (unit(), any::<bool>(), marshalled()).prop_map(|(unit, runtime, properties)| {
                Request::SetUnitProperties {
                    unit,
                    runtime,
                    properties,
                }
            }),
            (unit(), ".{0,5}", any::<i32>()).prop_map(|(unit, whom, signal)| Request::KillUnit {
                unit,
                whom,
                signal
            }),
            proptest::option::of(unit()).prop_map(|unit| Request::Subscribe { unit }),
            unit().prop_map(|unit| Request::SubscribeState { unit }),
            unit().prop_map(|unit| Request::StartDep { unit }),
            Just(Request::Resync),
            (
                proptest::collection::vec(".{0,20}", 0..4),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(files, runtime, force)| Request::EnableUnitFiles {
                    files,
                    runtime,
                    force
                }),
        ]
    }

    fn unit_info() -> impl Strategy<Value = UnitInfo> {
        (".{0,10}", ".{0,10}", any::<u32>()).prop_map(|(name, description, job_id)| UnitInfo {
            name,
            description,
            load_state: "loaded".into(),
            active_state: "active".into(),
            sub_state: "running".into(),
            followed: String::new(),
            object_path: "/org/freedesktop/systemd1/unit/x".into(),
            job_id,
            job_type: String::new(),
            job_path: "/".into(),
        })
    }

    fn response() -> impl Strategy<Value = Result<Response, RemoteError>> {
        prop_oneof![
            Just(Ok(Response::Empty)),
            proptest::collection::vec(unit_info(), 0..4).prop_map(|u| Ok(Response::Units(u))),
            marshalled().prop_map(|m| Ok(Response::Value(m))),
            ".{0,20}".prop_map(|t| Ok(Response::Text(t))),
            (".{0,20}", ".{0,20}").prop_map(|(n, m)| Err(RemoteError::new(n, m))),
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (any::<u32>(), ".{0,10}")
                .prop_map(|(job_id, state)| Event::JobStateChanged { job_id, state }),
            (any::<u32>(), ".{0,10}")
                .prop_map(|(job_id, result)| Event::JobDone { job_id, result }),
            (tag(), unit(), reason()).prop_map(|(tag, unit, reason)| Event::UnitNew {
                tag,
                unit,
                reason
            }),
            (tag(), unit(), ".{0,8}", ".{0,8}", reason()).prop_map(
                |(tag, unit, active_state, sub_state, reason)| Event::UnitStateChanged {
                    tag,
                    unit,
                    active_state,
                    sub_state,
                    reason
                }
            ),
            (tag(), unit(), ".{0,8}", marshalled()).prop_map(
                |(tag, unit, interface, properties)| {
                    Event::UnitPropertiesChanged {
                        tag,
                        unit,
                        interface,
                        properties,
                    }
                }
            ),
            (node(), unit(), any::<u64>(), any::<bool>()).prop_map(
                |(node, unit, proxy_id, bluechi)| Event::ProxyNew {
                    node,
                    unit,
                    proxy_id,
                    template: if bluechi {
                        ProxyTemplate::Bluechi
                    } else {
                        ProxyTemplate::Drover
                    },
                }
            ),
            (tag(), unit(), health()).prop_map(|(tag, unit, health)| Event::UnitHealth {
                tag,
                unit,
                health
            }),
            (
                tag(),
                proptest::collection::vec((unit(), health()), 0..4),
                proptest::option::of(node_health())
            )
                .prop_map(|(tag, units, node)| Event::HealthSnapshot {
                    tag,
                    part: HealthSnapshot {
                        units: units
                            .into_iter()
                            .map(|(unit, health)| crate::health::UnitHealth { unit, health })
                            .collect(),
                        node,
                    },
                }),
            node_health().prop_map(Event::NodeHealth),
            (tag(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
                |(tag, watch, count, hash)| {
                    Event::ResyncDigest(Digest {
                        tag,
                        watch,
                        units: crate::resync::Sum { count, hash },
                        health: crate::resync::Sum::default(),
                    })
                }
            ),
            (
                tag(),
                proptest::collection::vec((unit(), "[a-z]{0,8}", "[a-z-]{0,12}"), 0..4),
                any::<bool>()
            )
                .prop_map(|(tag, rows, last)| Event::ResyncSnapshot {
                    tag,
                    part: SnapshotPart {
                        watch: 1,
                        units: rows
                            .into_iter()
                            .map(|(unit, active_state, sub_state)| crate::resync::UnitRow {
                                unit,
                                active_state,
                                sub_state
                            })
                            .collect(),
                        last,
                    },
                }),
        ]
    }

    fn to_manager() -> impl Strategy<Value = ToManager> {
        prop_oneof![
            Just(ToManager::Heartbeat),
            (any::<u64>(), response()).prop_map(|(id, result)| ToManager::Reply { id, result }),
            event().prop_map(ToManager::Event),
            (
                any::<u64>(),
                response().prop_filter_map("a part is rows", Result::ok)
            )
                .prop_map(|(id, part)| ToManager::ReplyPart { id, part }),
        ]
    }

    fn notice() -> impl Strategy<Value = Notice> {
        prop_oneof![
            (any::<u64>(), ".{0,20}")
                .prop_map(|(proxy_id, message)| Notice::ProxyError { proxy_id, message }),
            (any::<u64>(), reason()).prop_map(|(proxy_id, reason)| Notice::ProxyTarget {
                proxy_id,
                change: TargetChange::New { reason }
            }),
            (any::<u64>(), ".{0,8}", ".{0,8}", reason()).prop_map(
                |(proxy_id, active_state, sub_state, reason)| {
                    Notice::ProxyTarget {
                        proxy_id,
                        change: TargetChange::State {
                            active_state,
                            sub_state,
                            reason,
                        },
                    }
                }
            ),
            (any::<u64>(), reason()).prop_map(|(proxy_id, reason)| Notice::ProxyTarget {
                proxy_id,
                change: TargetChange::Removed { reason }
            }),
            (any::<u64>(), health()).prop_map(|(proxy_id, health)| Notice::ProxyTarget {
                proxy_id,
                change: TargetChange::Health(health)
            }),
            (any::<u64>(), any::<Option<u64>>()).prop_map(|(proxy_id, offline_for_ms)| {
                Notice::TargetNodeOffline {
                    proxy_id,
                    offline_for_ms,
                }
            }),
            any::<u64>().prop_map(|proxy_id| Notice::TargetNodeOnline { proxy_id }),
        ]
    }

    fn to_agent() -> impl Strategy<Value = ToAgent> {
        prop_oneof![
            Just(ToAgent::Heartbeat),
            (any::<u64>(), request()).prop_map(|(id, body)| ToAgent::Request { id, body }),
            notice().prop_map(ToAgent::Notice),
        ]
    }

    proptest! {
        #[test]
        fn to_manager_round_trips(msg in to_manager()) {
            let body = encode_body(&msg).unwrap();
            prop_assert_eq!(decode_body::<ToManager>(&body).unwrap(), msg);
        }

        /// The manager's reader relies on it (`crate::liveness`): a
        /// heartbeat's frame is never padded, every other frame is at least
        /// the minimum once padded, and decodes as it was.
        #[test]
        fn only_a_heartbeat_is_shorter_than_the_minimum(msg in to_manager()) {
            let mut body = encode_body(&msg).unwrap();
            crate::codec::pad_body(&mut body, msg.min_frame_len());
            let len = crate::codec::HEADER_LEN + body.len();
            if msg == ToManager::Heartbeat {
                prop_assert_eq!(len, crate::liveness::AGENT_HEARTBEAT_FRAME_LEN);
            } else {
                prop_assert!(len >= crate::liveness::AGENT_MIN_FRAME_LEN, "{:?}: {}", msg, len);
            }
            prop_assert_eq!(decode_body::<ToManager>(&body).unwrap(), msg);
        }

        #[test]
        fn to_agent_round_trips(msg in to_agent()) {
            let body = encode_body(&msg).unwrap();
            prop_assert_eq!(decode_body::<ToAgent>(&body).unwrap(), msg);
        }

        /// Any prefix of a valid frame, and any random bytes, decode to an
        /// error or a message, never a panic.
        #[test]
        fn truncated_or_random_input_never_panics(msg in to_agent(), cut in any::<prop::sample::Index>(), junk in proptest::collection::vec(any::<u8>(), 0..64)) {
            let body = encode_body(&msg).unwrap();
            let cut = cut.index(body.len().max(1));
            if cut < body.len() {
                prop_assert!(decode_body::<ToAgent>(&body[..cut]).is_err());
            }
            let _ = decode_body::<ToAgent>(&junk);
            let _ = decode_body::<ToManager>(&junk);
        }
    }
}
