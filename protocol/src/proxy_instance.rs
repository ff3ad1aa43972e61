//! The proxy instance: `NODE_UNIT`, as systemd's `%i` gives it for
//! `drover-proxy@NODE_UNIT.service`, and the proxy unit names built from it.
//!
//! The helper parses the instance it is run with ([`ProxyInstance::parse`]);
//! the agent recognises proxy units among the units systemd reports
//! ([`ProxyInstance::from_unit_name`]) and checks the proxy unit a
//! `CreateProxy` caller names ([`proxy_template_of`], and
//! [`ProxyInstance::proxy_of`]: the proxy unit must be the proxy of the very
//! node and unit the call names). One rule for all of them:
//!
//! * the instance splits at the **first** `_`: everything before is the target
//!   node, everything after the target unit (node names cannot contain `_`, so
//!   the split is never ambiguous; unit names may);
//! * a unit without a type suffix means `.service` (`node2_db` → `db.service`);
//!   any other unit type is kept (`node2_data.mount`);
//! * node and unit must be valid ([`NodeName`], [`UnitName`]) and the unit must
//!   not be a template (`foo@.service` cannot be started);
//! * the proxy unit's own name, `drover-proxy@INSTANCE.service`, must be a
//!   valid unit name too: it is what the agent stops when the target goes down.
//!
//! The templates whose instances are proxies are one table,
//! [`PROXY_PREFIXES`]; accepting another template (BlueChi's
//! `bluechi-proxy@`) is one more entry there. The first entry is drover's own,
//! the one [`ProxyInstance::parse`] names units after.
//!
//! Everything here is pure: a rejected instance never reaches the bus.

use crate::names::{NameError, NodeName, UnitName, printable};
use std::fmt;

/// The prefixes (`TEMPLATE@`) of the unit templates whose instances are
/// proxy units; the first is drover's own.
pub const PROXY_PREFIXES: &[&str] = &["drover-proxy@"];

/// drover's own proxy template prefix, the one [`ProxyInstance::parse`] uses.
const OWN_PREFIX: &str = PROXY_PREFIXES[0];

/// The suffix of every proxy unit: the templates are services.
const PROXY_SUFFIX: &str = ".service";

/// The prefix of the proxy template `unit` is an instance of (anything after
/// `TEMPLATE@` but a bare `.`, i.e. not the template itself); `None` if it is
/// none of [`PROXY_PREFIXES`]. Only the prefix is checked: the type suffix and
/// the instance are the caller's to validate.
pub fn proxy_template_of(unit: &str) -> Option<&'static str> {
    PROXY_PREFIXES.iter().copied().find(|prefix| {
        unit.strip_prefix(prefix)
            .is_some_and(|rest| !rest.starts_with('.'))
    })
}

/// The proxy templates as a user names them, for messages
/// (`drover-proxy@.service`).
pub fn proxy_templates_text() -> String {
    PROXY_PREFIXES
        .iter()
        .map(|p| format!("{p}{PROXY_SUFFIX}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Why an instance name was refused. The text is the one line the helper prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceError {
    #[error("the proxy instance is empty (expected NODE_UNIT, e.g. node2_db)")]
    Empty,
    #[error(
        "proxy instance '{0}' has no '_' between node and unit (expected NODE_UNIT, e.g. node2_db)"
    )]
    NoSeparator(String),
    #[error("proxy instance '{instance}': bad target node: {source}")]
    Node { instance: String, source: NameError },
    #[error("proxy instance '{instance}': bad target unit: {source}")]
    Unit { instance: String, source: NameError },
    #[error(
        "proxy instance '{instance}': target unit '{unit}' is a template; name an instance of it (e.g. {example})"
    )]
    Template {
        instance: String,
        unit: String,
        example: String,
    },
    #[error("proxy instance '{instance}': the proxy unit name would be invalid: {source}")]
    ProxyUnit { instance: String, source: NameError },
}

/// Why a `(proxy unit, node, unit)` triple is not one proxy
/// ([`ProxyInstance::proxy_of`]). The text is the message a caller gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyMismatch {
    #[error(
        "'{proxy_unit}' is not a proxy unit (expected an instance of {templates} naming NODE_UNIT)"
    )]
    NotAProxy {
        proxy_unit: String,
        templates: String,
    },
    #[error(
        "'{proxy_unit}' is the proxy of {target}, not of {unit} on node {node}; a proxy unit may only ask for its own target"
    )]
    OtherTarget {
        proxy_unit: String,
        target: String,
        node: String,
        unit: String,
    },
}

/// A validated proxy instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInstance {
    instance: String,
    node: NodeName,
    unit: UnitName,
    proxy_unit: UnitName,
}

impl ProxyInstance {
    /// Parses and validates `NODE_UNIT` (see the module docs); the proxy unit
    /// is an instance of drover's own template.
    pub fn parse(instance: &str) -> Result<Self, InstanceError> {
        Self::parse_for(OWN_PREFIX, instance)
    }

    /// The proxy behind a proxy unit's own name
    /// (`drover-proxy@bar_db.service` → `db.service` on `bar`), for any of
    /// [`PROXY_PREFIXES`]; `None` for any other unit or an invalid instance.
    pub fn from_unit_name(unit: &str) -> Option<Self> {
        let prefix = proxy_template_of(unit)?;
        let instance = unit.strip_prefix(prefix)?.strip_suffix(PROXY_SUFFIX)?;
        Self::parse_for(prefix, instance).ok()
    }

    /// The proxy behind `proxy_unit` when it is exactly a proxy of `unit`
    /// on `node` ([`ProxyInstance::from_unit_name`] of it names that very
    /// node and unit). Several proxy units may name one target
    /// (`drover-proxy@bar_db.service` and `drover-proxy@bar_db.service.service`
    /// both mean `db.service` on `bar`); each is accepted for that target and
    /// for no other. This is what keeps a `CreateProxy` from binding one
    /// proxy unit to another unit's target: the agent stops the named proxy
    /// unit when the target goes down.
    pub fn proxy_of(proxy_unit: &str, node: &str, unit: &str) -> Result<Self, ProxyMismatch> {
        let p = Self::from_unit_name(proxy_unit).ok_or_else(|| ProxyMismatch::NotAProxy {
            proxy_unit: printable(proxy_unit),
            templates: proxy_templates_text(),
        })?;
        if p.node.as_str() == node && p.unit.as_str() == unit {
            Ok(p)
        } else {
            Err(ProxyMismatch::OtherTarget {
                proxy_unit: printable(proxy_unit),
                target: p.to_string(),
                node: printable(node),
                unit: printable(unit),
            })
        }
    }

    fn parse_for(prefix: &str, instance: &str) -> Result<Self, InstanceError> {
        if instance.is_empty() {
            return Err(InstanceError::Empty);
        }
        let shown = printable(instance);
        let Some((node, unit)) = instance.split_once('_') else {
            return Err(InstanceError::NoSeparator(shown));
        };
        let node = NodeName::new(node).map_err(|source| InstanceError::Node {
            instance: shown.clone(),
            source,
        })?;
        // `with_default_suffix("")` would complain about ".service"; say what is wrong.
        let unit = if unit.is_empty() {
            Err(NameError::EmptyUnit)
        } else {
            UnitName::with_default_suffix(unit)
        };
        let unit = unit.map_err(|source| InstanceError::Unit {
            instance: shown.clone(),
            source,
        })?;
        if unit.is_template() {
            let example = unit.as_str().replacen("@.", "@1.", 1);
            return Err(InstanceError::Template {
                instance: shown,
                unit: unit.as_str().to_string(),
                example,
            });
        }
        let proxy_unit =
            UnitName::new(format!("{prefix}{instance}{PROXY_SUFFIX}")).map_err(|source| {
                InstanceError::ProxyUnit {
                    instance: shown.clone(),
                    source,
                }
            })?;
        Ok(Self {
            instance: instance.to_string(),
            node,
            unit,
            proxy_unit,
        })
    }

    /// The instance as given (`node2_db`).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The target node.
    pub fn node(&self) -> &NodeName {
        &self.node
    }

    /// The target unit, with its type suffix (`db.service`).
    pub fn unit(&self) -> &UnitName {
        &self.unit
    }

    /// The local proxy unit: `drover-proxy@INSTANCE.service`.
    pub fn proxy_unit(&self) -> &UnitName {
        &self.proxy_unit
    }
}

impl fmt::Display for ProxyInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on node {}", self.unit, self.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (String, String, String) {
        let p = ProxyInstance::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        (
            p.node().to_string(),
            p.unit().to_string(),
            p.proxy_unit().to_string(),
        )
    }

    fn err(s: &str) -> String {
        match ProxyInstance::parse(s) {
            Ok(p) => panic!("{s:?} was accepted as {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn splits_at_the_first_underscore_and_defaults_to_service() {
        assert_eq!(
            ok("node2_db"),
            (
                "node2".into(),
                "db.service".into(),
                "drover-proxy@node2_db.service".into()
            )
        );
        // The unit keeps every later '_'.
        assert_eq!(ok("bar_my_db").1, "my_db.service");
        assert_eq!(ok("bar_my_db.service").1, "my_db.service");
        assert_eq!(
            ok("bar_my_db.service").2,
            "drover-proxy@bar_my_db.service.service"
        );
        // Node names with '-' and '.' are fine.
        assert_eq!(ok("node-2.lab_db").0, "node-2.lab");
    }

    #[test]
    fn other_unit_types_are_kept() {
        assert_eq!(ok("n_data.mount").1, "data.mount");
        assert_eq!(ok("n_web.socket").1, "web.socket");
        assert_eq!(ok("n_multi-user.target").1, "multi-user.target");
        assert_eq!(ok("n_backup.timer").1, "backup.timer");
        // An unknown "suffix" is part of the name: db.v2 → db.v2.service.
        assert_eq!(ok("n_db.v2").1, "db.v2.service");
    }

    #[test]
    fn instances_of_templates_are_targets_templates_are_not() {
        assert_eq!(ok("n_getty@tty1").1, "getty@tty1.service");
        assert_eq!(ok("n_worker@a@b.service").1, "worker@a@b.service");
        let e = err("n_getty@");
        assert!(e.contains("is a template"), "{e}");
        assert!(e.contains("getty@1.service"), "{e}");
        assert!(err("n_getty@.service").contains("is a template"));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        assert_eq!(
            err(""),
            "the proxy instance is empty (expected NODE_UNIT, e.g. node2_db)"
        );
        assert!(err("bad").contains("no '_' between node and unit"));
        assert!(err("_x").contains("bad target node: node name is empty"));
        assert!(err("node_").contains("bad target unit: unit name is empty"));
        assert!(err("a b_c").contains("bad target node: invalid node name 'a b'"));
        assert!(err("node_a b").contains("bad target unit"));
        assert!(err("-x_db").contains("bad target node"));
        assert!(err("n_.service").contains("bad target unit"));
        assert!(err("n_db/../x").contains("bad target unit"));
        assert!(err("n_db\n").contains("bad target unit"));
        assert!(err("n\u{e9}_db").contains("bad target node"));
        assert!(err("n_\u{0}").contains("bad target unit"));
        let long_node = format!("{}_db", "n".repeat(65));
        assert!(err(&long_node).contains("longer than 64"));
        let long_unit = format!("n_{}", "u".repeat(300));
        assert!(err(&long_unit).contains("longer than 255"));
    }

    #[test]
    fn the_proxy_unit_name_must_fit_too() {
        // The target fits in 255 bytes, "drover-proxy@n_" + ".service" does not.
        let unit = format!("{}.service", "u".repeat(240));
        let e = err(&format!("n_{unit}"));
        assert!(e.contains("proxy unit name would be invalid"), "{e}");
    }

    #[test]
    fn messages_quote_control_characters_and_stay_short() {
        let e = err("no\nseparator");
        assert!(e.contains("no\\nseparator"), "{e}");
        assert!(!e.contains('\n'));
        let e = err(&"x".repeat(500));
        assert!(e.len() < 200, "{e}");
        assert!(e.contains('…'));
    }

    #[test]
    fn display_names_target() {
        let p = ProxyInstance::parse("node2_db").unwrap();
        assert_eq!(p.to_string(), "db.service on node node2");
        assert_eq!(p.instance(), "node2_db");
    }

    #[test]
    fn proxy_units_map_back_to_their_instance() {
        let p = ProxyInstance::from_unit_name("drover-proxy@bar_my_db.socket.service").unwrap();
        assert_eq!(
            (p.node().as_str(), p.unit().as_str()),
            ("bar", "my_db.socket")
        );
        assert_eq!(
            p.proxy_unit().as_str(),
            "drover-proxy@bar_my_db.socket.service"
        );
        for bad in [
            "drover-proxy@.service",
            "drover-proxy@bar.service",
            "drover-proxy@bar_db.socket",
            "drover-proxy@bar_getty@.service",
            "other@bar_db.service",
        ] {
            assert!(ProxyInstance::from_unit_name(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_proxy_unit_is_the_proxy_of_its_own_target_only() {
        let p =
            ProxyInstance::proxy_of("drover-proxy@bar_db.service", "bar", "db.service").unwrap();
        assert_eq!(p.instance(), "bar_db");
        // The explicit suffix spelling names the same target.
        ProxyInstance::proxy_of("drover-proxy@bar_db.service.service", "bar", "db.service")
            .unwrap();
        ProxyInstance::proxy_of("drover-proxy@bar_data.mount.service", "bar", "data.mount")
            .unwrap();
        for (local, node, unit) in [
            ("drover-proxy@bar_db.service", "foo", "db.service"),
            ("drover-proxy@bar_db.service", "bar", "web.service"),
            ("drover-proxy@bar_db.service", "bar", "db"),
            ("drover-proxy@bar_db.service", "bar", "db.socket"),
            ("drover-proxy@bar_my_db.service", "bar_my", "db.service"),
        ] {
            let e = ProxyInstance::proxy_of(local, node, unit).unwrap_err();
            assert!(
                matches!(e, ProxyMismatch::OtherTarget { .. }),
                "{local} {node} {unit}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("is the proxy of db.service on node bar") || text.contains("my_db"),
                "{text}"
            );
        }
        for local in [
            "db.service",
            "drover-proxy@.service",
            "drover-proxy@bar.service",
            "drover-proxy@bar_db.socket",
            "other@bar_db.service",
            "",
        ] {
            let e = ProxyInstance::proxy_of(local, "bar", "db.service").unwrap_err();
            assert!(matches!(e, ProxyMismatch::NotAProxy { .. }), "{local}: {e}");
            assert!(e.to_string().contains("drover-proxy@.service"), "{e}");
        }
        let e = ProxyInstance::proxy_of("drover-proxy@bar_db.service", "bar\n", "x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn the_template_table_names_proxy_units() {
        assert_eq!(
            proxy_template_of("drover-proxy@bar_t.timer"),
            Some("drover-proxy@")
        );
        assert_eq!(proxy_template_of("drover-proxy@.service"), None);
        assert_eq!(proxy_template_of("db.service"), None);
        assert_eq!(proxy_templates_text(), "drover-proxy@.service");
    }
}
