//! The manager's side of a TLS link on rustls's unbuffered API: the caller
//! (this module) owns every buffer, so an idle session holds none.
//!
//! rustls's buffered connection keeps a 4 KiB record buffer per connection
//! for as long as it lives (it sizes it for a 4 KiB read before every read
//! and never lets it go), so at fleet size the manager held 4 KiB per idle
//! node that only ever carried a 27-byte heartbeat record. [`ServerStream`]
//! drives an [`UnbufferedServerConnection`] instead. Invariants:
//!
//! * **Nothing buffered between records.** `incoming` holds ciphertext only
//!   while a record (or a handshake message) is incomplete; once every
//!   record read has been opened it is freed. A read with nothing held (an
//!   idle link's every read) goes to the stack and its records are opened
//!   there: no allocation, no zeroed buffer; only the head of an incomplete
//!   record moves to `incoming`. `plaintext` holds what a
//!   reader's buffer had no room for, freed once read; `outgoing` holds
//!   sealed bytes the socket did not take yet, freed once written.
//! * **Bounded.** `incoming` never grows past [`MAX_INCOMING`] (rustls's own
//!   cap: one handshake message of 64 KiB while handshaking, one record of
//!   at most [`MAX_RECORD`] after); a peer that sends more is refused.
//!   `outgoing` takes at most [`MAX_SEAL`] bytes of plaintext per write.
//! * **Every complete record is opened before a read returns**: a read that
//!   returns Pending leaves no plaintext behind and at most the head of one
//!   record in `incoming` (the manager's reader relies on it to mark its
//!   socket, `manager/src/nodes/frames.rs`).
//! * **Bytes leave in the order rustls made them**: handshake messages,
//!   alerts and key updates go into `outgoing` ahead of any later
//!   application data; a record rustls makes while reading (an alert, a key
//!   update's answer) is written at once if the socket takes it, else with
//!   the next write or flush.
//! * **Ends as rustls's buffered stream did**: a `close_notify` then the end
//!   of the stream reads as the end (0 bytes); the end without a
//!   `close_notify` is an `UnexpectedEof` error; a TLS error is an
//!   `InvalidData` error carrying the [`rustls::Error`], after the alert
//!   rustls made for it was sent if the socket took it at once.

use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::{CommonState, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest TLS record on the wire rustls accepts once the handshake is
/// done: a 5-byte header and up to 16 KiB + 2 KiB of body.
pub const MAX_RECORD: usize = 5 + 16_384 + 2_048;

/// The most ciphertext held for one incomplete record or handshake message
/// (rustls's buffered connection allows a 64 KiB handshake message).
pub const MAX_INCOMING: usize = 0xffff + MAX_RECORD;

/// The most plaintext one write seals.
pub const MAX_SEAL: usize = 64 * 1024;

/// What a read asks of the socket at least (a heartbeat record is 27 bytes;
/// a larger record reserves its whole length once its header is in).
const READ_SIZE: usize = 4096;

/// The manager's end of an established TLS link (see the module docs).
pub struct ServerStream<IO> {
    io: IO,
    conn: UnbufferedServerConnection,
    /// Ciphertext read and not yet opened (at most one incomplete record
    /// or handshake message between calls).
    incoming: Vec<u8>,
    /// Plaintext opened and not yet read, from `plain_at` on.
    plaintext: Vec<u8>,
    plain_at: usize,
    /// Ciphertext sealed and not yet written, from `out_at` on.
    outgoing: Vec<u8>,
    out_at: usize,
    /// The peer's `close_notify` came: reads end.
    peer_closed: bool,
    /// Our `close_notify` is queued.
    closing: bool,
}

impl<IO> std::fmt::Debug for ServerStream<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerStream")
            .field("incoming", &self.incoming.len())
            .field("plaintext", &(self.plaintext.len() - self.plain_at))
            .field("outgoing", &(self.outgoing.len() - self.out_at))
            .field("peer_closed", &self.peer_closed)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

/// Where rustls stands after it opened every complete record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stand {
    /// The handshake needs more from the peer.
    Handshaking,
    /// Established: application data may be sealed.
    Open,
    /// Both sides sent `close_notify`.
    Closed,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> ServerStream<IO> {
    /// Runs the server side of the TLS handshake on `io` with `config`.
    /// Takes as long as the peer does: the caller bounds it. On a TLS error
    /// the alert rustls made is sent if the socket takes it at once, and the
    /// error is an `InvalidData` `io::Error` carrying the [`rustls::Error`].
    pub async fn accept(io: IO, config: Arc<ServerConfig>) -> io::Result<Self> {
        let conn = UnbufferedServerConnection::new(config).map_err(invalid)?;
        let mut stream = Self {
            io,
            conn,
            incoming: Vec::new(),
            plaintext: Vec::new(),
            plain_at: 0,
            outgoing: Vec::new(),
            out_at: 0,
            peer_closed: false,
            closing: false,
        };
        loop {
            let stand = match stream.process(None) {
                Ok(stand) => stand,
                Err(e) => {
                    stream.send_alert();
                    return Err(e);
                }
            };
            poll_fn(|cx| stream.poll_write_out(cx)).await?;
            match stand {
                Stand::Open => return Ok(stream),
                Stand::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "tls handshake closed by the peer",
                    ));
                }
                Stand::Handshaking => {
                    if stream.peer_closed {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "tls handshake closed by the peer",
                        ));
                    }
                    let read = poll_fn(|cx| stream.poll_read_in(cx)).await?;
                    if read == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "tls handshake eof",
                        ));
                    }
                }
            }
        }
    }
}

impl<IO> ServerStream<IO> {
    /// The connection's TLS state: protocol version, suite, the peer's
    /// certificates.
    pub fn state(&self) -> &CommonState {
        &self.conn
    }

    /// The stream under TLS.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Bytes held in the stream's own buffers now (ciphertext in and out,
    /// plaintext not yet read): 0 for an idle link.
    pub fn buffered(&self) -> usize {
        self.incoming.capacity() + self.plaintext.capacity() + self.outgoing.capacity()
    }

    /// Opens every complete record in `incoming`, queues what rustls has
    /// to send in `outgoing`, and says where the connection stands.
    /// Plaintext goes to `out` as far as it has room (when nothing is held
    /// back before it), the rest to `plaintext`. An `incoming` left empty is
    /// freed.
    fn process(&mut self, out: Option<&mut ReadBuf<'_>>) -> io::Result<Stand> {
        let mut incoming = std::mem::take(&mut self.incoming);
        let (used, stand) = self.open(&mut incoming, out);
        drop_front(&mut incoming, used);
        if !incoming.is_empty() {
            self.incoming = incoming;
        }
        stand
    }

    /// [`ServerStream::process`] on ciphertext held anywhere (`incoming`,
    /// or a read on the stack): also the count of its bytes rustls is done
    /// with, which the caller drops from its front (on an error too).
    fn open(
        &mut self,
        incoming: &mut [u8],
        mut out: Option<&mut ReadBuf<'_>>,
    ) -> (usize, io::Result<Stand>) {
        let mut used = 0;
        loop {
            let rest = incoming.get_mut(used..).unwrap_or_default();
            let UnbufferedStatus { mut discard, state } = self.conn.process_tls_records(rest);
            let step = match state {
                Err(e) => Err(invalid(e)),
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    let mut opened = Ok(None);
                    while let Some(record) = traffic.next_record() {
                        match record {
                            Ok(record) => {
                                discard += record.discard;
                                let payload = record.payload;
                                let held = self.plain_at < self.plaintext.len();
                                let direct = match out.as_deref_mut() {
                                    Some(buf) if !held => {
                                        let n = payload.len().min(buf.remaining());
                                        buf.put_slice(payload.get(..n).unwrap_or_default());
                                        n
                                    }
                                    _ => 0,
                                };
                                let rest = payload.get(direct..).unwrap_or_default();
                                if !rest.is_empty() {
                                    if !held {
                                        self.plaintext.clear();
                                        self.plain_at = 0;
                                    }
                                    self.plaintext.extend_from_slice(rest);
                                }
                            }
                            Err(e) => {
                                opened = Err(invalid(e));
                                break;
                            }
                        }
                    }
                    opened
                }
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    let start = self.outgoing.len();
                    let mut room = 512;
                    loop {
                        self.outgoing.resize(start + room, 0);
                        match data.encode(&mut self.outgoing[start..]) {
                            Ok(n) => {
                                self.outgoing.truncate(start + n);
                                break Ok(None);
                            }
                            Err(EncodeError::InsufficientSize(need)) => {
                                room = need.required_size;
                            }
                            Err(EncodeError::AlreadyEncoded) => {
                                self.outgoing.truncate(start);
                                break Ok(None);
                            }
                        }
                    }
                }
                // What was encoded is in `outgoing`, which is written before
                // anything queued after it.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    Ok(None)
                }
                Ok(ConnectionState::BlockedHandshake) => Ok(Some(Stand::Handshaking)),
                Ok(ConnectionState::WriteTraffic(_)) => Ok(Some(Stand::Open)),
                Ok(ConnectionState::PeerClosed) => {
                    self.peer_closed = true;
                    Ok(None)
                }
                Ok(ConnectionState::Closed) => {
                    self.peer_closed = true;
                    Ok(Some(Stand::Closed))
                }
                // Early data is off in drover's settings; anything rustls
                // adds later is not something this link expects.
                Ok(_) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected TLS connection state",
                )),
            };
            used += discard;
            match step {
                Ok(None) => {}
                Ok(Some(stand)) => return (used, Ok(stand)),
                Err(e) => return (used, Err(e)),
            }
        }
    }

    /// After a TLS error: writes the alert rustls queued with it if the
    /// socket takes it now (never waits). rustls hands a queued record out
    /// before it reads on, so one call yields it; a second would read the
    /// bad record again (and queue a second alert).
    fn send_alert(&mut self)
    where
        IO: AsyncWrite + Unpin,
    {
        let UnbufferedStatus { state, .. } = self.conn.process_tls_records(&mut self.incoming);
        if let Ok(ConnectionState::EncodeTlsData(mut data)) = state {
            let start = self.outgoing.len();
            self.outgoing.resize(start + 512, 0);
            match data.encode(&mut self.outgoing[start..]) {
                Ok(n) => self.outgoing.truncate(start + n),
                Err(_) => self.outgoing.truncate(start),
            }
        }
        let mut cx = Context::from_waker(Waker::noop());
        let _ = self.poll_write_out(&mut cx);
    }

    /// Reads more ciphertext into `incoming`: the count read (0 at the end
    /// of the stream).
    fn poll_read_in(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>>
    where
        IO: AsyncRead + Unpin,
    {
        let held = self.incoming.len();
        if held >= MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a TLS record or handshake message larger than allowed",
            )));
        }
        // Room for the whole record whose header is in, else a plain read.
        let want = match self.incoming.get(3..5) {
            Some(len) => 5 + usize::from(u16::from_be_bytes([len[0], len[1]])),
            None => 0,
        };
        let room = want
            .saturating_sub(held)
            .max(READ_SIZE)
            .min(MAX_INCOMING - held);
        self.incoming.resize(held + room, 0);
        let mut buf = ReadBuf::new(&mut self.incoming[held..]);
        let read = Pin::new(&mut self.io).poll_read(cx, &mut buf);
        let n = buf.filled().len();
        self.incoming.truncate(held + n);
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        match read {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Writes `outgoing` until it is empty (then frees it) or the socket
    /// blocks.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>
    where
        IO: AsyncWrite + Unpin,
    {
        while self.out_at < self.outgoing.len() {
            let rest = self.outgoing.get(self.out_at..).unwrap_or_default();
            match Pin::new(&mut self.io).poll_write(cx, rest) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.out_at += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.outgoing = Vec::new();
        self.out_at = 0;
        Poll::Ready(Ok(()))
    }

    /// Seals `data` (at most [`MAX_SEAL`] of it) into `outgoing`: the count
    /// taken.
    fn seal(&mut self, data: &[u8]) -> io::Result<usize> {
        let data = data.get(..MAX_SEAL).unwrap_or(data);
        match self.process(None)? {
            Stand::Open if !self.closing => {}
            _ => return Err(io::ErrorKind::BrokenPipe.into()),
        }
        let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
        let sealed = match state {
            Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                let start = self.outgoing.len();
                // One record per 16 KiB, 22 bytes each over the plaintext.
                let mut room = data.len() + (data.len() / 16_384 + 1) * 32;
                loop {
                    self.outgoing.resize(start + room, 0);
                    match traffic.encrypt(data, &mut self.outgoing[start..]) {
                        Ok(n) => {
                            self.outgoing.truncate(start + n);
                            break Ok(data.len());
                        }
                        Err(EncryptError::InsufficientSize(need)) => room = need.required_size,
                        Err(e) => {
                            self.outgoing.truncate(start);
                            break Err(io::Error::other(e.to_string()));
                        }
                    }
                }
            }
            Ok(_) => Err(io::ErrorKind::BrokenPipe.into()),
            Err(e) => Err(invalid(e)),
        };
        drop_front(&mut self.incoming, discard);
        sealed
    }

    /// Queues our `close_notify` once.
    fn close(&mut self) -> io::Result<()> {
        if self.closing {
            return Ok(());
        }
        if self.process(None)? != Stand::Open {
            self.closing = true;
            return Ok(());
        }
        let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
        let queued = match state {
            Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                let start = self.outgoing.len();
                self.outgoing.resize(start + 64, 0);
                match traffic.queue_close_notify(&mut self.outgoing[start..]) {
                    Ok(n) => {
                        self.outgoing.truncate(start + n);
                        Ok(())
                    }
                    Err(e) => {
                        self.outgoing.truncate(start);
                        Err(io::Error::other(e.to_string()))
                    }
                }
            }
            Ok(_) => Ok(()),
            Err(e) => Err(invalid(e)),
        };
        drop_front(&mut self.incoming, discard);
        self.closing = true;
        queued
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let pending = this.plaintext.get(this.plain_at..).unwrap_or_default();
            if !pending.is_empty() {
                let n = pending.len().min(buf.remaining());
                buf.put_slice(pending.get(..n).unwrap_or_default());
                this.plain_at += n;
                if this.plain_at == this.plaintext.len() {
                    this.plaintext = Vec::new();
                    this.plain_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let opened = if this.incoming.is_empty() {
                // Between records (an idle link's every read): read onto
                // the stack and open the records there; only the head of an
                // incomplete record is kept, on the heap.
                let mut stack = [MaybeUninit::<u8>::uninit(); READ_SIZE];
                let mut read = ReadBuf::uninit(&mut stack);
                match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
                let read = read.filled_mut();
                if read.is_empty() {
                    return Poll::Ready(Err(eof_without_close_notify()));
                }
                let (used, opened) = this.open(read, Some(buf));
                let rest = read.get(used..).unwrap_or_default();
                this.incoming.extend_from_slice(rest);
                opened
            } else {
                match this.poll_read_in(cx) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(eof_without_close_notify())),
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
                this.process(Some(buf))
            };
            if let Err(e) = opened {
                this.send_alert();
                return Poll::Ready(Err(e));
            }
            // A record rustls made while reading (a key update's answer):
            // out now if the socket takes it, else ahead of the next write.
            // Never with the reader's waker: a writer waiting for the socket
            // keeps its own.
            if this.out_at < this.outgoing.len() {
                let mut quiet = Context::from_waker(Waker::noop());
                let _ = this.poll_write_out(&mut quiet);
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Hold at most one write's records: take more once they are out.
        if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
            return Poll::Ready(Err(e));
        }
        if this.out_at < this.outgoing.len() {
            return Poll::Pending;
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let taken = this.seal(data)?;
        // Out now as far as the socket takes it; the rest with the next
        // write or flush.
        if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_write_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.close()?;
        match this.poll_write_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}

/// Removes the first `n` bytes of `buf`.
fn drop_front(buf: &mut Vec<u8>, n: usize) {
    if n >= buf.len() {
        buf.clear();
    } else if n > 0 {
        buf.drain(..n);
    }
}

fn eof_without_close_notify() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "peer closed connection without sending TLS close_notify",
    )
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
