//! Every configuration example a user can copy works.
//!
//! * Each `ini` block in the README and in `docs/` (man pages included) is part,
//!   word for word, of a file under `docs/examples/` or `dist/`, so what the
//!   documentation shows is what the tests below load.
//! * Each `.conf` file there loads with drover's own parser, as it is and with
//!   its commented-out settings (`#Key=value`, `#[node NAME]`) uncommented.
//! * Each unit file there is valid INI, and names its proxies in a form the
//!   agent accepts (`drover-proxy@NODE_UNIT.service`).

use drover_config::{AgentConfig, DnsConfig, ManagerConfig, ini};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("config/ lives in the workspace")
        .to_path_buf()
}

fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_below(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The documentation: README.md, sandbox/README.md, CHANGELOG.md and every
/// Markdown file under docs/.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = ["README.md", "sandbox/README.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    let mut all = Vec::new();
    files_below(&root.join("docs"), &mut all);
    docs.extend(
        all.into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    docs
}

/// The fenced ```ini blocks of a Markdown text, with the line each starts on.
fn ini_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```ini") => current = Some((i + 1, String::new())),
            Some(_) if fence.starts_with("```") => blocks.extend(current.take()),
            Some((_, body)) => {
                // Blocks indented under a list item: drop that indentation.
                let indent = line.len() - line.trim_start().len();
                let cut = indent.min(line.len() - fence.len());
                body.push_str(&line[cut..]);
                body.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The files a documented snippet may come from.
fn example_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    files_below(&root().join("docs/examples"), &mut files);
    files_below(&root().join("dist"), &mut files);
    files.retain(|p| p.extension().is_some_and(|e| e == "conf" || e == "service"));
    files
}

#[test]
fn every_documented_ini_block_is_an_example_file() {
    let sources: Vec<(PathBuf, String)> = example_files()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let mut seen = 0;
    let mut orphans = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, block) in ini_blocks(&text) {
            seen += 1;
            if !sources.iter().any(|(_, s)| s.contains(&block)) {
                orphans.push(format!(
                    "{}:{line}:\n{block}",
                    doc.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        seen >= 5,
        "only {seen} ini blocks found: is the scan broken?"
    );
    assert!(
        orphans.is_empty(),
        "these ini blocks are in no file under docs/examples/ or dist/ \
         (add the file, or copy the block from it):\n\n{}",
        orphans.join("\n")
    );
}

/// Which daemon reads a config file, by its sections.
enum Reader {
    Manager,
    Agent,
    Dns,
}

fn reader_of(path: &Path, text: &str) -> Reader {
    let doc = ini::parse(path, text).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = doc.sections.iter().map(|s| s.name.as_str()).collect();
    // A file whose sections are all commented out says in its header whose it is.
    let says = |section: &str| {
        names.contains(&section) || (names.is_empty() && text.contains(&format!("[{section}]")))
    };
    if says("drover-agent") {
        Reader::Agent
    } else if says("drover-dns") {
        Reader::Dns
    } else {
        Reader::Manager
    }
}

fn load(path: &Path, text: &str) -> Result<(), String> {
    match reader_of(path, text) {
        Reader::Manager => ManagerConfig::parse_str(text).map(|_| ()),
        Reader::Agent => AgentConfig::parse_str(text).map(|_| ()),
        Reader::Dns => DnsConfig::parse_str(text).map(|_| ()),
    }
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Uncomments `#Key=value` and `#[section]` lines (and the indented
/// continuation lines right after an uncommented key), leaving prose alone.
fn uncomment(text: &str) -> (String, usize) {
    let mut out = String::new();
    let mut count = 0;
    let mut after_key = false;
    for line in text.lines() {
        let body = line.strip_prefix('#');
        let is_key = body.is_some_and(|b| {
            b.split_once('=')
                .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()))
        });
        let is_section = body.is_some_and(|b| b.starts_with('[') && b.trim_end().ends_with(']'));
        let is_continuation =
            after_key && body.is_some_and(|b| b.starts_with("  ") && !b.trim().is_empty());
        if is_key || is_section || is_continuation {
            out.push_str(&line[1..]);
            count += 1;
        } else {
            out.push_str(line);
        }
        out.push('\n');
        after_key = is_key || is_continuation;
    }
    (out, count)
}

#[test]
fn every_example_config_loads_as_is_and_uncommented() {
    let confs: Vec<PathBuf> = example_files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        // D-Bus policies are XML, not drover configs.
        .filter(|p| !p.to_string_lossy().contains("/dbus-1/"))
        .collect();
    let names: Vec<String> = confs
        .iter()
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    for expected in [
        "dist/etc/drover/manager.conf",
        "dist/etc/drover/agent.conf",
        "dist/usr/share/drover/manager.conf",
        "dist/usr/share/drover/agent.conf",
        "docs/examples/manager.conf",
        "dist/etc/drover/dns.conf",
        "dist/usr/share/drover/dns.conf",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not found in {names:?}"
        );
    }
    let mut failures = Vec::new();
    for path in &confs {
        let text = std::fs::read_to_string(path).unwrap();
        if let Err(e) = load(path, &text) {
            failures.push(e);
        }
        let (open, count) = uncomment(&text);
        if count > 0
            && let Err(e) = load(path, &open)
        {
            failures.push(format!("uncommented ({count} lines): {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_etc_examples_really_set_something_when_uncommented() {
    // Guards the uncommenting itself: if it did nothing, the test above would
    // only prove that comments parse.
    let text = std::fs::read_to_string(root().join("dist/etc/drover/manager.conf")).unwrap();
    let (open, _) = uncomment(&text);
    let c = ManagerConfig::parse_str(&open).unwrap();
    let allowed: Vec<&str> = c.allowed_nodes.iter().map(|n| n.as_str()).collect();
    assert_eq!(allowed, ["node1", "node2"]);
    assert_eq!(c.nodes[0].allow_dependencies_on[0].as_str(), "node2");
    let tls = c.tls.expect("the manager example shows TLS");
    assert_eq!(tls.ca_bundle, Path::new("/etc/drover/tls/ca.pem"));
    assert!(tls.crl.is_some());
    assert!(c.allow_certified_nodes);
    let text = std::fs::read_to_string(root().join("dist/etc/drover/agent.conf")).unwrap();
    let (open, _) = uncomment(&text);
    let c = AgentConfig::parse_str(&open).unwrap();
    assert_eq!(c.node_name, "node1");
    assert_eq!(c.controller_host, "192.0.2.10");
    assert!(c.tls.is_some(), "the agent example shows TLS");
    assert_eq!(c.tls_server_name(), "manager.example.com");
}

#[test]
fn example_units_are_ini_and_name_well_formed_proxies() {
    let units: Vec<PathBuf> = example_files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "service"))
        .collect();
    assert!(
        units
            .iter()
            .any(|p| p.ends_with("docs/examples/need-db.service"))
    );
    for path in units {
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = ini::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
        for entry in doc.sections.iter().flat_map(|s| &s.entries) {
            for word in entry.value.split_whitespace() {
                let Some(instance) = word
                    .strip_prefix("drover-proxy@")
                    .and_then(|w| w.strip_suffix(".service"))
                else {
                    continue;
                };
                // NODE_UNIT: split at the first '_', both sides non-empty.
                let ok = instance
                    .split_once('_')
                    .is_some_and(|(n, u)| !n.is_empty() && !u.is_empty());
                assert!(
                    ok,
                    "{}: {word} is not drover-proxy@NODE_UNIT.service",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn a_comment_after_a_value_is_refused_with_the_reason() {
    let err = ManagerConfig::parse_str("[drover-manager]\nHeartbeatInterval=2000          # ms\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "<string>:2: key 'HeartbeatInterval': '2000          # ms' is not a number \
         (comments must be on their own line)"
    );
}
