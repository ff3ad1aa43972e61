//! An agent's side: TLS to the manager, checking the manager's certificate
//! against the CA bundle and the name the agent dialled, and presenting the
//! agent's own certificate.
//!
//! In TLS 1.3 the client's handshake completes before the server has judged
//! the client certificate: if the manager refuses this agent's certificate,
//! `connect` still succeeds and the refusal arrives as an error on the first
//! read ("received fatal alert: …"). Read the manager's first frame before
//! concluding the link is up.

use std::io;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::current::Current;
use crate::error::Error;
use crate::settings::ClientSettings;

/// An agent's TLS connector, bound to the manager name it dials: a handle on
/// the [`ClientSettings`] in force. Clones share the settings.
#[derive(Debug, Clone)]
pub struct Connector {
    settings: Current<ClientSettings>,
    server_name: ServerName<'static>,
}

impl Connector {
    /// `server_name` is what the manager's certificate must name: the DNS
    /// name or the IP address (literal) the agent dials. It is also sent as
    /// SNI when it is a DNS name.
    pub fn new(settings: ClientSettings, server_name: &str) -> Result<Self, Error> {
        let server_name = Self::new_name(server_name)?;
        Ok(Self {
            settings: Current::new(settings),
            server_name,
        })
    }

    /// Puts new settings in force for the next connections; a connection
    /// already up keeps the old ones. Returns the settings replaced.
    pub fn reload(&self, settings: ClientSettings) -> Arc<ClientSettings> {
        self.settings.replace(settings)
    }

    pub fn settings(&self) -> Arc<ClientSettings> {
        self.settings.get()
    }

    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// A connector on the same settings (a later [`Connector::reload`] of
    /// either reaches both) that checks another manager name: for an agent
    /// told to dial a manager at another host (`SwitchController`).
    pub fn with_server_name(&self, server_name: &str) -> Result<Self, Error> {
        let named = Self::new_name(server_name)?;
        Ok(Self {
            settings: self.settings.clone(),
            server_name: named,
        })
    }

    fn new_name(server_name: &str) -> Result<ServerName<'static>, Error> {
        ServerName::try_from(server_name.to_owned()).map_err(|_| Error::ServerName {
            name: server_name
                .chars()
                .take(80)
                .flat_map(char::escape_default)
                .collect(),
        })
    }

    /// Runs the TLS handshake on `stream` (a connected TCP stream). Takes as
    /// long as the peer does: wrap it in a timeout.
    pub async fn connect<S>(&self, stream: S) -> io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        TlsConnector::from(self.settings.get().config())
            .connect(self.server_name.clone(), stream)
            .await
    }
}

/// The manager's verdict on this agent's certificate, when `err` (from a
/// read after [`Connector::connect`]) is a TLS alert the manager sent: in
/// TLS 1.3 that is how a refused client certificate reaches the agent.
/// `None` for any other error (a reset, a closed stream, garbage).
pub fn alert_from_manager(err: &io::Error) -> Option<String> {
    use rustls::AlertDescription as A;
    let rustls::Error::AlertReceived(alert) = err.get_ref()?.downcast_ref::<rustls::Error>()?
    else {
        return None;
    };
    Some(match alert {
        A::CertificateRevoked => {
            "the manager refused this node's certificate: it is revoked".to_string()
        }
        A::CertificateExpired => {
            "the manager refused this node's certificate: it has expired".to_string()
        }
        A::UnknownCA => {
            "the manager refused this node's certificate: it is not from the manager's CA"
                .to_string()
        }
        A::BadCertificate
        | A::CertificateUnknown
        | A::UnsupportedCertificate
        | A::CertificateRequired
        | A::AccessDenied => {
            format!("the manager refused this node's certificate ({alert:?})")
        }
        other => format!("the manager ended the TLS session ({other:?})"),
    })
}

#[cfg(test)]
mod alert_tests {
    use super::*;

    #[test]
    fn only_alerts_from_the_manager_are_named() {
        let revoked = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRevoked),
        );
        assert_eq!(
            alert_from_manager(&revoked).as_deref(),
            Some("the manager refused this node's certificate: it is revoked")
        );
        let other = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::InternalError),
        );
        assert!(
            alert_from_manager(&other)
                .unwrap()
                .contains("InternalError")
        );
        for err in [
            io::Error::from(io::ErrorKind::ConnectionReset),
            io::Error::new(io::ErrorKind::InvalidData, "garbage"),
            io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError),
        ] {
            assert_eq!(alert_from_manager(&err), None, "{err}");
        }
    }
}
