//! Errors the D-Bus API returns, with BlueChi's error names.
//!
//! [`ApiError`] carries any D-Bus error name, so an error from systemd on a
//! node (a [`RemoteError`]) reaches the caller with the same name and message.
//! A name from the wire that is not a valid D-Bus error name is never put on
//! the bus: it becomes `org.freedesktop.DBus.Error.Failed` with the name kept
//! in the message.

use drover_protocol::error_names::{FAILED, INVALID_ARGS, OFFLINE};
use drover_protocol::{RemoteError, Response};
use std::cell::Cell;
use zbus::message::{Header, Message};
use zbus::names::{ErrorName, OwnedErrorName};

tokio::task_local! {
    /// The name of the error the running D-Bus call answered, set when its
    /// reply is made, for whoever runs the call in [`noting_answer`].
    static ANSWERED: Cell<Option<OwnedErrorName>>;
}

/// Runs a D-Bus method call and returns, with its output, the name of the
/// error an [`ApiError`] reply made during it (the last one), if any: how
/// the call counter (`crate::api::counted`) learns a call's result.
pub async fn noting_answer<T>(call: impl Future<Output = T>) -> (T, Option<OwnedErrorName>) {
    ANSWERED
        .scope(Cell::new(None), async move {
            let out = call.await;
            (out, ANSWERED.with(Cell::take))
        })
        .await
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct ApiError {
    name: OwnedErrorName,
    message: String,
}

impl ApiError {
    /// An error with `name`; an invalid name becomes `Failed` (see module docs).
    pub fn new(name: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        match OwnedErrorName::try_from(name.to_owned()) {
            Ok(name) => Self { name, message },
            Err(_) => Self {
                name: known(FAILED),
                message: format!("{} ({message})", name.escape_default()),
            },
        }
    }

    pub fn offline() -> Self {
        Self::new(OFFLINE, "Node is offline")
    }

    pub fn invalid_args(message: impl Into<String>) -> Self {
        Self::new(INVALID_ARGS, message)
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(FAILED, message)
    }

    /// An agent answered with a reply of the wrong kind (a broken agent).
    pub fn unexpected_reply(response: &Response) -> Self {
        let kind = match response {
            Response::Empty => "empty",
            Response::Units(_) => "units",
            Response::UnitFiles(_) => "unit files",
            Response::Value(_) => "value",
            Response::Text(_) => "text",
            Response::Changes { .. } => "changes",
        };
        Self::failed(format!("unexpected reply from the agent ({kind})"))
    }

    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

fn known(name: &'static str) -> OwnedErrorName {
    OwnedErrorName::try_from(name).expect("constant error name is valid")
}

impl From<RemoteError> for ApiError {
    fn from(e: RemoteError) -> Self {
        Self::new(&e.name, e.message)
    }
}

impl zbus::DBusError for ApiError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        let _ = ANSWERED.try_with(|a| a.set(Some(self.name.clone())));
        Message::error(call, self.name.as_ref()).build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        self.name.as_ref()
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_errors_keep_their_name() {
        let e = ApiError::from(RemoteError::new(
            "org.freedesktop.systemd1.NoSuchUnit",
            "Unit x.service not found.",
        ));
        assert_eq!(e.name(), "org.freedesktop.systemd1.NoSuchUnit");
        assert_eq!(e.message(), "Unit x.service not found.");
    }

    #[test]
    fn invalid_names_become_failed() {
        let e = ApiError::from(RemoteError::new("not a name", "boom"));
        assert_eq!(e.name(), FAILED);
        assert!(e.message().contains("not a name") && e.message().contains("boom"));
    }
}
