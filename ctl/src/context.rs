//! What every command runs with and implements: the [`Run`] trait and the
//! [`Context`] (output format, output sink, bus connection).
//!
//! Commands print through [`Context::emit`] (table text or a JSON document) and get
//! the bus connection from [`Context::client`], opened on first use so that commands
//! that need no bus (`version`) never touch one. Lives apart from
//! [`crate::commands`] so the commands import it without importing the list that
//! names them.

use std::io::Write;

use serde::Serialize;

use crate::client::{Client, Listing};
use crate::error::CtlError;
use crate::output::json;
use crate::stream::{IN_MEMORY, RowStream};
use drover_bus::Bus;
use drover_bus::client::NodeProxy;

/// A table's headers and the cells of one row.
pub type Columns<'a, R> = (&'a [&'a str], fn(&R) -> Vec<String>);

/// What every command implements.
pub trait Run {
    /// Do the command. Output goes through `ctx`; a failure is returned, not printed.
    fn run(self, ctx: &mut Context) -> impl Future<Output = Result<(), CtlError>>;
}

/// What a command runs with: output format, output sink, bus.
pub struct Context {
    target: Bus,
    json: bool,
    client: Option<Client>,
    out: Box<dyn Write>,
}

impl Context {
    pub fn new(target: Bus, json: bool, out: Box<dyn Write>) -> Context {
        Context {
            target,
            json,
            client: None,
            out,
        }
    }

    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        self.json
    }

    /// The bus connection, opened on first use.
    pub async fn client(&mut self) -> Result<&Client, CtlError> {
        if self.client.is_none() {
            self.client = Some(Client::connect(self.target.clone()).await?);
        }
        // Set just above when it was missing.
        self.client
            .as_ref()
            .ok_or_else(|| CtlError::Other("no bus connection".to_owned()))
    }

    /// A message for stderr (bluechictl prints some results there, e.g. the
    /// symlinks `enable` created).
    pub fn warn(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
    }

    /// Write already rendered output (a table or a JSON document) and flush it, so
    /// a result line is visible even while a later step still waits.
    pub fn emit(&mut self, text: &str) -> Result<(), CtlError> {
        self.out.write_all(text.as_bytes())?;
        self.out.flush()?;
        Ok(())
    }

    /// Write a [`Listing`]'s rows (JSON or `render`), then one stderr line per node
    /// that could not be listed; such nodes make the command fail after the output.
    pub fn emit_listing<T: Serialize>(
        &mut self,
        listing: Listing<T>,
        what: &str,
        render: impl FnOnce(&[T]) -> String,
    ) -> Result<(), CtlError> {
        self.emit_rows(&listing.rows, render)?;
        self.left_out(listing.left_out, what)
    }

    /// A listing printed as it comes, node by node: JSON item by item with
    /// `--json`, else a table under `headers` of `cells(row)` (see
    /// [`crate::stream`]).
    fn row_stream<R: Serialize>(
        &mut self,
        headers: &[&str],
        cells: fn(&R) -> Vec<String>,
    ) -> RowStream<'_, R> {
        if self.json {
            RowStream::json(&mut *self.out, cells)
        } else {
            RowStream::table(&mut *self.out, headers, cells, IN_MEMORY)
        }
    }

    /// A listing over every online node, asked one by one
    /// ([`Client::each_node`] with `one`): `rows` makes a node's rows, which
    /// are printed as they come (a table of `headers` and `cells`, or JSON);
    /// the nodes that could not be listed go to stderr and fail the command
    /// (`Context::left_out`, `what` names what was listed).
    pub async fn stream_nodes<T, R: Serialize>(
        &mut self,
        client: &Client,
        (headers, cells): Columns<'_, R>,
        one: impl AsyncFn(&NodeProxy<'static>) -> zbus::Result<Vec<T>>,
        rows: impl Fn(&str, Vec<T>) -> Vec<R>,
        what: &str,
    ) -> Result<(), CtlError> {
        let mut out = self.row_stream(headers, cells);
        let left_out = client
            .each_node(one, |node, entries| Ok(out.push(&rows(node, entries))?))
            .await?;
        out.finish()?;
        self.left_out(left_out, what)
    }

    /// One stderr line per online node that could not be listed (`left_out`:
    /// node and reason); any makes the command fail.
    fn left_out(&mut self, left_out: Vec<(String, String)>, what: &str) -> Result<(), CtlError> {
        if left_out.is_empty() {
            return Ok(());
        }
        let mut warnings = String::new();
        for (node, reason) in &left_out {
            warnings.push_str(&format!(
                "droverctl: cannot list {what} of node {node}: {reason}\n"
            ));
        }
        self.warn(&warnings);
        Err(CtlError::NodesLeftOut {
            nodes: left_out.into_iter().map(|(node, _)| node).collect(),
        })
    }

    /// A listing: one JSON document of `rows` with `--json`, else `render(rows)`.
    pub fn emit_rows<T: Serialize>(
        &mut self,
        rows: &[T],
        render: impl FnOnce(&[T]) -> String,
    ) -> Result<(), CtlError> {
        let text = if self.json { json(rows) } else { render(rows) };
        self.emit(&text)
    }
}
