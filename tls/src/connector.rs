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
