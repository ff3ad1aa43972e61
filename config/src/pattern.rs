//! Node-name patterns: the entries of `AllowedNodeNames` that admit a family
//! of nodes (`edge-*`, `lab-??`, `rack[0-9]-*`) instead of one name.
//!
//! Syntax (shell globs, matched against the whole name, case-sensitive):
//! * `*` any run of characters (also none), `?` one character,
//!   `[abc]` / `[a-z]` one of a set, `[!abc]` one character not in it;
//! * every other character is a literal and must be a node-name character
//!   (ASCII letter, digit, `-`, `.`), so a pattern can only describe valid
//!   names; a literal first character must be a letter or digit;
//! * `**` is refused (it means nothing more than `*` here, and in path globs it
//!   means something else); an unclosed or empty `[` set is refused;
//! * an entry without `*`, `?` or `[` is a plain node name, not a pattern.
//!
//! Invariant: a [`NodePattern`] passed these checks, and [`NodePattern::matches`]
//! agrees with `glob::Pattern`, which does the matching (node names hold no
//! `/`, so its path rules never apply).

use drover_protocol::NodeName;
use std::fmt;

/// Longest accepted pattern: a `[a-z]` set spends five bytes on one name
/// character, so patterns may be longer than names, but not without bound.
pub const PATTERN_MAX: usize = 255;

/// Whether `s` is meant as a pattern (holds a glob metacharacter).
pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A validated node-name pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePattern {
    text: String,
    glob: glob::Pattern,
}

impl NodePattern {
    /// Checks `s` against the module's syntax; the error says what is wrong
    /// (the caller adds the file, line and key).
    pub fn new(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty pattern".into());
        }
        if s.len() > PATTERN_MAX {
            return Err(format!(
                "pattern '{}…' is longer than {PATTERN_MAX} bytes",
                s.chars().take(32).collect::<String>()
            ));
        }
        if !is_pattern(s) {
            return Err(format!(
                "'{s}' has no '*', '?' or '[', so it is a node name, not a pattern"
            ));
        }
        let bad = |why: &str| Err(format!("invalid node-name pattern '{s}': {why}"));
        if s.contains("**") {
            return bad("write '*' instead of '**'");
        }
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        let mut chars = s.chars().peekable();
        let mut first = true;
        while let Some(c) = chars.next() {
            match c {
                '*' | '?' => {}
                '[' => {
                    if chars.peek() == Some(&'!') {
                        chars.next();
                    }
                    let mut members = 0;
                    loop {
                        match chars.next() {
                            None => return bad("'[' without its ']'"),
                            Some(']') if members == 0 => {
                                return bad("empty set '[]'");
                            }
                            Some(']') => break,
                            Some(m) if name_char(m) => members += 1,
                            Some(m) => {
                                return bad(&format!(
                                    "'{}' inside [...]: sets hold node-name characters \
                                     (ASCII letters, digits, '-', '.') and ranges like a-z",
                                    m.escape_default()
                                ));
                            }
                        }
                    }
                }
                c if name_char(c) => {
                    if first && !c.is_ascii_alphanumeric() {
                        return bad("a node name starts with a letter or digit");
                    }
                }
                c => {
                    return bad(&format!(
                        "'{}' is neither a node-name character (ASCII letter, digit, '-', '.') \
                         nor a pattern character ('*', '?', '[...]')",
                        c.escape_default()
                    ));
                }
            }
            first = false;
        }
        let glob = glob::Pattern::new(s).map_err(|e| format!("invalid pattern '{s}': {e}"))?;
        Ok(Self {
            text: s.to_owned(),
            glob,
        })
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &NodeName) -> bool {
        self.glob.matches(name.as_str())
    }

    /// Whether the pattern admits every name (`*`).
    pub fn matches_all(&self) -> bool {
        self.text == "*"
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for NodePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> NodePattern {
        NodePattern::new(s).unwrap()
    }

    fn m(pattern: &str, name: &str) -> bool {
        p(pattern).matches(&NodeName::new(name).unwrap())
    }

    #[test]
    fn matching() {
        assert!(m("edge-*", "edge-1"));
        assert!(m("edge-*", "edge-"));
        assert!(m("edge-*", "edge-eu.rack-7"));
        assert!(!m("edge-*", "edge"));
        assert!(!m("edge-*", "xedge-1"));
        assert!(!m("edge-*", "Edge-1"), "case-sensitive like node names");
        assert!(m("lab-??", "lab-01"));
        assert!(!m("lab-??", "lab-1"));
        assert!(!m("lab-??", "lab-001"));
        assert!(m("rack[0-9]-*", "rack3-a"));
        assert!(!m("rack[0-9]-*", "racka-a"));
        assert!(m("n[!x]", "ny"));
        assert!(!m("n[!x]", "nx"));
        assert!(m("*.prod", "db.prod"));
        assert!(m("*", "anything-at.all"));
        assert!(p("*").matches_all());
        assert!(!p("a*").matches_all());
        assert_eq!(p("edge-*").to_string(), "edge-*");
    }

    #[test]
    fn garbage_is_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("edge", "not a pattern"),
            ("edge_*", "'_'"),
            ("edge *", "' '"),
            ("edge/*", "'/'"),
            ("-edge*", "starts with a letter or digit"),
            (".*", "starts with a letter or digit"),
            ("edge-**", "'**'"),
            ("rack[0-9", "without its ']'"),
            ("rack[", "without its ']'"),
            ("rack[]*", "empty set"),
            ("rack[_]*", "inside [...]"),
            ("é*", "neither"),
            ("a*\u{7}", "neither"),
        ];
        for (pattern, want) in cases {
            let err = NodePattern::new(pattern).unwrap_err();
            assert!(err.contains(want), "{pattern:?}: {err}");
        }
        let long = format!("a*{}", "b".repeat(PATTERN_MAX));
        assert!(NodePattern::new(&long).unwrap_err().contains("longer than"));
        // A leading wildcard or set is fine: only a literal first character
        // must start a name.
        p("?dge");
        p("[-a]*");
        p("*-edge");
    }

    #[test]
    fn is_pattern_marks_the_metacharacters() {
        assert!(is_pattern("a*") && is_pattern("a?") && is_pattern("a[b]"));
        assert!(!is_pattern("node-1.example"));
    }
}
