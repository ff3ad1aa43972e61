//! Who sent a message, and who may speak for a well-known name.
//!
//! A bus lets any connection send a signal *to* another connection's unique
//! name, and a match rule's `sender='org.freedesktop.systemd1'` is only
//! applied by the bus daemon to broadcasts: a unicast signal is delivered
//! whatever the rule says, and zbus does not check a well-known sender
//! either (it cannot know who owns the name). So every stream of signals a
//! drover process acts on is judged here, message by message:
//!
//! * the bus daemon's own signals (`NameOwnerChanged`, `NameLost`,
//!   `NameAcquired`) count only when the message's sender is exactly
//!   `org.freedesktop.DBus` ([`from_bus_daemon`]): the daemon stamps every
//!   other connection's messages with that connection's unique name, so
//!   nobody else can send as it (zbus itself takes `org.freedesktop.DBus` for
//!   a unique name, so its own streams of the daemon's signals, e.g.
//!   `DBusProxy::receive_name_lost`, match the sender exactly too);
//! * a well-known name's signals count only from its **current unique owner**
//!   ([`Owner`]): the owner is asked once (`GetNameOwner`, after the match on
//!   its changes is in place) and then followed through the bus daemon's
//!   `NameOwnerChanged`, read in the same ordered stream as the signals, so a
//!   new owner (systemd after `daemon-reexec`, a restarted manager) is
//!   believed from exactly the first message after the change;
//! * what is not believed is dropped and counted ([`Dropped`]), and said in
//!   a log line at most every [`DROPPED_LOG_EVERY`] (the first at once).
//!
//! Method replies need none of this: the daemon delivers a reply only to the
//! connection that made the call, and zbus takes only `method_return` and
//! `error` messages as replies.

use std::time::{Duration, Instant};
use zbus::message::{Sequence, Type as MessageType};
use zbus::{Connection, MatchRule, Message, MessageStream};

/// The bus daemon's name, object path and interface.
pub const DBUS_NAME: &str = "org.freedesktop.DBus";
pub const DBUS_PATH: &str = "/org/freedesktop/DBus";

/// A dropped signal is logged at once, then at most once per this interval
/// (with the count of those not logged).
pub const DROPPED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether `msg` was sent by the bus daemon itself.
pub fn from_bus_daemon(msg: &Message) -> bool {
    msg.header()
        .sender()
        .is_some_and(|s| s.as_str() == DBUS_NAME)
}

/// Whether `msg` is the bus daemon's signal `member` on its own interface
/// (sender, interface and member all checked).
pub fn is_bus_daemon_signal(msg: &Message, member: &str) -> bool {
    let header = msg.header();
    msg.message_type() == MessageType::Signal
        && from_bus_daemon(msg)
        && header.interface().is_some_and(|i| i.as_str() == DBUS_NAME)
        && header.member().is_some_and(|m| m.as_str() == member)
}

/// The bus daemon's `NameOwnerChanged` as `(name, old owner, new owner)`
/// (empty strings for none), when `msg` is one the daemon really sent.
pub fn name_owner_changed(msg: &Message) -> Option<(String, String, String)> {
    if !is_bus_daemon_signal(msg, "NameOwnerChanged") {
        return None;
    }
    msg.body().deserialize::<(String, String, String)>().ok()
}

/// The match rule for the bus daemon's `NameOwnerChanged` about `name`
/// (`None`: about every name).
pub fn owner_changes_rule(name: Option<&str>) -> zbus::Result<MatchRule<'_>> {
    let rule = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .sender(DBUS_NAME)
        .path(DBUS_PATH)
        .interface(DBUS_NAME)
        .member("NameOwnerChanged");
    match name {
        Some(name) => rule.arg(0, name).build(),
        None => rule.build(),
    }
}

/// What a message of a followed stream is, for [`Owner::judge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The bus daemon says the name changed owner; `owner` is the new one.
    OwnerChanged { owner: Option<String> },
    /// Sent by the name's current owner.
    FromOwner,
    /// Sent by anyone else: drop it.
    NotFromOwner { sender: String },
}

/// The current unique owner of a well-known name, followed through the bus
/// daemon's `NameOwnerChanged` (see the module docs).
#[derive(Debug, Clone)]
pub struct Owner {
    name: String,
    unique: Option<String>,
    /// Where the `GetNameOwner` reply arrived: a change the stream delivers
    /// before it is already in the answer (`None`: not asked, every change
    /// counts).
    known_at: Option<Sequence>,
}

impl Owner {
    /// Puts the match on `name`'s owner changes in place, then asks the bus
    /// who owns it. Returns the owner and the stream of changes, which the
    /// caller joins (`zbus::export::ordered_stream::join`) with its signal
    /// streams and passes, message by message, to [`Owner::judge`].
    pub async fn follow(
        conn: &Connection,
        name: &str,
        queue: Option<std::num::NonZeroUsize>,
    ) -> zbus::Result<(Owner, MessageStream)> {
        let changes =
            MessageStream::for_match_rule(owner_changes_rule(Some(name))?, conn, queue).await?;
        let reply = conn
            .call_method(
                Some(DBUS_NAME),
                DBUS_PATH,
                Some(DBUS_NAME),
                "GetNameOwner",
                &(name,),
            )
            .await;
        let (unique, known_at) = match reply {
            Ok(reply) => (
                Some(reply.body().deserialize::<String>()?),
                reply.recv_position(),
            ),
            // Nobody owns it now: nobody speaks for it until the bus says so.
            Err(zbus::Error::MethodError(e, _, reply)) if e.as_str() == NAME_HAS_NO_OWNER => {
                (None, reply.recv_position())
            }
            Err(e) => return Err(e),
        };
        let known_at = Some(known_at);
        Ok((
            Owner {
                name: name.to_owned(),
                unique,
                known_at,
            },
            changes,
        ))
    }

    /// An owner known by other means (tests).
    pub fn known(name: &str, unique: Option<&str>) -> Owner {
        Owner {
            name: name.to_owned(),
            unique: unique.map(str::to_owned),
            known_at: None,
        }
    }

    /// The well-known name followed.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its unique owner now, if any.
    pub fn unique(&self) -> Option<&str> {
        self.unique.as_deref()
    }

    /// "NAME (now UNIQUE)", for log lines.
    pub fn describe(&self) -> String {
        format!(
            "{} (now {})",
            self.name,
            self.unique.as_deref().unwrap_or("owned by nobody")
        )
    }

    /// Takes one message of the followed stream, in stream order.
    pub fn judge(&mut self, msg: &Message) -> Verdict {
        if let Some((name, _, new)) = name_owner_changed(msg)
            && name == self.name
        {
            if self.known_at.is_none_or(|at| msg.recv_position() > at) {
                self.unique = (!new.is_empty()).then_some(new);
            }
            return Verdict::OwnerChanged {
                owner: self.unique.clone(),
            };
        }
        let sender = msg.header().sender().map(|s| s.as_str().to_owned());
        match (&sender, &self.unique) {
            (Some(s), Some(owner)) if s == owner => Verdict::FromOwner,
            _ => Verdict::NotFromOwner {
                sender: sender.unwrap_or_else(|| "(no sender)".to_owned()),
            },
        }
    }
}

/// The error name of `GetNameOwner` for a name nobody owns.
const NAME_HAS_NO_OWNER: &str = "org.freedesktop.DBus.Error.NameHasNoOwner";

/// Counts the signals a stream dropped and says so at a bounded rate.
#[derive(Debug)]
pub struct Dropped {
    what: &'static str,
    total: u64,
    unlogged: u64,
    last_log: Option<Instant>,
}

impl Dropped {
    /// `what` names the stream in the log line ("systemd's unit signals").
    pub fn new(what: &'static str) -> Self {
        Dropped {
            what,
            total: 0,
            unlogged: 0,
            last_log: None,
        }
    }

    /// Signals dropped so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counts `msg`, dropped because `sender` is not `speaker` (who alone
    /// may send it, e.g. [`Owner::describe`]); returns the line to log when
    /// one is due.
    pub fn note(&mut self, msg: &Message, sender: &str, speaker: &str) -> Option<String> {
        self.note_at(msg, sender, speaker, Instant::now())
    }

    fn note_at(
        &mut self,
        msg: &Message,
        sender: &str,
        speaker: &str,
        now: Instant,
    ) -> Option<String> {
        self.total += 1;
        if self
            .last_log
            .is_some_and(|at| now.saturating_duration_since(at) < DROPPED_LOG_EVERY)
        {
            self.unlogged += 1;
            return None;
        }
        self.last_log = Some(now);
        let header = msg.header();
        let member = header.member().map(|m| m.as_str()).unwrap_or("?");
        let path = header.path().map(|p| p.as_str()).unwrap_or("?");
        let unlogged = std::mem::take(&mut self.unlogged);
        let more = if unlogged > 0 {
            format!(", {unlogged} more since the last such line")
        } else {
            String::new()
        };
        Some(format!(
            "dropped a {member} signal on {path} from {sender}: only {speaker} \
             speaks for it in {} ({} dropped in all{more})",
            self.what, self.total
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal_from(sender: &str, path: &str, iface: &str, member: &str) -> Message {
        Message::signal(path, iface, member)
            .sender(sender)
            .build(&())
            .unwrap()
    }

    fn owner_changed(sender: &str, name: &str, old: &str, new: &str) -> Message {
        Message::signal(DBUS_PATH, DBUS_NAME, "NameOwnerChanged")
            .sender(sender)
            .build(&(name, old, new))
            .unwrap()
    }

    const SYSTEMD: &str = "org.freedesktop.systemd1";

    #[test]
    fn only_the_current_owner_speaks_and_only_the_daemon_changes_it() {
        let mut owner = Owner::known(SYSTEMD, Some(":1.3"));
        let job = "/org/freedesktop/systemd1";
        let iface = "org.freedesktop.systemd1.Manager";
        assert_eq!(
            owner.judge(&signal_from(":1.3", job, iface, "JobRemoved")),
            Verdict::FromOwner
        );
        assert_eq!(
            owner.judge(&signal_from(":1.9", job, iface, "JobRemoved")),
            Verdict::NotFromOwner {
                sender: ":1.9".into()
            }
        );
        // A forged owner change (sent by :1.9, not the daemon) changes nothing.
        let forged = owner_changed(":1.9", SYSTEMD, ":1.3", ":1.9");
        assert!(matches!(owner.judge(&forged), Verdict::NotFromOwner { .. }));
        assert_eq!(owner.unique(), Some(":1.3"));
        // The daemon's says systemd went away (daemon-reexec) and came back.
        assert_eq!(
            owner.judge(&owner_changed(DBUS_NAME, SYSTEMD, ":1.3", "")),
            Verdict::OwnerChanged { owner: None }
        );
        assert!(matches!(
            owner.judge(&signal_from(":1.3", job, iface, "JobRemoved")),
            Verdict::NotFromOwner { .. }
        ));
        assert_eq!(
            owner.judge(&owner_changed(DBUS_NAME, SYSTEMD, "", ":1.12")),
            Verdict::OwnerChanged {
                owner: Some(":1.12".into())
            }
        );
        assert_eq!(
            owner.judge(&signal_from(":1.12", job, iface, "JobRemoved")),
            Verdict::FromOwner
        );
        // Another name's change is no change of ours (and not the owner speaking).
        assert!(matches!(
            owner.judge(&owner_changed(DBUS_NAME, "org.example", "", ":1.40")),
            Verdict::NotFromOwner { .. }
        ));
        assert_eq!(owner.unique(), Some(":1.12"));
    }

    #[test]
    fn nobody_speaks_for_a_name_nobody_owns() {
        let mut owner = Owner::known(SYSTEMD, None);
        assert!(matches!(
            owner.judge(&signal_from(":1.3", "/a", "b.c", "D")),
            Verdict::NotFromOwner { .. }
        ));
    }

    #[test]
    fn the_daemon_is_recognised_by_sender_interface_and_member() {
        let real = owner_changed(DBUS_NAME, "x.y", "", ":1.9");
        assert_eq!(
            name_owner_changed(&real),
            Some(("x.y".into(), String::new(), ":1.9".into()))
        );
        assert_eq!(
            name_owner_changed(&owner_changed(":1.9", "x.y", "", ":1.9")),
            None
        );
        let no_sender = Message::signal(DBUS_PATH, DBUS_NAME, "NameOwnerChanged")
            .build(&("x.y", "", ":1.9"))
            .unwrap();
        assert_eq!(name_owner_changed(&no_sender), None);
        let other_member = Message::signal(DBUS_PATH, DBUS_NAME, "NameLost")
            .sender(DBUS_NAME)
            .build(&("x.y", "", ":1.9"))
            .unwrap();
        assert_eq!(name_owner_changed(&other_member), None);
    }

    #[test]
    fn dropped_logs_the_first_then_at_a_bounded_rate_and_counts_all() {
        let owner = Owner::known(SYSTEMD, Some(":1.3"));
        let msg = signal_from(
            ":1.9",
            "/org/freedesktop/systemd1/unit/db_2eservice",
            crate::bus::PROPERTIES_IFACE,
            "PropertiesChanged",
        );
        let mut d = Dropped::new("systemd's unit signals");
        let t0 = Instant::now();
        let first = d.note_at(&msg, ":1.9", &owner.describe(), t0).unwrap();
        assert!(first.contains("PropertiesChanged"), "{first}");
        assert!(first.contains("from :1.9"), "{first}");
        assert!(first.contains("now :1.3"), "{first}");
        assert!(first.contains("1 dropped in all"), "{first}");
        for _ in 0..99 {
            assert_eq!(d.note_at(&msg, ":1.9", &owner.describe(), t0), None);
        }
        let later = d
            .note_at(&msg, ":1.9", &owner.describe(), t0 + DROPPED_LOG_EVERY)
            .unwrap();
        assert!(later.contains("101 dropped in all"), "{later}");
        assert!(later.contains("99 more since"), "{later}");
        assert_eq!(d.total(), 101);
    }
}
