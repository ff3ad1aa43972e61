//! The frames an agent sends, read so that a lone heartbeat does not wake
//! the manager.
//!
//! At fleet size reading heartbeats is most of the manager's idle work:
//! 5,000 a second at 10,000 nodes, each a wake-up and a read. On a plaintext
//! link [`Frames`] asks the kernel to wake the reader only once more than a
//! heartbeat frame waits in the socket (`SO_RCVLOWAT`), so it reads every
//! other heartbeat (the protocol rules that make this safe are in
//! `drover_protocol::liveness`). Invariants:
//!
//! * **Nothing but a heartbeat waits.** The mark is raised only while the
//!   reader stands between frames with nothing buffered; every frame but a
//!   heartbeat is longer than the mark's threshold, so it wakes the reader on
//!   its own. Inside a frame (a header or part of a body buffered) the mark is
//!   one byte, so the rest of a frame is read as soon as any of it comes; and
//!   setting the mark makes the kernel signal bytes that are already there.
//! * **A heartbeat waits for one send at most**: the next frame of the agent,
//!   which comes within a third of the manager's threshold.
//! * The end of the stream and socket errors wake the reader whatever the
//!   mark (the kernel signals them apart from data).
//! * Without a socket to mark (TLS: the record layer hides frame boundaries
//!   from the socket; tests), every frame is read as it comes.
//! * Decoding is [`FrameCodec`]'s: frame cap, typed errors, a stream that
//!   ends inside a frame is [`FrameError::Truncated`].

use bytes::BytesMut;
use drover_protocol::liveness::AGENT_HEARTBEAT_FRAME_LEN;
use drover_protocol::{FrameCodec, FrameError, ToAgent, ToManager};
use futures::Stream;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncRead;
use tokio_util::codec::Decoder;

/// The mark between frames: one byte more than a heartbeat frame.
const BETWEEN_FRAMES: usize = AGENT_HEARTBEAT_FRAME_LEN + 1;

/// The least room a read gets (a frame's body reserves its own room once
/// its header is read).
const MIN_READ: usize = 64;

/// The agent's frames, decoded (see the module docs).
pub struct Frames<R> {
    io: R,
    codec: FrameCodec<ToManager, ToAgent>,
    buf: BytesMut,
    mark: Option<LowMark>,
    done: bool,
}

impl<R: AsyncRead + Unpin> Frames<R> {
    /// Frames read from `io`, starting with what was already read past the
    /// handshake (`buffered`), into a buffer of `capacity` bytes to begin
    /// with. `socket` is the plaintext TCP socket under
    /// `io`, whose receive mark the reader may raise; it must stay open as
    /// long as `io` does.
    pub fn new(io: R, buffered: &[u8], capacity: usize, socket: Option<RawFd>) -> Self {
        let mut buf = BytesMut::with_capacity(capacity.max(buffered.len()));
        buf.extend_from_slice(buffered);
        Self {
            io,
            codec: FrameCodec::default(),
            buf,
            mark: socket.map(LowMark::new),
            done: false,
        }
    }

    /// The receive mark the socket has now (1 without a mark).
    #[cfg(test)]
    fn mark(&self) -> usize {
        self.mark.as_ref().map_or(1, |m| m.now)
    }
}

impl<R: AsyncRead + Unpin> Stream for Frames<R> {
    type Item = Result<ToManager, FrameError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match this.codec.decode(&mut this.buf) {
                Ok(Some(msg)) => return Poll::Ready(Some(Ok(msg))),
                Ok(None) => {}
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            if let Some(mark) = &mut this.mark {
                let between = this.buf.is_empty() && this.codec.between_frames();
                mark.set(if between { BETWEEN_FRAMES } else { 1 });
            }
            // Room for a useful read; a buffer whose frames were all taken
            // gets its allocation back here rather than a new one.
            if this.buf.capacity() - this.buf.len() < MIN_READ {
                this.buf.reserve(MIN_READ);
            }
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.io),
                cx,
                &mut this.buf
            ));
            match read {
                Ok(0) => {
                    this.done = true;
                    return match this.codec.decode_eof(&mut this.buf) {
                        Ok(Some(msg)) => Poll::Ready(Some(Ok(msg))),
                        Ok(None) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(e))),
                    };
                }
                Ok(_) => {}
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(FrameError::Io(e))));
                }
            }
        }
    }
}

/// A socket's `SO_RCVLOWAT`, set only when it changes.
struct LowMark {
    /// `None` once the kernel refused a mark: then every frame is read as
    /// it comes, as on TLS.
    fd: Option<RawFd>,
    now: usize,
}

impl LowMark {
    fn new(fd: RawFd) -> Self {
        Self {
            fd: Some(fd),
            now: 1,
        }
    }

    /// Sets the mark to `bytes` (see [`LowMark::fd`] for a refusal).
    fn set(&mut self, bytes: usize) {
        let Some(fd) = self.fd else { return };
        if self.now == bytes {
            return;
        }
        match set_recv_lowat(fd, bytes) {
            Ok(()) => self.now = bytes,
            Err(e) => {
                tracing::debug!("SO_RCVLOWAT {bytes}: {e}; reading every frame as it comes");
                if self.now != 1 && set_recv_lowat(fd, 1).is_ok() {
                    self.now = 1;
                }
                self.fd = None;
            }
        }
    }
}

/// `setsockopt(SO_RCVLOWAT)`. The kernel checks at once whether the bytes
/// already queued reach the new mark and wakes the reader if they do.
fn set_recv_lowat(fd: RawFd, bytes: usize) -> std::io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    #[allow(unsafe_code)]
    // SAFETY: `fd` is the open socket under the reader's `io` (the caller of
    // `Frames::new` keeps it open as long as the reader lives); the option
    // value is a c_int on the stack, passed with its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::codec::encode_body;
    use futures::StreamExt;
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    fn frame(msg: &ToManager) -> Vec<u8> {
        let body = encode_body(msg).unwrap();
        let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }

    /// The manager's reader on a fresh loopback connection, the agent's
    /// end, and a second descriptor of the manager's socket to look at it.
    async fn link() -> (
        TcpStream,
        Frames<tokio::io::ReadHalf<TcpStream>>,
        tokio::io::WriteHalf<TcpStream>,
        std::net::TcpStream,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let agent = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (manager, _) = listener.accept().await.unwrap();
        let view = std::net::TcpStream::from(socket2::SockRef::from(&manager).try_clone().unwrap());
        let fd = manager.as_raw_fd();
        let (read, write) = tokio::io::split(manager);
        (agent, Frames::new(read, &[], 512, Some(fd)), write, view)
    }

    /// Bytes in the socket's receive queue (`FIONREAD`).
    fn queued(socket: &std::net::TcpStream) -> usize {
        let mut n: libc::c_int = 0;
        #[allow(unsafe_code)]
        // SAFETY: an open socket and a c_int for the count.
        let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &raw mut n) };
        assert_eq!(rc, 0);
        usize::try_from(n).unwrap()
    }

    /// Whether the kernel reports the socket readable now (`poll`, no wait).
    fn readable(socket: &std::net::TcpStream) -> bool {
        let mut fds = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: one valid pollfd, no timeout.
        let rc = unsafe { libc::poll(&raw mut fds, 1, 0) };
        assert!(rc >= 0);
        fds.revents & libc::POLLIN != 0
    }

    /// Waits until `n` bytes are queued on `socket` (loopback delivers
    /// within the sender's write; this does not rely on it).
    async fn until_queued(socket: &std::net::TcpStream, n: usize) {
        while queued(socket) < n {
            tokio::task::yield_now().await;
        }
    }

    /// Between frames the reader's socket does not report one heartbeat as
    /// readable, and does report two, or any other frame.
    #[tokio::test]
    async fn a_lone_heartbeat_does_not_wake_the_reader() {
        let (mut agent, mut frames, _write, view) = link().await;
        let beat = frame(&ToManager::Heartbeat);
        assert_eq!(beat.len(), AGENT_HEARTBEAT_FRAME_LEN);

        // A first poll raises the mark (nothing buffered, between frames).
        assert!(futures::poll!(frames.next()).is_pending());
        assert_eq!(frames.mark(), BETWEEN_FRAMES);

        agent.write_all(&beat).await.unwrap();
        until_queued(&view, beat.len()).await;
        assert!(!readable(&view), "one heartbeat is below the mark");
        agent.write_all(&beat).await.unwrap();
        until_queued(&view, 2 * beat.len()).await;
        assert!(readable(&view), "two heartbeats reach it");
        assert_eq!(frames.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        assert_eq!(frames.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        assert!(futures::poll!(frames.next()).is_pending());

        let reply = frame(&ToManager::Reply {
            id: 1,
            result: Ok(drover_protocol::Response::Empty),
        });
        agent.write_all(&reply).await.unwrap();
        until_queued(&view, reply.len()).await;
        assert!(readable(&view), "any other frame reaches the mark alone");
        assert!(matches!(
            frames.next().await.unwrap().unwrap(),
            ToManager::Reply { id: 1, .. }
        ));
    }

    /// A frame whose last bytes are fewer than the mark still arrives whole:
    /// inside a frame the mark is one byte. Every split point of a frame;
    /// where the first piece wakes the reader, it is read before the rest
    /// is sent.
    #[tokio::test]
    async fn the_tail_of_a_frame_is_never_left_waiting() {
        let msg = ToManager::Reply {
            id: 7,
            result: Ok(drover_protocol::Response::Text("x".repeat(40))),
        };
        let bytes = frame(&msg);
        for cut in 1..bytes.len() {
            let (mut agent, mut frames, _write, view) = link().await;
            assert!(futures::poll!(frames.next()).is_pending());
            agent.write_all(&bytes[..cut]).await.unwrap();
            until_queued(&view, cut).await;
            if cut >= BETWEEN_FRAMES {
                while queued(&view) > 0 {
                    assert!(futures::poll!(frames.next()).is_pending(), "cut {cut}");
                    tokio::task::yield_now().await;
                }
                assert_eq!(frames.mark(), 1, "inside a frame (cut {cut})");
            }
            agent.write_all(&bytes[cut..]).await.unwrap();
            let got = tokio::time::timeout(std::time::Duration::from_secs(10), frames.next())
                .await
                .unwrap_or_else(|_| panic!("cut at {cut}: the frame's tail was left waiting"));
            assert_eq!(got.unwrap().unwrap(), msg, "cut {cut}");
        }
    }

    /// The end of the stream wakes the reader whatever the mark, and a
    /// stream cut inside a frame is truncated.
    #[tokio::test]
    async fn the_end_wakes_the_reader_and_a_cut_frame_is_truncated() {
        let (agent, mut frames, _write, _view) = link().await;
        assert!(futures::poll!(frames.next()).is_pending());
        drop(agent);
        assert!(frames.next().await.is_none());

        let (mut agent, mut frames, _write, _view) = link().await;
        assert!(futures::poll!(frames.next()).is_pending());
        agent
            .write_all(&frame(&ToManager::Heartbeat)[..3])
            .await
            .unwrap();
        drop(agent);
        assert!(matches!(
            frames.next().await,
            Some(Err(FrameError::Truncated))
        ));
        assert!(frames.next().await.is_none());
    }

    /// What was read past the handshake comes first; garbage ends the stream
    /// with a typed error.
    #[tokio::test]
    async fn buffered_bytes_first_and_garbage_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut agent = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (manager, _) = listener.accept().await.unwrap();
        let beat = frame(&ToManager::Heartbeat);
        let mut frames = Frames::new(manager, &beat, 512, None);
        assert_eq!(frames.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        agent.write_all(&[0, 0, 0, 2, 0xff, 0xff]).await.unwrap();
        assert!(matches!(
            frames.next().await,
            Some(Err(FrameError::Malformed(_)))
        ));
        assert!(frames.next().await.is_none());
    }
}
