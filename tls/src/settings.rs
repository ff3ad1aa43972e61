//! From files to immutable rustls configurations: [`ServerSettings`] for the
//! manager, [`ClientSettings`] for an agent, [`service_client_config`] for
//! the manager as a client of etcd.
//!
//! Loading checks everything it can before any peer shows up: each file
//! readable and holding what it should, the key private (mode) and matching
//! the certificate, one's own certificate currently valid (and, for an
//! agent, naming one node), CA certificates usable as trust anchors, each
//! CRL signed by a CA of the bundle. A load that fails changes nothing: the
//! caller keeps the settings it has.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, InconsistentKeys, RootCertStore, ServerConfig};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::Error;
use crate::files;
use crate::identity::{NodeIdentity, Serial};
use crate::revocation::{CrlRollback, RevokedSet};
use crate::utc;
use crate::verifier::NodeCertVerifier;
use drover_config::TlsFiles;

/// The manager's side, loaded and checked. Immutable; see [`crate::Acceptor`].
#[derive(Debug)]
pub struct ServerSettings {
    config: Arc<ServerConfig>,
    revoked: RevokedSet,
    serial: Serial,
    not_after: SystemTime,
}

impl ServerSettings {
    pub fn load(files: &TlsFiles) -> Result<Self, Error> {
        let provider = provider();
        let own = Own::load(files, &provider, Purpose::Server)?;
        let trust = Trust::load(files)?;
        let webpki = WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&trust.roots),
            Arc::clone(&provider),
        )
        .with_crls(trust.crls)
        .allow_unknown_revocation_status()
        .build()
        .map_err(|e| crl_error(files, e))?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(NodeCertVerifier::new(webpki)))
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(own.key)));
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Self {
            config: Arc::new(config),
            revoked: trust.revoked,
            serial: own.serial,
            not_after: own.not_after,
        })
    }

    /// Whether the CRL of these settings revokes `identity`: after a reload,
    /// the manager drops the sessions for which this is true.
    pub fn is_revoked(&self, identity: &NodeIdentity) -> bool {
        self.revoked.contains(identity.issuer(), identity.serial())
    }

    /// `Some` when these settings' CRL for some issuer is older (a lower CRL
    /// number) than the one in `in_force`: a reload must then keep
    /// `in_force` (an older CRL un-revokes).
    pub fn crl_rollback_from(&self, in_force: &ServerSettings) -> Option<CrlRollback> {
        self.revoked.rollback_from(&in_force.revoked)
    }

    /// How many certificates the CRL file revokes.
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }

    /// The manager certificate's notAfter (to warn before it expires).
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The manager certificate's serial.
    pub fn serial(&self) -> &Serial {
        &self.serial
    }

    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config)
    }
}

/// An agent's side, loaded and checked. Immutable; see [`crate::Connector`].
#[derive(Debug)]
pub struct ClientSettings {
    config: Arc<ClientConfig>,
    identity: NodeIdentity,
    revoked: RevokedSet,
}

impl ClientSettings {
    /// Also checks that the agent's own certificate names exactly one node.
    pub fn load(files: &TlsFiles) -> Result<Self, Error> {
        let provider = provider();
        let own = Own::load(files, &provider, Purpose::Client)?;
        let identity =
            NodeIdentity::from_certificate(own.key.end_entity_cert()?).map_err(|source| {
                Error::NotANodeCertificate {
                    path: files.certificate.clone(),
                    source,
                }
            })?;
        let trust = Trust::load(files)?;
        let revoked = trust.revoked;
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::clone(&trust.roots),
            Arc::clone(&provider),
        )
        .with_crls(trust.crls)
        .allow_unknown_revocation_status()
        .build()
        .map_err(|e| crl_error(files, e))?;
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_webpki_verifier(verifier)
            .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(own.key)));
        config.resumption = Resumption::disabled();
        Ok(Self {
            config: Arc::new(config),
            identity,
            revoked,
        })
    }

    /// As [`ServerSettings::crl_rollback_from`], for the agent's CRL (which
    /// can revoke the manager's certificate): the same rule.
    pub fn crl_rollback_from(&self, in_force: &ClientSettings) -> Option<CrlRollback> {
        self.revoked.rollback_from(&in_force.revoked)
    }

    /// How many certificates the CRL file revokes.
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }

    /// The node this agent's certificate speaks for.
    pub fn identity(&self) -> &NodeIdentity {
        &self.identity
    }

    pub(crate) fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }
}

/// A client of a service that is not drover (etcd, for the managers'
/// election, docs/ha.md): one's own certificate chain and key (any name;
/// its extended key usage must allow client authentication), and the CA
/// bundle (and CRL) the service's certificate must chain to and be valid
/// for the name dialled. Checked at load as [`ClientSettings::load`]
/// checks, without asking the certificate to name a node. TLS 1.3, as
/// everywhere in drover (etcd 3.4 speaks it).
pub fn service_client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, Error> {
    let provider = provider();
    let own = Own::load(files, &provider, Purpose::Client)?;
    let trust = Trust::load(files)?;
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::clone(&trust.roots),
        Arc::clone(&provider),
    )
    .with_crls(trust.crls)
    .allow_unknown_revocation_status()
    .build()
    .map_err(|e| crl_error(files, e))?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_webpki_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(own.key)));
    Ok(Arc::new(config))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CRL that passed our own parse but not webpki's.
fn crl_error(files: &TlsFiles, e: rustls::server::VerifierBuilderError) -> Error {
    Error::BadCrl {
        path: files.crl.clone().unwrap_or_default(),
        index: 0,
        detail: e.to_string(),
    }
}

/// One's own certificate chain and key.
struct Own {
    key: CertifiedKey,
    serial: Serial,
    not_after: SystemTime,
}

impl Own {
    fn load(files: &TlsFiles, provider: &CryptoProvider, purpose: Purpose) -> Result<Self, Error> {
        let cert_path = &files.certificate;
        let chain = files::certificates(cert_path, &files::read(cert_path)?)?;
        let (serial, not_after) = check_leaf(cert_path, &chain[0], purpose)?;
        let key_path = &files.private_key;
        let key_der = files::private_key(key_path, &files::read_private(key_path)?)?;
        let signer = provider
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| Error::BadKey {
                path: key_path.clone(),
                detail: e.to_string(),
            })?;
        let key = CertifiedKey::new(chain, signer);
        match key.keys_match() {
            // ring can derive the public key of every key type it loads; an
            // unknown answer would come from a provider we do not use.
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(Error::KeyMismatch {
                    cert: cert_path.clone(),
                    key: key_path.clone(),
                });
            }
            Err(e) => {
                return Err(Error::BadCertificate {
                    path: cert_path.clone(),
                    index: 1,
                    detail: e.to_string(),
                });
            }
        }
        Ok(Self {
            key,
            serial,
            not_after,
        })
    }
}

/// What one's own certificate is for: the peer checks the extended key usage.
#[derive(Clone, Copy)]
enum Purpose {
    Server,
    Client,
}

/// Parses one's own (leaf) certificate; refuses it outside its validity or
/// when its extended key usage excludes `purpose` (as the peer would).
fn check_leaf(
    path: &Path,
    der: &CertificateDer<'_>,
    purpose: Purpose,
) -> Result<(Serial, SystemTime), Error> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| Error::BadCertificate {
        path: path.to_owned(),
        index: 1,
        detail: e.to_string(),
    })?;
    let now = utc::to_unix(SystemTime::now());
    let validity = cert.validity();
    let (not_before, not_after) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    if now > not_after {
        return Err(Error::Expired {
            path: path.to_owned(),
            not_after: utc::format(utc::from_unix(not_after)),
        });
    }
    if now < not_before {
        return Err(Error::NotYetValid {
            path: path.to_owned(),
            not_before: utc::format(utc::from_unix(not_before)),
        });
    }
    // No extension allows every purpose (as webpki reads it); an unreadable
    // one allows none.
    let allowed = match cert.extended_key_usage() {
        Ok(None) => true,
        Ok(Some(eku)) => match purpose {
            Purpose::Server => eku.value.server_auth,
            Purpose::Client => eku.value.client_auth,
        },
        Err(_) => false,
    };
    if !allowed {
        return Err(Error::WrongPurpose {
            path: path.to_owned(),
            needed: match purpose {
                Purpose::Server => {
                    "server authentication: the manager needs a certificate from `drover-pki manager`"
                }
                Purpose::Client => {
                    "client authentication: an agent needs a certificate from `drover-pki node`"
                }
            },
        });
    }
    Ok((
        Serial::from_bytes(cert.raw_serial()),
        utc::from_unix(not_after),
    ))
}

/// What peers are checked against: the CA bundle and the CRL file.
struct Trust {
    roots: Arc<RootCertStore>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    revoked: RevokedSet,
}

impl Trust {
    fn load(files: &TlsFiles) -> Result<Self, Error> {
        let ca_path = &files.ca_bundle;
        let cas = files::certificates(ca_path, &files::read(ca_path)?)?;
        let mut roots = RootCertStore::empty();
        for (i, ca) in cas.iter().enumerate() {
            roots.add(ca.clone()).map_err(|e| Error::BadCaCertificate {
                path: ca_path.clone(),
                index: i + 1,
                detail: e.to_string(),
            })?;
        }
        let (crls, revoked) = match &files.crl {
            None => (Vec::new(), RevokedSet::default()),
            Some(crl_path) => {
                let crls = files::crls(crl_path, &files::read(crl_path)?)?;
                let revoked = RevokedSet::from_crls(crl_path, &crls, ca_path, &cas)?;
                (crls, revoked)
            }
        };
        Ok(Self {
            roots: Arc::new(roots),
            crls,
            revoked,
        })
    }
}
