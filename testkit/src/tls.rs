//! A bare rustls client for TLS tests: it trusts a CA file and presents any
//! certificate and key given, or none. drover's own loader
//! (`drover_tls::ClientSettings`) refuses to present an expired, foreign or
//! malformed certificate, so tests that check what the *manager* refuses
//! connect with this instead. TLS 1.3 and the ring provider, as drover.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// The crypto provider drover uses (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client that trusts the CA certificates in `ca` and presents
/// `client` = (certificate, key) if given. Panics on unreadable files.
pub fn raw_client(ca: &Path, client: Option<(&Path, &Path)>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(cert.expect("CA certificate")).expect("CA usable");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .expect("certificate file")
                    .map(|c| c.expect("certificate"))
                    .collect(),
                PrivateKeyDer::from_pem_file(key).expect("key file"),
            )
            .expect("certificate and key"),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}
