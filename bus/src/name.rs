//! Owning a well-known bus name, the same way in both daemons.
//!
//! Invariants:
//!
//! * **One owner, never replaced.** The name is requested without
//!   `AllowReplacement` and without `ReplaceExisting` (BlueChi allows
//!   replacement): nobody takes the name from a running daemon, and a daemon
//!   takes it from nobody. A process that could take it over would leave the
//!   daemon running with no client able to reach it.
//! * **A short wait in the queue, never an endless one.** A restart
//!   (`systemctl restart`, `Restart=on-failure`) starts the new process as the
//!   old one exits, and the bus daemon may not yet have handled the old
//!   connection's end when the new one asks. So the request queues, and
//!   [`own`] waits up to its `wait` for `NameAcquired`. If the name is still
//!   someone else's then, it leaves the queue and says who holds the name
//!   (its PID, when the bus tells it): the daemon exits rather than run
//!   headless.
//! * **Loss ends the daemon.** [`lost`] resolves when the bus daemon says the
//!   name is gone (zbus matches `NameLost` on the sender
//!   `org.freedesktop.DBus` exactly, so no other client can forge it). With
//!   the flags above it cannot happen while the connection lives; if it ever
//!   does, the caller exits and its unit restarts it.

use std::time::Duration;

use futures::StreamExt;
use zbus::Connection;
use zbus::fdo::{DBusProxy, RequestNameFlags, RequestNameReply};
use zbus::names::BusName;

/// Why a daemon does not own its name.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    /// Another connection still held the name after the wait.
    #[error(
        "another process ({holder}) still owns it after {wait:?} (drover never takes the name over)"
    )]
    Taken {
        /// The holder, as far as the bus tells it (`PID 1234`, or its unique name).
        holder: String,
        /// How long this process waited in the queue.
        wait: Duration,
    },
    /// The bus refused or failed the request.
    #[error("{0}")]
    Bus(#[from] zbus::Error),
}

/// Owns `name` on `conn`, waiting up to `wait` behind a current owner (see
/// the module docs). On success the name is this connection's until it closes.
pub async fn own(conn: &Connection, name: &str, wait: Duration) -> Result<(), NameError> {
    let dbus = DBusProxy::new(conn).await?;
    // Subscribed before the request: `NameAcquired` may come right after its reply.
    let mut acquired = dbus.receive_name_acquired().await?;
    match conn
        .request_name_with_flags(name, RequestNameFlags::empty())
        .await
    {
        Ok(RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner) => return Ok(()),
        Ok(RequestNameReply::InQueue) => {}
        // Only with DoNotQueue; answered as taken all the same.
        Ok(RequestNameReply::Exists) | Err(zbus::Error::NameTaken) => {}
        Err(e) => return Err(e.into()),
    }
    let got = tokio::time::timeout(wait, async {
        while let Some(signal) = acquired.next().await {
            if signal.args().is_ok_and(|a| a.name.as_str() == name) {
                return true;
            }
        }
        false
    })
    .await;
    if got == Ok(true) {
        return Ok(());
    }
    let holder = holder(&dbus, name).await;
    // Out of the queue: a name that frees later must not go to a process on its way out.
    if let Err(e) = conn.release_name(name).await {
        tracing::debug!("leaving the queue for {name}: {e}");
    }
    Err(NameError::Taken { holder, wait })
}

/// Who holds `name`, for the error message.
async fn holder(dbus: &DBusProxy<'_>, name: &str) -> String {
    let Ok(bus_name) = BusName::try_from(name) else {
        return "unknown".to_owned();
    };
    let Ok(owner) = dbus.get_name_owner(bus_name).await else {
        return "gone since".to_owned();
    };
    match dbus
        .get_connection_unix_process_id(BusName::from(owner.clone()))
        .await
    {
        Ok(pid) => format!("PID {pid}, {owner}"),
        Err(_) => owner.to_string(),
    }
}

/// Resolves when the bus daemon tells `conn` it lost `name` (see the module
/// docs); never when that cannot be watched (logged at debug level).
pub async fn lost(conn: Connection, name: &'static str) {
    let watch = async {
        let dbus = DBusProxy::new(&conn).await?;
        let mut lost = dbus.receive_name_lost().await?;
        while let Some(signal) = lost.next().await {
            if signal.args().is_ok_and(|a| a.name.as_str() == name) {
                return Ok(());
            }
        }
        Err(zbus::Error::Failure("the bus connection closed".into()))
    };
    if let Err(e) = watch.await {
        tracing::debug!("not watching {name}: {e}");
        std::future::pending::<()>().await;
    }
}
