//! Validated names. Every node or unit name that comes from outside (config,
//! D-Bus call, CLI argument, wire frame, proxy instance) is checked here, so
//! the rest of the code can rely on a [`NodeName`] or [`UnitName`] being sane.
//!
//! Node names: 1–64 bytes of ASCII letters, digits, `-` and `.`, starting with
//! a letter or digit. `_` is excluded on purpose: a proxy instance
//! `drover-proxy@NODE_UNIT` splits at the first `_`, so a node name with `_`
//! could never be a dependency target (a silent trap in BlueChi).
//!
//! Unit names follow systemd's rules (`unit_name_is_valid`): at most 255 bytes,
//! `PREFIX[@INSTANCE].TYPE` with a known type, prefix and instance made of
//! `[A-Za-z0-9:_.\-]` (instances may also hold `@` and `\`), non-empty prefix.

use serde::{Deserialize, Serialize};
use std::fmt;

pub const NODE_NAME_MAX: usize = 64;
pub const UNIT_NAME_MAX: usize = 255;

/// Unit types systemd knows.
pub const UNIT_TYPES: &[&str] = &[
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("node name is empty")]
    EmptyNode,
    #[error("node name '{0}' is longer than {NODE_NAME_MAX} bytes")]
    NodeTooLong(String),
    #[error(
        "invalid node name '{0}': use ASCII letters, digits, '-' and '.', starting with a letter or digit"
    )]
    BadNode(String),
    #[error("unit name is empty")]
    EmptyUnit,
    #[error("unit name '{0}' is longer than {UNIT_NAME_MAX} bytes")]
    UnitTooLong(String),
    #[error("invalid unit name '{0}': {1}")]
    BadUnit(String, &'static str),
}

/// A node name that passed validation.
///
/// Shared, not copied: a manager keeps a node's name in a dozen places
/// (its tables, its session, its records) for each of up to tens of
/// thousands of nodes, and a clone is a count, not an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeName(std::sync::Arc<str>);

impl NodeName {
    pub fn new(s: impl Into<String>) -> Result<Self, NameError> {
        let s = s.into();
        if s.is_empty() {
            return Err(NameError::EmptyNode);
        }
        if s.len() > NODE_NAME_MAX {
            return Err(NameError::NodeTooLong(printable(&s)));
        }
        let first_ok = s.as_bytes()[0].is_ascii_alphanumeric();
        let rest_ok = s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !first_ok || !rest_ok {
            return Err(NameError::BadNode(printable(&s)));
        }
        Ok(Self(s.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A systemd unit name that passed validation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnitName(String);

fn prefix_char_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-' | b'\\')
}

impl UnitName {
    pub fn new(s: impl Into<String>) -> Result<Self, NameError> {
        let s = s.into();
        if s.is_empty() {
            return Err(NameError::EmptyUnit);
        }
        if s.len() > UNIT_NAME_MAX {
            return Err(NameError::UnitTooLong(printable(&s)));
        }
        let bad = |why| Err(NameError::BadUnit(printable(&s), why));
        let Some((stem, ty)) = s.rsplit_once('.') else {
            return bad("it has no type suffix such as '.service'");
        };
        if !UNIT_TYPES.contains(&ty) {
            return bad("unknown unit type suffix");
        }
        let (prefix, instance) = match stem.split_once('@') {
            Some((p, i)) => (p, Some(i)),
            None => (stem, None),
        };
        if prefix.is_empty() {
            return bad("the name before the type suffix is empty");
        }
        if !prefix.bytes().all(prefix_char_ok) {
            return bad("it contains a character systemd does not allow");
        }
        if let Some(instance) = instance
            && !instance.bytes().all(|b| prefix_char_ok(b) || b == b'@')
        {
            return bad("the instance contains a character systemd does not allow");
        }
        Ok(Self(s))
    }

    /// Like [`UnitName::new`], but a name without a known type suffix gets
    /// `.service` appended first (what `systemctl start foo` does).
    pub fn with_default_suffix(s: &str) -> Result<Self, NameError> {
        let has_type = s
            .rsplit_once('.')
            .is_some_and(|(_, ty)| UNIT_TYPES.contains(&ty));
        if has_type {
            Self::new(s)
        } else {
            Self::new(format!("{s}.service"))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The type suffix, e.g. `service`.
    pub fn unit_type(&self) -> &str {
        self.0.rsplit_once('.').map(|(_, t)| t).unwrap_or_default()
    }

    /// A template (`foo@.service`) cannot be started; an instance can.
    pub fn is_template(&self) -> bool {
        self.0
            .rsplit_once('.')
            .is_some_and(|(stem, _)| stem.ends_with('@'))
    }
}

/// Error messages quote names from outside; keep them printable and short.
pub(crate) fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_default).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

macro_rules! string_newtype {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
        impl std::str::FromStr for $t {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}
string_newtype!(NodeName);
string_newtype!(UnitName);

impl From<NodeName> for String {
    fn from(n: NodeName) -> String {
        n.0.as_ref().to_owned()
    }
}

impl From<UnitName> for String {
    fn from(n: UnitName) -> String {
        n.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manager keeps a node's name in many places: they share it.
    #[test]
    fn a_node_names_clones_share_its_text() {
        let name = NodeName::new("node-01234").unwrap();
        let copy = name.clone();
        assert_eq!(copy, name);
        assert!(std::ptr::eq(copy.as_str(), name.as_str()));
        assert_eq!(String::from(copy), "node-01234");
    }

    #[test]
    fn node_names() {
        for ok in ["node1", "a", "node-bar", "host.example.com", "9lives"] {
            assert!(NodeName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-x",
            ".x",
            "a_b",
            "a b",
            "é",
            "a/b",
            "a\0b",
            &"x".repeat(65),
        ] {
            assert!(NodeName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unit_names() {
        for ok in [
            "web.service",
            "getty@tty1.service",
            "drover-dep@db.service.service",
            "foo@.service",
            "a:b_c-d.timer",
            "-.mount",
            "dev-sda1.device",
            "x\\x2d.slice",
        ] {
            assert!(UnitName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "web",
            "web.nope",
            ".service",
            "@x.service",
            "a b.service",
            "a/b.service",
            "ä.service",
            &format!("{}.service", "x".repeat(250)),
        ] {
            assert!(UnitName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_suffix() {
        assert_eq!(
            UnitName::with_default_suffix("db").unwrap().as_str(),
            "db.service"
        );
        assert_eq!(
            UnitName::with_default_suffix("db.socket").unwrap().as_str(),
            "db.socket"
        );
        assert!(UnitName::with_default_suffix("a b").is_err());
        assert!(UnitName::new("foo@.service").unwrap().is_template());
        assert!(!UnitName::new("foo@a.service").unwrap().is_template());
    }

    #[test]
    fn serde_rejects_bad_names() {
        let bytes = postcard::to_stdvec(&"a b".to_string()).unwrap();
        assert!(postcard::from_bytes::<NodeName>(&bytes).is_err());
        assert!(postcard::from_bytes::<UnitName>(&bytes).is_err());
    }
}
