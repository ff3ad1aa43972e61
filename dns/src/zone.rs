//! What a name inside the zone asks for (drover-dns(8), "NAMES"):
//!
//! * the zone itself (`drover.`): its SOA;
//! * `UNIT.drover.`: the unit on every node where it is active and healthy;
//! * `UNIT.NODE.drover.`: the same, on that node only;
//! * `_NAME._tcp.UNIT.drover.`: the unit's port called `NAME` (`_port` for an
//!   unnamed `Port=`), as SRV records.
//!
//! A unit name ends at the last label that is a systemd unit type (`service`,
//! `socket`, ...); the labels after it, if any, are the node's. So a node
//! whose name has a label equal to a unit type (`db.service` as a node name)
//! cannot be named in `UNIT.NODE` form. Anything else, and anything the
//! label mapping ([`crate::labels`]) does not produce, is no name at all:
//! NXDOMAIN, never an error.

use crate::labels;
use drover_protocol::names::UNIT_TYPES;
use drover_protocol::{NodeName, UnitName};

/// The SRV service label of an unnamed `Port=`.
pub const UNNAMED_PORT: &str = "port";

/// The only SRV protocol label served: ports in `[X-Drover]` are TCP ports.
pub const SRV_PROTO: &[u8] = b"_tcp";

/// What a name in the zone stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The zone's apex.
    Apex,
    /// `UNIT.drover` (node `None`) or `UNIT.NODE.drover`.
    Unit {
        unit: UnitName,
        node: Option<NodeName>,
    },
    /// `_NAME._tcp.UNIT.drover`: `port` is the decoded `NAME`.
    Srv { port: String, unit: UnitName },
}

/// Reads the labels of a query name below the zone (the zone's own labels
/// taken off, most specific first). `None`: no such name.
pub fn parse(labels: &[&[u8]]) -> Option<Target> {
    if labels.is_empty() {
        return Some(Target::Apex);
    }
    if labels.len() >= 3 && labels[1] == SRV_PROTO {
        let name = labels[0].strip_prefix(b"_")?;
        let port = labels::decode([name])?;
        let Target::Unit { unit, node: None } = unit_target(&labels[2..])? else {
            return None;
        };
        return Some(Target::Srv { port, unit });
    }
    unit_target(labels)
}

fn unit_target(labels: &[&[u8]]) -> Option<Target> {
    let end = labels
        .iter()
        .rposition(|l| UNIT_TYPES.iter().any(|t| t.as_bytes() == *l))?;
    let unit = UnitName::new(labels::decode(labels[..=end].iter().copied())?).ok()?;
    let node = if end + 1 < labels.len() {
        Some(NodeName::new(labels::decode(labels[end + 1..].iter().copied())?).ok()?)
    } else {
        None
    };
    Some(Target::Unit { unit, node })
}

/// Whether `name` is the zone `origin` or below it (any case).
pub fn in_zone(
    origin: &hickory_server::proto::rr::Name,
    name: &hickory_server::proto::rr::Name,
) -> bool {
    origin.zone_of(name)
}

/// The labels of `UNIT.NODE` below the zone (an SRV record's target).
pub fn unit_on_node(unit: &UnitName, node: &NodeName) -> Vec<String> {
    let mut labels = labels::encode(unit.as_str());
    labels.extend(labels::encode(node.as_str()));
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str) -> Option<Target> {
        let labels: Vec<&[u8]> = if name.is_empty() {
            Vec::new()
        } else {
            name.split('.').map(str::as_bytes).collect()
        };
        parse(&labels)
    }

    fn unit(u: &str, n: Option<&str>) -> Option<Target> {
        Some(Target::Unit {
            unit: UnitName::new(u).unwrap(),
            node: n.map(|n| NodeName::new(n).unwrap()),
        })
    }

    #[test]
    fn names_in_the_zone() {
        assert_eq!(p(""), Some(Target::Apex));
        assert_eq!(p("web.service"), unit("web.service", None));
        assert_eq!(p("web.service.node1"), unit("web.service", Some("node1")));
        assert_eq!(
            p("web.service.rack-2.node1"),
            unit("web.service", Some("rack-2.node1"))
        );
        assert_eq!(p("a.b.socket"), unit("a.b.socket", None));
        assert_eq!(p("web_401.service"), unit("web@1.service", None));
        assert_eq!(p("_57eb.service._4eode"), unit("Web.service", Some("Node")));
        assert_eq!(
            p("_http._tcp.web.service"),
            Some(Target::Srv {
                port: "http".into(),
                unit: UnitName::new("web.service").unwrap()
            })
        );
        assert_eq!(
            p("_port._tcp.web.service"),
            Some(Target::Srv {
                port: UNNAMED_PORT.into(),
                unit: UnitName::new("web.service").unwrap()
            })
        );
    }

    #[test]
    fn names_that_map_to_nothing() {
        for bad in [
            "web",
            "service",
            "node1",
            "web.service.bad_name",
            "web.service._",
            "web@1.service",
            "WEB.service",
            "web.service.-node",
            "_http._udp.web.service",
            "_http._tcp.web.service.node1",
            "http._tcp.web.service",
            "_._tcp.web.service",
            "_tcp.web.service",
            "x._tcp",
            "_http._tcp",
            "a..service",
            "@.service",
            "\u{0}.service",
        ] {
            assert_eq!(p(bad), None, "{bad}");
        }
        // Long and odd labels never panic.
        let long = vec![b'x'; 300];
        assert_eq!(parse(&[&long, b"service"]), None);
        assert_eq!(parse(&[b"", b"service"]), None);
    }

    #[test]
    fn srv_targets_name_the_unit_on_its_node() {
        let u = UnitName::new("web@a.service").unwrap();
        let n = NodeName::new("Node1").unwrap();
        let labels = unit_on_node(&u, &n);
        let raw: Vec<&[u8]> = labels.iter().map(|l| l.as_bytes()).collect();
        assert_eq!(
            parse(&raw),
            Some(Target::Unit {
                unit: u,
                node: Some(n)
            })
        );
    }
}
