//! Object paths of nodes and jobs.
//!
//! Node paths use systemd's bus path escaping (the rule BlueChi and
//! `bluechictl` use to build node paths themselves): every byte that is not
//! an ASCII letter, and a digit in first position, becomes `_` followed by two
//! lowercase hex digits; the empty string becomes `_`. The result is always a
//! valid object path element, whatever the input.

use zbus::OwnedObjectPath;

pub const CONTROLLER_PATH: &str = "/org/eclipse/bluechi";
pub const NODE_PATH_PREFIX: &str = "/org/eclipse/bluechi/node";
pub const JOB_PATH_PREFIX: &str = "/org/eclipse/bluechi/job";

/// systemd's `bus_label_escape`.
pub fn bus_label_escape(s: &str) -> String {
    if s.is_empty() {
        return "_".to_owned();
    }
    let mut out = String::with_capacity(s.len() * 3);
    for (i, b) in s.bytes().enumerate() {
        let plain = b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit());
        if plain {
            out.push(char::from(b));
        } else {
            out.push('_');
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// The inverse of [`bus_label_escape`]; `None` for text that no escaping produces.
pub fn bus_label_unescape(s: &str) -> Option<String> {
    if s == "_" {
        return Some(String::new());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'_' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn path(s: String) -> OwnedObjectPath {
    // Escaped labels and decimal ids only contain [A-Za-z0-9_], so the path is
    // valid by construction.
    OwnedObjectPath::try_from(s).expect("escaped object path is valid")
}

/// `/org/eclipse/bluechi/node/<escaped name>`.
pub fn node_path(name: &str) -> OwnedObjectPath {
    path(format!("{NODE_PATH_PREFIX}/{}", bus_label_escape(name)))
}

/// `/org/eclipse/bluechi/job/<id>`.
pub fn job_path(id: u32) -> OwnedObjectPath {
    path(format!("{JOB_PATH_PREFIX}/{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_systemd() {
        assert_eq!(bus_label_escape("node-bar"), "node_2dbar");
        assert_eq!(bus_label_escape(""), "_");
        assert_eq!(bus_label_escape("node1"), "node1");
        assert_eq!(bus_label_escape("9lives"), "_39lives");
        assert_eq!(bus_label_escape("a.b_c"), "a_2eb_5fc");
        assert_eq!(bus_label_escape("é"), "_c3_a9");
    }

    #[test]
    fn unescape_round_trips() {
        for s in ["", "node-bar", "9lives", "host.example.com", "a_b", "é"] {
            assert_eq!(bus_label_unescape(&bus_label_escape(s)).as_deref(), Some(s));
        }
        assert_eq!(bus_label_unescape("_zz"), None);
        assert_eq!(bus_label_unescape("_2"), None);
    }

    #[test]
    fn paths() {
        assert_eq!(
            node_path("node-bar").as_str(),
            "/org/eclipse/bluechi/node/node_2dbar"
        );
        assert_eq!(job_path(17).as_str(), "/org/eclipse/bluechi/job/17");
        // Anything, even bytes a node name can never have, gives a valid path.
        assert!(node_path("a/b c\0").as_str().starts_with(NODE_PATH_PREFIX));
    }
}
