//! A framed agent ↔ manager connection over any byte stream, the handshake
//! for both sides, and the TCP socket options both ends set (`IP_RECVERR`,
//! `TCP_USER_TIMEOUT`: see [`crate::liveness`] for why).
//!
//! Every wait here has a timeout: a peer that connects and says nothing, or
//! says something that is not drover, is dropped with a typed error.
//!
//! The manager reads the hello — the first frame of a connection, sent
//! before anything is known about the peer — with its own cap,
//! [`HELLO_MAX_LEN`]: the 4-byte header is read alone and checked, then
//! exactly the announced body, so a peer announcing a 1 MiB hello costs
//! the manager 4 bytes read and no buffer. Only after the hello does the
//! connection switch to the normal codec and [`crate::MAX_FRAME_LEN`]. The
//! agent reads the manager's answer the same way, capped at
//! [`WELCOME_MAX_LEN`]: a peer posing as the manager costs it no more.

use crate::codec::{FrameCodec, FrameError, Frames, HEADER_LEN, decode_body, encode_body};
use crate::handshake::{
    Accepted, HELLO_MAX_LEN, Hello, MAGIC, Outcome, PROTOCOL_VERSION, RefuseReason,
    WELCOME_MAX_LEN, Welcome, read_prefix,
};
use crate::message::{ToAgent, ToManager};
use bytes::BytesMut;
use futures::SinkExt;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_util::codec::{Decoder, Encoder, Framed, FramedParts};

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
    /// The manager stands by and parked the link ([`Outcome::Parked`]);
    /// only from [`agent_handshake`], which does not wait on a parked link
    /// ([`agent_hello`] does).
    #[error("the manager stands by: {message}")]
    Parked { message: String },
    /// A parked peer sent something: nothing may come before the verdict.
    #[error("the agent sent data on a parked link")]
    Unexpected,
    /// The manager answered the hello with a TLS record: it runs TLS and this
    /// agent does not (read from the "frame length" a TLS record header makes).
    #[error(
        "the manager answered with TLS, and this agent speaks plaintext: configure the agent's \
         TLS keys (TLSCertificate, TLSPrivateKey, TLSCertificateAuthority)"
    )]
    PeerSpeaksTls,
    /// A peer opened with a TLS record on a plaintext link (read the same way).
    #[error(
        "the peer started a TLS handshake, and this link is plaintext: configure TLS on the \
         manager too, or none on the agent"
    )]
    PeerStartsTls,
    /// The answer to the hello announces more than any welcome can be
    /// ([`WELCOME_MAX_LEN`]); refused from its header, nothing more is read.
    #[error(
        "the manager's answer to the hello announces {len} bytes, more than a drover welcome \
         can be ({max} bytes): not a drover manager"
    )]
    WelcomeTooLarge { len: usize, max: usize },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Whether a frame length read from the wire is the first four bytes of a TLS
/// record header: content type 20–24 (change cipher spec, alert, handshake,
/// application data, heartbeat), then protocol version 3.x.
fn is_tls_record_header(len: usize) -> bool {
    let bytes = (len as u64).to_be_bytes();
    (len >> 32) == 0 && (0x14..=0x18).contains(&bytes[4]) && bytes[5] == 0x03 && bytes[6] <= 0x04
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

/// `TCP_USER_TIMEOUT` on a link's TCP socket: data it sent that stays
/// unacknowledged for `timeout` (the rule: [`crate::liveness::user_timeout`])
/// fails the connection in the kernel. Both ends set it.
pub fn set_user_timeout(stream: &tokio::net::TcpStream, timeout: Duration) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    setsockopt(stream, sockopt::TcpUserTimeout, &ms).map_err(std::io::Error::from)
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

/// The first frame's body, read with the cap `max` checked on the header
/// before any body byte is read: reads exactly the header and the body, no
/// byte more, so the caller can go on with the rest of the stream.
pub async fn read_bounded_frame<IO: AsyncRead + Unpin>(
    io: &mut IO,
    max: usize,
) -> Result<Vec<u8>, HandshakeError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = io
            .read(&mut header[got..])
            .await
            .map_err(|e| HandshakeError::Frame(FrameError::Io(e)))?;
        if n == 0 {
            return Err(if got == 0 {
                HandshakeError::Closed
            } else {
                HandshakeError::Frame(FrameError::Truncated)
            });
        }
        got += n;
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(HandshakeError::Frame(FrameError::TooLarge { len, max }));
    }
    let mut body = vec![0; len];
    io.read_exact(&mut body).await.map_err(|e| {
        HandshakeError::Frame(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        })
    })?;
    Ok(body)
}

/// Checks and decodes a hello body: the prefix first (so another protocol
/// version is told as such), then the whole [`Hello`]. Pure: the fuzz
/// target and the property tests drive it directly.
pub fn decode_hello(body: &[u8]) -> Result<Hello, HandshakeError> {
    check_prefix(body, "agent")?;
    Ok(decode_body::<Hello>(body)?)
}

/// What a manager answered a hello with ([`agent_hello`]).
// Made once per connection and taken apart at once: boxing the session
// would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Answer<IO> {
    /// A session: messages flow from now on.
    Accepted(AgentFramed<IO>, Accepted),
    /// The manager stands by: the link stays open, and
    /// [`ParkedLink::verdict`] waits for what it says next.
    Parked(ParkedLink<IO>, String),
}

/// A link a standby holds for the agent ([`Outcome::Parked`]).
pub struct ParkedLink<IO> {
    io: IO,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> ParkedLink<IO> {
    /// Waits, without a deadline, for the manager's next welcome on this
    /// link: accepted when it leads, parked again (another leader), or a
    /// refusal. A dead peer is seen by TCP keepalive, as on a session.
    pub async fn verdict(mut self) -> Result<Answer<IO>, HandshakeError> {
        let welcome = read_welcome_body(&mut self.io).await?;
        answer(self.io, welcome)
    }
}

/// Reads and checks one welcome (capped at [`WELCOME_MAX_LEN`]).
async fn read_welcome_body<IO: AsyncRead + Unpin>(io: &mut IO) -> Result<Welcome, HandshakeError> {
    let reply = match read_bounded_frame(io, WELCOME_MAX_LEN).await {
        Err(HandshakeError::Frame(FrameError::TooLarge { len, max })) => {
            return Err(if is_tls_record_header(len) {
                HandshakeError::PeerSpeaksTls
            } else {
                HandshakeError::WelcomeTooLarge { len, max }
            });
        }
        reply => reply?,
    };
    check_prefix(&reply, "manager")?;
    Ok(decode_body(&reply)?)
}

fn answer<IO>(io: IO, welcome: Welcome) -> Result<Answer<IO>, HandshakeError> {
    match welcome.outcome {
        Outcome::Accepted(accepted) => Ok(Answer::Accepted(
            Framed::new(io, FrameCodec::default()),
            accepted,
        )),
        Outcome::Parked { message } => Ok(Answer::Parked(ParkedLink { io }, message)),
        Outcome::Refused { reason, message } => Err(HandshakeError::Refused { reason, message }),
    }
}

/// Agent side: send `hello`, read the manager's answer (within `timeout`):
/// a session, a parked link, or an error. A hello over [`HELLO_MAX_LEN`]
/// (an absurd agent version) is refused here, before anything is sent,
/// rather than by the manager.
pub async fn agent_hello<IO: AsyncRead + AsyncWrite + Unpin>(
    io: IO,
    hello: &Hello,
    timeout: Duration,
) -> Result<Answer<IO>, HandshakeError> {
    let mut framed = Framed::new(io, RawCodec::default());
    let body = encode_body(hello)?;
    if body.len() > HELLO_MAX_LEN {
        return Err(HandshakeError::Frame(FrameError::TooLarge {
            len: body.len(),
            max: HELLO_MAX_LEN,
        }));
    }
    tokio::time::timeout(timeout, framed.send(body))
        .await
        .map_err(|_| HandshakeError::Timeout(timeout))??;
    // Nothing was read through `framed`: its read buffer is empty.
    let mut io = framed.into_inner();
    let welcome = tokio::time::timeout(timeout, read_welcome_body(&mut io))
        .await
        .map_err(|_| HandshakeError::Timeout(timeout))??;
    answer(io, welcome)
}

/// [`agent_hello`] for peers that want a session or nothing: a parked
/// answer is [`HandshakeError::Parked`] (the link is closed).
pub async fn agent_handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    io: IO,
    hello: &Hello,
    timeout: Duration,
) -> Result<(AgentFramed<IO>, Accepted), HandshakeError> {
    match agent_hello(io, hello, timeout).await? {
        Answer::Accepted(framed, accepted) => Ok((framed, accepted)),
        Answer::Parked(_, message) => Err(HandshakeError::Parked { message }),
    }
}

/// Manager side, step 1: read the agent's hello, at most [`HELLO_MAX_LEN`]
/// bytes of body (see the module doc); `timeout` bounds the whole read. A
/// version mismatch, a non-drover peer or an oversized hello is answered
/// with a refusal (best effort) before the error is returned, so the agent
/// learns why; a timeout or a closed connection is not answered.
pub async fn manager_read_hello<IO: AsyncRead + AsyncWrite + Unpin>(
    mut io: IO,
    timeout: Duration,
) -> Result<(PendingAgent<IO>, Hello), HandshakeError> {
    let read = tokio::time::timeout(timeout, read_bounded_frame(&mut io, HELLO_MAX_LEN)).await;
    let checked = match read {
        Err(_) => return Err(HandshakeError::Timeout(timeout)),
        Ok(Err(e @ (HandshakeError::Closed | HandshakeError::Frame(FrameError::Io(_))))) => {
            return Err(e);
        }
        Ok(Err(HandshakeError::Frame(FrameError::TooLarge { len, .. })))
            if is_tls_record_header(len) =>
        {
            Err(HandshakeError::PeerStartsTls)
        }
        Ok(read) => read.and_then(|body| decode_hello(&body)),
    };
    // No read buffer is allocated until the session reads its first message.
    let mut framed = Framed::from_parts(FramedParts::new::<Vec<u8>>(io, RawCodec::default()));
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

    /// Manager side, while standing by: tells the agent who leads and keeps
    /// the link ([`Outcome::Parked`]); the verdict comes later, through
    /// [`PendingAgent::accept`] or [`PendingAgent::refuse`], or
    /// [`PendingAgent::park`] again.
    pub async fn park(&mut self, message: &str, timeout: Duration) -> Result<(), HandshakeError> {
        let body = encode_body(&Welcome::parked(message))?;
        tokio::time::timeout(timeout, self.framed.send(body))
            .await
            .map_err(|_| HandshakeError::Timeout(timeout))??;
        Ok(())
    }

    /// Resolves when a parked peer is gone: it closed the link, the link
    /// failed, or it sent anything (an agent sends nothing until the
    /// verdict). Cancel-safe; reads nothing into a buffer that matters, as
    /// a well-behaved agent sends no byte.
    pub async fn gone(&mut self) -> HandshakeError {
        use futures::StreamExt;
        match self.framed.next().await {
            None => HandshakeError::Closed,
            Some(Err(e)) => HandshakeError::Frame(e),
            Some(Ok(_)) => HandshakeError::Unexpected,
        }
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
    use futures::StreamExt;

    const T: Duration = Duration::from_secs(2);

    fn accepted() -> Accepted {
        Accepted {
            session_id: 7,
            heartbeat_interval_ms: 1000,
            heartbeat_threshold_ms: 5000,
            manager_version: "test".into(),
            resync_interval_ms: 0,
            epoch: 4,
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
    async fn a_parked_link_carries_its_verdict_later() {
        let (a, m) = tokio::io::duplex(4096);
        let agent = tokio::spawn(async move { agent_hello(a, &Hello::new("n1", "x"), T).await });
        let (mut pending, _) = manager_read_hello(m, T).await.unwrap();
        pending.park("mgr-a:842 leads (epoch 3)", T).await.unwrap();
        let Ok(Answer::Parked(link, message)) = agent.await.unwrap() else {
            panic!("not parked");
        };
        assert_eq!(message, "mgr-a:842 leads (epoch 3)");
        // Parked again (another leader), then accepted on the same link.
        let verdict = tokio::spawn(link.verdict());
        pending.park("no leader known", T).await.unwrap();
        let Ok(Answer::Parked(link, message)) = verdict.await.unwrap() else {
            panic!("not parked again");
        };
        assert_eq!(message, "no leader known");
        let verdict = tokio::spawn(link.verdict());
        let mut mf = pending.accept(accepted(), T).await.unwrap();
        let Ok(Answer::Accepted(mut af, acc)) = verdict.await.unwrap() else {
            panic!("not accepted");
        };
        assert_eq!(acc.epoch, 4);
        af.send(ToManager::Heartbeat).await.unwrap();
        assert_eq!(mf.next().await.unwrap().unwrap(), ToManager::Heartbeat);
    }

    #[tokio::test]
    async fn a_parked_peer_that_speaks_or_leaves_is_gone() {
        // It leaves.
        let (a, m) = tokio::io::duplex(4096);
        let agent = tokio::spawn(async move { agent_hello(a, &Hello::new("n1", "x"), T).await });
        let (mut pending, _) = manager_read_hello(m, T).await.unwrap();
        pending.park("standing by", T).await.unwrap();
        drop(agent.await.unwrap());
        assert!(matches!(pending.gone().await, HandshakeError::Closed));
        // It sends garbage instead of waiting.
        let (a, m) = tokio::io::duplex(4096);
        let (mut pending, mut agent) = {
            let hello = frame(&encode_body(&Hello::new("n1", "x")).unwrap());
            let mut a = a;
            tokio::io::AsyncWriteExt::write_all(&mut a, &hello)
                .await
                .unwrap();
            let (p, _) = manager_read_hello(m, T).await.unwrap();
            (p, a)
        };
        pending.park("standing by", T).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut agent, &frame(b"junk"))
            .await
            .unwrap();
        assert!(matches!(pending.gone().await, HandshakeError::Unexpected));
        // A plain handshake does not wait on a parked link.
        let (a, m) = tokio::io::duplex(4096);
        let agent =
            tokio::spawn(async move { agent_handshake(a, &Hello::new("n1", "x"), T).await });
        let (mut pending, _) = manager_read_hello(m, T).await.unwrap();
        pending.park("standing by", T).await.unwrap();
        match agent.await.unwrap() {
            Err(HandshakeError::Parked { message }) => assert_eq!(message, "standing by"),
            other => panic!("unexpected {:?}", other.map(|(_, a)| a)),
        }
    }

    #[tokio::test]
    async fn a_garbage_verdict_on_a_parked_link_is_an_error() {
        for (body, what) in [
            (b"DRVR".to_vec(), "a cut prefix"),
            (
                encode_body(&(MAGIC, PROTOCOL_VERSION, 9u8)).unwrap(),
                "an unknown outcome",
            ),
            (
                encode_body(&(MAGIC, PROTOCOL_VERSION - 1, 0u8)).unwrap(),
                "another version",
            ),
        ] {
            let (a, m) = tokio::io::duplex(4096);
            let agent =
                tokio::spawn(async move { agent_hello(a, &Hello::new("n1", "x"), T).await });
            let (mut pending, _) = manager_read_hello(m, T).await.unwrap();
            pending.park("standing by", T).await.unwrap();
            let Ok(Answer::Parked(link, _)) = agent.await.unwrap() else {
                panic!("not parked");
            };
            let mut raw = pending.framed.into_inner();
            tokio::io::AsyncWriteExt::write_all(&mut raw, &frame(&body))
                .await
                .unwrap();
            assert!(link.verdict().await.is_err(), "{what}");
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

    /// A peer that has `data` to send and counts what the manager reads;
    /// what the manager writes is kept.
    struct Counting {
        data: Vec<u8>,
        read: usize,
        written: Vec<u8>,
    }

    impl AsyncRead for Counting {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = buf.remaining().min(self.data.len() - self.read);
            let start = self.read;
            buf.put_slice(&self.data[start..start + n]);
            self.read += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.written.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_1_mib_first_frame_is_refused_from_its_header() {
        // A whole 1 MiB hello (the normal frame cap) is available to read.
        let mut data = (1u32 << 20).to_be_bytes().to_vec();
        data.resize(4 + (1 << 20), b'x');
        let mut peer = Counting {
            data,
            read: 0,
            written: Vec::new(),
        };
        let err = manager_read_hello(&mut peer, T).await.err().unwrap();
        assert!(
            matches!(
                err,
                HandshakeError::Frame(FrameError::TooLarge {
                    len: 1_048_576,
                    max: HELLO_MAX_LEN
                })
            ),
            "{err}"
        );
        assert!(
            peer.read <= HEADER_LEN + HELLO_MAX_LEN,
            "read {} bytes",
            peer.read
        );
        assert_eq!(peer.read, HEADER_LEN, "only the header was read");
        // The peer is told why, in a Welcome it can decode.
        let mut frames = Frames::default();
        let mut written = BytesMut::from(&peer.written[..]);
        let body = frames.decode_frame(&mut written).unwrap().unwrap();
        match decode_body::<Welcome>(&body).unwrap().outcome {
            Outcome::Refused {
                reason: RefuseReason::BadHandshake,
                message,
            } => assert!(message.contains("exceeds the maximum of 512"), "{message}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// `body` with its frame header.
    fn frame(body: &[u8]) -> Vec<u8> {
        let mut data = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        data.extend_from_slice(body);
        data
    }

    #[tokio::test]
    async fn an_oversized_welcome_is_refused_from_its_header() {
        // Announced and available to read: one byte over the cap, and 1 MiB.
        for len in [WELCOME_MAX_LEN + 1, 1 << 20] {
            let mut peer = Counting {
                data: frame(&vec![b'x'; len]),
                read: 0,
                written: Vec::new(),
            };
            let err = agent_handshake(&mut peer, &Hello::new("n1", "x"), T)
                .await
                .err()
                .unwrap();
            assert!(
                matches!(err, HandshakeError::WelcomeTooLarge { len: l, max: WELCOME_MAX_LEN } if l == len),
                "{err}"
            );
            assert!(err.to_string().contains("not a drover manager"), "{err}");
            assert_eq!(peer.read, HEADER_LEN, "only the header was read");
        }
    }

    #[tokio::test]
    async fn the_largest_welcomes_are_read_exactly() {
        // A refusal at the cap reaches the agent whole.
        let message = "m".repeat(crate::handshake::REFUSAL_MESSAGE_MAX);
        let body = encode_body(&Welcome::refused(
            RefuseReason::UnknownNode,
            message.clone(),
        ))
        .unwrap();
        // The cap but for the version's varint at its longest (5 bytes, here 1).
        assert_eq!(body.len(), WELCOME_MAX_LEN - 4);
        let mut peer = Counting {
            data: frame(&body),
            read: 0,
            written: Vec::new(),
        };
        match agent_handshake(&mut peer, &Hello::new("n1", "x"), T).await {
            Err(HandshakeError::Refused { message: got, .. }) => assert_eq!(got, message),
            other => panic!("unexpected {:?}", other.map(|(_, a)| a)),
        }
        // An acceptance with the longest version; the frame right behind it
        // is the session's first message, not lost to the handshake's read.
        let welcome = Welcome::accepted(Accepted {
            manager_version: "v".repeat(crate::handshake::MANAGER_VERSION_MAX),
            ..accepted()
        });
        let mut data = frame(&encode_body(&welcome).unwrap());
        data.extend(frame(&encode_body(&ToAgent::Heartbeat).unwrap()));
        let mut peer = Counting {
            data,
            read: 0,
            written: Vec::new(),
        };
        let (mut framed, got) = agent_handshake(&mut peer, &Hello::new("n1", "x"), T)
            .await
            .unwrap();
        assert_eq!(
            got.manager_version.len(),
            crate::handshake::MANAGER_VERSION_MAX
        );
        assert_eq!(framed.next().await.unwrap().unwrap(), ToAgent::Heartbeat);
    }

    #[tokio::test]
    async fn the_largest_legal_hello_is_read_exactly() {
        let hello = Hello::new(
            "n".repeat(crate::names::NODE_NAME_MAX),
            "v".repeat(crate::handshake::AGENT_VERSION_MAX),
        );
        let body = encode_body(&hello).unwrap();
        let mut data = (body.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(&body);
        // What follows the hello is left for the session.
        data.extend_from_slice(b"after");
        let mut peer = Counting {
            data,
            read: 0,
            written: Vec::new(),
        };
        let (_, got) = manager_read_hello(&mut peer, T).await.unwrap();
        assert_eq!(got, hello);
        assert_eq!(peer.read, HEADER_LEN + body.len());
    }

    #[tokio::test]
    async fn a_hello_cut_short_is_truncated_and_an_empty_stream_closed() {
        for (data, want_closed) in [
            (vec![], true),
            (vec![0, 0], false),
            (vec![0, 0, 0, 9, 1, 2], false),
        ] {
            let mut peer = Counting {
                data,
                read: 0,
                written: Vec::new(),
            };
            let err = manager_read_hello(&mut peer, T).await.err().unwrap();
            if want_closed {
                assert!(matches!(err, HandshakeError::Closed), "{err}");
            } else {
                assert!(
                    matches!(err, HandshakeError::Frame(FrameError::Truncated)),
                    "{err}"
                );
            }
        }
    }

    #[tokio::test]
    async fn an_agent_does_not_send_an_oversized_hello() {
        let (a, _m) = tokio::io::duplex(4096);
        let hello = Hello::new("n1", "v".repeat(HELLO_MAX_LEN));
        let err = agent_handshake(a, &hello, T).await.err().unwrap();
        assert!(
            matches!(err, HandshakeError::Frame(FrameError::TooLarge { .. })),
            "{err}"
        );
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

    #[tokio::test]
    async fn a_tls_answer_to_a_plaintext_hello_says_so() {
        // What a TLS manager sends a plaintext agent: a fatal alert record.
        let (a, mut m) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let mut hello = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut m, &mut hello).await;
            let alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];
            let _ = tokio::io::AsyncWriteExt::write_all(&mut m, &alert).await;
        });
        let err = agent_handshake(a, &Hello::new("n1", "1"), T)
            .await
            .err()
            .unwrap();
        assert!(matches!(err, HandshakeError::PeerSpeaksTls), "{err}");
        assert!(err.to_string().contains("TLSCertificate"), "{err}");
        // Only TLS record headers count; any other huge length stays TooLarge.
        assert!(is_tls_record_header(0x1603_0100));
        assert!(is_tls_record_header(0x1503_0300));
        assert!(!is_tls_record_header(0x0010_0001));
        assert!(!is_tls_record_header(0x1903_0300));
        assert!(!is_tls_record_header(0x1504_0300 | 0x0001_0000));
        assert!(!is_tls_record_header(0x1_1503_0300));
    }

    #[tokio::test]
    async fn a_tls_client_hello_on_a_plaintext_link_says_so() {
        let (mut a, m) = tokio::io::duplex(4096);
        // A TLS record header announcing a ClientHello, then some of it.
        tokio::io::AsyncWriteExt::write_all(&mut a, &[0x16, 0x03, 0x01, 0x00, 0xf4, 0x01])
            .await
            .unwrap();
        let err = manager_read_hello(m, T).await.err().unwrap();
        assert!(matches!(err, HandshakeError::PeerStartsTls), "{err}");
    }
}
