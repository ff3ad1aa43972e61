//! `issued.tsv`: every certificate a PKI directory's CA issued, so that
//! revoking a node revokes all its certificates, not only the one in
//! `nodes/NODE.pem` (a rotation with `--force` replaces that file, and the
//! old certificate, whose key may be the compromised one, stays valid).
//!
//! One line per certificate, tab-separated: serial (hex with `:`), kind
//! (`ca`, `manager`, `node`), name (the node name; the manager's first name;
//! the CA's common name) and the end of its validity. Lines starting with
//! `#` are comments. A line is added *before* the certificate is written,
//! so a certificate is never on disk without its line (a failed write may
//! leave a line for a certificate that never was, which harms nothing).
//!
//! A directory made before the index existed gets one the first time
//! `drover-pki` issues or revokes there, seeded from the certificates
//! present then; its first line says so ([`Index::seeded`]), because
//! certificates replaced before that day are unknown to it.
//!
//! The file is the operator's and is read as untrusted text: a line that
//! does not parse is an error naming the file and the line, never skipped.

use std::path::{Path, PathBuf};

use drover_protocol::NodeName;

use super::write::{CERT_MODE, write_file};
use crate::files;
use crate::identity::Serial;

/// The file's name inside a PKI directory.
pub const FILE: &str = "issued.tsv";

const HEADER: &str =
    "# drover-pki: every certificate this CA issued: serial, kind, name, not after";
const SEEDED: &str = "# seeded from the certificates present on ";

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ca,
    Manager,
    Node,
    /// etcd's server certificate (`Pki::issue_etcd`).
    Etcd,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Ca => "ca",
            Kind::Manager => "manager",
            Kind::Node => "node",
            Kind::Etcd => "etcd",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        match s {
            "ca" => Some(Kind::Ca),
            "manager" => Some(Kind::Manager),
            "node" => Some(Kind::Node),
            "etcd" => Some(Kind::Etcd),
            _ => None,
        }
    }
}

/// The index cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {detail}", path.display())]
pub struct IndexError {
    pub path: PathBuf,
    pub detail: String,
}

/// One certificate issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub serial: Serial,
    pub kind: Kind,
    pub name: String,
    /// As written (`YYYY-MM-DD HH:MM:SS UTC`); for people only.
    pub not_after: String,
}

impl Entry {
    fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\n",
            self.serial,
            self.kind.as_str(),
            self.name,
            self.not_after
        )
    }
}

/// The index as read (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    entries: Vec<Entry>,
    /// The date it was seeded from the files present, if it was.
    seeded: Option<String>,
    /// The file's text, kept to append to.
    text: String,
}

impl Index {
    /// A new, empty index (a new CA).
    pub fn new() -> Index {
        Index {
            text: format!("{HEADER}\n"),
            ..Index::default()
        }
    }

    /// A new index seeded from certificates found on disk.
    pub fn seeded(date: &str, found: Vec<Entry>) -> Index {
        let mut index = Index {
            text: format!(
                "{HEADER}\n{SEEDED}{date}; certificates replaced before then are not listed\n"
            ),
            seeded: Some(date.to_string()),
            ..Index::default()
        };
        for entry in found {
            index.push(entry);
        }
        index
    }

    /// Reads `path`; `None` when it does not exist.
    pub fn load(path: &Path) -> Result<Option<Index>, IndexError> {
        if !path.exists() {
            return Ok(None);
        }
        let bad = |detail: String| IndexError {
            path: path.to_owned(),
            detail,
        };
        let bytes = files::read(path).map_err(|e| bad(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
        let mut index = Index {
            text: text.clone(),
            ..Index::default()
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(rest) = line.strip_prefix(SEEDED) {
                let date = rest.split(';').next().unwrap_or_default();
                index.seeded = Some(date.to_string());
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let entry = parse_line(line).ok_or_else(|| {
                bad(format!(
                    "line {}: not `serial<TAB>kind<TAB>name<TAB>not after`",
                    n + 1
                ))
            })?;
            index.entries.push(entry);
        }
        if !index.text.ends_with('\n') {
            index.text.push('\n');
        }
        Ok(Some(index))
    }

    /// Adds a line (not yet written: see [`Index::save`]).
    pub fn push(&mut self, entry: Entry) {
        self.text.push_str(&entry.line());
        self.entries.push(entry);
    }

    /// Writes the whole file anew, atomically.
    pub fn save(&self, path: &Path) -> Result<(), IndexError> {
        write_file(path, self.text.as_bytes(), CERT_MODE).map_err(|e| IndexError {
            path: path.to_owned(),
            detail: e.to_string(),
        })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// When it was seeded from the files present, if it was: certificates
    /// replaced before then are missing.
    pub fn seeded_on(&self) -> Option<&str> {
        self.seeded.as_deref()
    }

    /// The serials of every certificate issued for `node`, oldest first.
    pub fn node_serials(&self, node: &NodeName) -> Vec<Serial> {
        self.entries
            .iter()
            .filter(|e| e.kind == Kind::Node && e.name == node.as_str())
            .map(|e| e.serial.clone())
            .collect()
    }

    /// The certificate with this serial, if this CA issued it.
    pub fn find(&self, serial: &Serial) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.serial == serial)
    }
}

fn parse_line(line: &str) -> Option<Entry> {
    let mut fields = line.split('\t');
    let serial = fields.next()?.parse().ok()?;
    let kind = Kind::parse(fields.next()?)?;
    let name = fields.next()?.to_string();
    let not_after = fields.next()?.to_string();
    if fields.next().is_some() || name.is_empty() {
        return None;
    }
    Some(Entry {
        serial,
        kind,
        name,
        not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(serial: &str, kind: Kind, name: &str) -> Entry {
        Entry {
            serial: serial.parse().unwrap(),
            kind,
            name: name.into(),
            not_after: "2030-01-01 00:00:00 UTC".into(),
        }
    }

    #[test]
    fn written_lines_read_back() {
        let dir = std::env::temp_dir().join(format!("drover-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE);
        let mut index = Index::new();
        index.push(entry("4a:01", Kind::Ca, "drover CA 01"));
        index.push(entry("4a:02", Kind::Node, "db2"));
        index.push(entry("4a:03", Kind::Node, "db2"));
        index.push(entry("4a:04", Kind::Node, "db20"));
        index.save(&path).unwrap();
        let read = Index::load(&path).unwrap().unwrap();
        assert_eq!(read.entries(), index.entries());
        assert_eq!(read.seeded_on(), None);
        let db2 = NodeName::new("db2").unwrap();
        let serials: Vec<String> = read
            .node_serials(&db2)
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(serials, ["4a:02", "4a:03"]);
        assert_eq!(read.find(&"4a:04".parse().unwrap()).unwrap().name, "db20");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn seeded_says_so_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("drover-index-s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE);
        Index::seeded(
            "2026-11-28 08:00:00 UTC",
            vec![entry("01", Kind::Node, "n1")],
        )
        .save(&path)
        .unwrap();
        let read = Index::load(&path).unwrap().unwrap();
        assert_eq!(read.seeded_on(), Some("2026-11-28 08:00:00 UTC"));
        assert_eq!(read.entries().len(), 1);
        for garbage in [
            "zz\tnode\tn1\tx",
            "01\tnode\tn1",
            "01\tpet\tn1\tx",
            "01\tnode\t\tx",
            "01\tnode\tn1\tx\textra",
        ] {
            std::fs::write(&path, format!("{HEADER}\n{garbage}\n")).unwrap();
            let err = Index::load(&path).unwrap_err();
            assert!(err.to_string().contains("line 2"), "{garbage:?}: {err}");
        }
        std::fs::write(&path, b"\xff\xfe").unwrap();
        assert!(Index::load(&path).is_err());
        assert_eq!(Index::load(&dir.join("absent")).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
