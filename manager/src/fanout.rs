//! Fleet-wide lists (`Controller.ListUnits`, `Controller.ListUnitFiles`):
//! one request to every online node, answered as one D-Bus dict keyed by
//! node name.
//!
//! Invariants:
//!
//! * At most [`IN_FLIGHT`] nodes are asked at a time, and every answer must
//!   come by one deadline (the fan-out timeout, counted from the start of
//!   the call): slow nodes make the answer partial, never later than a
//!   client waits.
//! * A node that fails or misses the deadline is left out and logged (one
//!   broken node should not blind an operator to the rest of the fleet).
//! * The answer is one D-Bus message, which nothing splits. Its encoded
//!   body is counted exactly as node answers arrive (`BodySize`); once it
//!   is certain to pass the limit, gathering stops — requests in flight are
//!   dropped, no node is asked any more, what was held is freed — and the
//!   call fails with `LimitsExceeded`, naming the size reached, the limit
//!   and the way out (each node on its own, as `droverctl` lists). So the
//!   manager holds at most about the limit's worth of rows plus the answers
//!   in flight, whatever the fleet's size.
//! * A fleet whose answer fits gets all of it, in node-name order.
//! * How many fleet-wide lists run or wait at once, per client and in all,
//!   is bounded ([`limit`]): a client's pending calls cannot make the
//!   manager hold more than a few answers, nor starve other clients.

use crate::error::ApiError;
use crate::nodes::session::Session;
use drover_protocol::error_names::LIMITS_EXCEEDED;
use drover_protocol::{Request, Response};
use futures::StreamExt;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use zbus::wire::serialized::Context;
use zbus::wire::{LE, Type, serialized_size};

pub mod limit;

/// Nodes asked at the same time.
pub const IN_FLIGHT: usize = 64;

/// Which fleet-wide list, for logs and the refusal's advice.
#[derive(Debug, Clone)]
pub struct FleetList {
    /// The request every node gets.
    pub request: Request,
    /// The D-Bus method, on the controller and on each node (`ListUnits`).
    pub method: &'static str,
    /// The `droverctl` command that lists the same, node by node.
    pub ctl: &'static str,
}

/// `ListUnits` over the fleet.
pub const LIST_UNITS: FleetList = FleetList {
    request: Request::ListUnits,
    method: "ListUnits",
    ctl: "list-units",
};

/// `ListUnitFiles` over the fleet.
pub const LIST_UNIT_FILES: FleetList = FleetList {
    request: Request::ListUnitFiles,
    method: "ListUnitFiles",
    ctl: "list-unit-files",
};

/// Asks every session in `sessions` for `list` (see the module docs) and
/// returns the rows by node, or `LimitsExceeded` once the answer's encoded
/// body would pass `limit` bytes. `rows` turns a node's reply into its rows.
pub async fn gather<T>(
    sessions: Vec<Arc<Session>>,
    list: &FleetList,
    rows: fn(Response) -> Result<Vec<T>, ApiError>,
    timeout: Duration,
    limit: usize,
) -> Result<BTreeMap<String, Vec<T>>, ApiError>
where
    T: Serialize + Type,
{
    let online = sessions.len();
    let deadline = Instant::now() + timeout;
    let mut answers = futures::stream::iter(sessions)
        .map(|session| async move {
            let left = deadline.saturating_duration_since(Instant::now());
            let result = if left.is_zero() {
                Err(ApiError::failed(
                    "not asked: the fan-out deadline had passed",
                ))
            } else {
                session.request(list.request.clone(), left).await
            };
            (session, result)
        })
        .buffer_unordered(IN_FLIGHT);
    let mut size = BodySize::default();
    let mut out = BTreeMap::new();
    while let Some((session, result)) = answers.next().await {
        let node = session.node().to_string();
        let entry = result.and_then(rows).and_then(|r| {
            let bytes = entry_size(&node, &r)?;
            Ok((r, bytes))
        });
        match entry {
            Ok((r, bytes)) => {
                size.add(&node, bytes);
                if size.at_least() > limit {
                    let listed = size.entries();
                    drop(answers);
                    drop(out);
                    return Err(too_large(list, size.at_least(), limit, listed, online));
                }
                out.insert(node, r);
            }
            Err(e) => tracing::warn!(node = %node, "{} left node {node} out: {e}", list.method),
        }
    }
    let exact = size.exact();
    if exact > limit {
        return Err(too_large(list, exact, limit, size.entries(), online));
    }
    Ok(out)
}

fn too_large(
    list: &FleetList,
    reached: usize,
    limit: usize,
    listed: usize,
    online: usize,
) -> ApiError {
    let (method, ctl) = (list.method, list.ctl);
    tracing::warn!(
        "Controller.{method} refused: the answer reached {reached} bytes after {listed} of \
         {online} nodes, more than the {limit} bytes of one D-Bus reply"
    );
    ApiError::new(
        LIMITS_EXCEEDED,
        format!(
            "the answer of Controller.{method} would be at least {reached} bytes (reached after \
             {listed} of {online} online nodes), more than the {limit} bytes one D-Bus reply may \
             carry here; ask each node with Node.{method} instead, as `droverctl {ctl}` does"
        ),
    )
}

/// The encoded size of one dict entry `{s a(...)}` for `node`: a dict entry
/// is aligned to 8 like a struct, so its size does not depend on where it
/// sits, and the tuple encodes exactly as the entry does.
fn entry_size<T: Serialize + Type>(node: &str, rows: &[T]) -> Result<usize, ApiError> {
    serialized_size(Context::new(LE, 0), &(node, rows))
        .map(|s| *s)
        .map_err(|e| {
            ApiError::failed(format!(
                "the answer of node '{node}' cannot be encoded: {e}"
            ))
        })
}

/// The body of an answer `a{s...}` in the making, from the sizes of its
/// entries: the array's length (4 bytes) and the padding to the first entry
/// (4), then each entry padded to 8 except the last one. Entries go out in
/// node-name order (the answer is a `BTreeMap`), so which one is last — the
/// only one without padding — is known only at the end.
#[derive(Debug, Default)]
struct BodySize {
    /// Entry sizes by node.
    entries: BTreeMap<String, usize>,
    /// Sum of the entry sizes, each rounded up to 8.
    padded: usize,
}

impl BodySize {
    fn add(&mut self, node: &str, bytes: usize) {
        self.padded = self.padded.saturating_add(bytes.next_multiple_of(8));
        self.entries.insert(node.to_owned(), bytes);
    }

    fn entries(&self) -> usize {
        self.entries.len()
    }

    /// What the body takes at least, whichever entry ends up last.
    fn at_least(&self) -> usize {
        match self.entries.len() {
            0 => 8,
            _ => (8 + self.padded).saturating_sub(7),
        }
    }

    /// The body's size with the entries in node-name order.
    fn exact(&self) -> usize {
        match self.entries.last_key_value() {
            None => 8,
            Some((_, last)) => 8 + self.padded - (last.next_multiple_of(8) - last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = (String, String);

    fn body(map: &BTreeMap<String, Vec<Row>>) -> usize {
        *serialized_size(Context::new(LE, 0), map).unwrap()
    }

    /// The sizes counted entry by entry are the bytes zbus writes for the
    /// whole map, for entries of every length mod 8 and in any arrival order.
    #[test]
    fn body_size_is_what_zbus_encodes() {
        let mut map: BTreeMap<String, Vec<Row>> = BTreeMap::new();
        let mut size = BodySize::default();
        assert_eq!(size.exact(), body(&map));
        for (i, node) in ["n3", "a", "zz-last", "bb", "c1234567"].iter().enumerate() {
            let rows: Vec<Row> = (0..i)
                .map(|j| (format!("u{}.service", "x".repeat(j)), "enabled".into()))
                .collect();
            size.add(node, entry_size(node, &rows).unwrap());
            map.insert(node.to_string(), rows);
            assert_eq!(size.exact(), body(&map), "after {node}");
            assert!(size.at_least() <= size.exact());
            assert!(size.exact() - size.at_least() <= 7);
        }
    }
}
