//! The documentation points only at files in this repository: no note or
//! design file that lives elsewhere, and every repository path it names in
//! backquotes exists. "The documentation" is what a user or contributor reads
//! (`documents`) and the module docs (`//!`) of every Rust source file; no
//! comment in a Rust source names a file outside the repository either.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_below(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// What a user or a contributor reads.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "CHANGELOG.md",
        "sandbox/README.md",
        "Makefile",
        ".ci/run",
        "scripts/host-deps",
        "scripts/fresh-root-check",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    files_below(&root.join("docs"), &mut docs);
    files_below(&root.join("dist"), &mut docs);
    docs
}

/// Top-level directories of the repository, as paths in the docs start.
const TOP: &[&str] = &[
    "docs/",
    "dist/",
    "scripts/",
    "xtask/",
    "config/",
    "sandbox/",
    "manager/",
    "agent/",
    "ctl/",
    "protocol/",
    "proxy-helper/",
    "tls/",
    "tests/",
    "benches/",
    "build/",
    ".ci/",
    "fuzz/",
];

/// Names of files that live outside the repository (the project's own notes),
/// spelled in pieces so this file does not name them itself.
fn outside_names() -> Vec<String> {
    [
        ["DESIGN", ".md"],
        ["bluechi", "-facts"],
        ["TESTING", ".md"],
        ["../", "shared"],
        ["/work", "/"],
    ]
    .iter()
    .map(|p| p.concat())
    .collect()
}

/// Problems of one line of documentation: a name of a file outside the
/// repository, or a backquoted repository path that does not exist.
fn check_line(rel: &str, no: usize, line: &str, problems: &mut Vec<String>) {
    check_outside(rel, no, line, problems);
    // `path/in/the/repo` in backquotes must exist.
    for (k, span) in line.split('`').enumerate() {
        if k % 2 == 0 || !TOP.iter().any(|t| span.starts_with(t)) {
            continue;
        }
        let path = span.split([' ', ':', '#']).next().unwrap_or(span);
        let placeholder = path.contains(['*', '{', '<'])
            || path.split('/').any(|p| {
                p.chars().any(|c| c.is_ascii_uppercase())
                    && p.chars()
                        .all(|c| c.is_ascii_uppercase() || c == '_' || c == '.')
            });
        if !placeholder && !repo().join(path).exists() {
            problems.push(format!("{rel}:{}: `{path}` does not exist", no + 1));
        }
    }
}

fn check_outside(rel: &str, no: usize, line: &str, problems: &mut Vec<String>) {
    for outside in outside_names() {
        if line.contains(&outside) {
            problems.push(format!(
                "{rel}:{}: names {outside}, which is not in the repository",
                no + 1
            ));
        }
    }
}

#[test]
fn docs_name_no_file_outside_the_repository() {
    let mut problems = Vec::new();
    let docs = documents();
    for doc in &docs {
        let Ok(text) = std::fs::read_to_string(doc) else {
            problems.push(format!("{} is missing", doc.display()));
            continue;
        };
        let rel = doc.strip_prefix(repo()).unwrap().display().to_string();
        for (no, line) in text.lines().enumerate() {
            check_line(&rel, no, line, &mut problems);
        }
    }
    assert!(docs.len() > 20, "only {} documents found", docs.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every Rust source file of the workspace (build output left out).
fn rust_sources() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(repo()).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() && name != "target" && name != ".git" {
            files_below(&path, &mut all);
        }
    }
    all.retain(|p| {
        p.extension().is_some_and(|e| e == "rs")
            && !p.components().any(|c| c.as_os_str() == "target")
    });
    all
}

#[test]
fn module_docs_point_only_at_files_in_the_repository() {
    let mut problems = Vec::new();
    let sources = rust_sources();
    for source in &sources {
        let text = std::fs::read_to_string(source).unwrap();
        let rel = source.strip_prefix(repo()).unwrap().display().to_string();
        for (no, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//!") {
                check_line(&rel, no, code, &mut problems);
            } else if code.starts_with("//") {
                check_outside(&rel, no, code, &mut problems);
            }
        }
    }
    assert!(
        sources.len() > 100,
        "only {} Rust files found",
        sources.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
