//! The TLS keys both daemons share: `TLSCertificate`, `TLSPrivateKey`,
//! `TLSCertificateAuthority`, `TLSRevocationList`.
//!
//! This crate checks the *settings*, not the files: each value must be an
//! absolute path (a relative one would depend on the daemon's working
//! directory), and the first three are all-or-nothing — set together, after
//! the last layer, or not at all; `TLSRevocationList` needs them too. An
//! empty value (`TLSCertificate=`) unsets the key, so a drop-in can turn TLS
//! off again. Whether the files exist and hold what they should (PEM, key
//! mode 0600, the key matching the certificate, dates, CRL signature) is
//! checked by `drover-tls` when a daemon loads them, at start and on
//! reload, with errors naming the file.
//!
//! [`TlsFiles`] is a plain struct of paths with the field names of
//! `drover_tls::TlsFiles`, so this crate (which droverctl's build also sees)
//! does not link rustls; the daemons convert field by field.

use crate::ConfigError;
use crate::value::At;
use std::path::{Path, PathBuf};

/// The four TLS keys, in the order drover.conf(5) lists them.
pub const KEYS: &[&str] = &[
    "TLSCertificate",
    "TLSPrivateKey",
    "TLSCertificateAuthority",
    "TLSRevocationList",
];

/// Where a daemon's TLS files are, once all three required keys are set.
/// The same four for the manager and an agent; `drover-tls` loads them
/// (its `ServerSettings::load` / `ClientSettings::load`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `TLSCertificate`: one's own certificate (PEM), then any intermediates.
    pub certificate: PathBuf,
    /// `TLSPrivateKey`: its key (PEM: PKCS#8, SEC1 or PKCS#1, unencrypted,
    /// mode 0600 or stricter).
    pub private_key: PathBuf,
    /// `TLSCertificateAuthority`: the CA certificates peers must chain to
    /// (several during a CA rotation).
    pub ca_bundle: PathBuf,
    /// `TLSRevocationList`: CRLs issued by those CAs (optional).
    pub crl: Option<PathBuf>,
}

/// Where a key was set: enough to build an error that names file, line and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    pub path: PathBuf,
    pub line: usize,
    pub key: String,
}

impl Origin {
    pub fn of(at: At<'_>) -> Self {
        Self {
            path: at.path.to_path_buf(),
            line: at.entry.line,
            key: at.entry.key.clone(),
        }
    }

    pub fn err(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::Value {
            path: self.path.clone(),
            line: self.line,
            key: self.key.clone(),
            message: message.into(),
        }
    }
}

/// The four keys as the layers set them; [`TlsKeys::finish`] applies the
/// all-or-nothing rule after the last layer. The keys are [`KEYS`] by
/// default; [`TlsKeys::named`] takes another set of the same meaning (the
/// manager's TLS to etcd, [`crate::ha`]).
#[derive(Debug, Clone)]
pub(crate) struct TlsKeys {
    /// Certificate, private key, CA bundle, then optionally the CRL.
    names: &'static [&'static str],
    set: Vec<Option<(PathBuf, Origin)>>,
}

impl Default for TlsKeys {
    fn default() -> Self {
        Self::named(KEYS)
    }
}

impl TlsKeys {
    /// The keys `names`: certificate, private key, CA bundle (required
    /// together), and optionally a fourth, the CRL.
    pub fn named(names: &'static [&'static str]) -> Self {
        Self {
            names,
            set: vec![None; names.len()],
        }
    }

    /// Applies `at` if it is one of the keys; returns false for any other key.
    pub fn apply(&mut self, at: At<'_>) -> Result<bool, ConfigError> {
        let Some(i) = self.names.iter().position(|k| *k == at.entry.key) else {
            return Ok(false);
        };
        self.set[i] = if at.value().is_empty() {
            None
        } else {
            Some((tls_path(at)?, Origin::of(at)))
        };
        Ok(true)
    }

    /// Where the first TLS key that is set was set (for errors about keys
    /// that contradict TLS).
    pub fn first_origin(&self) -> Option<&Origin> {
        self.set.iter().flatten().map(|(_, o)| o).next()
    }

    /// `None` when no key is set; the files when the three required keys
    /// are; otherwise an error at the first key set naming the missing ones.
    pub fn finish(&self) -> Result<Option<TlsFiles>, ConfigError> {
        let Some(origin) = self.first_origin() else {
            return Ok(None);
        };
        let missing: Vec<&str> = self.names[..3]
            .iter()
            .zip(&self.set)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(origin.err(format!(
                "TLS needs {}, {} and {} together; {} {} not set",
                self.names[0],
                self.names[1],
                self.names[2],
                missing.join(" and "),
                if missing.len() == 1 { "is" } else { "are" }
            )));
        }
        let path = |i: usize| {
            self.set
                .get(i)
                .and_then(|v| v.as_ref())
                .map(|(p, _)| p.clone())
        };
        Ok(Some(TlsFiles {
            certificate: path(0).unwrap_or_default(),
            private_key: path(1).unwrap_or_default(),
            ca_bundle: path(2).unwrap_or_default(),
            crl: path(3),
        }))
    }
}

/// An absolute path without control characters.
fn tls_path(at: At<'_>) -> Result<PathBuf, ConfigError> {
    let v = at.value();
    if v.chars().any(char::is_control) {
        return Err(at.err("a path must not contain control characters"));
    }
    let path = Path::new(v);
    if !path.is_absolute() {
        return Err(at.err(format!(
            "'{v}' is not an absolute path (e.g. /etc/drover/tls/ca.pem)"
        )));
    }
    if v.ends_with('/') {
        return Err(at.err(format!("'{v}' names a directory; give the PEM file")));
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ini::Entry;

    fn apply(keys: &mut TlsKeys, key: &str, value: &str, line: usize) -> Result<bool, ConfigError> {
        let entry = Entry {
            key: key.into(),
            value: value.into(),
            line,
        };
        keys.apply(At {
            path: Path::new("f.conf"),
            entry: &entry,
        })
    }

    #[test]
    fn all_or_nothing() {
        let mut k = TlsKeys::default();
        assert_eq!(k.finish().unwrap(), None);
        assert!(!apply(&mut k, "ControllerPort", "1", 1).unwrap());
        apply(&mut k, "TLSPrivateKey", "/k.key", 3).unwrap();
        let err = k.finish().unwrap_err().to_string();
        assert_eq!(
            err,
            "f.conf:3: key 'TLSPrivateKey': TLS needs TLSCertificate, TLSPrivateKey and \
             TLSCertificateAuthority together; TLSCertificate and TLSCertificateAuthority are not set"
        );
        apply(&mut k, "TLSCertificate", "/c.pem", 4).unwrap();
        apply(&mut k, "TLSCertificateAuthority", "/ca.pem", 5).unwrap();
        let files = k.finish().unwrap().unwrap();
        assert_eq!(files.certificate, Path::new("/c.pem"));
        assert_eq!(files.crl, None);
        // Unsetting one breaks the set again; unsetting all is no TLS.
        apply(&mut k, "TLSCertificate", "", 6).unwrap();
        assert!(k.finish().is_err());
        apply(&mut k, "TLSPrivateKey", "", 7).unwrap();
        apply(&mut k, "TLSCertificateAuthority", "", 8).unwrap();
        assert_eq!(k.finish().unwrap(), None);
        // A CRL alone is not TLS either.
        apply(&mut k, "TLSRevocationList", "/crl.pem", 9).unwrap();
        let err = k.finish().unwrap_err().to_string();
        assert!(
            err.starts_with("f.conf:9: key 'TLSRevocationList':"),
            "{err}"
        );
    }

    #[test]
    fn paths_are_absolute_files() {
        let mut k = TlsKeys::default();
        for (value, want) in [
            ("tls/ca.pem", "not an absolute path"),
            ("./ca.pem", "not an absolute path"),
            ("/etc/drover/tls/", "names a directory"),
            ("/etc/ca\u{7}.pem", "control characters"),
        ] {
            let err = apply(&mut k, "TLSCertificateAuthority", value, 2)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("f.conf:2: key 'TLSCertificateAuthority':"),
                "{err}"
            );
            assert!(err.contains(want), "{value}: {err}");
        }
    }
}
