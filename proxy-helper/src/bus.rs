//! A blocking D-Bus client connection that can do one thing: call a method
//! and wait for its reply (see [`crate::wire`] for why it is not zbus).
//!
//! * Addresses: `unix:path=` and `unix:abstract=` entries of a D-Bus address
//!   (`;`-separated, tried in order, values %-escaped), which is what system
//!   and session buses use on Linux. Which address the system or the session
//!   bus has is `drover_bus::Bus::address`'s rule, as for every drover
//!   process.
//! * Authentication: SASL `EXTERNAL` with the process' uid; `BEGIN` and
//!   `Hello` then go out together with the first call, so a call costs the
//!   bus one round trip for the handshake and one for the call.
//! * Waiting: `poll` on the socket and, optionally, a signalfd, so a stop
//!   request (SIGTERM) interrupts the wait instead of killing the helper.

use crate::wire::{self, Call, Incoming, Kind};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long connecting and authenticating may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a bus listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// The endpoints of a D-Bus address, in the order to try them.
pub fn endpoints(address: &str) -> Result<Vec<Endpoint>, String> {
    let mut out = Vec::new();
    for entry in address.split(';').filter(|e| !e.is_empty()) {
        let Some((transport, params)) = entry.split_once(':') else {
            return Err(format!("'{entry}' is not a D-Bus address (no transport)"));
        };
        if transport != "unix" {
            // Other transports exist; the buses the helper talks to are local.
            continue;
        }
        let mut found = None;
        for kv in params.split(',') {
            let Some((key, value)) = kv.split_once('=') else {
                return Err(format!("'{kv}' in '{entry}' is not key=value"));
            };
            let value = unescape(value).ok_or_else(|| format!("bad %-escape in '{kv}'"))?;
            match key {
                "path" => found = Some(Endpoint::Path(PathBuf::from(bytes_to_os(value)))),
                "abstract" => found = Some(Endpoint::Abstract(value)),
                _ => {}
            }
        }
        out.extend(found);
    }
    if out.is_empty() {
        return Err(format!(
            "no unix:path= or unix:abstract= entry in D-Bus address '{address}'"
        ));
    }
    Ok(out)
}

fn bytes_to_os(b: Vec<u8>) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(b)
}

fn unescape(v: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(v.len());
    let mut bytes = v.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = (bytes.next()? as char).to_digit(16)?;
            let lo = (bytes.next()? as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// A socket connected to the first endpoint of `address` that accepts.
pub fn connect(address: &str) -> Result<UnixStream, String> {
    let mut last = String::new();
    for endpoint in endpoints(address)? {
        let connected = match &endpoint {
            Endpoint::Path(p) => UnixStream::connect(p),
            Endpoint::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|a| UnixStream::connect_addr(&a))
            }
        };
        match connected {
            Ok(sock) => return Ok(sock),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// How a call ended, when it did not get its reply.
#[derive(Debug)]
pub enum CallError {
    /// The signalfd said this signal arrived first.
    Interrupted(Signal),
    TimedOut,
    /// The bus closed the connection (the daemon went away).
    Closed,
    Io(String),
}

/// The reply to a call: `Ok(())` for a method return, or the error's name
/// and message.
pub type Reply = Result<(), (String, String)>;

/// An authenticated connection (see the module docs).
pub struct Connection {
    sock: UnixStream,
    /// Bytes read and not yet parsed into messages.
    buf: Vec<u8>,
    last_serial: u32,
    /// `BEGIN` and `Hello`, sent in front of the first call.
    pending_hello: Option<Vec<u8>>,
    /// Replies to earlier calls that came while waiting for another one
    /// (the helper makes two calls at most; see [`Connection::reply`]).
    early: Vec<(u32, Reply)>,
}

/// Replies to other calls kept while waiting for one.
const EARLY_REPLIES_MAX: usize = 4;

impl Connection {
    /// Connects to the first endpoint of `address` that accepts, and
    /// authenticates.
    pub fn open(address: &str) -> Result<Self, String> {
        Self::authenticate(connect(address)?)
    }

    fn authenticate(mut sock: UnixStream) -> Result<Self, String> {
        let io = |e: std::io::Error| format!("authenticating: {e}");
        sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        let uid = nix::unistd::getuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        sock.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())
            .map_err(io)?;
        // The bus sends nothing after its answer until we say BEGIN, so
        // reading whatever arrives reads exactly that line.
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            let mut chunk = [0u8; 256];
            let n = sock.read(&mut chunk).map_err(io)?;
            if n == 0 {
                return Err("the bus closed the connection while authenticating".into());
            }
            line.extend_from_slice(&chunk[..n]);
            if line.len() > 4096 {
                return Err("the bus' authentication answer is too long".into());
            }
        }
        if !line.starts_with(b"OK ") {
            let answer = String::from_utf8_lossy(&line);
            return Err(format!(
                "the bus refused EXTERNAL authentication ({})",
                answer.trim()
            ));
        }
        sock.set_read_timeout(None).map_err(io)?;
        let mut first = b"BEGIN\r\n".to_vec();
        first.extend(wire::encode_call(
            &Call {
                destination: wire::DBUS_NAME,
                path: wire::DBUS_PATH,
                interface: wire::DBUS_NAME,
                member: "Hello",
                args: &[],
            },
            1,
        ));
        Ok(Self {
            sock,
            buf: Vec::new(),
            last_serial: 1,
            pending_hello: Some(first),
            early: Vec::new(),
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
        let serial = self.send(call)?;
        self.reply(serial, timeout, interrupt)
    }

    /// The serial of the last call sent.
    pub fn last_serial(&self) -> u32 {
        self.last_serial
    }

    /// Sends `call`; its serial, for [`Connection::reply`].
    pub fn send(&mut self, call: &Call<'_>) -> Result<u32, CallError> {
        self.last_serial += 1;
        let serial = self.last_serial;
        let mut out = self.pending_hello.take().unwrap_or_default();
        out.extend(wire::encode_call(call, serial));
        self.sock
            .write_all(&out)
            .map_err(|e| CallError::Io(e.to_string()))?;
        Ok(serial)
    }

    /// Waits for the reply to the call sent as `serial`, at most `timeout`
    /// (`None`: as long as it takes), or until `interrupt` reports a signal.
    /// A reply to another call of ours that arrives meanwhile is kept for a
    /// later `reply` of that serial (an interrupted call's answer may come
    /// while a second call is waited for).
    pub fn reply(
        &mut self,
        serial: u32,
        timeout: Option<Duration>,
        interrupt: Option<&SignalFd>,
    ) -> Result<Reply, CallError> {
        if let Some(at) = self.early.iter().position(|(s, _)| *s == serial) {
            return Ok(self.early.swap_remove(at).1);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            while let Some(msg) = self.next_buffered()? {
                // Only a method return or an error answers a call. A signal may
                // carry a REPLY_SERIAL field too, and any local user may send one
                // to our unique name: taken as the answer, it would complete the
                // proxy while its target is still down.
                let Some(to) = msg
                    .reply_serial
                    .filter(|_| matches!(msg.kind, Kind::Return | Kind::Error))
                else {
                    continue;
                };
                let reply = match msg.kind {
                    Kind::Error => Err((
                        msg.error_name.unwrap_or_default(),
                        msg.first_string.unwrap_or_default(),
                    )),
                    _ => Ok(()),
                };
                if to == serial {
                    return Ok(reply);
                }
                // Hello's reply (serial 1) answers nothing we wait for; a
                // reply to another call of ours is kept for it.
                if to > 1 && to <= self.last_serial && self.early.len() < EARLY_REPLIES_MAX {
                    self.early.push((to, reply));
                }
            }
            self.wait(deadline, interrupt)?;
            let mut chunk = [0u8; 4096];
            match self.sock.read(&mut chunk) {
                Ok(0) => return Err(CallError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CallError::Io(e.to_string())),
            }
        }
    }

    /// Blocks until the socket is readable, or the deadline or a signal.
    fn wait(
        &self,
        deadline: Option<Instant>,
        interrupt: Option<&SignalFd>,
    ) -> Result<(), CallError> {
        loop {
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(CallError::TimedOut);
                    }
                    // Rounded up, so the wait never spins at 0 ms.
                    let ms = left.as_millis().saturating_add(1).min(i32::MAX as u128);
                    PollTimeout::try_from(ms as i32).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = vec![PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            if let Some(sfd) = interrupt {
                fds.push(PollFd::new(sfd.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(CallError::Io(e.to_string())),
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            if fds.len() > 1 && ready(&fds[1]) {
                if let Some(sfd) = interrupt
                    && let Ok(Some(info)) = sfd.read_signal()
                    && let Ok(sig) = Signal::try_from(info.ssi_signo as i32)
                {
                    return Err(CallError::Interrupted(sig));
                }
                continue;
            }
            if ready(&fds[0]) {
                return Ok(());
            }
        }
    }

    /// Splits the next whole message off the read buffer.
    fn next_buffered(&mut self) -> Result<Option<Incoming>, CallError> {
        let malformed = |e: wire::Malformed| CallError::Io(e.to_string());
        let Some(len) = wire::message_len(&self.buf).map_err(malformed)? else {
            return Ok(None);
        };
        if self.buf.len() < len {
            return Ok(None);
        }
        let msg = wire::parse(&self.buf[..len]).map_err(malformed)?;
        self.buf.drain(..len);
        Ok(Some(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_unix_sockets() {
        assert_eq!(
            endpoints("unix:path=/run/user/0/bus").unwrap(),
            vec![Endpoint::Path("/run/user/0/bus".into())]
        );
        assert_eq!(
            endpoints("tcp:host=x,port=1;unix:abstract=/tmp/dbus-x%2c1,guid=ab;unix:path=/a%20b")
                .unwrap(),
            vec![
                Endpoint::Abstract(b"/tmp/dbus-x,1".to_vec()),
                Endpoint::Path("/a b".into())
            ]
        );
    }

    #[test]
    fn bad_addresses_are_clear_errors() {
        for (address, why) in [
            ("", "no unix:path="),
            ("tcp:host=localhost,port=1", "no unix:path="),
            ("/run/bus", "no transport"),
            ("unix:path", "not key=value"),
            ("unix:path=/x%zz", "%-escape"),
            ("unix:path=/x%4", "%-escape"),
            ("unix:guid=1234", "no unix:path="),
        ] {
            let err = endpoints(address).unwrap_err();
            assert!(err.contains(why), "{address:?}: {err}");
        }
    }

    const CALL: Call<'static> = Call {
        destination: "org.eclipse.bluechi.Agent",
        path: "/org/eclipse/bluechi",
        interface: "org.eclipse.bluechi.Agent",
        member: "CreateProxy",
        args: &["drover-proxy@n_db.service", "n", "db.service"],
    };

    /// A "bus" on the other end of a socket pair: answers the handshake with
    /// `auth`, then reads the client's first write and answers with `then`.
    fn scripted_bus(auth: &'static [u8], then: Vec<u8>) -> UnixStream {
        let (client, mut bus) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut got = [0u8; 512];
            let _ = bus.read(&mut got);
            let _ = bus.write_all(auth);
            let _ = bus.read(&mut got);
            let _ = bus.write_all(&then);
            // Hold the socket open until the client is done.
            let _ = bus.read(&mut got);
        });
        client
    }

    /// An error reply to `serial` (2: the first call after Hello).
    fn error_reply(serial: u8, name: &str, message: &str) -> Vec<u8> {
        let mut m = vec![b'l', 3, 1, 1];
        let mut body = (message.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(message.as_bytes());
        body.push(0);
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(&5u32.to_le_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&[4, 1, b's', 0]);
        m.extend_from_slice(&(name.len() as u32).to_le_bytes());
        m.extend_from_slice(name.as_bytes());
        m.push(0);
        while !m.len().is_multiple_of(8) {
            m.push(0);
        }
        m.extend_from_slice(&[5, 1, b'u', 0, serial, 0, 0, 0]);
        m.extend_from_slice(&[8, 1, b'g', 0, 1, b's', 0]);
        let fields = (m.len() - 16) as u32;
        m[12..16].copy_from_slice(&fields.to_le_bytes());
        while !m.len().is_multiple_of(8) {
            m.push(0);
        }
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn the_reply_to_the_call_is_found_behind_other_messages() {
        // Hello's reply (serial 1) comes first and must not be taken for ours.
        let mut then = error_reply(1, "x.NotOurs", "");
        then.extend(error_reply(
            2,
            "org.eclipse.bluechi.ActivationFailed",
            "no such node 'n'",
        ));
        let sock = scripted_bus(b"OK 0123456789abcdef\r\n", then);
        let mut conn = Connection::authenticate(sock).unwrap();
        let reply = conn
            .call(&CALL, Some(Duration::from_secs(10)), None)
            .unwrap();
        assert_eq!(
            reply,
            Err((
                "org.eclipse.bluechi.ActivationFailed".into(),
                "no such node 'n'".into()
            ))
        );
    }

    #[test]
    fn the_answer_to_an_interrupted_call_is_kept_while_another_is_waited_for() {
        // CreateProxy (serial 2) was interrupted; RemoveProxy (3) is sent.
        // The agent answers both, in either order.
        for create_first in [true, false] {
            let create = error_reply(
                2,
                "org.eclipse.bluechi.ActivationFailed",
                "node n is offline",
            );
            let remove = error_reply(3, "x.Fine", "");
            let then = if create_first {
                [create, remove].concat()
            } else {
                [remove, create].concat()
            };
            let sock = scripted_bus(b"OK 1\r\n", then);
            let mut conn = Connection::authenticate(sock).unwrap();
            let created = conn.send(&CALL).unwrap();
            assert_eq!(created, 2);
            let removed = conn
                .call(&CALL, Some(Duration::from_secs(10)), None)
                .unwrap();
            assert_eq!(removed, Err(("x.Fine".into(), String::new())));
            let answer = conn
                .reply(created, Some(Duration::from_secs(10)), None)
                .unwrap();
            assert_eq!(
                answer,
                Err((
                    "org.eclipse.bluechi.ActivationFailed".into(),
                    "node n is offline".into()
                )),
                "create first: {create_first}"
            );
        }
    }

    #[test]
    fn a_bus_that_misbehaves_is_a_clear_error() {
        let sock = scripted_bus(b"REJECTED EXTERNAL\r\n", Vec::new());
        let err = Connection::authenticate(sock).err().unwrap();
        assert!(err.contains("refused EXTERNAL authentication"), "{err}");

        let sock = scripted_bus(b"OK 1\r\n", b"garbage that is not D-Bus".to_vec());
        let mut conn = Connection::authenticate(sock).unwrap();
        match conn.call(&CALL, Some(Duration::from_secs(10)), None) {
            Err(CallError::Io(e)) => assert!(e.contains("malformed D-Bus message"), "{e}"),
            other => panic!("{other:?}"),
        }

        // The bus goes away after the handshake.
        let (client, mut bus) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut got = [0u8; 512];
            let _ = bus.read(&mut got);
            let _ = bus.write_all(b"OK 1\r\n");
            let _ = bus.read(&mut got);
        });
        let mut conn = Connection::authenticate(client).unwrap();
        assert!(matches!(
            conn.call(&CALL, Some(Duration::from_secs(10)), None),
            Err(CallError::Closed)
        ));

        // A bus that never answers: the timeout ends the wait.
        let sock = scripted_bus(b"OK 1\r\n", Vec::new());
        let mut conn = Connection::authenticate(sock).unwrap();
        let t = Instant::now();
        assert!(matches!(
            conn.call(&CALL, Some(Duration::from_millis(100)), None),
            Err(CallError::TimedOut)
        ));
        assert!(t.elapsed() >= Duration::from_millis(100));
    }

    #[test]
    fn a_socket_nobody_listens_on_is_a_connect_error() {
        let dir = std::env::temp_dir().join(format!("drover-proxy-bus-{}", std::process::id()));
        let err = Connection::open(&format!("unix:path={}/none", dir.display()))
            .err()
            .expect("nothing listens there");
        assert!(err.contains("No such file"), "{err}");
    }
}
