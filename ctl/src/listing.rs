//! What `list-units` and `list-unit-files` share: a node method that lists
//! entries (`Node.ListUnits`, `Node.ListUnitFiles`), its entries turned into
//! rows, kept when they match the `--filter` glob and sorted by node then
//! name, so output is stable across runs.
//!
//! Without a node, each online node is asked on its own and its rows are
//! printed as they come ([`Context::stream_nodes`]): a fleet of any size
//! lists with bounded memory, where `Controller.ListUnits` is one D-Bus reply
//! that a large fleet does not fit. A node that cannot be listed has its
//! reason on stderr and makes the command exit 1 after the others are
//! printed. With a node, only that node is asked ([`Client::one_node`]).

use drover_protocol::NodeName;
use serde::Serialize;

use crate::client::Client;
use crate::context::Context;
use crate::error::CtlError;
use crate::output::fit_table;
use drover_bus::client::NodeProxy;

/// A row of a per-node listing; its order (derived, node first) is the
/// output's.
pub trait NodeRow: Serialize + Ord + Sized {
    /// One entry of the node method's answer.
    type Entry;
    /// The node method, as errors name it (`ListUnits`).
    const METHOD: &'static str;
    /// What the rows are, as errors name them (`units`).
    const WHAT: &'static str;
    /// The table's column headers; [`NodeRow::cells`] gives one per header.
    const HEADERS: &'static [&'static str];

    /// Calls the node method.
    fn list(node: &NodeProxy<'static>) -> impl Future<Output = zbus::Result<Vec<Self::Entry>>>;
    /// The row of one entry of `node`.
    fn from_entry(node: &str, entry: Self::Entry) -> Self;
    /// Whether the row is kept under `--filter GLOB`.
    fn matches(&self, filter: &glob::Pattern) -> bool;
    /// The row's fields in the table.
    fn cells(&self) -> Vec<String>;
}

/// The rows that match `filter` (all without one), sorted.
pub fn select<R: NodeRow>(mut rows: Vec<R>, filter: Option<&glob::Pattern>) -> Vec<R> {
    if let Some(p) = filter {
        rows.retain(|r| r.matches(p));
    }
    rows.sort();
    rows
}

/// The rows as a table, each column as wide as its widest value.
pub fn render_table<R: NodeRow>(rows: &[R]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(R::cells).collect();
    fit_table(R::HEADERS, &cells)
}

/// Lists `node`, or every online node without one, and prints the rows
/// (module docs).
pub async fn run<R: NodeRow>(
    ctx: &mut Context,
    node: Option<&NodeName>,
    filter: Option<&glob::Pattern>,
) -> Result<(), CtlError> {
    let client: Client = ctx.client().await?.clone();
    let Some(node) = node else {
        return ctx
            .stream_nodes(
                &client,
                (R::HEADERS, R::cells),
                async |node| R::list(node).await,
                |node, entries| {
                    let rows = entries.into_iter().map(|e| R::from_entry(node, e));
                    select(rows.collect(), filter)
                },
                R::WHAT,
            )
            .await;
    };
    let mut listing = client
        .one_node(
            node,
            R::METHOD,
            async |node| R::list(node).await,
            R::from_entry,
        )
        .await?;
    listing.rows = select(listing.rows, filter);
    ctx.emit_listing(listing, R::WHAT, render_table)
}
