//! Pieces for stand-in D-Bus services a test serves in place of a drover daemon (a
//! manager for droverctl, an agent for the proxy helper).

use zbus::message::{Header, Message};
use zbus::names::ErrorName;

/// A D-Bus error reply with any name and message (the daemons pass systemd's error names
/// on, and BlueChi's clients read them).
#[derive(Debug)]
pub struct NamedError {
    pub name: &'static str,
    pub message: String,
}

impl NamedError {
    pub fn new(name: &'static str, message: impl Into<String>) -> NamedError {
        NamedError {
            name,
            message: message.into(),
        }
    }
}

impl zbus::DBusError for NamedError {
    fn create_reply(&self, reply_to: &Header<'_>) -> zbus::Result<Message> {
        Message::error(reply_to, self.name).build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(self.name)
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}
