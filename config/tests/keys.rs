//! The published key lists (`manager::KEYS`, `manager::NODE_KEYS`,
//! `agent::KEYS`, which drover.conf(5) is checked against) are exactly the keys
//! the loaders recognise, both ways:
//!
//! * every listed key is recognised: a bad value for it is a value error, not
//!   "unknown key";
//! * every key the loaders' `match` arms name (read from their source) is
//!   listed, so a key added to a loader without the list fails here (the
//!   keys both daemons read — link, TLS file and logging keys — are matched
//!   in shared modules, and both daemons' lists must hold them).

use drover_config::{AgentConfig, ManagerConfig};
use std::collections::BTreeSet;

/// The error for `Key=\x01` in `section`: never "unknown key" for a known key.
fn probe(section: &str, key: &str) -> String {
    let text = format!("[{section}]\n{key}=\u{1}bad\n");
    let result = if section == "drover-agent" {
        AgentConfig::parse_str(&text).map(|_| ())
    } else {
        ManagerConfig::parse_str(&text).map(|_| ())
    };
    match result {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    }
}

fn recognised(section: &str, key: &str) -> bool {
    !probe(section, key).contains("unknown key")
}

#[test]
fn every_listed_key_is_recognised_and_others_are_not() {
    for key in drover_config::manager::KEYS {
        assert!(
            recognised("drover-manager", key),
            "{key}: {}",
            probe("drover-manager", key)
        );
    }
    for key in drover_config::manager::NODE_KEYS {
        assert!(
            recognised("node n1", key),
            "{key}: {}",
            probe("node n1", key)
        );
    }
    for key in drover_config::agent::KEYS {
        assert!(
            recognised("drover-agent", key),
            "{key}: {}",
            probe("drover-agent", key)
        );
    }
    // The probe itself can say no.
    assert!(!recognised("drover-manager", "NoSuchKey"));
    assert!(!recognised("drover-agent", "AllowedNodeNames"));
    assert!(!recognised("node n1", "ControllerPort"));
}

/// String literals of `"Key" =>` match arms in a source file, up to its tests.
fn match_arm_keys(source: &str) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let mut keys = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix('"') else {
            continue;
        };
        let Some((name, after)) = rest.split_once('"') else {
            continue;
        };
        let after = after.trim_start();
        if (after.starts_with("=>") || after.starts_with('|'))
            && name.chars().all(|c| c.is_ascii_alphanumeric())
            && name.starts_with(|c: char| c.is_ascii_uppercase())
        {
            keys.insert(name.to_string());
            // `"A" | "B" =>` arms.
            for alt in after.split('|').skip(1) {
                let alt = alt.trim();
                if let Some(n) = alt.strip_prefix('"').and_then(|a| a.split_once('"')) {
                    keys.insert(n.0.to_string());
                }
            }
        }
    }
    keys
}

#[test]
fn the_lists_hold_every_key_the_loaders_match() {
    let logging = match_arm_keys(include_str!("../src/value.rs"));
    assert_eq!(
        logging,
        ["LogIsQuiet", "LogLevel", "LogTarget"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // The TLS file keys are matched in tls.rs, from its own list.
    let tls: BTreeSet<String> = drover_config::tls::KEYS
        .iter()
        .map(|s| s.to_string())
        .collect();
    // The link keys are matched in shared.rs.
    let link = match_arm_keys(include_str!("../src/shared.rs"));
    assert_eq!(
        link,
        drover_config::shared::LINK_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // The metrics keys are matched in metrics.rs.
    let metrics = match_arm_keys(include_str!("../src/metrics.rs"));
    assert_eq!(
        metrics,
        drover_config::metrics::KEYS
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // The HA keys are matched in ha.rs; etcd's TLS file keys there by the
    // TLS file keys' helper, from ha::TLS_KEYS.
    let mut ha = match_arm_keys(include_str!("../src/ha.rs"));
    ha.extend(drover_config::ha::TLS_KEYS.iter().map(|s| s.to_string()));
    assert_eq!(
        ha,
        drover_config::ha::KEYS
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // The discovery keys are matched in discovery.rs.
    let discovery = match_arm_keys(include_str!("../src/discovery.rs"));
    assert_eq!(
        discovery,
        drover_config::discovery::KEYS
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    let mut manager = match_arm_keys(include_str!("../src/manager.rs"));
    manager.extend(discovery.iter().cloned());
    manager.extend(metrics.iter().cloned());
    manager.extend(ha.iter().cloned());
    manager.extend(logging.iter().cloned());
    manager.extend(tls.iter().cloned());
    manager.extend(link.iter().cloned());
    let listed: BTreeSet<String> = drover_config::manager::KEYS
        .iter()
        .chain(drover_config::manager::NODE_KEYS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        manager, listed,
        "manager.rs match arms vs manager::KEYS + NODE_KEYS"
    );

    let mut agent = match_arm_keys(include_str!("../src/agent.rs"));
    agent.extend(logging.iter().cloned());
    agent.extend(tls.iter().cloned());
    agent.extend(link.iter().cloned());
    let listed: BTreeSet<String> = drover_config::agent::KEYS
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(agent, listed, "agent.rs match arms vs agent::KEYS");
}
