//! Who sent a D-Bus call to the agent, as the bus says (never as the call
//! says): the first step of every local permission check (the proxy
//! helper's calls in `crate::api`, `ReportHealth` in `crate::health::api`).
//!
//! Invariant: a call without a sender, or whose sender the bus cannot name a
//! uid for, is refused with the checker's own error: there is no default
//! identity.

use zbus::Connection;
use zbus::message::Header;
use zbus::names::{BusName, UniqueName};

/// Who sent a call: its unique name and uid, and the bus proxy that asked
/// (for further questions about the same sender).
pub struct Caller<'h> {
    pub sender: &'h UniqueName<'h>,
    pub uid: u32,
    pub dbus: zbus::fdo::DBusProxy<'static>,
}

/// The sender of the call `header` and its uid (`GetConnectionUnixUser`);
/// when the call has no sender or the bus cannot say, the error is
/// `denied`'s, with the reason.
pub async fn caller_uid<'h, E>(
    conn: &Connection,
    header: &'h Header<'_>,
    denied: &impl Fn(String) -> E,
) -> Result<Caller<'h>, E> {
    let Some(sender) = header.sender() else {
        return Err(denied("the call carries no sender".into()));
    };
    let dbus = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(|e| denied(format!("cannot ask the bus about {sender}: {e}")))?;
    let uid = dbus
        .get_connection_unix_user(BusName::from(sender.clone()))
        .await
        .map_err(|e| denied(format!("the bus does not know the uid of {sender}: {e}")))?;
    Ok(Caller { sender, uid, dbus })
}
