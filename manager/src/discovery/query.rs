//! `Where`'s arguments and rows: the options dictionary checked completely
//! before anything happens (an unknown key or a value of the wrong type is
//! `InvalidArgs`), and the one function that builds a row, so the parts of
//! a row that come from elsewhere (drain, the advertised address, ports)
//! each change in one place.

use crate::discovery::index::{Filter, NodeFilter, Row};
use drover_protocol::NodeName;
use std::collections::HashMap;
use zbus::{OwnedVariant, Variant};

/// One row of `Where`: node, active state, sub state, health, address,
/// since (realtime µs), stale, drained, ports `(name, port)`.
pub type WhereRow = drover_bus::client::WhereTuple;

/// The options of one `Where` call.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub filter: Filter,
    /// Include drained rows (marked drained).
    pub drained: bool,
}

/// The option keys `Where` knows, for the error that names them.
pub const KEYS: &[&str] = &["healthy", "stale", "drained", "nodes", "all"];

fn boolean(key: &str, v: &Variant<'_>) -> Result<bool, String> {
    match v {
        Variant::Bool(b) => Ok(*b),
        Variant::Variant(inner) => boolean(key, inner),
        other => Err(format!(
            "option '{key}' must be a boolean (b), not '{}'",
            other.value_signature()
        )),
    }
}

impl Options {
    /// Checks every entry of `map`; the error says which one is wrong.
    pub fn parse(map: &HashMap<String, OwnedVariant>) -> Result<Self, String> {
        let mut o = Options::default();
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        for key in keys {
            let v: &Variant<'_> = &map[key];
            match key.as_str() {
                "healthy" => o.filter.healthy = boolean(key, v)?,
                "stale" => o.filter.stale = boolean(key, v)?,
                "all" => o.filter.all = boolean(key, v)?,
                "drained" => o.drained = boolean(key, v)?,
                "nodes" => {
                    let text = match v {
                        Variant::Str(s) => s.as_str(),
                        other => {
                            return Err(format!(
                                "option 'nodes' must be a string (s), not '{}'",
                                other.value_signature()
                            ));
                        }
                    };
                    o.filter.nodes =
                        NodeFilter::parse(text).map_err(|e| format!("option 'nodes': {e}"))?;
                }
                other => {
                    let shown: String = other.chars().take(64).collect();
                    return Err(format!(
                        "unknown option '{}' (known: {})",
                        shown.escape_default(),
                        KEYS.join(", ")
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// The row of `node`: everything a `Where` row says, in one place.
/// `address` is what clients should connect to, `drained` whether the node
/// or the unit on it is drained, `ports` the unit's declared ports.
pub fn where_row(
    node: &NodeName,
    row: &Row,
    address: &str,
    drained: bool,
    ports: &[(String, u16)],
) -> WhereRow {
    (
        node.to_string(),
        row.active_state.clone(),
        row.sub_state.clone(),
        row.health.as_str().to_owned(),
        address.to_owned(),
        row.since_usec,
        row.stale_since_usec.is_some(),
        drained,
        ports.to_vec(),
    )
}

/// Bytes `row` takes in a D-Bus body, at most (strings with their length
/// and nul, alignment padding, the fixed fields).
pub fn wire_size(row: &WhereRow) -> usize {
    let s = |t: &str| t.len() + 8;
    s(&row.0)
        + s(&row.1)
        + s(&row.2)
        + s(&row.3)
        + s(&row.4)
        + 32
        + row.8.iter().map(|(n, _)| s(n) + 8).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(entries: &[(&str, Variant<'_>)]) -> Result<Options, String> {
        let map = entries
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    v.try_clone().unwrap().try_into_owned().unwrap(),
                )
            })
            .collect();
        Options::parse(&map)
    }

    #[test]
    fn options_are_checked_completely() {
        let o = opts(&[
            ("healthy", Variant::Bool(true)),
            ("stale", Variant::Bool(true)),
            ("drained", Variant::Bool(true)),
            ("all", Variant::Bool(false)),
            ("nodes", Variant::from("edge-*")),
        ])
        .unwrap();
        assert!(o.filter.healthy && o.filter.stale && o.drained && !o.filter.all);
        assert!(matches!(o.filter.nodes, NodeFilter::Pattern(_)));
        assert!(opts(&[]).is_ok());
        for (entries, says) in [
            (vec![("healthy", Variant::from("yes"))], "boolean"),
            (vec![("stale", Variant::U32(1))], "boolean"),
            (vec![("nodes", Variant::Bool(true))], "string"),
            (vec![("nodes", Variant::from("a**"))], "nodes"),
            (vec![("nodes", Variant::from("bad/name"))], "nodes"),
            (vec![("colour", Variant::Bool(true))], "unknown option"),
            (vec![("", Variant::Bool(true))], "unknown option"),
        ] {
            let err = opts(&entries).expect_err(says);
            assert!(err.contains(says), "{err}");
        }
        let huge = "x".repeat(100_000);
        let err = opts(&[(huge.as_str(), Variant::Bool(true))]).unwrap_err();
        assert!(err.len() < 200, "the error does not echo a huge key");
    }
}
