//! One file per command. Each file defines a clap `Args` struct and implements
//! [`Run`] for it; the `commands!` list below turns them into the [`Command`]
//! enum and its dispatch. Adding a command = one new file + one line in that list.
//!
//! This file only declares and dispatches: what the commands share ([`Run`],
//! [`Context`]) lives in [`crate::context`], so imports run from here to the
//! commands and from the commands to `context`, never back.

use crate::context::{Context, Run};
use crate::error::CtlError;

pub mod daemon_reload;
pub mod default_target;
pub mod drain;
pub mod health;
pub mod list_unit_files;
pub mod list_units;
pub mod loglevel;
pub mod metrics;
pub mod monitor;
pub mod proxies;
pub mod status;
pub mod unit_files;
pub mod unit_job;
pub mod unit_ops;
pub mod version;
pub mod where_;

/// Declares the subcommands: `Variant(Type)`, with the doc comment as clap's about
/// text. Variant names become kebab-case command names (`ListUnits` → `list-units`).
macro_rules! commands {
    ($( $(#[$meta:meta])* $variant:ident($ty:ty) ),* $(,)?) => {
        /// A droverctl command.
        ///
        /// `defer`: a subcommand's arguments are built only when that subcommand is
        /// used, not all ~25 sets on every run (half of droverctl's start-up before
        /// this; see docs/dev/notes/droverctl-startup.md).
        #[derive(Debug, clap::Subcommand)]
        #[command(defer = true)]
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
    /// Show the nodes (state, IP, last seen), or units of a node; -w follows changes
    Status(status::Status),
    /// List the units of all online nodes, or of one node
    ListUnits(list_units::ListUnits),
    /// List the unit files of all online nodes, or of one node
    ListUnitFiles(list_unit_files::ListUnitFiles),
    /// Print unit events (created, state changed, properties changed, removed) until Ctrl-C
    Monitor(monitor::Monitor),
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
    /// Enable unit files on a node (then daemon-reload unless --no-reload)
    Enable(unit_files::Enable),
    /// Disable unit files on a node (then daemon-reload unless --no-reload)
    Disable(unit_files::Disable),
    /// Print the enablement state of a unit file; exit 0 only if it is enabled
    IsEnabled(unit_files::IsEnabled),
    /// Freeze a unit (its processes are suspended through the cgroup freezer)
    Freeze(unit_ops::Freeze),
    /// Thaw a frozen unit
    Thaw(unit_ops::Thaw),
    /// Send a signal to the processes of a unit
    Kill(unit_ops::Kill),
    /// Reset the failed state of all units of all nodes, of one node, or of some units
    ResetFailed(unit_ops::ResetFailed),
    /// Print the default target of a node
    GetDefault(default_target::GetDefault),
    /// Set the default target of a node
    SetDefault(default_target::SetDefault),
    /// Set the log level of the manager, or of one node's agent
    SetLoglevel(loglevel::SetLoglevel),
    /// Enable or disable metrics, or print metrics signals until Ctrl-C
    Metrics(metrics::Metrics),
    /// Show cross-node dependencies (proxies): who depends on which unit of which node
    Proxies(proxies::Proxies),
    /// Show the health of units (checks declared in their [X-Drover] section)
    Health(health::Health),
    /// Print a unit's health; exit 0 only if it is healthy
    IsHealthy(health::IsHealthy),
    /// Take a node, or units on it, out of service (Where, DNS) without stopping anything
    Drain(drain::Drain),
    /// Put a node, or units on it, back in service
    Undrain(drain::Undrain),
    /// List the drained nodes and units
    Drained(drain::Drained),
    /// Show where a unit runs (and is healthy); exit 0 only if it runs somewhere
    Where(where_::Where),
    /// Print droverctl's version
    Version(version::Version),
}
