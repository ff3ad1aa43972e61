//! When data last came in on a session's socket, in the kernel's words
//! (`TCP_INFO`), so that a node is not called silent because the manager
//! was too busy to read it.
//!
//! The silence check ([`crate::nodes::session::Session::is_silent`]) judges
//! an agent by the frames the manager has read. The reader lets an idle
//! agent's lone heartbeats wait in the socket and reads them in batches
//! (`crate::nodes::frames`), so its last read is often older than the
//! threshold while the agent is well; and under a burst of work the
//! readers fall behind: at 19,000 nodes, a monitor's first `Subscribe("*")`
//! has every agent answer with its loaded units at once, 3.8 million frames,
//! and a check by reads alone ended about 5,900 healthy sessions ("nothing
//! received for more than 6000 ms") whose heartbeats were there, unread
//! (`docs/dev/notes/fleet-scale.md`). So before a session counts as silent, the kernel
//! is asked how long ago data last arrived on its socket
//! (`tcpi_last_data_recv`) while data waits unread in it: what the agent
//! sent proves it alive as a frame read does. A frozen agent or a vanished
//! host sends nothing, so they are still seen within the threshold.
//!
//! Only unread data counts. The receive queue is read in order, so while
//! anything waits in it, the newest data to arrive is among what waits:
//! frames the reader has not reached. Once the reader has taken everything,
//! the frames read tell all there is, and the kernel adds nothing: a peer
//! that sends a frame a byte at a time, read as it comes, is judged by its
//! whole frames as before, and dropped when none comes within the
//! threshold (the mark lets at most `HEARTBEATS_PER_READ - 1` heartbeats'
//! worth of bytes wait).
//!
//! Invariants:
//! * The descriptor is used only while the session's reader holds the socket
//!   open: the reader calls [`Arrivals::forget`] before it lets go of its
//!   half, and the query runs under the same lock, so it never reaches a
//!   closed or reused descriptor.
//! * Without a socket (in-memory streams in tests, before the session's
//!   tasks start, after its reader ended) or when the kernel does not answer,
//!   there is no answer, and the frames read alone decide.
//! * The query is one `ioctl` and one `getsockopt`, made for a session that
//!   is silent by its reads, at most once a heartbeat tick (its answer moves
//!   last seen forward, so the next comes a threshold after the newest
//!   arrival at the earliest), and for a `LastSeenTimestamp` read; never per
//!   frame.

use std::os::fd::RawFd;
use std::sync::Mutex;

/// A session's socket, as far as the kernel's arrival time goes.
#[derive(Debug, Default)]
pub struct Arrivals {
    fd: Mutex<Option<RawFd>>,
}

impl Arrivals {
    /// From now on `fd` (a TCP socket the session's reader holds open) may be
    /// asked.
    pub fn watch(&self, fd: RawFd) {
        *self.lock() = Some(fd);
    }

    /// The reader lets go of the socket: it is not asked again. Waits for a
    /// query under way.
    pub fn forget(&self) {
        *self.lock() = None;
    }

    /// Milliseconds since the newest data still waiting unread in the socket
    /// arrived; `None` when nothing waits, without a socket, or without an
    /// answer.
    pub fn unread_since_ms(&self) -> Option<u32> {
        // Held until the kernel has answered, so that `forget` waits for a
        // query under way and the descriptor is never asked once the reader
        // may have closed it.
        let socket = self.lock();
        let fd = (*socket)?;
        if unread_bytes(fd)? == 0 {
            return None;
        }
        last_data_recv_ms(fd)
    }

    /// Whether a socket is watched now.
    #[cfg(test)]
    pub fn is_watching(&self) -> bool {
        self.lock().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<RawFd>> {
        // A panic while holding the lock cannot leave the Option half-written.
        self.fd.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Bytes waiting in the receive queue of socket `fd` (`FIONREAD`).
pub fn unread_bytes(fd: RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a c_int the call writes the count into; a descriptor
    // that is not a socket only makes the call fail.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &raw mut n) };
    if rc == 0 {
        usize::try_from(n).ok()
    } else {
        None
    }
}

/// `TCP_INFO`'s `tcpi_last_data_recv` of `fd`.
fn last_data_recv_ms(fd: RawFd) -> Option<u32> {
    // SAFETY: an all-zero `tcp_info` is a valid value of a plain C struct.
    #[allow(unsafe_code)]
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).ok()?;
    // SAFETY: `info` and `len` are valid for writes of `len` bytes; the
    // caller holds `fd` open (module invariants), and a descriptor that is not
    // a TCP socket only makes the call fail.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    // Older kernels fill less; the field must be within what was filled.
    let needed =
        std::mem::offset_of!(libc::tcp_info, tcpi_last_data_recv) + std::mem::size_of::<u32>();
    (rc == 0 && usize::try_from(len).is_ok_and(|l| l >= needed)).then_some(info.tcpi_last_data_recv)
}

/// A loopback TCP pair for tests of what the kernel says about a socket:
/// the manager's end (which the tests read only by hand) and the agent's.
#[cfg(test)]
pub(crate) fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let agent = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (manager, _) = listener.accept().unwrap();
    (manager, agent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn unread_data_is_seen_by_the_kernel_and_read_data_is_not() {
        use std::io::Read;
        let (mut manager, mut agent) = tcp_pair();
        let arrivals = Arrivals::default();
        assert_eq!(arrivals.unread_since_ms(), None, "no socket yet");
        arrivals.watch(manager.as_raw_fd());
        assert_eq!(arrivals.unread_since_ms(), None, "nothing waits");
        std::thread::sleep(std::time::Duration::from_millis(300));
        agent.write_all(&[0, 0, 0, 1, 0]).unwrap();
        // Loopback delivers within the write; nothing has read `manager`.
        let age = arrivals.unread_since_ms().unwrap();
        assert!(age < 200, "{age} ms after a write");
        // Read: the frames read tell it all, the kernel adds nothing.
        manager.read_exact(&mut [0; 5]).unwrap();
        assert_eq!(arrivals.unread_since_ms(), None, "all read");
        agent.write_all(&[0]).unwrap();
        assert!(arrivals.unread_since_ms().is_some(), "one byte waits");
        arrivals.forget();
        assert_eq!(arrivals.unread_since_ms(), None, "forgotten");
    }

    #[test]
    fn anything_but_a_tcp_socket_has_no_answer() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let arrivals = Arrivals::default();
        arrivals.watch(a.as_raw_fd());
        assert_eq!(arrivals.unread_since_ms(), None);
        arrivals.watch(-1);
        assert_eq!(arrivals.unread_since_ms(), None);
    }
}
