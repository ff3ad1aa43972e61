//! The few D-Bus messages the helper sends and reads, in the D-Bus wire
//! format (the specification's "Message Format" section).
//!
//! Why not zbus: the helper is exec'd by systemd for every proxy start, while
//! the target starts on another node, and on small machines the two compete
//! for the CPU. Measured side by side on the shared 2-core VM (issue 12)
//! against the same client on zbus 6.2 (`zbus::block_on` on its
//! current-thread Tokio runtime, `Builder::unix_stream`, the signalfd on the
//! runtime's reactor; commit "proxy-helper: the agent client on zbus too,
//! behind a feature, to measure", removed by the next one), this module and
//! [`crate::bus`] are **measurably faster on the cross-node path**:
//!
//! * `drover-bench proxy --samples 1000 --helper-b` (both helpers in one run,
//!   paired by round), two runs: the cross-node start is 0.24 ms and 0.60 ms
//!   shorter per start (median of the per-round differences; 95% intervals
//!   [0.09, 0.45] and [0.29, 1.02] ms), medians 10.34 vs 10.61 ms and 13.17 vs
//!   13.56 ms (2.6% and 3.0%); drover's own share 3.12 vs 3.38 ms and 3.45 vs
//!   3.78 ms (8% and 10%). The helper against a copy of itself: −0.03 ms
//!   [−0.35, 0.21].
//! * One whole `remove` against a bus (exec, connect, call, error reply,
//!   exit): 1.02–1.13 ms of CPU against 1.26–1.44 ms, 1.35–1.42 ms against
//!   1.62–1.73 ms wall (medians of 300 interleaved runs, twice): zbus waits for
//!   `Hello`'s reply before it sends the call, and starts a runtime.
//! * Exec alone (`--version`): 0.91–0.93 against 1.01–1.02 ms of CPU.
//! * Stripped binary 455 KB against 2.3 MB; 36 crates against 50.
//!
//! Sent: method calls whose arguments are strings (`Hello`, `CreateProxy`,
//! `RemoveProxy`), little-endian. Read: any message (either byte order) is
//! split off the stream and its header parsed; of a body only a leading
//! string is read, which is what an error reply carries as its message.
//! Everything read is checked: a malformed or oversized message is an error,
//! never a panic.

use std::fmt;

/// The bus daemon's own name, path and interface (for `Hello`).
pub const DBUS_NAME: &str = "org.freedesktop.DBus";
pub const DBUS_PATH: &str = "/org/freedesktop/DBus";

/// Messages the helper accepts at most; its replies are tiny, and the bus only
/// sends it replies and its own `NameAcquired`.
pub const MAX_MESSAGE: usize = 1 << 20;

const FIXED_HEADER: usize = 16;

/// D-Bus message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Call,
    Return,
    Error,
    Signal,
}

/// A method call whose arguments are all strings (signature `s…`).
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub destination: &'a str,
    pub path: &'a str,
    pub interface: &'a str,
    pub member: &'a str,
    pub args: &'a [&'a str],
}

/// What the helper needs of a message it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    pub kind: Kind,
    pub reply_serial: Option<u32>,
    pub error_name: Option<String>,
    /// The body's first argument when it is a string (an error's message).
    pub first_string: Option<String>,
}

/// Why bytes from the bus are not a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed D-Bus message from the bus: {}", self.0)
    }
}

fn bad<T>(why: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(why.into()))
}

// ---- writing ---------------------------------------------------------------

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self, align: usize) {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
    }

    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn signature(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    /// One header field `(code, variant)`; `sig` is `s`, `o` or `g`.
    fn field(&mut self, code: u8, sig: &str, value: &str) {
        self.pad(8);
        self.buf.push(code);
        self.signature(sig);
        if sig == "g" {
            self.signature(value);
        } else {
            self.string(value);
        }
    }
}

/// Encodes `call` with `serial`. Names and paths come from this crate and the
/// validated instance, so they are well-formed; lengths fit D-Bus' limits.
pub fn encode_call(call: &Call<'_>, serial: u32) -> Vec<u8> {
    let mut body = Writer { buf: Vec::new() };
    for arg in call.args {
        body.string(arg);
    }
    let mut w = Writer {
        buf: vec![b'l', 1, 0, 1],
    };
    w.u32(body.buf.len() as u32);
    w.u32(serial);
    w.u32(0); // header fields' length, patched below
    let fields_start = w.buf.len();
    w.field(1, "o", call.path);
    w.field(2, "s", call.interface);
    w.field(3, "s", call.member);
    w.field(6, "s", call.destination);
    if !call.args.is_empty() {
        w.field(8, "g", &"s".repeat(call.args.len()));
    }
    let fields_len = (w.buf.len() - fields_start) as u32;
    w.buf[12..16].copy_from_slice(&fields_len.to_le_bytes());
    w.pad(8);
    w.buf.extend_from_slice(&body.buf);
    w.buf
}

// ---- reading ---------------------------------------------------------------

/// The length of the first message in `buf` once its fixed header is there:
/// `Ok(None)` when more bytes are needed to know.
pub fn message_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < FIXED_HEADER {
        return Ok(None);
    }
    let little = endian(buf[0])?;
    if buf[3] != 1 {
        return bad(format!("protocol version {}", buf[3]));
    }
    let body = read_u32(little, &buf[4..8]) as usize;
    let fields = read_u32(little, &buf[12..16]) as usize;
    let header = FIXED_HEADER
        .checked_add(fields)
        .map(|h| h.next_multiple_of(8));
    match header.and_then(|h| h.checked_add(body)) {
        Some(total) if total <= MAX_MESSAGE => Ok(Some(total)),
        _ => bad(format!(
            "{fields} header and {body} body bytes (at most {MAX_MESSAGE} in all)"
        )),
    }
}

/// Parses one whole message (`msg.len()` as [`message_len`] said).
pub fn parse(msg: &[u8]) -> Result<Incoming, Malformed> {
    let Some(total) = message_len(msg)? else {
        return bad("truncated fixed header");
    };
    if total != msg.len() {
        return bad("length does not match its header");
    }
    let little = endian(msg[0])?;
    let kind = match msg[1] {
        1 => Kind::Call,
        2 => Kind::Return,
        3 => Kind::Error,
        4 => Kind::Signal,
        t => return bad(format!("message type {t}")),
    };
    let fields_len = read_u32(little, &msg[12..16]) as usize;
    let fields_end = FIXED_HEADER + fields_len;
    let mut r = Reader {
        buf: &msg[..fields_end],
        pos: FIXED_HEADER,
        little,
    };
    let mut out = Incoming {
        kind,
        reply_serial: None,
        error_name: None,
        first_string: None,
    };
    let mut body_sig = String::new();
    while r.pos < fields_end {
        r.align(8)?;
        let code = r.byte()?;
        let sig = r.signature()?;
        let value = r.basic(&sig)?;
        match (code, value) {
            (4, Value::Str(s)) => out.error_name = Some(s),
            (5, Value::U32(v)) => out.reply_serial = Some(v),
            (8, Value::Str(s)) => body_sig = s,
            (4 | 5 | 8, _) => return bad(format!("header field {code} has type '{sig}'")),
            _ => {}
        }
    }
    if kind == Kind::Error && out.error_name.is_none() {
        return bad("an error without an error name");
    }
    if matches!(kind, Kind::Return | Kind::Error) && out.reply_serial.is_none() {
        return bad("a reply without a reply serial");
    }
    if body_sig.starts_with('s') {
        let mut body = Reader {
            buf: &msg[fields_end.next_multiple_of(8)..],
            pos: 0,
            little,
        };
        match body.basic("s")? {
            Value::Str(s) => out.first_string = Some(s),
            _ => unreachable!("basic(\"s\") reads a string"),
        }
    }
    Ok(out)
}

fn endian(b: u8) -> Result<bool, Malformed> {
    match b {
        b'l' => Ok(true),
        b'B' => Ok(false),
        other => bad(format!("byte order mark {other:#04x}")),
    }
}

fn read_u32(little: bool, b: &[u8]) -> u32 {
    let b: [u8; 4] = b[..4].try_into().expect("four bytes");
    if little {
        u32::from_le_bytes(b)
    } else {
        u32::from_be_bytes(b)
    }
}

enum Value {
    Str(String),
    U32(u32),
    Other,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    little: bool,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return bad("a value runs past its end");
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn align(&mut self, to: usize) -> Result<(), Malformed> {
        let next = self.pos.next_multiple_of(to);
        if next > self.buf.len() {
            return bad("padding runs past its end");
        }
        if self.buf[self.pos..next].iter().any(|&b| b != 0) {
            return bad("non-zero padding");
        }
        self.pos = next;
        Ok(())
    }

    fn byte(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        self.align(4)?;
        let little = self.little;
        Ok(read_u32(little, self.take(4)?))
    }

    fn text(&mut self, len: usize) -> Result<String, Malformed> {
        let bytes = self.take(len + 1)?;
        if bytes[len] != 0 {
            return bad("a string without its terminating nul");
        }
        match std::str::from_utf8(&bytes[..len]) {
            Ok(s) if !s.contains('\0') => Ok(s.to_string()),
            _ => bad("a string that is not UTF-8 text"),
        }
    }

    fn signature(&mut self) -> Result<String, Malformed> {
        let len = self.byte()? as usize;
        self.text(len)
    }

    /// A value of a single basic type; containers are refused (no header
    /// field has one).
    fn basic(&mut self, sig: &str) -> Result<Value, Malformed> {
        match sig {
            "s" | "o" => {
                let len = self.u32()? as usize;
                Ok(Value::Str(self.text(len)?))
            }
            "g" => Ok(Value::Str(self.signature()?)),
            "u" => Ok(Value::U32(self.u32()?)),
            "y" => self.byte().map(|_| Value::Other),
            "n" | "q" => {
                self.align(2)?;
                self.take(2).map(|_| Value::Other)
            }
            "b" | "i" | "h" => self.u32().map(|_| Value::Other),
            "x" | "t" | "d" => {
                self.align(8)?;
                self.take(8).map(|_| Value::Other)
            }
            other => bad(format!("a header field of type '{other}'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the bus daemon writes it, in either byte order.
    fn reply(little: bool, kind: u8, fields: &[(u8, &str, &str)], body: &[&str]) -> Vec<u8> {
        let u32b = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let pad = |b: &mut Vec<u8>, a: usize| {
            while !b.len().is_multiple_of(a) {
                b.push(0)
            }
        };
        let mut body_bytes = Vec::new();
        for s in body {
            pad(&mut body_bytes, 4);
            body_bytes.extend_from_slice(&u32b(s.len() as u32));
            body_bytes.extend_from_slice(s.as_bytes());
            body_bytes.push(0);
        }
        let mut m = vec![if little { b'l' } else { b'B' }, kind, 0, 1];
        m.extend_from_slice(&u32b(body_bytes.len() as u32));
        m.extend_from_slice(&u32b(9));
        m.extend_from_slice(&[0; 4]);
        for (code, sig, value) in fields {
            pad(&mut m, 8);
            m.push(*code);
            m.extend_from_slice(&[1, sig.as_bytes()[0], 0]);
            match *sig {
                "u" => {
                    pad(&mut m, 4);
                    m.extend_from_slice(&u32b(value.parse().unwrap()));
                }
                "g" => {
                    m.push(value.len() as u8);
                    m.extend_from_slice(value.as_bytes());
                    m.push(0);
                }
                _ => {
                    pad(&mut m, 4);
                    m.extend_from_slice(&u32b(value.len() as u32));
                    m.extend_from_slice(value.as_bytes());
                    m.push(0);
                }
            }
        }
        let fields_len = (m.len() - 16) as u32;
        m[12..16].copy_from_slice(&u32b(fields_len));
        pad(&mut m, 8);
        m.extend_from_slice(&body_bytes);
        m
    }

    #[test]
    fn a_call_round_trips_through_the_reader() {
        let call = Call {
            destination: "org.eclipse.bluechi.Agent",
            path: "/org/eclipse/bluechi",
            interface: "org.eclipse.bluechi.Agent",
            member: "CreateProxy",
            args: &["drover-proxy@n_db.service", "n", "db.service"],
        };
        let bytes = encode_call(&call, 7);
        assert_eq!(message_len(&bytes), Ok(Some(bytes.len())));
        assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
        let m = parse(&bytes).unwrap();
        assert_eq!(m.kind, Kind::Call);
        assert_eq!(m.first_string.as_deref(), Some("drover-proxy@n_db.service"));
    }

    #[test]
    fn the_encoding_is_the_one_the_specification_gives() {
        // Hello, as every D-Bus library sends it (no body, no signature).
        let hello = encode_call(
            &Call {
                destination: DBUS_NAME,
                path: DBUS_PATH,
                interface: DBUS_NAME,
                member: "Hello",
                args: &[],
            },
            1,
        );
        let mut want = vec![b'l', 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        for (code, sig, value) in [
            (1u8, b'o', DBUS_PATH),
            (2, b's', DBUS_NAME),
            (3, b's', "Hello"),
            (6, b's', DBUS_NAME),
        ] {
            while !want.len().is_multiple_of(8) {
                want.push(0);
            }
            want.extend_from_slice(&[code, 1, sig, 0]);
            want.extend_from_slice(&(value.len() as u32).to_le_bytes());
            want.extend_from_slice(value.as_bytes());
            want.push(0);
        }
        let fields = (want.len() - 16) as u32;
        want[12..16].copy_from_slice(&fields.to_le_bytes());
        while !want.len().is_multiple_of(8) {
            want.push(0);
        }
        assert_eq!(fields, 109);
        assert_eq!(hello, want);
    }

    #[test]
    fn replies_in_both_byte_orders_are_read() {
        for little in [true, false] {
            let err = reply(
                little,
                3,
                &[
                    (4, "s", "org.eclipse.bluechi.ActivationFailed"),
                    (5, "u", "2"),
                    (8, "g", "s"),
                    (7, "s", ":1.4"),
                ],
                &["no such node 'x'"],
            );
            assert_eq!(message_len(&err), Ok(Some(err.len())));
            assert_eq!(
                parse(&err).unwrap(),
                Incoming {
                    kind: Kind::Error,
                    reply_serial: Some(2),
                    error_name: Some("org.eclipse.bluechi.ActivationFailed".into()),
                    first_string: Some("no such node 'x'".into()),
                }
            );
            let ret = reply(little, 2, &[(5, "u", "1"), (8, "g", "s")], &[":1.9"]);
            let m = parse(&ret).unwrap();
            assert_eq!((m.kind, m.reply_serial), (Kind::Return, Some(1)));
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let good = reply(true, 3, &[(4, "s", "a.B"), (5, "u", "2")], &[]);
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (b"xyzw".repeat(4), "byte order"),
            (
                {
                    let mut m = good.clone();
                    m[3] = 2;
                    m
                },
                "version",
            ),
            (
                {
                    let mut m = good.clone();
                    m[1] = 9;
                    m
                },
                "message type",
            ),
            (
                {
                    let mut m = good.clone();
                    m[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
                    m
                },
                "at most",
            ),
            (reply(true, 3, &[(5, "u", "2")], &[]), "error name"),
            (reply(true, 2, &[], &[]), "reply serial"),
            (reply(true, 2, &[(5, "s", "x")], &[]), "type 's'"),
        ];
        // A string length that runs past the end of the header.
        let mut long = good.clone();
        long[20..24].copy_from_slice(&200u32.to_le_bytes());
        cases.push((long, "past"));
        for (bytes, why) in cases {
            let err = match message_len(&bytes) {
                Err(e) => e,
                Ok(_) => parse(&bytes).expect_err(why),
            };
            assert!(err.0.contains(why), "{why}: {err}");
        }
        // Every truncation and every single-byte change of a good reply is
        // handled without a panic.
        for n in 0..good.len() {
            let _ = message_len(&good[..n]).map(|_| parse(&good[..n]));
            for v in [0u8, 0xff, b's', b'g'] {
                let mut m = good.clone();
                m[n] = v;
                let _ = parse(&m);
            }
        }
        assert_eq!(message_len(&good[..15]), Ok(None));
    }
}
