//! The frames an agent sends, read so that lone heartbeats do not wake
//! the manager.
//!
//! At fleet size reading heartbeats is most of the manager's idle work:
//! 5,000 a second at 10,000 nodes, each a wake-up and a read. [`Frames`]
//! asks the kernel to wake the reader only once more than
//! `HEARTBEATS_PER_READ - 1` lone heartbeats wait in the socket
//! (`SO_RCVLOWAT`), so it reads heartbeats [`HEARTBEATS_PER_READ`] at a time
//! (the protocol rules that make this safe, padding and silence judged by
//! arrival, are in `drover_protocol::liveness`). On a plaintext link a
//! heartbeat is a 5-byte frame; on a TLS link it is a 27-byte record
//! ([`TLS_BETWEEN_FRAMES`] says why that is exact), and the reader learns
//! where the records it was handed end from
//! [`drover_tls::records::Records`] under rustls. One rule for both
//! (`MarkSocket::mark`). Invariants:
//!
//! * **Nothing but a heartbeat waits.** The mark is raised only while the
//!   reader stands between frames with nothing buffered — and, on TLS, the
//!   ciphertext handed to rustls ends at a record boundary, so rustls holds
//!   no partial record (when a read returns Pending, rustls holds no
//!   plaintext either: it would have returned it). Every frame but a
//!   heartbeat is padded to [`AGENT_MIN_FRAME_LEN`], longer than either
//!   mark, and so is its record: it wakes the reader on its own (checked at
//!   compile time below). Otherwise the mark is one byte, so the rest of a frame or record
//!   is read as soon as any of it comes.
//! * **The mark follows every read, also one that returns Pending.** On TLS
//!   a read may take the head of a record (rustls keeps it) and still
//!   return Pending: the mark is set again after it, down to one byte if the
//!   ciphertext stopped inside a record. Setting the mark makes the kernel
//!   check the bytes already queued and wake the reader if they reach it, so
//!   a tail that came in the meantime is not missed.
//! * **A heartbeat waits for `HEARTBEATS_PER_READ - 1` sends at most**: the
//!   agent's next frame or the batch's last heartbeat. Meanwhile the silence
//!   check counts what waits as heard when it arrived
//!   (`crate::nodes::arrival`).
//! * The end of the stream and socket errors wake the reader whatever the
//!   mark (the kernel signals them apart from data). A TLS alert (a
//!   `close_notify`, or a fatal one) is a 24-byte record, below the mark:
//!   it is read with the end of the stream that follows it (a TLS shutdown
//!   sends both; a peer that fails closes its socket after its alert), or
//!   with the next record; a peer that sends one and then nothing is dropped by the
//!   heartbeat timer like any silent peer.
//! * Without a socket to mark (TLS other than 1.3 with a 16-byte tag, tests;
//!   or the kernel refused a mark), every frame is read as it comes: the
//!   mark stays one byte, and is never set.
//! * **An idle reader holds no buffer**: a read that waits with nothing
//!   buffered gives the buffer back, the next read takes one again (the
//!   same chunk of malloc's serves every session in turn).
//! * Decoding is [`FrameCodec`]'s: frame cap, typed errors, a stream that
//!   ends inside a frame is [`FrameError::Truncated`].

use bytes::BytesMut;
use drover_protocol::liveness::{
    AGENT_HEARTBEAT_FRAME_LEN, AGENT_MIN_FRAME_LEN, HEARTBEATS_PER_READ,
};
use drover_protocol::{FrameCodec, FrameError, ToAgent, ToManager};
use drover_tls::records::{Boundary, sealed_len};
use futures::Stream;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncRead;
use tokio_util::codec::Decoder;

/// The mark between frames on a plaintext link: one byte more than
/// `HEARTBEATS_PER_READ - 1` heartbeat frames.
pub const PLAIN_BETWEEN_FRAMES: usize = (HEARTBEATS_PER_READ - 1) * AGENT_HEARTBEAT_FRAME_LEN + 1;

/// The mark between frames and records on a TLS link: one byte more than
/// `HEARTBEATS_PER_READ - 1` records of a lone heartbeat, each 5 (record
/// header) + 5 (the frame) + 1 (inner content type) + 16 (AEAD tag) = 27.
///
/// Exact because the link is TLS 1.3 with a 16-byte tag (checked per link,
/// [`drover_tls::records::sizes_known`]), rustls seals what one write hands
/// it into one record without padding, and the agent writes each flush of
/// its frames at once: a lone heartbeat is one 27-byte record, two are 54
/// bytes, and any other frame (padded to [`AGENT_MIN_FRAME_LEN`]) is a
/// record longer than the mark. A peer that pads or splits its records only
/// changes when its own frames are read: a record below the mark waits for
/// the next one, as a heartbeat does.
pub const TLS_BETWEEN_FRAMES: usize =
    (HEARTBEATS_PER_READ - 1) * sealed_len(AGENT_HEARTBEAT_FRAME_LEN) + 1;

// Every frame but a heartbeat wakes the reader on its own, on either link.
const _: () = assert!(AGENT_MIN_FRAME_LEN >= PLAIN_BETWEEN_FRAMES);
const _: () = assert!(sealed_len(AGENT_MIN_FRAME_LEN) >= TLS_BETWEEN_FRAMES);

/// The least room a read gets (a frame's body reserves its own room once
/// its header is read).
const MIN_READ: usize = 64;

/// The TCP socket under a session's reader, and what lies between them.
#[derive(Debug, Clone)]
pub struct MarkSocket {
    fd: RawFd,
    layer: Layer,
}

#[derive(Debug, Clone)]
enum Layer {
    /// The frames are the socket's bytes.
    Plain,
    /// TLS 1.3 records with a 16-byte tag; where the ciphertext read ends.
    Tls(Boundary),
    /// TLS whose record sizes are not known: never marked.
    Unmarked,
}

impl MarkSocket {
    /// A plaintext link's socket. It must stay open as long as the reader
    /// reads.
    pub fn plain(fd: RawFd) -> Self {
        Self {
            fd,
            layer: Layer::Plain,
        }
    }

    /// The socket under a TLS link whose record sizes are known
    /// ([`drover_tls::records::sizes_known`]), and where the ciphertext read
    /// through it ends. It must stay open as long as the reader reads.
    pub fn tls(fd: RawFd, boundary: Boundary) -> Self {
        Self {
            fd,
            layer: Layer::Tls(boundary),
        }
    }

    /// The socket under a TLS link whose record sizes are not known: the
    /// reader reads every record as it comes. It must stay open as long as
    /// the reader reads.
    pub fn unmarked(fd: RawFd) -> Self {
        Self {
            fd,
            layer: Layer::Unmarked,
        }
    }

    /// The socket's descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The mark the socket gets now: `between` is whether the reader stands
    /// between frames with nothing buffered.
    fn mark(&self, between: bool) -> usize {
        match &self.layer {
            Layer::Plain if between => PLAIN_BETWEEN_FRAMES,
            Layer::Tls(records) if between && records.at_boundary() => TLS_BETWEEN_FRAMES,
            _ => 1,
        }
    }
}

/// The agent's frames, decoded (see the module docs).
pub struct Frames<R> {
    io: R,
    codec: FrameCodec<ToManager, ToAgent>,
    /// Frame bytes read and not yet decoded; no allocation while the
    /// reader waits with nothing held ([`Frames::release`]).
    buf: BytesMut,
    /// What a read takes for `buf` when it has none.
    capacity: usize,
    mark: Option<LowMark>,
    done: bool,
}

impl<R: AsyncRead + Unpin> Frames<R> {
    /// Frames read from `io`, starting with what was already read past the
    /// handshake (`buffered`), into a buffer of `capacity` bytes to begin
    /// with. `socket` is the TCP socket under `io`, whose receive mark the
    /// reader may raise.
    pub fn new(io: R, buffered: &[u8], capacity: usize, socket: Option<MarkSocket>) -> Self {
        let mut buf = BytesMut::with_capacity(capacity.max(buffered.len()));
        buf.extend_from_slice(buffered);
        Self {
            io,
            codec: FrameCodec::default(),
            buf,
            capacity: capacity.max(MIN_READ),
            mark: socket.map(LowMark::new),
            done: false,
        }
    }

    /// Sets the mark the reader's state calls for ([`MarkSocket::mark`]).
    fn follow(&mut self) {
        if let Some(mark) = &mut self.mark {
            let between = self.buf.is_empty() && self.codec.between_frames();
            let bytes = mark.socket.mark(between);
            mark.set(bytes);
        }
    }

    /// Gives the buffer back when it holds nothing: between reads an idle
    /// session holds no buffer (the next read takes one from malloc, which
    /// hands the same chunk to every session in turn).
    fn release(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
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
            this.follow();
            // Room for a useful read: a released buffer gets `capacity`
            // again; one whose frames were all taken gets its allocation
            // back here rather than a new one.
            if this.buf.capacity() == 0 {
                this.buf.reserve(this.capacity);
            } else if this.buf.capacity() - this.buf.len() < MIN_READ {
                this.buf.reserve(MIN_READ);
            }
            let read =
                match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut this.buf) {
                    Poll::Ready(read) => read,
                    Poll::Pending => {
                        // The read may have taken the head of a TLS record.
                        this.follow();
                        this.release();
                        return Poll::Pending;
                    }
                };
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
    socket: MarkSocket,
    /// False once the kernel refused a mark: then every frame is read as
    /// it comes.
    usable: bool,
    now: usize,
}

impl LowMark {
    fn new(socket: MarkSocket) -> Self {
        Self {
            socket,
            usable: true,
            now: 1,
        }
    }

    /// Sets the mark to `bytes` (see [`LowMark::usable`] for a refusal).
    fn set(&mut self, bytes: usize) {
        if !self.usable || self.now == bytes {
            return;
        }
        let fd = self.socket.fd;
        match set_recv_lowat(fd, bytes) {
            Ok(()) => self.now = bytes,
            Err(e) => {
                tracing::debug!("SO_RCVLOWAT {bytes}: {e}; reading every frame as it comes");
                if self.now != 1 && set_recv_lowat(fd, 1).is_ok() {
                    self.now = 1;
                }
                self.usable = false;
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
mod tls_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// `msg`'s frame as the agent sends it: the agent's own encoder (which
    /// pads it).
    pub(super) fn frame(msg: &ToManager) -> Vec<u8> {
        let mut out = BytesMut::new();
        tokio_util::codec::Encoder::encode(
            &mut FrameCodec::<ToAgent, ToManager>::default(),
            msg.clone(),
            &mut out,
        )
        .unwrap();
        out.to_vec()
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
        (
            agent,
            Frames::new(read, &[], 512, Some(MarkSocket::plain(fd))),
            write,
            view,
        )
    }

    /// Bytes in the socket's receive queue (`FIONREAD`).
    pub(super) fn queued(socket: &std::net::TcpStream) -> usize {
        crate::nodes::arrival::unread_bytes(socket.as_raw_fd()).expect("FIONREAD")
    }

    /// Whether the kernel reports the socket readable now (`poll`, no wait).
    pub(super) fn readable(socket: &std::net::TcpStream) -> bool {
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
    pub(super) async fn until_queued(socket: &std::net::TcpStream, n: usize) {
        while queued(socket) < n {
            tokio::task::yield_now().await;
        }
    }

    /// Between frames the reader's socket does not report
    /// `HEARTBEATS_PER_READ - 1` heartbeats as readable, and does report one
    /// more, or any other frame alone.
    #[tokio::test]
    async fn lone_heartbeats_do_not_wake_the_reader() {
        let (mut agent, mut frames, _write, view) = link().await;
        let beat = frame(&ToManager::Heartbeat);
        assert_eq!(beat.len(), AGENT_HEARTBEAT_FRAME_LEN);

        // A first poll raises the mark (nothing buffered, between frames).
        assert!(futures::poll!(frames.next()).is_pending());
        assert_eq!(frames.mark(), PLAIN_BETWEEN_FRAMES);

        for n in 1..HEARTBEATS_PER_READ {
            agent.write_all(&beat).await.unwrap();
            until_queued(&view, n * beat.len()).await;
            assert!(!readable(&view), "{n} heartbeats are below the mark");
        }
        agent.write_all(&beat).await.unwrap();
        until_queued(&view, HEARTBEATS_PER_READ * beat.len()).await;
        assert!(readable(&view), "one more reaches it");
        for _ in 0..HEARTBEATS_PER_READ {
            assert_eq!(frames.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        }
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

    /// An idle reader holds no buffer: once the frames read were taken and
    /// the read waits, the buffer is given back; the head of a frame is kept
    /// until its tail comes.
    #[tokio::test]
    async fn an_idle_reader_holds_no_buffer() {
        let (mut agent, mut frames, _write, view) = link().await;
        assert!(futures::poll!(frames.next()).is_pending());
        assert_eq!(frames.buf.capacity(), 0, "nothing read yet");

        let beats = frame(&ToManager::Heartbeat).repeat(HEARTBEATS_PER_READ);
        agent.write_all(&beats).await.unwrap();
        for _ in 0..HEARTBEATS_PER_READ {
            assert_eq!(frames.next().await.unwrap().unwrap(), ToManager::Heartbeat);
        }
        assert!(futures::poll!(frames.next()).is_pending());
        assert_eq!(frames.buf.capacity(), 0, "after a batch of heartbeats");

        let msg = ToManager::Reply {
            id: 3,
            result: Ok(drover_protocol::Response::Text("y".repeat(40))),
        };
        let bytes = frame(&msg);
        // A head as long as the mark: it wakes the reader.
        let head = PLAIN_BETWEEN_FRAMES;
        agent.write_all(&bytes[..head]).await.unwrap();
        until_queued(&view, head).await;
        while queued(&view) > 0 {
            assert!(futures::poll!(frames.next()).is_pending());
            tokio::task::yield_now().await;
        }
        assert!(!frames.buf.is_empty(), "the head of a frame is kept");
        agent.write_all(&bytes[head..]).await.unwrap();
        assert_eq!(frames.next().await.unwrap().unwrap(), msg);
        assert!(futures::poll!(frames.next()).is_pending());
        assert_eq!(frames.buf.capacity(), 0, "after the frame");
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
            if cut >= PLAIN_BETWEEN_FRAMES {
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
