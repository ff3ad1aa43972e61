//! The agent's local D-Bus API: `org.eclipse.bluechi.Agent` at
//! `/org/eclipse/bluechi`, on the bus where the agent reaches systemd (the
//! system bus; the user bus with `--user`; any bus with `--bus`).
//!
//! Served as BlueChi's agent serves it: the proxy
//! helper's `CreateProxy` / `RemoveProxy`, and the link's status for
//! `bluechi-is-online`-style watchers. Member names, argument names,
//! signatures, property types and `EmitsChangedSignal` follow BlueChi's XML,
//! so `Introspect` describes exactly what is served (BlueChi serves
//! `JobCancel` without declaring it in its XML; drover declares it).
//!
//! * `CreateProxy(s local_service_name, s node, s unit)`: arguments are
//!   validated first (garbage → `InvalidArgs`, nothing changes), and
//!   `local_service_name` must be exactly a proxy unit of `unit` on `node`
//!   ([`ProxyInstance::proxy_of`]; a mismatch is `InvalidArgs`: the agent
//!   stops the named proxy unit when the target goes down, so a mismatched
//!   pair would bind one unit's fate to another's target). Then the caller
//!   must be allowed ([`authorize`]); the reply is
//!   deferred until the proxy's fate is known ([`crate::proxies::registry`]). There is no
//!   timeout of our own: the start timeout of the proxy unit bounds the
//!   helper, and when the helper is killed (it leaves the bus) the waiting
//!   proxy is dropped.
//! * `RemoveProxy(s local_service_name, s node, s unit)`: the same checks;
//!   success even when the proxy is unknown, except for the stop the agent
//!   makes of a proxy whose target *failed*: that one answers
//!   `ActivationFailed` with the target's reason, so the proxy unit's
//!   `ExecStop=` fails and the unit ends `failed` with the reason in its
//!   journal (as when the target fails while the proxy waits).
//!
//! Who may call them ([`authorize`]): root (the bus's
//! `GetConnectionUnixUser` is 0), or a process of the proxy unit itself —
//! the caller's PID (`GetConnectionUnixProcessID`) is in the cgroup of
//! `local_service_name`, as systemd's `GetUnitByPID` says. That is where the
//! helper runs (`ExecStart=`/`ExecStop=` of `drover-proxy@.service`, or of
//! BlueChi's `bluechi-proxy@.service`). Anyone
//! else gets `AccessDenied` and nothing changes. The D-Bus policy already
//! keeps the name root-only on the system bus; this check holds where the
//! policy is looser (a user bus, a misconfigured policy).
//! * `SwitchController(s dbus_address)`: BlueChi's `tcp:host=H,port=P`
//!   (garbage, a `unix:` address and the address already dialled are
//!   `InvalidArgs`, nothing changes). Replies at once, after
//!   `ControllerAddress` changed; the link then drops its session and dials
//!   the new manager (`crate::link::target`, where the TLS name rule is).
//! * `JobCancel(u id)`: cancels the systemd job behind the manager's job `id`
//!   of the current session (`org.freedesktop.systemd1.Job.Cancel`, systemd's
//!   errors as `Failed` with their text); an id the agent does not track is
//!   `org.freedesktop.systemd1.NoSuchJob`. The manager hears the job end as
//!   `canceled`, as for `Job.Cancel` on the manager.
//!
//! Who may call `SwitchController` and `JobCancel` ([`authorize_owner`]): root
//! or the user the agent runs as (on the system bus that is root; the D-Bus
//! policy already says so); anyone else gets `AccessDenied`.
//! * Properties read [`AgentStatus`](crate::link::status::AgentStatus),
//!   which the link keeps current;
//!   `PropertiesChanged` is emitted for `Status` and `ControllerAddress`.
//!
//! The name is owned as `drover_bus::name` says (BlueChi allows
//! replacement; drover never does): another process that took it over would
//! leave this agent running with no proxy helper able to reach it. If
//! another process still owns it after [`NAME_WAIT`] (a restart's old agent
//! is gone well within it), the agent does not start (a clear error naming
//! the holder); if the bus ever says the agent lost it, [`Served::lost`]
//! resolves and the agent exits (its unit restarts it).

use crate::caller::{Caller, caller_uid};
use crate::proxies::registry::{CreateError, ProxyKey};
use crate::state::Shared;
use drover_bus::bluechi::{AGENT_BUS_NAME, AGENT_IFACE, AGENT_PATH};
use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::systemd::{
    BUS_NAME as SYSTEMD_BUS_NAME, JOB_IFACE, MANAGER_IFACE, MANAGER_PATH, UNIT_IFACE,
};
use drover_protocol::ProxyInstance;
use drover_protocol::error_names::{
    ACCESS_DENIED, ACTIVATION_FAILED, FAILED, INVALID_ARGS, NO_SUCH_JOB,
};
use futures::StreamExt;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use zbus::message::{Header, Message};
use zbus::names::{BusName, ErrorName, InterfaceName, OwnedUniqueName};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, Variant, interface};
use zbus::{OwnedObjectPath, OwnedVariant};

/// An error reply of the local API. Names are constants of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct LocalError {
    name: &'static str,
    message: String,
}

impl LocalError {
    pub fn new(name: &'static str, message: impl Into<String>) -> Self {
        Self {
            name,
            message: message.into(),
        }
    }

    pub fn name(&self) -> &str {
        self.name
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl zbus::DBusError for LocalError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name()).build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(self.name)
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

/// The served object; a thin adapter over [`Shared`].
pub struct AgentObject {
    shared: Arc<Shared>,
}

impl AgentObject {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn invalid(message: String) -> LocalError {
    LocalError::new(INVALID_ARGS, message)
}

/// The validated key of a `CreateProxy` / `RemoveProxy` call: each argument
/// valid, and the proxy unit the proxy of exactly that node and unit.
fn proxy_key(local: &str, node: &str, unit: &str) -> Result<ProxyKey, LocalError> {
    let key = ProxyKey::parse(local, node, unit).map_err(invalid)?;
    ProxyInstance::proxy_of(local, node, unit)
        .map_err(|e| invalid(format!("local_service_name: {e}")))?;
    Ok(key)
}

/// Lets the call through when its sender is root or a process of the proxy
/// unit `proxy_unit` (see the module docs); `AccessDenied` otherwise, also
/// when the bus or systemd cannot say who the caller is.
pub async fn authorize(
    conn: &Connection,
    header: &Header<'_>,
    proxy_unit: &str,
) -> Result<(), LocalError> {
    let denied = |why: String| {
        let message =
            format!("only root or the proxy unit {proxy_unit} itself may call this: {why}");
        tracing::warn!("refused a proxy call: {message}");
        LocalError::new(ACCESS_DENIED, message)
    };
    let Caller { sender, uid, dbus } = caller_uid(conn, header, &denied).await?;
    if uid == 0 {
        return Ok(());
    }
    let pid = dbus
        .get_connection_unix_process_id(BusName::from(sender.clone()))
        .await
        .map_err(|e| {
            denied(format!(
                "the bus does not know the pid of {sender} (uid {uid}): {e}"
            ))
        })?;
    match unit_of_pid(conn, pid).await {
        Ok(unit) if unit == proxy_unit => Ok(()),
        Ok(unit) => Err(denied(format!(
            "the caller {sender} (uid {uid}, pid {pid}) runs in {unit}"
        ))),
        Err(e) => Err(denied(format!(
            "the caller {sender} (uid {uid}, pid {pid}) is in no unit systemd names: {e}"
        ))),
    }
}

/// Lets the call `what` through when its sender is root or runs as the same
/// user as this agent; `AccessDenied` otherwise, also when the bus cannot say
/// who the caller is.
pub async fn authorize_owner(
    conn: &Connection,
    header: &Header<'_>,
    what: &str,
) -> Result<(), LocalError> {
    let denied = |why: String| {
        let message = format!("only root or the agent's own user may call {what}: {why}");
        tracing::warn!("refused a local call: {message}");
        LocalError::new(ACCESS_DENIED, message)
    };
    let Caller { sender, uid, .. } = caller_uid(conn, header, &denied).await?;
    // The owner of /proc/self is this process's effective uid.
    let own = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata("/proc/self")
            .map_err(|e| denied(format!("cannot read the agent's own uid: {e}")))?,
    );
    if uid == 0 || uid == own {
        Ok(())
    } else {
        Err(denied(format!("the caller {sender} runs as uid {uid}")))
    }
}

/// The unit whose cgroup holds `pid`, by systemd's `GetUnitByPID` and the
/// unit's `Id`.
async fn unit_of_pid(conn: &Connection, pid: u32) -> zbus::Result<String> {
    let reply = conn
        .call_method(
            Some(SYSTEMD_BUS_NAME),
            MANAGER_PATH,
            Some(MANAGER_IFACE),
            "GetUnitByPID",
            &(pid,),
        )
        .await?;
    let path: OwnedObjectPath = reply.body().deserialize()?;
    let reply = conn
        .call_method(
            Some(SYSTEMD_BUS_NAME),
            &path,
            Some(PROPERTIES_IFACE),
            "Get",
            &(UNIT_IFACE, "Id"),
        )
        .await?;
    let id: OwnedVariant = reply.body().deserialize()?;
    String::try_from(id)
}

#[interface(name = "org.eclipse.bluechi.Agent", introspection_docs = false)]
impl AgentObject {
    /// Deferred reply: see the module docs.
    async fn create_proxy(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        local_service_name: String,
        node: String,
        unit: String,
    ) -> Result<(), LocalError> {
        let key = proxy_key(&local_service_name, &node, &unit)?;
        authorize(conn, &header, key.local.as_str()).await?;
        let caller: Option<OwnedUniqueName> = header.sender().map(|s| s.to_owned().into());
        let shared = &self.shared;
        let (id, outcome) = shared
            .proxies
            .create(key, &shared.outbox)
            .map_err(|e| match e {
                CreateError::Duplicate { .. } => LocalError::new(FAILED, e.to_string()),
                CreateError::ShuttingDown => LocalError::new(ACTIVATION_FAILED, e.to_string()),
            })?;
        tokio::select! {
            outcome = outcome => match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => Err(LocalError::new(ACTIVATION_FAILED, why)),
                Err(_) => Err(LocalError::new(ACTIVATION_FAILED, "the proxy was dropped")),
            },
            () = caller_gone(conn, caller) => {
                shared.proxies.abandon(id, &shared.outbox);
                Err(LocalError::new(ACTIVATION_FAILED, "the caller left the bus"))
            }
        }
    }

    /// Success even when no such proxy exists.
    async fn remove_proxy(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        local_service_name: String,
        node: String,
        unit: String,
    ) -> Result<(), LocalError> {
        let key = proxy_key(&local_service_name, &node, &unit)?;
        authorize(conn, &header, key.local.as_str()).await?;
        self.shared.proxies.remove(&key, &self.shared.outbox);
        // The stop of a proxy whose target failed fails too (see
        // `Proxies::take_failure`).
        match self.shared.proxies.take_failure(&key) {
            Some(why) => Err(LocalError::new(ACTIVATION_FAILED, why)),
            None => Ok(()),
        }
    }

    /// Dial another manager: see the module docs.
    async fn switch_controller(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        dbus_address: String,
    ) -> Result<(), LocalError> {
        authorize_owner(conn, &header, "SwitchController").await?;
        let new = self
            .shared
            .switch_controller(&dbus_address)
            .map_err(|m| invalid(format!("dbus_address: {m}")))?;
        tracing::info!("SwitchController: the manager is now at {new}");
        Ok(())
    }

    /// Cancel the systemd job of one of the manager's jobs: see the module docs.
    async fn job_cancel(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        id: u32,
    ) -> Result<(), LocalError> {
        authorize_owner(conn, &header, "JobCancel").await?;
        let shared = &self.shared;
        let path = shared
            .outbox
            .current()
            .and_then(|epoch| shared.tracker().job_path(epoch, id).map(str::to_owned));
        let Some(path) = path else {
            return Err(LocalError::new(
                NO_SUCH_JOB,
                format!("no job {id} of the manager is running on this node"),
            ));
        };
        let path = zbus::ObjectPath::try_from(path.as_str())
            .map_err(|e| LocalError::new(FAILED, format!("job {id}: bad job path {path}: {e}")))?;
        conn.call_method(
            Some(SYSTEMD_BUS_NAME),
            &path,
            Some(JOB_IFACE),
            "Cancel",
            &(),
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            // The job ended between the lookup and the call.
            zbus::Error::MethodError(name, _, _) if name.as_str() == NO_SUCH_JOB => {
                LocalError::new(NO_SUCH_JOB, format!("job {id} has already ended"))
            }
            other => LocalError::new(FAILED, format!("cancelling job {id}: {other}")),
        })
    }

    /// `online` while registered with the manager, else `offline`.
    #[zbus(property)]
    async fn status(&self) -> String {
        self.shared.status.status().to_owned()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    async fn log_level(&self) -> String {
        self.shared.status.snapshot().log_level
    }

    #[zbus(property(emits_changed_signal = "const"))]
    async fn log_target(&self) -> String {
        self.shared.status.snapshot().log_target
    }

    /// µs (realtime) of the last disconnect; 0 while online.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn disconnect_timestamp(&self) -> u64 {
        self.shared.status.disconnected_at().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    async fn disconnect_timestamp_monotonic(&self) -> u64 {
        self.shared.status.disconnected_at().1
    }

    /// µs (realtime) of the last frame from the manager.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn last_seen_timestamp(&self) -> u64 {
        self.shared.status.last_seen().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    async fn last_seen_timestamp_monotonic(&self) -> u64 {
        self.shared.status.last_seen().1
    }

    #[zbus(property)]
    async fn controller_address(&self) -> String {
        self.shared.status.snapshot().controller_address
    }
}

/// Resolves when `caller` has left the bus; never when that cannot be known.
async fn caller_gone(conn: &Connection, caller: Option<OwnedUniqueName>) {
    let Some(caller) = caller else {
        return std::future::pending().await;
    };
    let watch = async {
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let mut changes = dbus
            .receive_name_owner_changed_with_args(&[(0, caller.as_str())])
            .await?;
        // The match is in place: a departure from now on is seen.
        if !dbus.name_has_owner(caller.as_ref().into()).await? {
            return Ok(true);
        }
        while let Some(signal) = changes.next().await {
            if signal.args().is_ok_and(|a| a.new_owner().is_none()) {
                return Ok(true);
            }
        }
        Ok::<bool, zbus::Error>(false)
    };
    match watch.await {
        Ok(true) => {}
        Ok(false) => std::future::pending().await,
        Err(e) => {
            tracing::debug!("cannot watch the CreateProxy caller {caller}: {e}");
            std::future::pending().await
        }
    }
}

/// How long a starting agent waits behind the current owner of
/// [`AGENT_BUS_NAME`]: the agent a restart replaces releases it as its
/// connection closes, which takes the bus daemon well under this.
pub const NAME_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why the local API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot export {AGENT_PATH}: {0}")]
    Export(zbus::Error),
    #[error("cannot own {AGENT_BUS_NAME}: {0}")]
    Name(drover_bus::name::NameError),
}

/// The served API; dropping it stops the `PropertiesChanged` task (the
/// object stays exported until the connection closes).
pub struct Served {
    task: tokio::task::JoinHandle<()>,
    conn: Connection,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Served {
    /// Resolves when the bus daemon tells the agent it lost
    /// [`AGENT_BUS_NAME`] (`drover_bus::name::lost`).
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        drover_bus::name::lost(self.conn.clone(), AGENT_BUS_NAME)
    }

    /// Gives [`AGENT_BUS_NAME`] up (a clean stop): the agent that replaces
    /// this one owns it at once.
    pub async fn release(&self) {
        if let Err(e) = self.conn.release_name(AGENT_BUS_NAME).await {
            tracing::debug!("releasing {AGENT_BUS_NAME}: {e}");
        }
    }
}

/// Exports the object on `conn`, owns [`AGENT_BUS_NAME`], and emits
/// `PropertiesChanged` as [`AgentStatus`](crate::link::status::AgentStatus) changes.
pub async fn serve(conn: &Connection, shared: Arc<Shared>) -> Result<Served, ServeError> {
    conn.object_server()
        .at(AGENT_PATH, AgentObject::new(shared.clone()))
        .await
        .map_err(ServeError::Export)?;
    // One owner, never replaced; a short wait behind an agent on its way out
    // (`drover_bus::name`).
    drover_bus::name::own(conn, AGENT_BUS_NAME, NAME_WAIT)
        .await
        .map_err(ServeError::Name)?;
    tracing::info!("serving {AGENT_BUS_NAME} at {AGENT_PATH}");
    let task = tokio::spawn(announce_changes(conn.clone(), shared));
    Ok(Served {
        task,
        conn: conn.clone(),
    })
}

/// Emits `PropertiesChanged` for `Status` and `ControllerAddress` whenever
/// they differ from what was last announced.
async fn announce_changes(conn: Connection, shared: Arc<Shared>) {
    let mut rx = shared.status.watch();
    let mut last_status = String::new();
    let mut last_address = String::new();
    // Starts from the state at export: clients read it with Get first.
    rx.mark_changed();
    while rx.changed().await.is_ok() {
        let status = shared.status.status().to_owned();
        let address = shared.status.snapshot().controller_address;
        let mut changed: HashMap<&str, Variant<'_>> = HashMap::new();
        if status != last_status && !last_status.is_empty() {
            changed.insert("Status", Variant::from(status.as_str()));
        }
        if address != last_address && !last_address.is_empty() {
            changed.insert("ControllerAddress", Variant::from(address.as_str()));
        }
        if !changed.is_empty() {
            emit(&conn, changed).await;
        }
        last_status = status;
        last_address = address;
    }
}

async fn emit(conn: &Connection, changed: HashMap<&str, Variant<'_>>) {
    let emitter = match SignalEmitter::new(conn, AGENT_PATH) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("bad object path {AGENT_PATH}: {e}");
            return;
        }
    };
    let iface = InterfaceName::from_static_str_unchecked(AGENT_IFACE);
    if let Err(e) =
        zbus::fdo::Properties::properties_changed(&emitter, iface, changed, Cow::Borrowed(&[]))
            .await
    {
        tracing::warn!("cannot emit PropertiesChanged on {AGENT_PATH}: {e}");
    }
}
