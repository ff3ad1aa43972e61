//! Which sections a daemon's files may hold, and in which dialect.
//!
//! Both daemons accept their own section under drover's name and under
//! BlueChi's (`[drover-manager]` or `[bluechi-controller]`; `[drover-agent]` or
//! `[bluechi-agent]`), in every file they read — drover's, BlueChi's and
//! `-c FILE` — so BlueChi's files work unchanged. The manager also takes
//! `[node NAME]`. Both section names take the same keys; the dialect only
//! decides what happens to a BlueChi key drover cannot honour (an error in
//! drover's section, a warning naming the key in BlueChi's: see the loaders).
//! Any other section is an error naming the file and line, with a hint when
//! it is the other daemon's section.

use crate::ConfigError;
use crate::ini::{Document, Section};

/// The manager's section, drover's name and BlueChi's.
pub(crate) const MANAGER: &str = "drover-manager";
pub(crate) const MANAGER_BLUECHI: &str = "bluechi-controller";
/// The agent's section, drover's name and BlueChi's.
pub(crate) const AGENT: &str = "drover-agent";
pub(crate) const AGENT_BLUECHI: &str = "bluechi-agent";

/// The daemon whose files are being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Daemon {
    Manager,
    Agent,
}

/// Whose name the section header used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Drover,
    BlueChi,
}

/// What a section is to the daemon reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind<'a> {
    /// The daemon's own keys.
    Main(Dialect),
    /// `[node NAME]` (manager only); `""` for a bare `[node]`, so that the
    /// loader reports it as a bad node name rather than an unknown section.
    Node(&'a str),
    /// `[health NAME]` (agent only): a node check (`crate::health`); `""`
    /// for a bare `[health]`, reported as a bad name by the loader.
    Health(&'a str),
}

impl Daemon {
    /// drover's and BlueChi's name of the daemon's own section.
    pub fn sections(self) -> (&'static str, &'static str) {
        match self {
            Daemon::Manager => (MANAGER, MANAGER_BLUECHI),
            Daemon::Agent => (AGENT, AGENT_BLUECHI),
        }
    }

    /// The name of the daemon's own section in `dialect`.
    pub fn section(self, dialect: Dialect) -> &'static str {
        let (drover, bluechi) = self.sections();
        match dialect {
            Dialect::Drover => drover,
            Dialect::BlueChi => bluechi,
        }
    }

    fn other(self) -> Daemon {
        match self {
            Daemon::Manager => Daemon::Agent,
            Daemon::Agent => Daemon::Manager,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Daemon::Manager => "manager",
            Daemon::Agent => "agent",
        }
    }
}

/// Classifies `section` of `doc` for `daemon`, or the error for a section the
/// daemon does not know.
pub(crate) fn classify<'a>(
    doc: &Document,
    section: &'a Section,
    daemon: Daemon,
) -> Result<Kind<'a>, ConfigError> {
    let (drover, bluechi) = daemon.sections();
    let name = section.name.as_str();
    if name == drover {
        return Ok(Kind::Main(Dialect::Drover));
    }
    if name == bluechi {
        return Ok(Kind::Main(Dialect::BlueChi));
    }
    if daemon == Daemon::Manager
        && let Some(node) = named_section(name, "node")
    {
        return Ok(Kind::Node(node));
    }
    if daemon == Daemon::Agent
        && let Some(check) = named_section(name, "health")
    {
        return Ok(Kind::Health(check));
    }
    let (o_drover, o_bluechi) = daemon.other().sections();
    let hint = if name == o_drover || name == o_bluechi {
        format!(" ([{name}] is the {}'s section)", daemon.other().noun())
    } else {
        String::new()
    };
    let node = if daemon == Daemon::Manager {
        " or [node NAME]"
    } else {
        " or [health NAME]"
    };
    Err(ConfigError::Syntax {
        path: doc.path.clone(),
        line: section.line,
        message: format!(
            "unknown section [{name}]: expected [{drover}] (or BlueChi's [{bluechi}]){node}{hint}"
        ),
    })
}

/// `NAME` of a `WORD NAME` section header (`node NAME`, `health NAME`);
/// `Some("")` for a bare `WORD`.
fn named_section<'a>(section: &'a str, word: &str) -> Option<&'a str> {
    let rest = section.strip_prefix(word)?;
    if rest.is_empty() {
        return Some("");
    }
    rest.starts_with(char::is_whitespace).then(|| rest.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn kind(text: &str, daemon: Daemon) -> Result<Kind<'static>, String> {
        let doc = crate::ini::parse(Path::new("f.conf"), text).unwrap();
        let doc: &'static Document = Box::leak(Box::new(doc));
        classify(doc, &doc.sections[0], daemon).map_err(|e| e.to_string())
    }

    #[test]
    fn both_dialects_and_node_sections() {
        use Daemon::*;
        assert_eq!(
            kind("[drover-manager]", Manager),
            Ok(Kind::Main(Dialect::Drover))
        );
        assert_eq!(
            kind("[bluechi-controller]", Manager),
            Ok(Kind::Main(Dialect::BlueChi))
        );
        assert_eq!(
            kind("[drover-agent]", Agent),
            Ok(Kind::Main(Dialect::Drover))
        );
        assert_eq!(
            kind("[bluechi-agent]", Agent),
            Ok(Kind::Main(Dialect::BlueChi))
        );
        assert_eq!(kind("[node a-1]", Manager), Ok(Kind::Node("a-1")));
        assert_eq!(kind("[node]", Manager), Ok(Kind::Node("")));
        assert_eq!(kind("[health disk]", Agent), Ok(Kind::Health("disk")));
        assert_eq!(kind("[health]", Agent), Ok(Kind::Health("")));
        assert!(kind("[health disk]", Manager).is_err());
    }

    #[test]
    fn other_sections_are_errors_with_a_hint() {
        use Daemon::*;
        let e = kind("\n[bluechi-agent]", Manager).unwrap_err();
        assert_eq!(
            e,
            "f.conf:2: unknown section [bluechi-agent]: expected [drover-manager] \
             (or BlueChi's [bluechi-controller]) or [node NAME] ([bluechi-agent] is the agent's section)"
        );
        let e = kind("[drover-manager]", Agent).unwrap_err();
        assert!(e.contains("is the manager's section"), "{e}");
        let e = kind("[node a]", Agent).unwrap_err();
        assert_eq!(
            e,
            "f.conf:1: unknown section [node a]: expected [drover-agent] (or BlueChi's [bluechi-agent]) or [health NAME]"
        );
        assert!(kind("[nodes]", Manager).is_err());
        assert!(kind("[Drover-Manager]", Manager).is_err());
    }
}
