//! The TCP listener for agents: where it comes from, and the accept loop.
//!
//! * A listener passed by the service manager (`LISTEN_FDS=1`, `LISTEN_PID` =
//!   our pid, fd 3; read by `sd_notify::listen_fds`, which also marks it
//!   close-on-exec so no child inherits the agents' port) is used as is:
//!   systemd socket activation, and the sandbox keeps the port across
//!   manager restarts that way.
//! * Otherwise bind `ListenAddress:port`; unset, `[::]:port` (dual stack)
//!   falling back to `0.0.0.0:port` when IPv6 is off — with TLS or
//!   `AllowPlaintext=true` only; without them `127.0.0.1` (the agents'
//!   default `ControllerHost`), see `ManagerConfig::bind_address`.
//! * Without TLS a warning is logged at start for the plaintext listener,
//!   and a connection that reached a non-loopback local address is closed at
//!   once unless `AllowPlaintext=true` (a socket-activated listener may be
//!   bound anywhere).
//! * The accept loop never gives up: when descriptors run out (EMFILE,
//!   ENFILE) or memory is short it logs, backs off, and keeps accepting once
//!   descriptors free up. Accepted connections wait in the [`Lobby`] (up to
//!   [`LOBBY`]; beyond, in the listen backlog) until the [`Gate`] has a
//!   place for the one whose turn it is (round robin over source
//!   addresses; closed ones dropped, silent ones passed, see [`Lobby`]): a
//!   free place, or that of a connection evicted because it
//!   waited on its peer too long while the gate was full. The connection
//!   gets its ticket, TCP_NODELAY, keepalive per config, IP_RECVERR and
//!   TCP_USER_TIMEOUT (`drover_protocol::liveness`), then its handshake runs
//!   in its own task, read through the gate's [`Watched`] stream, so a slow
//!   or silent peer never stalls the loop: the TLS handshake (with TLS) and
//!   the hello must both be done within `Timeouts::handshake` of the accept.
//!   With TLS, not one drover byte is read before the client certificate is
//!   verified.
//! * The session's reader gets the socket to mark (`nodes/frames.rs`): on
//!   plaintext as is; on TLS 1.3 with where the ciphertext rustls read ends
//!   (`drover_tls::records::Records` under rustls from the first byte).

use crate::heap::Churn;
use crate::nodes::frames::MarkSocket;
use crate::nodes::gate::{Eviction, Gate, LogLimiter, Slot, Ticket, Watched};
use crate::nodes::lifecycle::Lifecycle;
use crate::nodes::lobby::{Lobby, Peek};
use drover_config::ManagerConfig;
use drover_tls::Acceptor;
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("LISTEN_FDS={0}: drover-manager takes exactly one socket-activated listener")]
    TooManyFds(String),
    #[error("the socket activation environment is unusable: {0}")]
    Activation(io::Error),
    #[error("the socket-activated fd 3 is not a listening TCP socket: {0}")]
    NotTcp(io::Error),
    #[error("UseTCP=false and no socket-activated listener: agents would have no way to connect")]
    NoListener,
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

/// fd 3 when the service manager passed exactly one socket to this process.
pub fn activated_listener() -> Result<Option<TcpListener>, ListenError> {
    let fds: Vec<_> = sd_notify::listen_fds()
        .map_err(ListenError::Activation)?
        .collect();
    let fd = match fds.as_slice() {
        [] => return Ok(None),
        [fd] => *fd,
        more => return Err(ListenError::TooManyFds(more.len().to_string())),
    };
    // SAFETY: LISTEN_PID names this process and LISTEN_FDS=1, so by the
    // socket activation protocol `fd` (3) is ours and open; nothing else in
    // this process took ownership of it. std has no safe way to adopt an
    // inherited descriptor.
    #[allow(unsafe_code)]
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    let sock = SockRef::from(&listener);
    let is_tcp_listener = sock.r#type().map_err(ListenError::NotTcp)? == Type::STREAM
        && sock.is_listener().map_err(ListenError::NotTcp)?
        && listener.local_addr().is_ok();
    if !is_tcp_listener {
        return Err(ListenError::NotTcp(io::Error::other(
            "not a listening stream socket",
        )));
    }
    Ok(Some(listener))
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    // Thousands of agents may reconnect at once; the kernel caps this at somaxconn.
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Binds `ListenAddress:port`, or `[::]:port` with a fallback to `0.0.0.0:port`.
pub fn bind(address: Option<IpAddr>, port: u16) -> Result<TcpListener, ListenError> {
    let bind = |ip: IpAddr| {
        let addr = SocketAddr::new(ip, port);
        bind_one(addr).map_err(|source| ListenError::Bind { addr, source })
    };
    match address {
        Some(ip) => bind(ip),
        None => bind(IpAddr::V6(Ipv6Addr::UNSPECIFIED)).or_else(|v6| {
            tracing::info!("{v6}; falling back to IPv4 only");
            bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        }),
    }
}

/// The listener the manager should use: socket-activated, else bound per
/// config (unless `UseTCP=false`, which leaves only socket activation).
pub fn listener_for(config: &ManagerConfig) -> Result<TcpListener, ListenError> {
    match activated_listener()? {
        Some(listener) => {
            match listener.local_addr() {
                Ok(local) => tracing::info!("using the socket-activated listener on {local}"),
                Err(e) => tracing::info!("using the socket-activated listener (address: {e})"),
            }
            Ok(listener)
        }
        None if !config.use_tcp => Err(ListenError::NoListener),
        // Plaintext without `ListenAddress`: 127.0.0.1, the agents' default
        // `ControllerHost` (`::1` would leave every default agent outside).
        None => bind(config.bind_address(false), config.port),
    }
}

/// The start-up warning for a plaintext listener (nothing with TLS).
pub fn warn_if_plaintext(config: &ManagerConfig, local: SocketAddr) {
    match plaintext_warning(config, local) {
        Some(Plaintext::ServesNobody(line)) => tracing::error!("{line}"),
        Some(Plaintext::Warn(line)) => tracing::warn!("{line}"),
        None => {}
    }
}

/// What [`warn_if_plaintext`] says.
#[derive(Debug, PartialEq, Eq)]
enum Plaintext {
    Warn(String),
    /// Bound (socket activation) to one address that is not loopback, with
    /// plaintext served on loopback only: every connection will be closed.
    ServesNobody(String),
}

fn plaintext_warning(config: &ManagerConfig, local: SocketAddr) -> Option<Plaintext> {
    if config.tls.is_some() {
        return None;
    }
    let ip = local.ip().to_canonical();
    Some(if config.allow_plaintext {
        Plaintext::Warn(format!(
            "agents connect to {local} in PLAINTEXT, from any address (AllowPlaintext=true): \
             whoever reaches this port can register as an allowed node; configure \
             TLSCertificate, TLSPrivateKey and TLSCertificateAuthority"
        ))
    } else if !ip.is_loopback() && !ip.is_unspecified() {
        Plaintext::ServesNobody(format!(
            "the agents' listener is on {local}, not a loopback address, and without TLS \
             plaintext is served on loopback only: this manager can serve NO agent, every \
             connection will be closed; configure TLSCertificate, TLSPrivateKey and \
             TLSCertificateAuthority, bind the socket to 127.0.0.1, or set AllowPlaintext=true"
        ))
    } else {
        Plaintext::Warn(format!(
            "agents connect to {local} in plaintext, accepted on loopback addresses only; \
             configure TLSCertificate, TLSPrivateKey and TLSCertificateAuthority for agents \
             on other hosts"
        ))
    })
}

/// Socket options for one agent connection. Failures are logged, not fatal:
/// the connection still works, only dead-peer detection is slower.
pub fn configure_stream(stream: &tokio::net::TcpStream, config: &ManagerConfig) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
    let sock = SockRef::from(stream);
    let mut keepalive = TcpKeepalive::new();
    if config.link.keepalive_time_s > 0 {
        keepalive = keepalive.with_time(Duration::from_secs(config.link.keepalive_time_s.into()));
    }
    if config.link.keepalive_interval_s > 0 {
        keepalive =
            keepalive.with_interval(Duration::from_secs(config.link.keepalive_interval_s.into()));
    }
    if config.link.keepalive_count > 0 {
        keepalive = keepalive.with_retries(config.link.keepalive_count);
    }
    if let Err(e) = sock
        .set_keepalive(true)
        .and_then(|()| sock.set_tcp_keepalive(&keepalive))
    {
        tracing::debug!("TCP keepalive: {e}");
    }
    if config.link.ip_receive_errors
        && let Err(e) = drover_protocol::link::set_recv_err(stream)
    {
        tracing::debug!("IP_RECVERR: {e}");
    }
    let threshold = Duration::from_millis(config.node_heartbeat_threshold_ms);
    let sends_every = (config.heartbeat_interval_ms > 0)
        .then_some(Duration::from_millis(config.heartbeat_interval_ms));
    if let Some(timeout) = drover_protocol::liveness::user_timeout(threshold, sends_every)
        && let Err(e) = drover_protocol::link::set_user_timeout(stream, timeout)
    {
        tracing::debug!("TCP_USER_TIMEOUT: {e}");
    }
}

/// What the accept loop and each connection's handshake need.
pub struct Accept {
    /// Where an admitted hello goes: the node lifecycle.
    pub lifecycle: Arc<Lifecycle>,
    /// Caps on connections not yet admitted.
    pub gate: Arc<Gate>,
    /// Rate limits for the log lines about refused peers.
    pub refusals: Arc<LogLimiter>,
    /// Mutual TLS on the agent port, when configured.
    pub tls: Option<Acceptor>,
    /// The plaintext rule and the TCP keepalive settings.
    pub config: Arc<ManagerConfig>,
    /// For the TLS handshake and the hello together.
    pub handshake: Duration,
    /// Connections accepted, for [`crate::heap`].
    pub churn: Arc<Churn>,
}

/// Connections parked at most, accepted and waiting for a place (see
/// [`Lobby`]): the size of the listen backlog, so a flood that fits in the
/// backlog fits here, where it is let in fairly instead of first come,
/// first served.
pub const LOBBY: usize = 4096;

/// Accepts agents until `stop` is cancelled: every connection the kernel has
/// is taken into the [`Lobby`] at once (until it is full), and the next one
/// the lobby names is let in whenever the gate has a place for it.
pub async fn accept_loop(
    ctx: Arc<Accept>,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) {
    let mut lobby = Lobby::new(LOBBY);
    let mut backoff = Duration::from_millis(10);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            slot = place(&ctx, &stop), if !lobby.is_empty() => {
                let Some(slot) = slot else { return };
                if let Some((_, (stream, peer))) = lobby.pop_with(|(s, _)| peek(s)) {
                    admit_connection(&ctx, slot, stream, peer);
                }
            }
            accepted = listener.accept(), if !lobby.is_full() => match accepted {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(10);
                    // An IPv4 agent on the dual-stack listener is `[::ffff:a.b.c.d]`:
                    // every log line and check sees its plain address instead.
                    let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
                    lobby.push(peer.ip(), (stream, peer));
                }
                Err(e) if is_resource_exhaustion(&e) => {
                    tracing::error!(
                        "cannot accept agents: {e}; retrying in {} ms",
                        backoff.as_millis()
                    );
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                // Per-connection failures (the peer reset before we took it, …).
                Err(e) => tracing::debug!("accept: {e}"),
            },
        }
    }
}

/// What a parked connection's socket holds, without reading it (one
/// non-blocking `recv(MSG_PEEK)`; see [`Lobby::pop_with`]).
fn peek(stream: &tokio::net::TcpStream) -> Peek {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    match SockRef::from(stream).peek(&mut byte) {
        Ok(0) => Peek::Gone,
        Ok(_) => Peek::Spoke,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Peek::Silent,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Peek::Silent,
        Err(_) => Peek::Gone,
    }
}

/// A place in the gate for a connection that waits to be let in: a free
/// one, or the place of a ripe connection evicted for it (see `gate`).
/// `None` once `stop` is cancelled.
async fn place(ctx: &Accept, stop: &CancellationToken) -> Option<Slot> {
    let gate = &ctx.gate;
    loop {
        if let Some(slot) = gate.try_slot() {
            return Some(slot);
        }
        let recheck = match gate.evict_ripest() {
            Eviction::Evicted { ip, waited } => {
                ctx.refusals.warn("evicted", || {
                    format!(
                        "{ip}: closed a connection that waited {} ms on its peer in its \
                         handshake, to let a newcomer in ({} connections are authenticating)",
                        waited.as_millis(),
                        gate.limits().handshakes
                    )
                });
                // Its task ends at once and frees the place.
                EVICTION_RECHECK
            }
            Eviction::Pending => EVICTION_RECHECK,
            Eviction::NotYet(first_ripe) => {
                ctx.refusals.warn("over cap: total", || {
                    format!(
                        "{} connections are authenticating and none has waited on its peer for \
                         {} ms; new ones wait in line",
                        gate.limits().handshakes,
                        gate.limits().ripe_after.as_millis()
                    )
                });
                first_ripe.unwrap_or(gate.limits().ripe_after)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            slot = gate.slot() => return slot,
            _ = tokio::time::sleep(recheck.max(Duration::from_millis(1))) => {}
        }
    }
}

/// How long to wait for an evicted connection's place before looking again.
const EVICTION_RECHECK: Duration = Duration::from_millis(50);

/// One accepted connection: its ticket, the plaintext rule, then its own task
/// for TLS, hello and session.
fn admit_connection(
    ctx: &Arc<Accept>,
    slot: Slot,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    ctx.churn.note();
    let ticket = ctx.gate.enter(slot, peer.ip(), Some(&stream));
    if ctx.tls.is_none() {
        let local = stream.local_addr().map(|a| a.ip());
        let allowed = local
            .as_ref()
            .is_ok_and(|ip| ctx.config.plaintext_allowed_on(*ip));
        if !allowed {
            ctx.refusals.warn("plaintext off loopback", || {
                format!(
                    "{peer}: closed at once: plaintext is served on loopback only (local address \
                     {local:?}); configure TLS, or AllowPlaintext=true"
                )
            });
            return;
        }
    }
    configure_stream(&stream, &ctx.config);
    let ctx = ctx.clone();
    tokio::spawn(async move { serve(ctx, stream, peer, ticket).await });
}

async fn serve(ctx: Arc<Accept>, stream: tokio::net::TcpStream, peer: SocketAddr, ticket: Ticket) {
    let deadline = tokio::time::Instant::now() + ctx.handshake;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    // Read through the gate's watch until the verdict (see `gate`).
    let stream = Watched::new(stream, ticket.peer_wait());
    let Some(acceptor) = ctx.tls.clone() else {
        // Plaintext: the reader may mark the socket (nodes/frames.rs); the
        // stream moves into the session, which keeps it open while it reads.
        let socket = MarkSocket::plain(fd);
        ctx.lifecycle
            .serve_connection(stream, Some(socket), peer, None, deadline, Some(ticket))
            .await;
        return;
    };
    // TLS: rustls reads through `Records`, which tells the reader where the
    // ciphertext it took ends, so the reader may mark the socket too.
    let (stream, boundary) = drover_tls::records::follow(stream);
    let stats = ctx.lifecycle.link_stats();
    let tls = match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            stats.handshake(drover_tls::refusal_class(&e));
            ctx.refusals.warn("tls handshake", || {
                format!("{peer}: TLS handshake refused: {e}")
            });
            return;
        }
        Err(_) => {
            stats.handshake("timeout");
            ctx.refusals.warn("tls timeout", || {
                format!(
                    "{peer}: TLS handshake not done within {} ms; closed",
                    ctx.handshake.as_millis()
                )
            });
            return;
        }
    };
    let identity = match drover_tls::peer_identity(&tls) {
        Ok(identity) => {
            stats.handshake("ok");
            identity
        }
        Err(e) => {
            stats.handshake("identity");
            ctx.refusals.warn("tls identity", || {
                format!("{peer}: client certificate refused: {e}")
            });
            return;
        }
    };
    // Record sizes are exact on TLS 1.3 with a 16-byte tag (all drover
    // negotiates); on anything else the reader reads every record as it comes.
    let socket = if drover_tls::records::sizes_known(&tls) {
        MarkSocket::tls(fd, boundary)
    } else {
        MarkSocket::unmarked(fd)
    };
    ctx.lifecycle
        .serve_connection(
            tls,
            Some(socket),
            peer,
            Some(identity),
            deadline,
            Some(ticket),
        )
        .await;
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_dual_stack_by_default_and_explicit_address() {
        let l = bind(None, 0).unwrap();
        assert!(l.local_addr().unwrap().port() > 0);
        let l = bind(Some("127.0.0.1".parse().unwrap()), 0).unwrap();
        assert_eq!(
            l.local_addr().unwrap().ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn no_activation_without_our_pid() {
        // The test process was not socket-activated.
        assert!(activated_listener().unwrap().is_none());
    }

    #[test]
    fn use_tcp_false_without_activation_is_a_clear_error() {
        let config = ManagerConfig {
            use_tcp: false,
            ..ManagerConfig::default()
        };
        let err = listener_for(&config).unwrap_err();
        assert!(err.to_string().contains("UseTCP=false"), "{err}");
    }

    #[test]
    fn plaintext_binds_loopback_by_default() {
        let config = ManagerConfig {
            port: 0,
            ..ManagerConfig::default()
        };
        let l = listener_for(&config).unwrap();
        assert!(l.local_addr().unwrap().ip().is_loopback());
    }

    #[test]
    fn a_plaintext_listener_on_one_outside_address_says_it_serves_nobody() {
        let plain = ManagerConfig::default();
        let at = |s: &str| plaintext_warning(&plain, s.parse().unwrap());
        match at("192.0.2.10:842") {
            Some(Plaintext::ServesNobody(line)) => {
                assert!(line.contains("can serve NO agent"), "{line}");
                assert!(line.contains("192.0.2.10:842"), "{line}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            at("[2001:db8::1]:842"),
            Some(Plaintext::ServesNobody(_))
        ));
        // Loopback, or every address (loopback among them): served, with a warning.
        for local in [
            "127.0.0.1:842",
            "[::1]:842",
            "0.0.0.0:842",
            "[::]:842",
            "[::ffff:127.0.0.1]:842",
        ] {
            assert!(matches!(at(local), Some(Plaintext::Warn(_))), "{local}");
        }
        let open = ManagerConfig {
            allow_plaintext: true,
            ..ManagerConfig::default()
        };
        assert!(matches!(
            plaintext_warning(&open, "192.0.2.10:842".parse().unwrap()),
            Some(Plaintext::Warn(line)) if line.contains("PLAINTEXT")
        ));
    }

    #[test]
    fn exhaustion_errors_are_recognised() {
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}
