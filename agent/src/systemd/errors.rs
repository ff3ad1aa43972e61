//! The errors of calls to systemd, as the manager forwards them: systemd's
//! own D-Bus error name and message when it gave one ([`remote_error`]),
//! `Failed` with what went wrong otherwise; a reply that does not decode is
//! "unexpected reply from systemd" (`bad_reply`).

use drover_protocol::RemoteError;
use drover_protocol::error_names::UNKNOWN_METHOD;
use zbus::DBusError;

/// Maps a zbus error to the error the manager forwards: systemd's D-Bus
/// error name and message when there is one, `Failed` otherwise.
pub fn remote_error(err: zbus::Error, method: &str) -> RemoteError {
    match err {
        zbus::Error::MethodError(name, detail, _) => {
            RemoteError::new(name.as_str(), detail.unwrap_or_default())
        }
        zbus::Error::FDO(fdo) => {
            let name = fdo.name().to_string();
            let detail = fdo.description().unwrap_or_default().to_string();
            if name == UNKNOWN_METHOD {
                // An older systemd than the one this agent was written for.
                RemoteError::new(
                    name,
                    format!("this node's systemd does not implement {method} (too old?): {detail}"),
                )
            } else {
                RemoteError::new(name, detail)
            }
        }
        other => RemoteError::failed(format!("{method}: talking to systemd failed: {other}")),
    }
}

pub(super) fn bad_reply(method: &str, err: zbus::Error) -> RemoteError {
    RemoteError::failed(format!("{method}: unexpected reply from systemd: {err}"))
}

/// The error of a proxy call to `method`: a reply body that does not
/// decode (zbus's decoding errors) is [`bad_reply`], anything else
/// [`remote_error`]. Both are `Failed` unless systemd named the error.
pub(super) fn call_error(method: &str) -> impl FnOnce(zbus::Error) -> RemoteError + '_ {
    move |err| match err {
        zbus::Error::Failure(_)
        | zbus::Error::IncorrectType
        | zbus::Error::SignatureMismatch(..)
        | zbus::Error::Utf8(_)
        | zbus::Error::PaddingNot0(_)
        | zbus::Error::OutOfBounds
        | zbus::Error::ExcessData => bad_reply(method, err),
        other => remote_error(other, method),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_that_does_not_decode_is_an_unexpected_reply() {
        let remote = call_error("ListUnits")(zbus::Error::IncorrectType);
        assert_eq!(remote.name, "org.freedesktop.DBus.Error.Failed");
        assert!(
            remote.message.starts_with("ListUnits: unexpected reply"),
            "{remote}"
        );
    }

    #[test]
    fn unknown_method_says_systemd_is_too_old() {
        let err = zbus::Error::FDO(Box::new(zbus::fdo::Error::UnknownMethod(
            "No such method 'FreezeUnit'".into(),
        )));
        let remote = remote_error(err, "FreezeUnit");
        assert_eq!(remote.name, UNKNOWN_METHOD);
        assert!(
            remote.message.contains("does not implement FreezeUnit"),
            "{remote}"
        );
        assert!(remote.message.contains("No such method"), "{remote}");
    }

    #[test]
    fn other_fdo_errors_keep_their_name() {
        let err = zbus::Error::FDO(Box::new(zbus::fdo::Error::AccessDenied(
            "polkit says no".into(),
        )));
        let remote = remote_error(err, "StartUnit");
        assert_eq!(remote.name, "org.freedesktop.DBus.Error.AccessDenied");
        assert_eq!(remote.message, "polkit says no");
    }

    #[test]
    fn transport_errors_are_failed_with_context() {
        let remote = remote_error(zbus::Error::InvalidReply, "ListUnits");
        assert_eq!(remote.name, "org.freedesktop.DBus.Error.Failed");
        assert!(remote.message.starts_with("ListUnits:"), "{remote}");
    }
}
