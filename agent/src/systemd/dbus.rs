//! [`Systemd`] over D-Bus with zbus.
//!
//! Plain method calls on `org.freedesktop.systemd1` rather than generated
//! proxies: the agent uses six methods and two signals, and building their
//! bodies by hand keeps the compile small and every wire type visible here.
//!
//! The event stream joins two match-rule streams (`Manager.JobRemoved`, and
//! `PropertiesChanged` under `/org/freedesktop/systemd1/job`) with zbus's
//! ordered join, so a job's `running` state change is never delivered after
//! its removal.

use super::{
    BusTarget, ERR_UNKNOWN_METHOD, EVENT_QUEUE, EventStream, JobKind, JobPath, Systemd,
    SystemdEvent,
};
use drover_protocol::{RemoteError, UnitInfo};
use futures::StreamExt;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use tokio::sync::mpsc;
use zbus::export::ordered_stream::{self, OrderedStreamExt};
use zbus::message::Type as MessageType;
use zbus::{Connection, DBusError, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

const SERVICE: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER_IFACE: &str = "org.freedesktop.systemd1.Manager";
const JOB_IFACE: &str = "org.freedesktop.systemd1.Job";
const JOB_PATH_PREFIX: &str = "/org/freedesktop/systemd1/job";
const PROPERTIES_IFACE: &str = "org.freedesktop.DBus.Properties";

/// Could not reach systemd at all (as opposed to systemd refusing a call).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to systemd on {target}: {source}")]
pub struct ConnectError {
    pub target: BusTarget,
    #[source]
    pub source: zbus::Error,
}

/// The real systemd, reached over D-Bus.
#[derive(Clone, Debug)]
pub struct ZbusSystemd {
    conn: Connection,
}

/// systemd's `ListUnits` tuple `(ssssssouso)`.
type RawUnit = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

impl ZbusSystemd {
    /// Connects to the bus and checks that systemd answers there (reads
    /// `Manager.Version`), so a wrong bus is reported at start, not at the
    /// first request.
    pub async fn connect(target: &BusTarget) -> Result<Self, ConnectError> {
        let builder = match target {
            BusTarget::System => zbus::connection::Builder::system(),
            BusTarget::Session => zbus::connection::Builder::session(),
            BusTarget::Address(addr) => zbus::connection::Builder::address(addr.as_str()),
        };
        let err = |source| ConnectError {
            target: target.clone(),
            source,
        };
        let conn = builder.build().await.map_err(err)?;
        let reply = conn
            .call_method(
                Some(SERVICE),
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
                Some(SERVICE),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                method,
                body,
            )
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
            if name == ERR_UNKNOWN_METHOD {
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
        let raw: Vec<RawUnit> = reply
            .body()
            .deserialize()
            .map_err(|e| bad_reply("ListUnits", e))?;
        Ok(raw
            .into_iter()
            .map(|u| UnitInfo {
                name: u.0,
                description: u.1,
                load_state: u.2,
                active_state: u.3,
                sub_state: u.4,
                followed: u.5,
                object_path: u.6.to_string(),
                job_id: u.7,
                job_type: u.8,
                job_path: u.9.to_string(),
            })
            .collect())
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
            .call_method(Some(SERVICE), job, Some(JOB_IFACE), "Cancel", &())
            .await
            .map_err(|e| remote_error(e, "Job.Cancel"))?;
        Ok(())
    }

    async fn reload(&self) -> Result<(), RemoteError> {
        self.manager_call("Reload", &()).await?;
        Ok(())
    }

    async fn subscribe(&self) -> Result<EventStream, RemoteError> {
        let rule_err = |e| RemoteError::failed(format!("building a D-Bus match rule: {e}"));
        let removed_rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(SERVICE)
            .path(MANAGER_PATH)
            .interface(MANAGER_IFACE)
            .member("JobRemoved")
            .build()
            .map_err(rule_err)?;
        let state_rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(SERVICE)
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
        self.manager_call("Subscribe", &()).await?;

        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let joined = ordered_stream::join(removed, states).into_stream();
        tokio::spawn(pump(joined, tx));
        Ok(rx)
    }
}

/// Turns signal messages into [`SystemdEvent`]s until the connection closes
/// or nobody listens any more. Malformed signals are logged and skipped.
async fn pump<S>(mut messages: S, tx: mpsc::Sender<SystemdEvent>)
where
    S: futures::Stream<Item = zbus::Result<zbus::Message>> + Unpin,
{
    while let Some(msg) = messages.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!("reading systemd signals: {e}");
                continue;
            }
        };
        let Some(event) = parse_signal(&msg) else {
            continue;
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
    tracing::debug!("systemd signal stream ended");
}

fn parse_signal(msg: &zbus::Message) -> Option<SystemdEvent> {
    let header = msg.header();
    let member = header.member()?.as_str();
    match member {
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

    #[test]
    fn unknown_method_says_systemd_is_too_old() {
        let err = zbus::Error::FDO(Box::new(zbus::fdo::Error::UnknownMethod(
            "No such method 'FreezeUnit'".into(),
        )));
        let remote = remote_error(err, "FreezeUnit");
        assert_eq!(remote.name, ERR_UNKNOWN_METHOD);
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
