//! The manager's client-certificate verifier: rustls' webpki verifier (chain
//! to the CA bundle, clientAuth purpose, validity, CRL), then drover's own
//! rule that the certificate names exactly one valid node.
//!
//! Doing the identity check here, not after the handshake, means a
//! certificate that cannot be a node never completes a TLS session: the
//! peer gets an alert and the manager's `accept` an error carrying the
//! reason.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

use crate::identity::NodeIdentity;

#[derive(Debug)]
pub(crate) struct NodeCertVerifier {
    webpki: Arc<dyn ClientCertVerifier>,
}

impl NodeCertVerifier {
    pub(crate) fn new(webpki: Arc<dyn ClientCertVerifier>) -> Self {
        Self { webpki }
    }
}

impl ClientCertVerifier for NodeCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Trust first: an unknown issuer must read as such, not as a bad name.
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        NodeIdentity::from_certificate(end_entity).map_err(|e| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
