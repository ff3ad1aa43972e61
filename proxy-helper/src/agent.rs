//! The one thing the helper talks to: the local drover agent's
//! `org.eclipse.bluechi.Agent` interface (bus name `org.eclipse.bluechi.Agent`,
//! path `/org/eclipse/bluechi`), on the system bus, the session bus (`--user`)
//! or a given address.
//!
//! `CreateProxy` is answered only when the target is active or cannot be, which
//! may take as long as the target's start: the connection has **no method
//! timeout**. The unit's `TimeoutStartSec=` bounds the wait instead (systemd
//! sends SIGTERM, and the helper then releases the proxy, see [`crate::run`]).
//!
//! Every D-Bus failure is mapped once, here, to a [`AgentError`] whose text is
//! the one line a user finds in the proxy unit's journal.

use crate::instance::ProxyInstance;
use std::fmt;
use std::time::Duration;
use zbus::DBusError;

pub const AGENT_BUS_NAME: &str = "org.eclipse.bluechi.Agent";
pub const AGENT_PATH: &str = "/org/eclipse/bluechi";
pub const AGENT_IFACE: &str = "org.eclipse.bluechi.Agent";
/// The error the agent answers a failed proxy with.
pub const ACTIVATION_FAILED: &str = "org.eclipse.bluechi.ActivationFailed";

/// Which bus the agent is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    System,
    Session,
    Address(String),
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bus::System => f.write_str("the system bus"),
            Bus::Session => f.write_str("the session bus"),
            Bus::Address(a) => write!(f, "bus {a}"),
        }
    }
}

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
    conn: zbus::Connection,
    bus: Bus,
}

impl AgentClient {
    /// Connects without a method timeout (see the module docs).
    pub async fn connect(bus: Bus) -> Result<Self, AgentError> {
        let builder = match &bus {
            Bus::System => zbus::connection::Builder::system(),
            Bus::Session => zbus::connection::Builder::session(),
            Bus::Address(a) => zbus::connection::Builder::address(a.as_str()),
        };
        let conn = builder.build().await.map_err(|e| AgentError::Connect {
            bus: bus.clone(),
            reason: one_line(&e.to_string()),
        })?;
        Ok(Self { conn, bus })
    }

    /// `CreateProxy(proxy unit, node, unit)`: returns once the target is active.
    pub async fn create_proxy(&self, p: &ProxyInstance) -> Result<(), AgentError> {
        self.call("CreateProxy", p, None).await
    }

    /// `RemoveProxy(proxy unit, node, unit)`; `timeout` bounds the wait (a
    /// removal must never hold a unit's stop forever).
    pub async fn remove_proxy(
        &self,
        p: &ProxyInstance,
        timeout: Option<Duration>,
    ) -> Result<(), AgentError> {
        self.call("RemoveProxy", p, timeout).await
    }

    async fn call(
        &self,
        method: &str,
        p: &ProxyInstance,
        timeout: Option<Duration>,
    ) -> Result<(), AgentError> {
        let args = (
            p.proxy_unit().as_str(),
            p.node().as_str(),
            p.unit().as_str(),
        );
        let call = self.conn.call_method(
            Some(AGENT_BUS_NAME),
            AGENT_PATH,
            Some(AGENT_IFACE),
            method,
            &args,
        );
        let res = match timeout {
            None => call.await,
            Some(t) => match tokio::time::timeout(t, call).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(AgentError::Io(format!(
                        "no answer to {method} within {} s",
                        t.as_secs()
                    )));
                }
            },
        };
        res.map(drop).map_err(|e| self.map_error(e))
    }

    fn map_error(&self, e: zbus::Error) -> AgentError {
        match e {
            zbus::Error::MethodError(name, message, _) => {
                classify(name.as_str(), message.as_deref().unwrap_or(""), &self.bus)
            }
            zbus::Error::FDO(fdo) => classify(fdo.name().as_str(), &fdo.to_string(), &self.bus),
            other => AgentError::Io(one_line(&other.to_string())),
        }
    }
}

/// Maps a D-Bus error reply (name, message) to what the user is told.
pub fn classify(name: &str, message: &str, bus: &Bus) -> AgentError {
    let message = one_line(message);
    match name {
        ACTIVATION_FAILED => AgentError::Refused { reason: message },
        "org.freedesktop.DBus.Error.ServiceUnknown"
        | "org.freedesktop.DBus.Error.NameHasNoOwner" => {
            AgentError::NotRunning { bus: bus.clone() }
        }
        "org.freedesktop.DBus.Error.NoReply" | "org.freedesktop.DBus.Error.Disconnected" => {
            AgentError::Vanished(message)
        }
        _ if name.starts_with("org.eclipse.bluechi.") => AgentError::Refused {
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
