//! systemd's signals as the agent receives them: the match rules that bring
//! them (always narrowed to signals from systemd's name), who may send them
//! (the current owner of that name, followed through the bus daemon:
//! `drover_bus::sender`), and what a message says (`parse_signal` for the
//! job stream, `parse_unit_signal` for the unit stream). Shared by
//! `super::dbus` and `super::unit_stream`; no state.
//!
//! Invariant: a malformed signal is logged and skipped, never an error of
//! the stream.

use super::api::{ChangedProperties, EVENT_QUEUE, SystemdEvent, UnitSignal};
use super::errors::remote_error;
use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::sender::Owner;
use drover_bus::systemd::{
    BUS_NAME, JOB_IFACE, MANAGER_IFACE, MANAGER_PATH, UNIT_IFACE, UNIT_PATH_PREFIX,
    unit_name_from_path,
};
use drover_protocol::RemoteError;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use zbus::match_rule::Builder as MatchRuleBuilder;
use zbus::message::Type as MessageType;
use zbus::wire::Type;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant, Variant};

/// A message of the unit stream (`super::unit_stream`) as a [`UnitSignal`];
/// `None` for what it does not carry or cannot read.
pub(super) fn parse_unit_signal(msg: &zbus::Message) -> Option<UnitSignal> {
    let header = msg.header();
    let member = header.member()?.as_str();
    let interface = header.interface()?.as_str();
    let path = header.path()?.as_str();
    let wanted = match member {
        "Reloading" | "UnitNew" | "UnitRemoved" | "JobNew" | "JobRemoved" => {
            interface == MANAGER_IFACE && path == MANAGER_PATH
        }
        "PropertiesChanged" => interface == PROPERTIES_IFACE && path.starts_with(UNIT_PATH_PREFIX),
        _ => false,
    };
    if !wanted {
        return None;
    }
    match member {
        "Reloading" => match msg.body().deserialize::<bool>() {
            Ok(active) => Some(UnitSignal::Reloading { active }),
            Err(e) => {
                tracing::warn!("ignoring a malformed Reloading signal: {e}");
                None
            }
        },
        // The job stream's parser, so both streams read these alike.
        "JobNew" | "JobRemoved" => match parse_signal(msg)? {
            SystemdEvent::JobNew { job, unit, .. } => Some(UnitSignal::JobNew { job, unit }),
            SystemdEvent::JobRemoved { job, .. } => Some(UnitSignal::JobRemoved { job }),
            SystemdEvent::JobState { .. } => None,
        },
        "UnitNew" | "UnitRemoved" => {
            let (unit, _path) = match msg.body().deserialize::<(String, OwnedObjectPath)>() {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!("ignoring a malformed {member} signal: {e}");
                    return None;
                }
            };
            Some(if member == "UnitNew" {
                UnitSignal::New { unit }
            } else {
                UnitSignal::Removed { unit }
            })
        }
        "PropertiesChanged" => {
            let path = header.path()?.as_str();
            let Some(unit) = unit_name_from_path(path) else {
                tracing::debug!("PropertiesChanged on {path}, not a unit object");
                return None;
            };
            // Only the interface and, for the unit interface, the state are
            // read now; the rest when a subscription wants it.
            let body = msg.body();
            if body.signature().to_string_no_parens() != "sa{sv}as" {
                tracing::warn!(
                    "ignoring a PropertiesChanged signal on {path} with body `{}`",
                    body.signature()
                );
                return None;
            }
            let interface = match body.data().deserialize::<&str>() {
                Ok((interface, _)) => interface.to_owned(),
                Err(e) => {
                    tracing::warn!("ignoring a malformed PropertiesChanged signal on {path}: {e}");
                    return None;
                }
            };
            let (active_state, sub_state) = if interface == UNIT_IFACE {
                match body.deserialize::<(&str, UnitState, Vec<&str>)>() {
                    Ok((_, changed, _)) => (changed.active, changed.sub),
                    Err(e) => {
                        tracing::warn!(
                            "ignoring a malformed PropertiesChanged signal on {path}: {e}"
                        );
                        return None;
                    }
                }
            } else {
                (None, None)
            };
            Some(UnitSignal::Changed {
                unit,
                interface,
                properties: ChangedProperties::from_signal(msg.clone()),
                active_state,
                sub_state,
            })
        }
        _ => None,
    }
}

/// `ActiveState` and `SubState` of a `Unit` interface's changed properties
/// (`a{sv}`), `None` when absent or not a string (the last of a name
/// given twice counts). The other values are walked, so a malformed one
/// still fails the signal, but not built: a unit's change carries a dozen
/// of them (timestamps, its job, its invocation id), which the unit stream
/// decodes only for a unit someone watches for everything.
#[derive(Debug, Default, PartialEq)]
struct UnitState {
    active: Option<String>,
    sub: Option<String>,
}

impl Type for UnitState {
    const SIGNATURE: &'static zbus::Signature = <HashMap<&str, Variant<'_>>>::SIGNATURE;
}

impl<'de> serde::Deserialize<'de> for UnitState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = UnitState;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a{sv} dictionary")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let text = |v: Variant<'_>| match v {
                    Variant::Str(s) => Some(s.as_str().to_owned()),
                    _ => None,
                };
                let mut state = UnitState::default();
                while let Some(key) = access.next_key::<&str>()? {
                    match key {
                        "ActiveState" => state.active = text(access.next_value()?),
                        "SubState" => state.sub = text(access.next_value()?),
                        _ => {
                            access.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(state)
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// The rule for `Manager.<member>` signals (the job stream's and the unit
/// stream's are the same rule, which the connection then shares).
pub(super) fn manager_signal(
    member: &'static str,
) -> impl FnOnce(MatchRuleBuilder<'static>) -> MatchRuleBuilder<'static> {
    move |rule| {
        rule.path(MANAGER_PATH)
            .interface(MANAGER_IFACE)
            .member(member)
    }
}

/// systemd's signals that `rule` narrows (it starts as "signals from
/// systemd"), as a stream; the match is on the bus when this returns.
pub(super) async fn systemd_signals(
    conn: &Connection,
    rule: impl FnOnce(MatchRuleBuilder<'static>) -> MatchRuleBuilder<'static>,
) -> Result<MessageStream, RemoteError> {
    let rule = rule(
        MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(BUS_NAME),
    )
    .build()
    .map_err(|e| RemoteError::failed(format!("building a D-Bus match rule: {e}")))?;
    MessageStream::for_match_rule(rule, conn, NonZeroUsize::new(EVENT_QUEUE))
        .await
        .map_err(|e| remote_error(e, "AddMatch"))
}

/// The bus daemon's news of who owns `org.freedesktop.systemd1`, and who
/// does now (`drover_bus::sender`): joined into each signal stream, so a
/// signal counts only when the owner of that moment sent it.
pub(super) async fn follow_systemd(
    conn: &Connection,
) -> Result<(Owner, MessageStream), RemoteError> {
    Owner::follow(conn, BUS_NAME, NonZeroUsize::new(OWNER_QUEUE))
        .await
        .map_err(|e| remote_error(e, "GetNameOwner"))
}

/// Owner changes waiting to be read: systemd changes owner once per
/// `daemon-reexec`.
const OWNER_QUEUE: usize = 64;

/// A message of the job stream as a [`SystemdEvent`]; `None` for what it
/// does not carry or cannot read.
pub(super) fn parse_signal(msg: &zbus::Message) -> Option<SystemdEvent> {
    let header = msg.header();
    let member = header.member()?.as_str();
    match member {
        "JobNew" => match msg.body().deserialize::<(u32, OwnedObjectPath, String)>() {
            Ok((id, job, unit)) => Some(SystemdEvent::JobNew {
                id,
                job: job.to_string(),
                unit,
            }),
            Err(e) => {
                tracing::warn!("ignoring a malformed JobNew signal: {e}");
                None
            }
        },
        "JobRemoved" => match msg
            .body()
            .deserialize::<(u32, OwnedObjectPath, String, String)>()
        {
            Ok((id, job, unit, result)) => Some(SystemdEvent::JobRemoved {
                id,
                job: job.to_string(),
                unit,
                result,
            }),
            Err(e) => {
                tracing::warn!("ignoring a malformed JobRemoved signal: {e}");
                None
            }
        },
        "PropertiesChanged" => {
            let job = header.path()?.to_string();
            let (iface, mut changed, _invalidated) =
                match msg
                    .body()
                    .deserialize::<(String, HashMap<String, OwnedVariant>, Vec<String>)>()
                {
                    Ok(body) => body,
                    Err(e) => {
                        tracing::warn!(
                            "ignoring a malformed PropertiesChanged signal on {job}: {e}"
                        );
                        return None;
                    }
                };
            if iface != JOB_IFACE {
                return None;
            }
            let state = String::try_from(changed.remove("State")?).ok()?;
            Some(SystemdEvent::JobState { job, state })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_bus::marshal::{self, OrderedProperties, PropertyMap};
    use drover_bus::systemd::unit_path;

    fn manager_signal<B>(member: &str, body: &B) -> zbus::Message
    where
        B: zbus::export::serde::Serialize + zbus::DynamicType,
    {
        zbus::Message::signal(MANAGER_PATH, MANAGER_IFACE, member)
            .build(body)
            .unwrap()
    }

    #[test]
    fn the_unit_stream_reads_job_signals_and_skips_malformed_ones() {
        let job = OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
        let unit = "drover-dep@db.service.service".to_string();
        let new = manager_signal("JobNew", &(7u32, job.clone(), unit.clone()));
        assert!(matches!(
            parse_unit_signal(&new),
            Some(UnitSignal::JobNew { job: j, unit: u })
                if j == job.as_str() && u == unit
        ));
        let removed = manager_signal("JobRemoved", &(7u32, job.clone(), unit.clone(), "done"));
        assert!(matches!(
            parse_unit_signal(&removed),
            Some(UnitSignal::JobRemoved { job: j }) if j == job.as_str()
        ));
        // Wrong body types or arity: skipped, not guessed at.
        assert!(parse_unit_signal(&manager_signal("JobNew", &("7", unit.clone()))).is_none());
        assert!(parse_unit_signal(&manager_signal("JobNew", &(7u32,))).is_none());
        assert!(parse_unit_signal(&manager_signal("JobRemoved", &(7u32, job.clone()))).is_none());
        // The same member on another object is not systemd's manager speaking.
        let elsewhere = zbus::Message::signal("/somewhere/else", MANAGER_IFACE, "JobNew")
            .build(&(7u32, job, unit))
            .unwrap();
        assert!(parse_unit_signal(&elsewhere).is_none());
    }

    fn changed_signal<B>(unit: &str, body: &B) -> zbus::Message
    where
        B: zbus::export::serde::Serialize + zbus::DynamicType,
    {
        zbus::Message::signal(
            unit_path(unit).as_str(),
            PROPERTIES_IFACE,
            "PropertiesChanged",
        )
        .build(body)
        .unwrap()
    }

    #[test]
    fn properties_changed_reads_the_state_now_and_the_rest_on_demand() {
        let none: Vec<String> = Vec::new();
        let mut props: HashMap<&str, Variant<'_>> = HashMap::new();
        props.insert("ActiveState", Variant::from("active"));
        props.insert("SubState", Variant::from("running"));
        props.insert("NRestarts", Variant::from(3u32));
        let msg = changed_signal("db.service", &(super::UNIT_IFACE, &props, &none));
        let Some(UnitSignal::Changed {
            unit,
            interface,
            properties,
            active_state,
            sub_state,
        }) = parse_unit_signal(&msg)
        else {
            panic!("not a state change");
        };
        assert_eq!(unit, "db.service");
        assert_eq!(interface, super::UNIT_IFACE);
        assert_eq!(active_state.as_deref(), Some("active"));
        assert_eq!(sub_state.as_deref(), Some("running"));
        let decoded: PropertyMap = marshal::decode(&properties.marshal().unwrap()).unwrap();
        assert_eq!(decoded.len(), 3);
        assert_eq!(u32::try_from(&*decoded["NRestarts"]).unwrap(), 3);

        // Another interface: no state read, the properties still there.
        let service = "org.freedesktop.systemd1.Service";
        let msg = changed_signal("db.service", &(service, &props, &none));
        match parse_unit_signal(&msg) {
            Some(UnitSignal::Changed {
                interface,
                properties,
                active_state: None,
                sub_state: None,
                ..
            }) => {
                assert_eq!(interface, service);
                let decoded: PropertyMap = marshal::decode(&properties.marshal().unwrap()).unwrap();
                assert_eq!(decoded.len(), 3);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// The values a `Unit` interface's change carries besides the state
    /// (systemd's shapes: timestamps, the job, the invocation id, the
    /// conditions) are skipped, whatever their type; a state that is not a
    /// string is no state.
    #[test]
    fn the_state_is_read_past_values_of_every_shape() {
        let none: Vec<String> = Vec::new();
        let job = zbus::ObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
        let conditions = vec![("ConditionPathExists", false, false, "/etc/x", 1i32)];
        let props: Vec<(&str, Variant<'_>)> = vec![
            ("ActiveEnterTimestamp", Variant::from(1_700_000_000u64)),
            ("Job", Variant::from((7u32, job))),
            ("ActiveState", Variant::from("activating")),
            ("InvocationID", Variant::from(vec![7u8; 16])),
            ("Conditions", Variant::from(conditions)),
            ("SubState", Variant::from("start")),
            ("ConditionResult", Variant::from(true)),
        ];
        let props = OrderedProperties(
            props
                .into_iter()
                .map(|(k, v)| (k.to_owned(), OwnedVariant::try_from(v).unwrap()))
                .collect(),
        );
        let msg = changed_signal("db.service", &(super::UNIT_IFACE, &props, &none));
        let Some(UnitSignal::Changed {
            active_state,
            sub_state,
            properties,
            ..
        }) = parse_unit_signal(&msg)
        else {
            panic!("not a state change");
        };
        assert_eq!(active_state.as_deref(), Some("activating"));
        assert_eq!(sub_state.as_deref(), Some("start"));
        let decoded: PropertyMap = marshal::decode(&properties.marshal().unwrap()).unwrap();
        assert_eq!(
            decoded.len(),
            7,
            "a watcher of everything still gets them all"
        );

        let mut odd: HashMap<&str, Variant<'_>> = HashMap::new();
        odd.insert("ActiveState", Variant::from(1u32));
        odd.insert("SubState", Variant::from("running"));
        let msg = changed_signal("db.service", &(super::UNIT_IFACE, &odd, &none));
        match parse_unit_signal(&msg) {
            Some(UnitSignal::Changed {
                active_state: None,
                sub_state: Some(sub),
                ..
            }) => assert_eq!(sub, "running"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn malformed_properties_changed_is_skipped() {
        // Bodies of the wrong type, whatever the interface: skipped, not guessed at.
        for iface in [super::UNIT_IFACE, "org.freedesktop.systemd1.Service"] {
            let msg = changed_signal("db.service", &(iface, 7u32));
            assert!(parse_unit_signal(&msg).is_none(), "{iface}");
            let props: HashMap<&str, &str> = HashMap::from([("ActiveState", "active")]);
            let msg = changed_signal("db.service", &(iface, props));
            assert!(parse_unit_signal(&msg).is_none(), "{iface}");
        }
        assert!(parse_unit_signal(&changed_signal("db.service", &(7u32,))).is_none());
        // Not a unit object: skipped.
        let elsewhere = zbus::Message::signal(
            "/org/freedesktop/systemd1/job/7",
            PROPERTIES_IFACE,
            "PropertiesChanged",
        )
        .build(&(
            "org.freedesktop.systemd1.Job",
            HashMap::<&str, Variant<'_>>::new(),
            Vec::<String>::new(),
        ))
        .unwrap();
        assert!(parse_unit_signal(&elsewhere).is_none());
    }
}
