//! One file per command. Each file defines a clap `Args` struct and implements
//! [`Run`] for it; the [`commands!`] list below turns them into the [`Command`]
//! enum and its dispatch. Adding a command = one new file + one line in that list.
//!
//! Commands print through [`Context::emit`] (table text or a JSON document) and get
//! the bus connection from [`Context::client`], opened on first use so that commands
//! that need no bus (`version`) never touch one.

use std::io::Write;

use crate::client::{BusTarget, Client};
use crate::error::CtlError;

pub mod daemon_reload;
pub mod list_units;
pub mod status;
pub mod unit_job;
pub mod version;

/// What every command implements.
pub trait Run {
    /// Do the command. Output goes through `ctx`; a failure is returned, not printed.
    fn run(self, ctx: &mut Context) -> impl Future<Output = Result<(), CtlError>>;
}

/// Declares the subcommands: `Variant(Type)`, with the doc comment as clap's about
/// text. Variant names become kebab-case command names (`ListUnits` → `list-units`).
macro_rules! commands {
    ($( $(#[$meta:meta])* $variant:ident($ty:ty) ),* $(,)?) => {
        /// A droverctl command.
        #[derive(Debug, clap::Subcommand)]
        pub enum Command {
            $( $(#[$meta])* $variant($ty), )*
        }

        impl Command {
            /// Run the command.
            pub async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
                match self {
                    $( Command::$variant(c) => c.run(ctx).await, )*
                }
            }
        }
    };
}

commands! {
    /// Show the nodes: state, IP address, when last seen
    Status(status::Status),
    /// List the units of all online nodes, or of one node
    ListUnits(list_units::ListUnits),
    /// Start a unit on a node and wait for the job to finish
    Start(unit_job::Start),
    /// Stop a unit on a node and wait for the job to finish
    Stop(unit_job::Stop),
    /// Restart a unit on a node and wait for the job to finish
    Restart(unit_job::Restart),
    /// Reload a unit on a node and wait for the job to finish
    Reload(unit_job::Reload),
    /// Make systemd on a node reload its unit files
    DaemonReload(daemon_reload::DaemonReload),
    /// Print droverctl's version
    Version(version::Version),
}

/// What a command runs with: output format, output sink, bus.
pub struct Context {
    target: BusTarget,
    json: bool,
    client: Option<Client>,
    out: Box<dyn Write>,
}

impl Context {
    pub fn new(target: BusTarget, json: bool, out: Box<dyn Write>) -> Context {
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

    /// Write already rendered output (a table or a JSON document) and flush it, so
    /// a result line is visible even while a later step still waits.
    pub fn emit(&mut self, text: &str) -> Result<(), CtlError> {
        self.out.write_all(text.as_bytes())?;
        self.out.flush()?;
        Ok(())
    }
}
