//! How a failed attempt is told: the log line (its level by what failed,
//! quiet after `ConnectionRetryCountUntilQuiet` failures in a row) and the
//! service manager's status line.
//!
//! Invariants: the quiet limit is said once, on the attempt that reaches it;
//! after it, failures are logged at debug level only until the next
//! connection; problems only the operator can fix (an unknown node, a name
//! or version refused, a certificate on either side) are errors, the rest
//! warnings.

use super::config::LinkConfig;
use super::outcome::ConnectError;
use crate::notify;
use drover_protocol::RefuseReason;
use drover_protocol::link::HandshakeError;

/// Failures in a row logged at their own level (`ConnectionRetryCountUntilQuiet`, at least 1).
pub(super) fn quiet_limit(cfg: &LinkConfig) -> u32 {
    cfg.quiet_after.max(1)
}

/// Logs the `failures`-th failed attempt in a row to the manager at `endpoint`.
pub(super) fn log_failure(cfg: &LinkConfig, endpoint: &str, err: &ConnectError, failures: u32) {
    let limit = quiet_limit(cfg);
    if failures > limit {
        tracing::debug!(
            "connecting to the manager at {endpoint} failed (attempt {failures}): {err}"
        );
        return;
    }
    let quiet = if failures == limit {
        format!(
            " (after {limit} failed attempts, further failures are logged at debug level until connected)"
        )
    } else {
        String::new()
    };
    match err {
        ConnectError::Handshake(HandshakeError::Refused { reason, message }) => {
            let node = cfg.node.as_str();
            match reason {
                RefuseReason::UnknownNode
                | RefuseReason::InvalidName
                | RefuseReason::VersionMismatch => {
                    tracing::error!(
                        "the manager at {endpoint} refused node '{node}' ({reason:?}): {message}{quiet}"
                    )
                }
                _ => tracing::warn!(
                    "the manager at {endpoint} refused node '{node}' ({reason:?}): {message}{quiet}"
                ),
            }
        }
        ConnectError::Handshake(HandshakeError::VersionMismatch { .. }) => {
            tracing::error!("cannot register with the manager at {endpoint}: {err}{quiet}")
        }
        ConnectError::Tls { .. } => tracing::error!(
            "refusing the manager at {endpoint}: {err}; check TLSCertificateAuthority and \
             TLSControllerName{quiet}"
        ),
        ConnectError::CertificateRefused { why, .. } => tracing::error!(
            "the manager at {endpoint} refused node '{}': {why}; the manager's log says \
             why, and a new certificate from the CA (drover-pki node) is the way back{quiet}",
            cfg.node.as_str()
        ),
        _ => tracing::warn!("cannot connect to the manager at {endpoint}: {err}{quiet}"),
    }
}

/// What a failure was, for the status line ([`notify::Failure`] borrows
/// its text; this owns it across the backoff computation).
#[derive(Clone, Copy)]
pub(super) enum FailureKind {
    Unreachable,
    Refused,
    Tls,
    Lost,
}

impl FailureKind {
    pub(super) fn with(self, text: &str) -> notify::Failure<'_> {
        match self {
            FailureKind::Unreachable => notify::Failure::Unreachable(text),
            FailureKind::Refused => notify::Failure::Refused(text),
            FailureKind::Tls => notify::Failure::Tls(text),
            FailureKind::Lost => notify::Failure::Lost(text),
        }
    }
}

/// The status line's kind of failure and its text.
pub(super) fn notify_failure(err: &ConnectError) -> (FailureKind, String) {
    match err {
        ConnectError::Handshake(HandshakeError::Refused { reason, message }) => {
            (FailureKind::Refused, format!("{reason:?}: {message}"))
        }
        ConnectError::Handshake(e @ HandshakeError::VersionMismatch { .. }) => {
            (FailureKind::Refused, e.to_string())
        }
        ConnectError::Tls { source, .. } => (FailureKind::Tls, source.to_string()),
        ConnectError::CertificateRefused { why, .. } => (FailureKind::Refused, why.clone()),
        ConnectError::Connect { source, .. } => (FailureKind::Unreachable, source.to_string()),
        other => (FailureKind::Unreachable, other.to_string()),
    }
}
