//! The documentation points only at files in this repository: no note or
//! design file that lives elsewhere, and every repository path it names in
//! backquotes exists.

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
            for outside in [
                "DESIGN.md",
                "bluechi-facts",
                "TESTING.md",
                "../shared",
                "/work/",
            ] {
                if line.contains(outside) {
                    problems.push(format!(
                        "{rel}:{}: names {outside}, which is not in the repository",
                        no + 1
                    ));
                }
            }
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
    }
    assert!(docs.len() > 20, "only {} documents found", docs.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
