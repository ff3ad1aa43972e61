//! The records of a reply: what a query for a [`Target`] gets from an
//! [`Answer`] (drover-dns(8), "ANSWERS").
//!
//! * A/AAAA: one per distinct address of the rows (IPv4 as A, IPv6 as AAAA;
//!   a row whose address is empty or not an IP address gives none);
//! * SRV `_NAME._tcp.UNIT`: one per row with a port of that name (`_port`:
//!   an unnamed `Port=`), priority 0, weight 0, target `UNIT.NODE.ZONE`,
//!   whose addresses ride along in the additional section;
//! * a name whose unit runs nowhere (or not on that node, or has no such
//!   port) does not exist: NXDOMAIN; a name that exists but has no record of
//!   the asked type: NODATA. Both carry the zone's SOA in the authority
//!   section (its minimum = the TTL, RFC 2308).
//!
//! Replies fit the room they have ([`room`]): records that would not fit
//! are left out and the reply says truncated (TC), so a UDP client asks again
//! over TCP, and a TCP reply never exceeds 64 KiB.

use crate::source::{Answer, Row};
use crate::zone::{self, Target, UNNAMED_PORT};
use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The zone: its name and SOA.
#[derive(Debug, Clone)]
pub struct Zone {
    pub origin: Name,
    soa: Record,
}

impl Zone {
    /// `origin` must be a fully qualified name; `negative_ttl` is the SOA's
    /// TTL and minimum; `serial` changes with every start.
    pub fn new(origin: Name, negative_ttl: u32, serial: u32) -> Result<Self, String> {
        let host = |l: &str| {
            Name::from_labels([l.as_bytes()])
                .and_then(|n| n.append_domain(&origin))
                .map_err(|e| format!("zone '{origin}': {e}"))
        };
        let soa = SOA::new(
            origin.clone(),
            host("hostmaster")?,
            serial,
            3600,
            600,
            86400,
            negative_ttl,
        );
        let soa = Record::from_rdata(origin.clone(), negative_ttl, RData::SOA(soa));
        Ok(Self { origin, soa })
    }

    pub fn soa(&self) -> &Record {
        &self.soa
    }
}

/// A reply's code and sections.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additionals: Vec<Record>,
    pub truncated: bool,
}

impl Reply {
    pub fn code(code: ResponseCode) -> Self {
        Self {
            code,
            ..Self::default()
        }
    }

    /// NXDOMAIN or NODATA (`code` NoError) with the SOA.
    pub fn negative(zone: &Zone, code: ResponseCode) -> Self {
        Self {
            code,
            authority: vec![zone.soa.clone()],
            ..Self::default()
        }
    }
}

/// The UDP payload drover-dns offers in its EDNS record (the DNS flag day
/// 2020 value, which avoids IP fragmentation).
pub const EDNS_PAYLOAD: u16 = 1232;

/// Bytes a reply may take: the client's UDP size (512 without EDNS, at most
/// what drover-dns offers, [`EDNS_PAYLOAD`]), 65,535 on TCP.
pub fn room(udp: bool, client_payload: u16) -> usize {
    if udp {
        usize::from(client_payload.clamp(512, EDNS_PAYLOAD))
    } else {
        usize::from(u16::MAX)
    }
}

/// Header, question and an OPT record, counted generously.
const FIXED: usize = 12 + 4 + 11;

fn record_size(r: &Record) -> usize {
    // Name as a compression pointer (2) + type, class, TTL, length (10) + data.
    12 + match r.data() {
        RData::A(_) => 4,
        RData::AAAA(_) => 16,
        RData::SRV(srv) => 6 + srv.target().len() + 1,
        _ => 64,
    }
}

fn addresses(rows: &[&Row], qtype: RecordType, name: &Name, ttl: u32) -> Vec<Record> {
    let ips: BTreeSet<IpAddr> = rows
        .iter()
        .filter_map(|r| r.address.parse::<IpAddr>().ok())
        .collect();
    ips.into_iter()
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => Some(RData::A(A(v4))),
            (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => Some(RData::AAAA(AAAA(v6))),
            _ => None,
        })
        .map(|data| Record::from_rdata(name.clone(), ttl, data))
        .collect()
}

/// The reply to `qtype` at `qname` (which is `target` in `zone`), from
/// `answer` given with `ttl`, within `room` bytes.
pub fn reply(
    zone: &Zone,
    qname: &Name,
    qtype: RecordType,
    target: &Target,
    answer: &Answer,
    ttl: u32,
    room: usize,
) -> Reply {
    let mut reply = Reply::code(ResponseCode::NoError);
    match target {
        Target::Apex => {
            if matches!(qtype, RecordType::SOA | RecordType::ANY) {
                reply.answers.push(zone.soa.clone());
            } else {
                return Reply::negative(zone, ResponseCode::NoError);
            }
        }
        Target::Unit { node, .. } => {
            let rows: Vec<&Row> = answer
                .rows
                .iter()
                .filter(|r| node.as_ref().is_none_or(|n| n.as_str() == r.node))
                .collect();
            if rows.is_empty() {
                return Reply::negative(zone, ResponseCode::NXDomain);
            }
            reply.answers = addresses(&rows, qtype, qname, ttl);
        }
        Target::Srv { port, unit } => {
            let wanted = |name: &str| name == port || (name.is_empty() && port == UNNAMED_PORT);
            let mut found = false;
            for row in &answer.rows {
                let Some((_, number)) = row.ports.iter().find(|(n, _)| wanted(n)) else {
                    continue;
                };
                found = true;
                let Ok(node) = drover_protocol::NodeName::new(row.node.as_str()) else {
                    continue;
                };
                let labels = zone::unit_on_node(unit, &node);
                let Ok(host) = Name::from_labels(labels.iter().map(|l| l.as_bytes()))
                    .and_then(|n| n.append_domain(&zone.origin))
                else {
                    continue; // too long for a DNS name: no record
                };
                if matches!(qtype, RecordType::SRV | RecordType::ANY) {
                    let srv = SRV::new(0, 0, *number, host.clone());
                    reply
                        .answers
                        .push(Record::from_rdata(qname.clone(), ttl, RData::SRV(srv)));
                    reply
                        .additionals
                        .extend(addresses(&[row], RecordType::ANY, &host, ttl));
                }
            }
            if !found {
                return Reply::negative(zone, ResponseCode::NXDomain);
            }
        }
    }
    if reply.answers.is_empty() {
        return Reply::negative(zone, ResponseCode::NoError);
    }
    fit(&mut reply, room.saturating_sub(FIXED + qname.len() + 1));
    reply
}

/// Drops what does not fit in `room` bytes: additionals first, then answers
/// (saying truncated).
fn fit(reply: &mut Reply, room: usize) {
    let mut used = 0;
    let mut keep = 0;
    for r in &reply.answers {
        let size = record_size(r);
        if used + size > room {
            break;
        }
        used += size;
        keep += 1;
    }
    if keep < reply.answers.len() {
        reply.answers.truncate(keep);
        reply.additionals.clear();
        reply.truncated = true;
        return;
    }
    let mut extra = 0;
    for r in &reply.additionals {
        // Additional names are not compressed against the question.
        let size = record_size(r) + r.name().len();
        if used + size > room {
            break;
        }
        used += size;
        extra += 1;
    }
    reply.additionals.truncate(extra);
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{NodeName, UnitName};

    fn zone() -> Zone {
        Zone::new(Name::from_ascii("drover.").unwrap(), 5, 42).unwrap()
    }

    fn row(node: &str, address: &str, ports: &[(&str, u16)]) -> Row {
        Row {
            node: node.into(),
            address: address.into(),
            ports: ports.iter().map(|(n, p)| ((*n).into(), *p)).collect(),
        }
    }

    fn web(node: Option<&str>) -> Target {
        Target::Unit {
            unit: UnitName::new("web.service").unwrap(),
            node: node.map(|n| NodeName::new(n).unwrap()),
        }
    }

    fn answer() -> Answer {
        Answer {
            rows: vec![
                row("n1", "10.0.0.1", &[("", 80), ("http", 8080)]),
                row("n2", "10.0.0.2", &[("http", 8081)]),
                row("n3", "fd00::3", &[]),
                row("n4", "", &[]),
                row("n5", "10.0.0.1", &[]),
            ],
            complete: true,
        }
    }

    fn data(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| r.data().to_string()).collect()
    }

    fn q(name: &str) -> Name {
        Name::from_ascii(name).unwrap()
    }

    #[test]
    fn addresses_of_every_node_once() {
        let z = zone();
        let r = reply(
            &z,
            &q("web.service.drover."),
            RecordType::A,
            &web(None),
            &answer(),
            4,
            512,
        );
        assert_eq!(r.code, ResponseCode::NoError);
        assert_eq!(data(&r.answers), ["10.0.0.1", "10.0.0.2"]);
        assert!(r.answers.iter().all(|a| a.ttl() == 4));
        assert!(r.authority.is_empty() && !r.truncated);
        let r = reply(
            &z,
            &q("web.service.drover."),
            RecordType::AAAA,
            &web(None),
            &answer(),
            4,
            512,
        );
        assert_eq!(data(&r.answers), ["fd00::3"]);
        // One node only.
        let r = reply(
            &z,
            &q("web.service.n2.drover."),
            RecordType::A,
            &web(Some("n2")),
            &answer(),
            4,
            512,
        );
        assert_eq!(data(&r.answers), ["10.0.0.2"]);
    }

    #[test]
    fn nxdomain_and_nodata_carry_the_soa() {
        let z = zone();
        let none = Answer {
            rows: vec![],
            complete: true,
        };
        let r = reply(
            &z,
            &q("web.service.drover."),
            RecordType::A,
            &web(None),
            &none,
            4,
            512,
        );
        assert_eq!(r.code, ResponseCode::NXDomain);
        assert_eq!(r.authority.len(), 1);
        assert_eq!(r.authority[0].record_type(), RecordType::SOA);
        let r = reply(
            &z,
            &q("web.service.n9.drover."),
            RecordType::A,
            &web(Some("n9")),
            &answer(),
            4,
            512,
        );
        assert_eq!(r.code, ResponseCode::NXDomain);
        // Exists, but no such type (n3 has only IPv6; TXT never).
        let r = reply(
            &z,
            &q("web.service.n3.drover."),
            RecordType::A,
            &web(Some("n3")),
            &answer(),
            4,
            512,
        );
        assert_eq!(
            (r.code, r.answers.len(), r.authority.len()),
            (ResponseCode::NoError, 0, 1)
        );
        let r = reply(
            &z,
            &q("web.service.drover."),
            RecordType::TXT,
            &web(None),
            &answer(),
            4,
            512,
        );
        assert_eq!(
            (r.code, r.answers.len(), r.authority.len()),
            (ResponseCode::NoError, 0, 1)
        );
        // The apex has its SOA.
        let r = reply(
            &z,
            &q("drover."),
            RecordType::SOA,
            &Target::Apex,
            &none,
            4,
            512,
        );
        assert_eq!(r.answers[0].record_type(), RecordType::SOA);
        let soa = r.answers[0].data().to_string();
        assert!(soa.contains("42") && soa.ends_with(" 5"), "{soa}");
    }

    #[test]
    fn srv_records_point_at_the_unit_on_each_node() {
        let z = zone();
        let srv = |port: &str| Target::Srv {
            port: port.into(),
            unit: UnitName::new("web.service").unwrap(),
        };
        let name = q("_http._tcp.web.service.drover.");
        let r = reply(&z, &name, RecordType::SRV, &srv("http"), &answer(), 4, 512);
        assert_eq!(
            data(&r.answers),
            [
                "0 0 8080 web.service.n1.drover.",
                "0 0 8081 web.service.n2.drover."
            ]
        );
        assert_eq!(data(&r.additionals), ["10.0.0.1", "10.0.0.2"]);
        let r = reply(
            &z,
            &name,
            RecordType::SRV,
            &srv(UNNAMED_PORT),
            &answer(),
            4,
            512,
        );
        assert_eq!(data(&r.answers), ["0 0 80 web.service.n1.drover."]);
        let r = reply(&z, &name, RecordType::SRV, &srv("https"), &answer(), 4, 512);
        assert_eq!(r.code, ResponseCode::NXDomain);
        let r = reply(&z, &name, RecordType::A, &srv("http"), &answer(), 4, 512);
        assert_eq!(
            (r.code, r.answers.len(), r.authority.len()),
            (ResponseCode::NoError, 0, 1)
        );
    }

    #[test]
    fn big_answers_are_cut_to_the_room_and_say_so() {
        let z = zone();
        let rows = (0..200u32)
            .map(|i| {
                row(
                    &format!("n{i}"),
                    &format!("10.0.{}.{}", i / 256, i % 256),
                    &[],
                )
            })
            .collect();
        let big = Answer {
            rows,
            complete: true,
        };
        let name = q("web.service.drover.");
        let r = reply(&z, &name, RecordType::A, &web(None), &big, 4, room(true, 0));
        assert!(r.truncated);
        assert!(
            !r.answers.is_empty() && r.answers.len() < 30,
            "{}",
            r.answers.len()
        );
        let r = reply(
            &z,
            &name,
            RecordType::A,
            &web(None),
            &big,
            4,
            room(false, 0),
        );
        assert!(!r.truncated);
        assert_eq!(r.answers.len(), 200);
    }
}
