//! [`Forger`]: an unprivileged local user (`nobody`) on a bus with the system bus's
//! policy, sending signals straight to one connection's unique name, as any local user
//! of a node or of the manager host can. The attacks of the signal tests are made of it.
//!
//! [`Forger::sync`] is the barrier: a round trip to the bus daemon, which handles one
//! connection's messages in order, so when it returns every signal sent before has been
//! routed (queued to its destination) and precedes anything a later action of the test
//! makes another connection send.

use zbus::{Connection, Message};

/// The uid of `nobody`.
pub const NOBODY: u32 = 65534;

/// See the module docs.
pub struct Forger {
    pub conn: Connection,
}

impl Forger {
    /// Connects to the bus at `address` (a `unix:path=` address) as `nobody`.
    pub async fn nobody(address: &str) -> Forger {
        Forger {
            conn: crate::api::connect_as(address, NOBODY).await,
        }
    }

    /// Our own unique name (what the victim sees as the sender).
    pub fn unique_name(&self) -> String {
        self.conn
            .unique_name()
            .map(|n| n.to_string())
            .expect("a bus connection has a unique name")
    }

    /// Sends the signal `iface.member` on `path` with `body` to the connection `to`.
    pub async fn signal<B>(&self, to: &str, path: &str, iface: &str, member: &str, body: &B)
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        let msg = Message::signal(path, iface, member)
            .destination(to)
            .build(body)
            .unwrap_or_else(|e| panic!("building {iface}.{member}: {e}"));
        self.conn
            .send(&msg)
            .await
            .unwrap_or_else(|e| panic!("sending {iface}.{member} to {to}: {e}"));
    }

    /// Sends a ready-made message (a signal with header fields no builder above sets).
    pub async fn send(&self, msg: &Message) {
        self.conn
            .send(msg)
            .await
            .unwrap_or_else(|e| panic!("sending {msg:?}: {e}"));
    }

    /// The barrier (module docs).
    pub async fn sync(&self) {
        let _: String = self
            .conn
            .call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "GetId",
                &(),
            )
            .await
            .expect("GetId")
            .body()
            .deserialize()
            .expect("GetId's answer");
    }
}

/// The unique name of the connection process `pid` holds on the bus of `conn`, as every
/// user can find it (`ListNames`, `GetConnectionUnixProcessID`); the first if several.
pub async fn unique_name_of(conn: &Connection, pid: u32) -> String {
    let dbus = zbus::fdo::DBusProxy::new(conn).await.expect("DBus proxy");
    for name in dbus.list_names().await.expect("ListNames") {
        if !name.starts_with(':') {
            continue;
        }
        if dbus
            .get_connection_unix_process_id(name.as_ref())
            .await
            .is_ok_and(|p| p == pid)
        {
            return name.to_string();
        }
    }
    panic!("process {pid} has no connection on this bus");
}
