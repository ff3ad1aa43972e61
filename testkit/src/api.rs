//! The manager's public D-Bus API (BlueChi's), seen from a client: names and paths (and
//! the typed members, `drover_bus::client`, shared with droverctl), an
//! [`Api`] connection with calls, properties, introspection and signal streams,
//! [`JobWatch`] for a job's `JobNew`/`JobRemoved`, and [`Inbox`] for the unicast signals
//! of monitors. Everything panics with a clear message on what a test does not expect;
//! calls that a test checks for errors return `zbus::Result`.

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;
use zbus::message::Message;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

use crate::wait::WAIT;

/// BlueChi's names (bus, objects, interfaces) and drover's extensions on the same
/// objects, as the manager serves them: from drover-bus, where they are written once.
pub use drover_bus::bluechi::{
    BUS_NAME, CONTROLLER_IFACE, CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, DROVER_MONITOR_IFACE,
    JOB_IFACE, METRICS_IFACE, METRICS_PATH, MONITOR_IFACE, NODE_IFACE,
};
/// The API as a client declares it, once for droverctl and the tests.
pub use drover_bus::client::{ControllerProxy, JobNewStream, JobRemovedStream, NodeTuple};
/// One row of `ListUnits` (`(ssssssouso)`), as systemd and the manager send it.
pub use drover_bus::systemd::UnitTuple;

/// The standard interfaces every object has.
pub use drover_bus::bus::PROPERTIES_IFACE;
pub const INTROSPECTABLE_IFACE: &str = "org.freedesktop.DBus.Introspectable";

/// A new connection to the bus at `address`.
pub async fn connect(address: &str) -> Connection {
    zbus::connection::Builder::address(address)
        .build()
        .await
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"))
}

/// The user tests take as "not root": `nobody`.
pub const NOBODY: u32 = 65534;

/// A new connection to the bus at `address` (`unix:path=…`) as user `uid`, not root: the
/// bus sees `uid` as the caller (`GetConnectionUnixUser`) and this process's PID. Only
/// the connecting thread changes its effective uid, for the `connect(2)` alone (the
/// kernel records the peer's credentials then), so the test process stays root. The bus
/// must let other users in ([`drover_sandbox::PrivateBus::start_open`]).
pub async fn connect_as(address: &str, uid: u32) -> Connection {
    let path = address
        .strip_prefix("unix:path=")
        .unwrap_or_else(|| panic!("connect_as needs a unix:path= address, not {address}"))
        .to_owned();
    let stream = std::thread::spawn(move || {
        let set_euid = |euid: u32| {
            // SAFETY: a raw setresuid(-1, euid, -1) changes the credentials of this
            // thread only (glibc's wrapper would change every thread's); the real and
            // saved uids stay 0, so the thread can switch back. It touches no memory.
            #[allow(unsafe_code)]
            let rc = unsafe {
                nix::libc::syscall(
                    nix::libc::SYS_setresuid,
                    -1 as nix::libc::c_long,
                    nix::libc::c_long::from(euid),
                    -1 as nix::libc::c_long,
                )
            };
            assert_eq!(
                rc,
                0,
                "setresuid(-1, {euid}, -1): {}",
                std::io::Error::last_os_error()
            );
        };
        set_euid(uid);
        let stream = std::os::unix::net::UnixStream::connect(&path);
        set_euid(0);
        stream.unwrap_or_else(|e| panic!("connecting to {path} as uid {uid}: {e}"))
    })
    .join()
    .expect("the connecting thread panicked");
    zbus::connection::Builder::unix_stream(stream)
        .user_id(uid)
        .build()
        .await
        .unwrap_or_else(|e| panic!("authenticating to {address} as uid {uid}: {e}"))
}

/// A client of the manager's API: one connection to its bus.
#[derive(Clone)]
pub struct Api {
    pub conn: Connection,
}

impl Api {
    /// A new client connection to the manager's bus at `address`.
    pub async fn connect(address: &str) -> Api {
        Api {
            conn: connect(address).await,
        }
    }

    /// This connection's unique bus name (`:1.42`).
    pub fn unique_name(&self) -> String {
        self.conn
            .unique_name()
            .expect("a connection to a bus has a unique name")
            .to_string()
    }

    /// A proxy of `iface` at `path` on the manager.
    pub async fn proxy(&self, path: &str, iface: &'static str) -> zbus::Proxy<'static> {
        zbus::Proxy::new(&self.conn, BUS_NAME, path.to_owned(), iface)
            .await
            .unwrap_or_else(|e| panic!("proxy {iface} at {path}: {e}"))
    }

    pub async fn controller(&self) -> zbus::Proxy<'static> {
        self.proxy(CONTROLLER_PATH, CONTROLLER_IFACE).await
    }

    /// The controller as the shared client declaration (`drover_bus::client`) types it.
    pub async fn typed_controller(&self) -> ControllerProxy<'static> {
        ControllerProxy::new(&self.conn)
            .await
            .unwrap_or_else(|e| panic!("controller proxy: {e}"))
    }

    /// `Controller.GetNode(name)`.
    pub async fn get_node(&self, name: &str) -> zbus::Result<OwnedObjectPath> {
        self.typed_controller().await.get_node(name).await
    }

    /// The `Node` object of `name`, found with `Controller.GetNode`.
    pub async fn node(&self, name: &str) -> zbus::Proxy<'static> {
        let path = self.get_node(name).await;
        let path = path.unwrap_or_else(|e| panic!("GetNode({name}): {e}"));
        self.proxy(path.as_str(), NODE_IFACE).await
    }

    /// Calls `iface.method(body)` at `path` on the manager.
    pub async fn call<B, R>(
        &self,
        path: &str,
        iface: &str,
        method: &str,
        body: &B,
    ) -> zbus::Result<R>
    where
        B: serde::Serialize + zbus::DynamicType,
        R: for<'d> serde::Deserialize<'d> + zbus::Type,
    {
        let reply = self
            .conn
            .call_method(Some(BUS_NAME), path, Some(iface), method, body)
            .await?;
        reply.body().deserialize::<R>()
    }

    /// A property, read with `Properties.Get` each time (no cache).
    pub async fn get_property<R>(&self, path: &str, iface: &str, name: &str) -> R
    where
        R: TryFrom<OwnedVariant>,
        <R as TryFrom<OwnedVariant>>::Error: std::fmt::Debug,
    {
        let v: OwnedVariant = self
            .call(path, PROPERTIES_IFACE, "Get", &(iface, name))
            .await
            .unwrap_or_else(|e| panic!("Get {iface}.{name} at {path}: {e}"));
        R::try_from(v).unwrap_or_else(|e| panic!("{iface}.{name} has another type: {e:?}"))
    }

    /// The introspection XML of `path`.
    pub async fn introspect(&self, path: &str) -> String {
        self.call(path, INTROSPECTABLE_IFACE, "Introspect", &())
            .await
            .unwrap_or_else(|e| panic!("Introspect {path}: {e}"))
    }

    /// A stream of the signals of `interface` at `path` (subscribed when this returns).
    pub async fn signals(&self, path: &str, interface: &str) -> MessageStream {
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(path)
            .interface(interface)
            .build()
            .expect("match rule")
            .to_owned();
        MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .unwrap_or_else(|e| panic!("subscribing to {interface} at {path}: {e}"))
    }

    /// `Controller.ListNodes` as (name, status, peer ip).
    pub async fn list_nodes(&self) -> Vec<(String, String, String)> {
        let nodes: Vec<NodeTuple> = self
            .typed_controller()
            .await
            .list_nodes()
            .await
            .expect("ListNodes");
        nodes
            .into_iter()
            .map(|(name, _, status, ip)| (name, status, ip))
            .collect()
    }

    /// A [`JobWatch`] on this connection (subscribed when this returns).
    pub async fn jobs(&self) -> JobWatch {
        JobWatch::new(&self.conn).await
    }

    /// Every message this connection receives from now on.
    pub fn inbox(&self) -> Inbox {
        Inbox(MessageStream::from(self.conn.clone()))
    }
}

/// Next signal from `stream` within [`WAIT`], as (member, message).
pub async fn next_signal(stream: &mut MessageStream) -> (String, Message) {
    let msg = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a signal within the wait time")
        .expect("stream open")
        .expect("valid message");
    let member = msg
        .header()
        .member()
        .map(|m| m.to_string())
        .unwrap_or_default();
    (member, msg)
}

/// The string value of `key` in a `PropertiesChanged` signal, if it carries one.
pub fn changed_value(msg: &Message, key: &str) -> Option<String> {
    let (_iface, changed, _inv): (String, HashMap<String, OwnedVariant>, Vec<String>) =
        msg.body().deserialize().ok()?;
    changed
        .get(key)
        .and_then(|v| String::try_from(v.clone()).ok())
}

/// Waits for a `PropertiesChanged` on `stream` that sets `key` to `want`.
pub async fn wait_changed(stream: &mut MessageStream, key: &str, want: &str) {
    loop {
        let (member, msg) = next_signal(stream).await;
        if member == "PropertiesChanged" && changed_value(&msg, key).as_deref() == Some(want) {
            return;
        }
    }
}

/// Asserts that `text` (introspection XML, say) contains every one of `needles`; a
/// failure names `what` and shows the text.
pub fn assert_mentions(text: &str, what: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{what} lacks {needle}:\n{text}");
    }
}

/// The D-Bus error name of a call that must fail; panics if it succeeded.
pub fn error_name<T: std::fmt::Debug>(res: zbus::Result<T>) -> String {
    match res {
        Ok(v) => panic!("the call must fail, it returned {v:?}"),
        Err(e) => error_of(&e).0,
    }
}

/// D-Bus error name and message of a failed call; panics on any other failure.
pub fn error_of(e: &zbus::Error) -> (String, String) {
    use zbus::DBusError;
    match e {
        zbus::Error::MethodError(name, desc, _) => {
            (name.to_string(), desc.clone().unwrap_or_default())
        }
        zbus::Error::FDO(e) => (
            e.name().to_string(),
            e.description().unwrap_or_default().to_owned(),
        ),
        other => panic!("not a D-Bus error reply: {other}"),
    }
}

/// Calls `Node.<method>(unit, "replace")` and returns the job path.
pub async fn job_call(node: &zbus::Proxy<'_>, method: &str, unit: &str) -> zbus::Result<String> {
    let path: OwnedObjectPath = node.call(method, &(unit, "replace")).await?;
    Ok(path.to_string())
}

/// One `JobRemoved` signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRemoved {
    pub id: u32,
    pub path: String,
    pub node: String,
    pub unit: String,
    pub result: String,
}

/// The Controller's `JobNew` and `JobRemoved`, subscribed *before* the caller starts jobs.
pub struct JobWatch {
    removed: JobRemovedStream,
    new: JobNewStream,
}

impl JobWatch {
    pub async fn new(conn: &Connection) -> Self {
        let ctl = ControllerProxy::new(conn).await.expect("controller proxy");
        let removed = ctl.receive_job_removed().await.expect("match JobRemoved");
        let new = ctl.receive_job_new().await.expect("match JobNew");
        Self { removed, new }
    }

    /// Waits for the `JobNew` of `path`; returns the job id.
    pub async fn job_new(&mut self, path: &str, timeout: Duration) -> Result<u32> {
        tokio::time::timeout(timeout, async {
            while let Some(signal) = self.new.next().await {
                let args = signal.args()?;
                if args.job.as_str() == path {
                    return Ok(args.id);
                }
            }
            bail!("signal stream ended")
        })
        .await
        .with_context(|| format!("no JobNew for {path} within {timeout:?}"))?
    }

    /// Waits for the `JobRemoved` of `path`.
    pub async fn removed(&mut self, path: &str, timeout: Duration) -> Result<JobRemoved> {
        tokio::time::timeout(timeout, async {
            while let Some(signal) = self.removed.next().await {
                let args = signal.args()?;
                if args.job.as_str() == path {
                    return Ok(JobRemoved {
                        id: args.id,
                        path: args.job.to_string(),
                        node: args.node.to_owned(),
                        unit: args.unit.to_owned(),
                        result: args.result.to_owned(),
                    });
                }
            }
            bail!("signal stream ended")
        })
        .await
        .with_context(|| format!("no JobRemoved for {path} within {timeout:?}"))?
    }

    /// The job at `path` is announced (`JobNew`), then removed for `unit` on `node` with
    /// `result`, and no second `JobRemoved` follows within `quiet`; returns its id.
    pub async fn ends_once(
        &mut self,
        path: &str,
        (node, unit, result): (&str, &str, &str),
        timeout: Duration,
        quiet: Duration,
    ) -> u32 {
        let id = self.job_new(path, timeout).await.expect("JobNew");
        let removed = self.removed(path, timeout).await.expect("JobRemoved");
        let path = path.to_owned();
        let (node, unit, result) = (node.into(), unit.into(), result.into());
        let want = JobRemoved {
            id,
            path: path.clone(),
            node,
            unit,
            result,
        };
        assert_eq!(removed, want);
        self.no_more_removed(&path, quiet)
            .await
            .expect("no second JobRemoved");
        id
    }

    /// No further `JobRemoved` for `path` within `quiet` (every job ends exactly once).
    pub async fn no_more_removed(&mut self, path: &str, quiet: Duration) -> Result<()> {
        let res = tokio::time::timeout(quiet, async {
            while let Some(signal) = self.removed.next().await {
                if signal.args().ok()?.job.as_str() == path {
                    return Some(());
                }
            }
            None
        })
        .await;
        match res {
            Ok(Some(())) => bail!("a second JobRemoved arrived for {path}"),
            _ => Ok(()),
        }
    }
}

/// Every message one connection receives, with no match rule: how a monitor's owner and
/// peers get its signals, which the manager sends to them by name (unicast).
pub struct Inbox(MessageStream);

impl Inbox {
    /// The next signal of `iface` within [`WAIT`], as (member, message); other messages
    /// are skipped.
    pub async fn next(&mut self, iface: &str) -> (String, Message) {
        loop {
            let msg = tokio::time::timeout(WAIT, self.0.next())
                .await
                .unwrap_or_else(|_| panic!("no {iface} signal within {WAIT:?}"))
                .expect("stream open")
                .expect("valid message");
            let h = msg.header();
            if h.message_type() == zbus::message::Type::Signal
                && h.interface().is_some_and(|i| i.as_str() == iface)
            {
                let member = h.member().map(|m| m.to_string()).unwrap_or_default();
                return (member, msg.clone());
            }
        }
    }

    /// The next message of any kind within [`WAIT`].
    pub async fn next_message(&mut self) -> Message {
        tokio::time::timeout(WAIT, self.0.next())
            .await
            .expect("a message within the wait time")
            .expect("stream open")
            .expect("valid message")
    }

    /// True if no signal of `iface` arrives within `ms` milliseconds.
    pub async fn quiet(&mut self, iface: &str, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), self.next(iface))
            .await
            .is_err()
    }
}
