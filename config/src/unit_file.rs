//! The `[X-Drover]` section of systemd unit files, read by systemd's rules
//! (`systemd.syntax(7)`), which differ from drover's own config files
//! ([`crate::ini`]):
//!
//! * a line ending in `\` continues on the next one (the backslash becomes a
//!   space); comment lines inside a continued value are skipped, as systemd
//!   does; an indented line is an ordinary line, not a continuation;
//! * `#` and `;` start a comment line; whitespace around keys and values is
//!   trimmed;
//! * every other section is skipped without a look at its lines (they are
//!   systemd's, and systemd has read them already).
//!
//! A unit's settings are its fragment and then its drop-ins, in the order
//! systemd applies them (`FragmentPath`, then `DropInPaths`); every file yields
//! its entries with file and line, and the caller applies them in order, so a
//! later assignment wins and an empty one resets ([`crate::health`]).
//!
//! Bounds: a file larger than [`MAX_FILE`] bytes or not UTF-8 is an error
//! (naming the file); a continued value stops growing at [`MAX_VALUE`] bytes
//! (an error naming file and line), so a hostile file cannot make the agent
//! hold more than that.

use std::path::{Path, PathBuf};

/// The section drover reads.
pub const SECTION: &str = "X-Drover";
/// Largest unit file read, in bytes (systemd's own files are a few KiB).
pub const MAX_FILE: u64 = 1024 * 1024;
/// Longest value, continuations included, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;

/// One `Key=Value` of an `[X-Drover]` section, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEntry {
    pub path: PathBuf,
    /// 1-based line of the key.
    pub line: usize,
    pub key: String,
    pub value: String,
}

impl UnitEntry {
    /// `FILE:LINE: key 'KEY': MESSAGE`, the form of every error about an entry.
    pub fn error(&self, message: impl std::fmt::Display) -> String {
        format!(
            "{}:{}: key '{}': {message}",
            self.path.display(),
            self.line,
            self.key
        )
    }
}

/// The `[X-Drover]` entries of `text` (the contents of `path`), in order.
/// A syntax error names the file and line.
pub fn x_drover_entries(path: &Path, text: &str) -> Result<Vec<UnitEntry>, String> {
    let at = |line: usize, message: &str| format!("{}:{line}: {message}", path.display());
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Cheap way out for the common file without the section.
    if !text.contains(SECTION) {
        return Ok(Vec::new());
    }
    let mut entries = Vec::new();
    let mut in_section = false;
    // A value being continued: (line of its key, text so far).
    let mut pending: Option<(usize, String)> = None;
    for (idx, raw) in text.split('\n').enumerate() {
        let line_no = idx + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = raw.trim();
        if let Some((start, mut joined)) = pending.take() {
            if trimmed.starts_with('#') || trimmed.starts_with(';') {
                pending = Some((start, joined));
                continue;
            }
            let (part, more) = continued(trimmed);
            joined.push(' ');
            joined.push_str(part);
            if joined.len() > MAX_VALUE {
                return Err(at(start, &format!("value longer than {MAX_VALUE} bytes")));
            }
            if more {
                pending = Some((start, joined));
            } else if in_section {
                push_entry(&mut entries, path, start, &joined).map_err(|m| at(start, &m))?;
            }
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(at(line_no, &format!("bad section header '{trimmed}'")));
            };
            in_section = name == SECTION;
            continue;
        }
        let (part, more) = continued(trimmed);
        if more {
            pending = Some((line_no, part.to_owned()));
        } else if in_section {
            push_entry(&mut entries, path, line_no, part).map_err(|m| at(line_no, &m))?;
        }
    }
    if let Some((start, joined)) = pending
        && in_section
    {
        push_entry(&mut entries, path, start, &joined).map_err(|m| at(start, &m))?;
    }
    Ok(entries)
}

/// The line without a final `\`, and whether it had one.
fn continued(line: &str) -> (&str, bool) {
    match line.strip_suffix('\\') {
        Some(part) => (part.trim_end(), true),
        None => (line, false),
    }
}

fn push_entry(
    entries: &mut Vec<UnitEntry>,
    path: &Path,
    line: usize,
    text: &str,
) -> Result<(), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("'{text}' is not Key=Value"));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err("empty key".into());
    }
    entries.push(UnitEntry {
        path: path.to_path_buf(),
        line,
        key: key.to_owned(),
        value: value.trim().to_owned(),
    });
    Ok(())
}

/// Reads `path` (at most [`MAX_FILE`] bytes, UTF-8) and returns its
/// `[X-Drover]` entries; an error names the file.
pub fn read_x_drover(path: &Path) -> Result<Vec<UnitEntry>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("{}: larger than {MAX_FILE} bytes", path.display()));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
    x_drover_entries(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<(usize, String, String)> {
        x_drover_entries(Path::new("/u/db.service"), text)
            .unwrap()
            .into_iter()
            .map(|e| (e.line, e.key, e.value))
            .collect()
    }

    #[test]
    fn only_the_section_is_read_with_lines() {
        let text = "[Unit]\nDescription=db\n\n[Service]\nExecStart=/bin/db\n[X-Drover]\n# a comment\n  HealthTCP = 127.0.0.1:5432  \n;x\nHealthInterval=5s\n[Install]\nHealthCmd=not ours\n";
        assert_eq!(
            entries(text),
            vec![
                (8, "HealthTCP".into(), "127.0.0.1:5432".into()),
                (10, "HealthInterval".into(), "5s".into())
            ]
        );
    }

    #[test]
    fn continuations_join_with_a_space_and_skip_comments() {
        let text = "[X-Drover]\nHealthCmd=/bin/sh -c \\\n# skipped\n   'exit 0'\nHealthRetries=2\n";
        assert_eq!(
            entries(text),
            vec![
                (2, "HealthCmd".into(), "/bin/sh -c 'exit 0'".into()),
                (5, "HealthRetries".into(), "2".into())
            ]
        );
        // A continuation into the next section's lines ends with the file.
        assert_eq!(
            entries("[X-Drover]\nHealthCmd=/bin/true \\"),
            vec![(2, "HealthCmd".into(), "/bin/true".into())]
        );
    }

    #[test]
    fn files_without_the_section_cost_nothing_and_garbage_names_the_line() {
        assert!(entries("[Service]\nExecStart=/bin/x\n").is_empty());
        let err =
            x_drover_entries(Path::new("/u/x.service"), "[X-Drover]\nHealthTCP\n").unwrap_err();
        assert_eq!(err, "/u/x.service:2: 'HealthTCP' is not Key=Value");
        let err = x_drover_entries(Path::new("/u/x.service"), "[X-Drover\nA=b\n").unwrap_err();
        assert!(
            err.starts_with("/u/x.service:1: bad section header"),
            "{err}"
        );
        let err = x_drover_entries(Path::new("/u/x.service"), "[X-Drover]\n=b\n").unwrap_err();
        assert_eq!(err, "/u/x.service:2: empty key");
        let long = format!(
            "[X-Drover]\nHealthCmd=a \\\n{}\\\n{}\n",
            "b".repeat(40_000),
            "c".repeat(40_000)
        );
        let err = x_drover_entries(Path::new("/u/x.service"), &long).unwrap_err();
        assert!(err.contains(":2: value longer than"), "{err}");
    }

    #[test]
    fn entry_errors_name_file_line_and_key() {
        let e = &x_drover_entries(Path::new("/d/50-h.conf"), "[X-Drover]\n\nHealthRetries=x\n")
            .unwrap()[0];
        assert_eq!(
            e.error("'x' is not a number"),
            "/d/50-h.conf:3: key 'HealthRetries': 'x' is not a number"
        );
    }

    #[test]
    fn big_or_binary_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("drover-unit-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.service");
        std::fs::write(&big, vec![b'#'; MAX_FILE as usize + 1]).unwrap();
        assert!(read_x_drover(&big).unwrap_err().contains("larger than"));
        let bin = dir.join("bin.service");
        std::fs::write(&bin, [0xff, 0xfe, b'[']).unwrap();
        assert!(read_x_drover(&bin).unwrap_err().contains("not UTF-8"));
        assert!(read_x_drover(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
