//! The same one-call-at-a-time connection as [`crate::bus`], on zbus instead of
//! the hand-rolled [`crate::wire`] (feature `zbus-client`, built to measure the
//! two side by side; see issue 12 and `drover-bench proxy --helper-b`).
//!
//! zbus 6 has no blocking API of its own any more: a synchronous program puts
//! its async code in [`zbus::block_on`], which, with zbus's `tokio` feature,
//! runs it on a current-thread Tokio runtime that zbus starts on first use.
//! The connection's reader task runs only while the helper is inside
//! `block_on`, which is exactly while it waits for a reply.
//!
//! What stays as in [`crate::bus`]: the address rules and the connect
//! ([`crate::bus::connect`]: `unix:path=`/`unix:abstract=` entries tried in
//! order, the same errors), the handshake bound, no method timeout unless one
//! is given, and a stop signal read from the signalfd ends the wait (the fd is
//! watched by the runtime's reactor, so nothing is lost between calls).

use crate::bus::{CallError, HANDSHAKE_TIMEOUT, Reply};
use crate::wire::Call;
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use std::future::Future;
use std::os::fd::AsFd;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// An authenticated connection that has said `Hello`.
pub struct Connection {
    conn: zbus::Connection,
}

impl Connection {
    /// Connects to the first endpoint of `address` that accepts, and
    /// authenticates (zbus pipelines `AUTH`, `BEGIN` and `Hello`, and waits for
    /// `Hello`'s reply).
    pub fn open(address: &str) -> Result<Self, String> {
        let sock = crate::bus::connect(address)?;
        zbus::block_on(async move {
            let build = zbus::connection::Builder::unix_stream(sock).build();
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, build).await {
                Ok(Ok(conn)) => Ok(Self { conn }),
                Ok(Err(e)) => Err(format!("authenticating: {e}")),
                Err(_) => Err(format!(
                    "authenticating: no answer from the bus within {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                )),
            }
        })
    }

    /// Sends `call` and waits for its reply, at most `timeout` (`None`: as
    /// long as it takes), or until `interrupt` reports a signal.
    pub fn call(
        &mut self,
        call: &Call<'_>,
        timeout: Option<Duration>,
        interrupt: Option<&SignalFd>,
    ) -> Result<Reply, CallError> {
        let &[a, b, c] = call.args else {
            return Err(CallError::Io(format!(
                "{} takes three strings, not {}",
                call.member,
                call.args.len()
            )));
        };
        let conn = &self.conn;
        zbus::block_on(async move {
            let args = (a, b, c);
            let reply = conn.call_method(
                Some(call.destination),
                call.path,
                Some(call.interface),
                call.member,
                &args,
            );
            let stop = async {
                match interrupt {
                    Some(sfd) => next_signal(sfd).await,
                    None => std::future::pending().await,
                }
            };
            let deadline = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            let (mut reply, mut stop, mut deadline) = (pin!(reply), pin!(stop), pin!(deadline));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = reply.as_mut().poll(cx) {
                    return Poll::Ready(reply_of(conn, r));
                }
                if let Poll::Ready(r) = stop.as_mut().poll(cx) {
                    return Poll::Ready(r.and_then(|sig| Err(CallError::Interrupted(sig))));
                }
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(CallError::TimedOut));
                }
                Poll::Pending
            })
            .await
        })
    }
}

/// The next signal read from `sfd` (its signals are blocked, so they wait there).
async fn next_signal(sfd: &SignalFd) -> Result<Signal, CallError> {
    let io = |e: std::io::Error| CallError::Io(e.to_string());
    // SAFETY: the fd is borrowed from `sfd`, which outlives `watched`, so it
    // stays open and the same file for as long as the runtime watches it.
    let watched = unsafe { AsyncFd::register_with_interest(sfd.as_fd(), Interest::READABLE) }
        .map_err(|e| io(e.into()))?;
    loop {
        let mut ready = watched.readable().await.map_err(io)?;
        match sfd.read_signal() {
            Ok(Some(info)) => {
                if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                    return Ok(sig);
                }
            }
            Ok(None) => ready.clear_ready(),
            Err(e) => return Err(CallError::Io(e.to_string())),
        }
    }
}

/// A call's outcome in the terms of [`crate::bus`]: an error reply is a
/// `(name, message)`, a lost connection is `Closed`.
fn reply_of(conn: &zbus::Connection, r: zbus::Result<zbus::Message>) -> Result<Reply, CallError> {
    use zbus::DBusError;
    match r {
        Ok(_) => Ok(Ok(())),
        Err(zbus::Error::MethodError(name, message, _)) => {
            Ok(Err((name.to_string(), message.unwrap_or_default())))
        }
        Err(zbus::Error::FDO(e)) => Ok(Err((
            e.name().to_string(),
            e.description().unwrap_or_default().to_string(),
        ))),
        Err(zbus::Error::InputOutput(_)) if conn.is_closed() => Err(CallError::Closed),
        Err(e) => Err(CallError::Io(e.to_string())),
    }
}
