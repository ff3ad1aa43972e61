//! A framed agent ↔ manager connection over any byte stream, the handshake
//! for both sides, and the TCP socket options both ends set.
//!
//! Every wait here has a timeout: a peer that connects and says nothing, or
//! says something that is not drover, is dropped with a typed error.

use crate::codec::{FrameCodec, FrameError, Frames, decode_body, encode_body};
use crate::handshake::{
    Accepted, Hello, MAGIC, Outcome, PROTOCOL_VERSION, RefuseReason, Welcome, read_prefix,
};
use crate::message::{ToAgent, ToManager};
use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Decoder, Encoder, Framed};

/// The agent's end: sends [`ToManager`], receives [`ToAgent`].
pub type AgentFramed<IO> = Framed<IO, FrameCodec<ToAgent, ToManager>>;
/// The manager's end: sends [`ToAgent`], receives [`ToManager`].
pub type ManagerFramed<IO> = Framed<IO, FrameCodec<ToManager, ToAgent>>;

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no handshake from the peer within {0:?}")]
    Timeout(Duration),
    #[error("the peer closed the connection during the handshake")]
    Closed,
    #[error("the peer is not a drover {0} (bad magic bytes)")]
    NotDrover(&'static str),
    #[error("protocol version mismatch: we speak {ours}, the peer speaks {theirs}")]
    VersionMismatch { ours: u32, theirs: u32 },
    #[error("refused by the manager ({reason:?}): {message}")]
    Refused {
        reason: RefuseReason,
        message: String,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Raw frames for the handshake, before the message types are known.
#[derive(Default)]
struct RawCodec(Frames);

impl Decoder for RawCodec {
    type Item = BytesMut;
    type Error = FrameError;
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        self.0.decode_frame(src)
    }
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        self.0.decode_frame_eof(src)
    }
}

impl Encoder<Vec<u8>> for RawCodec {
    type Error = FrameError;
    fn encode(&mut self, body: Vec<u8>, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.0.encode_frame(&body, dst)
    }
}

/// `IP_RECVERR` / `IPV6_RECVERR` on a link's TCP socket: ICMP errors (host
/// unreachable, …) end the connection at once instead of after
/// retransmission timeouts. Both ends set it (config `IPReceiveErrors`).
pub fn set_recv_err(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let set = match stream.local_addr()? {
        std::net::SocketAddr::V4(_) => setsockopt(stream, sockopt::Ipv4RecvErr, &true),
        std::net::SocketAddr::V6(_) => setsockopt(stream, sockopt::Ipv6RecvErr, &true),
    };
    set.map_err(std::io::Error::from)
}

async fn next_raw<IO: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<IO, RawCodec>,
    timeout: Duration,
) -> Result<BytesMut, HandshakeError> {
    match tokio::time::timeout(timeout, framed.next()).await {
        Err(_) => Err(HandshakeError::Timeout(timeout)),
        Ok(None) => Err(HandshakeError::Closed),
        Ok(Some(frame)) => Ok(frame?),
    }
}

fn check_prefix(body: &[u8], what: &'static str) -> Result<(), HandshakeError> {
    let (magic, version) = read_prefix(body).map_err(|_| HandshakeError::NotDrover(what))?;
    if magic != MAGIC {
        return Err(HandshakeError::NotDrover(what));
    }
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    Ok(())
}

/// Agent side: send `hello`, wait for the manager's answer.
pub async fn agent_handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    io: IO,
    hello: &Hello,
    timeout: Duration,
) -> Result<(AgentFramed<IO>, Accepted), HandshakeError> {
    let mut framed = Framed::new(io, RawCodec::default());
    let body = encode_body(hello)?;
    tokio::time::timeout(timeout, framed.send(body))
        .await
        .map_err(|_| HandshakeError::Timeout(timeout))??;
    let reply = next_raw(&mut framed, timeout).await?;
    check_prefix(&reply, "manager")?;
    let welcome: Welcome = decode_body(&reply)?;
    match welcome.outcome {
        Outcome::Accepted(accepted) => Ok((framed.map_codec(|_| FrameCodec::default()), accepted)),
        Outcome::Refused { reason, message } => Err(HandshakeError::Refused { reason, message }),
    }
}

/// Manager side, step 1: read the agent's hello. A version mismatch or a
/// non-drover peer is answered with a refusal (best effort) before the error
/// is returned, so the agent learns why.
pub async fn manager_read_hello<IO: AsyncRead + AsyncWrite + Unpin>(
    io: IO,
    timeout: Duration,
) -> Result<(PendingAgent<IO>, Hello), HandshakeError> {
    let mut framed = Framed::new(io, RawCodec::default());
    let body = next_raw(&mut framed, timeout).await?;
    let checked = check_prefix(&body, "agent").and_then(|()| Ok(decode_body::<Hello>(&body)?));
    match checked {
        Ok(hello) => Ok((PendingAgent { framed }, hello)),
        Err(err) => {
            let (reason, message) = match &err {
                HandshakeError::VersionMismatch { .. } => {
                    (RefuseReason::VersionMismatch, err.to_string())
                }
                _ => (RefuseReason::BadHandshake, format!("bad handshake: {err}")),
            };
            if let Ok(refusal) = encode_body(&Welcome::refused(reason, message)) {
                let _ = tokio::time::timeout(timeout, framed.send(refusal)).await;
            }
            Err(err)
        }
    }
}

/// A connection whose hello was read and which waits for the manager's verdict.
pub struct PendingAgent<IO> {
    framed: Framed<IO, RawCodec>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> PendingAgent<IO> {
    pub fn get_ref(&self) -> &IO {
        self.framed.get_ref()
    }

    /// Manager side, step 2a: accept; the connection carries messages from now on.
    pub async fn accept(
        mut self,
        accepted: Accepted,
        timeout: Duration,
    ) -> Result<ManagerFramed<IO>, HandshakeError> {
        let body = encode_body(&Welcome::accepted(accepted))?;
        tokio::time::timeout(timeout, self.framed.send(body))
            .await
            .map_err(|_| HandshakeError::Timeout(timeout))??;
        Ok(self.framed.map_codec(|_| FrameCodec::default()))
    }

    /// Manager side, step 2b: refuse with a reason the agent will log.
    pub async fn refuse(mut self, reason: RefuseReason, message: &str, timeout: Duration) {
        if let Ok(body) = encode_body(&Welcome::refused(reason, message)) {
            let _ = tokio::time::timeout(timeout, self.framed.send(body)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(2);

    fn accepted() -> Accepted {
        Accepted {
            session_id: 7,
            heartbeat_interval_ms: 1000,
            heartbeat_threshold_ms: 5000,
            manager_version: "test".into(),
        }
    }

    #[tokio::test]
    async fn accept_then_messages_flow() {
        let (a, m) = tokio::io::duplex(4096);
        let agent =
            tokio::spawn(async move { agent_handshake(a, &Hello::new("n1", "x"), T).await });
        let (pending, hello) = manager_read_hello(m, T).await.unwrap();
        assert_eq!(hello.node, "n1");
        let mut mf = pending.accept(accepted(), T).await.unwrap();
        let (mut af, acc) = agent.await.unwrap().unwrap();
        assert_eq!(acc.session_id, 7);
        af.send(ToManager::Heartbeat).await.unwrap();
        assert_eq!(mf.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        mf.send(ToAgent::Heartbeat).await.unwrap();
        assert_eq!(af.next().await.unwrap().unwrap(), ToAgent::Heartbeat);
    }

    #[tokio::test]
    async fn refusal_reaches_the_agent() {
        let (a, m) = tokio::io::duplex(4096);
        let agent =
            tokio::spawn(async move { agent_handshake(a, &Hello::new("n1", "x"), T).await });
        let (pending, _) = manager_read_hello(m, T).await.unwrap();
        pending
            .refuse(RefuseReason::UnknownNode, "node n1 is not allowed", T)
            .await;
        match agent.await.unwrap() {
            Err(HandshakeError::Refused {
                reason: RefuseReason::UnknownNode,
                message,
            }) => {
                assert!(message.contains("not allowed"))
            }
            other => panic!("unexpected {other:?}", other = other.map(|(_, a)| a)),
        }
    }

    #[tokio::test]
    async fn version_mismatch_is_clear_on_both_sides() {
        let (a, m) = tokio::io::duplex(4096);
        let mut hello = Hello::new("n1", "x");
        hello.protocol_version = PROTOCOL_VERSION + 1;
        let agent = tokio::spawn(async move { agent_handshake(a, &hello, T).await });
        let err = manager_read_hello(m, T).await.err().unwrap();
        assert!(
            matches!(err, HandshakeError::VersionMismatch { theirs, .. } if theirs == PROTOCOL_VERSION + 1)
        );
        match agent.await.unwrap() {
            Err(HandshakeError::Refused {
                reason: RefuseReason::VersionMismatch,
                ..
            }) => {}
            other => panic!("unexpected {:?}", other.map(|(_, a)| a)),
        }
    }

    #[tokio::test]
    async fn garbage_is_not_drover_and_silence_times_out() {
        let (mut a, m) = tokio::io::duplex(4096);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"\0\0\0\x05GET /")
            .await
            .unwrap();
        let err = manager_read_hello(m, T).await.err().unwrap();
        assert!(matches!(err, HandshakeError::NotDrover(_)), "{err}");

        let (_a, m) = tokio::io::duplex(4096);
        let err = manager_read_hello(m, Duration::from_millis(50))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, HandshakeError::Timeout(_)), "{err}");
    }
}
