//! Test harness: a private dbus-daemon, a manager running in-process on it,
//! fake agents speaking drover's protocol over loopback TCP, and a zbus
//! client. Everything started here is torn down in `Drop`, also when a test
//! fails.

#![allow(dead_code)]

use drover_config::ManagerConfig;
use drover_manager::{Manager, Timeouts, listener};
use drover_protocol::handshake::Accepted;
use drover_protocol::link::{HandshakeError, agent_handshake};
use drover_protocol::{Hello, NodeName, Request, ToAgent, ToManager};
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zbus::{Connection, MessageStream};

pub const WAIT: Duration = Duration::from_secs(5);
pub const BUS_NAME: &str = "org.eclipse.bluechi";
pub const CONTROLLER: &str = "/org/eclipse/bluechi";

/// The private `dbus-daemon` every manager test runs on.
pub use drover_sandbox::PrivateBus as TestBus;

/// Starts a [`TestBus`].
pub fn test_bus() -> TestBus {
    TestBus::start("drover-manager-test").expect("private dbus-daemon")
}

pub fn config(nodes: &[&str]) -> ManagerConfig {
    ManagerConfig {
        allowed_nodes: nodes
            .iter()
            .map(|n| NodeName::new(*n).expect("test node name"))
            .collect(),
        heartbeat_interval_ms: 100,
        node_heartbeat_threshold_ms: 1000,
        ..ManagerConfig::default()
    }
}

pub fn fast_timeouts() -> Timeouts {
    Timeouts {
        request: Duration::from_secs(2),
        handshake: Duration::from_millis(300),
        fanout: Duration::from_secs(1),
    }
}

/// A manager on a private bus, plus a client connection to that bus.
pub struct Fixture {
    pub manager: Option<Manager>,
    pub client: Connection,
    pub addr: SocketAddr,
    // Last: the bus outlives the connections above.
    pub bus: TestBus,
}

impl Fixture {
    pub async fn start(config: ManagerConfig) -> Self {
        Self::start_with(config, fast_timeouts()).await
    }

    pub async fn start_with(config: ManagerConfig, timeouts: Timeouts) -> Self {
        let bus = test_bus();
        let listener = listener::bind(Some("127.0.0.1".parse().expect("ip")), 0).expect("bind");
        let manager = Manager::start(
            config,
            &drover_manager::Bus::Address(bus.address().to_string()),
            listener,
            timeouts,
        )
        .await
        .expect("manager starts");
        let addr = manager.local_addr();
        let client = zbus::connection::Builder::address(bus.address())
            .build()
            .await
            .expect("client connects");
        Self {
            manager: Some(manager),
            client,
            addr,
            bus,
        }
    }

    pub async fn agent(&self, name: &str, behavior: Behavior) -> FakeAgent {
        FakeAgent::connect(self.addr, name, behavior)
            .await
            .expect("agent is accepted")
    }

    /// Calls a method on the manager and deserializes the reply.
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
            .client
            .call_method(Some(BUS_NAME), path, Some(iface), method, body)
            .await?;
        reply.body().deserialize::<R>()
    }

    pub async fn get_property<R>(&self, path: &str, iface: &str, name: &str) -> R
    where
        R: TryFrom<zbus::OwnedVariant>,
        <R as TryFrom<zbus::OwnedVariant>>::Error: std::fmt::Debug,
    {
        let v: zbus::OwnedVariant = self
            .call(
                path,
                "org.freedesktop.DBus.Properties",
                "Get",
                &(iface, name),
            )
            .await
            .expect("property get");
        R::try_from(v).expect("property type")
    }

    pub async fn introspect(&self, path: &str) -> String {
        self.call(
            path,
            "org.freedesktop.DBus.Introspectable",
            "Introspect",
            &(),
        )
        .await
        .expect("introspect")
    }

    /// A stream of signals on `path` with `interface`.
    pub async fn signals(&self, path: &str, interface: &str) -> MessageStream {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(path)
            .interface(interface)
            .build()
            .expect("match rule")
            .to_owned();
        MessageStream::for_match_rule(rule, &self.client, None)
            .await
            .expect("subscribe")
    }

    /// True once the job object at `path` is no longer served (polled: it is
    /// unexported right after its JobRemoved).
    pub async fn introspect_job_gone(&self, path: &str) -> bool {
        for _ in 0..50 {
            let got: zbus::Result<zbus::OwnedVariant> = self
                .call(
                    path,
                    "org.freedesktop.DBus.Properties",
                    "Get",
                    &("org.eclipse.bluechi.Job", "Id"),
                )
                .await;
            if got.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn manager(&self) -> &Manager {
        self.manager.as_ref().expect("manager running")
    }
}

/// Next signal from `stream` within [`WAIT`], as (member, message).
pub async fn next_signal(stream: &mut MessageStream) -> (String, zbus::message::Message) {
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

/// The `Status` value of a PropertiesChanged signal, if it carries one.
pub fn changed_status(msg: &zbus::message::Message, key: &str) -> Option<String> {
    let (_iface, changed, _inv): (
        String,
        std::collections::HashMap<String, zbus::OwnedVariant>,
        Vec<String>,
    ) = msg.body().deserialize().ok()?;
    changed
        .get(key)
        .and_then(|v| String::try_from(v.clone()).ok())
}

/// Waits for a PropertiesChanged carrying `key` = `want`.
pub async fn wait_status(stream: &mut MessageStream, key: &str, want: &str) {
    loop {
        let (member, msg) = next_signal(stream).await;
        if member == "PropertiesChanged" && changed_status(&msg, key).as_deref() == Some(want) {
            return;
        }
    }
}

/// D-Bus error name and message of a failed call.
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

/// What a fake agent answers to a request: messages to send back, in order.
pub type Behavior = Arc<dyn Fn(u64, &Request) -> Vec<ToManager> + Send + Sync>;

pub fn reply_empty() -> Behavior {
    Arc::new(|id, _| {
        vec![ToManager::Reply {
            id,
            result: Ok(drover_protocol::Response::Empty),
        }]
    })
}

pub fn never_reply() -> Behavior {
    Arc::new(|_, _| Vec::new())
}

/// An agent that speaks drover's protocol with scripted answers.
pub struct FakeAgent {
    task: JoinHandle<()>,
    pub requests: Arc<Mutex<Vec<Request>>>,
    /// One-way notices from the manager (proxies), in arrival order.
    pub notices: Arc<Mutex<Vec<drover_protocol::Notice>>>,
    pub accepted: Accepted,
    inject: mpsc::Sender<Injected>,
    /// Stops heartbeats (a hung agent).
    pub silent: Arc<AtomicBool>,
}

pub enum Injected {
    Message(ToManager),
    /// Raw bytes straight onto the socket (breaks the framing on purpose).
    Raw(Vec<u8>),
}

impl FakeAgent {
    pub async fn connect(
        addr: SocketAddr,
        name: &str,
        behavior: Behavior,
    ) -> Result<Self, HandshakeError> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| HandshakeError::Frame(e.into()))?;
        let (framed, accepted) = agent_handshake(stream, &Hello::new(name, "fake"), WAIT).await?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let notices = Arc::new(Mutex::new(Vec::new()));
        let silent = Arc::new(AtomicBool::new(false));
        let (inject, mut injected) = mpsc::channel::<Injected>(64);
        let task = {
            let requests = requests.clone();
            let notices = notices.clone();
            let silent = silent.clone();
            tokio::spawn(async move {
                let mut framed = framed;
                let mut beat = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tokio::select! {
                        frame = framed.next() => match frame {
                            Some(Ok(ToAgent::Request { id, body })) => {
                                let answers = behavior(id, &body);
                                requests.lock().expect("requests").push(body);
                                for answer in answers {
                                    if framed.send(answer).await.is_err() { return; }
                                }
                            }
                            Some(Ok(ToAgent::Heartbeat)) => {}
                            Some(Ok(ToAgent::Notice(n))) => notices.lock().expect("notices").push(n),
                            _ => return,
                        },
                        msg = injected.recv() => match msg {
                            Some(Injected::Message(m)) => { if framed.send(m).await.is_err() { return; } }
                            Some(Injected::Raw(bytes)) => {
                                use tokio::io::AsyncWriteExt;
                                if framed.get_mut().write_all(&bytes).await.is_err() { return; }
                            }
                            None => return,
                        },
                        _ = beat.tick() => {
                            if !silent.load(Ordering::Relaxed) && framed.send(ToManager::Heartbeat).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            })
        };
        Ok(Self {
            task,
            requests,
            notices,
            accepted,
            inject,
            silent,
        })
    }

    pub async fn send(&self, msg: ToManager) {
        self.inject
            .send(Injected::Message(msg))
            .await
            .expect("agent task alive");
    }

    pub async fn send_raw(&self, bytes: Vec<u8>) {
        self.inject
            .send(Injected::Raw(bytes))
            .await
            .expect("agent task alive");
    }

    pub fn request_count(&self) -> usize {
        self.requests.lock().expect("requests").len()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}
