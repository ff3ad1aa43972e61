//! [`Systemd`] over D-Bus with zbus.
//!
//! Method calls go through `#[zbus::proxy]` traits, one per systemd
//! interface the agent calls ([`ManagerProxy`], [`UnitProxy`],
//! [`JobProxy`]) plus `org.freedesktop.DBus.Properties` ([`PropertiesProxy`])
//! for reading unit and job objects, so every method's name and argument and reply types are
//! written once, here. Proxies are built without a property cache (building
//! one then costs no bus traffic): the manager's once at connect, a unit's
//! or job's per call, on the object path systemd named. The interface names
//! in the attributes are `drover_bus::systemd`'s constants spelled out
//! (attributes take literals); a test checks they agree.
//!
//! Errors: a refusal keeps systemd's D-Bus error name ([`remote_error`]); a
//! reply of the wrong shape is `Failed` ("unexpected reply from systemd").
//!
//! The job event stream joins three match-rule streams (`Manager.JobNew`, `Manager.JobRemoved`, and
//! `PropertiesChanged` under `/org/freedesktop/systemd1/job`) with zbus's
//! ordered join, so a job's `running` state change is never delivered after
//! its removal. The unit stream ([`Systemd::unit_stream`]) is
//! `super::unit_stream`'s, with the rules and the parser here; unit object
//! paths are turned back into unit names by reversing systemd's bus label
//! escaping. Signals are read as messages, not through proxy signal streams:
//! the order across members is the point.
//!
//! Only systemd speaks for systemd: each stream also carries the bus
//! daemon's `NameOwnerChanged` of `org.freedesktop.systemd1`, and a signal
//! counts only when its sender is the unique name that owns it at that point
//! of the stream (`drover_bus::sender`). The match rules' `sender=` does not
//! do this: the bus applies it to broadcasts only, and any local user may
//! send a signal straight to the agent's unique name. Others' signals are
//! dropped, counted and logged at a bounded rate.

use super::api::{
    EVENT_QUEUE, EventStream, Followed, JobInfo, JobPath, Systemd, UnitFileChange, UnitSignalStream,
};
use super::errors::{bad_reply, call_error, remote_error};
use super::signals::{follow_systemd, manager_signal, parse_signal, systemd_signals};
use super::unit_stream::UnitStreams;
use drover_bus::Bus;
use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::marshal::{self, AuxUnits, PropertyList, PropertyMap};
use drover_bus::sender::{Dropped, Owner, Verdict};
use drover_bus::systemd::{
    BUS_NAME, JOB_IFACE, JOB_PATH_PREFIX, MANAGER_IFACE, MANAGER_PATH, UnitTuple, unit_info,
};
use drover_protocol::JobKind;
use drover_protocol::error_names::NO_SUCH_UNIT;
use drover_protocol::{Marshalled, RemoteError, UnitInfo};
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::mpsc;
use zbus::export::ordered_stream::{self, OrderedStreamExt};
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath, OwnedVariant};

/// `org.freedesktop.systemd1.Manager`: the methods the agent calls.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub trait Manager {
    fn list_units(&self) -> zbus::Result<Vec<UnitTuple>>;
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reload_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn reload(&self) -> zbus::Result<()>;
    fn subscribe(&self) -> zbus::Result<()>;
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &PropertyList,
    ) -> zbus::Result<()>;
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
    fn enable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<(bool, Vec<UnitFileChange>)>;
    fn disable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
    ) -> zbus::Result<Vec<UnitFileChange>>;
    fn get_unit_file_state(&self, file: &str) -> zbus::Result<String>;
    fn list_unit_files(&self) -> zbus::Result<Vec<(String, String)>>;
    fn reset_failed(&self) -> zbus::Result<()>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn get_default_target(&self) -> zbus::Result<String>;
    fn set_default_target(&self, name: &str, force: bool) -> zbus::Result<Vec<UnitFileChange>>;
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &PropertyList,
        aux: &AuxUnits,
    ) -> zbus::Result<OwnedObjectPath>;
}

/// `org.freedesktop.systemd1.Unit` on a unit's object.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Unit {
    fn freeze(&self) -> zbus::Result<()>;
    fn thaw(&self) -> zbus::Result<()>;
}

/// `org.freedesktop.systemd1.Job` on a job's object.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Job",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Job {
    fn cancel(&self) -> zbus::Result<()>;
}

/// `org.freedesktop.DBus.Properties` on one of systemd's objects, with
/// zbus errors (not `fdo` ones), so systemd's error names pass unchanged.
#[zbus::proxy(
    interface = "org.freedesktop.DBus.Properties",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Properties {
    fn get(&self, interface: &str, property: &str) -> zbus::Result<OwnedVariant>;
    fn get_all(&self, interface: &str) -> zbus::Result<PropertyMap>;
}

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
    manager: ManagerProxy<'static>,
    /// The unit stream's switches (`super::unit_stream`).
    units: Arc<UnitStreams>,
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
        let version = properties(&conn, MANAGER_PATH)
            .await
            .map_err(err)?
            .get(MANAGER_IFACE, "Version")
            .await
            .map_err(err)?;
        tracing::debug!(version = ?version, "systemd answers on {target}");
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(err)?;
        Ok(Self {
            conn,
            manager,
            units: Arc::default(),
        })
    }

    /// The underlying bus connection (the agent serves its own API on it later).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The unit's object path: `GetUnit`, or `LoadUnit` when it is not loaded
    /// (properties of a unit nobody started are readable too, as with
    /// `systemctl show`).
    async fn unit_path(&self, unit: &str) -> Result<OwnedObjectPath, RemoteError> {
        match self
            .manager
            .get_unit(unit)
            .await
            .map_err(call_error("GetUnit"))
        {
            Err(e) if e.name == NO_SUCH_UNIT => self
                .manager
                .load_unit(unit)
                .await
                .map_err(call_error("LoadUnit")),
            other => other,
        }
    }

    /// `org.freedesktop.DBus.Properties` of the unit's object.
    async fn unit_properties(&self, unit: &str) -> Result<PropertiesProxy<'static>, RemoteError> {
        let path = self.unit_path(unit).await?;
        properties(&self.conn, path)
            .await
            .map_err(call_error("Properties"))
    }
}

/// A proxy on `path` of systemd, for the object path it named.
async fn properties<'p, P>(conn: &Connection, path: P) -> zbus::Result<PropertiesProxy<'p>>
where
    P: TryInto<zbus::ObjectPath<'p>>,
    P::Error: Into<zbus::Error>,
{
    PropertiesProxy::builder(conn)
        .path(path)
        .cache_properties(CacheProperties::No)
        .build()
        .await
}

impl Systemd for ZbusSystemd {
    /// zbus numbers every message a connection receives, answers and signals
    /// alike, in the order they arrived.
    type Position = zbus::message::Sequence;

    async fn list_units(&self) -> Result<Vec<UnitInfo>, RemoteError> {
        Ok(self.list_units_at().await?.0)
    }

    async fn list_units_at(&self) -> Result<(Vec<UnitInfo>, Self::Position), RemoteError> {
        let answer = self
            .manager
            .inner()
            .call_method("ListUnits", &())
            .await
            .map_err(call_error("ListUnits"))?;
        let rows: Vec<UnitTuple> = answer
            .body()
            .deserialize()
            .map_err(call_error("ListUnits"))?;
        Ok((
            rows.into_iter().map(unit_info).collect(),
            answer.recv_position(),
        ))
    }

    async fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        mode: &str,
    ) -> Result<JobPath, RemoteError> {
        let m = &self.manager;
        let path = match kind {
            JobKind::Start => m.start_unit(unit, mode).await,
            JobKind::Stop => m.stop_unit(unit, mode).await,
            JobKind::Restart => m.restart_unit(unit, mode).await,
            JobKind::Reload => m.reload_unit(unit, mode).await,
        }
        .map_err(call_error(kind.method()))?;
        Ok(path.to_string())
    }

    async fn cancel_job(&self, job: &str) -> Result<(), RemoteError> {
        let cancel = async {
            JobProxy::builder(&self.conn)
                .path(job)
                .cache_properties(CacheProperties::No)
                .build()
                .await?
                .cancel()
                .await
        };
        cancel.await.map_err(|e| remote_error(e, "Job.Cancel"))
    }

    async fn job_info(&self, job: &str) -> Result<JobInfo, RemoteError> {
        let get_all = async { properties(&self.conn, job).await?.get_all(JOB_IFACE).await };
        let mut props = get_all.await.map_err(call_error("GetAll"))?;
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
        self.manager.reload().await.map_err(call_error("Reload"))
    }

    async fn subscribe(&self) -> Result<EventStream, RemoteError> {
        // Match rules first, then Subscribe: no signal can slip between them.
        let (owner, owner_changes) = follow_systemd(&self.conn).await?;
        let removed = systemd_signals(&self.conn, manager_signal("JobRemoved")).await?;
        let states = systemd_signals(&self.conn, |rule| {
            rule.path_namespace(JOB_PATH_PREFIX)
                .interface(PROPERTIES_IFACE)
                .member("PropertiesChanged")
        })
        .await?;
        let news = systemd_signals(&self.conn, manager_signal("JobNew")).await?;
        self.manager
            .subscribe()
            .await
            .map_err(call_error("Subscribe"))?;

        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let joined = ordered_stream::join(
            ordered_stream::join(ordered_stream::join(news, removed), states),
            owner_changes,
        )
        .into_stream();
        tokio::spawn(pump(
            joined,
            owner,
            tx,
            parse_signal,
            "systemd's job signals",
        ));
        Ok(rx)
    }

    async fn unit_stream(&self) -> Result<UnitSignalStream<Self::Position>, RemoteError> {
        self.units.start(&self.conn).await
    }

    async fn follow(&self, followed: &Followed, id: u64) -> Result<(), RemoteError> {
        self.units.follow(&self.conn, followed, id).await
    }

    async fn get_unit_properties(
        &self,
        unit: &str,
        interface: &str,
    ) -> Result<Marshalled, RemoteError> {
        let map = self
            .unit_properties(unit)
            .await?
            .get_all(interface)
            .await
            .map_err(call_error("GetAll"))?;
        marshal::encode(&map)
    }

    async fn get_unit_property(
        &self,
        unit: &str,
        interface: &str,
        property: &str,
    ) -> Result<Marshalled, RemoteError> {
        let value = self
            .unit_properties(unit)
            .await?
            .get(interface, property)
            .await
            .map_err(call_error("Get"))?;
        marshal::encode_variant(&value)
    }

    async fn set_unit_properties(
        &self,
        unit: &str,
        runtime: bool,
        properties: &Marshalled,
    ) -> Result<(), RemoteError> {
        let props: PropertyList = marshal::decode(properties)?;
        self.manager
            .set_unit_properties(unit, runtime, &props)
            .await
            .map_err(call_error("SetUnitProperties"))
    }

    async fn freeze_unit(&self, unit: &str, freeze: bool) -> Result<(), RemoteError> {
        let method = if freeze { "Freeze" } else { "Thaw" };
        let path = self.unit_path(unit).await?;
        let call = async {
            let proxy = UnitProxy::builder(&self.conn)
                .path(path)
                .cache_properties(CacheProperties::No)
                .build()
                .await?;
            if freeze {
                proxy.freeze().await
            } else {
                proxy.thaw().await
            }
        };
        call.await.map_err(call_error(method))
    }

    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<(), RemoteError> {
        self.manager
            .kill_unit(unit, whom, signal)
            .await
            .map_err(call_error("KillUnit"))
    }

    async fn enable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
        force: bool,
    ) -> Result<(bool, Vec<UnitFileChange>), RemoteError> {
        self.manager
            .enable_unit_files(files, runtime, force)
            .await
            .map_err(call_error("EnableUnitFiles"))
    }

    async fn disable_unit_files(
        &self,
        files: &[String],
        runtime: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.manager
            .disable_unit_files(files, runtime)
            .await
            .map_err(call_error("DisableUnitFiles"))
    }

    async fn get_unit_file_state(&self, file: &str) -> Result<String, RemoteError> {
        self.manager
            .get_unit_file_state(file)
            .await
            .map_err(call_error("GetUnitFileState"))
    }

    async fn list_unit_files(&self) -> Result<Vec<(String, String)>, RemoteError> {
        self.manager
            .list_unit_files()
            .await
            .map_err(call_error("ListUnitFiles"))
    }

    async fn reset_failed(&self, unit: Option<&str>) -> Result<(), RemoteError> {
        match unit {
            None => self
                .manager
                .reset_failed()
                .await
                .map_err(call_error("ResetFailed")),
            Some(unit) => self
                .manager
                .reset_failed_unit(unit)
                .await
                .map_err(call_error("ResetFailedUnit")),
        }
    }

    async fn get_default_target(&self) -> Result<String, RemoteError> {
        self.manager
            .get_default_target()
            .await
            .map_err(call_error("GetDefaultTarget"))
    }

    async fn set_default_target(
        &self,
        target: &str,
        force: bool,
    ) -> Result<Vec<UnitFileChange>, RemoteError> {
        self.manager
            .set_default_target(target, force)
            .await
            .map_err(call_error("SetDefaultTarget"))
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
        let path = self
            .manager
            .start_transient_unit(unit, mode, &props, &aux)
            .await
            .map_err(call_error("StartTransientUnit"))?;
        Ok(path.to_string())
    }
}

/// Turns signal messages into events with `parse` (malformed signals give
/// `None` and are skipped) until the connection closes or nobody listens any
/// more. A signal that systemd's current unique owner did not send is
/// dropped before it is parsed: anyone on the bus may send a signal to the
/// agent's own name, and a forged unit or job signal would move units on
/// other nodes. `what` names the stream in logs.
async fn pump<S, T>(
    mut messages: S,
    mut owner: Owner,
    tx: mpsc::Sender<T>,
    parse: fn(&zbus::Message) -> Option<T>,
    what: &'static str,
) where
    S: futures::Stream<Item = zbus::Result<zbus::Message>> + Unpin,
{
    let mut dropped = Dropped::new(what);
    while let Some(msg) = messages.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!("reading {what}: {e}");
                continue;
            }
        };
        match owner.judge(&msg) {
            Verdict::FromOwner => {}
            Verdict::OwnerChanged { owner } => {
                tracing::info!(
                    "{BUS_NAME} is now owned by {} (for {what})",
                    owner.as_deref().unwrap_or("nobody")
                );
                continue;
            }
            Verdict::NotFromOwner { sender } => {
                if let Some(line) = dropped.note(&msg, &sender, &owner.describe()) {
                    tracing::warn!("{line}");
                }
                continue;
            }
        }
        let Some(event) = parse(&msg) else {
            continue;
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
    tracing::debug!("{what} stream ended");
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_bus::systemd::UNIT_IFACE;

    #[test]
    fn the_proxies_name_drover_bus_s_interfaces_and_paths() {
        use zbus::proxy::Defaults;
        fn iface<P: Defaults>() -> Option<String> {
            P::INTERFACE.as_ref().map(|i| i.to_string())
        }
        fn service<P: Defaults>() -> Option<String> {
            P::DESTINATION.as_ref().map(|d| d.to_string())
        }
        assert_eq!(iface::<ManagerProxy<'_>>().as_deref(), Some(MANAGER_IFACE));
        assert_eq!(iface::<UnitProxy<'_>>().as_deref(), Some(UNIT_IFACE));
        assert_eq!(iface::<JobProxy<'_>>().as_deref(), Some(JOB_IFACE));
        assert_eq!(
            iface::<PropertiesProxy<'_>>().as_deref(),
            Some(PROPERTIES_IFACE)
        );
        for service in [
            service::<ManagerProxy<'_>>(),
            service::<UnitProxy<'_>>(),
            service::<JobProxy<'_>>(),
            service::<PropertiesProxy<'_>>(),
        ] {
            assert_eq!(service.as_deref(), Some(BUS_NAME));
        }
        let path = <ManagerProxy<'_> as Defaults>::PATH
            .as_ref()
            .map(|p| p.to_string());
        assert_eq!(path.as_deref(), Some(MANAGER_PATH));
    }
}
