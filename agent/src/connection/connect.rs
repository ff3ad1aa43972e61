//! One connection attempt to one manager: resolve, TCP with the link's socket
//! options, TLS when configured, then the agent's hello (steps 1 and 4 of
//! the module docs of `crate::connection`).
//!
//! Invariants: the host is resolved again on every attempt; resolving,
//! connecting, the TLS handshake and the hello are each bounded by
//! `ConnectTimeout`; a manager whose certificate does not chain to the
//! agent's CA bundle or does not name the expected name (`TLSControllerName`,
//! else the host dialled, also after `SwitchController`) is refused before a
//! byte of the hello is sent; a socket option that cannot be set is logged,
//! never fatal.

use super::config::LinkConfig;
use super::outcome::ConnectError;
use crate::link::target::Endpoint;
use drover_protocol::Hello;
use drover_protocol::link::{Answer, HandshakeError, agent_hello};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Version sent in the handshake.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
/// What a link runs over: TCP, or TLS on TCP.
pub trait LinkIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> LinkIo for T {}
/// The connection of one session.
pub type LinkStream = Box<dyn LinkIo>;

/// One attempt: the manager's answer to the hello (welcomed, parked or an
/// error), on a connection configured as [`LinkConfig`] says.
pub(super) async fn connect(
    cfg: &LinkConfig,
    target: &Endpoint,
) -> Result<Answer<LinkStream>, ConnectError> {
    let t = cfg.connect_timeout;
    let host = target.host.as_str();
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(t, tokio::net::lookup_host((host, target.port)))
            .await
            .map_err(|_| ConnectError::Timeout(t))?
            .map_err(|source| ConnectError::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match tokio::time::timeout(t, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(source)) => last = Some(ConnectError::Connect { addr, source }),
            Err(_) => last = Some(ConnectError::Timeout(t)),
        }
    }
    let Some(stream) = stream else {
        return Err(last.unwrap_or(ConnectError::NoAddress {
            host: host.to_string(),
        }));
    };
    configure_socket(&stream, cfg);
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let stream: LinkStream = match &cfg.tls {
        None => Box::new(stream),
        Some(connector) => {
            let connector = &connector_for(cfg, connector, host)?;
            let addr = stream
                .peer_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
            let tls_err = |source| ConnectError::Tls {
                addr,
                name: server_name(connector),
                source,
            };
            match tokio::time::timeout(t, connector.connect(stream)).await {
                Ok(Ok(tls)) => Box::new(tls),
                Ok(Err(source)) => return Err(tls_err(source)),
                Err(_) => return Err(ConnectError::Timeout(t)),
            }
        }
    };
    let hello = Hello::new(cfg.node.as_str(), AGENT_VERSION).advertising(cfg.advertise_address);
    match agent_hello(stream, &hello, t).await {
        Err(HandshakeError::Frame(drover_protocol::FrameError::Io(io))) => {
            match drover_tls::connector::alert_from_manager(&io) {
                Some(why) => Err(ConnectError::CertificateRefused { addr: peer, why }),
                None => Err(HandshakeError::Frame(drover_protocol::FrameError::Io(io)).into()),
            }
        }
        other => Ok(other?),
    }
}

/// The connector that checks the right manager name for `host` (see the
/// module docs of `crate::connection`, step 4): the configured one, or — when the name follows
/// the host and `SwitchController` changed the host — the same TLS
/// settings checking the new host's name.
fn connector_for(
    cfg: &LinkConfig,
    connector: &drover_tls::Connector,
    host: &str,
) -> Result<drover_tls::Connector, ConnectError> {
    if !cfg.tls_name_follows_host || server_name(connector) == host {
        return Ok(connector.clone());
    }
    connector
        .with_server_name(host)
        .map_err(|e| ConnectError::Tls {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            name: host.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        })
}

/// The manager name a connector checks, for messages.
fn server_name(connector: &drover_tls::Connector) -> String {
    connector.server_name().to_str().into_owned()
}

/// Best effort: a socket option that cannot be set is logged, not fatal.
fn configure_socket(stream: &TcpStream, cfg: &LinkConfig) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!("cannot set TCP_NODELAY: {e}");
    }
    let sock = socket2::SockRef::from(stream);
    if let Some(ka) = cfg.keepalive {
        let mut params = socket2::TcpKeepalive::new();
        if !ka.idle.is_zero() {
            params = params.with_time(ka.idle);
        }
        if !ka.interval.is_zero() {
            params = params.with_interval(ka.interval);
        }
        if ka.count > 0 {
            params = params.with_retries(ka.count);
        }
        if let Err(e) = sock.set_tcp_keepalive(&params) {
            tracing::warn!("cannot enable TCP keepalive: {e}");
        }
    }
    if cfg.ip_receive_errors
        && let Err(e) = drover_protocol::link::set_recv_err(stream)
    {
        tracing::warn!("cannot set IP_RECVERR: {e}");
    }
    if let Some(timeout) = link_user_timeout(cfg)
        && let Err(e) = drover_protocol::link::set_user_timeout(stream, timeout)
    {
        tracing::warn!("cannot set TCP_USER_TIMEOUT: {e}");
    }
}

/// The `TCP_USER_TIMEOUT` of the link's socket: the agent's heartbeats are
/// its probes of the manager (`drover_protocol::liveness`), so what it sent
/// unacknowledged for this long ends the link. From the configured pair,
/// set before the manager's answer: negotiation only makes the agent send
/// more often, except when its own interval is 0 (then it may send nothing,
/// and the whole threshold applies).
pub fn link_user_timeout(cfg: &LinkConfig) -> Option<Duration> {
    let sends_every = (!cfg.heartbeat_interval.is_zero()).then_some(cfg.heartbeat_interval);
    drover_protocol::liveness::user_timeout(cfg.heartbeat_threshold, sends_every)
}
