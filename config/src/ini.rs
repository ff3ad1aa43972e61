//! systemd-style INI, the syntax of drover's (and BlueChi's) config files.
//!
//! Accepted:
//! * `[section]` headers; the name is trimmed and may contain spaces (`[node foo]`);
//! * `Key=Value`, whitespace around key and value trimmed; a value may be empty;
//! * `#` and `;` comment lines, blank lines. Only whole lines are comments, as
//!   in systemd: `Key=2000 # ms` has the value `2000 # ms`, which the typed
//!   loaders then refuse, saying that comments must be on their own line;
//! * a value continues on the following lines that begin with whitespace: each
//!   continuation line is trimmed and appended to the value as is, without a
//!   separator (inih/BlueChi behaviour, so `AllowedNodeNames=a,` + `  b` is `a,b`).
//!   Continuation is only possible directly after a key line or another
//!   continuation line; an indented line elsewhere is an ordinary line, and an
//!   indented comment is a comment.
//!
//! Rejected, each with the file and the 1-based line: a key line outside any
//! section, a line without `=`, an empty key, an unterminated `[`, anything after
//! `]`, an empty section name, a line longer than [`MAX_LINE`] characters,
//! a file that is not UTF-8 or is larger than [`MAX_FILE`] bytes.
//!
//! The parser knows nothing about section or key names: the typed loaders in
//! [`crate::manager`] and [`crate::agent`] decide what is known. A key given
//! twice in one file yields two entries; the loaders apply them in order, so
//! the last one wins, as in systemd.

use crate::ConfigError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Longest accepted line, in characters (without the line break).
pub const MAX_LINE: usize = 500;

/// Largest accepted file, in bytes. Config files are a few kilobytes; the cap
/// keeps a mistaken `-c /dev/zero` from eating memory.
pub const MAX_FILE: u64 = 1024 * 1024;

/// One `Key=Value`, with the line of the key (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    /// Trimmed value with continuation lines appended.
    pub value: String,
    pub line: usize,
}

/// One `[name]` block. A section header that appears twice yields two
/// `Section`s, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Trimmed text between `[` and `]`.
    pub name: String,
    /// Line of the header.
    pub line: usize,
    pub entries: Vec<Entry>,
}

/// One parsed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where the text came from; used in every error message.
    pub path: PathBuf,
    pub sections: Vec<Section>,
}

/// Parses `text`; `path` only names the source in errors.
pub fn parse(path: &Path, text: &str) -> Result<Document, ConfigError> {
    let syntax = |line: usize, message: String| ConfigError::Syntax {
        path: path.to_path_buf(),
        line,
        message,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut sections: Vec<Section> = Vec::new();
    // True while the previous line was a key line or a continuation of one,
    // i.e. while an indented line continues a value.
    let mut in_value = false;

    for (idx, raw) in text.split('\n').enumerate() {
        let line_no = idx + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let chars = raw.chars().count();
        if chars > MAX_LINE {
            return Err(syntax(
                line_no,
                format!("line is {chars} characters long, at most {MAX_LINE} are allowed"),
            ));
        }
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            in_value = false;
            continue;
        }
        let indented = raw.starts_with(char::is_whitespace);
        if indented && in_value {
            // `in_value` implies a section with at least one entry.
            if let Some(entry) = sections.last_mut().and_then(|s| s.entries.last_mut()) {
                entry.value.push_str(trimmed);
                continue;
            }
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            in_value = false;
            let Some((name, after)) = rest.split_once(']') else {
                return Err(syntax(
                    line_no,
                    format!("unterminated section header '{trimmed}'"),
                ));
            };
            if !after.trim().is_empty() {
                return Err(syntax(
                    line_no,
                    format!("unexpected text '{}' after section header", after.trim()),
                ));
            }
            let name = name.trim();
            if name.is_empty() {
                return Err(syntax(line_no, "empty section name".into()));
            }
            sections.push(Section {
                name: name.to_string(),
                line: line_no,
                entries: Vec::new(),
            });
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(syntax(
                line_no,
                format!("expected 'Key=Value', '[section]' or a comment, found '{trimmed}'"),
            ));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(syntax(line_no, "empty key before '='".into()));
        }
        let Some(section) = sections.last_mut() else {
            return Err(syntax(
                line_no,
                format!("key '{key}' outside any section (add a [section] header above it)"),
            ));
        };
        section.entries.push(Entry {
            key: key.to_string(),
            value: value.trim().to_string(),
            line: line_no,
        });
        in_value = true;
    }
    Ok(Document {
        path: path.to_path_buf(),
        sections,
    })
}

/// Parses raw bytes: non-UTF-8 input is an error naming the line it is on.
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Document, ConfigError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse(path, text),
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
            Err(ConfigError::Syntax {
                path: path.to_path_buf(),
                line,
                message: "not valid UTF-8".into(),
            })
        }
    }
}

/// Reads and parses `path`. With `missing_ok`, a file that does not exist
/// gives `Ok(None)`; any other read failure is an error.
pub fn read_file(path: &Path, missing_ok: bool) -> Result<Option<Document>, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_FILE} bytes"),
        )));
    }
    parse_bytes(path, &bytes).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Document, ConfigError> {
        parse(Path::new("t.conf"), text)
    }

    /// The `(file, line)` of a syntax error, or a panic naming what came instead.
    fn syntax_at(r: Result<Document, ConfigError>) -> (String, usize, String) {
        match r {
            Err(ConfigError::Syntax {
                path,
                line,
                message,
            }) => (path.display().to_string(), line, message),
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn sections_keys_comments() {
        let d = p(
            "# top comment\n; another\n\n[a]\n Key = Value with spaces \nEmpty=\n\
                   [node foo bar]\nx=1=2\n",
        )
        .unwrap();
        assert_eq!(d.sections.len(), 2);
        assert_eq!(d.sections[0].name, "a");
        assert_eq!(d.sections[0].line, 4);
        assert_eq!(
            d.sections[0].entries,
            vec![
                Entry {
                    key: "Key".into(),
                    value: "Value with spaces".into(),
                    line: 5
                },
                Entry {
                    key: "Empty".into(),
                    value: "".into(),
                    line: 6
                },
            ]
        );
        assert_eq!(d.sections[1].name, "node foo bar");
        // Only the first '=' separates key and value.
        assert_eq!(d.sections[1].entries[0].value, "1=2");
        assert_eq!(d.sections[1].entries[0].line, 8);
    }

    #[test]
    fn continuation_lines_are_concatenated() {
        let d = p("[s]\nNames=a,\n  b,\n\tc\nNext=x\n").unwrap();
        let e = &d.sections[0].entries;
        assert_eq!(e[0].value, "a,b,c");
        assert_eq!(e[0].line, 2);
        assert_eq!(e[1].key, "Next");
        assert_eq!(e[1].line, 5);
    }

    #[test]
    fn blank_line_or_comment_ends_a_value() {
        // After a blank line an indented key is an ordinary line again.
        let d = p("[s]\nA=1\n\n  B=2\n# c\n  C=3\n").unwrap();
        let keys: Vec<_> = d.sections[0].entries.iter().map(|e| &e.key).collect();
        assert_eq!(keys, ["A", "B", "C"]);
        assert_eq!(d.sections[0].entries[0].value, "1");
        // An indented comment right after a value is a comment, not text.
        let d = p("[s]\nA=1\n  # not part of A\n").unwrap();
        assert_eq!(d.sections[0].entries[0].value, "1");
    }

    #[test]
    fn crlf_and_bom() {
        let d = p("\u{feff}[s]\r\nA=1\r\n").unwrap();
        assert_eq!(d.sections[0].name, "s");
        assert_eq!(d.sections[0].entries[0].value, "1");
    }

    #[test]
    fn errors_name_file_and_line() {
        let (file, line, msg) = syntax_at(p("# c\nA=1\n"));
        assert_eq!((file.as_str(), line), ("t.conf", 2));
        assert!(msg.contains("outside any section"), "{msg}");

        let (_, line, msg) = syntax_at(p("[s]\nA=1\njust words\n"));
        assert_eq!(line, 3);
        assert!(msg.contains("just words"), "{msg}");

        let (_, line, msg) = syntax_at(p("[s]\n[broken\n"));
        assert_eq!(line, 2);
        assert!(msg.contains("unterminated"), "{msg}");

        let (_, line, _) = syntax_at(p("[s] trailing\n"));
        assert_eq!(line, 1);
        let (_, line, _) = syntax_at(p("[ ]\n"));
        assert_eq!(line, 1);
        let (_, line, _) = syntax_at(p("[s]\n = v\n"));
        assert_eq!(line, 2);
        // A continuation line with nothing to continue is parsed as a line.
        let (_, line, _) = syntax_at(p("[s]\n  orphan\n"));
        assert_eq!(line, 2);
    }

    #[test]
    fn line_length_limit() {
        let ok = format!("[s]\nK={}\n", "x".repeat(MAX_LINE - 2));
        assert!(p(&ok).is_ok());
        let long = format!("[s]\nK={}\n", "x".repeat(MAX_LINE - 1));
        let (_, line, msg) = syntax_at(p(&long));
        assert_eq!(line, 2);
        assert!(msg.contains("501"), "{msg}");
        // The limit counts characters, not bytes.
        let wide = format!("[s]\nK={}\n", "é".repeat(MAX_LINE - 2));
        assert!(p(&wide).is_ok());
    }

    #[test]
    fn non_utf8_names_its_line() {
        let (_, line, msg) = syntax_at(parse_bytes(Path::new("t.conf"), b"[s]\nA=1\nB=\xff\xfe\n"));
        assert_eq!(line, 3);
        assert!(msg.contains("UTF-8"));
    }

    #[test]
    fn read_file_missing_and_present() {
        let dir = crate::test_util::TempDir::new("ini");
        let missing = dir.path().join("nope.conf");
        assert!(read_file(&missing, true).unwrap().is_none());
        assert!(matches!(
            read_file(&missing, false),
            Err(ConfigError::Read { .. })
        ));
        let f = dir.path().join("a.conf");
        std::fs::write(&f, "[s]\nA=1\n").unwrap();
        let d = read_file(&f, false).unwrap().unwrap();
        assert_eq!(d.path, f);
        assert_eq!(d.sections[0].entries[0].value, "1");
        std::fs::write(&f, vec![b'#'; MAX_FILE as usize + 1]).unwrap();
        let err = read_file(&f, false).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }
}
