//! The manager's side: accept TLS on an accepted TCP stream and read the
//! node identity the client certificate proved.
//!
//! A handshake fails (and `accept` returns the error) when the peer sends no
//! client certificate, one that does not chain to the CA bundle, is expired,
//! revoked by the CRL, lacks the clientAuth purpose, or does not name exactly
//! one node; and on anything that is not TLS 1.3. The caller bounds the time
//! (`tokio::time::timeout`) and the number of handshakes in flight: before
//! the client is authenticated a connection buffers at most one handshake
//! message (under 64 KiB) and one record
//! ([`crate::server_stream::MAX_INCOMING`]), so that cap bounds
//! pre-authentication memory. The established link is a [`ServerStream`]
//! (rustls's unbuffered API: an idle link holds no buffer).

use std::fmt;
use std::io;

use rustls::CertificateError;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::current::Current;
use crate::error::IdentityError;
use crate::identity::NodeIdentity;
use crate::server_stream::ServerStream;
use crate::settings::ServerSettings;

/// The manager's TLS acceptor: a handle on the [`ServerSettings`] in force.
/// Clones share the settings, so the accept loop and the reload handler can
/// each hold one.
#[derive(Debug, Clone)]
pub struct Acceptor {
    settings: Current<ServerSettings>,
}

impl Acceptor {
    pub fn new(settings: ServerSettings) -> Self {
        Self {
            settings: Current::new(settings),
        }
    }

    /// Puts new settings in force for the handshakes that start from now on;
    /// connections already established (or mid-handshake) keep the old ones.
    /// Returns the settings replaced.
    pub fn reload(&self, settings: ServerSettings) -> std::sync::Arc<ServerSettings> {
        self.settings.replace(settings)
    }

    /// The settings in force (e.g. for [`ServerSettings::is_revoked`]).
    pub fn settings(&self) -> std::sync::Arc<ServerSettings> {
        self.settings.get()
    }

    /// Runs the TLS handshake on `stream`. Takes as long as the peer does:
    /// wrap it in a timeout.
    pub async fn accept<S>(&self, stream: S) -> io::Result<ServerStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        ServerStream::accept(stream, self.settings.get().config())
            .await
            .map_err(explain)
    }
}

/// A client certificate refused because it does not name one node. The
/// error inside an `io::Error` from [`Acceptor::accept`] in that case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRefused(pub IdentityError);

impl fmt::Display for CertificateRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client certificate refused: {}", self.0)
    }
}

impl std::error::Error for CertificateRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// rustls shows an error of a custom verifier by its `Debug` form; give the
/// identity refusals their sentence back.
fn explain(e: io::Error) -> io::Error {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(|tls| match tls {
            rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
                other.0.downcast_ref::<IdentityError>().cloned()
            }
            _ => None,
        });
    match refused {
        Some(why) => io::Error::new(e.kind(), CertificateRefused(why)),
        None => e,
    }
}

/// Why a handshake from [`Acceptor::accept`] failed, as one of a fixed set
/// of classes (for counting; the error itself says more):
/// `no_certificate` (the client sent none), `revoked` (by the CRL),
/// `expired` (or not valid yet), `identity` (it does not name one node),
/// `certificate` (any other certificate fault: an unknown CA, the wrong
/// purpose, a bad signature), `incompatible` (not TLS 1.3, no common
/// cipher), `protocol` (any other TLS error: garbage, an alert), `io` (the
/// connection failed or closed mid-handshake).
pub fn refusal_class(e: &io::Error) -> &'static str {
    let inner = e.get_ref();
    if inner.is_some_and(|i| i.downcast_ref::<CertificateRefused>().is_some()) {
        return "identity";
    }
    match inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
        None => "io",
        Some(rustls::Error::NoCertificatesPresented) => "no_certificate",
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            CertificateError::Revoked => "revoked",
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => "expired",
            _ => "certificate",
        },
        Some(rustls::Error::PeerIncompatible(_)) => "incompatible",
        Some(_) => "protocol",
    }
}

/// Every value [`refusal_class`] returns.
pub const REFUSAL_CLASSES: [&str; 8] = [
    "no_certificate",
    "revoked",
    "expired",
    "identity",
    "certificate",
    "incompatible",
    "protocol",
    "io",
];

/// The node identity of an accepted connection's client certificate.
///
/// The handshake already refused certificates that do not name one node, so
/// on a stream from [`Acceptor::accept`] this fails only if that rule was
/// somehow bypassed.
pub fn peer_identity<S>(conn: &ServerStream<S>) -> Result<NodeIdentity, IdentityError> {
    let leaf = conn
        .state()
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or(IdentityError::NoCertificate)?;
    NodeIdentity::from_certificate(leaf)
}
