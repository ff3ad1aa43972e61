//! droverctl: the command line client of drover's public D-Bus API.
//!
//! drover-manager speaks Eclipse BlueChi's API (bus name `org.eclipse.bluechi`);
//! droverctl uses nothing else, so it works against any BlueChi-compatible manager.
//! Grammar and output follow bluechictl so scripts that parse bluechictl keep
//! working; drover's improvements are exit codes that mean something (a failed job
//! exits 1), local validation of names, `--json`, `--timeout`, and clear messages when
//! the manager is not there or goes away.
//!
//! Layout:
//! * [`cli`]: global options, and the program ([`cli::main`], [`cli::run`]);
//! * [`parse`]: value parsers (validation happens at parse time);
//! * [`commands`]: one file per command, and the list that makes the command enum;
//! * [`context`]: what every command implements ([`context::Run`]) and runs with
//!   ([`context::Context`]: output format, output sink, bus);
//! * [`client`]: bus choice, connection, D-Bus error → [`CtlError`] mapping;
//! * the API's proxies and row types are `drover_bus::client`'s (shared with the test
//!   kit), node object paths `drover_bus::bluechi`'s;
//! * [`follow`]: what `monitor`, `status -w` and `metrics listen` share (one ordered
//!   signal stream, Ctrl-C, noticing that the manager left);
//! * [`listing`]: what `list-units` and `list-unit-files` share (one node, or every
//!   online node streamed node by node; filter, order, table);
//! * [`output`]: tables, JSON, timestamps (pure, unit-tested);
//! * [`stream`]: a listing printed as its nodes come in, in the same bytes, with
//!   bounded memory (a table is spooled until its widths are known);
//! * [`error`]: the error type and the exit-code contract.
//!
//! The binary is [`cli::main`]: parse, run on a current-thread runtime, print any
//! error as one line `droverctl: <message>` on stderr, exit with
//! [`CtlError::exit_code`].
//!
//! Imports run one way: `cli` → `commands` → each command → `listing`, `context`,
//! `parse`, `client`, `follow`, `output` → `error` (`listing` → `context`,
//! `client`, `output`); `context` → `stream` → `output`.
//! This file only declares modules and re-exports; nothing inside the crate imports
//! through it.

pub mod cli;
pub mod client;
pub mod commands;
pub mod context;
pub mod error;
pub mod follow;
pub mod listing;
pub mod output;
pub mod parse;
pub mod stream;

pub use cli::Cli;
pub use error::{CtlError, EXIT_FAILED, EXIT_OK, EXIT_USAGE};
