//! Rendering: bluechictl-style text tables, JSON documents, local timestamps.
//!
//! Everything here is pure (strings in, strings out) so the exact output scripts
//! parse is pinned by unit tests. Tables have a header line, a separator line of `=`
//! as long as the padded header, and one line per row; columns are joined by ` | `
//! and trailing blanks are cut, so `split('|')` + trim yields the fields.

use serde::Serialize;

/// How wide a column is.
#[derive(Debug, Clone, Copy)]
pub enum Width {
    /// At least this many characters (bluechictl's fixed widths); longer values widen
    /// their own line only, they are never cut.
    Fixed(usize),
    /// As wide as the widest value in the column (header included).
    Fit,
}

/// Render a table. `rows` must have as many fields as `headers`.
pub fn table(headers: &[(&str, Width)], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, (h, w))| match w {
            Width::Fixed(n) => *n,
            Width::Fit => rows
                .iter()
                .filter_map(|r| r.get(i))
                .map(|v| v.chars().count())
                .chain(std::iter::once(h.chars().count()))
                .max()
                .unwrap_or(0),
        })
        .collect();
    let mut out = table_head(headers.iter().map(|(h, _)| *h), &widths);
    for row in rows {
        push_table_row(&mut out, row.iter().map(String::as_str), &widths);
    }
    out
}

/// Appends `fields` padded to `widths` (in characters) and joined by ` | `,
/// blanks kept; returns how many characters it appended. Written in place:
/// a table of 50,000 rows is built without a string per field.
fn push_padded<'a>(
    out: &mut String,
    fields: impl Iterator<Item = &'a str>,
    widths: &[usize],
) -> usize {
    let mut chars = 0;
    for (i, (f, &w)) in fields.zip(widths).enumerate() {
        if i > 0 {
            out.push_str(" | ");
            chars += 3;
        }
        out.push_str(f);
        let len = f.chars().count();
        let pad = w.saturating_sub(len);
        out.extend(std::iter::repeat_n(' ', pad));
        chars += len + pad;
    }
    chars
}

/// Cuts the blanks at the end of `out` after byte `from` (the line being
/// written).
fn trim_line_end(out: &mut String, from: usize) {
    let kept = from + out[from..].trim_end().len();
    out.truncate(kept);
}

/// A table's header line (trailing blanks cut) and its `=` line, as long as
/// the padded header.
pub fn table_head<'a>(headers: impl Iterator<Item = &'a str>, widths: &[usize]) -> String {
    let mut out = String::new();
    let chars = push_padded(&mut out, headers, widths);
    trim_line_end(&mut out, 0);
    out.push('\n');
    out.extend(std::iter::repeat_n('=', chars));
    out.push('\n');
    out
}

/// One row line of a table, trailing blanks cut, with its newline.
pub fn table_row<'a>(fields: impl Iterator<Item = &'a str>, widths: &[usize]) -> String {
    let mut line = String::new();
    push_table_row(&mut line, fields, widths);
    line
}

/// [`table_row`], appended to `out`.
pub fn push_table_row<'a>(
    out: &mut String,
    fields: impl Iterator<Item = &'a str>,
    widths: &[usize],
) {
    let from = out.len();
    push_padded(out, fields, widths);
    trim_line_end(out, from);
    out.push('\n');
}

/// A table whose every column is as wide as its widest value ([`Width::Fit`]).
pub fn fit_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let headers: Vec<(&str, Width)> = headers.iter().map(|h| (*h, Width::Fit)).collect();
    table(&headers, rows)
}

/// One JSON document, pretty-printed, with a final newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> String {
    // Serializing plain structs of strings and numbers cannot fail.
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".to_owned());
    s.push('\n');
    s
}

/// One JSON Lines record: `v` on one line, with its newline.
pub fn json_line(v: &serde_json::Value) -> String {
    let mut s = v.to_string();
    s.push('\n');
    s
}

/// `YYYY-MM-DD HH:MM:SS` in the local time zone for a realtime timestamp in µs
/// (the unit of BlueChi's `LastSeenTimestamp`). Falls back to UTC-less seconds if
/// the C library cannot convert the value.
pub fn local_time(usec: u64) -> String {
    let secs = usec / 1_000_000;
    let Ok(t) = libc::time_t::try_from(secs) else {
        return format!("@{secs}");
    };
    // SAFETY: `tm` is plain old data that localtime_r fully initialises on success;
    // localtime_r is the thread-safe variant and only reads `t`. It stays a raw libc
    // call because neither std nor nix convert to local time: the time zone rules
    // (TZ, /etc/localtime) are the C library's.
    #[allow(unsafe_code)]
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals; see above.
    #[allow(unsafe_code)]
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if !ok {
        return format!("@{secs}");
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Text from the other end (a manager's error message, a name it serves) as one line:
/// at most `max` characters, control characters escaped.
pub fn one_line(text: &str, max: usize) -> String {
    let mut line = String::new();
    for c in text.chars().take(max) {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter()
            .map(|r| r.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[test]
    fn fit_columns_pad_to_widest_value() {
        let t = table(
            &[
                ("NODE", Width::Fit),
                ("ID", Width::Fit),
                ("SUB", Width::Fit),
            ],
            &rows(&[
                &["a", "web.service", "running"],
                &["node-long", "x", "dead"],
            ]),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "NODE      | ID          | SUB");
        assert_eq!(
            lines[1],
            "=".repeat("NODE      | ID          | SUB    ".len())
        );
        assert_eq!(lines[2], "a         | web.service | running");
        assert_eq!(lines[3], "node-long | x           | dead");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn fixed_columns_keep_width_and_never_cut() {
        let t = table(
            &[("A", Width::Fixed(5)), ("B", Width::Fixed(3))],
            &rows(&[&["toolongvalue", "x"]]),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "A     | B");
        assert_eq!(lines[1].len(), 11);
        assert_eq!(lines[2], "toolongvalue | x");
    }

    /// Padding counts characters, not bytes, and blanks at a line's end are
    /// cut whichever field they come from (a value's own too), as a
    /// `format!("{f:<w$}")` per field joined by " | " and trimmed would.
    #[test]
    fn rows_pad_by_characters_and_cut_their_trailing_blanks() {
        let widths = [4, 3, 5];
        for fields in [
            ["é", "ü", ""],
            ["ab", "", ""],
            ["", "", ""],
            ["x  ", "y", "z "],
            ["wider-than-4", "ok", "\u{2003}"],
            ["日本", "語", "a"],
        ] {
            let reference: Vec<String> = fields
                .iter()
                .zip(widths)
                .map(|(f, w)| format!("{f:<w$}"))
                .collect();
            let want = format!("{}\n", reference.join(" | ").trim_end());
            assert_eq!(table_row(fields.into_iter(), &widths), want, "{fields:?}");
        }
        let head = table_head(["Ä", "B", "C"].into_iter(), &widths);
        assert_eq!(head, "Ä    | B   | C\n==================\n");
    }

    #[test]
    fn empty_table_has_header_and_separator() {
        let t = table(&[("NODE", Width::Fit), ("ID", Width::Fit)], &[]);
        assert_eq!(t, "NODE | ID\n=========\n");
    }

    #[test]
    fn local_time_shape() {
        let s = local_time(1_700_000_000_000_000);
        assert_eq!(s.len(), 19, "{s}");
        let b = s.as_bytes();
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16]),
            (b'-', b'-', b' ', b':', b':')
        );
        assert!(s.starts_with("2023-11-1"), "{s}");
    }
}
