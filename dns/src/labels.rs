//! The mapping between unit and node names and DNS labels: documented in
//! drover-dns(8) ("NAMES") and reversible, so every unit has exactly one
//! DNS name and every DNS name means at most one unit.
//!
//! A name is split at its dots; each part becomes one label (or several, see
//! below). Inside a label:
//!
//! * `a`–`z`, `0`–`9` and `-` stand for themselves;
//! * every other byte (upper-case letters, `_`, `@`, `:`, `\`) is `_` and two
//!   lower-case hex digits: `web@1.service` is `web_401.service`,
//!   `Web.service` is `_57eb.service`, `dev-disk-by\x2duuid.device` is
//!   `dev-disk-by_5cx2duuid.device`;
//! * a part whose encoding is longer than 63 bytes (a DNS label's limit) is cut
//!   into labels of at most 62 bytes, never inside an escape, each but the
//!   last followed by a lone `_` (which no escape can be): the labels join
//!   again without a dot.
//!
//! DNS compares names without regard to case; the encoding uses lower case
//! only, so a query in any case means the same unit. A label that breaks
//! these rules (an upper-case escape digit, a raw `@`, an escape of a byte
//! that needs none) decodes to nothing: the query gets NXDOMAIN. Invariant:
//! `decode(encode(x)) == x` for every part, and `decode` accepts only what
//! `encode` can produce.

/// Longest DNS label, in bytes (RFC 1035).
pub const MAX_LABEL: usize = 63;

/// Longest piece of a cut part (one byte left for the continuation mark).
const PIECE: usize = MAX_LABEL - 1;

fn plain(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

fn hex(n: u8) -> u8 {
    b"0123456789abcdef"[usize::from(n & 0xf)]
}

fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// The labels of one dot-free part of a name (never empty for a non-empty part).
pub fn encode_part(part: &str) -> Vec<String> {
    // Escapes first, as units that must stay whole.
    let mut units: Vec<[u8; 3]> = Vec::with_capacity(part.len());
    for b in part.bytes() {
        units.push(if plain(b) {
            [b, 0, 0]
        } else {
            [b'_', hex(b >> 4), hex(b)]
        });
    }
    let mut labels = Vec::new();
    let mut current = String::new();
    let total: usize = units.iter().map(unit_len).sum();
    for unit in &units {
        let len = unit_len(unit);
        if total > MAX_LABEL && current.len() + len > PIECE {
            current.push('_');
            labels.push(std::mem::take(&mut current));
        }
        for &b in &unit[..len] {
            current.push(char::from(b));
        }
    }
    labels.push(current);
    labels
}

fn unit_len(unit: &[u8; 3]) -> usize {
    if unit[0] == b'_' { 3 } else { 1 }
}

/// The DNS labels of a dotted name (`web.service` → `web`, `service`).
pub fn encode(name: &str) -> Vec<String> {
    name.split('.').flat_map(encode_part).collect()
}

/// Decodes one label: the bytes it stands for and whether it continues in
/// the next label (a trailing lone `_`). `None`: not a label `encode` makes.
pub fn decode_label(label: &[u8]) -> Option<(Vec<u8>, bool)> {
    if label.is_empty() || label.len() > MAX_LABEL {
        return None;
    }
    let mut out = Vec::with_capacity(label.len());
    let mut i = 0;
    while i < label.len() {
        let b = label[i];
        if plain(b) {
            out.push(b);
            i += 1;
        } else if b == b'_' {
            if i + 1 == label.len() {
                // The continuation mark: only after a full piece's worth.
                return (!out.is_empty()).then_some((out, true));
            }
            let hi = unhex(*label.get(i + 1)?)?;
            let lo = unhex(*label.get(i + 2)?)?;
            let byte = (hi << 4) | lo;
            if plain(byte) {
                return None; // not canonical: that byte is written as itself
            }
            out.push(byte);
            i += 3;
        } else {
            return None;
        }
    }
    Some((out, false))
}

/// Decodes a run of labels back to the dotted name they encode; `None` when
/// any label is not one `encode` makes, or the last one says it continues.
pub fn decode<'a>(labels: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let labels: Vec<&[u8]> = labels.into_iter().collect();
    let mut name = Vec::new();
    let mut continues = false;
    let mut first = true;
    for &label in &labels {
        let (bytes, more) = decode_label(label)?;
        if !first && !continues {
            name.push(b'.');
        }
        name.extend_from_slice(&bytes);
        continues = more;
        first = false;
    }
    if first || continues {
        return None;
    }
    let name = String::from_utf8(name).ok()?;
    // Only the one spelling `encode` makes (a cut where none is needed, or
    // in another place, is a different name for nothing).
    let again = encode(&name);
    (again.len() == labels.len() && again.iter().zip(&labels).all(|(a, b)| a.as_bytes() == *b))
        .then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(name: &str) -> String {
        let labels = encode(name);
        for l in &labels {
            assert!(l.len() <= MAX_LABEL, "{name}: label {l} too long");
            assert!(
                l.bytes().all(|b| plain(b) || b == b'_'),
                "{name}: label {l} has a byte outside [a-z0-9-_]"
            );
        }
        let back = decode(labels.iter().map(|l| l.as_bytes())).unwrap();
        assert_eq!(back, name, "labels {labels:?}");
        labels.join(".")
    }

    #[test]
    fn names_map_as_documented_and_back() {
        assert_eq!(round("web.service"), "web.service");
        assert_eq!(round("web@1.service"), "web_401.service");
        assert_eq!(round("Web.service"), "_57eb.service");
        assert_eq!(
            round("dev-disk-by\\x2duuid.device"),
            "dev-disk-by_5cx2duuid.device"
        );
        assert_eq!(round("a:b_c.socket"), "a_3ab_5fc.socket");
        assert_eq!(round("node-1.example"), "node-1.example");
        assert_eq!(round("Node1"), "_4eode1");
    }

    #[test]
    fn long_parts_are_cut_and_joined_again() {
        let long = format!("{}.service", "a".repeat(200));
        let dns = round(&long);
        assert!(dns.split('.').count() > 2, "{dns}");
        // Escapes are never cut in half.
        let escaped = format!("{}.service", "@".repeat(80));
        round(&escaped);
        let mixed: String = (0..120)
            .map(|i| if i % 3 == 0 { 'X' } else { 'x' })
            .collect();
        round(&format!("{mixed}@{mixed}.service"));
        // Exactly 63 stays one label.
        let exact = "b".repeat(63);
        assert_eq!(encode(&exact), vec![exact.clone()]);
        assert_eq!(encode(&"b".repeat(64)).len(), 2);
    }

    #[test]
    fn labels_encode_cannot_make_decode_to_nothing() {
        for bad in [
            &b"Web"[..],
            b"web@1",
            b"_4",
            b"_4g",
            b"_41", // 'A'? no: 0x41 is 'A', which needs the escape: fine
            b"_61", // 'a' escaped: not canonical
            b"_2d", // '-' escaped: not canonical
            b"_",   // a lone continuation mark
            b"a b",
            b"\xff",
            b"",
        ] {
            let got = decode_label(bad);
            if bad == b"_41" {
                assert_eq!(got, Some((b"A".to_vec(), false)));
            } else {
                assert!(
                    got.is_none(),
                    "{:?} decoded to {got:?}",
                    String::from_utf8_lossy(bad)
                );
            }
        }
        let too_long = vec![b'a'; 64];
        assert!(decode_label(&too_long).is_none());
        // A name may not end on a continuation, nor be cut where it needs no cut.
        assert!(decode([&b"abc_"[..]]).is_none());
        assert!(decode([&b"abc_"[..], b"def"]).is_none());
        assert_eq!(decode([&b"abc"[..], b"def"]).as_deref(), Some("abc.def"));
        assert!(decode(std::iter::empty::<&[u8]>()).is_none());
    }

    #[test]
    fn every_byte_round_trips() {
        for b in 1u8..=127 {
            let s = String::from(char::from(b));
            if s == "." {
                continue;
            }
            round(&s);
        }
    }
}
