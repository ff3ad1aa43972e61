//! Which bus a drover process talks on, how its address is found, and the
//! connection to it.
//!
//! Every drover process picks one of three buses: the system bus (default),
//! the session bus (`--user`, a user's systemd and user-mode drover), or a bus
//! at a given address (`--bus ADDRESS`, the sandbox and tests). What a `Bus`
//! means is decided here:
//!
//! * the daemons' flags pick it one way ([`Bus::from_flags`]): `--bus`
//!   wins over `--user`, and neither means the system bus (`droverctl` also
//!   reads `$DROVER_BUS`, its own rule);
//! * the session bus is `$DBUS_SESSION_BUS_ADDRESS`, else
//!   `unix:path=$XDG_RUNTIME_DIR/bus`; the system bus is
//!   `$DBUS_SYSTEM_BUS_ADDRESS`, else `unix:path=/run/dbus/system_bus_socket`
//!   (what libdbus, sd-bus and zbus do) — [`Bus::address`], pure, for a
//!   client that brings its own D-Bus code;
//! * `Bus::connect` (feature `zbus`) opens and authenticates a zbus
//!   connection there; `Bus::builder` when the caller needs to set more
//!   (a method timeout) first.
//!
//! A `Bus` names itself in messages the same way everywhere ([`Bus`]'s
//! `Display`: "the system bus", "bus unix:path=…").
//!
//! [`PROPERTIES_IFACE`], the interface every object's properties are read
//! and announced on, is named here once for every process.

use std::fmt;

/// The standard interface of every object's properties (`Get`, `GetAll`,
/// the `PropertiesChanged` signal): systemd's and drover's objects alike.
pub const PROPERTIES_IFACE: &str = "org.freedesktop.DBus.Properties";

/// The system bus' address when `$DBUS_SYSTEM_BUS_ADDRESS` is not set.
pub const DEFAULT_SYSTEM_BUS_ADDRESS: &str = "unix:path=/run/dbus/system_bus_socket";

/// Which bus a process talks on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The system bus (default).
    System,
    /// The session bus (`--user`).
    Session,
    /// Any D-Bus address (`--bus ADDRESS`).
    Address(String),
}

/// The session bus cannot be located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set")]
pub struct NoSessionBus;

impl Bus {
    /// The bus a daemon's `--bus ADDRESS` and `--user` flags name: the
    /// address when given (whatever `--user` says), else the session bus
    /// with `--user`, else the system bus.
    pub fn from_flags(address: Option<&str>, user: bool) -> Self {
        match (address, user) {
            (Some(address), _) => Bus::Address(address.to_owned()),
            (None, true) => Bus::Session,
            (None, false) => Bus::System,
        }
    }

    /// The D-Bus address of this bus, from the process environment (see the
    /// module docs).
    pub fn address(&self) -> Result<String, NoSessionBus> {
        self.address_in(|key| std::env::var(key).ok())
    }

    /// [`Bus::address`] with the environment passed in (`env(key)` is the
    /// variable's value, if set).
    pub fn address_in(&self, env: impl Fn(&str) -> Option<String>) -> Result<String, NoSessionBus> {
        match self {
            Bus::System => Ok(env("DBUS_SYSTEM_BUS_ADDRESS")
                .unwrap_or_else(|| DEFAULT_SYSTEM_BUS_ADDRESS.to_owned())),
            Bus::Session => match env("DBUS_SESSION_BUS_ADDRESS") {
                Some(address) => Ok(address),
                None => env("XDG_RUNTIME_DIR")
                    .map(|dir| format!("unix:path={dir}/bus"))
                    .ok_or(NoSessionBus),
            },
            Bus::Address(address) => Ok(address.clone()),
        }
    }
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bus::System => f.write_str("the system bus"),
            Bus::Session => f.write_str("the session bus"),
            Bus::Address(a) => write!(f, "bus {a}"),
        }
    }
}

#[cfg(feature = "zbus")]
impl Bus {
    /// A connection builder for this bus, for callers that set more before
    /// connecting.
    pub fn builder(&self) -> zbus::connection::Builder<'static> {
        match self {
            Bus::System => zbus::connection::Builder::system(),
            Bus::Session => zbus::connection::Builder::session(),
            Bus::Address(a) => zbus::connection::Builder::address(a.as_str()),
        }
    }

    /// Connects to this bus and authenticates.
    pub async fn connect(&self) -> zbus::Result<zbus::Connection> {
        self.builder().build().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |key| {
            vars.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn addresses_are_found_as_libdbus_finds_them() {
        assert_eq!(
            Bus::System.address_in(env(&[])).unwrap(),
            "unix:path=/run/dbus/system_bus_socket"
        );
        assert_eq!(
            Bus::System
                .address_in(env(&[("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/s")]))
                .unwrap(),
            "unix:path=/s"
        );
        assert_eq!(
            Bus::Session
                .address_in(env(&[("XDG_RUNTIME_DIR", "/run/user/7")]))
                .unwrap(),
            "unix:path=/run/user/7/bus"
        );
        let both = [
            ("XDG_RUNTIME_DIR", "/run/user/7"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:abstract=x"),
        ];
        assert_eq!(
            Bus::Session.address_in(env(&both)).unwrap(),
            "unix:abstract=x"
        );
        assert_eq!(Bus::Session.address_in(env(&[])), Err(NoSessionBus));
        assert_eq!(
            Bus::Address("tcp:host=h,port=1".into())
                .address_in(env(&both))
                .unwrap(),
            "tcp:host=h,port=1"
        );
    }

    #[test]
    fn flags_pick_the_address_then_the_session_then_the_system_bus() {
        assert_eq!(Bus::from_flags(None, false), Bus::System);
        assert_eq!(Bus::from_flags(None, true), Bus::Session);
        for user in [false, true] {
            assert_eq!(
                Bus::from_flags(Some("unix:path=/b"), user),
                Bus::Address("unix:path=/b".into())
            );
        }
    }

    #[test]
    fn buses_name_themselves() {
        assert_eq!(Bus::System.to_string(), "the system bus");
        assert_eq!(Bus::Session.to_string(), "the session bus");
        assert_eq!(
            Bus::Address("unix:path=/x".into()).to_string(),
            "bus unix:path=/x"
        );
    }
}
