//! The proxy instance: `NODE_UNIT`, as systemd's `%i` gives it for
//! `drover-proxy@NODE_UNIT.service` (or BlueChi's
//! `bluechi-proxy@NODE_UNIT.service`), and the proxy unit names built from it.
//!
//! The helper parses the argument it is run with ([`ProxyInstance::parse`],
//! [`ProxyInstance::parse_arg`]); the agent recognises proxy units among the
//! units systemd reports ([`ProxyInstance::from_unit_name`]) and checks the
//! proxy unit a `CreateProxy` caller names ([`ProxyTemplate::of_unit`], and
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
//! * the proxy unit's own name, `TEMPLATE@INSTANCE.service`, must be a
//!   valid unit name too: it is what the agent stops when the target goes down.
//!
//! # Template families
//!
//! Proxy units are instances of one of the [`ProxyTemplate`]s: drover's own
//! `drover-proxy@.service`, or BlueChi's `bluechi-proxy@.service` (shipped by
//! drover's optional BlueChi compatibility set, so that unit files written for
//! BlueChi, `Wants=bluechi-proxy@bar_db.service`, work unchanged). The family
//! changes only the proxy unit's name and how the helper is given the instance;
//! the instance rule above is the same for both, and the agent treats both
//! alike (a proxy's identity is its proxy unit, its node and its unit).
//!
//! * drover's template runs `drover-proxy create %i`: the argument is the
//!   instance (`bar_db`);
//! * BlueChi's template runs `bluechi-proxy create %i.service` (the compat set
//!   installs `bluechi-proxy` as a link to drover's helper, which tells the
//!   family by the name it is run as, [`ProxyTemplate::of_program`]): the
//!   argument is the proxy unit's name without its template prefix
//!   (`bar_db.service`), and the proxy unit is `bluechi-proxy@` + argument.
//!
//! For every target BlueChi accepts (a `.service` named without its suffix,
//! `bar_db`) both families name the same unit; drover's rule also accepts
//! other unit types (`bar_data.mount`), where BlueChi would ask for
//! `data.mount.service`.
//!
//! Everything here is pure: a rejected instance never reaches the bus.

use crate::names::{NameError, NodeName, UnitName, printable};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The suffix of every proxy unit: the templates are services.
const PROXY_SUFFIX: &str = ".service";

/// A family of proxy units: the template they are instances of. It crosses
/// the wire in `Event::ProxyNew`: how a proxy ends depends on its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ProxyTemplate {
    /// `drover-proxy@.service`, drover's own.
    Drover,
    /// `bluechi-proxy@.service`, BlueChi's name (drover's compat set).
    Bluechi,
}

impl ProxyTemplate {
    /// Every family, drover's own first.
    pub const ALL: [ProxyTemplate; 2] = [ProxyTemplate::Drover, ProxyTemplate::Bluechi];

    /// The unit name prefix of its instances (`drover-proxy@`).
    pub fn prefix(self) -> &'static str {
        match self {
            ProxyTemplate::Drover => "drover-proxy@",
            ProxyTemplate::Bluechi => "bluechi-proxy@",
        }
    }

    /// The template unit itself (`drover-proxy@.service`).
    pub fn template_unit(self) -> &'static str {
        match self {
            ProxyTemplate::Drover => "drover-proxy@.service",
            ProxyTemplate::Bluechi => "bluechi-proxy@.service",
        }
    }

    /// The helper's program name under this family's template
    /// (`drover-proxy`, `bluechi-proxy`).
    pub fn program(self) -> &'static str {
        match self {
            ProxyTemplate::Drover => "drover-proxy",
            ProxyTemplate::Bluechi => "bluechi-proxy",
        }
    }

    /// The family of the helper run as `argv0` (a path or a bare name):
    /// BlueChi's when its file name is `bluechi-proxy`, drover's otherwise.
    pub fn of_program(argv0: &str) -> Self {
        let name = argv0.rsplit('/').next().unwrap_or(argv0);
        if name == ProxyTemplate::Bluechi.program() {
            ProxyTemplate::Bluechi
        } else {
            ProxyTemplate::Drover
        }
    }

    /// The family `unit` is an instance of (anything after `TEMPLATE@` but a
    /// bare `.`, i.e. not the template itself); `None` if it is none. Only
    /// the prefix is checked: the type suffix and the instance are the
    /// caller's to validate.
    pub fn of_unit(unit: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| {
            unit.strip_prefix(t.prefix())
                .is_some_and(|rest| !rest.starts_with('.'))
        })
    }

    /// What the helper's `INSTANCE` argument means under this family's
    /// template: drover's passes the instance itself, BlueChi's passes
    /// `%i.service`, whose suffix is stripped here.
    fn instance_of_arg(self, arg: &str) -> Result<&str, InstanceError> {
        match self {
            ProxyTemplate::Drover => Ok(arg),
            ProxyTemplate::Bluechi => arg
                .strip_suffix(PROXY_SUFFIX)
                .ok_or_else(|| InstanceError::BluechiArg(printable(arg))),
        }
    }
}

impl fmt::Display for ProxyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.template_unit())
    }
}

/// The proxy templates as a user names them, for messages
/// (`drover-proxy@.service or bluechi-proxy@.service`).
pub fn proxy_templates_text() -> String {
    ProxyTemplate::ALL
        .iter()
        .map(|t| t.template_unit())
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
    #[error(
        "bluechi-proxy argument '{0}' does not end in .service (expected NODE_UNIT.service, as bluechi-proxy@.service passes %i.service, e.g. node2_db.service)"
    )]
    BluechiArg(String),
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
    template: ProxyTemplate,
    instance: String,
    node: NodeName,
    unit: UnitName,
    proxy_unit: UnitName,
}

impl ProxyInstance {
    /// Parses and validates `NODE_UNIT` (see the module docs); the proxy unit
    /// is an instance of drover's own template.
    pub fn parse(instance: &str) -> Result<Self, InstanceError> {
        Self::parse_for(ProxyTemplate::Drover, instance)
    }

    /// Parses the helper's `INSTANCE` argument as `template`'s unit file
    /// passes it (see the module docs): `bar_db` for drover's,
    /// `bar_db.service` for BlueChi's.
    pub fn parse_arg(template: ProxyTemplate, arg: &str) -> Result<Self, InstanceError> {
        Self::parse_for(template, template.instance_of_arg(arg)?)
    }

    /// The proxy behind a proxy unit's own name
    /// (`drover-proxy@bar_db.service` or `bluechi-proxy@bar_db.service` →
    /// `db.service` on `bar`), for any [`ProxyTemplate`]; `None` for any
    /// other unit or an invalid instance.
    pub fn from_unit_name(unit: &str) -> Option<Self> {
        let template = ProxyTemplate::of_unit(unit)?;
        let instance = unit
            .strip_prefix(template.prefix())?
            .strip_suffix(PROXY_SUFFIX)?;
        Self::parse_for(template, instance).ok()
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

    fn parse_for(template: ProxyTemplate, instance: &str) -> Result<Self, InstanceError> {
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
        let proxy_unit = UnitName::new(format!("{}{instance}{PROXY_SUFFIX}", template.prefix()))
            .map_err(|source| InstanceError::ProxyUnit {
                instance: shown.clone(),
                source,
            })?;
        Ok(Self {
            template,
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

    /// The local proxy unit: `drover-proxy@INSTANCE.service` (or
    /// `bluechi-proxy@INSTANCE.service`).
    pub fn proxy_unit(&self) -> &UnitName {
        &self.proxy_unit
    }

    /// The family of its proxy unit.
    pub fn template(&self) -> ProxyTemplate {
        self.template
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
    fn the_template_families_name_proxy_units() {
        assert_eq!(
            ProxyTemplate::of_unit("drover-proxy@bar_t.timer"),
            Some(ProxyTemplate::Drover)
        );
        assert_eq!(
            ProxyTemplate::of_unit("bluechi-proxy@bar_db.service"),
            Some(ProxyTemplate::Bluechi)
        );
        for not_one in [
            "drover-proxy@.service",
            "bluechi-proxy@.service",
            "db.service",
            "bluechi-dep@db.service",
            "hirte-proxy@bar_db.service",
        ] {
            assert_eq!(ProxyTemplate::of_unit(not_one), None, "{not_one}");
        }
        assert_eq!(
            proxy_templates_text(),
            "drover-proxy@.service or bluechi-proxy@.service"
        );
        assert_eq!(ProxyTemplate::Bluechi.to_string(), "bluechi-proxy@.service");
    }

    #[test]
    fn the_helper_tells_its_family_by_its_program_name() {
        assert_eq!(
            ProxyTemplate::of_program("/usr/libexec/bluechi-proxy"),
            ProxyTemplate::Bluechi
        );
        assert_eq!(
            ProxyTemplate::of_program("bluechi-proxy"),
            ProxyTemplate::Bluechi
        );
        for drover in [
            "/usr/libexec/drover-proxy",
            "drover-proxy",
            "/opt/bluechi-proxy/drover-proxy",
            "bluechi-proxy.sh",
            "",
        ] {
            assert_eq!(
                ProxyTemplate::of_program(drover),
                ProxyTemplate::Drover,
                "{drover}"
            );
        }
    }

    #[test]
    fn bluechi_names_mean_what_they_mean_to_bluechi() {
        // What BlueChi's helper does for `bluechi-proxy@bar_db.service`:
        // argument `bar_db.service`, CreateProxy(local, "bar", "db.service").
        let p = ProxyInstance::parse_arg(ProxyTemplate::Bluechi, "bar_db.service").unwrap();
        assert_eq!(p.proxy_unit().as_str(), "bluechi-proxy@bar_db.service");
        assert_eq!(
            (p.node().as_str(), p.unit().as_str()),
            ("bar", "db.service")
        );
        assert_eq!(p.template(), ProxyTemplate::Bluechi);
        assert_eq!(p.instance(), "bar_db");
        let q =
            ProxyInstance::proxy_of("bluechi-proxy@bar_db.service", "bar", "db.service").unwrap();
        assert_eq!(q, p);
        assert_eq!(
            ProxyInstance::from_unit_name("bluechi-proxy@bar_db.service"),
            Some(p)
        );
        // Units with '_' split at the first one, as BlueChi's helper does.
        let p = ProxyInstance::parse_arg(ProxyTemplate::Bluechi, "bar_my_db.service").unwrap();
        assert_eq!(
            (p.node().as_str(), p.unit().as_str()),
            ("bar", "my_db.service")
        );
        // drover's helper argument is the instance itself.
        let d = ProxyInstance::parse_arg(ProxyTemplate::Drover, "bar_db").unwrap();
        assert_eq!(d.proxy_unit().as_str(), "drover-proxy@bar_db.service");
        assert_eq!(d, ProxyInstance::parse("bar_db").unwrap());
        // The same target under both names: two proxy units, one target.
        assert_eq!((d.node(), d.unit()), (q.node(), q.unit()));
        assert_ne!(d.proxy_unit(), q.proxy_unit());
    }

    #[test]
    fn garbage_bluechi_names_are_refused_with_a_reason() {
        let e = ProxyInstance::parse_arg(ProxyTemplate::Bluechi, "bar_db")
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not end in .service"), "{e}");
        let e = ProxyInstance::parse_arg(ProxyTemplate::Bluechi, "nounderscore.service")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no '_' between node and unit"), "{e}");
        let e = ProxyInstance::parse_arg(ProxyTemplate::Bluechi, ".service")
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
        assert!(ProxyInstance::from_unit_name("bluechi-proxy@nounderscore.service").is_none());
        // BlueChi's helper, given a non-service target, asks for `X.mount.service`:
        // drover's rule names `X.mount`, so the pair does not match, said clearly.
        let e = ProxyInstance::proxy_of(
            "bluechi-proxy@bar_data.mount.service",
            "bar",
            "data.mount.service",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("is the proxy of data.mount on node bar"), "{e}");
        // Wrong node, wrong unit, or a name of no family.
        for (local, node, unit) in [
            ("bluechi-proxy@bar_db.service", "foo", "db.service"),
            ("bluechi-proxy@bar_db.service", "bar", "web.service"),
            (
                "bluechi-proxy@nounderscore.service",
                "nounderscore",
                "db.service",
            ),
            ("hirte-proxy@bar_db.service", "bar", "db.service"),
        ] {
            assert!(
                ProxyInstance::proxy_of(local, node, unit).is_err(),
                "{local}"
            );
        }
    }
}
