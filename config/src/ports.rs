//! The discovery keys of a unit's `[X-Drover]` section: `Port=PORT` (one
//! unnamed port) and `Ports=NAME:PORT[,NAME:PORT...]` (named ports, for DNS
//! SRV records `_NAME._tcp`). Pure: the agent reads the entries
//! ([`crate::unit_file`]) and sends what [`unit_ports`] returns.
//!
//! Rules: the last non-empty assignment of each key wins and an empty one
//! resets it, as in systemd and the health keys; the values must make a
//! valid [`drover_protocol::ports::Ports`] together (ports 1–65535, names
//! DNS labels, no name twice, at most
//! [`drover_protocol::ports::PORTS_MAX`]). A bad value is an error naming
//! file, line and key; it takes away the unit's ports, never its health
//! (the health keys are read apart, [`crate::health`]). The table of all
//! `[X-Drover]` keys is [`crate::health::UNIT_KEYS`].

use crate::unit_file::UnitEntry;
use drover_protocol::ports::{Port, Ports};

/// `Port=`: one unnamed port.
pub const PORT: &str = "Port";
/// `Ports=`: named ports.
pub const PORTS: &str = "Ports";

/// The ports `entries` (a unit's `[X-Drover]` entries, fragment first, then
/// drop-ins) declare; other keys are left alone. `Err`: the first problem,
/// naming file, line and key.
pub fn unit_ports(entries: &[UnitEntry]) -> Result<Ports, String> {
    let mut port: Option<&UnitEntry> = None;
    let mut named: Option<&UnitEntry> = None;
    for e in entries {
        let slot = match e.key.as_str() {
            PORT => &mut port,
            PORTS => &mut named,
            _ => continue,
        };
        *slot = (!e.value.is_empty()).then_some(e);
    }
    let mut all = Vec::new();
    if let Some(e) = port {
        all.push(Port {
            name: String::new(),
            port: number(e.value.trim()).map_err(|m| e.error(m))?,
        });
    }
    if let Some(e) = named {
        for item in e.value.split([',', ' ', '\t']).filter(|i| !i.is_empty()) {
            if all.len() > drover_protocol::ports::PORTS_MAX {
                break;
            }
            let Some((name, p)) = item.split_once(':') else {
                return Err(e.error(format!("'{}' is not NAME:PORT", shown(item))));
            };
            drover_protocol::ports::check_name(name).map_err(|m| e.error(m))?;
            all.push(Port {
                name: name.to_owned(),
                port: number(p).map_err(|m| e.error(m))?,
            });
        }
    }
    let blame = named.or(port);
    Ports::new(all).map_err(|m| match blame {
        Some(e) => e.error(m),
        None => m,
    })
}

fn shown(text: &str) -> String {
    text.chars()
        .take(80)
        .flat_map(char::escape_default)
        .collect()
}

fn number(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 && !text.starts_with('+') => Ok(p),
        _ => Err(format!("'{}' is not a port (1 to 65535)", shown(text))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn entries(list: &[(&str, &str)]) -> Vec<UnitEntry> {
        list.iter()
            .enumerate()
            .map(|(i, (k, v))| UnitEntry {
                path: PathBuf::from("/etc/systemd/system/web.service"),
                line: i + 2,
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Result<Vec<(String, u16)>, String> {
        unit_ports(&entries(list)).map(|p| p.pairs())
    }

    #[test]
    fn port_and_named_ports() {
        assert_eq!(pairs(&[]).unwrap(), vec![]);
        assert_eq!(
            pairs(&[("HealthTCP", "127.0.0.1:80"), ("Port", "8080")]).unwrap(),
            vec![("".into(), 8080)]
        );
        assert_eq!(
            pairs(&[("Port", "80"), ("Ports", "HTTP:8080, admin:9090")]).unwrap(),
            vec![
                ("".into(), 80),
                ("admin".into(), 9090),
                ("http".into(), 8080)
            ]
        );
        // The last assignment wins; an empty one resets.
        assert_eq!(
            pairs(&[("Port", "1"), ("Port", "2")]).unwrap(),
            vec![("".into(), 2)]
        );
        assert_eq!(pairs(&[("Port", "1"), ("Port", "")]).unwrap(), vec![]);
    }

    #[test]
    fn garbage_names_file_line_and_key() {
        for (list, says) in [
            (vec![("Port", "0")], "Port': '0' is not a port"),
            (vec![("Port", "65536")], "'65536' is not a port"),
            (vec![("Port", "+80")], "is not a port"),
            (vec![("Port", "http")], "'http' is not a port"),
            (vec![("Ports", "http")], "'http' is not NAME:PORT"),
            (vec![("Ports", "http:")], "'' is not a port"),
            (vec![("Ports", "a_b:80")], "not a DNS label"),
            (vec![("Ports", "-a:80")], "not a DNS label"),
            (vec![("Ports", ":80")], "not a DNS label"),
            (vec![("Ports", "a:1,A:2")], "port name 'a' twice"),
            (vec![("Ports", "a:1\u{0}")], "is not a port"),
        ] {
            let err = pairs(&list).expect_err(says);
            assert!(
                err.starts_with("/etc/systemd/system/web.service:2: key 'Port"),
                "{err}"
            );
            assert!(err.contains(says), "{err} lacks {says}");
        }
        let many: Vec<String> = (1..=40).map(|i| format!("p{i}:{i}")).collect();
        let err = pairs(&[("Ports", &many.join(","))]).unwrap_err();
        assert!(err.contains("at most 32"), "{err}");
        let huge = "9".repeat(100_000);
        let err = pairs(&[("Port", &huge)]).unwrap_err();
        assert!(err.len() < 400, "the error does not echo a huge value");
    }
}
