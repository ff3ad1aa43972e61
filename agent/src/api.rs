//! The agent's local D-Bus API: `org.eclipse.bluechi.Agent` at
//! `/org/eclipse/bluechi`, on the bus where the agent reaches systemd (the
//! system bus; the user bus with `--user`; any bus with `--bus`).
//!
//! Served as BlueChi's agent serves it (bluechi-facts §2.6): the proxy
//! helper's `CreateProxy` / `RemoveProxy`, and the link's status for
//! `bluechi-is-online`-style watchers. Member names, argument names,
//! signatures, property types and `EmitsChangedSignal` follow BlueChi's XML,
//! so `Introspect` describes exactly what is served. `SwitchController` and
//! `JobCancel` are not served (no stubs).
//!
//! * `CreateProxy(s local_service_name, s node, s unit)`: arguments are
//!   validated first (garbage → `InvalidArgs`, nothing changes); the reply is
//!   deferred until the proxy's fate is known ([`crate::proxy`]). There is no
//!   timeout of our own: the start timeout of the proxy unit bounds the
//!   helper, and when the helper is killed (it leaves the bus) the waiting
//!   proxy is dropped.
//! * `RemoveProxy(s local_service_name, s node, s unit)`: success even when
//!   the proxy is unknown.
//! * Properties read [`AgentStatus`], which the link keeps current;
//!   `PropertiesChanged` is emitted for `Status` and `ControllerAddress`.
//!
//! The name is requested with replace-existing and allow-replacement, never
//! queued (as BlueChi); if another owner refuses to give it up, the agent
//! does not start (a clear error).

use crate::dispatch::Shared;
use crate::proxy::{CreateError, ProxyKey};
use drover_bus::bluechi::{AGENT_BUS_NAME, AGENT_IFACE, AGENT_PATH};
use drover_bus::timestamp::{monotonic_us, realtime_us};
use drover_protocol::error_names::{ACTIVATION_FAILED, FAILED, INVALID_ARGS};
use futures::StreamExt;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use zbus::fdo::{RequestNameFlags, RequestNameReply};
use zbus::message::{Header, Message};
use zbus::names::{ErrorName, InterfaceName, OwnedUniqueName};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, Variant, interface};

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

/// µs since the epoch (realtime) and since boot (monotonic), as BlueChi's
/// `*Timestamp` / `*TimestampMonotonic` properties.
fn now_us() -> (u64, u64) {
    (realtime_us(), monotonic_us())
}

#[derive(Default)]
struct Stamp {
    realtime: AtomicU64,
    monotonic: AtomicU64,
}

impl Stamp {
    fn set(&self, (realtime, monotonic): (u64, u64)) {
        self.realtime.store(realtime, Ordering::Relaxed);
        self.monotonic.store(monotonic, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (
            self.realtime.load(Ordering::Relaxed),
            self.monotonic.load(Ordering::Relaxed),
        )
    }
}

#[derive(Default, Clone)]
struct Texts {
    log_level: String,
    log_target: String,
    controller_address: String,
}

/// The link as the local API shows it. The link calls [`connected`],
/// [`disconnected`] and [`seen`]; the API reads it and is woken by
/// [`AgentStatus::watch`] when `Status` or `ControllerAddress` changed.
///
/// [`connected`]: AgentStatus::connected
/// [`disconnected`]: AgentStatus::disconnected
/// [`seen`]: AgentStatus::seen
pub struct AgentStatus {
    online: AtomicBool,
    disconnect: Stamp,
    seen: Stamp,
    texts: Mutex<Texts>,
    changed: watch::Sender<u64>,
}

impl Default for AgentStatus {
    fn default() -> Self {
        Self {
            online: AtomicBool::new(false),
            disconnect: Stamp::default(),
            seen: Stamp::default(),
            texts: Mutex::new(Texts {
                log_level: "INFO".into(),
                log_target: "journald".into(),
                controller_address: String::new(),
            }),
            changed: watch::channel(0).0,
        }
    }
}

impl AgentStatus {
    fn texts(&self) -> MutexGuard<'_, Texts> {
        self.texts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Registered with the manager.
    pub fn connected(&self) {
        self.seen.set(now_us());
        self.disconnect.set((0, 0));
        if !self.online.swap(true, Ordering::SeqCst) {
            self.bump();
        }
    }

    /// The session ended (or never started).
    pub fn disconnected(&self) {
        if self.online.swap(false, Ordering::SeqCst) {
            self.disconnect.set(now_us());
            self.bump();
        }
    }

    /// A frame arrived from the manager.
    pub fn seen(&self) {
        self.seen.set(now_us());
    }

    /// `online` or `offline`.
    pub fn status(&self) -> &'static str {
        if self.online.load(Ordering::SeqCst) {
            "online"
        } else {
            "offline"
        }
    }

    pub fn set_log_level(&self, level: &str) {
        self.texts().log_level = level.to_owned();
    }

    pub fn set_log_target(&self, target: &str) {
        self.texts().log_target = target.to_owned();
    }

    /// `tcp:host=H,port=P`, BlueChi's address syntax.
    pub fn set_controller(&self, host: &str, port: u16) {
        let address = format!("tcp:host={host},port={port}");
        let mut t = self.texts();
        if t.controller_address != address {
            t.controller_address = address;
            drop(t);
            self.bump();
        }
    }

    /// Woken on every change of `Status` or `ControllerAddress`.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn snapshot(&self) -> Texts {
        self.texts().clone()
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
        let key = ProxyKey::parse(&local_service_name, &node, &unit).map_err(invalid)?;
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
        local_service_name: String,
        node: String,
        unit: String,
    ) -> Result<(), LocalError> {
        let key = ProxyKey::parse(&local_service_name, &node, &unit).map_err(invalid)?;
        self.shared.proxies.remove(&key, &self.shared.outbox);
        Ok(())
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
        self.shared.status.disconnect.get().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    async fn disconnect_timestamp_monotonic(&self) -> u64 {
        self.shared.status.disconnect.get().1
    }

    /// µs (realtime) of the last frame from the manager.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn last_seen_timestamp(&self) -> u64 {
        self.shared.status.seen.get().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    async fn last_seen_timestamp_monotonic(&self) -> u64 {
        self.shared.status.seen.get().1
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

/// Why the local API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot export {AGENT_PATH}: {0}")]
    Export(zbus::Error),
    #[error("cannot own {AGENT_BUS_NAME}: {0}")]
    Name(String),
}

/// The served API; dropping it stops the `PropertiesChanged` task (the
/// object stays exported until the connection closes).
pub struct Served {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Exports the object on `conn`, owns [`AGENT_BUS_NAME`], and emits
/// `PropertiesChanged` as [`AgentStatus`] changes.
pub async fn serve(conn: &Connection, shared: Arc<Shared>) -> Result<Served, ServeError> {
    conn.object_server()
        .at(AGENT_PATH, AgentObject::new(shared.clone()))
        .await
        .map_err(ServeError::Export)?;
    // As BlueChi: take over from an older agent that allows it, let a newer
    // one take over, never wait in the queue.
    let flags = RequestNameFlags::ALLOW_REPLACEMENT
        | RequestNameFlags::REPLACE_EXISTING
        | RequestNameFlags::DO_NOT_QUEUE;
    match conn.request_name_with_flags(AGENT_BUS_NAME, flags).await {
        Ok(RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner) => {}
        Ok(other) => {
            return Err(ServeError::Name(format!(
                "the bus answered {other:?}: another owner holds it and does not allow replacement"
            )));
        }
        Err(zbus::Error::NameTaken) => {
            return Err(ServeError::Name(
                "another process owns it and does not allow replacement".into(),
            ));
        }
        Err(e) => return Err(ServeError::Name(e.to_string())),
    }
    tracing::info!("serving {AGENT_BUS_NAME} at {AGENT_PATH}");
    let (c1, c2) = (conn.clone(), conn.clone());
    let task = tokio::spawn(async move {
        tokio::join!(announce_changes(c1, shared), watch_name(c2));
    });
    Ok(Served { task })
}

/// Says so when a newer agent takes the name over (we allowed it): proxy
/// units on this node then talk to that one.
async fn watch_name(conn: Connection) {
    let lost = async {
        let dbus = zbus::fdo::DBusProxy::new(&conn).await?;
        let mut lost = dbus.receive_name_lost().await?;
        while let Some(signal) = lost.next().await {
            if signal.args().is_ok_and(|a| a.name() == AGENT_BUS_NAME) {
                tracing::error!(
                    "another process took over {AGENT_BUS_NAME}; the proxy helper on this node no longer reaches this agent"
                );
            }
        }
        Ok::<(), zbus::Error>(())
    };
    if let Err(e) = lost.await {
        tracing::debug!("cannot watch for the loss of {AGENT_BUS_NAME}: {e}");
    }
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
