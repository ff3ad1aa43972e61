//! The man pages say what the programs do:
//!
//! * every page of `docs/man/` renders and `man` formats it without a warning;
//! * every page is shipped by a package, every shipped page exists;
//! * the options a page documents are the options its binary's `--help` lists
//!   (droverctl and drover-pki: every subcommand's too), both ways;
//! * drover.conf(5) documents, per section, exactly the keys the config
//!   parser recognises.
//!
//! The binaries are the ones of the cargo target directory this test was built
//! into (`make test` builds them first).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use xtask::packages::{self, PACKAGES, Source};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `target/<profile>/NAME`, next to this test's `deps/` directory.
fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().join(name)
}

fn page_source(page: &str) -> String {
    std::fs::read_to_string(repo().join("docs/man").join(format!("{page}.md"))).unwrap()
}

#[test]
fn every_page_renders_and_man_formats_it_cleanly() {
    let pages = packages::render_man_pages(&repo(), "0.0.0").unwrap();
    let names: BTreeSet<&str> = pages.keys().map(String::as_str).collect();
    let shipped: BTreeSet<&str> = PACKAGES
        .iter()
        .flat_map(|p| p.items)
        .filter_map(|i| match i.source {
            Source::Man(page) => Some(page),
            _ => None,
        })
        .collect();
    assert_eq!(
        names, shipped,
        "docs/man pages vs the pages the packages ship"
    );
    for expected in [
        "drover-manager.8",
        "drover-agent.8",
        "drover-proxy.8",
        "drover-dns.8",
        "droverctl.1",
        "drover-pki.1",
        "drover.conf.5",
    ] {
        assert!(names.contains(expected), "{expected} missing");
    }

    let dir = std::env::temp_dir().join(format!("drover-man-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (page, roff) in &pages {
        let file = dir.join(page);
        std::fs::write(&file, roff).unwrap();
        let out = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&file)
            .env("MANWIDTH", "80")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("man (package man-db; scripts/host-deps test installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{page}: {warnings}");
        assert!(warnings.trim().is_empty(), "{page}: man warns:\n{warnings}");
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"] {
            assert!(
                text.lines().any(|l| l == section),
                "{page}: no {section} section:\n{text}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Long options (`--x`) and short ones (`-x`) in a text.
fn options_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    for i in 0..chars.len() {
        let boundary = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '-');
        if !boundary || chars[i] != '-' {
            continue;
        }
        let word: String = chars[i..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '-')
            .collect();
        let long = word.len() > 3
            && word.starts_with("--")
            && word[2..].starts_with(|c: char| c.is_ascii_lowercase());
        let short = word.len() == 2 && word[1..].starts_with(|c: char| c.is_ascii_alphabetic());
        if long || short {
            out.insert(word);
        }
    }
    out
}

/// The options of `--help`, including every subcommand's `--help`.
fn help_options(binary: &str, subcommands: &[&str]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    let runs: Vec<Vec<&str>> = std::iter::once(vec!["--help"])
        .chain(subcommands.iter().map(|s| vec![*s, "--help"]))
        .collect();
    for args in runs {
        let out = Command::new(bin(binary))
            .args(&args)
            .output()
            .unwrap_or_else(|e| {
                panic!("{}: {e} (build the binaries first)", bin(binary).display())
            });
        assert!(
            out.status.success(),
            "{binary} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        // Only the option lists, not prose that mentions other programs' flags.
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with('-') {
                all.extend(options_in(t.split("  ").next().unwrap_or(t)));
            }
        }
    }
    all
}

/// Options the page documents as its own: the terms of its OPTIONS and
/// COMMANDS sections, and the SYNOPSIS.
fn page_options(page: &str) -> BTreeSet<String> {
    let src = page_source(page);
    let mut out = BTreeSet::new();
    let mut section = "";
    for line in src.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = if h == "OPTIONS" || h == "SYNOPSIS" || h == "COMMANDS" {
                "yes"
            } else {
                ""
            };
            continue;
        }
        // Terms and synopsis lines begin at the margin; bodies are indented.
        if section == "yes" && line.starts_with("**") {
            out.extend(options_in(&line.replace("**", " ").replace('*', " ")));
        }
    }
    out
}

fn subcommands(binary: &str) -> Vec<String> {
    let out = Command::new(bin(binary)).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut in_commands = false;
    let mut subs = Vec::new();
    for line in text.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !line.starts_with("  ") {
                break;
            }
            let name = line
                .split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches(',');
            if name != "help" {
                subs.push(name.to_string());
            }
        }
    }
    subs
}

/// `droverctl -V`: clap's usual version flag, kept next to bluechictl's `-v`.
const HIDDEN_ALIASES: &[(&str, &str)] = &[("droverctl", "-V")];

fn assert_same_options(page: &str, binary: &str, nested: bool) {
    let subs = if nested {
        subcommands(binary)
    } else {
        Vec::new()
    };
    if nested {
        assert!(subs.len() >= 3, "{binary}: no subcommands found");
    }
    let sub_refs: Vec<&str> = subs.iter().map(String::as_str).collect();
    let mut help = help_options(binary, &sub_refs);
    // Aliases clap accepts but does not list; each must really work.
    for (b, alias) in HIDDEN_ALIASES {
        if *b == binary {
            let out = Command::new(bin(binary)).arg(alias).output().unwrap();
            assert!(
                out.status.success(),
                "{binary} {alias} is documented but fails"
            );
            help.insert(alias.to_string());
        }
    }
    let documented = page_options(page);
    let undocumented: Vec<_> = help.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&help).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{page} vs {binary} --help: not in the page {undocumented:?}, not in --help {unknown:?}"
    );
}

#[test]
fn daemon_pages_document_exactly_the_daemons_options() {
    assert_same_options("drover-manager.8", "drover-manager", false);
    assert_same_options("drover-agent.8", "drover-agent", false);
    assert_same_options("drover-dns.8", "drover-dns", false);
}

#[test]
fn proxy_page_documents_exactly_the_helpers_options() {
    assert_same_options("drover-proxy.8", "drover-proxy", false);
}

#[test]
fn cli_pages_document_exactly_the_options_of_every_command() {
    assert_same_options("droverctl.1", "droverctl", true);
    assert_same_options("drover-pki.1", "drover-pki", true);
}

#[test]
fn the_option_scan_finds_options_and_only_options() {
    assert_eq!(
        options_in("-c, --config <FILE>  use drover-agent; --no-default-config -v"),
        ["--config", "--no-default-config", "-c", "-v"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}

/// `**Key=**` terms per `## SECTION [name]` heading of drover.conf(5).
fn documented_keys() -> Vec<(String, BTreeSet<String>)> {
    let src = page_source("drover.conf.5");
    let mut sections: Vec<(String, BTreeSet<String>)> = Vec::new();
    for line in src.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            if let Some(name) = h
                .strip_prefix("SECTION [")
                .and_then(|r| r.strip_suffix(']'))
            {
                sections.push((name.to_string(), BTreeSet::new()));
            } else {
                sections.push((String::new(), BTreeSet::new()));
            }
            continue;
        }
        if let Some(key) = line
            .strip_prefix("**")
            .and_then(|l| l.split_once("=**"))
            .map(|(k, _)| k)
            && let Some((_, keys)) = sections.last_mut()
        {
            keys.insert(key.to_string());
        }
    }
    sections.retain(|(name, _)| !name.is_empty());
    sections
}

#[test]
fn drover_conf_documents_exactly_the_keys_the_parser_knows() {
    let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
    let expected = [
        (
            "drover-manager".to_string(),
            set(drover_config::manager::KEYS),
        ),
        (
            "node NAME".to_string(),
            set(drover_config::manager::NODE_KEYS),
        ),
        ("drover-agent".to_string(), set(drover_config::agent::KEYS)),
        // Its keys are [X-Drover]'s (minus three), documented there once.
        ("health NAME".to_string(), BTreeSet::new()),
        (
            "X-Drover".to_string(),
            set(drover_config::health::UNIT_KEYS),
        ),
    ];
    let node_keys = set(drover_config::health::NODE_KEYS);
    assert!(node_keys.is_subset(&set(drover_config::health::UNIT_KEYS)));
    let documented = documented_keys();
    for ((name, keys), (doc_name, doc_keys)) in expected.iter().zip(&documented) {
        assert_eq!(name, doc_name, "sections of drover.conf(5)");
        let missing: Vec<_> = keys.difference(doc_keys).collect();
        let extra: Vec<_> = doc_keys.difference(keys).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "[{name}]: undocumented keys {missing:?}; documented but unknown to the parser {extra:?}"
        );
    }
    assert_eq!(documented.len(), expected.len(), "sections: {documented:?}");
    // Each key says its default.
    let src = page_source("drover.conf.5");
    for (_, keys) in &documented {
        for key in keys {
            let start = src.find(&format!("**{key}=**")).unwrap();
            let body = &src[start..];
            let end = body[3..].find("\n**").map_or(body.len(), |e| e + 3);
            assert!(
                body[..end].contains("Default") || key == "RequiredSelinuxContext",
                "{key} has no default"
            );
        }
    }
}
