//! The CRL file as a set of (issuer, serial): what [`is_revoked`] answers for
//! identities already online after a reload; and each issuer's CRL number,
//! so that a reload can refuse a CRL older than the one in force
//! ([`RevokedSet::rollback_from`]): an older CRL lists fewer revocations, and
//! taking it would silently un-revoke.
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
    /// Issuer (DER name) → the highest CRL number of its CRLs in the file
    /// (big-endian, no leading zeros), and the issuer's name for people.
    numbers: HashMap<Vec<u8>, (Vec<u8>, String)>,
}

/// A CRL older than the one in force for the same issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlRollback {
    /// The issuer, as people read it (`CN=drover CA 1a2b3c4d, O=drover`).
    pub issuer: String,
    /// CRL numbers, in hex: the new file's and the one in force.
    pub new: String,
    pub in_force: String,
}

impl std::fmt::Display for CrlRollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the CRL of {} has CRL number {}, lower than the {} in force: an older CRL would \
             un-revoke what was revoked since (drover-pki revoke signs each new CRL with a \
             higher number)",
            self.issuer, self.new, self.in_force
        )
    }
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
        let mut numbers: HashMap<Vec<u8>, (Vec<u8>, String)> = HashMap::new();
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
            if let Some(number) = crl.crl_number() {
                let number = trim(number.to_bytes_be());
                let slot = numbers
                    .entry(issuer.to_vec())
                    .or_insert_with(|| (Vec::new(), crl.issuer().to_string()));
                if cmp_be(&number, &slot.0).is_gt() {
                    slot.0 = number;
                }
            }
            for revoked in crl.iter_revoked_certificates() {
                entries
                    .entry(Serial::from_bytes(revoked.raw_serial()))
                    .or_default()
                    .insert(issuer.to_vec());
            }
        }
        Ok(Self { entries, numbers })
    }

    /// The first issuer whose CRL here is older (lower CRL number) than its
    /// CRL in `in_force`. An issuer without a number on either side is not
    /// compared.
    pub(crate) fn rollback_from(&self, in_force: &RevokedSet) -> Option<CrlRollback> {
        let mut issuers: Vec<&Vec<u8>> = self.numbers.keys().collect();
        issuers.sort();
        issuers.into_iter().find_map(|issuer| {
            let (new, name) = &self.numbers[issuer];
            let (old, _) = in_force.numbers.get(issuer)?;
            cmp_be(new, old).is_lt().then(|| CrlRollback {
                issuer: name.clone(),
                new: hex(new),
                in_force: hex(old),
            })
        })
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

fn trim(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros);
    bytes
}

/// Compares big-endian unsigned numbers without leading zeros.
fn cmp_be(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "0x0".into();
    }
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{}", digits.trim_start_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_as_numbers() {
        assert!(cmp_be(&trim(vec![0, 2]), &trim(vec![1])).is_gt());
        assert!(cmp_be(&[1, 0], &[0xff]).is_gt());
        assert!(cmp_be(&[], &[1]).is_lt());
        assert_eq!(hex(&[0x01, 0x0a]), "0x10a");
        assert_eq!(hex(&[]), "0x0");
    }
}
