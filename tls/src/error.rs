//! Errors. A load error names the file and says what is wrong with it, in
//! words an operator can act on; an identity error says why a certificate
//! does not name exactly one drover node.

use std::io;
use std::path::PathBuf;

use drover_protocol::NameError;

/// Why TLS settings could not be loaded. Each variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },

    #[error("{} is larger than {limit} bytes: not a PEM file", path.display())]
    TooLarge { path: PathBuf, limit: u64 },

    #[error("{} is not valid PEM: {detail}", path.display())]
    Pem { path: PathBuf, detail: String },

    #[error("{} holds no {what} (expected a PEM block '-----BEGIN {label}-----')", path.display())]
    Missing {
        path: PathBuf,
        what: &'static str,
        label: &'static str,
    },

    #[error("{} holds {count} private keys; put exactly one in the file", path.display())]
    SeveralKeys { path: PathBuf, count: usize },

    #[error("{} holds an encrypted private key; drover needs it unencrypted (and the file mode 0600)", path.display())]
    EncryptedKey { path: PathBuf },

    #[error(
        "private key {} is accessible by group or others (mode {mode:04o}); it must be readable by its owner only: chmod 600 {}",
        path.display(),
        path.display()
    )]
    KeyPermissions { path: PathBuf, mode: u32 },

    #[error("{} holds a private key that cannot be used: {detail}", path.display())]
    BadKey { path: PathBuf, detail: String },

    #[error("private key {} does not belong to certificate {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },

    #[error("{}: certificate #{index} in the file cannot be parsed: {detail}", path.display())]
    BadCertificate {
        path: PathBuf,
        index: usize,
        detail: String,
    },

    #[error("{}: CA certificate #{index} cannot be used as a trust anchor: {detail}", path.display())]
    BadCaCertificate {
        path: PathBuf,
        index: usize,
        detail: String,
    },

    #[error("{}: the certificate expired on {not_after}; issue a new one (drover-pki)", path.display())]
    Expired { path: PathBuf, not_after: String },

    #[error("{}: the certificate is not valid before {not_before} (is the clock right?)", path.display())]
    NotYetValid { path: PathBuf, not_before: String },

    #[error("{}: the certificate's extended key usage does not allow {needed}", path.display())]
    WrongPurpose { path: PathBuf, needed: &'static str },

    #[error("{}: CRL #{index} in the file cannot be used: {detail}", path.display())]
    BadCrl {
        path: PathBuf,
        index: usize,
        detail: String,
    },

    #[error("{}: CRL #{index} is not signed by any CA in {}", path.display(), ca_bundle.display())]
    CrlNotFromCa {
        path: PathBuf,
        index: usize,
        ca_bundle: PathBuf,
    },

    #[error("{}: not a drover node certificate: {source}", path.display())]
    NotANodeCertificate {
        path: PathBuf,
        source: IdentityError,
    },

    #[error("'{name}' is not a server name to dial: give a DNS name or an IP address")]
    ServerName { name: String },

    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Why a certificate does not yield a node identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error("the peer presented no certificate")]
    NoCertificate,

    #[error("the certificate cannot be parsed: {0}")]
    Unparsable(String),

    #[error("the certificate's subjectAltName cannot be read: {0}")]
    BadSubjectAltName(String),

    #[error(
        "the certificate has no DNS name in its subjectAltName; drover takes the node name from exactly one DNS SAN (the CN is ignored)"
    )]
    NoDnsName,

    #[error(
        "the certificate has {count} DNS names in its subjectAltName ({}); a node certificate names exactly one node",
        .shown.join(", ")
    )]
    SeveralDnsNames {
        /// How many DNS names the certificate has.
        count: usize,
        /// The first few, escaped and cut, then `…` when there are more.
        shown: Vec<String>,
    },

    #[error("the certificate's DNS name is not a drover node name: {0}")]
    BadNodeName(NameError),
}
