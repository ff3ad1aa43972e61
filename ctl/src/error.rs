//! droverctl's error type and exit codes.
//!
//! Every failure a user can see is one [`CtlError`] variant, printed as one line
//! `droverctl: <message>` on stderr by the binary. D-Bus error names are turned
//! into variants in exactly one place, [`crate::client::Client::classify`], so the
//! friendly wording lives here and nowhere else.
//!
//! Exit codes are a contract with scripts (documented in `--help` and the man page):
//! [`EXIT_OK`] 0, [`EXIT_FAILED`] 1 (the operation failed), [`EXIT_USAGE`] 2 (the
//! command line was wrong and nothing was sent).

use std::time::Duration;

/// The command did what was asked.
pub const EXIT_OK: u8 = 0;
/// The operation failed: job result not `done`, node offline, unknown node or unit,
/// manager unreachable, any other D-Bus error.
pub const EXIT_FAILED: u8 = 1;
/// The command line was wrong (clap uses 2 too); nothing was sent.
pub const EXIT_USAGE: u8 = 2;

/// Everything that can go wrong in a droverctl command.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A command-line problem found after clap's parsing (e.g. a bad `$DROVER_BUS`).
    #[error("{0}")]
    Usage(String),

    /// The bus itself could not be reached.
    #[error("cannot reach drover-manager: cannot connect to {bus}: {reason}")]
    Connect { bus: String, reason: String },

    /// Nobody owns `org.eclipse.bluechi` on the bus we talk to.
    #[error("cannot reach drover-manager on {bus}: is it running?")]
    ManagerUnreachable { bus: String },

    /// The manager released its name (exited, crashed, restarted) while we waited for a job.
    #[error(
        "drover-manager left {bus} while waiting for job {job} ({operation} of unit {unit} on node {node}); its outcome is unknown"
    )]
    ManagerVanished {
        bus: String,
        job: String,
        operation: &'static str,
        unit: String,
        node: String,
    },

    /// Our own connection to the bus closed under us.
    #[error("lost the connection to {bus}")]
    BusClosed { bus: String },

    #[error("node '{0}' not found")]
    NodeNotFound(String),

    #[error("node {0} is offline")]
    NodeOffline(String),

    #[error("unit {unit} not found on node {node}")]
    UnitNotFound { unit: String, node: String },

    /// The job ended, but not with `done` (the result line is already on stdout).
    #[error("{operation} of unit {unit} on node {node} finished with result '{result}'{why}")]
    JobFailed {
        operation: &'static str,
        unit: String,
        node: String,
        result: String,
        /// For `dependency`: which dependencies failed, one line each
        /// (each line starts with a newline); else empty.
        why: String,
    },

    /// `--timeout` ran out before the job's `JobRemoved` arrived (or before the
    /// manager even answered the call: then there is no job path yet).
    #[error(
        "timed out after {} s waiting for {operation} of unit {unit} on node {node}{}; the job may still be running",
        .after.as_secs_f64(),
        .job.as_ref().map(|j| format!(" (job {j})")).unwrap_or_default()
    )]
    Timeout {
        after: Duration,
        job: Option<String>,
        operation: &'static str,
        unit: String,
        node: String,
    },

    /// drover-manager released its name while a long-running command (`monitor`,
    /// `status -w`, `metrics listen`) followed it.
    #[error("drover-manager left {bus}; stopped {what}")]
    ManagerLeft { bus: String, what: &'static str },

    /// `status NODE UNIT...`: some units do not exist; each was already reported on
    /// stderr as `Unit X could not be found.` (bluechictl's words).
    #[error("{} unit(s) not found on node {node}: {}", .units.len(), .units.join(", "))]
    UnitsNotFound { node: String, units: Vec<String> },

    /// `list-units` over all nodes: these online nodes could not be listed
    /// (the rest was printed; each node's reason went to stderr first).
    #[error("{} node(s) left out of the list: {}", .nodes.len(), .nodes.join(", "))]
    NodesLeftOut { nodes: Vec<String> },

    /// `is-enabled`: the state (already printed) is not an enabled one. Like
    /// `systemctl is-enabled`, only the exit status says so.
    #[error("unit {unit} on node {node} is {state}")]
    NotEnabled {
        unit: String,
        node: String,
        state: String,
    },

    /// `is-healthy`: the state (already printed) is not `healthy`. Only the exit
    /// status says so.
    #[error("unit {unit} on node {node} is {state}")]
    NotHealthy {
        unit: String,
        node: String,
        state: String,
    },

    /// `where`: no node matches (the empty answer is already printed). Only
    /// the exit status says so.
    #[error("unit {unit} runs on no node that matches")]
    NowhereToBeFound { unit: String },

    /// The manager on this bus stands by (high availability): `io.drover.NotLeader`,
    /// whose message names the leader (docs/ha.md).
    #[error("{}", not_leader_line(.bus, .message))]
    NotLeader { bus: String, message: String },

    /// Any other D-Bus error, passed through with its name so nothing is hidden.
    #[error("{what} failed: {name}: {message}")]
    DBus {
        what: String,
        name: String,
        message: String,
    },

    /// Whoever reads our output closed it (`droverctl list-units | head`): nothing
    /// more to say to anyone, so no message and exit 0, like a tool killed by
    /// SIGPIPE is silent.
    #[error("output closed by its reader")]
    OutputClosed,

    /// A local problem that is not D-Bus (e.g. writing to stdout failed).
    #[error("{0}")]
    Other(String),
}

impl CtlError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Usage(_) => EXIT_USAGE,
            CtlError::OutputClosed => EXIT_OK,
            _ => EXIT_FAILED,
        }
    }

    /// Whether the command already told the user everything (stdout or stderr), so
    /// the binary adds no `droverctl: ...` line, only the exit status.
    pub fn is_quiet(&self) -> bool {
        matches!(
            self,
            CtlError::UnitsNotFound { .. }
                | CtlError::NotEnabled { .. }
                | CtlError::NotHealthy { .. }
                | CtlError::NowhereToBeFound { .. }
                | CtlError::OutputClosed
        )
    }
}

/// The most characters of a manager's `NotLeader` message droverctl repeats.
const MAX_NOT_LEADER: usize = 300;

/// One line for [`CtlError::NotLeader`]: which bus, then the manager's words
/// (bounded, control characters escaped: they come from the other end).
fn not_leader_line(bus: &str, message: &str) -> String {
    let said = crate::output::one_line(message, MAX_NOT_LEADER);
    let said = said
        .strip_prefix("this drover manager stands by; ")
        .map(str::to_owned)
        .unwrap_or(said);
    format!(
        "the drover-manager on {bus} stands by and serves no calls; {said}. \
         Run droverctl against the leader's bus"
    )
}

impl From<std::io::Error> for CtlError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return CtlError::OutputClosed;
        }
        CtlError::Other(format!("cannot write output: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_names_the_bus_and_the_leader_on_one_line() {
        let e = CtlError::NotLeader {
            bus: "unix:path=/b".into(),
            message: "this drover manager stands by; the leader is mgr-a:842 (epoch 12)".into(),
        };
        assert_eq!(e.exit_code(), EXIT_FAILED);
        assert!(!e.is_quiet());
        assert_eq!(
            e.to_string(),
            "the drover-manager on unix:path=/b stands by and serves no calls; the leader is \
             mgr-a:842 (epoch 12). Run droverctl against the leader's bus"
        );
        // Whatever the other end says stays one bounded line.
        let hostile = CtlError::NotLeader {
            bus: "b".into(),
            message: format!("x\ny\r{}", "z".repeat(10_000)),
        };
        let line = hostile.to_string();
        assert!(!line.contains(['\n', '\r']), "{line}");
        assert!(line.contains("x\\ny\\r"), "{line}");
        assert!(line.len() < 500, "{}", line.len());
    }

    #[test]
    fn a_closed_output_is_quiet_success_other_write_errors_fail() {
        let closed = CtlError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(matches!(closed, CtlError::OutputClosed));
        assert!(closed.is_quiet());
        assert_eq!(closed.exit_code(), EXIT_OK);
        let full = CtlError::from(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert!(!full.is_quiet());
        assert_eq!(full.exit_code(), EXIT_FAILED);
        assert!(
            full.to_string().starts_with("cannot write output"),
            "{full}"
        );
    }
}
