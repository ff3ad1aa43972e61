//! Reading the PEM files of the settings: certificates, one private key,
//! CRLs. Every failure names the file.
//!
//! Files are read whole, up to [`FILE_MAX`] (so a path mistyped as
//! `/dev/zero` is an error, not a hang). A private key file is checked on the
//! opened descriptor: any permission for group or others refuses it.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::error::Error;

/// Far above any certificate bundle or CRL a fleet has.
const FILE_MAX: u64 = 4 << 20;

fn read_open(path: &Path, mut file: File) -> Result<Vec<u8>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    file.by_ref()
        .take(FILE_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > FILE_MAX {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            limit: FILE_MAX,
        });
    }
    Ok(bytes)
}

fn open(path: &Path) -> Result<File, Error> {
    File::open(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// A public file: certificates, CA bundle, CRL.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, Error> {
    read_open(path, open(path)?)
}

/// A private key file: refused when group or others have any permission.
pub(crate) fn read_private(path: &Path) -> Result<Vec<u8>, Error> {
    let file = open(path)?;
    let meta = file.metadata().map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(Error::KeyPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    read_open(path, file)
}

fn sections(path: &Path, pem: &[u8]) -> Result<Vec<(SectionKind, Vec<u8>)>, Error> {
    <(SectionKind, Vec<u8>)>::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

/// All certificates of the file, in order; at least one.
pub(crate) fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<_> = sections(path, pem)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der))
        .collect();
    if certs.is_empty() {
        return Err(Error::Missing {
            path: path.to_owned(),
            what: "certificate",
            label: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The one private key of the file (PKCS#8, SEC1 or PKCS#1).
pub(crate) fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    let mut keys: Vec<_> = sections(path, pem)?
        .into_iter()
        .filter_map(|(kind, der)| PrivateKeyDer::from_pem(kind, der))
        .collect();
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 if contains(pem, b"-----BEGIN ENCRYPTED PRIVATE KEY-----") => Err(Error::EncryptedKey {
            path: path.to_owned(),
        }),
        0 => Err(Error::Missing {
            path: path.to_owned(),
            what: "private key",
            label: "PRIVATE KEY",
        }),
        count => Err(Error::SeveralKeys {
            path: path.to_owned(),
            count,
        }),
    }
}

/// All CRLs of the file; at least one.
pub(crate) fn crls(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateRevocationListDer<'static>>, Error> {
    let crls: Vec<_> = sections(path, pem)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Crl)
        .map(|(_, der)| CertificateRevocationListDer::from(der))
        .collect();
    if crls.is_empty() {
        return Err(Error::Missing {
            path: path.to_owned(),
            what: "certificate revocation list",
            label: "X509 CRL",
        });
    }
    Ok(crls)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
