//! What the link tells whoever watches it: its state ([`LinkState`]), why a
//! connection attempt failed ([`ConnectError`]) and why a session ended
//! ([`SessionEnd`]).
//!
//! Invariants: every failed attempt is one [`ConnectError`] and every ended
//! session one [`SessionEnd`], whatever the manager sent; a read error is
//! classified by [`SessionEnd::from_read_error`] alone, so a TLS stream cut
//! without `close_notify` is a closed connection exactly as a plaintext end
//! is, and nothing read past the last whole frame is trusted.

use drover_protocol::link::HandshakeError;
use std::net::SocketAddr;
use std::time::Duration;

/// What the link is doing, for whoever wants to watch (tests, the local API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    Connecting { failures: u32 },
    Connected { epoch: u64, session_id: u64 },
    Stopped,
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("TLS with the manager at {addr} (expected name '{name}') failed: {source}")]
    Tls {
        addr: SocketAddr,
        name: String,
        source: std::io::Error,
    },
    /// The manager refused this node's certificate (a TLS alert it sent
    /// after the handshake, as TLS 1.3 does).
    #[error("the manager at {addr} refused this node: {why}")]
    CertificateRefused { addr: SocketAddr, why: String },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Shutdown,
    Closed,
    HeartbeatExpired(Duration),
    Malformed(String),
    /// The connection failed (reset, ...).
    Broken(String),
    Killed(String),
    /// `SwitchController` named another manager.
    Switched,
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::Shutdown => f.write_str("agent shutting down"),
            SessionEnd::Closed => f.write_str("the manager closed the connection"),
            SessionEnd::HeartbeatExpired(t) => {
                write!(f, "nothing heard from the manager for {t:?}")
            }
            SessionEnd::Malformed(e) => write!(f, "invalid data from the manager: {e}"),
            SessionEnd::Broken(e) => write!(f, "the connection failed: {e}"),
            SessionEnd::Killed(why) => f.write_str(why),
            SessionEnd::Switched => f.write_str("switching to another manager"),
        }
    }
}

impl SessionEnd {
    /// Why a read from the manager failed. A TLS stream that ends without
    /// `close_notify` (rustls's `UnexpectedEof`) is a closed connection, as
    /// a plaintext end is: the manager was killed or its host cut the link
    /// (a manager that stops sends `close_notify`). The agent reconnects
    /// either way; nothing read is trusted past the last whole frame.
    pub(super) fn from_read_error(e: drover_protocol::FrameError) -> Self {
        use drover_protocol::FrameError;
        match e {
            FrameError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                SessionEnd::Closed
            }
            FrameError::Io(io) => SessionEnd::Broken(io.to_string()),
            other => SessionEnd::Malformed(other.to_string()),
        }
    }
}
