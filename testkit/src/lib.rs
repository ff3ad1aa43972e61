//! drover-testkit: the one place test fixtures live, so that a new test is a few lines.
//!
//! **Why a crate of its own, and not a module of `drover-sandbox`.** The sandbox is a
//! product: `drover-sandbox up` is how people try drover on one machine, and its library
//! is what a cluster *is* (nodes, cgroups, teardown). Fixtures are something else: they
//! panic with a test's message instead of returning errors, and they contain fakes of
//! drover's own processes (an agent and a manager speaking the wire protocol, a
//! `droverctl` driver). Kept here they never reach a shipped binary or its dependency
//! tree. This crate depends on `drover-sandbox` and the contract crates (`drover-protocol`,
//! `drover-bus`) only, never on the manager, agent or CLI crates, so every crate may take it
//! as a dev-dependency without a cycle; a fixture that needs a crate's internals (the manager running in-process, the
//! agent's dispatcher) stays in that crate's test helpers (such as `manager/tests/common/`) and is built from these parts.
//!
//! A test against real systemd nodes, start to end:
//!
//! ```no_run
//! use drover_testkit::prelude::*;
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn web_starts_on_node2() {
//!     let c = TestCluster::with_units(2, &[("node2", "web.service", SLEEPER)]).await;
//!     let out = c.ctl_ok(&["start", "node2", "web"]).await;
//!     assert!(out.contains("StartUnit operation result: done"), "{out}");
//!     assert_eq!(c.state("node2", "web.service").await, "active");
//!     c.down().await;
//! }
//! ```
//!
//! Modules, one concept each:
//! * [`cluster`]: [`TestCluster`], a sandbox cluster of real `systemd --user` nodes with
//!   the calls tests make on it (start it with units, `systemctl`, a unit's state now,
//!   later or all along, node status, `droverctl`, an API client or monitor);
//! * [`api`]: the manager's public D-Bus API as a client: names, proxies, calls,
//!   properties, introspection, signals, [`api::JobWatch`] (a job's `JobNew` and
//!   `JobRemoved`), [`api::Inbox`] (a monitor's unicast signals), error names;
//! * [`monitor`]: a monitor followed over D-Bus, with every event ([`monitor::Ev`]) it got;
//! * [`flood`]: [`flood::Flood`], thousands of half-open TLS handshakes from many loopback
//!   addresses, reopened as the manager closes them (the admission tests and `drover-bench flood`);
//! * [`forge`]: [`forge::Forger`], an unprivileged local user sending signals to one
//!   connection (the attacks of the signal tests);
//! * [`etcd`]: [`etcd::Etcd`], a real single-member etcd on loopback ports (HA tests);
//! * [`etcd_cluster`]: [`etcd_cluster::EtcdCluster`], a real etcd of several members on loopback;
//! * [`relay`]: [`relay::Relay`], a TCP relay whose path can be cut (a partition of one client);
//! * [`ha`]: [`ha::HaManager`], a real manager of an HA group on its own bus, like
//!   another host, with what the HA tests read of it (`Leading`, `Epoch`, its log);
//! * [`http`]: a plain HTTP client for the metrics endpoint and Prometheus's API;
//! * [`ctl`]: `droverctl` runs and followed runs (`monitor`, `status -w`) read line by line;
//! * [`agent`]: [`FakeAgent`], a scripted agent that speaks drover's wire protocol to a
//!   real manager (handshake, heartbeats, answers, events), and the messages it sends;
//! * [`manager`]: [`FakeManager`], the other end: accepts a real agent's connections;
//! * [`node`]: [`SystemdNode`], one `systemd --user` node on its own, for agent tests;
//! * [`standin`]: pieces for stand-in D-Bus services (an error reply of any name);
//! * [`tls`]: a bare rustls client presenting any certificate, or none;
//! * [`units`]: unit files tests install;
//! * [`wait`]: bounded polling, and [`wait::Seen`], what a stream delivered so far;
//! * [`process`]: binaries, finished runs, children, temp dirs and ports.
//!
//! Invariant: every fixture that starts a process or makes a directory or cgroup undoes it
//! in `Drop`, so a failing (panicking) test leaves nothing behind.

pub mod agent;
pub mod api;
pub mod cluster;
pub mod ctl;
pub mod etcd;
pub mod etcd_cluster;
pub mod flood;
pub mod forge;
pub mod ha;
pub mod http;
pub mod manager;
pub mod monitor;
pub mod node;
pub mod process;
pub mod relay;
pub mod standin;
pub mod tls;
pub mod units;
pub mod wait;

pub use agent::FakeAgent;
pub use cluster::TestCluster;
pub use manager::FakeManager;
pub use node::SystemdNode;

/// What most tests import: `use drover_testkit::prelude::*;`.
pub mod prelude {
    pub use crate::api::{
        Api, BUS_NAME, CONTROLLER_IFACE, CONTROLLER_PATH, JobRemoved, JobWatch, NODE_IFACE,
        UnitTuple, error_of,
    };
    pub use crate::cluster::TestCluster;
    pub use crate::ctl::{Ctl, CtlFollower};
    pub use crate::monitor::{Ev, MonitorWatch};
    pub use crate::process::{Run, bin};
    pub use crate::units::*;
    pub use crate::wait::eventually;
}
