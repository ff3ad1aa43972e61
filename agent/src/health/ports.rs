//! The ports this node's units declare (`[X-Drover]` `Port=`/`Ports=`,
//! `drover_config::ports`), as last told to the manager: the driver reads
//! them with the health declarations ([`super::systemd::declaration`]) and
//! sends `Event::UnitPorts` only for a change, and every unit's ports at
//! the start of a session.
//!
//! Bounded: at most [`PORT_UNITS_MAX`] units with ports; beyond it a unit's
//! ports are not kept nor sent (one warning).

use drover_protocol::UnitName;
use drover_protocol::ports::{PORT_UNITS_MAX, Ports};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// See the module docs.
#[derive(Default)]
pub struct PortsBook {
    inner: Mutex<(BTreeMap<UnitName, Ports>, bool)>,
}

impl PortsBook {
    fn lock(&self) -> MutexGuard<'_, (BTreeMap<UnitName, Ports>, bool)> {
        // Plain map operations: a poisoned lock still holds a consistent map.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `unit` declares `ports` now (empty: none, or unloaded). `Some`: what
    /// to tell the manager (a change).
    pub fn set(&self, unit: &UnitName, ports: Ports) -> Option<Ports> {
        let mut g = self.lock();
        let (book, warned) = &mut *g;
        if ports.is_empty() {
            return book.remove(unit).map(|_| Ports::default());
        }
        if book.get(unit) == Some(&ports) {
            return None;
        }
        if !book.contains_key(unit) && book.len() >= PORT_UNITS_MAX {
            if !*warned {
                *warned = true;
                tracing::warn!(
                    "more than {PORT_UNITS_MAX} units declare ports; {unit} and later ones are not told"
                );
            }
            return None;
        }
        book.insert(unit.clone(), ports.clone());
        Some(ports)
    }

    /// Forgets the units `keep` says no; returns them (their ports are gone).
    pub fn retain(&self, keep: impl Fn(&UnitName) -> bool) -> Vec<UnitName> {
        let mut g = self.lock();
        let gone: Vec<UnitName> = g.0.keys().filter(|u| !keep(u)).cloned().collect();
        for u in &gone {
            g.0.remove(u);
        }
        gone
    }

    /// Every unit's ports (the start of a session).
    pub fn all(&self) -> Vec<(UnitName, Ports)> {
        self.lock()
            .0
            .iter()
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::ports::Port;

    fn ports(n: u16) -> Ports {
        Ports::new(vec![Port {
            name: String::new(),
            port: n,
        }])
        .unwrap()
    }

    #[test]
    fn only_changes_are_told_and_the_book_is_bounded() {
        let b = PortsBook::default();
        let web = UnitName::new("web.service").unwrap();
        assert_eq!(b.set(&web, Ports::default()), None);
        assert_eq!(b.set(&web, ports(80)), Some(ports(80)));
        assert_eq!(b.set(&web, ports(80)), None);
        assert_eq!(b.set(&web, ports(81)), Some(ports(81)));
        assert_eq!(b.set(&web, Ports::default()), Some(Ports::default()));
        for i in 0..PORT_UNITS_MAX + 10 {
            let u = UnitName::new(format!("u{i}.service")).unwrap();
            let told = b.set(&u, ports(1));
            assert_eq!(told.is_some(), i < PORT_UNITS_MAX, "{i}");
        }
        assert_eq!(b.all().len(), PORT_UNITS_MAX);
        assert_eq!(b.retain(|u| u.as_str() != "u0.service").len(), 1);
    }
}
