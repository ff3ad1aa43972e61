//! drover-sandbox: a cluster of real `systemd --user` nodes on one machine, for trying
//! drover and for its integration tests.
//!
//! One node = one `systemd --user` manager in its own mount + cgroup namespace, with its own
//! cgroup subtree and its own bus (`<dir>/<node>/rt/bus`). Next to the nodes run a private
//! dbus-daemon (the manager's public API bus), one `drover-manager` and one `drover-agent`
//! per node, all on loopback; the agents run outside the node namespaces and reach their
//! node's systemd by bus address.
//!
//! Modules, one concept each:
//! * [`cluster`]: the [`Cluster`] value tests use (start, drive, tear down);
//! * [`cgroups`]: layout detection and the sandbox's cgroups (creation, kill, removal);
//! * [`node`]: one node (directories, namespaces, readiness, `nsenter`);
//! * [`process`]: starting daemons detached, in a cgroup, optionally socket-activated;
//! * [`state`]: `state.json`, so a sandbox can be cleaned up without its creator;
//! * [`files`]: the config files and `sandbox.env` the sandbox writes;
//! * [`bus`]: the few D-Bus calls the sandbox itself makes;
//! * [`private_bus`]: a throwaway dbus-daemon for tests and benchmarks without systemd;
//! * [`preflight`]: every host prerequisite, checked in one pass before anything starts;
//! * [`binaries`], [`inotify`]: finding drover binaries, the inotify limit;
//! * [`cli`]: the `drover-sandbox` command (`up`, `exec`, `install`, `down`, `demo`).
//!
//! Invariant: nothing a sandbox starts escapes its cgroups, and teardown (explicit, `Drop`,
//! or `drover-sandbox down`) leaves no process, cgroup, mount or namespace behind.

pub mod binaries;
pub mod bus;
pub mod cgroups;
pub mod cli;
pub mod cluster;
pub mod files;
pub mod inotify;
pub mod node;
pub mod preflight;
pub mod private_bus;
pub mod process;
pub mod state;

pub use cluster::{Cluster, ClusterOptions, ExtraAgent, free_loopback_port};
pub use private_bus::PrivateBus;
