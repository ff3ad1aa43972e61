//! Certificates for a drover fleet, made with rcgen: a CA, the manager's
//! server certificate, node client certificates, and the CRL. The
//! `drover-pki` binary is a thin skin over [`Pki`]; the sandbox and tests
//! call it directly.
//!
//! # Layout of a PKI directory
//!
//! | file | what | mode |
//! |---|---|---|
//! | `ca.pem` | the CA certificate: the CA bundle of the manager and every agent | 0644 |
//! | `ca.key` | the CA's private key: keep it off the fleet | 0600 |
//! | `crl.pem` | the CA's revocation list (empty at first), for the manager | 0644 |
//! | `manager.pem`, `manager.key` | the manager's server certificate and key | 0644, 0600 |
//! | `nodes/NODE.pem`, `nodes/NODE.key` | a node's client certificate and key | 0644, 0600 |
//! | `issued.tsv` | every certificate the CA issued ([`index`]) | 0644 |
//!
//! Keys are ECDSA P-256 (fast handshakes, small certificates). Serials are
//! 16 random bytes. Validity starts an hour back (clock skew between the
//! machine that issues and the ones that check) and lasts the given days.
//! The CA's name carries a random tag so two CAs never share a name: the
//! CRL of one must not be taken as authoritative for the other during a CA
//! rotation.
//!
//! Files are written to a temporary file in the same directory and renamed
//! into place, so a reader never sees half a file; keys are created with
//! mode 0600 (never loosened then tightened). An existing key is replaced
//! only with `force`.
//!
//! Revocation re-signs `crl.pem` with the entries it already holds plus the
//! new ones, and a CRL number one higher; the manager reads it on reload.
//! Revoking a node revokes every certificate ever issued for it (the index
//! knows them, a rotation notwithstanding); a serial is revoked only when
//! asked for as a serial, so a typo in a node name is an error, not a
//! revocation of some other number.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use drover_protocol::NodeName;
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData,
    RevocationReason, RevokedCertParams, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

use crate::files;
use crate::identity::Serial;
use index::{Entry, Index, Kind};
use write::{CERT_MODE, KEY_MODE};

pub mod index;
mod write;
use crate::utc;
use drover_config::TlsFiles;

/// Back-dating of notBefore, for clocks that lag the issuer's.
const BACKDATE: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);
/// Longest validity accepted: beyond this a typo is likelier than intent.
pub const MAX_DAYS: u32 = 36_500;

/// What went wrong making or revoking certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },

    #[error(
        "{} exists; pass --force to replace it (whatever uses the old key stops working)",
        path.display()
    )]
    KeyExists { path: PathBuf },

    #[error("no CA in {}: run `drover-pki ca {}` first", dir.display(), dir.display())]
    NoCa { dir: PathBuf },

    #[error("cannot use the CA in {}: {detail}", dir.display())]
    BadCa { dir: PathBuf, detail: String },

    #[error("{}: {detail}", path.display())]
    BadFile { path: PathBuf, detail: String },

    #[error("'{name}' is neither a DNS name nor an IP address")]
    BadServerName { name: String },

    #[error("{0}")]
    BadNodeName(#[from] drover_protocol::NameError),

    #[error("{0}")]
    BadIndex(#[from] index::IndexError),

    #[error("name at least one {0}")]
    NothingToDo(&'static str),

    #[error(
        "'{arg}' is not a node this CA issued a certificate for (see {}); to revoke a \
         certificate by its serial number, pass --serial",
        index.display()
    )]
    UnknownRevokeTarget { arg: String, index: PathBuf },

    #[error("validity must be 1 to {MAX_DAYS} days, not {0}")]
    BadValidity(u32),

    #[error("making the certificate failed: {0}")]
    Rcgen(#[from] rcgen::Error),

    #[error("the system random generator failed")]
    Random,
}

/// When a new certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// From an hour ago until `days` from now.
    pub fn days(days: u32) -> Result<Self, PkiError> {
        if days == 0 || days > MAX_DAYS {
            return Err(PkiError::BadValidity(days));
        }
        let now = SystemTime::now();
        Ok(Self {
            not_before: now - BACKDATE,
            not_after: now + DAY * days,
        })
    }
}

/// How to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub validity: Validity,
    /// Replace existing keys (and their certificates).
    pub force: bool,
}

/// A certificate written, with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub certificate: PathBuf,
    pub private_key: PathBuf,
    pub serial: Serial,
    pub not_after: SystemTime,
}

/// What to revoke: every certificate issued for a node, or one serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeTarget {
    Node(NodeName),
    Serial(Serial),
}

/// One revocation done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub serial: Serial,
    pub node: Option<NodeName>,
    /// The CRL listed it already; nothing changed for it.
    pub already: bool,
}

/// A PKI directory (see the module docs for its layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ca_certificate(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    pub fn crl(&self) -> PathBuf {
        self.dir.join("crl.pem")
    }

    /// Every certificate issued ([`index`]).
    pub fn index_path(&self) -> PathBuf {
        self.dir.join(index::FILE)
    }

    pub fn manager_certificate(&self) -> PathBuf {
        self.dir.join("manager.pem")
    }

    pub fn manager_key(&self) -> PathBuf {
        self.dir.join("manager.key")
    }

    /// etcd's server certificate ([`Pki::issue_etcd`]).
    pub fn etcd_certificate(&self) -> PathBuf {
        self.dir.join("etcd.pem")
    }

    pub fn etcd_key(&self) -> PathBuf {
        self.dir.join("etcd.key")
    }

    pub fn nodes_dir(&self) -> PathBuf {
        self.dir.join("nodes")
    }

    pub fn node_certificate(&self, node: &NodeName) -> PathBuf {
        self.nodes_dir().join(format!("{}.pem", node.as_str()))
    }

    pub fn node_key(&self, node: &NodeName) -> PathBuf {
        self.nodes_dir().join(format!("{}.key", node.as_str()))
    }

    /// The manager's settings files: its certificate, the CA, the CRL.
    pub fn manager_files(&self) -> TlsFiles {
        TlsFiles {
            certificate: self.manager_certificate(),
            private_key: self.manager_key(),
            ca_bundle: self.ca_certificate(),
            crl: Some(self.crl()),
        }
    }

    /// A node's settings files: its certificate, the CA, the CRL.
    pub fn node_files(&self, node: &NodeName) -> TlsFiles {
        TlsFiles {
            certificate: self.node_certificate(node),
            private_key: self.node_key(node),
            ca_bundle: self.ca_certificate(),
            crl: Some(self.crl()),
        }
    }

    /// Makes the CA (`ca.pem`, `ca.key`) and an empty `crl.pem`. Creates the
    /// directory if needed.
    pub fn create_ca(&self, options: &Options) -> Result<Issued, PkiError> {
        refuse_existing(&[self.ca_key()], options.force)?;
        create_dir(&self.dir)?;
        let key = KeyPair::generate()?;
        let serial = random_serial()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let ca_name = format!("drover CA {}", random_tag()?);
        params
            .distinguished_name
            .push(DnType::CommonName, ca_name.as_str());
        params
            .distinguished_name
            .push(DnType::OrganizationName, "drover");
        // The CA signs leaf certificates only: no intermediate below it.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, &options.validity, &serial);
        let cert = params.self_signed(&key)?;
        // A new CA starts a new index: what the old key issued is not its.
        let mut index = Index::new();
        index.push(Entry {
            serial: serial.clone(),
            kind: Kind::Ca,
            name: ca_name,
            not_after: utc::format(options.validity.not_after),
        });
        index.save(&self.index_path())?;
        write_file(&self.ca_key(), key.serialize_pem().as_bytes(), KEY_MODE)?;
        write_file(&self.ca_certificate(), cert.pem().as_bytes(), CERT_MODE)?;
        let issuer = Issuer::new(params, key);
        self.write_crl(&issuer, options.validity.not_after, Vec::new(), &[1])?;
        Ok(Issued {
            certificate: self.ca_certificate(),
            private_key: self.ca_key(),
            serial,
            not_after: options.validity.not_after,
        })
    }

    /// Issues the manager's server certificate for the names agents dial:
    /// each a DNS name or an IP address (a SAN of that type).
    pub fn issue_manager(
        &self,
        names: &[impl AsRef<str>],
        options: &Options,
    ) -> Result<Issued, PkiError> {
        let Some(first) = names.first() else {
            return Err(PkiError::NothingToDo("name agents dial the manager by"));
        };
        let sans = names
            .iter()
            .map(|n| server_san(n.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        refuse_existing(&[self.manager_key()], options.force)?;
        let ca = self.load_ca()?;
        self.issue(
            &ca,
            (Kind::Manager, first.as_ref()),
            sans,
            &[ExtendedKeyUsagePurpose::ServerAuth],
            options,
            &self.manager_certificate(),
            &self.manager_key(),
        )
    }

    /// Issues etcd's server certificate (`etcd.pem`, `etcd.key`) for the
    /// names the managers dial (`EtcdEndpoints=`, docs/ha.md): like the
    /// manager's, plus client authentication, because etcd's JSON gateway
    /// dials etcd itself with this certificate when etcd asks its clients
    /// for one (`--client-cert-auth`). The managers' own client
    /// certificates for etcd are node certificates of this CA
    /// ([`Pki::issue_node`]).
    pub fn issue_etcd(
        &self,
        names: &[impl AsRef<str>],
        options: &Options,
    ) -> Result<Issued, PkiError> {
        let Some(first) = names.first() else {
            return Err(PkiError::NothingToDo("name managers dial etcd by"));
        };
        let sans = names
            .iter()
            .map(|n| server_san(n.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        refuse_existing(&[self.etcd_key()], options.force)?;
        let ca = self.load_ca()?;
        self.issue(
            &ca,
            (Kind::Etcd, first.as_ref()),
            sans,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            options,
            &self.etcd_certificate(),
            &self.etcd_key(),
        )
    }

    /// Issues one client certificate per node: SAN = the node name,
    /// clientAuth. Checks every key first, so it writes all or none unless
    /// the disk fails midway.
    pub fn issue_nodes(
        &self,
        nodes: &[NodeName],
        options: &Options,
    ) -> Result<Vec<Issued>, PkiError> {
        if nodes.is_empty() {
            return Err(PkiError::NothingToDo("node"));
        }
        let keys: Vec<PathBuf> = nodes.iter().map(|n| self.node_key(n)).collect();
        refuse_existing(&keys, options.force)?;
        let ca = self.load_ca()?;
        create_dir(&self.nodes_dir())?;
        nodes
            .iter()
            .map(|node| {
                let san = SanType::DnsName(Ia5String::try_from(node.as_str())?);
                self.issue(
                    &ca,
                    (Kind::Node, node.as_str()),
                    vec![san],
                    &[ExtendedKeyUsagePurpose::ClientAuth],
                    options,
                    &self.node_certificate(node),
                    &self.node_key(node),
                )
            })
            .collect()
    }

    pub fn issue_node(&self, node: &NodeName, options: &Options) -> Result<Issued, PkiError> {
        let mut issued = self.issue_nodes(std::slice::from_ref(node), options)?;
        Ok(issued.remove(0))
    }

    /// Reads a `drover-pki revoke` argument naming a node: one this CA issued
    /// a certificate for (in the index, or in `nodes/`). Anything else is an
    /// error, also what looks like a serial: serials are revoked only as
    /// [`RevokeTarget::Serial`] (`--serial`).
    pub fn revoke_target(&self, arg: &str) -> Result<RevokeTarget, PkiError> {
        let unknown = || PkiError::UnknownRevokeTarget {
            arg: arg
                .chars()
                .take(80)
                .flat_map(char::escape_default)
                .collect(),
            index: self.index_path(),
        };
        let node = NodeName::new(arg).map_err(|_| unknown())?;
        let in_index = Index::load(&self.index_path())?
            .is_some_and(|index| !index.node_serials(&node).is_empty());
        if in_index || self.node_certificate(&node).exists() {
            Ok(RevokeTarget::Node(node))
        } else {
            Err(unknown())
        }
    }

    /// The index of every certificate issued: the file, or one seeded from
    /// the certificates present when there is none yet (not written here).
    pub fn index(&self) -> Result<Index, PkiError> {
        let ca = self.load_ca()?;
        self.index_for(&ca)
    }

    fn index_for(&self, ca: &Ca) -> Result<Index, PkiError> {
        if let Some(index) = Index::load(&self.index_path())? {
            return Ok(index);
        }
        let mut found = Vec::new();
        let mut add = |path: PathBuf, kind: Kind, name: Option<String>| {
            if let Ok(Some(entry)) = self.entry_of(ca, &path, kind, name) {
                found.push(entry);
            }
        };
        add(self.ca_certificate(), Kind::Ca, None);
        add(self.manager_certificate(), Kind::Manager, None);
        if let Ok(dir) = fs::read_dir(self.nodes_dir()) {
            let mut nodes: Vec<NodeName> = dir
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    NodeName::new(name.strip_suffix(".pem")?).ok()
                })
                .collect();
            nodes.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            for node in nodes {
                add(
                    self.node_certificate(&node),
                    Kind::Node,
                    Some(node.as_str().to_string()),
                );
            }
        }
        Ok(Index::seeded(&utc::format(SystemTime::now()), found))
    }

    /// The index line of the certificate in `path`, if this CA issued it.
    fn entry_of(
        &self,
        ca: &Ca,
        path: &Path,
        kind: Kind,
        name: Option<String>,
    ) -> Result<Option<Entry>, PkiError> {
        let bad = |detail: String| PkiError::BadFile {
            path: path.to_owned(),
            detail,
        };
        let pem = files::read(path).map_err(|e| bad(e.to_string()))?;
        let der = files::certificates(path, &pem)
            .map_err(|e| bad(e.to_string()))?
            .remove(0);
        let (_, cert) =
            X509Certificate::from_der(&der).map_err(|e| bad(format!("cannot be parsed: {e}")))?;
        if cert.issuer().as_raw() != ca.subject.as_slice() {
            return Ok(None);
        }
        let name = name.unwrap_or_else(|| {
            cert.subject()
                .iter_common_name()
                .find_map(|cn| cn.as_str().ok().map(str::to_string))
                .unwrap_or_else(|| "-".into())
        });
        Ok(Some(Entry {
            serial: Serial::from_bytes(cert.raw_serial()),
            kind,
            name,
            not_after: utc::format(utc::from_unix(cert.validity().not_after.timestamp())),
        }))
    }

    /// Adds the targets to `crl.pem` and signs it anew: a node's every
    /// certificate (the index's, and the one in `nodes/`), or a serial. One
    /// [`Revoked`] per serial.
    pub fn revoke(&self, targets: &[RevokeTarget]) -> Result<Vec<Revoked>, PkiError> {
        if targets.is_empty() {
            return Err(PkiError::NothingToDo("certificate to revoke"));
        }
        let ca = self.load_ca()?;
        let index = self.index_for(&ca)?;
        let (mut entries, number) = self.read_crl(&ca)?;
        let now = SystemTime::now();
        let mut done: Vec<Revoked> = Vec::new();
        for target in targets {
            let serials: Vec<(Serial, Option<NodeName>)> = match target {
                RevokeTarget::Serial(s) => {
                    let node = index
                        .find(s)
                        .filter(|e| e.kind == Kind::Node)
                        .and_then(|e| NodeName::new(e.name.as_str()).ok());
                    vec![(s.clone(), node)]
                }
                RevokeTarget::Node(n) => {
                    let mut serials = index.node_serials(n);
                    if self.node_certificate(n).exists() {
                        let current = self.node_serial(&ca, n)?;
                        if !serials.contains(&current) {
                            serials.push(current);
                        }
                    }
                    if serials.is_empty() {
                        return Err(PkiError::UnknownRevokeTarget {
                            arg: n.as_str().to_string(),
                            index: self.index_path(),
                        });
                    }
                    serials.into_iter().map(|s| (s, Some(n.clone()))).collect()
                }
            };
            for (serial, node) in serials {
                if done.iter().any(|d| d.serial == serial) {
                    continue;
                }
                let already = entries
                    .iter()
                    .any(|e| Serial::from_bytes(e.serial_number.as_ref()) == serial);
                if !already {
                    entries.push(RevokedCertParams {
                        serial_number: serial_number(&serial),
                        revocation_time: now.into(),
                        reason_code: Some(RevocationReason::Unspecified),
                        invalidity_date: None,
                    });
                }
                done.push(Revoked {
                    serial,
                    node,
                    already,
                });
            }
        }
        if !self.index_path().exists() {
            // Seeded now: kept, so what is issued from here on is known.
            index.save(&self.index_path())?;
        }
        self.write_crl(&ca.issuer, ca.not_after, entries, &increment(&number))?;
        Ok(done)
    }

    #[allow(clippy::too_many_arguments)]
    fn issue(
        &self,
        ca: &Ca,
        (kind, common_name): (Kind, &str),
        sans: Vec<SanType>,
        purposes: &[ExtendedKeyUsagePurpose],
        options: &Options,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let serial = random_serial()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = purposes.to_vec();
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, &options.validity, &serial);
        let cert = params.signed_by(&key, &ca.issuer)?;
        // The index line first: no certificate on disk without one.
        let mut index = self.index_for(ca)?;
        index.push(Entry {
            serial: serial.clone(),
            kind,
            name: common_name.to_string(),
            not_after: utc::format(options.validity.not_after),
        });
        index.save(&self.index_path())?;
        write_file(key_path, key.serialize_pem().as_bytes(), KEY_MODE)?;
        write_file(cert_path, cert.pem().as_bytes(), CERT_MODE)?;
        Ok(Issued {
            certificate: cert_path.to_owned(),
            private_key: key_path.to_owned(),
            serial,
            not_after: options.validity.not_after,
        })
    }

    fn load_ca(&self) -> Result<Ca, PkiError> {
        let (cert_path, key_path) = (self.ca_certificate(), self.ca_key());
        if !cert_path.exists() && !key_path.exists() {
            return Err(PkiError::NoCa {
                dir: self.dir.clone(),
            });
        }
        let bad = |detail: String| PkiError::BadCa {
            dir: self.dir.clone(),
            detail,
        };
        let cert_pem = files::read(&cert_path).map_err(|e| bad(e.to_string()))?;
        let cert_der = files::certificates(&cert_path, &cert_pem)
            .map_err(|e| bad(e.to_string()))?
            .remove(0);
        // Refuses a CA key that others can read, like the daemons do for theirs.
        let key_pem = files::read_private(&key_path).map_err(|e| bad(e.to_string()))?;
        let key_text =
            String::from_utf8(key_pem).map_err(|_| bad("ca.key is not PEM text".into()))?;
        let key =
            KeyPair::from_pem(&key_text).map_err(|e| bad(format!("ca.key cannot be read: {e}")))?;
        let (_, parsed) = X509Certificate::from_der(&cert_der)
            .map_err(|e| bad(format!("ca.pem cannot be parsed: {e}")))?;
        if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(bad("ca.key does not belong to ca.pem".into()));
        }
        let subject = parsed.subject().as_raw().to_vec();
        let not_after = utc::from_unix(parsed.validity().not_after.timestamp());
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        Ok(Ca {
            issuer,
            subject,
            not_after,
        })
    }

    /// The entries and number of the current CRL (none and 0 without one).
    fn read_crl(&self, ca: &Ca) -> Result<(Vec<RevokedCertParams>, Vec<u8>), PkiError> {
        let path = self.crl();
        if !path.exists() {
            return Ok((Vec::new(), vec![0]));
        }
        let bad = |detail: String| PkiError::BadFile {
            path: path.clone(),
            detail,
        };
        let pem = files::read(&path).map_err(|e| bad(e.to_string()))?;
        let der = files::crls(&path, &pem)
            .map_err(|e| bad(e.to_string()))?
            .remove(0);
        let (_, crl) = CertificateRevocationList::from_der(&der)
            .map_err(|e| bad(format!("cannot be parsed: {e}")))?;
        if crl.issuer().as_raw() != ca.subject.as_slice() {
            return Err(bad(
                "it was not issued by this directory's CA; move it away to start a new one".into(),
            ));
        }
        let entries = crl
            .iter_revoked_certificates()
            .map(|r| RevokedCertParams {
                serial_number: serial_number(&Serial::from_bytes(r.raw_serial())),
                revocation_time: r.revocation_date.to_datetime(),
                reason_code: r.reason_code().and_then(|(_, code)| reason(code.0)),
                invalidity_date: r.invalidity_date().map(|(_, t)| t.to_datetime()),
            })
            .collect();
        let number = crl
            .crl_number()
            .map(|n| n.to_bytes_be())
            .unwrap_or_else(|| vec![0]);
        Ok((entries, number))
    }

    fn write_crl(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        ca_not_after: SystemTime,
        revoked_certs: Vec<RevokedCertParams>,
        number: &[u8],
    ) -> Result<(), PkiError> {
        let now = SystemTime::now();
        // drover does not enforce nextUpdate (see the crate docs); say the CA's
        // lifetime, so other tools reading the file do not call it stale.
        let next_update = ca_not_after.max(now + DAY);
        let params = CertificateRevocationListParams {
            this_update: now.into(),
            next_update: next_update.into(),
            crl_number: SerialNumber::from_slice(number),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(issuer)?;
        write_file(&self.crl(), crl.pem()?.as_bytes(), CERT_MODE)
    }

    fn node_serial(&self, ca: &Ca, node: &NodeName) -> Result<Serial, PkiError> {
        let path = self.node_certificate(node);
        let bad = |detail: String| PkiError::BadFile {
            path: path.clone(),
            detail,
        };
        let pem = files::read(&path).map_err(|e| bad(e.to_string()))?;
        let der = files::certificates(&path, &pem)
            .map_err(|e| bad(e.to_string()))?
            .remove(0);
        let (_, cert) =
            X509Certificate::from_der(&der).map_err(|e| bad(format!("cannot be parsed: {e}")))?;
        if cert.issuer().as_raw() != ca.subject.as_slice() {
            return Err(bad("it was not issued by this directory's CA".into()));
        }
        Ok(Serial::from_bytes(cert.raw_serial()))
    }
}

/// The CA, ready to sign.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// DER of the CA's subject: the issuer name of what it signed.
    subject: Vec<u8>,
    not_after: SystemTime,
}

fn set_validity(params: &mut CertificateParams, validity: &Validity, serial: &Serial) {
    params.not_before = validity.not_before.into();
    params.not_after = validity.not_after.into();
    params.serial_number = Some(serial_number(serial));
}

fn server_san(name: &str) -> Result<SanType, PkiError> {
    let bad = || PkiError::BadServerName {
        name: name
            .chars()
            .take(80)
            .flat_map(char::escape_default)
            .collect(),
    };
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    // The agent's check (rustls) must accept what we write.
    rustls::pki_types::DnsName::try_from(name).map_err(|_| bad())?;
    Ok(SanType::DnsName(
        Ia5String::try_from(name).map_err(|_| bad())?,
    ))
}

fn serial_number(serial: &Serial) -> SerialNumber {
    match serial.as_bytes() {
        [] => SerialNumber::from_slice(&[0]),
        bytes => SerialNumber::from_slice(bytes),
    }
}

/// 16 random bytes, positive and without a leading zero byte, so the DER
/// integer is always 16 or 17 bytes and reads back as the same serial.
fn random_serial() -> Result<Serial, PkiError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Random)?;
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(Serial::from_bytes(&bytes))
}

fn random_tag() -> Result<String, PkiError> {
    let mut bytes = [0u8; 4];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn reason(code: u8) -> Option<RevocationReason> {
    use RevocationReason::*;
    Some(match code {
        0 => Unspecified,
        1 => KeyCompromise,
        2 => CaCompromise,
        3 => AffiliationChanged,
        4 => Superseded,
        5 => CessationOfOperation,
        6 => CertificateHold,
        8 => RemoveFromCrl,
        9 => PrivilegeWithdrawn,
        10 => AaCompromise,
        _ => return None,
    })
}

/// A big-endian unsigned number plus one.
fn increment(number: &[u8]) -> Vec<u8> {
    let mut out = number.to_vec();
    for byte in out.iter_mut().rev() {
        let (sum, carry) = byte.overflowing_add(1);
        *byte = sum;
        if !carry {
            return out;
        }
    }
    out.insert(0, 1);
    out
}

fn refuse_existing(keys: &[PathBuf], force: bool) -> Result<(), PkiError> {
    if force {
        return Ok(());
    }
    match keys.iter().find(|k| k.exists()) {
        Some(path) => Err(PkiError::KeyExists { path: path.clone() }),
        None => Ok(()),
    }
}

fn create_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|source| PkiError::Io {
        path: dir.to_owned(),
        source,
    })
}

/// [`write::write_file`], its error said with the path.
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    write::write_file(path, contents, mode).map_err(|source| PkiError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments() {
        assert_eq!(increment(&[0]), vec![1]);
        assert_eq!(increment(&[0x01, 0xff]), vec![0x02, 0x00]);
        assert_eq!(increment(&[0xff]), vec![0x01, 0x00]);
    }

    #[test]
    fn server_names() {
        assert!(matches!(server_san("10.0.0.1"), Ok(SanType::IpAddress(_))));
        assert!(matches!(server_san("::1"), Ok(SanType::IpAddress(_))));
        assert!(matches!(
            server_san("manager.example"),
            Ok(SanType::DnsName(_))
        ));
        for bad in ["", "a b", "exa_mple..com", "ünïcode"] {
            assert!(server_san(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validity_bounds() {
        assert!(Validity::days(0).is_err());
        assert!(Validity::days(MAX_DAYS + 1).is_err());
        let v = Validity::days(1).unwrap();
        assert!(v.not_before < SystemTime::now() && v.not_after > SystemTime::now());
    }
}
