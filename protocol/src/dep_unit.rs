//! The dep unit: `drover-dep@UNIT.service`, what the manager has the target
//! node's agent start while some proxy elsewhere needs `UNIT`, and stop when
//! none does.
//!
//! Rule (agreed with `dist/usr/lib/systemd/system/drover-dep@.service`, which says `BindsTo=%i` and
//! `After=%i`): the instance is the target's *full* unit name, type suffix
//! included, so any unit type works — `db.service` → `drover-dep@db.service.service`,
//! `web.socket` → `drover-dep@web.socket.service`. The agent builds the name
//! ([`dep_unit_of`]); the manager reads targets back from the units a node
//! lists ([`dep_target`]) to find deps nobody wants any more. Both directions
//! live here so they cannot drift apart.
//!
//! There is one dep family, drover's, whatever the family of the proxy that
//! asked ([`crate::proxy_instance::ProxyTemplate`]): the target node runs
//! drover's agent, which starts `drover-dep@UNIT.service` for BlueChi-named
//! proxies too. BlueChi's own dep template, `bluechi-dep@.service` (instance
//! without `.service`: `bluechi-dep@db.service` binds `db.service`), is
//! shipped by the optional compatibility set only for unit files that name it;
//! no drover process starts it or reads it back.

use crate::names::{NameError, UnitName};

/// Every dep unit is an instance of this template.
pub const DEP_PREFIX: &str = "drover-dep@";
/// The dep template is a service.
pub const DEP_SUFFIX: &str = ".service";

/// `drover-dep@<target>.service`; an error when the result would be longer
/// than systemd allows.
pub fn dep_unit_of(target: &UnitName) -> Result<UnitName, NameError> {
    UnitName::new(format!("{DEP_PREFIX}{target}{DEP_SUFFIX}"))
}

/// The target unit of a dep unit name, if `unit` is one.
pub fn dep_target(unit: &str) -> Option<UnitName> {
    let inner = unit.strip_prefix(DEP_PREFIX)?.strip_suffix(DEP_SUFFIX)?;
    UnitName::new(inner).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_for_every_unit_type() {
        for target in [
            "db.service",
            "web.socket",
            "getty@tty1.service",
            "data.mount",
        ] {
            let target = UnitName::new(target).unwrap();
            let dep = dep_unit_of(&target).unwrap();
            assert_eq!(dep.as_str(), format!("drover-dep@{target}.service"));
            assert_eq!(dep_target(dep.as_str()), Some(target));
        }
        let long = UnitName::new(format!("{}.service", "a".repeat(240))).unwrap();
        assert!(dep_unit_of(&long).is_err());
        assert_eq!(dep_target("drover-dep@db.service"), None);
    }
}
