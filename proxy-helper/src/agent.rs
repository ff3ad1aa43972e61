//! The one thing the helper talks to: the local drover agent's
//! `org.eclipse.bluechi.Agent` interface (bus name `org.eclipse.bluechi.Agent`,
//! path `/org/eclipse/bluechi`), on the system bus, the session bus (`--user`)
//! or a given address.
//!
//! `CreateProxy` is answered only when the target is active or cannot be, which
//! may take as long as the target's start: the connection has **no method
//! timeout**. The unit's `TimeoutStartSec=` bounds the wait instead (systemd
//! sends SIGTERM, and the helper then releases the proxy, see [`crate::cli::create`]).
//!
//! Every D-Bus failure is mapped once, here, to a [`AgentError`] whose text is
//! the one line a user finds in the proxy unit's journal.

use crate::bus::{CallError, Connection};
use crate::instance::ProxyInstance;
use crate::wire::Call;
use drover_bus::bluechi::{AGENT_BUS_NAME, AGENT_IFACE, AGENT_PATH};
use drover_protocol::error_names::{
    ACTIVATION_FAILED, BLUECHI_PREFIX, DISCONNECTED, NAME_HAS_NO_OWNER, NO_REPLY, SERVICE_UNKNOWN,
};
use nix::sys::signalfd::SignalFd;
use std::time::Duration;

/// Which bus the agent is on (the choice, and how it names itself, are
/// `drover_bus`'s; this client finds the address itself, [`crate::bus`]).
pub use drover_bus::Bus;

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot connect to {bus}: {reason}")]
    Connect { bus: Bus, reason: String },
    #[error("the drover agent is not running on this node (nobody owns {AGENT_BUS_NAME} on {bus})")]
    NotRunning { bus: Bus },
    #[error("the drover agent went away before answering ({0})")]
    Vanished(String),
    /// The agent refused or failed the proxy; `reason` is its own words
    /// (unknown node, not allowed, no such unit, target failed, ...).
    #[error("{reason}")]
    Refused { reason: String },
    #[error("the drover agent answered {name}: {message}")]
    Other { name: String, message: String },
    #[error("talking to the drover agent failed: {0}")]
    Io(String),
}

/// A connection to the bus the agent serves on.
pub struct AgentClient {
    conn: Connection,
    bus: Bus,
    /// The serial of a `CreateProxy` whose wait was interrupted: its answer
    /// still comes ([`AgentClient::create_proxy_answer`]).
    interrupted_create: Option<u32>,
}

/// How a call to the agent ended, when it did not end with an answer.
#[derive(Debug)]
pub enum CallEnd {
    Failed(AgentError),
    /// This signal arrived while waiting (see [`AgentClient::create_proxy`]).
    Interrupted(nix::sys::signal::Signal),
}

impl From<AgentError> for CallEnd {
    fn from(e: AgentError) -> Self {
        CallEnd::Failed(e)
    }
}

impl AgentClient {
    /// Connects and authenticates; the first call carries `Hello`.
    pub fn connect(bus: Bus) -> Result<Self, AgentError> {
        let connect_error = |reason: String| AgentError::Connect {
            bus: bus.clone(),
            reason: one_line(&reason),
        };
        let address = bus.address().map_err(|e| connect_error(e.to_string()))?;
        let conn = Connection::open(&address).map_err(connect_error)?;
        Ok(Self {
            conn,
            bus,
            interrupted_create: None,
        })
    }

    /// `CreateProxy(proxy unit, node, unit)`: returns once the target is
    /// active. No method timeout (see the module docs); a signal read from
    /// `interrupt` ends the wait.
    pub fn create_proxy(&mut self, p: &ProxyInstance, interrupt: &SignalFd) -> Result<(), CallEnd> {
        let result = self.call("CreateProxy", p, None, Some(interrupt));
        if let Err(CallEnd::Interrupted(_)) = result {
            self.interrupted_create = Some(self.conn.last_serial());
        }
        result
    }

    /// After an interrupted [`AgentClient::create_proxy`] and the
    /// `RemoveProxy` that releases it: the agent's answer to the
    /// `CreateProxy`, which it gives when the proxy is removed and which says
    /// why the proxy was still waiting (e.g. its target's node is offline,
    /// and since when). Waits at most `timeout`; `None` if no answer came or
    /// no call was interrupted.
    pub fn create_proxy_answer(&mut self, timeout: Duration) -> Option<AgentError> {
        let serial = self.interrupted_create.take()?;
        match self.conn.reply(serial, Some(timeout), None) {
            Ok(Err((name, message))) => Some(classify(&name, &message, &self.bus)),
            Ok(Ok(())) | Err(_) => None,
        }
    }

    /// `RemoveProxy(proxy unit, node, unit)`; `timeout` bounds the wait (a
    /// removal must never hold a unit's stop forever).
    pub fn remove_proxy(&mut self, p: &ProxyInstance, timeout: Duration) -> Result<(), AgentError> {
        match self.call("RemoveProxy", p, Some(timeout), None) {
            Ok(()) => Ok(()),
            Err(CallEnd::Failed(e)) => Err(e),
            Err(CallEnd::Interrupted(sig)) => Err(AgentError::Io(format!("interrupted by {sig}"))),
        }
    }

    fn call(
        &mut self,
        method: &str,
        p: &ProxyInstance,
        timeout: Option<Duration>,
        interrupt: Option<&SignalFd>,
    ) -> Result<(), CallEnd> {
        let args = [
            p.proxy_unit().as_str(),
            p.node().as_str(),
            p.unit().as_str(),
        ];
        let call = Call {
            destination: AGENT_BUS_NAME,
            path: AGENT_PATH,
            interface: AGENT_IFACE,
            member: method,
            args: &args,
        };
        match self.conn.call(&call, timeout, interrupt) {
            Ok(Ok(())) => Ok(()),
            Ok(Err((name, message))) => Err(classify(&name, &message, &self.bus).into()),
            Err(CallError::Interrupted(sig)) => Err(CallEnd::Interrupted(sig)),
            Err(CallError::TimedOut) => Err(AgentError::Io(format!(
                "no answer to {method} within {} s",
                timeout.unwrap_or_default().as_secs()
            ))
            .into()),
            Err(CallError::Closed) => {
                Err(AgentError::Vanished(format!("{} closed the connection", self.bus)).into())
            }
            Err(CallError::Io(e)) => Err(AgentError::Io(one_line(&e)).into()),
        }
    }
}

/// Maps a D-Bus error reply (name, message) to what the user is told.
pub fn classify(name: &str, message: &str, bus: &Bus) -> AgentError {
    let message = one_line(message);
    match name {
        ACTIVATION_FAILED => AgentError::Refused { reason: message },
        SERVICE_UNKNOWN | NAME_HAS_NO_OWNER => AgentError::NotRunning { bus: bus.clone() },
        NO_REPLY | DISCONNECTED => AgentError::Vanished(message),
        _ if name.starts_with(BLUECHI_PREFIX) => AgentError::Refused {
            reason: if message.is_empty() {
                name.to_string()
            } else {
                message
            },
        },
        _ => AgentError::Other {
            name: name.to_string(),
            message,
        },
    }
}

/// The journal shows one line per message: fold newlines, bound the length.
fn one_line(s: &str) -> String {
    let folded: String = s
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let mut out: String = folded.chars().take(400).collect();
    if folded.chars().count() > 400 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_what_a_user_needs_to_know() {
        let bus = Bus::Session;
        let e = classify(ACTIVATION_FAILED, "no such node 'node9'", &bus);
        assert_eq!(e.to_string(), "no such node 'node9'");
        let e = classify(
            "org.freedesktop.DBus.Error.ServiceUnknown",
            "The name org.eclipse.bluechi.Agent was not provided by any .service files",
            &bus,
        );
        assert_eq!(
            e.to_string(),
            "the drover agent is not running on this node (nobody owns org.eclipse.bluechi.Agent on the session bus)"
        );
        let e = classify(
            "org.freedesktop.DBus.Error.NoReply",
            "Message recipient disconnected from message bus without replying",
            &bus,
        );
        assert!(e.to_string().starts_with("the drover agent went away"));
        let e = classify("org.eclipse.bluechi.Offline", "", &bus);
        assert_eq!(e.to_string(), "org.eclipse.bluechi.Offline");
        let e = classify("com.example.Weird", "a\nb\n\nc", &bus);
        assert_eq!(
            e.to_string(),
            "the drover agent answered com.example.Weird: a; b; c"
        );
    }

    #[test]
    fn one_line_bounds_length() {
        let long = "x".repeat(1000);
        let s = one_line(&long);
        assert_eq!(s.chars().count(), 401);
        assert_eq!(one_line("  a \n\r\n b "), "a; b");
    }

    #[test]
    fn bus_names_itself() {
        assert_eq!(Bus::System.to_string(), "the system bus");
        assert_eq!(
            Bus::Address("unix:path=/x".into()).to_string(),
            "bus unix:path=/x"
        );
    }
}
