//! The ports a unit declares for discovery: `Port=` (one unnamed port) and
//! `Ports=NAME:PORT,...` (named ports) in its `[X-Drover]` section. The agent
//! reads them (`drover_config::ports`) and tells the manager
//! ([`crate::Event::UnitPorts`]); the manager
//! serves them in `Where` rows and DNS serves `_NAME._tcp` SRV records from
//! them.
//!
//! Rules, checked on both ends (a frame that breaks one fails to decode):
//! a port is 1–65535; a name is a DNS label of 1–[`PORT_NAME_MAX`] ASCII
//! letters, digits and `-`, not starting or ending with `-`, kept in lower
//! case (DNS names are case-insensitive); the unnamed port is the name `""`;
//! no name twice; at most [`PORTS_MAX`] ports per unit.

use serde::{Deserialize, Serialize};

/// Most ports one unit declares.
pub const PORTS_MAX: usize = 32;
/// Longest port name (a DNS label).
pub const PORT_NAME_MAX: usize = 63;
/// Most units of one node whose ports are kept (by the agent and by the
/// manager, per node).
pub const PORT_UNITS_MAX: usize = 4096;

/// One declared port: `name` `""` for `Port=`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Port {
    pub name: String,
    pub port: u16,
}

/// A unit's ports, valid by the module's rules, sorted by name (the
/// unnamed port first).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<Port>", into = "Vec<Port>")]
pub struct Ports(Vec<Port>);

impl Ports {
    /// Checks and sorts `ports`; names are taken in lower case.
    pub fn new(ports: Vec<Port>) -> Result<Self, String> {
        if ports.len() > PORTS_MAX {
            return Err(format!(
                "{} ports, at most {PORTS_MAX} per unit",
                ports.len()
            ));
        }
        let mut ports: Vec<Port> = ports
            .into_iter()
            .map(|p| Port {
                name: p.name.to_ascii_lowercase(),
                port: p.port,
            })
            .collect();
        for p in &ports {
            if p.port == 0 {
                return Err("port 0 is not a port (use 1 to 65535)".into());
            }
            if !p.name.is_empty() {
                check_name(&p.name)?;
            }
        }
        ports.sort();
        if let Some(w) = ports.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(if w[0].name.is_empty() {
                "two unnamed ports (Port= declares one)".to_owned()
            } else {
                format!("port name '{}' twice", w[0].name)
            });
        }
        Ok(Self(ports))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Port> {
        self.0.iter()
    }

    /// `(name, port)` pairs, the form D-Bus carries (`a(sq)`).
    pub fn pairs(&self) -> Vec<(String, u16)> {
        self.0.iter().map(|p| (p.name.clone(), p.port)).collect()
    }
}

impl TryFrom<Vec<Port>> for Ports {
    type Error = String;

    fn try_from(ports: Vec<Port>) -> Result<Self, String> {
        let sorted = Self::new(ports.clone())?;
        // On the wire the agent sends them as `new` made them: lower case, sorted.
        if sorted.0 != ports {
            return Err("ports not in canonical form (lower case, sorted)".into());
        }
        Ok(sorted)
    }
}

impl From<Ports> for Vec<Port> {
    fn from(p: Ports) -> Self {
        p.0
    }
}

/// Whether `name` is a port name: a DNS label (see the module docs).
pub fn check_name(name: &str) -> Result<(), String> {
    let shown: String = name
        .chars()
        .take(80)
        .flat_map(char::escape_default)
        .collect();
    let ok = (1..=PORT_NAME_MAX).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "port name '{shown}' is not a DNS label (1 to {PORT_NAME_MAX} letters, digits \
             and '-', not starting or ending with '-')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, port: u16) -> Port {
        Port {
            name: name.into(),
            port,
        }
    }

    #[test]
    fn rules() {
        let p = Ports::new(vec![port("HTTP", 80), port("", 8080), port("admin", 9090)]).unwrap();
        assert_eq!(
            p.pairs(),
            vec![
                ("".into(), 8080),
                ("admin".into(), 9090),
                ("http".into(), 80)
            ]
        );
        for bad in [
            vec![port("", 0)],
            vec![port("-a", 1)],
            vec![port("a-", 1)],
            vec![port("a_b", 1)],
            vec![port("a.b", 1)],
            vec![port(&"a".repeat(64), 1)],
            vec![port("x", 1), port("X", 2)],
            vec![port("", 1), port("", 2)],
            (0..=PORTS_MAX as u16)
                .map(|i| port(&format!("p{i}"), i + 1))
                .collect(),
        ] {
            assert!(Ports::new(bad.clone()).is_err(), "{bad:?}");
        }
        assert!(Ports::new(vec![port(&"a".repeat(63), 65535)]).is_ok());
    }

    #[test]
    fn wire_takes_only_canonical_ports() {
        let good = Ports::new(vec![port("b", 2), port("a", 1)]).unwrap();
        let bytes = postcard::to_allocvec(&good).unwrap();
        assert_eq!(postcard::from_bytes::<Ports>(&bytes).unwrap(), good);
        let raw = postcard::to_allocvec(&vec![port("b", 2), port("a", 1)]).unwrap();
        assert!(postcard::from_bytes::<Ports>(&raw).is_err());
        let raw = postcard::to_allocvec(&vec![port("a", 0)]).unwrap();
        assert!(postcard::from_bytes::<Ports>(&raw).is_err());
    }
}
