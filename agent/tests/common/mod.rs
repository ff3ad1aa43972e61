//! The agent's own harness, built on drover-testkit: a real `systemd --user` node
//! ([`SystemdNode`]), the agent's dispatcher on it with an outbox the test reads
//! ([`dispatcher`], [`Rig`]), and the whole agent running in-process below a
//! [`FakeManager`] ([`InProcessAgent`]). Everything is torn down in `Drop`, also when a
//! test fails.

#![allow(dead_code, unused_imports)]

pub use drover_testkit::agent::{node_name, unit_name};
pub use drover_testkit::manager::{FakeManager, ManagerSession};
pub use drover_testkit::node::SystemdNode;
use drover_testkit::wait::poll;

use drover_agent::agent::AgentError;
use drover_agent::connection::LinkConfig;
use drover_agent::deps::dep_unit::unit_status;
use drover_agent::dispatch::Dispatcher;
use drover_agent::fanout::pump_events;
use drover_agent::link::outbox::SessionKill;
use drover_agent::state::Shared;
use drover_agent::systemd::api::Systemd;
use drover_agent::systemd::dbus::ZbusSystemd;
use drover_bus::Bus;
use drover_protocol::{RemoteError, Request, Response, ToManager};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The agent's systemd client on the node's bus.
pub async fn systemd(node: &SystemdNode) -> ZbusSystemd {
    ZbusSystemd::connect(&Bus::Address(node.bus_address()))
        .await
        .expect("systemd answers")
}

/// `unit`'s ActiveState, as the agent reads it.
pub async fn active_state(systemd: &ZbusSystemd, unit: &str) -> String {
    unit_status(systemd, unit).await.unwrap().active_state
}

/// Waits up to `timeout` until `unit` is `want` (looked at every 20 ms).
pub async fn wait_state(systemd: &ZbusSystemd, unit: &str, want: &str, timeout: Duration) {
    let every = Duration::from_millis(20);
    let what = format!("{unit} to be {want}");
    let res = poll(timeout, every, &what, || async {
        active_state(systemd, unit).await == want
    });
    if let Err(e) = res.await {
        panic!("{e:#}: it is {}", active_state(systemd, unit).await);
    }
}

/// A dispatcher on the node's real systemd (events pumped into it), with session 1's
/// outbox open and handed to the test. `configure` sets up the shared state first.
pub async fn dispatcher(
    node: &SystemdNode,
    configure: impl FnOnce(&Shared),
) -> (Arc<Dispatcher<ZbusSystemd>>, mpsc::Receiver<ToManager>) {
    let systemd = Arc::new(systemd(node).await);
    let shared = Arc::new(Shared::default());
    configure(&shared);
    let events = systemd.subscribe().await.unwrap();
    tokio::spawn(pump_events(events, shared.clone(), systemd.clone()));
    let (tx, rx) = mpsc::channel(256);
    shared.outbox.open(1, tx, SessionKill::new());
    (Arc::new(Dispatcher::new(systemd, shared)), rx)
}

/// The next message for the manager within `timeout`.
pub async fn next_within(rx: &mut mpsc::Receiver<ToManager>, timeout: Duration) -> ToManager {
    tokio::time::timeout(timeout, rx.recv())
        .await
        .expect("message in time")
        .expect("open")
}

/// A [`dispatcher`] that a test asks as the manager would, one request at a time.
pub struct Rig {
    pub systemd: Arc<ZbusSystemd>,
    pub dispatcher: Arc<Dispatcher<ZbusSystemd>>,
    pub rx: mpsc::Receiver<ToManager>,
    next_id: u64,
    timeout: Duration,
}

impl Rig {
    pub async fn start(
        node: &SystemdNode,
        timeout: Duration,
        configure: impl FnOnce(&Shared),
    ) -> Rig {
        let systemd = Arc::new(systemd(node).await);
        let (dispatcher, rx) = dispatcher(node, configure).await;
        Rig {
            systemd,
            dispatcher,
            rx,
            next_id: 0,
            timeout,
        }
    }

    /// Sends `req` as the manager would and returns its one reply (other messages
    /// skipped).
    pub async fn ask(&mut self, req: Request) -> Result<Response, RemoteError> {
        self.next_id += 1;
        let id = self.next_id;
        tokio::time::timeout(self.timeout, self.dispatcher.handle(1, id, req))
            .await
            .expect("the request finishes in time");
        loop {
            match tokio::time::timeout(self.timeout, self.rx.recv()).await {
                Ok(Some(ToManager::Reply { id: got, result })) if got == id => return result,
                Ok(Some(_)) => continue,
                other => panic!("no reply: {other:?}"),
            }
        }
    }

    pub async fn active_state(&self, unit: &str) -> String {
        active_state(&self.systemd, unit).await
    }

    pub async fn wait_state(&self, unit: &str, want: &str) {
        wait_state(&self.systemd, unit, want, self.timeout).await;
    }
}

/// The whole agent (`drover_agent::agent::run`) in-process on a node, linked to a manager
/// on 127.0.0.1:`port`, heartbeats every 100 ms. Dropping it aborts the agent.
pub struct InProcessAgent {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AgentError>>,
}

impl InProcessAgent {
    /// Starts the agent as node `name`; `on_ready` runs once it is connected to systemd.
    pub fn start(
        node: &SystemdNode,
        name: &str,
        port: u16,
        on_ready: impl FnOnce() + Send + 'static,
    ) -> InProcessAgent {
        let mut link = LinkConfig::new(node_name(name), "127.0.0.1", port);
        link.heartbeat_interval = Duration::from_millis(100);
        let shutdown = CancellationToken::new();
        let bus = Bus::Address(node.bus_address());
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { drover_agent::agent::run(&bus, link, shutdown, on_ready).await }
        });
        InProcessAgent { shutdown, task }
    }

    /// A clean stop (`systemctl stop drover-agent`): must end without error in `timeout`.
    pub async fn stop(mut self, timeout: Duration) {
        self.shutdown.cancel();
        let ended = tokio::time::timeout(timeout, &mut self.task)
            .await
            .expect("agent stops")
            .unwrap();
        assert!(ended.is_ok(), "{ended:?}");
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
    }
}
