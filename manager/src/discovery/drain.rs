//! Drained nodes and units: taken out of service (out of `Where` answers
//! and DNS) without being stopped, until undrained (docs/discovery.md).
//!
//! An entry is `(node, unit)`, `unit` empty for the whole node. A node drained
//! as a whole drains every unit on it; undraining one unit of such a node
//! leaves it drained (the node entry still covers it). Draining what is
//! drained and undraining what is not change nothing and are not errors.
//!
//! **Kept across restarts** in one file, `drained.json` in the manager's
//! state directory (`StateDirectory=`, else systemd's `$STATE_DIRECTORY`;
//! without either the entries live in memory only, said at start). Every
//! change is written first (a temporary file in the same directory, fsync,
//! rename over the old one, fsync of the directory) and only then applied:
//! a change that cannot be saved fails and changes nothing, and a crash
//! leaves the old file or the new one, never a mix. Changes are serialized
//! (one writer at a time); readers see the last saved set, never blocked by
//! a write.
//!
//! **Hostile input.** At most [`MAX_ENTRIES`] entries in all and
//! [`MAX_UNITS_PER_CALL`] units per call (more is refused as a whole). A file
//! that cannot be read, is larger than [`MAX_FILE_BYTES`], is not the format,
//! holds an invalid name or more than [`MAX_ENTRIES`] entries is one log line
//! and an empty start, never a crash; a garbage file is moved aside
//! (`drained.json.bad`) so the operator can look at it and the next change
//! does not overwrite it.
//!
//! Which node names may be drained (the ones the manager admits) is the
//! caller's rule (`crate::api::drover_controller`): this store takes any
//! valid name.

use drover_protocol::{NodeName, UnitName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The file's name in the state directory.
pub const FILE_NAME: &str = "drained.json";
/// Most entries (nodes and units) drained at once.
pub const MAX_ENTRIES: usize = 16_384;
/// Most units one `Drain` or `Undrain` names.
pub const MAX_UNITS_PER_CALL: usize = 1024;
/// Largest file read at start: [`MAX_ENTRIES`] of the longest names with
/// their JSON quoting fit well within it.
pub const MAX_FILE_BYTES: u64 = 8 << 20;
/// The file's format number.
const FORMAT: u32 = 1;

/// The set: `(node, unit)`, `""` for the whole node.
type Entries = BTreeSet<(String, String)>;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    /// `(node, unit)`, `unit` `""` for the whole node.
    drained: Vec<(NodeName, String)>,
}

/// Why a change was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DrainError {
    /// Over [`MAX_ENTRIES`] or [`MAX_UNITS_PER_CALL`].
    #[error("{0}")]
    Limits(String),
    /// The state file could not be written.
    #[error("{0}")]
    Save(String),
}

/// The drained set at one moment ([`Drained::snapshot`]).
pub struct Snapshot(Arc<Entries>);

impl Snapshot {
    /// Whether `unit` on `node` is out of service: the node or the unit is
    /// drained. Costs nothing while nothing is drained.
    pub fn is_drained(&self, node: &str, unit: &str) -> bool {
        !self.0.is_empty()
            && (self.0.contains(&(node.to_owned(), String::new()))
                || self.0.contains(&(node.to_owned(), unit.to_owned())))
    }
}

/// See the module docs.
pub struct Drained {
    /// `None`: in memory only.
    file: Option<PathBuf>,
    entries: RwLock<Arc<Entries>>,
    writer: tokio::sync::Mutex<()>,
}

impl Drained {
    /// Nothing drained, nothing kept (tests; a manager without a state
    /// directory).
    pub fn in_memory() -> Self {
        Self {
            file: None,
            entries: RwLock::new(Arc::new(Entries::new())),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    /// The entries saved in `dir` (see the module docs for what a bad file
    /// does); `None`: in memory only. Logs what it found.
    pub fn load(dir: Option<&Path>) -> Self {
        let Some(dir) = dir else {
            tracing::warn!(
                "no state directory (StateDirectory= unset, no $STATE_DIRECTORY): drained \
                 nodes and units are kept in memory only and forgotten at a restart"
            );
            return Self::in_memory();
        };
        let file = dir.join(FILE_NAME);
        let entries = match read(&file) {
            Ok(None) => Entries::new(),
            Ok(Some(entries)) => {
                tracing::info!(
                    "{} drained nodes and units loaded from {}",
                    entries.len(),
                    file.display()
                );
                entries
            }
            Err(Bad::Unreadable(why)) => {
                tracing::error!(
                    "cannot read {}: {why}; starting with nothing drained",
                    file.display()
                );
                Entries::new()
            }
            Err(Bad::Garbage(why)) => {
                let aside = file.with_extension("json.bad");
                let kept = match std::fs::rename(&file, &aside) {
                    Ok(()) => format!("moved to {}", aside.display()),
                    Err(e) => format!("could not be moved aside: {e}"),
                };
                tracing::error!(
                    "{} is not a drained-state file ({why}); starting with nothing drained \
                     (the file {kept})",
                    file.display()
                );
                Entries::new()
            }
        };
        Self {
            file: Some(file),
            entries: RwLock::new(Arc::new(entries)),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    /// The state file, if the entries are kept.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    fn current(&self) -> Arc<Entries> {
        // Only whole-Arc swaps happen under the lock: a poisoned lock
        // still holds a consistent set.
        self.entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every entry, sorted: `(node, unit)`, `""` for the whole node.
    pub fn list(&self) -> Vec<(String, String)> {
        self.current().iter().cloned().collect()
    }

    /// Whether `node` is drained as a whole.
    pub fn node_drained(&self, node: &str) -> bool {
        self.current().contains(&(node.to_owned(), String::new()))
    }

    /// The set as it is now, for many lookups without the lock
    /// ([`Snapshot::is_drained`]).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.current())
    }

    /// Whether `unit` on `node` is out of service: the node or the unit is
    /// drained.
    pub fn is_drained(&self, node: &str, unit: &str) -> bool {
        let entries = self.current();
        entries.contains(&(node.to_owned(), String::new()))
            || entries.contains(&(node.to_owned(), unit.to_owned()))
    }

    /// Drains `units` on `node`, or the whole node when `units` is empty;
    /// returns how many entries are new.
    pub async fn drain(&self, node: &NodeName, units: &[UnitName]) -> Result<usize, DrainError> {
        per_call(units)?;
        self.change(|set| {
            let before = set.len();
            for key in keys(node, units) {
                set.insert(key);
            }
            if set.len() > MAX_ENTRIES {
                return Err(DrainError::Limits(format!(
                    "at most {MAX_ENTRIES} nodes and units may be drained at once; this would \
                     make {}",
                    set.len()
                )));
            }
            Ok(set.len() - before)
        })
        .await
    }

    /// Undrains `units` on `node`, or everything drained on it (the node
    /// and its units) when `units` is empty; returns how many entries went.
    pub async fn undrain(&self, node: &NodeName, units: &[UnitName]) -> Result<usize, DrainError> {
        per_call(units)?;
        self.change(|set| {
            let before = set.len();
            if units.is_empty() {
                set.retain(|(n, _)| n != node.as_str());
            } else {
                for key in keys(node, units) {
                    set.remove(&key);
                }
            }
            Ok(before - set.len())
        })
        .await
    }

    /// Applies `edit` to a copy, saves the copy when it differs, then makes
    /// it current; on any error nothing changed.
    async fn change(
        &self,
        edit: impl FnOnce(&mut Entries) -> Result<usize, DrainError>,
    ) -> Result<usize, DrainError> {
        let _writer = self.writer.lock().await;
        let old = self.current();
        let mut new = (*old).clone();
        let n = edit(&mut new)?;
        if new == *old {
            return Ok(n);
        }
        let new = Arc::new(new);
        if let Some(file) = &self.file {
            let file = file.clone();
            let saved = new.clone();
            tokio::task::spawn_blocking(move || write(&file, &saved))
                .await
                .map_err(|e| DrainError::Save(format!("saving the drained state: {e}")))??;
        }
        *self.entries.write().unwrap_or_else(|p| p.into_inner()) = new;
        Ok(n)
    }
}

fn per_call(units: &[UnitName]) -> Result<(), DrainError> {
    if units.len() > MAX_UNITS_PER_CALL {
        return Err(DrainError::Limits(format!(
            "{} units in one call; at most {MAX_UNITS_PER_CALL}",
            units.len()
        )));
    }
    Ok(())
}

fn keys<'a>(
    node: &'a NodeName,
    units: &'a [UnitName],
) -> Box<dyn Iterator<Item = (String, String)> + 'a> {
    if units.is_empty() {
        Box::new(std::iter::once((node.as_str().to_owned(), String::new())))
    } else {
        Box::new(
            units
                .iter()
                .map(|u| (node.as_str().to_owned(), u.as_str().to_owned())),
        )
    }
}

/// Why a file was not used.
#[derive(Debug)]
enum Bad {
    /// It could not be opened or read (permissions, an I/O error).
    Unreadable(String),
    /// It was read and is not a drained-state file.
    Garbage(String),
}

/// The entries in `file`; `None` when there is no file.
fn read(file: &Path) -> Result<Option<Entries>, Bad> {
    let f = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Bad::Unreadable(e.to_string())),
    };
    let mut text = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| Bad::Unreadable(e.to_string()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(Bad::Garbage(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    parse(&text).map(Some).map_err(Bad::Garbage)
}

/// The entries of a file's text.
fn parse(text: &[u8]) -> Result<Entries, String> {
    let file: File = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    if file.format != FORMAT {
        return Err(format!(
            "format {} (this manager reads {FORMAT})",
            file.format
        ));
    }
    if file.drained.len() > MAX_ENTRIES {
        return Err(format!(
            "{} entries, at most {MAX_ENTRIES}",
            file.drained.len()
        ));
    }
    let mut entries = Entries::new();
    for (node, unit) in file.drained {
        if !unit.is_empty() {
            UnitName::new(unit.as_str()).map_err(|e| e.to_string())?;
        }
        entries.insert((node.as_str().to_owned(), unit));
    }
    Ok(entries)
}

/// The text of a file holding `entries`.
fn render(entries: &Entries) -> Result<Vec<u8>, String> {
    let drained = entries
        .iter()
        .map(|(n, u)| NodeName::new(n.as_str()).map(|n| (n, u.clone())))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut text = serde_json::to_vec_pretty(&File {
        format: FORMAT,
        drained,
    })
    .map_err(|e| e.to_string())?;
    text.push(b'\n');
    Ok(text)
}

/// Replaces `file` with `entries` atomically (see the module docs).
fn write(file: &Path, entries: &Entries) -> Result<(), DrainError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        DrainError::Save(format!(
            "cannot save the drained state to {}: {what}: {e}",
            file.display()
        ))
    };
    let text = render(entries).map_err(|e| fail("encoding", &e))?;
    let dir = file
        .parent()
        .ok_or_else(|| fail("its directory", &"the path has none"))?;
    std::fs::create_dir_all(dir).map_err(|e| fail("creating its directory", &e))?;
    let tmp = file.with_extension("json.tmp");
    let result = (|| {
        let mut f =
            std::fs::File::create(&tmp).map_err(|e| fail("creating a temporary file", &e))?;
        f.write_all(&text)
            .map_err(|e| fail("writing a temporary file", &e))?;
        f.sync_all()
            .map_err(|e| fail("syncing a temporary file", &e))?;
        std::fs::rename(&tmp, file).map_err(|e| fail("replacing the file", &e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail("syncing its directory", &e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(s: &str) -> NodeName {
        NodeName::new(s).unwrap()
    }

    fn units(list: &[&str]) -> Vec<UnitName> {
        list.iter().map(|u| UnitName::new(*u).unwrap()).collect()
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "drover-drain-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn node_and_units_drain_and_undrain() {
        let d = Drained::in_memory();
        assert_eq!(d.drain(&node("a"), &[]).await, Ok(1));
        assert_eq!(d.drain(&node("a"), &[]).await, Ok(0), "idempotent");
        assert_eq!(
            d.drain(&node("b"), &units(&["web.service", "db.service"]))
                .await,
            Ok(2)
        );
        assert!(d.node_drained("a"));
        assert!(d.is_drained("a", "anything.service"));
        assert!(d.is_drained("b", "web.service"));
        assert!(!d.is_drained("b", "other.service"));
        assert!(!d.node_drained("b"));
        assert_eq!(
            d.list(),
            vec![
                ("a".into(), "".into()),
                ("b".into(), "db.service".into()),
                ("b".into(), "web.service".into())
            ]
        );
        // A unit of a node drained as a whole stays drained.
        d.drain(&node("a"), &units(&["x.service"])).await.unwrap();
        assert_eq!(d.undrain(&node("a"), &units(&["x.service"])).await, Ok(1));
        assert!(d.is_drained("a", "x.service"));
        assert_eq!(d.undrain(&node("b"), &units(&["web.service"])).await, Ok(1));
        assert!(!d.is_drained("b", "web.service"));
        assert_eq!(d.undrain(&node("b"), &units(&["web.service"])).await, Ok(0));
        // Empty = everything on the node.
        d.drain(&node("a"), &units(&["y.service"])).await.unwrap();
        assert_eq!(d.undrain(&node("a"), &[]).await, Ok(2));
        assert_eq!(d.list(), vec![("b".into(), "db.service".into())]);
    }

    #[tokio::test]
    async fn caps_refuse_the_whole_call() {
        let d = Drained::in_memory();
        let many: Vec<UnitName> = (0..=MAX_UNITS_PER_CALL)
            .map(|i| UnitName::new(format!("u{i}.service")).unwrap())
            .collect();
        assert!(matches!(
            d.drain(&node("a"), &many).await,
            Err(DrainError::Limits(_))
        ));
        assert!(d.list().is_empty());
        let full: Vec<UnitName> = many[..MAX_UNITS_PER_CALL].to_vec();
        for i in 0..MAX_ENTRIES / MAX_UNITS_PER_CALL {
            d.drain(&node(&format!("n{i}")), &full).await.unwrap();
        }
        assert_eq!(d.list().len(), MAX_ENTRIES);
        let e = d.drain(&node("one-more"), &[]).await.unwrap_err();
        assert!(matches!(e, DrainError::Limits(_)), "{e:?}");
        assert_eq!(d.list().len(), MAX_ENTRIES, "nothing changed");
        // What is drained already can be drained again at the cap.
        assert_eq!(d.drain(&node("n0"), &full[..1]).await, Ok(0));
    }

    #[tokio::test]
    async fn saved_and_loaded_again() {
        let dir = Dir(tempdir());
        let d = Drained::load(Some(&dir.0));
        d.drain(&node("a"), &[]).await.unwrap();
        d.drain(&node("b"), &units(&["web.service"])).await.unwrap();
        let again = Drained::load(Some(&dir.0));
        assert_eq!(again.list(), d.list());
        again.undrain(&node("a"), &[]).await.unwrap();
        assert_eq!(
            Drained::load(Some(&dir.0)).list(),
            vec![("b".into(), "web.service".into())]
        );
        assert!(!dir.0.join("drained.json.tmp").exists());
    }

    #[tokio::test]
    async fn garbage_files_start_empty_and_are_kept_aside() {
        let long_unit = format!("{}.service", "u".repeat(300));
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"not json".to_vec(),
            b"{\"format\":1}".to_vec(),
            b"{\"format\":2,\"drained\":[]}".to_vec(),
            b"{\"format\":1,\"drained\":[[\"bad_node\",\"\"]]}".to_vec(),
            b"{\"format\":1,\"drained\":[[\"a\",\"web\"]]}".to_vec(),
            format!("{{\"format\":1,\"drained\":[[\"a\",\"{long_unit}\"]]}}").into_bytes(),
            b"{\"format\":1,\"drained\":[],\"x\":1}".to_vec(),
            vec![0xff, 0xfe, 0],
            vec![b' '; (MAX_FILE_BYTES + 1) as usize],
        ];
        for text in cases {
            let dir = Dir(tempdir());
            std::fs::write(dir.0.join(FILE_NAME), &text).unwrap();
            let d = Drained::load(Some(&dir.0));
            assert!(d.list().is_empty());
            assert_eq!(
                std::fs::read(dir.0.join("drained.json.bad")).unwrap(),
                text,
                "kept aside"
            );
            // A change then writes a good file.
            d.drain(&node("a"), &[]).await.unwrap();
            assert_eq!(Drained::load(Some(&dir.0)).list(), d.list());
        }
        // Too many entries.
        let entries: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("[\"n{i}\",\"\"]"))
            .collect();
        let text = format!("{{\"format\":1,\"drained\":[{}]}}", entries.join(","));
        assert!(parse(text.as_bytes()).unwrap_err().contains("at most"));
    }

    #[tokio::test]
    async fn unreadable_file_starts_empty_and_a_failed_save_changes_nothing() {
        let dir = Dir(tempdir());
        // A directory where the file should be: it cannot be read, nor
        // replaced by a rename.
        std::fs::create_dir(dir.0.join(FILE_NAME)).unwrap();
        let d = Drained::load(Some(&dir.0));
        assert!(d.list().is_empty());
        let e = d.drain(&node("a"), &[]).await.unwrap_err();
        assert!(matches!(e, DrainError::Save(_)), "{e:?}");
        assert!(d.list().is_empty(), "nothing changed");
        assert!(!d.is_drained("a", "web.service"));
    }
}
