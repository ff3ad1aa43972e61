//! systemd's bus label escaping, the rule behind every object path that names
//! something: systemd's unit paths (`/org/freedesktop/systemd1/unit/db_2eservice`)
//! and BlueChi's node paths (`/org/eclipse/bluechi/node/node_2dbar`), which
//! clients such as `bluechictl` build themselves.
//!
//! Every byte that is not an ASCII letter, and a digit in first position,
//! becomes `_` followed by two lowercase hex digits; the empty string becomes
//! `_`. The result is always a valid object path element, whatever the input,
//! and [`bus_label_unescape`] gives the input back.

/// systemd's `bus_label_escape`.
pub fn bus_label_escape(s: &str) -> String {
    if s.is_empty() {
        return "_".to_owned();
    }
    let mut out = String::with_capacity(s.len() * 3);
    for (i, b) in s.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
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
        assert_eq!(bus_label_escape("A_Z"), "A_5fZ");
        // Non-ASCII is escaped byte by byte, lowercase hex.
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
}
