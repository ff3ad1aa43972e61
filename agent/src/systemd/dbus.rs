//! [`Systemd`] over D-Bus with zbus.
//!
//! Plain method calls on `org.freedesktop.systemd1` rather than generated
//! proxies: the agent uses six methods and two signals, and building their
//! bodies by hand keeps the compile small and every wire type visible here.
//!
//! The job event stream joins three match-rule streams (`Manager.JobNew`, `Manager.JobRemoved`, and
//! `PropertiesChanged` under `/org/freedesktop/systemd1/job`) with zbus's
//! ordered join, so a job's `running` state change is never delivered after
//! its removal. The unit signal stream ([`Systemd::subscribe_units`]) joins
//! `Manager.UnitNew`, `Manager.UnitRemoved` and `PropertiesChanged` under
//! `/org/freedesktop/systemd1/unit` the same way; unit object paths are
//! turned back into unit names by reversing systemd's bus label escaping.

use super::{
    ChangedProperties, EVENT_QUEUE, EventStream, JobInfo, JobPath, Systemd, SystemdEvent,
    UnitFileChange, UnitSignal, UnitSignalStream,
};
use drover_bus::Bus;
use drover_bus::marshal::{self, AuxUnits, PropertyList, PropertyMap};
use drover_bus::systemd::{
    BUS_NAME, JOB_IFACE, JOB_PATH_PREFIX, MANAGER_IFACE, MANAGER_PATH, UNIT_IFACE,
    UNIT_PATH_PREFIX, UnitTuple, unit_info, unit_name_from_path,
};
use drover_protocol::JobKind;
use drover_protocol::error_names::{NO_SUCH_UNIT, UNKNOWN_METHOD};
use drover_protocol::{Marshalled, RemoteError, UnitInfo};
use futures::StreamExt;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use tokio::sync::mpsc;
use zbus::export::ordered_stream::{self, OrderedStreamExt};
use zbus::message::Type as MessageType;
use zbus::{
    Connection, DBusError, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant, Variant,
};

const PROPERTIES_IFACE: &str = "org.freedesktop.DBus.Properties";

/// Could not reach systemd at all (as opposed to systemd refusing a call).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to systemd on {target}: {source}")]
pub struct ConnectError {
    pub target: Bus,
    #[source]
    pub source: zbus::Error,
}

/// The real systemd, reached over D-Bus.
#[derive(Clone, Debug)]
pub struct ZbusSystemd {
    conn: Connection,
}

impl ZbusSystemd {
    /// Connects to the bus and checks that systemd answers there (reads
    /// `Manager.Version`), so a wrong bus is reported at start, not at the
    /// first request.
    pub async fn connect(target: &Bus) -> Result<Self, ConnectError> {
        let err = |source| ConnectError {
            target: target.clone(),
            source,
        };
        let conn = target.connect().await.map_err(err)?;
        let reply = conn
            .call_method(
                Some(BUS_NAME),
                MANAGER_PATH,
                Some(PROPERTIES_IFACE),
                "Get",
                &(MANAGER_IFACE, "Version"),
            )
            .await
            .map_err(err)?;
        let version: OwnedVariant = reply.body().deserialize().map_err(err)?;
        tracing::debug!(version = ?version, "systemd answers on {target}");
        Ok(Self { conn })
    }

    /// The underlying bus connection (the agent serves its own API on it later).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    async fn manager_call<B>(
        &self,
        method: &'static str,
        body: &B,
    ) -> Result<zbus::Message, RemoteError>
    where
        B: zbus::export::serde::Serialize + zbus::DynamicType,
    {
        self.conn
            .call_method(
                Some(BUS_NAME),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                method,
                body,
            )
            .await
            .map_err(|e| remote_error(e, method))
    }

    /// A manager call whose reply body is one `T`.
    async fn manager_get<B, T>(&self, method: &'static str, body: &B) -> Result<T, RemoteError>
    where
        B: zbus::export::serde::Serialize + zbus::DynamicType,
        T: zbus::export::serde::de::DeserializeOwned + zbus::wire::Type,
    {
        let reply = self.manager_call(method, body).await?;
        reply.body().deserialize().map_err(|e| bad_reply(method, e))
    }

    /// The unit's object path: `GetUnit`, or `LoadUnit` when it is not loaded
    /// (properties of a unit nobody started are readable too, as with
    /// `systemctl show`).
    async fn unit_path(&self, unit: &str) -> Result<OwnedObjectPath, RemoteError> {
        match self.manager_get("GetUnit", &(unit,)).await {
            Err(e) if e.name == NO_SUCH_UNIT => self.manager_get("LoadUnit", &(unit,)).await,
            other => other,
        }
    }

    async fn unit_call<B>(
        &self,
        unit: &str,
        iface: &'static str,
        method: &'static str,
        body: &B,
    ) -> Result<zbus::Message, RemoteError>
    where
        B: zbus::export::serde::Serialize + zbus::DynamicType,
    {
        let path = self.unit_path(unit).await?;
        self.conn
            .call_method(Some(BUS_NAME), path.as_str(), Some(iface), method, body)
            .await
            .map_err(|e| remote_error(e, method))
    }
}

/// Maps a zbus error to the error the manager forwards: systemd's D-Bus
/// error name and message when there is one, `Failed` otherwise.
pub fn remote_error(err: zbus::Error, method: &str) -> RemoteError {
    match err {
        zbus::Error::MethodError(name, detail, _) => {
            RemoteError::new(name.as_str(), detail.unwrap_or_default())
        }
        zbus::Error::FDO(fdo) => {
            let name = fdo.name().to_string();
            let detail = fdo.description().unwrap_or_default().to_string();
            if name == UNKNOWN_METHOD {
                // An older systemd than the one this agent was written for.
                RemoteError::new(
                    name,
                    format!("this node's systemd does not implement {method} (too old?): {detail}"),
                )
            } else {
                RemoteError::new(name, detail)
            }
        }
        other => RemoteError::failed(format!("{method}: talking to systemd failed: {other}")),
    }
}

fn bad_reply(method: &str, err: zbus::Error) -> RemoteError {
    RemoteError::failed(format!("{method}: unexpected reply from systemd: {err}"))
}

impl Systemd for ZbusSystemd {
    async fn list_units(&self) -> Result<Vec<UnitInfo>, RemoteError> {
        let reply = self.manager_call("ListUnits", &()).await?;
        let rows: Vec<UnitTuple> = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply("ListUnits", e))?;
        Ok(rows.into_iter().map(unit_info).collect())
    }

    async fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        mode: &str,
    ) -> Result<JobPath, RemoteError> {
        let reply = self.manager_call(kind.method(), &(unit, mode)).await?;
        let path: OwnedObjectPath = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply(kind.method(), e))?;
        Ok(path.to_string())
    }

    async fn cancel_job(&self, job: &str) -> Result<(), RemoteError> {
        self.conn
            .call_method(Some(BUS_NAME), job, Some(JOB_IFACE), "Cancel", &())
            .await
            .map_err(|e| remote_error(e, "Job.Cancel"))?;
        Ok(())
    }

    async fn job_info(&self, job: &str) -> Result<JobInfo, RemoteError> {
        let reply = self
            .conn
            .call_method(
                Some(BUS_NAME),
                job,
                Some(PROPERTIES_IFACE),
                "GetAll",
                &(JOB_IFACE,),
            )
            .await
            .map_err(|e| remote_error(e, "GetAll"))?;
        let mut props: PropertyMap = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply("GetAll", e))?;
        let mut text = |key: &str| -> Result<String, RemoteError> {
            let value = props
                .remove(key)
                .ok_or_else(|| RemoteError::failed(format!("job {job} has no {key}")))?;
            String::try_from(value).map_err(|e| bad_reply("GetAll", e))
        };
        Ok(JobInfo {
            kind: text("JobType")?,
            state: text("State")?,
        })
    }

    async fn reload(&self) -> Result<(), RemoteError> {
        self.manager_call("Reload", &()).await?;
        Ok(())
    }

    async fn subscribe(&self) -> Result<EventStream, RemoteError> {
        let rule_err = |e| RemoteError::failed(format!("building a D-Bus match rule: {e}"));
        let removed_rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(BUS_NAME)
            .path(MANAGER_PATH)
            .interface(MANAGER_IFACE)
            .member("JobRemoved")
            .build()
            .map_err(rule_err)?;
        let new_rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(BUS_NAME)
            .path(MANAGER_PATH)
            .interface(MANAGER_IFACE)
            .member("JobNew")
            .build()
            .map_err(rule_err)?;
        let state_rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(BUS_NAME)
            .path_namespace(JOB_PATH_PREFIX)
            .interface(PROPERTIES_IFACE)
            .member("PropertiesChanged")
            .build()
            .map_err(rule_err)?;
        let queued = NonZeroUsize::new(EVENT_QUEUE);
        // Match rules first, then Subscribe: no signal can slip between them.
        let removed = MessageStream::for_match_rule(removed_rule, &self.conn, queued)
            .await
            .map_err(|e| remote_error(e, "AddMatch"))?;
        let states = MessageStream::for_match_rule(state_rule, &self.conn, queued)
            .await
            .map_err(|e| remote_error(e, "AddMatch"))?;
        let news = MessageStream::for_match_rule(new_rule, &self.conn, queued)
            .await
            .map_err(|e| remote_error(e, "AddMatch"))?;
        self.manager_call("Subscribe", &()).await?;

        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let joined =
            ordered_stream::join(ordered_stream::join(news, removed), states).into_stream();
        tokio::spawn(pump(joined, tx, parse_signal, "systemd signals"));
        Ok(rx)
    }

    async fn subscribe_units(&self) -> Result<UnitSignalStream, RemoteError> {
        // One match rule for every signal of systemd, filtered here: the
        // order between `Reloading`, `UnitRemoved`, `UnitNew` and the state
        // signals matters, and separate streams do not keep it reliably.
        let rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(BUS_NAME)
            .build()
            .map_err(|e| RemoteError::failed(format!("building a D-Bus match rule: {e}")))?;
        let stream =
            MessageStream::for_match_rule(rule, &self.conn, NonZeroUsize::new(EVENT_QUEUE))
                .await
                .map_err(|e| remote_error(e, "AddMatch"))?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        tokio::spawn(pump(stream, tx, parse_unit_signal, "systemd unit signals"));
        Ok(rx)
    }

    async fn get_unit_properties(
        &self,
        unit: &str,
        interface: &str,
    ) -> Result<Marshalled, RemoteError> {
        let reply = self
            .unit_call(unit, PROPERTIES_IFACE, "GetAll", &(interface,))
            .await?;
        let map: PropertyMap = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply("GetAll", e))?;
        marshal::encode(&map)
    }

    async fn get_unit_property(
        &self,
        unit: &str,
        interface: &str,
        property: &str,
    ) -> Result<Marshalled, RemoteError> {
        let reply = self
            .unit_call(unit, PROPERTIES_IFACE, "Get", &(interface, property))
            .await?;
        let value: OwnedVariant = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply("Get", e))?;
        marshal::encode_variant(&value)
    }

    async fn set_unit_properties(
        &self,
        unit: &str,
        runtime: bool,
        properties: &Marshalled,
    ) -> Result<(), RemoteError> {
        let props: PropertyList = marshal::decode(properties)?;
        self.manager_call("SetUnitProperties", &(unit, runtime, props))
            .await?;
        Ok(())
    }

    async fn freeze_unit(&self, unit: &str, freeze: bool) -> Result<(), RemoteError> {
        let method = if freeze { "Freeze" } else { "Thaw" };
        self.unit_call(unit, UNIT_IFACE, method, &()).await?;
        Ok(())
    }

    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<(), RemoteError> {
        self.manager_call("KillUnit", &(unit, whom, signal)).await?;
        Ok(())
    }

    async fn enable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
        force: bool,
    ) -> Result<(bool, Vec<UnitFileChange>), RemoteError> {
        self.manager_get("EnableUnitFiles", &(files, runtime, force))
            .await
    }

    async fn disable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.manager_get("DisableUnitFiles", &(files, runtime))
            .await
    }

    async fn get_unit_file_state(&self, file: &str) -> Result<String, RemoteError> {
        self.manager_get("GetUnitFileState", &(file,)).await
    }

    async fn list_unit_files(&self) -> Result<Vec<(String, String)>, RemoteError> {
        self.manager_get("ListUnitFiles", &()).await
    }

    async fn reset_failed(&self, unit: Option<&str>) -> Result<(), RemoteError> {
        match unit {
            None => self.manager_call("ResetFailed", &()).await?,
            Some(unit) => self.manager_call("ResetFailedUnit", &(unit,)).await?,
        };
        Ok(())
    }

    async fn get_default_target(&self) -> Result<String, RemoteError> {
        self.manager_get("GetDefaultTarget", &()).await
    }

    async fn set_default_target(
        &self,
        target: &str,
        force: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.manager_get("SetDefaultTarget", &(target, force)).await
    }

    async fn start_transient_unit(
        &self,
        unit: &str,
        mode: &str,
        properties: &Marshalled,
        aux: &Marshalled,
    ) -> Result<JobPath, RemoteError> {
        let props: PropertyList = marshal::decode(properties)?;
        let aux: AuxUnits = marshal::decode(aux)?;
        let path: OwnedObjectPath = self
            .manager_get("StartTransientUnit", &(unit, mode, props, aux))
            .await?;
        Ok(path.to_string())
    }
}

fn parse_unit_signal(msg: &zbus::Message) -> Option<UnitSignal> {
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
                match body.deserialize::<(&str, HashMap<&str, Variant<'_>>, Vec<&str>)>() {
                    Ok((_, changed, _)) => {
                        let text = |key: &str| match changed.get(key) {
                            Some(Variant::Str(s)) => Some(s.as_str().to_owned()),
                            _ => None,
                        };
                        (text("ActiveState"), text("SubState"))
                    }
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

/// The changed properties of a `PropertiesChanged` message, as a
/// [`Marshalled`] `a{sv}` (see [`ChangedProperties`]).
pub fn changed_properties(msg: &zbus::Message) -> Result<Marshalled, RemoteError> {
    let (_, changed, _): (String, PropertyMap, Vec<String>) = msg
        .body()
        .deserialize()
        .map_err(|e| RemoteError::failed(format!("malformed PropertiesChanged signal: {e}")))?;
    marshal::encode(&changed)
}

/// Turns signal messages into events with `parse` (malformed signals give
/// `None` and are skipped) until the connection closes or nobody listens any
/// more. `what` names the stream in logs.
async fn pump<S, T>(
    mut messages: S,
    tx: mpsc::Sender<T>,
    parse: fn(&zbus::Message) -> Option<T>,
    what: &'static str,
) where
    S: futures::Stream<Item = zbus::Result<zbus::Message>> + Unpin,
{
    while let Some(msg) = messages.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!("reading {what}: {e}");
                continue;
            }
        };
        let Some(event) = parse(&msg) else {
            continue;
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
    tracing::debug!("{what} stream ended");
}

fn parse_signal(msg: &zbus::Message) -> Option<SystemdEvent> {
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

    #[test]
    fn unknown_method_says_systemd_is_too_old() {
        let err = zbus::Error::FDO(Box::new(zbus::fdo::Error::UnknownMethod(
            "No such method 'FreezeUnit'".into(),
        )));
        let remote = remote_error(err, "FreezeUnit");
        assert_eq!(remote.name, UNKNOWN_METHOD);
        assert!(
            remote.message.contains("does not implement FreezeUnit"),
            "{remote}"
        );
        assert!(remote.message.contains("No such method"), "{remote}");
    }

    #[test]
    fn other_fdo_errors_keep_their_name() {
        let err = zbus::Error::FDO(Box::new(zbus::fdo::Error::AccessDenied(
            "polkit says no".into(),
        )));
        let remote = remote_error(err, "StartUnit");
        assert_eq!(remote.name, "org.freedesktop.DBus.Error.AccessDenied");
        assert_eq!(remote.message, "polkit says no");
    }

    #[test]
    fn transport_errors_are_failed_with_context() {
        let remote = remote_error(zbus::Error::InvalidReply, "ListUnits");
        assert_eq!(remote.name, "org.freedesktop.DBus.Error.Failed");
        assert!(remote.message.starts_with("ListUnits:"), "{remote}");
    }
}
