//! The first frame each way.
//!
//! Both first frames start with the same fixed prefix — 4 magic bytes and the
//! protocol version — encoded before anything else. The receiver decodes the
//! prefix alone first ([`read_prefix`]), so a peer speaking another version is
//! recognised even if the rest of its frame layout differs, and gets a clear
//! refusal instead of a decode error or a hang.

use crate::codec::FrameError;
use serde::{Deserialize, Serialize};

/// Bumped on every incompatible change of any message in this crate.
///
/// 2: one `Request::UnitJob { kind, .. }` replaced the four
/// `Request::{Start,Stop,Restart,Reload}Unit` variants.
/// 3: `ToManager::ReplyPart`, the parts of a list reply larger than a frame.
/// 4: `Notice::TargetNodeOffline` / `TargetNodeOnline`, why a proxy waits.
/// 5: the manager sends no heartbeats by default and the agent sets
/// `TCP_USER_TIMEOUT` so its own heartbeats probe the manager
/// ([`crate::liveness`]); a protocol 4 agent would not see a vanished manager.
/// 6: the agent sends three times per manager threshold (was: twice), since
/// the manager reads every other heartbeat ([`crate::liveness`]); a protocol
/// 5 agent sending twice per threshold would be dropped as silent.
/// 7: `Event::ProxyNew` carries the proxy unit's family (`template`): a
/// `bluechi-proxy@` proxy ends as BlueChi's does. Health (`crate::health`):
/// `Event::UnitHealth`, `Event::HealthSnapshot`, `Event::NodeHealth`,
/// `TargetChange::Health`; a protocol 6 manager would fail to decode them, a
/// protocol 6 agent's targets would never be healthy. (Both came in the same
/// unreleased version, so they share one number.)
/// 8: discovery: [`Hello::advertise_address`] (the agent's
/// `AdvertiseAddress=`); a protocol 7 manager would fail to decode the hello.
/// Also 8 (the same unreleased version): resync (`crate::resync`):
/// `Accepted::resync_interval_ms`, `Event::ResyncDigest`,
/// `Event::ResyncSnapshot`, `Request::Resync`, `Reason::Resync`.
/// 9: high availability: [`Accepted::epoch`] (the leader's epoch, which an
/// agent never lets fall) and [`Outcome::Parked`] (a standby holds the link
/// and welcomes the agent on it the moment it leads); a protocol 8 agent
/// would take a parked answer for garbage.
/// 10: the agent pads every frame but a heartbeat to
/// [`crate::liveness::AGENT_MIN_FRAME_LEN`] and the manager reads
/// heartbeats [`crate::liveness::HEARTBEATS_PER_READ`] at a time; a
/// protocol 9 agent's small replies would wait in the manager's socket for
/// its heartbeats.
/// 11: `Request::SubscribeState` ([`crate::Scope`]): the manager subscribes
/// the units its proxies and discovery watch for their state alone; a
/// protocol 10 agent would fail to decode it.
pub const PROTOCOL_VERSION: u32 = 11;

/// `DRVR`: tells a drover peer from anything else talking to the port.
pub const MAGIC: [u8; 4] = *b"DRVR";

/// Largest agent version string a [`Hello`] is meant to carry, in bytes.
/// Versions are short (`0.1.0`); the budget leaves room for a distribution
/// suffix and is what [`HELLO_MAX_LEN`] is sized from.
pub const AGENT_VERSION_MAX: usize = 256;

/// Cap on the body of the first frame a manager reads (the [`Hello`]), far
/// below [`crate::MAX_FRAME_LEN`]: before the hello nothing is known about
/// the peer, so what it can make the manager buffer must be small.
///
/// The largest legal hello is 4 (magic) + 5 (version, varint `u32::MAX`) +
/// 1 + 64 (node name of [`crate::names::NODE_NAME_MAX`] bytes) + 2 + 256
/// (agent version of [`AGENT_VERSION_MAX`] bytes) + 18 (advertise address:
/// option, variant, 16 bytes of IPv6) = 350 bytes; a test pins it. 512 leaves room for a field or two in a later protocol version
/// without letting an unauthenticated peer cost more than half a KiB.
pub const HELLO_MAX_LEN: usize = 512;

/// Largest manager version string a [`Welcome`] carries, in bytes (the same
/// budget as the agent's); [`Welcome::accepted`] cuts a longer one.
pub const MANAGER_VERSION_MAX: usize = AGENT_VERSION_MAX;

/// Largest refusal message a [`Welcome`] carries, in bytes;
/// [`Welcome::refused`] cuts a longer one. The manager's longest today is the
/// refusal of an invalid node name, which quotes the name (at most the rest
/// of a [`HELLO_MAX_LEN`] hello): about 560 bytes.
pub const REFUSAL_MESSAGE_MAX: usize = 1024;

/// Bytes of postcard's varint of `n`, 7 bits a byte.
const fn varint_len(n: usize) -> usize {
    let mut len = 1;
    let mut rest = n >> 7;
    while rest > 0 {
        len += 1;
        rest >>= 7;
    }
    len
}

/// Bytes of a postcard string of `max` bytes: its length as a varint, then the bytes.
const fn string_len(max: usize) -> usize {
    varint_len(max) + max
}

const fn max_of(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// Longest varints of a `u32` and a `u64`.
const VARINT_U32_MAX: usize = 5;
const VARINT_U64_MAX: usize = 10;

/// Cap on the body of the first frame an agent reads (the [`Welcome`]): the
/// largest welcome the constructors can build, so a peer posing as the
/// manager cannot make an agent buffer more (the normal cap,
/// [`crate::MAX_FRAME_LEN`], is 1 MiB, and applies only once accepted).
///
/// 4 (magic) + 5 (version) + 1 (outcome) + the largest of *accepted*: 5 × 10
/// (session id, heartbeat settings, resync interval and epoch, varint
/// `u64::MAX`) + 2 + 256 (manager version of [`MANAGER_VERSION_MAX`] bytes)
/// = 308, *refused*: 1 (reason) + 2 + 1024 (message of
/// [`REFUSAL_MESSAGE_MAX`] bytes) = 1027, and *parked*: 2 + 1024 (message,
/// the same budget) = 1026; 1037 bytes,
/// which a test pins. No margin is needed for later protocol versions: a
/// manager answers a hello of another version with a short refusal.
pub const WELCOME_MAX_LEN: usize = MAGIC.len()
    + VARINT_U32_MAX
    + 1
    + max_of(
        5 * VARINT_U64_MAX + string_len(MANAGER_VERSION_MAX),
        1 + string_len(REFUSAL_MESSAGE_MAX),
    );

/// `text` cut to at most `max` bytes, on a character boundary.
fn clamp(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Agent → manager, first frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 4],
    pub protocol_version: u32,
    /// Unvalidated on the wire so that a bad name gets a refusal that says so.
    pub node: String,
    pub agent_version: String,
    /// The agent's `AdvertiseAddress=`: where other programs reach the
    /// node's services. `None`: the address the manager sees the connection
    /// come from. A typed address, so a peer cannot send anything else.
    pub advertise_address: Option<std::net::IpAddr>,
}

impl Hello {
    pub fn new(node: impl Into<String>, agent_version: impl Into<String>) -> Self {
        Self {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            node: node.into(),
            agent_version: agent_version.into(),
            advertise_address: None,
        }
    }

    /// The same hello, advertising `address`.
    pub fn advertising(mut self, address: Option<std::net::IpAddr>) -> Self {
        self.advertise_address = address;
        self
    }
}

/// Manager → agent, first frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub magic: [u8; 4],
    pub protocol_version: u32,
    pub outcome: Outcome,
}

impl Welcome {
    /// The manager version is cut to [`MANAGER_VERSION_MAX`] bytes, so the
    /// welcome fits [`WELCOME_MAX_LEN`].
    pub fn accepted(mut accepted: Accepted) -> Self {
        accepted.manager_version = clamp(accepted.manager_version, MANAGER_VERSION_MAX);
        Self {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            outcome: Outcome::Accepted(accepted),
        }
    }

    /// A standby's answer: the link stays open, and a later welcome on it
    /// says the verdict (see [`Outcome::Parked`]). The message is cut to
    /// [`REFUSAL_MESSAGE_MAX`] bytes.
    pub fn parked(message: impl Into<String>) -> Self {
        Self {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            outcome: Outcome::Parked {
                message: clamp(message.into(), REFUSAL_MESSAGE_MAX),
            },
        }
    }

    /// The message is cut to [`REFUSAL_MESSAGE_MAX`] bytes, so the welcome
    /// fits [`WELCOME_MAX_LEN`].
    pub fn refused(reason: RefuseReason, message: impl Into<String>) -> Self {
        Self {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            outcome: Outcome::Refused {
                reason,
                message: clamp(message.into(), REFUSAL_MESSAGE_MAX),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Accepted(Accepted),
    Refused {
        reason: RefuseReason,
        message: String,
    },
    /// The manager stands by while another leads (high availability): it
    /// keeps the link open, says who leads (`message`, for the log), and
    /// sends another welcome on the same link when its verdict changes —
    /// accepted the moment it wins the election, refused when it stops.
    /// Nothing else is sent on a parked link, and the agent sends nothing.
    Parked {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// Fresh for every registration; the guid of this session's modification tags.
    pub session_id: u64,
    /// How often the manager sends heartbeats (ms), at most: 0 = never (the
    /// default). The agent watches for silence only when it is > 0
    /// ([`crate::liveness`]).
    pub heartbeat_interval_ms: u64,
    /// After this long without any frame from the agent, the manager drops it (ms).
    pub heartbeat_threshold_ms: u64,
    pub manager_version: String,
    /// How often the agent sends its resync digest (ms; 0 = never):
    /// `crate::resync`. The manager scales it with the fleet's size
    /// ([`crate::resync::interval_for`]).
    pub resync_interval_ms: u64,
    /// The leadership epoch of this manager (high availability: the leader
    /// key's creation revision, rising with every new leader; 0 for a
    /// manager without etcd). An agent remembers the highest it has seen and
    /// refuses a manager whose epoch is lower: a deposed leader is never
    /// obeyed again.
    pub epoch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefuseReason {
    /// The peers speak different protocol versions.
    VersionMismatch,
    /// The name is not a valid node name.
    InvalidName,
    /// The name is not in `AllowedNodeNames`.
    UnknownNode,
    /// A live session already holds the name.
    AlreadyConnected,
    /// The first frame was not a handshake.
    BadHandshake,
    /// The manager is shutting down.
    ShuttingDown,
    /// The hello names another node than the connection's TLS certificate.
    IdentityMismatch,
}

impl RefuseReason {
    /// Whether retrying later can help (an unknown name will stay unknown
    /// until the manager's config changes, but an agent retries anyway with
    /// backoff; this only picks the log level).
    pub fn is_transient(self) -> bool {
        matches!(self, Self::AlreadyConnected | Self::ShuttingDown)
    }
}

/// Decodes just the fixed prefix of a first frame.
pub fn read_prefix(body: &[u8]) -> Result<([u8; 4], u32), FrameError> {
    let (prefix, _) = postcard::take_from_bytes::<([u8; 4], u32)>(body)
        .map_err(|e| FrameError::Malformed(format!("handshake prefix: {e}")))?;
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode_body;

    #[test]
    fn prefix_is_readable_from_both_first_frames() {
        let hello = encode_body(&Hello::new("n1", "0.1")).unwrap();
        assert_eq!(read_prefix(&hello).unwrap(), (MAGIC, PROTOCOL_VERSION));
        let welcome = encode_body(&Welcome::refused(RefuseReason::UnknownNode, "x")).unwrap();
        assert_eq!(read_prefix(&welcome).unwrap(), (MAGIC, PROTOCOL_VERSION));
    }

    #[test]
    fn the_largest_legal_hello_fits_the_hello_cap() {
        let mut hello = Hello::new(
            "n".repeat(crate::names::NODE_NAME_MAX),
            "v".repeat(AGENT_VERSION_MAX),
        );
        hello.protocol_version = u32::MAX;
        hello.advertise_address = Some("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap());
        let len = encode_body(&hello).unwrap().len();
        assert_eq!(len, 350, "update the arithmetic in HELLO_MAX_LEN's doc");
        assert!(len <= HELLO_MAX_LEN);
    }

    #[test]
    fn the_largest_welcome_is_the_welcome_cap() {
        let accepted = Welcome {
            protocol_version: u32::MAX,
            ..Welcome::accepted(Accepted {
                session_id: u64::MAX,
                heartbeat_interval_ms: u64::MAX,
                heartbeat_threshold_ms: u64::MAX,
                manager_version: "v".repeat(MANAGER_VERSION_MAX),
                resync_interval_ms: u64::MAX,
                epoch: u64::MAX,
            })
        };
        let accepted = encode_body(&accepted).unwrap().len();
        assert_eq!(accepted, 318);
        let parked = Welcome {
            protocol_version: u32::MAX,
            ..Welcome::parked("p".repeat(REFUSAL_MESSAGE_MAX + 10))
        };
        let parked = encode_body(&parked).unwrap().len();
        assert_eq!(parked, 1036);
        let refused = Welcome {
            protocol_version: u32::MAX,
            ..Welcome::refused(
                RefuseReason::IdentityMismatch,
                "m".repeat(REFUSAL_MESSAGE_MAX),
            )
        };
        let refused = encode_body(&refused).unwrap().len();
        assert_eq!(
            refused, 1037,
            "update the arithmetic in WELCOME_MAX_LEN's doc"
        );
        assert_eq!(WELCOME_MAX_LEN, refused.max(accepted).max(parked));
    }

    #[test]
    fn longer_texts_are_cut_to_fit_the_welcome_cap() {
        // The cap falls inside a two-byte character: the cut is before it.
        let long = format!("x{}", "é".repeat(REFUSAL_MESSAGE_MAX));
        let welcome = Welcome::refused(RefuseReason::InvalidName, long);
        match &welcome.outcome {
            Outcome::Refused { message, .. } => {
                assert_eq!(
                    message,
                    &format!("x{}", "é".repeat(REFUSAL_MESSAGE_MAX / 2 - 1))
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(encode_body(&welcome).unwrap().len() <= WELCOME_MAX_LEN);
        let welcome = Welcome::accepted(Accepted {
            session_id: 1,
            heartbeat_interval_ms: 2,
            heartbeat_threshold_ms: 3,
            manager_version: "x".repeat(1 << 16) + "é",
            resync_interval_ms: 0,
            epoch: 0,
        });
        match &welcome.outcome {
            Outcome::Accepted(a) => assert_eq!(a.manager_version, "x".repeat(MANAGER_VERSION_MAX)),
            other => panic!("{other:?}"),
        }
        assert!(encode_body(&welcome).unwrap().len() <= WELCOME_MAX_LEN);
        // Short texts are kept whole.
        assert_eq!(
            Welcome::refused(RefuseReason::UnknownNode, "node 'x' é"),
            Welcome {
                magic: MAGIC,
                protocol_version: PROTOCOL_VERSION,
                outcome: Outcome::Refused {
                    reason: RefuseReason::UnknownNode,
                    message: "node 'x' é".into()
                }
            }
        );
    }

    #[test]
    fn prefix_of_a_future_version_is_readable() {
        // A later version may change everything after the prefix.
        let future = encode_body(&(MAGIC, 99u32, 7u8, vec![1u64, 2, 3])).unwrap();
        assert_eq!(read_prefix(&future).unwrap(), (MAGIC, 99));
    }
}
