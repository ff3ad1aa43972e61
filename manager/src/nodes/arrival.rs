//! When data last came in on a session's socket, in the kernel's words
//! (`TCP_INFO`), so that a node is not called silent because the manager
//! was too busy to read it.
//!
//! The silence check ([`crate::nodes::session::Session::is_silent`]) judges
//! an agent by the frames the manager has read. Under a burst of work the
//! readers fall behind: at 19,000 nodes, a monitor's first `Subscribe("*")`
//! has every agent answer with its loaded units at once, 3.8 million frames,
//! and a check by reads alone ended about 5,900 healthy sessions ("nothing
//! received for more than 6000 ms") whose heartbeats were there, unread
//! (`docs/performance.md`). So before a session counts as silent, the kernel
//! is asked how long ago data last arrived on its socket
//! (`tcpi_last_data_recv`): what the agent sent, read yet or not, proves it
//! alive as a frame read does. A frozen agent or a vanished host sends
//! nothing, so they are still seen within the threshold.
//!
//! Invariants:
//! * The descriptor is used only while the session's reader holds the socket
//!   open: the reader calls [`Arrivals::forget`] before it lets go of its
//!   half, and the query runs under the same lock, so it never reaches a
//!   closed or reused descriptor.
//! * Without a socket (in-memory streams in tests, before the session's
//!   tasks start, after its reader ended) or when the kernel does not answer,
//!   there is no answer, and the frames read alone decide.
//! * The query is one `getsockopt`, made only for a session that is silent
//!   by its reads (see the call site), never per frame.

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

    /// Milliseconds since data last arrived on the socket; `None` without a
    /// socket or an answer.
    pub fn since_last_data_ms(&self) -> Option<u32> {
        let fd = self.lock();
        fd.and_then(last_data_recv_ms)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let agent = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (manager, _) = listener.accept().unwrap();
        (manager, agent)
    }

    #[test]
    fn unread_data_is_seen_by_the_kernel() {
        let (manager, mut agent) = pair();
        let arrivals = Arrivals::default();
        assert_eq!(arrivals.since_last_data_ms(), None, "no socket yet");
        arrivals.watch(manager.as_raw_fd());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let before = arrivals.since_last_data_ms().unwrap();
        assert!(before >= 250, "nothing sent yet: {before} ms");
        agent.write_all(&[0, 0, 0, 1, 0]).unwrap();
        // Loopback delivers within the write; nothing reads `manager`.
        let after = arrivals.since_last_data_ms().unwrap();
        assert!(after < 200, "{after} ms after a write");
        arrivals.forget();
        assert_eq!(arrivals.since_last_data_ms(), None, "forgotten");
    }

    #[test]
    fn anything_but_a_tcp_socket_has_no_answer() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let arrivals = Arrivals::default();
        arrivals.watch(a.as_raw_fd());
        assert_eq!(arrivals.since_last_data_ms(), None);
        arrivals.watch(-1);
        assert_eq!(arrivals.since_last_data_ms(), None);
    }
}
