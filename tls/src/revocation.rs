//! The CRL file as a set of (issuer, serial): what [`is_revoked`] answers for
//! identities already online after a reload.
//!
//! The handshake itself checks CRLs with webpki; this set only serves the
//! question "is this authenticated session now revoked?". At load each CRL
//! must be signed by a CA of the bundle: a CRL from a foreign CA would revoke
//! nothing and leave the operator believing it does.
//!
//! [`is_revoked`]: crate::ServerSettings::is_revoked

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

use crate::error::Error;
use crate::identity::Serial;

#[derive(Debug, Default, Clone)]
pub(crate) struct RevokedSet {
    /// Serial → the issuers (DER names) whose CRL lists it.
    entries: HashMap<Serial, HashSet<Vec<u8>>>,
}

impl RevokedSet {
    pub(crate) fn from_crls(
        crl_path: &Path,
        crls: &[CertificateRevocationListDer<'_>],
        ca_path: &Path,
        cas: &[CertificateDer<'_>],
    ) -> Result<Self, Error> {
        // The bundle was accepted as trust anchors already; a CA that x509-parser
        // cannot read simply cannot be a CRL's signer.
        let cas: Vec<X509Certificate<'_>> = cas
            .iter()
            .filter_map(|der| X509Certificate::from_der(der).ok().map(|(_, c)| c))
            .collect();
        let mut entries: HashMap<Serial, HashSet<Vec<u8>>> = HashMap::new();
        for (i, der) in crls.iter().enumerate() {
            let index = i + 1;
            let (_, crl) = CertificateRevocationList::from_der(der).map_err(|e| Error::BadCrl {
                path: crl_path.to_owned(),
                index,
                detail: e.to_string(),
            })?;
            let issuer = crl.issuer().as_raw();
            let signed_by_ca = cas.iter().any(|ca| {
                ca.subject().as_raw() == issuer && crl.verify_signature(ca.public_key()).is_ok()
            });
            if !signed_by_ca {
                return Err(Error::CrlNotFromCa {
                    path: crl_path.to_owned(),
                    index,
                    ca_bundle: ca_path.to_owned(),
                });
            }
            for revoked in crl.iter_revoked_certificates() {
                entries
                    .entry(Serial::from_bytes(revoked.raw_serial()))
                    .or_default()
                    .insert(issuer.to_vec());
            }
        }
        Ok(Self { entries })
    }

    pub(crate) fn contains(&self, issuer: &[u8], serial: &Serial) -> bool {
        self.entries
            .get(serial)
            .is_some_and(|issuers| issuers.contains(issuer))
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.values().map(HashSet::len).sum()
    }
}
