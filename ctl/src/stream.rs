//! A listing printed as its nodes come in, in the same bytes as the listing
//! printed at once ([`crate::output::json`], [`crate::output::fit_table`]),
//! while droverctl holds only a bounded part of it.
//!
//! * `--json`: the array goes out item by item, each as `serde_json`'s pretty
//!   printer writes it inside an array, so the document is the one
//!   [`crate::output::json`] makes of all rows.
//! * A table: each column is as wide as its widest value, so no line can be
//!   written before the last row is known. Rows are kept in a compact form
//!   ([`Spool`]: length-prefixed cells), in memory up to [`IN_MEMORY`] bytes,
//!   then in an unlinked temporary file; the widths are kept as rows come, and
//!   the table is written at the end, one line at a time.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use serde::Serialize;

use crate::output::{table_head, table_row};

/// Bytes of spooled rows kept in memory before they go to a file.
pub const IN_MEMORY: usize = 4 << 20;

/// Where a listing goes, for rows of type `R`.
pub struct RowStream<'a, R> {
    out: &'a mut dyn Write,
    form: Form,
    cells: fn(&R) -> Vec<String>,
}

enum Form {
    /// Items written so far.
    Json(usize),
    Table(Spool),
}

impl<'a, R: Serialize> RowStream<'a, R> {
    /// A JSON array of the rows.
    pub fn json(out: &'a mut dyn Write, cells: fn(&R) -> Vec<String>) -> Self {
        RowStream {
            out,
            form: Form::Json(0),
            cells,
        }
    }

    /// A table under `headers`, with `cells(row)` as each row's fields.
    pub fn table(
        out: &'a mut dyn Write,
        headers: &[&str],
        cells: fn(&R) -> Vec<String>,
        in_memory: usize,
    ) -> Self {
        RowStream {
            out,
            form: Form::Table(Spool::new(headers, in_memory)),
            cells,
        }
    }

    /// Rows of one node, in the order they are to be printed.
    pub fn push(&mut self, rows: &[R]) -> std::io::Result<()> {
        match &mut self.form {
            Form::Json(written) => {
                for row in rows {
                    let item = serde_json::to_string_pretty(row).map_err(std::io::Error::other)?;
                    let mut text = String::from(if *written == 0 { "[\n" } else { ",\n" });
                    for (i, line) in item.lines().enumerate() {
                        if i > 0 {
                            text.push('\n');
                        }
                        text.push_str("  ");
                        text.push_str(line);
                    }
                    self.out.write_all(text.as_bytes())?;
                    *written += 1;
                }
                self.out.flush()
            }
            Form::Table(spool) => {
                for row in rows {
                    spool.push(&(self.cells)(row))?;
                }
                Ok(())
            }
        }
    }

    /// Ends the listing: the array's close, or the whole table.
    pub fn finish(self) -> std::io::Result<()> {
        match self.form {
            Form::Json(0) => self.out.write_all(b"[]\n")?,
            Form::Json(_) => self.out.write_all(b"\n]\n")?,
            Form::Table(spool) => spool.write_table(self.out)?,
        }
        self.out.flush()
    }
}

/// Rows of a table whose widths are not known yet (see the module docs).
pub struct Spool {
    headers: Vec<String>,
    widths: Vec<usize>,
    /// Encoded rows not yet in `file`.
    memory: Vec<u8>,
    in_memory: usize,
    file: Option<File>,
}

impl Spool {
    pub fn new(headers: &[&str], in_memory: usize) -> Spool {
        Spool {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            widths: headers.iter().map(|h| h.chars().count()).collect(),
            memory: Vec::new(),
            in_memory,
            file: None,
        }
    }

    /// One row; `cells` has one field per header.
    pub fn push(&mut self, cells: &[String]) -> std::io::Result<()> {
        for (cell, width) in cells.iter().zip(self.widths.iter_mut()) {
            *width = (*width).max(cell.chars().count());
            let len = u32::try_from(cell.len()).map_err(std::io::Error::other)?;
            self.memory.extend_from_slice(&len.to_le_bytes());
            self.memory.extend_from_slice(cell.as_bytes());
        }
        if self.memory.len() > self.in_memory {
            let file = match &mut self.file {
                Some(file) => file,
                None => self.file.insert(tempfile::tempfile()?),
            };
            file.write_all(&self.memory)?;
            self.memory.clear();
        }
        Ok(())
    }

    /// The table: header, `=` line, every row in the order pushed.
    pub fn write_table(self, out: &mut dyn Write) -> std::io::Result<()> {
        let mut out = BufWriter::new(out);
        let headers = self.headers.iter().map(String::as_str);
        out.write_all(table_head(headers, &self.widths).as_bytes())?;
        let columns = self.headers.len();
        if let Some(mut file) = self.file {
            file.seek(SeekFrom::Start(0))?;
            write_rows(&mut BufReader::new(file), columns, &self.widths, &mut out)?;
        }
        write_rows(&mut &self.memory[..], columns, &self.widths, &mut out)?;
        out.flush()
    }
}

/// Decodes spooled rows from `from` until its end and writes them as lines.
fn write_rows(
    from: &mut dyn Read,
    columns: usize,
    widths: &[usize],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut cells = vec![String::new(); columns];
    loop {
        for (i, cell) in cells.iter_mut().enumerate() {
            let mut len = [0u8; 4];
            match from.read_exact(&mut len) {
                Err(e) if i == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                other => other?,
            }
            let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
            from.read_exact(&mut bytes)?;
            *cell = String::from_utf8(bytes).map_err(std::io::Error::other)?;
        }
        out.write_all(table_row(cells.iter().map(String::as_str), widths).as_bytes())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{fit_table, json};

    #[derive(Serialize)]
    struct Row {
        node: String,
        unit: String,
    }

    fn cells(r: &Row) -> Vec<String> {
        vec![r.node.clone(), r.unit.clone()]
    }

    fn rows(n: usize) -> Vec<Row> {
        (0..n)
            .map(|i| Row {
                node: format!("node-{}", i % 7),
                unit: format!("ü{}\"{}.service", "x".repeat(i % 13), i),
            })
            .collect()
    }

    /// Streamed in chunks of any size, the output is byte for byte what the
    /// whole listing printed at once is: JSON, and tables kept in memory or
    /// spooled to a file (a 64-byte memory bound forces the file).
    #[test]
    fn streamed_output_is_the_output_printed_at_once() {
        for n in [0, 1, 2, 5, 300] {
            let all = rows(n);
            let table: Vec<Vec<String>> = all.iter().map(cells).collect();
            for chunk in [1, 3, 1000] {
                let mut out = Vec::new();
                let mut s = RowStream::json(&mut out, cells);
                for part in all.chunks(chunk) {
                    s.push(part).unwrap();
                }
                s.finish().unwrap();
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    json(&all),
                    "json, {n} rows"
                );
                for in_memory in [64, IN_MEMORY] {
                    let mut out = Vec::new();
                    let mut s = RowStream::table(&mut out, &["NODE", "ID"], cells, in_memory);
                    for part in all.chunks(chunk) {
                        s.push(part).unwrap();
                    }
                    s.finish().unwrap();
                    assert_eq!(
                        String::from_utf8(out).unwrap(),
                        fit_table(&["NODE", "ID"], &table),
                        "table, {n} rows, memory {in_memory}"
                    );
                }
            }
        }
    }
}
