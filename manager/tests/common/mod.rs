//! The manager's own harness: a `Manager` running in-process on a private dbus-daemon,
//! reached by fake agents over loopback TCP and by API clients on that bus. The fakes,
//! the API client and the waits come from `drover-testkit`; only what needs the manager's
//! internals (its config, its timeouts, the in-process `Manager`) lives here. Everything
//! is torn down in `Drop`, also when a test fails.

#![allow(dead_code, unused_imports)]

pub use drover_testkit::agent::{
    Behavior, FakeAgent, never_reply, node_name, reply_empty, reply_with, unit_name,
};
pub use drover_testkit::api::{
    Api, BUS_NAME, CONTROLLER_IFACE, CONTROLLER_PATH as CONTROLLER, DROVER_CONTROLLER_IFACE,
    DROVER_MONITOR_IFACE, INTROSPECTABLE_IFACE, Inbox, JOB_IFACE, METRICS_IFACE, METRICS_PATH,
    MONITOR_IFACE, NODE_IFACE, PROPERTIES_IFACE, UnitTuple, error_name, error_of, next_signal,
    wait_changed,
};
pub use drover_testkit::wait::WAIT;

use drover_config::ManagerConfig;
use drover_manager::nodes::listener;
use drover_manager::{Manager, Timeouts};
use drover_sandbox::PrivateBus;
use drover_testkit::process::{TempDir, free_port};
use std::net::SocketAddr;
use std::ops::Deref;
use std::time::Duration;

pub const INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";

/// A private `dbus-daemon` for a manager test; every local user may connect
/// (tests of what a non-root client may do use `drover_testkit::api::connect_as`).
pub fn test_bus() -> PrivateBus {
    PrivateBus::start_open("drover-manager-test").expect("private dbus-daemon")
}

/// A config allowing `nodes`, with fast heartbeats (100 ms, threshold 1 s).
pub fn config(nodes: &[&str]) -> ManagerConfig {
    ManagerConfig {
        allowed_nodes: nodes.iter().map(|n| node_name(n)).collect(),
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
        ..Timeouts::default()
    }
}

/// What a test of the `drover-manager` binary needs around it: a private bus, a free
/// port, and a temp dir holding its config file `manager.conf` (and its log), all gone
/// on drop.
pub struct BinarySetup {
    pub bus: PrivateBus,
    pub port: u16,
    pub tmp: TempDir,
    pub conf: std::path::PathBuf,
}

impl BinarySetup {
    pub fn new(conf: &str) -> BinarySetup {
        let tmp = TempDir::new("drover-manager-bin");
        BinarySetup {
            bus: test_bus(),
            port: free_port(),
            conf: tmp.file("manager.conf", conf),
            tmp,
        }
    }

    /// A fresh `manager.log` in the temp dir, for the manager's stderr.
    pub fn log(&self) -> std::fs::File {
        std::fs::File::create(self.tmp.join("manager.log")).expect("log file")
    }

    /// What the manager logged so far.
    pub fn logged(&self) -> String {
        self.tmp.read("manager.log")
    }
}

/// A manager on a private bus, plus an API client on that bus (what the fixture
/// dereferences to: `f.call(…)`, `f.get_property(…)`, `f.signals(…)`).
pub struct Fixture {
    pub manager: Option<Manager>,
    pub api: Api,
    /// Where agents connect.
    pub addr: SocketAddr,
    // Last: the bus outlives the connections above.
    pub bus: PrivateBus,
}

impl Fixture {
    pub async fn start(config: ManagerConfig) -> Self {
        Self::start_with(config, fast_timeouts()).await
    }

    pub async fn start_with(config: ManagerConfig, timeouts: Timeouts) -> Self {
        let bus = test_bus();
        let listener = listener::bind(Some("127.0.0.1".parse().expect("ip")), 0).expect("bind");
        let on = drover_manager::Bus::Address(bus.address().to_string());
        let manager = Manager::start(config, &on, listener, timeouts)
            .await
            .expect("manager starts");
        let addr = manager.local_addr();
        let api = Api::connect(bus.address()).await;
        Self {
            manager: Some(manager),
            api,
            addr,
            bus,
        }
    }

    /// A fake agent registered as `name`, answering as `behavior` says.
    pub async fn agent(&self, name: &str, behavior: Behavior) -> FakeAgent {
        FakeAgent::connect(self.addr, name, behavior)
            .await
            .expect("agent is accepted")
    }

    /// Another client connection to the manager's bus.
    pub async fn client(&self) -> Api {
        Api::connect(self.bus.address()).await
    }

    pub fn manager(&self) -> &Manager {
        self.manager.as_ref().expect("manager running")
    }

    /// True once the job object at `path` is no longer served (polled: it is
    /// unexported right after its JobRemoved).
    pub async fn introspect_job_gone(&self, path: &str) -> bool {
        for _ in 0..50 {
            let got: zbus::Result<zbus::OwnedVariant> = self
                .call(path, PROPERTIES_IFACE, "Get", &(JOB_IFACE, "Id"))
                .await;
            if got.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

impl Deref for Fixture {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}
