//! drover-proxy: the helper run by `drover-proxy@NODE_UNIT.service`.
//!
//! A unit on this node that says `Wants=`/`Requires=`/`BindsTo=` and `After=`
//! `drover-proxy@node2_db.service` makes systemd run `drover-proxy create
//! node2_db`. The helper checks the instance name, asks the local drover agent
//! (`org.eclipse.bluechi.Agent.CreateProxy`) to have `db.service` started on
//! `node2`, and exits 0 once it is active — so the proxy unit becomes active
//! and the dependent unit starts — or 1 with a one-line reason. `ExecStop=`
//! runs `drover-proxy remove node2_db` (`RemoveProxy`). Run as `bluechi-proxy`
//! (BlueChi's `bluechi-proxy@.service`, from the optional compatibility set),
//! it backs `bluechi-proxy@node2_db.service` and takes BlueChi's argument,
//! `node2_db.service` (see [`cli`]).
//!
//! The helper holds no state: the agent keeps the proxy, the manager the
//! references. Layout:
//! * [`instance`]: the `NODE_UNIT` instance name and its validation;
//! * [`agent`]: the calls to the local agent and their error mapping;
//! * [`bus`]: a blocking D-Bus connection that makes one call at a time;
//! * [`wire`]: the D-Bus messages it writes and reads;
//! * [`cli`]: arguments, exit codes, signal handling.

pub mod agent;
pub mod bus;
pub mod cli;
pub mod instance;
pub mod wire;

pub use agent::{AgentClient, AgentError, Bus};
pub use instance::{InstanceError, ProxyInstance};
